//! Device control on cgroup v2: a `BPF_PROG_TYPE_CGROUP_DEVICE` program, attached to a
//! group, decides every open/mknod of a device node by a member of the group.
//!
//! The program is small and fixed in shape, so it is assembled here by hand and loaded
//! with the raw `bpf(2)` system call rather than through an eBPF toolchain: for each
//! denied device, compare the access's type, major and minor and return 0 (deny) on a
//! match; return 1 (allow) at the end. It is attached with `BPF_F_ALLOW_MULTI`, so
//! programs of the groups above (systemd's, a container runtime's) keep applying: the
//! kernel allows an access only when every program on the path allows it. The group
//! holds the program; it goes with the group.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::libc;

use super::devices::Device;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;
/// `BPF_DEVCG_DEV_BLOCK` / `BPF_DEVCG_DEV_CHAR` in the access's low 16 bits.
const DEV_BLOCK: i32 = 1;
const DEV_CHAR: i32 = 2;

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    /// dst in the low nibble, src in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

// Opcodes (class | size/op | mode/source).
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU32_AND_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

/// The program denying `deny`. Its context is `struct bpf_cgroup_dev_ctx { u32
/// access_type; u32 major; u32 minor; }`, the device type in `access_type`'s low 16 bits.
pub fn program(deny: &[Device]) -> Vec<Insn> {
    let mut p = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0), // r2 = ctx->access_type
        insn(ALU32_AND_K, 2, 0, 0, 0xffff),
        insn(LDX_MEM_W, 3, 1, 4, 0), // r3 = ctx->major
        insn(LDX_MEM_W, 4, 1, 8, 0), // r4 = ctx->minor
    ];
    for d in deny {
        let kind = if d.block { DEV_BLOCK } else { DEV_CHAR };
        // Each test skips to the next device's block (5 instructions on) on a mismatch.
        p.push(insn(JNE_K, 2, 0, 4, kind));
        p.push(insn(JNE_K, 3, 0, 3, d.major as i32));
        p.push(insn(JNE_K, 4, 0, 2, d.minor as i32));
        p.push(insn(MOV64_K, 0, 0, 0, 0));
        p.push(insn(EXIT, 0, 0, 0, 0));
    }
    p.push(insn(MOV64_K, 0, 0, 0, 1));
    p.push(insn(EXIT, 0, 0, 0, 0));
    p
}

/// `union bpf_attr` for BPF_PROG_LOAD (the fields used, then zeroes, which the kernel
/// accepts for the newer fields it knows).
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _rest: [u64; 12],
}

/// `union bpf_attr` for BPF_PROG_ATTACH.
#[repr(C)]
#[derive(Default)]
struct ProgAttach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    _rest: [u32; 11],
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a properly sized, initialised `union bpf_attr` prefix.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Load the program denying `deny`; its descriptor.
pub fn load(deny: &[Device]) -> io::Result<OwnedFd> {
    let insns = program(deny);
    // The program calls no helper, so the license (the project's) matters to nothing.
    let license = c"Apache-2.0";
    let mut log = vec![0u8; 4096];
    let mut name = [0u8; 16];
    name[..13].copy_from_slice(b"lattice_devcg");
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        ..Default::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: the kernel returned a new descriptor, ours alone.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(e) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let verifier = String::from_utf8_lossy(&log[..end]);
            Err(io::Error::new(
                e.kind(),
                format!(
                    "loading the device program: {e}; verifier: {}",
                    verifier.trim()
                ),
            ))
        }
    }
}

/// Deny `deny` to the members of the v2 group `dir` (and its descendants).
pub fn deny_devices(dir: &Path, deny: &[Device]) -> io::Result<()> {
    let prog = load(deny)?;
    let group = std::fs::File::open(dir)?;
    let mut attr = ProgAttach {
        target_fd: group.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        ..Default::default()
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("attaching the device program to {}: {e}", dir.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_shape() {
        let d = Device {
            block: false,
            major: 195,
            minor: 1,
        };
        let p = program(&[d]);
        assert_eq!(p.len(), 4 + 5 + 2);
        assert_eq!(p[4], insn(JNE_K, 2, 0, 4, DEV_CHAR));
        assert_eq!(p[5].imm, 195);
        assert_eq!(p[6].imm, 1);
        // The mismatch jumps land on the final "allow".
        assert_eq!(4 + 1 + p[4].off as usize, 9);
        assert_eq!(p[9], insn(MOV64_K, 0, 0, 0, 1));
        assert_eq!(std::mem::size_of::<Insn>(), 8);
    }

    /// The real kernel path: a v2 group (any writable cgroup2 mount will do, device
    /// programs need no controller) with the program denies one fake device node and
    /// allows its neighbour.
    #[test]
    fn the_kernel_denies_what_the_program_denies() {
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let Some(v2) = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .iter()
            .map(Path::new)
            .find(|p| p.join("cgroup.controllers").exists())
        else {
            eprintln!("skipped: no cgroup v2 mount");
            return;
        };
        let group = v2.join(format!("lattice-bpf-test-{}", std::process::id()));
        if std::fs::create_dir(&group).is_err() {
            eprintln!("skipped: {} is not writable", v2.display());
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        for minor in [0, 1] {
            nix::sys::stat::mknod(
                &tmp.path().join(format!("gpu{minor}")),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(240, minor),
            )
            .unwrap();
        }
        let denied = Device {
            block: false,
            major: 240,
            minor: 1,
        };
        let attached = deny_devices(&group, &[denied]);
        let procs = std::ffi::CString::new(
            group
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        let open = |name: &str| {
            let procs = procs.clone();
            // SAFETY: only open(2)/write(2)/close(2) between fork and exec.
            let out = unsafe {
                std::process::Command::new("/bin/sh")
                    .arg("-c")
                    .arg(format!(
                        "head -c1 {} 2>&1 >/dev/null",
                        tmp.path().join(name).display()
                    ))
                    .pre_exec(move || {
                        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                        if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                            return Err(io::Error::last_os_error());
                        }
                        libc::close(fd);
                        Ok(())
                    })
                    .output()
                    .unwrap()
            };
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let (allowed, refused) = (open("gpu0"), open("gpu1"));
        let _ = std::fs::remove_dir(&group);
        attached.unwrap();
        assert!(allowed.contains("No such device or address"), "{allowed}");
        assert!(refused.contains("Operation not permitted"), "{refused}");
    }
}
