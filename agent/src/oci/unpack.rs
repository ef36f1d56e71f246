//! Layers into a root file system, as root, on descriptors.
//!
//! A layer is a tar stream written by whoever built the image: every path in it is
//! hostile. Each entry's parent is opened with `openat2(RESOLVE_IN_ROOT)` from the root
//! directory's descriptor, so `..` and symbolic links (absolute or relative, from this
//! layer or an earlier one) resolve inside the root file system and never outside it;
//! the entry itself is made with `*at` calls relative to that parent, never following a
//! link in its last component. OCI whiteouts are applied: `.wh.NAME` removes `NAME`
//! from the layers below, `.wh..wh..opq` empties its directory of what the layers below
//! put there.
//!
//! What is not carried over: set-user-ID and set-group-ID bits (the container runs with
//! `no_new_privs` anyway, and the cache must hold no privileged programs), device nodes
//! (the runtime makes `/dev`), extended attributes and file capabilities.

use std::collections::HashSet;
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::libc;

/// The most entries one image may have (all layers).
pub const MAX_ENTRIES: u64 = 2_000_000;
/// Free space an unpack leaves on the agent's disk.
const KEEP_FREE: u64 = 2 << 30;

/// What unpacking the layers so far has cost, bounded across the image.
#[derive(Debug, Default)]
pub struct Budget {
    /// Bytes written (regular files).
    pub bytes: u64,
    /// Entries seen.
    pub entries: u64,
    /// Device nodes skipped.
    pub devices_skipped: u64,
    /// Bytes of the decompressed layers read so far.
    pub stream: u64,
    /// The most bytes the image may unpack to.
    pub max_bytes: u64,
    checked_at: u64,
}

impl Budget {
    /// A budget of `max_bytes` unpacked.
    pub fn new(max_bytes: u64) -> Budget {
        Budget {
            max_bytes,
            ..Default::default()
        }
    }
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: a NUL byte in the name", p.display()))
}

fn os(what: impl std::fmt::Display) -> impl Fn(std::io::Error) -> String {
    move |e| format!("{what}: {e}")
}

fn last_err() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Open `rel` (relative, already checked) beneath `root` as if `root` were `/`.
fn open_in_root(root: RawFd, rel: &Path, flags: OFlag) -> std::io::Result<OwnedFd> {
    let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(
        ResolveFlag::RESOLVE_IN_ROOT
            | ResolveFlag::RESOLVE_NO_MAGICLINKS
            | ResolveFlag::RESOLVE_NO_XDEV,
    );
    let p = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let fd = nix::fcntl::openat2(root, p, how).map_err(std::io::Error::from)?;
    // SAFETY: a new descriptor, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `rel`'s parent directory beneath `root` (made, root-owned 0755, where missing).
fn parent_dir(root: RawFd, rel: &Path) -> Result<OwnedFd, String> {
    let parent = rel.parent().unwrap_or(Path::new(""));
    match open_in_root(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(format!("{}: {e}", parent.display())),
    }
    // Make the missing directories one level at a time, each resolved from the root.
    let mut at = open_in_root(root, Path::new(""), OFlag::O_PATH | OFlag::O_DIRECTORY)
        .map_err(os("the root file system"))?;
    let mut sofar = PathBuf::new();
    for c in parent.components() {
        sofar.push(c);
        match open_in_root(root, &sofar, OFlag::O_PATH | OFlag::O_DIRECTORY) {
            Ok(fd) => at = fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let name = cstr(Path::new(c.as_os_str()))?;
                // SAFETY: mkdirat on a descriptor and a C string.
                if unsafe { libc::mkdirat(at.as_raw_fd(), name.as_ptr(), 0o755) } < 0 {
                    let e = last_err();
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(format!("{}: {e}", sofar.display()));
                    }
                }
                at = open_in_root(root, &sofar, OFlag::O_PATH | OFlag::O_DIRECTORY)
                    .map_err(os(sofar.display()))?;
            }
            Err(e) => return Err(format!("{}: {e}", sofar.display())),
        }
    }
    Ok(at)
}

