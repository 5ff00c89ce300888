//! Watches: a group's changes after a revision, from this node's change feed, waiting
//! for the first ones when there are none yet. Any node serves them from what it
//! applied; nothing is proposed.

use std::time::Duration;

use openraft::async_runtime::WatchReceiver;

use super::ServiceError;
use crate::node::Node;
use crate::waiting::WaitKind;
use crate::waiting::feed::FeedPage;
use crate::waiting::feed::Forgotten;

/// What a watch asks for.
#[derive(Clone, Debug)]
pub struct WatchRequest {
    /// The group.
    pub group: String,
    /// Changes after this revision; `None`: after the node's current one.
    pub after: Option<u64>,
    /// Changes per page (whole revisions).
    pub limit: usize,
    /// How long to wait for the first change.
    pub wait: Duration,
}

impl Node {
    /// The changes of a group after a revision, waiting up to `wait` for some; an empty
    /// page at the deadline, or `Err(Forgotten)` inside `Ok` when the revision is older
    /// than the feed keeps or ahead of this node's log.
    pub async fn watch(
        &self,
        request: &WatchRequest,
    ) -> Result<Result<FeedPage, Forgotten>, ServiceError> {
        self.check_member()?;
        if let Some(after) = request.after {
            let log_end = self.raft.metrics().borrow_watched().last_log_index;
            if let Err(ahead) = self.feed.check_not_ahead(after, log_end.unwrap_or(0)) {
                return Ok(Err(ahead));
            }
        }
        let after = request.after.unwrap_or_else(|| self.feed.revision());
        if request.wait.is_zero() {
            // A plain read: no waiter slot, so a full --max-waiters refuses only waits.
            return Ok(self.feed.page(&request.group, after, request.limit));
        }
        let slot = self.waiters.enter(WaitKind::Watch)?;
        let deadline = tokio::time::Instant::now() + request.wait;
        let signal = self.feed.signal(&request.group);
        let mut woken = false;
        let answer = loop {
            let changed = signal.notified();
            let stopped = self.waiters.stopped();
            tokio::pin!(changed, stopped);
            changed.as_mut().enable();
            stopped.as_mut().enable();
            let page = self.feed.page(&request.group, after, request.limit);
            let done = match &page {
                Ok(page) => !page.changes.is_empty(),
                Err(_) => true,
            };
            if woken {
                slot.woken(!done);
            }
            if done || self.waiters.is_stopping() || tokio::time::Instant::now() >= deadline {
                break page;
            }
            tokio::select! {
                // Polled in order: the simulation needs the same choice on every replay.
                biased;
                () = &mut changed => woken = true,
                () = &mut stopped => woken = false,
                () = tokio::time::sleep_until(deadline) => woken = false,
            }
        };
        drop(signal);
        self.feed.release(&request.group);
        Ok(answer)
    }
}
