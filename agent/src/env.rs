//! The environment of a workload: a minimal base inherited from the agent, the
//! allocation's `spec.env`, then the seed's `LATTICE_*` variables (and the familiar
//! `SLURM_*` ones when the agent runs with `--slurm-env` or the allocation carries the
//! annotation `lattice.dev/set-slurm-env: "true"`, which `lattice submit` writes when the
//! site's `lattice-compat.yaml` has `set_slurm_env: true`). Later layers win, so a user
//! cannot spoof `LATTICE_NODEID` but may change `PATH`.

use std::collections::BTreeMap;
use std::path::Path;

use lattice_apis::Allocation;

/// Annotation with the task count (`LATTICE_NPROCS`, `SLURM_NTASKS`).
pub use lattice_apis::wellknown::NTASKS_ANNOTATION;
/// Annotation with the tasks per node (`SLURM_NTASKS_PER_NODE`; with the node count, the
/// task count when [`NTASKS_ANNOTATION`] is absent).
pub use lattice_apis::wellknown::NTASKS_PER_NODE_ANNOTATION;
/// Annotation `"true"`: set `SLURM_*` for this allocation even without `--slurm-env`
/// (written by `lattice submit` for sites with `compat.set_slurm_env: true`).
pub use lattice_apis::wellknown::SET_SLURM_ENV_ANNOTATION;
/// Annotation with the submission directory (`LATTICE_SUBMIT_DIR`).
pub use lattice_apis::wellknown::SUBMIT_DIR_ANNOTATION;
/// Label with the task group's name (`LATTICE_TASK_GROUP_ID`).
pub use lattice_apis::wellknown::TASK_GROUP_LABEL;
/// Label with the index of a task-group member (`LATTICE_TASK_INDEX`).
pub use lattice_apis::wellknown::TASK_INDEX_LABEL;

/// Variables inherited from the agent's own environment.
pub const INHERITED: [&str; 4] = ["PATH", "HOME", "USER", "LANG"];

/// What the environment is built from.
#[derive(Debug, Clone)]
pub struct EnvInputs<'a> {
    /// The allocation (as bound: `status.assignedNodes`).
    pub alloc: &'a Allocation,
    /// This node.
    pub node: &'a str,
    /// The attempt being started.
    pub attempt: u32,
    /// The scratch directory.
    pub scratch: &'a Path,
    /// Also set `SLURM_*` for every allocation (the agent's `--slurm-env`). Allocations
    /// annotated [`SET_SLURM_ENV_ANNOTATION`]`: "true"` get them regardless.
    pub slurm: bool,
    /// The inherited base (see [`base_from_agent`]); `HOME`/`USER` are replaced when the
    /// workload runs as another user.
    pub base: BTreeMap<String, String>,
}

/// Where a job step's tasks run on one node: the first global rank there and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSlots {
    /// Global rank of the node's first task.
    pub first: u64,
    /// Tasks on the node (0 when there are more nodes than tasks).
    pub count: u64,
}

/// The tasks of a job step on the node at `rank` of `nnodes`: `per_node` on each node
/// in node order when given (the last ones may get fewer), else spread as evenly as
/// possible with the remainder on the first nodes (Slurm's default block distribution:
/// `-N3 -n4` is 2, 1, 1).
pub fn step_tasks(ntasks: u64, nnodes: u64, per_node: Option<u64>, rank: u64) -> TaskSlots {
    let nnodes = nnodes.max(1);
    match per_node {
        Some(k) => {
            let first = rank.saturating_mul(k);
            TaskSlots {
                first,
                count: k.min(ntasks.saturating_sub(first)),
            }
        }
        None => {
            let (base, extra) = (ntasks / nnodes, ntasks % nnodes);
            TaskSlots {
                first: rank * base + rank.min(extra),
                count: base + u64::from(rank < extra),
            }
        }
    }
}

/// [`INHERITED`] from the agent's environment (PATH defaults to a sane value).
pub fn base_from_agent() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for k in INHERITED {
        if let Ok(v) = std::env::var(k) {
            m.insert(k.to_string(), v);
        }
    }
    m.entry("PATH".into())
        .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".into());
    m
}

