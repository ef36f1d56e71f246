//! Job steps: a command run inside a running allocation (`lattice launch`, Slurm's `srun`
//! inside an allocation, `POST /v1/allocations/{id}/tasks`). A step is an [`Allocation`]
//! named `<allocation>.<n>` with `spec.stepOf: <allocation>`, labelled
//! [`STEP_OF_LABEL`] and owned by the allocation (controller reference); the step
//! controller binds it to the allocation's first nodes. This module builds it, the same
//! way for the CLI and the API server.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kinds::allocation::{
    Allocation, AllocationSpec, Distribution, Lifecycle, LifecycleType, NodeCount, Requeue,
    RequeuePolicy, StepLaunch,
};
use crate::meta::OwnerReference;
use crate::resource::Resource;

/// Annotation with the task count (as `lattice submit --ntasks` writes it).
pub use crate::wellknown::NTASKS_ANNOTATION;
/// Annotation with the tasks per node.
pub use crate::wellknown::NTASKS_PER_NODE_ANNOTATION;
/// Label on a step naming its allocation (to list an allocation's steps).
pub use crate::wellknown::STEP_OF_LABEL;
/// Annotation naming the submitting user.
pub use crate::wellknown::USER_ANNOTATION;
/// Annotations a step copies from its allocation.
pub const INHERITED_ANNOTATIONS: [&str; 2] = [
    crate::wellknown::SET_SLURM_ENV_ANNOTATION,
    crate::wellknown::SUBMIT_DIR_ANNOTATION,
];

/// What to run: the body of `POST /v1/allocations/{id}/tasks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskLaunch {
    /// Program and arguments (run as given, no shell; a single word with spaces runs
    /// through `/bin/sh -c`).
    pub command: Vec<String>,
    /// Tasks in all. Default: one per node, or nodes × `tasksPerNode`; when none of
    /// `ntasks`, `nodes` and `tasksPerNode` is given, the allocation's task layout (its
    /// `lattice.dev/ntasks` and `lattice.dev/ntasks-per-node` annotations), as srun does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntasks: Option<u32>,
    /// Nodes to use, the allocation's first ones. Default: all of them, or as many as the
    /// tasks need.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// Tasks on each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_per_node: Option<u32>,
    /// Environment variables, over the allocation's `spec.env` (which the step gets too).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory on the nodes (default: the allocation's submission directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// MPI wire-up, distribution and GPUs per task (the step's `spec.launch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<StepLaunch>,
}

/// How many nodes and tasks a step gets, given the allocation's `available` nodes
/// (Slurm's rules: `-n` alone uses as many nodes as tasks, up to all of them).
pub fn plan(
    available: u32,
    ntasks: Option<u32>,
    nodes: Option<u32>,
    per_node: Option<u32>,
) -> Result<(u32, u32), String> {
    if available == 0 {
        return Err("the allocation has no nodes".into());
    }
    if let Some(0) = ntasks {
        return Err("ntasks must be at least 1".into());
    }
    if let Some(0) = per_node {
        return Err("tasks per node must be at least 1".into());
    }
    if let Some(n) = ntasks.filter(|n| u64::from(*n) > MAX_STEP_TASKS) {
        return Err(format!(
            "{n} tasks are more than a step may have ({MAX_STEP_TASKS}); ask for fewer"
        ));
    }
    if let Some(k) = per_node.filter(|k| *k > MAX_TASKS_PER_NODE) {
        return Err(format!(
            "{k} tasks per node are more than a node runs for one step ({MAX_TASKS_PER_NODE}); ask for fewer"
        ));
    }
    let nodes = match (nodes, ntasks, per_node) {
        (Some(0), ..) => return Err("nodes must be at least 1".into()),
        (Some(n), ..) if n > available => {
            return Err(format!(
            "nodes is {n} but the allocation has {available} node(s); ask for at most {available}"
        ))
        }
        (Some(n), ..) => n,
        (None, Some(t), Some(k)) => t.div_ceil(k),
        (None, Some(t), None) => t.min(available),
        (None, None, _) => available,
    };
    if nodes > available {
        return Err(format!(
            "{} task(s) at {} per node need {nodes} nodes but the allocation has {available}",
            ntasks.unwrap_or(0),
            per_node.unwrap_or(1)
        ));
    }
    let ntasks = ntasks.unwrap_or(nodes.saturating_mul(per_node.unwrap_or(1)));
    if ntasks.div_ceil(nodes.max(1)) > MAX_TASKS_PER_NODE {
        return Err(format!(
            "{ntasks} tasks on {nodes} node(s) are more than {MAX_TASKS_PER_NODE} per node; ask for fewer tasks or more nodes"
        ));
    }
    if ntasks < nodes {
        return Err(format!(
            "{ntasks} task(s) cannot use {nodes} nodes; ask for at most {ntasks} node(s)"
        ));
    }
    if let Some(k) = per_node {
        if ntasks > nodes.saturating_mul(k) {
            return Err(format!(
                "{ntasks} tasks do not fit {nodes} node(s) at {k} per node; ask for more nodes or tasks per node"
            ));
        }
    }
    Ok((nodes, ntasks))
}

