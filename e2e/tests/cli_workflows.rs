//! The `lattice` command line end to end, as a user drives it: the real binary (and the
//! Slurm aliases, loaded into a real bash) against `lattice-server --dev` and real
//! `lattice-agent` processes running real processes; `lattice up`/`down` starting the
//! real binaries themselves.
//!
//! Every command runs with a private `HOME`, `USER=tester` and only `LATTICE_API_URL` /
//! `LATTICE_TOKEN` (or `LATTICE_TOKEN_FILE`) set. Waits poll with deadlines and dump the
//! processes' logs on failure; timing checks use timestamps the jobs write themselves.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lattice_e2e::{bin, free_port, pid_alive, Cluster};
use serde_json::{json, Value};

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The directory with the built binaries (`lattice`, `lattice-server`, `lattice-agent`).
fn bin_dir() -> PathBuf {
    bin("lattice").parent().expect("bin dir").to_path_buf()
}

/// What a finished (or killed) command left.
#[derive(Debug)]
struct Run {
    /// Exit code; `None` when it was killed (by us on timeout, or by a signal).
    code: Option<i32>,
    out: String,
    err: String,
    timed_out: bool,
}

impl Run {
    fn show(&self) -> String {
        format!(
            "exit {:?}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            if self.timed_out { " (timed out)" } else { "" },
            self.out,
            self.err
        )
    }
}

/// Runs `cmd` with no stdin, capturing both outputs; kills it after `limit`.
fn exec(mut cmd: Command, limit: Duration) -> Run {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = so.read_to_end(&mut b);
        b
    });
    let t_err = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = se.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + limit;
    let (status, timed_out) = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break (Some(s), false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let s = child.wait().ok();
            break (s, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.and_then(|s| s.code()),
        out: String::from_utf8_lossy(&t_out.join().unwrap_or_default()).to_string(),
        err: String::from_utf8_lossy(&t_err.join().unwrap_or_default()).to_string(),
        timed_out,
    }
}

/// A user's environment: private HOME, a fixed USER, nothing inherited that would change
/// what the CLI talks to.
fn user_env(cmd: &mut Command, home: &Path) {
    for var in [
        "LATTICE_API_URL",
        "LATTICE_TOKEN",
        "LATTICE_TOKEN_FILE",
        "LATTICE_TENANT",
        "LATTICE_VCLUSTER",
        "LATTICE_CONFIG",
        "LATTICE_COMPAT_CONFIG",
        "LATTICE_BIN",
        "LATTICE_SERVER_BIN",
        "LATTICE_AGENT_BIN",
        "XDG_CONFIG_HOME",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("HOME", home).env("USER", "tester");
}

/// The `lattice` binary pointed at one cluster (one this test started with [`Cluster`],
/// or one `lattice up --detach` started), with its own HOME and working directory.
struct Cli<'a> {
    url: String,
    token: String,
    /// The cluster's process logs, for failure messages.
    logs_fn: Box<dyn Fn() -> String + 'a>,
    home: PathBuf,
    work: PathBuf,
}

impl<'a> Cli<'a> {
    fn new(c: &'a Cluster) -> Cli<'a> {
        Cli::at(&c.dir, c.url(), c.token(), Box::new(|| c.logs()))
    }

    /// A user of the cluster at `url`, with HOME and working directory under `dir`.
    fn at(
        dir: &Path,
        url: String,
        token: String,
        logs_fn: Box<dyn Fn() -> String + 'a>,
    ) -> Cli<'a> {
        let home = dir.join("home");
        let work = dir.join("work");
        std::fs::create_dir_all(&home).expect("home");
        std::fs::create_dir_all(&work).expect("work");
        Cli {
            url,
            token,
            logs_fn,
            home,
            work,
        }
    }

    fn logs(&self) -> String {
        (self.logs_fn)()
    }

