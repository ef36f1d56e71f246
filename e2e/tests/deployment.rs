//! The deployment artefacts under `manifests/deploy/` against the code they deploy: the
//! systemd units pass `systemd-analyze verify` (and the server's its security review),
//! keep the hardening each daemon can take, and start the binaries with their config
//! files; the Containerfile copies sources that exist and the binaries the workspace
//! builds. (The Helm chart is rendered and validated by `hack/check-chart.sh`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn deploy() -> PathBuf {
    repo().join("manifests/deploy")
}

fn systemd_analyze() -> &'static str {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "systemd-analyze not found: run hack/install-deps.sh (Debian package systemd)"
    );
    "systemd-analyze"
}

/// `[Service]`-style directives of a unit: key → every value it is given, in order.
fn directives(unit: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in unit.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let (k, v) = line.split_once('=').expect("key=value");
        out.entry(format!("{section}.{}", k.trim()))
            .or_default()
            .push(v.trim().to_string());
    }
    out
}

fn one<'a>(d: &'a BTreeMap<String, Vec<String>>, key: &str) -> &'a str {
    match d.get(key).map(Vec::as_slice) {
        Some([v]) => v,
        other => panic!("{key}: expected one value, found {other:?}"),
    }
}

/// The unit with its ExecStart pointed at the binary this workspace built (verify checks
/// that the program exists).
fn unit_for_verify(name: &str, dir: &Path) -> PathBuf {
    let text =
        std::fs::read_to_string(deploy().join("systemd").join(format!("{name}.service"))).unwrap();
    let installed = format!("/usr/local/bin/{name} ");
    assert!(
        text.contains(&installed),
        "{name}: ExecStart is not {installed}"
    );
    let built = lattice_e2e::bin(name);
    let path = dir.join(format!("{name}.service"));
    std::fs::write(
        &path,
        text.replace(&installed, &format!("{} ", built.display())),
    )
    .unwrap();
    path
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    let analyze = systemd_analyze();
    let dir = tempfile::tempdir().unwrap();
    for name in ["lattice-server", "lattice-agent"] {
        let unit = unit_for_verify(name, dir.path());
        let out = Command::new(analyze)
            .arg("verify")
            .arg(&unit)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // verify exits 0 on unknown keys and bad values, only saying so: any word from it
        // is a defect.
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "systemd-analyze verify {name}.service: {stderr}"
        );
    }
    // The server's sandbox, as systemd scores it (0 = fully sandboxed, 10 = none): at most
    // 2.0, "OK".
    let unit = unit_for_verify("lattice-server", dir.path());
    let out = Command::new(analyze)
        .args(["security", "--offline=true", "--threshold=20"])
        .arg(&unit)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "lattice-server.service's exposure is above 2.0:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn server_unit_is_hardened_and_reads_etc_lattice() {
    let text = std::fs::read_to_string(deploy().join("systemd/lattice-server.service")).unwrap();
    let d = directives(&text);
    assert_eq!(
        one(&d, "Service.ExecStart"),
        "/usr/local/bin/lattice-server --config /etc/lattice/server.toml"
    );
    assert_eq!(
        one(&d, "Service.EnvironmentFile"),
        "-/etc/lattice/server.env"
    );
    assert_eq!(one(&d, "Service.User"), "lattice");
    assert_eq!(one(&d, "Service.StateDirectory"), "lattice");
    assert_eq!(one(&d, "Service.Restart"), "on-failure");
    assert!(one(&d, "Service.LimitNOFILE").parse::<u64>().unwrap() >= 65536);
    for (key, value) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(one(&d, &format!("Service.{key}")), value, "{key}");
    }
    // The user it runs as is the one the sysusers file creates, at home in the state
    // directory.
    let sysusers = std::fs::read_to_string(deploy().join("systemd/lattice.sysusers.conf")).unwrap();
    assert!(
        sysusers
            .lines()
            .any(|l| l.starts_with("u lattice ") && l.ends_with(" /var/lib/lattice")),
        "{sysusers}"
    );
}

