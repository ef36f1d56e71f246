//! DAG benchmarks beyond the pure engine (`lattice-dag-bench`):
//!
//! * `admission`: a `--steps`-step Dag through the API server's admission code:
//!   `RESULT validate_<n>_ms` (validation of the typed Dag: names, references, cycles,
//!   every step as an Allocation) and `RESULT admit_<n>_ms` (all of admission: strict
//!   typed parse of the JSON, defaults, validation, the normalized JSON stored).
//! * `in-process`: the real DAG controller (and the other built-in controllers) on an
//!   embedded store, in this process. A chain of `--steps` steps; each predecessor's
//!   terminal status is written through the API and the time until its successor is
//!   released (its hold lifted, i.e. schedulable) is measured. Prints
//!   `RESULT release_p50_ms` / `release_p99_ms` (the figure).
//! * `cluster`: against a running cluster (`--url`, `--token-file`) with real agents: a
//!   `--steps`-step chain and a `--steps`-wide fan-out/fan-in (root, `--steps` workers,
//!   join; the cluster's `scheduling.max_dag_size` is raised for it when needed and reset
//!   afterwards) of `/bin/true` steps, each run to completion. Prints, per shape, `dag_<shape>_<n>_s` (total wall time from
//!   submission to the Dag's terminal phase), `dag_<shape>_<n>_steps_runtime_s` (the
//!   steps' own runtime on the critical path: `/bin/true`'s runtime, measured here as
//!   `dag_step_runtime_ms`, times the steps that must run one after another: n for the
//!   chain, root + ceil(n/nodes) + join for the fan-out), `dag_<shape>_<n>_overhead_s`
//!   (wall time minus that runtime) and `dag_<shape>_<n>_overhead_ms_per_step` (that
//!   overhead over n).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde_json::{json, Value};

/// The allocator `lattice-server` uses, so the in-process controllers run as they do there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Controller release latency on an in-process store.
    InProcess {
        #[arg(long, default_value_t = 1000)]
        steps: usize,
    },
    /// The API server's validation and whole admission of one `--steps`-step Dag:
    /// `RESULT validate_<n>_ms` and `admit_<n>_ms`, medians of 11.
    Admission {
        #[arg(long, default_value_t = 10_000)]
        steps: usize,
    },
    /// Chain and fan-out end to end on a running cluster.
    Cluster {
        #[arg(long)]
        url: String,
        #[arg(long)]
        token_file: std::path::PathBuf,
        #[arg(long, default_value_t = 1000)]
        steps: usize,
        #[arg(long, default_value = "default")]
        tenant: String,
    },
}

fn step(name: String, deps: Vec<String>) -> Value {
    json!({
        "name": name,
        "dependsOn": deps.into_iter().map(|d| json!({"ref": d, "condition": "success"})).collect::<Vec<_>>(),
        "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "10m"}, "requeue": {"policy": "never"}},
    })
}

fn chain(name: &str, tenant: &str, n: usize) -> Value {
    let steps: Vec<Value> = (0..n)
        .map(|i| {
            step(
                format!("s{i}"),
                if i == 0 {
                    vec![]
                } else {
                    vec![format!("s{}", i - 1)]
                },
            )
        })
        .collect();
    json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Dag",
           "metadata": {"name": name, "namespace": tenant}, "spec": {"allocations": steps}})
}

/// `root`, then `n` workers after it, then `join` after all of them (n + 2 steps).
fn fan(name: &str, tenant: &str, n: usize) -> Value {
    let mut steps = vec![step("root".into(), vec![])];
    for i in 0..n {
        steps.push(step(format!("w{i}"), vec!["root".into()]));
    }
    steps.push(step(
        "join".into(),
        (0..n).map(|i| format!("w{i}")).collect(),
    ));
    json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Dag",
           "metadata": {"name": name, "namespace": tenant}, "spec": {"allocations": steps}})
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().mode {
        Mode::InProcess { steps } => in_process(steps).await,
        Mode::Admission { steps } => admission(steps),
        Mode::Cluster {
            url,
            token_file,
            steps,
            tenant,
        } => cluster(&url, &std::fs::read_to_string(token_file)?, steps, &tenant).await,
    }
}

/// A random `n`-step Dag: step i depends on one to three earlier steps.
fn random_dag(n: usize) -> Value {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |below: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % below.max(1) as u64) as usize
    };
    let steps: Vec<Value> = (0..n)
        .map(|i| {
            let mut deps: Vec<String> = Vec::new();
            if i > 0 {
                for _ in 0..1 + next(3) {
                    let d = format!("s{}", next(i));
                    if !deps.contains(&d) {
                        deps.push(d);
                    }
                }
            }
            step(format!("s{i}"), deps)
        })
        .collect();
    json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Dag",
           "metadata": {"name": "big", "namespace": "bench"}, "spec": {"allocations": steps}})
}

