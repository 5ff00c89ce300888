//! Membership changes, made safely: one at a time, learners caught up before they vote,
//! no change that leaves a configuration without a reachable majority (unless forced),
//! no node id used twice, and every change verified against the leader's view after it.

use std::collections::BTreeSet;
use std::time::Duration;

use rpc::admin::AddLearnerJson;
use rpc::admin::CAUGHT_UP_ENTRIES_MAX;
use rpc::admin::ClusterStatusJson;
use rpc::admin::InitRequestJson;
use rpc::admin::MemberJson;
use rpc::admin::NewLearner;
use rpc::admin::NodeIdJson;
use rpc::admin::check_new_learner;
use rpc::admin::id_list;
use rpc::client::HttpClient;
use rpc::client::HttpMethod;
use serde::Serialize;
use tokio::time::Instant;

use crate::CliError;
use crate::nodes::Nodes;
use crate::nodes::PROBE_TIMEOUT;
use crate::wait::Look;
use crate::wait::POLL_INTERVAL;
use crate::wait::poll_until;

/// Deadline of an admin call; membership changes commit through the log.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a membership command did, for people and (`--json`) for scripts.
#[derive(Debug, Serialize)]
pub struct ChangeReport {
    /// One sentence: what changed.
    pub summary: String,
    /// The cluster as the leader sees it afterwards.
    pub cluster: ClusterStatusJson,
}

/// Talks to the cluster behind `--url` and to its members.
pub struct Admin {
    nodes: Nodes,
    /// How long one wait (leader, catch-up, transfer, snapshot) may take, leader
    /// elections during it included.
    timeout: Duration,
}

impl Admin {
    /// An admin session over the nodes of `--url`; each wait gives up after `timeout`.
    pub fn new(urls: &[String], timeout: Duration) -> Result<Self, CliError> {
        Ok(Self {
            nodes: Nodes::new(urls)?,
            timeout,
        })
    }

    fn client(&self) -> &HttpClient {
        self.nodes.client()
    }

    /// Whether the node at `addr` answers `/health`.
    pub async fn answers(&self, addr: &str) -> bool {
        matches!(
            self.client().get(addr, "/health", PROBE_TIMEOUT).await,
            Ok(r) if r.status.is_success()
        )
    }

    async fn status_of(&self, addr: &str) -> Option<ClusterStatusJson> {
        status_of(self.client(), addr).await
    }

    /// When a wait that starts now gives up.
    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// The leader's view of the cluster, waiting for a leader if there is none yet.
    pub async fn leader_view(&self) -> Result<ClusterStatusJson, CliError> {
        self.leader_view_by(self.deadline()).await
    }

    /// [`Admin::leader_view`], giving up at `deadline`.
    async fn leader_view_by(&self, deadline: Instant) -> Result<ClusterStatusJson, CliError> {
        // Every node of --url is asked until one names a leader that answers as such: the
        // first to answer may be cut off from the others and know no leader.
        let look = async || {
            let mut first_seen = None;
            for addr in self.nodes.addrs() {
                let Some(seen) = self.status_of(addr).await else {
                    continue;
                };
                if let Some(view) = self.view_of_leader(&seen).await {
                    return Ok(Look::Done(view));
                }
                first_seen.get_or_insert(seen);
            }
            match first_seen {
                Some(seen) => Ok(Look::NotYet(seen)),
                None => Err(CliError::Unreachable(format!(
                    "no node answered: {}; check --url and that the nodes run and have a leader",
                    self.nodes.addrs().join(", ")
                ))),
            }
        };
        poll_until(deadline, POLL_INTERVAL, look, |seen| {
            CliError::Unreachable(format!(
                "no leader answered within {:?} (node {} sees leader {:?}); check `rota cluster status` and that a majority of voters runs",
                self.timeout, seen.id, seen.leader
            ))
        })
        .await
    }

    /// `/cluster` as answered by the leader that `seen` names, if it answers as leader.
    async fn view_of_leader(&self, seen: &ClusterStatusJson) -> Option<ClusterStatusJson> {
        let leader = seen.leader?;
        if seen.id == leader {
            return Some(seen.clone());
        }
        let addr = &seen.nodes.iter().find(|n| n.id == leader)?.api_addr;
        self.status_of(addr)
            .await
            .filter(|view| view.leader == Some(view.id))
    }

