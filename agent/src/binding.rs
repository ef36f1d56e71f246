//! The agent runs only what the scheduler bound to its node.
//!
//! An allocation's `status.assignedNodes` is what the agent watches, but it is not proof
//! of a binding: a status written past the API server's checks, or a store written
//! behind it, could name any node. The proof is the node's own `status.owner`, which the
//! scheduler writes in the same transaction as the binding (and a scale-up in the same
//! transaction as the appended node; ADR-002), and which only a release clears — after
//! this node confirmed that the owner's processes are gone. So before it starts
//! anything the agent checks that its Node's owner is exactly this allocation: tenant,
//! name, uid, binding attempt and user. A job step (`spec.stepOf`) has no ownership of
//! its own: the owner must be its allocation (by the step's controller reference and
//! the allocation attempt the step controller recorded), in the same tenant, for the
//! same user.
//!
//! The check reads the Node from the agent's watch of it first; since that watch may
//! lag the allocation's, a mismatch is confirmed on fresh reads of the Node and then of
//! the allocation. A legitimately bound allocation always matches the Node read after
//! it (the ownership was written with or before the binding, and is cleared only once
//! the allocation no longer wants this node for this attempt); when the fresh
//! allocation no longer wants this node, the event was stale and nothing is reported.
//! What remains is refused: reported `Failed` with reason `NotBound` on this
//! allocation's own entry, with nothing started, and the node's owner left alone.

use std::time::Duration;

use lattice_apis::kinds::node::NodeOwner;
use lattice_apis::lifecycle::{should_run, RunDecision};
use lattice_apis::{Allocation, Node};
use lattice_runtime::Api;

use crate::agent::Ctx;
use crate::policy::USER_ANNOTATION;

/// Annotation on a bound job step: its allocation's attempt (written by the step
/// controller when it binds the step).
pub use lattice_apis::wellknown::STEP_PARENT_ATTEMPT_ANNOTATION;

/// The outcome of [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The node is this allocation's: run it.
    Bound,
    /// The allocation no longer wants this node for this attempt: do nothing.
    Stale,
    /// Not bound here: refuse, with this message.
    NotBound(String),
    /// The API could not be read to decide (the run fails to start, and is retried
    /// elsewhere by the requeue policy).
    Unknown(String),
}

/// The owner the node must have for `a` to run on it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expected<'a> {
    tenant: &'a str,
    allocation: &'a str,
    uid: &'a str,
    attempt: u32,
    user: Option<&'a str>,
}

fn expected(a: &Allocation) -> Result<Expected<'_>, String> {
    let m = &a.metadata;
    let user = m.annotations.get(USER_ANNOTATION).map(String::as_str);
    let tenant = m.namespace_str();
    let Some(parent) = a.spec.step_of.as_deref() else {
        return Ok(Expected {
            tenant,
            allocation: m.name_str(),
            uid: m.uid.as_deref().unwrap_or_default(),
            attempt: a.status.as_ref().map_or(0, |s| s.attempt),
            user,
        });
    };
    let Some(r) = m
        .owner_references
        .iter()
        .find(|o| o.kind == "Allocation" && o.name == parent && o.controller == Some(true))
    else {
        return Err(format!(
            "the job step has no controller reference to its allocation {parent}"
        ));
    };
    let Some(attempt) = m
        .annotations
        .get(STEP_PARENT_ATTEMPT_ANNOTATION)
        .and_then(|v| v.parse::<u32>().ok())
    else {
        return Err(format!(
            "the job step was not bound by the step controller (no {STEP_PARENT_ATTEMPT_ANNOTATION} annotation)"
        ));
    };
    Ok(Expected {
        tenant,
        allocation: parent,
        uid: &r.uid,
        attempt,
        user,
    })
}

