//! One group's index of its tasks: claim order by priority, then `(available time,
//! id)`; tasks waiting for prerequisites apart; a count of leased tasks.

use std::cmp::Reverse;

use imbl::OrdMap;
use imbl::OrdSet;

use crate::LogTime;
use crate::types::TaskId;

/// A task's place in its group's claim order.
pub(crate) type Position = (LogTime, TaskId);

/// See the module documentation. Cloning is O(1) (persistent maps).
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupIndex {
    /// Claimable tasks, highest priority first, each level in `(available time, id)`
    /// order. Claims look at the first available task of each level: O(levels · log n).
    levels: OrdMap<Reverse<i64>, OrdSet<Position>>,
    /// Tasks whose prerequisites have not all succeeded: listed, never claimed.
    blocked: OrdSet<Position>,
    /// How many of the group's tasks are a claim's lease that has not lapsed.
    pub(crate) running: usize,
    len: usize,
}

impl GroupIndex {
    /// Adds a task at `position`, claimable at `priority` unless `blocked`.
    pub(crate) fn insert(&mut self, position: Position, priority: i64, blocked: bool) {
        let inserted = if blocked {
            self.blocked.insert(position).is_none()
        } else {
            self.levels
                .entry(Reverse(priority))
                .or_default()
                .insert(position)
                .is_none()
        };
        if inserted {
            self.len += 1;
        }
    }

    /// Removes the task at `position` (claimable at `priority`, or blocked); whether it
    /// was there.
    pub(crate) fn remove(&mut self, position: &Position, priority: i64) -> bool {
        let removed = self.blocked.remove(position).is_some() || {
            let level = Reverse(priority);
            let removed = self
                .levels
                .get_mut(&level)
                .is_some_and(|tasks| tasks.remove(position).is_some());
            if self.levels.get(&level).is_some_and(OrdSet::is_empty) {
                self.levels.remove(&level);
            }
            removed
        };
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Moves a blocked task to the claimable order; whether it was blocked.
    pub(crate) fn unblock(&mut self, position: &Position, priority: i64) -> bool {
        if self.blocked.remove(position).is_none() {
            return false;
        }
        self.levels
            .entry(Reverse(priority))
            .or_default()
            .insert(*position);
        true
    }

    /// Whether a task sits at `position`, claimable or blocked (for the invariants).
    #[cfg(debug_assertions)]
    pub(crate) fn contains(&self, position: &Position) -> bool {
        self.blocked.contains(position) || self.levels.values().any(|l| l.contains(position))
    }

    /// Number of tasks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the group holds no task.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The task a claim at `now` takes: the highest priority level's first task available
    /// at `now` that `skip` does not exclude.
    pub(crate) fn first_claimable(
        &self,
        now: LogTime,
        skip: impl Fn(TaskId) -> bool,
    ) -> Option<TaskId> {
        self.levels.values().find_map(|level| {
            level
                .range(..=(now, TaskId::MAX))
                .map(|&(_, id)| id)
                .find(|&id| !skip(id))
        })
    }

    /// How many claimable tasks are available at `now`, counting at most `limit`.
    pub(crate) fn available_count(&self, now: LogTime, limit: usize) -> usize {
        let mut count = 0;
        for level in self.levels.values() {
            count += level
                .range(..=(now, TaskId::MAX))
                .take(limit - count)
                .count();
            if count >= limit {
                break;
            }
        }
        count
    }

    /// The earliest time after `now` at which a claimable task becomes available.
    pub(crate) fn next_available_after(&self, now: LogTime) -> Option<LogTime> {
        self.levels
            .values()
            .filter_map(|level| {
                level
                    .range((
                        std::ops::Bound::Excluded((now, TaskId::MAX)),
                        std::ops::Bound::Unbounded,
                    ))
                    .next()
                    .map(|&(at, _)| at)
            })
            .min()
    }

    /// Every task at or before `upper` and strictly after `after`, in `(available time,
    /// id)` order across levels and blocked tasks: the seed's listing order. O(levels)
    /// per task.
    pub(crate) fn in_order(
        &self,
        after: Option<(LogTime, TaskId)>,
        upper: LogTime,
    ) -> impl Iterator<Item = TaskId> + '_ {
        let bound = (upper, TaskId::MAX);
        let lower = match after {
            Some(after) => std::ops::Bound::Excluded(after),
            None => std::ops::Bound::Unbounded,
        };
        let mut sources: Vec<_> = self
            .levels
            .values()
            .chain(std::iter::once(&self.blocked))
            .map(|set| {
                if after.is_some_and(|a| a > bound) {
                    // Past the upper bound: an empty range (a reversed one would panic).
                    set.range(bound..bound).peekable()
                } else {
                    set.range((lower, std::ops::Bound::Included(bound)))
                        .peekable()
                }
            })
            .collect();
        std::iter::from_fn(move || {
            let next = sources
                .iter_mut()
                .enumerate()
                .filter_map(|(at, source)| source.peek().map(|&&position| (position, at)))
                .min()?;
            sources[next.1].next();
            Some(next.0.1)
        })
    }
}
