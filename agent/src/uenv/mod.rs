//! uenv: software environments as squashfs images (the seed's ADR-003), mounted read-only
//! in a private mount namespace of each run of an allocation that asks for them
//! (`environment.uenv`, `--uenv NAME/VERSION:TAG[,...]`), its job steps and its attach
//! sessions; a view (`environment.view`, `--view`) puts the image's tools on `PATH`.
//!
//! The images come from the node's uenv repository (`--uenv-repo`): a directory or an
//! `http(s)://` location (an S3 bucket served over HTTP works) holding `index.json`:
//!
//! ```json
//! {"images": [{"name": "prgenv-gnu", "version": "24.11", "tag": "v1",
//!              "file": "prgenv-gnu-24.11-v1.squashfs", "sha256": "<hex>",
//!              "mount": "/user-environment",
//!              "views": {"default": {"prepend": {"PATH": "/user-environment/env/default/bin"},
//!                                    "set": {"CC": "gcc"}}}}]}
//! ```
//!
//! An image is copied (or downloaded) into `<state-dir>/uenv/<sha256>.squashfs`, its
//! SHA-256 checked against the index before it is used, and kept there for the next run.
//! The index is the site's: it names the mount point and the views; the user names only
//! which image. An image or view the repository does not have fails the run at its start,
//! naming what the repository has.

pub mod mount;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest `index.json` read.
const MAX_INDEX: u64 = 16 << 20;
/// The default mount point of an image.
pub const DEFAULT_MOUNT: &str = "/user-environment";

/// One image in a repository's index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexEntry {
    /// Name, e.g. `prgenv-gnu`.
    pub name: String,
    /// Version, e.g. `24.11`.
    pub version: String,
    /// Tag, e.g. `v1`.
    pub tag: String,
    /// The squashfs file, relative to the repository.
    pub file: String,
    /// Its SHA-256 (hex).
    pub sha256: String,
    /// Where it is mounted (absolute) [default: `/user-environment`].
    #[serde(default)]
    pub mount: Option<String>,
    /// Views: name → variables.
    #[serde(default)]
    pub views: BTreeMap<String, View>,
    /// The file's size in bytes (a fetch stops beyond it).
    #[serde(default)]
    pub size: Option<u64>,
}

/// What a view does to the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    /// Put these in front of the variable (`:`-separated), e.g. `PATH`.
    #[serde(default)]
    pub prepend: BTreeMap<String, String>,
    /// Set these.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

/// A repository's `index.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    /// The images.
    pub images: Vec<IndexEntry>,
}

/// One image asked for: `name[/version][:tag]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Name.
    pub name: String,
    /// Version (any when absent).
    pub version: Option<String>,
    /// Tag (any when absent).
    pub tag: Option<String>,
}

impl std::fmt::Display for Wanted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if let Some(v) = &self.version {
            write!(f, "/{v}")?;
        }
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        Ok(())
    }
}

/// Parse `environment.uenv` (comma-separated `name[/version][:tag]`).
pub fn parse(spec: &str) -> Result<Vec<Wanted>, String> {
    lattice_apis::syntax::uenv::parse(spec).map(|v| {
        v.into_iter()
            .map(|(name, version, tag)| Wanted { name, version, tag })
            .collect()
    })
}

/// An image ready to mount, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// The verified image in the node's cache.
    pub image: PathBuf,
    /// The mount point.
    pub target: PathBuf,
}

/// What a run gets of its uenvs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Images to mount.
    pub mounts: Vec<Mount>,
    /// The view's variables, as `(name, prepend?, value)`.
    pub env: Vec<(String, bool, String)>,
}

/// The largest image fetched when the index gives no `size`.
const MAX_IMAGE: u64 = 256 << 30;
/// Free space a fetch leaves on the agent's disk (scratch and state live there too).
const KEEP_FREE: u64 = 2 << 30;
/// How long a repository may be silent.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a software environment (a uenv, an OCI image) could not be had: `permanent` when another node or a later try would fail
/// the same way (an unknown image or view, a wrong index), so the run is not requeued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    /// What went wrong, naming what was asked for.
    pub message: String,
    /// Fails everywhere, every time.
    pub permanent: bool,
}

