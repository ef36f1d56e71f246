//! The environment of a workload: a minimal base inherited from the agent, the
//! allocation's `spec.env`, then the seed's `LATTICE_*` variables (and, with
//! `--slurm-env`, the familiar `SLURM_*` ones). Later layers win, so a user cannot
//! spoof `LATTICE_NODEID` but may change `PATH`.

use std::collections::BTreeMap;
use std::path::Path;

use lattice_apis::Allocation;

/// Annotation with the task count (`LATTICE_NPROCS`, `SLURM_NTASKS`).
pub const NTASKS_ANNOTATION: &str = "lattice.dev/ntasks";
/// Annotation with the submission directory (`LATTICE_SUBMIT_DIR`).
pub const SUBMIT_DIR_ANNOTATION: &str = "lattice.dev/submit-dir";
/// Label with the index of a task-group member (`LATTICE_TASK_INDEX`).
pub const TASK_INDEX_LABEL: &str = "lattice.dev/task-index";
/// Label with the task group's name (`LATTICE_TASK_GROUP_ID`).
pub const TASK_GROUP_LABEL: &str = "lattice.dev/task-group";

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
    /// Also set `SLURM_*`.
    pub slurm: bool,
    /// The inherited base (see [`base_from_agent`]); `HOME`/`USER` are replaced when the
    /// workload runs as another user.
    pub base: BTreeMap<String, String>,
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
    let ntasks = meta
        .annotations
        .get(NTASKS_ANNOTATION)
        .filter(|v| !v.trim().is_empty())
        .cloned()
        .unwrap_or_else(|| nnodes.to_string());
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

    let mut env = i.base.clone();
    env.extend(a.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    set("LATTICE_ALLOC_ID", name.clone());
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
    if i.slurm {
        set("SLURM_JOB_ID", name);
        set("SLURM_JOB_NAME", job_name);
        set("SLURM_NNODES", nnodes.to_string());
        set("SLURM_NODELIST", nodelist);
        set("SLURM_NTASKS", ntasks);
        set("SLURM_PROCID", rank.to_string());
        set("SLURM_NODEID", rank.to_string());
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
    }
}
