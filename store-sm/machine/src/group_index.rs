//! One group's index of its tasks: claim order by priority, then `(available time,
//! id)`; tasks waiting for prerequisites apart; a count of leased tasks.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use imbl::OrdMap;
use imbl::OrdSet;

use crate::LogTime;
use crate::types::TaskId;

/// A task's place in its group's claim order.
pub(crate) type Position = (LogTime, TaskId);

/// A priority level's key: the highest priority sorts first.
type Level = Reverse<i64>;

/// See the module documentation. Cloning is O(1) (persistent maps).
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupIndex {
    /// Claimable tasks, highest priority first, each level in `(available time, id)`
    /// order.
    levels: OrdMap<Level, OrdSet<Position>>,
    /// Each level's first task, in `(available time, id)` order: the levels that hold a
    /// task available at a time are a prefix of it. Claims walk it alongside `levels`,
    /// so a claim costs O(log n) per level that is either above the one it takes or
    /// available at all, not per level of the group: a group of many priorities whose
    /// tasks are leased or scheduled later answers an empty claim at once.
    heads: OrdSet<(Position, Level)>,
    /// Tasks whose prerequisites have not all succeeded: listed, never claimed.
    blocked: OrdSet<Position>,
    /// How many of the group's tasks are a claim's lease that has not lapsed.
    pub(crate) running: usize,
    len: usize,
}

/// The last position available at `now`: ranges up to it hold what a claim may take.
fn available_until(now: LogTime) -> Position {
    (now, TaskId::MAX)
}

impl GroupIndex {
    /// Adds a task at `position`, claimable at `priority` unless `blocked`.
    pub(crate) fn insert(&mut self, position: Position, priority: i64, blocked: bool) {
        let inserted = if blocked {
            self.blocked.insert(position).is_none()
        } else {
            self.insert_claimable(position, Reverse(priority))
        };
        if inserted {
            self.len += 1;
        }
    }

    /// Puts `position` in `level`, keeping the level's head; whether it was new.
    fn insert_claimable(&mut self, position: Position, level: Level) -> bool {
        let tasks = self.levels.entry(level).or_default();
        let old_head = tasks.get_min().copied();
        if tasks.insert(position).is_some() {
            return false;
        }
        if old_head.is_none_or(|head| position < head) {
            if let Some(head) = old_head {
                self.heads.remove(&(head, level));
            }
            self.heads.insert((position, level));
        }
        true
    }

