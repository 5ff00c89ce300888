//! Network delay without `sch_netem`: iptables sends a node's packets to an NFQUEUE,
//! and this thread accepts each one only after its delay (a base plus uniform jitter,
//! so packets may overtake each other, as under netem with jitter).
//!
//! The queue is opened in the calling thread's network namespace (the lab's worker
//! namespace). Rules use `--queue-bypass` and the queue fails open, so packets pass
//! undelayed, never dropped, when the delayer is not running or its queue is full.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

/// Packets held at most; past it the kernel lets packets through undelayed.
const QUEUE_MAX: u32 = 4096;

/// A running delayer.
pub struct Delayer {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<u64, String>>,
}

/// xorshift64*: enough randomness for jitter, without a dependency.
struct Jitter(u64);

impl Jitter {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

impl Delayer {
    /// Binds NFQUEUE `queue` and delays every packet sent to it by `delay` ± `jitter`.
    pub fn start(queue: u16, delay: Duration, jitter: Duration) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let stopping = stop.clone();
        let handle = std::thread::spawn(move || {
            let opened = open(queue);
            let mut q = match opened {
                Ok(q) => {
                    let _ = ready_tx.send(Ok(()));
                    q
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.clone()));
                    return Err(e);
                }
            };
            let result = hold(&mut q, &stopping, delay, jitter);
            let _ = q.unbind(queue);
            result
        });
        match ready.recv() {
            Ok(Ok(())) => Ok(Self { stop, handle }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the delayer thread died while opening its queue".into()),
        }
    }

    /// Releases every held packet, stops, and returns how many packets it delayed.
    /// Remove the rules that feed the queue first.
    pub fn stop(self) -> Result<u64, String> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle
            .join()
            .map_err(|_| "the delayer thread panicked".to_string())?
    }
}

fn open(queue: u16) -> Result<nfq::Queue, String> {
    let context = |what: &str, e: std::io::Error| format!("NFQUEUE {queue}: {what}: {e}");
    let mut q = nfq::Queue::open().map_err(|e| context("open", e))?;
    q.bind(queue).map_err(|e| context("bind", e))?;
    // Metadata only: the delayer never looks inside a packet.
    q.set_copy_range(queue, 0)
        .map_err(|e| context("copy range", e))?;
    q.set_queue_max_len(queue, QUEUE_MAX)
        .map_err(|e| context("queue length", e))?;
    q.set_fail_open(queue, true)
        .map_err(|e| context("fail open", e))?;
    q.set_nonblocking(true);
    Ok(q)
}

fn hold(
    q: &mut nfq::Queue,
    stop: &AtomicBool,
    delay: Duration,
    jitter: Duration,
) -> Result<u64, String> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let mut rng = Jitter(seed);
    let spread = (jitter.as_micros() as u64).saturating_mul(2);
    let base = delay.saturating_sub(jitter);
    let mut held: BTreeMap<(Instant, u64), nfq::Message> = BTreeMap::new();
    let mut seq = 0u64;
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        loop {
            match q.recv() {
                Ok(message) => {
                    let extra = if spread == 0 { 0 } else { rng.next() % spread };
                    let due = Instant::now() + base + Duration::from_micros(extra);
                    held.insert((due, seq), message);
                    seq += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(format!("receiving from the queue: {e}")),
            }
        }
        let now = Instant::now();
        while let Some(entry) = held.first_entry() {
            if !stopping && entry.key().0 > now {
                break;
            }
            let mut message = entry.remove();
            message.set_verdict(nfq::Verdict::Accept);
            q.verdict(message)
                .map_err(|e| format!("releasing a packet: {e}"))?;
        }
        if stopping {
            return Ok(seq);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
