//! Membership changes made as an operator makes them, through the built `rota` binary
//! (`rota cluster add-learner | promote | remove | transfer-leader | status`), run from the
//! worker namespace while the lab's faults go on.
//!
//! Under faults a command may fail, time out or be cut off after the cluster already
//! made the change. So every change is driven by [`Lab::ensure`]: run the command (with
//! a bound), then look at the leader's own view of the cluster; the change is done when
//! that view shows it committed, whatever the command said. Otherwise the command runs
//! again, until a bound that fails the test. The lab records the membership each change
//! leaves ([`Lab::ids`] and [`Lab::voters`] follow it), and which ids are retired.

use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use rpc::admin::AddLearnerJson;
use rpc::admin::ClusterStatusJson;

use super::Lab;

/// Longest one `rota` invocation may run before the lab kills it: its admin call alone
/// may take 30 s (the CLI's deadline for a change to commit).
const CLI_MAX: Duration = Duration::from_secs(45);

/// `--timeout` of every membership command: its longest wait for a leader, a learner's
/// catch-up or a new leader.
const CLI_WAIT_SECS: &str = "20";

/// Longest one change may take, every retry included: room for a run cut off at
/// [`CLI_MAX`] and another, well inside the supervisor's bound on the whole run.
const CHANGE_MAX: Duration = Duration::from_secs(75);

/// Lines of a command's output echoed into the transcript.
const ECHO_LINES: usize = 12;

/// After a command reported success, how long the leader may take to show the change.
const SHOWN_MAX: Duration = Duration::from_secs(15);

/// After a command failed, how long to look for the change in the leader's view before
/// running the command again.
const SETTLE_MAX: Duration = Duration::from_secs(5);

/// What one `rota` invocation did.
#[derive(Debug)]
pub struct CliRun {
    /// Exit code; `None` when killed (after [`CLI_MAX`], or by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CliRun {
    /// Exit 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    fn brief(&self) -> String {
        let said = self.stderr.trim();
        let said = if said.is_empty() {
            self.stdout.trim()
        } else {
            said
        };
        format!("exit {:?}: {said}", self.code)
    }
}

/// What [`Lab::ensure`] asks of the leader's view once the change is done.
struct Goal<'a> {
    /// Whether the change shows in the leader's committed configuration.
    done: &'a dyn Fn(&ClusterStatusJson) -> bool,
    /// Whether, once shown, it stays: membership changes do; a leadership transfer may be
    /// undone by a later election, and is then made again.
    sticky: bool,
}

impl Lab {
    /// Runs `rota args...` (the binary cargo built beside this test) from the worker
    /// namespace, echoing it as a transcript; killed after [`CLI_MAX`].
    pub async fn rota(&self, args: &[String]) -> CliRun {
        self.say(&format!("$ rota {}", args.join(" ")));
        let started = Instant::now();
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rota"));
        if let Some((tokens, _)) = self.tokens.get() {
            command.env(rpc::auth::TOKEN_ENV, &tokens.admin);
        }
        command
            .args(args)
            .stdin(Stdio::null())
            // A command cut off at the bound must not go on changing the cluster.
            .kill_on_drop(true);
        let run = match tokio::time::timeout(CLI_MAX, command.output()).await {
            Ok(Ok(output)) => CliRun {
                code: output.status.code(),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            },
            Ok(Err(e)) => panic!("rota cannot run: {e}"),
            Err(_) => CliRun {
                code: None,
                stdout: String::new(),
                stderr: format!("killed by the test after {CLI_MAX:?}"),
            },
        };
        let lines: Vec<&str> = run.stdout.lines().chain(run.stderr.lines()).collect();
        for line in lines.iter().take(ECHO_LINES) {
            self.say(&format!("  | {line}"));
        }
        if lines.len() > ECHO_LINES {
            self.say(&format!("  | ... {} more lines", lines.len() - ECHO_LINES));
        }
        self.say(&format!(
            "  (exit {:?} after {:.1?})",
            run.code,
            started.elapsed()
        ));
        run
    }

