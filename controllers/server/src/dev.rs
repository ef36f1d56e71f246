//! `--dev` bootstrap: the objects a fresh single-member cluster needs to be usable at once.

use std::net::SocketAddr;

use anyhow::Context;
use serde_json::json;

/// Create tenant `default` and vCluster `default` (idempotently, through the API so that
/// admission and defaulting apply as to any other client).
pub async fn bootstrap(api: SocketAddr, token: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let base = format!("http://{api}/apis/lattice.dev/v1alpha1");
    let objects = [
        (
            format!("{base}/tenants/default"),
            // No `spec`: applying `spec: {}` would take the whole spec over and wipe what
            // an admin set since (quotas, `spec.runAs`) at every restart.
            json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": "default"}}),
        ),
        (
            format!("{base}/namespaces/default/vclusters/default"),
            json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "VCluster",
                   "metadata": {"name": "default", "namespace": "default"},
                   "spec": {"schedulerType": "hpc-backfill"}}),
        ),
    ];
    for (url, body) in objects {
        let resp = client
            .patch(format!("{url}?fieldManager=lattice-server-dev&force=true"))
            .bearer_auth(token)
            .header("Content-Type", "application/apply-patch+yaml")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await
            .with_context(|| format!("creating {url}"))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            anyhow::bail!("creating {url}: {status}: {text}");
        }
    }
    Ok(())
}
