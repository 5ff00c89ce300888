//! Replication as one long-lived exchange per follower: the leader sends appends as
//! openraft produces them, without waiting for the answer to the one before, and the
//! follower answers each in order (openraft's `stream_append` on both sides).
//!
//! One request per append, as before, made a leader that had new entries wait a round
//! trip for the follower's previous answer, and paid an HTTP request's parsing, routing
//! and answer per append on both sides. The exchange is an HTTP/2 request on a
//! connection of its own, so TLS, the target header and the log-forms header work as for
//! every other Raft message; its body and its answer's body are frames, each a length
//! (u32 LE) and a codec value: the leader's log time and an append one way, the result
//! of each append the other way.
//!
//! A follower of a build without the exchange answers 404 (or, before HTTP/2 on the Raft
//! listener, cannot speak it); the leader then sends that follower one request per
//! append for [`PLAIN_APPENDS_FOR`] before it asks again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use bytes::BufMut;
use bytes::Bytes;
use bytes::BytesMut;
use futures_util::Stream;
use futures_util::StreamExt;
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use openraft::error::NetworkError;
use openraft::error::RPCError;
use openraft::error::Unreachable;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::StreamAppendResult;
use openraft::type_config::alias::LogIdOf;
use rpc::client::DuplexBody;
use serde::Serialize;
use store_sm::codec::decode_value;
use store_sm::codec::encode_value;
use store_sm::raft_types::NodeId;
use tokio::sync::mpsc::UnboundedSender;

use crate::clock::LogClock;
use crate::network::ReplicationStats;

use crate::types::NodeTypes;

/// Appends a leader sends a follower ahead of its answers. One: measured against eight
/// (docs/performance.md, session 27), eight split the same writes into more, smaller
/// appends, each a follower fsync and a message, and cost 12% of the cycles at 16
/// workers, while one kept today's batches and still saved a request's parsing and
/// routing per append (5-15% more cycles with one worker). The exchange keeps the
/// order either way (the simulation passed 100 seeds of each).
pub const AHEAD_MAX: usize = 1;

/// How long the leader holds back an append that only tells a follower a new commit
/// index, in case entries come meanwhile and carry it. Under light load openraft sends one
/// right after each commit, just as the client's next request arrives: two follower
/// wake-ups and a leader's, on the same cores, and the next entries wait for its answer.
/// Held, the commit rides with the next entries (measured at one worker: 4-21% more
/// cycles and a claim p50 up to 0.14 ms lower, docs/performance.md, session 36). The price: an
/// idle follower applies, and its stale reads and change feeds show, a commit this much
/// later. Heartbeats, votes and the leader's reads do not go through an exchange.
pub const COMMIT_HOLD: Duration = Duration::from_millis(3);

/// How long a leader sends a follower that has no exchange (an older build) one request
/// per append before it offers the exchange again.
pub const PLAIN_APPENDS_FOR: Duration = Duration::from_secs(60);

/// How long an exchange may carry nothing before the leader ends it (and opens another
/// when there is something to send): a connection left open forever would outlive any
/// change of the network between the two nodes unnoticed.
pub const LEADER_IDLE_MAX: Duration = Duration::from_secs(20);

/// How long an exchange takes appends before the leader ends it, once every append in
/// it is answered, and opens another: the new one passes the follower's checks again
/// (its certificate, reloaded on SIGHUP; the membership).
pub const EXCHANGE_AGE_MAX: Duration = Duration::from_secs(300);

/// How long a follower waits for the next append before it ends the exchange: longer
/// than [`LEADER_IDLE_MAX`], so a live leader always ends an idle exchange first, and
/// bounded, so a leader that vanished (a partition, a crash) does not hold the follower's
/// connection and task for good.
pub const FOLLOWER_IDLE_MAX: Duration = Duration::from_secs(60);

/// Largest frame either side accepts: the largest Raft message.
pub const FRAME_BYTES_MAX: usize = crate::raft_api::RAFT_BODY_BYTES_MAX;

/// The codec value of a frame the leader sends: its log time (milliseconds) and an
/// append. Encoded from a borrowed append, decoded into an owned one.
pub type AppendFrame = (i64, AppendEntriesRequest<NodeTypes>);