    /// `--url` as an operator writes it: every member. SIGSTOPped members go last: the
    /// CLI tries the nodes in turn, and a stopped node costs each call its whole deadline
    /// (10 s) before the next is tried. A node a partition cut off goes *first*, so every
    /// command proves the CLI looks past a node that answers but knows no leader (it
    /// once asked only the first node that answered who leads, and failed).
    pub fn url(&self) -> String {
        let paused = self
            .paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let cut_off = self
            .cut_off
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut ids = self.ids();
        ids.sort_by_key(|id| (paused.contains(id), !cut_off.contains(id), *id));
        ids.into_iter()
            .map(|id| self.spec.api(id))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The view of the member that says it leads, of the highest term (a leader cut off
    /// may still believe it leads, in an older term), asked of every running member.
    pub async fn leader_view(&self) -> Option<ClusterStatusJson> {
        let paused = self
            .paused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut best: Option<ClusterStatusJson> = None;
        for id in self.ids() {
            if paused.contains(&id) {
                continue;
            }
            let Some(view) = self.status(id).await else {
                continue;
            };
            if view.leader == Some(view.id)
                && !view.removed
                && best.as_ref().is_none_or(|b| view.term > b.term)
            {
                best = Some(view);
            }
        }
        best
    }

    /// Waits up to `within` for a leader whose committed, non-joint configuration
    /// satisfies `done`.
    pub async fn settled_view(
        &self,
        within: Duration,
        done: &dyn Fn(&ClusterStatusJson) -> bool,
    ) -> Option<ClusterStatusJson> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(view) = self.leader_view().await
                && view.membership_committed
                && !view.joint
                && done(&view)
            {
                return Some(view);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Records a membership change of `kind` and says what it is.
    pub fn change(&self, kind: &'static str, detail: &str) {
        {
            let mut log = self.changes.lock().unwrap_or_else(|p| p.into_inner());
            if !log.counts.contains_key(kind) {
                log.order.push(kind);
            }
            *log.counts.entry(kind).or_default() += 1;
        }
        self.say(&format!("CHANGE {kind}: {detail}"));
    }

    /// `kind xN, ...` of the membership changes made, in the order first made.
    pub fn changes_summary(&self) -> String {
        let log = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        log.order
            .iter()
            .map(|kind| format!("{kind} x{}", log.counts[kind]))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Takes voters and learners from a leader's committed view.
    fn adopt(&self, view: &ClusterStatusJson) {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        members.voters = view.voters.clone();
        members.learners = view.learners.clone();
    }

    /// Ids removed from the cluster during the test, ascending.
    pub fn retired(&self) -> Vec<u64> {
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        members.retired.clone()
    }

    /// Runs `rota cluster VERB --url <members> --timeout .. REST...` until the leader's
    /// committed view shows the change (`goal`), however the runs ended; the view.
    /// A run that fails or is cut off leaves the outcome unknown: the view decides whether
    /// it took effect, and only if it did not is the command run again. Fails the test
    /// after [`CHANGE_MAX`], or at once on a usage error or a success the cluster does not
    /// show.
    async fn ensure(&self, verb: &str, rest: &[String], goal: Goal<'_>) -> ClusterStatusJson {
        let deadline = Instant::now() + CHANGE_MAX;
        let mut runs: Vec<String> = Vec::new();
        loop {
            let mut args: Vec<String> = ["cluster", verb, "--url", &self.url()]
                .into_iter()
                .map(str::to_string)
                .collect();
            args.extend(["--timeout".to_string(), CLI_WAIT_SECS.to_string()]);
            args.extend_from_slice(rest);
            let run = self.rota(&args).await;
            runs.push(run.brief());
            assert_ne!(
                run.code,
                Some(2),
                "`rota {}` is a usage error: {}",
                args.join(" "),
                run.stderr
            );
            let within = if run.ok() { SHOWN_MAX } else { SETTLE_MAX };
            if let Some(view) = self.settled_view(within, goal.done).await {
                if !run.ok() {
                    self.say(&format!(
                        "`rota cluster {verb}` did not report success ({}), yet the leader's configuration shows the change: it took effect",
                        run.brief()
                    ));
                }
                if runs.len() > 1 {
                    self.say(&format!(
                        "`rota cluster {verb}` done after {} runs",
                        runs.len()
                    ));
                }
                self.adopt(&view);
                return view;
            }
            assert!(
                !(run.ok() && goal.sticky),
                "`rota {}` reported success, but no leader showed the change within {SHOWN_MAX:?}; leader's view: {:?}",
                args.join(" "),
                self.leader_view().await
            );
            assert!(
                Instant::now() < deadline,
                "`rota cluster {verb} {}` did not take effect within {CHANGE_MAX:?} ({} runs: {runs:#?}); leader's view: {:?}",
                rest.join(" "),
                runs.len(),
                self.leader_view().await
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// `rota cluster add-learner` of node `id` (running, empty) at its addresses, until it
    /// is a learner; the CLI waits for it to catch up too.
    pub async fn add_learner(&self, id: u64) -> ClusterStatusJson {
        self.change(
            "add-learner",
            &format!("node {id} (empty) joins as a learner"),
        );
        let rest = self.member_args(id);
        let done = move |v: &ClusterStatusJson| v.learners.contains(&id);
        let view = self
            .ensure(
                "add-learner",
                &rest,
                Goal {
                    done: &done,
                    sticky: true,
                },
            )
            .await;
        self.say(&format!(
            "node {id} is a learner: voters {:?}, learners {:?}",
            view.voters, view.learners
        ));
        view
    }

    /// `rota cluster promote` of learner `id`, until it is a voter.
    pub async fn promote(&self, id: u64) -> ClusterStatusJson {
        self.change("promote", &format!("learner {id} becomes a voter"));
        let done = move |v: &ClusterStatusJson| v.voters.contains(&id);
        let view = self
            .ensure(
                "promote",
                &["--id".to_string(), id.to_string()],
                Goal {
                    done: &done,
                    sticky: true,
                },
            )
            .await;
        self.say(&format!("node {id} is a voter: voters {:?}", view.voters));
        view
    }

    /// `rota cluster remove` of voter or learner `id`, until it is gone and retired;
    /// records its id as retired. Its process keeps running: stopping it is the caller's
    /// step.
    pub async fn remove(&self, id: u64) -> ClusterStatusJson {
        let role = if self.voters().contains(&id) {
            "voter"
        } else {
            "learner"
        };
        self.change("remove", &format!("{role} {id} leaves for good"));
        let done = move |v: &ClusterStatusJson| {
            !v.nodes.iter().any(|n| n.id == id) && v.retired.contains(&id)
        };
        let view = self
            .ensure(
                "remove",
                &["--id".to_string(), id.to_string()],
                Goal {
                    done: &done,
                    sticky: true,
                },
            )
            .await;
        {
            let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
            members.retired.push(id);
            members.retired.sort_unstable();
        }
        self.say(&format!(
            "node {id} removed: voters {:?}, retired {:?}",
            view.voters, view.retired
        ));
        view
    }

    /// `rota cluster transfer-leader` to voter `id`, until it leads; its view.
    pub async fn transfer_leader(&self, id: u64) -> ClusterStatusJson {
        self.change("transfer-leader", &format!("leadership to node {id}"));
        let done = move |v: &ClusterStatusJson| v.id == id;
        let view = self
            .ensure(
                "transfer-leader",
                &["--id".to_string(), id.to_string()],
                Goal {
                    done: &done,
                    sticky: false,
                },
            )
            .await;
        self.say(&format!("node {id} leads (term {})", view.term));
        view
    }

    fn member_args(&self, id: u64) -> Vec<String> {
        vec![
            "--id".to_string(),
            id.to_string(),
            "--api-addr".to_string(),
            self.spec.api(id),
            "--raft-addr".to_string(),
            self.spec.raft(id),
        ]
    }

    /// Checks that the cluster refuses retired id `id` as a new learner, at its old
    /// addresses, both through the CLI (exit 1, saying ids are never reused) and through
    /// the admin API of every member (409).
    pub async fn assert_refuses_retired(&self, id: u64) {
        let mut args: Vec<String> = ["cluster", "add-learner", "--url", &self.url()]
            .into_iter()
            .map(str::to_string)
            .collect();
        args.extend(["--timeout".to_string(), CLI_WAIT_SECS.to_string()]);
        args.extend(self.member_args(id));
        let run = self.rota(&args).await;
        assert_eq!(
            run.code,
            Some(1),
            "re-adding retired node {id} was not refused: {}",
            run.brief()
        );
        assert!(
            run.stderr.contains("never reused"),
            "re-adding retired node {id} was refused for another reason: {}",
            run.stderr
        );
        let body = AddLearnerJson {
            id,
            api_addr: self.spec.api(id),
            raft_addr: self.spec.raft(id),
        };
        for member in self.ids() {
            let addr = self.spec.api(member);
            let answer = self
                .http()
                .post_json(&addr, "/admin/add-learner", &body, Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("node {member} answers /admin/add-learner: {e}"));
            let text = String::from_utf8_lossy(&answer.body);
            assert_eq!(
                answer.status.as_u16(),
                409,
                "node {member} answered POST /admin/add-learner of retired node {id} with {}: {text}",
                answer.status
            );
            assert!(
                text.contains("never reused"),
                "node {member} refused retired node {id} for another reason: {text}"
            );
        }
        let view = self.leader_view().await.expect("a leader");
        assert!(
            !view.nodes.iter().any(|n| n.id == id),
            "retired node {id} is a member again: {view:?}"
        );
        self.say(&format!(
            "node id {id} refused as a learner (retired): by the CLI and by the admin API of nodes {:?}",
            self.ids()
        ));
    }

    /// `rota cluster status --json`: the cluster section of the answer.
    pub async fn cli_status(&self) -> ClusterStatusJson {
        let args: Vec<String> = ["cluster", "status", "--url", &self.url(), "--json"]
            .into_iter()
            .map(str::to_string)
            .collect();
        let run = self.rota(&args).await;
        assert!(run.ok(), "rota cluster status failed: {}", run.brief());
        let answer: serde_json::Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("rota cluster status --json is not JSON ({e})"));
        serde_json::from_value(answer["cluster"].clone())
            .unwrap_or_else(|e| panic!("rota cluster status --json has no cluster ({e})"))
    }

    /// What node `id`, removed from the cluster but still running, says of itself after
    /// `within`: whether it knows it was removed, and its view. (A removed follower may
    /// never know: the leader stops replicating to it as soon as it appends the
    /// configuration without it, so the follower may miss that entry.)
    pub async fn removed_view(
        &self,
        id: u64,
        within: Duration,
    ) -> (bool, Option<ClusterStatusJson>) {
        let deadline = Instant::now() + within;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.status(id).await;
            if last
                .as_ref()
                .is_some_and(|v| v.removed && v.leader.is_none())
            {
                return (true, last);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (false, last)
    }
}
