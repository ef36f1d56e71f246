//! The controller host: controllers run only while the gate says leader and stop and
//! start again on changes; metrics register into a prometheus registry; the Event
//! recorder aggregates repeats.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use lattice_apis::{Allocation, Event, EventType};
use lattice_runtime::events::{EventSpec, Recorder, Reporter};
use lattice_runtime::{Action, Api, ControllerHost, ListParams, PostParams};
use tokio::sync::watch;

const T: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_only_while_leader_and_exposes_metrics() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();

    let (leader_tx, leader_rx) = watch::channel(false);
    let mut host =
        ControllerHost::new(env.client.clone(), Arc::new(leader_rx)).with_factory(factory(&env));
    let starts = Arc::new(AtomicUsize::new(0));
    let reconciles = Arc::new(AtomicUsize::new(0));
    {
        let (starts, reconciles) = (starts.clone(), reconciles.clone());
        host.register("counter", move |ctx| {
            starts.fetch_add(1, Ordering::SeqCst);
            let reconciles = reconciles.clone();
            async move {
                ctx.controller::<Allocation>()
                    .run(
                        |_a: Arc<Allocation>, n: Arc<AtomicUsize>| async move {
                            n.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, std::convert::Infallible>(Action::await_change())
                        },
                        reconciles,
                    )
                    .await
            }
        });
    }
    let mut registry = prometheus_client::registry::Registry::default();
    host.register_metrics(&mut registry);
    let readiness = host.readiness();
    tokio::spawn(host.run(std::future::pending()));

    // Standby: ready (nothing to do), nothing runs.
    assert!(eventually(T, || readiness.is_ready()).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(starts.load(Ordering::SeqCst), 0);
    assert_eq!(reconciles.load(Ordering::SeqCst), 0);

    // Leader: starts, syncs, reconciles.
    leader_tx.send_replace(true);
    assert!(eventually(T, || reconciles.load(Ordering::SeqCst) >= 1).await);
    assert!(eventually(T, || readiness.is_ready()).await);
    assert_eq!(readiness.report().get("counter"), Some(&true));

    // Deposed: stops within moments; changes are not reconciled.
    leader_tx.send_replace(false);
    assert!(eventually(T, || readiness.report().get("counter") == Some(&false)).await);
    let before = reconciles.load(Ordering::SeqCst);
    api.create(&PostParams::default(), &alloc("a2", "t1"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        reconciles.load(Ordering::SeqCst),
        before,
        "no reconcile while not leader"
    );

    // Leader again: restarts and catches up from the cache (level-triggered).
    leader_tx.send_replace(true);
    assert!(eventually(T, || reconciles.load(Ordering::SeqCst) >= before + 2).await);
    assert_eq!(starts.load(Ordering::SeqCst), 2);

    tokio::time::sleep(Duration::from_millis(1100)).await; // one metrics tick
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for needle in [
        "lattice_controller_reconciles_total{controller=\"counter\",result=\"success\"}",
        "lattice_controller_reconcile_duration_seconds_bucket",
        "lattice_controller_queue_depth{controller=\"counter\"}",
        "lattice_controller_seconds_since_last_success{controller=\"counter\"}",
        "lattice_controller_running{controller=\"counter\"} 1",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_recorder_aggregates_repeats() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let a = api
        .create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    let reporter = Reporter {
        component: "lattice.dev/test".into(),
        instance: Some("here".into()),
    };
    let rec = Recorder::new(env.client.clone(), reporter.clone());
    let spec = EventSpec {
        type_: EventType::Warning,
        reason: "Unschedulable".into(),
        message: "no node fits".into(),
        action: Some("Scheduling".into()),
    };
    let e1 = rec.publish(&a, &spec).await.unwrap();
    assert_eq!(e1.count, 1);
    let e2 = rec.publish(&a, &spec).await.unwrap();
    assert_eq!(e2.count, 2);
    // Another recorder (a restarted process) lands on the same Event.
    let rec2 = Recorder::new(env.client.clone(), reporter);
    let e3 = rec2.publish(&a, &spec).await.unwrap();
    assert_eq!(e3.count, 3);
    assert_eq!(e3.metadata.name, e1.metadata.name);
    // A different message is a different Event.
    let other = EventSpec {
        message: "still no node".into(),
        ..spec
    };
    rec.publish(&a, &other).await.unwrap();
    let events: Api<Event> = Api::namespaced(env.client.clone(), "t1");
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    assert!(list
        .items
        .iter()
        .all(|e| e.involved_object.name == "a1" && e.involved_object.kind == "Allocation"));
}