/// The most tasks a step may have in all (as a task group's members).
pub const MAX_STEP_TASKS: u64 = crate::wellknown::MAX_TASKS;
/// The most tasks of one step on one node (each is a process the agent starts).
pub const MAX_TASKS_PER_NODE: u32 = 1024;

/// The global ranks on each of a step's `nnodes` nodes: with `per_node`, at most that many
/// on each node; else spread as evenly as possible, the remainder on the first nodes
/// (Slurm's `-N3 -n4` is 2, 1, 1). `Block` gives each node consecutive ranks;
/// `Cyclic` deals them out in turn to the nodes that still have room.
pub fn layout(
    ntasks: u32,
    nnodes: u32,
    per_node: Option<u32>,
    distribution: Distribution,
) -> Vec<Vec<u32>> {
    let nnodes = nnodes.max(1);
    let counts: Vec<u32> = (0..nnodes)
        .map(|i| match per_node {
            Some(k) => k.min(ntasks.saturating_sub(i.saturating_mul(k))),
            None => ntasks / nnodes + u32::from(i < ntasks % nnodes),
        })
        .collect();
    let mut nodes: Vec<Vec<u32>> = counts
        .iter()
        .map(|c| Vec::with_capacity(*c as usize))
        .collect();
    match distribution {
        Distribution::Block => {
            let mut next = 0;
            for (node, c) in nodes.iter_mut().zip(&counts) {
                node.extend(next..next + c);
                next += c;
            }
        }
        Distribution::Cyclic => {
            let mut rank = 0;
            while rank < counts.iter().sum::<u32>() {
                for (node, c) in nodes.iter_mut().zip(&counts) {
                    if (node.len() as u32) < *c {
                        node.push(rank);
                        rank += 1;
                    }
                }
            }
        }
    }
    nodes
}

/// PMI's `PMI_process_mapping` for a [`layout`]: `(vector,(FIRST_NODE,NODES,RANKS),...)`,
/// blocks of `NODES` consecutive nodes with `RANKS` consecutive ranks each, read in rank
/// order and repeated from the start while ranks remain (how MPICH reads it). The
/// shortest repeating list is written: block `-N4 -n64` is `(vector,(0,4,16))`, cyclic
/// is `(vector,(0,4,1))`.
pub fn process_mapping(layout: &[Vec<u32>]) -> String {
    let total: usize = layout.iter().map(Vec::len).sum();
    let mut node_of = vec![0u32; total];
    for (n, ranks) in layout.iter().enumerate() {
        for r in ranks {
            if let Some(slot) = node_of.get_mut(*r as usize) {
                *slot = n as u32;
            }
        }
    }
    // Runs of consecutive ranks on one node: (node, ranks).
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for n in node_of {
        match runs.last_mut() {
            Some((node, k)) if *node == n => *k += 1,
            _ => runs.push((n, 1)),
        }
    }
    // Consecutive nodes with the same run length merge: (first node, nodes, ranks).
    let mut blocks: Vec<(u32, u32, u32)> = Vec::new();
    for (n, k) in runs {
        match blocks.last_mut() {
            Some((first, count, ranks)) if *ranks == k && *first + *count == n => *count += 1,
            _ => blocks.push((n, 1, k)),
        }
    }
    // The shortest prefix that repeats into the whole list.
    let period = (1..=blocks.len())
        .find(|p| blocks.len() % p == 0 && blocks.chunks(*p).all(|c| c == &blocks[..*p]))
        .unwrap_or(blocks.len());
    let mut out = String::from("(vector");
    for (first, count, ranks) in &blocks[..period] {
        out.push_str(&format!(",({first},{count},{ranks})"));
    }
    out.push(')');
    out
}