    fn env(&self, cmd: &mut Command) {
        user_env(cmd, &self.home);
        cmd.env("LATTICE_API_URL", &self.url)
            .env("LATTICE_TOKEN", &self.token)
            .current_dir(&self.work);
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("lattice"));
        cmd.args(args);
        self.env(&mut cmd);
        cmd
    }

    /// Runs `lattice ARGS`; a command still running after `limit` is a test failure.
    fn run_within(&self, args: &[&str], limit: Duration) -> Run {
        let r = exec(self.cmd(args), limit);
        if r.timed_out {
            panic!(
                "lattice {args:?} still running after {limit:?}:\n{}\n{}",
                r.show(),
                self.logs()
            );
        }
        r
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_within(args, Duration::from_secs(60))
    }

    /// Runs `lattice ARGS`, which must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let r = self.run(args);
        if r.code != Some(0) {
            panic!("lattice {args:?} failed:\n{}\n{}", r.show(), self.logs());
        }
        r.out
    }

    /// Runs a bash script after `eval "$(lattice compat-aliases)"` (with `lattice` on
    /// PATH), so `sbatch`, `squeue`, ... are the shell functions users get.
    fn slurm(&self, script: &str) -> Run {
        let mut cmd = Command::new("bash");
        cmd.arg("-c").arg(format!(
            "set -e\neval \"$(lattice compat-aliases)\"\n{script}"
        ));
        self.env(&mut cmd);
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", bin_dir().display()));
        let r = exec(cmd, Duration::from_secs(60));
        if r.timed_out {
            panic!(
                "bash script timed out:\n{script}\n{}\n{}",
                r.show(),
                self.logs()
            );
        }
        r
    }

    /// Like [`slurm`](Self::slurm), but the script must succeed; returns its stdout.
    fn slurm_ok(&self, script: &str) -> String {
        let r = self.slurm(script);
        if r.code != Some(0) {
            panic!(
                "bash script failed:\n{script}\n{}\n{}",
                r.show(),
                self.logs()
            );
        }
        r.out
    }

    /// `lattice status ID -o json`.
    fn alloc(&self, id: &str) -> Value {
        let out = self.ok(&["status", id, "-o", "json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status {id} -o json: {e}\n{out}"))
    }

    /// Polls `f` every 100 ms until it returns `Some`, failing after `limit`.
    fn wait<T>(&self, what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = f() {
                return v;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {limit:?} waiting for {what}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until allocation `id` satisfies `pred` (checked on `status -o json`).
    fn wait_alloc(
        &self,
        id: &str,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let a = self.alloc(id);
            if pred(&a) {
                return a;
            }
            if Instant::now() > deadline {
                panic!(
                    "{id}: timed out after {limit:?} waiting for {what}; status {}\n{}",
                    a["status"],
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_phase(&self, id: &str, want: &str, limit: Duration) -> Value {
        self.wait_alloc(id, want, limit, |a| phase(a) == want)
    }

    fn wait_terminal(&self, id: &str) -> Value {
        self.wait_alloc(id, "a terminal phase", Duration::from_secs(90), |a| {
            matches!(phase(a), "Completed" | "Failed" | "Cancelled")
        })
    }

    /// Waits for `n` Ready nodes, as `lattice nodes -o json` shows them.
    fn wait_nodes_ready(&self, n: usize) {
        self.wait(&format!("{n} Ready nodes"), Duration::from_secs(60), || {
            let r = self.run(&["nodes", "-o", "json"]);
            let v: Value = serde_json::from_str(&r.out).ok()?;
            let ready = v["items"]
                .as_array()?
                .iter()
                .filter(|n| n["status"]["state"] == "Ready")
                .count();
            (ready >= n).then_some(())
        })
    }

    /// `lattice submit ARGS` → the ID from `Submitted allocation <id>`.
    fn submit(&self, args: &[&str]) -> String {
        let mut full = vec!["submit"];
        full.extend_from_slice(args);
        let out = self.ok(&full);
        submitted_id(&out)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.work.join(name);
        std::fs::write(&p, text).expect("write file");
        p
    }
}

fn submitted_id(out: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.starts_with("Submitted allocation "))
        .unwrap_or_else(|| panic!("no `Submitted allocation <id>` line in:\n{out}"));
    let id = line["Submitted allocation ".len()..].trim().to_string();
    assert!(
        !id.is_empty() && !id.contains(char::is_whitespace),
        "bad id in {line:?}"
    );
    id
}

fn phase(a: &Value) -> &str {
    a["status"]["phase"].as_str().unwrap_or("Pending")
}

/// The table row that starts with `id` (split on whitespace).
fn row<'t>(table: &'t str, id: &str) -> Option<Vec<&'t str>> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&id))
}

/// A float timestamp (`date +%s.%N`) from a marker file.
fn stamp(p: &Path) -> f64 {
    let t = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    t.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {t:?}: {e}", p.display()))
}

fn read_pid(p: &Path) -> Option<i32> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

#[test]
fn submit_status_watch_and_logs() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, &[], &[]);
    let cli = Cli::new(&c);
    cli.wait_nodes_ready(2);

    // A command after `--`: entrypoint and args exactly as given, no re-quoting.
    let id = cli.submit(&["--", "/bin/sh", "-c", r#"echo "a b" "c\"d"; exit 0"#]);
    let st = cli.ok(&["status", &id]);
    let cells = row(&st, &id).unwrap_or_else(|| panic!("status does not list {id}:\n{st}"));
    assert!(
        ["Pending", "Staging", "Running", "Completed"].contains(&cells[2]),
        "{st}"
    );
    assert!(st.starts_with("ID "), "status has a header:\n{st}");
    // `watch` prints a line per change and ends (0) once the allocation Completed.
    let w = cli.run_within(&["watch", &id], Duration::from_secs(90));
    assert_eq!(w.code, Some(0), "watch {id}:\n{}", w.show());
    let last = w.out.lines().last().unwrap_or_default();
    assert!(
        last.contains(&id) && last.contains("Completed") && last.contains("exit code: 0"),
        "last watch line: {last:?}\n{}",
        w.show()
    );
    assert_eq!(cli.ok(&["logs", &id]), "a b c\"d\n");
    let st = cli.ok(&["status", &id]);
    assert_eq!(row(&st, &id).map(|c| c[2]), Some("Completed"), "{st}");

    // `logs --follow` right after submitting: waits for the start, then streams lines
    // as the job prints them (one per 200 ms for 2 s) and ends when the job ends.
    let id = cli.submit(&[
        "--",
        "/bin/sh",
        "-c",
        "i=0; while [ $i -lt 10 ]; do echo tick-$i; i=$((i+1)); sleep 0.2; done; echo done >&2",
    ]);
    let mut follow = cli.cmd(&["logs", &id, "--follow"]);
    follow
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = follow.spawn().expect("spawn logs --follow");
    let stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut lines: Vec<(Instant, String)> = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => lines.push(l),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!(
                        "logs --follow did not end; lines so far {lines:?}\n{}",
                        c.logs()
                    );
                }
            }
        }
    }
    let eof = Instant::now();
    let _ = reader.join();
    let status = child.wait().expect("wait logs --follow");
    let follow_err = err_reader.join().unwrap_or_default();
    let text: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    let mut want: Vec<String> = (0..10).map(|i| format!("tick-{i}")).collect();
    want.push("done".into());
    assert_eq!(text, want, "stderr: {follow_err}");
    assert!(
        status.success(),
        "logs --follow: {status}; stderr: {follow_err}"
    );
    assert!(
        !follow_err.contains("Error"),
        "logs --follow stderr: {follow_err}"
    );
    // Streamed, not delivered in one piece at the end: the job prints for ~2 s, so the
    // first line arrives well before the last (allow for a late start on a loaded
    // machine: whatever was printed before the stream opened comes at once).
    let first = lines[0].0;
    let end = lines[lines.len() - 1].0;
    assert!(
        end.duration_since(first) >= Duration::from_millis(800),
        "the first line arrived only {:?} before the job's last line",
        end.duration_since(first)
    );
    // ... and it ended with the job, not much later.
    assert!(
        eof.duration_since(end) < Duration::from_secs(15),
        "logs --follow lingered {:?} after the last line",
        eof.duration_since(end)
    );
    let done = cli.wait_terminal(&id);
    assert_eq!(phase(&done), "Completed", "{}", done["status"]);
    assert_eq!(cli.ok(&["logs", &id, "--stderr"]), "done\n");
    assert_eq!(cli.ok(&["logs", &id, "--tail=3"]), "tick-8\ntick-9\ndone\n");
    assert_eq!(
        cli.ok(&["logs", &id, "--stdout", "--tail=2"]),
        "tick-8\ntick-9\n"
    );
    let json = cli.ok(&["logs", &id, "--tail=1", "-o", "json"]);
    let v: Value = serde_json::from_str(json.trim()).expect("a JSON line");
    assert_eq!(v["line"], "done");

    // An allocation that cannot start (3 nodes on a 2-node cluster): plain `logs` says it
    // has not started (not "no log endpoint"), and after a cancel it says it never ran.
    let id = cli.submit(&["--nodes=3", "--", "/bin/true"]);
    let r = cli.run(&["logs", &id]);
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(
        r.err.contains("has not started yet") && r.err.contains("--follow"),
        "{}",
        r.show()
    );
    let out = cli.ok(&["cancel", &id]);
    assert!(
        out.contains(&format!("Cancel requested for allocation {id}")),
        "{out}"
    );
    cli.wait_phase(&id, "Cancelled", Duration::from_secs(30));
    let r = cli.run(&["logs", &id, "--follow"]);
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(r.err.contains("Cancelled"), "{}", r.show());
}

#[test]
fn batch_scripts_with_sbatch_directives() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, &[], &[]);
    let cli = Cli::new(&c);
    cli.wait_nodes_ready(2);
    // `#!/bin/bash`: run as a script through its shebang (BASH_VERSION is set by bash,
    // not by /bin/sh where that is dash); two directives Lattice ignores with a warning.
    let script = |code: i32| {
        format!(
            "#!/bin/bash\n\
             #SBATCH --job-name=scripted\n\
             #SBATCH --time=00:10:00\n\
             #SBATCH --mem=64G\n\
             #SBATCH --mail-type=END\n\
             echo \"shell=${{BASH_VERSION:+bash}}\"\n\
             echo \"args=$#\"\n\
             exit {code}\n"
        )
    };
    cli.write("job.sh", &script(0));
    cli.write("fail.sh", &script(3));

    let r = cli.run(&["submit", "job.sh"]);
    assert_eq!(r.code, Some(0), "{}", r.show());
    assert!(
        r.err.contains(
            "Warning: #SBATCH --mem=64G ignored (Lattice uses full-node scheduling, memory is not constrainable)"
        ),
        "{}",
        r.show()
    );
    assert!(
        r.err
            .contains("Warning: #SBATCH --mail-type=END ignored (use `lattice watch` for event notifications)"),
        "{}",
        r.show()
    );
    let ok_id = submitted_id(&r.out);
    assert!(ok_id.starts_with("scripted-"), "{ok_id}");
    let done = cli.wait_terminal(&ok_id);
    assert_eq!(phase(&done), "Completed", "{}", done["status"]);
    assert_eq!(cli.ok(&["logs", &ok_id]), "shell=bash\nargs=0\n");
    let st = cli.ok(&["status", &ok_id]);
    let cells = row(&st, &ok_id).unwrap_or_else(|| panic!("{st}"));
    assert_eq!(
        &cells[1..5],
        ["scripted", "Completed", "1", "00:10:00"],
        "{st}"
    );

    // exit 3: Failed, exit code 3 in watch, status -v and history.
    let r = cli.run(&["submit", "fail.sh"]);
    assert_eq!(r.code, Some(0), "{}", r.show());
    let fail_id = submitted_id(&r.out);
    let w = cli.run_within(&["watch", &fail_id], Duration::from_secs(90));
    assert_eq!(
        w.code,
        Some(1),
        "watch of a failing job exits 1:\n{}",
        w.show()
    );
    let last = w.out.lines().last().unwrap_or_default();
    assert!(
        last.contains("Failed") && last.contains("exit code: 3"),
        "{last:?}"
    );
    let a = cli.alloc(&fail_id);
    assert_eq!(phase(&a), "Failed");
    assert_eq!(a["status"]["exitCode"], 3, "{}", a["status"]);
    let st = cli.ok(&["status", &fail_id, "-v"]);
    let line = st
        .lines()
        .find(|l| l.starts_with(&fail_id))
        .unwrap_or_else(|| panic!("{st}"));
    assert!(
        line.contains("Failed") && line.contains("exited with code 3"),
        "{st}"
    );
    let h = cli.ok(&["history"]);
    let cells = row(&h, &fail_id).unwrap_or_else(|| panic!("history lacks {fail_id}:\n{h}"));
    assert_eq!(cells[2], "Failed", "{h}");
    assert_eq!(cells.last(), Some(&"3"), "EXIT column:\n{h}");
    let cells = row(&h, &ok_id).unwrap_or_else(|| panic!("history lacks {ok_id}:\n{h}"));
    assert_eq!(
        (cells[2], *cells.last().unwrap()),
        ("Completed", "0"),
        "{h}"
    );
    let h = cli.ok(&["history", "--state=failed", "-o", "name"]);
    assert_eq!(h.trim(), fail_id, "history --state=failed");
}

