//! Runtime history: what finished allocations ran for, per vCluster and user, which the
//! scheduling core's runtime estimators learn from (`lattice_scheduler::predict`).
//!
//! One small store value per (vCluster, user) under [`PREFIX`], written by the release
//! controller in the same guarded transaction that gives a finished allocation's last
//! nodes back (so each finished allocation counts exactly once, and the history survives
//! any restart), never by a scheduling cycle. The scheduler keeps a copy that a background
//! task refreshes ([`HistoryCache`]); a cycle only clones an `Arc` of it.
//!
//! A value keeps the user's newest [`lattice_scheduler::predict::RECENT`] runs, and the
//! newest runs of at most [`NAMES_PER_USER`] job names (`spec.tags.name`; the least
//! recently run name is dropped first), so its size is bounded whatever the user submits.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use lattice_apis::{Allocation, VCluster};
use lattice_runtime::ResourceExt;
use lattice_scheduler::predict::{RuntimeHistory, RuntimeKey, RECENT};
use lattice_store::{KvBackend, RangeRequest, SortOrder, SortTarget};
use serde::{Deserialize, Serialize};

use super::adapter::VClusterKey;
use crate::allocations::USER_ANNOTATION;
use crate::objects::key_of;

/// Where runtime histories live: `<PREFIX><tenant>/<vcluster>/<user>`, each segment
/// escaped ([`escape`]).
pub const PREFIX: &str = "/lattice/runtime-history/";

/// The tag that names a job (`sbatch --job-name`, the script's name).
pub const JOB_NAME_TAG: &str = "name";

/// Job names whose runs a user's history keeps.
pub const NAMES_PER_USER: usize = 32;

/// Longest job name kept (longer ones are cut at a character boundary).
const MAX_NAME_BYTES: usize = 128;

/// How often the scheduler's copy checks the store for changes.
const REFRESH: Duration = Duration::from_secs(2);

/// One user's history in one vCluster: the stored value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserHistory {
    /// `[runtime_s, walltime_s]` of the user's newest runs, oldest first.
    #[serde(default)]
    pub runs: Vec<[i64; 2]>,
    /// The newest runs per job name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub names: BTreeMap<String, NameRuns>,
    /// How many runs have been recorded (orders the names by recency).
    #[serde(default)]
    pub seq: u64,
}

/// The newest runs of one job name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameRuns {
    /// `[runtime_s, walltime_s]`, oldest first.
    pub runs: Vec<[i64; 2]>,
    /// [`UserHistory::seq`] when this name last ran.
    pub last: u64,
}

fn push(runs: &mut Vec<[i64; 2]>, run: [i64; 2]) {
    runs.push(run);
    if runs.len() > RECENT {
        runs.drain(..runs.len() - RECENT);
    }
}

impl UserHistory {
    /// Add one finished run.
    pub fn record(&mut self, run: &FinishedRun) {
        self.seq += 1;
        let r = [run.runtime_s, run.walltime_s];
        push(&mut self.runs, r);
        if let Some(name) = &run.name {
            let e = self.names.entry(name.clone()).or_default();
            push(&mut e.runs, r);
            e.last = self.seq;
            while self.names.len() > NAMES_PER_USER {
                let Some(oldest) = self
                    .names
                    .iter()
                    .min_by_key(|(n, e)| (e.last, n.as_str()))
                    .map(|(n, _)| n.clone())
                else {
                    break;
                };
                self.names.remove(&oldest);
            }
        }
    }
}

/// What a finished allocation adds to its user's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedRun {
    /// `lattice.dev/user` (set by the API server from the credentials).
    pub user: String,
    /// `spec.tags.name`, if any.
    pub name: Option<String>,
    /// From its (last) start to its end.
    pub runtime_s: i64,
    /// The walltime it was bound with (its kill time).
    pub walltime_s: i64,
}

/// The run a terminal, bounded allocation that started adds to the history; `None` for
/// anything else (still running, requeued, never started, unbounded, no user).
pub fn finished_run(a: &Allocation) -> Option<FinishedRun> {
    let st = a.status.as_ref()?;
    if !st.phase.is_terminal() {
        return None;
    }
    let walltime_s = i64::try_from(st.walltime_seconds?).ok()?;
    let (start, end) = (st.start_time?, st.end_time?);
    let runtime_s = (end - start).num_seconds().max(0);
    let user = a.metadata.annotations.get(USER_ANNOTATION)?.clone();
    Some(FinishedRun {
        user,
        name: job_name(a).map(str::to_string),
        runtime_s,
        walltime_s,
    })
}

