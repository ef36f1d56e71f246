//! The allocation controller: what happens to an allocation before it is bound.
//!
//! * a cancel request on an unbound allocation cancels it at once (a bound one is
//!   stopped by its agents, see `lattice_apis::lifecycle`);
//! * `spec.dependsOn` on other allocations (by name, in the same tenant): the allocation
//!   stays out of the queue (reason `waiting_for_dependencies`) until every dependency
//!   holds — then the condition `DependenciesMet` is set and the scheduler sees it — or is
//!   cancelled with reason `dependency_never_satisfied` when one never can.
//!
//! Level-triggered: every decision is recomputed from the cached objects; dependents are
//! woken when an allocation they depend on changes.

use std::sync::Arc;

use lattice_apis::lifecycle::{self, reason};
use lattice_apis::meta::{now, set_condition, Condition, ConditionStatus};
use lattice_apis::{Allocation, AllocationPhase, DependencyCondition};
use lattice_runtime::informer::InformerParams;
use lattice_runtime::reflector::Store;
use lattice_runtime::{Action, Api, HostContext, ObjectRef, ResourceExt};

/// Annotation with the reason of a cancellation made by a controller (e.g. a DAG's
/// failure propagation); users' cancels have none.
pub const CANCEL_REASON_ANNOTATION: &str = "lattice.dev/cancel-reason";
/// Condition set when every dependency holds.
pub const DEPENDENCIES_MET: &str = "DependenciesMet";

/// Whether the condition `DependenciesMet` is true.
pub fn dependencies_met(a: &Allocation) -> bool {
    a.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == DEPENDENCIES_MET && c.status == ConditionStatus::True)
    })
}

fn unbound(a: &Allocation) -> bool {
    a.status.as_ref().is_none_or(|s| {
        matches!(
            s.phase,
            AllocationPhase::Pending | AllocationPhase::Suspended
        ) && s.assigned_nodes.is_empty()
    })
}

/// How one dependency stands.
#[derive(Debug, PartialEq, Eq)]
enum DepState {
    Holds,
    Waiting(String),
    Never(String),
}

fn dependency_state(
    store: &Store<Allocation>,
    ns: Option<&str>,
    d: &lattice_apis::Dependency,
) -> DepState {
    let Some(dep) = store.get_named(ns, &d.ref_) else {
        return DepState::Waiting(format!("{} (not found yet)", d.ref_));
    };
    let phase = dep.phase();
    let cond = match d.condition {
        DependencyCondition::Success | DependencyCondition::Corresponding => "success",
        DependencyCondition::Failure => "failure",
        DependencyCondition::Any => "any",
    };
    if !phase.is_terminal() {
        return DepState::Waiting(format!("{} ({cond})", d.ref_));
    }
    let holds = match d.condition {
        DependencyCondition::Success | DependencyCondition::Corresponding => {
            phase == AllocationPhase::Completed
        }
        DependencyCondition::Failure => phase == AllocationPhase::Failed,
        DependencyCondition::Any => true,
    };
    if holds {
        DepState::Holds
    } else {
        DepState::Never(format!("{} ({cond}) ended {phase}", d.ref_))
    }
}

struct Ctx {
    api: Api<Allocation>,
    store: Store<Allocation>,
}

/// Register the allocation controller.
pub fn register(host: &mut lattice_runtime::ControllerHost) {
    host.register("allocations", |hc: HostContext| async move {
        let controller = hc.controller::<Allocation>();
        let store = controller.store();
        let dependents = store.clone();
        let ctx = Arc::new(Ctx {
            api: Api::all(hc.client.clone()),
            store,
        });
        controller
            .watches::<Allocation, _>(&InformerParams::default(), move |changed| {
                // Wake the allocations that depend on this one (only when it ended:
                // nothing else can change a dependency's state).
                if !changed.phase().is_terminal() {
                    return Vec::new();
                }
                let ns = changed.namespace().map(str::to_string);
                let name = changed.name_any().to_string();
                dependents
                    .find(|a| {
                        a.namespace().map(str::to_string) == ns
                            && a.spec.depends_on.iter().any(|d| d.ref_ == name)
                            && !a.phase().is_terminal()
                    })
                    .iter()
                    .map(|a| ObjectRef::from_obj(a.as_ref()))
                    .collect()
            })
            .run(reconcile, ctx)
            .await;
    });
}

