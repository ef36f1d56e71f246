//! Fuzzing the HTTP router in process: random methods, paths over every route, query
//! strings, headers and bodies, sent through `ApiServer::router()` (tower's `oneshot`)
//! of two servers over one embedded store, one with authentication (an admin's, a user's
//! and a read-only user's tokens, and bad ones) and one without. Every answer must come
//! back (no panic, in the handler or in a task it spawned; no hang), and no answer may be
//! a 5xx other than 503 (and 507, the store's space alarm).
//!
//! `PROPTEST_CASES=N` runs N cases (default 1,500, a few seconds).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request};
use lattice_apiserver::{mint_token, ApiConfig, ApiServer, Role};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tower::ServiceExt;

const SECRET: &[u8] = b"fuzz-secret";

/// Set by the panic hook: a panic anywhere in the process (a spawned task's too).
static PANICKED: AtomicBool = AtomicBool::new(false);

/// Answers by status code, printed at the end (what the cases reached).
static CODES: std::sync::Mutex<std::collections::BTreeMap<u16, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

struct Servers {
    rt: tokio::runtime::Runtime,
    with_auth: axum::Router,
    without_auth: axum::Router,
    _dir: tempfile::TempDir,
}

fn servers() -> &'static Servers {
    static S: OnceLock<Servers> = OnceLock::new();
    S.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::SeqCst);
            previous(info);
        }));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let (with_auth, without_auth) = rt.block_on(async {
            let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
                .await
                .expect("store");
            let backend: Arc<dyn KvBackend> = Arc::new(store);
            let on = ApiServer::new(
                backend.clone(),
                ApiConfig {
                    jwt_secret: SECRET.to_vec(),
                    auth: true,
                    ..Default::default()
                },
            );
            let off = ApiServer::new(backend, ApiConfig::default());
            (on.router(), off.router())
        });
        Servers {
            rt,
            with_auth,
            without_auth,
            _dir: dir,
        }
    })
}

fn tokens() -> &'static [String] {
    static T: OnceLock<Vec<String>> = OnceLock::new();
    T.get_or_init(|| {
        let t = |sub: &str, ten: &[&str], role: Role| {
            let ten: Vec<String> = ten.iter().map(|s| s.to_string()).collect();
            mint_token(SECRET, sub, &ten, role, Duration::from_secs(3600))
        };
        vec![
            t("ops", &["*"], Role::Admin),
            t("alice", &["t1"], Role::User),
            t("rita", &["t1"], Role::Readonly),
            t("sys", &["*"], Role::System),
            // Expired.
            mint_token(SECRET, "late", &["t1".into()], Role::User, Duration::ZERO),
            // Another secret.
            mint_token(
                b"other",
                "eve",
                &["*".into()],
                Role::Admin,
                Duration::from_secs(60),
            ),
            "not.a.token".into(),
            "abcdef.0123456789abcdef".into(),
        ]
    })
}

const API: &str = "/apis/lattice.dev/v1alpha1";

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("t1".to_string()),
        4 => prop::sample::select(vec![
            "t1", "t2", "default", "a", "n1", "job", "lattice-node-lease", "status",
            "", "..", "%2e%2e", "a%2Fb", "%00", "%ff", "ü", "*", "a.b", "-", "0",
        ])
        .prop_map(String::from),
        2 => "[a-z0-9-]{1,12}",
        1 => Just("x".repeat(300)),
    ]
}

fn plural() -> impl Strategy<Value = String> {
    let mut p: Vec<String> = lattice_apis::kinds()
        .iter()
        .map(|k| k.plural.to_string())
        .collect();
    p.push("foo".into());
    prop::sample::select(p)
}

/// The parts a case's path and body share: a kind's plural and two segments.
#[derive(Debug, Clone)]
struct Parts {
    plural: String,
    a: String,
    b: String,
    c: String,
}

fn parts() -> impl Strategy<Value = Parts> {
    (plural(), segment(), segment(), segment()).prop_map(|(plural, a, b, c)| Parts {
        plural,
        a,
        b,
        c,
    })
}

