//! The dev server as users meet it: the real `lattice-server --dev`, the real `lattice`
//! CLI applying the example manifests, the real `kubectl` pointed at the same API with a
//! kubeconfig, `etcdctl` on the etcd port, and `promtool` linting `/metrics`.

use std::path::Path;
use std::process::{Command, Output};

use lattice_e2e::{bin, free_port, kubectl as kubectl_bin, Server};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    out
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn lattice(server: &Server) -> Command {
    let mut c = Command::new(bin("lattice"));
    c.env("LATTICE_API_URL", server.api_url())
        .env("LATTICE_TOKEN", server.admin_token())
        .env("HOME", server.data_dir.join("home"))
        .env_remove("LATTICE_TENANT")
        .current_dir(repo());
    c
}

#[test]
fn cli_applies_the_examples_and_reads_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), free_port(), free_port(), &["--dev"]);

    // The dev bootstrap created tenant and vCluster `default`.
    let out = ok(lattice(&server).args(["get", "tenants"]));
    assert!(out.contains("default"), "{out}");
    let out = ok(lattice(&server).args(["get", "vclusters", "-n", "default"]));
    assert!(out.contains("default"), "{out}");

    let out = ok(lattice(&server).args(["apply", "-f", "manifests/examples/"]));
    assert!(
        out.contains("created"),
        "first apply should create objects:\n{out}"
    );
    // Applying the same files again changes nothing.
    let again = ok(lattice(&server).args(["apply", "-f", "manifests/examples/"]));
    assert!(
        !again.contains("created") && !again.contains("configured"),
        "second apply changed something:\n{again}"
    );

    let out = ok(lattice(&server).args(["get", "dags", "-A"]));
    assert!(out.contains("training-pipeline"), "{out}");
    let out = ok(lattice(&server).args(["get", "allocations", "-A", "-o", "json"]));
    let list: serde_json::Value = serde_json::from_str(&out).expect("json list");
    assert!(
        list["items"].as_array().is_some_and(|i| !i.is_empty()),
        "{out}"
    );

    // A bad manifest: a clear error naming the field, non-zero exit, nothing stored.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: bad, namespace: default}\nspec:\n  entrypoint: /bin/true\n  preemptionClass: 42\n",
    )
    .unwrap();
    let out = run(lattice(&server).args(["apply", "-f"]).arg(&bad));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.preemptionClass"),
        "error should name the field: {err}"
    );
    let out = run(lattice(&server).args(["get", "allocation", "bad", "-n", "default"]));
    assert!(!out.status.success(), "invalid object must not be stored");
}

/// The kubeconfig `lattice-server` writes: HTTPS with its generated CA and the admin token.
fn kubeconfig(server: &Server) -> std::path::PathBuf {
    let path = server.data_dir.join("kubeconfig");
    assert!(
        path.exists(),
        "lattice-server did not write {}",
        path.display()
    );
    path
}

fn kubectl(server: &Server, cfg: &Path) -> Command {
    let mut c = Command::new(kubectl_bin());
    c.env("KUBECONFIG", cfg)
        .env("HOME", server.data_dir.join("home"))
        .env("KUBECACHEDIR", server.data_dir.join("kubecache"))
        .current_dir(repo());
    c
}

#[test]
fn kubectl_works_unmodified() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), free_port(), free_port(), &["--dev"]);
    let cfg = kubeconfig(&server);

    let out = ok(kubectl(&server, &cfg).args(["api-resources", "--api-group=lattice.dev"]));
    assert!(
        out.contains("allocations") && out.contains("alloc"),
        "{out}"
    );

    let manifest = dir.path().join("alloc.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: lattice.dev/v1alpha1\nkind: Allocation\nmetadata: {name: kube-job, namespace: default}\nspec:\n  entrypoint: /bin/echo\n  args: [hello]\n  resources: {nodes: 1}\n  lifecycle: {type: bounded, walltime: \"1h\"}\n",
    )
    .unwrap();
    ok(kubectl(&server, &cfg)
        .args(["apply", "--server-side", "-f"])
        .arg(&manifest));
    let out = ok(kubectl(&server, &cfg).args(["get", "allocations"]));
    assert!(out.contains("kube-job"), "{out}");
    let out = ok(kubectl(&server, &cfg).args(["get", "alloc", "kube-job", "-o", "yaml"]));
    assert!(out.contains("generation: 1"), "{out}");
    let out = ok(kubectl(&server, &cfg).args(["explain", "allocations.spec"]));
    assert!(out.to_lowercase().contains("entrypoint"), "{out}");

    // `get -w` prints the change made by another client.
    let mut watch = kubectl(&server, &cfg)
        .args([
            "get",
            "allocations",
            "--watch-only",
            "--request-timeout=20s",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    ok(kubectl(&server, &cfg).args(["delete", "allocation", "kube-job"]));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("kube-job"),
        "kubectl get -w printed nothing for the delete: {printed}"
    );
}

#[test]
fn etcdctl_and_promtool_against_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), free_port(), free_port(), &["--dev"]);
    let etcdctl = |args: &[&str]| {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", server.etcd_endpoint()))
            .args(args);
        c
    };
    // Resources are ordinary keys under /registry/.
    let out = ok(&mut etcdctl(&[
        "get",
        "--prefix",
        "--keys-only",
        "/registry/lattice.dev/",
    ]));
    assert!(
        out.contains("/registry/lattice.dev/tenants/default"),
        "{out}"
    );
    ok(&mut etcdctl(&["endpoint", "health"]));

    let metrics = reqwest::blocking_get(&format!("{}/metrics", server.api_url()));
    let path = dir.path().join("metrics.txt");
    std::fs::write(&path, &metrics).unwrap();
    let out = run(Command::new("promtool")
        .arg("check")
        .arg("metrics")
        .stdin(std::fs::File::open(&path).unwrap()));
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        metrics.contains("lattice_store_applied_revision"),
        "store metrics missing"
    );
    assert!(metrics.contains("lattice_apiserver"), "API metrics missing");
}

mod reqwest {
    /// A tiny blocking GET without pulling reqwest's blocking feature.
    pub fn blocking_get(url: &str) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async { ::reqwest::get(url).await.unwrap().text().await.unwrap() })
    }
}
