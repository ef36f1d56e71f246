//! Every well-known key of the API, defined once: the `lattice.dev/*` labels,
//! annotations and finalizers that Lattice's own components write and read, the
//! Kubernetes garbage-collection finalizers, and the API's limits.
//!
//! A component that writes or reads one of these keys names the constant, never the
//! string: a key spelled twice is a key that drifts. `docs/kinds.md`-style tables in the
//! docs list the same keys for users.

/// The API group and version of every Lattice kind.
pub const API_VERSION: &str = "lattice.dev/v1alpha1";

/// The prefix of every key Lattice owns. Users may not set system keys under it (see
/// the admission of each kind); tools match on it to tell Lattice's keys from theirs.
pub const PREFIX: &str = "lattice.dev/";

/// The most tasks one allocation (a job array) may have.
pub const MAX_TASKS: u64 = 100_000;
/// The largest task index (a range's indices take at most 9 digits; Slurm's `ID_TASK`
/// likewise).
pub const MAX_TASK_INDEX: u64 = 999_999_999;
/// The longest duration the API takes (one year; anything longer is almost surely a
/// typo): walltimes, delays, grace periods.
pub const MAX_DURATION_SECS: u64 = 366 * 24 * 3600;

// ---------------------------------------------------------------------------------
// Identity

/// The Unix user an allocation runs as: an annotation, set by the API server from the
/// caller's identity, and a label of the same value so that lists select by user.
pub const USER_ANNOTATION: &str = "lattice.dev/user";
/// The label twin of [`USER_ANNOTATION`] (the same key).
pub const USER_LABEL: &str = USER_ANNOTATION;
/// Who submitted a Slurm-compatible job (the `sbatch` translation records it).
pub const SUBMITTED_BY_ANNOTATION: &str = "lattice.dev/submitted-by";

// ---------------------------------------------------------------------------------
// Arrays, task groups, DAGs and steps

/// Label of one task of a job array: its index.
pub const TASK_INDEX_LABEL: &str = "lattice.dev/task-index";
/// Label of every task of a job array: the array's (task group's) name.
pub const TASK_GROUP_LABEL: &str = "lattice.dev/task-group";
/// Label put on every Allocation a Dag creates, naming the Dag.
pub const DAG_LABEL: &str = "lattice.dev/dag";
/// Label put on every Allocation a Dag creates, naming its task.
pub const DAG_TASK_LABEL: &str = "lattice.dev/dag-task";
/// Label of a Dag's step allocation (a task's retry or stage).
pub const DAG_STEP_LABEL: &str = "lattice.dev/dag-step";
/// Label of a step (`srun` inside an allocation): the parent allocation's name.
pub const STEP_OF_LABEL: &str = "lattice.dev/step-of";
/// Annotation of a step: the parent's attempt it belongs to; a step of an earlier
/// attempt is not run.
pub const STEP_PARENT_ATTEMPT_ANNOTATION: &str = "lattice.dev/step-parent-attempt";

// ---------------------------------------------------------------------------------
// Launch and Slurm compatibility

/// Number of tasks of a launch (`srun -n`, `#SBATCH --ntasks`).
pub const NTASKS_ANNOTATION: &str = "lattice.dev/ntasks";
/// Tasks per node of a launch (`--ntasks-per-node`).
pub const NTASKS_PER_NODE_ANNOTATION: &str = "lattice.dev/ntasks-per-node";
/// The directory a job was submitted from (its working directory, `SLURM_SUBMIT_DIR`).
pub const SUBMIT_DIR_ANNOTATION: &str = "lattice.dev/submit-dir";
/// `true`: the agent sets Slurm's environment (`SLURM_JOB_ID`, ...) for the job.
pub const SET_SLURM_ENV_ANNOTATION: &str = "lattice.dev/set-slurm-env";
/// The node that runs a batch script (the first of the allocation's nodes).
pub const BATCH_HOST_ANNOTATION: &str = "lattice.dev/batch-host";
/// Where a job's standard output goes (`#SBATCH --output`).
pub const OUTPUT_ANNOTATION: &str = "lattice.dev/output";
/// Where a job's standard error goes (`#SBATCH --error`).
pub const ERROR_ANNOTATION: &str = "lattice.dev/error";
/// A Slurm dependency expression as the user wrote it (`--dependency`).
pub const DEPENDENCY_ANNOTATION: &str = "lattice.dev/dependency";
/// A Slurm constraint expression as the user wrote it (`--constraint`).
pub const CONSTRAINT_ANNOTATION: &str = "lattice.dev/constraint";
/// The Slurm partition a script named.
pub const SLURM_PARTITION_ANNOTATION: &str = "lattice.dev/slurm-partition";
/// The Slurm QOS a script named.
pub const SLURM_QOS_ANNOTATION: &str = "lattice.dev/slurm-qos";
/// The Slurm account a script named.
pub const SLURM_ACCOUNT_ANNOTATION: &str = "lattice.dev/slurm-account";
/// A job's comment (`--comment`).
pub const COMMENT_ANNOTATION: &str = "lattice.dev/comment";
/// Which front end made the object (`sbatch`, `srun`, `salloc`, ...).
pub const FRONTEND_ANNOTATION: &str = "lattice.dev/frontend";

