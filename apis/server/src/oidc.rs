//! OpenID Connect: ID tokens from the site's identity providers (Keycloak, Dex, Entra, ...)
//! as bearer tokens, as Kubernetes' OIDC authenticator takes them.
//!
//! For each configured issuer the server reads the discovery document
//! (`/.well-known/openid-configuration`, whose `issuer` must be the configured one
//! exactly), then the JWKS it names, cached by key id. A token signed with a key id not in
//! the cache makes the server read the JWKS again (at most once a second per issuer), so a
//! provider's key rotation is followed without a restart; the cached set is read again
//! after [`JWKS_MAX_AGE`] as well, so a key the provider withdrew stops working.
//!
//! A token is accepted when: its `alg` is RS256, ES256 or EdDSA and fits the key's type
//! (never `none`, never HMAC: a public key is not a shared secret); its signature
//! verifies; `iss` is the issuer; `aud` names one of the configured audiences; `exp` is
//! in the future and `nbf` in the past, within the issuer's clock skew (at most
//! [`MAX_CLOCK_SKEW`]). Its claims then name the user, groups, tenants and role
//! ([`IssuerConfig`]; the role rule is the product documentation's: scopes first, then
//! the `lattice_role` / `pact_role` claims, first match wins, `user` by default).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use axum::http::HeaderMap;
use base64::Engine;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use lattice_apis::kinds::rbac::builtin;
use serde::Deserialize;
use serde_json::Value;

use crate::auth::{Authenticator, JwtAuthenticator, Role, UserInfo};
use crate::errors::{ApiError, ApiResult};
use crate::rbac::{builtin_grant, Grant};

/// Largest clock skew an issuer may be given.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);
/// How long a fetched JWKS is trusted before it is read again.
pub const JWKS_MAX_AGE: Duration = Duration::from_secs(600);
/// Least time between two reads of a JWKS for an unknown key id.
const REFETCH_INTERVAL: Duration = Duration::from_secs(1);
/// How long a verified token is remembered (a client sends the same one with every
/// request; remembering it saves the signature check, never past its `exp`).
const VERIFIED_TTL: Duration = Duration::from_secs(10);
/// Largest discovery document or JWKS read.
const MAX_DOCUMENT: usize = 1024 * 1024;

/// One trusted identity provider (`lattice-server --oidc-config FILE`, a YAML list under
/// `issuers:`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IssuerConfig {
    /// The issuer URL, exactly as the provider's tokens carry it in `iss`.
    pub issuer: String,
    /// `aud` values accepted: the client id(s) Lattice's CLI logs in as.
    pub audiences: Vec<String>,
    /// The client id `lattice login` uses (default: the first audience).
    #[serde(default)]
    pub client_id: Option<String>,
    /// The claim naming the user (default `sub`; `preferred_username` or `email` are common).
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    /// Put before every user name from this issuer (e.g. `keycloak:`), so two issuers'
    /// users cannot be mistaken for each other.
    #[serde(default)]
    pub username_prefix: String,
    /// The claim listing groups (default `groups`; absent: none).
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// Put before every group name from this issuer.
    #[serde(default)]
    pub groups_prefix: String,
    /// The claim listing the user's tenants (default `tenants`; a list or one string).
    #[serde(default = "default_tenants_claim")]
    pub tenants_claim: String,
    /// Groups starting with this prefix also name tenants (`tenant:` makes the group
    /// `tenant:physics` the tenant `physics`).
    #[serde(default)]
    pub tenant_group_prefix: Option<String>,
    /// Claims whose value names a role (the product documentation's cross-system claims).
    /// They must be ones the provider sets per user, never ones users can set themselves.
    #[serde(default = "default_role_claims")]
    pub role_claims: Vec<String>,
    /// Also take roles from the token's scopes (`admin`, `tenant:admin`, `operator`,
    /// `sensitive:claim`, `readonly`), as the product documentation describes. Off by
    /// default: a client asks for scopes, and many providers grant an optional scope to
    /// whoever asks; turn it on only where the provider grants those scopes per user.
    #[serde(default)]
    pub role_scopes: bool,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds (default 30, at most 300).
    #[serde(default = "default_skew")]
    pub clock_skew_seconds: u64,
    /// PEM CA bundle to trust for the provider's https (default: the system's roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Scopes `lattice login` asks for (default: openid, offline_access, profile, email,
    /// groups; add the ones whose claims the mapping above reads).
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
}