async fn reconcile(a: Arc<Allocation>, ctx: Arc<Ctx>) -> Result<Action, lattice_runtime::Error> {
    let api = ctx.api.for_obj(&a);
    if a.is_deleting() {
        return release_finalizer(&api, &a).await;
    }
    if a.phase().is_terminal() || !unbound(&a) {
        return Ok(Action::await_change());
    }
    if lifecycle::cancel_requested(&a) {
        let why = a
            .metadata
            .annotations
            .get(CANCEL_REASON_ANNOTATION)
            .cloned();
        api.update_status_with_retry(a.name_any(), 5, |cur| {
            if cur.phase().is_terminal() || !unbound(cur) {
                return false;
            }
            let st = cur.status.get_or_insert_with(Default::default);
            st.phase = AllocationPhase::Cancelled;
            st.reason = Some(reason::CANCELLED.into());
            st.message = Some(
                why.clone()
                    .unwrap_or_else(|| "cancelled before it started".into()),
            );
            st.end_time = Some(now());
            true
        })
        .await?;
        tracing::info!(allocation = %a.object_ref(), "cancelled (never started)");
        return Ok(Action::await_change());
    }
    if a.spec.depends_on.is_empty() || dependencies_met(&a) {
        return Ok(Action::await_change());
    }
    let mut waiting = Vec::new();
    let mut never = Vec::new();
    for d in &a.spec.depends_on {
        match dependency_state(&ctx.store, a.namespace(), d) {
            DepState::Holds => {}
            DepState::Waiting(w) => waiting.push(w),
            DepState::Never(n) => never.push(n),
        }
    }
    if !never.is_empty() {
        let msg = format!("dependency can never be satisfied: {}", never.join(", "));
        api.update_status_with_retry(a.name_any(), 5, |cur| {
            if cur.phase().is_terminal() || !unbound(cur) {
                return false;
            }
            let st = cur.status.get_or_insert_with(Default::default);
            st.phase = AllocationPhase::Cancelled;
            st.reason = Some(reason::DEPENDENCY_NEVER_SATISFIED.into());
            st.message = Some(msg.clone());
            st.end_time = Some(now());
            set_condition(
                &mut st.conditions,
                Condition::new(
                    DEPENDENCIES_MET,
                    ConditionStatus::False,
                    "NeverSatisfied",
                    &msg,
                ),
            );
            true
        })
        .await?;
        tracing::info!(allocation = %a.object_ref(), %msg, "cancelled");
        return Ok(Action::await_change());
    }
    let (status, why, msg) = if waiting.is_empty() {
        (ConditionStatus::True, "AllSatisfied", String::new())
    } else {
        (
            ConditionStatus::False,
            "Waiting",
            format!("waiting for dependencies: {}", waiting.join(", ")),
        )
    };
    api.update_status_with_retry(a.name_any(), 5, |cur| {
        if cur.phase().is_terminal() || !unbound(cur) {
            return false;
        }
        let st = cur.status.get_or_insert_with(Default::default);
        let before = st.clone();
        set_condition(
            &mut st.conditions,
            Condition::new(DEPENDENCIES_MET, status, why, &msg),
        );
        if status == ConditionStatus::True {
            if st.reason.as_deref() == Some(reason::WAITING_FOR_DEPENDENCIES) {
                st.reason = None;
                st.message = None;
            }
        } else {
            st.reason = Some(reason::WAITING_FOR_DEPENDENCIES.into());
            st.message = Some(msg.clone());
        }
        *st != before
    })
    .await?;
    Ok(Action::await_change())
}

/// A deleted allocation keeps `lattice.dev/nodes` until no node runs its processes any
/// more (its agents stop it: deletion counts as a cancel); then the finalizer goes, with a
/// patch guarded by a `test` of the entry, and the release controller frees the nodes.
async fn release_finalizer(
    api: &Api<Allocation>,
    a: &Allocation,
) -> Result<Action, lattice_runtime::Error> {
    let Some(i) = a
        .metadata
        .finalizers
        .iter()
        .position(|f| f == lifecycle::NODES_FINALIZER)
    else {
        return Ok(Action::await_change());
    };
    if !lifecycle::processes_gone(a) {
        return Ok(Action::await_change());
    }
    let patch = lattice_runtime::Patch::Json(serde_json::json!([
        {"op": "test", "path": format!("/metadata/finalizers/{i}"), "value": lifecycle::NODES_FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{i}")},
    ]));
    match api
        .patch(
            a.name_any(),
            &lattice_runtime::PatchParams::default(),
            &patch,
        )
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(e) if e.is_not_found() || e.is_patch_test_failed() => Ok(Action::await_change()),
        Err(e) => Err(e),
    }
}