/// The path of an entry as a clean relative path (`None`: the root itself).
fn clean(raw: &Path) -> Result<Option<PathBuf>, String> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(format!(
                    "the layer has the path {:?}, which climbs out with '..'",
                    raw.display()
                ))
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// What is at `name` in `dir`, without following a link.
fn lstat_at(dir: RawFd, name: &CString) -> std::io::Result<Option<libc::stat>> {
    // SAFETY: fstatat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc < 0 {
        let e = last_err();
        return if e.raw_os_error() == Some(libc::ENOENT) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    Ok(Some(st))
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Remove `name` from `dir`, a directory with everything in it.
fn remove_at(dir: RawFd, name: &CString) -> std::io::Result<()> {
    let Some(st) = lstat_at(dir, name)? else {
        return Ok(());
    };
    if is_dir(&st) {
        // SAFETY: openat relative to a descriptor, never following a link.
        let fd = unsafe {
            libc::openat(
                dir,
                name.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(last_err());
        }
        // SAFETY: a new descriptor, owned here.
        let sub = unsafe { OwnedFd::from_raw_fd(fd) };
        empty_dir(sub.as_raw_fd(), &HashSet::new(), Path::new(""))?;
        // SAFETY: unlinkat with a C string.
        if unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) } < 0 {
            return Err(last_err());
        }
    } else if unsafe { libc::unlinkat(dir, name.as_ptr(), 0) } < 0 {
        return Err(last_err());
    }
    Ok(())
}

/// Remove every entry of directory `dir` (at `path` in the image) except those in `keep`.
fn empty_dir(dir: RawFd, keep: &HashSet<PathBuf>, path: &Path) -> std::io::Result<()> {
    // SAFETY: dup of a valid descriptor, handed to fdopendir (which owns it).
    let dup = unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(last_err());
    }
    // SAFETY: fdopendir takes the duplicate; closedir below releases it.
    let d = unsafe { libc::fdopendir(dup) };
    if d.is_null() {
        let e = last_err();
        unsafe { libc::close(dup) };
        return Err(e);
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: readdir on an open stream; the entry is copied before the next call.
        let ent = unsafe { libc::readdir(d) };
        if ent.is_null() {
            break;
        }
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    unsafe { libc::closedir(d) };
    for n in names {
        let p =
            path.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n.as_bytes()));
        if !keep.contains(&p) {
            remove_at(dir, &n)?;
        }
    }
    Ok(())
}

/// Unpack one layer (an uncompressed tar stream) onto the root file system open at
/// `root` (where the layers below it are).
pub fn layer(root: &OwnedFd, src: impl Read, budget: &mut Budget) -> Result<(), String> {
    let root = root.as_raw_fd();
    // The whole decompressed stream is bounded, and extension headers are read here with
    // small limits (the tar reader would read a long name of any length into memory).
    let mut counted = Counted {
        inner: src,
        left: budget.max_bytes.saturating_sub(budget.stream),
        read: 0,
    };
    let result = entries(root, &mut counted, budget);
    budget.stream = budget.stream.saturating_add(counted.read);
    result
}

/// The most bytes one extension header (a long name, PAX records) may have.
const MAX_EXTENSION: u64 = 64 << 10;

/// A reader that fails once it has given `left` bytes.
struct Counted<R> {
    inner: R,
    left: u64,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Err(std::io::Error::other(
                "the image's layers decompress to more than the agent allows",
            ));
        }
        let want = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        self.read += n as u64;
        Ok(n)
    }
}

/// What GNU and PAX extension headers say about the next entry.
#[derive(Default)]
struct Extensions {
    name: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

impl Extensions {
    /// PAX records: `LEN KEY=VALUE\n`, LEN counting the whole record.
    fn pax(&mut self, mut data: &[u8]) -> Result<(), String> {
        while !data.is_empty() {
            let sp = data
                .iter()
                .position(|b| *b == b' ')
                .ok_or("a PAX record without a length")?;
            let len: usize = std::str::from_utf8(&data[..sp])
                .ok()
                .and_then(|l| l.parse().ok())
                .ok_or("a PAX record with a bad length")?;
            if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
                return Err("a PAX record with a bad length".into());
            }
            let kv = &data[sp + 1..len - 1];
            if let Some(eq) = kv.iter().position(|b| *b == b'=') {
                let (k, v) = (&kv[..eq], &kv[eq + 1..]);
                match k {
                    b"path" => self.name = Some(v.to_vec()),
                    b"linkpath" => self.link = Some(v.to_vec()),
                    b"size" => self.size = std::str::from_utf8(v).ok().and_then(|v| v.parse().ok()),
                    _ => {}
                }
            }
            data = &data[len..];
        }
        Ok(())
    }
}

