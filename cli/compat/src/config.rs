//! The site mapping file `lattice-compat.yaml`.
//!
//! ```yaml
//! # lattice-compat.yaml (the keys may also sit under a top-level `compat:`)
//! partitions:              # Slurm partition -> vCluster (alias: partition_mapping)
//!   normal: hpc-batch
//!   debug: interactive
//!   gpu: ml-training
//! qos:                     # Slurm QOS -> preemption class 0-10 (alias: qos_mapping)
//!   low: 1
//!   normal: 4
//!   high: 7
//! accounts:                # Slurm account -> tenant (optional; default: same name)
//!   ml_team: ml-team
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

/// Parsed `lattice-compat.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompatConfig {
    /// Slurm partition → vCluster name.
    #[serde(default, alias = "partition_mapping")]
    pub partitions: BTreeMap<String, String>,
    /// Slurm QOS → preemption class (0–10).
    #[serde(default, alias = "qos_mapping")]
    pub qos: BTreeMap<String, i32>,
    /// Slurm account → tenant; unmapped accounts are used as the tenant name.
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
    /// vClusters and this partition is none of them.
    pub fn map_partition(&self, partition: &str) -> Option<String> {
        if let Some(v) = self.partitions.get(partition) {
            return Some(v.clone());
        }
        let avail = self.available_vclusters();
        if avail.is_empty() || avail.iter().any(|a| a == partition) {
            // No mapping configured: the partition name is the vCluster name.
            return Some(partition.to_string());
        }
        None
    }
}
