//! A watch channel that wakes its waiters in the order they started waiting.
//!
//! tokio's watch channel does not promise an order, and under the simulator an order
//! that depends on anything but the seed breaks replay. This one keeps waiters in a
//! queue and wakes them front to back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::RwLock;
use std::sync::RwLockReadGuard;
use std::task::Poll;
use std::task::Waker;

use openraft::rt::OptionalSend;
use openraft::rt::OptionalSync;
use openraft::rt::watch;

/// The [`watch::Watch`] implementation of [`super::MadsimRuntime`].
pub struct FifoWatch;

struct Shared<T> {
    value: RwLock<T>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Bumped by every change; a receiver has seen the change when it holds this.
    version: u64,
    senders: usize,
    receivers: usize,
    waiters: VecDeque<Waker>,
}

impl<T> Shared<T> {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, T> {
        self.value.read().unwrap_or_else(|p| p.into_inner())
    }

    fn wake_all(&self) {
        let waiters = std::mem::take(&mut self.state().waiters);
        for waker in waiters {
            waker.wake();
        }
    }
}

/// The sending half.
pub struct FifoWatchSender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving half.
pub struct FifoWatchReceiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
}

impl<T> Clone for FifoWatchSender<T> {
    fn clone(&self) -> Self {
        self.shared.state().senders += 1;
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for FifoWatchSender<T> {
    fn drop(&mut self) {
        let last = {
            let mut state = self.shared.state();
            state.senders -= 1;
            state.senders == 0
        };
        if last {
            // Waiters learn that no change will ever come.
            self.shared.wake_all();
        }
    }
}

impl<T> Clone for FifoWatchReceiver<T> {
    fn clone(&self) -> Self {
        self.shared.state().receivers += 1;
        Self {
            shared: Arc::clone(&self.shared),
            seen: self.seen,
        }
    }
}

impl<T> Drop for FifoWatchReceiver<T> {
    fn drop(&mut self) {
        self.shared.state().receivers -= 1;
    }
}

impl watch::Watch for FifoWatch {
    type Sender<T: OptionalSend + OptionalSync> = FifoWatchSender<T>;
    type Receiver<T: OptionalSend + OptionalSync> = FifoWatchReceiver<T>;
    type Ref<'a, T: OptionalSend + 'a> = RwLockReadGuard<'a, T>;

    fn channel<T: OptionalSend + OptionalSync>(init: T) -> (Self::Sender<T>, Self::Receiver<T>) {
        let shared = Arc::new(Shared {
            value: RwLock::new(init),
            state: Mutex::new(State {
                senders: 1,
                receivers: 1,
                ..State::default()
            }),
        });
        let receiver = FifoWatchReceiver {
            shared: Arc::clone(&shared),
            seen: 0,
        };
        (FifoWatchSender { shared }, receiver)
    }
}

impl<T: OptionalSend + OptionalSync> watch::WatchSender<FifoWatch, T> for FifoWatchSender<T> {
    fn send(&self, value: T) -> Result<(), watch::SendError<T>> {
        if self.shared.state().receivers == 0 {
            return Err(watch::SendError(value));
        }
        self.send_if_modified(|current| {
            *current = value;
            true
        });
        Ok(())
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        let modified = {
            let mut value = self.shared.value.write().unwrap_or_else(|p| p.into_inner());
            modify(&mut value)
        };
        if modified {
            self.shared.state().version += 1;
            self.shared.wake_all();
        }
        modified
    }

    fn borrow_watched(&self) -> RwLockReadGuard<'_, T> {
        self.shared.read()
    }

    fn subscribe(&self) -> FifoWatchReceiver<T> {
        let seen = {
            let mut state = self.shared.state();
            state.receivers += 1;
            state.version
        };
        FifoWatchReceiver {
            shared: Arc::clone(&self.shared),
            seen,
        }
    }
}

impl<T: OptionalSend + OptionalSync> watch::WatchReceiver<FifoWatch, T> for FifoWatchReceiver<T> {
    async fn changed(&mut self) -> Result<(), watch::RecvError> {
        std::future::poll_fn(|cx| {
            let mut state = self.shared.state();
            if state.version != self.seen {
                self.seen = state.version;
                return Poll::Ready(Ok(()));
            }
            if state.senders == 0 {
                return Poll::Ready(Err(watch::RecvError(())));
            }
            if !state.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                state.waiters.push_back(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    fn borrow_watched(&self) -> RwLockReadGuard<'_, T> {
        self.shared.read()
    }

    fn borrow_and_update(&mut self) -> RwLockReadGuard<'_, T> {
        self.seen = self.shared.state().version;
        self.shared.read()
    }
}
