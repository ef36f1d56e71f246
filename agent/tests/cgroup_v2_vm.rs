//! cgroup v2 for real. Machines like the CI's bind the memory and pids controllers to
//! cgroup v1, and a controller bound to a v1 hierarchy in use cannot be moved to v2, so
//! the agent's v2 path (memory, CPU, pids and its device BPF program) is exercised in a
//! small virtual machine instead: Debian's kernel (`linux-image-amd64`), booted with
//! cgroup v1 off (`cgroup_no_v1=all`) from an initramfs holding busybox and this very
//! test binary (with the libraries it links). Inside, [`inside_the_vm`] runs the agent's
//! cgroup code against that kernel and prints `VM-RESULT ok`.
//!
//! Needs `qemu-system-x86_64`, a kernel in `/boot` and `/bin/busybox`
//! (`hack/install-deps.sh` installs them) and skips itself without them. It boots under
//! emulation (about half a minute; `LATTICE_VM_ACCEL=kvm` for a few seconds where KVM
//! works — nested in a VM it may hang at boot).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lattice_agent::cgroup::devices::Device;
use lattice_agent::cgroup::hierarchy::{Controller, Layout};
use lattice_agent::cgroup::limits::Resources;
use lattice_agent::cgroup::{self, Cgroups, Limits};
use lattice_agent::state::TaskKey;

/// The kernel command line marker that tells [`inside_the_vm`] it is in the VM.
const MARKER: &str = "lattice-vm-test";

/// A `newc` cpio archive (what the kernel unpacks as its initramfs).
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let name = name.trim_start_matches('/');
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }

    fn file(&mut self, name: &str, data: &[u8], perm: u32) {
        self.entry(name, 0o100000 | perm, data);
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120777, target.as_bytes());
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// The shared libraries `exe` loads (absolute paths, from `ldd`).
fn libraries(exe: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(exe).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

fn newest_kernel() -> Option<PathBuf> {
    let mut k: Vec<PathBuf> = std::fs::read_dir("/boot")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .collect();
    k.sort();
    k.pop()
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file())
}

const INIT: &str = "#!/bin/sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t tmpfs tmp /tmp
/bin/busybox mount -t cgroup2 cgroup2 /sys/fs/cgroup
/t --exact inside_the_vm --ignored --nocapture --test-threads 1
echo \"VM-EXIT $?\"
/bin/busybox poweroff -f
";

