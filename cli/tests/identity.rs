//! `lattice login` end to end against a real, certified OpenID provider (panva's
//! oidc-provider, `hack/oidc/provider.js`, installed by `hack/install-deps.sh`) and the
//! real API server: the device flow driven through the provider's own pages, silent
//! refresh after expiry, a token for another audience refused, a rotated signing key
//! followed, the browser flow with PKCE, logout; and `lattice audit` against the same
//! server's audit log.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use lattice_apiserver::oidc::{OidcAuthenticator, OidcConfig};
use lattice_apiserver::{mint_token, ApiConfig, ApiServer, JwtAuthenticator, Role};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::{json, Value};

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const API: &str = "/apis/lattice.dev/v1alpha1";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The provider, killed when dropped.
struct Provider {
    child: Child,
    issuer: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// The child is returned inside a `Provider`, whose drop kills and waits for it.
#[allow(clippy::zombie_processes)]
fn provider(port: u16, alg: &str, kid: &str, id_token_ttl: u64) -> Provider {
    let dir = repo().join("hack/oidc");
    assert!(
        dir.join("node_modules/oidc-provider").is_dir(),
        "the test OpenID provider is not installed: run hack/install-deps.sh (npm ci in hack/oidc)"
    );
    let mut child = Command::new("node")
        .arg("provider.js")
        .current_dir(&dir)
        .env("PORT", port.to_string())
        .env("KEY_ALG", alg)
        .env("KEY_ID", kid)
        .env("ID_TOKEN_TTL", id_token_ttl.to_string())
        .env(
            "ACCOUNTS",
            json!({"alice": {"groups": ["physics"], "tenants": ["t1"]}}).to_string(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start node hack/oidc/provider.js");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    loop {
        line.clear();
        let n = out
            .read_line(&mut line)
            .expect("read the provider's output");
        assert!(n > 0, "the OpenID provider exited before it was ready");
        if let Some(i) = line.trim().strip_prefix("READY ") {
            let issuer = i.to_string();
            std::thread::spawn(move || {
                let mut sink = String::new();
                let _ = out.read_to_string(&mut sink);
            });
            return Provider { child, issuer };
        }
    }
}

struct Server {
    url: String,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn server(issuer: &str) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .unwrap();
    let backend: Arc<dyn KvBackend> = Arc::new(store);
    let cfg: OidcConfig = serde_yaml::from_str(&format!(
        "issuers:\n- issuer: {issuer}\n  audiences: [lattice]\n  usernameClaim: preferred_username\n  clockSkewSeconds: 1\n  scopes: [openid, offline_access, profile, groups, tenants]\n"
    ))
    .unwrap();
    let auth = OidcAuthenticator::new(&cfg, JwtAuthenticator::new(SECRET), true).unwrap();
    let api = ApiServer::with_authenticator(
        backend.clone(),
        ApiConfig {
            jwt_secret: SECRET.to_vec(),
            auth: true,
            ..Default::default()
        },
        Arc::new(auth),
    );
    let audit = lattice_apiserver::audit::AuditConfig::new(dir.path().join("audit"), "api-1");
    api.set_audit(
        lattice_apiserver::audit::Auditor::start(audit, backend.clone())
            .await
            .unwrap(),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(api.serve(l, async move {
        let _ = rx.await;
    }));
    let admin = mint_token(
        SECRET,
        "root",
        &["*".into()],
        Role::Admin,
        Duration::from_secs(600),
    );
    let c = reqwest::Client::new();
    for t in ["t1", "t2"] {
        let r = c
            .post(format!("{url}{API}/tenants"))
            .bearer_auth(&admin)
            .json(&json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant", "metadata": {"name": t}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
    }
    Server {
        url,
        _dir: dir,
        _stop: tx,
    }
}

fn lattice(home: &Path, server: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lattice"));
    for k in [
        "LATTICE_TOKEN",
        "LATTICE_TOKEN_FILE",
        "LATTICE_CONFIG",
        "DISPLAY",
        "WAYLAND_DISPLAY",
        "BROWSER",
    ] {
        c.env_remove(k);
    }
    c.env("XDG_CONFIG_HOME", home)
        .env("LATTICE_API_URL", server);
    c
}

/// A person at a browser: follows the provider's pages, submitting each form (the user
/// code confirmation, the login) until none is left. Returns the last page.
async fn browse(url: &str, login: &str) -> String {
    let c = reqwest::Client::builder()
        .cookie_store(true)
        .build()
        .unwrap();
    let mut resp = c.get(url).send().await.expect("open the login page");
    for _ in 0..12 {
        let base = resp.url().clone();
        let page = resp.text().await.unwrap();
        let Some(start) = page.find("<form") else {
            return page;
        };
        let form = &page[start
            ..page[start..]
                .find("</form>")
                .map_or(page.len(), |e| start + e)];
        let attr = |tag: &str, name: &str| -> Option<String> {
            let k = format!("{name}=\"");
            let i = tag.find(&k)? + k.len();
            Some(tag[i..i + tag[i..].find('"')?].to_string())
        };
        let action =
            attr(&form[..form.find('>').unwrap_or(form.len())], "action").unwrap_or_default();
        let mut fields: Vec<(String, String)> = Vec::new();
        for input in form.split("<input").skip(1) {
            let tag = &input[..input.find('>').unwrap_or(input.len())];
            if let Some(name) = attr(tag, "name") {
                let value = match name.as_str() {
                    "login" => login.to_string(),
                    "password" => "any".to_string(),
                    _ => attr(tag, "value").unwrap_or_default(),
                };
                fields.push((name, value));
            }
        }
        let target = base.join(&action).unwrap();
        resp = c
            .post(target)
            .form(&fields)
            .send()
            .await
            .expect("submit a form");
    }
    panic!("the provider's pages never ended");
}

/// Starts `lattice login` with `args`; returns it and the first line of its stderr that
/// holds a URL.
// The child is returned; `finish` waits for it.
#[allow(clippy::zombie_processes)]
fn start_login(home: &Path, server: &str, args: &[&str], env: &[(&str, &str)]) -> (Child, String) {
    let mut cmd = lattice(home, server);
    cmd.arg("login")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run lattice login");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "lattice login printed no URL"
        );
        if let Some(i) = line.find("http") {
            let url = line[i..].split_whitespace().next().unwrap().to_string();
            std::thread::spawn(move || {
                let mut sink = String::new();
                let _ = err.read_to_string(&mut sink);
            });
            return (child, url);
        }
    }
}

fn finish(child: Child) -> (i32, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

fn run(home: &Path, server: &str, args: &[&str]) -> (i32, String, String) {
    run_env(home, server, args, &[])
}

/// `lattice ARGS` with more environment: (exit code, stdout, stderr).
fn run_env(
    home: &Path,
    server: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, String, String) {
    let mut cmd = lattice(home, server);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn cached(home: &Path) -> (PathBuf, Value) {
    let dir = home.join("lattice/tokens");
    let f = std::fs::read_dir(&dir)
        .expect("the token cache")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a cached login");
    let v = serde_json::from_slice(&std::fs::read(&f).unwrap()).unwrap();
    (f, v)
}

async fn status_with(server: &str, token: &str, path: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(format!("{server}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn device_login(home: &Path, server: &str, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["--flow", "device"];
    args.extend_from_slice(extra);
    let (child, url) = start_login(home, server, &args, &[]);
    assert!(url.contains("user_code="), "{url}");
    let last = browse(&url, "alice").await;
    assert!(
        last.contains("Sign-in Success") || last.contains("success"),
        "{last}"
    );
    tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_login_refresh_audience_and_key_rotation() {
    use std::os::unix::fs::PermissionsExt;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut idp = provider(port, "RS256", "k1", 6);
    let s = server(&idp.issuer).await;
    let home = tempfile::tempdir().unwrap();

    // The device flow, confirmed at the provider's pages by "alice".
    let (code, out) = device_login(home.path(), &s.url, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Logged in to"), "{out}");
    assert!(out.contains("user:     alice"), "{out}");
    assert!(out.contains("user in tenant t1"), "{out}");
    let (file, first) = cached(home.path());
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(first["refreshToken"].is_string(), "{first}");
    // The token works where alice's role does, and not elsewhere.
    let (code, _, err) = run(home.path(), &s.url, &["get", "allocations", "-n", "t1"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(home.path(), &s.url, &["get", "allocations", "-n", "t2"]);
    assert_ne!(code, 0);
    assert!(err.contains("not a member"), "{err}");

    // Expiry: the ID token lives 6 s; the server then refuses it, and the CLI refreshes.
    let old = first["idToken"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_secs(9)).await;
    let (code, body) = status_with(&s.url, &old, "/v1/auth/whoami").await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("expired"), "{body}");
    let (code, out, err) = run(home.path(), &s.url, &["whoami"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("alice"), "{out}");
    let (_, refreshed) = cached(home.path());
    assert_ne!(refreshed["idToken"], first["idToken"], "refreshed silently");

    // A token issued to another client (audience) is refused, saying why.
    let (code, out) = device_login(home.path(), &s.url, &["--client-id", "other"]).await;
    assert_ne!(code, 0, "{out}");
    let (_, other) = cached(home.path());
    let (code, body) = status_with(
        &s.url,
        other["idToken"].as_str().unwrap(),
        "/v1/auth/whoami",
    )
    .await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("not issued to this cluster"), "{body}");

    // Back to a good login, then the provider rotates its key (and algorithm).
    let (code, out) = device_login(home.path(), &s.url, &[]).await;
    assert_eq!(code, 0, "{out}");
    let (_, before) = cached(home.path());
    let signed_by_k1 = before["idToken"].as_str().unwrap().to_string();
    drop(idp);
    idp = provider(port, "ES256", "k2", 600);
    // The server reads the new key when a token names it...
    let (code, out) = device_login(home.path(), &s.url, &[]).await;
    assert_eq!(code, 0, "logging in with the new key: {out}");
    // ... and the withdrawn one is gone with that read.
    let (code, body) = status_with(&s.url, &signed_by_k1, "/v1/auth/whoami").await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("does not publish"), "{body}");
    let (_, after) = cached(home.path());
    let header = after["idToken"]
        .as_str()
        .unwrap()
        .split('.')
        .next()
        .unwrap()
        .to_string();
    use base64::Engine;
    let header: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (header["alg"].as_str(), header["kid"].as_str()),
        (Some("ES256"), Some("k2"))
    );
    drop(idp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_login_with_pkce_then_logout() {
    let idp = provider(0, "EdDSA", "ed1", 600);
    let s = server(&idp.issuer).await;
    let home = tempfile::tempdir().unwrap();
    // The "browser" is this test: BROWSER names a command that opens nothing.
    let (child, url) = start_login(
        home.path(),
        &s.url,
        &["--flow", "browser"],
        &[("BROWSER", "true")],
    );
    assert!(url.contains("code_challenge_method=S256"), "{url}");
    // Another local user's forged redirect (no state of this login) is refused, and the
    // login goes on waiting for the real one.
    let redirect = reqwest::Url::parse(&url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "redirect_uri")
        .map(|(_, v)| v.to_string())
        .unwrap();
    let forged = reqwest::get(format!("{redirect}?code=attackers&state=guess"))
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 400);
    let last = browse(&url, "alice").await;
    assert!(last.contains("Logged in to Lattice"), "{last}");
    let (code, out) = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("user:     alice"), "{out}");
    let (_, c) = cached(home.path());
    assert!(c["idToken"].as_str().unwrap().split('.').count() == 3);
    let (code, out, _) = run(home.path(), &s.url, &["logout"]);
    assert_eq!(code, 0);
    assert!(out.contains("Logged out"), "{out}");
    let (code, _, err) = run(home.path(), &s.url, &["whoami"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("authentication required") || err.contains("401"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_query_export_and_verify_through_the_cli() {
    let idp = provider(0, "RS256", "k1", 600);
    let s = server(&idp.issuer).await;
    let home = tempfile::tempdir().unwrap();
    let (code, out) = device_login(home.path(), &s.url, &[]).await;
    assert_eq!(code, 0, "{out}");
    // alice works in t1 (recorded), and is refused in t2 (recorded as a denial).
    let manifest = home.path().join("a.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: audited, namespace: t1}\nspec: {entrypoint: /bin/true, lifecycle: {walltime: 10m}}\n",
    )
    .unwrap();
    let (code, _, err) = run(
        home.path(),
        &s.url,
        &["apply", "-f", manifest.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = run(
        home.path(),
        &s.url,
        &["delete", "allocation", "audited", "-n", "t1"],
    );
    assert_eq!(code, 0);
    // The log is an administrator's to read: alice may not.
    let (code, _, err) = run(home.path(), &s.url, &["audit", "query", "-A"]);
    assert_ne!(code, 0);
    assert!(err.contains("auditrecords"), "{err}");
    let admin = mint_token(
        SECRET,
        "root",
        &["*".into()],
        Role::Admin,
        Duration::from_secs(600),
    );
    let as_admin = |args: &[&str]| run_env(home.path(), &s.url, args, &[("LATTICE_TOKEN", &admin)]);
    let (code, out, err) = as_admin(&["audit", "query", "-A", "--user", "alice"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("patch") || out.contains("create"), "{out}");
    assert!(out.contains("delete"), "{out}");
    assert!(out.contains("127.0.0.1:"), "{out}");
    let (code, out, err) = as_admin(&["audit", "verify"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("intact"), "{out}");
    let (code, export, err) = as_admin(&["audit", "export"]);
    assert_eq!(code, 0, "{err}");
    let file = home.path().join("audit.jsonl");
    std::fs::write(&file, &export).unwrap();
    let (code, out, err) = as_admin(&["audit", "verify", "--file", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // One line edited: named, exit 1.
    std::fs::write(&file, export.replacen("\"delete\"", "\"get\"", 1)).unwrap();
    let (code, out, _) = as_admin(&["audit", "verify", "--file", file.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("was edited") && out.contains("NOT intact"),
        "{out}"
    );
    drop(idp);
}