    /// Posts an admin change (`body` is one of rpc's admin types) through the nodes of
    /// `--url`; the answering node's view of the cluster.
    async fn change<T: Serialize>(
        &self,
        path: &str,
        body: &T,
    ) -> Result<ClusterStatusJson, CliError> {
        let (addr, response) = self.nodes.post_json(path, body, CHANGE_TIMEOUT).await?;
        let response = response
            .success(&addr)
            .map_err(|e| CliError::Failed(format!("refused: {e}")))?;
        response
            .json(&addr)
            .map_err(|e| CliError::Failed(e.to_string()))
    }

    /// Waits until `done` holds for the leader's view; `what` names the wait in errors.
    async fn wait_for(
        &self,
        what: &str,
        mut done: impl FnMut(&ClusterStatusJson) -> bool,
    ) -> Result<ClusterStatusJson, CliError> {
        // One deadline for the whole wait, leader elections included.
        let deadline = self.deadline();
        let look = async || {
            let view = self.leader_view_by(deadline).await?;
            Ok(if done(&view) {
                Look::Done(view)
            } else {
                Look::NotYet(())
            })
        };
        poll_until(deadline, POLL_INTERVAL, look, |()| {
            CliError::Unreachable(format!(
                "gave up after {:?} waiting for {what}; see `rota cluster status`, or pass a longer --timeout",
                self.timeout
            ))
        })
        .await
    }

    /// Waits until `id` is at most [`CAUGHT_UP_ENTRIES_MAX`] entries behind the leader.
    async fn wait_caught_up(&self, id: u64) -> Result<ClusterStatusJson, CliError> {
        self.wait_for(&format!("node {id} to catch up"), |view| {
            lag_of(view, id).is_some_and(|lag| lag <= CAUGHT_UP_ENTRIES_MAX)
        })
        .await
    }

    /// Forms a new cluster of `members`; the nodes must run and belong to no cluster.
    pub async fn init(&self, members: Vec<MemberJson>) -> Result<ChangeReport, CliError> {
        if members.is_empty() {
            return Err(CliError::Usage(
                "--initial-cluster lists no member; give ID=API/RAFT,...".into(),
            ));
        }
        check_empty_members(self.client(), &members).await?;
        let wanted: Vec<u64> = members.iter().map(|m| m.id).collect();
        self.change("/admin/init", &InitRequestJson { members })
            .await?;
        let cluster = self
            .wait_for("the new cluster to elect a leader", |view| {
                view.voters == wanted && view.membership_committed
            })
            .await?;
        Ok(ChangeReport {
            summary: format!(
                "initialised a cluster of {}; node {} leads",
                id_list(&cluster.voters),
                cluster.id
            ),
            cluster,
        })
    }

    /// Adds a node as a learner and (if `wait`) waits until it has caught up.
    pub async fn add_learner(
        &self,
        member: MemberJson,
        wait: bool,
    ) -> Result<ChangeReport, CliError> {
        let view = self.leader_view().await?;
        refuse_if_changing(&view)?;
        let id = member.id;
        let new_learner =
            check_new_learner(&view, &member).map_err(|e| CliError::Failed(e.to_string()))?;
        self.check_new_node(&member, new_learner).await?;
        let request: &AddLearnerJson = &member;
        self.change("/admin/add-learner", request).await?;
        let cluster = if wait {
            self.wait_caught_up(id).await?
        } else {
            self.wait_for(&format!("node {id} to be a learner"), |view| {
                view.learners.contains(&id) && view.membership_committed
            })
            .await?
        };
        verify(&cluster, |c| c.learners.contains(&id), "a learner", id)?;
        let lag = lag_of(&cluster, id).map_or("unknown".into(), |l| l.to_string());
        let what = if new_learner == NewLearner::AlreadyAdded {
            "was already a learner at these addresses; nothing changed"
        } else {
            "added as a learner"
        };
        Ok(ChangeReport {
            summary: format!(
                "node {id} ({} / {}) {what}; lag {lag} entries; promote it with `rota cluster promote --id {id}`",
                member.api_addr, member.raft_addr
            ),
            cluster,
        })
    }

