//! The tasks of a job step on this node: which global ranks run here
//! ([`lattice_apis::steps::layout`]), and what each one gets of its own — its rank
//! variables (Lattice's, Slurm's, and the ones `torchrun` sets: `RANK`, `LOCAL_RANK`,
//! `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `NODE_RANK`, `MASTER_ADDR`, `MASTER_PORT`), its
//! PMI socket (`PMI_FD`, `PMI_RANK`, `PMI_SIZE`, `PMI_JOBID`) and its GPUs
//! (`CUDA_VISIBLE_DEVICES`, `ROCR_VISIBLE_DEVICES`).
//!
//! `MASTER_ADDR` is the host of the step's first node (its agent address as the step
//! controller recorded it, else its name) and `MASTER_PORT` a port derived from the
//! step's uid, the same on every node, so a training script's rank 0 can listen there
//! and the others connect without a rendezvous server of their own.

use std::collections::BTreeMap;

use lattice_apis::steps::{layout, process_mapping};
use lattice_apis::{Allocation, CpuBind, MpiKind};

use crate::env::{NTASKS_ANNOTATION, NTASKS_PER_NODE_ANNOTATION};
use crate::runtime::FIRST_PASSED_FD;
use crate::shim::TaskPlan;

/// The range `MASTER_PORT` is taken from (below Linux's default ephemeral ports).
const MASTER_PORT_BASE: u16 = 20_000;
const MASTER_PORT_SPAN: u16 = 12_000;

/// A step's tasks on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTasks {
    /// This node's index in the step's node list.
    pub node_index: usize,
    /// The step's nodes.
    pub nodes: Vec<String>,
    /// The global ranks here, in local order.
    pub ranks: Vec<u32>,
    /// The ranks of every node of the step, in node order.
    pub layout: Vec<Vec<u32>>,
    /// Ranks in all.
    pub size: u32,
    /// `PMI_process_mapping`.
    pub mapping: String,
    /// The PMI server to run (`None`: none).
    pub mpi: Option<MpiKind>,
    /// The PMI job id: `<allocation>.<step>`, as Slurm's `<jobid>.<stepid>`.
    pub jobid: String,
    /// `MASTER_ADDR` and `MASTER_PORT`.
    pub master: (String, u16),
}

/// The host part of an agent address (`host:port`, `[v6]:port`).
fn host_of(address: &str) -> Option<&str> {
    let host = match address.strip_prefix('[') {
        Some(rest) => rest.split(']').next()?,
        None => address.rsplit_once(':').map_or(address, |(h, _)| h),
    };
    (!host.is_empty()).then_some(host)
}

/// A port from `seed` in [`MASTER_PORT_BASE`], [`MASTER_PORT_BASE`] + span (FNV-1a).
pub fn master_port(seed: &str) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in seed.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    MASTER_PORT_BASE + (h % u32::from(MASTER_PORT_SPAN)) as u16
}

/// The first node's host, for `MASTER_ADDR`.
pub fn master_addr(a: &Allocation) -> String {
    let st = a.status.as_ref();
    st.and_then(|s| s.node_addresses.first())
        .and_then(|addr| host_of(addr))
        .map(str::to_string)
        .or_else(|| st.and_then(|s| s.assigned_nodes.first().cloned()))
        .unwrap_or_default()
}

/// The tasks of step `a` on `node` (`None` for an allocation that is not a step).
pub fn for_step(a: &Allocation, node: &str) -> Option<NodeTasks> {
    a.spec.step_of.as_ref()?;
    let nodes: Vec<String> = a
        .status
        .as_ref()
        .map(|s| s.assigned_nodes.clone())
        .unwrap_or_default();
    let node_index = nodes.iter().position(|n| n == node).unwrap_or(0);
    let nnodes = nodes.len().max(1) as u32;
    let ann = &a.metadata.annotations;
    let count = |k: &str| ann.get(k).and_then(|v| v.trim().parse::<u32>().ok());
    let per_node = count(NTASKS_PER_NODE_ANNOTATION).filter(|k| *k > 0);
    let size = count(NTASKS_ANNOTATION)
        .filter(|n| *n > 0)
        .unwrap_or_else(|| per_node.unwrap_or(1).saturating_mul(nnodes));
    // What admission and `steps::plan` allow; an object written past them runs nothing
    // unreasonable here either.
    let size = size.min(lattice_apis::steps::MAX_STEP_TASKS as u32);
    let per_node = per_node.map(|k| k.min(lattice_apis::steps::MAX_TASKS_PER_NODE));
    let launch = a.spec.launch.clone().unwrap_or_default();
    let l = layout(
        size,
        nnodes,
        per_node,
        launch.distribution.unwrap_or_default(),
    );
    let ranks = l.get(node_index).cloned().unwrap_or_default();
    let name = a.metadata.name_str();
    let parent = a.spec.step_of.clone().unwrap_or_default();
    let step = name.rsplit('.').next().unwrap_or(name);
    Some(NodeTasks {
        node_index,
        nodes,
        ranks,
        size,
        mapping: process_mapping(&l),
        layout: l.clone(),
        mpi: launch.mpi.filter(|m| *m != MpiKind::None),
        jobid: format!("{parent}.{step}"),
        master: (
            master_addr(a),
            master_port(a.metadata.uid.as_deref().unwrap_or(name)),
        ),
    })
}