fn admission(n: usize) -> anyhow::Result<()> {
    let kind = lattice_apis::find_kind("Dag").ok_or_else(|| anyhow::anyhow!("no Dag kind"))?;
    let dag = random_dag(n);
    let edges: usize = dag["spec"]["allocations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["dependsOn"].as_array().map_or(0, Vec::len))
                .sum()
        })
        .unwrap_or(0);
    use lattice_apis::Resource;
    let (mut validate, mut admit) = (Vec::new(), Vec::new());
    for _ in 0..11 {
        // The validation proper, on the typed and defaulted Dag: names, references,
        // cycles, sizes and every step checked as an Allocation.
        let mut typed: lattice_apis::Dag = lattice_apis::resource::parse_strict(dag.clone())?;
        typed.default_fields();
        let t = Instant::now();
        let checked = typed.validate();
        validate.push(t.elapsed().as_secs_f64() * 1000.0);
        if let Err(e) = checked {
            anyhow::bail!("the bench Dag is invalid: {e}");
        }
        // All of admission, as the API server runs it on a request's JSON: strict typed
        // parse, defaults, validation, and the normalized JSON it stores.
        let input = dag.clone();
        let t = Instant::now();
        let admitted = (kind.admit)(input);
        admit.push(t.elapsed().as_secs_f64() * 1000.0);
        if let Err(e) = admitted {
            anyhow::bail!("the bench Dag was refused: {e}");
        }
    }
    println!("admission: {n} steps, {edges} edges");
    println!(
        "RESULT validate_{n}_ms={:.3}",
        lattice_e2e::percentile(&mut validate, 0.5)
    );
    println!(
        "RESULT admit_{n}_ms={:.3}",
        lattice_e2e::percentile(&mut admit, 0.5)
    );
    Ok(())
}

