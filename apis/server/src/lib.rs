//! `lattice-apiserver`: a Kubernetes-style HTTP API over the [`KvBackend`] trait.
//!
//! * Resources under `/apis/lattice.dev/v1alpha1/...` (namespaced kinds under
//!   `namespaces/{tenant}/`), handled generically as JSON with each kind's `admit`.
//! * Verbs: get, list (label/field selectors, limit/continue), watch (from the watch
//!   cache, bookmarks, 410 on compaction), create, replace, patch (merge, JSON,
//!   server-side apply), delete (preconditions, finalizers), `dryRun=All`, `/status`.
//! * Discovery, OpenAPI v3, Table output, `Status` errors, JWT auth, `/metrics`,
//!   `/healthz`, `/readyz`, and the seed's `/v1/...` Intent API.
//!
//! Two layers:
//!
//! * [`registry`]: the verbs over the store, with no HTTP in it — resources, admission,
//!   server-side apply, patches, selectors, the watch cache, quotas, authorization,
//!   redaction, the caller's identity, the cluster settings, and the in-process
//!   transport the built-in controllers use. Its modules are re-exported at the root.
//! * HTTP: [`routes`] (paths and dispatch), [`auth`] (tokens and certificates),
//!   [`watch`], [`table`], [`discovery`], [`openapi`], [`errors`] (a `Status` answer),
//!   [`intent`] (the `/v1` routes), [`logs`] and [`attach`] (proxied to the node agents),
//!   [`heartbeat`], [`node_identity`], [`tls`], [`limits`], [`metrics`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use lattice_store::KvBackend;

pub mod access;
pub mod agents;
pub mod api_tokens;
pub mod attach;
pub mod audit;
pub mod auth;
pub mod cluster_config;
pub mod compactor;
pub mod discovery;
pub mod errors;
pub mod heartbeat;
pub mod intent;
pub mod job_token;
pub mod limits;
pub mod logs;
pub mod metrics;
pub mod node_identity;
pub mod oidc;
pub mod openapi;
pub mod ranges;
pub mod registry;
pub mod reports;
pub mod routes;
pub mod table;
pub mod tls;
pub mod watch;

// The registry's modules at the crate's root, where callers have always found them.
pub use registry::{
    admission, apply, authz, in_process, objects, parse, patch, quota, rbac, redact, resources,
    selectors, watch_cache,
};

pub use auth::{mint_token, Authenticator, JwtAuthenticator, Role, UserInfo};
pub use errors::{ApiError, ApiResult};

/// API server settings.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// HS256 secret for bearer tokens.
    pub jwt_secret: Vec<u8>,
    /// `false`: no authentication, everyone is an admin (tests, `--dev`).
    pub auth: bool,
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// Events kept per kind in the watch cache's ring buffer.
    pub watch_cache_size: usize,
    /// How often watchers that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Watch lifetime when the client gives no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// TTL of the store lease behind a node's heartbeat stream: a node whose agent sends
    /// nothing for this long loses its heartbeat Lease (the controllers' heartbeat timeout).
    pub heartbeat_ttl: Duration,
    /// Most tasks (`spec.allocations`) a `Dag` may have; larger ones are rejected at
    /// admission with 422 (`lattice-server --max-dag-size`, the seed's
    /// `scheduling.max_dag_size`; default 1000).
    pub max_dag_size: usize,
    /// The cluster CA (certificate and key): signs node certificates (bootstrap, renewal)
    /// and this server's own client certificate for talking to agents. Without it nodes
    /// cannot enroll here.
    pub ca: Option<Arc<lattice_pki::Ca>>,
    /// Lifetime of the node certificates this server signs (agents renew at two thirds).
    pub node_cert_validity: Duration,
    /// How this server reaches node agents (logs, attach): trusting the cluster CA and
    /// showing its `system:apiserver` certificate. `None`: agents are reached over plain
    /// HTTP (only agents without a node identity serve that: servers without
    /// authentication, in tests).
    pub agent_tls: Option<Arc<rustls::ClientConfig>>,
    /// Per-identity limits: request rate, requests in flight, watches, log streams and
    /// attach sessions (see [`limits`]).
    pub limits: limits::IdentityLimits,
    /// Per-tenant object-count quotas (see [`quota`]).
    pub object_quotas: quota::ObjectQuotas,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            jwt_secret: Vec::new(),
            auth: false,
            max_body_bytes: 3 * 1024 * 1024,
            watch_cache_size: 10_000,
            bookmark_interval: Duration::from_secs(10),
            default_watch_timeout: Duration::from_secs(30 * 60),
            heartbeat_ttl: Duration::from_secs(30),
            max_dag_size: lattice_apis::kinds::dag::DEFAULT_MAX_DAG_SIZE,
            ca: None,
            node_cert_validity: Duration::from_secs(30 * 24 * 3600),
            agent_tls: None,
            limits: limits::IdentityLimits::DEFAULT,
            object_quotas: quota::ObjectQuotas::DEFAULT,
        }
    }
}

