//! Floods and out-of-range numbers, performed against the real server: a huge watch
//! timeout, one identity flooding while another is served, a cap on watches, a tenant at
//! its object-count quota (sequential and in parallel), and unauthorized bodies refused
//! before they are parsed.

mod common;
use common::*;

use std::time::Duration;

use lattice_apiserver::limits::{ClassLimits, IdentityLimits};
use lattice_apiserver::quota::ObjectQuotas;
use lattice_apiserver::{mint_token, ApiConfig, Role};
use lattice_store::KvBackend;
use reqwest::Method;
use serde_json::{json, Value};

const SECRET: &[u8] = b"floods-secret";

fn token(name: &str, role: Role, tenants: &[&str]) -> String {
    let t: Vec<String> = tenants.iter().map(|s| s.to_string()).collect();
    mint_token(SECRET, name, &t, role, Duration::from_secs(600))
}

fn authenticated(limits: IdentityLimits, quotas: ObjectQuotas) -> ApiConfig {
    ApiConfig {
        jwt_secret: SECRET.to_vec(),
        auth: true,
        limits,
        object_quotas: quotas,
        ..Default::default()
    }
}

/// A YAML body whose aliases describe 40 million nodes in 150 KB.
fn alias_bomb() -> String {
    let wide: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    format!(
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {{name: bomb}}\nspec:\n  x: &x [{}]\n  y: [{}]\n",
        wide.join(","),
        vec!["*x"; 2_000].join(",")
    )
}

#[tokio::test]
async fn a_huge_watch_timeout_is_a_400_and_the_server_goes_on() {
    let s = start().await;
    let path = format!(
        "{}?watch=1&timeoutSeconds=18446744073709551615",
        allocs("t1")
    );
    let resp = s
        .client
        .get(s.url(&path))
        .send()
        .await
        .expect("an answer, not a reset");
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().await.unwrap();
    let msg = v["message"].as_str().unwrap();
    assert!(
        msg.contains("timeoutSeconds") && msg.contains("from 0 to 86400"),
        "{msg}"
    );
    // In range: served (and ends when it says).
    let mut w = s
        .watch(&format!("{}?watch=1&timeoutSeconds=1", allocs("t1")))
        .await;
    assert_eq!(w.status, 200);
    assert!(w.next(Duration::from_secs(5)).await.is_none());
    // Other numbers.
    for (path, param) in [
        (format!("{}?limit=-1", allocs("t1")), "limit"),
        (format!("{}?limit=99999999999", allocs("t1")), "limit"),
        (
            format!("{API}/namespaces/t1/allocations/a/log?tailLines=99999999999999"),
            "tailLines",
        ),
        (
            format!("{API}/namespaces/t1/allocations/a/log?attempt=4294967296"),
            "attempt",
        ),
        (
            format!(
                "{API}/namespaces/t1/allocations/a/log?sinceTime=2026-03-02T00:00:00Z&untilTime=2026-03-01T00:00:00Z"
            ),
            "untilTime",
        ),
    ] {
        let (c, v) = s.get(&path).await;
        assert_eq!(c, 400, "{path}: {v}");
        assert!(v["message"].as_str().unwrap().contains(param), "{v}");
    }
    let (c, _) = s.get(&allocs("t1")).await;
    assert_eq!(c, 200);
}

#[tokio::test]
async fn one_identity_flooding_gets_429_while_another_is_served() {
    let mut limits = IdentityLimits::DEFAULT;
    limits.users = ClassLimits {
        requests_per_second: 2,
        burst: 10,
        max_in_flight: 0,
        max_watches: 0,
    };
    let s = start_with(authenticated(limits, ObjectQuotas::DEFAULT)).await;
    let alice = token("alice", Role::User, &["t1"]);
    let bob = token("bob", Role::User, &["t1"]);
    let mut refused = 0;
    let mut retry_after = None;
    for _ in 0..40 {
        let resp = s
            .client
            .get(s.url(&allocs("t1")))
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap();
        if resp.status().as_u16() == 429 {
            refused += 1;
            retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(String::from);
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["reason"], "TooManyRequests", "{v}");
            assert!(
                v["message"]
                    .as_str()
                    .unwrap()
                    .contains("2 requests per second"),
                "{v}"
            );
        }
    }
    assert!(refused >= 25, "only {refused} of 40 refused");
    let secs: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=2).contains(&secs), "{secs}");
    // Bob is served in the middle of Alice's flood, and so is an administrator.
    let (c, v) = call(&s, Method::GET, &allocs("t1"), &bob, None).await;
    assert_eq!(c, 200, "{v}");
    let admin = token("ops", Role::Admin, &["*"]);
    let (c, v) = call(&s, Method::GET, &allocs("t1"), &admin, None).await;
    assert_eq!(c, 200, "{v}");
    // The refusals are counted.
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.lines().any(
            |l| l.starts_with("lattice_apiserver_limit_rejections_total")
                && l.contains("class=\"user\"")
                && l.contains("limit=\"rate\"")
        ),
        "{text}"
    );
    // After the wait the bucket has room again.
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (c, v) = call(&s, Method::GET, &allocs("t1"), &alice, None).await;
    assert_eq!(c, 200, "{v}");
}

