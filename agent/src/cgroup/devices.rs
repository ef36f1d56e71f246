//! GPU device nodes: which exist on the machine, which belong to this node, and so
//! which a job must not open.
//!
//! A job may use the GPUs of its allocation. With full-node scheduling that is every GPU
//! of the node; when several nodes share a machine (tests, `lattice up`), or a site gives
//! the node a subset with `--gpu-devices`, the other GPUs' device nodes are denied to
//! its jobs by the devices cgroup (v1) or a device BPF program (v2). The shared control
//! nodes (`nvidiactl`, `nvidia-uvm`, `nvidia-modeset`, AMD's `kfd`) stay allowed: they
//! reach no GPU by themselves.
//!
//! GPU `N` is `<device-dir>/nvidiaN` (NVIDIA) or `<device-dir>/dri/renderD<128+N>`
//! (AMD, and other DRM render nodes).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A device by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// A block device (else a character device).
    pub block: bool,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl Device {
    /// The v1 `devices.allow`/`devices.deny` line for every access: `c 195:1 rwm`.
    pub fn rule(&self) -> String {
        format!(
            "{} {}:{} rwm",
            if self.block { 'b' } else { 'c' },
            self.major,
            self.minor
        )
    }
}

/// One GPU's device node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDevice {
    /// The GPU's index (`nvidiaN`, `renderD<128+N>`).
    pub index: u32,
    /// Its path.
    pub path: PathBuf,
    /// Its number.
    pub device: Device,
}

/// The GPU device nodes under `dev_dir`, by index (NVIDIA first).
pub fn discover(dev_dir: &Path) -> Vec<GpuDevice> {
    let mut out = Vec::new();
    let mut scan = |dir: &Path, prefix: &str, base: u32| {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(n) = name
                .strip_prefix(prefix)
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Some(index) = n.checked_sub(base) else {
                continue;
            };
            let path = e.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !meta.file_type().is_char_device() {
                continue;
            }
            let rdev = meta.rdev();
            out.push(GpuDevice {
                index,
                path,
                device: Device {
                    block: false,
                    major: nix::sys::stat::major(rdev) as u32,
                    minor: nix::sys::stat::minor(rdev) as u32,
                },
            });
        }
    };
    scan(dev_dir, "nvidia", 0);
    scan(&dev_dir.join("dri"), "renderD", 128);
    // Stable: NVIDIA nodes before render nodes of the same index.
    out.sort_by_key(|g| g.index);
    out
}

/// `--gpu-devices`: which GPUs (by index) belong to this node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GpuSelection {
    /// Every GPU found (one node per machine).
    #[default]
    All,
    /// None: every GPU found is denied.
    None,
    /// These indexes.
    Indexes(Vec<u32>),
}

impl FromStr for GpuSelection {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "all" => Ok(Self::All),
            "none" | "" => Ok(Self::None),
            list => list
                .split(',')
                .map(|i| {
                    i.trim().parse::<u32>().map_err(|_| {
                        format!("{i:?} is not a GPU index; give all, none or indexes such as 0,1")
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Self::Indexes),
        }
    }
}

impl GpuSelection {
    /// Whether GPU `index` is this node's.
    pub fn contains(&self, index: u32) -> bool {
        match self {
            Self::All => true,
            Self::None => false,
            Self::Indexes(v) => v.contains(&index),
        }
    }
}

/// The devices of `found` that are not this node's (deduplicated).
pub fn denied(found: &[GpuDevice], mine: &GpuSelection) -> Vec<Device> {
    let mut d: Vec<Device> = found
        .iter()
        .filter(|g| !mine.contains(g.index))
        .map(|g| g.device)
        .collect();
    d.sort();
    d.dedup();
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_syntax() {
        assert_eq!("all".parse::<GpuSelection>().unwrap(), GpuSelection::All);
        assert_eq!("none".parse::<GpuSelection>().unwrap(), GpuSelection::None);
        assert_eq!(
            "0, 2".parse::<GpuSelection>().unwrap(),
            GpuSelection::Indexes(vec![0, 2])
        );
        assert!("gpu0".parse::<GpuSelection>().is_err());
        assert_eq!(
            Device {
                block: false,
                major: 195,
                minor: 1
            }
            .rule(),
            "c 195:1 rwm"
        );
    }

    #[test]
    fn discovers_gpu_device_nodes_and_denies_the_others() {
        if !nix::unistd::geteuid().is_root() {
            return; // mknod needs root
        }
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("dri")).unwrap();
        let mk = |p: &Path, minor: u64| {
            nix::sys::stat::mknod(
                p,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(240, minor),
            )
            .unwrap()
        };
        mk(&tmp.path().join("nvidia0"), 0);
        mk(&tmp.path().join("nvidia1"), 1);
        mk(&tmp.path().join("nvidiactl"), 255);
        mk(&tmp.path().join("dri/renderD129"), 129);
        std::fs::write(tmp.path().join("nvidia7"), "not a device").unwrap();
        let found = discover(tmp.path());
        let idx: Vec<(u32, u32)> = found.iter().map(|g| (g.index, g.device.minor)).collect();
        assert_eq!(idx, vec![(0, 0), (1, 1), (1, 129)]);
        let d = denied(&found, &"0".parse().unwrap());
        assert_eq!(d.iter().map(|d| d.minor).collect::<Vec<_>>(), vec![1, 129]);
        assert!(denied(&found, &GpuSelection::All).is_empty());
        assert_eq!(denied(&found, &GpuSelection::None).len(), 3);
    }
}