    /// Checks that the node to add runs at its API address as the id given, and belongs
    /// to no cluster (unless this is a retry and it is the learner already).
    async fn check_new_node(
        &self,
        member: &MemberJson,
        new_learner: NewLearner,
    ) -> Result<(), CliError> {
        let id = member.id;
        let Some(new) = self.status_of(&member.api_addr).await else {
            return Err(CliError::Unreachable(format!(
                "the new node does not answer at {}; start it (with --id {id}, an empty data directory and no --initial-cluster) first",
                member.api_addr
            )));
        };
        if new.id != id {
            return Err(CliError::Failed(format!(
                "{} is node {}, not node {id}; check --id and --api-addr",
                member.api_addr, new.id
            )));
        }
        if !new.voters.is_empty() && new_learner != NewLearner::AlreadyAdded {
            return Err(CliError::Failed(format!(
                "node {id} already belongs to a cluster (voters {}); give the new node an empty data directory",
                id_list(&new.voters)
            )));
        }
        Ok(())
    }

    /// Makes a caught-up learner a voter.
    pub async fn promote(&self, id: u64) -> Result<ChangeReport, CliError> {
        let view = self.leader_view().await?;
        // As for a transfer to the leader: what was asked for holds already.
        if view.voters.contains(&id) {
            return Ok(ChangeReport {
                summary: format!("node {id} is already a voter; nothing to do"),
                cluster: view,
            });
        }
        refuse_if_changing(&view)?;
        self.check_promotable(&view, id).await?;
        self.wait_caught_up(id).await?;
        self.change("/admin/promote", &NodeIdJson { id }).await?;
        let cluster = self
            .wait_for(&format!("node {id} to be a voter"), |view| {
                view.voters.contains(&id) && !view.joint && view.membership_committed
            })
            .await?;
        verify(&cluster, |c| c.voters.contains(&id), "a voter", id)?;
        Ok(ChangeReport {
            summary: format!(
                "node {id} is now a voter; voters {}{}",
                id_list(&cluster.voters),
                parity_hint(cluster.voters.len())
            ),
            cluster,
        })
    }

    /// Checks that `id` is a learner that answers: a voter that is down only weakens the
    /// quorum.
    async fn check_promotable(&self, view: &ClusterStatusJson, id: u64) -> Result<(), CliError> {
        let Some(node) = view.nodes.iter().find(|n| n.id == id) else {
            return Err(CliError::Failed(format!(
                "node {id} is not a learner; add it first with `rota cluster add-learner --id {id} ...`"
            )));
        };
        if !self.answers(&node.api_addr).await {
            return Err(CliError::Unreachable(format!(
                "node {id} does not answer at {}; a voter that is down only weakens the quorum",
                node.api_addr
            )));
        }
        Ok(())
    }

    /// Removes a voter or learner, refusing (unless `force`) what would leave the old, the
    /// joint or the new configuration without a reachable majority.
    pub async fn remove(&self, id: u64, force: bool) -> Result<ChangeReport, CliError> {
        let view = self.leader_view().await?;
        refuse_if_changing(&view)?;
        if !view.nodes.iter().any(|n| n.id == id) {
            return Err(CliError::Failed(format!(
                "node {id} is not a member (members {}); nothing to remove",
                id_list(&view.nodes.iter().map(|n| n.id).collect::<Vec<_>>())
            )));
        }
        if view.voters.contains(&id) {
            self.check_quorum_after_removal(&view, id, force).await?;
        }
        self.change("/admin/remove", &NodeIdJson { id }).await?;
        let cluster = self
            .wait_for(&format!("node {id} to leave"), |view| {
                !view.nodes.iter().any(|n| n.id == id) && !view.joint && view.membership_committed
            })
            .await?;
        verify(&cluster, |c| c.retired.contains(&id), "retired", id)?;
        Ok(ChangeReport {
            summary: format!(
                "removed node {id}; voters {}, learners {}{}; its id is retired for good: stop the process and wipe its data directory",
                id_list(&cluster.voters),
                id_list(&cluster.learners),
                parity_hint(cluster.voters.len())
            ),
            cluster,
        })
    }