/// A `/readyz` check: `Ok(())` when ready, `Err(reason)` otherwise. Must be cheap.
pub type ReadinessCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Shared state of every handler.
pub struct Inner {
    pub config: ApiConfig,
    pub resources: resources::Resources,
    pub caches: watch_cache::WatchCaches,
    pub metrics: Arc<metrics::Metrics>,
    pub authenticator: Arc<dyn Authenticator>,
    /// Heartbeat sequence numbers seen per node.
    pub heartbeats: heartbeat::Sequences,
    /// Revoked client certificates.
    pub revocations: node_identity::Revocations,
    /// The role bindings, kept from the store.
    pub rbac: rbac::Rbac,
    /// The API tokens, kept from the store.
    pub api_tokens: api_tokens::Tokens,
    /// Per-identity limits and what each identity holds of them.
    pub limiter: Arc<limits::Limiter>,
    /// The heartbeat reader thread, started with the first heartbeat stream (`None`
    /// when it could not start: streams are then read by a task each).
    heartbeat_reader: std::sync::OnceLock<Option<heartbeat::reader::Reader>>,
    /// Flips to true when the server shuts down: open watches end so the graceful
    /// shutdown does not wait for them.
    pub shutting_down: tokio::sync::watch::Sender<bool>,
    /// Extra `/readyz` checks (the controller host's, say): name → `Err(why)` when not ready.
    readiness: std::sync::RwLock<Vec<(String, ReadinessCheck)>>,
    openapi_doc: Vec<u8>,
    openapi_hash: String,
    /// How node agents are reached (logs, attach).
    pub agents: agents::Agents,
    /// Set once the built-in roles are being written.
    seeded: std::sync::OnceLock<()>,
    /// The audit log, when this server keeps one ([`ApiServer::set_audit`]).
    audit: std::sync::OnceLock<Arc<audit::Auditor>>,
}

impl Inner {
    /// The audit log, when this server keeps one.
    pub fn auditor(&self) -> Option<Arc<audit::Auditor>> {
        self.audit.get().cloned()
    }
}

impl Inner {
    /// The heartbeat reader (started on first use; needs a tokio runtime).
    pub(crate) fn heartbeat_reader(&self) -> Option<&heartbeat::reader::Reader> {
        self.heartbeat_reader
            .get_or_init(|| {
                heartbeat::reader::Reader::start(
                    self.resources.backend.clone(),
                    self.metrics.clone(),
                    self.revocations.clone(),
                    self.shutting_down.subscribe(),
                    self.config.heartbeat_ttl.max(Duration::from_secs(1)),
                )
                .map_err(|e| tracing::error!(error = %e, "cannot start the heartbeat reader; heartbeat streams are read by a task each"))
                .ok()
            })
            .as_ref()
    }
}

/// The API server.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

impl ApiServer {
    pub fn new(backend: Arc<dyn KvBackend>, config: ApiConfig) -> ApiServer {
        let authenticator: Arc<dyn Authenticator> = if config.auth {
            Arc::new(JwtAuthenticator::new(&config.jwt_secret))
        } else {
            Arc::new(auth::AllowAll)
        };
        Self::with_authenticator(backend, config, authenticator)
    }