/// The GPUs of local task `local` when each gets `per_task` of `gpus`.
pub fn task_gpus(gpus: &[u32], per_task: u32, local: usize) -> Option<Vec<u32>> {
    let per = per_task as usize;
    let from = local.checked_mul(per)?;
    gpus.get(from..from.checked_add(per)?).map(<[u32]>::to_vec)
}

/// The CPUs of local task `local` of `tasks` when `cpus` are split into equal,
/// contiguous blocks (the remainder unused).
pub fn task_cpus(cpus: &[usize], tasks: usize, local: usize) -> Option<Vec<usize>> {
    let per = cpus.len().checked_div(tasks)?;
    (per > 0 && local < tasks).then(|| cpus[local * per..(local + 1) * per].to_vec())
}

/// The CPUs this process may run on (what its tasks share).
pub fn usable_cpus() -> Vec<usize> {
    // SAFETY: a plain C struct filled by the kernel.
    let mut set: nix::libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<nix::libc::cpu_set_t>();
    // SAFETY: pid 0 is this thread; `set` is large enough.
    if unsafe { nix::libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return Vec::new();
    }
    (0..nix::libc::CPU_SETSIZE as usize)
        // SAFETY: the index is within the set.
        .filter(|c| unsafe { nix::libc::CPU_ISSET(*c, &set) })
        .collect()
}

