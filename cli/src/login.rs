//! `lattice login | logout | whoami`: logging in through the site's identity provider.
//!
//! The server says which providers it trusts (`GET /v1/auth/discovery`, public); the CLI
//! reads the provider's discovery document and logs in with its public client:
//!
//! * `device` (the default without a browser): the device authorization grant (RFC 8628):
//!   a URL and a code to open on any device, while the CLI polls;
//! * `browser` (the default when a display is there): authorization code with PKCE (S256),
//!   redirected to a one-shot listener on 127.0.0.1 (RFC 8252);
//! * `manual`: the same URL, and the address the browser ends on is pasted back.
//!
//! The ID token (what the API server checks) and the refresh token are kept in
//! `$XDG_CONFIG_HOME/lattice/tokens/<server>.json` (or `~/.config/...`), mode 0600, one
//! file per server. Every command uses it when no other token is configured, refreshing it
//! silently when it expires within a minute.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Env;
use crate::errors::CliError;

/// How `lattice login` logs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flow {
    /// Device authorization grant: open a URL anywhere and enter a code.
    Device,
    /// Authorization code + PKCE, redirected to a listener on 127.0.0.1.
    Browser,
    /// As `browser`, but the address the browser ends on is pasted back here.
    Manual,
}

/// A login, as cached.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cached {
    pub server: String,
    pub issuer: String,
    pub client_id: String,
    pub token_endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_endpoint: Option<String>,
    pub id_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// When the ID token expires (seconds since the epoch).
    pub expires_at: u64,
}

/// Refresh when the ID token has less than this left.
const REFRESH_BEFORE: u64 = 60;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

fn err(what: &str, why: impl std::fmt::Display) -> CliError {
    CliError::new(what.to_string(), why.to_string())
}

/// Where logins are cached.
pub fn cache_dir(env: &Env) -> Option<PathBuf> {
    let base = match env.get("XDG_CONFIG_HOME") {
        Some(x) => PathBuf::from(x),
        None => Path::new(&env.get("HOME")?).join(".config"),
    };
    Some(base.join("lattice").join("tokens"))
}

/// The cache file of `server`.
pub fn cache_file(env: &Env, server: &str) -> Option<PathBuf> {
    let digest = ring::digest::digest(&ring::digest::SHA256, server.as_bytes());
    let name: String = digest.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(cache_dir(env)?.join(format!("{name}.json")))
}

/// Writes `c` to its file, readable by its owner only (created 0600, written whole, then
/// renamed into place).
fn store(env: &Env, c: &Cached) -> Result<PathBuf, CliError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = cache_file(env, &c.server)
        .ok_or_else(|| err("save the login", "neither XDG_CONFIG_HOME nor HOME is set"))?;
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(&format!("create {}", dir.display()), e))?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| err(&format!("write {}", tmp.display()), e))?;
    let body = serde_json::to_vec_pretty(c).map_err(|e| err("save the login", e))?;
    f.write_all(&body)
        .and_then(|()| f.sync_all())
        .map_err(|e| err(&format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &path).map_err(|e| err(&format!("write {}", path.display()), e))?;
    Ok(path)
}

/// The cached login for `server`, if any (a file others may read is refused, not used).
pub fn load(env: &Env, server: &str) -> Result<Option<Cached>, CliError> {
    use std::os::unix::fs::MetadataExt;
    let Some(path) = cache_file(env, server) else {
        return Ok(None);
    };
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(&format!("read {}", path.display()), e)),
    };
    if !meta.is_file() || meta.mode() & 0o077 != 0 {
        return Err(err(
            &format!("read the login cached in {}", path.display()),
            "it is not a plain file readable by its owner only",
        )
        .hint("remove it and run `lattice login` again"));
    }
    let text = std::fs::read(&path).map_err(|e| err(&format!("read {}", path.display()), e))?;
    let c: Cached = serde_json::from_slice(&text).map_err(|e| {
        err(&format!("read {}", path.display()), e).hint("remove it and run `lattice login` again")
    })?;
    Ok((c.server == server).then_some(c))
}

fn http(insecure: bool, ca_pem: Option<&[u8]>) -> Result<reqwest::Client, CliError> {
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .user_agent(crate::client::USER_AGENT);
    if insecure {
        b = b.danger_accept_invalid_certs(true);
    }
    if let Some(pem) = ca_pem {
        for c in
            reqwest::Certificate::from_pem_bundle(pem).map_err(|e| err("read the CA file", e))?
        {
            b = b.add_root_certificate(c);
        }
    }
    b.build().map_err(|e| err("set up the HTTP client", e))
}