    /// Probes every voter and applies [`quorum_check`] to the removal of voter `id`;
    /// refuses, or with `force` only warns.
    async fn check_quorum_after_removal(
        &self,
        view: &ClusterStatusJson,
        id: u64,
        force: bool,
    ) -> Result<(), CliError> {
        let mut reachable = BTreeSet::new();
        // The last voter is refused whatever answers: no need to ask.
        if view.voters != [id] {
            for node in view.nodes.iter().filter(|n| view.voters.contains(&n.id)) {
                if self.answers(&node.api_addr).await {
                    reachable.insert(node.id);
                }
            }
        }
        let reason = match quorum_check(&view.voters, id, &reachable) {
            Ok(()) => return Ok(()),
            // No --force can help: a cluster without a voter cannot exist.
            Err(QuorumRefusal::LastVoter) => {
                return Err(CliError::Failed(format!(
                    "refusing to remove node {id}: it is the last voter, and a cluster needs one; \
                     add and promote another node first (`rota cluster add-learner`, then \
                     `rota cluster promote`), or stop the cluster instead"
                )));
            }
            Err(reason) => reason,
        };
        if !force {
            return Err(CliError::Failed(format!(
                "refusing to remove node {id}: {reason}; bring the down nodes back first, or pass --force if the cluster may stop accepting writes"
            )));
        }
        eprintln!("rota: warning: --force: {reason}");
        Ok(())
    }

    /// Hands leadership to voter `id` and waits until it leads.
    pub async fn transfer_leader(&self, id: u64) -> Result<ChangeReport, CliError> {
        let view = self.leader_view().await?;
        if view.leader == Some(id) {
            return Ok(ChangeReport {
                summary: format!("node {id} already leads; nothing to do"),
                cluster: view,
            });
        }
        if !view.voters.contains(&id) {
            return Err(CliError::Failed(format!(
                "node {id} is not a voter (voters {}); leadership can only go to a voter",
                id_list(&view.voters)
            )));
        }
        self.change("/admin/transfer-leader", &NodeIdJson { id })
            .await?;
        let cluster = self
            .wait_for(&format!("node {id} to lead"), |view| {
                view.leader == Some(id)
            })
            .await?;
        Ok(ChangeReport {
            summary: format!("node {id} leads now (term {})", cluster.term),
            cluster,
        })
    }

    /// Has every node of `--url` build a snapshot and waits until each covers the index
    /// it had applied when asked.
    pub async fn snapshot(&self) -> Result<Vec<SnapshotReport>, CliError> {
        let mut reports = Vec::new();
        for addr in self.nodes.addrs() {
            reports.push(self.snapshot_one(addr).await?);
        }
        Ok(reports)
    }

    /// [`Admin::snapshot`] of the node at `addr`.
    async fn snapshot_one(&self, addr: &str) -> Result<SnapshotReport, CliError> {
        let Some(before) = self.status_of(addr).await else {
            return Err(CliError::Unreachable(format!("{addr} does not answer")));
        };
        // No body: the node snapshots what it has applied.
        self.client()
            .send(
                addr,
                HttpMethod::POST,
                "/admin/snapshot",
                &[],
                Vec::new().into(),
                CHANGE_TIMEOUT,
            )
            .await
            .map_err(|e| CliError::Unreachable(e.to_string()))?
            .success(addr)
            .map_err(|e| CliError::Failed(format!("refused: {e}")))?;
        let look = async || {
            let now = self.status_of(addr).await;
            Ok(Look::from(
                now.filter(|s| s.snapshot_index >= before.applied_index),
            ))
        };
        let now = poll_until(self.deadline(), POLL_INTERVAL, look, |()| {
            CliError::Unreachable(format!(
                "node {} at {addr} did not finish its snapshot within {:?}",
                before.id, self.timeout
            ))
        })
        .await?;
        Ok(SnapshotReport {
            node: now.id,
            snapshot_index: now.snapshot_index,
            purged_index: now.purged_index,
        })
    }
}

/// Refuses to start a change while another is in flight.
fn refuse_if_changing(view: &ClusterStatusJson) -> Result<(), CliError> {
    if view.joint || !view.membership_committed {
        return Err(CliError::Failed(format!(
            "a membership change is in flight (configuration at log index {} is {}); wait for it to finish, then check `rota cluster status`",
            view.membership_index.map_or("?".into(), |i| i.to_string()),
            if view.joint {
                "joint"
            } else {
                "not yet committed"
            }
        )));
    }
    Ok(())
}

/// `/cluster` as node `addr` answers it, or `None` if it does not.
pub async fn status_of(client: &HttpClient, addr: &str) -> Option<ClusterStatusJson> {
    let response = client.get(addr, "/cluster", PROBE_TIMEOUT).await.ok()?;
    response.success(addr).ok()?.json(addr).ok()
}

