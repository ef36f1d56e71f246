//! Scheduler extenders (`spec.extenders`): once per cycle, every extender of the vCluster
//! gets one batched request with the cycle's candidate jobs and nodes
//! ([`lattice_apis::extender`]); its answer removes nodes for this cycle (`filter`) and adds
//! a weighted term to the jobs' scores (`score`). Extenders are asked concurrently, each
//! within its `timeout`.
//!
//! A failed call (refused, timed out, an HTTP error, an unreadable or oversized answer) is
//! counted in `lattice_scheduling_extender_errors_total` and then follows the extender's
//! `failurePolicy`: `ignore` schedules as if it were not configured; `fail` keeps the
//! vCluster's jobs pending this cycle, with a reason naming the extender.
//!
//! What is sent is documented in [`lattice_apis::extender`]: no command, environment,
//! annotations or credentials of any job. Redirects are not followed (an extender cannot
//! forward the request elsewhere).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lattice_apis::extender::{
    ExtenderJob, ExtenderNode, ExtenderRequest, ExtenderResponse, MAX_JOBS, MAX_NODES,
    MAX_RESPONSE_BYTES,
};
use lattice_apis::kinds::vcluster::{Extender, ExtenderFailurePolicy};
use lattice_apis::{Allocation, Node};
use lattice_runtime::ResourceExt;
use lattice_scheduler::{ExternalScores, ExternalTerm, NodeView, PendingJob};

use crate::metrics::SchedulerMetrics;

/// The HTTP client the scheduler asks extenders with (one per scheduler: connections are
/// reused across cycles).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "extender HTTP client: default settings");
            reqwest::Client::new()
        })
}

/// What the extenders decided for one cycle.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Nodes no job of the vCluster may use this cycle, by name (each extender's reasons
    /// are logged at `debug`).
    pub filtered: HashSet<String>,
    /// Score terms, per pending job in the order of the `jobs` given to [`consult`].
    pub scores: ExternalScores,
    /// A `failurePolicy: fail` extender failed: the reason the jobs wait with.
    pub blocked: Option<String>,
}

/// The request for this cycle: the first [`MAX_JOBS`] jobs (`(allocation, its core view)`,
/// in snapshot order), the first [`MAX_NODES`] candidate nodes (`(name, labels, view)`).
pub fn request(
    vcluster: &str,
    jobs: &[(&Allocation, &PendingJob)],
    nodes: &[(&str, Option<&Node>, &NodeView)],
) -> ExtenderRequest {
    ExtenderRequest {
        vcluster: vcluster.to_string(),
        filter: false,
        score: false,
        jobs: jobs.iter().take(MAX_JOBS).map(|(a, j)| job(a, j)).collect(),
        nodes: nodes
            .iter()
            .take(MAX_NODES)
            .map(|(name, n, v)| ExtenderNode {
                name: name.to_string(),
                labels: n.map(|n| n.metadata.labels.clone()).unwrap_or_default(),
                gpus: v.gpus,
                gpu_type: v.gpu_type.clone(),
                features: v.features.clone(),
                group: v.topology_group,
            })
            .collect(),
    }
}

/// A job as extenders see it: placement facts and labels, nothing secret.
fn job(a: &Allocation, j: &PendingJob) -> ExtenderJob {
    let tenant = a.namespace().unwrap_or("default").to_string();
    ExtenderJob {
        name: format!("{tenant}/{}", a.name_any()),
        tenant,
        user: a
            .metadata
            .annotations
            .get(lattice_apis::steps::USER_ANNOTATION)
            .cloned(),
        nodes: j.nodes.min,
        gpu_type: j.constraints.gpu_type.clone(),
        gpus_per_node: j.constraints.min_gpus_per_node,
        features: j.constraints.features.clone(),
        any_of: j.constraints.any_of.clone(),
        preemption_class: j.preemption_class,
        walltime_seconds: u64::try_from(j.walltime_s).ok(),
        labels: a.metadata.labels.clone(),
    }
}

/// Ask every extender of `extenders` about `req` (its `filter`/`score` are set per
/// extender), concurrently. `all_nodes`: every candidate node, sent or not (beyond the
/// bound); `pending`: the snapshot's pending jobs, of which `req.jobs` are the first.
pub async fn consult(
    http: &reqwest::Client,
    metrics: &SchedulerMetrics,
    vcluster: &str,
    extenders: &[Extender],
    req: &ExtenderRequest,
    all_nodes: &[String],
    pending: usize,
) -> Verdict {
    let calls = extenders.iter().map(|e| async move {
        let started = Instant::now();
        let result = call(http, e, req).await;
        metrics.observe_extender(vcluster, &e.name, started.elapsed(), result.is_ok());
        (e, result)
    });
    let mut verdict = Verdict::default();
    let sent: HashSet<&str> = req.nodes.iter().map(|n| n.name.as_str()).collect();
    for (e, result) in futures::future::join_all(calls).await {
        let policy = e.failure_policy.unwrap_or_default();
        let answer = match result {
            Ok(a) => a,
            Err(why) => {
                tracing::warn!(vcluster, extender = %e.name, url = %e.url, error = %why, ?policy, "scheduler extender failed");
                if policy == ExtenderFailurePolicy::Fail && verdict.blocked.is_none() {
                    verdict.blocked = Some(format!(
                        "scheduler extender {:?} failed ({why}); with failurePolicy: fail this \
                         vCluster's allocations wait until it answers",
                        e.name
                    ));
                }
                continue;
            }
        };
        if e.filter {
            for (n, why) in &answer.filtered_nodes {
                tracing::debug!(vcluster, extender = %e.name, node = %n, reason = %why, "node filtered");
                verdict.filtered.insert(n.clone());
            }
            // A node it was not sent (beyond MAX_NODES) it could not vouch for.
            verdict.filtered.extend(
                all_nodes
                    .iter()
                    .filter(|n| !sent.contains(n.as_str()))
                    .cloned(),
            );
        }
        if e.score {
            let values = req
                .jobs
                .iter()
                .map(|j| {
                    answer
                        .scores
                        .get(&j.name)
                        .copied()
                        .filter(|v| v.is_finite())
                        .map_or(0.0, |v| v.clamp(0.0, 1.0))
                })
                .chain(std::iter::repeat(0.0))
                .take(pending)
                .collect();
            verdict.scores.push(ExternalTerm {
                name: e.name.clone(),
                weight: e.weight.unwrap_or(0.0),
                values,
            });
        }
    }
    verdict
}

/// One call: POST the request as JSON, read at most [`MAX_RESPONSE_BYTES`] of answer.
async fn call(
    http: &reqwest::Client,
    e: &Extender,
    req: &ExtenderRequest,
) -> Result<ExtenderResponse, String> {
    let timeout = Duration::from_millis(e.timeout_ms());
    let req = ExtenderRequest {
        filter: e.filter,
        score: e.score,
        ..req.clone()
    };
    let exchange = async {
        let mut resp = http
            .post(&e.url)
            .json(&req)
            .send()
            .await
            .map_err(|err| format!("request failed: {err}"))?;
        if !resp.status().is_success() {
            return Err(format!("answered HTTP {}", resp.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|err| format!("reading the answer: {err}"))?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(format!("answer larger than {MAX_RESPONSE_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice::<ExtenderResponse>(&body)
            .map_err(|err| format!("unreadable answer: {err}"))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} ms", timeout.as_millis())))
}
