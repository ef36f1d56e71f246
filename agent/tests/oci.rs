//! OCI images for real: an image built here (busybox from Debian's `busybox-static`, two
//! layers with whiteouts and a hostile symbolic link) is pushed to Debian's
//! `docker-registry` (the CNCF distribution registry), pulled by the agent, unpacked, and
//! run by Debian's `crun` as the job's user. Needs root (mounts, containers).

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use common::*;
use lattice_apis::AllocationPhase;
use serde_json::{json, Value};
use sha2::Digest;

/// A registry on loopback with its storage in `dir`; killed on drop.
struct Registry {
    child: Child,
    addr: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn registry(dir: &Path) -> Registry {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let cfg = dir.join("registry.yml");
    std::fs::write(
        &cfg,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.join("storage").display()
        ),
    )
    .unwrap();
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("docker-registry (Debian package docker-registry): run hack/install-deps.sh");
    let reg = Registry { child, addr };
    for _ in 0..200 {
        if std::net::TcpStream::connect(&reg.addr).is_ok() {
            return reg;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("docker-registry did not listen on {}", reg.addr);
}

/// A tar+gzip layer of `entries`: (path, kind) where kind is `file:CONTENT`,
/// `exec:HOSTPATH`, `link:TARGET` or `dir`.
fn layer(entries: &[(&str, &str)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (path, kind) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        if let Some(text) = kind.strip_prefix("file:") {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(text.len() as u64);
            b.append_data(&mut h, path, text.as_bytes()).unwrap();
        } else if let Some(host) = kind.strip_prefix("exec:") {
            let bytes = std::fs::read(host).unwrap();
            h.set_entry_type(tar::EntryType::Regular);
            // A set-user-ID bit in the image: never carried over.
            h.set_mode(0o4755);
            h.set_size(bytes.len() as u64);
            b.append_data(&mut h, path, bytes.as_slice()).unwrap();
        } else if let Some(target) = kind.strip_prefix("link:") {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            b.append_link(&mut h, path, target).unwrap();
        } else {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            b.append_data(&mut h, path, std::io::empty()).unwrap();
        }
    }
    b.into_inner().unwrap().finish().unwrap()
}

fn digest(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

/// Push `blob` to `repo` on the registry (a monolithic upload).
async fn push_blob(http: &reqwest::Client, addr: &str, repo: &str, blob: &[u8]) -> String {
    let d = digest(blob);
    let r = http
        .post(format!("http://{addr}/v2/{repo}/blobs/uploads/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{:?}", r.text().await);
    let loc = r.headers()["location"].to_str().unwrap().to_string();
    let loc = if loc.starts_with('/') {
        format!("http://{addr}{loc}")
    } else {
        loc
    };
    let sep = if loc.contains('?') { '&' } else { '?' };
    let r = http
        .put(format!("{loc}{sep}digest={d}"))
        .header("content-type", "application/octet-stream")
        .body(blob.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    d
}

/// Push an image of `layers` as `repo:tag`; its manifest digest.
async fn push_image(addr: &str, repo: &str, tag: &str, layers: &[Vec<u8>]) -> String {
    let http = reqwest::Client::new();
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for l in layers {
        let d = push_blob(&http, addr, repo, l).await;
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(l.as_slice()), &mut raw)
            .unwrap();
        diff_ids.push(digest(&raw));
        descs.push(
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                          "digest": d, "size": l.len()}),
        );
    }
    let config = json!({
        "architecture": lattice_agent::oci::oci_arch(), "os": "linux",
        "config": {"Env": ["PATH=/bin", "IMAGE_GREETING=from-the-image", "OVERRIDDEN=image"],
                   "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    })
    .to_string();
    let cd = push_blob(&http, addr, repo, config.as_bytes()).await;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
        "layers": descs,
    })
    .to_string();
    let r = http
        .put(format!("http://{addr}/v2/{repo}/manifests/{tag}"))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(manifest.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    digest(manifest.as_bytes())
}

/// The test image: busybox, an `/etc/os-release` of its own, and a second layer that
/// whites out a file and a directory's old content and writes through a link that
/// points at the host's `/`.
async fn test_image(addr: &str, marker: &str) -> String {
    let busybox = "/bin/busybox";
    assert!(
        Path::new(busybox).exists(),
        "busybox (Debian busybox-static): run hack/install-deps.sh"
    );
    let mut base: Vec<(String, String)> = vec![
        ("bin".into(), "dir".into()),
        ("bin/busybox".into(), format!("exec:{busybox}")),
        ("etc".into(), "dir".into()),
        (
            "etc/os-release".into(),
            "file:ID=lattice-test\nPRETTY_NAME=\"Lattice test image\"\n".into(),
        ),
        (
            "etc/gone".into(),
            "file:whited out by the second layer\n".into(),
        ),
        (
            "opt/keep/old".into(),
            "file:hidden by an opaque whiteout\n".into(),
        ),
        ("escape".into(), "link:/".into()),
    ];
    for tool in [
        "sh", "cat", "id", "ls", "test", "printf", "grep", "echo", "stat",
    ] {
        base.push((format!("bin/{tool}"), "link:busybox".into()));
    }
    let base: Vec<(&str, &str)> = base.iter().map(|(p, k)| (p.as_str(), k.as_str())).collect();
    let escaped = format!("escape/{marker}");
    let top = [
        ("etc/.wh.gone", "file:"),
        ("opt/keep/.wh..wh..opq", "file:"),
        ("opt/keep/new", "file:the second layer's\n"),
        (escaped.as_str(), "file:written through a link to /\n"),
    ];
    push_image(addr, "lattice/test", "v1", &[layer(&base), layer(&top)]).await
}

fn user_meta(user: &str) -> Value {
    json!({"annotations": {"lattice.dev/user": user}})
}

fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn setup() -> Option<nix::unistd::User> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: containers need root");
        return None;
    }
    if !cgroups_usable() {
        eprintln!("skipped: needs writable cgroups");
        return None;
    }
    test_user()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_job_runs_in_the_image_as_the_user_with_its_steps_ranks_on_pmi() {
    let Some(user) = setup() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let marker = format!("lattice-oci-escape-{}", std::process::id());
    let manifest = test_image(&reg.addr, &marker).await;
    let server = Server::start();
    let root = open_dir();
    let agent = Agent::start(&server, "node-a", root.path(), &[]);
    let image = format!("{}/lattice/test:v1", reg.addr);

    let script = "#!/bin/sh\n\
        cat /etc/os-release\n\
        echo \"uid=$(id -u) greeting=$IMAGE_GREETING overridden=$OVERRIDDEN\"\n\
        test -e /etc/gone && echo 'gone is there' || echo 'gone is gone'\n\
        echo \"keep: $(ls /opt/keep)\"\n\
        grep '^CapEff' /proc/self/status\n\
        grep '^NoNewPrivs' /proc/self/status\n\
        echo \"suid: $(stat -c %a /bin/busybox)\"\n\
        echo ready\n\
        exec sleep 300\n";
    create_with(
        &server,
        "boxed",
        json!({"script": script, "env": {"OVERRIDDEN": "job"},
               "environment": {"image": image}}),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "boxed", &["node-a"], Some(600)).await;
    let text = wait_for("the job's output", LIMIT, || async {
        let (_, t) = server.logs("boxed", "").await;
        t.contains("ready").then_some(t)
    })
    .await;
    let want = [
        "ID=lattice-test".to_string(),
        format!("uid={} greeting=from-the-image overridden=job", user.uid),
        "gone is gone".into(),
        "keep: new".into(),
        "CapEff:\t0000000000000000".into(),
        "NoNewPrivs:\t1".into(),
        "suid: 755".into(),
    ];
    for w in &want {
        assert!(
            text.contains(w.as_str()),
            "missing {w:?} in:\n{text}\n{}",
            agent.log()
        );
    }
    eprintln!("the job said:\n{text}");
    // The link to / in the image resolved inside the image: nothing reached the host.
    assert!(!Path::new("/").join(&marker).exists());
    let cached = agent
        .state_dir
        .join("oci")
        .join(manifest.trim_start_matches("sha256:"));
    assert!(cached.join("rootfs").join(&marker).exists());

    // An attach session enters the container: the image's files and environment.
    let out = attach(
        &server,
        "boxed",
        &[
            "--",
            "sh",
            "-c",
            "grep ^ID= /etc/os-release; echo \"attached uid=$(id -u) $IMAGE_GREETING\"; grep ^NoNewPrivs /proc/self/status",
        ],
    );
    let said = String::from_utf8_lossy(&out.stdout);
    for w in [
        "ID=lattice-test".to_string(),
        format!("attached uid={} from-the-image", user.uid),
        "NoNewPrivs:\t1".into(),
    ] {
        assert!(
            said.contains(&w),
            "missing {w:?} in {said}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // A job step of the allocation runs in the image too: two ranks, each speaking the
    // PMI-1 wire on its own socket (descriptor 3 in the container).
    let p = server.allocations().get("boxed").await.unwrap();
    let ranks = "printf 'cmd=init pmi_version=1 pmi_subversion=1\\n' >&$PMI_FD; \
                 read -r a <&$PMI_FD; \
                 printf 'cmd=finalize\\n' >&$PMI_FD; read -r b <&$PMI_FD; \
                 echo \"rank $PMI_RANK of $PMI_SIZE fd=$PMI_FD in $(grep ^ID= /etc/os-release): $a / $b\"";
    let meta = json!({
        "ownerReferences": [{"apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
                             "name": "boxed", "uid": p.metadata.uid, "controller": true}],
        "annotations": {"lattice.dev/user": user.name, "lattice.dev/ntasks": "2"},
    });
    create_with(
        &server,
        "boxed.0",
        json!({"stepOf": "boxed", "entrypoint": ranks, "requeue": {"policy": "never"},
               "launch": {"mpi": "pmi2"}, "environment": {"image": image}}),
        meta,
    )
    .await;
    let s = wait_terminal(&server, "boxed.0").await;
    let (_, out) = server.logs("boxed.0", "").await;
    assert_eq!(
        s.phase(),
        AllocationPhase::Completed,
        "{:?}\n{out}\n{}",
        s.status,
        agent.log()
    );
    for r in 0..2 {
        assert!(
            out.contains(&format!(
                "rank {r} of 2 fd=3 in ID=lattice-test: cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0 / cmd=finalize_ack"
            )),
            "rank {r}: {out}"
        );
    }
}

/// The runtime enters the working directory as root: only the agent's own scratch
/// directory is given to it. Any other is entered by the user, so a working directory
/// through another process's root (`/proc/1/root`, the host's `/`) is refused by the
/// kernel; one in the image works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_working_directory_is_entered_as_the_user() {
    let Some(user) = setup() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    test_image(
        &reg.addr,
        &format!("lattice-oci-cwd-{}", std::process::id()),
    )
    .await;
    let server = Server::start();
    let root = open_dir();
    let agent = Agent::start(&server, "node-a", root.path(), &[]);
    let image = format!("{}/lattice/test:v1", reg.addr);
    for (name, wd) in [("in-image", "/opt/keep"), ("host-root", "/proc/1/root/etc")] {
        create_with(
            &server,
            name,
            json!({"entrypoint": "pwd; ls", "workingDir": wd, "requeue": {"policy": "never"},
                   "environment": {"image": image}}),
            user_meta(&user.name),
        )
        .await;
        bind(&server, name, &["node-a"], Some(600)).await;
    }
    let ok = wait_terminal(&server, "in-image").await;
    let (_, out) = server.logs("in-image", "").await;
    assert_eq!(
        ok.phase(),
        AllocationPhase::Completed,
        "{out}\n{}",
        agent.log()
    );
    assert!(out.contains("/opt/keep\nnew"), "{out}");
    let refused = wait_terminal(&server, "host-root").await;
    let (_, out) = server.logs("host-root", "").await;
    assert_eq!(refused.phase(), AllocationPhase::Failed, "{out}");
    assert!(out.contains("can't cd") && !out.contains("passwd"), "{out}");
}

/// The node's GPUs (here fake device nodes: the node has GPU 0 of two) and the job's
/// uenv mounts are passed into the container; the other GPU is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_gpus_and_the_jobs_uenv_reach_the_container() {
    let Some(user) = setup() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    test_image(
        &reg.addr,
        &format!("lattice-oci-gpu-{}", std::process::id()),
    )
    .await;
    let (repo, mount) = uenv_repository(dir.path());
    let dev = open_dir();
    fake_gpus(dev.path());
    let server = Server::start();
    let root = open_dir();
    let (dev_dir, repo, mount_s) = (
        dev.path().display().to_string(),
        repo.display().to_string(),
        mount.display().to_string(),
    );
    let agent = Agent::start(
        &server,
        "node-a",
        root.path(),
        &[
            "--device-dir",
            &dev_dir,
            "--gpu-devices",
            "0",
            "--uenv-repo",
            &repo,
            "--uenv-mount-points",
            &mount_s,
        ],
    );
    create_with(
        &server,
        "gpu-box",
        json!({"entrypoint": format!("ls /dev | grep nvidia; {mount_s}/bin/hello-uenv; grep -c ^ID=lattice-test /etc/os-release"),
               "requeue": {"policy": "never"},
               "environment": {"image": format!("{}/lattice/test:v1", reg.addr),
                               "toolsUenv": "tools/1.0:v1"}}),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "gpu-box", &["node-a"], Some(600)).await;
    let a = wait_terminal(&server, "gpu-box").await;
    let (_, out) = server.logs("gpu-box", "").await;
    assert_eq!(
        a.phase(),
        AllocationPhase::Completed,
        "{out}\n{}",
        agent.log()
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "nvidia0",
            "nvidiactl",
            &format!("hello from the uenv at {mount_s}/bin"),
            "1"
        ],
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_image_fails_the_allocation_without_requeue() {
    let Some(user) = setup() else { return };
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let server = Server::start();
    let root = open_dir();
    let agent = Agent::start(&server, "node-a", root.path(), &[]);
    create_with(
        &server,
        "nope",
        json!({"entrypoint": "true", "environment": {"image": format!("{}/lattice/none:v9", reg.addr)}}),
        user_meta(&user.name),
    )
    .await;
    bind(&server, "nope", &["node-a"], Some(600)).await;
    let a = wait_terminal(&server, "nope").await;
    assert_eq!(
        a.phase(),
        AllocationPhase::Failed,
        "{:?}\n{}",
        a.status,
        agent.log()
    );
    assert_eq!(
        a.status.as_ref().and_then(|s| s.reason.as_deref()),
        Some("environment_unavailable")
    );
    let said = format!("{:?}", node_state(&a, "node-a").message);
    assert!(
        said.contains("lattice/none:v9") && said.contains("no manifests/v9"),
        "{said}"
    );
}
