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
    assert_eq!(out.status.code(), Some(5), "unreachable server exits 5");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err,
        format!(
            "Error: cannot reach the Lattice API at http://127.0.0.1:{port} — connection refused\n  \
             Hint: start a server with `lattice-server --dev` (or `lattice up`) or set \
             LATTICE_API_URL (or --api-url) to the address of a running one\n"
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
        err.starts_with(
            "Error: read config file /nonexistent/lattice.yaml — no such file\n  Hint:"
        ),
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
        err.starts_with("Error: read CA file /nonexistent/ca.pem — "),
        "{err}"
    );
    assert!(err.contains("Hint: check --certificate-authority"), "{err}");
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

fn run_ok(c: &mut Command) -> std::process::Output {
    c.output().expect("run")
}

#[test]
fn completion_scripts_load() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = run_ok(lattice().args(["completion", "bash"]));
    assert_eq!(out.status.code(), Some(0));
    let script = dir.path().join("lattice.bash");
    std::fs::write(&script, &out.stdout).expect("write");
    let check = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p lattice && declare -F _lattice_dynamic",
            script.display()
        ))
        .output()
        .expect("bash");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let loaded = String::from_utf8_lossy(&check.stdout);
    assert!(loaded.contains("-F _lattice_dynamic"), "{loaded}");
    for shell in ["zsh", "fish"] {
        let out = run_ok(lattice().args(["completion", shell]));
        assert_eq!(out.status.code(), Some(0));
        assert!(String::from_utf8_lossy(&out.stdout).contains("lattice"));
    }
    // Loaded the way the seed shows it, without a server.
    let out = run_ok(lattice().args([
        "__complete",
        "allocations",
        "--api-url",
        "http://127.0.0.1:9",
    ]));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
}

#[test]
fn bash_completion_passes_the_typed_tenant() {
    let out = run_ok(lattice().args(["completion", "bash"]));
    let script = String::from_utf8(out.stdout).expect("utf8");
    assert!(
        script.contains("__complete \"$kind\" ${targs[@]+\"${targs[@]}\"}"),
        "the bash helper passes --tenant to __complete"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("lattice.bash");
    std::fs::write(&f, &script).expect("write");
    let check = Command::new("bash")
        .arg("-n")
        .arg(&f)
        .output()
        .expect("bash");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // Call the helper as bash's completion would (COMP_WORDS split at '=' as bash does),
    // with clap's function stubbed and the stand-in lattice on PATH.
    let fake = fake_lattice_dir();
    let harness = format!(
        "source {}\n_lattice() {{ printf clap; }}\n\
         t() {{ COMP_WORDS=(\"$@\"); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=(); \
         _lattice_dynamic; printf '%s;\\n' \"${{COMPREPLY[*]}}\"; }}\n\
         t lattice status ''\nt lattice -t x cancel ''\nt lattice status -t phys ''\n\
         t lattice --tenant = phys logs ''\nt lattice -tphys watch ''\nt lattice -n \"'phys'\" status ''\n\
         t lattice -t phys node status ''\nt lattice -t phys dag status ''\n\
         t lattice -t phys submit --vcluster ''\nt lattice -t phys submit --vcluster = ''\n\
         t lattice status -t ''\nt lattice status --tenant = ph\nt lattice status -o ''\n",
        f.display()
    );
    let run = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &harness])
        .env("PATH", with_path(fake.path()))
        .output()
        .expect("bash");
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "alloc-1 alloc-2;\nx/alloc-1 x/alloc-2;\nphys/alloc-1 phys/alloc-2;\n\
         phys/alloc-1 phys/alloc-2;\nphys/alloc-1 phys/alloc-2;\nphys/alloc-1 phys/alloc-2;\n\
         node-01;\nphys/dag-9;\nphys/hpc-batch;\nphys/hpc-batch;\nchem physics;\nphysics;\nclap;\n",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// True when `shell` runs here (zsh and fish are optional on build machines).
