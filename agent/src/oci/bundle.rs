//! Running a workload's tasks in an OCI image, in the root shim.
//!
//! The agent hands the shim a [`ContainerPlan`] (on `--oci-fd`). In the run's private
//! mount namespace, before any task starts, the shim ([`prepare`])
//!
//! 1. mounts a tmpfs (root only) on `<run-dir>/oci`: the run's scratch for containers,
//!    gone with the namespace;
//! 2. mounts an overlay there whose lower layer is the cached, unpacked image and whose
//!    upper layer lives in that tmpfs (`nosuid,nodev`): every task of the run sees one
//!    writable root file system, and the cache is never written;
//! 3. makes the mount points of the binds in it, resolved with `RESOLVE_IN_ROOT` (an
//!    image's links cannot point them outside).
//!
//! Each task then runs as `RUNTIME --root <tmpfs>/state --cgroup-manager=disabled run
//! --bundle <tmpfs>/task-N [--preserve-fds 1] task-N` ([`runtime_args`]), with a
//! `config.json` ([`config`]) that runs the command as the job's user with no
//! capabilities and `no_new_privs`, in a mount namespace only: host network, host IPC
//! (MPI shared memory) and host PIDs, so the shim's process-group and cgroup teardown
//! reaches every process. The runtime stays in the run's cgroups (the shim puts it
//! there; `--cgroup-manager=disabled` keeps it from making its own), with the task's
//! CPU binding; a task's PMI socket is its descriptor 3.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::libc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Mount the tmpfs of the containers here, under the run directory.
pub const SCRATCH: &str = "oci";
/// The tmpfs's size: the upper layer of the root file system, `/dev/shm` and `/tmp`
/// writes of the image's own directories (memory of the run, charged to its cgroup).
const SCRATCH_SIZE: &str = "50%";
/// The descriptor a task's PMI socket has in its container.
pub const PMI_FD_IN_CONTAINER: i32 = 3;

/// A host path bound into the containers at the same path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bind {
    /// Host path (and path in the container).
    pub path: PathBuf,
    /// Read-only in the container.
    #[serde(default)]
    pub readonly: bool,
}

/// What the agent tells the shim about the image a run's tasks run in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerPlan {
    /// The OCI runtime (`crun`, `runc`).
    pub runtime: PathBuf,
    /// The unpacked image (lower layer, never written).
    pub rootfs: PathBuf,
    /// The image's `Env`, under the workload's own environment.
    #[serde(default)]
    pub image_env: Vec<String>,
    /// Host paths bound in: the working directory, scratch, run directory, uenv mount
    /// points, the site's `--oci-binds`.
    #[serde(default)]
    pub binds: Vec<Bind>,
    /// Device nodes passed in (the node's GPUs and their control nodes).
    #[serde(default)]
    pub devices: Vec<DeviceBind>,
    /// A working directory the runtime may enter as root: the job's scratch directory,
    /// made by the agent (no component of its path is the user's to replace). Any other
    /// is entered by the user, from a shell in the image.
    #[serde(default)]
    pub safe_cwd: Option<PathBuf>,
}

/// A device node bound into the containers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceBind {
    /// On the host (under the agent's `--device-dir`).
    pub source: PathBuf,
    /// In the container (under `/dev`).
    pub target: PathBuf,
}

/// The device nodes of this node's GPUs (`gpus`: their paths under `dev_dir`) and the
/// vendors' control nodes that exist there, as the containers see them under `/dev`.
pub fn gpu_devices(dev_dir: &Path, gpus: &[PathBuf]) -> Vec<DeviceBind> {
    let mut out: Vec<DeviceBind> = Vec::new();
    let control = [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
        "kfd",
    ];
    let candidates = gpus
        .iter()
        .cloned()
        .chain(control.iter().map(|c| dev_dir.join(c)));
    for source in candidates {
        let Ok(rel) = source.strip_prefix(dev_dir) else {
            continue;
        };
        if source.exists() {
            out.push(DeviceBind {
                target: Path::new("/dev").join(rel),
                source,
            });
        }
    }
    out
}

