//! The heartbeat: one long-lived connection to the API server
//! (`POST /apis/lattice.dev/v1alpha1/nodes/<node>/heartbeat?sequence=N`, upgraded to
//! `lattice-heartbeat/1`) carrying one line per `--heartbeat-interval`, the next
//! heartbeat sequence number. The server keeps
//! the node's `Lease` `lattice-node-lease/<node>` attached to a store lease that each line
//! renews in memory, so a heartbeat is a few bytes on an open connection, not a write.
//! When the server ends the stream (lease expired, server restart, idle, shutdown: one
//! JSON line, then close) or the connection breaks (a heartbeat unacknowledged for three
//! intervals fails it: `TCP_USER_TIMEOUT`), the agent reconnects with backoff; a
//! reconnect within the TTL keeps the same Lease.
//!
//! Sequence numbers never go back, not even across restarts: they are reserved in blocks
//! in the state file ([`SEQUENCE_BLOCK`] at a time), so a heartbeat costs no fsync and a
//! restarted agent continues above anything it may have used. A failing heartbeat only
//! logs (with backoff) and counts; it never touches workloads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::agent::Ctx;

/// Namespace of the node heartbeat Leases.
pub const LEASE_NAMESPACE: &str = lattice_apis::NODE_LEASE_NAMESPACE;
/// Annotation carrying the heartbeat sequence number.
pub const SEQUENCE_ANNOTATION: &str = lattice_apis::HEARTBEAT_SEQUENCE_ANNOTATION;
/// The `Upgrade` protocol of the heartbeat stream.
pub const PROTOCOL: &str = "lattice-heartbeat/1";
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

/// Keep a heartbeat stream open until shutdown.
pub async fn run(ctx: Arc<Ctx>) {
    let http = match ctx
        .api
        .builder()
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        // A server host that died without closing the connection: the next heartbeat
        // stays unacknowledged, and the kernel fails the connection after this long.
        .tcp_user_timeout(
            ctx.cfg
                .heartbeat_interval
                .saturating_mul(3)
                .max(Duration::from_secs(5)),
        )
        .http1_only()
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the heartbeat HTTP client; no heartbeats");
            return;
        }
    };
    let mut seq = Sequence::resume(&ctx);
    let mut failures: u32 = 0;
    let mut last_warn: Option<Instant> = None;
    loop {
        let opened = Instant::now();
        let outcome = stream(&ctx, &http, &mut seq).await;
        if ctx.shutdown.is_cancelled() {
            return;
        }
        // A stream that lived a while was healthy: reconnect at once.
        let healthy = opened.elapsed() >= ctx.cfg.heartbeat_interval.saturating_mul(2);
        match outcome {
            // A stream the server ended quickly counts as a failure, so that repeated
            // quick endings back off instead of reopening (a Lease write) in a loop.
            Ok(why) if healthy => {
                tracing::info!(reason = %why, "heartbeat stream ended; reconnecting");
                failures = 0;
                last_warn = None;
            }
            Ok(why) | Err(why) => {
                ctx.metrics.heartbeat_failures.inc();
                failures += 1;
                // Log the first failure, then at most every 2^k intervals (capped at a minute).
                let quiet = ctx
                    .cfg
                    .heartbeat_interval
                    .saturating_mul(1 << failures.min(6))
                    .min(Duration::from_secs(60));
                if last_warn.is_none_or(|t| t.elapsed() >= quiet) {
                    tracing::warn!(error = %why, failures, "heartbeat failed; workloads are unaffected");
                    last_warn = Some(Instant::now());
                }
            }
        }
        // Back off while failing: one interval times 2^(failures-1), capped at 30 s.
        let wait = if failures == 0 {
            Duration::from_millis(100)
        } else {
            ctx.cfg
                .heartbeat_interval
                .saturating_mul(1 << (failures - 1).min(5))
                .min(Duration::from_secs(30))
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = ctx.shutdown.cancelled() => return,
        }
    }
}

/// One stream: open it (an upgraded connection), send a line per interval until the
/// server ends it or the connection fails. `Ok(reason)` when the server ended it, `Err`
/// when it failed.
async fn stream(ctx: &Ctx, http: &reqwest::Client, seq: &mut Sequence) -> Result<String, String> {
    let first = seq.take(ctx).map_err(|e| e.to_string())?;
    let url = ctx.api.url(&format!(
        "/apis/{}/nodes/{}/heartbeat?sequence={first}",
        lattice_apis::wellknown::API_VERSION,
        ctx.cfg.node
    ));
    let req = http
        .post(url)
        .header("connection", "upgrade")
        .header("upgrade", PROTOCOL);
    let started = Instant::now();
    // The 101 arrives once the server has written the Lease.
    let resp = tokio::select! {
        r = req.send() => r.map_err(|e| format!("opening the heartbeat stream: {e}"))?,
        _ = ctx.shutdown.cancelled() => return Ok("shutdown".into()),
    };
    if resp.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        let code = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        let msg = crate::api::error_message(code.as_u16(), &body);
        // The server knows a higher sequence (e.g. the state file was lost): jump past it.
        if code == reqwest::StatusCode::CONFLICT {
            if let Some(n) = msg
                .split("is not above ")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .and_then(|n| n.trim().parse::<u64>().ok())
            {
                seq.at_least(n + 1);
            }
        }
        return Err(format!("heartbeat stream refused ({code}): {msg}"));
    }
    let conn = resp
        .upgrade()
        .await
        .map_err(|e| format!("upgrading the heartbeat connection: {e}"))?;
    ctx.metrics
        .heartbeat_latency
        .observe(started.elapsed().as_secs_f64());
    ctx.metrics.heartbeats.inc();
    let (mut rd, mut wr) = tokio::io::split(conn);
    // The opening sequence counts as the first heartbeat; send the next ones.
    let mut tick = tokio::time::interval(ctx.cfg.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut farewell = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let n = seq.take(ctx).map_err(|e| e.to_string())?;
                if let Err(e) = wr.write_all(format!("{n}\n").as_bytes()).await {
                    return Err(format!("heartbeat connection failed: {e}"));
                }
                ctx.metrics.heartbeats.inc();
            }
            r = rd.read(&mut buf) => match r {
                Ok(0) => {
                    let text = String::from_utf8_lossy(&farewell);
                    let why = serde_json::from_str::<serde_json::Value>(text.trim())
                        .ok()
                        .and_then(|v| {
                            let r = v.get("reason")?.as_str()?.to_string();
                            let m = v.get("message").and_then(|m| m.as_str()).unwrap_or("");
                            Some(if m.is_empty() { r } else { format!("{r}: {m}") })
                        })
                        .unwrap_or_else(|| "the server closed the stream".into());
                    return Ok(why);
                }
                Ok(n) if farewell.len() < 4096 => farewell.extend_from_slice(&buf[..n]),
                Ok(_) => {}
                Err(e) => return Err(format!("heartbeat connection failed: {e}")),
            },
            _ = ctx.shutdown.cancelled() => return Ok("shutdown".into()),
        }
    }
}