/// Checks that each of `members` answers at its API address as the id listed and holds
/// no cluster's state, as a new cluster (init or restore) needs.
pub async fn check_empty_members(
    client: &HttpClient,
    members: &[MemberJson],
) -> Result<(), CliError> {
    for member in members {
        let Some(view) = status_of(client, &member.api_addr).await else {
            return Err(CliError::Unreachable(format!(
                "node {} does not answer at {}; start every member first (empty data directory, no --initial-cluster)",
                member.id, member.api_addr
            )));
        };
        if view.id != member.id {
            return Err(CliError::Failed(format!(
                "{} is node {}, not node {}; fix --initial-cluster",
                member.api_addr, view.id, member.id
            )));
        }
        if !view.nodes.is_empty() || view.applied_index.is_some() {
            return Err(CliError::Failed(format!(
                "node {} at {} already holds a cluster's state (voters {}); a new cluster needs nodes with empty data directories",
                member.id,
                member.api_addr,
                id_list(&view.voters)
            )));
        }
    }
    Ok(())
}

/// One node's snapshot after `rota cluster snapshot`.
#[derive(Debug, Serialize)]
pub struct SnapshotReport {
    /// The node.
    pub node: u64,
    /// Last log index its snapshot covers.
    pub snapshot_index: Option<u64>,
    /// Last log index removed from its log.
    pub purged_index: Option<u64>,
}

/// Entries `id` is behind the leader's log, as the leader reports it.
fn lag_of(view: &ClusterStatusJson, id: u64) -> Option<u64> {
    view.nodes.iter().find(|n| n.id == id).and_then(|n| n.lag)
}

/// Why removing a voter is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum QuorumRefusal {
    /// It is the last voter: no `--force` can help, a cluster needs one.
    LastVoter,
    /// A configuration would have no majority of reachable voters; why.
    NoMajority(String),
}

impl std::fmt::Display for QuorumRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LastVoter => f.write_str("it is the last voter"),
            Self::NoMajority(why) => f.write_str(why),
        }
    }
}

/// Whether removing voter `id` leaves the old, joint and new configurations each with
/// a majority among the `reachable` voters; if not, why.
pub fn quorum_check(
    voters: &[u64],
    id: u64,
    reachable: &BTreeSet<u64>,
) -> Result<(), QuorumRefusal> {
    let after: Vec<u64> = voters.iter().copied().filter(|&v| v != id).collect();
    if after.is_empty() {
        return Err(QuorumRefusal::LastVoter);
    }
    for (name, config) in [("now", voters), ("after the change", &after[..])] {
        let up = config.iter().filter(|v| reachable.contains(v)).count();
        let majority = config.len() / 2 + 1;
        if up < majority {
            return Err(QuorumRefusal::NoMajority(format!(
                "{name} the voters would be {} of which {up} answer, fewer than the majority of {majority} that every write needs",
                id_list(config)
            )));
        }
    }
    Ok(())
}

fn verify(
    cluster: &ClusterStatusJson,
    holds: impl Fn(&ClusterStatusJson) -> bool,
    what: &str,
    id: u64,
) -> Result<(), CliError> {
    if holds(cluster) {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "the change was accepted but node {id} is not {what} in the leader's configuration (voters {}, learners {}); check `rota cluster status`",
            id_list(&cluster.voters),
            id_list(&cluster.learners)
        )))
    }
}

fn parity_hint(voters: usize) -> &'static str {
    if voters.is_multiple_of(2) {
        " (an even number of voters tolerates no more failures than one fewer; add or remove one more)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorum_check_refuses_what_leaves_no_reachable_majority() {
        let up = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<_>>();
        // Three voters, node 3 down: removing node 3 leaves 1,2, both up.
        assert!(quorum_check(&[1, 2, 3], 3, &up(&[1, 2])).is_ok());
        // ...but removing node 2 leaves 1,3 with only node 1 up.
        let reason = quorum_check(&[1, 2, 3], 2, &up(&[1, 2])).expect_err("refused");
        assert!(reason.to_string().contains("1,3"), "{reason}");
        // Five voters, one down: removing a healthy one still leaves 3 of 4 up.
        assert!(quorum_check(&[1, 2, 3, 4, 5], 5, &up(&[1, 2, 3, 5])).is_ok());
        // Five voters, three down: the old configuration has no majority already.
        assert!(quorum_check(&[1, 2, 3, 4, 5], 5, &up(&[1, 2])).is_err());
        assert_eq!(
            quorum_check(&[1], 1, &up(&[1])),
            Err(QuorumRefusal::LastVoter)
        );
    }
}
