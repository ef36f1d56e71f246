//! The store's ports as an operator meets them: the real `lattice-server` on an address of
//! this machine that is not a loopback one, certificates from the real `lattice admin pki`,
//! the real `etcdctl`, and the store's size quota from etcdctl and from the HTTP API.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lattice_e2e::{bin, free_port, Server};

/// An address of this machine another machine could reach (not 127.0.0.0/8 or ::1: an
/// address on `lo` such as 127.0.0.2 is still loopback, and so is not what this tests).
/// A machine without one (a container with no network) gets one of the benchmarking
/// range (198.18.0.0/15) on `lo` for the test's duration: by address it is not loopback
/// (needs root and `ip`).
struct OffLoopback {
    ip: IpAddr,
    /// The address this test added to `lo`, to be removed.
    added: Option<String>,
}

impl Drop for OffLoopback {
    fn drop(&mut self) {
        if let Some(added) = &self.added {
            let _ = Command::new("ip")
                .args(["addr", "del", added, "dev", "lo"])
                .status();
        }
    }
}

fn off_loopback() -> OffLoopback {
    let find = || {
        nix::ifaddrs::getifaddrs()
            .expect("getifaddrs")
            .filter(|i| i.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP))
            .filter_map(|i| i.address?.as_sockaddr_in().map(|a| IpAddr::V4(a.ip())))
            .find(|ip| !ip.is_loopback())
    };
    if let Some(ip) = find() {
        return OffLoopback { ip, added: None };
    }
    let pid = std::process::id();
    let ip = format!("198.18.{}.{}", (pid / 250) % 250 + 1, pid % 250 + 1);
    let added = format!("{ip}/32");
    let st = Command::new("ip")
        .args(["addr", "add", &added, "dev", "lo"])
        .status();
    assert!(
        matches!(st, Ok(s) if s.success()),
        "this test needs a non-loopback address: there is none, and adding {added} to lo \
         failed ({st:?}; root and iproute2 are needed)"
    );
    OffLoopback {
        ip: ip.parse().unwrap(),
        added: Some(added),
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?} failed:\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn pki(args: &[&str], ca: &Path) -> String {
    ok(Command::new(bin("lattice"))
        .args(["admin", "pki"])
        .args(args)
        .arg("--dir")
        .arg(ca))
}