    /// Removes the task at `position` (claimable at `priority`, or blocked); whether it
    /// was there.
    pub(crate) fn remove(&mut self, position: &Position, priority: i64) -> bool {
        let removed =
            self.blocked.remove(position).is_some() || self.remove_claimable(position, priority);
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Takes `position` out of its level, keeping the level's head; whether it was there.
    fn remove_claimable(&mut self, position: &Position, priority: i64) -> bool {
        let level = Reverse(priority);
        let Some(tasks) = self.levels.get_mut(&level) else {
            return false;
        };
        if tasks.remove(position).is_none() {
            return false;
        }
        let next_head = tasks.get_min().copied();
        if next_head.is_none_or(|head| *position < head) {
            self.heads.remove(&(*position, level));
            match next_head {
                Some(head) => {
                    self.heads.insert((head, level));
                }
                None => {
                    self.levels.remove(&level);
                }
            }
        }
        true
    }

    /// Moves a blocked task to the claimable order; whether it was blocked.
    pub(crate) fn unblock(&mut self, position: &Position, priority: i64) -> bool {
        if self.blocked.remove(position).is_none() {
            return false;
        }
        self.insert_claimable(*position, Reverse(priority));
        true
    }

    /// Whether a task sits at `position`, claimable or blocked, with its level's head
    /// recorded (for the invariants: O(levels), as before the heads).
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn contains(&self, position: &Position) -> bool {
        if self.heads.len() != self.levels.len() {
            return false;
        }
        self.blocked.contains(position)
            || self.levels.iter().any(|(level, tasks)| {
                tasks.contains(position)
                    && tasks
                        .get_min()
                        .is_some_and(|head| self.heads.contains(&(*head, *level)))
            })
    }

    /// Number of tasks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the group holds no task.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The levels that hold a task available at `now`, in the order of their first.
    fn available_levels(&self, now: LogTime) -> impl Iterator<Item = (Level, &OrdSet<Position>)> {
        let last = (available_until(now), Reverse(i64::MIN));
        self.heads.range(..=last).filter_map(|(_, level)| {
            let tasks = self.levels.get(level);
            debug_assert!(tasks.is_some(), "a head names a level that is gone");
            tasks.map(|tasks| (*level, tasks))
        })
    }

    /// The task a claim at `now` takes: the highest priority level's first task available
    /// at `now` that `skip` does not exclude.
    pub(crate) fn first_claimable(
        &self,
        now: LogTime,
        skip: impl Fn(TaskId) -> bool,
    ) -> Option<TaskId> {
        let first_in = |tasks: &OrdSet<Position>| {
            tasks
                .range(..=available_until(now))
                .map(|&(_, id)| id)
                .find(|&id| !skip(id))
        };
        // Two walks in step, until one settles it: the levels by priority (the first
        // that holds a task to take is the answer), and the levels that hold an
        // available task at all (once all are known, the answer is among them).
        let mut by_priority = self.levels.iter();
        // Made only past the first level: most claims stop there.
        let mut available = None;
        let mut known = Vec::new();
        loop {
            let (level, tasks) = by_priority.next()?;
            if let Some(id) = first_in(tasks) {
                return Some(id);
            }
            let walk = available.get_or_insert_with(|| self.available_levels(now));
            let Some(found) = walk.next() else {
                break;
            };
            // Levels above this one in priority order hold nothing to take.
            if found.0 > *level {
                known.push(found);
            }
        }
        known.sort_unstable_by_key(|(level, _)| *level);
        known.into_iter().find_map(|(_, tasks)| first_in(tasks))
    }

    /// How many claimable tasks are available at `now`, counting at most `limit`.
    pub(crate) fn available_count(&self, now: LogTime, limit: usize) -> usize {
        let mut count = 0;
        for (_, tasks) in self.available_levels(now) {
            if count >= limit {
                break;
            }
            count += tasks
                .range(..=available_until(now))
                .take(limit - count)
                .count();
        }
        count
    }

    /// The earliest time after `now` at which a claimable task becomes available.
    pub(crate) fn next_available_after(&self, now: LogTime) -> Option<LogTime> {
        let after = std::ops::Bound::Excluded(available_until(now));
        // A level whose first task is later than `now` offers that one; a level with
        // one available now may hold a later one before it.
        let first_later_head = self
            .heads
            .range((
                std::ops::Bound::Excluded((available_until(now), Reverse(i64::MIN))),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .map(|&((at, _), _)| at);
        self.available_levels(now)
            .filter_map(|(_, tasks)| {
                tasks
                    .range((after, std::ops::Bound::Unbounded))
                    .next()
                    .map(|&(at, _)| at)
            })
            .chain(first_later_head)
            .min()
    }

    /// Every task at or before `upper` and strictly after `after`, in `(available time,
    /// id)` order across levels and blocked tasks: the seed's listing order. O(levels)
    /// to start, then O(log levels) per task.
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
                    set.range(bound..bound)
                } else {
                    set.range((lower, std::ops::Bound::Included(bound)))
                }
            })
            .collect();
        // Each source's next task, smallest first.
        let mut next: BinaryHeap<Reverse<(Position, usize)>> = sources
            .iter_mut()
            .enumerate()
            .filter_map(|(at, source)| source.next().map(|&position| Reverse((position, at))))
            .collect();
        std::iter::from_fn(move || {
            let Reverse((position, at)) = next.pop()?;
            if let Some(&following) = sources[at].next() {
                next.push(Reverse((following, at)));
            }
            Some(position.1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index as a plain list, each query answered by looking at everything.
    #[derive(Default)]
    struct Plain(Vec<(Position, i64, bool)>);

    impl Plain {
        fn claimable(&self, now: LogTime) -> impl Iterator<Item = &(Position, i64, bool)> {
            self.0
                .iter()
                .filter(move |(position, _, blocked)| !blocked && position.0 <= now)
        }

        fn first_claimable(&self, now: LogTime, skip: impl Fn(TaskId) -> bool) -> Option<TaskId> {
            self.claimable(now)
                .filter(|(position, _, _)| !skip(position.1))
                .min_by_key(|(position, priority, _)| (Reverse(*priority), *position))
                .map(|(position, _, _)| position.1)
        }

        fn next_available_after(&self, now: LogTime) -> Option<LogTime> {
            self.0
                .iter()
                .filter(|(position, _, blocked)| !blocked && position.0 > now)
                .map(|(position, _, _)| position.0)
                .min()
        }
    }

    /// The index against the plain list through random inserts, removals and unblocks
    /// over few and many priorities, with and without skipped tasks.
    #[test]
    fn agrees_with_looking_at_every_task() {
        let mut next = crate::test_numbers(0x2545_f491_4f6c_dd1d);
        for priorities in [1, 3, 40, 400] {
            let mut index = GroupIndex::default();
            let mut plain = Plain::default();
            for step in 0..2_000u64 {
                match next(10) {
                    0..=4 => {
                        let position = (LogTime::from_millis(next(100) as i64), step);
                        let priority = next(priorities) as i64 - 2;
                        let blocked = next(8) == 0;
                        index.insert(position, priority, blocked);
                        plain.0.push((position, priority, blocked));
                    }
                    5..=7 if !plain.0.is_empty() => {
                        let (position, priority, _) =
                            plain.0.swap_remove(next(plain.0.len() as u64) as usize);
                        assert!(index.remove(&position, priority), "step {step}");
                    }
                    _ => {
                        if let Some(at) = plain.0.iter().position(|(_, _, blocked)| *blocked) {
                            let (position, priority, _) = plain.0[at];
                            plain.0[at].2 = false;
                            assert!(index.unblock(&position, priority), "step {step}");
                        }
                    }
                }
                let now = LogTime::from_millis(next(110) as i64);
                let skipped = next(3) as TaskId * step / 3;
                let skip = |id: TaskId| id == skipped;
                let what = format!("step {step}, {priorities} priorities, now {now}");
                assert_eq!(index.len(), plain.0.len(), "{what}");
                assert_eq!(
                    index.first_claimable(now, skip),
                    plain.first_claimable(now, skip),
                    "{what}"
                );
                assert_eq!(
                    index.first_claimable(now, |_| false),
                    plain.first_claimable(now, |_| false),
                    "{what}"
                );
                let limit = next(20) as usize;
                let count = plain.claimable(now).count().min(limit);
                assert_eq!(index.available_count(now, limit), count, "{what}");
                assert_eq!(
                    index.next_available_after(now),
                    plain.next_available_after(now),
                    "{what}"
                );
                let mut listed: Vec<Position> = plain
                    .0
                    .iter()
                    .map(|(position, _, _)| *position)
                    .filter(|position| position.0 <= now)
                    .collect();
                listed.sort_unstable();
                let from_index: Vec<TaskId> = index.in_order(None, now).collect();
                let expected: Vec<TaskId> = listed.iter().map(|position| position.1).collect();
                assert_eq!(from_index, expected, "{what}");
                if let Some(&middle) = listed.get(listed.len() / 2) {
                    let rest: Vec<TaskId> = index.in_order(Some(middle), now).collect();
                    assert_eq!(rest, expected[listed.len() / 2 + 1..], "{what}");
                }
                // O(tasks · levels): now and then.
                assert!(
                    step % 100 != 0
                        || plain
                            .0
                            .iter()
                            .all(|(position, _, _)| index.contains(position)),
                    "{what}"
                );
            }
        }
    }
}
