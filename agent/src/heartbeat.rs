//! The heartbeat: the `Lease` `lattice-node-lease/<node>`, renewed every
//! `--heartbeat-interval`, with a sequence number in the annotation
//! `lattice.dev/heartbeat-sequence` that never goes back, not even across restarts.
//!
//! Sequence numbers are reserved in blocks in the state file ([`SEQUENCE_BLOCK`] at a
//! time), so a heartbeat costs one API write and no fsync, and a restarted agent
//! continues above anything it may have used. A failing heartbeat only logs (with
//! backoff) and counts; it never touches workloads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lattice_apis::{Lease, LeaseSpec, ObjectMeta};
use lattice_runtime::{Api, PostParams};

use crate::agent::Ctx;

/// Namespace of the node heartbeat Leases.
pub const LEASE_NAMESPACE: &str = "lattice-node-lease";
/// Annotation carrying the heartbeat sequence number.
pub const SEQUENCE_ANNOTATION: &str = "lattice.dev/heartbeat-sequence";
/// Sequence numbers reserved per state-file write.
pub const SEQUENCE_BLOCK: u64 = 1000;

/// Hands out heartbeat sequence numbers, reserving them in the state file.
#[derive(Debug)]
pub struct Sequence {
    next: u64,
    reserved: u64,
}

impl Sequence {
    /// Continue above what the state file says may have been used.
    pub fn resume(ctx: &Ctx) -> Self {
        let used = ctx.state.read(|s| s.heartbeat_sequence);
        Self {
            next: used + 1,
            reserved: used,
        }
    }

    /// Never go below `floor` (what the Lease already carries).
    pub fn at_least(&mut self, floor: u64) {
        self.next = self.next.max(floor);
    }

    /// The next number; reserves a new block durably when needed.
    pub fn take(&mut self, ctx: &Ctx) -> anyhow::Result<u64> {
        if self.next > self.reserved {
            let upto = self.next + SEQUENCE_BLOCK - 1;
            ctx.state
                .update(|s| s.heartbeat_sequence = s.heartbeat_sequence.max(upto))?;
            self.reserved = upto;
        }
        let n = self.next;
        self.next += 1;
        Ok(n)
    }
}

/// Renew the Lease until shutdown.
pub async fn run(ctx: Arc<Ctx>) {
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), LEASE_NAMESPACE);
    let mut seq = Sequence::resume(&ctx);
    let mut cached: Option<Lease> = None;
    let mut failures: u32 = 0;
    let mut last_warn: Option<Instant> = None;
    loop {
        let started = Instant::now();
        match renew(&ctx, &api, &mut cached, &mut seq).await {
            Ok(n) => {
                ctx.metrics.heartbeats.inc();
                if failures > 0 {
                    tracing::info!(
                        sequence = n,
                        after_failures = failures,
                        "heartbeat restored"
                    );
                }
                failures = 0;
                last_warn = None;
            }
            Err(e) => {
                ctx.metrics.heartbeat_failures.inc();
                failures += 1;
                // Log the first failure, then at most every 2^k intervals (capped at a minute).
                let quiet = ctx
                    .cfg
                    .heartbeat_interval
                    .saturating_mul(1 << failures.min(6))
                    .min(Duration::from_secs(60));
                if last_warn.is_none_or(|t| t.elapsed() >= quiet) {
                    tracing::warn!(error = %e, failures, "heartbeat failed; workloads are unaffected");
                    last_warn = Some(Instant::now());
                }
            }
        }
        let wait = ctx.cfg.heartbeat_interval.saturating_sub(started.elapsed());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = ctx.shutdown.cancelled() => return,
        }
    }
}

fn sequence_of(l: &Lease) -> u64 {
    l.metadata
        .annotations
        .get(SEQUENCE_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One renewal; returns the sequence number written.
async fn renew(
    ctx: &Ctx,
    api: &Api<Lease>,
    cached: &mut Option<Lease>,
    seq: &mut Sequence,
) -> anyhow::Result<u64> {
    let node = ctx.cfg.node.as_str();
    for _ in 0..5 {
        let now = lattice_apis::meta::now();
        let current = match cached.take() {
            Some(l) => Some(l),
            None => api.get_opt(node).await?,
        };
        match current {
            None => {
                let n = seq.take(ctx)?;
                let mut meta = ObjectMeta::named(node, Some(LEASE_NAMESPACE));
                meta.annotations
                    .insert(SEQUENCE_ANNOTATION.into(), n.to_string());
                let lease = Lease {
                    metadata: meta,
                    spec: LeaseSpec {
                        holder_identity: Some(node.to_string()),
                        lease_duration_seconds: Some(ctx.cfg.lease_duration_seconds),
                        acquire_time: Some(now),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                    },
                    ..Default::default()
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(l) => {
                        *cached = Some(l);
                        return Ok(n);
                    }
                    Err(e) if e.is_already_exists() => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Some(mut l) => {
                seq.at_least(sequence_of(&l) + 1);
                let n = seq.take(ctx)?;
                if l.spec.holder_identity.as_deref() != Some(node) {
                    l.spec.holder_identity = Some(node.to_string());
                    l.spec.acquire_time = Some(now);
                    l.spec.lease_transitions = Some(l.spec.lease_transitions.unwrap_or(0) + 1);
                }
                l.spec.renew_time = Some(now);
                l.spec.lease_duration_seconds = Some(ctx.cfg.lease_duration_seconds);
                l.metadata
                    .annotations
                    .insert(SEQUENCE_ANNOTATION.into(), n.to_string());
                match api.replace(node, &PostParams::default(), &l).await {
                    Ok(l) => {
                        *cached = Some(l);
                        return Ok(n);
                    }
                    // Someone else wrote it (or it was deleted): re-read and try again.
                    Err(e) if e.is_conflict() || e.is_not_found() => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    anyhow::bail!("the heartbeat Lease kept changing under us")
}
