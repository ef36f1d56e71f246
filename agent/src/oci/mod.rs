//! OCI images (`environment.image`): pulled from a registry, verified, unpacked once per
//! manifest digest into the agent's cache, and run by an OCI runtime ([`bundle`]).
//!
//! The pull speaks the OCI distribution API (`/v2/<name>/manifests/<ref>`,
//! `/v2/<name>/blobs/<digest>`), anonymously, with the registry's bearer-token
//! challenge answered when it makes one (Docker Hub, GHCR, Harbor). Every document and
//! blob is checked against its SHA-256 digest: the manifest against the digest the
//! reference names (or the one the registry reports), the config and each layer
//! against the manifest. Plain HTTP is used only for a registry on this machine;
//! redirects (blob stores) are followed only to HTTPS or back to this machine. An index
//! (multi-platform image) picks `linux` and this machine's architecture.
//!
//! The cache is `<state-dir>/oci/<manifest hex>/` (root only), holding `rootfs/` (the
//! layers unpacked by [`unpack`]) and `image.json` (the config's `Env` and
//! `WorkingDir`). A pull builds `.pull-<hex>-…` beside it and renames it into place, so a
//! half-pulled image is never used; one pull of a digest at a time.

pub mod bundle;
pub mod unpack;

use std::io::Read;
use std::path::{Path, PathBuf};

use lattice_apis::syntax::image::ImageRef;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::uenv::{EnvError, Sink};

/// Manifests and configs larger than this are refused.
const MAX_DOCUMENT: u64 = 4 << 20;
/// The most layers an image may have.
const MAX_LAYERS: usize = 256;
/// The most bytes an image's layers may have, compressed.
const MAX_COMPRESSED: u64 = 64 << 30;
/// The most bytes an image may unpack to.
const MAX_UNPACKED: u64 = 256 << 30;

/// The longest one pull may take (a registry that trickles must not hold the image's
/// lock, and every job waiting for it, for ever).
const PULL_LIMIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Whether `host` names the node or a private, link-local or otherwise internal address
/// (by literal address or a name that means one).
fn internal_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let lower = h.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") || lower.ends_with(".local") {
        return true;
    }
    match h.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => {
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                // Shared address space (RFC 6598).
                || (a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64)
        }
        Ok(std::net::IpAddr::V6(a)) => {
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xfe00) == 0xfc00
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a.to_ipv4_mapped()
                    .is_some_and(|v4| internal_host(&v4.to_string()))
        }
        Err(_) => false,
    }
}

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// What the runtime needs of a pulled image.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    /// The unpacked root file system.
    pub rootfs: PathBuf,
    /// The manifest's digest (`sha256:…`).
    pub digest: String,
    /// The image's `Env` (`KEY=VALUE`).
    #[serde(default)]
    pub env: Vec<String>,
    /// The image's `WorkingDir`.
    #[serde(default)]
    pub working_dir: Option<String>,
}

/// `image.json` in the cache.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Cached {
    digest: String,
    reference: String,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    devices_skipped: u64,
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// The hex part of a `sha256:` digest (checked).
fn digest_hex(d: &str) -> Result<&str, EnvError> {
    d.strip_prefix("sha256:")
        .filter(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        .ok_or_else(|| {
            EnvError::permanent(format!(
                "the registry names the digest {d:?}; only sha256 digests are accepted"
            ))
        })
}

/// This machine's architecture as OCI names it.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn is_loopback_host(host: &str) -> bool {
    crate::uenv::loopback(&format!("http://{host}/"))
}

/// A registry session for one repository.
struct Registry {
    base: String,
    repository: String,
    client: reqwest::Client,
    token: Option<String>,
    shown: String,
}

fn failed(what: &str, e: impl std::fmt::Display) -> EnvError {
    EnvError::passing(format!("cannot fetch {what}: {e}"))
}