impl EnvError {
    pub(crate) fn permanent(message: impl Into<String>) -> Self {
        EnvError {
            message: message.into(),
            permanent: true,
        }
    }
    pub(crate) fn passing(message: impl Into<String>) -> Self {
        EnvError {
            message: message.into(),
            permanent: false,
        }
    }
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where the images come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repo {
    /// A directory.
    Dir(PathBuf),
    /// An HTTP(S) location (with a trailing `/`).
    Http(String),
}

/// Whether `url`'s host is this machine (where plain HTTP cannot be tampered with on the
/// way).
pub(crate) fn loopback(url: &str) -> bool {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let host = rest.split('/').next().unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(h) => h.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Repo {
    /// `--uenv-repo`: a directory, an `https://` location, or `http://` on this machine
    /// only (the index carries the checksums: it must not be open to tampering on the
    /// network).
    pub fn from_flag(s: &str) -> Result<Repo, String> {
        if s.starts_with("http://") && !loopback(s) {
            return Err(format!(
                "--uenv-repo {s}: plain http:// is accepted only from this machine (the index, which carries the images' checksums, could be changed on the way); use https:// or a directory"
            ));
        }
        if s.starts_with("http://") || s.starts_with("https://") {
            let mut u = s.to_string();
            if !u.ends_with('/') {
                u.push('/');
            }
            Ok(Repo::Http(u))
        } else {
            Ok(Repo::Dir(PathBuf::from(s)))
        }
    }

    fn describe(&self) -> String {
        match self {
            Repo::Dir(d) => d.display().to_string(),
            Repo::Http(u) => u.clone(),
        }
    }

    fn client() -> Result<reqwest::Client, EnvError> {
        reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .read_timeout(READ_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| EnvError::passing(format!("cannot make an HTTP client: {e}")))
    }

    /// GET `url`, handing each chunk of the body to `take` until it says `false`.
    async fn download(
        url: &str,
        mut take: impl FnMut(&[u8]) -> Result<bool, EnvError>,
    ) -> Result<(), EnvError> {
        let failed = |e: reqwest::Error| EnvError::passing(format!("cannot fetch {url}: {e}"));
        let mut r = Self::client()?
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(failed)?;
        while let Some(chunk) = r.chunk().await.map_err(failed)? {
            if !take(&chunk)? {
                break;
            }
        }
        Ok(())
    }

    /// The index.
    pub async fn index(&self) -> Result<Index, EnvError> {
        let bytes = match self {
            Repo::Dir(d) => {
                let p = d.join("index.json");
                let f = std::fs::File::open(&p)
                    .map_err(|e| EnvError::passing(format!("cannot read {}: {e}", p.display())))?;
                let mut b = Vec::new();
                f.take(MAX_INDEX + 1)
                    .read_to_end(&mut b)
                    .map_err(|e| EnvError::passing(format!("cannot read {}: {e}", p.display())))?;
                b
            }
            Repo::Http(u) => {
                let mut b = Vec::new();
                Self::download(&format!("{u}index.json"), |chunk| {
                    b.extend_from_slice(chunk);
                    // Past the limit: enough to say so.
                    Ok(b.len() as u64 <= MAX_INDEX)
                })
                .await?;
                b
            }
        };
        if bytes.len() as u64 > MAX_INDEX {
            return Err(EnvError::permanent(format!(
                "the uenv index of {} is larger than {MAX_INDEX} bytes",
                self.describe()
            )));
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            EnvError::permanent(format!(
                "the uenv index of {} is not valid: {e}",
                self.describe()
            ))
        })
    }

    /// Copy `entry`'s image to `dest` (a new file), checking its size and SHA-256 on the
    /// way and leaving [`KEEP_FREE`] of the disk.
    async fn fetch(&self, entry: &IndexEntry, dest: &Path) -> Result<(), EnvError> {
        let file = Path::new(&entry.file);
        let plain = !entry.file.is_empty()
            && file
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(EnvError::permanent(format!(
                "the uenv index gives {}/{}:{} the file {:?}: it must be a path inside the repository, without / at the start or ..",
                entry.name, entry.version, entry.tag, entry.file
            )));
        }
        let limit = entry.size.unwrap_or(MAX_IMAGE);
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode_0600()
            .open(dest)
            .map_err(|e| EnvError::passing(format!("cannot create {}: {e}", dest.display())))?;
        let mut sink = Sink::new(out, limit, dest);
        match self {
            Repo::Dir(d) => {
                let p = d.join(file);
                let mut src = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags_nofollow()
                    .open(&p)
                    .map_err(|e| EnvError::passing(format!("cannot read {}: {e}", p.display())))?;
                let meta = src
                    .metadata()
                    .map_err(|e| EnvError::passing(format!("cannot read {}: {e}", p.display())))?;
                if !meta.is_file() {
                    return Err(EnvError::permanent(format!(
                        "{} is not a regular file",
                        p.display()
                    )));
                }
                // Reading a large image blocks: not on the async workers.
                sink = tokio::task::spawn_blocking(move || {
                    let mut buf = vec![0u8; 1 << 20];
                    loop {
                        let n = src.read(&mut buf).map_err(|e| {
                            EnvError::passing(format!("cannot read {}: {e}", p.display()))
                        })?;
                        if n == 0 {
                            return Ok(sink);
                        }
                        sink.write(&buf[..n])?;
                    }
                })
                .await
                .map_err(|e| EnvError::passing(format!("copy task failed: {e}")))??;
            }
            Repo::Http(u) => {
                Self::download(&format!("{u}{}", entry.file), |chunk| {
                    sink.write(chunk).map(|()| true)
                })
                .await?;
            }
        }
        if entry.size.is_some_and(|s| s != sink.written) {
            return Err(EnvError::passing(format!(
                "uenv {}/{}:{} from {}: {} bytes, the index says {}",
                entry.name,
                entry.version,
                entry.tag,
                self.describe(),
                sink.written,
                limit
            )));
        }
        let got = hex::encode(sink.hash.finalize());
        if !got.eq_ignore_ascii_case(&entry.sha256) {
            return Err(EnvError::passing(format!(
                "uenv {}/{}:{} from {}: SHA-256 is {got}, the index says {}; the image is not used",
                entry.name,
                entry.version,
                entry.tag,
                self.describe(),
                entry.sha256
            )));
        }
        sink.out
            .sync_all()
            .map_err(|e| EnvError::passing(format!("cannot write {}: {e}", dest.display())))
    }
}

