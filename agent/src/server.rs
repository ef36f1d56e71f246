//! The agent's own HTTP endpoint (`--listen`): `/logs/{namespace}/{name}`,
//! `/attach/{namespace}/{name}` (see [`crate::attach`]), `/metrics`, `/healthz`. The API server proxies `.../allocations/{name}/log` here.

use std::sync::Arc;

use axum::extract::{FromRef, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::logs::{http::get_logs, Logs};
use crate::metrics::Metrics;

/// Handler state.
#[derive(Clone)]
pub struct AppState {
    /// Logs.
    pub logs: Arc<Logs>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// What attach sessions need (`None`: attach is refused).
    pub attach: Option<Arc<crate::agent::Ctx>>,
    /// Checks that log requests come from the API server.
    pub proxy: Arc<ProxyKey>,
}

/// This agent's copy of the key the API server signs proxied requests with
/// ([`lattice_apis::proxy_auth`]), fetched on first need with the agent's credentials.
#[derive(Debug)]
pub struct ProxyKey {
    api_url: String,
    token: Option<String>,
    /// The key and when it was fetched.
    key: tokio::sync::Mutex<Option<(Arc<Vec<u8>>, std::time::Instant)>>,
}

/// A key that signatures do not match is fetched again (a restored or replaced store), at
/// most this often.
const REFETCH_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

impl ProxyKey {
    /// Fetched from the API at `api_url` with `token`.
    pub fn new(api_url: &str, token: Option<String>) -> Self {
        Self {
            api_url: api_url.trim_end_matches('/').to_string(),
            token,
            key: tokio::sync::Mutex::new(None),
        }
    }

    /// The key: the one held, or (none held, or `stale` and not fetched lately) a fresh one.
    async fn get(&self, stale: bool) -> Result<Arc<Vec<u8>>, String> {
        let mut held = self.key.lock().await;
        if let Some((k, at)) = held.as_ref() {
            if !stale || at.elapsed() < REFETCH_EVERY {
                return Ok(k.clone());
            }
        }
        let fresh = Arc::new(self.fetch().await?);
        *held = Some((fresh.clone(), std::time::Instant::now()));
        Ok(fresh)
    }

    async fn fetch(&self) -> Result<Vec<u8>, String> {
        let mut req = reqwest::Client::new()
            .get(format!(
                "{}{}",
                self.api_url,
                lattice_apis::proxy_auth::KEY_PATH
            ))
            .timeout(std::time::Duration::from_secs(10));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| e.to_string())?;
        let code = resp.status();
        let body: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
        let hex = body.get("key").and_then(|k| k.as_str()).ok_or_else(|| {
            format!(
                "{code}: {}",
                body.get("message")
                    .and_then(|m| m.as_str())
                    .unwrap_or_default()
            )
        })?;
        (0..hex.len())
            .step_by(2)
            .map(|i| {
                hex.get(i..i + 2)
                    .and_then(|b| u8::from_str_radix(b, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| "the API server's proxy key is not hex".to_string())
    }
}

/// Only the API server (a valid signature) reads logs here.
async fn from_api_server(State(s): State<AppState>, req: Request, next: Next) -> Response {
    use lattice_apis::proxy_auth::{verify, HEADER};
    let path = req.uri().path().to_string();
    let deny = |code: StatusCode, msg: String| {
        tracing::info!(%path, %msg, "log request refused");
        (code, msg).into_response()
    };
    let Some(sig) = req.headers().get(HEADER).and_then(|v| v.to_str().ok()) else {
        return deny(
            StatusCode::UNAUTHORIZED,
            format!("logs are served through the API server (`lattice logs`); this request has no {HEADER} signature"),
        );
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let method = req.method().as_str().to_string();
    let mut checked = Err(String::new());
    // A mismatch may be a replaced key: fetched again once (rate-limited) before refusing.
    for stale in [false, true] {
        checked = match s.proxy.get(stale).await {
            Ok(key) => verify(&key, sig, &method, &path, now),
            Err(e) => {
                return deny(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("cannot check the request: no proxy key from the API server ({e})"),
                )
            }
        };
        if !checked
            .as_ref()
            .is_err_and(|e| e.contains("does not match"))
        {
            break;
        }
    }
    if let Err(e) = checked {
        return deny(StatusCode::FORBIDDEN, e);
    }
    next.run(req).await
}

impl FromRef<AppState> for Option<Arc<crate::agent::Ctx>> {
    fn from_ref(s: &AppState) -> Self {
        s.attach.clone()
    }
}

impl FromRef<AppState> for Arc<Logs> {
    fn from_ref(s: &AppState) -> Self {
        s.logs.clone()
    }
}

/// The routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route(
            "/logs/{namespace}/{name}",
            get(get_logs).route_layer(middleware::from_fn_with_state(
                state.clone(),
                from_api_server,
            )),
        )
        .route("/attach/{namespace}/{name}", get(crate::attach::attach))
        .with_state(state)
}

async fn metrics(State(s): State<AppState>) -> Response {
    let mut r = s.metrics.encode().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// Serve until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}
