//! Which cgroup hierarchy holds each controller the agent needs: cgroup v2 (one unified
//! hierarchy), cgroup v1 (one mount per controller or group of controllers), or both
//! (the "hybrid" layout: v1 controllers plus a v2 mount, often with no controllers, at
//! `<root>/unified`).
//!
//! A controller is taken from the v2 hierarchy when it lists it in `cgroup.controllers`,
//! else from the v1 mount that has it. Device control is the v1 `devices` controller,
//! or, on v2, a BPF program attached to the group (v2 has no device controller).

use std::path::{Path, PathBuf};

/// What the agent limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Controller {
    /// Memory (and swap).
    Memory,
    /// CPU time (CFS bandwidth).
    Cpu,
    /// Processes and threads.
    Pids,
    /// Device access.
    Devices,
}

impl Controller {
    /// The kernel's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Cpu => "cpu",
            Self::Pids => "pids",
            Self::Devices => "devices",
        }
    }
}

/// The controllers every run is limited by (devices only where there are devices to deny).
pub const REQUIRED: [Controller; 3] = [Controller::Memory, Controller::Cpu, Controller::Pids];

/// A cgroup mount, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where it is mounted.
    pub point: PathBuf,
    /// cgroup v2.
    pub v2: bool,
    /// The controllers of a v1 mount (its super options).
    pub v1_controllers: Vec<String>,
}

/// One hierarchy the agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Mount point.
    pub mount: PathBuf,
    /// cgroup v2.
    pub v2: bool,
    /// The controllers the agent uses from it.
    pub controllers: Vec<Controller>,
}

impl Hierarchy {
    /// Whether the agent uses `c` from this hierarchy.
    pub fn has(&self, c: Controller) -> bool {
        self.controllers.contains(&c)
    }
}

/// The hierarchies in use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    /// In a fixed order: v2 first, then v1 mounts by mount point.
    pub hierarchies: Vec<Hierarchy>,
}

/// The kernel's cgroup v1 controllers.
const V1_CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