/// The allocation's node count: its assigned nodes, else what it asked for.
pub fn node_count(a: &Allocation) -> u32 {
    let assigned = a.status.as_ref().map_or(0, |s| s.assigned_nodes.len());
    if assigned > 0 {
        return assigned as u32;
    }
    a.spec.resources.nodes.min().max(1)
}

/// The number for the next step of `parent`, given the names of its existing steps.
pub fn next_number<'a>(parent: &str, existing: impl IntoIterator<Item = &'a str>) -> u32 {
    let prefix = format!("{parent}.");
    existing
        .into_iter()
        .filter_map(|n| n.strip_prefix(&prefix)?.parse::<u32>().ok())
        .max()
        .map_or(0, |m| m.saturating_add(1))
}

/// Why a step cannot be started in `parent` (before planning).
pub fn refuse(parent: &Allocation) -> Option<String> {
    if parent.spec.step_of.is_some() {
        return Some(format!(
            "{} is a step, not an allocation; run in its allocation {}",
            parent.metadata.name_str(),
            parent.spec.step_of.as_deref().unwrap_or_default()
        ));
    }
    let phase = parent.status.as_ref().map(|s| s.phase).unwrap_or_default();
    phase
        .is_terminal()
        .then(|| format!("the allocation is {phase}; a step needs a running allocation"))
}

