//! A hostile tenant against `lattice up`: the real CLI starting a real server and real
//! agents (each enrolled with its own node certificate), with real Unix users made by the
//! test. Mallory, an ordinary user of tenant `blue`, tries what issue 32 lists and what a
//! user on a shared machine would try next; alice shares the tenant, carol is in `red`.
//! Every attempt must fail with a message that says why, and honest work must still run.
//!
//! Needs root (to make users and give jobs cgroups); without it the suite says so and
//! checks nothing, as there is nothing it could check.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lattice_e2e::{bin, free_port};
use serde_json::{json, Value};

const API: &str = "/apis/lattice.dev/v1alpha1";
const MALLORY: &str = "lattice-mallory";
const ALICE: &str = "lattice-alice";
/// The memory each job may use on these agents (`--memory-gb 1`, nothing reserved).
const MEMORY_GB: u64 = 1;
/// The processes each job may have (`--max-pids`).
const PIDS: u64 = 96;

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// An ordinary local user (uid >= 1000), made with `useradd` if missing.
fn ensure_user(name: &str) -> u32 {
    for _ in 0..50 {
        if let Ok(Some(u)) = nix::unistd::User::from_name(name) {
            return u.uid.as_raw();
        }
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", name])
            .output()
            .expect("useradd (package passwd; hack/install-deps.sh installs it)");
        // Exit 9 or 10: another test binary made it (or holds the lock) meanwhile.
        assert!(
            out.status.success() || matches!(out.status.code(), Some(9 | 10)),
            "useradd {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("could not create user {name}");
}

/// `lattice up --detach` in `dir`; `lattice down` when dropped.
struct Up {
    data: PathBuf,
    url: String,
    admin: String,
    secret: Vec<u8>,
    http: reqwest::Client,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = Command::new(bin("lattice"))
            .args(["down", "--data-dir"])
            .arg(&self.data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn up(dir: &Path) -> Up {
    let data = dir.join("cluster");
    let addr = format!("127.0.0.1:{}", free_port());
    let out = Command::new(bin("lattice"))
        .args(["up", "--agents", "2", "--detach", "--data-dir"])
        .arg(&data)
        .args(["--api-addr", &addr, "--timeout", "120"])
        .arg(format!("--agent-arg=--memory-gb={MEMORY_GB}"))
        .arg(format!("--agent-arg=--max-pids={PIDS}"))
        .current_dir(dir)
        .env("HOME", dir)
        .output()
        .expect("lattice up");
    let logs = || {
        std::fs::read_dir(data.join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| {
                format!(
                    "--- {}\n{}",
                    e.path().display(),
                    std::fs::read_to_string(e.path()).unwrap_or_default()
                )
            })
            .collect::<String>()
    };
    assert!(
        out.status.success(),
        "lattice up: {}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        logs()
    );
    let admin = std::fs::read_to_string(data.join("server/admin.token"))
        .unwrap()
        .trim()
        .to_string();
    let secret = std::fs::read(data.join("server/jwt.secret")).unwrap();
    Up {
        url: format!("http://{addr}"),
        data,
        admin,
        secret,
        http: reqwest::Client::new(),
    }
}

impl Up {
    /// A user token, as the site's identity provider would give one.
    fn token(&self, user: &str, tenants: &[&str]) -> String {
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &json!({"sub": user, "tenants": tenants, "role": "user", "exp": exp}),
            &jsonwebtoken::EncodingKey::from_secret(&self.secret),
        )
        .unwrap()
    }

    async fn call(&self, tok: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut r = self
            .http
            .request(m.clone(), format!("{}{path}", self.url))
            .bearer_auth(tok);
        if let Some(b) = body {
            let ct = if m == reqwest::Method::PATCH {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            r = r.header("content-type", ct).body(b.to_string());
        }
        let resp = r.send().await.unwrap();
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            code,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn submit(&self, tok: &str, tenant: &str, name: &str, spec: Value) -> (u16, Value) {
        self.call(
            tok,
            "POST",
            &format!("{API}/namespaces/{tenant}/allocations"),
            Some(
                json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
                        "metadata": {"name": name}, "spec": spec}),
            ),
        )
        .await
    }

    /// Wait for a terminal phase; the allocation then.
    async fn finished(&self, tenant: &str, name: &str) -> Value {
        let start = Instant::now();
        loop {
            let (_, a) = self
                .call(
                    &self.admin,
                    "GET",
                    &format!("{API}/namespaces/{tenant}/allocations/{name}"),
                    None,
                )
                .await;
            let phase = a
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            if matches!(phase, "Completed" | "Failed" | "Cancelled") {
                return a;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{name} did not finish: {a}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn logs(&self, tok: &str, tenant: &str, name: &str) -> (u16, String) {
        let resp = self
            .http
            .get(format!(
                "{}{API}/namespaces/{tenant}/allocations/{name}/log",
                self.url
            ))
            .bearer_auth(tok)
            .send()
            .await
            .unwrap();
        (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        )
    }
}

fn script(body: &str) -> Value {
    json!({"script": format!("#!/bin/sh\n{body}\n"), "lifecycle": {"walltime": "5m"},
           "vcluster": "default", "requeue": {"policy": "never"}})
}

fn reason(a: &Value) -> String {
    a.pointer("/status/nodeStates")
        .and_then(Value::as_object)
        .and_then(|m| m.values().next())
        .map(|n| {
            format!(
                "{} {}",
                n["reason"].as_str().unwrap_or(""),
                n["message"].as_str().unwrap_or("")
            )
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tenant_cannot_escape() {
    if !is_root() {
        eprintln!("hostile_tenant: not root, so no users can be made and no cgroups used; nothing checked");
        return;
    }
    let mallory_uid = ensure_user(MALLORY);
    ensure_user(ALICE);
    let dir = tempfile::tempdir().unwrap();
    let c = up(dir.path());
    // The tenants: an administrator makes them; mallory and alice share `blue`.
    for t in ["blue", "red"] {
        let (code, v) = c
            .call(
                &c.admin,
                "POST",
                &format!("{API}/tenants"),
                Some(
                    json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
                              "metadata": {"name": t}, "spec": {}}),
                ),
            )
            .await;
        assert_eq!(code, 201, "{v}");
        let (code, v) = c
            .call(&c.admin, "POST", &format!("{API}/namespaces/{t}/vclusters"),
                  Some(json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "VCluster",
                              "metadata": {"name": "default"}, "spec": {"schedulerType": "hpc-backfill"}})))
            .await;
        assert_eq!(code, 201, "{v}");
    }
    let mallory = c.token(MALLORY, &["blue"]);
    let alice = c.token(ALICE, &["blue"]);
    let carol = c.token("carol", &["red"]);
    let root_user = c.token("root", &["blue"]);

    // Honest work runs, as its user.
    let (code, v) = c
        .submit(
            &alice,
            "blue",
            "alice-job",
            script("id -un; echo alice-secret"),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let a = c.finished("blue", "alice-job").await;
    assert_eq!(a["status"]["phase"], "Completed", "{a}");
    let (code, out) = c.logs(&alice, "blue", "alice-job").await;
    assert_eq!((code, out.lines().next()), (200, Some(ALICE)), "{out}");

    // (e) A tenant-mate's output.
    let (code, out) = c.logs(&mallory, "blue", "alice-job").await;
    assert_eq!(code, 403, "{out}");
    assert!(!out.contains("alice-secret"));

    // Another tenant, through every route.
    let (code, v) = c
        .submit(&carol, "red", "carol-job", script("echo red"))
        .await;
    assert_eq!(code, 201, "{v}");
    for path in [
        format!("{API}/namespaces/red/allocations"),
        format!("{API}/namespaces/red/allocations/carol-job"),
        format!("{API}/allocations"),
        format!("{API}/namespaces/red/events"),
        "/v1/allocations?tenant=red".to_string(),
        "/v1/allocations/red/carol-job".to_string(),
        format!("{API}/tenants"),
    ] {
        let (code, v) = c.call(&mallory, "GET", &path, None).await;
        assert!(code == 403 || code == 404, "{path}: {code} {v}");
    }

    // Work that runs as someone else: named, or as root through a token for "root" in a
    // tenant that does not allow it.
    let mut spec = script("id -u");
    spec["env"] = json!({});
    let (code, v) = c
        .call(&mallory, "POST", &format!("{API}/namespaces/blue/allocations"),
              Some(json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
                          "metadata": {"name": "as-alice", "annotations": {"lattice.dev/user": ALICE}},
                          "spec": spec})))
        .await;
    assert_eq!(code, 403, "{v}");
    let (code, v) = c
        .submit(
            &root_user,
            "blue",
            "as-root",
            script("id -u > /tmp/lattice-hostile-root"),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let a = c.finished("blue", "as-root").await;
    assert_eq!(a["status"]["phase"], "Failed", "{a}");
    assert!(reason(&a).contains("NotPermitted"), "{}", reason(&a));
    assert!(!Path::new("/tmp/lattice-hostile-root").exists());

    // (a) Running one's own allocation past the scheduler by writing its status.
    let (code, v) = c
        .submit(
            &mallory,
            "blue",
            "held",
            json!({"script": "#!/bin/sh\nsleep 1", "lifecycle": {"walltime": "1m"}}),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let mut forged = v.clone();
    forged["status"] = json!({"phase": "Running", "attempt": 7, "assignedNodes": ["node-01"], "walltimeSeconds": 99999999});
    let (code, v) = c
        .call(
            &mallory,
            "PUT",
            &format!("{API}/namespaces/blue/allocations/held/status"),
            Some(forged),
        )
        .await;
    assert_eq!(code, 403, "{v}");

    // (d) Taking nodes: a vCluster with home nodes.
    let (code, v) = c
        .call(&mallory, "POST", &format!("{API}/namespaces/blue/vclusters"),
              Some(json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "VCluster",
                          "metadata": {"name": "mine"},
                          "spec": {"schedulerType": "hpc-backfill", "homeNodes": ["node-01", "node-02"]}})))
        .await;
    assert_eq!(code, 403, "{v}");

    // (b) A preload library for the root part of the agent: only mallory's own processes
    // load it (the marker records their uids).
    let marker = dir.path().join("preload-marks");
    std::fs::write(&marker, "").unwrap();
    std::fs::set_permissions(&marker, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let lib = preload(dir.path(), &marker);
    let mut spec = script("true");
    spec["env"] = json!({"LD_PRELOAD": lib.display().to_string()});
    let (code, v) = c.submit(&mallory, "blue", "preload", spec).await;
    assert_eq!(code, 201, "{v}");
    let a = c.finished("blue", "preload").await;
    assert_eq!(a["status"]["phase"], "Completed", "{a}");
    let marks = std::fs::read_to_string(&marker).unwrap();
    assert!(!marks.is_empty(), "the job itself should have loaded it");
    for l in marks.lines() {
        assert!(
            l.split_whitespace().all(|id| id == mallory_uid.to_string()),
            "a process of another user (root?) loaded mallory's library: {marks}"
        );
    }

    // The node's identity is not the job's to take.
    let key = c.data.join("agents/node-01/pki/node.key");
    assert!(key.exists());
    let (code, v) = c
        .submit(
            &mallory,
            "blue",
            "steal",
            script(&format!("cat {} && echo STOLEN", key.display())),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let a = c.finished("blue", "steal").await;
    let (_, out) = c.logs(&mallory, "blue", "steal").await;
    assert!(
        !out.contains("STOLEN") && !out.contains("PRIVATE KEY"),
        "{out}"
    );
    assert_eq!(a["status"]["phase"], "Failed", "{a}");

    // Memory beyond the node's allocatable share: the job ends OutOfMemory, naming the
    // limit; the node's next job runs.
    let (code, v) = c
        // `tail` keeps its whole last line, and /dev/zero has no newline.
        .submit(
            &mallory,
            "blue",
            "hog",
            script(&format!(
                "head -c {} /dev/zero | tail > /dev/null",
                (MEMORY_GB + 1) << 30
            )),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let a = c.finished("blue", "hog").await;
    assert_eq!(a["status"]["phase"], "Failed", "{a}");
    assert!(reason(&a).contains("OutOfMemory"), "{}", reason(&a));
    // A fork bomb stops at the pids limit: forks fail (the shell says so), and what it
    // started goes with the job.
    let (code, v) = c
        .submit(&mallory, "blue", "bomb", json!({
            "script": format!("#!/bin/sh\nn=0; while [ $n -lt {} ]; do sleep 20 & n=$((n+1)); done; echo tried $n", PIDS * 4),
            "lifecycle": {"walltime": "2m"}, "requeue": {"policy": "never"}}))
        .await;
    assert_eq!(code, 201, "{v}");
    c.finished("blue", "bomb").await;
    let (_, out) = c.logs(&mallory, "blue", "bomb").await;
    assert!(
        out.to_lowercase().contains("fork"),
        "no fork was refused: {out}"
    );
    let (code, v) = c
        .submit(&alice, "blue", "after", script("echo still-fine"))
        .await;
    assert_eq!(code, 201, "{v}");
    let a = c.finished("blue", "after").await;
    assert_eq!(a["status"]["phase"], "Completed", "{a}");
}

/// A library that appends `<uid> <euid>` to `marker` whenever a process loads it.
fn preload(dir: &Path, marker: &Path) -> PathBuf {
    let src = dir.join("mark.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <unistd.h>\n__attribute__((constructor)) static void mark(void) {{\n  FILE *f = fopen(\"{}\", \"a\");\n  if (f) {{ fprintf(f, \"%d %d\\n\", (int)getuid(), (int)geteuid()); fclose(f); }}\n}}\n",
            marker.display()
        ),
    )
    .unwrap();
    let lib = dir.join("libmark.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Readable by the job's user.
    for p in [dir, lib.as_path()] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    lib
}
