//! Intra-node topology a node agent reports with the node's capacity (the seed's "GPU
//! Topology" and "Memory Topology"): GPU interconnect links, which network interface is
//! closest to each GPU, and the node's memory domains. The scheduler turns them into the
//! intra-node part of f₄ and into its preference for nodes whose GPUs sit next to their
//! NICs ([`GpuTopology::link_fitness`], [`GpuTopology::nic_affinity`],
//! [`MemoryTopology::locality`]).

use std::collections::{BTreeMap, HashMap};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Kind of GPU-to-GPU link (vendor-neutral, after the seed's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum GpuLinkType {
    /// NVIDIA NVLink, GPU to GPU.
    NvLink,
    /// NVIDIA NVSwitch (all to all).
    NvSwitch,
    /// AMD Infinity Fabric.
    InfinityFabric,
    /// AMD xGMI.
    Xgmi,
    /// PCIe (through switches, host bridges or sockets).
    Pcie,
}

/// A link between two GPUs of the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuLink {
    /// Device index of one end.
    pub gpu_a: u32,
    /// Device index of the other end.
    pub gpu_b: u32,
    /// What connects them.
    pub link_type: GpuLinkType,
    /// Bandwidth in GB/s, as discovered.
    pub bandwidth_gbps: f64,
}

/// GPU interconnect topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuTopology {
    /// Links between pairs of GPUs (the fastest path between two GPUs counts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<GpuLink>,
    /// The network interfaces for inter-node traffic (e.g. Slingshot `hsn0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<String>,
    /// GPU index (as text) → the NIC closest to it (same PCIe switch or NUMA domain); a
    /// GPU without an entry has no NIC nearby.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nic_affinity: BTreeMap<String, String>,
}

impl GpuTopology {
    /// The seed's `intra_node_fitness = min_link_bandwidth(selected_gpus) /
    /// max_link_bandwidth(node)` for an allocation of all `gpus` GPUs (full-node
    /// scheduling): 1 when every pair is as well connected as the best pair, lower when some
    /// pair has only a slow path. A pair's bandwidth is its fastest listed link; a pair
    /// without a listed link counts as the slowest listed link. 1 with fewer than two GPUs
    /// or no links (nothing to tell apart). Linear in the links (it runs for every node of
    /// every scheduling cycle).
    pub fn link_fitness(&self, gpus: u32) -> f64 {
        let usable = || {
            self.links
                .iter()
                .filter(|l| l.bandwidth_gbps.is_finite() && l.bandwidth_gbps > 0.0)
        };
        let (Some(max), Some(slowest)) = (
            usable().map(|l| l.bandwidth_gbps).reduce(f64::max),
            usable().map(|l| l.bandwidth_gbps).reduce(f64::min),
        ) else {
            return 1.0;
        };
        if gpus < 2 {
            return 1.0;
        }
        // Best bandwidth of each pair among the allocation's GPUs.
        let mut pairs: HashMap<(u32, u32), f64> = HashMap::new();
        for l in usable() {
            let (a, b) = (l.gpu_a.min(l.gpu_b), l.gpu_a.max(l.gpu_b));
            if a != b && b < gpus {
                let best = pairs.entry((a, b)).or_insert(0.0);
                *best = best.max(l.bandwidth_gbps);
            }
        }
        let all_pairs = u64::from(gpus) * u64::from(gpus - 1) / 2;
        let mut min = pairs.values().copied().fold(f64::INFINITY, f64::min);
        if (pairs.len() as u64) < all_pairs {
            min = min.min(slowest);
        }
        (min / max).clamp(0.0, 1.0)
    }

    /// Fraction of the node's `gpus` GPUs that have a NIC nearby (the seed: "prefer nodes
    /// where GPU-to-NIC affinity matches"); 1 without GPUs.
    pub fn nic_affinity(&self, gpus: u32) -> f64 {
        if gpus == 0 {
            return 1.0;
        }
        // Keys are GPU indices in their canonical decimal form ("3", not "03").
        let near = self
            .nic_affinity
            .keys()
            .filter(|k| {
                k.parse::<u32>()
                    .is_ok_and(|g| g < gpus && g.to_string() == **k)
            })
            .count();
        near as f64 / f64::from(gpus)
    }
}