impl Registry {
    fn new(r: &ImageRef) -> Result<Registry, EnvError> {
        let host = if r.registry == lattice_apis::syntax::image::DOCKER_HUB {
            "registry-1.docker.io".to_string()
        } else {
            r.registry.clone()
        };
        let scheme = if is_loopback_host(&host) {
            "http"
        } else {
            "https"
        };
        let local = scheme == "http";
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .read_timeout(std::time::Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                let u = attempt.url();
                let safe = if local {
                    u.host_str().is_some_and(is_loopback_host)
                } else {
                    u.scheme() == "https" && u.host_str().is_some_and(|h| !internal_host(h))
                };
                if attempt.previous().len() >= 5 {
                    attempt.error("more than 5 redirects")
                } else if safe {
                    attempt.follow()
                } else {
                    attempt.error(
                        "a redirect to plain http:// or into the node's or site's own network",
                    )
                }
            }))
            .build()
            .map_err(|e| EnvError::passing(format!("cannot make an HTTP client: {e}")))?;
        Ok(Registry {
            base: format!("{scheme}://{host}/v2/{}", r.repository),
            repository: r.repository.clone(),
            client,
            token: None,
            shown: r.to_string(),
        })
    }

    /// GET `path` under the repository, answering one bearer challenge.
    async fn get(&mut self, path: &str, accept: &str) -> Result<reqwest::Response, EnvError> {
        let url = format!("{}/{path}", self.base);
        let mut answered = 0;
        for _ in 0..3 {
            let mut req = self.client.get(&url);
            if !accept.is_empty() {
                req = req.header(reqwest::header::ACCEPT, accept);
            }
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            let r = req.send().await.map_err(|e| failed(&url, e))?;
            // A first challenge, or an expired token (registries give them for minutes).
            if r.status() == reqwest::StatusCode::UNAUTHORIZED && answered < 2 {
                answered += 1;
                let challenge = r
                    .headers()
                    .get(reqwest::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                self.token = Some(self.answer(&challenge).await?);
                continue;
            }
            if r.status() == reqwest::StatusCode::NOT_FOUND {
                return Err(EnvError::permanent(format!(
                    "image {}: the registry has no {path} (is the name or tag right?)",
                    self.shown
                )));
            }
            if r.status() == reqwest::StatusCode::UNAUTHORIZED
                || r.status() == reqwest::StatusCode::FORBIDDEN
            {
                return Err(EnvError::permanent(format!(
                    "image {}: the registry refuses an anonymous pull ({}); Lattice pulls public images only",
                    self.shown,
                    r.status()
                )));
            }
            return r.error_for_status().map_err(|e| failed(&url, e));
        }
        Err(EnvError::passing(format!(
            "image {}: the registry keeps asking for a token",
            self.shown
        )))
    }

    /// An anonymous token for the challenge `Bearer realm="…",service="…",scope="…"`.
    async fn answer(&self, challenge: &str) -> Result<String, EnvError> {
        let Some(params) = challenge
            .strip_prefix("Bearer ")
            .or_else(|| challenge.strip_prefix("bearer "))
        else {
            return Err(EnvError::permanent(format!(
                "image {}: the registry asks for credentials ({challenge:?}); Lattice pulls public images only",
                self.shown
            )));
        };
        let mut realm = None;
        let mut query: Vec<(String, String)> = Vec::new();
        for part in split_params(params) {
            let Some((k, v)) = part.split_once('=') else {
                continue;
            };
            let v = v.trim().trim_matches('"').to_string();
            match k.trim() {
                "realm" => realm = Some(v),
                "service" | "scope" => query.push((k.trim().to_string(), v)),
                _ => {}
            }
        }
        if !query.iter().any(|(k, _)| k == "scope") {
            query.push((
                "scope".into(),
                format!("repository:{}:pull", self.repository),
            ));
        }
        let realm = realm.ok_or_else(|| {
            EnvError::passing(format!(
                "image {}: a token challenge without a realm",
                self.shown
            ))
        })?;
        let u = reqwest::Url::parse(&realm).map_err(|e| {
            EnvError::passing(format!("image {}: token realm {realm:?}: {e}", self.shown))
        })?;
        // The token service gets a request from this node: only where the registry
        // itself would send it (no plain http:// off the node, no internal addresses for
        // a registry outside).
        let local = self.base.starts_with("http://");
        let safe = if local {
            u.host_str().is_some_and(is_loopback_host)
        } else {
            u.scheme() == "https" && u.host_str().is_some_and(|h| !internal_host(h))
        };
        if !safe {
            return Err(EnvError::permanent(format!(
                "image {}: the registry's token service {} is plain http:// or inside the node's or site's network; it is not asked",
                self.shown,
                u.host_str().unwrap_or("?")
            )));
        }
        let r = self
            .client
            .get(u)
            .query(&query)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| failed(&realm, e))?;
        let body = bounded(r, MAX_DOCUMENT, &realm).await?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| EnvError::passing(format!("token from {realm}: {e}")))?;
        v.get("token")
            .or_else(|| v.get("access_token"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| EnvError::passing(format!("{realm} gave no token")))
    }

    /// A manifest or index: its bytes and media type.
    async fn manifest(
        &mut self,
        reference: &str,
    ) -> Result<(Vec<u8>, String, Option<String>), EnvError> {
        let accept = [INDEX_TYPES, MANIFEST_TYPES].concat().join(", ");
        let r = self.get(&format!("manifests/{reference}"), &accept).await?;
        let header_digest = r
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let ct = r
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let body = bounded(r, MAX_DOCUMENT, &self.shown).await?;
        Ok((body, ct, header_digest))
    }
}

