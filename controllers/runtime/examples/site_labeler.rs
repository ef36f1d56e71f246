//! A site controller as a separate process: labels every Allocation with the queue it
//! belongs to (`site.example/queue=<vcluster or "default">`), through the public HTTP
//! API, with leader election on a Lease so that only one replica acts at a time.
//!
//! ```sh
//! LATTICE_SERVER=http://127.0.0.1:6443 LATTICE_TOKEN=... \
//!     cargo run -p lattice-runtime --example site_labeler
//! ```
//!
//! Environment: `LATTICE_SERVER` (default `http://127.0.0.1:6443`), `LATTICE_TOKEN`
//! (bearer token, optional), `SITE_LABELER_IDENTITY` (default `<host>-<pid>`),
//! `SITE_LABELER_LEASE_SECONDS` (lease duration, default 15).

use std::sync::Arc;
use std::time::Duration;

use lattice_apis::Allocation;
use lattice_runtime::{
    Action, Api, Client, ControllerHost, LeaseConfig, LeaseLock, Patch, PatchParams, ResourceExt,
};
use serde_json::json;

const LABEL: &str = "site.example/queue";
const MANAGER: &str = "site-labeler";

struct Ctx {
    api: Api<Allocation>,
}

/// Level-triggered and idempotent: compute the label from the object as it is now and
/// apply it; an object that already carries the right value costs nothing.
async fn reconcile(a: Arc<Allocation>, ctx: Arc<Ctx>) -> Result<Action, lattice_runtime::Error> {
    let queue = a
        .spec
        .vcluster
        .clone()
        .unwrap_or_else(|| "default".to_string());
    if a.labels().get(LABEL) == Some(&queue) || a.is_deleting() {
        return Ok(Action::await_change());
    }
    let patch = Patch::Apply(json!({
        "apiVersion": lattice_apis::API_VERSION,
        "kind": "Allocation",
        "metadata": {"name": a.name_any(), "namespace": a.namespace(), "labels": {LABEL: queue}},
    }));
    ctx.api
        .for_obj(&a)
        .patch(a.name_any(), &PatchParams::apply(MANAGER).force(), &patch)
        .await?;
    tracing::info!(allocation = %a.object_ref(), %queue, "labelled");
    Ok(Action::await_change())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let server = std::env::var("LATTICE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:6443".into());
    let token = std::env::var("LATTICE_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    let identity = std::env::var("SITE_LABELER_IDENTITY").unwrap_or_else(|_| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "site-labeler".into());
        format!("{host}-{}", std::process::id())
    });
    let lease_secs: u64 = std::env::var("SITE_LABELER_LEASE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);

    let client = Client::http(&server, token)?;
    let mut lease = LeaseConfig::new(MANAGER, &identity);
    if lease_secs != 15 {
        lease.lease_duration = Duration::from_secs(lease_secs);
        lease.renew_deadline = Duration::from_secs(lease_secs).mul_f64(2.0 / 3.0);
        lease.retry_period = Duration::from_secs(lease_secs).mul_f64(2.0 / 15.0);
    }
    let elector = Arc::new(LeaseLock::new(client.clone(), lease).spawn());

    let mut host = ControllerHost::new(client.clone(), elector.clone());
    let api: Api<Allocation> = Api::all(client);
    host.register(MANAGER, move |hc| {
        let ctx = Arc::new(Ctx { api: api.clone() });
        async move { hc.controller::<Allocation>().run(reconcile, ctx).await }
    });
    tracing::info!(%server, %identity, "site-labeler starting");
    host.run(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    // Hand the lease over at once instead of making the next replica wait it out.
    elector.shutdown().await?;
    Ok(())
}
