//! Test harness: the real HTTP server on 127.0.0.1:0 over an EmbeddedStore in a tempdir.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lattice_apiserver::{ApiConfig, ApiServer};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::{json, Value};

pub const API: &str = "/apis/lattice.dev/v1alpha1";

pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    pub store: EmbeddedStore,
    pub server: ApiServer,
    _dir: tempfile::TempDir,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

pub async fn start() -> TestServer {
    start_with(ApiConfig::default()).await
}

pub async fn start_with(config: ApiConfig) -> TestServer {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .expect("open store");
    let backend: Arc<dyn KvBackend> = Arc::new(store.clone());
    let server = ApiServer::new(backend, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let s = server.clone();
    tokio::spawn(async move {
        let _ = s
            .serve(listener, async move {
                let _ = rx.await;
            })
            .await;
    });
    TestServer {
        base: format!("http://{addr}"),
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(2000)
            .build()
            .expect("client"),
        store,
        server,
        _dir: dir,
        _shutdown: tx,
    }
}

pub fn alloc(name: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "demo"}},
        "spec": {"entrypoint": "/bin/sh", "args": ["-c", "echo hi"], "lifecycle": {"walltime": "10m"}}
    })
}

pub fn allocs(ns: &str) -> String {
    format!("{API}/namespaces/{ns}/allocations")
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn req(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut r = self.client.request(method, self.url(path));
        if let Some(b) = body {
            r = r.json(b);
        }
        let resp = r.send().await.expect("send");
        let code = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.req(reqwest::Method::GET, path, None).await
    }
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.req(reqwest::Method::POST, path, Some(body)).await
    }
    pub async fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        self.req(reqwest::Method::PUT, path, Some(body)).await
    }
    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.req(reqwest::Method::DELETE, path, None).await
    }
    pub async fn patch(&self, path: &str, ct: &str, body: &str) -> (u16, Value) {
        let resp = self
            .client
            .patch(self.url(path))
            .header("content-type", ct)
            .body(body.to_string())
            .send()
            .await
            .expect("send");
        let code = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
    pub async fn apply(&self, path: &str, manager: &str, force: bool, yaml: &str) -> (u16, Value) {
        let sep = if path.contains('?') { '&' } else { '?' };
        self.patch(
            &format!("{path}{sep}fieldManager={manager}&force={force}"),
            "application/apply-patch+yaml",
            yaml,
        )
        .await
    }

    pub async fn watch(&self, path_and_query: &str) -> Watch {
        let resp = self
            .client
            .get(self.url(path_and_query))
            .send()
            .await
            .expect("watch");
        Watch::new(resp)
    }
}

pub struct Watch {
    pub status: u16,
    stream: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: Vec<u8>,
    pub first_body: Option<Value>,
}

impl Watch {
    fn new(resp: reqwest::Response) -> Self {
        let status = resp.status().as_u16();
        Self {
            status,
            stream: resp.bytes_stream().boxed(),
            buf: Vec::new(),
            first_body: None,
        }
    }

    /// Next event, or None on timeout / end of stream.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return serde_json::from_slice(&line).ok();
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(Some(Ok(b))) => self.buf.extend_from_slice(&b),
                _ => return None,
            }
        }
    }

    /// Next event that is not a BOOKMARK.
    pub async fn next_change(&mut self, timeout: Duration) -> Option<Value> {
        loop {
            let e = self.next(timeout).await?;
            if e["type"] != "BOOKMARK" {
                return Some(e);
            }
        }
    }

    pub async fn body(mut self) -> Value {
        let mut all = std::mem::take(&mut self.buf);
        while let Some(Ok(b)) = self.stream.next().await {
            all.extend_from_slice(&b);
        }
        serde_json::from_slice(&all).unwrap_or(Value::Null)
    }
}

pub fn rv(v: &Value) -> i64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("resourceVersion")
}

/// `method path` with bearer token `tok` and an optional JSON body: (status, JSON body or null).
pub async fn call(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    tok: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = s.client.request(method, s.url(path)).bearer_auth(tok);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("send");
    let code = resp.status().as_u16();
    (code, resp.json::<Value>().await.unwrap_or(Value::Null))
}

/// The HS256 secret of [`start_authenticated`] servers.
pub const AUTH_SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

/// A server with authentication on, its tokens signed with [`AUTH_SECRET`].
pub async fn start_authenticated() -> TestServer {
    start_with(ApiConfig {
        jwt_secret: AUTH_SECRET.to_vec(),
        auth: true,
        ..Default::default()
    })
    .await
}

/// An HS256 token of `user` with `role` in `tenants` (`"*"`: all), signed with
/// [`AUTH_SECRET`].
pub fn auth_token(user: &str, tenants: &[&str], role: lattice_apiserver::Role) -> String {
    let t: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
    lattice_apiserver::mint_token(AUTH_SECRET, user, &t, role, Duration::from_secs(600))
}

/// An administrator's token for [`start_authenticated`] servers.
pub fn admin_token() -> String {
    auth_token("root", &["*"], lattice_apiserver::Role::Admin)
}

/// Waits until `tok` may GET `path` (a role binding reaching the server's copy of the
/// bindings takes a moment).
pub async fn until_allowed(s: &TestServer, tok: &str, path: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while call(s, reqwest::Method::GET, path, tok, None).await.0 == 403 {
        assert!(
            std::time::Instant::now() < deadline,
            "never allowed: {path}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A RoleBinding (in `tenant`) or ClusterRoleBinding (`None`) of the ClusterRole `role` to
/// user `user`, named `name`.
pub fn role_binding(name: &str, tenant: Option<&str>, role: &str, user: &str) -> Value {
    let (kind, meta) = match tenant {
        Some(t) => ("RoleBinding", json!({"name": name, "namespace": t})),
        None => ("ClusterRoleBinding", json!({"name": name})),
    };
    json!({
        "apiVersion": "lattice.dev/v1alpha1", "kind": kind, "metadata": meta,
        "roleRef": {"kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "User", "name": user}],
    })
}

/// Binds the ClusterRole `role` to `user` in `tenant` (`None`: cluster-wide) as `admin`,
/// and waits until `probe` (a path the role lets `user` GET) answers: the server's copy
/// of the bindings has it.
pub async fn bind_role(
    s: &TestServer,
    admin: &str,
    tenant: Option<&str>,
    role: &str,
    user: &str,
    probe: Option<(&str, &str)>,
) {
    let path = match tenant {
        Some(t) => format!("{API}/namespaces/{t}/rolebindings"),
        None => format!("{API}/clusterrolebindings"),
    };
    let b = role_binding(&format!("{role}-{user}"), tenant, role, user);
    let (code, v) = call(s, reqwest::Method::POST, &path, admin, Some(b)).await;
    assert_eq!(code, 201, "bind {role} to {user}: {v}");
    if let Some((token, path)) = probe {
        until_allowed(s, token, path).await;
    }
}