fn default_scopes() -> Vec<String> {
    ["openid", "offline_access", "profile", "email", "groups"]
        .map(String::from)
        .to_vec()
}

fn default_username_claim() -> String {
    "sub".into()
}
fn default_groups_claim() -> String {
    "groups".into()
}
fn default_tenants_claim() -> String {
    "tenants".into()
}
fn default_role_claims() -> Vec<String> {
    vec!["lattice_role".into(), "pact_role".into()]
}
fn default_skew() -> u64 {
    30
}

/// The file `--oidc-config` names.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OidcConfig {
    /// The identity providers trusted.
    pub issuers: Vec<IssuerConfig>,
}

impl OidcConfig {
    /// Reads and checks `--oidc-config`.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("read the OIDC config {}: {e}", path.display()))?;
        let cfg: OidcConfig = serde_yaml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("the OIDC config {}: {e}", path.display()))?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Every issuer is usable: an https URL (http only on loopback, for tests), at least
    /// one audience, a bounded clock skew, no issuer twice.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.issuers.is_empty() {
            anyhow::bail!("issuers: name at least one identity provider");
        }
        let mut seen = std::collections::HashSet::new();
        for (i, c) in self.issuers.iter().enumerate() {
            let at = format!("issuers[{i}]");
            reqwest::Url::parse(&c.issuer)
                .map_err(|e| anyhow::anyhow!("{at}.issuer: {:?} is not a URL: {e}", c.issuer))?;
            if !secure_url(&c.issuer) {
                anyhow::bail!(
                    "{at}.issuer: {:?} must be https (plain http only on loopback, for tests)",
                    c.issuer
                );
            }
            if c.audiences.is_empty() || c.audiences.iter().any(String::is_empty) {
                anyhow::bail!("{at}.audiences: name the client id(s) tokens must be issued to");
            }
            if c.clock_skew_seconds > MAX_CLOCK_SKEW.as_secs() {
                anyhow::bail!(
                    "{at}.clockSkewSeconds: {} is more than {} s; fix the clocks instead",
                    c.clock_skew_seconds,
                    MAX_CLOCK_SKEW.as_secs()
                );
            }
            if c.username_claim.is_empty() {
                anyhow::bail!("{at}.usernameClaim: must name a claim (sub, email, ...)");
            }
            if !seen.insert(c.issuer.clone()) {
                anyhow::bail!("{at}.issuer: {:?} is listed twice", c.issuer);
            }
            // Two issuers naming users or groups alike would let one's be the other's:
            // with several, every prefix is non-empty and none starts another.
            if self.issuers.len() > 1 {
                let username: fn(&IssuerConfig) -> &str = |o| &o.username_prefix;
                let groups: fn(&IssuerConfig) -> &str = |o| &o.groups_prefix;
                for (field, prefix) in [("usernamePrefix", username), ("groupsPrefix", groups)] {
                    let mine = prefix(c);
                    let clash = self
                        .issuers
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, o)| prefix(o))
                        .any(|p| p.starts_with(mine) || mine.starts_with(p));
                    if mine.is_empty() || clash {
                        anyhow::bail!(
                            "{at}.{field}: {mine:?}: with several issuers each needs a \
                             non-empty prefix that no other issuer's starts with or extends, \
                             or one issuer's users or groups could pass for another's"
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// An https URL, or plain http on loopback (tests).
fn secure_url(u: &str) -> bool {
    reqwest::Url::parse(u).is_ok_and(|url| {
        let loopback = matches!(url.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
        url.scheme() == "https" || (url.scheme() == "http" && loopback)
    })
}

/// What a provider's keys are, as last read.
#[derive(Default)]
struct Keys {
    by_kid: HashMap<String, (Algorithm, Arc<DecodingKey>)>,
    /// Keys without a `kid`: tried in turn for tokens without one.
    anonymous: Vec<(Algorithm, Arc<DecodingKey>)>,
    jwks_uri: Option<String>,
    /// When the keys were last read.
    fetched: Option<Instant>,
    /// When they were last asked for, read or not (an unknown `kid` makes the server ask
    /// at most once per [`REFETCH_INTERVAL`], even while the provider is down).
    attempted: Option<Instant>,
}

struct Issuer {
    cfg: IssuerConfig,
    http: reqwest::Client,
    keys: tokio::sync::Mutex<Keys>,
    /// Bumped each time the keys are read again: a token verified before is verified
    /// again (its key may be gone).
    generation: std::sync::atomic::AtomicU64,
}

/// The accepted algorithms, and the key type each needs.
fn algorithm_for(jwk: &Jwk) -> Option<Algorithm> {
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature)
    {
        return None;
    }
    let declared = jwk
        .common
        .key_algorithm
        .and_then(|a| format!("{a:?}").parse::<Algorithm>().ok());
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        // HMAC keys and other curves: never (a published key is not a shared secret).
        _ => return None,
    };
    match declared {
        Some(a) if a != by_type => None,
        _ => Some(by_type),
    }
}

async fn fetch_json(http: &reqwest::Client, url: &str) -> Result<Value, String> {
    let resp = http
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("GET {url}: HTTP {}", resp.status()));
    }
    if resp
        .content_length()
        .is_some_and(|l| l as usize > MAX_DOCUMENT)
    {
        return Err(format!("GET {url}: larger than {MAX_DOCUMENT} bytes"));
    }
    let body = resp.bytes().await.map_err(|e| format!("GET {url}: {e}"))?;
    if body.len() > MAX_DOCUMENT {
        return Err(format!("GET {url}: larger than {MAX_DOCUMENT} bytes"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
}

impl Issuer {
    /// Reads the discovery document (once) and the JWKS.
    async fn refresh(&self, keys: &mut Keys) -> Result<(), String> {
        let jwks_uri = match &keys.jwks_uri {
            Some(u) => u.clone(),
            None => {
                let url = format!(
                    "{}/.well-known/openid-configuration",
                    self.cfg.issuer.trim_end_matches('/')
                );
                let doc = fetch_json(&self.http, &url).await?;
                let iss = doc
                    .get("issuer")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if iss != self.cfg.issuer {
                    return Err(format!(
                        "the discovery document at {url} names issuer {iss:?}, not {:?}",
                        self.cfg.issuer
                    ));
                }
                let u = doc
                    .get("jwks_uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("the discovery document at {url} has no jwks_uri"))?
                    .to_string();
                if !secure_url(&u) {
                    return Err(format!(
                        "the discovery document at {url} names jwks_uri {u:?}, which is not \
                         https (plain http only on loopback)"
                    ));
                }
                keys.jwks_uri = Some(u.clone());
                u
            }
        };
        let set = fetch_json(&self.http, &jwks_uri).await?;
        let mut by_kid = HashMap::new();
        let mut anonymous = Vec::new();
        for k in set
            .get("keys")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Ok(jwk) = serde_json::from_value::<Jwk>(k.clone()) else {
                continue;
            };
            let Some(alg) = algorithm_for(&jwk) else {
                continue;
            };
            let Ok(key) = DecodingKey::from_jwk(&jwk) else {
                continue;
            };
            match &jwk.common.key_id {
                Some(kid) => {
                    by_kid.insert(kid.clone(), (alg, Arc::new(key)));
                }
                None => anonymous.push((alg, Arc::new(key))),
            }
        }
        tracing::info!(issuer = %self.cfg.issuer, keys = by_kid.len() + anonymous.len(), "OIDC signing keys read");
        keys.by_kid = by_kid;
        keys.anonymous = anonymous;
        keys.fetched = Some(Instant::now());
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// The keys that may have signed a token with `kid` and `alg`, reading the JWKS again
    /// when the kid is unknown (rotation) or the set is old.
    async fn keys_for(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> ApiResult<Vec<Arc<DecodingKey>>> {
        let mut keys = self.keys.lock().await;
        let find = |k: &Keys| -> Vec<Arc<DecodingKey>> {
            match kid {
                Some(kid) => k
                    .by_kid
                    .get(kid)
                    .filter(|(a, _)| *a == alg)
                    .map(|(_, key)| vec![key.clone()])
                    .unwrap_or_default(),
                None => k
                    .anonymous
                    .iter()
                    .chain(k.by_kid.values())
                    .filter(|(a, _)| *a == alg)
                    .map(|(_, key)| key.clone())
                    .collect(),
            }
        };
        let stale = keys.fetched.is_none_or(|t| t.elapsed() > JWKS_MAX_AGE);
        let found = find(&keys);
        let may_refetch = keys
            .attempted
            .is_none_or(|t| t.elapsed() >= REFETCH_INTERVAL);
        if (stale || found.is_empty()) && may_refetch {
            keys.attempted = Some(Instant::now());
            if let Err(e) = self.refresh(&mut keys).await {
                tracing::warn!(issuer = %self.cfg.issuer, error = %e, "cannot read the identity provider's keys");
                if keys.fetched.is_none() {
                    return Err(ApiError::unavailable(format!(
                        "cannot read the signing keys of the identity provider {}: {e}",
                        self.cfg.issuer
                    )));
                }
            }
            return Ok(find(&keys));
        }
        Ok(found)
    }

    /// The user `claims` name.
    fn user(&self, claims: &Value, exp: u64) -> ApiResult<UserInfo> {
        let c = &self.cfg;
        if c.username_claim == "email"
            && claims.get("email_verified").and_then(Value::as_bool) != Some(true)
        {
            return Err(ApiError::unauthorized(format!(
                "invalid OIDC token: users are named by their email here, and {} has not \
                 verified this one (email_verified is not true)",
                c.issuer
            )));
        }
        let name = match claims.get(&c.username_claim) {
            Some(Value::String(s)) if !s.is_empty() => format!("{}{s}", c.username_prefix),
            _ => {
                return Err(ApiError::unauthorized(format!(
                    "invalid OIDC token: it has no {:?} claim to name the user by (this \
                     server's usernameClaim for {})",
                    c.username_claim, c.issuer
                )))
            }
        };
        if name.starts_with("system:") {
            return Err(ApiError::unauthorized(format!(
                "invalid OIDC token: the user name {name:?} is reserved for system identities"
            )));
        }
        let strings = |v: Option<&Value>| -> Vec<String> {
            match v {
                Some(Value::String(s)) => vec![s.clone()],
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect(),
                _ => Vec::new(),
            }
        };
        let raw_groups = strings(claims.get(&c.groups_claim));
        let mut tenants = strings(claims.get(&c.tenants_claim));
        if let Some(p) = &c.tenant_group_prefix {
            tenants.extend(
                raw_groups
                    .iter()
                    .filter_map(|g| g.strip_prefix(p.as_str()))
                    .map(str::to_string),
            );
        }
        tenants.retain(|t| lattice_apis::validation::is_dns1123_label(t));
        tenants.sort();
        tenants.dedup();
        let groups: Vec<String> = raw_groups
            .iter()
            .filter(|g| !g.starts_with("system:"))
            .map(|g| format!("{}{g}", c.groups_prefix))
            .collect();
        let role = derive_role(claims, &c.role_claims, c.role_scopes);
        let grants: Vec<Grant> = match role {
            builtin::SYSTEM_ADMIN | builtin::OPERATOR => {
                builtin_grant(role, None).into_iter().collect()
            }
            _ => tenants
                .iter()
                .filter_map(|t| builtin_grant(role, Some(t)))
                .collect(),
        };
        Ok(UserInfo {
            name,
            // Membership follows from the grants (`crate::rbac::apply_grants`); the
            // readonly role of a token grants nothing by itself in no tenant.
            tenants: Some(Vec::new()),
            role: Role::Readonly,
            expires: Some(exp),
            groups,
            grants: Arc::new(grants),
            ..Default::default()
        })
    }
}

/// The role a token's claims give, as the product documentation derives it: OIDC scopes
/// first when `use_scopes` (`admin` / `system:admin`, `tenant:admin`, `operator`,
/// `sensitive:claim`, `readonly`), then the cross-system role claims (`system-admin` /
/// `pact-platform-admin`, `tenant-admin`, `operator`); first match wins; `user` otherwise.
pub fn derive_role(claims: &Value, role_claims: &[String], use_scopes: bool) -> &'static str {
    let scopes: Vec<String> = match (claims.get("scope"), claims.get("scp")) {
        _ if !use_scopes => Vec::new(),
        (Some(Value::String(s)), _) => s.split_whitespace().map(str::to_string).collect(),
        (_, Some(Value::Array(a))) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        (_, Some(Value::String(s))) => s.split_whitespace().map(str::to_string).collect(),
        _ => Vec::new(),
    };
    for s in &scopes {
        match s.as_str() {
            "admin" | "system:admin" => return builtin::SYSTEM_ADMIN,
            "tenant:admin" => return builtin::TENANT_ADMIN,
            "operator" => return builtin::OPERATOR,
            "sensitive:claim" => return builtin::CLAIMING_USER,
            "readonly" => return builtin::READONLY,
            _ => {}
        }
    }
    for claim in role_claims {
        if let Some(v) = claims.get(claim).and_then(Value::as_str) {
            match v {
                "system-admin" | "pact-platform-admin" => return builtin::SYSTEM_ADMIN,
                "tenant-admin" => return builtin::TENANT_ADMIN,
                "operator" => return builtin::OPERATOR,
                _ => {}
            }
        }
    }
    builtin::USER
}

/// The unverified `iss` of a JWT: which issuer's keys to check it with.
fn unverified_issuer(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.get("iss")?.as_str().map(str::to_string)
}

/// Bearer tokens from the configured identity providers, and (only where allowed: `--dev`,
/// tests, break-glass) the server's own HS256 tokens.
pub struct OidcAuthenticator {
    issuers: Vec<Issuer>,
    /// The server's own HS256 tokens: job tokens always (the server mints them for every
    /// running job), people's only when `hs256_people` (`--dev`, break-glass).
    hs256: JwtAuthenticator,
    hs256_people: bool,
    /// Verified tokens: the user, until when, which issuer and its key generation.
    verified: Mutex<HashMap<String, Verified>>,
}

struct Verified {
    user: UserInfo,
    until: Instant,
    issuer: usize,
    generation: u64,
}

impl OidcAuthenticator {
    /// `hs256` checks the server's own tokens (those whose `iss` is none of the
    /// providers'): job tokens always, people's only when `hs256_people`.
    pub fn new(
        cfg: &OidcConfig,
        hs256: JwtAuthenticator,
        hs256_people: bool,
    ) -> anyhow::Result<Self> {
        cfg.check()?;
        let mut issuers = Vec::new();
        for c in &cfg.issuers {
            let mut b = reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::custom(|attempt| {
                    // Every hop must be as secure as the first (no https → http).
                    if attempt.previous().len() >= 3 {
                        attempt.error("too many redirects")
                    } else if secure_url(attempt.url().as_str()) {
                        attempt.follow()
                    } else {
                        attempt.error("redirected to an address that is not https")
                    }
                }));
            if let Some(ca) = &c.ca_file {
                let pem = std::fs::read(ca)
                    .map_err(|e| anyhow::anyhow!("read the CA file {}: {e}", ca.display()))?;
                for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
                    b = b.add_root_certificate(cert);
                }
            }
            issuers.push(Issuer {
                cfg: c.clone(),
                http: b.build()?,
                keys: Default::default(),
                generation: Default::default(),
            });
        }
        Ok(Self {
            issuers,
            hs256,
            hs256_people,
            verified: Mutex::new(HashMap::new()),
        })
    }

    /// The trusted issuers, for `GET /v1/auth/discovery`.
    pub fn issuers(&self) -> Vec<IssuerConfig> {
        self.issuers.iter().map(|i| i.cfg.clone()).collect()
    }

    /// Checks `token`.
    pub async fn verify(&self, token: &str) -> ApiResult<UserInfo> {
        {
            let mut v = self.verified.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(hit) = v.get(token) {
                let current = self
                    .issuers
                    .get(hit.issuer)
                    .map(|i| i.generation.load(std::sync::atomic::Ordering::Acquire));
                if Instant::now() < hit.until && current == Some(hit.generation) {
                    return Ok(hit.user.clone());
                }
                v.remove(token);
            }
        }
        let iss = unverified_issuer(token);
        let Some((index, issuer)) = iss.as_deref().and_then(|iss| {
            self.issuers
                .iter()
                .enumerate()
                .find(|(_, i)| i.cfg.issuer == iss)
        }) else {
            if iss.is_none() {
                // The server's own token: a job's always, a person's only when allowed.
                if let Ok(u) = self.hs256.verify(token) {
                    if u.bound_to.is_some() || self.hs256_people {
                        return Ok(u);
                    }
                }
            }
            let trusted: Vec<&str> = self.issuers.iter().map(|i| i.cfg.issuer.as_str()).collect();
            return Err(ApiError::unauthorized(format!(
                "invalid bearer token: issuer {:?} is not trusted here (trusted: {}); log in \
                 with `lattice login`",
                iss.unwrap_or_default(),
                trusted.join(", ")
            )));
        };
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| ApiError::unauthorized(format!("invalid OIDC token: {e}")))?;
        if !matches!(
            header.alg,
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA
        ) {
            return Err(ApiError::unauthorized(format!(
                "invalid OIDC token: algorithm {:?} is not accepted (RS256, ES256, EdDSA)",
                header.alg
            )));
        }
        let keys = issuer.keys_for(header.kid.as_deref(), header.alg).await?;
        let generation = issuer.generation.load(std::sync::atomic::Ordering::Acquire);
        if keys.is_empty() {
            return Err(ApiError::unauthorized(format!(
                "invalid OIDC token: signed with a key {} does not publish{}",
                issuer.cfg.issuer,
                header
                    .kid
                    .map(|k| format!(" (kid {k:?})"))
                    .unwrap_or_default()
            )));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[issuer.cfg.issuer.as_str()]);
        validation.set_audience(&issuer.cfg.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = issuer.cfg.clock_skew_seconds;
        let mut last = None;
        for key in keys {
            match jsonwebtoken::decode::<Value>(token, &key, &validation) {
                Ok(data) => {
                    let exp = data.claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
                    let user = issuer.user(&data.claims, exp)?;
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_secs();
                    let left = Duration::from_secs(exp.saturating_sub(now));
                    let mut v = self.verified.lock().unwrap_or_else(|p| p.into_inner());
                    if v.len() >= 4096 {
                        v.clear();
                    }
                    v.insert(
                        token.to_string(),
                        Verified {
                            user: user.clone(),
                            until: Instant::now() + left.min(VERIFIED_TTL),
                            issuer: index,
                            generation,
                        },
                    );
                    return Ok(user);
                }
                Err(e) => last = Some(e),
            }
        }
        let why = match last.map(|e| e.into_kind()) {
            Some(jsonwebtoken::errors::ErrorKind::InvalidAudience) => format!(
                "it was not issued to this cluster (aud must name one of: {})",
                issuer.cfg.audiences.join(", ")
            ),
            Some(jsonwebtoken::errors::ErrorKind::ExpiredSignature) => {
                "it has expired; `lattice login` again (or let the CLI refresh it)".to_string()
            }
            Some(jsonwebtoken::errors::ErrorKind::ImmatureSignature) => {
                "it is not valid yet (nbf)".to_string()
            }
            Some(k) => format!("{k:?}"),
            None => "no key verified it".to_string(),
        };
        Err(ApiError::unauthorized(format!("invalid OIDC token: {why}")))
    }
}

#[async_trait]
impl Authenticator for OidcAuthenticator {
    async fn authenticate(&self, headers: &HeaderMap) -> ApiResult<Option<UserInfo>> {
        match crate::auth::bearer_token(headers)? {
            Some(token) => self.verify(token).await.map(Some),
            None => Ok(None),
        }
    }

    fn oidc_issuers(&self) -> Vec<IssuerConfig> {
        self.issuers()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roles_follow_the_documented_rule() {
        let rc = default_role_claims();
        assert_eq!(derive_role(&json!({}), &rc, true), builtin::USER);
        // Scopes are what a client asks for: roles from them only where the site says so.
        assert_eq!(
            derive_role(&json!({"scope": "openid admin"}), &rc, false),
            builtin::USER
        );
        assert_eq!(
            derive_role(&json!({"scope": "openid admin"}), &rc, true),
            builtin::SYSTEM_ADMIN
        );
        assert_eq!(
            derive_role(&json!({"scp": ["tenant:admin"]}), &rc, true),
            builtin::TENANT_ADMIN
        );
        // Scopes first, then claims.
        assert_eq!(
            derive_role(
                &json!({"scope": "readonly", "lattice_role": "system-admin"}),
                &rc,
                true
            ),
            builtin::READONLY
        );
        assert_eq!(
            derive_role(&json!({"pact_role": "pact-platform-admin"}), &rc, true),
            builtin::SYSTEM_ADMIN
        );
        assert_eq!(
            derive_role(&json!({"lattice_role": "operator"}), &rc, true),
            builtin::OPERATOR
        );
        assert_eq!(
            derive_role(&json!({"lattice_role": "root"}), &rc, true),
            builtin::USER
        );
    }

    #[test]
    fn issuers_must_be_https_with_an_audience_and_a_bounded_skew() {
        let ok = |issuer: &str, skew: u64| {
            OidcConfig {
                issuers: vec![IssuerConfig {
                    issuer: issuer.into(),
                    audiences: vec!["lattice".into()],
                    client_id: None,
                    username_claim: "sub".into(),
                    username_prefix: String::new(),
                    groups_claim: "groups".into(),
                    groups_prefix: String::new(),
                    tenants_claim: "tenants".into(),
                    tenant_group_prefix: None,
                    role_claims: default_role_claims(),
                    role_scopes: false,
                    clock_skew_seconds: skew,
                    ca_file: None,
                    scopes: default_scopes(),
                }],
            }
            .check()
        };
        ok("https://idp.example.org/realms/hpc", 30).unwrap();
        ok("http://127.0.0.1:8080", 30).unwrap();
        assert!(ok("http://idp.example.org", 30).is_err());
        assert!(ok("https://idp.example.org", 3600).is_err());
    }

    #[test]
    fn the_servers_own_tokens_pass_for_jobs_and_for_people_only_when_allowed() {
        let cfg: OidcConfig = serde_yaml::from_str(
            "issuers:\n- issuer: http://127.0.0.1:9\n  audiences: [lattice]\n",
        )
        .unwrap();
        let secret = b"0123456789abcdef0123456789abcdef";
        let job = crate::auth::mint_job_token(
            secret,
            "alice",
            crate::auth::BoundAllocation {
                ns: "t1".into(),
                name: "j".into(),
                uid: "u".into(),
            },
            std::time::Duration::from_secs(60),
        );
        let person = crate::auth::mint_token(
            secret,
            "alice",
            &["t1".into()],
            Role::User,
            std::time::Duration::from_secs(60),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let strict = OidcAuthenticator::new(&cfg, JwtAuthenticator::new(secret), false).unwrap();
        assert!(rt.block_on(strict.verify(&job)).unwrap().bound_to.is_some());
        let e = rt.block_on(strict.verify(&person)).unwrap_err();
        assert_eq!(e.code, 401);
        let dev = OidcAuthenticator::new(&cfg, JwtAuthenticator::new(secret), true).unwrap();
        assert_eq!(rt.block_on(dev.verify(&person)).unwrap().name, "alice");
    }

    #[test]
    fn several_issuers_name_users_and_groups_apart() {
        let two = |a: &str, b: &str, ga: &str, gb: &str| {
            serde_yaml::from_str::<OidcConfig>(&format!(
                "issuers:\n- {{issuer: 'https://a.example', audiences: [l], usernamePrefix: '{a}', groupsPrefix: '{ga}'}}\n- {{issuer: 'https://b.example', audiences: [l], usernamePrefix: '{b}', groupsPrefix: '{gb}'}}\n"
            ))
            .unwrap()
            .check()
        };
        two("a:", "b:", "a:", "b:").unwrap();
        // Empty, or one extending the other ("corp:alice" minted by A would be B's alice).
        assert!(two("", "corp:", "a:", "b:").is_err());
        assert!(two("c:", "c:x:", "a:", "b:").is_err());
        assert!(two("a:", "b:", "", "b:").is_err());
    }

    #[test]
    fn hmac_and_foreign_curves_are_never_keys() {
        let oct: Jwk =
            serde_json::from_value(json!({"kty": "oct", "k": "c2VjcmV0", "kid": "h"})).unwrap();
        assert_eq!(algorithm_for(&oct), None);
        let rsa: Jwk =
            serde_json::from_value(json!({"kty": "RSA", "n": "AQAB", "e": "AQAB", "alg": "RS256"}))
                .unwrap();
        assert_eq!(algorithm_for(&rsa), Some(Algorithm::RS256));
        let mislabelled: Jwk =
            serde_json::from_value(json!({"kty": "RSA", "n": "AQAB", "e": "AQAB", "alg": "ES256"}))
                .unwrap();
        assert_eq!(algorithm_for(&mislabelled), None);
        let enc: Jwk =
            serde_json::from_value(json!({"kty": "RSA", "n": "AQAB", "e": "AQAB", "use": "enc"}))
                .unwrap();
        assert_eq!(algorithm_for(&enc), None);
    }
}
