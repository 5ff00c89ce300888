//! Group commit through real nodes: writes that arrive together share log entries, and
//! no client can tell: each gets its own outcome, a retry its first one, a watch every
//! version; a cluster with a member of an older build logs one write per entry.

mod common;

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

use common::TestCluster;
use futures_util::future::join_all;
use hyper::Method;
use rpc::watch::WatchEventJson;
use rpc::watch::WatchPageJson;
use rpc::worker::AddJson;
use rpc::worker::ClaimRequestJson;
use rpc::worker::UpdateRequestJson;
use rpc::worker::WriteResultJson;

/// Writes sent at once: enough that most share entries.
const WRITES: usize = 48;

/// An answer to one of the writes sent together.
enum Sent {
    Added(rpc::worker::TaskJson),
    Claimed(Option<u64>),
}

/// Adds one task of `group` with `data`, under request id `add-<data>`: the task.
async fn add(cluster: &TestCluster, via: u64, group: &str, data: &str) -> rpc::worker::TaskJson {
    let mut request = UpdateRequestJson::by(1).with_add(AddJson::in_group(group).with_data(data));
    request.requestid = Some(format!("add-{data}"));
    match cluster.write(via, "/update", &request).await {
        Ok(WriteResultJson::Tasks { mut tasks }) if tasks.len() == 1 => tasks.remove(0),
        other => panic!("add {data}: {other:?}"),
    }
}

/// Claims a task of `group` for client `client`: its id, if there was one.
async fn claim(cluster: &TestCluster, via: u64, group: &str, client: i64) -> Option<u64> {
    let request = ClaimRequestJson::new(client, group, 60_000);
    match cluster.write(via, "/claim", &request).await {
        Ok(WriteResultJson::Tasks { tasks }) => {
            assert!(tasks.len() <= 1, "one claim, one task: {tasks:?}");
            tasks.first().map(|task| {
                assert_eq!(task.ownerid, client, "claimed for its claimant: {task:?}");
                task.id
            })
        }
        other => panic!("claim by {client}: {other:?}"),
    }
}

/// Every change of `group` that node `via` applied after revision 0.
async fn changes(cluster: &TestCluster, via: u64, group: &str) -> Vec<WatchEventJson> {
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let response = cluster
            .client
            .send(
                cluster.api(via),
                Method::GET,
                &format!("/watch?group={group}&after={after}&limit=1000"),
                &[],
                Vec::new().into(),
                common::CALL_TIMEOUT,
            )
            .await
            .expect("the node answered");
        assert_eq!(response.status.as_u16(), 200, "{response:?}");
        let page: WatchPageJson = serde_json::from_slice(&response.body).expect("a watch page");
        if page.changes.is_empty() {
            return seen;
        }
        after = page.revision;
        seen.extend(page.changes);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_sent_together_share_entries_and_keep_their_own_outcomes() {
    // Snapshots every 100 commands: the writes below are more, in fewer entries.
    let cluster = TestCluster::start_with(3, "always", &["--snapshot-every-entries=100"]);
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    cluster.wait_log_form_recorded(leader).await;

    // Adds at once; each answer is its own request's.
    let first: Vec<String> = (0..WRITES).map(|n| format!("first-{n}")).collect();
    let added = join_all(first.iter().map(|data| add(&cluster, leader, "g", data))).await;
    for (task, data) in added.iter().zip(&first) {
        assert_eq!(&task.data, data, "{task:?}");
    }
    // Adds and claims at once in an empty group: a claim can take only a task added in
    // its own entry or in one just before, and the watch must still show that add.
    let second: Vec<String> = (0..WRITES).map(|n| format!("second-{n}")).collect();
    let nodes = &cluster;
    let sent = second.iter().enumerate().flat_map(|(n, data)| {
        let add: Pin<Box<dyn Future<Output = Sent> + Send + '_>> =
            Box::pin(async move { Sent::Added(add(nodes, leader, "h", data).await) });
        let claim: Pin<Box<dyn Future<Output = Sent> + Send + '_>> =
            Box::pin(async move { Sent::Claimed(claim(nodes, leader, "h", 100 + n as i64).await) });
        [add, claim]
    });
    let mut added_too = Vec::new();
    let mut claimed = Vec::new();
    for answer in join_all(sent).await {
        match answer {
            Sent::Added(task) => added_too.push(task),
            Sent::Claimed(id) => claimed.extend(id),
        }
    }
    for (task, data) in added_too.iter().zip(&second) {
        assert_eq!(&task.data, data, "{task:?}");
    }
    let distinct: BTreeSet<u64> = claimed.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        claimed.len(),
        "a task claimed twice: {claimed:?}"
    );
    assert!(!claimed.is_empty(), "no claim found a task added beside it");

    let batches = cluster.metric(leader, "rota_write_batches_total").await;
    let batched = cluster.metric(leader, "rota_batched_writes_total").await;
    assert!(batches > 0.0, "no entry shared by writes sent together");
    assert!(batched > batches, "{batched} writes in {batches} batches");

    // A retry gets its first outcome, whichever entry that was in.
    for (task, data) in added.iter().zip(&first).take(5) {
        let again = add(&cluster, leader, "g", data).await;
        assert_eq!(again.id, task.id, "retry of add-{data}");
    }

    // Every node applied the same, and shows every version in its watch: the adds
    // claimed in their own entry too.
    let converged = cluster.wait_converged(&[1, 2, 3]).await;
    for id in 1..=3 {
        for (group, added) in [("g", &added), ("h", &added_too)] {
            let written: BTreeSet<u64> = changes(&cluster, id, group)
                .await
                .into_iter()
                .filter_map(|change| match change {
                    WatchEventJson::Task { task, .. } => Some(task.id),
                    _ => None,
                })
                .collect();
            let missing: Vec<u64> = added
                .iter()
                .map(|t| t.id)
                .filter(|id| !written.contains(id))
                .collect();
            assert!(
                missing.is_empty(),
                "node {id}'s watch of {group} lacks adds {missing:?}"
            );
        }
    }

    // A snapshot came by commands, openraft's count of entries being below 100.
    let commands = cluster.metric(leader, "rota_applied_commands_total").await;
    let entries = converged.applied_index.unwrap_or(0);
    assert!(
        entries < 100 && commands >= 150.0,
        "{entries} entries and {commands} commands: the check below says nothing"
    );
    common::eventually(|| async {
        match cluster.status(leader).await {
            Some(status) if status.snapshot_index.is_some() => Ok(()),
            other => Err(format!("no snapshot after {commands} commands: {other:?}")),
        }
    })
    .await;
}

/// Until every member reads batches (log form 5), a leader logs one write per entry:
/// a member of an older build could not apply a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_of_an_older_build_keeps_one_write_per_entry() {
    let cluster = TestCluster::start_with_env(
        3,
        "never",
        &[],
        &[(3, raft_node::log_forms::ANNOUNCE_FORM_ENV, "4")],
    );
    let leader = cluster.wait_leader(&[1, 2, 3]).await;
    cluster.wait_log_form_recorded(leader).await;
    let status = cluster.status(leader).await.expect("a status");
    assert_eq!(status.log_form, 4, "{status:?}");

    let data: Vec<String> = (0..WRITES).map(|n| format!("old-{n}")).collect();
    let added = join_all(data.iter().map(|d| add(&cluster, leader, "g", d))).await;
    for (task, data) in added.iter().zip(&data) {
        assert_eq!(&task.data, data, "{task:?}");
    }
    assert_eq!(
        cluster.metric(leader, "rota_write_batches_total").await,
        0.0
    );
    cluster.wait_converged(&[1, 2, 3]).await;
}
