//! What the node is: CPU, memory, GPUs, kernel, architecture, and the conformance
//! fingerprint (a hash of the driver, firmware and kernel facts that must agree across
//! the nodes of a `requireConformance` allocation).
//!
//! GPUs are found through a [`GpuDiscovery`]: [`FakeGpus`] when `--gpu-count` is given
//! (tests, `lattice up`), NVML with the cargo feature `nvidia`, none otherwise.

use std::collections::BTreeMap;
use std::path::Path;

use lattice_apis::{Gpu, GpuTopology, NodeCapacity};
use sha2::{Digest, Sha256};

use crate::config::Config;

/// GPUs and the facts (driver versions, ...) that go into the fingerprint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuInventory {
    /// The devices.
    pub gpus: Vec<Gpu>,
    /// Fingerprint facts, e.g. `gpu.driver=550.54.15`.
    pub facts: BTreeMap<String, String>,
    /// Links between the GPUs, and NICs where the source knows them.
    pub topology: Option<GpuTopology>,
}

/// A source of GPU information.
pub trait GpuDiscovery: Send + Sync {
    /// The node's GPUs (an empty inventory when there are none).
    fn discover(&self) -> anyhow::Result<GpuInventory>;
}

/// No GPUs.
#[derive(Debug, Default)]
pub struct NoGpus;

impl GpuDiscovery for NoGpus {
    fn discover(&self) -> anyhow::Result<GpuInventory> {
        Ok(GpuInventory::default())
    }
}

/// `count` identical GPUs of model `model` (from `--gpu-count` / `--gpu-type`), linked as
/// `layout` (`--gpu-topology`).
#[derive(Debug, Clone)]
pub struct FakeGpus {
    /// How many.
    pub count: u32,
    /// Model.
    pub model: String,
    /// Interconnect and NIC layout.
    pub layout: crate::topology::FakeLayout,
}

impl GpuDiscovery for FakeGpus {
    fn discover(&self) -> anyhow::Result<GpuInventory> {
        let gpus = (0..self.count)
            .map(|index| Gpu {
                index,
                type_: self.model.clone(),
                ..Default::default()
            })
            .collect();
        let facts = BTreeMap::from([
            ("gpu.driver".to_string(), "fake".to_string()),
            ("gpu.model".to_string(), self.model.clone()),
        ]);
        let topology =
            (self.count > 0).then(|| crate::topology::fake_gpu_topology(self.count, self.layout));
        Ok(GpuInventory {
            gpus,
            facts,
            topology,
        })
    }
}

/// NVIDIA GPUs through NVML (`libnvidia-ml.so`, loaded at run time).
#[cfg(feature = "nvidia")]
#[derive(Debug, Default)]
pub struct NvmlGpus;