fn have(shell: &str) -> bool {
    Command::new(shell)
        .args(["-c", "exit 0"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A stand-in `lattice` on PATH whose `__complete KIND [--tenant T]` prints fixed names
/// per kind, prefixed with `T/` when a tenant is passed.
fn fake_lattice_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    let bin = dir.path().join("lattice");
    std::fs::write(
        &bin,
        "#!/bin/sh\n[ \"$1\" = __complete ] || exit 1\nt=\"\"\n[ \"$3\" = --tenant ] && t=\"$4/\"\n\
         case \"$2\" in\n  allocations) echo ${t}alloc-1; echo ${t}alloc-2 ;;\n  nodes) echo node-01 ;;\n  \
         dags) echo ${t}dag-9 ;;\n  vclusters) echo ${t}hpc-batch ;;\n  tenants) echo chem; echo physics ;;\nesac\n",
    )
    .expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

fn with_path(dir: &std::path::Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn zsh_and_fish_completion_complete_names() {
    let zsh =
        String::from_utf8(run_ok(lattice().args(["completion", "zsh"])).stdout).expect("utf8");
    // clap's function is wrapped: `_lattice` asks `lattice __complete` for names.
    assert!(zsh.starts_with("#compdef lattice\n"), "{}", &zsh[..40]);
    assert!(zsh.contains("\n_lattice_clap() {\n"));
    assert!(zsh.contains("\n_lattice() {\n"));
    assert!(zsh.contains("__complete \"$kind\" \"${targs[@]}\""));
    assert!(zsh.contains("_lattice_clap \"$@\""));
    let wrapper = zsh.find("\n_lattice() {\n").expect("wrapper");
    assert!(
        zsh.rfind("compdef _lattice lattice")
            .is_some_and(|tail| tail > wrapper),
        "the wrapper is defined before the script's final dispatch"
    );
    let fish =
        String::from_utf8(run_ok(lattice().args(["completion", "fish"])).stdout).expect("utf8");
    for hook in [
        "__lattice_wants allocations",
        "__lattice_wants nodes",
        "__lattice_wants dags",
        "(lattice __complete vclusters (__lattice_tenant_args) 2>/dev/null)",
        "(lattice __complete allocations (__lattice_tenant_args) 2>/dev/null)",
        "-l tenant -r -f -a '(lattice __complete tenants 2>/dev/null)'",
    ] {
        assert!(fish.contains(hook), "fish script lacks {hook}");
    }
    // The parent subcommand decides: `node status` and `dag status` are not `status`.
    assert!(!fish.contains("__fish_seen_subcommand_from status cancel logs watch"));

    let dir = tempfile::tempdir().expect("tmp");
    let fake = fake_lattice_dir();
    if have("zsh") {
        let f = dir.path().join("lattice.zsh");
        std::fs::write(&f, &zsh).expect("write");
        let check = Command::new("zsh").arg("-n").arg(&f).output().expect("zsh");
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
        // Call the wrapper with stand-ins for zsh's completion builtins.
        let harness = format!(
            "compdef() {{ :; }}\nsource {}\ncompadd() {{ [[ $1 == -a ]] && print -rn -- \"${{(P)2}};\" }}\n\
             _call_program() {{ shift; \"$@\"; }}\n_lattice_clap() {{ print -rn -- clap; }}\n\
             t() {{ words=(\"$@\"); CURRENT=$#words; _lattice; print }}\n\
             t lattice status ''\nt lattice node status ''\nt lattice node ''\nt lattice dag status ''\n\
             t lattice -t x cancel ''\nt lattice submit --vcluster ''\nt lattice status --wa\n\
             t lattice status --tenant=phys ''\nt lattice -tphys dag status ''\n\
             t lattice -n \\'phys\\' submit --vcluster ''\nt lattice status -t ''\nt lattice status -o ''\n",
            f.display()
        );
        let run = Command::new("zsh")
            .args(["-f", "-c", &harness])
            .env("PATH", with_path(fake.path()))
            .output()
            .expect("zsh");
        assert_eq!(
            String::from_utf8_lossy(&run.stdout),
            "alloc-1 alloc-2;\nnode-01;\nclap\ndag-9;\nx/alloc-1 x/alloc-2;\nhpc-batch;\nclap\n\
             phys/alloc-1 phys/alloc-2;\nphys/dag-9;\nphys/hpc-batch;\nchem physics;\nclap\n",
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
    if have("fish") {
        let f = dir.path().join("lattice.fish");
        std::fs::write(&f, &fish).expect("write");
        let check = Command::new("fish")
            .arg("-n")
            .arg(&f)
            .output()
            .expect("fish");
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
        for (line, want) in [
            ("lattice status ", "alloc-1 alloc-2"),
            ("lattice node status ", "node-01"),
            ("lattice dag status ", "dag-9"),
            ("lattice -t x cancel ", "x/alloc-1 x/alloc-2"),
            ("lattice submit --vcluster ", "hpc-batch"),
            ("lattice logs --node ", "node-01"),
            // The typed tenant is passed on: `-t X`, `--tenant=X`, `-tX`, after the command too.
            ("lattice status --tenant=phys ", "phys/alloc-1 phys/alloc-2"),
            ("lattice -tphys dag status ", "phys/dag-9"),
            ("lattice status -n phys ", "phys/alloc-1 phys/alloc-2"),
            ("lattice -t phys submit --vcluster ", "phys/hpc-batch"),
            // The tenant option's own value: tenant names, not allocations.
            ("lattice status -t ", "chem physics"),
        ] {
            let run = Command::new("fish")
                .args([
                    "--no-config",
                    "-c",
                    &format!("source {}; complete -C'{line}'", f.display()),
                ])
                .env("PATH", with_path(fake.path()))
                .output()
                .expect("fish");
            let got: Vec<String> = String::from_utf8_lossy(&run.stdout)
                .lines()
                .map(|l| l.split('\t').next().unwrap_or_default().to_string())
                .collect();
            assert_eq!(
                got.join(" "),
                want,
                "{line:?}: {}",
                String::from_utf8_lossy(&run.stderr)
            );
        }
    }
}

#[test]
fn admin_config_help_says_what_is_cluster_wide_and_what_is_client_side() {
    let out = run_ok(lattice().args(["admin", "config", "--help"]));
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for claim in [
        "Cluster settings (scheduling.max_dag_size)",
        "apply to the whole cluster at once",
        "client-side default",
        "only edit the local CLI config file",
        "nothing is sent to the server",
        "do not exist on the server yet",
    ] {
        assert!(help.contains(claim), "{claim:?} missing from:\n{help}");
    }
    let out = run_ok(lattice().args(["admin", "config", "set", "--help"]));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("for the whole cluster"), "{help}");
    assert!(
        help.contains("any other key in the local CLI config file"),
        "{help}"
    );
}

#[test]
fn compat_aliases_define_slurm_functions() {
    let out = run_ok(lattice().arg("compat-aliases"));
    assert_eq!(out.status.code(), Some(0));
    let script = String::from_utf8_lossy(&out.stdout).to_string();
    let check = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{script}\nfor f in sbatch squeue scancel salloc srun sinfo sacct; do declare -F $f >/dev/null || exit 1; done\nLATTICE_BIN={} sbatch --bogus-option 2>&1; echo rc=$?",
            env!("CARGO_BIN_EXE_lattice")
        ))
        .output()
        .expect("bash");
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{text}");
    assert!(
        text.contains("rc=2"),
        "unknown sbatch option is a usage error: {text}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let out = run_ok(lattice().args(["cancel"]));
    assert_eq!(out.status.code(), Some(2));
    let out = run_ok(lattice().args(["submit", "--nodes"]));
    assert_eq!(out.status.code(), Some(2));
    let out = run_ok(lattice().args(["submit", "--dry-run=client"]));
    assert_eq!(out.status.code(), Some(2), "nothing to run");
}

/// The site mapping of the compat crate's corpus tests (cli/compat/tests/common).
const SITE: &str = "partitions:\n  normal: hpc-batch\n  debug: interactive\n  gpu: ml-training\n  long: hpc-batch\n  sensitive: sensitive-secure\nqos:\n  low: 1\n  normal: 4\n  high: 7\n  urgent: 9\naccounts:\n  ml_team: ml-team\nvclusters: [hpc-batch, ml-training, interactive, sensitive-secure]\ndefault_vcluster: hpc-batch\nset_slurm_env: true\n";

#[test]
fn corpus_submits_with_client_dry_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let site = dir.path().join("lattice-compat.yaml");
    std::fs::write(&site, SITE).expect("site");
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("compat/tests/corpus");
    let mut scripts: Vec<_> = std::fs::read_dir(&corpus)
        .expect("corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 30);
    for s in &scripts {
        let golden = s.with_extension("golden.json");
        let out = run_ok(
            lattice()
                .args([
                    "submit",
                    "--dry-run=client",
                    "-o",
                    "json",
                    "--compat-config",
                ])
                .arg(&site)
                .arg(s)
                .env("USER", "alice")
                // Nothing listens here: client dry runs need no server.
                .env("LATTICE_API_URL", "http://127.0.0.1:9"),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{}: {stderr}", s.display());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["kind"], "Allocation", "{}", s.display());
        assert_eq!(v["metadata"]["annotations"]["lattice.dev/user"], "alice");
        // Same translation as the library's golden file.
        let want: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&golden).expect("golden")).expect("json");
        let want_spec = want
            .get("allocation")
            .map(|a| &a["spec"])
            .unwrap_or(&want["spec"]);
        assert_eq!(
            v["spec"]["resources"],
            want_spec["resources"],
            "{}",
            s.display()
        );
        for w in stderr.lines() {
            assert!(w.starts_with("Warning: "), "{}: {w}", s.display());
        }
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn server_bin() -> Option<std::path::PathBuf> {
    let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_lattice"));
    let p = exe.parent()?.join("lattice-server");
    p.is_file().then_some(p)
}

/// `lattice up --agents 0 --detach` against the real server binary, then `lattice down`.
/// Skipped when lattice-server has not been built (`cargo build -p lattice-server`).
#[test]
fn up_detach_and_down_with_real_server() {
    let Some(_) = server_bin() else {
        eprintln!("skipped: build lattice-server first (cargo build -p lattice-server)");
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("up");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let manifests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/examples");
    let out = run_ok(
        lattice()
            .args([
                "up",
                "--agents",
                "0",
                "--detach",
                "--timeout",
                "60",
                "--api-addr",
                &addr,
                "--data-dir",
            ])
            .arg(&data)
            .arg("--manifests")
            .arg(&manifests),
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("export LATTICE_API_URL=http://{addr}")),
        "{stdout}"
    );
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("up.json")).expect("up.json"))
            .expect("json");
    let pid = state["processes"][0]["pid"].as_u64().expect("pid");
    let token = data.join("server/admin.token");
    let out = run_ok(
        lattice()
            .args([
                "admin",
                "vcluster",
                "list",
                "--api-url",
                &format!("http://{addr}"),
            ])
            .arg("--token-file")
            .arg(&token),
    );
    let list = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(list.contains("ml-training"), "examples applied: {list}");
    // A second `up` in the same directory refuses.
    let again = run_ok(
        lattice()
            .args(["up", "--agents", "0", "--detach", "--data-dir"])
            .arg(&data),
    );
    assert_eq!(again.status.code(), Some(1));
    let out = run_ok(lattice().args(["down", "--data-dir"]).arg(&data));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Stopped 1 process"));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists() || {
            let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            st.contains(") Z ")
        },
        "server stopped"
    );
    assert!(!data.join("up.json").exists());
}

/// Foreground `lattice up`: Ctrl-C stops what it started.
#[cfg(unix)]
#[test]
fn up_foreground_stops_on_ctrl_c() {
    let Some(_) = server_bin() else {
        eprintln!("skipped: build lattice-server first (cargo build -p lattice-server)");
        return;
    };
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("up");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = lattice()
        .args([
            "up",
            "--agents",
            "0",
            "--timeout",
            "60",
            "--api-addr",
            &addr,
            "--data-dir",
        ])
        .arg(&data)
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap_or_default();
        let done = l.starts_with("Press Ctrl-C");
        seen.push(l);
        if done {
            break;
        }
    }
    assert!(
        seen.iter().any(|l| l.starts_with("Lattice is up")),
        "{seen:?}"
    );
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("up.json")).expect("up.json"))
            .expect("json");
    let pid = state["processes"][0]["pid"].as_u64().expect("pid");
    assert!(Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill")
        .success());
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
    let rest: Vec<String> = lines.map(|l| l.unwrap_or_default()).collect();
    assert!(
        rest.iter().any(|l| l.starts_with("Stopped 1 processes")),
        "{rest:?}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists() || {
            let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            st.contains(") Z ")
        }
    );
}

#[test]
fn up_reports_missing_binaries() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = run_ok(
        lattice()
            .args(["up", "--agents", "2", "--detach", "--data-dir"])
            .arg(dir.path().join("up"))
            .env("LATTICE_AGENT_BIN", "/nonexistent/lattice-agent")
            .env("LATTICE_SERVER_BIN", env!("CARGO_BIN_EXE_lattice")),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("Error: start lattice-agent — LATTICE_AGENT_BIN=/nonexistent/lattice-agent does not exist"), "{err}");
    assert!(err.contains("cargo build --release"), "{err}");
}
