//! Controllers against a real store: shared informers, level-triggered reconciles,
//! deleted objects as no-ops, owns(), finalizers, conflict retries.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use lattice_apis::Allocation;
use lattice_runtime::controller::ErrorContext;
use lattice_runtime::finalizer::{self, finalizer};
use lattice_runtime::wait::{await_condition, conditions};
use lattice_runtime::{
    Action, Api, Controller, DeleteParams, DeleteResult, ObjectRef, Patch, PatchParams, PostParams,
    ResourceExt,
};
use serde_json::json;

const T: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Seen {
    names: Mutex<Vec<String>>,
    deleted: Mutex<Vec<String>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_share_one_list_and_watch() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    let f = factory(&env);
    let seen_a = Arc::new(Seen::default());
    let seen_b = Arc::new(Seen::default());
    let rec = |a: Arc<Allocation>, s: Arc<Seen>| async move {
        s.names.lock().unwrap().push(a.name_any().to_string());
        Ok::<_, std::convert::Infallible>(Action::await_change())
    };
    tokio::spawn(
        Controller::<Allocation>::new(&f)
            .name("a")
            .run(rec, seen_a.clone()),
    );
    tokio::spawn(
        Controller::<Allocation>::new(&f)
            .name("b")
            .run(rec, seen_b.clone()),
    );
    api.create(&PostParams::default(), &alloc("a2", "t1"))
        .await
        .unwrap();
    let both = |s: &Seen| {
        let n = s.names.lock().unwrap();
        n.contains(&"a1".to_string()) && n.contains(&"a2".to_string())
    };
    assert!(eventually(T, || both(&seen_a) && both(&seen_b)).await);
    assert_eq!(
        env.transport.lists_of("Allocation"),
        1,
        "one list for two controllers"
    );
    assert_eq!(
        env.transport.watches_of("Allocation"),
        1,
        "one watch for two controllers"
    );
    assert_eq!(f.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_object_is_a_no_op_with_hook_and_reconcile_reads_latest() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    let f = factory(&env);
    let seen = Arc::new(Seen::default());
    let errors = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let e2 = errors.clone();
    let c = Controller::<Allocation>::new(&f)
        .name("noop")
        .on_deleted(move |r: ObjectRef| {
            let s = s2.clone();
            async move { s.deleted.lock().unwrap().push(r.name) }
        })
        // Every change reconciles; a key triggered for a gone object must not reach the
        // reconciler, nor the error policy.
        .trigger(futures::stream::iter(vec![ObjectRef::new::<Allocation>(
            Some("t1"),
            "never-existed",
        )]));
    tokio::spawn(c.run_with_error_policy(
        |a: Arc<Allocation>, s: Arc<Seen>| async move {
            let labels: Vec<String> = a.labels().keys().cloned().collect();
            s.names
                .lock()
                .unwrap()
                .push(format!("{}:{}", a.name_any(), labels.join(",")));
            Ok::<_, std::io::Error>(Action::await_change())
        },
        move |_, _, _: &ErrorContext, _| {
            e2.fetch_add(1, Ordering::SeqCst);
            Action::await_change()
        },
        seen.clone(),
    ));
    assert!(
        eventually(T, || seen
            .deleted
            .lock()
            .unwrap()
            .contains(&"never-existed".to_string()))
        .await
    );
    api.patch(
        "a1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
    )
    .await
    .unwrap();
    assert!(
        eventually(T, || seen
            .names
            .lock()
            .unwrap()
            .iter()
            .any(|n| n == "a1:app,v"))
        .await
    );
    api.delete("a1", &DeleteParams::default()).await.unwrap();
    assert!(
        eventually(T, || seen
            .deleted
            .lock()
            .unwrap()
            .contains(&"a1".to_string()))
        .await
    );
    assert_eq!(errors.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owns_triggers_the_owner() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let parent = api
        .create(&PostParams::default(), &alloc("parent", "t1"))
        .await
        .unwrap();
    let f = factory(&env);
    let count = Arc::new(AtomicUsize::new(0));
    // Allocation owns Allocation here (any kind works; this one needs no extra setup).
    let c = Controller::<Allocation>::new(&f)
        .name("owner")
        .owns::<Allocation>();
    let store = c.store();
    tokio::spawn(c.run(
        |a: Arc<Allocation>, n: Arc<AtomicUsize>| async move {
            if a.name_any() == "parent" {
                n.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, std::convert::Infallible>(Action::await_change())
        },
        count.clone(),
    ));
    assert!(eventually(T, || count.load(Ordering::SeqCst) >= 1).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = count.load(Ordering::SeqCst);
    let mut child = alloc("child", "t1");
    child.metadata.owner_references = vec![parent.owner_ref(true).unwrap()];
    api.create(&PostParams::default(), &child).await.unwrap();
    assert!(
        eventually(T, || count.load(Ordering::SeqCst) > before).await,
        "a child change reconciles its owner"
    );
    assert_eq!(store.by_owner_uid(parent.uid().unwrap()).len(), 1);
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct E(String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizer_add_cleanup_remove() {
    const FIN: &str = "lattice.dev/test-cleanup";
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    let f = factory(&env);
    struct Ctx {
        api: Api<Allocation>,
        applies: AtomicUsize,
        cleanups: AtomicUsize,
    }
    let ctx = Arc::new(Ctx {
        api: Api::all(env.client.clone()),
        applies: AtomicUsize::new(0),
        cleanups: AtomicUsize::new(0),
    });
    tokio::spawn(Controller::<Allocation>::new(&f).name("fin").run(
        |a: Arc<Allocation>, ctx: Arc<Ctx>| async move {
            let c = ctx.clone();
            finalizer(&ctx.api, FIN, a, move |ev| async move {
                match ev {
                    finalizer::Event::Apply(_) => c.applies.fetch_add(1, Ordering::SeqCst),
                    finalizer::Event::Cleanup(_) => c.cleanups.fetch_add(1, Ordering::SeqCst),
                };
                Ok::<_, E>(Action::await_change())
            })
            .await
        },
        ctx.clone(),
    ));
    let with_fin = tokio::time::timeout(
        T,
        await_condition(api.clone(), "a1", |o: Option<&Allocation>| {
            o.is_some_and(|o| o.finalizers().iter().any(|f| f == FIN))
        }),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(eventually(T, || ctx.applies.load(Ordering::SeqCst) >= 1).await);
    assert_eq!(ctx.cleanups.load(Ordering::SeqCst), 0);
    let uid = with_fin.uid().unwrap().to_string();
    match api.delete("a1", &DeleteParams::default()).await.unwrap() {
        DeleteResult::Pending(o) => assert!(o.is_deleting()),
        DeleteResult::Deleted(_) => panic!("the finalizer must hold the object"),
    }
    tokio::time::timeout(
        T,
        await_condition(api.clone(), "a1", conditions::is_deleted(&uid)),
    )
    .await
    .expect("deleted once cleanup ran");
    assert!(ctx.cleanups.load(Ordering::SeqCst) >= 1);
    assert!(api.get_opt("a1").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_under_409_conflicts() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();

    // Api level: concurrent read-modify-write with retry loses no update.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            api.update_with_retry("a1", 50, |a| {
                a.metadata.labels.insert(format!("k{i}"), "v".into());
                true
            })
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let a = api.get("a1").await.unwrap();
    assert_eq!(a.labels().keys().filter(|k| k.starts_with('k')).count(), 8);

    // A stale PUT is a 409.
    let mut stale = a.clone();
    api.patch(
        "a1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"bump": "1"}}})),
    )
    .await
    .unwrap();
    stale.metadata.labels.insert("stale".into(), "1".into());
    let err = api
        .replace("a1", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");

    // Controller level: a reconciler that PUTs from the cache while someone else keeps
    // writing fails with 409, is retried with backoff, and converges.
    let f = factory(&env);
    let failures_seen = Arc::new(Mutex::new(HashSet::new()));
    let fs = failures_seen.clone();
    let writer_api = api.clone();
    let writer = tokio::spawn(async move {
        for i in 0..30 {
            let _ = writer_api
                .patch(
                    "a1",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {"lattice.dev/tick": i.to_string()}}}),
                    ),
                )
                .await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let c = Controller::<Allocation>::new(&f)
        .name("conflicts")
        .backoff(fast_backoff());
    tokio::spawn(c.run_with_error_policy(
        |a: Arc<Allocation>, api: Arc<Api<Allocation>>| async move {
            if a.labels().get("reconciled").is_some() {
                return Ok(Action::await_change());
            }
            let mut next = (*a).clone();
            next.metadata
                .labels
                .insert("reconciled".into(), "true".into());
            api.replace(a.name_any(), &PostParams::default(), &next)
                .await?;
            Ok::<_, lattice_runtime::Error>(Action::await_change())
        },
        move |_, e: &lattice_runtime::Error, ectx: &ErrorContext, _| {
            assert!(e.is_conflict(), "{e}");
            fs.lock().unwrap().insert(ectx.failures);
            ectx.backoff()
        },
        Arc::new(api.clone()),
    ));
    writer.await.unwrap();
    let done = tokio::time::timeout(
        T,
        await_condition(api.clone(), "a1", |o: Option<&Allocation>| {
            o.is_some_and(|o| o.labels().contains_key("reconciled"))
        }),
    )
    .await
    .expect("converges");
    assert!(done.is_some());
    tracing::info!(failures = ?failures_seen.lock().unwrap(), "conflict failures seen by the error policy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_after_watch_outage_past_compaction() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    let f = factory(&env);
    let seen = Arc::new(Seen::default());
    let s2 = seen.clone();
    let c = Controller::<Allocation>::new(&f)
        .name("outage")
        .on_deleted(move |r: ObjectRef| {
            let s = s2.clone();
            async move { s.deleted.lock().unwrap().push(r.name) }
        });
    tokio::spawn(c.run(
        |a: Arc<Allocation>, s: Arc<Seen>| async move {
            s.names.lock().unwrap().push(a.name_any().to_string());
            Ok::<_, std::convert::Infallible>(Action::await_change())
        },
        seen.clone(),
    ));
    assert!(eventually(T, || seen.names.lock().unwrap().contains(&"a1".to_string())).await);

    // Outage: the watch is cut and refused; meanwhile a1 is deleted, a3 created, and the
    // store compacts past the controller's resourceVersion.
    env.transport.block(true);
    env.transport.cut_watches();
    api.delete("a1", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &alloc("a3", "t1"))
        .await
        .unwrap();
    env.backend.compact(env.store.revision()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    env.transport.block(false);

    // 410 → relist → the deletion and the creation are both reconciled.
    assert!(
        eventually(T, || seen
            .deleted
            .lock()
            .unwrap()
            .contains(&"a1".to_string()))
        .await
    );
    assert!(eventually(T, || seen.names.lock().unwrap().contains(&"a3".to_string())).await);
    assert_eq!(env.transport.lists_of("Allocation"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_predicate_skips_status_only_updates() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    api.create(&PostParams::default(), &alloc("a1", "t1"))
        .await
        .unwrap();
    let f = factory(&env);
    let seen = Arc::new(Seen::default());
    let c = Controller::<Allocation>::new(&f)
        .name("gen")
        .predicate(lattice_runtime::controller::predicates::generation);
    tokio::spawn(c.run(
        |a: Arc<Allocation>, s: Arc<Seen>| async move {
            s.names.lock().unwrap().push(format!(
                "{}@{}",
                a.name_any(),
                a.generation().unwrap_or(0)
            ));
            Ok::<_, std::convert::Infallible>(Action::await_change())
        },
        seen.clone(),
    ));
    assert!(eventually(T, || seen.names.lock().unwrap().len() == 1).await);
    api.patch_status(
        "a1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    api.patch(
        "a1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        seen.names.lock().unwrap().len(),
        1,
        "status and label changes skipped"
    );
    api.patch(
        "a1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"args": ["-c", "echo changed"]}})),
    )
    .await
    .unwrap();
    assert!(eventually(T, || seen.names.lock().unwrap().iter().any(|n| n == "a1@2")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_keeps_other_objects_out_but_owned_children_still_trigger() {
    let env = env().await;
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let mut wanted = alloc("wanted", "t1");
    wanted.metadata.labels.insert("mine".into(), "yes".into());
    api.create(&PostParams::default(), &wanted).await.unwrap();
    let other = api
        .create(&PostParams::default(), &alloc("other", "t1"))
        .await
        .unwrap();
    let f = factory(&env);
    let seen = Arc::new(Seen::default());
    let c = Controller::<Allocation>::new(&f)
        .name("filtered")
        .filter(|a: &Allocation| a.labels().contains_key("mine"))
        .owns::<Allocation>()
        .on_deleted({
            let seen = seen.clone();
            move |r: ObjectRef| {
                let seen = seen.clone();
                async move { seen.deleted.lock().unwrap().push(r.name) }
            }
        });
    tokio::spawn(c.run(
        |a: Arc<Allocation>, s: Arc<Seen>| async move {
            s.names.lock().unwrap().push(a.name_any().to_string());
            Ok::<_, std::convert::Infallible>(Action::await_change())
        },
        seen.clone(),
    ));
    let names = |s: &Seen| s.names.lock().unwrap().clone();
    // Start-up pass: only the accepted object.
    assert!(
        eventually(T, || names(&seen) == ["wanted"]).await,
        "{:?}",
        names(&seen)
    );
    // Changes to refused objects are dropped; a refused object that starts to match
    // comes in with that change.
    api.patch_status(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    api.patch(
        "wanted",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    assert!(eventually(T, || names(&seen).len() == 2).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        names(&seen),
        ["wanted", "wanted"],
        "the refused object's change is dropped"
    );
    // A child of a refused owner still triggers that owner (owns maps past the filter).
    let mut child = alloc("child", "t1");
    child.metadata.owner_references = vec![other.owner_ref(true).unwrap()];
    api.create(&PostParams::default(), &child).await.unwrap();
    assert!(eventually(T, || names(&seen).iter().any(|n| n == "other")).await);
    assert!(
        !names(&seen).iter().any(|n| n == "child"),
        "the child itself is refused"
    );
    // The deletion of an accepted object reaches the hook; a refused one's does not.
    api.delete("wanted", &DeleteParams::default())
        .await
        .unwrap();
    api.delete("child", &DeleteParams::default()).await.unwrap();
    assert!(eventually(T, || seen.deleted.lock().unwrap().len() == 1).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*seen.deleted.lock().unwrap(), ["wanted"]);
}