/// An allocation's job name as the history keeps it (cut to [`MAX_NAME_BYTES`]).
fn job_name(a: &Allocation) -> Option<&str> {
    a.spec.tags.get(JOB_NAME_TAG).map(|n| {
        let mut cut = n.len().min(MAX_NAME_BYTES);
        while !n.is_char_boundary(cut) {
            cut -= 1;
        }
        &n[..cut]
    })
}

/// A key segment: bytes other than ASCII letters, digits, `.`, `_`, `-` and `@` as `%XX`,
/// so that no user name can reach another user's (or another vCluster's) key.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The store key of `user`'s history in vCluster `vc`.
pub fn key(vc: &VClusterKey, user: &str) -> String {
    format!(
        "{PREFIX}{}/{}/{}",
        escape(&vc.0),
        escape(&vc.1),
        escape(user)
    )
}

/// `(vcluster, user)` of a history key.
pub fn parse_key(key: &str) -> Option<(VClusterKey, String)> {
    let rest = key.strip_prefix(PREFIX)?;
    let mut parts = rest.split('/');
    let (t, v, u) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some(((unescape(t)?, unescape(v)?), unescape(u)?))
}

/// The store keys of the vCluster an allocation is queued in, in the order the scheduler
/// resolves it (`adapter::resolve_vcluster`): its tenant's, then the shared one.
pub fn vcluster_candidates(a: &Allocation) -> [(VClusterKey, String); 2] {
    let name = a.spec.vcluster.clone().unwrap_or_else(|| "default".into());
    let ns = a.namespace().unwrap_or("default").to_string();
    let own = (ns, name.clone());
    let shared = ("default".to_string(), name);
    [own, shared].map(|k| {
        let store_key = key_of::<VCluster>(Some(&k.0), &k.1);
        (k, store_key)
    })
}

/// One vCluster's history as the core reads it, with the interned users and job names.
#[derive(Debug, Default)]
pub struct VClusterHistory {
    pub history: RuntimeHistory,
    users: HashMap<String, u32>,
    names: HashMap<String, u32>,
}

impl VClusterHistory {
    fn add(&mut self, user: &str, h: &UserHistory) {
        let n = self.users.len() as u32;
        let uid = *self.users.entry(user.to_string()).or_insert(n);
        let runs = |r: &[[i64; 2]]| r.iter().map(|x| (x[0], x[1])).collect::<Vec<_>>();
        self.history.load_user(uid, &runs(&h.runs));
        for (name, e) in &h.names {
            let n = self.names.len() as u32;
            let nid = *self.names.entry(name.clone()).or_insert(n);
            self.history.load_job(uid, nid, &runs(&e.runs));
        }
    }

    /// The history key of an allocation: its user and job name, when this vCluster has
    /// seen them finish work (anything else has nothing to predict from).
    pub fn key_of(&self, a: &Allocation) -> RuntimeKey {
        let user = a
            .metadata
            .annotations
            .get(USER_ANNOTATION)
            .and_then(|u| self.users.get(u))
            .copied();
        let name = job_name(a).and_then(|n| self.names.get(n)).copied();
        RuntimeKey {
            user,
            name: user.and(name),
        }
    }

    /// Users with history.
    pub fn users(&self) -> usize {
        self.users.len()
    }
}

/// Every vCluster's history, as last read from the store.
#[derive(Debug, Default)]
pub struct HistoryView {
    by_vcluster: HashMap<VClusterKey, VClusterHistory>,
}

impl HistoryView {
    /// Build from stored `(key, value)` pairs (malformed ones are skipped and logged).
    pub fn from_stored<'a>(kvs: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Self {
        let mut view = HistoryView::default();
        let mut entries: Vec<(VClusterKey, String, UserHistory)> = Vec::new();
        for (k, v) in kvs {
            let Some((vc, user)) = std::str::from_utf8(k).ok().and_then(parse_key) else {
                tracing::debug!(key = %String::from_utf8_lossy(k), "not a runtime history key");
                continue;
            };
            match serde_json::from_slice::<UserHistory>(v) {
                Ok(h) => entries.push((vc, user, h)),
                Err(e) => tracing::warn!(%user, error = %e, "unreadable runtime history skipped"),
            }
        }
        // Sorted, so that the interned ids do not depend on the store's order.
        entries.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        for (vc, user, h) in entries {
            view.by_vcluster.entry(vc).or_default().add(&user, &h);
        }
        view
    }

    /// The history of vCluster `vc`, if it has any.
    pub fn vcluster(&self, vc: &VClusterKey) -> Option<&VClusterHistory> {
        self.by_vcluster.get(vc)
    }
}

