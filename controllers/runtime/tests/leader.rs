//! Lease election with two contenders against a real store: one wins, the other takes
//! over after the holder stops renewing, the deposed holder's stale write is fenced
//! off by resourceVersion, and a released lease hands over at once.

mod common;

use std::time::{Duration, Instant};

use common::*;
use lattice_apis::{Lease, SYSTEM_NAMESPACE};
use lattice_runtime::{Api, LeaderGate, LeaseConfig, LeaseLock, PostParams, ResourceExt};

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1200),
        retry_period: Duration::from_millis(100),
        ..LeaseConfig::new("site-plugin", identity)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wins_then_handover_after_expiry_with_fencing() {
    let env = env().await;
    let a = LeaseLock::new(env.client.clone(), config("a"));
    let b = LeaseLock::new(env.client.clone(), config("b"));
    assert!(
        a.try_acquire_or_renew().await.unwrap(),
        "first contender creates and holds"
    );
    assert!(!b.try_acquire_or_renew().await.unwrap(), "second loses");
    assert!(a.try_acquire_or_renew().await.unwrap(), "holder renews");
    let api: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let held_by_a = api.get("site-plugin").await.unwrap();
    assert_eq!(held_by_a.spec.holder_identity.as_deref(), Some("a"));
    let token_a = a.state().borrow().fencing_token.clone();
    assert_eq!(token_a.as_deref(), held_by_a.resource_version());

    // a stops renewing; b may take over only after the lease duration, by b's clock.
    let start = Instant::now();
    let mut took_over = None;
    while start.elapsed() < Duration::from_secs(6) {
        if b.try_acquire_or_renew().await.unwrap() {
            took_over = Some(start.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took_over = took_over.expect("b takes over");
    assert!(
        took_over >= Duration::from_millis(1900),
        "not before expiry: {took_over:?}"
    );
    let lease = api.get("site-plugin").await.unwrap();
    assert_eq!(lease.spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(lease.spec.lease_transitions, Some(1));

    // Fencing: a's write based on what it last held is refused...
    let mut stale = held_by_a.clone();
    stale.spec.renew_time = Some(chrono::Utc::now());
    let err = api
        .replace("site-plugin", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    // ...and a, coming back, sees a live lease held by b.
    assert!(!a.try_acquire_or_renew().await.unwrap());
    assert!(!a.state().borrow().is_leader);
    assert_eq!(a.state().borrow().fencing_token, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn electors_never_both_lead_and_release_hands_over_quickly() {
    let env = env().await;
    let ea = LeaseLock::new(env.client.clone(), config("a")).spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let eb = LeaseLock::new(env.client.clone(), config("b")).spawn();
    let mut leaders_seen = 0;
    for _ in 0..20 {
        let (la, lb) = (ea.is_leader(), eb.is_leader());
        assert!(!(la && lb), "two leaders at once");
        if la || lb {
            leaders_seen += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(leaders_seen > 0);
    let (leader, follower) = if ea.is_leader() { (ea, eb) } else { (eb, ea) };
    let start = Instant::now();
    leader.shutdown().await.unwrap();
    assert!(
        eventually(Duration::from_secs(2), || follower.is_leader()).await,
        "a released lease is taken at once, not after expiry"
    );
    assert!(start.elapsed() < Duration::from_millis(1500));
}
