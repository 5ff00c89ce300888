//! Waiting for something the cluster (or a local process) does by itself: a leader, a
//! learner's catch-up, a snapshot, a restore, a node coming up or going away. Every wait
//! looks again at an interval until a deadline, and says on timeout what it saw last.

use std::time::Duration;

use tokio::time::Instant;

/// How often a wait on the cluster looks again: often enough to return soon after the
/// condition holds, seldom enough to cost a node nothing.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// What one look found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Look<T, S> {
    /// The condition holds; the wait returns this.
    Done(T),
    /// Not yet; this is what was seen, for the message if the deadline passes.
    NotYet(S),
}

impl<T> From<Option<T>> for Look<T, ()> {
    fn from(found: Option<T>) -> Self {
        found.map_or(Look::NotYet(()), Look::Done)
    }
}

/// Looks every `interval` until a look is [`Look::Done`] (its value is returned), a look
/// fails (its error is returned at once), or `deadline` passes (then the error is
/// `timed_out` of what the last look saw). Looks at least once, however late it is.
pub async fn poll_until<T, S, E>(
    deadline: Instant,
    interval: Duration,
    mut look: impl AsyncFnMut() -> Result<Look<T, S>, E>,
    timed_out: impl FnOnce(S) -> E,
) -> Result<T, E> {
    loop {
        let seen = match look().await? {
            Look::Done(value) => return Ok(value),
            Look::NotYet(seen) => seen,
        };
        if Instant::now() >= deadline {
            return Err(timed_out(seen));
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn returns_what_the_first_successful_look_finds() {
        let mut looks = 0;
        let found = poll_until(
            Instant::now() + Duration::from_secs(60),
            TICK,
            async || {
                looks += 1;
                Ok::<_, String>(if looks == 3 {
                    Look::Done(looks)
                } else {
                    Look::NotYet(())
                })
            },
            |()| "timed out".to_string(),
        )
        .await;
        assert_eq!(found, Ok(3));
    }

    #[tokio::test]
    async fn gives_up_at_the_deadline_with_what_it_saw_last() {
        let mut looks = 0;
        let result: Result<(), u32> = poll_until(
            Instant::now() + 20 * TICK,
            TICK,
            async || {
                looks += 1;
                Ok(Look::NotYet(looks))
            },
            |last| last,
        )
        .await;
        let last = result.expect_err("never done");
        assert!(last >= 2, "looked again until the deadline: {last}");
        assert_eq!(last, looks, "the message shows the last look");
    }

    #[tokio::test]
    async fn looks_once_even_past_the_deadline() {
        let found = poll_until(
            Instant::now(),
            TICK,
            async || Ok::<_, ()>(Look::<_, ()>::Done("late")),
            |()| (),
        )
        .await;
        assert_eq!(found, Ok("late"));
    }

    #[tokio::test]
    async fn a_failed_look_ends_the_wait_at_once() {
        let result: Result<(), &str> = poll_until(
            Instant::now() + Duration::from_secs(60),
            TICK,
            async || Err::<Look<(), ()>, _>("unreachable"),
            |()| "timed out",
        )
        .await;
        assert_eq!(result, Err("unreachable"));
        assert_eq!(Look::<u8, ()>::from(None), Look::NotYet(()));
        assert_eq!(Look::<u8, ()>::from(Some(7)), Look::Done(7));
    }
}
