//! A small fake Lattice API server (axum) with canned discovery and an in-memory object
//! map, plus helpers to run the CLI against it and compare with golden files.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use lattice_cli::config::Env;
use lattice_cli::kinds::{Catalog, Column, KindMeta};
use lattice_cli::{RunOptions, Shutdown};

pub use lattice_apis::wellknown::API_VERSION as GV;
pub const PREFIX: &str = "/apis/lattice.dev/v1alpha1";

/// The fixed "now" of every test: ages are computed against it.
pub fn now() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
        .expect("ts")
        .with_timezone(&Utc)
}

/// One recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: HashMap<String, String>,
    pub content_type: String,
    pub auth: String,
    pub body: String,
}

/// A canned watch response.
#[derive(Debug, Clone)]
pub enum WatchReply {
    /// 200 with these NDJSON lines, then the stream ends.
    Events(Vec<Value>),
    /// An HTTP error status with a Status body.
    Status(u16),
}

#[derive(Default)]
pub struct State {
    /// (plural, namespace, name) -> object
    pub objects: BTreeMap<(String, String, String), Value>,
    pub rv: u64,
    pub requests: Vec<Recorded>,
    /// Object name -> canned error (code, Status body) for any request naming it.
    pub fail_on: HashMap<String, (u16, Value)>,
    /// Watch replies, in order; when exhausted, `watch_done` is notified and the watch hangs.
    pub watch_script: VecDeque<WatchReply>,
    /// Required bearer token, if any.
    pub token: Option<String>,
    /// Answer field selectors on events with 400 (to test the client-side fallback).
    pub reject_event_field_selector: bool,
    /// Allocation name -> log text served at `.../allocations/NAME/log`.
    pub logs: HashMap<String, String>,
    /// Serve no log endpoint (404 like an older server).
    pub no_log_endpoint: bool,
    /// `/metrics` body.
    pub metrics: String,
    /// Counter for generateName suffixes.
    pub generated: u64,
}

pub struct Fake {
    pub url: String,
    pub state: Arc<Mutex<State>>,
    pub watch_done: Arc<tokio::sync::Notify>,
}

impl Fake {
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("lock").requests.clone()
    }

    pub fn insert(&self, plural: &str, obj: Value) {
        let mut st = self.state.lock().expect("lock");
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        st.objects.insert((plural.to_string(), ns, name), obj);
    }

    pub fn get(&self, plural: &str, ns: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .expect("lock")
            .objects
            .get(&(plural.to_string(), ns.to_string(), name.to_string()))
            .cloned()
    }
}

pub fn discovery() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GV,
        "resources": [
            {"name": "allocations", "singularName": "allocation", "namespaced": true, "kind": "Allocation",
             "verbs": ["create","delete","get","list","patch","update","watch"], "shortNames": ["alloc"]},
            {"name": "allocations/status", "singularName": "", "namespaced": true, "kind": "Allocation", "verbs": ["get","patch","update"]},
            {"name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node",
             "verbs": ["create","delete","get","list","patch","update","watch"], "shortNames": ["no"]},
            {"name": "events", "singularName": "event", "namespaced": true, "kind": "Event",
             "verbs": ["create","delete","get","list","watch"], "shortNames": ["ev"]},
            {"name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget",
             "verbs": ["create","delete","get","list","patch","watch"], "shortNames": []},
            {"name": "dags", "singularName": "dag", "namespaced": true, "kind": "Dag",
             "verbs": ["create","delete","get","list","patch","update","watch"], "shortNames": []},
            {"name": "vclusters", "singularName": "vcluster", "namespaced": true, "kind": "VCluster",
             "verbs": ["create","delete","get","list","patch","update","watch"], "shortNames": ["vc"]},
            {"name": "tenants", "singularName": "tenant", "namespaced": false, "kind": "Tenant",
             "verbs": ["create","delete","get","list","patch","update","watch"], "shortNames": []}
        ]
    })
}