fn describe(o: &NodeOwner) -> String {
    match (&o.tenant, &o.allocation) {
        (Some(t), Some(a)) => format!(
            "allocation {t}/{a} (uid {}, attempt {}, user {})",
            o.allocation_uid.as_deref().unwrap_or("?"),
            o.attempt.map_or("?".to_string(), |n| n.to_string()),
            o.user.as_deref().unwrap_or("none")
        ),
        _ => "nobody".into(),
    }
}

/// Whether `node` (as read) is owned by `a` — for a job step, by its allocation, in the
/// same tenant, for the same user. `Err` says how it differs.
pub fn owned_by(node: &Node, a: &Allocation) -> Result<(), String> {
    let name = node.metadata.name_str();
    let want = expected(a)?;
    let owner = node
        .status
        .as_ref()
        .and_then(|s| s.owner.clone())
        .unwrap_or_default();
    let matches = owner.tenant.as_deref() == Some(want.tenant)
        && owner.allocation.as_deref() == Some(want.allocation)
        && owner.allocation_uid.as_deref() == Some(want.uid)
        && !want.uid.is_empty()
        && owner.attempt == Some(want.attempt)
        && owner.user.as_deref() == want.user;
    if matches {
        return Ok(());
    }
    let wanted = NodeOwner {
        tenant: Some(want.tenant.into()),
        allocation: Some(want.allocation.into()),
        allocation_uid: Some(want.uid.into()),
        attempt: Some(want.attempt),
        user: want.user.map(String::from),
        ..Default::default()
    };
    Err(format!(
        "node {name}'s status.owner is {}, not {}{}",
        describe(&owner),
        describe(&wanted),
        if a.spec.step_of.is_some() {
            " (this job step's allocation)"
        } else {
            ""
        }
    ))
}