/// Where a fetched image goes: hashed, counted, bounded (uenv images, OCI layers).
pub(crate) struct Sink {
    pub(crate) out: std::fs::File,
    pub(crate) hash: Sha256,
    pub(crate) written: u64,
    limit: u64,
    dest: PathBuf,
    checked_at: u64,
}

impl Sink {
    /// Into `out` (at `dest`), at most `limit` bytes.
    pub(crate) fn new(out: std::fs::File, limit: u64, dest: &Path) -> Sink {
        Sink {
            out,
            hash: Sha256::new(),
            written: 0,
            limit,
            dest: dest.to_path_buf(),
            checked_at: 0,
        }
    }

    pub(crate) fn write(&mut self, chunk: &[u8]) -> Result<(), EnvError> {
        self.written += chunk.len() as u64;
        if self.written > self.limit {
            return Err(EnvError::passing(format!(
                "{}: the image is larger than {} bytes",
                self.dest.display(),
                self.limit
            )));
        }
        if self.written - self.checked_at >= 64 << 20 || self.checked_at == 0 {
            self.checked_at = self.written;
            // The field types differ between platforms.
            #[allow(clippy::unnecessary_cast)]
            let free = nix::sys::statvfs::fstatvfs(&self.out)
                .map(|v| v.blocks_available() as u64 * v.fragment_size() as u64)
                .unwrap_or(u64::MAX);
            if free < KEEP_FREE {
                return Err(EnvError::passing(format!(
                    "{}: less than {} GiB left on the agent's disk; the image is not fetched",
                    self.dest.display(),
                    KEEP_FREE >> 30
                )));
            }
        }
        self.hash.update(chunk);
        self.out
            .write_all(chunk)
            .map_err(|e| EnvError::passing(format!("cannot write {}: {e}", self.dest.display())))
    }
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
    }
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
    }
}

