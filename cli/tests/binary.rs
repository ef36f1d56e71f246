//! Tests of the `lattice` binary itself: exit codes, stderr wording, no colors.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

fn lattice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lattice"));
    // Nothing from the developer's environment leaks in.
    for k in [
        "LATTICE_API_URL",
        "LATTICE_TOKEN",
        "LATTICE_TOKEN_FILE",
        "LATTICE_TENANT",
        "LATTICE_CONFIG",
    ] {
        c.env_remove(k);
    }
    c.env("XDG_CONFIG_HOME", "/nonexistent-lattice-test-config");
    c
}

#[test]
fn connection_refused_is_human_and_fails() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    let out = lattice()
        .args(["get", "alloc"])
        .env("LATTICE_API_URL", format!("http://127.0.0.1:{port}"))
        .output()
        .expect("run lattice");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err,
        format!(
            "error: cannot reach the Lattice API at http://127.0.0.1:{port}: connection refused\n  \
             hint: start a server with `lattice-server --dev` or set LATTICE_API_URL (or --api-url) \
             to the address of a running one\n"
        )
    );
    assert!(!err.contains('\u{1b}'), "no ANSI colors when not a TTY");
    assert!(out.stdout.is_empty());
}

#[test]
fn version_and_help_need_no_server() {
    let out = lattice()
        .args(["version", "--client"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("Client Version: {}\n", env!("CARGO_PKG_VERSION"))
    );
    let out = lattice().arg("--help").output().expect("run");
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "apply",
        "diff",
        "get",
        "describe",
        "delete",
        "api-resources",
        "version",
        "config",
    ] {
        assert!(help.contains(cmd), "{cmd} missing from help:\n{help}");
    }
    assert!(!help.contains('\u{1b}'));
}

#[test]
fn bad_flag_is_a_usage_error() {
    let out = lattice()
        .args(["get", "alloc", "-o", "xml"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'xml'"), "{err}");
}

#[test]
fn missing_explicit_config_file_is_reported() {
    let out = lattice()
        .args(["--config", "/nonexistent/lattice.yaml", "get", "alloc"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: read config file /nonexistent/lattice.yaml: no such file\n  hint:"),
        "{err}"
    );
}

#[test]
fn unreadable_ca_file_is_reported() {
    let out = lattice()
        .args([
            "--certificate-authority",
            "/nonexistent/ca.pem",
            "get",
            "alloc",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: read CA file /nonexistent/ca.pem: "),
        "{err}"
    );
    assert!(err.contains("hint: check --certificate-authority"), "{err}");
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_exits_zero_on_ctrl_c() {
    let f = common::populated().await;
    let mut child = lattice()
        .args(["get", "alloc", "-w", "--api-url", &f.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lattice");
    let stdout = child.stdout.take().expect("stdout");
    // Header and the two listed rows arrive before the watch starts waiting.
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .take(3)
            .map(|l| l.unwrap_or_default())
            .collect::<Vec<_>>()
    });
    let lines = tokio::time::timeout(Duration::from_secs(20), lines)
        .await
        .expect("rows printed in time")
        .expect("reader");
    assert!(lines[0].starts_with("NAME"), "{lines:?}");
    assert!(lines[1].starts_with("eval"), "{lines:?}");
    // Wait until the watch request is in flight, then interrupt like Ctrl-C does.
    tokio::time::timeout(Duration::from_secs(20), f.watch_done.notified())
        .await
        .expect("watch started");
    let pid = child.id().to_string();
    let status = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let waited = tokio::task::spawn_blocking(move || child.wait_with_output());
    let out = tokio::time::timeout(Duration::from_secs(20), waited)
        .await
        .expect("exits after SIGINT")
        .expect("join")
        .expect("wait");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