/// Kind of memory domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MemoryDomainType {
    /// DRAM of a socket (a NUMA node).
    Dram,
    /// GPU high-bandwidth memory.
    Hbm,
    /// CXL-attached memory.
    CxlAttached,
    /// CPU and GPU share one coherent pool (GH200, MI300A).
    Unified,
}

/// One memory domain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryDomain {
    /// Domain id (the NUMA node id where there is one).
    pub id: u32,
    /// What it is.
    pub domain_type: MemoryDomainType,
    /// Capacity in bytes.
    #[serde(default)]
    pub capacity_bytes: u64,
    /// Linux NUMA node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// CPUs with local access (a count; the agent's cpuset has the list).
    #[serde(default)]
    pub cpus: u32,
    /// GPU indices with local or coherent access.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attached_gpus: Vec<u32>,
}

/// Kind of link between memory domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MemoryLinkType {
    /// Socket-to-socket (UPI, Infinity Fabric between sockets).
    NumaLink,
    /// Through a CXL switch.
    CxlSwitch,
    /// Coherent CPU-GPU fabric (NVLink-C2C).
    CoherentFabric,
}

/// A link between two memory domains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryInterconnect {
    /// One end.
    pub domain_a: u32,
    /// The other end.
    pub domain_b: u32,
    /// What connects them.
    pub link_type: MemoryLinkType,
    /// Bandwidth in GB/s, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_gbps: Option<f64>,
    /// ACPI SLIT distance (10 = local), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distance: Option<u32>,
}

/// The node's memory topology.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryTopology {
    /// The domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<MemoryDomain>,
    /// Links between them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interconnects: Vec<MemoryInterconnect>,
}