async fn get_json(http: &reqwest::Client, url: &str) -> Result<Value, CliError> {
    let resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| err(&format!("GET {url}"), e))?;
    let status = resp.status();
    let body: Value = resp
        .json()
        .await
        .map_err(|e| err(&format!("GET {url}"), format!("not JSON: {e}")))?;
    if !status.is_success() {
        return Err(err(&format!("GET {url}"), format!("HTTP {status}: {body}")));
    }
    Ok(body)
}

/// A token endpoint's answer: the tokens, or the OAuth error code and text.
async fn token_request(
    http: &reqwest::Client,
    endpoint: &str,
    form: &[(&str, &str)],
) -> Result<Result<Value, (String, String)>, CliError> {
    let resp = http
        .post(endpoint)
        .form(form)
        .send()
        .await
        .map_err(|e| err(&format!("POST {endpoint}"), e))?;
    let ok = resp.status().is_success();
    let body: Value = resp
        .json()
        .await
        .map_err(|e| err(&format!("POST {endpoint}"), format!("not JSON: {e}")))?;
    if ok {
        return Ok(Ok(body));
    }
    let code = body["error"].as_str().unwrap_or("error").to_string();
    let text = body["error_description"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok(Err((code, text)))
}

/// The claims of a JWT, unverified (the CLI reads its own token's expiry and nonce; the
/// API server is what verifies it).
fn claims(jwt: &str) -> Option<Value> {
    let payload = jwt.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn random_url_safe(n: usize) -> Result<String, CliError> {
    use ring::rand::SecureRandom;
    let mut b = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| err("log in", "no randomness"))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
}

/// The provider's endpoints.
struct Provider {
    issuer: String,
    client_id: String,
    scopes: String,
    authorization_endpoint: Option<String>,
    device_endpoint: Option<String>,
    token_endpoint: String,
    revocation_endpoint: Option<String>,
}

/// What `lattice login` was asked.
pub struct LoginRequest<'a> {
    pub server: &'a str,
    pub flow: Option<Flow>,
    pub issuer: Option<&'a str>,
    pub client_id: Option<&'a str>,
    pub insecure: bool,
    pub ca_pem: Option<&'a [u8]>,
}

async fn provider(http: &reqwest::Client, req: &LoginRequest<'_>) -> Result<Provider, CliError> {
    let disc = get_json(http, &format!("{}/v1/auth/discovery", req.server)).await?;
    let issuers = disc["issuers"].as_array().cloned().unwrap_or_default();
    if issuers.is_empty() {
        return Err(err(
            "log in",
            format!("the server at {} trusts no identity provider", req.server),
        )
        .hint("ask its administrator for a token (lattice admin token create), or start it with --oidc-config"));
    }
    let chosen = match req.issuer {
        Some(want) => issuers
            .iter()
            .find(|i| i["issuer"].as_str() == Some(want))
            .ok_or_else(|| {
                let known: Vec<&str> = issuers
                    .iter()
                    .filter_map(|i| i["issuer"].as_str())
                    .collect();
                err("log in", format!("the server does not trust {want}"))
                    .hint(format!("it trusts: {}", known.join(", ")))
            })?,
        None => &issuers[0],
    };
    let issuer = chosen["issuer"].as_str().unwrap_or_default().to_string();
    let client_id = req
        .client_id
        .map(str::to_string)
        .or_else(|| chosen["clientId"].as_str().map(str::to_string))
        .ok_or_else(|| err("log in", "the server names no client id").hint("pass --client-id"))?;
    let scopes = chosen["scopes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "openid offline_access profile email groups".to_string());
    let doc = get_json(
        http,
        &format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        ),
    )
    .await?;
    if doc["issuer"].as_str() != Some(issuer.as_str()) {
        return Err(err(
            "log in",
            format!(
                "the provider's discovery document names issuer {}, not {issuer}",
                doc["issuer"]
            ),
        ));
    }
    let s = |k: &str| doc[k].as_str().map(str::to_string);
    Ok(Provider {
        issuer,
        client_id,
        scopes,
        authorization_endpoint: s("authorization_endpoint"),
        device_endpoint: s("device_authorization_endpoint"),
        token_endpoint: s("token_endpoint")
            .ok_or_else(|| err("log in", "the provider has no token_endpoint"))?,
        revocation_endpoint: s("revocation_endpoint"),
    })
}

/// Whether a browser can be opened here.
fn has_browser(env: &Env) -> bool {
    env.get("BROWSER").is_some()
        || env.get("DISPLAY").is_some()
        || env.get("WAYLAND_DISPLAY").is_some()
}

