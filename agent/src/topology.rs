//! Intra-node topology (the seed's "GPU Topology" and "Memory Topology"): which GPUs are
//! linked how, which network interface sits next to which GPU, and the node's memory
//! domains. Reported with the node's capacity; the scheduler scores it (f₄'s intra-node
//! term) and prefers nodes whose GPUs are near their NICs for multi-node GPU work.
//!
//! * memory domains come from sysfs (`/sys/devices/system/node`): CPUs, memory and the
//!   ACPI distances per NUMA node, GPUs attached by their NUMA node;
//! * GPU links come from NVML (feature `nvidia`: active NVLinks and their peers, else the
//!   PCIe level of `nvmlDeviceGetTopologyCommonAncestor`), or from a named layout for fake
//!   GPUs (`--gpu-topology nvswitch|nvlink-pairs|pcie`);
//! * GPU-to-NIC affinity: a NIC on the same NUMA node as the GPU (sysfs
//!   `/sys/class/net/*/device/numa_node`), or the fake layout's.

use std::collections::BTreeMap;
use std::path::Path;

use lattice_apis::{
    Gpu, GpuLink, GpuLinkType, GpuTopology, MemoryDomain, MemoryDomainType, MemoryInterconnect,
    MemoryLinkType, MemoryTopology,
};

/// A GPU layout for fake GPUs (`--gpu-topology`), after the machines the seed names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FakeLayout {
    /// Every pair through NVSwitch (900 GB/s, H100 HGX); a NIC for each two GPUs.
    #[default]
    Nvswitch,
    /// NVLink between GPUs 0-1, 2-3, ... (450 GB/s), PCIe between pairs (64 GB/s); a NIC
    /// for each pair.
    NvlinkPairs,
    /// PCIe only (64 GB/s); one NIC, next to the first half of the GPUs.
    Pcie,
}

/// The links and NICs of `count` fake GPUs laid out as `layout`.
pub fn fake_gpu_topology(count: u32, layout: FakeLayout) -> GpuTopology {
    let mut t = GpuTopology::default();
    for a in 0..count {
        for b in a + 1..count {
            let (link_type, bandwidth_gbps) = match layout {
                FakeLayout::Nvswitch => (GpuLinkType::NvSwitch, 900.0),
                FakeLayout::NvlinkPairs if a / 2 == b / 2 => (GpuLinkType::NvLink, 450.0),
                FakeLayout::NvlinkPairs | FakeLayout::Pcie => (GpuLinkType::Pcie, 64.0),
            };
            t.links.push(GpuLink {
                gpu_a: a,
                gpu_b: b,
                link_type,
                bandwidth_gbps,
            });
        }
    }
    match layout {
        FakeLayout::Nvswitch | FakeLayout::NvlinkPairs => {
            for g in 0..count {
                let nic = format!("hsn{}", g / 2);
                if !t.nics.contains(&nic) {
                    t.nics.push(nic.clone());
                }
                t.nic_affinity.insert(g.to_string(), nic);
            }
        }
        FakeLayout::Pcie => {
            if count > 0 {
                t.nics.push("hsn0".into());
                for g in 0..count.div_ceil(2) {
                    t.nic_affinity.insert(g.to_string(), "hsn0".into());
                }
            }
        }
    }
    t
}

/// A sysfs list like `0-3,8,10-11` → its size.
fn list_len(s: &str) -> u32 {
    s.trim()
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('-') {
            Some((a, b)) => match (a.parse::<u32>(), b.parse::<u32>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 0,
            },
            None => u32::from(p.parse::<u32>().is_ok()),
        })
        .sum()
}

