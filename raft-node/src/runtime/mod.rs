//! The runtime seam: the one place that decides which async runtime openraft runs on.
//!
//! A normal build uses openraft's tokio runtime. A build with `--cfg madsim` uses
//! [`MadsimRuntime`], whose tasks, timers, clock and randomness all come from the
//! simulator, so a seed replays a run exactly. Everything else in the node reaches
//! tasks, time and sockets through `tokio`, which is `madsim-tokio`: real tokio in a
//! normal build, the simulator's under `--cfg madsim`.

#[cfg(madsim)]
mod fifo_watch;
#[cfg(madsim)]
mod madsim_runtime;

#[cfg(madsim)]
pub use fifo_watch::FifoWatch;
#[cfg(madsim)]
pub use madsim_runtime::MadsimRuntime;

/// The runtime openraft runs on in this build.
#[cfg(not(madsim))]
pub type NodeRuntime = openraft::TokioRuntime;

/// The runtime openraft runs on in this build.
#[cfg(madsim)]
pub type NodeRuntime = MadsimRuntime;

/// hyper's timer on the seam's clock (hyper-util's `TokioTimer` reaches for real
/// tokio, which does not run in simulation).
#[derive(Clone, Copy, Debug, Default)]
pub struct HyperTimer;

/// A sleep hyper can hold.
struct HyperSleep(std::pin::Pin<Box<tokio::time::Sleep>>);

impl std::future::Future for HyperSleep {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for HyperSleep {}

impl hyper::rt::Timer for HyperTimer {
    fn sleep(&self, duration: std::time::Duration) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(HyperSleep(Box::pin(tokio::time::sleep(duration))))
    }

    fn sleep_until(
        &self,
        deadline: std::time::Instant,
    ) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        #[cfg(madsim)]
        let sleep = tokio::time::sleep_until(deadline);
        #[cfg(not(madsim))]
        let sleep = tokio::time::sleep_until(deadline.into());
        Box::pin(HyperSleep(Box::pin(sleep)))
    }
}