#[test]
fn slurm_aliases_sbatch_squeue_scancel_sacct_dependencies_arrays() {
    let dir = tempfile::tempdir().unwrap();
    // A cluster from `lattice up --detach` (stopped by `lattice down` when `up` drops),
    // with four nodes, so that a concurrency limit of 2 is the scheduler's doing, not the
    // cluster's size. Its agents run without `--slurm-env`: the SLURM_* variables come
    // from the site's lattice-compat.yaml (`set_slurm_env: true`), through the
    // `lattice.dev/set-slurm-env` annotation `sbatch` writes on each job.
    let up = up_detached(dir.path(), 4);
    let cli = Cli::at(
        dir.path(),
        up.url.clone(),
        up.token.clone(),
        Box::new(|| logs_of(&up.data)),
    );
    cli.wait_nodes_ready(4);
    cli.write(
        "lattice-compat.yaml",
        "# site mapping\nset_slurm_env: true\n",
    );
    cli.write("off.yaml", "set_slurm_env: false\n");
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let m = marks.display().to_string();

    // --- sbatch / squeue / scancel / sacct on a long job.
    cli.write(
        "long.sh",
        &format!("#!/bin/sh\n#SBATCH --job-name=long\necho $$ > {m}/long.pid\nexec sleep 300\n"),
    );
    let out = cli.slurm_ok("jid=$(sbatch --parsable long.sh)\necho \"$jid\"\nsqueue -h -o %i");
    let mut lines = out.lines();
    let jid = lines.next().unwrap_or_default().trim().to_string();
    assert!(
        jid.starts_with("long-"),
        "sbatch --parsable printed {out:?}"
    );
    assert!(
        lines.any(|l| l.trim() == jid),
        "squeue -h -o %i does not list {jid}:\n{out}"
    );
    cli.wait_phase(&jid, "Running", Duration::from_secs(60));
    let pid = cli.wait("the job's pid file", Duration::from_secs(30), || {
        read_pid(&marks.join("long.pid"))
    });
    assert!(pid_alive(pid));
    let out = cli.slurm_ok(&format!("squeue -h -o '%i %t'\nscancel {jid}"));
    assert!(
        out.lines().any(|l| l.trim() == format!("{jid} R")),
        "squeue shows it running:\n{out}"
    );
    assert!(
        !out.contains("Cancel"),
        "scancel is silent, printed:\n{out}"
    );
    cli.wait_phase(&jid, "Cancelled", Duration::from_secs(60));
    cli.wait(
        "the cancelled job's process to exit",
        Duration::from_secs(30),
        || (!pid_alive(pid)).then_some(()),
    );
    let out = cli.slurm_ok(&format!(
        "sacct -j {jid}\nsacct -j {jid} -n -P --format=JobID,State,ExitCode\necho @@@\nsqueue -h -o %i"
    ));
    let (sacct, queue) = out.split_once("@@@\n").expect("marker");
    assert!(sacct.contains("CANCELLED"), "sacct:\n{sacct}");
    assert!(
        sacct
            .lines()
            .any(|l| l.starts_with(&format!("{jid}|CANCELLED|"))),
        "sacct -P:\n{sacct}"
    );
    assert!(
        !queue.lines().any(|l| l.trim() == jid),
        "squeue still lists the cancelled job:\n{queue}"
    );

    // --- afterok dependency: the second job starts only once the first has ended.
    cli.write(
        "first.sh",
        &format!(
            "#!/bin/sh\n#SBATCH --job-name=first\n\
             date +%s.%N > {m}/first.start\n\
             echo \"${{SLURM_JOB_ID:-unset}} ${{SLURM_JOBID:-unset}} ${{SLURM_NNODES:-unset}} ${{SLURM_JOB_NAME:-unset}}\" > {m}/first.env\n\
             sleep 3\ndate +%s.%N > {m}/first.end\n"
        ),
    );
    cli.write(
        "second.sh",
        &format!("#!/bin/sh\n#SBATCH --job-name=second\ndate +%s.%N > {m}/second.start\n"),
    );
    // A control job submitted with a site file that leaves SLURM_* off: the agents do
    // not set them by themselves.
    cli.write(
        "plain.sh",
        &format!(
            "#!/bin/sh\n#SBATCH --job-name=plain\n\
             echo \"${{SLURM_JOB_ID:-unset}} ${{SLURM_NNODES:-unset}} ${{LATTICE_ALLOC_ID:-unset}}\" > {m}/plain.env\n"
        ),
    );
    let out = cli.slurm_ok(
        "a=$(sbatch --parsable first.sh)\n\
         b=$(sbatch --parsable --dependency=afterok:$a second.sh)\n\
         p=$(LATTICE_COMPAT_CONFIG=off.yaml sbatch --parsable plain.sh)\n\
         echo \"$a $b $p\"\n\
         squeue -h -o '%i %t'",
    );
    let (a, b, p) = match out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()[..]
    {
        [a, b, p] => (a.to_string(), b.to_string(), p.to_string()),
        _ => panic!("{out}"),
    };
    assert!(
        out.lines().any(|l| l.trim() == format!("{b} PD")),
        "the dependent job is pending while the first runs:\n{out}"
    );
    let second = cli.wait_terminal(&b);
    assert_eq!(phase(&second), "Completed", "{}", second["status"]);
    assert_eq!(phase(&cli.alloc(&a)), "Completed");
    let first_end = stamp(&marks.join("first.end"));
    let second_start = stamp(&marks.join("second.start"));
    assert!(
        second_start >= first_end,
        "the afterok job started at {second_start}, before its dependency ended at {first_end}"
    );
    let out = cli.slurm_ok(&format!(
        "sacct -j {a},{b} -n -P --format=JobID,State,ExitCode"
    ));
    for id in [&a, &b] {
        assert!(
            out.lines().any(|l| l == format!("{id}|COMPLETED|0:0|")),
            "sacct:\n{out}"
        );
    }
    // SLURM_* came from the annotation the site file had `sbatch` write.
    let ann =
        |id: &str| cli.alloc(id)["metadata"]["annotations"]["lattice.dev/set-slurm-env"].clone();
    assert_eq!(ann(&a), "true", "{}", cli.alloc(&a)["metadata"]);
    let env = std::fs::read_to_string(marks.join("first.env")).expect("first.env");
    assert_eq!(
        env.trim(),
        format!("{a} {a} 1 first"),
        "SLURM_JOB_ID SLURM_JOBID SLURM_NNODES SLURM_JOB_NAME of {a}"
    );
    let plain = cli.wait_terminal(&p);
    assert_eq!(phase(&plain), "Completed", "{}", plain["status"]);
    assert_eq!(ann(&p), Value::Null, "{}", plain["metadata"]);
    let env = std::fs::read_to_string(marks.join("plain.env")).expect("plain.env");
    assert_eq!(
        env.trim(),
        format!("unset unset {p}"),
        "SLURM_JOB_ID SLURM_NNODES LATTICE_ALLOC_ID of {p}, submitted with set_slurm_env: false"
    );

    // --- a job array: 6 elements, at most 2 at a time, with their indices.
    cli.write(
        "sweep.sh",
        &format!(
            "#!/bin/sh\n#SBATCH --job-name=sweep\n\
             s=$(date +%s.%N)\nsleep 1\n\
             echo \"$s $(date +%s.%N) ${{SLURM_ARRAY_TASK_ID:-unset}} ${{LATTICE_TASK_INDEX:-unset}} ${{SLURM_ARRAY_JOB_ID:-unset}}\" \
             > {m}/task.${{LATTICE_TASK_INDEX:-none}}\n"
        ),
    );
    let out = cli.slurm_ok("sbatch --parsable --array=0-5%2 sweep.sh");
    let arr = out.trim().to_string();
    assert!(arr.starts_with("sweep-"), "{out}");
    let done = cli.wait_alloc(&arr, "the array to end", Duration::from_secs(120), |a| {
        matches!(phase(a), "Completed" | "Failed" | "Cancelled")
    });
    assert_eq!(phase(&done), "Completed", "{}", done["status"]);
    let mut spans: Vec<(f64, f64)> = Vec::new();
    for i in 0..6 {
        let p = marks.join(format!("task.{i}"));
        let t = std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("array element {i} left no marker ({e})\n{}", cli.logs()));
        let f: Vec<&str> = t.split_whitespace().collect();
        assert_eq!(f.len(), 5, "{t:?}");
        assert_eq!(
            f[2],
            i.to_string(),
            "SLURM_ARRAY_TASK_ID of element {i}: {t:?}"
        );
        assert_eq!(
            f[3],
            i.to_string(),
            "LATTICE_TASK_INDEX of element {i}: {t:?}"
        );
        assert_eq!(f[4], arr, "SLURM_ARRAY_JOB_ID of element {i}: {t:?}");
        spans.push((f[0].parse().unwrap(), f[1].parse().unwrap()));
    }
    let extra: Vec<_> = std::fs::read_dir(&marks)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("task.") && !["0", "1", "2", "3", "4", "5"].contains(&&n[5..]))
        .collect();
    assert!(extra.is_empty(), "unexpected markers {extra:?}");
    // At any element's start, at most 2 elements (itself included) were running.
    let most = spans
        .iter()
        .map(|(s, _)| spans.iter().filter(|(s2, e2)| s2 <= s && s < e2).count())
        .max()
        .unwrap_or(0);
    assert!(
        most <= 2,
        "{most} array elements ran at once with --array=0-5%2: {spans:?}"
    );
    let out = cli.ok(&["status", "--tasks", "--state=completed", "-o", "name"]);
    for i in 0..6 {
        assert!(
            out.lines().any(|l| l == format!("{arr}-{i}")),
            "status --tasks lacks element {i}:\n{out}"
        );
    }
}