/// The index entry `w` names: exactly one must match.
pub fn pick<'a>(index: &'a Index, w: &Wanted, repo: &str) -> Result<&'a IndexEntry, EnvError> {
    let matches: Vec<&IndexEntry> = index
        .images
        .iter()
        .filter(|e| {
            e.name == w.name
                && w.version.as_ref().is_none_or(|v| *v == e.version)
                && w.tag.as_ref().is_none_or(|t| *t == e.tag)
        })
        .collect();
    let have = || {
        index
            .images
            .iter()
            .map(|e| format!("{}/{}:{}", e.name, e.version, e.tag))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(EnvError::permanent(format!(
            "uenv {w} is not in this node's uenv repository {repo} (it has: {})",
            have()
        ))),
        many => Err(EnvError::permanent(format!(
            "uenv {w} matches {} images in {repo} ({}); name the version and tag",
            many.len(),
            many.iter()
                .map(|e| format!("{}/{}:{}", e.name, e.version, e.tag))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The mount point of `e`: one of the node's `allowed` ones (`--uenv-mount-points`).
fn mount_point(e: &IndexEntry, allowed: &[PathBuf]) -> Result<PathBuf, EnvError> {
    let m = PathBuf::from(e.mount.as_deref().unwrap_or(DEFAULT_MOUNT));
    let normal = m.is_absolute()
        && m.components()
            .skip(1)
            .all(|c| matches!(c, std::path::Component::Normal(_)))
        && m.components().count() > 1;
    if !normal || !allowed.contains(&m) {
        return Err(EnvError::permanent(format!(
            "the uenv index gives {}/{}:{} the mount point {:?}, which is not one this node mounts uenvs at ({}; lattice-agent --uenv-mount-points)",
            e.name,
            e.version,
            e.tag,
            m.display(),
            allowed
                .iter()
                .map(|a| a.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(m)
}

/// Resolve `uenv` (and `view`) against `repo`, caching the images in `cache`.
pub async fn resolve(
    repo: &Repo,
    cache: &Path,
    allowed: &[PathBuf],
    uenv: &str,
    view: Option<&str>,
) -> Result<Resolved, EnvError> {
    let wanted = parse(uenv).map_err(EnvError::permanent)?;
    let index = repo.index().await?;
    let mut out = Resolved::default();
    // Everything is checked before anything is fetched.
    let mut entries: Vec<(&Wanted, &IndexEntry, PathBuf)> = Vec::new();
    for w in &wanted {
        let e = pick(&index, w, &repo.describe())?;
        let target = mount_point(e, allowed)?;
        if entries.iter().any(|(_, _, t)| *t == target) {
            return Err(EnvError::permanent(format!(
                "uenv {w} mounts at {} like another uenv of this job; use one of them",
                target.display()
            )));
        }
        if e.sha256.len() != 64 || !e.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(EnvError::permanent(format!(
                "the uenv index gives {w} no valid sha256 (64 hex digits)"
            )));
        }
        entries.push((w, e, target));
    }
    for v in view.into_iter().flat_map(|v| v.split(',')).map(str::trim) {
        if v.is_empty() {
            continue;
        }
        // `name:view` picks the uenv; a bare view is looked up in each, first match.
        let (which, name) = match v.split_once(':') {
            Some((u, n)) => (Some(u), n),
            None => (None, v),
        };
        let found = entries
            .iter()
            .filter(|(w, ..)| which.is_none_or(|u| u == w.name))
            .find_map(|(_, e, _)| e.views.get(name));
        let Some(view) = found else {
            let known: Vec<String> = entries
                .iter()
                .flat_map(|(w, e, _)| e.views.keys().map(move |k| format!("{}:{k}", w.name)))
                .collect();
            return Err(EnvError::permanent(format!(
                "view {v:?} is not in the uenv(s) {uenv} (views: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        };
        for (k, val) in &view.prepend {
            out.env.push((k.clone(), true, val.clone()));
        }
        for (k, val) in &view.set {
            out.env.push((k.clone(), false, val.clone()));
        }
    }
    for (w, e, target) in entries {
        let sha = e.sha256.to_ascii_lowercase();
        let image = cache.join(format!("{sha}.squashfs"));
        // One fetch of an image at a time; the others wait for it and use its result.
        let lock = fetch_lock(&sha);
        let _fetching = lock.lock().await;
        if !image.exists() {
            // What an interrupted fetch of this image left.
            if let Ok(dir) = std::fs::read_dir(cache) {
                let prefix = format!("{sha}.part-");
                for f in dir.flatten() {
                    if f.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = std::fs::remove_file(f.path());
                    }
                }
            }
            static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let part = cache.join(format!(
                "{}.part-{}-{}",
                e.sha256.to_ascii_lowercase(),
                std::process::id(),
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            let _ = std::fs::remove_file(&part);
            let fetched = repo.fetch(e, &part).await;
            if let Err(err) = fetched {
                let _ = std::fs::remove_file(&part);
                return Err(err);
            }
            std::fs::rename(&part, &image).map_err(|err| {
                EnvError::passing(format!("cannot store {}: {err}", image.display()))
            })?;
            tracing::info!(uenv = %w, image = %image.display(), "uenv image cached");
        }
        out.mounts.push(Mount { image, target });
    }
    Ok(out)
}

/// The lock that makes one fetch of the image with digest `sha` at a time (uenv images,
/// OCI images): the others wait for it and then find it cached.
pub(crate) fn fetch_lock(sha: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    static FETCHES: std::sync::LazyLock<
        std::sync::Mutex<BTreeMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
    > = std::sync::LazyLock::new(Default::default);
    let mut m = FETCHES.lock().unwrap_or_else(|p| p.into_inner());
    m.entry(sha.to_string()).or_default().clone()
}

/// Apply a view's variables to `env`.
pub fn apply(view: &[(String, bool, String)], env: &mut BTreeMap<String, String>) {
    for (k, prepend, v) in view {
        let value = match (prepend, env.get(k)) {
            (true, Some(old)) if !old.is_empty() => format!("{v}:{old}"),
            _ => v.clone(),
        };
        env.insert(k.clone(), value);
    }
}

#[cfg(test)]
mod tests;