fn open_browser(env: &Env, url: &str) {
    let cmd = env.get("BROWSER").unwrap_or_else(|| "xdg-open".to_string());
    let _ = std::process::Command::new(cmd)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

async fn device_flow(
    http: &reqwest::Client,
    p: &Provider,
    tell: &mut dyn Write,
) -> Result<Value, CliError> {
    let endpoint = p.device_endpoint.as_deref().ok_or_else(|| {
        err(
            "log in",
            format!("{} offers no device authorization", p.issuer),
        )
        .hint("use --flow browser or --flow manual")
    })?;
    let started = match token_request(
        http,
        endpoint,
        &[("client_id", &p.client_id), ("scope", &p.scopes)],
    )
    .await?
    {
        Ok(v) => v,
        Err((code, text)) => return Err(err("start the device login", format!("{code}: {text}"))),
    };
    let device_code = started["device_code"]
        .as_str()
        .ok_or_else(|| err("start the device login", "the provider sent no device_code"))?;
    let url = started["verification_uri_complete"]
        .as_str()
        .or_else(|| started["verification_uri"].as_str())
        .unwrap_or_default();
    let user_code = started["user_code"].as_str().unwrap_or_default();
    writeln!(
        tell,
        "To log in, open {url}\nand confirm the code {user_code} (waiting...)"
    )
    .ok();
    tell.flush().ok();
    let mut interval = started["interval"].as_u64().unwrap_or(5).max(1);
    let deadline = now() + started["expires_in"].as_u64().unwrap_or(600);
    loop {
        tokio::time::sleep(Duration::from_secs(interval)).await;
        match token_request(
            http,
            &p.token_endpoint,
            &[
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", device_code),
                ("client_id", &p.client_id),
            ],
        )
        .await?
        {
            Ok(tokens) => return Ok(tokens),
            Err((code, _)) if code == "authorization_pending" => {}
            Err((code, _)) if code == "slow_down" => interval += 5,
            Err((code, text)) => {
                return Err(
                    err("log in", format!("{code}: {text}")).hint("run `lattice login` again")
                )
            }
        }
        if now() > deadline {
            return Err(err("log in", "the code expired before it was confirmed")
                .hint("run `lattice login` again"));
        }
    }
}

struct CodeRequest {
    url: String,
    redirect_uri: String,
    state: String,
    nonce: String,
    verifier: String,
}

fn code_request(p: &Provider, redirect_uri: String) -> Result<CodeRequest, CliError> {
    let endpoint = p.authorization_endpoint.as_deref().ok_or_else(|| {
        err(
            "log in",
            format!("{} has no authorization endpoint", p.issuer),
        )
        .hint("use --flow device")
    })?;
    let verifier = random_url_safe(48)?;
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(ring::digest::digest(
        &ring::digest::SHA256,
        verifier.as_bytes(),
    ));
    let (state, nonce) = (random_url_safe(16)?, random_url_safe(16)?);
    let url = reqwest::Url::parse_with_params(
        endpoint,
        [
            ("response_type", "code"),
            ("client_id", p.client_id.as_str()),
            ("redirect_uri", redirect_uri.as_str()),
            ("scope", p.scopes.as_str()),
            ("state", state.as_str()),
            ("nonce", nonce.as_str()),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
            ("prompt", "consent"),
        ],
    )
    .map_err(|e| err("log in", format!("authorization endpoint {endpoint}: {e}")))?;
    Ok(CodeRequest {
        url: url.to_string(),
        redirect_uri,
        state,
        nonce,
        verifier,
    })
}

/// The code from the address the provider redirected to, its state checked.
fn code_from(redirected: &str, r: &CodeRequest) -> Result<String, CliError> {
    let url = reqwest::Url::parse(redirected.trim())
        .or_else(|_| reqwest::Url::parse(&format!("http://127.0.0.1{}", redirected.trim())))
        .map_err(|e| err("log in", format!("not an address: {e}")))?;
    let q: std::collections::HashMap<String, String> = url.query_pairs().into_owned().collect();
    if let Some(e) = q.get("error") {
        return Err(err(
            "log in",
            format!(
                "{e}: {}",
                q.get("error_description").cloned().unwrap_or_default()
            ),
        ));
    }
    if q.get("state") != Some(&r.state) {
        return Err(err(
            "log in",
            "the answer's state does not match this login (a forged redirect?)",
        ));
    }
    q.get("code")
        .cloned()
        .ok_or_else(|| err("log in", "the address carries no code"))
}

async fn exchange(
    http: &reqwest::Client,
    p: &Provider,
    r: &CodeRequest,
    code: &str,
) -> Result<Value, CliError> {
    let tokens = match token_request(
        http,
        &p.token_endpoint,
        &[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &r.redirect_uri),
            ("client_id", &p.client_id),
            ("code_verifier", &r.verifier),
        ],
    )
    .await?
    {
        Ok(t) => t,
        Err((code, text)) => return Err(err("log in", format!("{code}: {text}"))),
    };
    let nonce = tokens["id_token"]
        .as_str()
        .and_then(claims)
        .and_then(|c| c["nonce"].as_str().map(str::to_string));
    if nonce.as_deref() != Some(r.nonce.as_str()) {
        return Err(err(
            "log in",
            "the ID token's nonce is not this login's (a replayed token?)",
        ));
    }
    Ok(tokens)
}

