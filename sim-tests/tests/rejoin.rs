//! A follower cut off from the others for several election timeouts, then back: the
//! leader keeps leading in its term (the pre-vote keeps the follower's failed campaigns
//! from raising its term and deposing the leader on its return).

#![cfg(madsim)]

use std::time::Duration;

use sim_tests::cluster::SimCluster;

#[madsim::test]
async fn a_follower_back_from_a_partition_does_not_depose_the_leader() {
    let (cluster, _tokens, leader) = SimCluster::start_serving(3).await;
    let term = cluster
        .status(leader)
        .await
        .expect("the leader answers")
        .term;
    let follower = if leader == 1 { 2 } else { 1 };
    let rest: Vec<u64> = (1..=3).filter(|&n| n != follower).collect();

    // Ten times the longest election timeout (600 ms): campaigns enough to raise a
    // term that has no pre-vote several times over.
    cluster.partition(&[vec![follower], rest]);
    madsim::time::sleep(Duration::from_secs(6)).await;
    let cut_off = cluster
        .status(follower)
        .await
        .expect("the follower answers");
    assert!(
        cut_off.term == term,
        "the cut-off follower raised its term from {term} to {} without a majority",
        cut_off.term
    );
    cluster.heal();
    madsim::time::sleep(Duration::from_secs(3)).await;

    for id in 1..=3 {
        let status = cluster.status(id).await.expect("every node answers");
        assert_eq!(
            (status.leader, status.term),
            (Some(leader), term),
            "node {id} after the heal"
        );
    }
}
