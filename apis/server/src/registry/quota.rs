//! Per-tenant object-count quotas: how many allocations, DAGs, events, leases, vClusters
//! and network domains one tenant may hold. Each object costs the server memory (the
//! store's copy, the watch cache's, every controller's cache: about 9 KB an allocation
//! under `hack/bench-api.sh`) however small the tenant's share of the cluster, so a
//! tenant's user scripting creates could otherwise grow the control plane until it runs
//! out of memory.
//!
//! The limit of a kind in a tenant is the Tenant's `spec.objectQuotas.<plural>` when set
//! (0: none at all), else the server's default ([`ObjectQuotas`]; `lattice-server
//! --tenant-max-<plural>`, 0: no limit). A create past it is `403 Forbidden` ("exceeded
//! quota", as Kubernetes' ResourceQuota answers) naming the quota, the count and the
//! limit. Counted: every object of the kind in the tenant, whoever made it. Enforced: on
//! creates by people (users and administrators, the anonymous caller of a server without
//! authentication included); the controllers (which make a Dag's allocations and record
//! Events) and node agents (which may create only their own Node and heartbeat Lease) are
//! not refused, so work the system already accepted is never stopped halfway.
//!
//! How it is counted: in memory, from one store watch over the registry, started with a
//! keys-only list; a create takes the count under one lock and is O(1). Exactness: this
//! server's own creates are reserved before their transaction and stay reserved until the
//! watch has shown them, so parallel creates through one API server cannot overshoot the
//! limit at all. Creates through *other* API servers of the cluster are seen when their
//! watch events arrive (milliseconds), so with N API servers a tenant can exceed its
//! limit by at most the creates the other N-1 have in flight in that window. Deletes are
//! counted when the watch shows them, so a create right after a delete may still be
//! refused for that window (the refusal errs on the safe side).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lattice_apis::KindInfo;
use lattice_store::{KeyRange, KvBackend, RangeRequest, StoreError, WatchRequest};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{json, Value};

use crate::registry::errors::{ApiError, ApiResult};
use crate::registry::identity::{Role, UserInfo};
use crate::registry::objects::REGISTRY_PREFIX;

/// The server's default limit per tenant for each counted kind (0: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectQuotas {
    pub allocations: u64,
    pub dags: u64,
    pub events: u64,
    pub leases: u64,
    pub vclusters: u64,
    pub network_domains: u64,
}

impl ObjectQuotas {
    /// The defaults: room for `hack/bench-api.sh`'s ~110,000 allocations in one tenant,
    /// and a bound (about 1.8 GB of server memory in allocations) on what one tenant can
    /// make the control plane hold.
    pub const DEFAULT: ObjectQuotas = ObjectQuotas {
        allocations: 200_000,
        dags: 20_000,
        events: 100_000,
        leases: 1_000,
        vclusters: 100,
        network_domains: 1_000,
    };

    /// No limits.
    pub const UNLIMITED: ObjectQuotas = ObjectQuotas {
        allocations: 0,
        dags: 0,
        events: 0,
        leases: 0,
        vclusters: 0,
        network_domains: 0,
    };

    /// The default for the kind `plural`; `None` when the kind is not counted.
    pub fn of(&self, plural: &str) -> Option<u64> {
        Some(match plural {
            "allocations" => self.allocations,
            "dags" => self.dags,
            "events" => self.events,
            "leases" => self.leases,
            "vclusters" => self.vclusters,
            "networkdomains" => self.network_domains,
            _ => return None,
        })
    }
}

impl Default for ObjectQuotas {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The counted kinds (plurals, as in keys and in `spec.objectQuotas`).
pub const COUNTED: [&str; 6] = [
    "allocations",
    "dags",
    "events",
    "leases",
    "vclusters",
    "networkdomains",
];

/// Where a tenant's override lives in its spec.
const OVERRIDE_FIELD: &str = "objectQuotas";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    /// Objects the watch has shown.
    stored: u64,
    /// This server's creates not yet shown by the watch (in flight, or committed and on
    /// their way).
    pending: u64,
}

