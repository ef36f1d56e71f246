//! Registration: the cluster-scoped `Node` named after `--node-id`.
//!
//! The agent creates the Node when it is missing (with `spec.topologyGroup` and
//! `spec.features` from its flags; an existing spec is the operator's and is left
//! alone), then writes what it knows through `/status` with a JSON merge patch — never
//! a full replace, because `status.owner` belongs to the scheduler. It moves the node
//! to `Ready` only from `Unknown`, `Booting` or `Down` (and never when the operator
//! disabled it); Draining, Drained and Degraded are the node lifecycle controller's.
//! That state change is guarded by the resourceVersion read, so it cannot overwrite a
//! decision made meanwhile.

use std::sync::Arc;
use std::time::Duration;

use lattice_apis::{Node, NodeSpec, NodeState, ObjectMeta, Time};
use lattice_runtime::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::agent::Ctx;
use crate::discovery::NodeFacts;

/// Agent version published in `status.agent.version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Wait until every re-attached run is confirmed as still this node's or has stopped;
/// false when the agent stops first.
///
/// Runs re-attached from the state file may have been superseded while the agent was
/// away (the node went Down, its work was requeued): the node may take new work (be
/// registered Ready, or heartbeat its way back to Ready) only after that.
pub async fn wait_settled(ctx: &Ctx) -> bool {
    let mut unsettled = ctx.unsettled.subscribe();
    let waiting = *unsettled.borrow_and_update();
    if waiting == 0 {
        return true;
    }
    tracing::info!(
        runs = waiting,
        "registering and heartbeating once the re-attached runs are confirmed or stopped"
    );
    tokio::select! {
        r = unsettled.wait_for(|n| *n == 0) => r.is_ok(),
        _ = ctx.shutdown.cancelled() => false,
    }
}

/// Register (once the re-attached runs have settled), retrying with backoff until it
/// succeeds or the agent stops.
pub async fn run(ctx: Arc<Ctx>, facts: NodeFacts, address: String, started: Time) {
    if !wait_settled(&ctx).await {
        return;
    }
    let mut backoff = Duration::from_millis(500);
    loop {
        match register(&ctx, &facts, &address, started).await {
            Ok(state) => {
                tracing::info!(node = %ctx.cfg.node, ?state, %address, "node registered");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "registration failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = ctx.shutdown.cancelled() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

pub use lattice_apis::kinds::node::agent_may_ready;

/// The status merge patch for `node` (as last read).
pub fn status_patch(node: &Node, facts: &NodeFacts, address: &str, started: Time) -> Value {
    let mut capacity = serde_json::to_value(&facts.capacity).unwrap_or_else(|_| json!({}));
    if let Some(c) = capacity.as_object_mut() {
        // A merge patch keeps fields it does not mention: clear what is gone.
        for k in ["gpuType", "numaNodes", "cxlMemoryGb"] {
            c.entry(k).or_insert(Value::Null);
        }
        c.entry("gpus").or_insert(json!([]));
    }
    let mut status = json!({
        "capacity": capacity,
        "conformanceFingerprint": facts.fingerprint,
        "agent": {
            "version": VERSION,
            "address": address,
            "kernelVersion": facts.kernel_version,
            "architecture": facts.architecture,
            "startTime": started,
            "capabilities": facts.capabilities,
        },
    });
    let mut patch = json!({});
    if agent_may_ready(node) {
        status["state"] = json!("Ready");
        status["reason"] = json!("AgentRegistered");
        status["message"] = json!(format!("agent {VERSION} registered from {address}"));
        status["lastTransitionTime"] = json!(lattice_apis::meta::now());
        // Guard: only if nobody changed the node since we read its state.
        if let Some(rv) = &node.metadata.resource_version {
            patch["metadata"] = json!({ "resourceVersion": rv });
        }
    }
    patch["status"] = status;
    patch
}

/// One registration; returns the node's state afterwards.
pub async fn register(
    ctx: &Ctx,
    facts: &NodeFacts,
    address: &str,
    started: Time,
) -> anyhow::Result<NodeState> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let name = ctx.cfg.node.as_str();
    if api.get_opt(name).await?.is_none() {
        let node = Node {
            metadata: ObjectMeta::named(name, None),
            spec: NodeSpec {
                topology_group: ctx.cfg.topology_group,
                features: ctx.cfg.features.clone(),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => tracing::info!(node = name, "created Node"),
            Err(e) if e.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
    }
    for _ in 0..10 {
        let node = api.get(name).await?;
        let patch = status_patch(&node, facts, address, started);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(n) => return Ok(n.state()),
            Err(e) if e.is_conflict() => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("the Node kept changing while registering")
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::NodeStatus;

    #[test]
    fn ready_only_from_unknown_booting_down() {
        let mut n = Node::default();
        assert!(agent_may_ready(&n));
        for (state, ok) in [
            (NodeState::Unknown, true),
            (NodeState::Booting, true),
            (NodeState::Down, true),
            (NodeState::Ready, false),
            (NodeState::Degraded, false),
            (NodeState::Draining, false),
            (NodeState::Drained, false),
            (NodeState::Failed, false),
        ] {
            n.status = Some(NodeStatus {
                state,
                ..Default::default()
            });
            assert_eq!(agent_may_ready(&n), ok, "{state:?}");
        }
        n.status = None;
        n.spec.disabled = true;
        assert!(!agent_may_ready(&n));
    }

    #[test]
    fn patch_is_guarded_only_when_changing_state() {
        let facts = NodeFacts {
            fingerprint: "ab".into(),
            ..Default::default()
        };
        let mut n = Node::default();
        n.metadata.resource_version = Some("7".into());
        let p = status_patch(&n, &facts, "127.0.0.1:1", lattice_apis::meta::now());
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(p["status"]["state"], "Ready");
        assert_eq!(p["status"]["agent"]["address"], "127.0.0.1:1");
        assert!(p["status"].get("owner").is_none());
        n.status = Some(NodeStatus {
            state: NodeState::Draining,
            ..Default::default()
        });
        let p = status_patch(&n, &facts, "a:1", lattice_apis::meta::now());
        assert!(p.get("metadata").is_none());
        assert!(p["status"].get("state").is_none());
        assert_eq!(p["status"]["conformanceFingerprint"], "ab");
    }
}