fn path(p: Parts, method: &Method) -> impl Strategy<Value = String> {
    // A POST mostly to a collection, anything else mostly to an object.
    let resources: Vec<&'static str> = if *method == Method::POST {
        vec![
            "{API}/{plural}",
            "{API}/namespaces/{a}/{plural}",
            "{API}/namespaces/{a}/{plural}",
            "{API}/namespaces/{a}/{plural}",
            "/v1/{plural}",
        ]
    } else {
        vec![
            "{API}/{plural}",
            "{API}/{plural}/{a}",
            "{API}/{plural}/{a}/status",
            "{API}/namespaces/{a}/{plural}",
            "{API}/namespaces/{a}/{plural}/{b}",
            "{API}/namespaces/{a}/{plural}/{b}",
            "{API}/namespaces/{a}/{plural}/{b}/status",
            "/v1/{plural}",
            "/v1/{plural}/{a}",
        ]
    };
    let templates: Vec<&'static str> = vec![
        "/healthz",
        "/livez",
        "/readyz",
        "/metrics",
        "/version",
        "/api",
        "/apis",
        "/apis/lattice.dev",
        "{API}",
        "{API}/",
        "{API}/{plural}",
        "{API}/{plural}/{a}",
        "{API}/{plural}/{a}/status",
        "{API}/{plural}/{a}/{b}",
        "{API}/namespaces/{a}/{plural}",
        "{API}/namespaces/{a}/{plural}/{b}",
        "{API}/namespaces/{a}/{plural}/{b}/status",
        "{API}/namespaces/{a}/{plural}/{b}/{c}",
        "{API}/namespaces/{a}/allocations/{b}/log",
        "{API}/namespaces/{a}/allocations/{b}/attach",
        "{API}/nodes/{a}/heartbeat",
        "/openapi/v3",
        "/openapi/v3/apis/lattice.dev/v1alpha1",
        "/v1/admin/config",
        "/v1/admin/config/{a}",
        "/v1/admin/config/scheduling.max_dag_size",
        "/v1/{plural}",
        "/v1/{plural}/{a}",
        "/v1/dags/{a}/graph",
        "/v1/allocations/{a}/tasks",
        "/v1/allocations/{a}/attach",
        "/v1/allocations/{a}/token",
        "/v1/attach/redeem",
        "/v1/nodes/certificate",
        "/v1/nodes/certificate/renew",
        "/v1/admin/bootstrap-tokens",
        "/v1/admin/bootstrap-tokens/{a}",
        "/v1/admin/nodes/{a}/revoke",
        "/v1/agent/proxy-key",
        "/{a}",
        "/{a}/{b}/{c}",
    ];
    prop_oneof![
        2 => prop::sample::select(resources),
        1 => prop::sample::select(templates),
    ]
    .prop_map(move |t| {
        t.replace("{API}", API)
            .replace("{plural}", &p.plural)
            .replace("{a}", &p.a)
            .replace("{b}", &p.b)
            .replace("{c}", &p.c)
    })
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn query() -> impl Strategy<Value = String> {
    let keys = prop::sample::select(vec![
        "watch",
        "timeoutSeconds",
        "limit",
        "continue",
        "resourceVersion",
        "resourceVersionMatch",
        "labelSelector",
        "fieldSelector",
        "dryRun",
        "fieldManager",
        "force",
        "propagationPolicy",
        "orphanDependents",
        "tailLines",
        "sinceTime",
        "untilTime",
        "attempt",
        "follow",
        "stream",
        "node",
        "rows",
        "cols",
        "tty",
        "stdin",
        "command",
        "sequence",
        "tenant",
        "uid",
        "includeObject",
        "allowWatchBookmarks",
        "sendInitialEvents",
        "prefix",
        "timestamps",
        "x",
    ]);
    let values = prop_oneof![
        4 => prop::sample::select(vec![
            "", "0", "1", "-1", "true", "false", "18446744073709551615",
            "99999999999999999999", "9223372036854775807", "All", "Foreground", "Orphan",
            "a=b", "a in (x,y)", "!a", "a>5", "metadata.name=x", "status.assignedNodes=n1",
            "status.phase!=Running", "2026-03-01T10:00:00Z", "9999-12-31T23:59:59Z",
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiIifQ", "Exact", "Object",
            "stdout", "me", "t1",
        ])
        .prop_map(String::from),
        1 => ".{0,40}",
    ];
    prop_oneof![
        8 => prop::collection::vec((keys, values), 0..4).prop_map(|kv| {
            kv.iter()
                .map(|(k, v)| format!("{k}={}", encode(v)))
                .collect::<Vec<_>>()
                .join("&")
        }),
        1 => Just("%zz&&==&a=%".to_string()),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,20}".prop_map(Value::String),
        prop::sample::select(vec![
            "lattice.dev/v1alpha1",
            "Allocation",
            "Dag",
            "t1",
            "Running",
            "1h",
            "/bin/true",
        ])
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "apiVersion",
                    "kind",
                    "metadata",
                    "name",
                    "namespace",
                    "spec",
                    "status",
                    "labels",
                    "annotations",
                    "finalizers",
                    "resourceVersion",
                    "allocations",
                    "entrypoint",
                    "lifecycle",
                    "walltime",
                    "dependsOn",
                    "ref",
                    "op",
                    "path",
                    "value",
                    "preconditions",
                    "propagationPolicy",
                    "tenant",
                    "node",
                    "csr",
                    "ticket",
                    "command",
                    "ttlSeconds",
                    "generateName",
                    "phase",
                    "x",
                ])
                .prop_map(String::from),
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object of the kind the path names, called what the path calls it, in its
/// namespace (usually valid, so that writes reach the store and later cases find them).
fn object(p: &Parts, yaml: bool, mutate: Option<(String, serde_json::Value)>) -> Vec<u8> {
    use serde_json::json;
    let kind = lattice_apis::kinds()
        .iter()
        .find(|k| k.plural == p.plural)
        .map_or("Foo", |k| k.kind);
    let namespaced = p.plural != "tenants" && p.plural != "nodes";
    let name = if namespaced { &p.b } else { &p.a };
    let step = json!({"entrypoint": "/bin/true", "lifecycle": {"walltime": "1h"}});
    let spec = match kind {
        "Allocation" => step.clone(),
        "Dag" => json!({"allocations": [
            {"name": "s1", "spec": step},
            {"name": "s2", "spec": step, "dependsOn": [{"ref": "s1", "condition": "success"}]},
        ]}),
        _ => json!({}),
    };
    let mut v = json!({
        "apiVersion": "lattice.dev/v1alpha1", "kind": kind,
        "metadata": {"name": name, "labels": {"fuzz": "yes"}},
        "spec": spec,
    });
    if namespaced {
        v["metadata"]["namespace"] = json!(p.a);
    }
    if let Some((field, value)) = mutate {
        if let Some(o) = v.as_object_mut() {
            o.insert(field, value);
        }
    }
    if yaml {
        serde_yaml::to_string(&v).unwrap_or_default().into_bytes()
    } else {
        serde_json::to_vec(&v).unwrap_or_default()
    }
}