const WORKFLOW: &str = r#"# The seed's "DAG Workflows" example, with commands that run anywhere.
name: pipeline
allocations:
  - name: preprocess
    entrypoint: "/bin/sh -c 'echo preprocessing; sleep 1'"
    nodes: 1
    walltime: "10m"
  - name: train
    entrypoint: "/bin/sh -c 'echo training on $LATTICE_NODELIST; sleep 1'"
    nodes: 2
    walltime: "10m"
    depends_on:
      - preprocess: success
  - name: evaluate
    entrypoint: "/bin/sh -c 'echo evaluating'"
    nodes: 1
    walltime: "10m"
    depends_on:
      - train: success
  - name: notify-failure
    entrypoint: "/bin/sh -c 'echo training failed >&2'"
    nodes: 1
    walltime: "10m"
    depends_on:
      - train: failure
"#;

#[test]
fn dag_submit_status_list_and_cancel() {
    let dir = tempfile::tempdir().unwrap();
    // A server whose flag admits 3 tasks per Dag; the 4-task workflow needs the
    // cluster setting raised.
    let c = Cluster::start(dir.path(), 2, &["--max-dag-size", "3"], &[]);
    let cli = Cli::new(&c);
    cli.wait_nodes_ready(2);
    cli.write("workflow.yaml", WORKFLOW);
    // `lattice get dag -w`, started before the submission: rows as the Dag changes.
    let mut watch = cli.cmd(&["get", "dag", "-w"]);
    watch
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut watch = watch.spawn().expect("spawn get dag -w");
    let watch_out = watch.stdout.take().expect("stdout");
    let (tx, watch_rows) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(watch_out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The Dag size limit is a cluster setting an administrator changes at run time.
    let max = ["admin", "config", "get", "scheduling.max_dag_size"];
    assert_eq!(cli.ok(&max), "3\n");
    let r = cli.run(&["dag", "submit", "workflow.yaml"]);
    assert_ne!(r.code, Some(0), "{}", r.show());
    assert!(r.err.contains("(4 allocations, limit: 3)"), "{}", r.show());
    assert!(
        r.err
            .contains("lattice admin config set scheduling.max_dag_size=N"),
        "{}",
        r.show()
    );
    let r = cli.run(&["admin", "config", "set", "scheduling.max_dag_size=0"]);
    assert_ne!(r.code, Some(0), "{}", r.show());
    assert!(
        r.err.contains("whole number of tasks from 1 to 100000"),
        "{}",
        r.show()
    );
    assert_eq!(
        cli.ok(&["admin", "config", "set", "scheduling.max_dag_size=5"]),
        "Set scheduling.max_dag_size = 5 for the whole cluster\n"
    );
    let table = cli.ok(&["admin", "config", "cluster"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("scheduling.max_dag_size")
                && l.contains(" 5 ")
                && l.contains("cluster")),
        "{table}"
    );
    // Admitted above the server's flag, and run to the end by the DAG controller (below).
    let out = cli.ok(&["dag", "submit", "workflow.yaml"]);
    assert_eq!(out.trim(), "Submitted DAG pipeline with 4 allocations");

    let dag_phase = |name: &str| -> String {
        let v: Value =
            serde_json::from_str(&cli.ok(&["dag", "status", name, "-o", "json"])).expect("json");
        v["status"]["phase"]
            .as_str()
            .unwrap_or("Pending")
            .to_string()
    };
    cli.wait("DAG pipeline to end", Duration::from_secs(120), || {
        let p = dag_phase("pipeline");
        ["Completed", "Failed", "Cancelled"]
            .contains(&p.as_str())
            .then_some(())
    });
    // The watch printed the Dag as it went, ending with its Completed row.
    let mut rows: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !rows
        .iter()
        .any(|r| r.starts_with("pipeline ") && r.contains("Completed"))
    {
        match watch_rows.recv_timeout(Duration::from_millis(200)) {
            Ok(r) => rows.push(r),
            Err(_) if Instant::now() < deadline => {}
            Err(e) => {
                let _ = watch.kill();
                panic!("get dag -w never showed pipeline Completed ({e}); rows: {rows:#?}");
            }
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(rows[0].starts_with("NAME "), "a header first: {rows:#?}");
    let mine: Vec<&String> = rows.iter().filter(|r| r.starts_with("pipeline ")).collect();
    assert!(mine.len() >= 2, "a row per change: {rows:#?}");
    assert!(!mine[0].contains("Completed"), "{rows:#?}");
    assert_eq!(
        cli.ok(&["admin", "config", "unset", "scheduling.max_dag_size"]),
        "Reset scheduling.max_dag_size: 3 (the server's flag)\n"
    );
    assert_eq!(cli.ok(&max), "3\n");
    // `dag status -o yaml` is the object.
    let y: serde_yaml::Value =
        serde_yaml::from_str(&cli.ok(&["dag", "status", "pipeline", "-o", "yaml"])).expect("yaml");
    assert_eq!(y["kind"].as_str(), Some("Dag"));
    assert_eq!(y["status"]["phase"].as_str(), Some("Completed"));
    let graph = cli.ok(&["dag", "status", "pipeline", "--graph"]);
    // The seed's arrow view; the failure handler branches off below `train`.
    let top = "preprocess [Completed] → train [Completed] → evaluate [Completed]";
    let col = "preprocess [Completed] → train [Completed]".chars().count();
    assert_eq!(
        graph,
        format!("{top}\n{}↘ notify-failure [Skipped]\n", " ".repeat(col + 1)),
        "graph:\n{graph}"
    );
    let st = cli.ok(&["dag", "status", "pipeline"]);
    assert!(st.contains("State:     Completed\n"), "{st}");
    assert!(st.contains("Progress:  3/4 completed"), "{st}");
    let list = cli.ok(&["dag", "list"]);
    assert!(list.starts_with("ID "), "{list}");
    assert_eq!(
        row(&list, "pipeline").map(|r| r[1..4].to_vec()),
        Some(vec!["Completed", "4", "3/4"]),
        "{list}"
    );
    // train ran on both nodes, and its steps' output is there.
    let logs = cli.ok(&["logs", "pipeline-train"]);
    assert_eq!(logs.lines().count(), 2, "{logs}");
    assert!(logs.lines().all(|l| l.contains("| training on ")), "{logs}");

    // Cancel a DAG while a step runs: the DAG ends Cancelled, the running step's
    // allocation is Cancelled and its process is gone, the waiting step never runs.
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    cli.write(
        "long.yaml",
        &format!(
            "name: longdag\n\
             allocations:\n\
             \x20 - name: first\n\
             \x20   entrypoint: \"/bin/sh -c 'echo $$ > {m}/first.pid; exec sleep 300'\"\n\
             \x20   walltime: \"10m\"\n\
             \x20 - name: second\n\
             \x20   entrypoint: \"/bin/sh -c 'touch {m}/second.ran'\"\n\
             \x20   depends_on:\n\
             \x20     - first: success\n",
            m = marks.display()
        ),
    );
    let out = cli.ok(&["dag", "submit", "long.yaml"]);
    assert_eq!(out.trim(), "Submitted DAG longdag with 2 allocations");
    let pid = cli.wait("the first step to run", Duration::from_secs(60), || {
        read_pid(&marks.join("first.pid"))
    });
    cli.wait("the first step Running", Duration::from_secs(30), || {
        let v: Value =
            serde_json::from_str(&cli.ok(&["dag", "status", "longdag", "-o", "json"])).ok()?;
        (v["status"]["tasks"]["first"]["phase"] == "Running").then_some(())
    });
    let out = cli.ok(&["dag", "cancel", "longdag"]);
    assert!(out.starts_with("Cancel requested for DAG longdag"), "{out}");
    cli.wait("DAG longdag Cancelled", Duration::from_secs(60), || {
        (dag_phase("longdag") == "Cancelled").then_some(())
    });
    let v: Value =
        serde_json::from_str(&cli.ok(&["dag", "status", "longdag", "-o", "json"])).unwrap();
    let first_alloc = v["status"]["tasks"]["first"]["allocation"]
        .as_str()
        .unwrap_or("longdag-first")
        .to_string();
    assert_eq!(
        v["status"]["tasks"]["second"]["phase"], "Cancelled",
        "{}",
        v["status"]
    );
    cli.wait_phase(&first_alloc, "Cancelled", Duration::from_secs(60));
    cli.wait(
        "the cancelled step's process to exit",
        Duration::from_secs(30),
        || (!pid_alive(pid)).then_some(()),
    );
    let st = cli.ok(&["dag", "status", "longdag"]);
    assert!(st.contains("State:     Cancelled\n"), "{st}");
    let graph = cli.ok(&["dag", "status", "longdag", "--graph"]);
    assert_eq!(graph, "first [Cancelled] → second [Cancelled]\n");
    let list = cli.ok(&["dag", "list"]);
    assert_eq!(
        row(&list, "longdag").map(|r| r[1..4].to_vec()),
        Some(vec!["Cancelled", "2", "0/2"]),
        "{list}"
    );
    let out = cli.ok(&["dag", "cancel", "longdag"]);
    assert_eq!(
        out.trim(),
        "DAG longdag already Cancelled; nothing to cancel"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(!marks.join("second.ran").exists(), "the dependent step ran");

    // Both forms through both commands: the short form with `lattice apply -f`, the full
    // manifest with `lattice dag submit`. The task group's template carries `${INDEX}`
    // (the seed's sweep example), and its 2 elements count towards the limit of 3.
    cli.write(
        "short.yaml",
        &format!(
            "name: short-form\n\
             allocations:\n\
             \x20 - name: sweep\n\
             \x20   entrypoint: \"/bin/sh -c 'touch {m}/sweep-${{INDEX}}'\"\n\
             \x20   task_group: \"0-1\"\n\
             \x20   walltime: \"10m\"\n\
             \x20 - name: gather\n\
             \x20   entrypoint: \"/bin/sh -c 'ls {m} > {m}/gathered'\"\n\
             \x20   depends_on:\n\
             \x20     - sweep: success\n",
            m = marks.display()
        ),
    );
    let out = cli.ok(&["apply", "-f", "short.yaml"]);
    assert!(out.contains("short-form"), "{out}");
    cli.write(
        "full.yaml",
        &format!(
            "apiVersion: lattice.dev/v1alpha1\n\
             kind: Dag\n\
             metadata:\n\
             \x20 name: full-form\n\
             spec:\n\
             \x20 allocations:\n\
             \x20 - name: one\n\
             \x20   spec:\n\
             \x20     entrypoint: \"/bin/sh -c 'touch {m}/full-one'\"\n\
             \x20     lifecycle: {{walltime: 10m}}\n\
             \x20 - name: two\n\
             \x20   dependsOn: [{{ref: one, condition: success}}]\n\
             \x20   spec:\n\
             \x20     entrypoint: \"/bin/sh -c 'touch {m}/full-two'\"\n\
             \x20     lifecycle: {{walltime: 10m}}\n",
            m = marks.display()
        ),
    );
    let out = cli.ok(&["dag", "submit", "full.yaml"]);
    assert_eq!(out.trim(), "Submitted DAG full-form with 2 allocations");
    for name in ["short-form", "full-form"] {
        cli.wait(
            &format!("DAG {name} Completed"),
            Duration::from_secs(90),
            || (dag_phase(name) == "Completed").then_some(()),
        );
    }
    let gathered = std::fs::read_to_string(marks.join("gathered")).unwrap_or_default();
    assert!(
        gathered.lines().any(|l| l == "sweep-0") && gathered.lines().any(|l| l == "sweep-1"),
        "the elements ran with their index before gather: {gathered:?}"
    );
    assert!(marks.join("full-one").exists() && marks.join("full-two").exists());
    let v: Value =
        serde_json::from_str(&cli.ok(&["dag", "status", "short-form", "-o", "json"])).unwrap();
    assert_eq!(
        v["status"]["tasks"]["sweep"]["elements"],
        json!({"total": 2, "waiting": 0, "pending": 0, "running": 0, "completed": 2,
               "failed": 0, "cancelled": 0}),
        "{}",
        v["status"]
    );
    assert_eq!(v["status"]["counts"]["completed"], 2, "{}", v["status"]);
}

#[test]
fn nodes_drain_and_undrain() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, &[], &[]);
    let cli = Cli::new(&c);
    cli.wait_nodes_ready(2);
    let nodes = cli.ok(&["nodes"]);
    assert!(nodes.starts_with("NODE "), "{nodes}");
    for n in ["node-01", "node-02"] {
        assert_eq!(row(&nodes, n).map(|r| r[1]), Some("Ready"), "{nodes}");
    }
    let node_state = |n: &str| -> String {
        let v: Value = serde_json::from_str(&cli.ok(&["nodes", n, "-o", "json"])).expect("json");
        v["status"]["state"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let wait_state = |n: &str, want: &str| {
        cli.wait(&format!("{n} {want}"), Duration::from_secs(30), || {
            (node_state(n) == want).then_some(())
        })
    };

    // An idle node drains at once.
    let out = cli.ok(&["node", "drain", "node-01", "--reason", "maintenance"]);
    assert!(
        out.starts_with("Drain requested for node node-01 (reason: maintenance)"),
        "{out}"
    );
    wait_state("node-01", "Drained");
    let nodes = cli.ok(&["nodes"]);
    assert_eq!(
        row(&nodes, "node-01").map(|r| r[1]),
        Some("Drained"),
        "{nodes}"
    );
    let out = cli.ok(&["nodes", "--state=drained", "-o", "name"]);
    assert_eq!(out.trim(), "node-01");
    let out = cli.ok(&["node", "undrain", "node-01"]);
    assert!(out.starts_with("Undrained node node-01"), "{out}");
    wait_state("node-01", "Ready");

    // Undrain of a Ready node: refused with the seed's hint, non-zero exit.
    let r = cli.run(&["node", "undrain", "node-02"]);
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(
        r.err.contains("the node is Ready, not Drained")
            && r.err
                .contains("Undrain only works when the node is in Drained state"),
        "{}",
        r.show()
    );
    assert_eq!(node_state("node-02"), "Ready");

    // A node with running work stays Draining; undrain says to wait or cancel first.
    let id = cli.submit(&["--", "/bin/sleep", "300"]);
    let a = cli.wait_phase(&id, "Running", Duration::from_secs(60));
    let busy = a["status"]["assignedNodes"][0]
        .as_str()
        .expect("assigned node")
        .to_string();
    cli.ok(&["node", "drain", &busy]);
    wait_state(&busy, "Draining");
    let r = cli.run(&["node", "undrain", &busy]);
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(
        r.err.contains("Draining")
            && r.err
                .contains("wait for them to complete or cancel them first"),
        "{}",
        r.show()
    );
    cli.ok(&["cancel", &id]);
    cli.wait_phase(&id, "Cancelled", Duration::from_secs(60));
    wait_state(&busy, "Drained");
    cli.ok(&["node", "undrain", &busy]);
    wait_state(&busy, "Ready");
    // Unknown node: exit 3.
    let r = cli.run(&["node", "undrain", "node-99"]);
    assert_eq!(r.code, Some(3), "{}", r.show());
}

/// Runs `lattice down --data-dir DIR` when dropped (a failed test leaves nothing behind).
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if self.0.join("up.json").exists() {
            let mut cmd = Command::new(bin("lattice"));
            cmd.arg("down").arg("--data-dir").arg(&self.0);
            let _ = exec(cmd, Duration::from_secs(30));
        }
    }
}

/// `lattice up` as a user runs it: no LATTICE_* variables, PATH without the build
/// directory (the server and agent binaries are found next to `lattice`).
fn up_cmd(home: &Path, cwd: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("lattice"));
    cmd.args(args).current_dir(cwd);
    user_env(&mut cmd, home);
    cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    cmd
}

/// A cluster `lattice up --detach` started; `lattice down` stops it when this drops.
struct Up {
    data: PathBuf,
    url: String,
    token: String,
    _down: Down,
}

/// `lattice up --detach --agents N` with its data in `DIR/cluster`, run as a user with
/// HOME `DIR/home` from `DIR`; returns once it reports the cluster up.
fn up_detached(dir: &Path, agents: usize) -> Up {
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let data = dir.join("cluster");
    let down = Down(data.clone());
    let addr = format!("127.0.0.1:{}", free_port());
    let (data_s, n) = (data.display().to_string(), agents.to_string());
    let r = exec(
        up_cmd(
            &home,
            dir,
            &[
                "up",
                "--agents",
                &n,
                "--detach",
                "--data-dir",
                &data_s,
                "--api-addr",
                &addr,
                "--timeout",
                "120",
            ],
        ),
        Duration::from_secs(180),
    );
    assert_eq!(r.code, Some(0), "{}\n{}", r.show(), logs_of(&data));
    let up: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("up.json")).expect("up.json"))
            .expect("up.json is JSON");
    let url = up["api_url"].as_str().expect("api_url").to_string();
    assert_eq!(url, format!("http://{addr}"), "{up}");
    let token_file = up["token_file"].as_str().expect("token_file");
    let token = std::fs::read_to_string(token_file)
        .unwrap_or_else(|e| panic!("{token_file}: {e}"))
        .trim()
        .to_string();
    // The agents run with `lattice up`'s arguments only (no `--slurm-env`, say).
    let agent_pids: Vec<i64> = up["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("node-")))
        .filter_map(|p| p["pid"].as_i64())
        .collect();
    assert_eq!(agent_pids.len(), agents, "{up}");
    for pid in agent_pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<_> = cmdline
            .split(|b| *b == 0)
            .map(String::from_utf8_lossy)
            .collect();
        assert!(
            args.iter().any(|a| a == "--node-id") && !args.iter().any(|a| a.contains("slurm")),
            "agent {pid}: {args:?}"
        );
    }
    Up {
        data,
        url,
        token,
        _down: down,
    }
}

