//! Snapshot builds at a low CPU priority. A node builds a snapshot every 50 000 entries
//! by default: an encode of the whole state (about 0.1 s of CPU for 200 000 tasks) that
//! competed on equal terms with the threads answering requests. On two shared cores that
//! doubled the claim p99 at half the peak load (docs/performance.md, session 17). At
//! nice 10, a build takes mostly the CPU those threads leave idle, and under full load
//! still gets about a tenth of the share of each busy thread it competes with. Nice 19
//! did no better for the p99 and would leave it about 1.5%: a build of millions of
//! tasks (seconds of CPU) could then take many minutes while the log waits for it.
//!
//! The thread is one of its own, made per build and named: a thread that lowers its
//! priority cannot raise it back without `CAP_SYS_NICE`, so the lowered priority must
//! end with the build's thread rather than pass to whatever work a shared thread runs
//! next.

use std::io;

/// The nice value of a snapshot-building thread (0 is the default, 19 the lowest).
pub const SNAPSHOT_NICE: i32 = 10;

/// Runs `work` on a new thread named `name` at nice [`SNAPSHOT_NICE`] (on Linux; at the
/// process's priority elsewhere, or if the kernel refuses) and answers what it returns.
pub async fn run_at_low_priority<T, F>(name: &str, work: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (answer, answered) = futures_channel::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            lower_this_thread();
            let _ = answer.send(work());
        })?;
    answered
        .await
        .map_err(|_| io::Error::other(format!("the {name} thread ended without an answer")))
}

/// Lowers the calling thread's CPU priority (Linux keeps a nice value per thread).
fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        let thread = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(thread), SNAPSHOT_NICE) {
            tracing::debug!(error = %e, "a snapshot thread keeps the process's priority");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_a_named_thread_at_the_lowered_priority() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let (name, nice) = runtime
            .block_on(run_at_low_priority("rota-test-low", || {
                let name = std::thread::current().name().map(str::to_string);
                #[cfg(target_os = "linux")]
                let nice = rustix::process::getpriority_process(Some(rustix::thread::gettid()))
                    .expect("its priority");
                #[cfg(not(target_os = "linux"))]
                let nice = SNAPSHOT_NICE;
                (name, nice)
            }))
            .expect("answered");
        assert_eq!(name.as_deref(), Some("rota-test-low"));
        assert_eq!(nice, SNAPSHOT_NICE);
        #[cfg(target_os = "linux")]
        assert_ne!(
            rustix::process::getpriority_process(Some(rustix::thread::gettid())),
            Ok(SNAPSHOT_NICE),
            "the caller's thread keeps its priority"
        );
    }

    #[test]
    fn a_panicking_build_is_an_error_not_a_hang() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let failed = runtime.block_on(run_at_low_priority("rota-test-panic", || -> u8 {
            panic!("a planted panic")
        }));
        assert!(failed.is_err());
    }
}