/// Read with a few retries; `Err` once the API stayed unreachable.
async fn read<T, F, Fut>(what: &str, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = lattice_runtime::Result<T>>,
{
    let mut delay = Duration::from_millis(200);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if delay < Duration::from_secs(10) => {
                tracing::warn!(error = %e, "cannot read {what}; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => return Err(format!("cannot read {what} to check the binding: {e}")),
        }
    }
}

/// Whether `a` (as seen by the dispatcher) is bound to this node (see the module docs).
pub async fn verify(ctx: &Ctx, a: &Allocation) -> Check {
    let cached = ctx.node.borrow().clone();
    if cached.is_some_and(|n| owned_by(&n, a).is_ok()) {
        return Check::Bound;
    }
    let node_name = ctx.cfg.node.clone();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = match read(&format!("node {node_name}"), || nodes.get_opt(&node_name)).await {
        Ok(n) => n.unwrap_or_default(),
        Err(e) => return Check::Unknown(e),
    };
    let why = match owned_by(&node, a) {
        Ok(()) => return Check::Bound,
        Err(why) => why,
    };
    let (ns, name) = (a.metadata.namespace_str(), a.metadata.name_str());
    let allocs: Api<Allocation> = Api::namespaced(ctx.client.clone(), ns);
    let fresh = match read(&format!("allocation {ns}/{name}"), || allocs.get_opt(name)).await {
        Ok(f) => f,
        Err(e) => return Check::Unknown(e),
    };
    let attempt = a.status.as_ref().map_or(0, |s| s.attempt);
    let still_wanted = fresh.as_ref().is_some_and(|f| {
        f.metadata.uid == a.metadata.uid && should_run(f, &node_name, attempt) == RunDecision::Run
    });
    if !still_wanted {
        return Check::Stale;
    }
    Check::NotBound(format!(
        "{why}: the scheduler did not bind it to this node, so the agent started nothing"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::meta::OwnerReference;
    use lattice_apis::{AllocationStatus, NodeStatus};

    fn alloc(name: &str, uid: &str, attempt: u32, user: &str) -> Allocation {
        let mut a = Allocation::default();
        a.metadata.name = Some(name.into());
        a.metadata.namespace = Some("ml".into());
        a.metadata.uid = Some(uid.into());
        a.metadata
            .annotations
            .insert(USER_ANNOTATION.into(), user.into());
        a.status = Some(AllocationStatus {
            attempt,
            assigned_nodes: vec!["n1".into()],
            ..Default::default()
        });
        a
    }

    fn node(owner: Option<NodeOwner>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.status = Some(NodeStatus {
            owner,
            ..Default::default()
        });
        n
    }

    fn owner(tenant: &str, name: &str, uid: &str, attempt: u32, user: &str) -> NodeOwner {
        NodeOwner {
            tenant: Some(tenant.into()),
            allocation: Some(name.into()),
            allocation_uid: Some(uid.into()),
            attempt: Some(attempt),
            user: Some(user.into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_owner_must_be_this_allocations_attempt() {
        let a = alloc("job", "u1", 2, "alice");
        assert!(owned_by(&node(Some(owner("ml", "job", "u1", 2, "alice"))), &a).is_ok());
        for (o, what) in [
            (None, "nobody"),
            (Some(owner("ml", "job", "u1", 1, "alice")), "attempt 1"),
            (Some(owner("ml", "job", "u0", 2, "alice")), "uid u0"),
            (Some(owner("ml", "other", "u1", 2, "alice")), "ml/other"),
            (Some(owner("ai", "job", "u1", 2, "alice")), "ai/job"),
            (Some(owner("ml", "job", "u1", 2, "bob")), "user bob"),
        ] {
            let e = owned_by(&node(o), &a).unwrap_err();
            assert!(e.starts_with("node n1's status.owner is "), "{e}");
            assert!(e.contains(what), "{what}: {e}");
            assert!(
                e.contains("not allocation ml/job (uid u1, attempt 2, user alice)"),
                "{e}"
            );
        }
        // An allocation without a uid matches nothing.
        let mut nouid = a.clone();
        nouid.metadata.uid = None;
        assert!(owned_by(&node(Some(owner("ml", "job", "", 2, "alice"))), &nouid).is_err());
    }

    fn step(user: &str, parent_uid: &str, parent_attempt: Option<&str>) -> Allocation {
        let mut s = alloc("job.1", "s1", 1, user);
        s.spec.step_of = Some("job".into());
        s.metadata.owner_references.push(OwnerReference {
            api_version: lattice_apis::API_VERSION.into(),
            kind: "Allocation".into(),
            name: "job".into(),
            uid: parent_uid.into(),
            controller: Some(true),
            ..Default::default()
        });
        if let Some(p) = parent_attempt {
            s.metadata
                .annotations
                .insert(STEP_PARENT_ATTEMPT_ANNOTATION.into(), p.into());
        }
        s
    }

    #[test]
    fn a_step_runs_where_its_allocation_owns_the_node_for_the_same_user() {
        let n = node(Some(owner("ml", "job", "u1", 3, "alice")));
        assert!(owned_by(&n, &step("alice", "u1", Some("3"))).is_ok());
        let e = owned_by(&n, &step("mallory", "u1", Some("3"))).unwrap_err();
        assert!(
            e.contains("user mallory") && e.ends_with("(this job step's allocation)"),
            "{e}"
        );
        assert!(
            owned_by(&n, &step("alice", "u9", Some("3"))).is_err(),
            "another allocation"
        );
        assert!(
            owned_by(&n, &step("alice", "u1", Some("2"))).is_err(),
            "an earlier attempt"
        );
        let e = owned_by(&n, &step("alice", "u1", None)).unwrap_err();
        assert!(e.contains("not bound by the step controller"), "{e}");
        let mut orphan = step("alice", "u1", Some("3"));
        orphan.metadata.owner_references.clear();
        assert!(owned_by(&n, &orphan)
            .unwrap_err()
            .contains("no controller reference"));
        // In another tenant the same names are another allocation.
        let mut elsewhere = step("alice", "u1", Some("3"));
        elsewhere.metadata.namespace = Some("ai".into());
        assert!(owned_by(&n, &elsewhere).is_err());
    }
}
