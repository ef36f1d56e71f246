//! The audit log through the real HTTP server: records of creates, patches, deletes,
//! refusals and sessions into sensitive work (committed to the store before the session
//! is opened), the chain verified, an edited, removed or cut-off record caught, the
//! policy's levels, token secrets never recorded, and the webhook and syslog forwarders.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{alloc, allocs, call, start_authenticated, TestServer, API};
use lattice_apiserver::audit::{AuditConfig, Auditor};
use lattice_apiserver::Role;
use lattice_store::{KeyRange, KvBackend, RangeRequest};
use reqwest::Method;
use serde_json::{json, Value};

fn token(user: &str, tenants: &[&str], role: Role) -> String {
    common::auth_token(user, tenants, role)
}

fn admin() -> String {
    common::admin_token()
}

struct Audited {
    s: TestServer,
    dir: tempfile::TempDir,
    hooked: Arc<std::sync::Mutex<Vec<Value>>>,
    syslog: tokio::net::UdpSocket,
}

async fn audited() -> Audited {
    let s = start_authenticated().await;
    // A webhook receiver and a syslog receiver.
    let hooked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let h = hooked.clone();
    let app = axum::Router::new().route(
        "/audit",
        axum::routing::post(move |axum::Json(batch): axum::Json<Vec<Value>>| {
            let h = h.clone();
            async move {
                h.lock().unwrap().extend(batch);
                "ok"
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook = format!("http://{}/audit", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    let syslog = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = AuditConfig {
        webhook: Some(webhook),
        syslog: Some(syslog.local_addr().unwrap()),
        ..AuditConfig::new(dir.path().join("audit"), "api-1")
    };
    let backend: Arc<dyn KvBackend> = Arc::new(s.store.clone());
    s.server
        .set_audit(Auditor::start(cfg, backend).await.unwrap());
    for t in ["t1", "t2"] {
        let (c, v) = call(
            &s,
            Method::POST,
            &format!("{API}/tenants"),
            &admin(),
            Some(
                json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
                        "metadata": {"name": t},
                        "spec": {"admins": ["tadmin"], "quota": {"sensitivePoolSize": 2}}}),
            ),
        )
        .await;
        assert_eq!(c, 201, "{v}");
    }
    Audited {
        s,
        dir,
        hooked,
        syslog,
    }
}

async fn records(s: &TestServer, tok: &str, query: &str) -> (u16, Vec<Value>) {
    let (code, v) = call(s, Method::GET, &format!("/v1/audit{query}"), tok, None).await;
    (code, v["items"].as_array().cloned().unwrap_or_default())
}

#[tokio::test]
async fn changes_refusals_and_sensitive_sessions_are_recorded_in_a_verifiable_chain() {
    let a = audited().await;
    let s = &a.s;
    // alice may claim nodes in t1.
    let alice = token("alice", &[], Role::Readonly);
    common::bind_role(
        s,
        &admin(),
        Some("t1"),
        "claiming-user",
        "alice",
        Some((&alice, &allocs("t1"))),
    )
    .await;
    // Create, patch, delete.
    let (c, v) = call(
        s,
        Method::POST,
        &allocs("t1"),
        &alice,
        Some(alloc("a1", "t1")),
    )
    .await;
    assert_eq!(c, 201, "{v}");
    let resp = s
        .client
        .patch(s.url(&format!("{}/a1", allocs("t1"))))
        .bearer_auth(&alice)
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"metadata": {"labels": {"stage": "two"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let (c, _) = call(
        s,
        Method::DELETE,
        &format!("{}/a1", allocs("t1")),
        &alice,
        None,
    )
    .await;
    assert_eq!(c, 200);
    // A refusal: bob holds nothing in t1.
    let bob = token("bob", &[], Role::Readonly);
    let (c, _) = call(
        s,
        Method::POST,
        &allocs("t1"),
        &bob,
        Some(alloc("b1", "t1")),
    )
    .await;
    assert_eq!(c, 403);
    // Sensitive work: its create and a session into it are committed to the store first.
    let mut sens = alloc("s1", "t1");
    sens["spec"]["sensitive"] = json!(true);
    let (c, v) = call(s, Method::POST, &allocs("t1"), &alice, Some(sens)).await;
    assert_eq!(c, 201, "{v}");
    let system = token("scheduler", &["*"], Role::System);
    let mut running = v.clone();
    running["status"] = json!({"phase": "Running", "assignedNodes": ["n1"]});
    let (c, v) = call(
        s,
        Method::PUT,
        &format!("{}/s1/status", allocs("t1")),
        &system,
        Some(running),
    )
    .await;
    assert_eq!(c, 200, "{v}");
    // Not a WebSocket, so no session opens; the access is on record before that answer.
    let (c, _) = call(
        s,
        Method::GET,
        &format!("{}/s1/attach?command=id", allocs("t1")),
        &alice,
        None,
    )
    .await;
    assert_eq!(c, 400);
    let stored = s
        .store
        .range(RangeRequest {
            range: KeyRange::prefix(Bytes::from_static(b"/lattice/audit/sensitive/api-1/")),
            ..Default::default()
        })
        .await
        .unwrap();
    let sensitive: Vec<Value> = stored
        .kvs
        .iter()
        .map(|kv| serde_json::from_slice(&kv.value).unwrap())
        .collect();
    let what: Vec<(String, String)> = sensitive
        .iter()
        .map(|r| {
            (
                r["verb"].as_str().unwrap().to_string(),
                r["subresource"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(what.contains(&("create".into(), String::new())), "{what:?}");
    assert!(
        what.contains(&("connect".into(), "attach".into())),
        "{what:?}"
    );
    assert!(sensitive
        .iter()
        .all(|r| r["stage"] == "RequestReceived" && r["user"] == "alice"));

    // The query: alice's records, with outcome, source and chain fields.
    let (c, mine) = records(s, &admin(), "?user=alice").await;
    assert_eq!(c, 200);
    let verbs: Vec<&str> = mine.iter().map(|r| r["verb"].as_str().unwrap()).collect();
    for v in ["create", "patch", "delete", "connect"] {
        assert!(verbs.contains(&v), "{v} missing from {verbs:?}");
    }
    let create = mine
        .iter()
        .find(|r| r["verb"] == "create" && r["name"] == "a1")
        .unwrap();
    assert_eq!(
        (create["code"].as_u64(), create["decision"].as_str()),
        (Some(201), Some("allow"))
    );
    assert!(
        create["source"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{create}"
    );
    assert_eq!(create["tenant"], "t1");
    let (_, denied) = records(s, &admin(), "?user=bob&decision=deny").await;
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert!(
        denied[0]["reason"]
            .as_str()
            .unwrap()
            .contains("not a member"),
        "{}",
        denied[0]
    );
    // Reads are not recorded by the default policy.
    let (_, reads) = records(s, &admin(), "?verb=get").await;
    assert!(reads.is_empty(), "{reads:?}");
    // Who may read it: a tenant's admin its tenant's records only; a user not at all.
    let ta = token("tadmin", &["t1"], Role::User);
    let (c, _) = records(s, &ta, "?tenant=t1").await;
    assert_eq!(c, 200);
    let (c, _) = records(s, &ta, "").await;
    assert_eq!(c, 403);
    let (c, _) = records(s, &alice, "?tenant=t1").await;
    assert_eq!(c, 403);

    // The chain verifies on the server, and an export verifies here.
    let (c, v) = call(s, Method::GET, "/v1/audit/verify", &admin(), None).await;
    assert_eq!((c, v["ok"].as_bool()), (200, Some(true)), "{v}");
    let export = s
        .client
        .get(s.url("/v1/audit/export"))
        .bearer_auth(admin())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (_, k) = call(s, Method::GET, "/v1/audit/keys", &admin(), None).await;
    let keys: std::collections::HashMap<String, lattice_apis::audit::PublicKey> = k["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["keyId"].as_str().unwrap().to_string(),
                lattice_apis::audit::PublicKey {
                    server: k["server"].as_str().unwrap().to_string(),
                    key: lattice_apis::audit::base64_decode(k["publicKey"].as_str().unwrap())
                        .unwrap(),
                },
            )
        })
        .collect();
    let lines: Vec<&str> = export.lines().collect();
    assert!(lines.len() >= 8, "{export}");
    let report = lattice_apis::audit::verify(lines.iter().copied(), &keys, true);
    assert!(report.ok(), "{:?}", report.problems);
    // An edited line, a removed one, two swapped: each named.
    let edited: Vec<String> = lines
        .iter()
        .map(|l| {
            if l.contains("\"bob\"") {
                l.replace("\"deny\"", "\"allow\"")
            } else {
                l.to_string()
            }
        })
        .collect();
    let r = lattice_apis::audit::verify(edited.iter().map(String::as_str), &keys, true);
    assert!(
        r.problems.iter().any(|p| p.contains("was edited")),
        "{:?}",
        r.problems
    );
    let mut removed: Vec<&str> = lines.clone();
    removed.remove(3);
    let r = lattice_apis::audit::verify(removed.iter().copied(), &keys, true);
    assert!(
        r.problems.iter().any(|p| p.contains("missing")),
        "{:?}",
        r.problems
    );
    // The file on the server edited in place: the server's own check catches it.
    let file = a.dir.path().join("audit/audit.log");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replacen("\"alice\"", "\"carol\"", 1)).unwrap();
    let (_, v) = call(s, Method::GET, "/v1/audit/verify", &admin(), None).await;
    assert_eq!(v["ok"], false, "{v}");
    assert!(v.to_string().contains("was edited"), "{v}");
    // Cut short after its head was committed: the records removed from its end are named.
    let kept: Vec<&str> = text.lines().collect();
    tokio::time::sleep(Duration::from_millis(1500)).await; // one checkpoint of the head
    std::fs::write(&file, format!("{}\n", kept[..kept.len() - 2].join("\n"))).unwrap();
    let (_, v) = call(s, Method::GET, "/v1/audit/verify", &admin(), None).await;
    assert!(v.to_string().contains("removed from its end"), "{v}");

    // Forwarded: the webhook got the records, syslog an RFC 5424 line.
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.hooked.lock().unwrap().len() < 5 {
        assert!(Instant::now() < deadline, "the webhook got nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(a
        .hooked
        .lock()
        .unwrap()
        .iter()
        .any(|r| r["user"] == "alice" && r["verb"] == "delete"));
    let mut buf = vec![0u8; 65536];
    let n = tokio::time::timeout(Duration::from_secs(5), a.syslog.recv(&mut buf))
        .await
        .expect("a syslog datagram")
        .unwrap();
    let line = String::from_utf8_lossy(&buf[..n]);
    assert!(line.starts_with("<110>1 "), "{line}");
    assert!(line.contains("lattice-apiserver - audit - {"), "{line}");
}

#[tokio::test]
async fn the_policy_sets_the_level_and_token_secrets_are_never_recorded() {
    let a = audited().await;
    let s = &a.s;
    // Everything about allocations with bodies; reads of nodes at Metadata.
    let (c, v) = call(
        s,
        Method::POST,
        &format!("{API}/auditpolicies"),
        &admin(),
        Some(
            json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "AuditPolicy",
                    "metadata": {"name": "default"},
                    "rules": [
                        {"level": "RequestResponse", "resources": ["allocations"]},
                        {"level": "Metadata", "verbs": ["list"], "resources": ["nodes"]},
                        {"level": "RequestResponse", "resources": ["apitokens"]},
                        {"level": "Metadata"}]}),
        ),
    )
    .await;
    assert_eq!(c, 201, "{v}");
    // Another name would never be read: refused.
    let (c, v) = call(
        s,
        Method::POST,
        &format!("{API}/auditpolicies"),
        &admin(),
        Some(
            json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "AuditPolicy",
                    "metadata": {"name": "mine"}, "rules": []}),
        ),
    )
    .await;
    assert_eq!(c, 422, "{v}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (c, _) = call(s, Method::GET, &format!("{API}/nodes"), &admin(), None).await;
        assert_eq!(c, 200);
        let (_, listed) = records(s, &admin(), "?verb=list&resource=nodes").await;
        if !listed.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the policy never took effect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (c, _) = call(
        s,
        Method::POST,
        &allocs("t1"),
        &admin(),
        Some(alloc("p1", "t1")),
    )
    .await;
    assert_eq!(c, 201);
    let (_, r) = records(s, &admin(), "?verb=create&resource=allocations").await;
    let rec = r.last().unwrap();
    assert_eq!(rec["level"], "RequestResponse");
    assert_eq!(rec["requestObject"]["metadata"]["name"], "p1");
    assert!(
        rec["responseObject"]["metadata"]["uid"].is_string(),
        "{rec}"
    );
    // An API token: the request is recorded, its secret never.
    let (c, made) = call(
        s,
        Method::POST,
        "/v1/admin/tokens",
        &admin(),
        Some(json!({"user": "ci"})),
    )
    .await;
    assert_eq!(c, 201);
    let secret = made["token"].as_str().unwrap();
    let (_, r) = records(s, &admin(), "?resource=apitokens").await;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0]["requestObject"]["user"], "ci");
    assert!(r[0].get("responseObject").is_none(), "{}", r[0]);
    let export = s
        .client
        .get(s.url("/v1/audit/export"))
        .bearer_auth(admin())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !export.contains(secret),
        "a token secret reached the audit log"
    );
}