fn logs_of(data: &Path) -> String {
    let mut out = String::new();
    if let Ok(rd) = std::fs::read_dir(data.join("logs")) {
        let mut files: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            out.push_str(&format!(
                "\n--- {} ---\n{}",
                f.display(),
                std::fs::read_to_string(&f).unwrap_or_default()
            ));
        }
    }
    out
}

#[test]
fn up_detach_then_down() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let data = dir.path().join("cluster");
    let _down = Down(data.clone());
    let addr = format!("127.0.0.1:{}", free_port());
    let data_s = data.display().to_string();
    let r = exec(
        up_cmd(
            &home,
            dir.path(),
            &[
                "up",
                "--agents",
                "2",
                "--detach",
                "--data-dir",
                &data_s,
                "--api-addr",
                &addr,
                "--timeout",
                "120",
            ],
        ),
        Duration::from_secs(180),
    );
    assert_eq!(r.code, Some(0), "{}\n{}", r.show(), logs_of(&data));
    assert!(
        r.out.contains("Lattice is up: lattice-server and 2 agents"),
        "{}",
        r.show()
    );
    assert!(
        r.out.contains(&format!("API:    http://{addr}")),
        "{}",
        r.show()
    );
    let up: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("up.json")).expect("up.json"))
            .expect("up.json is JSON");
    let procs = up["processes"].as_array().expect("processes").clone();
    assert_eq!(procs.len(), 3, "{up}");
    for p in &procs {
        let b = p["binary"].as_str().unwrap_or_default();
        assert!(
            Path::new(b).parent() == Some(bin_dir().as_path())
                || Path::new(b).parent().map(|d| d.canonicalize().ok())
                    == Some(bin_dir().canonicalize().ok()),
            "{b} is not next to lattice in {}",
            bin_dir().display()
        );
    }
    let pids: Vec<i32> = procs
        .iter()
        .map(|p| p["pid"].as_i64().unwrap() as i32)
        .collect();
    assert!(pids.iter().all(|p| pid_alive(*p)), "{up}");

    // The detached cluster works: two Ready nodes, and a job runs to completion.
    let user = |args: &[&str]| {
        let mut cmd = up_cmd(&home, dir.path(), args);
        cmd.env("LATTICE_API_URL", format!("http://{addr}")).env(
            "LATTICE_TOKEN_FILE",
            data.join("server").join("admin.token"),
        );
        let r = exec(cmd, Duration::from_secs(90));
        assert!(
            r.code == Some(0),
            "lattice {args:?}:\n{}\n{}",
            r.show(),
            logs_of(&data)
        );
        r.out
    };
    let nodes = user(&["nodes", "--state=ready", "-o", "name"]);
    assert_eq!(nodes.lines().collect::<Vec<_>>(), ["node-01", "node-02"]);
    let out = user(&["submit", "--wait", "--", "/bin/echo", "hello from up"]);
    let id = submitted_id(&out);
    assert_eq!(user(&["logs", &id]), "hello from up\n");

    let r = exec(
        up_cmd(&home, dir.path(), &["down", "--data-dir", &data_s]),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "{}", r.show());
    assert!(
        r.out.starts_with("Stopped 3 processes from"),
        "{}",
        r.show()
    );
    assert!(!data.join("up.json").exists());
    let deadline = Instant::now() + Duration::from_secs(20);
    while pids.iter().any(|p| pid_alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "still running after down: {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Nothing left to stop.
    let r = exec(
        up_cmd(&home, dir.path(), &["down", "--data-dir", &data_s]),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(3), "{}", r.show());
}

