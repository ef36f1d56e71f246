//! The task-group controller (job arrays: `--task-group=0-99%20`, `#SBATCH --array`):
//! an Allocation with `spec.taskGroup` is a *parent* that is never scheduled itself. Its
//! elements `<parent>-<index>` (labels `lattice.dev/task-group`, `lattice.dev/task-index`,
//! owned by the parent) are created lazily so that at most `concurrency` are pending or
//! running at once; the parent's status aggregates them (`status.tasks`, shown as `1×20`).
//!
//! The parent's `dependsOn` holds the whole array (no element is created before it is
//! met), except `corresponding` (Slurm `aftercorr`): each element carries those entries
//! and the allocation controller evaluates them for the element's own index (element
//! *i* waits for element *i* of the other array, and is cancelled if that one fails).
//!
//! Elements of a DAG step that is a task group are created by the DAG controller instead
//! (its engine handles `corresponding` edges per index).

use std::collections::BTreeSet;
use std::sync::Arc;

use lattice_apis::lifecycle::{self, reason, CANCEL_ANNOTATION};
use lattice_apis::meta::now;
use lattice_apis::{
    Allocation, AllocationPhase, DependencyCondition, DependencyKind, ObjectMeta, TaskGroupStatus,
    TaskRange,
};
use lattice_runtime::reflector::Store;
use lattice_runtime::{Action, Api, HostContext, Patch, PatchParams, PostParams, ResourceExt};
use serde_json::json;

use crate::allocations::{dependencies_met, CANCEL_REASON_ANNOTATION};
use crate::dag::{DAG_LABEL, TASK_GROUP_LABEL};
use crate::scheduler::adapter::{HOLD_ANNOTATION, TASK_INDEX_LABEL};

struct Ctx {
    api: Api<Allocation>,
    store: Store<Allocation>,
}

/// Whether `a` is the parent of a job array (not an element, not a DAG step group).
pub fn is_parent(a: &Allocation) -> bool {
    a.spec.task_group.is_some()
        && !a.labels().contains_key(TASK_INDEX_LABEL)
        && !a.labels().contains_key(DAG_LABEL)
}

/// Register the task-group controller.
pub fn register(host: &mut lattice_runtime::ControllerHost) {
    host.register("task-groups", |hc: HostContext| async move {
        let controller = hc.controller::<Allocation>();
        let ctx = Arc::new(Ctx {
            api: Api::all(hc.client.clone()),
            store: controller.store(),
        });
        // Elements are Allocations owned by an Allocation: `owns` maps them to the parent.
        // Only parents are reconciled (anything else is a no-op there), so the rest of
        // the allocations need not wake this controller.
        controller
            .filter(is_parent)
            .owns::<Allocation>()
            .run(reconcile, ctx)
            .await;
    });
}

