//! Sensitive allocations against a real store: node claims (first commit wins), claims
//! outside sensitive vClusters, and the cluster-wide sensitive pool.
//!
//! The same scenarios with the real `lattice-agent` processes are in `e2e/`.

mod common;

use std::time::Duration;

use common::*;
use lattice_apis::{Allocation, AllocationPhase};
use lattice_runtime::{Patch, PatchParams, ResourceExt};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensitive_claims_first_commit_wins_and_the_loser_names_the_holder() {
    let mut env = env().await;
    env.tenant("hospital", None).await;
    env.vcluster("hospital", "secure", "sensitive-reservation")
        .await;
    let names = ["s1", "s2", "s3", "s4"];
    for n in names {
        sensitive_node(&env, n).await;
    }
    env.node("plain", 1).await;
    let _hb = heartbeats(&env, &["s1", "s2", "s3", "s4", "plain"]);
    // Two scheduler replicas race for every claim.
    env.start_controllers(fast_config());
    env.start_controllers(fast_config());

    // Overlapping claims submitted together: exactly one gets s2.
    let (a, b) = tokio::join!(
        env.submit("hospital", "claim-a", 2, claim("alice", &["s1", "s2"])),
        env.submit("hospital", "claim-b", 2, claim("bob", &["s2", "s3"])),
    );
    drop((a, b));
    let settled = |a: &Allocation| {
        a.phase() == AllocationPhase::Staging || a.phase() == AllocationPhase::Failed
    };
    let a = env
        .wait_alloc("hospital", "claim-a", "bound or failed", settled)
        .await;
    let b = env
        .wait_alloc("hospital", "claim-b", "bound or failed", settled)
        .await;
    let (won, lost, winner_user) = match (a.phase(), b.phase()) {
        (AllocationPhase::Staging, AllocationPhase::Failed) => (a, b, "alice"),
        (AllocationPhase::Failed, AllocationPhase::Staging) => (b, a, "bob"),
        other => panic!("exactly one claim must win, got {other:?}"),
    };
    assert_eq!(won.status.as_ref().expect("status").assigned_nodes.len(), 2);
    assert_eq!(reason_of(&lost), Some("ownership_conflict"));
    let msg = message_of(&lost);
    assert!(
        msg.starts_with("OwnershipConflict: node s2 is already claimed")
            && msg.contains(&format!("by user {winner_user}"))
            && msg.contains(&format!("hospital/{}", won.name_any())),
        "{msg}"
    );
    // The store records the claiming user with the ownership.
    let s2 = env.nodes().get("s2").await.expect("s2");
    let owner = s2.status.and_then(|s| s.owner).expect("owned");
    assert_eq!(owner.user.as_deref(), Some(winner_user));
    assert_eq!(owner.allocation.as_deref(), Some(won.name_any()));

    // Claims that can never be granted fail at once, saying why.
    env.submit("hospital", "ghost", 1, claim("carol", &["nope"]))
        .await;
    env.submit("hospital", "wrong-pool", 1, claim("carol", &["plain"]))
        .await;
    let ghost = env
        .wait_phase("hospital", "ghost", AllocationPhase::Failed)
        .await;
    assert_eq!(reason_of(&ghost), Some("invalid_claim"));
    assert!(message_of(&ghost).contains("node nope is not registered"));
    let wrong = env
        .wait_phase("hospital", "wrong-pool", AllocationPhase::Failed)
        .await;
    assert!(
        message_of(&wrong).contains("node plain is not in the sensitive pool"),
        "{}",
        message_of(&wrong)
    );
    // A disjoint claim is granted beside the winner.
    let free: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| {
            !won.status
                .as_ref()
                .expect("status")
                .assigned_nodes
                .iter()
                .any(|a| a == n)
        })
        .filter(|n| *n != "s3" || winner_user == "alice")
        .take(1)
        .collect();
    env.submit("hospital", "claim-c", 1, claim("carol", &free))
        .await;
    env.wait_phase("hospital", "claim-c", AllocationPhase::Staging)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_outside_sensitive_vclusters_wait_for_their_nodes() {
    let (env, _hb) = cluster(&["n1", "n2"]).await;
    let on = |n: &str| json!({"spec": {"resources": {"nodeNames": [n]}}});
    env.submit("t1", "holder", 1, on("n1")).await;
    env.wait_phase("t1", "holder", AllocationPhase::Staging)
        .await;
    // A second claim of n1 waits for it (n2 is free, but not what it asked for).
    env.submit("t1", "waiter", 1, on("n1")).await;
    let w = env
        .wait_alloc("t1", "waiter", "waiting for n1", |a| {
            reason_of(a) == Some("nodes_occupied")
        })
        .await;
    assert_eq!(w.phase(), AllocationPhase::Pending);
    assert!(
        message_of(&w).contains("waiting for claimed node n1 (by allocation t1/holder)"),
        "{}",
        message_of(&w)
    );
    // A claim of a cordoned node waits too, and says why.
    env.nodes()
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
    env.submit("t1", "wants-n2", 1, on("n2")).await;
    let c = env
        .wait_alloc("t1", "wants-n2", "explained", |a| {
            reason_of(a) == Some("invalid_claim")
        })
        .await;
    assert_eq!(c.phase(), AllocationPhase::Pending);
    assert!(
        message_of(&c).contains("node n2 is draining and cannot be claimed now"),
        "{}",
        message_of(&c)
    );
    env.nodes()
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": false}})),
        )
        .await
        .expect("uncordon");
    // Everything runs once its nodes are free.
    let _runner = auto_runner(&env, "t1", |_| 0);
    for (name, node) in [("holder", "n1"), ("waiter", "n1"), ("wants-n2", "n2")] {
        let a = env.wait_phase("t1", name, AllocationPhase::Completed).await;
        assert_eq!(
            a.status.expect("status").assigned_nodes,
            vec![node],
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_wide_sensitive_pool_is_a_hard_limit_across_tenants() {
    // Three sensitive nodes, two tenants, and `scheduling.sensitive_pool_size=2`.
    let (env, _hb) = cluster(&["s1", "s2", "s3"]).await;
    for n in ["s1", "s2", "s3"] {
        env.nodes()
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"sensitive": true}})),
            )
            .await
            .expect("mark sensitive");
    }
    env.tenant("t2", None).await;
    env.vcluster("t2", "default", "hpc-backfill").await;
    let setting =
        lattice_apis::cluster_config::find(lattice_apis::cluster_config::SENSITIVE_POOL_SIZE)
            .expect("setting");
    env.backend
        .put(lattice_store::PutRequest {
            key: setting.store_key().into_bytes().into(),
            value: b"2".to_vec().into(),
            ..Default::default()
        })
        .await
        .expect("set the limit");
    let plans = Plans::default();
    let _r1 = scripted_runner(&env, "t1", plans.clone());
    let _r2 = scripted_runner(&env, "t2", plans.clone());
    let sensitive = json!({"spec": {"sensitive": true}});
    plans.set("first", Run::Hold);
    plans.set("second", Run::Hold);
    plans.set("third", Run::Hold);
    env.submit("t1", "first", 1, sensitive.clone()).await;
    env.submit("t2", "second", 1, sensitive.clone()).await;
    env.wait_phase("t1", "first", AllocationPhase::Running)
        .await;
    env.wait_phase("t2", "second", AllocationPhase::Running)
        .await;
    let counter = || async {
        let kv = env
            .backend
            .get(lattice_controllers::sensitive_pool::COUNTER_KEY.into())
            .await
            .expect("get")
            .expect("counter written");
        serde_json::from_slice::<serde_json::Value>(&kv.value).expect("json")["nodes"].clone()
    };
    assert_eq!(counter().await, 2);
    // A third sensitive claim waits, although s3 is free and t2's own quota has room.
    env.submit("t2", "third", 1, sensitive).await;
    let w = env
        .wait_alloc("t2", "third", "the cluster-wide limit", |a| {
            message_of(a).contains("cluster-wide")
        })
        .await;
    assert_eq!(w.phase(), AllocationPhase::Pending);
    assert!(
        message_of(&w)
            .contains("sensitive_pool_size, cluster-wide: current 2, requested 1, limit 2"),
        "{}",
        message_of(&w)
    );
    // The first ends: its node goes back to the pool, and the third is bound.
    plans.set("first", Run::Exit(0, Duration::ZERO));
    env.wait_phase("t1", "first", AllocationPhase::Completed)
        .await;
    env.wait_phase("t2", "third", AllocationPhase::Running)
        .await;
    assert_eq!(counter().await, 2);
    // The usage audit recounts a drifted counter from node ownership.
    env.backend
        .put(lattice_store::PutRequest {
            key: lattice_controllers::sensitive_pool::COUNTER_KEY.into(),
            value: br#"{"nodes": 9}"#.to_vec().into(),
            ..Default::default()
        })
        .await
        .expect("drift");
    assert!(
        lattice_controllers::release::audit_usage(&env.backend)
            .await
            .expect("audit")
            >= 1
    );
    assert_eq!(counter().await, 2);
}
