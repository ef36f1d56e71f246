//! Files and directories the agent (root) makes for a job, made so that no user can
//! redirect them.
//!
//! A user owns their job's scratch directory and can plant a symbolic link in it at any
//! moment; a root process that creates, truncates, `chmod`s or `chown`s a path there
//! follows the link and writes wherever it points. So:
//!
//! * every file the agent creates for a job is created in a directory of its own (the
//!   run directory, root's, mode 0711) with `openat` relative to the directory's
//!   descriptor, `O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`, and given its mode and owner
//!   through the new file's descriptor (`fchmod`, `fchown`), never by path;
//! * directories handed to a user (the scratch directory) are made with `mkdirat` in a
//!   parent of the agent's, opened `O_DIRECTORY|O_NOFOLLOW` and handed over with
//!   `fchown` on that descriptor;
//! * trees a user owned are removed without following links: [`remove_tree`] (std's
//!   `remove_dir_all`, which on Linux walks with `openat(O_NOFOLLOW|O_DIRECTORY)` and
//!   `unlinkat`: a link is removed, never followed, and a directory swapped for a link
//!   during the walk is not entered).
//!
//! ```
//! # fn main() -> std::io::Result<()> {
//! use lattice_agent::files::Dir;
//! let tmp = tempfile::tempdir()?;
//! let run = Dir::open(tmp.path())?.fresh_dir("run-1", 0o711)?;
//! run.write_new("lattice-script", b"#!/bin/sh\necho hi\n", 0o700, None)?;
//! assert!(run.path().join("lattice-script").is_file());
//! # Ok(()) }
//! ```

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::libc;

/// An open directory: everything below goes through its descriptor.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} contains a NUL byte", p.display()),
        )
    })
}

/// A single path component: no `/`, not `.` or `..`, not empty.
fn c_name(name: &str) -> io::Result<CString> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        ));
    }
    c_path(Path::new(name))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

const DIR_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;