#[tokio::test]
async fn watches_per_identity_are_capped() {
    let mut limits = IdentityLimits::DEFAULT;
    limits.users.max_watches = 2;
    let s = start_with(authenticated(limits, ObjectQuotas::DEFAULT)).await;
    let alice = token("alice", Role::User, &["t1"]);
    let bob = token("bob", Role::User, &["t1"]);
    let open = |tok: String| {
        let s = &s;
        async move {
            s.client
                .get(s.url(&format!("{}?watch=1", allocs("t1"))))
                .bearer_auth(tok)
                .send()
                .await
                .unwrap()
        }
    };
    let w1 = open(alice.clone()).await;
    let w2 = open(alice.clone()).await;
    assert_eq!((w1.status().as_u16(), w2.status().as_u16()), (200, 200));
    let third = open(alice.clone()).await;
    assert_eq!(third.status().as_u16(), 429);
    let v: Value = third.json().await.unwrap();
    assert!(v["message"].as_str().unwrap().contains("(2/2)"), "{v}");
    // Another identity is not affected.
    let b = open(bob.clone()).await;
    assert_eq!(b.status().as_u16(), 200);
    // Closing one frees its place (the server notices the closed connection).
    drop(w1);
    let mut reopened = None;
    for _ in 0..100 {
        let r = open(alice.clone()).await;
        if r.status().as_u16() == 200 {
            reopened = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reopened.is_some(),
        "a closed watch never gave its place back"
    );
    drop(w2);
}

#[tokio::test]
async fn a_tenant_at_its_quota_is_refused_and_a_tenant_spec_overrides_it() {
    let quotas = ObjectQuotas {
        allocations: 3,
        ..ObjectQuotas::DEFAULT
    };
    let s = start_with(authenticated(IdentityLimits::DEFAULT, quotas)).await;
    let alice = token("alice", Role::User, &["t1", "t2"]);
    for i in 0..3 {
        let (c, v) = call(
            &s,
            Method::POST,
            &allocs("t1"),
            &alice,
            Some(alloc(&format!("a{i}"), "t1")),
        )
        .await;
        assert_eq!(c, 201, "{v}");
    }
    let (c, v) = call(
        &s,
        Method::POST,
        &allocs("t1"),
        &alice,
        Some(alloc("a3", "t1")),
    )
    .await;
    assert_eq!(c, 403, "{v}");
    let msg = v["message"].as_str().unwrap();
    assert!(
        msg.contains("exceeded quota")
            && msg.contains("holds 3 allocations")
            && msg.contains("limit is 3"),
        "{msg}"
    );
    assert!(msg.contains("--tenant-max-allocations"), "{msg}");
    assert_eq!(v["details"]["quota"]["used"], 3);
    // The Intent API and server-side apply are creates too.
    let (c, v) = call(
        &s,
        Method::POST,
        "/v1/allocations?tenant=t1",
        &alice,
        Some(json!({"name": "i1", "entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}})),
    )
    .await;
    assert_eq!(c, 403, "{v}");
    let resp = s
        .client
        .patch(s.url(&format!("{}/ssa?fieldManager=me", allocs("t1"))))
        .bearer_auth(&alice)
        .header("content-type", "application/apply-patch+yaml")
        .body("apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: ssa}\nspec: {entrypoint: /bin/true, lifecycle: {walltime: 1h}}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    // Another tenant has its own count.
    let (c, v) = call(
        &s,
        Method::POST,
        &allocs("t2"),
        &alice,
        Some(alloc("b0", "t2")),
    )
    .await;
    assert_eq!(c, 201, "{v}");
    // A delete makes room (once the server's watch has seen it).
    let (c, _) = call(
        &s,
        Method::DELETE,
        &format!("{}/a0", allocs("t1")),
        &alice,
        None,
    )
    .await;
    assert_eq!(c, 200);
    let mut created = false;
    for _ in 0..100 {
        let (c, _) = call(
            &s,
            Method::POST,
            &allocs("t1"),
            &alice,
            Some(alloc("a4", "t1")),
        )
        .await;
        if c == 201 {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(created, "the delete never made room");
    // An administrator raises t1's quota on its Tenant; users cannot.
    let tenant = json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": "t1"}, "spec": {"objectQuotas": {"allocations": 5}}});
    let (c, v) = call(
        &s,
        Method::POST,
        &format!("{API}/tenants"),
        &alice,
        Some(tenant.clone()),
    )
    .await;
    assert_eq!(c, 403, "{v}");
    let admin = token("ops", Role::Admin, &["*"]);
    let (c, v) = call(
        &s,
        Method::POST,
        &format!("{API}/tenants"),
        &admin,
        Some(tenant),
    )
    .await;
    assert_eq!(c, 201, "{v}");
    let mut more = 0;
    for i in 0..50 {
        let (c, v) = call(
            &s,
            Method::POST,
            &allocs("t1"),
            &alice,
            Some(alloc(&format!("m{i}"), "t1")),
        )
        .await;
        match c {
            201 => more += 1,
            403 if more == 2 => {
                assert!(
                    v["message"]
                        .as_str()
                        .unwrap()
                        .contains("spec.objectQuotas.allocations of Tenant \"t1\""),
                    "{v}"
                );
                break;
            }
            // Until the watch has shown the Tenant.
            403 => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => panic!("{c} {v}"),
        }
    }
    assert_eq!(more, 2, "t1 holds 5 with its own quota");
}

#[tokio::test]
async fn parallel_creates_do_not_overshoot_the_quota() {
    let quotas = ObjectQuotas {
        allocations: 10,
        ..ObjectQuotas::DEFAULT
    };
    let s = std::sync::Arc::new(start_with(authenticated(IdentityLimits::DEFAULT, quotas)).await);
    let alice = token("alice", Role::User, &["t1"]);
    let mut tasks = Vec::new();
    for i in 0..60 {
        let (s, alice) = (s.clone(), alice.clone());
        tasks.push(tokio::spawn(async move {
            call(
                &s,
                Method::POST,
                &allocs("t1"),
                &alice,
                Some(alloc(&format!("p{i}"), "t1")),
            )
            .await
            .0
        }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 10, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 403).count(), 50, "{codes:?}");
    let stored = s
        .store
        .range(lattice_store::RangeRequest::prefix(
            "/registry/lattice.dev/allocations/t1/",
        ))
        .await
        .unwrap()
        .kvs
        .len();
    assert_eq!(stored, 10);
}

#[tokio::test]
async fn bodies_are_refused_before_they_are_parsed() {
    let s = start_with(authenticated(
        IdentityLimits::DEFAULT,
        ObjectQuotas::DEFAULT,
    ))
    .await;
    let bomb = alias_bomb();
    let post = |tok: Option<String>, path: String| {
        let (s, bomb) = (&s, bomb.clone());
        async move {
            let mut r = s
                .client
                .post(s.url(&path))
                .header("content-type", "application/yaml")
                .body(bomb);
            if let Some(t) = tok {
                r = r.bearer_auth(t);
            }
            let resp = r.send().await.unwrap();
            let code = resp.status().as_u16();
            (code, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // No credentials: 401, whatever the body.
    let (c, v) = post(None, allocs("t1")).await;
    assert_eq!(c, 401, "{v}");
    // Another tenant, or read-only: 403 before the body is looked at.
    let (c, v) = post(Some(token("alice", Role::User, &["t2"])), allocs("t1")).await;
    assert_eq!(c, 403, "{v}");
    let (c, v) = post(Some(token("rita", Role::Readonly, &["t1"])), allocs("t1")).await;
    assert_eq!(c, 403, "{v}");
    let (c, v) = post(
        Some(token("alice", Role::User, &["t2"])),
        "/v1/allocations?tenant=t1".into(),
    )
    .await;
    assert_eq!(c, 403, "{v}");
    // A node enrolling with a token that is not one: 401 before its body is read.
    let (c, v) = post(
        Some("abcdef.0123456789abcdef".into()),
        lattice_apis::node_identity::BOOTSTRAP_PATH.into(),
    )
    .await;
    assert_eq!(c, 401, "{v}");
    // The member of t1 gets the body parsed, and refused for what it would build.
    let (c, v) = post(Some(token("alice", Role::User, &["t1"])), allocs("t1")).await;
    assert_eq!(c, 413, "{v}");
}