/// The catalog used by tests: fixed printer columns so goldens do not depend on
/// `lattice-apis`' evolving column set.
pub fn test_catalog() -> Catalog {
    let mut alloc = KindMeta::new("Allocation", "allocations", true);
    alloc.singular = "allocation".into();
    alloc.short_names = vec!["alloc".into()];
    alloc.columns = vec![
        Column::new("NAME", ".metadata.name", "string", 0),
        Column::new("STATE", ".status.phase", "string", 0),
        Column::new("NODES", ".spec.resources.nodes", "integer", 0),
        Column::new(
            "READY",
            ".status.conditions[?(@.type==\"Ready\")].status",
            "string",
            0,
        ),
        Column::new("AGE", ".metadata.creationTimestamp", "date", 0),
        Column::new("VCLUSTER", ".spec.vcluster", "string", 1),
        Column::new("STARTED", ".status.startTime", "date", 1),
    ];
    let mut node = KindMeta::new("Node", "nodes", false);
    node.short_names = vec!["no".into()];
    node.columns = vec![Column::new("STATE", ".status.state", "string", 0)];
    Catalog::new(vec![alloc, node])
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind":"Status","apiVersion":"v1","status":"Failure","message":message,"reason":reason,"code":code})
}

fn reply(code: u16, v: &Value) -> Response {
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn parse_query(uri: &Uri) -> HashMap<String, String> {
    axum::extract::Query::<HashMap<String, String>>::try_from_uri(uri)
        .map(|q| q.0)
        .unwrap_or_default()
}

fn labels_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let labels = obj.pointer("/metadata/labels");
        if let Some((k, v)) = term.split_once("!=") {
            labels.and_then(|l| l.get(k)).and_then(Value::as_str) != Some(v)
        } else if let Some((k, v)) = term.split_once('=') {
            let v = v.trim_start_matches('=');
            labels.and_then(|l| l.get(k)).and_then(Value::as_str) == Some(v)
        } else {
            labels.and_then(|l| l.get(term)).is_some()
        }
    })
}

fn fields_match(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let Some((k, v)) = term.split_once('=') else {
            return true;
        };
        let ptr = format!("/{}", k.replace('.', "/"));
        obj.pointer(&ptr).and_then(Value::as_str) == Some(v)
    })
}

