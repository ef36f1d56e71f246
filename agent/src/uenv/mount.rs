//! Mounting uenv images, in the shim, as root, before any task starts: a private mount
//! namespace for the run, then each image on a read-only loop device at its mount point.
//! The namespace (and with it the mounts and, through `LO_FLAGS_AUTOCLEAR`, the loop
//! devices) goes away with the run's last process; the host never sees the mounts.
//!
//! The mount point is reached without following links: each component is opened with
//! `O_PATH | O_NOFOLLOW` below the previous one, must be a directory owned by root that
//! others cannot write (or a sticky one, like `/tmp`, for the components above it), and
//! the image is mounted on `/proc/self/fd/N` of the last one. So a user who can create
//! links somewhere cannot point a mount over anything else.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::libc;

/// `LOOP_CTL_GET_FREE`.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// `LOOP_CONFIGURE` (Linux 5.8).
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
/// `LOOP_SET_FD` and `LOOP_SET_STATUS64` (older kernels).
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn err(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn cstr(p: &str) -> Result<CString, String> {
    CString::new(p).map_err(|_| format!("{p:?} contains a NUL byte"))
}

fn open(dir: Option<&OwnedFd>, name: &str, flags: libc::c_int) -> std::io::Result<OwnedFd> {
    let c = CString::new(name).map_err(|_| std::io::Error::other("NUL in a path"))?;
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: a valid C string and directory descriptor; the result is owned below.
    let fd = unsafe { libc::openat(at, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The mount point `target`, opened component by component without following links.
fn open_mount_point(target: &Path) -> Result<OwnedFd, String> {
    let shown = target.display().to_string();
    let mut dir = open(None, "/", libc::O_PATH | libc::O_DIRECTORY).map_err(err("/"))?;
    let parts: Vec<&str> = target
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => n.to_str(),
            _ => None,
        })
        .collect();
    for (i, name) in parts.iter().enumerate() {
        let next = open(
            Some(&dir),
            name,
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY,
        )
        .map_err(|e| {
            format!("mount point {shown}: {name} is not a directory reached without a link ({e}); the site must create it")
        })?;
        let st = nix::sys::stat::fstat(next.as_raw_fd())
            .map_err(|e| format!("mount point {shown}: {e}"))?;
        let last = i + 1 == parts.len();
        let writable_by_others = st.st_mode & 0o022 != 0;
        let sticky = st.st_mode & 0o1000 != 0;
        if st.st_uid != 0 || (writable_by_others && (last || !sticky)) {
            return Err(format!(
                "mount point {shown}: {name} must be owned by root and writable by no one else; the site must create it so"
            ));
        }
        dir = next;
    }
    Ok(dir)
}

/// A free loop device with `image` on it, read-only, released with its last mount.
fn attach_loop(image: &OwnedFd) -> Result<OwnedFd, String> {
    let ctl = open(None, "/dev/loop-control", libc::O_RDWR).map_err(err("/dev/loop-control"))?;
    for _ in 0..64 {
        // SAFETY: an ioctl without argument on the control device.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(format!(
                "no free loop device: {}",
                std::io::Error::last_os_error()
            ));
        }
        let path = format!("/dev/loop{n}");
        let dev = open(None, &path, libc::O_RDONLY).map_err(err(&path))?;
        // SAFETY: zeroed plain C structs, then the fields the kernel reads.
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = image.as_raw_fd() as u32;
        cfg.info.lo_flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
        // SAFETY: LOOP_CONFIGURE with a valid `struct loop_config`.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &cfg) };
        if rc == 0 {
            return Ok(dev);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // Another run took it between GET_FREE and here.
            Some(libc::EBUSY) => continue,
            // A kernel before 5.8: the two-step way.
            Some(libc::EINVAL) | Some(libc::ENOTTY) => {
                // SAFETY: LOOP_SET_FD with our image descriptor.
                if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_FD as _, image.as_raw_fd()) } < 0
                {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::EBUSY) {
                        continue;
                    }
                    return Err(format!("{path}: {e}"));
                }
                // SAFETY: LOOP_SET_STATUS64 with a valid `struct loop_info64`.
                let rc = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64 as _, &cfg.info) };
                if rc < 0 {
                    return Err(format!("{path}: {}", std::io::Error::last_os_error()));
                }
                return Ok(dev);
            }
            _ => return Err(format!("{path}: {e}")),
        }
    }
    Err("no free loop device after 64 tries".into())
}

/// Enter a private mount namespace and mount each `(image, target)` read-only there.
pub fn enter(mounts: &[(String, String)]) -> Result<(), String> {
    // SAFETY: unshare and mount with valid arguments.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) < 0 {
            return Err(format!(
                "cannot make a private mount namespace: {}",
                std::io::Error::last_os_error()
            ));
        }
        // Nothing mounted here propagates back to the host (mounts the host makes later,
        // an automounted home, still reach the run).
        let root = cstr("/")?;
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) < 0
        {
            return Err(format!(
                "cannot make the mount namespace private: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    for (image, target) in mounts {
        let img = open(None, image, libc::O_RDONLY | libc::O_NOFOLLOW)
            .map_err(|e| format!("uenv image {image}: {e}"))?;
        let dev = attach_loop(&img)?;
        let at = open_mount_point(Path::new(target))?;
        let source = cstr(&format!("/proc/self/fd/{}", dev.as_raw_fd()))?;
        let on = cstr(&format!("/proc/self/fd/{}", at.as_raw_fd()))?;
        let fstype = cstr("squashfs")?;
        // SAFETY: mount with valid C strings.
        let rc = unsafe {
            libc::mount(
                source.as_ptr(),
                on.as_ptr(),
                fstype.as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                std::ptr::null(),
            )
        };
        if rc < 0 {
            return Err(format!(
                "cannot mount uenv image {image} at {target}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// [`open_mount_point`], for the tests.
#[cfg(test)]
pub fn tests_open(target: &Path) -> Result<(), String> {
    open_mount_point(target).map(drop)
}