fn path_of(bytes: &[u8]) -> PathBuf {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&bytes[..end]))
}

fn entries(root: RawFd, src: impl Read, budget: &mut Budget) -> Result<(), String> {
    use tar::EntryType as T;
    let mut archive = tar::Archive::new(src);
    // What this layer made: an opaque whiteout keeps them.
    let mut made: HashSet<PathBuf> = HashSet::new();
    let mut ext = Extensions::default();
    let entries = archive
        .entries()
        .map_err(|e| format!("the layer is not a tar stream: {e}"))?
        .raw(true);
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("the layer's tar stream is damaged: {e}"))?;
        budget.entries += 1;
        if budget.entries > MAX_ENTRIES {
            return Err(format!("the image has more than {MAX_ENTRIES} entries"));
        }
        let kind = entry.header().entry_type();
        let size = entry
            .header()
            .size()
            .map_err(|e| format!("an entry of the layer has no usable size: {e}"))?;
        if matches!(
            kind,
            T::GNULongName | T::GNULongLink | T::XHeader | T::XGlobalHeader
        ) {
            if size > MAX_EXTENSION {
                return Err(format!(
                    "an extension header of {size} bytes; at most {MAX_EXTENSION}"
                ));
            }
            let mut data = Vec::with_capacity(size as usize);
            (&mut entry)
                .take(size)
                .read_to_end(&mut data)
                .map_err(|e| format!("the layer's tar stream is damaged: {e}"))?;
            match kind {
                T::GNULongName => ext.name = Some(data),
                T::GNULongLink => ext.link = Some(data),
                T::XHeader => ext.pax(&data)?,
                _ => {}
            }
            continue;
        }
        let ext_now = std::mem::take(&mut ext);
        if ext_now.size.is_some_and(|s| s != size) {
            return Err("a file larger than 8 GiB (a PAX size); not supported".into());
        }
        let raw = ext_now
            .name
            .as_deref()
            .map(path_of)
            .unwrap_or_else(|| path_of(&entry.path_bytes()));
        let link = ext_now
            .link
            .as_deref()
            .map(path_of)
            .or_else(|| entry.link_name_bytes().map(|b| path_of(&b)));
        if size > 0 && !matches!(kind, T::Regular | T::Continuous) {
            return Err(format!(
                "{}: a {kind:?} entry with {size} bytes of data",
                raw.display()
            ));
        }
        let Some(rel) = clean(&raw)? else {
            continue;
        };
        let Some(name) = rel.file_name().map(|n| n.to_owned()) else {
            continue;
        };
        let name_bytes = name.as_encoded_bytes();
        let parent = parent_dir(root, &rel)?;
        let pfd = parent.as_raw_fd();
        if name_bytes == b".wh..wh..opq" {
            let dir = rel.parent().unwrap_or(Path::new("")).to_path_buf();
            let d = open_in_root(root, &dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
                .map_err(os(dir.display()))?;
            empty_dir(d.as_raw_fd(), &made, &dir).map_err(os(dir.display()))?;
            continue;
        }
        if let Some(gone) = name_bytes.strip_prefix(b".wh.") {
            if gone.is_empty() || gone == b"." || gone == b".." || gone.contains(&b'/') {
                return Err(format!("{}: not a whiteout of an entry", rel.display()));
            }
            let gone = CString::new(gone).map_err(|_| "a NUL byte in a whiteout".to_string())?;
            remove_at(pfd, &gone).map_err(os(rel.display()))?;
            continue;
        }
        let cname = cstr(Path::new(&name))?;
        let header = entry.header();
        let mode = header.mode().unwrap_or(0o644) & 0o1777;
        let uid = header.uid().unwrap_or(0) as libc::uid_t;
        let gid = header.gid().unwrap_or(0) as libc::gid_t;
        let mtime = header.mtime().unwrap_or(0) as i64;
        let existing = lstat_at(pfd, &cname).map_err(os(rel.display()))?;
        // A directory over a directory merges; anything else replaces what was there.
        let keep_dir = kind.is_dir() && existing.as_ref().is_some_and(is_dir);
        if existing.is_some() && !keep_dir {
            remove_at(pfd, &cname).map_err(os(rel.display()))?;
        }
        made.insert(rel.clone());
        match kind {
            T::Directory => {
                if !keep_dir {
                    // SAFETY: mkdirat relative to the parent's descriptor.
                    if unsafe { libc::mkdirat(pfd, cname.as_ptr(), 0o700) } < 0 {
                        return Err(format!("{}: {}", rel.display(), last_err()));
                    }
                }
                let fd = unsafe {
                    libc::openat(
                        pfd,
                        cname.as_ptr(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    return Err(format!("{}: {}", rel.display(), last_err()));
                }
                // SAFETY: a new descriptor, owned here.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                own(fd.as_raw_fd(), uid, gid, mode & 0o1777).map_err(os(rel.display()))?;
            }
            T::Regular | T::Continuous => {
                // SAFETY: openat creating a new file, never through a link.
                let fd = unsafe {
                    libc::openat(
                        pfd,
                        cname.as_ptr(),
                        libc::O_WRONLY
                            | libc::O_CREAT
                            | libc::O_EXCL
                            | libc::O_NOFOLLOW
                            | libc::O_CLOEXEC,
                        0o600,
                    )
                };
                if fd < 0 {
                    return Err(format!("{}: {}", rel.display(), last_err()));
                }
                // SAFETY: a new descriptor, owned by the File.
                let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
                if budget.bytes.saturating_add(size) > budget.max_bytes {
                    return Err(format!(
                        "the image unpacks to more than {} bytes (at {})",
                        budget.max_bytes,
                        rel.display()
                    ));
                }
                let copied = std::io::copy(&mut (&mut entry).take(size), &mut f)
                    .map_err(os(rel.display()))?;
                budget.bytes += copied;
                if budget.bytes - budget.checked_at >= 64 << 20 {
                    budget.checked_at = budget.bytes;
                    #[allow(clippy::unnecessary_cast)]
                    let free = nix::sys::statvfs::fstatvfs(&f)
                        .map(|v| v.blocks_available() as u64 * v.fragment_size() as u64)
                        .unwrap_or(u64::MAX);
                    if free < KEEP_FREE {
                        return Err(format!(
                            "less than {} GiB left on the agent's disk; the image is not unpacked",
                            KEEP_FREE >> 30
                        ));
                    }
                }
                own(f.as_raw_fd(), uid, gid, mode & 0o777).map_err(os(rel.display()))?;
                set_mtime(pfd, &cname, mtime);
            }
            T::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| format!("{}: {e}", rel.display()))?
                    .ok_or_else(|| {
                        format!("{}: a symbolic link without a target", rel.display())
                    })?;
                let t = cstr(&target)?;
                // SAFETY: symlinkat with C strings; the target is only text.
                if unsafe { libc::symlinkat(t.as_ptr(), pfd, cname.as_ptr()) } < 0 {
                    return Err(format!("{}: {}", rel.display(), last_err()));
                }
                // SAFETY: fchownat on the link itself.
                if unsafe {
                    libc::fchownat(pfd, cname.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW)
                } < 0
                {
                    return Err(format!("{}: {}", rel.display(), last_err()));
                }
                set_mtime(pfd, &cname, mtime);
            }
            T::Link => {
                let target = link
                    .clone()
                    .ok_or_else(|| format!("{}: a hard link without a target", rel.display()))?;
                let Some(trel) = clean(&target)? else {
                    return Err(format!("{}: a hard link to the root", rel.display()));
                };
                let tparent = open_in_root(
                    root,
                    trel.parent().unwrap_or(Path::new("")),
                    OFlag::O_PATH | OFlag::O_DIRECTORY,
                )
                .map_err(os(trel.display()))?;
                let tname = cstr(Path::new(trel.file_name().unwrap_or_default()))?;
                // SAFETY: linkat between descriptors; a link in the target's last
                // component is linked itself, never followed.
                if unsafe {
                    libc::linkat(tparent.as_raw_fd(), tname.as_ptr(), pfd, cname.as_ptr(), 0)
                } < 0
                {
                    return Err(format!(
                        "{} (a hard link to {}): {}",
                        rel.display(),
                        trel.display(),
                        last_err()
                    ));
                }
            }
            T::Fifo => {
                // SAFETY: mkfifoat relative to the parent's descriptor.
                if unsafe { libc::mkfifoat(pfd, cname.as_ptr(), 0o600) } < 0 {
                    return Err(format!("{}: {}", rel.display(), last_err()));
                }
                let fd = unsafe {
                    libc::openat(
                        pfd,
                        cname.as_ptr(),
                        libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    )
                };
                if fd >= 0 {
                    // SAFETY: a new descriptor, owned here; chown/chmod through /proc is
                    // not needed: fchownat with AT_EMPTY_PATH works on O_PATH.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    let empty = c"";
                    unsafe {
                        libc::fchownat(
                            fd.as_raw_fd(),
                            empty.as_ptr(),
                            uid,
                            gid,
                            libc::AT_EMPTY_PATH,
                        );
                        libc::fchmodat(pfd, cname.as_ptr(), mode & 0o777, 0);
                    }
                }
            }
            T::Char | T::Block => {
                made.remove(&rel);
                budget.devices_skipped += 1;
            }
            other => {
                return Err(format!(
                    "{}: tar entries of type {other:?} are not supported",
                    rel.display()
                ))
            }
        }
    }
    Ok(())
}