/// Memory domains from `node_dir` (`/sys/devices/system/node`): one DRAM domain per NUMA
/// node with its CPUs and memory, the GPUs attached by their `numa_node`, and the ACPI
/// distances between nodes. `unified` (a superchip: GH200, MI300A) makes it one Unified
/// domain, as the seed maps them. `None` when sysfs has no NUMA nodes.
pub fn memory_topology(node_dir: &Path, gpus: &[Gpu], unified: bool) -> Option<MemoryTopology> {
    let mut ids: Vec<u32> = std::fs::read_dir(node_dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("node")
                .and_then(|n| n.parse::<u32>().ok())
        })
        .collect();
    ids.sort_unstable();
    if ids.is_empty() {
        return None;
    }
    let mut t = MemoryTopology::default();
    for &id in &ids {
        let dir = node_dir.join(format!("node{id}"));
        let cpus = std::fs::read_to_string(dir.join("cpulist"))
            .map(|s| list_len(&s))
            .unwrap_or(0);
        let capacity_bytes = std::fs::read_to_string(dir.join("meminfo"))
            .ok()
            .and_then(|m| {
                m.lines().find_map(|l| {
                    let (_, rest) = l.split_once("MemTotal:")?;
                    rest.split_whitespace().next()?.parse::<u64>().ok()
                })
            })
            .map_or(0, |kb| kb * 1024);
        let attached_gpus = gpus
            .iter()
            .filter(|g| g.numa_node == Some(id))
            .map(|g| g.index)
            .collect();
        t.domains.push(MemoryDomain {
            id,
            domain_type: MemoryDomainType::Dram,
            capacity_bytes,
            numa_node: Some(id),
            cpus,
            attached_gpus,
        });
        if let Ok(d) = std::fs::read_to_string(dir.join("distance")) {
            for (k, v) in d.split_whitespace().enumerate() {
                let (Some(&other), Ok(distance)) = (ids.get(k), v.parse::<u32>()) else {
                    continue;
                };
                if other > id {
                    t.interconnects.push(MemoryInterconnect {
                        domain_a: id,
                        domain_b: other,
                        link_type: MemoryLinkType::NumaLink,
                        bandwidth_gbps: None,
                        distance: Some(distance),
                    });
                }
            }
        }
    }
    if unified {
        let cpus = t.domains.iter().map(|d| d.cpus).sum();
        let capacity_bytes = t.domains.iter().map(|d| d.capacity_bytes).sum();
        t = MemoryTopology {
            domains: vec![MemoryDomain {
                id: 0,
                domain_type: MemoryDomainType::Unified,
                capacity_bytes,
                numa_node: None,
                cpus,
                attached_gpus: gpus.iter().map(|g| g.index).collect(),
            }],
            interconnects: Vec::new(),
        };
    }
    Some(t)
}

/// NICs under `net_dir` (`/sys/class/net`) with a PCI device, by NUMA node (-1 when the
/// platform does not say).
pub fn nics_by_numa(net_dir: &Path) -> BTreeMap<String, i64> {
    let Ok(rd) = std::fs::read_dir(net_dir) else {
        return BTreeMap::new();
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let dev = e.path().join("device");
            // Virtual interfaces (lo, bridges, veths) have no device.
            if !dev.exists() {
                return None;
            }
            let numa = std::fs::read_to_string(dev.join("numa_node"))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .unwrap_or(-1);
            Some((name, numa))
        })
        .collect()
}

/// GPU-to-NIC affinity by NUMA node: each GPU's closest NIC is one on its NUMA node (the
/// first by name); a platform that reports no NUMA nodes (-1) puts everything on one.
pub fn nic_affinity(gpus: &[Gpu], nics: &BTreeMap<String, i64>, t: &mut GpuTopology) {
    t.nics = nics.keys().cloned().collect();
    for g in gpus {
        let numa = g.numa_node.map_or(-1, i64::from);
        let near = nics
            .iter()
            .find(|(_, &n)| n == numa || n == -1 || numa == -1)
            .map(|(name, _)| name.clone());
        if let Some(nic) = near {
            t.nic_affinity.insert(g.index.to_string(), nic);
        }
    }
}