/// The shim's view of the prepared containers.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// `<run-dir>/oci` (the tmpfs).
    pub scratch: PathBuf,
    /// The merged root file system.
    pub rootfs: PathBuf,
    /// `/sys/fs/cgroup/unified` is a cgroup2 with controllers (a hybrid host, which
    /// runtimes refuse): hidden from the runtime in its own mount namespace.
    pub hide_unified: bool,
    /// The image has `/bin/sh`.
    pub has_shell: bool,
}

fn c(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: a NUL byte in the path", p.display()))
}

fn mount(
    src: &str,
    on: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> Result<(), String> {
    let (s, o, t, d) = (
        CString::new(src).map_err(|e| e.to_string())?,
        c(on)?,
        CString::new(fstype).map_err(|e| e.to_string())?,
        CString::new(data).map_err(|e| e.to_string())?,
    );
    // SAFETY: mount(2) with valid C strings.
    let rc = unsafe { libc::mount(s.as_ptr(), o.as_ptr(), t.as_ptr(), flags, d.as_ptr().cast()) };
    if rc < 0 {
        return Err(format!(
            "cannot mount {fstype} on {}: {}",
            on.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn mkdir(p: &Path, mode: u32) -> Result<(), String> {
    let cp = c(p)?;
    // SAFETY: mkdir/chmod with a valid C string (in the shim's own tmpfs).
    unsafe {
        if libc::mkdir(cp.as_ptr(), mode) < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(format!("cannot create {}: {e}", p.display()));
            }
        }
        libc::chmod(cp.as_ptr(), mode);
    }
    Ok(())
}

/// Whether `/sys/fs/cgroup/unified` is a cgroup2 file system with controllers.
fn hybrid_cgroups() -> bool {
    let p = Path::new("/sys/fs/cgroup/unified");
    let Ok(fs) = nix::sys::statfs::statfs(p) else {
        return false;
    };
    fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC
        && std::fs::read_to_string(p.join("cgroup.controllers")).is_ok_and(|s| !s.trim().is_empty())
}

/// Set up the root file system of the run's containers (in the run's private mount
/// namespace, which the caller has entered).
pub fn prepare(plan: &ContainerPlan, run_dir: &Path) -> Result<Prepared, String> {
    let scratch = run_dir.join(SCRATCH);
    for p in [&plan.rootfs, &scratch] {
        let s = p.to_string_lossy();
        if s.contains([',', ':', '\\']) {
            return Err(format!(
                "{s}: an overlay cannot use a path with ',', ':' or '\\' (move the agent's --state-dir)"
            ));
        }
    }
    mkdir(&scratch, 0o700)?;
    mount(
        "lattice-oci",
        &scratch,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("mode=0700,size={SCRATCH_SIZE}"),
    )?;
    for (d, mode) in [
        ("upper", 0o755),
        ("work", 0o700),
        ("rootfs", 0o755),
        ("state", 0o700),
    ] {
        mkdir(&scratch.join(d), mode)?;
    }
    let rootfs = scratch.join("rootfs");
    mount(
        "lattice-image",
        &rootfs,
        "overlay",
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!(
            "lowerdir={},upperdir={},workdir={}",
            plan.rootfs.display(),
            scratch.join("upper").display(),
            scratch.join("work").display()
        ),
    )?;
    let root = std::fs::File::open(&rootfs)
        .map(OwnedFd::from)
        .map_err(|e| format!("cannot open {}: {e}", rootfs.display()))?;
    for b in &plan.binds {
        make_target(&root, &b.path, b.path.is_dir())?;
    }
    for d in &plan.devices {
        make_target(&root, &d.target, false)?;
    }
    // What every container mounts that an image may lack.
    for d in ["proc", "dev", "sys", "tmp", "etc"] {
        make_target(&root, Path::new("/").join(d).as_path(), true)?;
    }
    for f in ["etc/hosts", "etc/resolv.conf"] {
        make_target(&root, Path::new("/").join(f).as_path(), false)?;
    }
    let has_shell = nix::fcntl::openat2(
        root.as_raw_fd(),
        "bin/sh",
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
    .map(|fd| {
        // SAFETY: a descriptor of ours, closed here.
        drop(unsafe { OwnedFd::from_raw_fd(fd) })
    })
    .is_ok();
    Ok(Prepared {
        scratch,
        rootfs,
        hide_unified: hybrid_cgroups(),
        has_shell,
    })
}

/// Make `path` (absolute, as seen in the container) in the root file system open at
/// `root`, a directory or an empty file, resolving every component inside it.
fn make_target(root: &OwnedFd, path: &Path, dir: bool) -> Result<(), String> {
    let rel: PathBuf = path
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect();
    if rel.as_os_str().is_empty() {
        return Ok(());
    }
    let how = |flags: OFlag| {
        OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(
            ResolveFlag::RESOLVE_IN_ROOT
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        )
    };
    let mut sofar = PathBuf::new();
    let n = rel.components().count();
    for (i, comp) in rel.components().enumerate() {
        let parent = nix::fcntl::openat2(
            root.as_raw_fd(),
            if sofar.as_os_str().is_empty() {
                Path::new(".")
            } else {
                sofar.as_path()
            },
            how(OFlag::O_PATH | OFlag::O_DIRECTORY),
        )
        .map_err(|e| format!("{} in the image: {e}", sofar.display()))?;
        // SAFETY: a new descriptor, owned here.
        let parent = unsafe { OwnedFd::from_raw_fd(parent) };
        sofar.push(comp);
        let name = c(Path::new(comp.as_os_str()))?;
        let last = i + 1 == n;
        // SAFETY: *at calls relative to the parent's descriptor, never following a link
        // in the last component (an existing entry of any kind is left as it is).
        let rc = unsafe {
            if last && !dir {
                let fd = libc::openat(
                    parent.as_raw_fd(),
                    name.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o644,
                );
                if fd >= 0 {
                    libc::close(fd);
                }
                fd
            } else {
                libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o755)
            }
        };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(format!("cannot make {} in the image: {e}", sofar.display()));
            }
        }
    }
    Ok(())
}

/// The runtime's command line for task `i` (after the runtime's path).
pub fn runtime_args(p: &Prepared, i: usize, pmi: bool) -> Vec<String> {
    let mut a = vec![
        format!("--root={}", p.scratch.join("state").display()),
        "--cgroup-manager=disabled".into(),
        "run".into(),
        format!("--bundle={}", p.scratch.join(format!("task-{i}")).display()),
    ];
    if pmi {
        a.push("--preserve-fds=1".into());
    }
    a.push(format!("task-{i}"));
    a
}

/// Where the runtime starts a task and what it runs: the runtime enters the working
/// directory as root before it switches to the user, so only a directory the agent made
/// ([`ContainerPlan::safe_cwd`], or `/`) is given to it; any other is entered by the
/// user, through `/bin/sh -c 'cd -- "$1" && shift && exec "$@"'`, so a link the user
/// planted (say to `/proc/1/root/...`) is followed with the user's rights only.
pub fn enter_cwd(
    plan: &ContainerPlan,
    p: &Prepared,
    cwd: &Path,
    command: &[String],
) -> Result<(PathBuf, Vec<String>), String> {
    if cwd == Path::new("/") || plan.safe_cwd.as_deref() == Some(cwd) {
        return Ok((cwd.to_path_buf(), command.to_vec()));
    }
    if !p.has_shell {
        return Err(format!(
            "the image has no /bin/sh, through which the job enters its working directory {} as its user; leave spec.workingDir unset (the job's scratch directory) or use an image with a shell",
            cwd.display()
        ));
    }
    let mut args: Vec<String> = [
        "/bin/sh",
        "-c",
        "cd -- \"$1\" || exit 127; shift; exec \"$@\"",
        "lattice-cd",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(cwd.display().to_string());
    args.extend(command.iter().cloned());
    Ok((PathBuf::from("/"), args))
}

/// `ro` and `noexec` where the host's mount of `path` has them (a runtime's remount
/// for `nosuid,nodev` would otherwise clear them).
fn host_flags(path: &Path) -> Vec<&'static str> {
    let mut out = Vec::new();
    if let Ok(v) = nix::sys::statvfs::statvfs(path) {
        let f = v.flags();
        if f.contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
            out.push("ro");
        }
        if f.contains(nix::sys::statvfs::FsFlags::ST_NOEXEC) {
            out.push("noexec");
        }
    }
    out
}