/// Each local task's plan. `slurm`: the `SLURM_*` variables are set for this run;
/// `gpus`: this node's GPU indices; `cpus`: the CPUs the tasks share; `pmi`: whether the
/// tasks get PMI sockets (passed at [`FIRST_PASSED_FD`] onwards, in local order).
pub fn plans(
    t: &NodeTasks,
    a: &Allocation,
    slurm: bool,
    gpus: &[u32],
    cpus: &[usize],
    pmi: bool,
) -> Result<Vec<TaskPlan>, String> {
    if t.ranks.len() > lattice_apis::steps::MAX_TASKS_PER_NODE as usize {
        return Err(format!(
            "the step puts {} tasks on this node, more than {} per node; ask for fewer tasks or more nodes",
            t.ranks.len(),
            lattice_apis::steps::MAX_TASKS_PER_NODE
        ));
    }
    let per_task_gpus = a.spec.launch.as_ref().and_then(|l| l.gpus_per_task);
    if let Some(g) = per_task_gpus {
        let need = g as usize * t.ranks.len();
        if need > gpus.len() {
            return Err(format!(
                "the step binds {g} GPU(s) to each of its {} task(s) on this node, {need} in all, but the node has {}; ask for fewer tasks per node or GPUs per task",
                t.ranks.len(),
                gpus.len()
            ));
        }
    }
    let bind_cpus = a.spec.launch.as_ref().and_then(|l| l.cpu_bind) == Some(CpuBind::Cores);
    if bind_cpus && cpus.len() < t.ranks.len() {
        return Err(format!(
            "the step binds each of its {} task(s) on this node to its own CPUs, but the node has {} usable CPU(s); ask for fewer tasks per node or no CPU binding",
            t.ranks.len(),
            cpus.len()
        ));
    }
    let local_size = t.ranks.len().to_string();
    let size = t.size.to_string();
    let mut out = Vec::with_capacity(t.ranks.len());
    for (local, rank) in t.ranks.iter().enumerate() {
        let mut env: BTreeMap<&str, String> = BTreeMap::new();
        let (r, l) = (rank.to_string(), local.to_string());
        env.insert("LATTICE_PROCID", r.clone());
        env.insert("LATTICE_LOCALID", l.clone());
        if slurm {
            env.insert("SLURM_PROCID", r.clone());
            env.insert("SLURM_LOCALID", l.clone());
        }
        env.insert("RANK", r.clone());
        env.insert("LOCAL_RANK", l.clone());
        env.insert("WORLD_SIZE", size.clone());
        env.insert("LOCAL_WORLD_SIZE", local_size.clone());
        let mut keep_fd = None;
        if pmi {
            let fd = FIRST_PASSED_FD + local as i32;
            keep_fd = Some(fd);
            env.insert("PMI_FD", fd.to_string());
            env.insert("PMI_RANK", r.clone());
            env.insert("PMI_SIZE", size.clone());
            env.insert("PMI_JOBID", t.jobid.clone());
        }
        if let Some(g) = per_task_gpus {
            let list = task_gpus(gpus, g, local)
                .unwrap_or_default()
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",");
            env.insert("CUDA_VISIBLE_DEVICES", list.clone());
            env.insert("ROCR_VISIBLE_DEVICES", list.clone());
            env.insert("LATTICE_TASK_GPUS", list);
        }
        let mut task_cpus_list = Vec::new();
        if bind_cpus {
            task_cpus_list = task_cpus(cpus, t.ranks.len(), local).unwrap_or_default();
            env.insert(
                "LATTICE_TASK_CPUS",
                task_cpus_list
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        out.push(TaskPlan {
            env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            keep_fd,
            cpus: task_cpus_list,
        });
    }
    Ok(out)
}

/// The variables every task of a run shares that a distributed-training launcher reads:
/// `MASTER_ADDR`, `MASTER_PORT`, `NODE_RANK`, and for a run that is not a step (one
/// process per node) `RANK`/`WORLD_SIZE` by node. What the allocation's `spec.env` sets
/// itself is left alone (these are not Lattice's names); a step's tasks get their own
/// ranks regardless ([`plans`]).
pub fn training_env(a: &Allocation, node: &str, env: &mut BTreeMap<String, String>) {
    let mut ours = BTreeMap::new();
    training_defaults(a, node, &mut ours);
    for (k, v) in ours {
        if !a.spec.env.contains_key(&k) {
            env.insert(k, v);
        }
    }
}

fn training_defaults(a: &Allocation, node: &str, env: &mut BTreeMap<String, String>) {
    let nodes: &[String] = a
        .status
        .as_ref()
        .map(|s| s.assigned_nodes.as_slice())
        .unwrap_or_default();
    let index = nodes.iter().position(|n| n == node).unwrap_or(0);
    let seed = a.metadata.uid.as_deref().unwrap_or(a.metadata.name_str());
    env.insert("MASTER_ADDR".into(), master_addr(a));
    env.insert("MASTER_PORT".into(), master_port(seed).to_string());
    env.insert("NODE_RANK".into(), index.to_string());
    if a.spec.step_of.is_none() {
        env.insert("RANK".into(), index.to_string());
        env.insert("LOCAL_RANK".into(), "0".into());
        env.insert("WORLD_SIZE".into(), nodes.len().max(1).to_string());
        env.insert("LOCAL_WORLD_SIZE".into(), "1".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::{AllocationSpec, AllocationStatus, Distribution, StepLaunch};

    fn step(nodes: &[&str], ntasks: u32, launch: StepLaunch) -> Allocation {
        let mut a = Allocation::new(
            "job.3",
            "t",
            AllocationSpec {
                step_of: Some("job".into()),
                launch: Some(launch),
                ..Default::default()
            },
        );
        a.metadata.uid = Some("uid-1".into());
        a.metadata
            .annotations
            .insert(NTASKS_ANNOTATION.into(), ntasks.to_string());
        a.status = Some(AllocationStatus {
            assigned_nodes: nodes.iter().map(|n| n.to_string()).collect(),
            node_addresses: vec!["10.0.0.7:9100".into(), "[fd00::2]:9100".into()],
            ..Default::default()
        });
        a
    }

    fn env_of(p: &TaskPlan) -> BTreeMap<String, String> {
        p.env.iter().cloned().collect()
    }

    #[test]
    fn each_task_gets_its_ranks_pmi_socket_and_gpus() {
        let a = step(
            &["n0", "n1"],
            4,
            StepLaunch {
                mpi: Some(MpiKind::Pmi2),
                distribution: Some(Distribution::Cyclic),
                gpus_per_task: Some(2),
                cpu_bind: Some(CpuBind::Cores),
            },
        );
        let t = for_step(&a, "n1").unwrap();
        assert_eq!(t.ranks, vec![1, 3]);
        assert_eq!(t.mapping, "(vector,(0,2,1))");
        assert_eq!(t.jobid, "job.3");
        assert_eq!(t.master.0, "10.0.0.7");
        let p = plans(&t, &a, true, &[0, 1, 2, 3], &[0, 1, 2, 3, 4], true).unwrap();
        let e1 = env_of(&p[1]);
        assert_eq!(e1["LATTICE_PROCID"], "3");
        assert_eq!(e1["SLURM_LOCALID"], "1");
        assert_eq!(e1["RANK"], "3");
        assert_eq!(e1["LOCAL_RANK"], "1");
        assert_eq!(e1["WORLD_SIZE"], "4");
        assert_eq!(e1["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(e1["PMI_FD"], (FIRST_PASSED_FD + 1).to_string());
        assert_eq!(p[1].keep_fd, Some(FIRST_PASSED_FD + 1));
        assert_eq!(e1["PMI_RANK"], "3");
        assert_eq!(e1["PMI_SIZE"], "4");
        assert_eq!(e1["CUDA_VISIBLE_DEVICES"], "2,3");
        assert_eq!(env_of(&p[0])["ROCR_VISIBLE_DEVICES"], "0,1");
        // Two tasks share five CPUs: two each, the fifth unused.
        assert_eq!(
            (p[0].cpus.clone(), p[1].cpus.clone()),
            (vec![0, 1], vec![2, 3])
        );
        assert_eq!(e1["LATTICE_TASK_CPUS"], "2,3");
        let e = plans(&t, &a, false, &[0, 1, 2, 3], &[7], true).unwrap_err();
        assert!(e.contains("1 usable CPU"), "{e}");
        // Not enough GPUs: refused, with the numbers.
        let e = plans(&t, &a, false, &[0, 1, 2], &[0, 1], true).unwrap_err();
        assert!(e.contains("4 in all, but the node has 3"), "{e}");
        // No PMI: no socket.
        let p = plans(&t, &a, false, &[0, 1, 2, 3], &[0, 1], false).unwrap();
        assert!(p[0].keep_fd.is_none() && !env_of(&p[0]).contains_key("PMI_FD"));
        assert!(!env_of(&p[0]).contains_key("SLURM_PROCID"));
    }

    #[test]
    fn training_variables_agree_on_every_node() {
        let a = step(&["n0", "n1"], 2, StepLaunch::default());
        let (mut e0, mut e1) = (BTreeMap::new(), BTreeMap::new());
        training_env(&a, "n0", &mut e0);
        training_env(&a, "n1", &mut e1);
        assert_eq!(e0["MASTER_ADDR"], "10.0.0.7");
        assert_eq!(e0["MASTER_PORT"], e1["MASTER_PORT"]);
        assert_eq!(e1["NODE_RANK"], "1");
        let port: u16 = e0["MASTER_PORT"].parse().unwrap();
        assert!((MASTER_PORT_BASE..MASTER_PORT_BASE + MASTER_PORT_SPAN).contains(&port));
        assert_eq!(host_of("[fd00::2]:9100"), Some("fd00::2"));
        assert_eq!(host_of("n3:1"), Some("n3"));
        // Without recorded addresses: the first node's name, as Slurm scripts use.
        let mut b = a.clone();
        if let Some(s) = b.status.as_mut() {
            s.node_addresses.clear();
        }
        assert_eq!(master_addr(&b), "n0");
        // An allocation (one process per node): rank by node.
        let mut c = a.clone();
        c.spec.step_of = None;
        let mut e = BTreeMap::new();
        training_env(&c, "n1", &mut e);
        assert_eq!((e["RANK"].as_str(), e["WORLD_SIZE"].as_str()), ("1", "2"));
        // The allocation's own value of such a name wins.
        c.spec.env.insert("MASTER_PORT".into(), "29500".into());
        let mut e = c.spec.env.clone();
        training_env(&c, "n1", &mut e);
        assert_eq!(e["MASTER_PORT"], "29500");
    }
}