/// The scheduler's copy of the runtime history, refreshed in the background.
#[derive(Default)]
pub struct HistoryCache {
    view: RwLock<Arc<HistoryView>>,
}

impl HistoryCache {
    /// The current view (an `Arc` clone: cycles never wait for a refresh).
    pub fn view(&self) -> Arc<HistoryView> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, v: HistoryView) {
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(v);
    }

    /// Read every history from the store now.
    pub async fn load(&self, backend: &Arc<dyn KvBackend>) -> lattice_store::StoreResult<()> {
        let resp = backend
            .range(RangeRequest::prefix(Bytes::from(PREFIX)))
            .await?;
        let view = HistoryView::from_stored(
            resp.kvs
                .iter()
                .map(|kv| (kv.key.as_ref(), kv.value.as_ref())),
        );
        self.set(view);
        Ok(())
    }
}

/// What identifies the stored histories' state cheaply: how many there are and the newest
/// change among them.
async fn fingerprint(backend: &Arc<dyn KvBackend>) -> lattice_store::StoreResult<(i64, i64)> {
    let mut req = RangeRequest::prefix(Bytes::from(PREFIX));
    req.limit = 1;
    req.keys_only = true;
    req.sort_order = SortOrder::Descend;
    req.sort_target = SortTarget::Mod;
    let resp = backend.range(req).await?;
    Ok((resp.count, resp.kvs.first().map_or(0, |kv| kv.mod_revision)))
}