async fn reconcile(
    parent: Arc<Allocation>,
    ctx: Arc<Ctx>,
) -> Result<Action, lattice_runtime::Error> {
    if !is_parent(&parent) || parent.is_deleting() {
        return Ok(Action::await_change());
    }
    let Some(tg) = parent.spec.task_group.as_ref() else {
        return Ok(Action::await_change());
    };
    let Ok(range) = TaskRange::parse(&tg.range) else {
        return Ok(Action::await_change()); // admission rejects bad ranges
    };
    let indices = range.indices();
    let concurrency = tg
        .concurrency
        .map(|c| c.max(1) as usize)
        .unwrap_or(indices.len());
    let uid = parent.uid().unwrap_or_default();
    let children = ctx.store.by_owner_uid(uid);
    let api = ctx.api.for_obj(&parent);

    let mut counts = TaskGroupStatus {
        total: indices.len() as u64,
        ..Default::default()
    };
    let mut created = BTreeSet::new();
    let mut active = 0usize;
    for c in &children {
        let Some(i) = c
            .labels()
            .get(TASK_INDEX_LABEL)
            .and_then(|i| i.parse::<u64>().ok())
        else {
            continue;
        };
        created.insert(i);
        match c.phase() {
            AllocationPhase::Completed => counts.completed += 1,
            AllocationPhase::Failed => counts.failed += 1,
            AllocationPhase::Cancelled => counts.cancelled += 1,
            AllocationPhase::Pending => {
                counts.pending += 1;
                active += 1;
            }
            _ => {
                counts.running += 1;
                active += 1;
            }
        }
    }
    let cancel = lifecycle::cancel_requested(&parent);
    if cancel {
        for c in &children {
            if !c.phase().is_terminal() && !lifecycle::cancel_requested(c) {
                let patch = Patch::Merge(json!({"metadata": {"annotations": {
                    CANCEL_ANNOTATION: "true",
                    CANCEL_REASON_ANNOTATION: "the task group was cancelled",
                }}}));
                api.patch(c.name_any(), &PatchParams::default(), &patch)
                    .await?;
            }
        }
    }
    let held = parent.metadata.annotations.contains_key(HOLD_ANNOTATION)
        || (!parent.spec.depends_on.is_empty() && !dependencies_met(&parent));
    let mut to_create = if cancel || held {
        0
    } else {
        concurrency.saturating_sub(active)
    };
    for &i in &indices {
        if to_create == 0 {
            break;
        }
        if created.contains(&i) {
            continue;
        }
        create_element(&api, &parent, i).await?;
        created.insert(i);
        counts.pending += 1;
        to_create -= 1;
    }
    let never_created = (indices.len() - created.len()) as u64;
    if cancel {
        // A cancelled array never creates the rest: they count as cancelled.
        counts.cancelled += never_created;
    } else {
        counts.pending += never_created;
    }

    let done = counts.completed + counts.failed + counts.cancelled;
    let all_done = done == counts.total;
    let phase = if all_done && counts.cancelled > 0 && cancel {
        AllocationPhase::Cancelled
    } else if all_done && counts.failed + counts.cancelled > 0 {
        AllocationPhase::Failed
    } else if all_done {
        AllocationPhase::Completed
    } else if counts.running > 0 || done > 0 {
        AllocationPhase::Running
    } else {
        AllocationPhase::Pending
    };
    api.update_status_with_retry(parent.name_any(), 5, |cur| {
        let st = cur.status.get_or_insert_with(Default::default);
        if st.phase.is_terminal() {
            return false;
        }
        let before = st.clone();
        st.tasks = Some(counts.clone());
        st.phase = phase;
        if phase.is_terminal() {
            st.end_time = Some(now());
            st.reason = Some(
                match phase {
                    AllocationPhase::Completed => reason::COMPLETED,
                    AllocationPhase::Cancelled => reason::CANCELLED,
                    _ => reason::NON_ZERO_EXIT,
                }
                .into(),
            );
            st.message = Some(format!(
                "{} of {} tasks completed, {} failed, {} cancelled",
                counts.completed, counts.total, counts.failed, counts.cancelled
            ));
            st.exit_code = Some(if counts.failed > 0 { 1 } else { 0 });
        } else if phase == AllocationPhase::Running && st.start_time.is_none() {
            st.start_time = Some(now());
        }
        *st != before
    })
    .await?;
    Ok(Action::await_change())
}

async fn create_element(
    api: &Api<Allocation>,
    parent: &Allocation,
    i: u64,
) -> Result<(), lattice_runtime::Error> {
    let name = format!("{}-{i}", parent.name_any());
    let mut meta = ObjectMeta::named(&name, parent.namespace());
    meta.labels = parent.labels().clone();
    meta.labels
        .insert(TASK_GROUP_LABEL.into(), parent.name_any().to_string());
    meta.labels.insert(TASK_INDEX_LABEL.into(), i.to_string());
    for (k, v) in &parent.metadata.annotations {
        if k.starts_with("lattice.dev/") && k != CANCEL_ANNOTATION && k != HOLD_ANNOTATION {
            meta.annotations.insert(k.clone(), v.clone());
        }
    }
    if let Some(o) = parent.owner_ref(true) {
        meta.owner_references.push(o);
    }
    let mut spec = parent.spec.task_element(i);
    // Per-index dependencies stay on the element; the others held the whole array.
    spec.depends_on.retain(|d| {
        matches!(
            d.kind(),
            Some(DependencyKind::Allocation {
                condition: DependencyCondition::Corresponding,
                ..
            })
        )
    });
    let a = Allocation {
        metadata: meta,
        spec,
        ..Default::default()
    };
    match api.create(&PostParams::default(), &a).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e),
    }
}
