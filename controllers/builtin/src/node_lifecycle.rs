//! The node lifecycle controller (the seed's "Node Lifecycle" and "Failure Modes"):
//!
//! * heartbeats are the agents' `Lease`s in namespace `lattice-node-lease`. A node whose
//!   lease has not been renewed for `heartbeat_timeout` goes **Degraded** (no new work,
//!   running work continues); after a further `grace_period` (longer for sensitive nodes)
//!   it goes **Down**, and each allocation on it is requeued or failed per its requeue
//!   policy (`lifecycle::node_failed`); the release controller then frees the node. A
//!   heartbeat that resumes brings it back to **Ready** with no disruption.
//! * drain: `spec.drain` set → **Draining** (no new work) → **Drained** once no
//!   allocation owns the node; `spec.drain` removed → **Ready**. `spec.disabled` → Down.
//!
//! Agents heartbeat over a stream to the API server, which keeps each node's Lease
//! attached to a store lease (annotation `lattice.dev/store-lease`) with the heartbeat
//! timeout as TTL: while that Lease exists the node is heard from, and when the store
//! deletes it the node has been silent for a whole timeout. Leases renewed by writing
//! (no store lease; older agents, tests, site tools) are judged by this controller's own
//! monotonic clock from when it last *saw* the lease change, never by comparing the
//! agent's timestamps with ours (no clock-skew assumption). After a restart or leader
//! change every node without a Lease gets a full timeout again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lattice_apis::meta::now;
use lattice_apis::{lifecycle, Allocation, Lease, Node, NodeState, STORE_LEASE_ANNOTATION};
use lattice_runtime::informer::{InformerEvent, InformerParams};
use lattice_runtime::reflector::Store;
use lattice_runtime::{Action, Api, HostContext, ObjectRef, Patch, PatchParams, ResourceExt};
use serde_json::json;

use crate::metrics::{ControllerMetrics, StateLabel};

/// Namespace of the agents' heartbeat leases.
pub const NODE_LEASE_NAMESPACE: &str = lattice_apis::NODE_LEASE_NAMESPACE;

/// Timeouts (the seed's defaults: 30 s + 60 s, sensitive 5 min grace).
#[derive(Debug, Clone, Copy)]
pub struct NodeLifecycleConfig {
    /// No heartbeat for this long → Degraded.
    pub heartbeat_timeout: Duration,
    /// Degraded for this long → Down.
    pub grace_period: Duration,
    /// Grace period of sensitive nodes.
    pub sensitive_grace_period: Duration,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        Self {
            heartbeat_timeout: Duration::from_secs(30),
            grace_period: Duration::from_secs(60),
            sensitive_grace_period: Duration::from_secs(300),
        }
    }
}

/// What this controller last saw of a node's heartbeat Lease.
struct Seen {
    /// resourceVersion of the Lease when `at` was taken.
    rv: String,
    /// When it changed (renew-by-write Leases), or since when the node has been silent
    /// (a stream Lease that the store deleted).
    at: Instant,
    /// A stream Lease exists: the node is heard from now.
    live: bool,
}

/// What this controller saw of every node's heartbeat Lease.
#[derive(Default)]
struct Heartbeats {
    seen: HashMap<String, Seen>,
}

impl Heartbeats {
    /// A Lease was created or changed.
    fn applied(&mut self, l: &Lease) {
        let rv = l.resource_version().unwrap_or_default();
        let live = l.metadata.annotations.contains_key(STORE_LEASE_ANNOTATION);
        let e = self.seen.entry(l.name_any().to_string()).or_insert(Seen {
            rv: String::new(),
            at: Instant::now(),
            live,
        });
        if e.rv != rv || e.live != live {
            *e = Seen {
                rv: rv.to_string(),
                at: Instant::now(),
                live,
            };
        }
    }

    /// A stream Lease is gone: its store lease expired, so the node has been silent
    /// for a whole timeout already.
    fn deleted(&mut self, name: &str, timeout: Duration) {
        if let Some(e) = self.seen.get_mut(name) {
            if e.live {
                e.live = false;
                e.at = Instant::now().checked_sub(timeout).unwrap_or(e.at);
            }
        }
    }
}

struct Ctx {
    config: NodeLifecycleConfig,
    started: Instant,
    heartbeats: Arc<Mutex<Heartbeats>>,
    leases: Store<Lease>,
    nodes: Api<Node>,
    allocations_api: Api<Allocation>,
    allocations: Store<Allocation>,
    metrics: ControllerMetrics,
}

