//! Built-in controllers in a replicated control plane: three real `lattice-server`
//! processes. Only the Raft leader runs the controller host (its garbage collector is the
//! probe here); when the leader is SIGKILLed, a surviving member takes the controllers
//! over within seconds and no reconcile is lost: owners deleted before, during and after
//! the leader change all get their dependents collected. At no sample do two live members
//! run the controllers at once.

use std::time::{Duration, Instant};

use lattice_apis::Allocation;
use lattice_e2e::RaftMember;
use lattice_runtime::{Api, Client, DeleteParams, PostParams, ResourceExt};

/// `lattice_controller_running{controller="garbage-collector"}` on one member, `None`
/// when it does not answer.
async fn gc_running(http: &reqwest::Client, url: &str) -> Option<bool> {
    let text = http
        .get(format!("{url}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let line = text.lines().find(|l| {
        l.starts_with("lattice_controller_running")
            && l.contains("controller=\"garbage-collector\"")
    })?;
    Some(line.trim_end().ends_with(" 1"))
}

fn allocation(name: &str, owner: Option<&Allocation>) -> Allocation {
    let mut a: Allocation = serde_json::from_value(serde_json::json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "10m"}}
    }))
    .expect("allocation");
    if let Some(o) = owner {
        a.metadata.owner_references = vec![o.owner_ref(true).expect("owner ref")];
    }
    a
}

/// Create an owner and its dependent through any member that answers.
async fn pair(apis: &[Api<Allocation>], i: usize) -> Allocation {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for api in apis {
            let owner = match api
                .create(
                    &PostParams::default(),
                    &allocation(&format!("owner-{i}"), None),
                )
                .await
            {
                Ok(o) => o,
                Err(_) => match api.get(&format!("owner-{i}")).await {
                    Ok(o) => o,
                    Err(_) => continue,
                },
            };
            let dep = allocation(&format!("dep-{i}"), Some(&owner));
            if api.create(&PostParams::default(), &dep).await.is_ok()
                || api.get(&format!("dep-{i}")).await.is_ok()
            {
                return owner;
            }
        }
        assert!(Instant::now() < deadline, "could not create pair {i}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn delete_owner(apis: &[Api<Allocation>], i: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for api in apis {
            let name = format!("owner-{i}");
            if api.delete(&name, &DeleteParams::default()).await.is_ok() {
                return;
            }
            if let Err(lattice_runtime::Error::Api(e)) = api.get(&name).await {
                if e.code == 404 {
                    return;
                }
            }
        }
        assert!(Instant::now() < deadline, "could not delete owner-{i}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_follow_the_raft_leader_and_lose_no_reconcile() {
    let root = tempfile::tempdir().unwrap();
    let secret = root.path().join("jwt.secret");
    std::fs::write(&secret, b"controllers-ha-test-secret-0123456789").unwrap();
    let mut members: Vec<RaftMember> = (1..=3).map(|id| RaftMember::new(root.path(), id)).collect();
    let jwt = [
        "--jwt-secret-file".to_string(),
        secret.display().to_string(),
    ];
    members[0].start(&[&jwt[..], &["--bootstrap".into(), "--dev".into()]].concat());
    let seed = format!("127.0.0.1:{}", members[0].raft);
    for m in members.iter_mut().skip(1) {
        m.start(&[&jwt[..], &["--join".into(), seed.clone()]].concat());
    }
    let token = members[0].server.as_ref().unwrap().admin_token();
    let http = reqwest::Client::new();

    // Exactly one member runs the controllers: the leader.
    let leader_idx = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut running = Vec::new();
            for (i, m) in members.iter().enumerate() {
                if gc_running(&http, &m.url()).await == Some(true) {
                    running.push(i);
                }
            }
            if running.len() == 1 {
                break running[0];
            }
            assert!(
                running.len() <= 1,
                "controllers run on several members at once: {running:?}"
            );
            assert!(Instant::now() < deadline, "no member runs the controllers");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };

    let api_for = |m: &RaftMember| -> Api<Allocation> {
        Api::namespaced(
            Client::http(&m.url(), Some(token.clone())).expect("client"),
            "default",
        )
    };
    let all: Vec<Api<Allocation>> = members.iter().map(api_for).collect();

    // Before the leader change: 5 pairs, owners deleted, dependents collected.
    for i in 0..5 {
        pair(&all, i).await;
    }
    for i in 0..5 {
        delete_owner(&all, i).await;
    }
    // More pairs whose owners are deleted right around the leader's death.
    for i in 5..10 {
        pair(&all, i).await;
    }

    let killed_at = Instant::now();
    members[leader_idx].server.as_mut().unwrap().kill9();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader_idx).collect();
    let live: Vec<Api<Allocation>> = survivors.iter().map(|&i| api_for(&members[i])).collect();
    for i in 5..10 {
        delete_owner(&live, i).await;
    }

    // A survivor takes over; never two at once.
    let new_leader = {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut running = Vec::new();
            for &i in &survivors {
                if gc_running(&http, &members[i].url()).await == Some(true) {
                    running.push(i);
                }
            }
            assert!(
                running.len() <= 1,
                "controllers run on several members at once: {running:?}"
            );
            if let [i] = running[..] {
                break i;
            }
            assert!(
                Instant::now() < deadline,
                "no survivor took the controllers over"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let handover = killed_at.elapsed();
    eprintln!("controllers moved from member {leader_idx} to {new_leader} in {handover:?}");
    assert!(
        handover < Duration::from_secs(10),
        "handover took {handover:?}"
    );

    // After the change: more pairs and deletes.
    for i in 10..15 {
        pair(&live, i).await;
        delete_owner(&live, i).await;
    }

    // Every dependent is collected: no reconcile was lost.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut left = Vec::new();
        for i in 0..15 {
            match live[0].get(&format!("dep-{i}")).await {
                Err(lattice_runtime::Error::Api(e)) if e.code == 404 => {}
                Ok(d) => left.push(d.name_any().to_string()),
                Err(_) => left.push(format!("dep-{i} (unreadable)")),
            }
        }
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dependents not collected after the leader change: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The killed member restarts as a follower: still one controller host running.
    members[leader_idx].start(&jwt);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut running = Vec::new();
    for (i, m) in members.iter().enumerate() {
        if gc_running(&http, &m.url()).await == Some(true) {
            running.push(i);
        }
    }
    assert_eq!(
        running,
        vec![new_leader],
        "one controller host after restart"
    );
}