impl MemoryTopology {
    /// The seed's `memory_locality_fitness` for a whole-node allocation: the fraction of
    /// its CPUs and GPUs in one memory domain (the best one). 1 on a single domain or a
    /// unified CPU-GPU pool, ½ on two sockets with everything split evenly; 1 when nothing
    /// is known.
    pub fn locality(&self) -> f64 {
        if self
            .domains
            .iter()
            .any(|d| d.domain_type == MemoryDomainType::Unified)
        {
            return 1.0;
        }
        let size = |d: &MemoryDomain| u64::from(d.cpus) + d.attached_gpus.len() as u64;
        let total: u64 = self.domains.iter().map(size).sum();
        if total == 0 {
            return 1.0;
        }
        let best = self.domains.iter().map(size).max().unwrap_or(0);
        best as f64 / total as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(a: u32, b: u32, t: GpuLinkType, bw: f64) -> GpuLink {
        GpuLink {
            gpu_a: a,
            gpu_b: b,
            link_type: t,
            bandwidth_gbps: bw,
        }
    }

    #[test]
    fn link_fitness_is_the_slowest_pair_over_the_fastest_link() {
        // NVSwitch: every pair at 900.
        let mut all = GpuTopology::default();
        for a in 0..4 {
            for b in a + 1..4 {
                all.links.push(link(a, b, GpuLinkType::NvSwitch, 900.0));
            }
        }
        assert_eq!(all.link_fitness(4), 1.0);
        // NVLink pairs (0-1, 2-3) at 450, PCIe across at 64.
        let pairs = GpuTopology {
            links: vec![
                link(0, 1, GpuLinkType::NvLink, 450.0),
                link(2, 3, GpuLinkType::NvLink, 450.0),
                link(0, 2, GpuLinkType::Pcie, 64.0),
            ],
            ..Default::default()
        };
        // 1-3 unlisted counts as the slowest listed link (64).
        assert!((pairs.link_fitness(4) - 64.0 / 450.0).abs() < 1e-12);
        assert_eq!(pairs.link_fitness(1), 1.0);
        assert_eq!(GpuTopology::default().link_fitness(8), 1.0);
        // A pair's fastest link counts; links of GPUs past the allocation do not.
        let t = GpuTopology {
            links: vec![
                link(0, 1, GpuLinkType::Pcie, 64.0),
                link(1, 0, GpuLinkType::NvLink, 450.0),
                link(1, 2, GpuLinkType::Pcie, 32.0),
            ],
            ..Default::default()
        };
        assert_eq!(t.link_fitness(2), 1.0);
        assert!((t.link_fitness(3) - 32.0 / 450.0).abs() < 1e-12);
    }

    /// The pair-by-pair definition, for the property below.
    fn link_fitness_by_pairs(t: &GpuTopology, gpus: u32) -> f64 {
        let ok = |b: f64| b.is_finite() && b > 0.0;
        let bws: Vec<f64> = t
            .links
            .iter()
            .map(|l| l.bandwidth_gbps)
            .filter(|b| ok(*b))
            .collect();
        let (Some(max), Some(slowest)) = (
            bws.iter().copied().reduce(f64::max),
            bws.iter().copied().reduce(f64::min),
        ) else {
            return 1.0;
        };
        if gpus < 2 {
            return 1.0;
        }
        let mut min = f64::INFINITY;
        for a in 0..gpus {
            for b in a + 1..gpus {
                let pair = t
                    .links
                    .iter()
                    .filter(|l| (l.gpu_a, l.gpu_b) == (a, b) || (l.gpu_a, l.gpu_b) == (b, a))
                    .map(|l| l.bandwidth_gbps)
                    .filter(|b| ok(*b))
                    .reduce(f64::max);
                min = min.min(pair.unwrap_or(slowest));
            }
        }
        (min / max).clamp(0.0, 1.0)
    }

    proptest::proptest! {
        #[test]
        fn link_fitness_matches_the_pairwise_definition(
            links in proptest::collection::vec((0u32..6, 0u32..6, 0.0f64..1000.0), 0..24),
            gpus in 0u32..7,
        ) {
            let t = GpuTopology {
                links: links
                    .into_iter()
                    .map(|(a, b, bw)| link(a, b, GpuLinkType::NvLink, bw))
                    .collect(),
                ..Default::default()
            };
            proptest::prop_assert_eq!(t.link_fitness(gpus), link_fitness_by_pairs(&t, gpus));
        }
    }

    #[test]
    fn nic_affinity_and_memory_locality() {
        let t = GpuTopology {
            nics: vec!["hsn0".into()],
            nic_affinity: BTreeMap::from([
                ("0".into(), "hsn0".into()),
                ("1".into(), "hsn0".into()),
            ]),
            ..Default::default()
        };
        assert_eq!(t.nic_affinity(4), 0.5);
        assert_eq!(t.nic_affinity(0), 1.0);
        // Only canonical indices of the node's GPUs count.
        let odd = GpuTopology {
            nic_affinity: BTreeMap::from([
                ("0".into(), "hsn0".into()),
                ("00".into(), "hsn0".into()),
                ("9".into(), "hsn0".into()),
                ("x".into(), "hsn0".into()),
            ]),
            ..Default::default()
        };
        assert_eq!(odd.nic_affinity(2), 0.5);
        let dram = |id: u32, cpus: u32, gpus: Vec<u32>| MemoryDomain {
            id,
            domain_type: MemoryDomainType::Dram,
            capacity_bytes: 1 << 30,
            numa_node: Some(id),
            cpus,
            attached_gpus: gpus,
        };
        let two_sockets = MemoryTopology {
            domains: vec![dram(0, 32, vec![0, 1]), dram(1, 32, vec![2, 3])],
            interconnects: Vec::new(),
        };
        assert_eq!(two_sockets.locality(), 0.5);
        let one = MemoryTopology {
            domains: vec![dram(0, 2, vec![])],
            interconnects: Vec::new(),
        };
        assert_eq!(one.locality(), 1.0);
        let mut unified = two_sockets.clone();
        unified.domains[0].domain_type = MemoryDomainType::Unified;
        assert_eq!(unified.locality(), 1.0);
        assert_eq!(MemoryTopology::default().locality(), 1.0);
    }
}