/// Register the node lifecycle controller.
pub fn register(
    host: &mut lattice_runtime::ControllerHost,
    config: NodeLifecycleConfig,
    metrics: ControllerMetrics,
) {
    host.register("node-lifecycle", move |hc: HostContext| {
        let metrics = metrics.clone();
        async move {
            let lease_params = InformerParams {
                namespace: Some(NODE_LEASE_NAMESPACE.into()),
                ..Default::default()
            };
            let leases = hc.factory.informer::<Lease>(&lease_params);
            let heartbeats = Arc::new(Mutex::new(Heartbeats::default()));
            // Record when each lease changes, as it happens (the controller's queue may
            // lag; the observation time must not).
            let mut rx = leases.subscribe();
            let lease_store = leases.store();
            let lease_cache = leases.store();
            let hb = heartbeats.clone();
            let recorder = tokio::spawn(async move {
                loop {
                    match rx.recv().await {
                        Ok(InformerEvent::Applied(l)) => {
                            if let Ok(mut g) = hb.lock() {
                                g.applied(&l);
                            }
                        }
                        Ok(InformerEvent::Deleted(l)) => {
                            if let Ok(mut g) = hb.lock() {
                                g.deleted(l.name_any(), config.heartbeat_timeout);
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            // Missed changes: compare every cached lease with what we saw.
                            if let Ok(mut g) = hb.lock() {
                                let cached = lease_store.state();
                                for l in &cached {
                                    g.applied(l);
                                }
                                let names: std::collections::HashSet<&str> =
                                    cached.iter().map(|l| l.name_any()).collect();
                                let gone: Vec<String> = g
                                    .seen
                                    .keys()
                                    .filter(|n| !names.contains(n.as_str()))
                                    .cloned()
                                    .collect();
                                for n in gone {
                                    g.deleted(&n, config.heartbeat_timeout);
                                }
                            }
                        }
                        Err(_) => break,
                    }
                }
            });
            let _recorder = crate::AbortOnDrop(recorder);
            let ctx = Arc::new(Ctx {
                config,
                started: Instant::now(),
                heartbeats,
                leases: lease_cache,
                nodes: Api::all(hc.client.clone()),
                allocations_api: Api::all(hc.client.clone()),
                allocations: hc.factory.all::<Allocation>().store(),
                metrics,
            });
            hc.controller::<Node>()
                .watches::<Lease, _>(&lease_params, |l| {
                    vec![ObjectRef::new::<Node>(None, l.name_any())]
                })
                .watches::<Allocation, _>(&InformerParams::default(), |a| {
                    // A Draining node becomes Drained when its last allocation ends.
                    if a.phase().is_terminal() {
                        a.status
                            .as_ref()
                            .map(|s| {
                                s.assigned_nodes
                                    .iter()
                                    .map(|n| ObjectRef::new::<Node>(None, n))
                                    .collect()
                            })
                            .unwrap_or_default()
                    } else {
                        Vec::new()
                    }
                })
                .run(reconcile, ctx)
                .await;
        }
    });
}

/// The state a node should be in, and when to look again.
fn desired(
    node: &Node,
    silent_for: Duration,
    cfg: &NodeLifecycleConfig,
) -> (NodeState, Option<Duration>, &'static str) {
    let current = node.status.as_ref().map(|s| s.state).unwrap_or_default();
    let owned = node
        .status
        .as_ref()
        .and_then(|s| s.owner.as_ref())
        .is_some_and(|o| o.allocation.is_some());
    if node.spec.disabled {
        return (NodeState::Down, None, "Disabled");
    }
    let grace = if node.spec.sensitive {
        cfg.sensitive_grace_period
    } else {
        cfg.grace_period
    };
    if current == NodeState::Unknown
        || current == NodeState::Booting
        || current == NodeState::Failed
    {
        // Not registered by an agent yet (or being provisioned): nothing to judge.
        return (current, None, "");
    }
    if silent_for >= cfg.heartbeat_timeout + grace {
        return (NodeState::Down, None, "HeartbeatLost");
    }
    if silent_for >= cfg.heartbeat_timeout {
        let wake = cfg.heartbeat_timeout + grace - silent_for;
        return (NodeState::Degraded, Some(wake), "HeartbeatLate");
    }
    let wake = Some(cfg.heartbeat_timeout - silent_for);
    if node.spec.drain.is_some() {
        if owned {
            return (NodeState::Draining, wake, "DrainRequested");
        }
        return (NodeState::Drained, wake, "Drained");
    }
    (NodeState::Ready, wake, "HeartbeatOk")
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, lattice_runtime::Error> {
    let name = node.name_any().to_string();
    let (silent_for, live) = {
        let mut g = ctx
            .heartbeats
            .lock()
            .map_err(|_| lattice_runtime::Error::Request("poisoned".into()))?;
        // The informer cache is the truth; the recorder may not have caught up with it.
        match ctx.leases.get_named(Some(NODE_LEASE_NAMESPACE), &name) {
            Some(l) => g.applied(&l),
            None => g.deleted(&name, ctx.config.heartbeat_timeout),
        }
        let current = node.status.as_ref().map(|s| s.state).unwrap_or_default();
        match g.seen.get(&name) {
            Some(seen) if seen.live => (Duration::ZERO, true),
            Some(seen) => (seen.at.elapsed(), false),
            // Never seen since this controller started (a restart or a new leader): a
            // node already known to be silent stays so (only a Lease brings it back);
            // any other counts from our start.
            None => match current {
                NodeState::Down => (
                    ctx.config.heartbeat_timeout
                        + ctx
                            .config
                            .grace_period
                            .max(ctx.config.sensitive_grace_period),
                    false,
                ),
                NodeState::Degraded => {
                    (ctx.config.heartbeat_timeout + ctx.started.elapsed(), false)
                }
                _ => (ctx.started.elapsed(), false),
            },
        }
    };
    let current = node.status.as_ref().map(|s| s.state).unwrap_or_default();
    let (want, wake, why) = desired(&node, silent_for, &ctx.config);
    if want != current {
        // Undrain only from Drained (the seed); a drain request on a node that is Down
        // waits for it to come back.
        // An idle node asked to drain is Drained at once (the seed: "If no active
        // allocations, node goes directly to Drained").
        let allowed = current.can_transition_to(want)
            || (want == NodeState::Drained
                && matches!(
                    current,
                    NodeState::Ready | NodeState::Degraded | NodeState::Down
                ));
        if allowed {
            let msg = match why {
                "HeartbeatLost" => format!(
                    "no heartbeat for {}s (timeout {}s + grace)",
                    silent_for.as_secs(),
                    ctx.config.heartbeat_timeout.as_secs()
                ),
                "HeartbeatLate" => format!("heartbeat late by {}s", silent_for.as_secs()),
                _ => String::new(),
            };
            // When the node was last heard from, as well as this controller can tell.
            let heard = now()
                - chrono::Duration::from_std(silent_for)
                    .unwrap_or_else(|_| chrono::Duration::zero());
            let patch = Patch::Merge(json!({"status": {
                "state": want,
                "reason": why,
                "message": if msg.is_empty() { serde_json::Value::Null } else { json!(msg) },
                "lastTransitionTime": now(),
                "lastHeartbeatTime": heard,
            }}));
            ctx.nodes
                .patch_status(&name, &PatchParams::default(), &patch)
                .await?;
            ctx.metrics
                .node_transitions
                .get_or_create(&StateLabel {
                    state: format!("{want:?}"),
                })
                .inc();
            tracing::info!(node = %name, from = ?current, to = ?want, reason = why, "node state");
        }
    }
    if want == NodeState::Down {
        fail_allocations(&ctx, &name).await?;
    }
    Ok(match wake {
        // A live stream Lease needs no timer: its deletion wakes this node up.
        Some(_) if live => Action::await_change(),
        Some(d) => Action::requeue(d + Duration::from_millis(50)),
        None => Action::await_change(),
    })
}

/// Requeue or fail (per policy) every live allocation bound to a Down node.
async fn fail_allocations(ctx: &Ctx, node: &str) -> Result<(), lattice_runtime::Error> {
    for a in ctx.allocations.by_node(node) {
        if a.phase().is_terminal() {
            continue;
        }
        let api = ctx.allocations_api.for_obj(&a);
        let res = api
            .update_status_with_retry(a.name_any(), 5, |cur| {
                lifecycle::node_failed(cur, node, now())
            })
            .await;
        match res {
            Ok(after) => {
                ctx.metrics.node_failures.inc();
                tracing::warn!(allocation = %a.object_ref(), node, phase = %after.phase(), "node Down: allocation requeued or failed");
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