/// PCIe bandwidth (GB/s) assumed for two GPUs whose common ancestor is at `level` (NVML's
/// topology levels: one switch, several switches, a host bridge, a NUMA node, the system).
pub fn pcie_bandwidth(level: u8) -> f64 {
    match level {
        0..=2 => 64.0, // internal, one switch, several switches: PCIe Gen5 x16
        3 => 32.0,     // the same host bridge
        4 => 24.0,     // the same NUMA node, different host bridges
        _ => 16.0,     // across sockets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_layouts_score_as_their_machines() {
        let nv = fake_gpu_topology(4, FakeLayout::Nvswitch);
        assert_eq!(nv.links.len(), 6);
        assert_eq!(nv.link_fitness(4), 1.0);
        assert_eq!(nv.nic_affinity(4), 1.0);
        assert_eq!(nv.nics, ["hsn0", "hsn1"]);
        let pairs = fake_gpu_topology(4, FakeLayout::NvlinkPairs);
        assert!((pairs.link_fitness(4) - 64.0 / 450.0).abs() < 1e-12);
        let pcie = fake_gpu_topology(4, FakeLayout::Pcie);
        assert_eq!(pcie.link_fitness(4), 1.0);
        assert_eq!(pcie.nic_affinity(4), 0.5);
        assert_eq!(
            fake_gpu_topology(0, FakeLayout::Pcie),
            GpuTopology::default()
        );
    }

    #[test]
    fn memory_domains_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        for (id, cpus, kb, dist) in [(0, "0-3,8", 1024, "10 21"), (1, "4-7", 2048, "21 10")] {
            let d = dir.path().join(format!("node{id}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{cpus}\n")).unwrap();
            std::fs::write(
                d.join("meminfo"),
                format!("Node {id} MemTotal:       {kb} kB\nNode {id} MemFree: 1 kB\n"),
            )
            .unwrap();
            std::fs::write(d.join("distance"), format!("{dist}\n")).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("possible")).unwrap();
        let gpu = |index, numa| Gpu {
            index,
            type_: "H100".into(),
            numa_node: Some(numa),
            ..Default::default()
        };
        let gpus = [gpu(0, 0), gpu(1, 1)];
        let t = memory_topology(dir.path(), &gpus, false).expect("domains");
        assert_eq!(t.domains.len(), 2);
        assert_eq!(
            (t.domains[0].cpus, t.domains[0].capacity_bytes),
            (5, 1024 * 1024)
        );
        assert_eq!(t.domains[1].attached_gpus, [1]);
        assert_eq!(t.interconnects.len(), 1);
        assert_eq!(t.interconnects[0].distance, Some(21));
        // 6 of the 11 CPUs and GPUs share node 0.
        assert!((t.locality() - 6.0 / 11.0).abs() < 1e-12);
        let u = memory_topology(dir.path(), &gpus, true).expect("unified");
        assert_eq!(u.domains.len(), 1);
        assert_eq!(u.domains[0].domain_type, MemoryDomainType::Unified);
        assert_eq!(u.domains[0].cpus, 9);
        assert!(memory_topology(&dir.path().join("none"), &gpus, false).is_none());
        assert_eq!(list_len("0-3,8,10-11\n"), 7);
        assert_eq!(list_len(""), 0);
    }

    #[test]
    fn nics_follow_the_gpus_numa_node() {
        let gpu = |index, numa| Gpu {
            index,
            type_: "H100".into(),
            numa_node: Some(numa),
            ..Default::default()
        };
        let nics = BTreeMap::from([("hsn0".to_string(), 0i64), ("hsn1".to_string(), 1)]);
        let mut t = GpuTopology::default();
        nic_affinity(&[gpu(0, 0), gpu(1, 1), gpu(2, 2)], &nics, &mut t);
        assert_eq!(t.nic_affinity["0"], "hsn0");
        assert_eq!(t.nic_affinity["1"], "hsn1");
        assert!(!t.nic_affinity.contains_key("2"), "no NIC on node 2");
        assert!((t.nic_affinity(3) - 2.0 / 3.0).abs() < 1e-12);
    }
}
