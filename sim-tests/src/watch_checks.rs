//! Checks of the watchers' streams (issue 13): each segment (a run of pages with no
//! forgotten revision between them) is ordered and has no gap. Task ids are issued in
//! log order, so inside a segment the written versions must come in increasing id
//! order, and every acknowledged version of the group whose id lies between two that
//! the segment shows must be in it too: the segment covered the revisions between.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use crate::history::Answer;
use crate::history::History;

/// What the watch checks counted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct WatchReport {
    /// Changes the watchers saw.
    pub changes: usize,
    /// Revisions a watcher found forgotten on every node it asked (a new segment).
    pub gaps: usize,
}

/// Checks every watch stream of `history`; what it counted, or every violation.
pub fn check_watches(history: &History) -> Result<WatchReport, Vec<String>> {
    let mut acknowledged: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for op in &history.ops {
        if let Answer::Tasks(tasks) = &op.result {
            let ids = acknowledged.entry(op.group.as_str()).or_default();
            ids.extend(tasks.iter().filter(|t| t.group == op.group).map(|t| t.id));
        }
    }
    let mut problems = Vec::new();
    let mut report = WatchReport::default();
    for stream in &history.watches {
        report.gaps += stream.segments.len().saturating_sub(1);
        for (n, segment) in stream.segments.iter().enumerate() {
            report.changes += segment.len();
            let at = |i: usize| format!("group {} segment {n} change {i}", stream.group);
            for (i, pair) in segment.windows(2).enumerate() {
                if pair[1].revision < pair[0].revision {
                    problems.push(format!(
                        "{}: revision {} after {}: out of order",
                        at(i + 1),
                        pair[1].revision,
                        pair[0].revision
                    ));
                }
            }
            let seen: Vec<u64> = segment.iter().filter_map(|c| c.task).collect();
            if let Some(pair) = seen.windows(2).find(|pair| pair[1] <= pair[0]) {
                problems.push(format!(
                    "group {} segment {n}: task version {} after {}: out of order or twice",
                    stream.group, pair[1], pair[0]
                ));
            }
            let (Some(&first), Some(&last)) = (seen.iter().min(), seen.iter().max()) else {
                continue;
            };
            let seen: BTreeSet<u64> = seen.into_iter().collect();
            let missing: Vec<u64> = acknowledged
                .get(stream.group.as_str())
                .into_iter()
                .flat_map(|ids| ids.range(first..=last))
                .filter(|id| !seen.contains(id))
                .copied()
                .collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "group {} segment {n} shows versions {first} to {last} but skips acknowledged versions {missing:?}",
                    stream.group
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Call;
    use crate::history::WatchSeen;
    use crate::history::WatchStream;
    use crate::history::fixtures::op;
    use crate::history::fixtures::task;

    fn add(id: u64) -> crate::history::Op {
        let call = Call::Add {
            data: format!("d{id}"),
            depends: Vec::new(),
        };
        op(
            1,
            (0, 1),
            call,
            Answer::Tasks(vec![task(id, &format!("d{id}"), 0, 1)]),
        )
    }

    fn seen(revision: u64, task: Option<u64>) -> WatchSeen {
        WatchSeen { revision, task }
    }

    fn history(segments: Vec<Vec<WatchSeen>>) -> History {
        History {
            ops: vec![add(1), add(2), add(3)],
            watches: vec![WatchStream {
                group: "g".into(),
                segments,
            }],
            ..History::default()
        }
    }

    #[test]
    fn a_complete_ordered_stream_passes() {
        let report = check_watches(&history(vec![vec![
            seen(1, Some(1)),
            seen(2, Some(2)),
            seen(2, None),
            seen(3, Some(3)),
        ]]))
        .expect("no violation");
        assert_eq!(
            report,
            WatchReport {
                changes: 4,
                gaps: 0
            }
        );
    }

    #[test]
    fn a_skipped_version_is_caught_but_not_across_a_forgotten_revision() {
        let skipped = check_watches(&history(vec![vec![seen(1, Some(1)), seen(3, Some(3))]]))
            .expect_err("a gap");
        assert!(
            skipped[0].contains("skips acknowledged versions [2]"),
            "{skipped:?}"
        );
        let report = check_watches(&history(vec![
            vec![seen(1, Some(1))],
            vec![seen(3, Some(3))],
        ]))
        .expect("a gap the node said it forgot");
        assert_eq!(report.gaps, 1);
    }

    #[test]
    fn reordered_or_repeated_changes_are_caught() {
        let reordered = check_watches(&history(vec![vec![seen(2, Some(2)), seen(1, Some(1))]]))
            .expect_err("out of order");
        assert!(
            reordered.iter().any(|p| p.contains("out of order")),
            "{reordered:?}"
        );
        let repeated = check_watches(&history(vec![vec![seen(1, Some(1)), seen(1, Some(1))]]))
            .expect_err("twice");
        assert!(repeated[0].contains("twice"), "{repeated:?}");
    }
}
