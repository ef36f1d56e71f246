//! `GET .../allocations/{name}/attach`: who may attach, what the relay hands the node
//! agent (a single-use ticket only admins redeem), the frames relayed both ways, and the
//! `Attached` audit event. The node agent here is a WebSocket server in the test.

// tungstenite's handshake callback returns its (large) error response type.
#![allow(clippy::result_large_err)]

mod common;

use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use lattice_apis::attach::{self as proto, AttachStatus};
use lattice_apiserver::{mint_token, ApiConfig, Role};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::Message;

const SECRET: &[u8] = b"attach-test-secret";
use lattice_apis::wellknown::USER_ANNOTATION as USER;

fn token(sub: &str, role: Role) -> String {
    let tenants = match role {
        Role::Admin => vec!["*".to_string()],
        _ => vec!["t1".to_string()],
    };
    mint_token(SECRET, sub, &tenants, role, Duration::from_secs(300))
}

async fn call(
    s: &TestServer,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = s.client.request(method, s.url(path)).bearer_auth(token);
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = r.send().await.expect("send");
    let code = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// What the fake agent saw: the request's path and query, and its bearer token.
#[derive(Debug)]
struct Seen {
    uri: String,
    bearer: String,
}

/// A node agent's attach endpoint: records each request, echoes one input frame back on
/// stdout, then reports exit status 7.
async fn fake_agent() -> (String, mpsc::UnboundedReceiver<Seen>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((sock, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let cb = |req: &Request, mut resp: Response| {
                    resp.headers_mut().insert(
                        "sec-websocket-protocol",
                        proto::PROTOCOL.parse().expect("header"),
                    );
                    let bearer = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let _ = tx.send(Seen {
                        uri: req.uri().to_string(),
                        bearer,
                    });
                    Ok(resp)
                };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(sock, cb).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Binary(b) = m {
                        if b.first() == Some(&proto::STDIN) {
                            let _ = ws
                                .send(Message::Binary(proto::frame(proto::STDOUT, &b[1..]).into()))
                                .await;
                            let st = serde_json::to_vec(&AttachStatus {
                                exit_code: Some(7),
                                ..Default::default()
                            })
                            .unwrap();
                            let _ = ws
                                .send(Message::Binary(proto::frame(proto::STATUS, &st).into()))
                                .await;
                            let _ = ws.close(None).await;
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, rx)
}

struct Fixture {
    s: TestServer,
    admin: String,
    /// What the scheduler and node agents would write with (a system identity).
    system: String,
    alice: String,
    seen: mpsc::UnboundedReceiver<Seen>,
}

/// An auth-on server with node `n1` (whose agent is [`fake_agent`]) and alice's
/// allocations: `a1` Running on `n1`, `p1` Pending, `s1` sensitive and Running.
async fn fixture() -> Fixture {
    let s = start_with(ApiConfig {
        jwt_secret: SECRET.to_vec(),
        auth: true,
        ..Default::default()
    })
    .await;
    let admin = token("root", Role::Admin);
    let system = token("scheduler", Role::System);
    let alice = token("alice", Role::User);
    let (addr, seen) = fake_agent().await;
    // Tenant t1, with a sensitive pool (its users may submit sensitive work).
    let t1 = json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "t1"},
                    "spec": {"quota": {"sensitivePoolSize": 1}}});
    let (c, e) = call(
        &s,
        Method::POST,
        &format!("{API}/tenants"),
        &admin,
        Some(t1),
    )
    .await;
    assert_eq!(c, 201, "{e}");
    let node = json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Node", "metadata": {"name": "n1"}, "spec": {}});
    let (c, n) = call(
        &s,
        Method::POST,
        &format!("{API}/nodes"),
        &admin,
        Some(node),
    )
    .await;
    assert_eq!(c, 201, "{n}");
    let mut n = n;
    n["status"] = json!({"agent": {"address": addr}});
    let (c, e) = call(
        &s,
        Method::PUT,
        &format!("{API}/nodes/n1/status"),
        &system,
        Some(n),
    )
    .await;
    assert_eq!(c, 200, "{e}");
    // Sensitive work claims nodes: alice holds claiming-user in t1.
    common::bind_role(&s, &admin, Some("t1"), "claiming-user", "alice", None).await;
    for (name, running, sensitive) in [
        ("a1", true, false),
        ("p1", false, false),
        ("s1", true, true),
    ] {
        let mut a = alloc(name, "t1");
        a["metadata"]["annotations"] = json!({USER: "alice"});
        if sensitive {
            a["spec"]["sensitive"] = json!(true);
        }
        // (The binding reaches the server's copy of the bindings within moments.)
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let (c, mut a) = loop {
            let (c, v) = call(&s, Method::POST, &allocs("t1"), &alice, Some(a.clone())).await;
            if c != 403 || std::time::Instant::now() > deadline {
                break (c, v);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(c, 201, "{a}");
        if running {
            a["status"] = json!({"phase": "Running", "assignedNodes": ["n1"]});
            let (c, e) = call(
                &s,
                Method::PUT,
                &format!("{}/{name}/status", allocs("t1")),
                &system,
                Some(a),
            )
            .await;
            assert_eq!(c, 200, "{e}");
        }
    }
    Fixture {
        s,
        admin,
        system,
        alice,
        seen,
    }
}

/// Opens the attach WebSocket as `token`; the HTTP refusal (code, body) when refused.
async fn open(
    s: &TestServer,
    path_and_query: &str,
    token: &str,
) -> Result<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>, (u16, Value)> {
    let url = format!("{}{path_and_query}", s.base.replacen("http://", "ws://", 1));
    let mut req = url.into_client_request().expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    req.headers_mut().insert(
        "sec-websocket-protocol",
        proto::PROTOCOL.parse().expect("header"),
    );
    let host = s.base.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(host).await.expect("connect");
    match tokio_tungstenite::client_async(req, tcp).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp.body().clone().unwrap_or_default();
            Err((
                resp.status().as_u16(),
                serde_json::from_slice(&body).unwrap_or(Value::Null),
            ))
        }
        Err(e) => panic!("attach: {e}"),
    }
}

fn attach_path(name: &str, query: &str) -> String {
    format!("{}/{name}/attach?{query}", allocs("t1"))
}

#[tokio::test]
async fn the_owner_attaches_through_the_relay_and_the_agent_gets_a_single_use_ticket() {
    let mut f = fixture().await;
    let mut ws = open(
        &f.s,
        &attach_path("a1", "command=cat&command=-n&stdin=true"),
        &f.alice,
    )
    .await
    .expect("alice attaches to her running allocation");
    ws.send(Message::Binary(proto::frame(proto::STDIN, b"hello").into()))
        .await
        .expect("send");
    let mut out = Vec::new();
    let mut status = None;
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Binary(b) = m {
            match b[0] {
                proto::STDOUT => out.extend_from_slice(&b[1..]),
                proto::STATUS => status = serde_json::from_slice::<AttachStatus>(&b[1..]).ok(),
                _ => {}
            }
        }
    }
    assert_eq!(
        out, b"hello",
        "input relayed to the agent and its output back"
    );
    assert_eq!(status.map(|s| s.shell_code()), Some(7));

    let seen = f.seen.recv().await.expect("the agent was called");
    assert!(seen.uri.starts_with("/attach/t1/a1?"), "{}", seen.uri);
    let ticket = seen
        .bearer
        .strip_prefix("Bearer ")
        .expect("a bearer ticket")
        .to_string();
    assert!(
        !ticket.contains(&f.alice),
        "the user's own token never reaches the agent"
    );

    // Only admins (node agents) redeem, and only once.
    let body = json!({"ticket": ticket});
    let (c, e) = call(
        &f.s,
        Method::POST,
        proto::REDEEM_PATH,
        &f.alice,
        Some(body.clone()),
    )
    .await;
    assert_eq!(c, 403, "{e}");
    // Not an admin either: tickets are for the node agents (system identities).
    let (c, e) = call(
        &f.s,
        Method::POST,
        proto::REDEEM_PATH,
        &f.admin,
        Some(body.clone()),
    )
    .await;
    assert_eq!(c, 403, "{e}");
    let (c, t) = call(
        &f.s,
        Method::POST,
        proto::REDEEM_PATH,
        &f.system,
        Some(body.clone()),
    )
    .await;
    assert_eq!(c, 200, "{t}");
    assert_eq!(t["namespace"], "t1");
    assert_eq!(t["name"], "a1");
    assert_eq!(t["node"], "n1");
    assert_eq!(t["user"], "alice");
    assert_eq!(t["command"], json!(["cat", "-n"]));
    assert_eq!(
        (t["tty"].as_bool(), t["stdin"].as_bool()),
        (Some(false), Some(true))
    );
    let (c, e) = call(
        &f.s,
        Method::POST,
        proto::REDEEM_PATH,
        &f.system,
        Some(body),
    )
    .await;
    assert_eq!(c, 403, "a ticket is good once: {e}");
    assert!(
        e["message"].as_str().unwrap_or_default().contains("used"),
        "{e}"
    );

    // The audit trail.
    let (c, evs) = call(
        &f.s,
        Method::GET,
        &format!("{API}/namespaces/t1/events"),
        &f.admin,
        None,
    )
    .await;
    assert_eq!(c, 200);
    let msgs: Vec<&str> = evs["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "Attached" && e["involvedObject"]["name"] == "a1")
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert_eq!(msgs.len(), 1, "{evs}");
    assert!(
        msgs[0].contains("user alice") && msgs[0].contains("node n1") && msgs[0].contains("cat -n"),
        "{}",
        msgs[0]
    );
}

#[tokio::test]
async fn attach_is_refused_to_others_and_outside_running_allocations() {
    let f = fixture().await;
    let bob = token("bob", Role::User);
    let viewer = token("viewer", Role::Readonly);
    let (c, e) = open(&f.s, &attach_path("a1", ""), &bob)
        .await
        .expect_err("bob is refused");
    assert_eq!(c, 403, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("belongs to user alice"),
        "{e}"
    );
    let (c, _) = open(&f.s, &attach_path("a1", ""), &viewer)
        .await
        .expect_err("read-only is refused");
    assert_eq!(c, 403);
    // An admin may attach to alice's work, but not to a sensitive allocation.
    let mut ws = open(&f.s, &attach_path("a1", ""), &f.admin)
        .await
        .expect("admin attaches");
    let _ = ws.close(None).await;
    let (c, e) = open(&f.s, &attach_path("s1", ""), &f.admin)
        .await
        .expect_err("sensitive");
    assert_eq!(c, 403, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("only the user who claimed"),
        "{e}"
    );
    let mut ws = open(&f.s, &attach_path("s1", ""), &f.alice)
        .await
        .expect("the claiming user attaches");
    let _ = ws.close(None).await;

    let (c, e) = open(&f.s, &attach_path("p1", ""), &f.alice)
        .await
        .expect_err("pending");
    assert_eq!(c, 409, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("needs a Running allocation"),
        "{e}"
    );
    let (c, e) = open(&f.s, &attach_path("a1", "node=n9"), &f.alice)
        .await
        .expect_err("other node");
    assert_eq!(c, 400, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not one of allocation a1's nodes (n1)"),
        "{e}"
    );
    let (c, e) = open(&f.s, &attach_path("a1", "tty=maybe"), &f.alice)
        .await
        .expect_err("bad flag");
    assert_eq!(c, 400, "{e}");
    let (c, e) = open(&f.s, &attach_path("a1", "shell=zsh"), &f.alice)
        .await
        .expect_err("unknown parameter");
    assert_eq!(c, 400, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("attach takes node, command"),
        "{e}"
    );
    // A plain GET is told what attach is.
    let (c, e) = call(&f.s, Method::GET, &attach_path("a1", ""), &f.alice, None).await;
    assert_eq!(c, 400, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("WebSocket"),
        "{e}"
    );
    // The seed's route finds the allocation by id.
    let mut ws = open(&f.s, "/v1/allocations/a1/attach", &f.alice)
        .await
        .expect("by id");
    let _ = ws.close(None).await;
}

/// `POST /v1/allocations/{id}/token` (node agents only): a token of the allocation's user,
/// for its tenant only; `null` with authentication off.
#[tokio::test]
async fn job_tokens_act_as_the_allocations_user_in_its_tenant() {
    let f = fixture().await;
    let (c, e) = call(
        &f.s,
        Method::POST,
        "/v1/allocations/a1/token",
        &f.alice,
        None,
    )
    .await;
    assert_eq!(c, 403, "only agents ask: {e}");
    let (c, e) = call(
        &f.s,
        Method::POST,
        "/v1/allocations/a1/token?tenant=t1",
        &f.admin,
        None,
    )
    .await;
    assert_eq!(
        c, 403,
        "an admin cannot have a token that acts as alice made: {e}"
    );
    let (c, a1) = call(
        &f.s,
        Method::GET,
        &format!("{}/a1", allocs("t1")),
        &f.admin,
        None,
    )
    .await;
    assert_eq!(c, 200, "{a1}");
    let uid = a1["metadata"]["uid"].as_str().expect("a uid").to_string();
    let (c, e) = call(
        &f.s,
        Method::POST,
        "/v1/allocations/a1/token?tenant=t1",
        &f.system,
        None,
    )
    .await;
    assert_eq!(c, 400, "the run names its allocation's uid: {e}");
    let (c, t) = call(
        &f.s,
        Method::POST,
        &format!("/v1/allocations/a1/token?tenant=t1&uid={uid}"),
        &f.system,
        None,
    )
    .await;
    assert_eq!(c, 200, "{t}");
    assert_eq!(
        (t["user"].as_str(), t["tenant"].as_str()),
        (Some("alice"), Some("t1"))
    );
    assert!(t["expirationTimestamp"].is_string(), "{t}");
    let job = t["token"].as_str().expect("a token").to_string();
    // Only for the allocation the agent runs (its uid), not one that took its name.
    let (c, e) = call(
        &f.s,
        Method::POST,
        "/v1/allocations/a1/token?tenant=t1&uid=not-it",
        &f.system,
        None,
    )
    .await;
    assert_eq!(c, 409, "{e}");
    // It is alice, in t1 only, and not an admin.
    let (c, l) = call(&f.s, Method::GET, &allocs("t1"), &job, None).await;
    assert_eq!(c, 200, "{l}");
    let (c, _) = call(&f.s, Method::GET, &allocs("t2"), &job, None).await;
    assert_eq!(c, 403);
    let (c, _) = call(&f.s, Method::POST, "/v1/allocations/a1/token", &job, None).await;
    assert_eq!(c, 403, "a job token mints nothing");
    let mut mine = alloc("from-job", "t1");
    mine["metadata"]["annotations"] = json!({USER: "alice"});
    let (c, e) = call(&f.s, Method::POST, &allocs("t1"), &job, Some(mine)).await;
    assert_eq!(c, 201, "submits as alice: {e}");
    let mut theirs = alloc("as-bob", "t1");
    theirs["metadata"]["annotations"] = json!({USER: "bob"});
    let (c, _) = call(&f.s, Method::POST, &allocs("t1"), &job, Some(theirs)).await;
    assert_eq!(c, 403, "and only as alice");

    // Authentication off: no token to mint.
    let open = start().await;
    let (c, _) = open
        .post(&allocs("t1"), &{
            let mut a = alloc("j", "t1");
            a["metadata"]["annotations"] = json!({USER: "carol"});
            a
        })
        .await;
    assert_eq!(c, 201);
    let (c, mut j) = open.get(&format!("{}/j", allocs("t1"))).await;
    assert_eq!(c, 200, "{j}");
    let uid = j["metadata"]["uid"].as_str().expect("a uid").to_string();
    j["status"] = json!({"phase": "Running", "assignedNodes": ["n1"]});
    let (c, e) = open.put(&format!("{}/j/status", allocs("t1")), &j).await;
    assert_eq!(c, 200, "{e}");
    let (c, t) = open
        .post(&format!("/v1/allocations/j/token?uid={uid}"), &json!({}))
        .await;
    assert_eq!(c, 200, "{t}");
    assert!(t["token"].is_null(), "{t}");
}