async fn handle(
    state: Arc<Mutex<State>>,
    notify: Arc<tokio::sync::Notify>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query = parse_query(&uri);
    let path = uri.path().to_string();
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let body_text = String::from_utf8_lossy(&body).to_string();
    let mut st = state.lock().expect("lock");
    st.requests.push(Recorded {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type: h("content-type"),
        auth: h("authorization"),
        body: body_text.clone(),
    });
    if let Some(t) = &st.token {
        if h("authorization") != format!("Bearer {t}") {
            return reply(401, &status(401, "Unauthorized", "Unauthorized"));
        }
    }
    if path == "/version" {
        return reply(
            200,
            &json!({"gitVersion": "v0.1.0-fake", "gitCommit": "abc123"}),
        );
    }
    if path == PREFIX {
        return reply(200, &discovery());
    }
    if path == "/readyz" {
        return (StatusCode::OK, "ok").into_response();
    }
    if path == "/metrics" {
        return (StatusCode::OK, st.metrics.clone()).into_response();
    }
    let Some(rest) = path.strip_prefix(&format!("{PREFIX}/")) else {
        return reply(
            404,
            &status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        );
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if let ["namespaces", ns, "allocations", name, "log"] = parts.as_slice() {
        if st.no_log_endpoint {
            return reply(
                404,
                &status(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ),
            );
        }
        let key = ("allocations".to_string(), ns.to_string(), name.to_string());
        if !st.objects.contains_key(&key) {
            return reply(
                404,
                &status(
                    404,
                    "NotFound",
                    &format!("allocations \"{name}\" not found"),
                ),
            );
        }
        let text = st.logs.get(*name).cloned().unwrap_or_default();
        return (StatusCode::OK, [("content-type", "text/plain")], text).into_response();
    }
    let (ns, plural, name) = match parts.as_slice() {
        ["namespaces", ns, plural] => (Some(ns.to_string()), plural.to_string(), None),
        ["namespaces", ns, plural, name] => (
            Some(ns.to_string()),
            plural.to_string(),
            Some(name.to_string()),
        ),
        [plural] => (None, plural.to_string(), None),
        [plural, name] => (None, plural.to_string(), Some(name.to_string())),
        _ => return reply(404, &status(404, "NotFound", "no such path")),
    };
    let known = [
        "allocations",
        "nodes",
        "events",
        "widgets",
        "dags",
        "vclusters",
        "tenants",
    ];
    if !known.contains(&plural.as_str()) {
        return reply(
            404,
            &status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        );
    }
    if let Some(n) = &name {
        if let Some((code, body)) = st.fail_on.get(n) {
            return reply(*code, body);
        }
    }
    let dry = query.get("dryRun").map(String::as_str) == Some("All");
    if method == Method::POST {
        let body_name = serde_json::from_str::<Value>(&body_text)
            .ok()
            .and_then(|v| {
                v.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        if let Some((code, body)) = body_name.and_then(|n| st.fail_on.get(&n).cloned()) {
            return reply(code, &body);
        }
    }
    match (method.as_str(), name) {
        ("GET", None) if query.get("watch").map(String::as_str) == Some("true") => {
            let next = st.watch_script.pop_front();
            drop(st);
            match next {
                Some(WatchReply::Status(code)) => {
                    reply(code, &status(code, "Expired", "too old resource version"))
                }
                Some(WatchReply::Events(evs)) => {
                    let mut text = String::new();
                    for e in evs {
                        text.push_str(&e.to_string());
                        text.push('\n');
                    }
                    (StatusCode::OK, [("content-type", "application/json")], text).into_response()
                }
                None => {
                    notify.notify_one();
                    let s = futures::stream::pending::<Result<Bytes, std::io::Error>>();
                    Response::new(Body::from_stream(s))
                }
            }
        }
        ("GET", None) => {
            if plural == "events"
                && st.reject_event_field_selector
                && query.get("fieldSelector").is_some_and(|f| !f.is_empty())
            {
                return reply(
                    400,
                    &status(400, "BadRequest", "field selector not supported"),
                );
            }
            let items: Vec<Value> = st
                .objects
                .iter()
                .filter(|((p, n, _), _)| *p == plural && ns.as_ref().is_none_or(|want| want == n))
                .map(|(_, v)| v.clone())
                .filter(|o| {
                    query
                        .get("labelSelector")
                        .is_none_or(|s| labels_match(o, s))
                })
                .filter(|o| {
                    query
                        .get("fieldSelector")
                        .is_none_or(|s| fields_match(o, s))
                })
                .collect();
            reply(
                200,
                &json!({"apiVersion": GV, "kind": "List", "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
            )
        }
        ("GET", Some(n)) => {
            let key = (plural.clone(), ns.clone().unwrap_or_default(), n.clone());
            match st.objects.get(&key) {
                Some(o) => reply(200, o),
                None => reply(
                    404,
                    &status(404, "NotFound", &format!("{plural} \"{n}\" not found")),
                ),
            }
        }
        ("POST", None) => {
            let Ok(mut obj) = serde_json::from_str::<Value>(&body_text) else {
                return reply(400, &status(400, "BadRequest", "body is not JSON"));
            };
            let md = obj["metadata"].as_object().cloned().unwrap_or_default();
            let name = match md.get("name").and_then(Value::as_str) {
                Some(n) => n.to_string(),
                None => match md.get("generateName").and_then(Value::as_str) {
                    Some(g) => {
                        st.generated += 1;
                        format!("{g}{:05}", st.generated)
                    }
                    None => {
                        return reply(
                            422,
                            &status(
                                422,
                                "Invalid",
                                "metadata.name: name or generateName is required",
                            ),
                        )
                    }
                },
            };
            let key = (plural.clone(), ns.clone().unwrap_or_default(), name.clone());
            if st.objects.contains_key(&key) {
                return reply(
                    409,
                    &status(
                        409,
                        "AlreadyExists",
                        &format!("{plural} \"{name}\" already exists"),
                    ),
                );
            }
            if !dry {
                st.rv += 1;
            }
            let rv = st.rv.to_string();
            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                m.insert("name".into(), json!(name));
                m.remove("generateName");
                m.insert("resourceVersion".into(), json!(rv));
                m.insert("uid".into(), json!(format!("uid-{name}")));
                m.insert("creationTimestamp".into(), json!("2026-01-01T12:00:00Z"));
                if let Some(n) = &ns {
                    m.insert("namespace".into(), json!(n));
                }
            }
            if !dry {
                st.objects.insert(key, obj.clone());
            }
            reply(201, &obj)
        }
        ("PATCH", Some(n)) if h("content-type") == "application/merge-patch+json" => {
            let Ok(p) = serde_json::from_str::<Value>(&body_text) else {
                return reply(400, &status(400, "BadRequest", "body is not JSON"));
            };
            let key = (plural.clone(), ns.clone().unwrap_or_default(), n.clone());
            let Some(mut obj) = st.objects.get(&key).cloned() else {
                return reply(
                    404,
                    &status(404, "NotFound", &format!("{plural} \"{n}\" not found")),
                );
            };
            merge(&mut obj, &p);
            if !dry {
                st.rv += 1;
                obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
                st.objects.insert(key, obj.clone());
            }
            reply(200, &obj)
        }
        ("PATCH", Some(n)) => {
            let Ok(mut obj) = serde_json::from_str::<Value>(&body_text) else {
                return reply(400, &status(400, "BadRequest", "body is not JSON"));
            };
            let key = (plural.clone(), ns.clone().unwrap_or_default(), n.clone());
            let existing = st.objects.get(&key).cloned();
            let strip = |v: &Value| {
                let mut v = v.clone();
                if let Some(md) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                    for k in [
                        "resourceVersion",
                        "uid",
                        "creationTimestamp",
                        "managedFields",
                        "generation",
                    ] {
                        md.remove(k);
                    }
                }
                if let Some(o) = v.as_object_mut() {
                    o.remove("status");
                }
                v
            };
            let changed = existing.as_ref().is_none_or(|e| strip(e) != strip(&obj));
            let rv = if changed && !dry {
                st.rv += 1;
                st.rv.to_string()
            } else {
                existing
                    .as_ref()
                    .and_then(|e| {
                        e.pointer("/metadata/resourceVersion")
                            .and_then(Value::as_str)
                    })
                    .unwrap_or("0")
                    .to_string()
            };
            if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                md.insert("resourceVersion".into(), json!(rv));
                md.insert("uid".into(), json!(format!("uid-{n}")));
                md.insert("creationTimestamp".into(), json!("2026-01-01T11:00:00Z"));
                md.insert(
                    "managedFields".into(),
                    json!([{"manager": "lattice-cli", "operation": "Apply"}]),
                );
            }
            if let (Some(e), Some(o)) = (existing.as_ref(), obj.as_object_mut()) {
                if let Some(s) = e.get("status") {
                    o.insert("status".into(), s.clone());
                }
            }
            if !dry {
                st.objects.insert(key, obj.clone());
            }
            reply(if existing.is_some() { 200 } else { 201 }, &obj)
        }
        ("DELETE", Some(n)) => {
            let key = (plural.clone(), ns.clone().unwrap_or_default(), n.clone());
            let found = if dry {
                st.objects.get(&key).cloned()
            } else {
                st.objects.remove(&key)
            };
            match found {
                Some(_) => reply(
                    200,
                    &json!({"kind":"Status","apiVersion":"v1","status":"Success","code":200}),
                ),
                None => reply(
                    404,
                    &status(404, "NotFound", &format!("{plural} \"{n}\" not found")),
                ),
            }
        }
        _ => reply(405, &status(405, "MethodNotAllowed", "method not allowed")),
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Starts the fake on a random loopback port.
pub async fn start() -> Fake {
    let state = Arc::new(Mutex::new(State {
        rv: 100,
        ..State::default()
    }));
    let notify = Arc::new(tokio::sync::Notify::new());
    let (s2, n2) = (state.clone(), notify.clone());
    let app = Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (s, n) = (s2.clone(), n2.clone());
            async move { handle(s, n, method, uri, headers, body).await }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Fake {
        url: format!("http://{addr}"),
        state,
        watch_done: notify,
    }
}

/// Output of one CLI run.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub out: String,
    pub err: String,
}

/// Runs the CLI with `args` against `url` (test catalog, fixed clock, empty env).
pub async fn run_at(url: &str, args: &[&str]) -> Run {
    run_with(url, args, "", None).await
}

pub async fn run_with(url: &str, args: &[&str], stdin: &str, shutdown: Option<Shutdown>) -> Run {
    run_opts(
        url,
        args,
        Opts {
            stdin: stdin.to_string(),
            shutdown,
            env: Vec::new(),
            cwd: PathBuf::from("/home/alice/project"),
        },
    )
    .await
}

/// Options of [`run_opts`].
pub struct Opts {
    pub stdin: String,
    pub shutdown: Option<Shutdown>,
    /// Environment variables the CLI sees (nothing else leaks in).
    pub env: Vec<(String, String)>,
    /// Working directory (submit directory, ./lattice-compat.yaml).
    pub cwd: PathBuf,
}

impl Opts {
    /// As user alice in `cwd`.
    pub fn alice(cwd: &std::path::Path) -> Opts {
        Opts {
            stdin: String::new(),
            shutdown: None,
            env: vec![("USER".into(), "alice".into())],
            cwd: cwd.to_path_buf(),
        }
    }
}

/// Runs the CLI with full control over stdin, environment and working directory.
pub async fn run_opts(url: &str, args: &[&str], o: Opts) -> Run {
    let mut argv: Vec<String> = Vec::new();
    argv.push("lattice".into());
    if args.first() == Some(&"compat") {
        argv.extend(args.iter().map(|a| a.to_string()));
    } else {
        argv.extend(["--api-url".to_string(), url.to_string()]);
        argv.extend(args.iter().map(|a| a.to_string()));
    }
    let cli = lattice_cli::parse_args(argv).expect("arguments parse");
    let opts = RunOptions {
        catalog: Some(test_catalog()),
        now: Some(now()),
        stdin: Box::new(std::io::Cursor::new(o.stdin.into_bytes())),
        shutdown: o.shutdown,
        cwd: Some(o.cwd),
        tty: false,
    };
    let mut pairs = o.env.clone();
    if args.first() == Some(&"compat") {
        pairs.push(("LATTICE_API_URL".into(), url.to_string()));
    }
    let env = Env::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = lattice_cli::run(cli, &env, opts, &mut out, &mut err).await;
    Run {
        code,
        out: String::from_utf8_lossy(&out).to_string(),
        err: String::from_utf8_lossy(&err).to_string(),
    }
}

/// Compares with `tests/golden/<name>`; `UPDATE_GOLDEN=1` rewrites the file.
pub fn golden(name: &str, actual: &str) {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "golden", name]
        .iter()
        .collect();
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("mkdir golden");
        }
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "golden file {} is missing; run with UPDATE_GOLDEN=1 to create it. Actual:\n{actual}",
            path.display()
        )
    });
    assert_eq!(
        actual,
        want,
        "output differs from golden file {} (UPDATE_GOLDEN=1 regenerates it)",
        path.display()
    );
}

