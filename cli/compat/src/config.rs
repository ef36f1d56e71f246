//! The site mapping file `lattice-compat.yaml`.
//!
//! ```yaml
//! # lattice-compat.yaml (the keys may also sit under a top-level `compat:`)
//! partitions:              # Slurm partition -> vCluster (alias: partition_mapping); an
//!                          #   unmapped partition is a vCluster of the same name, made a
//!                          #   valid vCluster name: gpu_long -> gpu-long
//!   normal: hpc-batch
//!   debug: interactive
//!   gpu: ml-training
//! qos:                     # Slurm QOS -> preemption class 0-10 (alias: qos_mapping)
//!   low: 1
//!   normal: 4
//!   high: 7
//! accounts:                # Slurm account -> tenant (optional; default: the account's
//!   ml_team: ml-team       #   name, made a valid tenant name: proj_1234 -> proj-1234)
//! vclusters:               # vClusters that exist (optional; partitions named like one pass through)
//!   - hpc-batch
//!   - ml-training
//!   - interactive
//! default_vcluster: hpc-batch   # used when neither --partition nor --vcluster is given
//! set_slurm_env: false          # agents also set SLURM_* variables
//! default_tasks_per_node: 4     # for --ntasks without --ntasks-per-node (optional)
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::SubmitError;
use crate::names::{is_dns1123_label, label_from};

/// Parsed `lattice-compat.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompatConfig {
    /// Slurm partition → vCluster name. An unmapped partition is used as the vCluster
    /// name (made a valid one, with a warning, when it is not: `gpu_long` → `gpu-long`).
    #[serde(default, alias = "partition_mapping")]
    pub partitions: BTreeMap<String, String>,
    /// Slurm QOS → preemption class (0–10).
    #[serde(default, alias = "qos_mapping")]
    pub qos: BTreeMap<String, i32>,
    /// Slurm account → tenant; an unmapped account is used as the tenant name (made a
    /// valid one, with a warning, when it is not: `proj_1234` → `proj-1234`).
    #[serde(default, alias = "account_mapping")]
    pub accounts: BTreeMap<String, String>,
    /// vClusters known to exist (partitions with these names pass through unmapped).
    #[serde(default)]
    pub vclusters: Vec<String>,
    /// vCluster used when none is requested.
    #[serde(default)]
    pub default_vcluster: Option<String>,
    /// Whether agents set `SLURM_*` variables in allocations (default false).
    #[serde(default)]
    pub set_slurm_env: bool,
    /// Tasks per node assumed for `--ntasks` without `--ntasks-per-node`.
    #[serde(default)]
    pub default_tasks_per_node: Option<u32>,
}

impl CompatConfig {
    /// Parse the YAML text; a top-level `compat:` section is accepted too.
    pub fn from_yaml(text: &str) -> Result<CompatConfig, SubmitError> {
        let err = |e: String| {
            SubmitError::Config {
            message: e,
            hint: "see the schema in the lattice-compat README: partitions, qos, accounts, vclusters, default_vcluster, set_slurm_env, default_tasks_per_node".into(),
        }
        };
        let v: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| err(e.to_string()))?;
        let v = match &v {
            serde_yaml::Value::Null => return Ok(CompatConfig::default()),
            serde_yaml::Value::Mapping(m) => match m.get("compat") {
                Some(inner) if m.len() == 1 => inner.clone(),
                _ => v.clone(),
            },
            _ => return Err(err("the file must be a mapping".into())),
        };
        let c: CompatConfig = serde_yaml::from_value(v).map_err(|e| err(e.to_string()))?;
        for (q, class) in &c.qos {
            if !(0..=10).contains(class) {
                return Err(err(format!(
                    "qos {q:?} maps to preemption class {class}, which is outside 0-10"
                )));
            }
        }
        c.check_names()?;
        Ok(c)
    }

    /// Every vCluster name the site offers (mapped targets + listed), sorted.
    pub fn available_vclusters(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .vclusters
            .iter()
            .chain(self.partitions.values())
            .cloned()
            .collect();
        if let Some(d) = &self.default_vcluster {
            v.push(d.clone());
        }
        v.sort();
        v.dedup();
        v
    }

    /// Map a partition name to a vCluster. `None` when the site has configured
    /// vClusters and this partition (or the label made of it) is none of them.
    pub fn map_partition(&self, partition: &str) -> Option<PartitionMatch> {
        if let Some(v) = self.partitions.get(partition) {
            return Some(PartitionMatch::Mapped(v.clone()));
        }
        let avail = self.available_vclusters();
        if avail.iter().any(|a| a == partition) {
            return Some(PartitionMatch::AsIs(partition.to_string()));
        }
        if !is_dns1123_label(partition) {
            if let Some(label) = label_from(partition) {
                if avail.is_empty() || avail.contains(&label) {
                    return Some(PartitionMatch::Normalized(label));
                }
            }
        }
        // No vClusters configured: the partition name is the vCluster name (the
        // translator rejects it if it is not a valid one).
        avail
            .is_empty()
            .then(|| PartitionMatch::AsIs(partition.to_string()))
    }

    /// Every mapped tenant and vCluster name must be a valid one (DNS-1123 labels).
    fn check_names(&self) -> Result<(), SubmitError> {
        let check = |key: String, name: &str, what: &str| -> Result<(), SubmitError> {
            if is_dns1123_label(name) {
                return Ok(());
            }
            let hint = match label_from(name) {
                Some(l) => format!(
                    "write e.g. {l:?} (lower-case letters, digits and '-', at most 63 characters)"
                ),
                None => "use lower-case letters, digits and '-', at most 63 characters".into(),
            };
            Err(SubmitError::Config {
                message: format!("{key}: {name:?} is not a valid {what} name"),
                hint,
            })
        };
        for (a, t) in &self.accounts {
            check(format!("accounts.{a}"), t, "tenant")?;
        }
        for (p, v) in &self.partitions {
            check(format!("partitions.{p}"), v, "vCluster")?;
        }
        for (i, v) in self.vclusters.iter().enumerate() {
            check(format!("vclusters[{i}]"), v, "vCluster")?;
        }
        if let Some(v) = &self.default_vcluster {
            check("default_vcluster".into(), v, "vCluster")?;
        }
        Ok(())
    }
}

/// How [`CompatConfig::map_partition`] found a partition's vCluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionMatch {
    /// Named under `partitions:`.
    Mapped(String),
    /// The partition's own name: a listed vCluster, or passed through (no vClusters listed).
    AsIs(String),
    /// The label made of a partition name that is not a valid vCluster name
    /// ([`crate::names::label_from`]): a listed vCluster, or passed through.
    Normalized(String),
}

impl PartitionMatch {
    /// The vCluster name.
    pub fn vcluster(&self) -> &str {
        match self {
            PartitionMatch::Mapped(v) | PartitionMatch::AsIs(v) | PartitionMatch::Normalized(v) => {
                v
            }
        }
    }
}