#[cfg(feature = "nvidia")]
impl GpuDiscovery for NvmlGpus {
    fn discover(&self) -> anyhow::Result<GpuInventory> {
        use anyhow::Context;
        let nvml = nvml_wrapper::Nvml::init().context("initialising NVML")?;
        let mut inv = GpuInventory::default();
        if let Ok(v) = nvml.sys_driver_version() {
            inv.facts.insert("gpu.driver".into(), v);
        }
        if let Ok(v) = nvml.sys_cuda_driver_version() {
            inv.facts.insert("gpu.cuda".into(), v.to_string());
        }
        let count = nvml.device_count().context("counting NVML devices")?;
        for index in 0..count {
            let dev = nvml
                .device_by_index(index)
                .with_context(|| format!("NVML device {index}"))?;
            let name = dev.name().unwrap_or_else(|_| "nvidia".into());
            let memory_gb = dev
                .memory_info()
                .ok()
                .map(|m| (m.total as f64 / 1e9 * 10.0).round() / 10.0);
            if let Ok(v) = dev.vbios_version() {
                inv.facts.insert(format!("gpu.{index}.vbios"), v);
            }
            inv.facts.insert(format!("gpu.{index}.model"), name.clone());
            // The GPU's NUMA node, from its PCI device in sysfs.
            let bus_id = dev.pci_info().ok().map(|p| p.bus_id.to_lowercase());
            let numa_node = bus_id.as_ref().and_then(|b| {
                std::fs::read_to_string(format!("/sys/bus/pci/devices/{b}/numa_node"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
            });
            inv.gpus.push(Gpu {
                index,
                type_: name,
                memory_gb,
                uuid: dev.uuid().ok(),
                numa_node,
            });
        }
        inv.topology = Some(nvml_links(&nvml, count));
        Ok(inv)
    }
}

/// GPU links through NVML: active NVLinks counted per peer GPU (an NVLink to a device that
/// is no GPU of this node is an NVSwitch port: all GPUs on switches are linked through
/// them), else the PCIe path of their common ancestor.
#[cfg(feature = "nvidia")]
fn nvml_links(nvml: &nvml_wrapper::Nvml, count: u32) -> GpuTopology {
    use lattice_apis::{GpuLink, GpuLinkType};
    use nvml_wrapper::enum_wrappers::device::TopologyLevel;
    // NVLink 4 (H100): 25 GB/s per direction and link.
    const NVLINK_GBPS: f64 = 50.0;
    const MAX_LINKS: u32 = 18;
    // Indexed by GPU index: a device NVML cannot open leaves a hole, not a shift.
    let devices: Vec<Option<_>> = (0..count).map(|i| nvml.device_by_index(i).ok()).collect();
    let bus: Vec<Option<String>> = devices
        .iter()
        .map(|d| {
            d.as_ref()
                .and_then(|d| d.pci_info().ok())
                .map(|p| p.bus_id.to_lowercase())
        })
        .collect();
    let mut peer_links: BTreeMap<(u32, u32), u32> = BTreeMap::new();
    let mut switch_links: BTreeMap<u32, u32> = BTreeMap::new();
    for (a, dev) in devices.iter().enumerate() {
        let Some(dev) = dev else { continue };
        for l in 0..MAX_LINKS {
            let link = dev.link_wrapper_for(l);
            if !link.is_active().unwrap_or(false) {
                continue;
            }
            let remote = link.remote_pci_info().ok().map(|p| p.bus_id.to_lowercase());
            match bus.iter().position(|b| b.is_some() && *b == remote) {
                Some(b) if b != a => {
                    let key = (a.min(b) as u32, a.max(b) as u32);
                    *peer_links.entry(key).or_default() += 1;
                }
                _ => *switch_links.entry(a as u32).or_default() += 1,
            }
        }
    }
    let mut t = GpuTopology::default();
    for a in 0..count {
        for b in a + 1..count {
            let (link_type, bandwidth_gbps) = if let Some(n) = peer_links.get(&(a, b)) {
                // Each end saw the links: count them once.
                (GpuLinkType::NvLink, f64::from((n / 2).max(1)) * NVLINK_GBPS)
            } else if let (Some(x), Some(y)) = (switch_links.get(&a), switch_links.get(&b)) {
                (GpuLinkType::NvSwitch, f64::from(*x.min(y)) * NVLINK_GBPS)
            } else {
                // `topology_common_ancestor` takes the other device by value (and
                // `Device` is not `Clone`): open it again.
                let (Some(Some(da)), Some(db)) =
                    (devices.get(a as usize), nvml.device_by_index(b).ok())
                else {
                    continue;
                };
                let level = match da.topology_common_ancestor(db) {
                    Ok(TopologyLevel::Internal) => 0,
                    Ok(TopologyLevel::Single) => 1,
                    Ok(TopologyLevel::Multiple) => 2,
                    Ok(TopologyLevel::HostBridge) => 3,
                    Ok(TopologyLevel::Node) => 4,
                    _ => 5,
                };
                (GpuLinkType::Pcie, crate::topology::pcie_bandwidth(level))
            };
            t.links.push(GpuLink {
                gpu_a: a,
                gpu_b: b,
                link_type,
                bandwidth_gbps,
            });
        }
    }
    t
}

/// Everything the agent reports about the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    /// Hardware.
    pub capacity: NodeCapacity,
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel_version: String,
    /// CPU architecture, e.g. `x86_64`.
    pub architecture: String,
    /// Hex SHA-256 of the sorted `key=value` facts.
    pub fingerprint: String,
    /// The facts hashed into the fingerprint.
    pub facts: BTreeMap<String, String>,
    /// What this agent can run besides plain processes (`status.agent.capabilities`).
    pub capabilities: Vec<String>,
}

/// What an agent with `cfg` can run besides plain processes.
pub fn capabilities(cfg: &Config) -> Vec<String> {
    use lattice_apis::kinds::node::capability;
    let mut out = Vec::new();
    if nix::unistd::geteuid().is_root()
        && !cfg.no_cgroups
        && crate::supervisor::find_program(&cfg.oci_runtime).is_some()
    {
        out.push(capability::OCI.to_string());
    }
    if cfg!(feature = "pmix") {
        out.push(capability::PMIX.to_string());
    }
    if cfg.uenv_repo.is_some() {
        out.push(capability::UENV.to_string());
    }
    out.sort();
    out
}

/// The GPU discovery the flags (and features) ask for.
pub fn gpu_discovery(cfg: &Config) -> Box<dyn GpuDiscovery> {
    if let Some(count) = cfg.gpu_count {
        return Box::new(FakeGpus {
            count,
            model: cfg.gpu_type.clone().unwrap_or_else(|| "gpu".into()),
            layout: cfg.gpu_topology,
        });
    }
    #[cfg(feature = "nvidia")]
    {
        Box::new(NvmlGpus)
    }
    #[cfg(not(feature = "nvidia"))]
    {
        Box::new(NoGpus)
    }
}

/// Discover the node from `/proc` (under `proc_root`, `/proc` in production), applying
/// the flag overrides.
pub fn discover(cfg: &Config, gpus: &dyn GpuDiscovery, proc_root: &Path) -> NodeFacts {
    let cpuinfo = std::fs::read_to_string(proc_root.join("cpuinfo")).unwrap_or_default();
    let meminfo = std::fs::read_to_string(proc_root.join("meminfo")).unwrap_or_default();
    let kernel_version = std::fs::read_to_string(proc_root.join("sys/kernel/osrelease"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let architecture = std::env::consts::ARCH.to_string();
    let cpu_cores = cfg.cpu_cores.unwrap_or_else(|| {
        let n = cpu_count(&cpuinfo);
        if n > 0 {
            n
        } else {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        }
    });
    let memory_gb = cfg.memory_gb.unwrap_or_else(|| memory_gb(&meminfo));
    let inventory = gpus.discover().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "GPU discovery failed; reporting no GPUs");
        GpuInventory::default()
    });
    let mut facts = inventory.facts.clone();
    facts.insert("kernel.release".into(), kernel_version.clone());
    facts.insert("arch".into(), architecture.clone());
    if let Some(model) = cpuinfo_field(&cpuinfo, "model name") {
        facts.insert("cpu.model".into(), model);
    }
    if let Some(mc) = cpuinfo_field(&cpuinfo, "microcode") {
        facts.insert("cpu.microcode".into(), mc);
    }
    for (key, file) in [
        ("bios.version", "/sys/class/dmi/id/bios_version"),
        ("bios.date", "/sys/class/dmi/id/bios_date"),
    ] {
        if let Ok(v) = std::fs::read_to_string(file) {
            facts.insert(key.into(), v.trim().to_string());
        }
    }
    let gpu_count = inventory.gpus.len() as u32;
    let gpu_type = inventory
        .gpus
        .first()
        .filter(|g| inventory.gpus.iter().all(|x| x.type_ == g.type_))
        .map(|g| g.type_.clone());
    // Superchips (GH200, MI300A) share one coherent CPU-GPU memory pool.
    let unified_memory = gpu_type
        .as_deref()
        .is_some_and(|t| t.contains("GH200") || t.contains("MI300A"));
    let node_dir = Path::new("/sys/devices/system/node");
    let memory_topology =
        crate::topology::memory_topology(node_dir, &inventory.gpus, unified_memory);
    let mut gpu_topology = inventory.topology;
    if let Some(t) = gpu_topology.as_mut().filter(|t| t.nics.is_empty()) {
        // A source that knows no NICs (NVML): the NICs on each GPU's NUMA node.
        let nics = crate::topology::nics_by_numa(Path::new("/sys/class/net"));
        crate::topology::nic_affinity(&inventory.gpus, &nics, t);
    }
    let capacity = NodeCapacity {
        cpu_cores,
        memory_gb,
        gpus: inventory.gpus,
        gpu_count,
        gpu_type,
        unified_memory,
        numa_nodes: numa_nodes(node_dir),
        gpu_topology,
        memory_topology,
        ..Default::default()
    };
    NodeFacts {
        capacity,
        kernel_version,
        architecture,
        fingerprint: fingerprint(&facts),
        facts,
        capabilities: capabilities(cfg),
    }
}

