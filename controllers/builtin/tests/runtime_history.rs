//! Runtime prediction in the live scheduler: a finished allocation's runtime reaches its
//! user's history in the store (release controller), survives a restart of the
//! controllers, lets a later job of that user backfill where its walltime would not, and
//! never changes the walltime the job is bound with (its kill time).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use lattice_apis::meta::now;
use lattice_apis::{lifecycle, AllocationPhase, NodeTaskPhase, NodeTaskState};
use lattice_controllers::scheduler::history::{key, UserHistory};
use serde_json::json;

/// Report `phase` for `name` on its nodes, started `ran` ago.
async fn report_started(env: &Env, name: &str, phase: NodeTaskPhase, ran: Duration) {
    let started = now() - chrono::Duration::from_std(ran).expect("duration");
    env.allocations("t1")
        .update_status_with_retry(name, 20, |a| {
            let st = a.status.clone().expect("bound");
            let mut changed = false;
            for n in &st.assigned_nodes {
                let r = NodeTaskState {
                    phase,
                    attempt: st.attempt,
                    pid: Some(1),
                    start_time: Some(started),
                    end_time: phase.is_terminal().then(now),
                    exit_code: phase.is_terminal().then_some(0),
                    reason: phase
                        .is_terminal()
                        .then(|| lifecycle::node_reason::EXITED.to_string()),
                    ..Default::default()
                };
                changed |= lifecycle::record_node_state(a, n, r, now());
            }
            changed
        })
        .await
        .expect("report");
}

fn job(user: &str, name: Option<&str>, walltime: &str) -> serde_json::Value {
    let mut v = json!({
        "metadata": {"annotations": {"lattice.dev/user": user}},
        "spec": {"lifecycle": {"walltime": walltime}},
    });
    if let Some(n) = name {
        v["spec"]["tags"] = json!({"name": n});
    }
    v
}

async fn stored_history(env: &Env, user: &str) -> Option<UserHistory> {
    let k = key(&("t1".to_string(), "default".to_string()), user);
    env.backend
        .get(Bytes::from(k))
        .await
        .expect("read")
        .map(|kv| serde_json::from_slice(&kv.value).expect("history value"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_finished_runtime_lets_their_next_job_backfill_with_its_walltime_kept() {
    let (mut env, _hb) = cluster(&["n1", "n2"]).await;

    // alice's "sim" runs 10 minutes of the hour it asked for.
    env.submit("t1", "first", 1, job("alice", Some("sim"), "1h"))
        .await;
    env.wait_phase("t1", "first", AllocationPhase::Staging)
        .await;
    report_started(
        &env,
        "first",
        NodeTaskPhase::Running,
        Duration::from_secs(600),
    )
    .await;
    report_started(
        &env,
        "first",
        NodeTaskPhase::Succeeded,
        Duration::from_secs(600),
    )
    .await;
    env.wait_phase("t1", "first", AllocationPhase::Completed)
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let h = loop {
        if let Some(h) = stored_history(&env, "alice").await {
            break h;
        }
        assert!(tokio::time::Instant::now() < deadline, "no history written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(h.runs.len(), 1);
    let [runtime, walltime] = h.runs[0];
    assert!((600..=605).contains(&runtime), "runtime {runtime}");
    assert_eq!(walltime, 3600);
    assert_eq!(h.names["sim"].runs, h.runs);

    // The history is in the store, not in the scheduler: restart the controllers.
    env.stop_controllers();
    env.start_controllers(fast_config());

    // bob holds n1 for up to two hours; carol's 2-node job must wait for it and holds n2.
    env.submit("t1", "bob-long", 1, job("bob", None, "2h"))
        .await;
    env.wait_phase("t1", "bob-long", AllocationPhase::Staging)
        .await;
    report_started(&env, "bob-long", NodeTaskPhase::Running, Duration::ZERO).await;
    env.submit("t1", "carol-wide", 2, job("carol", None, "1h"))
        .await;
    let wide = env
        .wait_alloc("t1", "carol-wide", "reserved", |a| {
            a.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("reserved")
        })
        .await;
    let msg = wide
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(msg.contains("expected to start at"), "{msg}");
    assert!(msg.contains("(predicted runtimes)"), "{msg}");

    // alice asks for 3 hours, past carol's reservation; her history says she will use a
    // sixth of it (30 min): she backfills onto n2, and is bound with her 3 hours.
    env.submit("t1", "dave-tail", 1, job("alice", Some("sim"), "3h"))
        .await;
    let tail = env
        .wait_phase("t1", "dave-tail", AllocationPhase::Staging)
        .await;
    let st = tail.status.expect("status");
    assert_eq!(st.assigned_nodes, vec!["n2".to_string()]);
    assert_eq!(
        st.walltime_seconds,
        Some(3 * 3600),
        "the kill time is the walltime"
    );
    let wide = env.get("t1", "carol-wide").await;
    assert_eq!(wide.phase(), AllocationPhase::Pending);
}
