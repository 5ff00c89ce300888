//! Waits for job outcomes (`GET /job` and `/jobs/wait` with `wait_ms`): a read that
//! is answered when every named job has finished (succeeded, dead or cancelled), or at
//! its deadline with the records as they are. It reads at the asked consistency each
//! time the group changes on this node or one of its leases ends; nothing is proposed.

use std::time::Duration;

use store_sm::machine::TaskMachine;
use tokio::time::Instant;

use super::Consistency;
use super::ReadView;
use super::ServiceError;
use crate::node::Node;
use crate::waiting::WaitKind;

impl Node {
    /// A view to answer from once every job of `group` named in `keys` has finished, or
    /// at the end of `wait`.
    pub async fn wait_jobs(
        &self,
        group: &str,
        keys: &[String],
        consistency: Consistency,
        wait: Duration,
    ) -> Result<ReadView, ServiceError> {
        let all_finished = |machine: &TaskMachine| {
            keys.iter().all(|key| {
                machine
                    .job(group, key)
                    .is_some_and(|record| record.state.has_ended())
            })
        };
        self.wait_for_jobs(group, consistency, wait, all_finished)
            .await
    }

    /// A view to answer from once the run of job `key` in `group` that this wait saw
    /// first (or `run`, when the caller already saw it) is over: the job finished, went
    /// on to its next run (a recurring or resubmitted job), or its record was dropped
    /// (a retention of 0). A key with no record is waited for until it has one that
    /// finishes.
    pub async fn wait_job_run(
        &self,
        group: &str,
        key: &str,
        run: Option<u32>,
        consistency: Consistency,
        wait: Duration,
    ) -> Result<ReadView, ServiceError> {
        let mut seen = run;
        let run_over = |machine: &TaskMachine| match machine.job(group, key) {
            Some(record) => {
                let run = *seen.get_or_insert(record.run);
                record.state.has_ended() || record.run != run
            }
            None => seen.is_some(),
        };
        self.wait_for_jobs(group, consistency, wait, run_over).await
    }

    /// A view to answer from once `done` holds for the machine as of the read's time,
    /// or at the end of `wait`. `done` is asked after each read of `group`'s changes.
    async fn wait_for_jobs(
        &self,
        group: &str,
        consistency: Consistency,
        wait: Duration,
        mut done: impl FnMut(&TaskMachine) -> bool,
    ) -> Result<ReadView, ServiceError> {
        if wait.is_zero() {
            return self.read(consistency).await;
        }
        let slot = self.waiters.enter(WaitKind::Job)?;
        let deadline = Instant::now() + wait;
        let signal = self.feed.signal(group);
        // A read is needed only after a change: at the deadline or a stop the last one
        // answers, which was linearizable within this request's time.
        let mut look = true;
        let mut woken = false;
        let mut last: Option<ReadView> = None;
        let answer = loop {
            let changed = signal.notified();
            let stopped = self.waiters.stopped();
            tokio::pin!(changed, stopped);
            changed.as_mut().enable();
            stopped.as_mut().enable();
            let view = match last.take() {
                // Nothing changed since it was read, but time passed: judge it now.
                Some(mut view) if !look => {
                    view.now = view.now.max(self.read_time(view.state.machine.log_time()));
                    view
                }
                _ => match self.read(consistency).await {
                    Ok(view) => view,
                    Err(e) => break Err(e),
                },
            };
            let finished = done(&view.state.machine.as_of(view.now));
            if woken {
                slot.woken(!finished);
            }
            if finished || self.waiters.is_stopping() || Instant::now() >= deadline {
                break Ok(view);
            }
            last = Some(view);
            // A lease that ends can end a job with no write (a lost last attempt leaves it
            // dead, and its dependants cancelled): look again when the group's next one
            // ends, as a blocking claim does.
            let wake_at = self
                .next_claimable_at(group)
                .map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                // Polled in order: the simulation needs the same choice on every replay.
                biased;
                () = &mut changed => (look, woken) = (true, true),
                () = &mut stopped => (look, woken) = (false, false),
                () = tokio::time::sleep_until(wake_at) => {
                    (look, woken) = (Instant::now() < deadline, false);
                }
            }
        };
        drop(signal);
        self.feed.release(group);
        answer
    }
}
