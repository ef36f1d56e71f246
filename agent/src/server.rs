//! The agent's own endpoint (`--listen`): `/logs/{namespace}/{name}`,
//! `/attach/{namespace}/{name}` (see [`crate::attach`]), `/metrics`, `/healthz`. The API
//! server proxies `.../allocations/{name}/log` and attach sessions here.
//!
//! With a node identity the endpoint is HTTPS with this node's certificate, and only
//! clients with a certificate from the cluster CA get a connection; logs and attach are
//! the API server's alone (`system:apiserver`), `/metrics` and `/healthz` also an
//! administrator's (`admin:<name>`). A job's user, another node's agent, anyone else on
//! the network: refused at the handshake or with 403. Without an identity (a server
//! without authentication, in tests) the endpoint is plain HTTP on loopback only (see
//! `Config::from_args`).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use lattice_pki::Identity;
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
    /// The MPI steps this node runs a PMI server for (the agents' fence exchange).
    pub pmi: Arc<crate::pmi::exchange::Registry>,
}

/// Who is on the other end of a TLS connection (its verified certificate's identity);
/// absent on a plain endpoint.
#[derive(Debug, Clone)]
pub struct Peer(pub Option<Identity>);

/// Logs and attach: the API server only (on a TLS endpoint).
async fn from_api_server(req: Request, next: Next) -> Response {
    match req.extensions().get::<Peer>() {
        None | Some(Peer(Some(Identity::ApiServer))) => next.run(req).await,
        Some(Peer(who)) => {
            let who = who
                .as_ref()
                .map(|i| i.to_string())
                .unwrap_or_else(|| "a client without a certificate".into());
            tracing::info!(path = %req.uri().path(), %who, "request refused: only the API server may ask");
            (
                StatusCode::FORBIDDEN,
                format!(
                    "{who} may not use {}: job output and sessions are served through the API \
                     server (`lattice logs`, `lattice attach`)",
                    req.uri().path()
                ),
            )
                .into_response()
        }
    }
}

/// `/metrics` and `/healthz`: the API server or an administrator (on a TLS endpoint).
async fn from_operator(req: Request, next: Next) -> Response {
    match req.extensions().get::<Peer>() {
        None | Some(Peer(Some(Identity::ApiServer | Identity::Admin(_)))) => next.run(req).await,
        Some(Peer(who)) => {
            let who = who.as_ref().map(|i| i.to_string()).unwrap_or_default();
            (
                StatusCode::FORBIDDEN,
                format!("{who} may not read {}", req.uri().path()),
            )
                .into_response()
        }
    }
}

/// The PMI exchange: other nodes' agents only (the service checks which step and node).
async fn from_node(req: Request, next: Next) -> Response {
    match req.extensions().get::<Peer>() {
        None | Some(Peer(None)) | Some(Peer(Some(Identity::Node(_)))) => next.run(req).await,
        Some(Peer(Some(who))) => (
            StatusCode::FORBIDDEN,
            format!("{who} is not a node: only agents exchange a step's PMI data"),
        )
            .into_response(),
    }
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
    let pmi = crate::pmi::exchange::Service::new(state.pmi.clone());
    Router::new()
        .route(
            "/healthz",
            get(|| async { "ok" }).route_layer(middleware::from_fn(from_operator)),
        )
        .route(
            "/metrics",
            get(metrics).route_layer(middleware::from_fn(from_operator)),
        )
        .merge(
            Router::new()
                .route_service("/lattice.pmi.v1.PmiExchange/{*method}", pmi)
                .route_layer(middleware::from_fn(from_node)),
        )
        .route(
            "/logs/{namespace}/{name}",
            get(get_logs).route_layer(middleware::from_fn(from_api_server)),
        )
        .route(
            "/attach/{namespace}/{name}",
            get(crate::attach::attach).route_layer(middleware::from_fn(from_api_server)),
        )
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

/// Serve until `shutdown`: HTTPS with `tls` (see the module docs), else plain HTTP.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
    tls: Option<rustls::ServerConfig>,
) -> anyhow::Result<()> {
    let app = router(state);
    let Some(tls) = tls else {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await?;
        return Ok(());
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app, shutdown) = (acceptor.clone(), app.clone(), shutdown.clone());
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake refused");
                        return;
                    }
                    Err(_) => return,
                };
            let who = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(lattice_pki::peer_info)
                .and_then(|i| i.identity);
            if !matches!(
                who,
                Some(Identity::ApiServer | Identity::Admin(_) | Identity::Node(_))
            ) {
                tracing::info!(%peer, who = ?who, "connection refused: not the API server, an administrator or a node");
                return;
            }
            let app = app.layer(axum::Extension(Peer(who)));
            let svc = hyper_util::service::TowerToHyperService::new(app);
            let conn =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let io = hyper_util::rt::TokioIo::new(tls);
            tokio::select! {
                r = conn.serve_connection_with_upgrades(io, svc) => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                }
                _ = shutdown.cancelled() => {}
            }
        });
    }
}
