//! The output of one cycle: proposals (each becomes one store transaction in the live
//! controller), reservations and a reason for every job left pending.

use std::fmt;

use serde::Serialize;

use crate::model::{JobId, NodeId, Time};

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ProposalKind {
    /// Start in queue order on free nodes.
    Start,
    /// Started ahead of a blocked job without delaying any reservation.
    Backfill,
    /// Sensitive node claim (sensitive-reservation scheduler).
    Claim,
    /// One more node for a running reactive allocation (`PendingJob::scale_up`).
    ScaleUp,
    /// Start after the victims have checkpointed and released their nodes. `reclaim`: every
    /// victim borrowed the job's own home nodes and is being sent back.
    Preempt {
        victims: Vec<JobId>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reclaim: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Proposal {
    pub job: JobId,
    /// Sorted node ids.
    pub nodes: Vec<NodeId>,
    pub kind: ProposalKind,
    pub score: f64,
    /// Nodes borrowed from another vCluster's idle pool.
    pub borrowed_nodes: u32,
    pub groups: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reservation {
    pub job: JobId,
    /// When the reserved nodes are free at the latest (their work's kill times, or
    /// predictions with `running_ends: predicted`).
    pub start: Time,
    /// When the job is expected to start: the reserved nodes' predicted ends (`start`
    /// without prediction). What users are told.
    pub expected: Time,
    pub nodes: Vec<NodeId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaKind {
    MaxNodes,
    MaxConcurrentAllocations,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum PendingReason {
    NoMatchingNodes {
        requested: u32,
        matching: u32,
        total: u32,
    },
    InsufficientConformanceGroup {
        requested: u32,
        largest: u32,
    },
    NodesOccupied {
        requested: u32,
        free: u32,
    },
    QuotaHeadroom {
        quota: QuotaKind,
        current: u32,
        requested: u32,
        limit: u32,
    },
    /// Blocked behind an earlier job in a strict-FIFO queue.
    WaitingBehind {
        job: JobId,
    },
    /// Could start now, but only by delaying a reservation.
    BlockedByReservation {
        free: u32,
    },
    Reserved {
        start: Time,
        /// The start was planned on predicted runtimes (of the job and the running work).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        predicted: bool,
    },
    /// A running reactive allocation may grow, and free nodes match it, but none it may
    /// take: already used by this attempt, of another conformance fingerprint, or
    /// borrowed (a lender's reclaim could not take back part of an allocation).
    NoScaleUpNode {
        excluded: u32,
        other_fingerprint: u32,
        borrowed: u32,
    },
    /// Allocations it preempts are still stopping; their nodes come to it.
    WaitingForPreemption {
        victims: u32,
    },
    /// Waiting for busy nodes, behind other work because its tenant has used most of its
    /// soft GPU/node-hours budget: the seed's budget penalty multiplies its score.
    SoftQuotaPenalty {
        /// Budget used, in percent (the worse of GPU- and node-hours).
        budget_used_pct: u32,
        /// What the score is multiplied by.
        priority_factor: f64,
        requested: u32,
        free: u32,
    },
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::NoMatchingNodes {
                requested,
                matching,
                total,
            } => write!(
                f,
                "no nodes matching constraints (requested {requested}, {matching} of {total} nodes match)"
            ),
            PendingReason::InsufficientConformanceGroup { requested, largest } => write!(
                f,
                "insufficient conformance group (requested {requested}, largest group {largest})"
            ),
            PendingReason::NodesOccupied { requested, free } => write!(
                f,
                "all suitable nodes occupied (requested {requested}, {free} free)"
            ),
            PendingReason::QuotaHeadroom {
                quota,
                current,
                requested,
                limit,
            } => {
                let q = match quota {
                    QuotaKind::MaxNodes => "max_nodes",
                    QuotaKind::MaxConcurrentAllocations => "max_concurrent_allocations",
                };
                write!(
                    f,
                    "waiting for quota headroom ({q}: current {current}, requested {requested}, limit {limit})"
                )
            }
            PendingReason::WaitingBehind { job } => {
                write!(f, "waiting behind job {} (strict FIFO)", job.0)
            }
            PendingReason::BlockedByReservation { free } => write!(
                f,
                "free nodes ({free}) are reserved for higher-priority jobs"
            ),
            PendingReason::Reserved {
                start,
                predicted: false,
            } => write!(f, "reserved to start at t={start}"),
            PendingReason::Reserved {
                start,
                predicted: true,
            } => write!(f, "expected to start at t={start} (predicted runtimes)"),
            PendingReason::SoftQuotaPenalty {
                budget_used_pct,
                priority_factor,
                requested,
                free,
            } => write!(
                f,
                "soft quota penalty: the tenant has used {budget_used_pct}% of its budget, so its \
                 priority is multiplied by {priority_factor:.2} (requested {requested}, {free} free)"
            ),
            PendingReason::NoScaleUpNode {
                excluded,
                other_fingerprint,
                borrowed,
            } => write!(
                f,
                "no free node it may grow onto: of the free matching nodes, {excluded} already \
                 ran this attempt, {other_fingerprint} have another conformance fingerprint, \
                 {borrowed} are borrowed"
            ),
            PendingReason::WaitingForPreemption { victims } => write!(
                f,
                "waiting for {victims} preempted allocation(s) to stop and free their nodes"
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingExplanation {
    pub job: JobId,
    pub reason: PendingReason,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Plan {
    pub now: Time,
    pub proposals: Vec<Proposal>,
    pub reservations: Vec<Reservation>,
    /// Only filled when `SchedulerConfig::explain` is set.
    pub pending: Vec<PendingExplanation>,
}