/// `a="x,y",b=z` split at the commas outside quotes.
fn split_params(s: &str) -> Vec<&str> {
    let (mut out, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// A response body of at most `limit` bytes.
async fn bounded(mut r: reqwest::Response, limit: u64, what: &str) -> Result<Vec<u8>, EnvError> {
    let mut b = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| failed(what, e))? {
        b.extend_from_slice(&chunk);
        if b.len() as u64 > limit {
            return Err(EnvError::permanent(format!(
                "{what}: a registry document larger than {limit} bytes"
            )));
        }
    }
    Ok(b)
}

fn media_type(v: &Value, fallback: &str) -> String {
    v.get("mediaType")
        .and_then(Value::as_str)
        .unwrap_or(fallback)
        .to_string()
}

/// The image `reference` names, pulled into `cache` if it is not there yet.
pub async fn resolve(cache: &Path, image: &str) -> Result<Image, EnvError> {
    let r = lattice_apis::syntax::image::parse(image).map_err(EnvError::permanent)?;
    let mut reg = Registry::new(&r)?;
    let (mut body, mut ct, mut header_digest) = reg.manifest(r.reference()).await?;
    let mut want = r.digest.clone().or(header_digest.take());
    let check = |body: &[u8], want: &Option<String>| -> Result<String, EnvError> {
        let got = format!("sha256:{}", sha256_hex(body));
        match want {
            Some(w) if *w != got => Err(EnvError::passing(format!(
                "image {r}: the registry's manifest has the digest {got}, not {w}; it is not used"
            ))),
            _ => Ok(got),
        }
    };
    let mut digest = check(&body, &want)?;
    let mut doc: Value = serde_json::from_slice(&body)
        .map_err(|e| EnvError::permanent(format!("image {r}: the manifest is not JSON: {e}")))?;
    // The document's own type wins over the header's (only the body is covered by the
    // digest).
    ct = media_type(&doc, &ct);
    if INDEX_TYPES.contains(&ct.as_str()) {
        let arch = oci_arch();
        let pick = doc
            .get("manifests")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|m| {
                let p = m.get("platform");
                p.and_then(|p| p.get("os")).and_then(Value::as_str) == Some("linux")
                    && p.and_then(|p| p.get("architecture"))
                        .and_then(Value::as_str)
                        == Some(arch)
            })
            .and_then(|m| m.get("digest"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let Some(d) = pick else {
            return Err(EnvError::permanent(format!(
                "image {r} has no linux/{arch} variant for this node"
            )));
        };
        digest_hex(&d)?;
        (body, ct, header_digest) = reg.manifest(&d).await?;
        drop(header_digest);
        want = Some(d);
        digest = check(&body, &want)?;
        doc = serde_json::from_slice(&body).map_err(|e| {
            EnvError::permanent(format!("image {r}: the manifest is not JSON: {e}"))
        })?;
        ct = media_type(&doc, &ct);
    }
    if !MANIFEST_TYPES.contains(&ct.as_str()) {
        return Err(EnvError::permanent(format!(
            "image {r}: the registry sent a {ct:?}, not an image manifest (expected one of {})",
            MANIFEST_TYPES.join(", ")
        )));
    }
    let hex = digest_hex(&digest)?.to_string();
    let lock = crate::uenv::fetch_lock(&format!("oci-{hex}"));
    let _pulling = lock.lock().await;
    let dir = cache.join(&hex);
    if let Some(img) = read_cached(&dir) {
        return Ok(img);
    }
    tokio::time::timeout(PULL_LIMIT, pull(&mut reg, &r, &doc, &hex, cache))
        .await
        .map_err(|_| {
            EnvError::passing(format!(
                "image {r}: the pull took longer than {} minutes; stopped",
                PULL_LIMIT.as_secs() / 60
            ))
        })??;
    read_cached(&dir).ok_or_else(|| {
        EnvError::passing(format!(
            "image {r}: {} is not usable after the pull",
            dir.display()
        ))
    })
}

/// The image with manifest digest `digest` in `cache`, if it is there.
pub fn cached(cache: &Path, digest: &str) -> Option<Image> {
    let hex = digest.strip_prefix("sha256:")?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    read_cached(&cache.join(hex))
}

fn read_cached(dir: &Path) -> Option<Image> {
    let c: Cached = serde_json::from_slice(&std::fs::read(dir.join("image.json")).ok()?).ok()?;
    let rootfs = dir.join("rootfs");
    rootfs.is_dir().then_some(Image {
        rootfs,
        digest: c.digest,
        env: c.env,
        working_dir: c.working_dir,
    })
}

/// Fetch the config and layers of manifest `doc` and unpack them into `cache/hex`.
async fn pull(
    reg: &mut Registry,
    r: &ImageRef,
    doc: &Value,
    hex: &str,
    cache: &Path,
) -> Result<(), EnvError> {
    let bad = |why: String| EnvError::permanent(format!("image {r}: {why}"));
    let config = doc
        .get("config")
        .ok_or_else(|| bad("the manifest has no config".into()))?;
    let config_digest = config
        .get("digest")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("the manifest's config has no digest".into()))?;
    digest_hex(config_digest)?;
    let layers = doc
        .get("layers")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("the manifest has no layers".into()))?;
    if layers.len() > MAX_LAYERS {
        return Err(bad(format!(
            "{} layers; at most {MAX_LAYERS}",
            layers.len()
        )));
    }
    let mut plan = Vec::with_capacity(layers.len());
    let mut total: u64 = 0;
    for (i, l) in layers.iter().enumerate() {
        let d = l
            .get("digest")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("layer {i} has no digest")))?;
        digest_hex(d)?;
        let mt = media_type(l, "");
        let gzip = match mt.as_str() {
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => true,
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar" => false,
            other => {
                return Err(bad(format!(
                    "layer {i} is {other:?}; this agent unpacks tar and tar+gzip layers (rebuild the image without zstd)"
                )))
            }
        };
        let size = l
            .get("size")
            .and_then(Value::as_u64)
            .filter(|s| *s > 0)
            .ok_or_else(|| bad(format!("layer {i} has no size")))?;
        total = total.saturating_add(size);
        plan.push((d.to_string(), gzip, size));
    }
    if total > MAX_COMPRESSED {
        return Err(bad(format!(
            "its layers have {total} bytes; at most {MAX_COMPRESSED}"
        )));
    }

    let cache_dir = crate::files::Dir::own(cache, 0o700)
        .map_err(|e| EnvError::passing(format!("cannot use {}: {e}", cache.display())))?;
    // What an interrupted pull of this image left.
    if let Ok(rd) = std::fs::read_dir(cache) {
        let prefix = format!(".pull-{hex}-");
        for f in rd.flatten() {
            let n = f.file_name().to_string_lossy().into_owned();
            if n.starts_with(&prefix) {
                let _ = cache_dir.remove_all(&n);
            }
        }
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let part = format!(
        ".pull-{hex}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let work = cache_dir.fresh_dir(&part, 0o700).map_err(|e| {
        EnvError::passing(format!(
            "cannot create {}: {e}",
            cache.join(&part).display()
        ))
    })?;
    let result = pull_into(reg, r, config_digest, &plan, &work).await;
    let done = result.and_then(|cached| {
        let json = serde_json::to_vec_pretty(&Cached {
            digest: format!("sha256:{hex}"),
            reference: r.to_string(),
            ..cached
        })
        .map_err(|e| EnvError::passing(format!("cannot encode image.json: {e}")))?;
        work.write_atomic("image.json", &json, 0o600)
            .map_err(|e| EnvError::passing(format!("cannot write image.json: {e}")))?;
        std::fs::rename(cache.join(&part), cache.join(hex)).map_err(|e| {
            EnvError::passing(format!(
                "cannot store the image in {}: {e}",
                cache.display()
            ))
        })
    });
    if done.is_err() {
        let _ = cache_dir.remove_all(&part);
    }
    done?;
    tracing::info!(image = %r, digest = %format!("sha256:{hex}"), layers = plan.len(), "OCI image cached");
    Ok(())
}