/// The codec value of a frame the follower sends: an append's result, or why the
/// follower stopped taking appends (its Raft stopped, a frame it cannot read); the
/// exchange ends after that.
pub type AnswerFrame = Result<StreamAppendResult<NodeTypes>, String>;

/// `value` as a frame: its length (u32 LE), then its codec bytes.
pub fn frame<T: Serialize + ?Sized>(value: &T) -> std::io::Result<Bytes> {
    let body = encode_value(value)?;
    if body.len() > FRAME_BYTES_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "a frame of {} bytes is over the limit of {FRAME_BYTES_MAX}",
                body.len()
            ),
        ));
    }
    let mut framed = BytesMut::with_capacity(4 + body.len());
    // Within u32: FRAME_BYTES_MAX is 1 GiB.
    framed.put_u32_le(body.len() as u32);
    framed.extend_from_slice(&body);
    Ok(framed.freeze())
}

/// Sends `request` down an exchange's `body`, framed with this leader's log time now,
/// and notes it in `unanswered`. Fails if it cannot be framed or the body is closed.
pub fn send_append(
    body: &UnboundedSender<Bytes>,
    unanswered: &mut Unanswered,
    clock: &LogClock,
    request: &AppendEntriesRequest<NodeTypes>,
) -> std::io::Result<()> {
    let bytes = frame(&(clock.now().as_millis(), request))?;
    body.send(bytes)
        .map_err(|_| std::io::Error::other("the connection no longer takes appends"))?;
    unanswered.sent(!request.entries.is_empty());
    if let Some(last) = request.entries.last() {
        unanswered.last_entry = Some(last.log_id);
    }
    Ok(())
}

/// Reads frames off a body as its pieces arrive. Cancel-safe: a read dropped before it
/// ends loses nothing.
#[derive(Debug)]
pub struct FrameReader<B> {
    body: B,
    buffer: BytesMut,
}