/// The cgroup mounts listed in a `mountinfo` text.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        // `id parent major:minor root point options [optional...] - fstype source super`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let mut r = right.split_whitespace();
        let fstype = r.next().unwrap_or_default();
        let super_opts = r.nth(1).unwrap_or_default();
        let point = PathBuf::from(unescape(point));
        match fstype {
            "cgroup2" => out.push(Mount {
                point,
                v2: true,
                v1_controllers: Vec::new(),
            }),
            "cgroup" => out.push(Mount {
                point,
                v2: false,
                // The super options mix controllers with mount options (rw, xattr,
                // name=systemd, ...): keep the controllers.
                v1_controllers: super_opts
                    .split(',')
                    .filter(|o| V1_CONTROLLERS.contains(o))
                    .map(String::from)
                    .collect(),
            }),
            _ => {}
        }
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Layout {
    /// The hierarchies under `root` on this machine.
    pub fn detect(root: &Path) -> Result<Layout, String> {
        let text = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        Self::from_mounts(&parse_mountinfo(&text), root)
    }

    /// The hierarchies among `mounts` at or under `root` (a v2 mount's controllers are
    /// read from its `cgroup.controllers`). Errors name the controller that is missing.
    pub fn from_mounts(mounts: &[Mount], root: &Path) -> Result<Layout, String> {
        let under: Vec<&Mount> = mounts
            .iter()
            .filter(|m| m.point.starts_with(root))
            .collect();
        if under.is_empty() {
            return Err(format!(
                "no cgroup hierarchy is mounted at or under {} (see /proc/self/mountinfo)",
                root.display()
            ));
        }
        // The v2 mount: the one at the root itself if any (unified layout), else the
        // first below it (hybrid: `<root>/unified`).
        let v2 = under
            .iter()
            .filter(|m| m.v2)
            .min_by_key(|m| (m.point != root, m.point.clone()));
        let v2_available: Vec<String> = v2
            .and_then(|m| std::fs::read_to_string(m.point.join("cgroup.controllers")).ok())
            .map(|s| s.split_whitespace().map(String::from).collect())
            .unwrap_or_default();
        let mut v1: Vec<&Mount> = under.iter().filter(|m| !m.v2).copied().collect();
        v1.sort_by(|a, b| a.point.cmp(&b.point));
        let mut layout = Layout::default();
        let mut missing = Vec::new();
        for c in [
            Controller::Memory,
            Controller::Cpu,
            Controller::Pids,
            Controller::Devices,
        ] {
            let on_v2 = match c {
                // No device controller on v2: a BPF program on the group does it, where
                // no v1 devices hierarchy exists.
                Controller::Devices => {
                    v2.is_some()
                        && !v1
                            .iter()
                            .any(|m| m.v1_controllers.iter().any(|x| x == "devices"))
                }
                _ => v2_available.iter().any(|x| x == c.name()),
            };
            let mount = if on_v2 {
                v2.map(|m| (m.point.clone(), true))
            } else {
                v1.iter()
                    .find(|m| m.v1_controllers.iter().any(|x| x == c.name()))
                    .map(|m| (m.point.clone(), false))
            };
            let Some((point, is_v2)) = mount else {
                missing.push(c);
                continue;
            };
            match layout.hierarchies.iter_mut().find(|h| h.mount == point) {
                Some(h) => h.controllers.push(c),
                None => layout.hierarchies.push(Hierarchy {
                    mount: point,
                    v2: is_v2,
                    controllers: vec![c],
                }),
            }
        }
        if let Some(c) = missing.iter().find(|c| REQUIRED.contains(c)) {
            return Err(format!(
                "no cgroup hierarchy under {} offers the {} controller (v2 {}, v1 mounts: {})",
                root.display(),
                c.name(),
                match v2 {
                    Some(m) =>
                        format!("at {} with [{}]", m.point.display(), v2_available.join(" ")),
                    None => "not mounted".into(),
                },
                if v1.is_empty() {
                    "none".to_string()
                } else {
                    v1.iter()
                        .map(|m| m.point.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
        layout
            .hierarchies
            .sort_by(|a, b| (!a.v2, &a.mount).cmp(&(!b.v2, &b.mount)));
        Ok(layout)
    }

    /// The hierarchy the agent uses `c` from.
    pub fn of(&self, c: Controller) -> Option<&Hierarchy> {
        self.hierarchies.iter().find(|h| h.has(c))
    }

    /// One line for the start log: `memory, cpu, pids on v1 (...); devices on v2 (BPF)`.
    pub fn describe(&self) -> String {
        self.hierarchies
            .iter()
            .map(|h| {
                let cs: Vec<&str> = h.controllers.iter().map(|c| c.name()).collect();
                format!(
                    "{} on {} {}",
                    cs.join("+"),
                    if h.v2 { "v2" } else { "v1" },
                    h.mount.display()
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
24 1 0:22 / /sys rw,nosuid - sysfs sysfs rw
30 24 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 30 0:33 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
38 1 8:1 / /mnt/my\\040disk rw - ext4 /dev/sda1 rw
";

    #[test]
    fn mountinfo_lists_cgroup_mounts() {
        let m = parse_mountinfo(HYBRID);
        assert_eq!(m.len(), 6);
        assert!(m[0].v2 && m[0].point == Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(m[1].v1_controllers, vec!["cpu", "cpuacct"]);
        assert!(
            m[5].v1_controllers.is_empty(),
            "name=systemd is no controller"
        );
        assert_eq!(unescape("/mnt/my\\040disk"), "/mnt/my disk");
    }

    #[test]
    fn hybrid_takes_controllers_from_v1() {
        let l = Layout::from_mounts(&parse_mountinfo(HYBRID), Path::new("/sys/fs/cgroup")).unwrap();
        // The v2 mount's cgroup.controllers cannot be read here: none are on v2.
        assert!(l.hierarchies.iter().all(|h| !h.v2));
        assert_eq!(
            l.of(Controller::Cpu).unwrap().mount,
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(
            l.of(Controller::Devices).unwrap().mount,
            Path::new("/sys/fs/cgroup/devices")
        );
        assert_eq!(l.hierarchies.len(), 4);
        assert!(
            Layout::from_mounts(&parse_mountinfo(HYBRID), Path::new("/elsewhere"))
                .unwrap_err()
                .contains("no cgroup hierarchy is mounted")
        );
    }

    #[test]
    fn unified_takes_everything_from_v2_with_bpf_devices() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids rdma misc\n",
        )
        .unwrap();
        let mounts = vec![Mount {
            point: tmp.path().to_path_buf(),
            v2: true,
            v1_controllers: vec![],
        }];
        let l = Layout::from_mounts(&mounts, tmp.path()).unwrap();
        assert_eq!(l.hierarchies.len(), 1);
        let h = &l.hierarchies[0];
        assert!(h.v2);
        assert_eq!(
            h.controllers,
            vec![
                Controller::Memory,
                Controller::Cpu,
                Controller::Pids,
                Controller::Devices
            ]
        );
        assert!(l.describe().starts_with("memory+cpu+pids+devices on v2"));
        // Without the pids controller delegated, the agent cannot limit processes.
        std::fs::write(tmp.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
        let e = Layout::from_mounts(&mounts, tmp.path()).unwrap_err();
        assert!(e.contains("the pids controller"), "{e}");
    }
}