async fn in_process(n: usize) -> anyhow::Result<()> {
    use futures::StreamExt;
    use lattice_apis::{Allocation, AllocationPhase, Dag};
    use lattice_runtime::{
        AlwaysLeader, Api, ControllerHost, PostParams, ResourceExt, WatchEvent, WatchParams,
    };
    use std::collections::HashMap;
    let dir = tempfile::tempdir()?;
    let store = lattice_store::EmbeddedStore::open(dir.path(), Default::default()).await?;
    let backend: Arc<dyn lattice_store::KvBackend> = Arc::new(store);
    let client = lattice_apiserver::in_process::client(backend.clone());
    let mut host = ControllerHost::new(client.clone(), Arc::new(AlwaysLeader::new()));
    let _m = lattice_controllers::register_all(&mut host, backend, Default::default());
    tokio::spawn(host.run(std::future::pending()));
    let dags: Api<Dag> = Api::namespaced(client.clone(), "bench");
    let allocs: Api<Allocation> = Api::namespaced(client.clone(), "bench");
    // Every change to the steps, stamped as it arrives on one watch: a predecessor's
    // terminal status write and its successor's release are timed on the same path.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut events = allocs.watch(&WatchParams::default()).await?;
    tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            if let Ok(WatchEvent::Added(a) | WatchEvent::Modified(a)) = ev {
                let released = !a
                    .metadata
                    .annotations
                    .contains_key(lattice_apis::wellknown::HOLD_ANNOTATION);
                let done = a.status.as_ref().map(|s| s.phase) == Some(AllocationPhase::Completed);
                if tx
                    .send((a.name_any().to_string(), released, done, Instant::now()))
                    .is_err()
                {
                    break;
                }
            }
        }
    });
    let dag: Dag = serde_json::from_value(chain("chain", "bench", n))?;
    dags.create(&PostParams::default(), &dag).await?;
    let mut released_at: HashMap<String, Instant> = HashMap::new();
    let mut done_at: HashMap<String, Instant> = HashMap::new();
    // From the predecessor's Completed status as seen on the watch (the figure), and from
    // the acknowledgement of its status write (the writer's view).
    let (mut lat, mut lat_ack) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let mut prev: Option<(String, Instant)> = None;
    let started = Instant::now();
    for i in 0..n {
        let name = format!("chain-s{i}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !released_at.contains_key(&name) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some((who, released, done, at))) => {
                    if released {
                        released_at.entry(who.clone()).or_insert(at);
                    }
                    if done {
                        done_at.entry(who).or_insert(at);
                    }
                }
                Ok(None) => anyhow::bail!("the watch on the steps ended"),
                Err(_) => anyhow::bail!("step {i} was not released within 30 s"),
            }
        }
        let released = released_at[&name];
        if let Some((p, acked)) = prev.take() {
            let done = done_at
                .get(&p)
                .copied()
                .ok_or_else(|| anyhow::anyhow!("{name} was released before {p} completed"))?;
            lat.push(released.saturating_duration_since(done).as_secs_f64() * 1000.0);
            lat_ack.push(released.saturating_duration_since(acked).as_secs_f64() * 1000.0);
        }
        // It "completes": the terminal status write that releases the next step.
        allocs
            .update_status_with_retry(&name, 20, |a| {
                let st = a.status.get_or_insert_with(Default::default);
                st.phase = AllocationPhase::Completed;
                st.exit_code = Some(0);
                true
            })
            .await?;
        prev = Some((name, Instant::now()));
    }
    println!("RESULT release_steps={n}");
    println!(
        "RESULT release_p50_ms={:.2}",
        lattice_e2e::percentile(&mut lat, 0.50)
    );
    println!(
        "RESULT release_p99_ms={:.2}",
        lattice_e2e::percentile(&mut lat, 0.99)
    );
    println!(
        "RESULT release_from_ack_p99_ms={:.2}",
        lattice_e2e::percentile(&mut lat_ack, 0.99)
    );
    println!(
        "RESULT release_total_s={:.2}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Mean wall time (ms) of running `/bin/true` here, the bench steps' own runtime: what a
/// step would take with no scheduler at all (fork, exec, exit, wait), over `runs` runs.
fn step_runtime_ms(runs: u32) -> anyhow::Result<f64> {
    let start = Instant::now();
    for _ in 0..runs {
        let st = std::process::Command::new("/bin/true").status()?;
        anyhow::ensure!(st.success(), "/bin/true failed: {st}");
    }
    Ok(start.elapsed().as_secs_f64() * 1000.0 / f64::from(runs.max(1)))
}

async fn cluster(url: &str, token: &str, n: usize, tenant: &str) -> anyhow::Result<()> {
    let token = token.trim();
    let http = reqwest::Client::new();
    let api = format!("{}/apis/lattice.dev/v1alpha1", url.trim_end_matches('/'));
    let base = format!("{api}/namespaces/{tenant}/dags");
    // Ready nodes: the fan-out's workers run this many at a time at best.
    let nodes: Value = http
        .get(format!("{api}/nodes"))
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?;
    let ready = nodes["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|n| n["status"]["state"] == "Ready")
                .count()
        })
        .unwrap_or(0)
        .max(1);
    let runtime_ms = step_runtime_ms(200)?;
    println!("RESULT dag_cluster_nodes={ready}");
    println!("RESULT dag_step_runtime_ms={runtime_ms:.2}");
    // The fan-out has n + 2 steps: raise the cluster's Dag size limit for it if needed
    // (`lattice admin config set scheduling.max_dag_size=N`), and reset it afterwards.
    let setting = format!(
        "{}/v1/admin/config/scheduling.max_dag_size",
        url.trim_end_matches('/')
    );
    let limit: Value = http
        .get(&setting)
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?;
    let raised = limit["value"].as_u64().unwrap_or(0) < (n + 2) as u64;
    if raised {
        let resp = http
            .put(&setting)
            .bearer_auth(token)
            .json(&json!({ "value": n + 2 }))
            .send()
            .await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "raise scheduling.max_dag_size: {} {}",
            resp.status(),
            resp.text().await?
        );
    }
    let runs = async {
        let run = format!("b{}", std::process::id());
        for (kind, dag) in [
            ("chain", chain(&format!("{run}-chain"), tenant, n)),
            ("fanout", fan(&format!("{run}-fan"), tenant, n)),
        ] {
            let name = dag["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let start = Instant::now();
            let resp = http
                .post(&base)
                .bearer_auth(token)
                .json(&dag)
                .send()
                .await?;
            if !resp.status().is_success() {
                anyhow::bail!("submit {kind}: {} {}", resp.status(), resp.text().await?);
            }
            let phase = loop {
                let d: Value = http
                    .get(format!("{base}/{name}"))
                    .bearer_auth(token)
                    .send()
                    .await?
                    .json()
                    .await?;
                let p = d["status"]["phase"].as_str().unwrap_or("").to_string();
                if ["Completed", "Failed", "Cancelled"].contains(&p.as_str()) {
                    break p;
                }
                if start.elapsed() > Duration::from_secs(600) {
                    anyhow::bail!(
                        "{kind} DAG did not finish in 600 s: {}",
                        d["status"]["counts"]
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            let wall_s = start.elapsed().as_secs_f64();
            // The steps' own runtime on the critical path: the chain runs its n steps one
            // after the other; the fan-out runs root, then its n workers `ready` at a time
            // (whole nodes each), then join.
            let serial_steps = match kind {
                "chain" => n,
                _ => 2 + n.div_ceil(ready),
            };
            let steps_s = serial_steps as f64 * runtime_ms / 1000.0;
            let overhead_s = (wall_s - steps_s).max(0.0);
            println!("RESULT dag_{kind}_{n}_phase={phase}");
            anyhow::ensure!(phase == "Completed", "the {kind} DAG ended {phase}");
            println!("RESULT dag_{kind}_{n}_s={wall_s:.2}");
            println!("RESULT dag_{kind}_{n}_steps_runtime_s={steps_s:.3}");
            println!("RESULT dag_{kind}_{n}_overhead_s={overhead_s:.2}");
            println!(
                "RESULT dag_{kind}_{n}_overhead_ms_per_step={:.1}",
                overhead_s * 1000.0 / n as f64
            );
        }
        anyhow::Ok(())
    }
    .await;
    // Reset on every way out, then report how the runs went.
    if raised {
        let resp = http.delete(&setting).bearer_auth(token).send().await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "reset scheduling.max_dag_size: {} {}",
            resp.status(),
            resp.text().await?
        );
    }
    runs
}