/// A canned allocation.
pub fn alloc(ns: &str, name: &str, phase: &str, nodes: u64, created: &str) -> Value {
    json!({
        "apiVersion": GV,
        "kind": "Allocation",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "resourceVersion": "7",
                     "creationTimestamp": created, "labels": {"app": "train"}},
        "spec": {"resources": {"nodes": nodes}, "vcluster": "hpc-batch", "entrypoint": "/bin/train"},
        "status": {"phase": phase, "startTime": "2026-01-01T11:30:00Z",
                   "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": "all nodes up",
                                   "lastTransitionTime": "2026-01-01T11:55:00Z"}]}
    })
}

/// A fake pre-populated with a few allocations and a node.
pub async fn populated() -> Fake {
    let f = start().await;
    f.insert(
        "allocations",
        alloc(
            "default",
            "train-large",
            "Running",
            64,
            "2026-01-01T10:00:00Z",
        ),
    );
    f.insert(
        "allocations",
        alloc("default", "eval", "Pending", 4, "2026-01-01T11:59:55Z"),
    );
    f.insert(
        "allocations",
        alloc("physics", "sim", "Running", 128, "2025-12-28T12:00:00Z"),
    );
    f.insert(
        "nodes",
        json!({"apiVersion": GV, "kind": "Node", "metadata": {"name": "x1000c0s0b0n0", "resourceVersion": "3",
               "creationTimestamp": "2025-12-01T00:00:00Z"}, "status": {"state": "Ready"}}),
    );
    f
}