#[test]
fn agent_unit_leaves_jobs_their_privileges() {
    let text = std::fs::read_to_string(deploy().join("systemd/lattice-agent.service")).unwrap();
    let d = directives(&text);
    assert_eq!(
        one(&d, "Service.ExecStart"),
        "/usr/local/bin/lattice-agent --config /etc/lattice/agent.toml"
    );
    assert_eq!(
        one(&d, "Service.EnvironmentFile"),
        "-/etc/lattice/agent.env"
    );
    assert_eq!(one(&d, "Service.User"), "root");
    assert_eq!(one(&d, "Service.StateDirectory"), "lattice-agent");
    assert_eq!(one(&d, "Service.Restart"), "on-failure");
    // Jobs survive a restart of the agent (agent/README.md, "Restart semantics").
    assert_eq!(one(&d, "Service.KillMode"), "process");
    assert!(d.contains_key("Service.LimitNOFILE"));
    // Jobs inherit the agent's sandbox: none of what would take from them set-uid
    // programs, their files, /tmp, namespaces, or the capabilities the agent uses to
    // become their users and limit them.
    for key in [
        "NoNewPrivileges",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "PrivateUsers",
        "RestrictNamespaces",
        "RestrictSUIDSGID",
        "CapabilityBoundingSet",
        "SystemCallFilter",
        "ProtectControlGroups",
        "DynamicUser",
    ] {
        assert!(
            !d.contains_key(&format!("Service.{key}")),
            "{key} breaks jobs"
        );
    }
}

/// A parsed Containerfile instruction: keyword and its arguments (continuations joined).
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if current.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(t);
        let (k, rest) = current.split_once(' ').unwrap_or((&current, ""));
        out.push((k.to_uppercase(), rest.trim().to_string()));
        current.clear();
    }
    out
}

