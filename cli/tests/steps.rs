//! Job steps and sessions (`launch`, `session`, `compat srun`/`salloc`, `logs --download`):
//! argument handling, what a step is created with, and that nothing is left behind on the
//! ways out. A small scripted API server below answers the error paths (the shared fake
//! fails every request naming an object, so a cancel after a failed read cannot be seen).

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use common::{Opts, Run, GV, PREFIX};
use lattice_cli::cli::Command;

// ---------------------------------------------------------------------------------------
// `lattice launch -n N`: the task count wherever it stands among the options.

/// (ntasks, tenant, label, command) of a parsed `lattice ...launch...` line.
fn launch_of(args: &[&str]) -> (Option<u32>, Option<String>, bool, Vec<String>) {
    let cli = lattice_cli::parse_args(std::iter::once("lattice").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let Command::Launch(l) = cli.command else {
        panic!("{args:?}: not launch");
    };
    (l.ntasks, cli.global.tenant, l.label, l.command)
}

#[test]
fn launch_dash_n_is_the_task_count_after_any_option() {
    let host = vec!["hostname".to_string()];
    let none: Option<String> = None;
    let prod = Some("prod".to_string());
    let table: Vec<(Vec<&str>, Option<u32>, Option<String>)> = vec![
        (vec!["launch", "-n", "4", "hostname"], Some(4), none.clone()),
        // launch's own options with a value.
        (
            vec!["launch", "-N", "2", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["launch", "--nodes", "2", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["launch", "--alloc", "job", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["launch", "-D", "/tmp", "-n", "2", "hostname"],
            Some(2),
            none.clone(),
        ),
        (
            vec!["launch", "--chdir", "/tmp", "-n2", "hostname"],
            Some(2),
            none.clone(),
        ),
        (
            vec!["launch", "--env", "K=V", "-n", "2", "hostname"],
            Some(2),
            none.clone(),
        ),
        (
            vec!["launch", "--tasks-per-node", "2", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["launch", "--ntasks-per-node", "2", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["launch", "--export", "NONE", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["launch", "--alloc=job", "-n=3", "hostname"],
            Some(3),
            none.clone(),
        ),
        (
            vec!["launch", "-N2", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["launch", "-D/tmp", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["launch", "-lN", "2", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        // Global options with a value before `launch`.
        (
            vec!["-o", "json", "launch", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["-q", "-ojson", "launch", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["-t", "prod", "launch", "-n", "4", "hostname"],
            Some(4),
            prod.clone(),
        ),
        (
            vec!["-n", "prod", "launch", "-n", "4", "hostname"],
            Some(4),
            prod.clone(),
        ),
        (
            vec!["--tenant", "prod", "launch", "-n", "4", "hostname"],
            Some(4),
            prod.clone(),
        ),
        (
            vec!["--api-url", "http://x:1", "launch", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["--api-url=http://x:1", "launch", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["--token", "T", "launch", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["--token-file", "F", "launch", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["--vcluster", "V", "launch", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec!["--config", "C", "launch", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
        (
            vec![
                "--certificate-authority",
                "F",
                "launch",
                "-n",
                "4",
                "hostname",
            ],
            Some(4),
            none.clone(),
        ),
        // Global options with a value after `launch`.
        (
            vec!["launch", "-t", "prod", "-n", "4", "hostname"],
            Some(4),
            prod.clone(),
        ),
        (
            vec!["launch", "--tenant", "prod", "-n", "4", "hostname"],
            Some(4),
            prod.clone(),
        ),
        (
            vec!["launch", "-o", "json", "-n", "4", "hostname"],
            Some(4),
            none.clone(),
        ),
    ];
    for (args, ntasks, tenant) in table {
        let (n, t, _, cmd) = launch_of(&args);
        assert_eq!((n, t, &cmd), (ntasks, tenant, &host), "{args:?}");
    }
    // In a cluster of short flags.
    assert_eq!(
        launch_of(&["launch", "-ln", "4", "hostname"]),
        (Some(4), None, true, host.clone())
    );
    assert_eq!(
        launch_of(&["launch", "-ln4", "hostname"]),
        (Some(4), None, true, host.clone())
    );
    // The command's own `-n` is left alone, after the command or after `--`.
    assert_eq!(
        launch_of(&["launch", "-n", "2", "mpirun", "-n", "8", "./app"]),
        (
            Some(2),
            None,
            false,
            vec!["mpirun".into(), "-n".into(), "8".into(), "./app".into()]
        )
    );
    assert_eq!(
        launch_of(&["launch", "-N", "2", "hostname", "-n", "4"]),
        (
            None,
            None,
            false,
            vec!["hostname".into(), "-n".into(), "4".into()]
        )
    );
    assert_eq!(
        launch_of(&["launch", "--", "sh", "-n", "x"]),
        (
            None,
            None,
            false,
            vec!["sh".into(), "-n".into(), "x".into()]
        )
    );
    // Not `launch`: `-n` stays the tenant.
    let cli = lattice_cli::parse_args(["lattice", "get", "allocations", "-n", "prod"]).unwrap();
    assert_eq!(cli.global.tenant.as_deref(), Some("prod"));
    let cli = lattice_cli::parse_args(["lattice", "-t", "launch", "get", "allocations"]).unwrap();
    assert_eq!(cli.global.tenant.as_deref(), Some("launch"));
}

// ---------------------------------------------------------------------------------------
// Steps against the shared fake.

const ALLOCS: &str = "/apis/lattice.dev/v1alpha1/namespaces/default/allocations";

/// A running allocation `job` of alice on `nodes`.
fn job(nodes: &[&str]) -> Value {
    json!({
        "apiVersion": GV, "kind": "Allocation",
        "metadata": {"name": "job", "namespace": "default", "uid": "uid-job", "resourceVersion": "7",
                     "creationTimestamp": "2026-01-01T10:00:00Z",
                     "annotations": {"lattice.dev/user": "alice"}},
        "spec": {"resources": {"nodes": nodes.len()}, "entrypoint": "/bin/sleep"},
        "status": {"phase": "Running", "assignedNodes": nodes}
    })
}

/// The "step controller": every step created is finished at once.
fn finish_steps(state: Arc<Mutex<common::State>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            {
                let mut st = state.lock().expect("lock");
                for o in st.objects.values_mut() {
                    if o.pointer("/spec/stepOf").is_some() && o.get("status").is_none() {
                        o["status"] = json!({"phase": "Completed", "exitCode": 0});
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

fn posts(f: &common::Fake) -> Vec<Value> {
    f.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == ALLOCS)
        .map(|r| serde_json::from_str(&r.body).expect("json body"))
        .collect()
}

async fn as_alice(url: &str, args: &[&str]) -> Run {
    let o = Opts::alice(std::path::Path::new("/home/alice/project"));
    tokio::time::timeout(Duration::from_secs(30), common::run_opts(url, args, o))
        .await
        .unwrap_or_else(|_| panic!("{args:?} did not end"))
}

#[tokio::test]
async fn a_step_gets_the_callers_environment_and_the_allocations_layout() {
    let f = common::start().await;
    let mut j = job(&["n1", "n2"]);
    j["metadata"]["annotations"]["lattice.dev/ntasks"] = json!("4");
    j["spec"]["env"] = json!({"FROM_ALLOC": "1", "SHARED": "alloc"});
    f.insert("allocations", j);
    let helper = finish_steps(f.state.clone());

    // Default (--export=ALL): this process's variables, less the node's and the shell's.
    let r = as_alice(
        &f.url,
        &[
            "launch",
            "--alloc",
            "job",
            "--env",
            "SHARED=mine",
            "hostname",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let step = posts(&f).pop().expect("a step");
    assert_eq!(step["metadata"]["name"], "job.0");
    let env = step["spec"]["env"].as_object().cloned().unwrap_or_default();
    assert_eq!(env["FROM_ALLOC"], "1", "{env:?}");
    assert_eq!(env["SHARED"], "mine", "--env wins: {env:?}");
    let path = std::env::var("PATH").expect("tests run with a PATH");
    assert_eq!(env["PATH"], path.as_str(), "{env:?}");
    for k in env.keys() {
        assert!(
            !k.starts_with("LATTICE_")
                && !k.starts_with("SLURM_")
                && !["PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME", "HOME", "USER"]
                    .contains(&k.as_str()),
            "{k} is the node's: {env:?}"
        );
    }
    // No -n/-N/--tasks-per-node: the allocation's 4 tasks on its 2 nodes.
    assert_eq!(step["metadata"]["annotations"]["lattice.dev/ntasks"], "4");
    assert_eq!(step["spec"]["resources"]["nodes"], 2);
    assert!(
        r.err.contains("step job.0: 4 task(s) on 2 node(s)"),
        "{}",
        r.err
    );

    // --export=none: only the allocation's and --env's.
    let r = as_alice(
        &f.url,
        &[
            "launch",
            "--alloc=job",
            "--export=none",
            "-n",
            "1",
            "hostname",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let step = posts(&f).pop().expect("a step");
    assert_eq!(step["metadata"]["name"], "job.1");
    assert_eq!(
        step["spec"]["env"],
        json!({"FROM_ALLOC": "1", "SHARED": "alloc"})
    );
    assert_eq!(step["metadata"]["annotations"]["lattice.dev/ntasks"], "1");

    // srun --export=PATH,X=1: those two.
    let o = Opts {
        env: vec![
            ("USER".into(), "alice".into()),
            ("LATTICE_ALLOC_ID".into(), "job".into()),
        ],
        ..Opts::alice(std::path::Path::new("/home/alice/project"))
    };
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        common::run_opts(
            &f.url,
            &["compat", "srun", "--export", "PATH,X=1", "hostname"],
            o,
        ),
    )
    .await
    .expect("srun ends");
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(!r.err.contains("--export"), "no warning: {}", r.err);
    let step = posts(&f).pop().expect("a step");
    assert_eq!(
        step["spec"]["env"],
        json!({"FROM_ALLOC": "1", "PATH": path, "SHARED": "alloc", "X": "1"})
    );
    let r = as_alice(
        &f.url,
        &["launch", "--alloc=job", "--export=ALL,NONE", "hostname"],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.err);
    helper.abort();
}

#[tokio::test]
async fn srun_finds_jobid_and_skips_option_values() {
    let f = common::start().await;
    f.insert("allocations", job(&["n1", "n2"]));
    let helper = finish_steps(f.state.clone());
    let o = || Opts::alice(std::path::Path::new("/home/alice/project"));
    // --jobid after an option with a value: a step of `job`, not a new allocation.
    let r = common::run_opts(
        &f.url,
        &["compat", "srun", "-N", "1", "--jobid=job", "hostname"],
        o(),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let step = posts(&f).pop().expect("a step");
    assert_eq!(step["metadata"]["name"], "job.0", "{step}");
    assert_eq!(step["spec"]["resources"]["nodes"], 1);
    // A long option's separate value is not the command.
    let r = common::run_opts(
        &f.url,
        &[
            "compat",
            "srun",
            "--cpus-per-task",
            "4",
            "--jobid",
            "job",
            "--mem-per-cpu",
            "2G",
            "./app",
            "--jobid=x",
        ],
        o(),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    let step = posts(&f).pop().expect("a step");
    assert_eq!(step["metadata"]["name"], "job.1", "{step}");
    assert_eq!(step["spec"]["entrypoint"], "./app");
    assert_eq!(step["spec"]["args"], json!(["--jobid=x"]));
    assert!(
        r.err
            .contains("srun: warning: --cpus-per-task 4: ignored for a step"),
        "{}",
        r.err
    );
    helper.abort();
}

#[tokio::test]
async fn step_numbers_are_tried_a_bounded_number_of_times() {
    let f = common::start().await;
    f.insert("allocations", job(&["n1"]));
    {
        let mut st = f.state.lock().expect("lock");
        for n in 0..100 {
            st.fail_on.insert(
                format!("job.{n}"),
                (
                    409,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409,
                           "reason": "AlreadyExists", "message": format!("allocations \"job.{n}\" already exists")}),
                ),
            );
        }
    }
    let r = as_alice(&f.url, &["launch", "--alloc=job", "hostname"]).await;
    assert_eq!(r.code, 1, "{}", r.err);
    assert!(
        r.err.contains("no free step number found in 8 tries"),
        "{}",
        r.err
    );
    assert_eq!(
        f.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == ALLOCS)
            .count(),
        8
    );
}

// ---------------------------------------------------------------------------------------
// `logs --download` of someone else's allocation.

#[tokio::test]
async fn download_of_someone_elses_job_stays_here_and_has_no_prefixes() {
    let f = common::start().await;
    let here = tempfile::tempdir().expect("tmp");
    let victim = tempfile::tempdir().expect("tmp");
    let mut bobs = common::alloc("default", "bobjob", "Completed", 1, "2026-01-01T10:00:00Z");
    bobs["metadata"]["annotations"] = json!({
        "lattice.dev/user": "bob",
        "lattice.dev/submit-dir": victim.path().display().to_string(),
        "lattice.dev/output": victim.path().join("stolen.out").display().to_string(),
        "lattice.dev/error": "../%j.err",
    });
    f.insert("allocations", bobs);
    let mut mine = common::alloc("default", "myjob", "Completed", 1, "2026-01-01T10:00:00Z");
    mine["metadata"]["annotations"] = json!({
        "lattice.dev/user": "alice",
        "lattice.dev/submit-dir": victim.path().display().to_string(),
        "lattice.dev/output": "sub/%j.out",
    });
    f.insert("allocations", mine);
    {
        let mut st = f.state.lock().expect("lock");
        st.logs.insert("bobjob".into(), "bob's output\n".into());
        st.logs.insert("myjob".into(), "mine\n".into());
    }
    let r = common::run_opts(
        &f.url,
        &["logs", "bobjob", "--download"],
        Opts::alice(here.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(!victim.path().join("stolen.out").exists());
    assert!(!here.path().join("../bobjob.err").exists());
    assert_eq!(
        std::fs::read_to_string(here.path().join("stolen.out")).expect("written here"),
        "bob's output\n"
    );
    assert!(here.path().join("bobjob.err").exists(), "{}", r.out);
    assert!(
        r.out
            .contains("Note: allocation bobjob belongs to bob, not you"),
        "{}",
        r.out
    );
    let logs: Vec<_> = f
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/log"))
        .collect();
    assert_eq!(logs.len(), 2);
    for l in &logs {
        assert_eq!(
            l.query.get("prefix").map(String::as_str),
            Some("false"),
            "{l:?}"
        );
    }
    // One's own job: its paths, from its submission directory.
    let r = common::run_opts(
        &f.url,
        &["logs", "myjob", "--download"],
        Opts::alice(here.path()),
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        std::fs::read_to_string(victim.path().join("sub/myjob.out")).expect("written there"),
        "mine\n"
    );
    assert!(!r.out.contains("Note"), "{}", r.out);
}

// ---------------------------------------------------------------------------------------
// A scripted server for the error paths.

#[derive(Default)]
struct Script {
    /// Allocations of tenant `default` by name.
    objects: BTreeMap<String, Value>,
    /// (method, path) of every request.
    requests: Vec<(String, String)>,
    /// (method, allocation name) -> answers to give first: `Some(code)` fails with
    /// `code`, `None` answers normally.
    fail: HashMap<(String, String), VecDeque<Option<u16>>>,
    /// `status` given to the allocations it creates (none: they stay Pending).
    on_create: Option<Value>,
    generated: u64,
}

#[derive(Clone)]
struct Scripted {
    url: String,
    state: Arc<Mutex<Script>>,
}

impl Scripted {
    fn fail(&self, method: &str, name: &str, answers: &[Option<u16>]) {
        self.state.lock().expect("lock").fail.insert(
            (method.into(), name.into()),
            answers.iter().copied().collect(),
        );
    }

    fn count(&self, method: &str, name: &str) -> usize {
        let path = format!("{ALLOCS}/{name}");
        self.state
            .lock()
            .expect("lock")
            .requests
            .iter()
            .filter(|(m, p)| m == method && *p == path)
            .count()
    }

    /// Cancel patches sent for `name`.
    fn cancels(&self, name: &str) -> usize {
        self.count("PATCH", name)
    }

    fn insert(&self, obj: Value) {
        let name = obj["metadata"]["name"].as_str().expect("name").to_string();
        self.state.lock().expect("lock").objects.insert(name, obj);
    }
}

fn answer(code: u16, v: &Value) -> Response {
    (
        StatusCode::from_u16(code).expect("code"),
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

fn failure(code: u16) -> Response {
    answer(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                "reason": "Scripted", "message": format!("scripted failure {code}")}),
    )
}

fn serve(st: &Mutex<Script>, method: Method, uri: Uri, body: Bytes) -> Response {
    let mut st = st.lock().expect("lock");
    let path = uri.path().to_string();
    st.requests.push((method.to_string(), path.clone()));
    if path == PREFIX {
        return answer(200, &common::discovery());
    }
    let Some(rest) = path.strip_prefix(ALLOCS) else {
        return failure(404);
    };
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let name = parts.first().map(|n| n.to_string()).unwrap_or_default();
    if let Some(q) = st.fail.get_mut(&(method.to_string(), name.clone())) {
        if let Some(Some(code)) = q.pop_front() {
            return failure(code);
        }
    }
    match (method.as_str(), parts.as_slice()) {
        ("GET", []) => {
            let sel = uri
                .query()
                .and_then(|q| {
                    q.split('&')
                        .find_map(|kv| kv.strip_prefix("labelSelector="))
                })
                .map(|s| s.replace("%3D", "=").replace("%2F", "/"))
                .unwrap_or_default();
            let items: Vec<Value> = st
                .objects
                .values()
                .filter(|o| {
                    sel.split_once('=').is_none_or(|(k, v)| {
                        o.pointer("/metadata/labels")
                            .and_then(|l| l.get(k))
                            .and_then(Value::as_str)
                            == Some(v)
                    })
                })
                .cloned()
                .collect();
            answer(
                200,
                &json!({"kind": "List", "apiVersion": GV, "items": items}),
            )
        }
        ("POST", []) => {
            let mut obj: Value = serde_json::from_slice(&body).expect("json");
            let name = match obj["metadata"]["name"].as_str() {
                Some(n) => n.to_string(),
                None => {
                    st.generated += 1;
                    let g = obj["metadata"]["generateName"].as_str().unwrap_or("x-");
                    format!("{g}{:05}", st.generated)
                }
            };
            obj["metadata"]["name"] = json!(name);
            obj["metadata"]["namespace"] = json!("default");
            obj["metadata"]["uid"] = json!(format!("uid-{name}"));
            if let Some(s) = st.on_create.clone() {
                obj["status"] = s;
            }
            st.objects.insert(name, obj.clone());
            answer(201, &obj)
        }
        ("GET", [n]) => match st.objects.get(*n) {
            Some(o) => answer(200, o),
            None => failure(404),
        },
        ("GET", [_, "log"]) => (StatusCode::OK, "").into_response(),
        ("PATCH", [n]) => {
            let patch: Value = serde_json::from_slice(&body).expect("json");
            match st.objects.get_mut(*n) {
                Some(o) => {
                    common::merge(o, &patch);
                    answer(200, o)
                }
                None => failure(404),
            }
        }
        _ => failure(405),
    }
}

async fn scripted(on_create: Option<Value>) -> Scripted {
    let state = Arc::new(Mutex::new(Script {
        on_create,
        ..Script::default()
    }));
    let s2 = state.clone();
    let app = Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
        let s = s2.clone();
        async move { serve(&s, method, uri, body) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Scripted {
        url: format!("http://{addr}"),
        state,
    }
}

fn running_on(nodes: &[&str]) -> Value {
    json!({"phase": "Running", "assignedNodes": nodes})
}

const SESSION: &str = "session-00001";

#[tokio::test]
async fn a_session_is_cancelled_when_waiting_for_it_fails() {
    let s = scripted(None).await;
    s.fail("GET", SESSION, &[Some(403)]);
    let r = as_alice(&s.url, &["session", "-N", "1", "--", "true"]).await;
    assert_eq!(r.code, 4, "{}", r.err);
    assert_eq!(s.cancels(SESSION), 1, "{}", r.err);
    assert!(
        r.err.contains(&format!(
            "relinquishing allocation {SESSION} (Cancel requested"
        )),
        "{}",
        r.err
    );
}

#[tokio::test]
async fn a_session_rides_out_passing_errors_and_keeps_the_shells_status() {
    let s = scripted(Some(running_on(&["n1"]))).await;
    // Two server errors while waiting, then one after the shell: the shell still runs,
    // its status is kept and the allocation is given back.
    s.fail("GET", SESSION, &[Some(500), Some(502), None, Some(500)]);
    let r = as_alice(&s.url, &["session", "-N", "1", "--", "sh", "-c", "exit 3"]).await;
    assert_eq!(r.code, 3, "{}", r.err);
    assert_eq!(s.cancels(SESSION), 1, "{}", r.err);
    assert!(r.err.contains("granted allocation"), "{}", r.err);
}

#[tokio::test]
async fn a_failed_cancel_is_reported_and_the_status_kept() {
    let s = scripted(Some(running_on(&["n1"]))).await;
    s.fail("PATCH", SESSION, &[Some(503)]);
    let r = as_alice(&s.url, &["session", "-N", "1", "--", "sh", "-c", "exit 5"]).await;
    assert_eq!(r.code, 5, "{}", r.err);
    assert!(
        r.err
            .contains(&format!("warning: could not cancel {SESSION}")),
        "{}",
        r.err
    );
    assert!(
        r.err.contains(&format!("lattice cancel {SESSION}")),
        "{}",
        r.err
    );
}

#[tokio::test]
async fn a_step_is_cancelled_when_following_it_fails() {
    let s = scripted(None).await;
    s.insert(job(&["n1"]));
    // The step is seen once (pending), then reading it fails.
    s.fail("GET", "job.0", &[None, Some(403)]);
    let r = as_alice(&s.url, &["launch", "--alloc=job", "hostname"]).await;
    assert_eq!(r.code, 4, "{}", r.err);
    assert_eq!(s.cancels("job.0"), 1, "{}", r.err);
    assert!(
        r.err.contains("Cancel requested for allocation job.0"),
        "{}",
        r.err
    );
}

// ---------------------------------------------------------------------------------------
// Signals to the binary.

/// Starts the binary with `args` against `url` as alice.
fn spawn_lattice(url: &str, args: &[&str]) -> std::process::Child {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_lattice"));
    for k in [
        "LATTICE_API_URL",
        "LATTICE_TOKEN",
        "LATTICE_TOKEN_FILE",
        "LATTICE_TENANT",
        "LATTICE_CONFIG",
        "LATTICE_ALLOC_ID",
        "SLURM_JOB_ID",
    ] {
        c.env_remove(k);
    }
    c.env("XDG_CONFIG_HOME", "/nonexistent-lattice-test-config")
        .env("USER", "alice")
        .env("LATTICE_API_URL", url)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c.spawn().expect("start lattice")
}

/// Waits until `done` holds (10 s at most).
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Sends `sig` to `child` and returns its exit code and stderr.
async fn signal_and_wait(
    mut child: std::process::Child,
    sig: libc::c_int,
) -> (Option<i32>, String) {
    // SAFETY: kill(2) on the child we started.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
    for _ in 0..1000 {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if child.try_wait().expect("wait").is_none() {
        let _ = child.kill();
        panic!("lattice did not stop on signal {sig}");
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test]
async fn sigterm_cancels_a_pending_step() {
    let s = scripted(None).await;
    s.insert(job(&["n1"]));
    let child = spawn_lattice(&s.url, &["launch", "--alloc=job", "hostname"]);
    until("the step to be followed", || s.count("GET", "job.0") >= 2).await;
    let (code, err) = signal_and_wait(child, libc::SIGTERM).await;
    assert_eq!(code, Some(130), "{err}");
    assert_eq!(s.cancels("job.0"), 1, "{err}");
}

#[tokio::test]
async fn sigterm_or_sighup_give_a_session_back() {
    // While waiting for the nodes.
    let s = scripted(None).await;
    let child = spawn_lattice(&s.url, &["session", "-N", "1", "--", "sleep", "30"]);
    until("the session to be waited for", || {
        s.count("GET", SESSION) >= 2
    })
    .await;
    let (code, err) = signal_and_wait(child, libc::SIGHUP).await;
    assert_eq!(code, Some(130), "{err}");
    assert_eq!(s.cancels(SESSION), 1, "{err}");
    // While the shell runs: it is ended, then the allocation cancelled.
    let d = tempfile::tempdir().expect("tmp");
    for (sig, want) in [(libc::SIGTERM, 143), (libc::SIGHUP, 129)] {
        let s = scripted(Some(running_on(&["n1"]))).await;
        let mark = d.path().join(format!("shell-{sig}"));
        let script = format!("touch {}; exec sleep 30", mark.display());
        let child = spawn_lattice(&s.url, &["session", "-N", "1", "--", "sh", "-c", &script]);
        until("the shell to start", || mark.exists()).await;
        let (code, err) = signal_and_wait(child, sig).await;
        assert_eq!(code, Some(want), "{err}");
        assert_eq!(s.cancels(SESSION), 1, "{err}");
        assert!(
            err.contains(&format!("relinquishing allocation {SESSION}")),
            "{err}"
        );
    }
}