    /// Like [`new`](Self::new) with a custom authenticator (OIDC, mTLS, ...).
    pub fn with_authenticator(
        backend: Arc<dyn KvBackend>,
        config: ApiConfig,
        authenticator: Arc<dyn Authenticator>,
    ) -> ApiServer {
        let metrics = Arc::new(metrics::Metrics::new());
        let doc = openapi::group_version_doc();
        let openapi_doc = serde_json::to_vec(&doc).unwrap_or_default();
        let openapi_hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            openapi_doc.hash(&mut h);
            format!("{:016X}", h.finish())
        };
        let agents = agents::Agents::new(config.agent_tls.clone());
        let limiter = limits::Limiter::new(config.limits, &metrics);
        let quotas = quota::Counts::new(backend.clone(), config.object_quotas, &metrics);
        let inner = Inner {
            limiter,
            caches: watch_cache::WatchCaches::new(
                backend.clone(),
                config.watch_cache_size,
                metrics.clone(),
            ),
            resources: resources::Resources::new(backend)
                .with_max_dag_size(config.max_dag_size)
                .with_quotas(quotas),
            config,
            metrics,
            authenticator,
            heartbeats: heartbeat::Sequences::default(),
            revocations: node_identity::Revocations::default(),
            rbac: rbac::Rbac::default(),
            api_tokens: api_tokens::Tokens::default(),
            heartbeat_reader: std::sync::OnceLock::new(),
            agents,
            shutting_down: tokio::sync::watch::channel(false).0,
            readiness: std::sync::RwLock::new(Vec::new()),
            openapi_doc,
            openapi_hash,
            seeded: std::sync::OnceLock::new(),
            audit: std::sync::OnceLock::new(),
        };
        ApiServer {
            inner: Arc::new(inner),
        }
    }

    /// Add a `/readyz` check (e.g. the controller host's readiness).
    pub fn add_readiness_check(&self, name: &str, check: ReadinessCheck) {
        if let Ok(mut checks) = self.inner.readiness.write() {
            checks.push((name.to_string(), check));
        }
    }

    pub fn router(&self) -> Router {
        let api_prefix = format!("/apis/{}", lattice_apis::API_VERSION);
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/livez", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics_handler))
            .route("/version", get(|| async { json(discovery::version()) }))
            .route("/api", get(discovery_handler))
            .route("/apis", get(discovery_handler))
            .route(
                &format!("/apis/{}", lattice_apis::GROUP),
                get(discovery_handler),
            )
            .route(&api_prefix, get(discovery_handler))
            .route(&format!("{api_prefix}/"), get(discovery_handler))
            .route(
                &format!("{api_prefix}/namespaces/{{ns}}/allocations/{{name}}/log"),
                get(logs::allocation_log),
            )
            .route(
                &format!("{api_prefix}/namespaces/{{ns}}/allocations/{{name}}/attach"),
                get(attach::attach),
            )
            .route(
                &format!("{api_prefix}/namespaces/{{ns}}/allocations/{{name}}/report"),
                post(reports::report),
            )
            .route(
                &format!("{api_prefix}/nodes/{{name}}/heartbeat"),
                axum::routing::post(heartbeat::node_heartbeat),
            )
            .route(
                &format!("{api_prefix}/{{*rest}}"),
                any(routes::resource_handler),
            )
            .route("/openapi/v3", get(openapi_index))
            .route(
                &format!("/openapi/v3/apis/{}", lattice_apis::API_VERSION),
                get(openapi_doc),
            )
            .route("/v1/admin/config", get(cluster_config::list))
            .route(
                "/v1/admin/config/{key}",
                get(cluster_config::get)
                    .put(cluster_config::put)
                    .delete(cluster_config::delete),
            )
            .route("/v1/{plural}", any(intent::collection))
            .route("/v1/{plural}/{id}", any(intent::item))
            .route("/v1/dags/{id}/graph", get(intent::dag_graph))
            .route("/v1/allocations/{id}/tasks", post(intent::launch_tasks))
            .route("/v1/allocations/{id}/attach", get(attach::attach_by_id))
            .route("/v1/allocations/{id}/token", post(job_token::job_token))
            .route(lattice_apis::attach::REDEEM_PATH, post(attach::redeem))
            .route(
                lattice_apis::node_identity::BOOTSTRAP_PATH,
                post(node_identity::bootstrap),
            )
            .route(
                lattice_apis::node_identity::RENEW_PATH,
                post(node_identity::renew),
            )
            .route(
                lattice_apis::node_identity::BOOTSTRAP_TOKENS_PATH,
                get(node_identity::tokens).post(node_identity::tokens),
            )
            .route(
                "/v1/admin/bootstrap-tokens/{id}",
                axum::routing::delete(node_identity::delete_token),
            )
            .route("/v1/admin/nodes/{name}/revoke", post(node_identity::revoke))
            .route(
                "/v1/admin/tokens",
                get(api_tokens::tokens)
                    .post(api_tokens::tokens)
                    .delete(api_tokens::tokens),
            )
            .route(
                "/v1/admin/tokens/{id}",
                axum::routing::delete(api_tokens::delete),
            )
            .route("/v1/auth/can-i", post(access::can_i))
            .route(access::DISCOVERY_PATH, get(access::discovery))
            .route(access::SEED_DISCOVERY_PATH, get(access::discovery))
            .route("/v1/auth/whoami", get(access::whoami))
            .route("/v1/audit", get(audit::query))
            .route("/v1/audit/export", get(audit::export))
            .route("/v1/audit/keys", get(audit::keys))
            .route("/v1/audit/verify", get(audit::verify))
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(
                self.inner.clone(),
                audit::layer,
            ))
            .layer(axum::middleware::from_fn_with_state(
                self.inner.clone(),
                limits::admit,
            ))
            .layer(axum::middleware::from_fn_with_state(
                self.inner.clone(),
                auth::authn,
            ))
            .layer(tower_http::trace::TraceLayer::new_for_http())
            .with_state(self.inner.clone())
    }

    /// Keeps an audit log (see [`audit`]); once, before serving.
    pub fn set_audit(&self, a: Arc<audit::Auditor>) {
        self.inner.metrics.add_registry(a.counts.registry());
        self.inner
            .resources
            .set_sensitive_writes(Arc::new(audit::SensitiveHook(a.clone())));
        let _ = self.inner.audit.set(a);
    }

    /// The audit log, if kept.
    pub fn auditor(&self) -> Option<Arc<audit::Auditor>> {
        self.inner.auditor()
    }

    /// Writes the built-in roles into the store (once per server, in the background,
    /// retried until the store takes them): see [`rbac::seed_builtins`].
    fn seed_builtin_roles(&self) {
        if self.inner.seeded.set(()).is_err() {
            return;
        }
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(200);
            loop {
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                match rbac::seed_builtins(&inner.resources).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::warn!(error = %e.message, "cannot write the built-in roles yet; retrying")
                    }
                }
                drop(inner);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
        });
    }

    /// Serve until `shutdown` resolves, then drain connections gracefully.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let addr = listener.local_addr()?;
        tracing::info!(%addr, "lattice API server listening");
        self.seed_builtin_roles();
        let inner = self.inner.clone();
        let signal = async move {
            shutdown.await;
            tracing::info!("lattice API server shutting down; ending watches");
            inner.shutting_down.send_replace(true);
        };
        // Each connection's socket is recorded, so that heartbeat streams can be handed
        // to the heartbeat reader thread.
        let app = self
            .router()
            .into_make_service_with_connect_info::<heartbeat::ConnFd>();
        axum::serve(listener, app)
            .with_graceful_shutdown(signal)
            .await?;
        Ok(())
    }

    /// Like [`serve`](Self::serve), over TLS (see [`tls`]). Both can run at once on
    /// clones of one server: they share caches, metrics and shutdown of watches.
    pub async fn serve_tls(
        self,
        listener: tokio::net::TcpListener,
        config: rustls::ServerConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let addr = listener.local_addr()?;
        tracing::info!(%addr, "lattice API server listening (TLS)");
        self.seed_builtin_roles();
        let inner = self.inner.clone();
        let signal = async move {
            shutdown.await;
            inner.shutting_down.send_replace(true);
        };
        // Each connection's verified client certificate (nodes, controllers) is kept for
        // authentication.
        let app = self
            .router()
            .into_make_service_with_connect_info::<tls::TlsConnInfo>();
        axum::serve(tls::TlsListener::new(listener, config)?, app)
            .with_graceful_shutdown(signal)
            .await?;
        Ok(())
    }

    /// The server's metrics (for embedding in a bigger registry or tests).
    pub fn metrics(&self) -> Arc<metrics::Metrics> {
        self.inner.metrics.clone()
    }
}

