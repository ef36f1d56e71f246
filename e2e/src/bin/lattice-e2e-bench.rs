//! End-to-end job throughput of a running Lattice cluster: submit `--jobs` trivial
//! allocations (`/bin/true`) from `--clients` concurrent HTTP clients, then wait until every
//! one is terminal. Prints `RESULT` lines: submit rate, first-submit-to-all-done time and
//! jobs/s. `hack/bench-e2e.sh` runs it beside Slurm.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// API base URL.
    #[arg(long)]
    url: String,
    /// File with the bearer token.
    #[arg(long)]
    token_file: std::path::PathBuf,
    /// Tenant (namespace) to submit into.
    #[arg(long, default_value = "default")]
    tenant: String,
    /// Jobs to submit.
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    /// Concurrent submitting clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Prefix of the metric names.
    #[arg(long, default_value = "lattice")]
    prefix: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let token = std::fs::read_to_string(&args.token_file)?
        .trim()
        .to_string();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let base = format!(
        "{}/apis/lattice.dev/v1alpha1/namespaces/{}/allocations",
        args.url.trim_end_matches('/'),
        args.tenant
    );
    let run = format!("b{}", std::process::id());
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let submitted = futures::stream::iter(0..args.clients)
        .map(|_| {
            let http = http.clone();
            let base = base.clone();
            let token = token.clone();
            let next = next.clone();
            let run = run.clone();
            let jobs = args.jobs;
            async move {
                let mut n = 0usize;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= jobs {
                        return Ok::<usize, anyhow::Error>(n);
                    }
                    let body = json!({
                        "apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
                        "metadata": {"name": format!("{run}-{i}"), "labels": {"bench": run}},
                        "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "5m"},
                                 "requeue": {"policy": "never"}},
                    });
                    let resp = http
                        .post(&base)
                        .bearer_auth(&token)
                        .json(&body)
                        .send()
                        .await?;
                    if !resp.status().is_success() {
                        anyhow::bail!(
                            "submit {i}: {} {}",
                            resp.status(),
                            resp.text().await.unwrap_or_default()
                        );
                    }
                    n += 1;
                }
            }
        })
        .buffer_unordered(args.clients)
        .collect::<Vec<_>>()
        .await;
    let mut total = 0;
    for s in submitted {
        total += s?;
    }
    let submit_s = start.elapsed().as_secs_f64();
    println!(
        "RESULT {}_submit_per_s={:.1}",
        args.prefix,
        total as f64 / submit_s
    );

    // Poll (cheap list with a label selector) until every job is terminal.
    let deadline = start + Duration::from_secs(args.timeout_s);
    let (done, failed) = loop {
        let resp: Value = http
            .get(&base)
            .query(&[("labelSelector", format!("bench={run}"))])
            .bearer_auth(&token)
            .send()
            .await?
            .json()
            .await?;
        let items = resp["items"].as_array().cloned().unwrap_or_default();
        let terminal = items
            .iter()
            .filter(|a| {
                matches!(
                    a["status"]["phase"].as_str(),
                    Some("Completed" | "Failed" | "Cancelled")
                )
            })
            .count();
        let failed = items
            .iter()
            .filter(|a| a["status"]["phase"].as_str() != Some("Completed"))
            .count();
        if terminal >= total {
            break (terminal, failed);
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "only {terminal} of {total} jobs finished within {}s",
                args.timeout_s
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let all_done = start.elapsed().as_secs_f64();
    println!("RESULT {}_jobs={done}", args.prefix);
    println!("RESULT {}_jobs_not_completed={failed}", args.prefix);
    println!(
        "RESULT {}_first_submit_to_all_done_s={all_done:.2}",
        args.prefix
    );
    println!(
        "RESULT {}_jobs_per_s={:.1}",
        args.prefix,
        done as f64 / all_done
    );
    Ok(())
}