/// What one task runs, as whom, where.
pub struct Process<'a> {
    /// argv.
    pub args: Vec<String>,
    /// The workload's environment with the task's own variables over it.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: &'a Path,
    /// uid, gid, supplementary groups (none: root, for a root agent running as itself).
    pub user: Option<(u32, u32, Vec<u32>)>,
}

/// The image's environment under the workload's (the workload's variables win, except
/// `PATH`, which is the image's: the host's directories mean nothing inside it).
pub fn merged_env(image_env: &[String], env: &[(String, String)]) -> Vec<String> {
    let mut out: std::collections::BTreeMap<String, String> = image_env
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let image_path = out.get("PATH").cloned();
    for (k, v) in env {
        out.insert(k.clone(), v.clone());
    }
    out.insert(
        "PATH".into(),
        image_path.unwrap_or_else(|| {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
        }),
    );
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Write task `i`'s bundle (`config.json`) under the prepared scratch.
pub fn write_bundle(
    plan: &ContainerPlan,
    p: &Prepared,
    i: usize,
    proc_: &Process,
) -> Result<(), String> {
    let dir = p.scratch.join(format!("task-{i}"));
    mkdir(&dir, 0o700)?;
    let cfg = config(plan, p, proc_);
    let bytes = serde_json::to_vec_pretty(&cfg).map_err(|e| e.to_string())?;
    std::fs::write(dir.join("config.json"), bytes)
        .map_err(|e| format!("cannot write {}: {e}", dir.join("config.json").display()))
}

/// The OCI runtime configuration of one task.
pub fn config(plan: &ContainerPlan, p: &Prepared, proc_: &Process) -> Value {
    let (uid, gid, groups) = proc_.user.clone().unwrap_or((0, 0, Vec::new()));
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "nosuid", "nodev"]}),
        json!({"destination": "/dev/mqueue", "type": "bind", "source": "/dev/mqueue", "options": ["rbind", "nosuid", "nodev", "noexec"]}),
        json!({"destination": "/sys", "type": "bind", "source": "/sys", "options": ["rbind", "ro", "nosuid", "noexec", "nodev"]}),
        json!({"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts", "options": ["bind", "ro", "nosuid", "nodev"]}),
        json!({"destination": "/etc/resolv.conf", "type": "bind", "source": "/etc/resolv.conf", "options": ["bind", "ro", "nosuid", "nodev"]}),
    ];
    mounts
        .retain(|m| m["type"] != "bind" || Path::new(m["source"].as_str().unwrap_or("")).exists());
    for b in &plan.binds {
        let mut o = vec!["rbind", "nosuid", "nodev"];
        if b.readonly {
            o.push("ro");
        }
        mounts.push(json!({"destination": b.path, "type": "bind", "source": b.path, "options": o}));
    }
    // Read-only and no-exec where the host has them.
    for m in mounts.iter_mut().filter(|m| m["type"] == "bind") {
        let extra = host_flags(Path::new(m["source"].as_str().unwrap_or("")));
        if let Some(o) = m["options"].as_array_mut() {
            for f in extra {
                if !o.iter().any(|x| x == f) {
                    o.push(json!(f));
                }
            }
        }
    }
    for d in &plan.devices {
        mounts.push(json!({"destination": d.target, "type": "bind", "source": d.source, "options": ["bind", "nosuid"]}));
    }
    let none: [&str; 0] = [];
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": uid, "gid": gid, "additionalGids": groups},
            "args": proc_.args,
            "env": merged_env(&plan.image_env, &proc_.env),
            "cwd": proc_.cwd,
            "capabilities": {"bounding": none, "effective": none, "inheritable": none, "permitted": none, "ambient": none},
            "noNewPrivileges": true,
        },
        "root": {"path": p.rootfs, "readonly": false},
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "mount"}],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"],
            "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_environment_wins_over_the_image_except_path() {
        let image = vec![
            "PATH=/opt/x/bin:/bin".to_string(),
            "LANG=C.UTF-8".into(),
            "A=image".into(),
        ];
        let env = vec![
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("A".into(), "job".into()),
            ("PMI_FD".into(), "3".into()),
        ];
        let m = merged_env(&image, &env);
        assert_eq!(
            m,
            vec!["A=job", "LANG=C.UTF-8", "PATH=/opt/x/bin:/bin", "PMI_FD=3"]
        );
        assert!(merged_env(&[], &[])
            .iter()
            .any(|e| e.starts_with("PATH=/usr/local/sbin")));
    }

    #[test]
    fn a_task_runs_as_the_user_without_capabilities_in_a_mount_namespace_only() {
        let plan = ContainerPlan {
            runtime: "/usr/bin/crun".into(),
            rootfs: "/var/lib/lattice/oci/x/rootfs".into(),
            binds: vec![
                Bind {
                    path: "/home/u".into(),
                    readonly: false,
                },
                Bind {
                    path: "/run/x".into(),
                    readonly: true,
                },
            ],
            devices: vec![DeviceBind {
                source: "/tmp/dev/nvidia0".into(),
                target: "/dev/nvidia0".into(),
            }],
            ..Default::default()
        };
        let p = Prepared {
            scratch: "/r/oci".into(),
            rootfs: "/r/oci/rootfs".into(),
            hide_unified: false,
            has_shell: true,
        };
        let cfg = config(
            &plan,
            &p,
            &Process {
                args: vec!["/bin/sh".into()],
                env: vec![],
                cwd: Path::new("/home/u"),
                user: Some((1000, 100, vec![100, 27])),
            },
        );
        assert_eq!(
            cfg["process"]["user"],
            json!({"uid": 1000, "gid": 100, "additionalGids": [100, 27]})
        );
        assert_eq!(cfg["process"]["noNewPrivileges"], json!(true));
        assert_eq!(cfg["process"]["capabilities"]["bounding"], json!([]));
        assert_eq!(cfg["linux"]["namespaces"], json!([{"type": "mount"}]));
        let mounts = cfg["mounts"].as_array().unwrap();
        let find = |d: &str| mounts.iter().find(|m| m["destination"] == d).cloned();
        assert_eq!(
            find("/home/u").unwrap()["options"],
            json!(["rbind", "nosuid", "nodev"])
        );
        assert_eq!(
            find("/run/x").unwrap()["options"],
            json!(["rbind", "nosuid", "nodev", "ro"])
        );
        assert!(find("/dev/nvidia0").is_some());
        assert_eq!(
            runtime_args(&p, 2, true),
            vec![
                "--root=/r/oci/state",
                "--cgroup-manager=disabled",
                "run",
                "--bundle=/r/oci/task-2",
                "--preserve-fds=1",
                "task-2"
            ]
        );
    }

    #[test]
    fn only_the_agents_own_directories_are_entered_by_the_runtime() {
        let plan = ContainerPlan {
            safe_cwd: Some("/var/lib/lattice/scratch/j".into()),
            ..Default::default()
        };
        let mut p = Prepared {
            scratch: "/r/oci".into(),
            rootfs: "/r/oci/rootfs".into(),
            hide_unified: false,
            has_shell: true,
        };
        let cmd = vec!["/bin/echo".to_string(), "hi".into()];
        let (cwd, args) =
            enter_cwd(&plan, &p, Path::new("/var/lib/lattice/scratch/j"), &cmd).unwrap();
        assert_eq!(
            (cwd, args),
            (PathBuf::from("/var/lib/lattice/scratch/j"), cmd.clone())
        );
        let (cwd, args) = enter_cwd(&plan, &p, Path::new("/home/u/proj"), &cmd).unwrap();
        assert_eq!(cwd, PathBuf::from("/"));
        assert_eq!(args[..2], ["/bin/sh".to_string(), "-c".into()]);
        assert_eq!(args[3..], ["lattice-cd", "/home/u/proj", "/bin/echo", "hi"]);
        p.has_shell = false;
        let e = enter_cwd(&plan, &p, Path::new("/home/u/proj"), &cmd).unwrap_err();
        assert!(e.contains("no /bin/sh"), "{e}");
    }
}