async fn browser_flow(
    http: &reqwest::Client,
    p: &Provider,
    env: &Env,
    tell: &mut dyn Write,
) -> Result<Value, CliError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| err("listen on 127.0.0.1 for the login's redirect", e))?;
    let port = listener.local_addr().map_err(|e| err("log in", e))?.port();
    let r = code_request(p, format!("http://127.0.0.1:{port}/callback"))?;
    writeln!(
        tell,
        "Opening a browser to log in; if none opens, visit:\n{}",
        r.url
    )
    .ok();
    tell.flush().ok();
    open_browser(env, &r.url);
    let accept = async {
        loop {
            let (mut sock, _) = listener.accept().await.map_err(|e| err("log in", e))?;
            let mut buf = vec![0u8; 8192];
            let mut n = 0;
            while n < buf.len() {
                // A connection that sends nothing, or fails, does not hold the login up.
                let m = match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf[n..]))
                    .await
                {
                    Ok(Ok(m)) => m,
                    _ => 0,
                };
                if m == 0 {
                    break;
                }
                n += m;
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let target = head.split_whitespace().nth(1).unwrap_or("/").to_string();
            if !target.starts_with("/callback") {
                let _ = sock
                    .write_all(
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    )
                    .await;
                continue;
            }
            // An answer without this login's state is somebody else's (another local user
            // can reach the listener): refused, and the login goes on waiting.
            let state_ok = reqwest::Url::parse(&format!("http://127.0.0.1{target}"))
                .ok()
                .is_some_and(|u| {
                    u.query_pairs()
                        .any(|(k, v)| k == "state" && v == r.state.as_str())
                });
            if !state_ok {
                let _ = sock
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                continue;
            }
            let result = code_from(&target, &r);
            let page = match &result {
                Ok(_) => {
                    "Logged in to Lattice. You can close this window and return to the terminal."
                }
                Err(_) => "The login failed; see the terminal.",
            };
            let _ = sock
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                        page.len()
                    )
                    .as_bytes(),
                )
                .await;
            return result;
        }
    };
    let code = tokio::time::timeout(Duration::from_secs(300), accept)
        .await
        .map_err(|_| err("log in", "no answer from the browser within 5 minutes"))??;
    exchange(http, p, &r, &code).await
}

async fn manual_flow(
    http: &reqwest::Client,
    p: &Provider,
    tell: &mut dyn Write,
    input: &mut dyn BufRead,
) -> Result<Value, CliError> {
    let r = code_request(p, "http://127.0.0.1:8400/callback".to_string())?;
    writeln!(
        tell,
        "Open this address in a browser and log in:\n{}\nThe browser then fails to load http://127.0.0.1:8400/callback?...; paste that whole address here:",
        r.url
    )
    .ok();
    tell.flush().ok();
    let mut line = String::new();
    input
        .read_line(&mut line)
        .map_err(|e| err("read the address", e))?;
    let code = code_from(&line, &r)?;
    exchange(http, p, &r, &code).await
}

fn cached_from(
    server: &str,
    p: &Provider,
    tokens: &Value,
    old_refresh: Option<String>,
) -> Result<Cached, CliError> {
    let id_token = tokens["id_token"]
        .as_str()
        .ok_or_else(|| {
            err(
                "log in",
                "the provider sent no ID token (is `openid` among the scopes?)",
            )
        })?
        .to_string();
    let exp = claims(&id_token)
        .and_then(|c| c["exp"].as_u64())
        .unwrap_or_else(|| now() + tokens["expires_in"].as_u64().unwrap_or(300));
    Ok(Cached {
        server: server.to_string(),
        issuer: p.issuer.clone(),
        client_id: p.client_id.clone(),
        token_endpoint: p.token_endpoint.clone(),
        revocation_endpoint: p.revocation_endpoint.clone(),
        id_token,
        refresh_token: tokens["refresh_token"]
            .as_str()
            .map(str::to_string)
            .or(old_refresh),
        expires_at: exp,
    })
}