/// Workspace members: package name → (directory, [[bin]] names).
fn workspace() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let root: toml_edit::DocumentMut = std::fs::read_to_string(repo().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let mut out = BTreeMap::new();
    for m in root["workspace"]["members"].as_array().unwrap() {
        let dir = m.as_str().unwrap().to_string();
        let manifest: toml_edit::DocumentMut =
            std::fs::read_to_string(repo().join(&dir).join("Cargo.toml"))
                .unwrap()
                .parse()
                .unwrap();
        let name = manifest["package"]["name"].as_str().unwrap().to_string();
        let bins = manifest
            .get("bin")
            .and_then(|b| b.as_array_of_tables())
            .map(|bins| {
                bins.iter()
                    .map(|b| b["name"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default();
        out.insert(name, (dir, bins));
    }
    out
}

#[test]
fn containerfile_builds_what_the_workspace_has() {
    let text = std::fs::read_to_string(deploy().join("Containerfile")).unwrap();
    let steps = instructions(&text);
    let members = workspace();
    let args: BTreeMap<String, String> = steps
        .iter()
        .filter(|(k, _)| k == "ARG")
        .filter_map(|(_, a)| a.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let expand = |s: &str| {
        args.iter().fold(s.to_string(), |s, (k, v)| {
            s.replace(&format!("${{{k}}}"), v)
                .replace(&format!("${k}"), v)
        })
    };

    // Two stages: a Rust builder on Debian 12 and a Debian 12 slim runtime.
    let froms: Vec<String> = steps
        .iter()
        .filter(|(k, _)| k == "FROM")
        .map(|(_, a)| expand(a))
        .collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(
        froms[0].starts_with("docker.io/library/rust:")
            && froms[0].ends_with("-bookworm AS builder"),
        "{}",
        froms[0]
    );
    assert_eq!(froms[1], "docker.io/library/debian:bookworm-slim");
    let runtime_at = steps.iter().rposition(|(k, _)| k == "FROM").unwrap();
    let (build, runtime) = steps.split_at(runtime_at);

    // Every source copied from the context exists, and together they hold the whole
    // workspace (cargo reads every member's manifest).
    let mut copied = BTreeSet::new();
    for (_, a) in build.iter().filter(|(k, _)| k == "COPY") {
        assert!(!a.starts_with("--from"), "{a}");
        let parts: Vec<&str> = a.split_whitespace().collect();
        for src in &parts[..parts.len() - 1] {
            assert!(
                repo().join(src).exists(),
                "COPY {src}: no such file in the repository"
            );
            copied.insert(src.trim_end_matches('/').to_string());
        }
    }
    for f in ["Cargo.toml", "Cargo.lock"] {
        assert!(copied.contains(f), "{f} is not copied");
    }
    for (name, (dir, _)) in &members {
        let top = dir.split('/').next().unwrap();
        assert!(
            copied.contains(top),
            "workspace member {name} ({dir}) is not copied"
        );
    }
    // The ignore file lets every copied source into the context.
    let ignore = std::fs::read_to_string(deploy().join("Containerfile.dockerignore")).unwrap();
    for src in &copied {
        let kept = ignore
            .lines()
            .any(|l| l.trim().trim_end_matches('/') == format!("!{src}"));
        assert!(
            kept,
            "Containerfile.dockerignore leaves {src} out of the context"
        );
    }

    // The build names real packages and copies out binaries they have, with a profile
    // the workspace defines.
    let profile = &args["PROFILE"];
    let cargo_toml = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    assert!(
        profile == "release" || cargo_toml.contains(&format!("[profile.{profile}]")),
        "profile {profile} is not in Cargo.toml"
    );
    let run = build
        .iter()
        .filter(|(k, _)| k == "RUN")
        .map(|(_, a)| a.as_str())
        .find(|a| a.contains("cargo build"))
        .expect("a RUN with cargo build");
    assert!(run.contains("--locked"), "{run}");
    let words: Vec<&str> = run.split_whitespace().collect();
    let mut bins = BTreeSet::new();
    for w in words.windows(2).filter(|w| w[0] == "-p") {
        let (_, package_bins) = members
            .get(w[1])
            .unwrap_or_else(|| panic!("-p {}: no such package in the workspace", w[1]));
        bins.extend(package_bins.iter().cloned());
    }
    for w in &words {
        if let Some(bin) = w.trim_matches('"').strip_prefix("target/${PROFILE}/") {
            assert!(
                bins.contains(bin),
                "{bin} is not a binary of the packages built"
            );
        }
    }

    // The runtime stage: CA certificates, the three binaries from the builder, a user that
    // is not root, lattice-server as the entry point.
    let runtime_text: String = runtime.iter().map(|(k, a)| format!("{k} {a}\n")).collect();
    assert!(runtime_text.contains("ca-certificates"), "{runtime_text}");
    let from_builder: Vec<&str> = runtime
        .iter()
        .filter(|(k, a)| k == "COPY" && a.starts_with("--from=builder "))
        .flat_map(|(_, a)| a.split_whitespace().skip(1))
        .collect();
    let (dest, sources) = from_builder.split_last().unwrap();
    assert_eq!(*dest, "/usr/local/bin/");
    let shipped: BTreeSet<&str> = sources
        .iter()
        .map(|s| s.rsplit('/').next().unwrap())
        .collect();
    assert_eq!(
        shipped,
        BTreeSet::from(["lattice", "lattice-agent", "lattice-server"])
    );
    for bin in &shipped {
        assert!(bins.contains(*bin), "{bin} is not built");
        assert!(
            run.contains(&format!("target/${{PROFILE}}/{bin}")),
            "{bin} is not copied out of the build"
        );
    }
    let user = runtime
        .iter()
        .rev()
        .find(|(k, _)| k == "USER")
        .map(|(_, a)| a.as_str())
        .expect("a USER");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "0" && uid != "root", "USER {user}");
    let entry = runtime
        .iter()
        .find(|(k, _)| k == "ENTRYPOINT")
        .map(|(_, a)| a.as_str())
        .unwrap();
    assert_eq!(entry, "[\"/usr/local/bin/lattice-server\"]");
}

/// A server started the way the unit starts it, `--config FILE`, with one setting from
/// the environment and one from the command line over the file's.
#[test]
fn a_server_takes_its_settings_from_flag_environment_and_file_in_that_order() {
    use lattice_e2e::free_port;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let [file_api, env_api, file_etcd, flag_etcd] = [(); 4].map(|_| free_port());
    let config = dir.path().join("server.toml");
    std::fs::write(
        &config,
        format!(
            "data-dir = {data:?}\napi-addr = \"127.0.0.1:{file_api}\"\n\
             etcd-addr = \"127.0.0.1:{file_etcd}\"\ntls-addr = \"off\"\n\
             store-plaintext-loopback = true\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
    let mut child = Command::new(lattice_e2e::bin("lattice-server"))
        .arg("--config")
        .arg(&config)
        .args(["--etcd-addr", &format!("127.0.0.1:{flag_etcd}")])
        .env("LATTICE_API_ADDR", format!("127.0.0.1:{env_api}"))
        .stderr(log)
        .spawn()
        .unwrap();
    let up = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    let start = Instant::now();
    while !(up(env_api) && up(flag_etcd) && data.join("admin.token").exists()) {
        let exited = child.try_wait().unwrap().is_some();
        if exited || start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!(
                "the server did not come up on the environment's and the flag's addresses:\n{}",
                std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (api_from_file, etcd_from_file) = (up(file_api), up(file_etcd));
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !api_from_file,
        "the file's api-addr won over LATTICE_API_ADDR"
    );
    assert!(!etcd_from_file, "the file's etcd-addr won over --etcd-addr");

    // A key that is no flag stops it at start, naming the file, the line and the key.
    std::fs::write(&config, "data-dir = \"/x\"\ndata_dir = \"/y\"\n").unwrap();
    let out = Command::new(lattice_e2e::bin("lattice-server"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("server.toml:2: unknown key `data_dir`") && stderr.contains("`data-dir`"),
        "{stderr}"
    );
}