/// Give `fd` to `uid:gid` with `mode` (ownership first: chown clears the mode's
/// special bits).
fn own(fd: RawFd, uid: libc::uid_t, gid: libc::gid_t, mode: u32) -> std::io::Result<()> {
    // SAFETY: fchown and fchmod on a valid descriptor.
    unsafe {
        if libc::fchown(fd, uid, gid) < 0 || libc::fchmod(fd, mode as libc::mode_t) < 0 {
            return Err(last_err());
        }
    }
    Ok(())
}

fn set_mtime(dir: RawFd, name: &CString, secs: i64) {
    let t = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: utimensat on the entry itself (a link is not followed).
    unsafe {
        libc::utimensat(
            dir,
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar stream of `(path, kind, data)`: kind `f` file, `d` directory, `l` symbolic
    /// link (data: target), `h` hard link (data: target).
    fn tar_of(entries: &[(&str, char, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_uid(nix::unistd::geteuid().as_raw().into());
            h.set_gid(nix::unistd::getegid().as_raw().into());
            match kind {
                'f' => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(data.len() as u64);
                    // Written raw: the builder's own path checks would refuse the
                    // hostile names these tests need.
                    let name = path.as_bytes();
                    h.as_old_mut().name[..name.len()].copy_from_slice(name);
                    h.set_cksum();
                    b.append(&h, data.as_bytes()).unwrap();
                }
                'd' => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    h.set_size(0);
                    b.append_data(&mut h, path, std::io::empty()).unwrap();
                }
                'l' | 'h' => {
                    h.set_entry_type(if *kind == 'l' {
                        tar::EntryType::Symlink
                    } else {
                        tar::EntryType::Link
                    });
                    h.set_size(0);
                    let name = path.as_bytes();
                    h.as_old_mut().name[..name.len()].copy_from_slice(name);
                    let target = data.as_bytes();
                    h.as_old_mut().linkname[..target.len()].copy_from_slice(target);
                    h.set_cksum();
                    b.append(&h, std::io::empty()).unwrap();
                }
                _ => unreachable!(),
            }
        }
        b.into_inner().unwrap()
    }

    fn unpack(root: &Path, layers: &[Vec<u8>]) -> Result<(), String> {
        let fd = OwnedFd::from(std::fs::File::open(root).unwrap());
        let mut budget = Budget::new(1 << 20);
        for l in layers {
            layer(&fd, l.as_slice(), &mut budget)?;
        }
        Ok(())
    }

    #[test]
    fn whiteouts_remove_what_the_layers_below_put_there() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let base = tar_of(&[
            ("etc/gone", 'f', "x"),
            ("etc/kept", 'f', "x"),
            ("opt/d/old", 'f', "x"),
            ("opt/tree/sub/f", 'f', "x"),
        ]);
        let top = tar_of(&[
            ("opt/d/new", 'f', "x"),
            ("opt/d/.wh..wh..opq", 'f', ""),
            ("etc/.wh.gone", 'f', ""),
            ("opt/.wh.tree", 'f', ""),
            ("etc/kept", 'f', "replaced"),
        ]);
        unpack(&root, &[base, top]).unwrap();
        assert!(!root.join("etc/gone").exists());
        assert_eq!(
            std::fs::read_to_string(root.join("etc/kept")).unwrap(),
            "replaced"
        );
        assert!(
            !root.join("opt/d/old").exists(),
            "the opaque directory hides the old"
        );
        assert!(
            root.join("opt/d/new").exists(),
            "but keeps its own layer's entries"
        );
        assert!(!root.join("opt/tree").exists());
    }

    #[test]
    fn hostile_layers_never_reach_outside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "host").unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let out = outside.display().to_string();
        // '..' is refused outright.
        let climb = tar_of(&[("../outside/planted", 'f', "x")]);
        let e = unpack(&root, &[climb]).unwrap_err();
        assert!(e.contains("climbs out"), "{e}");
        // A link to a host directory resolves inside the root, where it is missing: the
        // write through it fails, and nothing reaches the host.
        let dangling = tar_of(&[("abs", 'l', &out), ("abs/planted", 'f', "x")]);
        let e = unpack(&root, &[dangling]).unwrap_err();
        assert!(e.contains("abs"), "{e}");
        assert!(!outside.join("planted").exists());
        // Links to the root, absolute or climbing, lead to the image's own root.
        let links = tar_of(&[
            ("top", 'l', "/"),
            ("rel", 'l', "../../../../../../.."),
            ("top/planted", 'f', "x"),
            ("rel/tmp/planted2", 'f', "x"),
        ]);
        unpack(&root, &[links]).unwrap();
        assert!(root.join("planted").exists());
        assert!(root.join("tmp/planted2").exists());
        // A hard link to a host file resolves its target inside the root too.
        let hard = tar_of(&[("stolen", 'h', &format!("{out}/secret"))]);
        let e = unpack(&root, &[hard]).unwrap_err();
        assert!(e.contains("outside/secret"), "{e}");
        assert_eq!(
            std::fs::read_to_string(outside.join("secret")).unwrap(),
            "host"
        );
        // Replacing a link with a file replaces the link, not its target.
        let over = tar_of(&[("abs", 'f', "now a file")]);
        unpack(&root, &[over]).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("abs")).unwrap(),
            "now a file"
        );
        assert!(outside.join("secret").exists());
    }

    #[test]
    fn extension_headers_and_whiteout_names_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let fd = OwnedFd::from(std::fs::File::open(dir.path()).unwrap());
        // A GNU long name declaring 1 GiB: refused before anything is read.
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(1 << 30);
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_cksum();
        let mut bomb = h.as_bytes().to_vec();
        bomb.extend(std::iter::repeat_n(b'a', 4096));
        let e = layer(&fd, bomb.as_slice(), &mut Budget::new(1 << 40)).unwrap_err();
        assert!(e.contains("extension header"), "{e}");
        // A long name that fits is used.
        let mut b = tar::Builder::new(Vec::new());
        let long = format!("{}/f", "d".repeat(200));
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"ok"[..]).unwrap();
        let stream = b.into_inner().unwrap();
        layer(&fd, stream.as_slice(), &mut Budget::new(1 << 20)).unwrap();
        assert_eq!(std::fs::read(dir.path().join(&long)).unwrap(), b"ok");
        // Whiteouts of '.' or '..' are refused, and the root stays.
        for bad in [".wh..", ".wh..."] {
            let e = unpack(dir.path(), &[tar_of(&[(bad, 'f', "")])]).unwrap_err();
            assert!(e.contains("not a whiteout"), "{bad}: {e}");
        }
        assert!(dir.path().join(&long).exists());
        // The decompressed stream is bounded as a whole.
        let e = layer(&fd, stream.as_slice(), &mut Budget::new(1000)).unwrap_err();
        assert!(e.contains("decompress to more"), "{e}");
    }

    #[test]
    fn the_budget_bounds_what_an_image_unpacks_to() {
        let dir = tempfile::tempdir().unwrap();
        let big = "x".repeat(4096);
        let l = tar_of(&[("a", 'f', &big), ("b", 'f', &big)]);
        let fd = OwnedFd::from(std::fs::File::open(dir.path()).unwrap());
        let mut budget = Budget::new(6000);
        let e = layer(&fd, l.as_slice(), &mut budget).unwrap_err();
        assert!(e.contains("more than 6000 bytes"), "{e}");
    }
}