/// Hex SHA-256 of the facts as sorted `key=value` lines.
pub fn fingerprint(facts: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (k, v) in facts {
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

fn cpu_count(cpuinfo: &str) -> u32 {
    cpuinfo
        .lines()
        .filter(|l| l.split(':').next().is_some_and(|k| k.trim() == "processor"))
        .count() as u32
}

fn cpuinfo_field(cpuinfo: &str, field: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == field).then(|| v.trim().to_string())
    })
}

/// `MemTotal` in whole GB (GiB, rounded to nearest).
fn memory_gb(meminfo: &str) -> u64 {
    let kb = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    (kb + 512 * 1024) / (1024 * 1024)
}

fn numa_nodes(dir: &Path) -> Option<u32> {
    let n = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("node")
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
        })
        .count() as u32;
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Grace\nmicrocode\t: 0x1\n\nprocessor\t: 1\nmodel name\t: Grace\n";
        assert_eq!(cpu_count(cpuinfo), 2);
        assert_eq!(
            cpuinfo_field(cpuinfo, "model name").as_deref(),
            Some("Grace")
        );
        assert_eq!(memory_gb("MemTotal:       24576000 kB\n"), 23);
        assert_eq!(memory_gb(""), 0);
    }

    #[test]
    fn fingerprint_is_order_independent_and_sensitive() {
        let a = BTreeMap::from([
            ("kernel.release".to_string(), "6.1".to_string()),
            ("gpu.driver".to_string(), "550".to_string()),
        ]);
        let mut b = BTreeMap::new();
        b.insert("gpu.driver".to_string(), "550".to_string());
        b.insert("kernel.release".to_string(), "6.1".to_string());
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a).len(), 64);
        b.insert("gpu.driver".to_string(), "551".to_string());
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn fake_gpus_fill_capacity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/kernel")).unwrap();
        std::fs::write(dir.path().join("sys/kernel/osrelease"), "6.8.0-test\n").unwrap();
        std::fs::write(dir.path().join("cpuinfo"), "processor : 0\n").unwrap();
        std::fs::write(dir.path().join("meminfo"), "MemTotal: 2097152 kB\n").unwrap();
        let cfg = crate::config::Config::from_args(
            <crate::config::Cli as clap::Parser>::try_parse_from([
                "a",
                "--node-id",
                "n1",
                "--state-dir",
                "/tmp/s",
                "--gpu-count",
                "4",
                "--gpu-type",
                "GH200",
                "--cpu-cores",
                "72",
            ])
            .unwrap()
            .agent,
        )
        .unwrap();
        let facts = discover(&cfg, gpu_discovery(&cfg).as_ref(), dir.path());
        assert_eq!(facts.kernel_version, "6.8.0-test");
        assert_eq!(facts.capacity.cpu_cores, 72);
        assert_eq!(facts.capacity.memory_gb, 2);
        assert_eq!(facts.capacity.gpu_count, 4);
        assert_eq!(facts.capacity.gpu_type.as_deref(), Some("GH200"));
        assert_eq!(facts.capacity.gpus[3].index, 3);
        // GH200 is a superchip: unified memory; the fake GPUs come with their links.
        assert!(facts.capacity.unified_memory);
        let topology = facts.capacity.gpu_topology.as_ref().expect("links");
        assert_eq!(topology.links.len(), 6);
        assert_eq!(topology.link_fitness(4), 1.0);
        assert_eq!(facts.facts["kernel.release"], "6.8.0-test");
        assert_eq!(facts.fingerprint, fingerprint(&facts.facts));
    }
}
