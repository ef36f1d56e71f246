//! The agent's own HTTP endpoint (`--listen`): `/logs/{namespace}/{name}`,
//! `/attach/{namespace}/{name}` (see [`crate::attach`]), `/metrics`, `/healthz`. The API server proxies `.../allocations/{name}/log` here.

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::{header, HeaderValue};
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
        .route("/logs/{namespace}/{name}", get(get_logs))
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
