//! The garbage collector in a ControllerHost against a real store: orphans are
//! deleted, dependents follow a deleted owner, dangling references to one of several
//! owners are dropped, finalizers are respected.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use lattice_apis::Allocation;
use lattice_apis::OwnerReference;
use lattice_runtime::wait::{await_condition, conditions};
use lattice_runtime::{
    gc, AlwaysLeader, Api, ControllerHost, DeleteParams, PostParams, ResourceExt,
};

const T: Duration = Duration::from_secs(10);

fn owned_by(name: &str, owners: &[&Allocation]) -> Allocation {
    let mut a = alloc(name, "t1");
    a.metadata.owner_references = owners
        .iter()
        .enumerate()
        .map(|(i, o)| o.owner_ref(i == 0).unwrap())
        .collect();
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_orphans_and_follows_owner_deletion() {
    let env = env().await;
    let mut host = ControllerHost::new(env.client.clone(), Arc::new(AlwaysLeader::new()))
        .with_factory(factory(&env));
    gc::register(&mut host);
    let readiness = host.readiness();
    tokio::spawn(host.run(std::future::pending()));
    assert!(
        eventually(T, || readiness.is_ready()).await,
        "host becomes ready"
    );

    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let p1 = api
        .create(&PostParams::default(), &alloc("p1", "t1"))
        .await
        .unwrap();
    let p2 = api
        .create(&PostParams::default(), &alloc("p2", "t1"))
        .await
        .unwrap();
    let child = api
        .create(&PostParams::default(), &owned_by("child", &[&p1]))
        .await
        .unwrap();
    let shared = api
        .create(&PostParams::default(), &owned_by("shared", &[&p1, &p2]))
        .await
        .unwrap();
    let mut orphan = alloc("orphan", "t1");
    orphan.metadata.owner_references = vec![OwnerReference {
        api_version: "lattice.dev/v1alpha1".into(),
        kind: "Allocation".into(),
        name: "gone".into(),
        uid: "00000000-0000-0000-0000-000000000000".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }];
    let orphan = api.create(&PostParams::default(), &orphan).await.unwrap();

    // An object whose owner never existed is collected.
    tokio::time::timeout(
        T,
        await_condition(
            api.clone(),
            "orphan",
            conditions::is_deleted(orphan.uid().unwrap()),
        ),
    )
    .await
    .expect("orphan collected");
    // Live owners protect their dependents.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(api.get_opt("child").await.unwrap().is_some());

    // Deleting p1: child (only owner p1) goes; shared keeps p2 and loses the p1 ref.
    api.delete("p1", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        T,
        await_condition(
            api.clone(),
            "child",
            conditions::is_deleted(child.uid().unwrap()),
        ),
    )
    .await
    .expect("dependent of a deleted owner collected");
    let p2_uid = p2.uid().unwrap().to_string();
    let s = tokio::time::timeout(
        T,
        await_condition(api.clone(), "shared", move |o: Option<&Allocation>| {
            o.is_some_and(|o| {
                o.owner_references().len() == 1 && o.owner_references()[0].uid == p2_uid
            })
        }),
    )
    .await
    .expect("dangling reference dropped")
    .unwrap();
    assert_eq!(s.uid(), shared.uid(), "the same object, not a recreation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn respects_finalizers_on_dependents() {
    let env = env().await;
    let mut host = ControllerHost::new(env.client.clone(), Arc::new(AlwaysLeader::new()))
        .with_factory(factory(&env));
    gc::register(&mut host);
    tokio::spawn(host.run(std::future::pending()));
    let api: Api<Allocation> = Api::namespaced(env.client.clone(), "t1");
    let p = api
        .create(&PostParams::default(), &alloc("p", "t1"))
        .await
        .unwrap();
    let mut c = owned_by("c", &[&p]);
    c.metadata.finalizers = vec!["lattice.dev/keep".into()];
    api.create(&PostParams::default(), &c).await.unwrap();
    api.delete("p", &DeleteParams::default()).await.unwrap();
    let terminating = tokio::time::timeout(
        T,
        await_condition(api.clone(), "c", |o: Option<&Allocation>| {
            o.is_some_and(|o| o.is_deleting())
        }),
    )
    .await
    .expect("marked for deletion")
    .unwrap();
    assert_eq!(terminating.finalizers(), ["lattice.dev/keep".to_string()]);
}