impl<B> FrameReader<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    /// A reader of `body`.
    pub fn new(body: B) -> Self {
        Self {
            body,
            buffer: BytesMut::new(),
        }
    }

    /// The next frame's value bytes; `None` once the body ended between frames. A body
    /// that ends within a frame, fails, or announces a frame over [`FRAME_BYTES_MAX`] is
    /// an error.
    pub async fn next(&mut self) -> Result<Option<Bytes>, String> {
        loop {
            if let Some(frame) = self.complete_frame()? {
                return Ok(Some(frame));
            }
            match self.body.frame().await {
                None if self.buffer.is_empty() => return Ok(None),
                None => {
                    return Err(format!(
                        "the stream ended within a frame ({} bytes of it arrived)",
                        self.buffer.len()
                    ));
                }
                Some(Err(e)) => return Err(format!("the stream broke: {e}")),
                Some(Ok(piece)) => {
                    if let Ok(data) = piece.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    fn complete_frame(&mut self) -> Result<Option<Bytes>, String> {
        let Some(head) = self.buffer.get(..4) else {
            return Ok(None);
        };
        let mut head = head;
        let length = head.get_u32_le() as usize;
        if length > FRAME_BYTES_MAX {
            return Err(format!(
                "a frame of {length} bytes is over the limit of {FRAME_BYTES_MAX}"
            ));
        }
        if self.buffer.len() < 4 + length {
            return Ok(None);
        }
        self.buffer.advance(4);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }
}

/// An append sent and not yet answered.
#[derive(Debug)]
pub struct Sent {
    /// When it was sent.
    pub at: tokio::time::Instant,
    /// Whether it carried entries (then its answer's delay is a write's replication leg).
    pub entries: bool,
}

/// The appends sent and not yet answered, oldest first.
#[derive(Debug, Default)]
pub struct Unanswered {
    sent: VecDeque<Sent>,
    /// When the last answer came.
    last_answer: Option<tokio::time::Instant>,
    /// The log id of the last entry sent, answered or not.
    last_entry: Option<LogIdOf<NodeTypes>>,
}

impl Unanswered {
    /// Notes an append sent now.
    pub fn sent(&mut self, entries: bool) {
        self.sent.push_back(Sent {
            at: tokio::time::Instant::now(),
            entries,
        });
    }

    /// The oldest append, answered now; `None` if every append was answered.
    pub fn answered(&mut self) -> Option<Sent> {
        self.last_answer = Some(tokio::time::Instant::now());
        self.sent.pop_front()
    }

    /// How many wait for an answer.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// When the oldest one's answer is overdue, given that the follower answers one
    /// append within `within` of its sending or of the answer before, whichever is
    /// later (it works through them in order).
    pub fn overdue_at(&self, within: Duration) -> Option<tokio::time::Instant> {
        let oldest = self.sent.front()?;
        let since = self
            .last_answer
            .map_or(oldest.at, |last| last.max(oldest.at));
        Some(since + within)
    }
}

/// What the leader's side of an exchange does next.
enum Step {
    Answer(Result<Option<Bytes>, String>),
    Request(Option<AppendEntriesRequest<NodeTypes>>),
    Overdue,
    Idle,
    HoldOver,
}

/// An exchange's request as opened: the body going to the follower, the answers'
/// body coming back, and the appends already sent in the body before the answer's head
/// came (the first one rides with the request, which saves a round trip whenever an
/// exchange opens, after every idle spell).
pub struct Opened {
    /// The body going to the follower.
    pub body: UnboundedSender<Bytes>,
    /// The answers' body.
    pub answers: DuplexBody,
    /// The appends sent so far.
    pub sent: Unanswered,
}

/// The leader's side of one exchange with a follower: sends what `input` yields, at
/// most [`AHEAD_MAX`] ahead of the answers, and yields the answers in order.
pub struct Exchange<S> {
    target: NodeId,
    /// `None` once openraft ended the requests.
    input: Option<S>,
    /// The body going to the follower; dropped (ending it) with `input`.
    body: Option<UnboundedSender<Bytes>>,
    answers: FrameReader<DuplexBody>,
    unanswered: Unanswered,
    /// How long an append may go unanswered before the exchange counts as broken.
    answer_within: Duration,
    clock: Arc<LogClock>,
    /// Where appends with entries are timed, from send to answer.
    replication: Option<Arc<ReplicationStats>>,
    /// When it opened (see [`EXCHANGE_AGE_MAX`]).
    opened: tokio::time::Instant,
    ended: bool,
    /// An append that only moves the commit index, held back (see [`COMMIT_HOLD`]).
    held: Option<Held>,
}

/// An append held back, and when it goes if nothing overtakes it.
struct Held {
    request: AppendEntriesRequest<NodeTypes>,
    until: tokio::time::Instant,
}

impl<S> Exchange<S>
where
    S: Stream<Item = AppendEntriesRequest<NodeTypes>> + Unpin,
{
    /// An exchange with node `target` over the `opened` request, sending `input` after
    /// the appends that went with the request.
    pub fn new(
        target: NodeId,
        input: S,
        opened: Opened,
        answer_within: Duration,
        clock: Arc<LogClock>,
        replication: Option<Arc<ReplicationStats>>,
    ) -> Self {
        Self {
            target,
            input: Some(input),
            body: Some(opened.body),
            answers: FrameReader::new(opened.answers),
            unanswered: opened.sent,
            answer_within,
            clock,
            replication,
            opened: tokio::time::Instant::now(),
            ended: false,
            held: None,
        }
    }

    /// The next append's result; `None` once the requests ended and every append was
    /// answered, or after an error (openraft opens another exchange).
    pub async fn next_answer(
        &mut self,
    ) -> Option<Result<StreamAppendResult<NodeTypes>, RPCError<NodeTypes>>> {
        while !self.ended {
            let aged = self.opened.elapsed() >= EXCHANGE_AGE_MAX;
            if (self.input.is_none() || aged) && self.unanswered.is_empty() && self.held.is_none() {
                self.ended = true;
                return None;
            }
            let step = self.next_step().await;
            let outcome = match step {
                // Ended by the follower between appends (it waited too long for one, or
                // it is stopping): the next exchange finds out which. An exchange it ends
                // while a commit index is held fails, so that openraft sends the newest
                // commit index again (its own entry-less append) instead of counting it
                // as sent.
                Step::Answer(Ok(None)) if self.unanswered.is_empty() => {
                    if self.held.is_none() {
                        self.ended = true;
                        return None;
                    }
                    Some(Err(self.broken(
                        "it ended the exchange before a new commit index went".into(),
                    )))
                }
                Step::Answer(answer) => Some(self.take_answer(answer)),
                Step::Request(Some(request)) => self.offer(request).err().map(Err),
                Step::Request(None) => {
                    self.input = None;
                    let sent = self.held.take().map(|held| self.send(held.request));
                    self.body = None;
                    sent.and_then(Result::err).map(Err)
                }
                Step::HoldOver => match self.held.take() {
                    Some(held) => self.send(held.request).err().map(Err),
                    None => None,
                },
                Step::Overdue => Some(Err(self.broken(format!(
                    "an append went unanswered for {:?}",
                    self.answer_within
                )))),
                Step::Idle => {
                    self.ended = true;
                    return None;
                }
            };
            if let Some(outcome) = outcome {
                self.ended = outcome.is_err();
                return Some(outcome);
            }
        }
        None
    }

    async fn next_step(&mut self) -> Step {
        let room = self.input.is_some()
            && self.unanswered.len() < AHEAD_MAX
            && self.opened.elapsed() < EXCHANGE_AGE_MAX;
        let overdue = self.unanswered.overdue_at(self.answer_within);
        let idle = self.unanswered.is_empty();
        let far = tokio::time::Instant::now() + LEADER_IDLE_MAX;
        let held_until = self.held.as_ref().map(|held| held.until);
        let answers = &mut self.answers;
        let input = &mut self.input;
        tokio::select! {
            biased;
            answer = answers.next() => Step::Answer(answer),
            request = next_of(input), if room => Step::Request(request),
            () = tokio::time::sleep_until(held_until.unwrap_or(far)), if held_until.is_some() => Step::HoldOver,
            () = tokio::time::sleep_until(overdue.unwrap_or(far)), if overdue.is_some() => Step::Overdue,
            () = tokio::time::sleep_until(far), if idle => Step::Idle,
        }
    }

    /// Sends `request`, or holds it back for [`COMMIT_HOLD`] if it only tells a new
    /// commit index after entries this exchange sent (not a probe). A request that comes
    /// meanwhile replaces the held one: openraft's requests carry the newest commit index,
    /// and it matches answers to requests by log id, so an answer to a later append
    /// covers the one never sent.
    fn offer(
        &mut self,
        request: AppendEntriesRequest<NodeTypes>,
    ) -> Result<(), RPCError<NodeTypes>> {
        let commit_only = request.entries.is_empty()
            && request.prev_log_id.is_some()
            && request.prev_log_id == self.unanswered.last_entry;
        if commit_only {
            let until = self.held.take().map_or_else(
                || tokio::time::Instant::now() + COMMIT_HOLD,
                |held| held.until,
            );
            self.held = Some(Held { request, until });
            return Ok(());
        }
        self.held = None;
        self.send(request)
    }

    fn send(
        &mut self,
        request: AppendEntriesRequest<NodeTypes>,
    ) -> Result<(), RPCError<NodeTypes>> {
        let Some(body) = &self.body else {
            return Err(self.broken("the connection no longer takes appends".into()));
        };
        send_append(body, &mut self.unanswered, &self.clock, &request)
            .map_err(|e| self.broken(e.to_string()))
    }

    fn take_answer(
        &mut self,
        answer: Result<Option<Bytes>, String>,
    ) -> Result<StreamAppendResult<NodeTypes>, RPCError<NodeTypes>> {
        let bytes = match answer {
            Err(e) => return Err(self.broken(e)),
            Ok(None) => {
                return Err(self.broken(format!(
                    "node {} ended the exchange with {} appends unanswered",
                    self.target,
                    self.unanswered.len()
                )));
            }
            Ok(Some(bytes)) => bytes,
        };
        let answer: AnswerFrame =
            decode_value(&bytes, "append answer").map_err(|e| self.broken(e.to_string()))?;
        let result = match answer {
            Ok(result) => result,
            // The follower stopped taking appends (its Raft stopped, or it cannot read
            // them): it meets the next exchange the same way, so back off.
            Err(refusal) => {
                return Err(RPCError::Unreachable(Unreachable::new(
                    &std::io::Error::other(format!("node {}: {refusal}", self.target)),
                )));
            }
        };
        let Some(sent) = self.unanswered.answered() else {
            return Err(self.broken("an answer came for no append".into()));
        };
        if let Some(replication) = self
            .replication
            .as_ref()
            .filter(|_| sent.entries && result.is_ok())
        {
            replication.append_latency.record(sent.at.elapsed());
        }
        Ok(result)
    }

    fn broken(&self, why: String) -> RPCError<NodeTypes> {
        RPCError::Network(NetworkError::new(&std::io::Error::other(format!(
            "replication stream to node {}: {why}",
            self.target
        ))))
    }
}

/// The next item of `input`; pending for good once it is `None`.
async fn next_of<S>(input: &mut Option<S>) -> Option<S::Item>
where
    S: Stream + Unpin,
{
    match input {
        Some(input) => input.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::StreamBody;

    use super::*;

    fn body_of(
        pieces: Vec<Bytes>,
    ) -> StreamBody<
        impl futures_util::Stream<Item = Result<http_body::Frame<Bytes>, std::io::Error>> + Unpin,
    > {
        StreamBody::new(futures_util::stream::iter(
            pieces.into_iter().map(|p| Ok(http_body::Frame::data(p))),
        ))
    }

    #[tokio::test]
    async fn frames_come_back_whole_however_the_body_cuts_them() {
        let values: Vec<(i64, String)> = (0..5).map(|i| (i, "x".repeat(i as usize * 7))).collect();
        let mut wire = Vec::new();
        for value in &values {
            wire.extend_from_slice(&frame(value).expect("encode"));
        }
        for cut in [1, 3, 4, 5, 11, wire.len()] {
            let pieces: Vec<Bytes> = wire.chunks(cut).map(Bytes::copy_from_slice).collect();
            let mut reader = FrameReader::new(body_of(pieces));
            for expected in &values {
                let bytes = reader.next().await.expect("read").expect("a frame");
                let value: (i64, String) = decode_value(&bytes, "test").expect("decode");
                assert_eq!(&value, expected, "pieces of {cut} bytes");
            }
            assert_eq!(
                reader.next().await.expect("read"),
                None,
                "the end, cut {cut}"
            );
        }
    }

    #[tokio::test]
    async fn a_body_ending_within_a_frame_or_announcing_a_huge_one_is_an_error() {
        let whole = frame(&(1i64, "hello".to_string())).expect("encode");
        let cut = whole.slice(..whole.len() - 1);
        let mut reader = FrameReader::new(body_of(vec![cut]));
        let error = reader.next().await.expect_err("a cut frame");
        assert!(error.contains("ended within a frame"), "{error}");

        let mut huge = BytesMut::new();
        huge.put_u32_le(FRAME_BYTES_MAX as u32 + 1);
        let mut reader = FrameReader::new(body_of(vec![huge.freeze()]));
        let error = reader.next().await.expect_err("over the limit");
        assert!(error.contains("over the limit"), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_append_is_overdue_a_deadline_after_its_sending_or_the_answer_before() {
        let within = Duration::from_secs(1);
        let mut unanswered = Unanswered::default();
        let start = tokio::time::Instant::now();
        unanswered.sent(true);
        tokio::time::advance(Duration::from_millis(300)).await;
        unanswered.sent(true);
        assert_eq!(unanswered.overdue_at(within), Some(start + within));
        // The follower works in order: the second is due a deadline after the first's
        // answer, not after its own sending.
        tokio::time::advance(Duration::from_millis(900)).await;
        unanswered.answered();
        let answered_at = start + Duration::from_millis(1200);
        assert_eq!(unanswered.overdue_at(within), Some(answered_at + within));
        unanswered.answered();
        assert_eq!(unanswered.overdue_at(within), None);
        // One sent later than the last answer counts from its own sending.
        tokio::time::advance(Duration::from_millis(500)).await;
        unanswered.sent(false);
        assert_eq!(
            unanswered.overdue_at(within),
            Some(answered_at + Duration::from_millis(500) + within)
        );
    }

    #[test]
    fn answers_are_matched_to_appends_oldest_first() {
        let mut unanswered = Unanswered::default();
        assert_eq!(unanswered.overdue_at(Duration::from_secs(1)), None);
        unanswered.sent(true);
        unanswered.sent(false);
        assert_eq!(unanswered.len(), 2);
        assert!(unanswered.answered().expect("the first").entries);
        assert!(!unanswered.answered().expect("the second").entries);
        assert!(unanswered.answered().is_none());
        assert!(unanswered.is_empty());
    }
}