#[test]
fn up_demo_runs_the_example_workflow() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let data = dir.path().join("demo");
    let _down = Down(data.clone());
    let addr = format!("127.0.0.1:{}", free_port());
    let data_s = data.display().to_string();
    // From the repository root, where manifests/examples/ is.
    let r = exec(
        up_cmd(
            &home,
            repo(),
            &[
                "up",
                "--demo",
                "--agents",
                "4",
                "--data-dir",
                &data_s,
                "--api-addr",
                &addr,
                "--timeout",
                "180",
            ],
        ),
        Duration::from_secs(420),
    );
    assert_eq!(r.code, Some(0), "{}\n{}", r.show(), logs_of(&data));
    assert!(
        r.out
            .contains("Submitted DAG training-pipeline with 4 allocations"),
        "{}",
        r.show()
    );
    assert!(
        r.out
            .contains("DAG training-pipeline Completed (3/4 completed)"),
        "{}",
        r.show()
    );
    assert!(
        r.out.contains("== notify-failure") && r.out.contains("Skipped"),
        "{}",
        r.show()
    );
    assert!(r.out.contains("training on node-"), "{}", r.show());
    // It stopped what it started.
    assert!(r.out.contains("Stopped 5 processes"), "{}", r.show());
    assert!(!data.join("up.json").exists());
}