impl Dir {
    /// Open the directory `path` (its last component must not be a link).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = c_path(path)?;
        // SAFETY: a valid C string; the descriptor is owned below.
        let fd = cvt(unsafe { libc::open(c.as_ptr(), DIR_FLAGS) })?;
        Ok(Dir {
            // SAFETY: `fd` was just opened and is ours alone.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    /// Open the agent's own directory `path`, creating it (and its parents) with `mode`
    /// if missing. An existing one must be the agent's and writable by no one else (for
    /// a root agent, not by its group either): others who may write into it could swap
    /// its entries.
    pub fn own(path: &Path, mode: u32) -> io::Result<Dir> {
        if !path.exists() {
            std::fs::create_dir_all(path)?;
            let d = Dir::open(path)?;
            d.set_mode(mode)?;
            return Ok(d);
        }
        let d = Dir::open(path)?;
        let st = d.stat()?;
        let me = nix::unistd::geteuid().as_raw();
        // An unprivileged agent's group is its user's own (a umask of 002 makes 0775).
        let writable = if me == 0 { 0o022 } else { 0o002 };
        if st.st_uid != me || st.st_mode & writable != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is owned by uid {} with mode {:o}: it must belong to the agent's user (uid {me}) and be writable by no one else",
                    path.display(),
                    st.st_uid,
                    st.st_mode & 0o7777
                ),
            ));
        }
        Ok(d)
    }

    /// The path it was opened as (for messages and for handing to other processes).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path()/name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn stat(&self) -> io::Result<libc::stat> {
        // SAFETY: fstat fills the zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        cvt(unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) })?;
        Ok(st)
    }

    /// The entry `name`'s metadata, not following a link; `None` when absent.
    fn stat_at(&self, name: &CString) -> io::Result<Option<libc::stat>> {
        // SAFETY: fstatat fills the zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        match cvt(r) {
            Ok(_) => Ok(Some(st)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether `name` exists (a link counts, unfollowed).
    pub fn exists(&self, name: &str) -> bool {
        c_name(name)
            .and_then(|n| self.stat_at(&n))
            .is_ok_and(|s| s.is_some())
    }

    /// Open the existing sub-directory `name` (not through a link).
    pub fn sub(&self, name: &str) -> io::Result<Dir> {
        let n = c_name(name)?;
        // SAFETY: a valid C string relative to our descriptor.
        let fd = cvt(unsafe { libc::openat(self.fd.as_raw_fd(), n.as_ptr(), DIR_FLAGS) })?;
        Ok(Dir {
            // SAFETY: just opened, ours alone.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: self.path.join(name),
        })
    }

    /// Make the sub-directory `name` afresh with `mode`: whatever has that name (the
    /// leftover of a crash, or anything planted) is removed first, links unfollowed.
    pub fn fresh_dir(&self, name: &str, mode: u32) -> io::Result<Dir> {
        self.remove_all(name)?;
        self.make_dir(name, mode)
    }

    /// Open the sub-directory `name`, making it with `mode` if missing.
    pub fn ensure_dir(&self, name: &str, mode: u32) -> io::Result<Dir> {
        match self.make_dir(name, mode) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.sub(name),
            other => other,
        }
    }

    fn make_dir(&self, name: &str, mode: u32) -> io::Result<Dir> {
        let n = c_name(name)?;
        // SAFETY: a valid C string relative to our descriptor.
        cvt(unsafe { libc::mkdirat(self.fd.as_raw_fd(), n.as_ptr(), 0o700) })?;
        let d = self.sub(name)?;
        // The umask never decides: the mode is set on the descriptor.
        d.set_mode(mode)?;
        Ok(d)
    }

    /// `fchmod` the directory itself.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        // SAFETY: our descriptor.
        cvt(unsafe { libc::fchmod(self.fd.as_raw_fd(), mode as libc::mode_t) }).map(drop)
    }

    /// Hand the directory to `uid:gid` with `mode`, through its descriptor.
    pub fn give(&self, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
        // SAFETY: our descriptor.
        cvt(unsafe { libc::fchown(self.fd.as_raw_fd(), uid, gid) })?;
        self.set_mode(mode)
    }

    /// Create the new file `name` (never through a link, never an existing file).
    fn create(&self, name: &CString, mode: u32) -> io::Result<File> {
        // SAFETY: a valid C string relative to our descriptor; the descriptor is owned
        // by the returned File.
        let fd = cvt(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        })?;
        let f = unsafe { File::from_raw_fd(fd) };
        // SAFETY: the file's own descriptor.
        cvt(unsafe { libc::fchmod(f.as_raw_fd(), mode as libc::mode_t) })?;
        Ok(f)
    }

    /// Write the new file `name` with `bytes`, `mode` and (optionally) owner `uid:gid`,
    /// all through its descriptor. A leftover entry of that name is removed first (the
    /// directory is the agent's: only the agent puts anything there).
    pub fn write_new(
        &self,
        name: &str,
        bytes: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> io::Result<()> {
        let n = c_name(name)?;
        self.unlink(&n)?;
        let mut f = self.create(&n, mode)?;
        f.write_all(bytes)?;
        if let Some((uid, gid)) = owner {
            // SAFETY: the file's own descriptor.
            cvt(unsafe { libc::fchown(f.as_raw_fd(), uid, gid) })?;
        }
        f.sync_all()
    }

    /// Replace `name` with `bytes` atomically (a new temporary file, fsync, `renameat`,
    /// fsync of the directory): a crash leaves the old or the new content.
    pub fn write_atomic(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
        let n = c_name(name)?;
        let tmp = c_name(&format!(".{name}.tmp.{}", std::process::id()))?;
        self.unlink(&tmp)?;
        {
            let mut f = self.create(&tmp, mode)?;
            f.write_all(bytes)?;
            f.sync_all()?;
        }
        let dir = self.fd.as_raw_fd();
        // SAFETY: valid C strings relative to our descriptor.
        cvt(unsafe { libc::renameat(dir, tmp.as_ptr(), dir, n.as_ptr()) })?;
        // SAFETY: our descriptor.
        let _ = unsafe { libc::fsync(dir) };
        Ok(())
    }

    /// Open `name` for appending, creating it with `mode` when missing; never through a
    /// link.
    pub fn append(&self, name: &str, mode: u32) -> io::Result<File> {
        let n = c_name(name)?;
        // SAFETY: a valid C string relative to our descriptor; owned by the File.
        let fd = cvt(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                n.as_ptr(),
                libc::O_WRONLY
                    | libc::O_CREAT
                    | libc::O_APPEND
                    | libc::O_NOFOLLOW
                    | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })?;
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    fn unlink(&self, name: &CString) -> io::Result<()> {
        // SAFETY: a valid C string relative to our descriptor.
        match cvt(unsafe { libc::unlinkat(self.fd.as_raw_fd(), name.as_ptr(), 0) }) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Remove the entry `name` — for a directory, everything in it — never following a
    /// link. Absent is fine.
    pub fn remove_all(&self, name: &str) -> io::Result<()> {
        let n = c_name(name)?;
        match self.stat_at(&n)? {
            None => Ok(()),
            Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                match std::fs::remove_dir_all(self.path.join(name)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            }
            Some(_) => self.unlink(&n),
        }
    }
}

/// Remove `path` and everything under it without following links (see the module
/// docs); absent is fine, anything else is logged.
pub fn remove_tree(path: &Path) {
    if let Err(e) = std::fs::remove_dir_all(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn new_files_never_go_through_a_planted_link() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let d = Dir::open(tmp.path())
            .unwrap()
            .fresh_dir("run", 0o711)
            .unwrap();
        assert_eq!(mode(d.path()), 0o711);
        std::os::unix::fs::symlink(&victim, d.join("script")).unwrap();
        // write_new replaces the link itself, never its target.
        d.write_new("script", b"new", 0o700, None).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(mode(&victim), 0o600);
        assert_eq!(std::fs::read_to_string(d.join("script")).unwrap(), "new");
        assert_eq!(mode(&d.join("script")), 0o700);
        // An atomic write over a link replaces the link.
        std::os::unix::fs::symlink(&victim, d.join("state")).unwrap();
        d.write_atomic("state", b"{}", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(d.join("state"))
            .unwrap()
            .file_type()
            .is_symlink());
        // Appending refuses a link.
        std::os::unix::fs::symlink(&victim, d.join("log")).unwrap();
        assert!(d.append("log", 0o600).is_err());
        // A directory entry that is a link is not a directory to open.
        std::os::unix::fs::symlink(tmp.path(), d.join("sub")).unwrap();
        assert!(d.sub("sub").is_err());
        assert!(d.ensure_dir("sub", 0o700).is_err());
        for bad in ["", ".", "..", "a/b"] {
            assert!(d.write_new(bad, b"", 0o600, None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fresh_dirs_replace_links_and_leftovers_without_following_them() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("file"), "kept").unwrap();
        let root = Dir::open(tmp.path())
            .unwrap()
            .fresh_dir("scratch", 0o711)
            .unwrap();
        // A link where the directory goes.
        std::os::unix::fs::symlink(&outside, root.join("job-1")).unwrap();
        let job = root.fresh_dir("job-1", 0o700).unwrap();
        assert!(std::fs::symlink_metadata(job.path()).unwrap().is_dir());
        // A leftover tree with a link inside to a directory outside.
        std::fs::create_dir_all(job.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, job.join("a/b/link")).unwrap();
        std::os::unix::fs::symlink(outside.join("file"), job.join("flink")).unwrap();
        let job = root.fresh_dir("job-1", 0o700).unwrap();
        assert_eq!(std::fs::read_dir(job.path()).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_to_string(outside.join("file")).unwrap(),
            "kept"
        );
        std::fs::create_dir_all(job.join("x")).unwrap();
        std::os::unix::fs::symlink(&outside, job.join("x/link")).unwrap();
        remove_tree(job.path());
        assert!(!job.path().exists());
        assert_eq!(
            std::fs::read_to_string(outside.join("file")).unwrap(),
            "kept"
        );
        // remove_tree on a link removes the link only.
        std::os::unix::fs::symlink(&outside, tmp.path().join("l")).unwrap();
        remove_tree(&tmp.path().join("l"));
        assert!(outside.join("file").exists());
    }

    #[test]
    fn own_directories_must_not_be_writable_by_others() {
        let tmp = tempfile::tempdir().unwrap();
        let made = Dir::own(&tmp.path().join("a/b"), 0o711).unwrap();
        assert_eq!(mode(made.path()), 0o711);
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Dir::own(&open, 0o711).unwrap_err().to_string();
        assert!(e.contains("writable by no one else"), "{e}");
        // Group-writable: refused for root, whose group may hold users; an unprivileged
        // agent's group is its own.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert_eq!(
            Dir::own(&open, 0o711).is_ok(),
            !nix::unistd::geteuid().is_root()
        );
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path().join("a"), &link).unwrap();
        assert!(
            Dir::own(&link, 0o711).is_err(),
            "a link is not a directory of ours"
        );
    }

    #[test]
    fn give_hands_a_directory_over_by_descriptor() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let d = Dir::open(tmp.path())
            .unwrap()
            .fresh_dir("s", 0o711)
            .unwrap();
        d.give(65534, 65534, 0o700).unwrap();
        let m = std::fs::metadata(d.path()).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (65534, 65534, 0o700));
        d.write_new("f", b"x", 0o600, Some((65534, 65534))).unwrap();
        let m = std::fs::metadata(d.join("f")).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (65534, 0o600));
    }
}
