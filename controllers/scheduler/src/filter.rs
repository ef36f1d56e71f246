//! Filters: yes/no checks of one node class for one job, in the spirit of the Kubernetes
//! scheduling framework's filter plugins. The core filters per node *class* (nodes with
//! equal [`ClassKey`]s are interchangeable for every filter, see [`crate::catalog`]), so a
//! filter sees the class key, never a single node, and runs once per (job, class).
//!
//! [`FILTERS`] is the one list, in the order they run; the first that says no names the
//! reason ([`FilterOutcome`]) the job's pending message is built from. Ownership comes
//! last and is not in the list: it does not only say yes or no, it also says whether the
//! class is borrowed ([`crate::catalog::NodeCatalog::filter`]).
//!
//! Adding a filter is one `impl Filter` and one line in the `filters!` list (with a
//! [`FilterOutcome`] variant that says why). Filters that need a site's own data run
//! out of process instead, as scheduler extenders of the live controller.

use crate::catalog::{ClassKey, FilterOutcome};
use crate::model::PendingJob;

/// One feasibility check of a node class for a job.
pub trait Filter: Sync {
    /// Short name, for logs and docs.
    fn name(&self) -> &'static str;
    /// `Err(why)` when no node of the class may run the job.
    fn feasible(&self, job: &PendingJob, class: &ClassKey) -> Result<(), FilterOutcome>;
}

/// The one list of filters, in the order they run: it defines both [`FILTERS`] (names,
/// docs, tests) and [`run`], which calls the same filters in the same order without
/// dynamic dispatch (the cycle calls it once per job × node class, so each call inlines).
macro_rules! filters {
    ($($filter:expr),* $(,)?) => {
        /// Every filter, in the order they run.
        pub static FILTERS: &[&dyn Filter] = &[$(&$filter),*];

        /// [`FILTERS`] in order: the first that says no, else `Ok`.
        #[inline]
        pub(crate) fn run(job: &PendingJob, class: &ClassKey) -> Result<(), FilterOutcome> {
            $($filter.feasible(job, class)?;)*
            Ok(())
        }
    };
}

filters![
    Schedulable,
    SensitiveIsolation,
    GpuType,
    GpuCount,
    Features,
    Memory,
    UnifiedMemory,
];

/// The node is Ready (not draining, drained or down).
struct Schedulable;

impl Filter for Schedulable {
    fn name(&self) -> &'static str {
        "schedulable"
    }
    fn feasible(&self, _: &PendingJob, k: &ClassKey) -> Result<(), FilterOutcome> {
        if k.schedulable {
            Ok(())
        } else {
            Err(FilterOutcome::NotSchedulable)
        }
    }
}

/// Sensitive work only on the sensitive pool, and nothing else there.
struct SensitiveIsolation;

impl Filter for SensitiveIsolation {
    fn name(&self) -> &'static str {
        "sensitive-isolation"
    }
    fn feasible(&self, job: &PendingJob, k: &ClassKey) -> Result<(), FilterOutcome> {
        if k.sensitive_pool == job.sensitive {
            Ok(())
        } else {
            Err(FilterOutcome::SensitiveIsolation)
        }
    }
}

/// The GPU type asked for.
struct GpuType;

impl Filter for GpuType {
    fn name(&self) -> &'static str {
        "gpu-type"
    }
    fn feasible(&self, job: &PendingJob, k: &ClassKey) -> Result<(), FilterOutcome> {
        match &job.constraints.gpu_type {
            Some(t) if k.gpu_type.as_deref() != Some(t.as_str()) => Err(FilterOutcome::GpuType),
            _ => Ok(()),
        }
    }
}

/// At least the GPUs per node asked for.
struct GpuCount;

impl Filter for GpuCount {
    fn name(&self) -> &'static str {
        "gpu-count"
    }
    fn feasible(&self, job: &PendingJob, k: &ClassKey) -> Result<(), FilterOutcome> {
        if k.gpus < job.constraints.min_gpus_per_node {
            Err(FilterOutcome::GpuCount)
        } else {
            Ok(())
        }
    }
}

/// Every feature label asked for, and at least one label of each `anyOf` group (the
/// class's features are sorted).
struct Features;

impl Filter for Features {
    fn name(&self) -> &'static str {
        "features"
    }
    fn feasible(&self, job: &PendingJob, k: &ClassKey) -> Result<(), FilterOutcome> {
        let c = &job.constraints;
        let has = |f: &String| k.features.binary_search(f).is_ok();
        if c.features.iter().all(has) && c.any_of.iter().all(|group| group.iter().any(has)) {
            Ok(())
        } else {
            Err(FilterOutcome::Features)
        }
    }
}

/// Enough memory per node; CXL-attached memory counts only for jobs that opt in.
struct Memory;

impl Filter for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }
    fn feasible(&self, job: &PendingJob, k: &ClassKey) -> Result<(), FilterOutcome> {
        let c = &job.constraints;
        let memory = if c.allow_cxl_memory {
            k.memory_gb.saturating_add(k.cxl_memory_gb)
        } else {
            k.memory_gb
        };
        if memory < c.memory_gb_per_node {
            Err(FilterOutcome::Memory)
        } else {
            Ok(())
        }
    }
}

/// Unified memory when asked for.
struct UnifiedMemory;

impl Filter for UnifiedMemory {
    fn name(&self) -> &'static str {
        "unified-memory"
    }
    fn feasible(&self, job: &PendingJob, k: &ClassKey) -> Result<(), FilterOutcome> {
        if job.constraints.require_unified_memory && !k.unified_memory {
            Err(FilterOutcome::UnifiedMemory)
        } else {
            Ok(())
        }
    }
}