/// `lattice attach`: a command or a terminal inside a running allocation, on the node
/// asked for (the first by default), with the run's environment, input forwarded and the
/// remote exit status; every attach is an `Attached` event; the session ends with the
/// allocation and is refused once it ended. `lattice session` without a command and
/// `srun --pty` open a terminal on the first node.
#[test]
fn attach_runs_commands_and_terminals_inside_running_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let up = up_detached(dir.path(), 2);
    let cli = Cli::at(
        dir.path(),
        up.url.clone(),
        up.token.clone(),
        Box::new(|| logs_of(&up.data)),
    );
    cli.wait_nodes_ready(2);
    let job = cli.submit(&["-N", "2", "--", "sleep", "300"]);
    let running = cli.wait_phase(&job, "Running", Duration::from_secs(60));
    let nodes: Vec<String> = running["status"]["assignedNodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(String::from))
        .collect();
    assert_eq!(nodes.len(), 2, "{running}");

    // A command: its output (stderr apart), its exit status, the run's environment.
    let r = cli.run(&[
        "attach",
        &job,
        "--",
        "sh",
        "-c",
        "echo id=$LATTICE_ALLOC_ID node=$LATTICE_NODEID attached=$LATTICE_ATTACHED; echo oops >&2; exit 7",
    ]);
    assert_eq!(r.code, Some(7), "{}\n{}", r.show(), cli.logs());
    assert!(
        r.out
            .contains(&format!("id={job} node={} attached=1", nodes[0])),
        "{}",
        r.show()
    );
    assert!(
        r.err.contains("oops") && !r.out.contains("oops"),
        "{}",
        r.show()
    );

    // --node, input forwarded to the command, --command through sh.
    let out = cli.slurm_ok(&format!(
        "printf 'a\\nb\\nc\\n' | lattice attach {job} --node {} --command 'wc -l; echo on=$LATTICE_NODEID'",
        nodes[1]
    ));
    assert!(out.contains('3'), "{out}");
    assert!(out.contains(&format!("on={}", nodes[1])), "{out}");

    // A terminal: what is typed runs in an interactive shell on a pseudo-terminal of the
    // size asked for (80x24 when this side is not a terminal).
    let out = cli.slurm_ok(&format!(
        "(sleep 1; echo 'echo sum=$((6*7)); tty; stty size; exit 3') | lattice attach {job} --tty || echo rc=$?"
    ));
    assert!(out.contains("sum=42"), "{out}");
    assert!(out.contains("/dev/pts/"), "{out}");
    assert!(out.contains("24 80"), "{out}");
    assert!(out.contains("rc=3"), "{out}");

    // The audit trail: one Attached event per attach.
    let evs: Value = serde_json::from_str(&cli.ok(&["get", "events", "-o", "json"])).expect("json");
    let attached = evs["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["reason"] == "Attached" && e["involvedObject"]["name"] == job.as_str())
        .count();
    assert_eq!(attached, 3, "{evs}");

    // The session ends when the allocation does.
    let mut bg = cli.cmd(&["attach", &job, "--", "sleep", "300"]);
    bg.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = bg.spawn().expect("attach");
    std::thread::sleep(Duration::from_secs(2));
    cli.ok(&["cancel", &job]);
    let done = child.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&done.stderr);
    assert_ne!(done.status.code(), Some(0), "{err}");
    assert!(err.contains("stopped running"), "{err}");
    cli.wait_phase(&job, "Cancelled", Duration::from_secs(60));
    let r = cli.run(&["attach", &job, "--", "true"]);
    assert_ne!(r.code, Some(0), "{}", r.show());
    assert!(r.err.contains("needs a Running allocation"), "{}", r.show());

    // `lattice session` without a command: a shell on its first node (on a terminal when
    // this side is one); its nodes go back when the shell exits.
    let out = cli.slurm_ok(
        "echo 'echo in-session node=$LATTICE_NODEID; exit 4' | lattice session -N 1 || echo session-rc=$?",
    );
    assert!(out.contains("in-session node=node-"), "{out}");
    assert!(out.contains("session-rc=4"), "{out}");

    // Commands in a batch job reach the API as its user (a job token, 0600, and
    // srun/squeue/... on its PATH): srun starts a step on the job's two nodes.
    cli.write(
        "steps.sh",
        "#!/bin/sh\n#SBATCH -N 2\nsrun sh -c 'echo step-on=$LATTICE_NODEID'\necho srun-rc=$?\n\
         squeue -h -o %i -j \"$LATTICE_ALLOC_ID\"\nstat -c token-mode=%a \"$LATTICE_TOKEN_FILE\"\n",
    );
    let jid = cli.slurm_ok("sbatch --wait --parsable -o 'steps-%j.out' steps.sh");
    let jid = jid.trim();
    let text = std::fs::read_to_string(cli.work.join(format!("steps-{jid}.out")))
        .unwrap_or_else(|e| panic!("steps-{jid}.out: {e}\n{}", cli.logs()));
    for n in &nodes {
        assert!(text.contains(&format!("step-on={n}")), "{text}");
    }
    assert!(text.contains("srun-rc=0"), "{text}");
    assert!(
        text.lines().any(|l| l.trim() == jid),
        "squeue in the job:\n{text}"
    );
    assert!(text.contains("token-mode=600"), "{text}");

    // An MPI job as a site's script has it: `srun --mpi=pmi2` in a batch script runs the
    // ranks on both nodes, wired up through the agents' PMI server (no mpiexec).
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/mpi/hello.c");
    let hello = cli.work.join("mpi-hello");
    let built = std::process::Command::new("mpicc.mpich")
        .arg("-o")
        .arg(&hello)
        .arg(&src)
        .status()
        .expect("mpicc.mpich (libmpich-dev): run hack/install-deps.sh");
    assert!(built.success());
    cli.write(
        "mpi.sh",
        &format!(
            "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\nexport HWLOC_COMPONENTS=-gl\n\
             srun --mpi=pmi2 {}\necho mpi-rc=$?\n",
            hello.display()
        ),
    );
    let jid = cli.slurm_ok("sbatch --wait --parsable -o 'mpi-%j.out' mpi.sh");
    let text = std::fs::read_to_string(cli.work.join(format!("mpi-{}.out", jid.trim())))
        .unwrap_or_else(|e| panic!("mpi-{jid}.out: {e}\n{}", cli.logs()));
    for r in 0..4 {
        assert!(
            text.contains(&format!("hello rank={r} size=4 sum=6")),
            "{text}"
        );
    }
    assert!(text.contains("mpi-rc=0"), "{text}");

    // srun --pty: inside an allocation, and as Slurm's interactive job.
    let held = cli.submit(&["-N", "1", "--", "sleep", "300"]);
    cli.wait_phase(&held, "Running", Duration::from_secs(60));
    let out = cli.slurm_ok(&format!(
        "srun --jobid={held} --pty sh -c 'echo step-pty=$LATTICE_ALLOC_ID $(tty)' </dev/null"
    ));
    assert!(out.contains(&format!("step-pty={held} /dev/pts/")), "{out}");
    let out =
        cli.slurm_ok("echo 'echo interactive-job $LATTICE_NODEID; exit 0' | srun -N1 --pty bash");
    assert!(out.contains("interactive-job node-"), "{out}");
    cli.ok(&["cancel", &held]);
}

