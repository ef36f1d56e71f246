//! Leadership: who may run controllers.
//!
//! * [`LeaderGate`]: the abstraction the [`ControllerHost`](crate::ControllerHost) runs
//!   under — a `watch` of "am I leader". Built-in controllers use the store's view
//!   ([`AlwaysLeader`] for the single embedded member; a Raft store plugs its
//!   `is_leader` in through a `watch::Receiver<bool>`, which implements the trait).
//! * [`LeaseLock`] / [`LeaderElector`]: out-of-process controllers elect a leader
//!   through a `Lease` object (acquire, renew, release). Every write is a PUT carrying
//!   the resourceVersion read, so of two contenders only one can win a round; a
//!   leader that could not renew within `renew_deadline` (< `lease_duration`) steps
//!   down *before* anyone else may take over; and a deposed leader's late renewal
//!   fails with 409 — the resourceVersion is the fencing token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lattice_apis::{Lease, LeaseSpec, ObjectMeta, SYSTEM_NAMESPACE};
use tokio::sync::{watch, Mutex};

use crate::api::Api;
use crate::client::{Client, PostParams};
use crate::resource::ResourceExt;

/// Reads and writes a release tries before it leaves the lease to expire.
const RELEASE_ATTEMPTS: usize = 5;
/// Whether this process may run controllers now.
pub trait LeaderGate: Send + Sync + 'static {
    /// `true` while leader; changes are pushed.
    fn subscribe(&self) -> watch::Receiver<bool>;

    /// Leader right now?
    fn is_leader(&self) -> bool {
        *self.subscribe().borrow()
    }
}

impl LeaderGate for watch::Receiver<bool> {
    fn subscribe(&self) -> watch::Receiver<bool> {
        self.clone()
    }
}

/// Always leader: the single embedded store member.
#[derive(Debug)]
pub struct AlwaysLeader {
    tx: watch::Sender<bool>,
}

impl Default for AlwaysLeader {
    fn default() -> Self {
        Self {
            tx: watch::channel(true).0,
        }
    }
}

impl AlwaysLeader {
    /// A gate that is always open.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LeaderGate for AlwaysLeader {
    fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }
}