/// The step `name` of `parent` running `launch` as `user`.
pub fn step_allocation(
    parent: &Allocation,
    name: &str,
    launch: &TaskLaunch,
    user: Option<&str>,
) -> Result<Allocation, String> {
    if let Some(why) = refuse(parent) {
        return Err(why);
    }
    if launch.command.is_empty() || launch.command[0].trim().is_empty() {
        return Err("command is empty: give the program to run and its arguments".into());
    }
    // Like srun in an allocation: with no layout asked for, the allocation's own
    // (`#SBATCH -n`, `--ntasks-per-node`).
    let inherit =
        launch.ntasks.is_none() && launch.nodes.is_none() && launch.tasks_per_node.is_none();
    let (want_tasks, per_node) = if inherit {
        let count = |k: &str| {
            parent
                .metadata
                .annotations
                .get(k)
                .and_then(|v| v.trim().parse::<u32>().ok())
                .filter(|n| *n > 0)
        };
        (count(NTASKS_ANNOTATION), count(NTASKS_PER_NODE_ANNOTATION))
    } else {
        (launch.ntasks, launch.tasks_per_node)
    };
    let (nodes, ntasks) = plan(node_count(parent), want_tasks, launch.nodes, per_node)
        .map_err(|e| {
            if inherit && (want_tasks.is_some() || per_node.is_some()) {
                format!("{e} (the allocation's task layout; give the step its own with ntasks, nodes or tasks per node)")
            } else {
                e
            }
        })?;
    let parent_name = parent.metadata.name_str().to_string();
    let tenant = parent.metadata.namespace_str().to_string();
    let mut spec = AllocationSpec {
        step_of: Some(parent_name.clone()),
        entrypoint: Some(launch.command[0].clone()),
        args: launch.command[1..].to_vec(),
        // The allocation's environment, under the step's own.
        env: parent
            .spec
            .env
            .iter()
            .chain(&launch.env)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        vcluster: parent.spec.vcluster.clone(),
        // The same software environment (uenv mounts, view) as the allocation's runs.
        environment: parent.spec.environment.clone(),
        launch: launch
            .launch
            .clone()
            .filter(|l| *l != StepLaunch::default()),
        lifecycle: Lifecycle {
            type_: LifecycleType::Bounded,
            ..Default::default()
        },
        requeue: Some(Requeue {
            policy: Some(RequeuePolicy::Never),
            max_requeue: None,
        }),
        ..Default::default()
    };
    spec.resources.nodes = NodeCount::Exact(nodes);
    spec.working_dir = launch.working_dir.clone().or_else(|| {
        parent
            .metadata
            .annotations
            .get(crate::wellknown::SUBMIT_DIR_ANNOTATION)
            .cloned()
    });
    if let Some(job) = parent.spec.tags.get("name") {
        spec.tags.insert("name".into(), job.clone());
    }
    let mut step = Allocation::new(name, &tenant, spec);
    step.metadata
        .labels
        .insert(STEP_OF_LABEL.into(), parent_name.clone());
    let ann = &mut step.metadata.annotations;
    if let Some(u) = user {
        ann.insert(USER_ANNOTATION.into(), u.to_string());
    }
    ann.insert(NTASKS_ANNOTATION.into(), ntasks.to_string());
    if let Some(k) = per_node {
        ann.insert(NTASKS_PER_NODE_ANNOTATION.into(), k.to_string());
    }
    for k in INHERITED_ANNOTATIONS {
        if let Some(v) = parent.metadata.annotations.get(k) {
            ann.insert(k.into(), v.clone());
        }
    }
    step.metadata.owner_references.push(OwnerReference {
        api_version: crate::API_VERSION.into(),
        kind: Allocation::KIND.into(),
        name: parent_name,
        uid: parent.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    });
    Ok(step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::allocation::{AllocationPhase, AllocationStatus};

    #[test]
    fn steps_take_nodes_and_tasks_like_srun() {
        assert_eq!(plan(4, None, None, None), Ok((4, 4)));
        assert_eq!(plan(4, Some(2), None, None), Ok((2, 2)));
        assert_eq!(plan(4, Some(8), None, None), Ok((4, 8)));
        assert_eq!(plan(4, Some(6), None, Some(4)), Ok((2, 6)));
        assert_eq!(plan(4, None, Some(2), Some(3)), Ok((2, 6)));
        assert!(plan(2, None, Some(3), None)
            .unwrap_err()
            .contains("at most 2"));
        assert!(plan(2, Some(1), Some(2), None)
            .unwrap_err()
            .contains("at most 1 node"));
        assert!(plan(2, Some(9), None, Some(4))
            .unwrap_err()
            .contains("need 3 nodes"));
        assert!(plan(2, Some(9), Some(2), Some(4))
            .unwrap_err()
            .contains("do not fit"));
        assert!(plan(2, Some(0), None, None).is_err());
        assert!(plan(2, Some(u32::MAX), None, None)
            .unwrap_err()
            .contains("more than a step may have"));
        assert!(plan(1, Some(2000), None, None)
            .unwrap_err()
            .contains("more than 1024 per node"));
        assert!(plan(1, None, None, Some(5000))
            .unwrap_err()
            .contains("per node are more"));
        assert!(plan(0, None, None, None).is_err());
    }

    #[test]
    fn a_step_is_an_allocation_owned_by_its_allocation() {
        let mut p = Allocation::new("job", "t", AllocationSpec::default());
        p.metadata.uid = Some("u1".into());
        p.spec.tags.insert("name".into(), "train".into());
        p.metadata
            .annotations
            .insert("lattice.dev/submit-dir".into(), "/home/a".into());
        p.status = Some(AllocationStatus {
            phase: AllocationPhase::Running,
            assigned_nodes: vec!["a".into(), "b".into()],
            ..Default::default()
        });
        let launch = TaskLaunch {
            command: vec!["hostname".into(), "-s".into()],
            ntasks: Some(4),
            ..Default::default()
        };
        let s = step_allocation(&p, "job.0", &launch, Some("alice")).unwrap();
        assert_eq!(s.spec.step_of.as_deref(), Some("job"));
        assert_eq!(s.spec.resources.nodes, NodeCount::Exact(2));
        assert_eq!(s.metadata.annotations[NTASKS_ANNOTATION], "4");
        assert_eq!(s.metadata.annotations[USER_ANNOTATION], "alice");
        assert_eq!(s.metadata.labels[STEP_OF_LABEL], "job");
        assert_eq!(s.metadata.owner_references[0].uid, "u1");
        assert_eq!(s.spec.working_dir.as_deref(), Some("/home/a"));
        assert_eq!(s.spec.tags["name"], "train");
        assert_eq!(s.spec.args, vec!["-s"]);
        let mut s = s;
        s.fill_type_meta();
        assert!(s.validate().is_ok(), "{:?}", s.validate());
        assert_eq!(
            next_number("job", ["job.0", "job.7", "other.9", "job.x"]),
            8
        );
        assert_eq!(next_number("job", []), 0);
        if let Some(st) = p.status.as_mut() {
            st.phase = AllocationPhase::Completed;
        }
        assert!(step_allocation(&p, "job.1", &launch, None)
            .unwrap_err()
            .contains("needs a running allocation"));
    }

    fn running(nodes: &[&str]) -> Allocation {
        let mut p = Allocation::new("job", "t", AllocationSpec::default());
        p.status = Some(AllocationStatus {
            phase: AllocationPhase::Running,
            assigned_nodes: nodes.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        });
        p
    }

    fn hostname() -> TaskLaunch {
        TaskLaunch {
            command: vec!["hostname".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_step_without_a_layout_takes_the_allocations() {
        // `#SBATCH -N 2 -n 8`: a bare `srun hostname` runs 8 tasks on the 2 nodes.
        let mut p = running(&["a", "b"]);
        p.metadata
            .annotations
            .insert(NTASKS_ANNOTATION.into(), "8".into());
        let s = step_allocation(&p, "job.0", &hostname(), None).unwrap();
        assert_eq!(s.spec.resources.nodes, NodeCount::Exact(2));
        assert_eq!(s.metadata.annotations[NTASKS_ANNOTATION], "8");
        assert!(!s
            .metadata
            .annotations
            .contains_key(NTASKS_PER_NODE_ANNOTATION));
        // `--ntasks-per-node=3` alone: 3 on each node, and the agents are told so.
        let mut p = running(&["a", "b"]);
        p.metadata
            .annotations
            .insert(NTASKS_PER_NODE_ANNOTATION.into(), "3".into());
        let s = step_allocation(&p, "job.0", &hostname(), None).unwrap();
        assert_eq!(s.spec.resources.nodes, NodeCount::Exact(2));
        assert_eq!(s.metadata.annotations[NTASKS_ANNOTATION], "6");
        assert_eq!(s.metadata.annotations[NTASKS_PER_NODE_ANNOTATION], "3");
        // Both: 5 tasks at 4 per node take 2 nodes.
        p.metadata
            .annotations
            .insert(NTASKS_ANNOTATION.into(), "5".into());
        p.metadata
            .annotations
            .insert(NTASKS_PER_NODE_ANNOTATION.into(), "4".into());
        let s = step_allocation(&p, "job.0", &hostname(), None).unwrap();
        assert_eq!(s.spec.resources.nodes, NodeCount::Exact(2));
        assert_eq!(s.metadata.annotations[NTASKS_ANNOTATION], "5");
        assert_eq!(s.metadata.annotations[NTASKS_PER_NODE_ANNOTATION], "4");
        // Any of -n, -N, --tasks-per-node: the step's own layout only.
        for launch in [
            TaskLaunch {
                ntasks: Some(1),
                ..hostname()
            },
            TaskLaunch {
                nodes: Some(1),
                ..hostname()
            },
            TaskLaunch {
                tasks_per_node: Some(1),
                nodes: Some(1),
                ..hostname()
            },
        ] {
            let s = step_allocation(&p, "job.0", &launch, None).unwrap();
            assert_eq!(s.spec.resources.nodes, NodeCount::Exact(1), "{launch:?}");
            assert_eq!(s.metadata.annotations[NTASKS_ANNOTATION], "1", "{launch:?}");
        }
        // No annotations (or nonsense): one task per node, as before.
        let mut p = running(&["a", "b", "c"]);
        p.metadata
            .annotations
            .insert(NTASKS_ANNOTATION.into(), "many".into());
        let s = step_allocation(&p, "job.0", &hostname(), None).unwrap();
        assert_eq!(s.metadata.annotations[NTASKS_ANNOTATION], "3");
        // A layout that no longer fits says where it came from.
        let mut p = running(&["a"]);
        p.metadata
            .annotations
            .insert(NTASKS_ANNOTATION.into(), "8".into());
        p.metadata
            .annotations
            .insert(NTASKS_PER_NODE_ANNOTATION.into(), "4".into());
        let e = step_allocation(&p, "job.0", &hostname(), None).unwrap_err();
        assert!(e.contains("the allocation's task layout"), "{e}");
    }

    #[test]
    fn layouts_and_their_process_mapping() {
        let b = |n, nodes, k| layout(n, nodes, k, Distribution::Block);
        let c = |n, nodes, k| layout(n, nodes, k, Distribution::Cyclic);
        assert_eq!(b(4, 3, None), vec![vec![0, 1], vec![2], vec![3]]);
        assert_eq!(c(4, 3, None), vec![vec![0, 3], vec![1], vec![2]]);
        assert_eq!(b(6, 2, Some(4)), vec![vec![0, 1, 2, 3], vec![4, 5]]);
        assert_eq!(c(6, 2, Some(4)), vec![vec![0, 2, 4, 5], vec![1, 3]]);
        assert_eq!(b(2, 4, None), vec![vec![0], vec![1], vec![], vec![]]);
        assert_eq!(process_mapping(&b(64, 4, None)), "(vector,(0,4,16))");
        assert_eq!(process_mapping(&c(64, 4, None)), "(vector,(0,4,1))");
        assert_eq!(process_mapping(&b(4, 3, None)), "(vector,(0,1,2),(1,2,1))");
        assert_eq!(process_mapping(&c(4, 3, None)), "(vector,(0,3,1),(0,1,1))");
        assert_eq!(process_mapping(&b(1, 1, None)), "(vector,(0,1,1))");
        // Every rank is placed exactly once, whatever the shape.
        for n in 1..20u32 {
            for nodes in 1..6u32 {
                for k in [None, Some(1), Some(3), Some(20)] {
                    for d in [Distribution::Block, Distribution::Cyclic] {
                        if k.is_some_and(|k| k * nodes < n) {
                            continue;
                        }
                        let mut all: Vec<u32> = layout(n, nodes, k, d).concat();
                        all.sort_unstable();
                        assert_eq!(all, (0..n).collect::<Vec<_>>(), "{n} {nodes} {k:?} {d:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_step_gets_the_allocations_env_under_its_own() {
        let mut p = running(&["a"]);
        p.spec.env.insert("OMP_NUM_THREADS".into(), "4".into());
        p.spec.env.insert("DATA".into(), "/scratch/d".into());
        let mut launch = hostname();
        launch.env.insert("OMP_NUM_THREADS".into(), "8".into());
        launch.env.insert("STEP".into(), "1".into());
        let s = step_allocation(&p, "job.0", &launch, None).unwrap();
        let env: Vec<(&str, &str)> = s
            .spec
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            env,
            [
                ("DATA", "/scratch/d"),
                ("OMP_NUM_THREADS", "8"),
                ("STEP", "1")
            ]
        );
    }
}