/// Job steps and sessions: `lattice session` (salloc) holds nodes and runs a local
/// shell inside which `lattice launch` / `srun` run tasks on them; a step's exit status
/// comes back; `lattice launch --alloc` runs in a batch job; a step ends with its
/// allocation.
#[test]
fn sessions_and_steps_run_tasks_inside_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let up = up_detached(dir.path(), 2);
    let cli = Cli::at(
        dir.path(),
        up.url.clone(),
        up.token.clone(),
        Box::new(|| logs_of(&up.data)),
    );
    cli.wait_nodes_ready(2);
    let path = format!(
        "{}:{}",
        bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );

    // --- lattice session -N 2 -- CMD: four ranks over two nodes, then the nodes go back.
    let inner = "lattice launch -n 4 sh -c 'echo rank=$LATTICE_PROCID/$LATTICE_LOCALID node=$LATTICE_NODEID job=$LATTICE_ALLOC_ID'; \
                 echo launch-exit=$?; echo session=$LATTICE_ALLOC_ID";
    let mut cmd = cli.cmd(&["session", "-N", "2", "--", "sh", "-c", inner]);
    cmd.env("PATH", &path);
    let r = exec(cmd, Duration::from_secs(120));
    assert_eq!(r.code, Some(0), "{}\n{}", r.show(), cli.logs());
    let session = r
        .out
        .lines()
        .find_map(|l| l.strip_prefix("session="))
        .unwrap_or_else(|| panic!("no session id:\n{}", r.show()))
        .to_string();
    let mut ranks: Vec<&str> = r.out.lines().filter(|l| l.starts_with("rank=")).collect();
    ranks.sort();
    assert_eq!(ranks.len(), 4, "{}", r.show());
    for (i, l) in ranks.iter().enumerate() {
        assert!(l.starts_with(&format!("rank={i}/")), "{l}\n{}", r.show());
        assert!(l.ends_with(&format!("job={session}")), "{l}");
    }
    let nodes: std::collections::BTreeSet<&str> = ranks
        .iter()
        .filter_map(|l| l.split("node=").nth(1)?.split(' ').next())
        .collect();
    assert_eq!(nodes.len(), 2, "two nodes ran the four ranks: {ranks:?}");
    assert!(r.out.contains("launch-exit=0"), "{}", r.show());
    assert!(r.err.contains("granted allocation"), "{}", r.show());
    cli.wait_phase(&session, "Cancelled", Duration::from_secs(60));
    let step = cli.alloc(&format!("{session}.0"));
    assert_eq!(phase(&step), "Completed", "{step}");
    assert_eq!(step["spec"]["stepOf"], session.as_str(), "{step}");

    // --- salloc + srun through the aliases (loaded again in salloc's shell, as a user's
    // bashrc would): a failing step's status comes back.
    let r = cli.slurm(
        "salloc -N1 bash -c 'eval \"$(lattice compat-aliases)\"; srun sh -c \"exit 3\"; echo srun-exit=$?; srun -l echo hi'",
    );
    assert_eq!(r.code, Some(0), "{}\n{}", r.show(), cli.logs());
    assert!(r.out.contains("srun-exit=3"), "{}", r.show());
    assert!(
        r.out.lines().any(|l| l.ends_with("| hi")),
        "srun -l labels lines with the node:\n{}",
        r.show()
    );

    // --- sbatch --wait leaves the output where --output/--error said (Slurm's patterns),
    // and `lattice logs --download` writes it again.
    let out = cli.slurm_ok(
        "sbatch --wait --parsable --job-name=hello -o 'o-%x-%j.txt' -e 'e-%j.txt' --wrap 'echo to-out; echo to-err >&2'",
    );
    let jid = out.trim().to_string();
    let o = std::fs::read_to_string(cli.work.join(format!("o-hello-{jid}.txt")))
        .unwrap_or_else(|e| panic!("o-hello-{jid}.txt: {e}; sbatch printed {out:?}"));
    assert_eq!(o, "to-out\n");
    let e = std::fs::read_to_string(cli.work.join(format!("e-{jid}.txt"))).expect("stderr file");
    assert_eq!(e, "to-err\n");
    std::fs::remove_file(cli.work.join(format!("e-{jid}.txt"))).expect("rm");
    let r = cli.ok(&["logs", &jid, "--download"]);
    assert!(r.contains(&format!("e-{jid}.txt")), "{r}");
    assert!(cli.work.join(format!("e-{jid}.txt")).exists());
    // Without --output, sbatch's default name.
    let out = cli.slurm_ok("sbatch --wait --parsable --wrap 'echo plain'");
    let plain = std::fs::read_to_string(cli.work.join(format!("slurm-{}.out", out.trim())))
        .expect("slurm-%j.out");
    assert_eq!(plain, "plain\n");

    // --- a Slurm batch script runs once, on the first node; the other node holds the
    // allocation and its part counts as success (Slurm's batch host).
    cli.write(
        "twonode.sh",
        "#!/bin/sh\n#SBATCH -N 2\necho \"$LATTICE_NODEID\" >> batch-hosts.txt\n",
    );
    let out = cli.slurm_ok("sbatch --wait --parsable twonode.sh");
    let hosts = std::fs::read_to_string(cli.work.join("batch-hosts.txt")).expect("marker");
    assert_eq!(hosts.lines().count(), 1, "the script ran once: {hosts:?}");
    let job = cli.alloc(out.trim());
    assert_eq!(phase(&job), "Completed", "{job}");
    let first = job["status"]["assignedNodes"][0]
        .as_str()
        .unwrap_or_default();
    assert_eq!(hosts.trim(), first, "on the first node");

    // --- a step in a batch job ends when the job is cancelled.
    let job = cli.submit(&["-N", "2", "--", "sleep", "300"]);
    cli.wait_phase(&job, "Running", Duration::from_secs(60));
    let mut bg = cli.cmd(&["launch", "--alloc", &job, "-N", "1", "--", "sleep", "300"]);
    bg.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = bg.spawn().expect("launch");
    let step = format!("{job}.0");
    cli.wait("the step to run", Duration::from_secs(60), || {
        (cli.run(&["status", &step, "-o", "json"])
            .out
            .contains("\"Running\""))
        .then_some(())
    });
    cli.ok(&["cancel", &job]);
    let s = cli.wait_terminal(&step);
    assert_eq!(phase(&s), "Cancelled", "{s}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "launch did not exit after its step ended"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(status.code(), Some(0), "a cancelled step is not a success");
    // The job is over: a new step is refused with the reason.
    cli.wait_terminal(&job);
    let r = cli.run(&["launch", "--alloc", &job, "true"]);
    assert_ne!(r.code, Some(0), "{}", r.show());
    assert!(
        r.err.contains("a step needs a running allocation"),
        "{}",
        r.show()
    );
}