/// Whether the allocation asks for the `SLURM_*` variables
/// ([`SET_SLURM_ENV_ANNOTATION`] is `"true"`).
pub fn wants_slurm_env(a: &Allocation) -> bool {
    a.metadata
        .annotations
        .get(SET_SLURM_ENV_ANNOTATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// Build the workload's environment.
pub fn build(i: &EnvInputs<'_>) -> BTreeMap<String, String> {
    let a = i.alloc;
    let meta = &a.metadata;
    let name = meta.name_str().to_string();
    let nodes: Vec<String> = a
        .status
        .as_ref()
        .map(|s| s.assigned_nodes.clone())
        .unwrap_or_default();
    let rank = nodes.iter().position(|n| n == i.node).unwrap_or(0);
    let nnodes = nodes.len().max(1);
    let per_node = meta
        .annotations
        .get(NTASKS_PER_NODE_ANNOTATION)
        .and_then(|v| v.trim().parse::<u64>().ok());
    let ntasks = meta
        .annotations
        .get(NTASKS_ANNOTATION)
        .filter(|v| !v.trim().is_empty())
        .cloned()
        .unwrap_or_else(|| {
            per_node
                .unwrap_or(1)
                .saturating_mul(nnodes as u64)
                .to_string()
        });
    let job_name = a
        .spec
        .tags
        .get("name")
        .cloned()
        .unwrap_or_else(|| name.clone());
    let nodelist = nodes.join(",");
    let submit_dir = meta.annotations.get(SUBMIT_DIR_ANNOTATION).cloned();
    let task_index = meta.labels.get(TASK_INDEX_LABEL).cloned();
    let task_group = meta.labels.get(TASK_GROUP_LABEL).cloned();

    // A job step belongs to its allocation: the job id is the allocation's, and the
    // tasks are spread over the step's nodes (see [`step_tasks`]).
    let step = a.spec.step_of.as_ref().map(|parent| {
        let n = ntasks.trim().parse::<u64>().unwrap_or(nnodes as u64);
        let slots = step_tasks(n, nnodes as u64, per_node, rank as u64);
        let id = name.rsplit('.').next().unwrap_or(&name).to_string();
        (parent.clone(), name.clone(), id, slots)
    });
    let job_id = step
        .as_ref()
        .map(|(parent, ..)| parent.clone())
        .unwrap_or_else(|| name.clone());

    let mut env = i.base.clone();
    env.extend(a.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    set("LATTICE_ALLOC_ID", job_id.clone());
    if let Some((_, step_name, _, slots)) = &step {
        set("LATTICE_STEP_ID", step_name.clone());
        set("LATTICE_PROCID", slots.first.to_string());
        set("LATTICE_LOCALID", "0".to_string());
        set("LATTICE_LOCAL_TASKS", slots.count.to_string());
    }
    set("LATTICE_ALLOC_UID", meta.uid.clone().unwrap_or_default());
    set("LATTICE_JOB_NAME", job_name.clone());
    set("LATTICE_TENANT", meta.namespace_str().to_string());
    set("LATTICE_NODELIST", nodelist.clone());
    set("LATTICE_NNODES", nnodes.to_string());
    set("LATTICE_NPROCS", ntasks.clone());
    set("LATTICE_NODEID", i.node.to_string());
    set("LATTICE_NODE_RANK", rank.to_string());
    set("LATTICE_SCRATCH", i.scratch.display().to_string());
    set("LATTICE_ATTEMPT", i.attempt.to_string());
    if let Some(t) = &task_index {
        set("LATTICE_TASK_INDEX", t.clone());
    }
    if let Some(g) = &task_group {
        set("LATTICE_TASK_GROUP_ID", g.clone());
    }
    if let Some(d) = &submit_dir {
        set("LATTICE_SUBMIT_DIR", d.clone());
    }
    if i.slurm || wants_slurm_env(a) {
        // The seed's table (Slurm Migration, "Environment Variables"), plus the long
        // forms Slurm itself sets next to them. One process per node: PROCID = NODEID.
        set("SLURM_JOB_ID", job_id.clone());
        set("SLURM_JOBID", job_id);
        set("SLURM_JOB_NAME", job_name);
        set("SLURM_NNODES", nnodes.to_string());
        set("SLURM_JOB_NUM_NODES", nnodes.to_string());
        set("SLURM_NODELIST", nodelist.clone());
        set("SLURM_JOB_NODELIST", nodelist.clone());
        set("SLURM_NTASKS", ntasks.clone());
        set("SLURM_NPROCS", ntasks.clone());
        if let Some(t) = per_node {
            set("SLURM_NTASKS_PER_NODE", t.to_string());
        }
        if let Some(v) = &a.spec.vcluster {
            set("SLURM_JOB_PARTITION", v.clone());
        }
        set("SLURM_JOB_ACCOUNT", meta.namespace_str().to_string());
        set("SLURM_NODEID", rank.to_string());
        set("SLURM_LOCALID", "0".to_string());
        match &step {
            Some((_, _, id, slots)) => {
                set("SLURM_STEP_ID", id.clone());
                set("SLURM_STEPID", id.clone());
                set("SLURM_PROCID", slots.first.to_string());
                set("SLURM_STEP_NUM_NODES", nnodes.to_string());
                set("SLURM_STEP_NODELIST", nodelist.clone());
                set("SLURM_STEP_NUM_TASKS", ntasks.clone());
            }
            None => set("SLURM_PROCID", rank.to_string()),
        }
        if let Some(d) = submit_dir {
            set("SLURM_SUBMIT_DIR", d);
        }
        if let Some(t) = task_index {
            set("SLURM_ARRAY_TASK_ID", t);
        }
        if let Some(g) = task_group {
            set("SLURM_ARRAY_JOB_ID", g);
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::{AllocationSpec, AllocationStatus};

    fn alloc() -> Allocation {
        let mut a = Allocation::new("train", "ml", AllocationSpec::default());
        a.metadata.uid = Some("u-1".into());
        a.spec.env.insert("OMP_NUM_THREADS".into(), "8".into());
        a.spec.env.insert("LATTICE_NODEID".into(), "spoofed".into());
        a.spec.env.insert("PATH".into(), "/opt/bin".into());
        a.status = Some(AllocationStatus {
            assigned_nodes: vec!["n0".into(), "n1".into(), "n2".into()],
            attempt: 2,
            ..Default::default()
        });
        a
    }

    #[test]
    fn lattice_variables_win_over_spec_env() {
        let a = alloc();
        let base = BTreeMap::from([
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ]);
        let env = build(&EnvInputs {
            alloc: &a,
            node: "n1",
            attempt: 2,
            scratch: Path::new("/s/u-1-2"),
            slurm: false,
            base,
        });
        assert_eq!(env["PATH"], "/opt/bin");
        assert_eq!(env["HOME"], "/root");
        assert_eq!(env["OMP_NUM_THREADS"], "8");
        assert_eq!(env["LATTICE_NODEID"], "n1");
        assert_eq!(env["LATTICE_NODE_RANK"], "1");
        assert_eq!(env["LATTICE_NODELIST"], "n0,n1,n2");
        assert_eq!(env["LATTICE_NNODES"], "3");
        assert_eq!(env["LATTICE_NPROCS"], "3");
        assert_eq!(env["LATTICE_ALLOC_ID"], "train");
        assert_eq!(env["LATTICE_ALLOC_UID"], "u-1");
        assert_eq!(env["LATTICE_JOB_NAME"], "train");
        assert_eq!(env["LATTICE_TENANT"], "ml");
        assert_eq!(env["LATTICE_SCRATCH"], "/s/u-1-2");
        assert_eq!(env["LATTICE_ATTEMPT"], "2");
        assert!(!env.contains_key("LATTICE_TASK_INDEX"));
        assert!(!env.keys().any(|k| k.starts_with("SLURM_")));
    }

    #[test]
    fn slurm_and_task_group_variables() {
        let mut a = alloc();
        a.spec.tags.insert("name".into(), "my-job".into());
        a.metadata
            .annotations
            .insert(NTASKS_ANNOTATION.into(), "96".into());
        a.metadata
            .annotations
            .insert(SUBMIT_DIR_ANNOTATION.into(), "/home/me".into());
        a.metadata
            .labels
            .insert(TASK_INDEX_LABEL.into(), "7".into());
        a.metadata
            .labels
            .insert(TASK_GROUP_LABEL.into(), "sweep".into());
        let env = build(&EnvInputs {
            alloc: &a,
            node: "n2",
            attempt: 2,
            scratch: Path::new("/s"),
            slurm: true,
            base: BTreeMap::new(),
        });
        assert_eq!(env["LATTICE_JOB_NAME"], "my-job");
        assert_eq!(env["LATTICE_NPROCS"], "96");
        assert_eq!(env["LATTICE_TASK_INDEX"], "7");
        assert_eq!(env["LATTICE_TASK_GROUP_ID"], "sweep");
        assert_eq!(env["LATTICE_SUBMIT_DIR"], "/home/me");
        assert_eq!(env["SLURM_JOB_ID"], "train");
        assert_eq!(env["SLURM_JOB_NAME"], "my-job");
        assert_eq!(env["SLURM_NNODES"], "3");
        assert_eq!(env["SLURM_NODELIST"], "n0,n1,n2");
        assert_eq!(env["SLURM_NTASKS"], "96");
        assert_eq!(env["SLURM_SUBMIT_DIR"], "/home/me");
        assert_eq!(env["SLURM_ARRAY_TASK_ID"], "7");
        assert_eq!(env["SLURM_ARRAY_JOB_ID"], "sweep");
        assert_eq!(env["SLURM_PROCID"], "2");
        assert_eq!(env["SLURM_NODEID"], "2");
        assert_eq!(env["SLURM_LOCALID"], "0");
        // The seed's aliases.
        assert_eq!(env["SLURM_JOBID"], "train");
        assert_eq!(env["SLURM_NPROCS"], "96");
        assert_eq!(env["SLURM_JOB_NUM_NODES"], "3");
        assert_eq!(env["SLURM_JOB_NODELIST"], "n0,n1,n2");
        assert_eq!(env["SLURM_JOB_ACCOUNT"], "ml");
        assert!(!env.contains_key("SLURM_JOB_PARTITION"));
    }

    #[test]
    fn step_tasks_spread_like_slurm() {
        let counts = |n, nodes, per| {
            (0..nodes)
                .map(|r| step_tasks(n, nodes, per, r))
                .map(|s| (s.first, s.count))
                .collect::<Vec<_>>()
        };
        assert_eq!(counts(4, 3, None), vec![(0, 2), (2, 1), (3, 1)]);
        assert_eq!(counts(6, 2, None), vec![(0, 3), (3, 3)]);
        assert_eq!(counts(2, 3, None), vec![(0, 1), (1, 1), (2, 0)]);
        assert_eq!(counts(5, 2, Some(4)), vec![(0, 4), (4, 1)]);
        assert_eq!(counts(8, 2, Some(4)), vec![(0, 4), (4, 4)]);
    }

    #[test]
    fn a_step_runs_as_part_of_its_allocation() {
        let mut a = alloc();
        a.metadata.name = Some("job.3".into());
        a.spec.step_of = Some("job".into());
        a.metadata
            .annotations
            .insert(NTASKS_ANNOTATION.into(), "5".into());
        let env = build(&EnvInputs {
            alloc: &a,
            node: "n1",
            attempt: 1,
            scratch: Path::new("/s"),
            slurm: true,
            base: BTreeMap::new(),
        });
        assert_eq!(env["LATTICE_ALLOC_ID"], "job");
        assert_eq!(env["LATTICE_STEP_ID"], "job.3");
        // 5 tasks on 3 nodes: 2, 2, 1; node n1 has ranks 2 and 3.
        assert_eq!(env["LATTICE_PROCID"], "2");
        assert_eq!(env["LATTICE_LOCAL_TASKS"], "2");
        assert_eq!(env["SLURM_JOB_ID"], "job");
        assert_eq!(env["SLURM_STEP_ID"], "3");
        assert_eq!(env["SLURM_PROCID"], "2");
        assert_eq!(env["SLURM_STEP_NUM_TASKS"], "5");
    }

    fn slurm_of(a: &Allocation, agent_flag: bool) -> BTreeMap<String, String> {
        build(&EnvInputs {
            alloc: a,
            node: "n0",
            attempt: 1,
            scratch: Path::new("/s"),
            slurm: agent_flag,
            base: BTreeMap::new(),
        })
        .into_iter()
        .filter(|(k, _)| k.starts_with("SLURM_"))
        .collect()
    }

    #[test]
    fn set_slurm_env_annotation_turns_slurm_variables_on() {
        // `lattice submit` with `set_slurm_env: true` in lattice-compat.yaml writes the
        // annotation; an agent without --slurm-env must honour it.
        let mut a = alloc();
        a.spec.vcluster = Some("hpc-batch".into());
        a.metadata
            .annotations
            .insert(SET_SLURM_ENV_ANNOTATION.into(), "true".into());
        a.metadata
            .annotations
            .insert(NTASKS_PER_NODE_ANNOTATION.into(), "4".into());
        let env = slurm_of(&a, false);
        assert_eq!(env["SLURM_JOB_ID"], "train");
        assert_eq!(env["SLURM_JOBID"], "train");
        assert_eq!(env["SLURM_NNODES"], "3");
        assert_eq!(env["SLURM_NODELIST"], "n0,n1,n2");
        // No ntasks annotation: tasks per node × nodes.
        assert_eq!(env["SLURM_NTASKS"], "12");
        assert_eq!(env["SLURM_NPROCS"], "12");
        assert_eq!(env["SLURM_NTASKS_PER_NODE"], "4");
        assert_eq!(env["SLURM_JOB_PARTITION"], "hpc-batch");
        assert_eq!(env["SLURM_PROCID"], "0");
        // The flag and the annotation give the same variables.
        assert_eq!(env, slurm_of(&a, true));

        // Any other value (or none) leaves them off unless the agent's flag is on.
        for v in ["false", "", "yes"] {
            a.metadata
                .annotations
                .insert(SET_SLURM_ENV_ANNOTATION.into(), v.into());
            assert!(slurm_of(&a, false).is_empty(), "annotation {v:?}");
            assert!(!slurm_of(&a, true).is_empty());
        }
        a.metadata
            .annotations
            .insert(SET_SLURM_ENV_ANNOTATION.into(), " TRUE ".into());
        assert!(wants_slurm_env(&a));
        a.metadata.annotations.remove(SET_SLURM_ENV_ANNOTATION);
        assert!(!wants_slurm_env(&a));
        assert!(slurm_of(&a, false).is_empty());
    }
}