fn json(v: serde_json::Value) -> Response {
    routes::json_response(StatusCode::OK, &v)
}

async fn not_found(uri: Uri) -> Response {
    ApiError::path_not_found(uri.path()).into_response()
}

async fn discovery_handler(
    State(inner): State<Arc<Inner>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = routes::authenticate(&inner, &headers).await {
        return e.into_response();
    }
    let path = uri.path().trim_end_matches('/');
    let v = match path {
        "/api" => discovery::core_api(),
        "/apis" => discovery::api_group_list(),
        p if p == format!("/apis/{}", lattice_apis::GROUP) => discovery::api_group(),
        _ => discovery::api_resource_list(),
    };
    json(v)
}

async fn openapi_index(State(inner): State<Arc<Inner>>, headers: HeaderMap) -> Response {
    if let Err(e) = routes::authenticate(&inner, &headers).await {
        return e.into_response();
    }
    json(openapi::index(&inner.openapi_hash))
}

async fn openapi_doc(State(inner): State<Arc<Inner>>, headers: HeaderMap) -> Response {
    if let Err(e) = routes::authenticate(&inner, &headers).await {
        return e.into_response();
    }
    let mut resp = (StatusCode::OK, inner.openapi_doc.clone()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

async fn readyz(State(inner): State<Arc<Inner>>) -> Response {
    if let Err(e) = inner.resources.backend.status().await {
        return ApiError::unavailable(format!("store not ready: {e}")).into_response();
    }
    let failing: Vec<String> = match inner.readiness.read() {
        Ok(checks) => checks
            .iter()
            .filter_map(|(name, check)| check().err().map(|why| format!("{name}: {why}")))
            .collect(),
        Err(_) => vec!["readiness checks: lock poisoned".to_string()],
    };
    if failing.is_empty() {
        "ok".into_response()
    } else {
        ApiError::unavailable(format!("not ready: {}", failing.join("; "))).into_response()
    }
}

async fn metrics_handler(State(inner): State<Arc<Inner>>) -> Response {
    let text = metrics::to_prometheus_text(&inner.metrics.encode());
    let mut resp = (StatusCode::OK, text).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}
