//! Sends this node's reports (`status.nodeStates[node]`) to the API, in order, from
//! the queue kept in the state file.
//!
//! Each report goes to the allocation's `report` subresource
//! ([`lattice_apis::lifecycle::NodeReport`]): the API server applies
//! `lifecycle::record_node_state` to the stored allocation in a guarded write of its own,
//! so the agent writes its report and nothing else of the status. `record_node_state`
//! ignores duplicates and stale attempts, so replaying the queue after a restart is
//! harmless. While the API is unreachable the queue waits (with backoff) and the
//! workloads run on.

use std::sync::Arc;
use std::time::Duration;

use lattice_apis::lifecycle::{NodeReport, REPORT_SUBRESOURCE};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::agent::ApiHttp;
use crate::metrics::Metrics;
use crate::state::{PendingReport, StateFile};

/// The report sender.
#[derive(Debug)]
pub struct Reporter {
    api: ApiHttp,
    node: String,
    state: Arc<StateFile>,
    metrics: Arc<Metrics>,
    wake: Notify,
}

enum Outcome {
    /// Recorded, or nothing left to record (duplicate, stale, allocation gone).
    Done,
    /// Try again later.
    Retry(String),
}

impl Reporter {
    /// A reporter for `node`.
    pub fn new(api: ApiHttp, node: &str, state: Arc<StateFile>, metrics: Arc<Metrics>) -> Self {
        Self {
            api,
            node: node.to_string(),
            state,
            metrics,
            wake: Notify::new(),
        }
    }

    /// Queue a report (durably) and wake the sender.
    pub fn enqueue(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        report: lattice_apis::NodeTaskState,
    ) -> anyhow::Result<()> {
        self.state
            .update(|s| s.push_report(namespace, name, uid, report))?;
        self.wake();
        Ok(())
    }

    /// Something was queued (through [`StateFile::update`] directly).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Send queued reports until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let head = self.state.read(|s| {
                self.metrics
                    .reports_pending
                    .set(s.pending_reports.len() as i64);
                s.pending_reports.first().cloned()
            });
            let Some(head) = head else {
                tokio::select! {
                    _ = self.wake.notified() => continue,
                    _ = shutdown.cancelled() => return,
                }
            };
            match self.send(&head).await {
                Outcome::Done => {
                    backoff = Duration::from_millis(200);
                    if let Err(e) = self
                        .state
                        .update(|s| s.pending_reports.retain(|r| r.seq != head.seq))
                    {
                        tracing::warn!(error = %e, "cannot persist the report queue");
                    }
                }
                Outcome::Retry(why) => {
                    self.metrics.report_failures.inc();
                    tracing::warn!(
                        allocation = %format!("{}/{}", head.namespace, head.name),
                        error = %why,
                        retry_in_ms = backoff.as_millis() as u64,
                        "cannot report to the API; will retry"
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    async fn send(&self, r: &PendingReport) -> Outcome {
        let url = self.api.url(&format!(
            "/apis/{}/namespaces/{}/allocations/{}/{REPORT_SUBRESOURCE}",
            lattice_apis::API_VERSION,
            r.namespace,
            r.name
        ));
        let body = NodeReport {
            node: self.node.clone(),
            uid: r.uid.clone(),
            report: r.report.clone(),
        };
        let resp = match self
            .api
            .http
            .post(url)
            .timeout(Duration::from_secs(30))
            .json(&body)
            .send()
            .await
        {
            Ok(resp) => resp,
            Err(e) => return Outcome::Retry(e.to_string()),
        };
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let allocation = format!("{}/{}", r.namespace, r.name);
        match code {
            200..=299 => {
                self.metrics.reports_sent.inc();
                tracing::info!(
                    %allocation,
                    attempt = r.report.attempt,
                    phase = ?r.report.phase,
                    reason = r.report.reason.as_deref().unwrap_or(""),
                    recorded = !text.contains("\"recorded\":false"),
                    "reported"
                );
                Outcome::Done
            }
            // Gone, or deleted and re-created under the same name: not ours any more.
            404 | 409 if !text.contains("concurrent writers") => Outcome::Done,
            400..=499 if code != 429 && code != 409 => {
                // The API refuses this report for good (validation, permissions): retrying
                // cannot help and would block every later report.
                tracing::error!(%allocation, code, error = %text, "the API rejected a node report; dropping it");
                Outcome::Done
            }
            _ => Outcome::Retry(format!("{code}: {text}")),
        }
    }
}