// ---------------------------------------------------------------------------------
// Lifecycle

/// Held: the scheduler leaves the allocation pending (`lattice hold`, `scontrol hold`).
pub const HOLD_ANNOTATION: &str = "lattice.dev/hold";
/// Set by `lattice cancel` / `DELETE /v1/allocations/{id}`: the controllers stop the
/// work and finish the object as Cancelled, keeping it for history.
pub const CANCEL_REQUESTED_ANNOTATION: &str = "lattice.dev/cancel-requested";
/// Why an allocation was cancelled (set with [`CANCEL_REQUESTED_ANNOTATION`]).
pub const CANCEL_REASON_ANNOTATION: &str = "lattice.dev/cancel-reason";
/// Set by the scheduler on an allocation it preempts.
pub const PREEMPT_ANNOTATION: &str = "lattice.dev/preempt-requested";

// ---------------------------------------------------------------------------------
// Leases

/// On a node's heartbeat Lease: the store lease that keeps it alive.
pub const STORE_LEASE_ANNOTATION: &str = "lattice.dev/store-lease";
/// On a node's heartbeat Lease: the sequence number of the last beat.
pub const HEARTBEAT_SEQUENCE_ANNOTATION: &str = "lattice.dev/heartbeat-sequence";

// ---------------------------------------------------------------------------------
// Finalizers

/// Finalizer that makes the checkpoint broker run before an allocation is deleted.
pub const CHECKPOINT_FINALIZER: &str = "lattice.dev/checkpoint";
/// Finalizer held while an allocation's nodes are still being released.
pub const NODES_FINALIZER: &str = "lattice.dev/nodes";
/// Finalizer of a foreground deletion (Kubernetes' spelling): the garbage collector
/// deletes the object's dependents first, then removes it.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// Finalizer of an orphaning deletion (Kubernetes' spelling): the garbage collector
/// removes the object from its dependents' `ownerReferences` (they survive), then
/// removes it.
pub const ORPHAN_FINALIZER: &str = "orphan";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lattice_key_is_under_the_prefix_and_a_valid_qualified_name() {
        let keys = [
            USER_ANNOTATION,
            SUBMITTED_BY_ANNOTATION,
            TASK_INDEX_LABEL,
            TASK_GROUP_LABEL,
            DAG_LABEL,
            DAG_TASK_LABEL,
            DAG_STEP_LABEL,
            STEP_OF_LABEL,
            STEP_PARENT_ATTEMPT_ANNOTATION,
            NTASKS_ANNOTATION,
            NTASKS_PER_NODE_ANNOTATION,
            SUBMIT_DIR_ANNOTATION,
            SET_SLURM_ENV_ANNOTATION,
            BATCH_HOST_ANNOTATION,
            OUTPUT_ANNOTATION,
            ERROR_ANNOTATION,
            DEPENDENCY_ANNOTATION,
            CONSTRAINT_ANNOTATION,
            SLURM_PARTITION_ANNOTATION,
            SLURM_QOS_ANNOTATION,
            SLURM_ACCOUNT_ANNOTATION,
            COMMENT_ANNOTATION,
            FRONTEND_ANNOTATION,
            HOLD_ANNOTATION,
            CANCEL_REQUESTED_ANNOTATION,
            CANCEL_REASON_ANNOTATION,
            PREEMPT_ANNOTATION,
            STORE_LEASE_ANNOTATION,
            HEARTBEAT_SEQUENCE_ANNOTATION,
            CHECKPOINT_FINALIZER,
            NODES_FINALIZER,
        ];
        let mut seen = std::collections::BTreeSet::new();
        for k in keys {
            let name = k.strip_prefix(PREFIX).unwrap_or_else(|| panic!("{k}"));
            assert!(
                !name.is_empty()
                    && name.len() <= 63
                    && name
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{k} is not a valid qualified name"
            );
            assert!(seen.insert(k), "{k} is defined twice");
        }
    }
}