#[derive(Debug, Default)]
struct State {
    counts: HashMap<(&'static str, String), Entry>,
    /// Tenants' `spec.objectQuotas`: plural → limit.
    overrides: HashMap<String, HashMap<&'static str, u64>>,
    /// The revision up to which the watch has been applied.
    seen: i64,
    /// This server's committed creates the watch has not shown yet: revision → counter.
    mine: HashMap<i64, (&'static str, String)>,
}

impl State {
    fn release(&mut self, key: &(&'static str, String)) {
        if let Some(e) = self.counts.get_mut(key) {
            e.pending = e.pending.saturating_sub(1);
        }
    }
}

/// The counts, and the watch that keeps them.
pub struct Counts {
    backend: Arc<dyn KvBackend>,
    defaults: ObjectQuotas,
    state: Mutex<State>,
    started: tokio::sync::OnceCell<()>,
    rejections: Family<KindLabel, Counter>,
}

impl Counts {
    pub fn new(
        backend: Arc<dyn KvBackend>,
        defaults: ObjectQuotas,
        metrics: &crate::metrics::Metrics,
    ) -> Arc<Counts> {
        let rejections = Family::<KindLabel, Counter>::default();
        let mut registry = prometheus_client::registry::Registry::with_prefix("lattice_apiserver");
        registry.register(
            "quota_rejections",
            "Creates refused because the tenant held its object-count quota of the kind",
            rejections.clone(),
        );
        metrics.add_registry(registry);
        Arc::new(Counts {
            backend,
            defaults,
            state: Mutex::new(State::default()),
            started: tokio::sync::OnceCell::new(),
            rejections,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The tenant's count of `plural` (what the watch has shown plus this server's
    /// creates on their way).
    pub fn count(&self, plural: &str, tenant: &str) -> u64 {
        let st = self.lock();
        COUNTED
            .iter()
            .find(|p| **p == plural)
            .and_then(|p| st.counts.get(&(*p, tenant.to_string())))
            .map_or(0, |e| e.stored + e.pending)
    }

    /// Start counting (once): list what is stored, then follow the store's changes.
    async fn start(self: &Arc<Self>) -> ApiResult<()> {
        self.started
            .get_or_try_init(|| async {
                let rev = self.relist().await.map_err(|e| {
                    ApiError::unavailable(format!("cannot count the tenants' objects: {e}"))
                })?;
                let me = Arc::downgrade(self);
                tokio::spawn(follow(me, rev));
                Ok::<(), ApiError>(())
            })
            .await
            .map(|_| ())
    }

    /// Count everything from a list at one revision; returns that revision.
    async fn relist(&self) -> Result<i64, StoreError> {
        let mut counts: HashMap<(&'static str, String), Entry> = HashMap::new();
        let mut rev = 0;
        for plural in COUNTED {
            let prefix = format!("{REGISTRY_PREFIX}{plural}/");
            let resp = self
                .backend
                .range(RangeRequest {
                    range: KeyRange::prefix(Bytes::from(prefix)),
                    keys_only: true,
                    revision: rev,
                    ..Default::default()
                })
                .await?;
            if rev == 0 {
                rev = resp.revision;
            }
            for kv in &resp.kvs {
                if let Some((p, tenant)) = counted_key(&kv.key) {
                    counts.entry((p, tenant.to_string())).or_default().stored += 1;
                }
            }
        }
        let tenants = self
            .backend
            .range(RangeRequest {
                range: KeyRange::prefix(Bytes::from(format!("{REGISTRY_PREFIX}tenants/"))),
                revision: rev,
                ..Default::default()
            })
            .await?;
        let mut overrides = HashMap::new();
        for kv in &tenants.kvs {
            if let Some(name) = tenant_key(&kv.key) {
                if let Some(o) = tenant_overrides(&kv.value) {
                    overrides.insert(name.to_string(), o);
                }
            }
        }
        let mut st = self.lock();
        // Keep the pending creates; the list shows the ones committed at or below it.
        let shown: Vec<i64> = st.mine.keys().copied().filter(|r| *r <= rev).collect();
        for r in shown {
            if let Some(key) = st.mine.remove(&r) {
                st.release(&key);
            }
        }
        for (key, e) in st.counts.iter() {
            if e.pending > 0 {
                counts.entry(key.clone()).or_default().pending = e.pending;
            }
        }
        st.counts = counts;
        st.overrides = overrides;
        st.seen = rev;
        Ok(rev)
    }

    /// Apply one store change.
    fn apply(&self, st: &mut State, ev: &lattice_store::Event) {
        let kv = &ev.kv;
        if let Some((plural, tenant)) = counted_key(&kv.key) {
            let key = (plural, tenant.to_string());
            match ev.kind {
                lattice_store::EventType::Put if kv.version == 1 => {
                    st.counts.entry(key).or_default().stored += 1;
                    if let Some(key) = st.mine.remove(&kv.mod_revision) {
                        st.release(&key);
                    }
                }
                lattice_store::EventType::Delete => {
                    if let Some(e) = st.counts.get_mut(&key) {
                        e.stored = e.stored.saturating_sub(1);
                    }
                }
                _ => {}
            }
        } else if let Some(name) = tenant_key(&kv.key) {
            match (ev.kind, tenant_overrides(&kv.value)) {
                (lattice_store::EventType::Put, Some(o)) => {
                    st.overrides.insert(name.to_string(), o);
                }
                _ => {
                    st.overrides.remove(name);
                }
            }
        }
        st.seen = st.seen.max(kv.mod_revision);
    }

    /// The limit of `plural` in `tenant` and where it comes from; `None`: no limit.
    fn limit(&self, st: &State, plural: &'static str, tenant: &str) -> Option<(u64, String)> {
        if let Some(n) = st.overrides.get(tenant).and_then(|o| o.get(plural)) {
            return Some((
                *n,
                format!("spec.{OVERRIDE_FIELD}.{plural} of Tenant {tenant:?}"),
            ));
        }
        let n = self.defaults.of(plural).filter(|n| *n > 0)?;
        let flag = format!(
            "--tenant-max-{}",
            plural.replace("networkdomains", "network-domains")
        );
        Some((n, format!("the server's default ({flag})")))
    }

    /// Reserve one object of `kind` in tenant `ns` for a create by `caller` (`None`:
    /// in process); `Ok(None)` when nothing is counted against a limit.
    pub async fn reserve(
        self: &Arc<Self>,
        kind: &KindInfo,
        ns: Option<&str>,
        caller: Option<&UserInfo>,
    ) -> ApiResult<Option<Reservation>> {
        let (Some(plural), Some(tenant)) = (COUNTED.iter().find(|p| **p == kind.plural), ns) else {
            return Ok(None);
        };
        let enforced = caller.is_some_and(|c| !matches!(c.role, Role::System | Role::Node));
        if !enforced || tenant == lattice_apis::kinds::lease::NODE_LEASE_NAMESPACE {
            return Ok(None);
        }
        self.start().await?;
        let mut st = self.lock();
        let Some((limit, source)) = self.limit(&st, plural, tenant) else {
            return Ok(None);
        };
        let key = (*plural, tenant.to_string());
        let e = st.counts.entry(key.clone()).or_default();
        let have = e.stored + e.pending;
        if have >= limit {
            drop(st);
            self.rejections
                .get_or_create(&KindLabel { kind: plural })
                .inc();
            let why = format!(
                "exceeded quota: tenant {tenant:?} holds {have} {plural}, and its limit is \
                 {limit} ({source}); delete some first, or ask an administrator to raise \
                 spec.{OVERRIDE_FIELD}.{plural} on the Tenant"
            );
            return Err(
                ApiError::forbidden(format!("{plural}.lattice.dev is forbidden: {why}"))
                    .with_details(json!({
                        "group": "lattice.dev",
                        "kind": plural,
                        "causes": [{
                            "reason": "QuotaExceeded",
                            "field": format!("spec.{OVERRIDE_FIELD}.{plural}"),
                            "message": why,
                        }],
                        "quota": {"kind": plural, "tenant": tenant, "used": have, "limit": limit},
                    })),
            );
        }
        e.pending += 1;
        Ok(Some(Reservation {
            counts: self.clone(),
            key: Some(key),
        }))
    }
}

/// One object reserved by a create; released on drop unless [`created`](Self::created).
pub struct Reservation {
    counts: Arc<Counts>,
    key: Option<(&'static str, String)>,
}

impl Reservation {
    /// The create committed at `revision`: the reservation stands until the watch shows it.
    pub fn created(mut self, revision: i64) {
        let Some(key) = self.key.take() else {
            return;
        };
        let mut st = self.counts.lock();
        if st.seen >= revision {
            // Already counted by the watch.
            st.release(&key);
        } else {
            st.mine.insert(revision, key);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.counts.lock().release(&key);
        }
    }
}

/// `(plural, tenant)` of a counted kind's object key.
fn counted_key(key: &[u8]) -> Option<(&'static str, &str)> {
    let rest = std::str::from_utf8(key.strip_prefix(REGISTRY_PREFIX.as_bytes())?).ok()?;
    let mut parts = rest.splitn(3, '/');
    let plural = parts.next()?;
    let tenant = parts.next()?;
    parts.next()?;
    let plural = COUNTED.iter().find(|p| **p == plural)?;
    Some((plural, tenant))
}

/// The name of a Tenant's key.
fn tenant_key(key: &[u8]) -> Option<&str> {
    let rest = key.strip_prefix(format!("{REGISTRY_PREFIX}tenants/").as_bytes())?;
    std::str::from_utf8(rest).ok().filter(|n| !n.contains('/'))
}

/// A stored Tenant's `spec.objectQuotas`.
fn tenant_overrides(value: &[u8]) -> Option<HashMap<&'static str, u64>> {
    let v: Value = serde_json::from_slice(value).ok()?;
    let o = v.get("spec")?.get(OVERRIDE_FIELD)?.as_object()?;
    let map: HashMap<&'static str, u64> = COUNTED
        .iter()
        .filter_map(|p| Some((*p, o.get(*p)?.as_u64()?)))
        .collect();
    (!map.is_empty()).then_some(map)
}

/// Follow the store from `rev + 1`, relisting when the watch breaks (compaction, a new
/// leader); ends when the counts are dropped.
async fn follow(counts: std::sync::Weak<Counts>, mut rev: i64) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(c) = counts.upgrade() else {
            return;
        };
        let watch = c
            .backend
            .watch(WatchRequest {
                range: KeyRange::prefix(Bytes::from_static(REGISTRY_PREFIX.as_bytes())),
                start_revision: rev + 1,
                prev_kv: false,
                progress_notify: true,
                filters: Default::default(),
            })
            .await;
        let mut stream = match watch {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "object-count quotas: cannot watch the store; relisting");
                drop(c);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                if let Some(c) = counts.upgrade() {
                    match c.relist().await {
                        Ok(r) => rev = r,
                        Err(e) => tracing::warn!(error = %e, "object-count quotas: relist failed"),
                    }
                }
                continue;
            }
        };
        drop(c);
        backoff = Duration::from_millis(100);
        while let Some(batch) = stream.next().await {
            let Some(c) = counts.upgrade() else {
                return;
            };
            match batch {
                Ok(b) => {
                    let mut st = c.lock();
                    for ev in &b.events {
                        c.apply(&mut st, ev);
                    }
                    if b.events.is_empty() {
                        st.seen = st.seen.max(b.revision);
                    }
                    rev = st.seen;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "object-count quotas: the store watch ended; relisting");
                    break;
                }
            }
        }
        if let Some(c) = counts.upgrade() {
            match c.relist().await {
                Ok(r) => rev = r,
                Err(e) => {
                    tracing::warn!(error = %e, "object-count quotas: relist failed");
                    tokio::time::sleep(backoff).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn people_are_counted_against_the_limit_and_the_system_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = lattice_store::EmbeddedStore::open(dir.path(), Default::default())
            .await
            .unwrap();
        let backend: Arc<dyn KvBackend> = Arc::new(store);
        let quotas = ObjectQuotas {
            dags: 1,
            ..ObjectQuotas::DEFAULT
        };
        let counts = Counts::new(backend, quotas, &crate::metrics::Metrics::new());
        let dags = lattice_apis::kinds()
            .iter()
            .find(|k| k.plural == "dags")
            .unwrap();
        let alice = UserInfo {
            name: "alice".into(),
            tenants: None,
            role: Role::User,
            ..Default::default()
        };
        let held = counts
            .reserve(dags, Some("t1"), Some(&alice))
            .await
            .unwrap();
        assert!(held.is_some());
        assert_eq!(counts.count("dags", "t1"), 1);
        let e = counts
            .reserve(dags, Some("t1"), Some(&alice))
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, 403);
        // In-process callers, the controllers and nodes make what the system decided.
        for who in [
            None,
            Some(UserInfo::controllers()),
            Some(UserInfo::node("n1")),
        ] {
            assert!(counts
                .reserve(dags, Some("t1"), who.as_ref())
                .await
                .unwrap()
                .is_none());
        }
        // A failed create gives its place back.
        drop(held);
        assert_eq!(counts.count("dags", "t1"), 0);
        assert!(counts
            .reserve(dags, Some("t1"), Some(&alice))
            .await
            .unwrap()
            .is_some());
    }

    #[test]
    fn keys() {
        assert_eq!(
            counted_key(b"/registry/lattice.dev/allocations/t1/a"),
            Some(("allocations", "t1"))
        );
        assert_eq!(counted_key(b"/registry/lattice.dev/allocations/t1"), None);
        assert_eq!(counted_key(b"/registry/lattice.dev/nodes/n1"), None);
        assert_eq!(tenant_key(b"/registry/lattice.dev/tenants/t1"), Some("t1"));
        assert_eq!(tenant_key(b"/registry/lattice.dev/tenants/t1/x"), None);
        let o = tenant_overrides(br#"{"spec":{"objectQuotas":{"allocations":5,"x":1}}}"#).unwrap();
        assert_eq!(o.get("allocations"), Some(&5));
        assert_eq!(o.len(), 1);
        assert!(tenant_overrides(br#"{"spec":{}}"#).is_none());
    }
}