#[test]
fn cgroup_v2_limits_hold_in_a_vm() {
    let (Some(qemu), Some(kernel)) = (which("qemu-system-x86_64"), newest_kernel()) else {
        eprintln!("skipped: needs qemu-system-x86_64 and a kernel in /boot (hack/install-deps.sh)");
        return;
    };
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        eprintln!("skipped: needs /bin/busybox (busybox-static)");
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let mut cpio = Cpio::default();
    for d in [
        "/bin", "/proc", "/sys", "/dev", "/tmp", "/lib", "/lib64", "/usr", "/usr/lib",
    ] {
        cpio.dir(d);
    }
    cpio.file("/init", INIT.as_bytes(), 0o755);
    cpio.file("/bin/busybox", &std::fs::read(busybox).unwrap(), 0o755);
    for tool in ["sh", "dd", "head", "sleep", "cat", "echo"] {
        cpio.symlink(&format!("/bin/{tool}"), "busybox");
    }
    cpio.file("/t", &std::fs::read(&exe).unwrap(), 0o755);
    let mut dirs_made = std::collections::HashSet::new();
    for lib in libraries(&exe) {
        let mut parts = PathBuf::from("/");
        for c in lib.parent().unwrap().components().skip(1) {
            parts.push(c);
            let s = parts.display().to_string();
            if dirs_made.insert(s.clone())
                && !["/lib", "/lib64", "/usr", "/usr/lib"].contains(&s.as_str())
            {
                cpio.dir(&s);
            }
        }
        let real = std::fs::canonicalize(&lib).unwrap();
        cpio.file(
            &lib.display().to_string(),
            &std::fs::read(real).unwrap(),
            0o755,
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let initrd = tmp.path().join("initrd.cpio");
    std::fs::File::create(&initrd)
        .unwrap()
        .write_all(&cpio.finish())
        .unwrap();
    std::fs::set_permissions(&initrd, std::fs::Permissions::from_mode(0o644)).unwrap();

    // Emulated by default: KVM nested in a VM (as on the CI's machines) can hang at
    // boot; LATTICE_VM_ACCEL=kvm where it works well.
    let accel = std::env::var("LATTICE_VM_ACCEL").unwrap_or_else(|_| "tcg".into());
    let start = Instant::now();
    let mut child = Command::new(qemu)
        .args([
            "-machine",
            &format!("accel={accel}"),
            "-m",
            "1024",
            "-smp",
            "1",
        ])
        .args([
            "-nographic",
            "-no-reboot",
            "-monitor",
            "none",
            "-serial",
            "stdio",
        ])
        .args(["-nic", "none"])
        .arg("-kernel")
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            &format!("console=ttyS0 cgroup_no_v1=all panic=-1 quiet {MARKER}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("qemu");
    // Read on threads; kill qemu if the VM hangs.
    let mut stdout = child.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    let limit = Duration::from_secs(150);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let console = out.join().unwrap_or_default();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    eprintln!("VM ran {:?} with {}", start.elapsed(), kernel.display());
    for l in console.lines().filter(|l| {
        ["layout:", "memory:", "pids:", "devices:", "VM-"]
            .iter()
            .any(|p| l.starts_with(p))
    }) {
        eprintln!("  {}", l.trim_end());
    }
    assert!(
        status.is_some(),
        "the VM did not finish in {limit:?}:\n{console}\n{err}"
    );
    assert!(
        console.contains("VM-RESULT ok") && console.contains("VM-EXIT 0"),
        "in the VM:\n{console}\n{err}"
    );
}

/// Run `script` with busybox sh in the groups `dirs` (joined between fork and exec, as
/// the shim does); its exit status and output.
fn run_in(dirs: &[PathBuf], script: &str) -> (std::process::ExitStatus, String) {
    let files = cgroup::procs_files(dirs).unwrap();
    // SAFETY: join() is async-signal-safe (open/write/close).
    let out = unsafe {
        Command::new("/bin/sh")
            .args(["-c", script])
            .pre_exec(move || cgroup::join(&files))
            .output()
            .unwrap()
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
#[ignore = "runs inside the VM of cgroup_v2_limits_hold_in_a_vm"]
fn inside_the_vm() {
    use std::os::unix::process::ExitStatusExt;
    if !read(Path::new("/proc/cmdline")).contains(MARKER) {
        return;
    }
    let root = Path::new(cgroup::DEFAULT_ROOT);
    let layout = Layout::detect(root).unwrap();
    println!("layout: {}", layout.describe());
    assert_eq!(layout.hierarchies.len(), 1, "{layout:?}");
    let h = &layout.hierarchies[0];
    assert!(h.v2);
    for c in [
        Controller::Memory,
        Controller::Cpu,
        Controller::Pids,
        Controller::Devices,
    ] {
        assert!(h.has(c), "{c:?} not on v2: {layout:?}");
    }
    for minor in [0, 1] {
        nix::sys::stat::mknod(
            &PathBuf::from(format!("/tmp/gpu{minor}")),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(240, minor),
        )
        .unwrap();
    }
    let limits = Limits {
        resources: Resources {
            memory: 64 << 20,
            cpu_millis: 500,
            pids: 16,
        },
        deny: vec![Device {
            block: false,
            major: 240,
            minor: 1,
        }],
    };
    let cg = Cgroups::open(root, "vm", "inst", limits).unwrap();
    let dirs = cg.create(&TaskKey::new("u", 1)).unwrap();
    assert_eq!(dirs, vec![root.join("lattice/vm/inst/u-1")]);
    let d = &dirs[0];
    assert_eq!(read(&d.join("memory.max")), (64u64 << 20).to_string());
    assert_eq!(read(&d.join("cpu.max")), "50000 100000");
    assert_eq!(read(&d.join("pids.max")), "16");

    // Memory: a 128 MiB buffer is killed at the 64 MiB limit, and the kill is counted.
    let (st, out) = run_in(&dirs, "exec dd if=/dev/zero of=/dev/null bs=128M count=1");
    assert_eq!(st.signal(), Some(9), "{st:?}: {out}");
    assert!(
        Cgroups::oom_kills(&dirs) >= 1,
        "{}",
        read(&d.join("memory.events"))
    );
    println!("memory: killed at the limit, oom_kill counted");

    // pids: a loop of background sleeps stops at 16 processes.
    let (_, out) = run_in(
        &dirs,
        "i=0; while [ $i -lt 40 ]; do sleep 1 & i=$((i+1)); done; wait",
    );
    let refused: u64 = read(&d.join("pids.events"))
        .strip_prefix("max ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(refused > 0, "no fork was refused: {out}");
    println!("pids: {refused} forks refused at the limit");

    // Devices: the BPF program denies gpu1, allows gpu0.
    let (_, out) = run_in(&dirs, "head -c1 /tmp/gpu0; head -c1 /tmp/gpu1");
    assert!(out.contains("No such device or address"), "{out}");
    assert!(out.contains("Operation not permitted"), "{out}");
    println!("devices: denied by the BPF program");

    Cgroups::remove(&dirs);
    assert!(!d.exists());
    println!("VM-RESULT ok");
}