async fn pull_into(
    reg: &mut Registry,
    r: &ImageRef,
    config_digest: &str,
    plan: &[(String, bool, u64)],
    work: &crate::files::Dir,
) -> Result<Cached, EnvError> {
    // The config: the image's environment and working directory.
    let resp = reg.get(&format!("blobs/{config_digest}"), "").await?;
    let body = bounded(resp, MAX_DOCUMENT, &format!("{r} config")).await?;
    if format!("sha256:{}", sha256_hex(&body)) != config_digest {
        return Err(EnvError::passing(format!(
            "image {r}: the config does not match its digest {config_digest}; it is not used"
        )));
    }
    let config: Value = serde_json::from_slice(&body)
        .map_err(|e| EnvError::permanent(format!("image {r}: the config is not JSON: {e}")))?;
    let c = config.get("config");
    let env = c
        .and_then(|c| c.get("Env"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|e| e.split_once('=').is_some_and(|(k, _)| !k.is_empty()) && !e.contains('\0'))
        .map(str::to_string)
        .collect();
    let working_dir = c
        .and_then(|c| c.get("WorkingDir"))
        .and_then(Value::as_str)
        .filter(|w| w.starts_with('/'))
        .map(str::to_string);

    let root_dir = work
        .fresh_dir("rootfs", 0o755)
        .map_err(|e| EnvError::passing(format!("cannot create the root file system: {e}")))?;
    let root = std::sync::Arc::new(
        std::fs::File::open(root_dir.path())
            .map(std::os::fd::OwnedFd::from)
            .map_err(|e| EnvError::passing(format!("cannot open the root file system: {e}")))?,
    );
    let mut budget = unpack::Budget::new(MAX_UNPACKED);
    for (i, (digest, gzip, size)) in plan.iter().enumerate() {
        let name = format!("layer-{i}");
        let dest = work.join(&name);
        let out = work
            .append(&name, 0o600)
            .map_err(|e| EnvError::passing(format!("cannot create {}: {e}", dest.display())))?;
        let mut sink = Sink::new(out, *size, &dest);
        let mut resp = reg.get(&format!("blobs/{digest}"), "").await?;
        while let Some(chunk) = resp.chunk().await.map_err(|e| failed(digest, e))? {
            sink.write(&chunk)?;
        }
        let got = format!("sha256:{}", hex::encode(sink.hash.clone().finalize()));
        if got != *digest {
            return Err(EnvError::passing(format!(
                "image {r}: layer {i} has the digest {got}, not {digest}; it is not used"
            )));
        }
        let (root, gzip, shown) = (root.clone(), *gzip, r.to_string());
        budget = tokio::task::spawn_blocking(move || {
            let f = std::fs::File::open(&dest)
                .map_err(|e| EnvError::passing(format!("cannot read {}: {e}", dest.display())))?;
            let src: Box<dyn Read> = if gzip {
                Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(
                    f,
                )))
            } else {
                Box::new(std::io::BufReader::new(f))
            };
            let unpacked = unpack::layer(&root, src, &mut budget);
            let _ = std::fs::remove_file(&dest);
            unpacked
                .map(|()| budget)
                .map_err(|e| EnvError::permanent(format!("image {shown}: layer {i}: {e}")))
        })
        .await
        .map_err(|e| EnvError::passing(format!("the unpack task failed: {e}")))??;
    }
    if budget.devices_skipped > 0 {
        tracing::info!(image = %r, devices = budget.devices_skipped, "device nodes in the image were not made (the runtime makes /dev)");
    }
    Ok(Cached {
        env,
        working_dir,
        devices_skipped: budget.devices_skipped,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_recognised() {
        for h in [
            "localhost",
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.5.5",
            "169.254.169.254",
            "[::1]",
            "fd00::1",
            "fe80::1",
            "100.64.0.1",
            "x.local",
            "[::ffff:10.0.0.1]",
        ] {
            assert!(internal_host(h), "{h}");
        }
        for h in ["auth.docker.io", "8.8.8.8", "ghcr.io", "[2001:db8::1]"] {
            assert!(!internal_host(h), "{h}");
        }
    }
}
