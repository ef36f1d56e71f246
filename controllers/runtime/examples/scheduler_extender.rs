//! A scheduler extender in one file: an HTTP service the built-in scheduler asks once per
//! cycle (`spec.extenders` of a VCluster; protocol in `lattice_apis::extender`).
//!
//! It keeps jobs off nodes labelled `example.com/maintenance=true` and ranks jobs by their
//! `example.com/boost` label (a number in [0, 1]).
//!
//! ```text
//! cargo run -p lattice-runtime --example scheduler_extender -- 127.0.0.1:8090
//! ```
//!
//! and in the VCluster (admins only: tenants cannot edit vClusters):
//!
//! ```yaml
//! spec:
//!   extenders:
//!   - name: maintenance
//!     url: http://127.0.0.1:8090/lattice/extender
//!     filter: true
//!     score: true
//!     weight: 0.2
//!     timeout: 500ms
//!     failurePolicy: ignore
//! ```

use axum::routing::post;
use axum::{Json, Router};
use lattice_apis::extender::{ExtenderRequest, ExtenderResponse};

/// Nodes with this label set to `true` are filtered out.
pub const MAINTENANCE_LABEL: &str = "example.com/maintenance";
/// A job's score: this label's value, clamped to [0, 1] (absent or unreadable: 0).
pub const BOOST_LABEL: &str = "example.com/boost";
/// Where the extender listens.
pub const PATH: &str = "/lattice/extender";

/// The extender's routes.
pub fn router() -> Router {
    Router::new().route(
        PATH,
        post(|Json(req): Json<ExtenderRequest>| async move { Json(answer(&req)) }),
    )
}

/// The decision, pure: what a test can check without a network.
pub fn answer(req: &ExtenderRequest) -> ExtenderResponse {
    let mut out = ExtenderResponse::default();
    if req.filter {
        for n in &req.nodes {
            if n.labels.get(MAINTENANCE_LABEL).map(String::as_str) == Some("true") {
                out.filtered_nodes
                    .insert(n.name.clone(), format!("{MAINTENANCE_LABEL}=true"));
            }
        }
    }
    if req.score {
        for j in &req.jobs {
            let boost = j
                .labels
                .get(BOOST_LABEL)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .map_or(0.0, |v| v.clamp(0.0, 1.0));
            out.scores.insert(j.name.clone(), boost);
        }
    }
    out
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8090".to_string());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("scheduler extender on http://{addr}{PATH}");
    axum::serve(listener, router()).await
}