/// `lattice login`: logs in and caches the tokens; returns the cache file.
pub async fn login(
    env: &Env,
    req: &LoginRequest<'_>,
    tell: &mut dyn Write,
    input: &mut dyn BufRead,
) -> Result<PathBuf, CliError> {
    let http = http(req.insecure, req.ca_pem)?;
    let p = provider(&http, req).await?;
    let flow = req.flow.unwrap_or(if has_browser(env) {
        Flow::Browser
    } else {
        Flow::Device
    });
    let tokens = match flow {
        Flow::Device => device_flow(&http, &p, tell).await?,
        Flow::Browser => browser_flow(&http, &p, env, tell).await?,
        Flow::Manual => manual_flow(&http, &p, tell, input).await?,
    };
    let c = cached_from(req.server, &p, &tokens, None)?;
    store(env, &c)
}

/// The ID token to send to `server`: the cached login's, refreshed first when it expires
/// within a minute and a refresh token is there. `None`: not logged in.
pub async fn token_for(
    env: &Env,
    server: &str,
    insecure: bool,
    ca_pem: Option<&[u8]>,
) -> Result<Option<String>, CliError> {
    let Some(c) = load(env, server)? else {
        return Ok(None);
    };
    if c.expires_at > now() + REFRESH_BEFORE {
        return Ok(Some(c.id_token));
    }
    let Some(refresh) = c.refresh_token.clone() else {
        return Ok(Some(c.id_token));
    };
    let http = http(insecure, ca_pem)?;
    match token_request(
        &http,
        &c.token_endpoint,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", &refresh),
            ("client_id", &c.client_id),
        ],
    )
    .await?
    {
        Ok(tokens) => {
            let p = Provider {
                issuer: c.issuer.clone(),
                client_id: c.client_id.clone(),
                scopes: String::new(),
                authorization_endpoint: None,
                device_endpoint: None,
                token_endpoint: c.token_endpoint.clone(),
                revocation_endpoint: c.revocation_endpoint.clone(),
            };
            let next = cached_from(server, &p, &tokens, Some(refresh))?;
            store(env, &next)?;
            Ok(Some(next.id_token))
        }
        // The server will say the token expired; `lattice login` again.
        Err(_) => Ok(Some(c.id_token)),
    }
}

/// `lattice logout`: revokes the refresh token (best effort) and forgets the login.
/// Whether there was one.
pub async fn logout(
    env: &Env,
    server: &str,
    insecure: bool,
    ca_pem: Option<&[u8]>,
) -> Result<bool, CliError> {
    let Some(path) = cache_file(env, server) else {
        return Ok(false);
    };
    if let Ok(Some(c)) = load(env, server) {
        if let (Some(ep), Some(rt)) = (&c.revocation_endpoint, &c.refresh_token) {
            if let Ok(http) = http(insecure, ca_pem) {
                let _ = token_request(
                    &http,
                    ep,
                    &[
                        ("token", rt),
                        ("token_type_hint", "refresh_token"),
                        ("client_id", &c.client_id),
                    ],
                )
                .await;
            }
        }
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(err(&format!("remove {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let env = Env::from_pairs([("XDG_CONFIG_HOME", dir.path().to_str().unwrap())]);
        let c = Cached {
            server: "https://lattice.example.org".into(),
            issuer: "https://idp".into(),
            client_id: "lattice".into(),
            token_endpoint: "https://idp/token".into(),
            revocation_endpoint: None,
            id_token: "a.b.c".into(),
            refresh_token: Some("r".into()),
            expires_at: now() + 3600,
        };
        let path = store(&env, &c).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(load(&env, &c.server).unwrap().unwrap().id_token, "a.b.c");
        // Another server's login is not this one's.
        assert!(load(&env, "https://other").unwrap().is_none());
        // A cache others may read is refused, not used.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load(&env, &c.server).is_err());
    }

    #[test]
    fn a_redirect_is_taken_only_with_this_logins_state() {
        let r = CodeRequest {
            url: String::new(),
            redirect_uri: String::new(),
            state: "s1".into(),
            nonce: "n".into(),
            verifier: "v".into(),
        };
        assert_eq!(
            code_from("http://127.0.0.1:8400/callback?code=c&state=s1", &r).unwrap(),
            "c"
        );
        assert_eq!(code_from("/callback?code=c&state=s1", &r).unwrap(), "c");
        assert!(code_from("/callback?code=c&state=s2", &r).is_err());
        assert!(code_from("/callback?error=access_denied&state=s1", &r).is_err());
    }
}