/// Keep `cache` current: every [`REFRESH`], a one-key read says whether anything changed,
/// and only then are the histories read again (off the scheduling cycles' path).
pub async fn refresh_loop(backend: Arc<dyn KvBackend>, cache: Arc<HistoryCache>) {
    let mut seen: Option<(i64, i64)> = None;
    loop {
        match fingerprint(&backend).await {
            Ok(now) if Some(now) != seen => match cache.load(&backend).await {
                Ok(()) => seen = Some(now),
                Err(e) => tracing::debug!(error = %e, "runtime history not read"),
            },
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "runtime history not checked"),
        }
        tokio::time::sleep(REFRESH).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(user: &str, name: Option<&str>, runtime_s: i64) -> FinishedRun {
        FinishedRun {
            user: user.into(),
            name: name.map(str::to_string),
            runtime_s,
            walltime_s: 3600,
        }
    }

    /// User names are escaped, so no user (however named) writes another user's key or
    /// another vCluster's, and keys read back to what was written.
    #[test]
    fn hostile_user_names_stay_in_their_own_key() {
        let vc = ("t1".to_string(), "batch".to_string());
        let evil = ["alice/../bob", "a/b", "%2F", "../../registry", "x\n", "ü"];
        let mut keys: Vec<String> = evil.iter().map(|u| key(&vc, u)).collect();
        keys.push(key(&vc, "bob"));
        keys.push(key(&vc, "a"));
        for (k, u) in keys.iter().zip(evil.iter().chain(&["bob", "a"])) {
            assert!(k.starts_with("/lattice/runtime-history/t1/batch/"), "{k}");
            assert_eq!(k.matches('/').count(), 5, "{k}");
            assert_eq!(parse_key(k), Some((vc.clone(), u.to_string())));
        }
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len());
        assert_eq!(parse_key("/lattice/runtime-history/t1/batch/a/b"), None);
        assert_eq!(parse_key("/lattice/runtime-history/t1/batch/%zz"), None);
    }

    /// A user's value stays bounded: the newest runs, and the newest runs of the most
    /// recently run job names.
    #[test]
    fn a_history_keeps_the_newest_runs_of_recent_names() {
        let mut h = UserHistory::default();
        for i in 0..10 {
            h.record(&run("u", Some("sim"), i));
        }
        assert_eq!(h.runs, vec![[6, 3600], [7, 3600], [8, 3600], [9, 3600]]);
        assert_eq!(h.names["sim"].runs, h.runs);
        for i in 0..(NAMES_PER_USER + 5) {
            h.record(&run("u", Some(&format!("job-{i}")), 1));
        }
        assert_eq!(h.names.len(), NAMES_PER_USER);
        assert!(
            !h.names.contains_key("sim"),
            "least recently run name dropped"
        );
        assert!(!h.names.contains_key("job-4"));
        assert!(h.names.contains_key("job-5"));
        h.record(&run("u", None, 5));
        assert_eq!(h.names.len(), NAMES_PER_USER);
        // Stored compactly and read back.
        let bytes = serde_json::to_vec(&h).expect("json");
        assert!(bytes.len() < 4096, "{} bytes", bytes.len());
        assert_eq!(
            serde_json::from_slice::<UserHistory>(&bytes).expect("read"),
            h
        );
    }

    fn allocation(v: serde_json::Value) -> Allocation {
        serde_json::from_value(v).expect("allocation")
    }

    /// Only work that finished counts, with the runtime of its last start and the
    /// walltime it was bound with.
    #[test]
    fn only_finished_bounded_work_is_recorded() {
        let done = allocation(serde_json::json!({
            "metadata": {"name": "a", "namespace": "t1",
                         "annotations": {"lattice.dev/user": "alice"}},
            "spec": {"entrypoint": "/bin/true", "tags": {"name": "sim"}},
            "status": {"phase": "Completed", "walltimeSeconds": 3600,
                       "startTime": "2026-01-01T00:00:00Z", "endTime": "2026-01-01T00:10:00Z"},
        }));
        assert_eq!(
            finished_run(&done),
            Some(FinishedRun {
                user: "alice".into(),
                name: Some("sim".into()),
                runtime_s: 600,
                walltime_s: 3600,
            })
        );
        let mut running = done.clone();
        running.status.as_mut().expect("status").phase = lattice_apis::AllocationPhase::Running;
        assert_eq!(finished_run(&running), None);
        let mut unbounded = done.clone();
        unbounded.status.as_mut().expect("status").walltime_seconds = None;
        assert_eq!(finished_run(&unbounded), None);
        let mut anonymous = done.clone();
        anonymous.metadata.annotations.clear();
        assert_eq!(finished_run(&anonymous), None);
        let mut never_started = done.clone();
        never_started.status.as_mut().expect("status").start_time = None;
        assert_eq!(finished_run(&never_started), None);
    }

    /// The view interns users and names exactly (no hashing: no collisions to craft) and
    /// gives an allocation the key of its user and job name in its vCluster only.
    #[test]
    fn the_view_keys_allocations_by_their_user_and_name() {
        let mut alice = UserHistory::default();
        alice.record(&run("alice", Some("sim"), 600));
        alice.record(&run("alice", Some("post"), 60));
        let vc = ("t1".to_string(), "batch".to_string());
        let other = ("t1".to_string(), "other".to_string());
        let value = serde_json::to_vec(&alice).expect("json");
        let stored = [
            (key(&vc, "alice").into_bytes(), value.clone()),
            (b"/lattice/runtime-history/bad".to_vec(), value.clone()),
            (key(&vc, "bob").into_bytes(), b"not json".to_vec()),
        ];
        let view =
            HistoryView::from_stored(stored.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
        let h = view.vcluster(&vc).expect("history");
        assert_eq!(h.users(), 1);
        assert!(view.vcluster(&other).is_none());
        let a = allocation(serde_json::json!({
            "metadata": {"name": "a", "namespace": "t1",
                         "annotations": {"lattice.dev/user": "alice"}},
            "spec": {"entrypoint": "/bin/true", "tags": {"name": "sim"}},
        }));
        let k = h.key_of(&a);
        let (u, n) = (k.user.expect("user"), k.name.expect("name"));
        assert_eq!(h.history.user(u), &[(60, 3600), (600, 3600)]);
        assert_eq!(h.history.job(u, n), &[(600, 3600)]);
        // A long name is kept cut, and found again the same way.
        let long = "é".repeat(100);
        let mut h2 = UserHistory::default();
        let mut r = run("alice", Some(&long), 42);
        r.name = job_name(&{
            let mut b = a.clone();
            b.spec.tags.insert(JOB_NAME_TAG.into(), long.clone());
            b
        })
        .map(str::to_string);
        assert!(r.name.as_ref().is_some_and(|n| n.len() <= MAX_NAME_BYTES));
        h2.record(&r);
        let v2 = serde_json::to_vec(&h2).expect("json");
        let k2 = key(&vc, "alice").into_bytes();
        let view2 = HistoryView::from_stored(std::iter::once((k2.as_slice(), v2.as_slice())));
        let mut b = a.clone();
        b.spec.tags.insert(JOB_NAME_TAG.into(), long);
        let h2v = view2.vcluster(&vc).expect("history");
        let k = h2v.key_of(&b);
        assert_eq!(
            h2v.history
                .job(k.user.expect("user"), k.name.expect("name")),
            &[(42, 3600)]
        );
        let mut stranger = a.clone();
        stranger
            .metadata
            .annotations
            .insert(USER_ANNOTATION.into(), "mallory".into());
        assert_eq!(h.key_of(&stranger), RuntimeKey::default());
    }
}
