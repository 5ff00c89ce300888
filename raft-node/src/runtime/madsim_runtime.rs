//! openraft's [`AsyncRuntime`] on the madsim simulator: tasks, timers and the clock are
//! the simulator's, randomness comes from its seeded generator, and the watch channel
//! wakes in FIFO order. Channels and the mutex are tokio's, which need no runtime.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::task::Poll;
use std::time::Duration;
use std::time::Instant;

use openraft::rt::AsyncRuntime;
use openraft::rt::OptionalSend;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::FifoWatch;

/// The simulator's runtime, for `--cfg madsim` builds.
pub struct MadsimRuntime {
    runtime: madsim::runtime::Runtime,
}

impl std::fmt::Debug for MadsimRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MadsimRuntime").finish()
    }
}

/// A future with a deadline. Both halves are boxed, so the struct is `Unpin` and needs
/// no pin projection.
pub struct SimTimeout<F: Future> {
    future: Pin<Box<F>>,
    sleep: Pin<Box<madsim::time::Sleep>>,
}

impl<F: Future> Future for SimTimeout<F> {
    type Output = Result<F::Output, madsim::time::error::Elapsed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(output) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Ok(output));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(madsim::time::error::Elapsed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRuntime for MadsimRuntime {
    type JoinError = madsim::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = madsim::task::JoinHandle<T>;
    type Sleep = madsim::time::Sleep;
    type Instant = Instant;
    type TimeoutError = madsim::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = SimTimeout<T>;
    type ThreadLocalRng = SmallRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        madsim::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        madsim::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        madsim::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        SimTimeout {
            future: Box::pin(future),
            sleep: Box::pin(madsim::time::sleep(duration)),
        }
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        SimTimeout {
            future: Box::pin(future),
            sleep: Box::pin(madsim::time::sleep_until(deadline)),
        }
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SmallRng::seed_from_u64(madsim::rand::random::<u64>())
    }

    type Mpsc = openraft_rt_tokio::TokioMpsc;
    type Watch = FifoWatch;
    type Oneshot = openraft_rt_tokio::TokioOneshot;
    type Mutex<T: OptionalSend + 'static> = openraft_rt_tokio::TokioMutex<T>;

    fn new(_threads: usize) -> Self {
        Self {
            runtime: madsim::runtime::Runtime::new(),
        }
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.runtime.block_on(future)
    }

    /// The simulator has no threads: the work runs inline, which is deterministic.
    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, std::io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        std::future::ready(Ok(f()))
    }
}