fn body(p: Parts) -> impl Strategy<Value = Vec<u8>> {
    let (p1, p2) = (p.clone(), p);
    let valid = any::<bool>().prop_map(move |yaml| object(&p1, yaml, None));
    let mutated = (
        prop::sample::select(vec!["spec", "metadata", "status", "kind", "apiVersion"]),
        json_value(),
    )
        .prop_map(move |(f, v)| object(&p2, false, Some((f.to_string(), v))));
    prop_oneof![
        8 => valid,
        4 => mutated,
        2 => Just(Vec::new()),
        4 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        2 => json_value().prop_map(|v| serde_yaml::to_string(&v).unwrap_or_default().into_bytes()),
        2 => prop::collection::vec(any::<u8>(), 0..200),
        1 => Just(b"a: &a [x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c]\n".to_vec()),
        1 => Just(format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes()),
        1 => Just(br#"[{"op":"replace","path":"/spec/entrypoint","value":"/bin/false"}]"#.to_vec()),
        1 => Just(br#"{"preconditions":{"uid":"x"},"propagationPolicy":"Foreground"}"#.to_vec()),
        1 => Just(br#"{"tenant":"t1","name":"i","entrypoint":"/bin/true","lifecycle":{"walltime":"1h"}}"#.to_vec()),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    auth: bool,
    method: Method,
    path: String,
    query: String,
    content_type: Option<&'static str>,
    token: Option<usize>,
    upgrade: Option<&'static str>,
    accept: Option<&'static str>,
    body: Vec<u8>,
}

fn case() -> impl Strategy<Value = Case> {
    let method = prop_oneof![
        12 => prop::sample::select(vec![
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ]),
        1 => prop::sample::select(vec![
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::from_bytes(b"LIST").unwrap_or(Method::GET),
        ]),
    ];
    let ct = prop::option::of(prop::sample::select(vec![
        "application/json",
        "application/yaml",
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/apply-patch+yaml",
        "application/strategic-merge-patch+json",
        "text/plain",
        "application/json; charset=utf-8",
    ]));
    // Mostly the good tokens (admin, user, read-only), so requests get past authentication.
    let token = prop_oneof![
        6 => (0..3usize).prop_map(Some),
        1 => (0..tokens().len()).prop_map(Some),
        1 => Just(None),
    ];
    let upgrade = prop::option::of(prop::sample::select(vec![
        "websocket",
        "lattice-heartbeat/1",
    ]));
    let accept = prop::option::of(prop::sample::select(vec![
        "application/json;as=Table;v=v1;g=meta.k8s.io",
        "application/json",
        "*/*",
    ]));
    (parts(), method, query(), ct, token, upgrade, accept)
        .prop_flat_map(move |(p, method, query, ct, token, upgrade, accept)| {
            (
                any::<bool>(),
                path(p.clone(), &method),
                Just(method),
                Just(query),
                Just(ct),
                Just(token),
                Just(upgrade),
                Just(accept),
                body(p),
            )
        })
        .prop_map(
            |(auth, path, method, query, content_type, token, upgrade, accept, body)| Case {
                auth,
                method,
                path,
                query,
                content_type,
                token,
                upgrade,
                accept,
                body,
            },
        )
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let s = servers();
    let uri = if c.query.is_empty() {
        c.path.clone()
    } else {
        format!("{}?{}", c.path, c.query)
    };
    let mut req = Request::builder().method(c.method.clone()).uri(&uri);
    if let Some(ct) = c.content_type {
        req = req.header("content-type", ct);
    }
    if let Some(i) = c.token {
        req = req.header("authorization", format!("Bearer {}", tokens()[i]));
    }
    if let Some(u) = c.upgrade {
        req = req
            .header("connection", "upgrade")
            .header("upgrade", u)
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
    }
    if let Some(a) = c.accept {
        req = req.header("accept", a);
    }
    // A URI the HTTP layer would not accept never reaches the router.
    let Ok(req) = req.body(Body::from(c.body.clone())) else {
        return Ok(());
    };
    let router = if c.auth {
        s.with_auth.clone()
    } else {
        s.without_auth.clone()
    };
    let answer = s.rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), router.oneshot(req)).await
    });
    let resp = match answer {
        Ok(Ok(r)) => r,
        Ok(Err(never)) => match never {},
        Err(_) => return Err(TestCaseError::fail(format!("no answer in 20 s: {c:?}"))),
    };
    let code = resp.status().as_u16();
    if let Ok(mut codes) = CODES.lock() {
        *codes.entry(code).or_default() += 1;
    }
    // Let tasks the request spawned (watches, heartbeat sessions) run into any panic.
    drop(resp);
    if PANICKED.load(Ordering::SeqCst) {
        return Err(TestCaseError::fail(format!("a panic while serving {c:?}")));
    }
    if code >= 500 && code != 503 && code != 507 {
        return Err(TestCaseError::fail(format!("{code} for {c:?}")));
    }
    Ok(())
}

#[test]
fn the_router_answers_anything_without_panics_or_5xx() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_500);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let result = runner.run(&case(), |c| run(&c));
    eprintln!(
        "{cases} cases in {:.1} s; answers by code: {:?}",
        started.elapsed().as_secs_f64(),
        CODES.lock().map(|c| c.clone()).unwrap_or_default()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    // Tasks spawned by the last cases.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!PANICKED.load(Ordering::SeqCst), "a spawned task panicked");
}