/// `lattice-server` on `flags`, its log in `dir/server.log`; killed on drop.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn start(dir: &Path, flags: &[String]) -> Proc {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join("server.log");
        let child = Command::new(bin("lattice-server"))
            .arg("--data-dir")
            .arg(dir)
            .args(flags)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn lattice-server");
        Proc { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait for the process to exit; its status and log.
    fn exited(mut self) -> (std::process::ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (st, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "lattice-server did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until `admin.token` exists (the server is up), or fail with its log.
    fn ready(&mut self, dir: &Path) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !dir.join("admin.token").exists() {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("lattice-server exited ({st}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "lattice-server not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// etcdctl against `endpoint` with `tls` (`--cacert/--cert/--key` words).
fn etcdctl(endpoint: &str, tls: &[String], args: &[&str]) -> Output {
    run(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=4s")
        .arg("--dial-timeout=2s")
        .args(tls)
        .args(args))
}

fn tls_flags(dir: &Path, stem: &str) -> Vec<String> {
    vec![
        format!("--cacert={}", dir.join("ca.crt").display()),
        format!("--cert={}", dir.join(format!("{stem}.crt")).display()),
        format!("--key={}", dir.join(format!("{stem}.key")).display()),
    ]
}

/// Off loopback the server never serves plaintext: asked to, it refuses to start (for the
/// etcd port and the Raft port alike), and so it does without TLS material (a CA
/// certificate but neither the certificates it needs nor the CA's key to issue them). With a
/// member certificate from `lattice admin pki` (the CA's key kept elsewhere) the etcd port
/// takes etcdctl with an administrator's certificate, and refuses etcdctl without one, in
/// plaintext, and with a node's.
#[test]
fn off_loopback_the_store_ports_take_mutual_tls_only() {
    let addr = off_loopback();
    let ip = addr.ip;
    let tmp = tempfile::tempdir().unwrap();
    let common = || -> Vec<String> {
        vec![
            "--api-addr".into(),
            format!("127.0.0.1:{}", free_port()),
            "--tls-addr".into(),
            "off".into(),
            "--compaction-interval".into(),
            "0".into(),
        ]
    };
    // Certificates from the CLI, offline.
    let ca = tmp.path().join("ca");
    pki(&["init"], &ca);
    let said = pki(
        &["issue", "member", "--id", "1", "--ip", &ip.to_string()],
        &ca,
    );
    assert!(
        said.contains("member:1") && said.contains(&ip.to_string()),
        "{said}"
    );
    pki(&["issue", "admin", "--name", "ops"], &ca);
    pki(&["issue", "node", "--name", "n1"], &ca);
    let ca_only = tmp.path().join("ca-only");
    std::fs::create_dir_all(&ca_only).unwrap();
    std::fs::copy(ca.join("ca.crt"), ca_only.join("ca.crt")).unwrap();

    // Refused, each naming what to do.
    for (dir, flags, expected) in [
        (
            "etcd-plaintext-off-loopback",
            vec![
                format!("--etcd-addr={ip}:{}", free_port()),
                "--store-plaintext-loopback".into(),
            ],
            "plaintext off loopback",
        ),
        (
            "raft-plaintext-off-loopback",
            vec![
                "--etcd-addr=off".into(),
                format!("--raft-addr={ip}:{}", free_port()),
                "--bootstrap".into(),
                "--store-plaintext-loopback".into(),
            ],
            "plaintext off loopback",
        ),
        (
            "no-tls-material",
            vec![
                format!("--etcd-addr={ip}:{}", free_port()),
                format!("--pki-dir={}", ca_only.display()),
            ],
            "but not its key",
        ),
    ] {
        let mut all = common();
        all.extend(flags);
        let (status, log) = Proc::start(&tmp.path().join(dir), &all).exited();
        assert!(!status.success(), "{dir}: started:\n{log}");
        assert!(log.contains(expected), "{dir}:\n{log}");
        assert!(log.contains("lattice admin pki"), "{dir}: no hint:\n{log}");
    }

    // The CA's key stays elsewhere: the server is given its API certificate too.
    pki(&["issue", "apiserver"], &ca);
    for f in ["apiserver.crt", "apiserver.key"] {
        std::fs::copy(ca.join("apiserver").join(f), ca.join("member-1").join(f)).unwrap();
    }
    let data = tmp.path().join("served");
    let port = free_port();
    let mut flags = common();
    flags.extend([
        format!("--etcd-addr={ip}:{port}"),
        format!("--pki-dir={}", ca.join("member-1").display()),
    ]);
    let mut server = Proc::start(&data, &flags);
    server.ready(&data);
    let https = format!("https://{ip}:{port}");
    let admin = tls_flags(&ca.join("admin-ops"), "admin");
    let out = etcdctl(&https, &admin, &["put", "/tls/k", "v"]);
    assert!(out.status.success(), "admin refused:\n{}", text(&out));
    let out = etcdctl(&https, &admin, &["get", "/tls/k", "--print-value-only"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v");

    let ca_only = vec![format!("--cacert={}", ca.join("ca.crt").display())];
    let node = tls_flags(&ca.join("node-n1"), "node");
    for (who, endpoint, tls) in [
        (
            "etcdctl without a client certificate",
            https.as_str(),
            ca_only,
        ),
        ("etcdctl with a node's certificate", https.as_str(), node),
        (
            "etcdctl in plaintext",
            &format!("http://{ip}:{port}"),
            Vec::new(),
        ),
    ] {
        let out = etcdctl(endpoint, &tls, &["put", "/tls/k", "theirs"]);
        assert!(!out.status.success(), "{who} got in:\n{}", text(&out));
        let out = etcdctl(endpoint, &tls, &["get", "/tls/k"]);
        assert!(!out.status.success(), "{who} read:\n{}", text(&out));
    }
    let out = etcdctl(&https, &admin, &["get", "/tls/k", "--print-value-only"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "v",
        "unchanged"
    );
    assert!(
        server.log().contains("TLS peer refused"),
        "the node's refusal is logged:\n{}",
        server.log()
    );
}

/// The size quota as an operator sees it: writes through etcdctl stop with etcd's
/// "database space exceeded", `etcdctl alarm list` shows NOSPACE, the API answers 507
/// naming the quota and the fix, deletes and compaction work, `etcdctl alarm disarm`
/// lifts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_alarm_through_etcdctl_and_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        free_port(),
        free_port(),
        &[
            "--dev",
            "--quota-backend-bytes=512Ki",
            "--compaction-interval=0",
        ],
    );
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    assert!(
        log.contains("PLAINTEXT on loopback") && log.contains(&server.etcd_endpoint()),
        "--dev says the store ports are plaintext, naming them:\n{log}"
    );
    let ep = server.etcd_endpoint();
    let value = "x".repeat(32 * 1024);
    let mut refused = None;
    for i in 0..64 {
        let out = etcdctl(&ep, &[], &["put", &format!("/fill/{i}"), &value]);
        if !out.status.success() {
            refused = Some(text(&out));
            break;
        }
    }
    let refused = refused.expect("the quota stops the writes");
    assert!(refused.contains("database space exceeded"), "{refused}");
    let alarms = ok(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(["alarm", "list"]));
    assert!(alarms.contains("alarm:NOSPACE"), "{alarms}");

    // The API: 507, naming the quota and the fix.
    let http = reqwest::Client::new();
    let tenant = serde_json::json!({
        "apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
        "metadata": {"name": "late"}, "spec": {}
    });
    let resp = http
        .post(format!(
            "{}/apis/lattice.dev/v1alpha1/tenants",
            server.api_url()
        ))
        .bearer_auth(server.admin_token())
        .json(&tenant)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 507);
    let status: serde_json::Value = resp.json().await.unwrap();
    let message = status["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains("524288 bytes") && message.contains("etcdctl alarm disarm"),
        "{status}"
    );
    assert_eq!(status["reason"], "InsufficientStorage");

    // Free space, disarm, write again.
    ok(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(["del", "--prefix", "/fill/"]));
    let st = ok(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(["endpoint", "status", "-w", "json"]));
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    let rev = st[0]["Status"]["header"]["revision"].as_i64().unwrap();
    ok(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(["compact", &rev.to_string()]));
    let disarmed = ok(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(["alarm", "disarm"]));
    assert!(disarmed.contains("alarm:NOSPACE"), "{disarmed}");
    let alarms = ok(Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={ep}"))
        .args(["alarm", "list"]));
    assert!(alarms.trim().is_empty(), "{alarms}");
    let resp = http
        .post(format!(
            "{}/apis/lattice.dev/v1alpha1/tenants",
            server.api_url()
        ))
        .bearer_auth(server.admin_token())
        .json(&tenant)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
}