/// Lease election settings (client-go's defaults).
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease object name, e.g. `site-labeler`.
    pub name: String,
    /// Tenant of the Lease ([`SYSTEM_NAMESPACE`] by default).
    pub namespace: String,
    /// This contender's identity (host name + pid, say). Must be unique.
    pub identity: String,
    /// How long a lease is valid without renewal (15 s).
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long steps down (10 s; must be below
    /// `lease_duration`).
    pub renew_deadline: Duration,
    /// Time between acquire/renew attempts (2 s).
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// Defaults for lease `name` held by `identity`.
    pub fn new(name: &str, identity: &str) -> Self {
        Self {
            name: name.to_string(),
            namespace: SYSTEM_NAMESPACE.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What a contender knows about the lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderState {
    /// This contender holds the lease.
    pub is_leader: bool,
    /// Last known holder.
    pub holder: Option<String>,
    /// The Lease's resourceVersion after our last successful acquire/renew: a fencing
    /// token (any later write by someone else changes it).
    pub fencing_token: Option<String>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
}

struct Observed {
    resource_version: Option<String>,
    at: Instant,
    last_renew: Option<Instant>,
}

/// One contender for a Lease; [`try_acquire_or_renew`](Self::try_acquire_or_renew) is
/// one round, [`LeaseLock::spawn`] runs rounds forever.
pub struct LeaseLock {
    api: Api<Lease>,
    config: LeaseConfig,
    observed: Mutex<Observed>,
    state: watch::Sender<LeaderState>,
}

impl LeaseLock {
    /// A contender through `client`.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: Mutex::new(Observed {
                resource_version: None,
                at: Instant::now(),
                last_renew: None,
            }),
            state: watch::channel(LeaderState::default()).0,
        }
    }

    /// The current state.
    pub fn state(&self) -> watch::Receiver<LeaderState> {
        self.state.subscribe()
    }

    fn spec(&self, old: Option<&LeaseSpec>) -> LeaseSpec {
        let now = chrono::Utc::now();
        let ours = old
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| h == self.config.identity);
        let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_duration.as_secs().max(1) as i32),
            acquire_time: if ours {
                old.and_then(|s| s.acquire_time)
            } else {
                Some(now)
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours || old.is_none() {
                transitions
            } else {
                transitions + 1
            }),
        }
    }

    fn publish(&self, is_leader: bool, lease: Option<&Lease>) {
        self.state.send_modify(|s| {
            s.is_leader = is_leader;
            if let Some(l) = lease {
                s.holder = l.spec.holder_identity.clone();
                s.transitions = l.spec.lease_transitions.unwrap_or(0);
                s.fencing_token = if is_leader {
                    l.resource_version().map(str::to_string)
                } else {
                    None
                };
            } else if !is_leader {
                s.fencing_token = None;
            }
        });
    }

    /// One round: create the Lease, take it over if it expired or was released, or
    /// renew it if ours. Returns whether we hold it afterwards.
    pub async fn try_acquire_or_renew(&self) -> crate::Result<bool> {
        let name = self.config.name.clone();
        let mut obs = self.observed.lock().await;
        let current = self.api.get_opt(&name).await?;
        let Some(lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta::named(name.clone(), Some(&self.config.namespace)),
                spec: self.spec(None),
                ..Lease::default()
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(l) => {
                    obs.resource_version = l.resource_version().map(str::to_string);
                    obs.at = Instant::now();
                    obs.last_renew = Some(Instant::now());
                    self.publish(true, Some(&l));
                    Ok(true)
                }
                Err(e) if e.is_already_exists() => {
                    self.publish(false, None);
                    Ok(false)
                }
                Err(e) => Err(e),
            };
        };
        // Expiry is judged by *our* clock since we last saw the lease change, never by
        // the holder's timestamps: no clock-skew assumptions between contenders.
        if obs.resource_version.as_deref() != lease.resource_version() {
            obs.resource_version = lease.resource_version().map(str::to_string);
            obs.at = Instant::now();
        }
        let holder = lease.spec.holder_identity.as_deref().unwrap_or("");
        let ours = holder == self.config.identity;
        let duration = lease
            .spec
            .lease_duration_seconds
            .map_or(self.config.lease_duration, |s| {
                Duration::from_secs(s.max(1) as u64)
            });
        if !ours && !holder.is_empty() && obs.at.elapsed() < duration {
            self.publish(false, Some(&lease));
            return Ok(false);
        }
        let mut next = lease.clone();
        next.spec = self.spec(Some(&lease.spec));
        match self.api.replace(&name, &PostParams::default(), &next).await {
            Ok(l) => {
                obs.resource_version = l.resource_version().map(str::to_string);
                obs.at = Instant::now();
                obs.last_renew = Some(Instant::now());
                if !ours {
                    tracing::info!(lease = %name, identity = %self.config.identity, previous = holder, "acquired lease");
                }
                self.publish(true, Some(&l));
                Ok(true)
            }
            Err(e) if e.is_conflict() => {
                // Someone else wrote first: they won this round (and if we were the
                // leader, we are deposed — our token is stale).
                self.publish(false, None);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Give the lease up (if ours) so a successor need not wait for expiry.
    pub async fn release(&self) -> crate::Result<()> {
        let name = self.config.name.clone();
        // A conflict means the lease changed since it was read: someone else took it, or a
        // renewal of ours that was already on its way (from the election task just
        // stopped) landed in between. Read it again: only while it is still ours is
        // there anything to release.
        for _ in 0..RELEASE_ATTEMPTS {
            let Some(mut lease) = self.api.get_opt(&name).await? else {
                break;
            };
            if lease.spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                break;
            }
            lease.spec.holder_identity = None;
            lease.spec.renew_time = Some(chrono::Utc::now());
            match self
                .api
                .replace(&name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => {
                    tracing::info!(lease = %name, "released lease");
                    break;
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
        self.publish(false, None);
        Ok(())
    }

    /// Run election rounds forever in a task.
    pub fn spawn(self) -> LeaderElector {
        let lock = Arc::new(self);
        let (tx, rx) = watch::channel(false);
        let l = lock.clone();
        let task = tokio::spawn(async move {
            loop {
                let leader = *tx.borrow();
                let result = l.try_acquire_or_renew().await;
                let now_leader = match result {
                    Ok(held) => held,
                    Err(e) => {
                        tracing::warn!(lease = %l.config.name, error = %e, "lease round failed");
                        // Keep leading only while within the renew deadline.
                        let last = l.observed.lock().await.last_renew;
                        leader && last.is_some_and(|t| t.elapsed() < l.config.renew_deadline)
                    }
                };
                if now_leader != leader {
                    tracing::info!(lease = %l.config.name, identity = %l.config.identity, leader = now_leader, "leadership changed");
                    tx.send_replace(now_leader);
                    if !now_leader {
                        l.publish(false, None);
                    }
                }
                tokio::time::sleep(l.config.retry_period).await;
            }
        });
        LeaderElector {
            lock,
            leader: rx,
            task: std::sync::Mutex::new(Some(task)),
        }
    }
}

/// A running election; a [`LeaderGate`]. Dropping it stops renewing (call
/// [`LeaderElector::shutdown`] to release at once).
pub struct LeaderElector {
    lock: Arc<LeaseLock>,
    leader: watch::Receiver<bool>,
    /// The election task; taken out by `shutdown`, which waits for it.
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl LeaderElector {
    /// The lock's detailed state (holder, fencing token).
    pub fn state(&self) -> watch::Receiver<LeaderState> {
        self.lock.state()
    }

    /// Stop renewing and release the lease. The election task is waited for first: an
    /// aborted task still running could otherwise start a round after the release and
    /// take the lease again. (A renewal it had already sent is what `release` retries
    /// past.)
    pub async fn shutdown(&self) -> crate::Result<()> {
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        self.lock.release().await
    }

    fn abort_task(&self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            task.abort();
        }
    }

    /// Stop renewing without releasing (the lease expires on its own).
    pub fn abandon(&self) {
        self.abort_task();
    }
}

impl Drop for LeaderElector {
    fn drop(&mut self) {
        self.abort_task();
    }
}

impl LeaderGate for LeaderElector {
    fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }
}
