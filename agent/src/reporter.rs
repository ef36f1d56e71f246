//! Sends this node's reports (`status.nodeStates[node]`) to the API, in order, from
//! the queue kept in the state file.
//!
//! Each report is a guarded read-modify-write of `/status`:
//! `lifecycle::record_node_state` on the latest allocation, then a PUT carrying the
//! resourceVersion read (a 409 re-reads and retries). `record_node_state` ignores
//! duplicates and stale attempts, so replaying the queue after a restart is harmless.
//! While the API is unreachable the queue waits (with backoff) and the workloads run on.

use std::sync::Arc;
use std::time::Duration;

use lattice_apis::lifecycle::record_node_state;
use lattice_apis::Allocation;
use lattice_runtime::{Api, Client, PostParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::state::{PendingReport, StateFile};

/// Conflicts tolerated per report before backing off.
const CONFLICT_RETRIES: usize = 20;

/// The report sender.
#[derive(Debug)]
pub struct Reporter {
    client: Client,
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
    pub fn new(client: Client, node: &str, state: Arc<StateFile>, metrics: Arc<Metrics>) -> Self {
        Self {
            client,
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
        let api: Api<Allocation> = Api::namespaced(self.client.clone(), &r.namespace);
        for _ in 0..CONFLICT_RETRIES {
            let mut a = match api.get(&r.name).await {
                Ok(a) => a,
                Err(e) if e.is_not_found() => return Outcome::Done,
                Err(e) => return Outcome::Retry(e.to_string()),
            };
            if a.metadata.uid.as_deref() != Some(r.uid.as_str()) {
                // Deleted and re-created under the same name: not ours any more.
                return Outcome::Done;
            }
            if !record_node_state(
                &mut a,
                &self.node,
                r.report.clone(),
                lattice_apis::meta::now(),
            ) {
                return Outcome::Done;
            }
            match api
                .replace_status(&r.name, &PostParams::default(), &a)
                .await
            {
                Ok(_) => {
                    self.metrics.reports_sent.inc();
                    tracing::info!(
                        allocation = %format!("{}/{}", r.namespace, r.name),
                        attempt = r.report.attempt,
                        phase = ?r.report.phase,
                        reason = r.report.reason.as_deref().unwrap_or(""),
                        "reported"
                    );
                    return Outcome::Done;
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) if e.is_not_found() => return Outcome::Done,
                Err(e)
                    if e.code()
                        .is_some_and(|c| (400..500).contains(&c) && c != 429) =>
                {
                    // The API refuses this report for good (validation, permissions): retrying
                    // cannot help and would block every later report.
                    tracing::error!(
                        allocation = %format!("{}/{}", r.namespace, r.name),
                        error = %e,
                        "the API rejected a node report; dropping it"
                    );
                    return Outcome::Done;
                }
                Err(e) => return Outcome::Retry(e.to_string()),
            }
        }
        Outcome::Retry("too many conflicting writers".into())
    }
}
