//! The allocation controller: what happens to an allocation before it is bound.
//!
//! * a cancel request on an unbound allocation cancels it at once (a bound one is
//!   stopped by its agents, see `lattice_apis::lifecycle`);
//! * `spec.dependsOn`: the allocation stays out of the queue (reason
//!   `waiting_for_dependencies`) until every dependency holds — then the condition
//!   `DependenciesMet` is set and the scheduler sees it — or fails with reason
//!   `dependency_never_satisfied` when one never can (Flux RFC 26's fatal exception: it
//!   never ran, and a `failure` (afternotok) dependency on it holds as on any failure).
//!
//! # Dependency schemes
//!
//! | entry | Slurm / Flux RFC 26 | holds when | can never hold when |
//! |---|---|---|---|
//! | `{ref: A, condition: success}` | `afterok:A` | A Completed | A Failed or Cancelled |
//! | `{ref: A, condition: failure}` | `afternotok:A` | A Failed or Cancelled (an unsuccessful result) | A Completed |
//! | `{ref: A, condition: any}` | `afterany:A` | A ended, however | — |
//! | `{ref: A, condition: corresponding}` on an element *i* of a job array | `aftercorr:A` | element *i* of A Completed, or A has no index *i* | element *i* of A Failed or Cancelled, or A ended without creating it |
//! | `{ref: A, condition: started}` | `after:A` | A Running, or ended after starting | A ended without ever starting |
//! | `{beginTime: T}` | `begin-time:T`, `--begin` | wall time ≥ T (epoch seconds) | — |
//! | `{symbol: S, type: in}` | `string:S?type=in` | every current writer of S Completed | a current writer Failed or was Cancelled |
//! | `{symbol: S, type: out}` | `string:S?type=out` | at once (declares a writer) | — |
//! | `{symbol: S, type: inout}` | `string:S?type=inout` | as `in`; then it is the writer (chains) | as `in` |
//! | `{singleton: true}` | `singleton` | no earlier non-terminal holder of the lock named like its job name, same user | — |
//! | `{ref: L, condition: mutex}` | `singleton` on the name `L` | no earlier non-terminal holder of the lock `L`, same user | — |
//!
//! `ref` names an allocation of the same tenant by name, or else by uid (for `mutex`: a
//! lock name).
//!
//! **Options of `ref` entries** (success, failure, any, started):
//!
//! | option | Slurm | holds when | can never hold when |
//! |---|---|---|---|
//! | `taskIndex: N` | `afterok:A_N` | element N of the job array A (`A-N`, labels `lattice.dev/task-group`/`-index`, owned by A) meets the condition, as an allocation of its own | that element can never meet it; A is no job array or has no index N; A ended without creating element N |
//! | `delay: D` | `after:A+MIN` (Lattice: every condition) | the condition holds and the clock reached A's recorded `status.startTime` (`started`) or `status.endTime` (the others) + D | as without the delay |
//! | `anyOf: true` | `?` between entries | (for the group of all such entries, with `beginTime` and `singleton` entries too) any one of them holds | every one of them can never hold |
//!
//! Entries without `anyOf` must all hold, and the any-of group too when there is one. An
//! alternative that can never hold does not fail the allocation while another one may
//! still hold. A `delay` is timed from the times A recorded, so a controller that notices
//! late (restart, backlog) releases at once and never later than needed; the allocation
//! requeues itself for that instant (as for `beginTime`). The element of a `taskIndex`
//! entry wakes its dependents like any allocation (index keyed by array and index).
//!
//! **aftercorr** (job arrays, Slurm `aftercorr`, the seed's `Corresponding`). On the
//! array B (the parent) the entry holds as soon as the job array A exists; B's elements
//! carry it and each one waits for its own index: B\[i\] starts once A\[i\] Completed and
//! fails (`dependency_never_satisfied`) when A\[i\] Failed or was Cancelled (or A
//! ended without ever creating it), while the other indices go on. Indices of B that A
//! does not have hold at once, as if they had no such dependency (the seed: "extra
//! indices ... enter the scheduler queue as if they were root nodes"). When A is not a
//! job array, the entry means `success` on A as a whole.
//!
//! **Order.** "Earlier" is the order in which the store created the objects (the key's
//! `create_revision`), which is the submission order and never changes; it is read from
//! the store once per allocation and cached by uid.
//!
//! **Symbols** (Flux RFC 26 `string` scheme). Scope `user` covers the allocations of the
//! tenant with the same `lattice.dev/user` annotation and the same scope; `global` the
//! whole tenant. The writers of a symbol for an allocation X are the earlier allocations
//! declaring it `out` or `inout` in the same scope, from the last `inout` writer on (an
//! `inout` replaces the writers before it, which is what chains jobs), leaving out writers
//! that had already ended unsuccessfully before X was submitted (they are no longer
//! current). X holds when all of them Completed; when one of them fails or is cancelled,
//! X fails (RFC 26's fatal exception) with a message naming that writer.
//!
//! **Scope rule** (RFC 26: "A non-instance owner can only create a dependency with the
//! type in within this scope"): an allocation declaring `out` or `inout` in scope
//! `global` whose user is not an instance owner — for a tenant, a user listed in the
//! Tenant's `spec.admins` — is cancelled before it runs, with reason
//! `dependency_not_permitted` and a message naming the rule and the fix (`type: in`,
//! `scope: user`, or submit as a tenant admin). Such a declaration never makes it a
//! writer, so it cannot hold or cancel anyone's `global` readers.
//!
//! **Locks** (Slurm `singleton`, DAG and standalone `mutex`): an allocation holds the
//! lock named like its job name (`spec.tags.name`, else the allocation name) and every
//! lock it declares with `mutex`; the scope is the tenant and the user (the
//! `lattice.dev/user` annotation). A `singleton` or `mutex` entry waits until every
//! holder of that lock submitted earlier has ended, so holders run one at a time in
//! submission order, whichever way they declare the lock: a DAG step's `mutex` (which the
//! DAG controller puts on the step's Allocation) excludes other DAGs' steps, standalone
//! `mutex` allocations and `singleton` jobs of that name. Elements of one job array or
//! DAG task group share their group's lock and do not wait for each other.
//!
//! **Bookkeeping** (RFC 26 `dependency-add` / `dependency-remove`). Each entry has a
//! description (`afterok:prep`, `after:prep`, `begin-time:1767225600`,
//! `string:ckpt?scope=user&type=inout`, `singleton`, `mutex:gpu-lock`) and a record in
//! `status.dependencies`. A satisfied dependency stays satisfied, through the RFC's
//! duplicate rules (`lattice_dag::flux::DependencyTracker`): re-evaluating it (a
//! restarted controller, a duplicate event) never posts it again, and a dependency that
//! started and was then requeued, or was deleted after completing, does not block again.
//! `DependenciesMet` is set once, so a release happens at most once.
//!
//! Level-triggered: every decision is recomputed from the cached objects and the
//! allocation's own status. Dependents are woken through an index keyed by what they wait
//! on (allocation name and uid, array element, symbol, lock) when one of those objects
//! changes phase;
//! `beginTime` requeues the allocation at that time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use lattice_apis::kinds::allocation::TASK_INDEX_LABEL;
use lattice_apis::lifecycle::{self, reason};
use lattice_apis::meta::{now, set_condition, Condition, ConditionStatus};
use lattice_apis::{
    Allocation, AllocationPhase, Dependency, DependencyCondition, DependencyKind, DependencyStatus,
    SymbolScope, SymbolType, TaskRange, Tenant,
};
use lattice_dag::deps::{SymbolAccess, SymbolScope as FluxScope};
use lattice_dag::flux::{scope_permits, DependencyTracker, EventError, FluxError};
use lattice_runtime::informer::{InformerEvent, InformerParams};
use lattice_runtime::reflector::Store;
use lattice_runtime::{Action, Api, HostContext, ObjectRef, ResourceExt};
use lattice_store::{KeyRange, KvBackend, RangeRequest, TxnOp, TxnOpResponse, TxnRequest};

/// Annotation with the reason of a cancellation made by a controller (e.g. a DAG's
/// failure propagation); users' cancels have none.
pub use lattice_apis::wellknown::CANCEL_REASON_ANNOTATION;
/// Condition set when every dependency holds.
pub const DEPENDENCIES_MET: &str = "DependenciesMet";
/// Annotation naming the submitting user (scope of `singleton` and of `user` symbols).
pub use lattice_apis::wellknown::USER_ANNOTATION;
/// `spec.tags` key holding the job name (Slurm `--job-name`), used by `singleton`.
pub const JOB_NAME_TAG: &str = "name";
/// Reason of an allocation cancelled because it declares a dependency its user may not
/// (Flux RFC 26: `out`/`inout` in scope `global` by a non-owner).
pub const DEPENDENCY_NOT_PERMITTED: &str = "dependency_not_permitted";

/// Longest a reconcile waiting for a `beginTime` sleeps before looking again.
const MAX_TIMER: Duration = Duration::from_secs(600);

/// Whether the condition `DependenciesMet` is true.
pub fn dependencies_met(a: &Allocation) -> bool {
    a.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == DEPENDENCIES_MET && c.status == ConditionStatus::True)
    })
}

/// The submitting user (`lattice.dev/user`), "" when unset.
pub fn user_of(a: &Allocation) -> &str {
    a.metadata
        .annotations
        .get(USER_ANNOTATION)
        .map(String::as_str)
        .unwrap_or("")
}

/// The job name `singleton` serializes on: `spec.tags.name`, else the allocation name.
pub fn job_name_of(a: &Allocation) -> &str {
    a.spec
        .tags
        .get(JOB_NAME_TAG)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| a.name_any())
}

/// Whether `a` holds the lock `lock`: its job name is `lock`, or it declares
/// `{ref: lock, condition: mutex}`.
fn holds_lock(a: &Allocation, lock: &str) -> bool {
    job_name_of(a) == lock
        || a.spec
            .depends_on
            .iter()
            .any(|d| d.kind() == Some(DependencyKind::Mutex(lock)))
}

/// The index of a job-array element (DAG task-group elements included); `None` for
/// anything else.
fn element_index(a: &Allocation) -> Option<u64> {
    if a.spec.task_group.is_some() {
        return None;
    }
    a.labels().get(TASK_INDEX_LABEL)?.parse().ok()
}

/// Whether `a` and `b` are elements of the same job array or DAG task group.
fn siblings(a: &Allocation, b: &Allocation) -> bool {
    let group = |x: &Allocation| {
        element_index(x)?;
        Some((
            x.labels().get(crate::dag::TASK_GROUP_LABEL)?.clone(),
            x.controller_owner()?.uid.clone(),
        ))
    };
    group(a).is_some_and(|g| Some(g) == group(b))
}

/// Whether the allocation has started running (now or in a past attempt that ended).
fn started(a: &Allocation) -> bool {
    a.status.as_ref().is_some_and(|s| {
        s.start_time.is_some()
            || matches!(
                s.phase,
                AllocationPhase::Running | AllocationPhase::Checkpointing
            )
    })
}

fn unbound(a: &Allocation) -> bool {
    a.status.as_ref().is_none_or(|s| {
        matches!(
            s.phase,
            AllocationPhase::Pending | AllocationPhase::Suspended
        ) && s.assigned_nodes.is_empty()
    })
}

/// The symbol access `a` declares for `symbol` in `scope`, if any.
fn declares(a: &Allocation, symbol: &str, scope: SymbolScope) -> Option<SymbolType> {
    a.spec.depends_on.iter().find_map(|d| match d.kind() {
        Some(DependencyKind::Symbol {
            name,
            type_,
            scope: s,
        }) if name == symbol && s == scope => Some(type_),
        _ => None,
    })
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn rfc3339(epoch: f64) -> String {
    chrono::DateTime::from_timestamp(epoch.floor() as i64, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| format!("{epoch}"))
}

// ---------------------------------------------------------------------------------------
// Wake-up index
// ---------------------------------------------------------------------------------------

/// What a waiting allocation may be woken by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum WakeKey {
    /// (tenant, allocation name)
    Name(String, String),
    /// allocation uid
    Uid(String),
    /// (tenant, user, lock name): `singleton` (the job name) and `mutex`
    Job(String, String, String),
    /// (tenant, symbol): `string` scheme
    Symbol(String, String),
    /// (tenant, job array name, index): an element, for `corresponding`
    Element(String, String, u64),
    /// (job array uid, index): an element, for `corresponding` by uid
    ElementUid(String, u64),
}

/// The keys a waiting allocation listens on.
fn wait_keys(a: &Allocation) -> Vec<WakeKey> {
    let ns = a.namespace().unwrap_or_default().to_string();
    let mut keys = Vec::new();
    for d in &a.spec.depends_on {
        match d.kind() {
            Some(DependencyKind::Allocation { target, condition }) => {
                keys.push(WakeKey::Name(ns.clone(), target.to_string()));
                keys.push(WakeKey::Uid(target.to_string()));
                let element = match (condition, d.task_index) {
                    (DependencyCondition::Corresponding, _) => element_index(a),
                    (_, Some(i)) => Some(i),
                    _ => None,
                };
                if let Some(i) = element {
                    keys.push(WakeKey::Element(ns.clone(), target.to_string(), i));
                    keys.push(WakeKey::ElementUid(target.to_string(), i));
                }
            }
            Some(DependencyKind::Symbol { name, type_, .. }) if type_.reads() => {
                keys.push(WakeKey::Symbol(ns.clone(), name.to_string()));
            }
            Some(DependencyKind::Singleton) => keys.push(WakeKey::Job(
                ns.clone(),
                user_of(a).to_string(),
                job_name_of(a).to_string(),
            )),
            Some(DependencyKind::Mutex(lock)) => keys.push(WakeKey::Job(
                ns.clone(),
                user_of(a).to_string(),
                lock.to_string(),
            )),
            _ => {}
        }
    }
    keys
}

/// The keys under which a change of `a` is announced.
fn emit_keys(a: &Allocation) -> Vec<WakeKey> {
    let ns = a.namespace().unwrap_or_default().to_string();
    let mut keys = vec![
        WakeKey::Name(ns.clone(), a.name_any().to_string()),
        WakeKey::Job(
            ns.clone(),
            user_of(a).to_string(),
            job_name_of(a).to_string(),
        ),
    ];
    if let Some(uid) = a.uid() {
        keys.push(WakeKey::Uid(uid.to_string()));
    }
    if let Some(i) = element_index(a) {
        if let Some(g) = a.labels().get(crate::dag::TASK_GROUP_LABEL) {
            keys.push(WakeKey::Element(ns.clone(), g.clone(), i));
        }
        if let Some(o) = a.controller_owner() {
            keys.push(WakeKey::ElementUid(o.uid.clone(), i));
        }
    }
    for d in &a.spec.depends_on {
        match d.kind() {
            Some(DependencyKind::Symbol { name, type_, .. }) if type_.writes() => {
                keys.push(WakeKey::Symbol(ns.clone(), name.to_string()));
            }
            Some(DependencyKind::Mutex(lock)) => keys.push(WakeKey::Job(
                ns.clone(),
                user_of(a).to_string(),
                lock.to_string(),
            )),
            _ => {}
        }
    }
    keys
}

/// Waiting allocations by what they wait on, and the last phase seen of every
/// allocation (dependents are woken only when it changes). Registrations are made by the
/// reconciler *before* it reads the cache, so a change that lands after the read always
/// finds the registration (no lost wake-up).
#[derive(Default)]
struct WakeIndex {
    waiters: HashMap<WakeKey, HashSet<ObjectRef>>,
    keys_of: HashMap<ObjectRef, Vec<WakeKey>>,
    seen: HashMap<ObjectRef, (AllocationPhase, bool)>,
}

impl WakeIndex {
    fn register(&mut self, r: &ObjectRef, keys: Vec<WakeKey>) {
        if self.keys_of.get(r) == Some(&keys) {
            return;
        }
        self.unregister(r);
        for k in &keys {
            self.waiters.entry(k.clone()).or_default().insert(r.clone());
        }
        self.keys_of.insert(r.clone(), keys);
    }

    fn unregister(&mut self, r: &ObjectRef) {
        for k in self.keys_of.remove(r).unwrap_or_default() {
            if let Some(set) = self.waiters.get_mut(&k) {
                set.remove(r);
                if set.is_empty() {
                    self.waiters.remove(&k);
                }
            }
        }
    }

    /// The allocations to wake for this event.
    fn on_event(&mut self, ev: &InformerEvent<Allocation>) -> Vec<ObjectRef> {
        let a = ev.object();
        let r = ObjectRef::from_obj(a.as_ref());
        let changed = match ev {
            InformerEvent::Deleted(_) => {
                self.unregister(&r);
                self.seen.remove(&r);
                true
            }
            InformerEvent::Applied(_) => {
                if a.phase().is_terminal() {
                    self.unregister(&r);
                }
                let state = (a.phase(), started(a));
                self.seen.insert(r.clone(), state) != Some(state)
            }
        };
        if !changed {
            return Vec::new();
        }
        let mut out: HashSet<ObjectRef> = HashSet::new();
        for k in emit_keys(a) {
            if let Some(set) = self.waiters.get(&k) {
                out.extend(set.iter().filter(|w| **w != r).cloned());
            }
        }
        out.into_iter().collect()
    }
}

struct Shared {
    index: Mutex<WakeIndex>,
    /// uid → store `create_revision` (immutable for a uid).
    revisions: Mutex<HashMap<String, i64>>,
}

impl Shared {
    fn index(&self) -> std::sync::MutexGuard<'_, WakeIndex> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn revisions(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.revisions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Ctx {
    api: Api<Allocation>,
    store: Store<Allocation>,
    tenants: Store<Tenant>,
    tenant_api: Api<Tenant>,
    backend: Arc<dyn KvBackend>,
    shared: Arc<Shared>,
}

impl Ctx {
    /// The instance owners of a tenant in the sense of Flux RFC 26: its admins
    /// (`Tenant.spec.admins`), from the cache when it lists every one of `users`, else as
    /// stored. An allocation is cancelled, or a writer passed over, for not being an owner
    /// only on the stored Tenant, never on a cache that has not yet seen an admin just
    /// added.
    async fn owners(
        &self,
        tenant: Option<&str>,
        users: &[&str],
    ) -> Result<Vec<String>, anyhow::Error> {
        let Some(ns) = tenant else {
            return Ok(Vec::new());
        };
        if let Some(t) = self.tenants.get_named(None, ns) {
            if users.iter().all(|u| t.spec.admins.iter().any(|o| o == u)) {
                return Ok(t.spec.admins.clone());
            }
        }
        Ok(self
            .tenant_api
            .get_opt(ns)
            .await?
            .map(|t| t.spec.admins)
            .unwrap_or_default())
    }

    /// The store `create_revision` of each allocation (by uid; absent when it is gone).
    async fn create_revisions(
        &self,
        objs: &[&Allocation],
    ) -> Result<HashMap<String, i64>, anyhow::Error> {
        let mut out = HashMap::new();
        let mut missing: Vec<(String, String)> = Vec::new();
        {
            let cache = self.shared.revisions();
            for a in objs {
                let Some(uid) = a.uid() else { continue };
                match cache.get(uid) {
                    Some(r) => {
                        out.insert(uid.to_string(), *r);
                    }
                    None => missing.push((
                        uid.to_string(),
                        crate::objects::key_of::<Allocation>(a.namespace(), a.name_any()),
                    )),
                }
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        let req = TxnRequest {
            compare: Vec::new(),
            success: missing
                .iter()
                .map(|(_, k)| {
                    TxnOp::Range(RangeRequest {
                        range: KeyRange::single(Bytes::from(k.clone())),
                        keys_only: true,
                        ..Default::default()
                    })
                })
                .collect(),
            failure: Vec::new(),
        };
        let resp = self.backend.txn(req).await?;
        let mut cache = self.shared.revisions();
        for ((uid, _), r) in missing.into_iter().zip(resp.responses) {
            if let TxnOpResponse::Range(r) = r {
                if let Some(kv) = r.kvs.first() {
                    cache.insert(uid.clone(), kv.create_revision);
                    out.insert(uid, kv.create_revision);
                }
            }
        }
        Ok(out)
    }
}

/// Register the allocation controller.
pub fn register(host: &mut lattice_runtime::ControllerHost, backend: Arc<dyn KvBackend>) {
    host.register("allocations", move |hc: HostContext| {
        let backend = backend.clone();
        async move {
            let controller = hc.controller::<Allocation>();
            let store = controller.store();
            let shared = Arc::new(Shared {
                index: Mutex::new(WakeIndex::default()),
                revisions: Mutex::new(HashMap::new()),
            });
            let ctx = Arc::new(Ctx {
                api: Api::all(hc.client.clone()),
                store,
                tenants: hc.factory.all::<Tenant>().store(),
                tenant_api: Api::all(hc.client.clone()),
                backend,
                shared: shared.clone(),
            });
            controller
                .watches_events::<Allocation, _>(&InformerParams::default(), move |ev| {
                    if let InformerEvent::Deleted(a) = ev {
                        if let Some(uid) = a.uid() {
                            shared.revisions().remove(uid);
                        }
                    }
                    shared.index().on_event(ev)
                })
                .run(reconcile, ctx)
                .await;
        }
    });
}

// ---------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------

/// How one dependency stands.
#[derive(Debug, PartialEq)]
enum DepState {
    Holds,
    Waiting(String),
    /// Waiting for the wall clock to reach this epoch.
    Until(f64, String),
    Never(String),
}

/// An allocation dependency (`{ref: target, condition}`), with its options: `task_index`
/// (one element of the job array `target`) and `delay` (seconds after the event).
#[derive(Debug, Clone, Copy)]
struct AllocationDep<'a> {
    target: &'a str,
    condition: DependencyCondition,
    task_index: Option<u64>,
    delay: Option<u64>,
}

fn allocation_state(
    store: &Store<Allocation>,
    a: &Allocation,
    d: AllocationDep<'_>,
    now: f64,
) -> DepState {
    let AllocationDep {
        target, condition, ..
    } = d;
    let ns = a.namespace();
    let dep = store.get_named(ns, target).or_else(|| {
        store
            .find(|o| o.namespace() == ns && o.uid() == Some(target))
            .into_iter()
            .next()
    });
    let Some(dep) = dep else {
        return DepState::Waiting(format!("{target} (not found yet)"));
    };
    if dep.uid().is_some() && dep.uid() == a.uid() {
        return DepState::Never(format!("{target} is this allocation itself"));
    }
    if condition == DependencyCondition::Corresponding {
        if let Some(state) = corresponding_state(store, a, &dep) {
            return state;
        }
    }
    // `taskIndex`: the element decides, as an allocation of its own.
    let (dep, name) = match d.task_index {
        Some(i) => match element_of(store, a, &dep, i) {
            Ok(e) => {
                let name = format!("{}[{i}] ({})", dep.name_any(), e.name_any());
                (e, name)
            }
            Err(state) => return state,
        },
        None => {
            let name = dep.name_any().to_string();
            (dep, name)
        }
    };
    let phase = dep.phase();
    let state = if condition == DependencyCondition::Started {
        if started(&dep) {
            DepState::Holds
        } else if phase.is_terminal() {
            DepState::Never(format!("{name} (started) ended {phase} without starting"))
        } else {
            DepState::Waiting(format!("{name} (started)"))
        }
    } else if !phase.is_terminal() {
        DepState::Waiting(format!("{name} ({condition})"))
    } else {
        let holds = match condition {
            // (`corresponding` on something that is not a job array; `mutex` is a lock,
            // see `lock_state`.)
            DependencyCondition::Success
            | DependencyCondition::Corresponding
            | DependencyCondition::Mutex => phase == AllocationPhase::Completed,
            // RFC 26: "with an unsuccessful result"; Slurm's afternotok likewise takes
            // every finished state but COMPLETED (cancelled, timed out, node failure).
            DependencyCondition::Failure => {
                matches!(phase, AllocationPhase::Failed | AllocationPhase::Cancelled)
            }
            DependencyCondition::Any | DependencyCondition::Started => true,
        };
        if holds {
            DepState::Holds
        } else {
            DepState::Never(format!("{name} ({condition}) ended {phase}"))
        }
    };
    match (state, d.delay) {
        (DepState::Holds, Some(delay)) if delay > 0 => {
            delayed_state(&dep, &name, condition, delay, now)
        }
        (state, _) => state,
    }
}

/// A dependency that holds, with a `delay`: it holds `delay` seconds after the time the
/// dependency recorded for the event — `status.startTime` for `started`, `status.endTime`
/// otherwise — never after the time this controller noticed it.
fn delayed_state(
    dep: &Allocation,
    name: &str,
    condition: DependencyCondition,
    delay: u64,
    now: f64,
) -> DepState {
    let st = dep.status.as_ref();
    let (event, recorded) = if condition == DependencyCondition::Started {
        ("start", st.and_then(|s| s.start_time))
    } else {
        ("end", st.and_then(|s| s.end_time))
    };
    let Some(at) = recorded else {
        // Its status records the time in the same write as the phase; wait for it.
        return DepState::Waiting(format!(
            "{name} ({condition} +{delay}s, {event} time not recorded yet)"
        ));
    };
    let t = at.timestamp() as f64 + delay as f64;
    if now >= t {
        DepState::Holds
    } else {
        DepState::Until(
            t,
            format!(
                "{name} ({condition} +{delay}s: {event} {} + {delay}s = {})",
                rfc3339(at.timestamp() as f64),
                rfc3339(t)
            ),
        )
    }
}

/// Element `i` of the job array `array` (`taskIndex`), or how the dependency stands when
/// there is none: `array` is no job array or has no index `i` (never), the element is not
/// created yet (waiting) or never will be (the array ended: never).
fn element_of(
    store: &Store<Allocation>,
    a: &Allocation,
    array: &Allocation,
    i: u64,
) -> Result<Arc<Allocation>, DepState> {
    let name = array.name_any();
    let Some(tg) = array
        .spec
        .task_group
        .as_ref()
        .filter(|_| !array.labels().contains_key(TASK_INDEX_LABEL))
    else {
        return Err(DepState::Never(format!(
            "{name} is not a job array (no spec.taskGroup), so it has no task {i}"
        )));
    };
    let Ok(range) = TaskRange::parse(&tg.range) else {
        return Err(DepState::Never(format!(
            "{name} has an invalid task range {:?}",
            tg.range
        )));
    };
    if !range.contains(i) {
        return Err(DepState::Never(format!(
            "{name} has no task {i} (its range is {})",
            tg.range
        )));
    }
    match array_element(store, a.namespace(), array, i) {
        Some(e) => Ok(e),
        None if array.phase().is_terminal() => Err(DepState::Never(format!(
            "task {i} of {name} was never created ({name} ended {})",
            array.phase()
        ))),
        None => Err(DepState::Waiting(format!("{name}[{i}] (not created yet)"))),
    }
}

/// Element `i` of the job array `array` (`<array>-<i>`, labelled with its index and owned
/// by the array), if it has been created.
fn array_element(
    store: &Store<Allocation>,
    ns: Option<&str>,
    array: &Allocation,
    i: u64,
) -> Option<Arc<Allocation>> {
    let index = i.to_string();
    store
        .get_named(ns, &format!("{}-{i}", array.name_any()))
        .filter(|e| {
            e.labels().get(TASK_INDEX_LABEL) == Some(&index)
                && e.owner_references()
                    .iter()
                    .any(|o| Some(o.uid.as_str()) == array.uid())
        })
}

/// `corresponding` (Slurm `aftercorr`) on the job array `dep`: `None` when `dep` is not
/// a job array (then it means `success` on `dep` as a whole).
fn corresponding_state(
    store: &Store<Allocation>,
    a: &Allocation,
    dep: &Allocation,
) -> Option<DepState> {
    let tg = dep.spec.task_group.as_ref()?;
    if dep.labels().contains_key(TASK_INDEX_LABEL) {
        return None;
    }
    let Some(i) = element_index(a) else {
        // The array itself: each of its elements waits for its own index.
        return a.spec.task_group.is_some().then_some(DepState::Holds);
    };
    let name = dep.name_any();
    let range = TaskRange::parse(&tg.range).ok()?;
    if !range.contains(i) {
        // No matching element: as if there were no such dependency (the seed).
        return Some(DepState::Holds);
    }
    let element = format!("{name}-{i}");
    Some(match array_element(store, a.namespace(), dep, i) {
        Some(e) => match e.phase() {
            AllocationPhase::Completed => DepState::Holds,
            p if p.is_terminal() => {
                DepState::Never(format!("element {i} of {name} ({element}) ended {p}"))
            }
            _ => DepState::Waiting(format!("{element} (corresponding)")),
        },
        None if dep.phase().is_terminal() => DepState::Never(format!(
            "element {i} of {name} never ran ({name} ended {})",
            dep.phase()
        )),
        None => DepState::Waiting(format!("{name}[{i}] (corresponding, not created yet)")),
    })
}

fn names(v: &[&Allocation]) -> String {
    let mut n: Vec<&str> = v.iter().map(|a| a.name_any()).collect();
    n.truncate(5);
    let more = v.len().saturating_sub(n.len());
    let mut s = n.join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

/// `singleton` (`what`, on the job name) and `mutex` (on `lock`): holds when no holder
/// of the lock of the same tenant and user that was submitted earlier is still active.
async fn lock_state(
    ctx: &Ctx,
    a: &Allocation,
    what: &str,
    lock: &str,
) -> Result<DepState, anyhow::Error> {
    let ns = a.namespace();
    let user = user_of(a);
    let others = ctx.store.find(|o| {
        o.namespace() == ns
            && o.uid() != a.uid()
            && !o.phase().is_terminal()
            && user_of(o) == user
            && holds_lock(o, lock)
            && !siblings(a, o)
    });
    if others.is_empty() {
        return Ok(DepState::Holds);
    }
    let mut objs: Vec<&Allocation> = others.iter().map(|o| o.as_ref()).collect();
    objs.push(a);
    let revs = ctx.create_revisions(&objs).await?;
    let Some(mine) = a.uid().and_then(|u| revs.get(u)) else {
        return Ok(DepState::Waiting(format!(
            "{what} (allocation not stored yet)"
        )));
    };
    let mut earlier: Vec<(i64, &Allocation)> = others
        .iter()
        .filter_map(|o| Some((*revs.get(o.uid()?)?, o.as_ref())))
        .filter(|(r, _)| r < mine)
        .collect();
    if earlier.is_empty() {
        return Ok(DepState::Holds);
    }
    earlier.sort_by_key(|(r, _)| *r);
    let e: Vec<&Allocation> = earlier.into_iter().map(|(_, o)| o).collect();
    Ok(DepState::Waiting(format!(
        "{what} {lock:?}{}: {} still active",
        if user.is_empty() {
            String::new()
        } else {
            format!(" of {user}")
        },
        names(&e)
    )))
}

async fn symbol_state(
    ctx: &Ctx,
    a: &Allocation,
    symbol: &str,
    type_: SymbolType,
    scope: SymbolScope,
) -> Result<DepState, anyhow::Error> {
    if !type_.reads() {
        return Ok(DepState::Holds); // `out` only declares a writer
    }
    let ns = a.namespace();
    let user = user_of(a);
    let mut writers = ctx.store.find(|o| {
        o.namespace() == ns
            && o.uid() != a.uid()
            && (scope == SymbolScope::Global || user_of(o) == user)
            && declares(o, symbol, scope).is_some_and(SymbolType::writes)
    });
    if scope == SymbolScope::Global && !writers.is_empty() {
        // A global writer whose user may not write there (RFC 26) is not a writer.
        let users: Vec<&str> = writers.iter().map(|w| user_of(w)).collect();
        let owners = ctx.owners(ns, &users).await?;
        writers.retain(|w| owners.iter().any(|o| o == user_of(w)));
    }
    if writers.is_empty() {
        return Ok(DepState::Holds);
    }
    let mut objs: Vec<&Allocation> = writers.iter().map(|o| o.as_ref()).collect();
    objs.push(a);
    let revs = ctx.create_revisions(&objs).await?;
    let Some(mine) = a.uid().and_then(|u| revs.get(u)) else {
        return Ok(DepState::Waiting(format!(
            "string:{symbol} (allocation not stored yet)"
        )));
    };
    let submitted = a.metadata.creation_timestamp;
    let mut earlier: Vec<(i64, &Allocation)> = writers
        .iter()
        .filter_map(|o| Some((*revs.get(o.uid()?)?, o.as_ref())))
        .filter(|(r, _)| r < mine)
        // Writers that had already ended unsuccessfully when this one was submitted are
        // no longer current writers.
        .filter(|(_, w)| {
            let ended_before = w
                .status
                .as_ref()
                .and_then(|s| s.end_time)
                .zip(submitted)
                .is_some_and(|(end, sub)| end < sub);
            !(w.phase().is_terminal() && w.phase() != AllocationPhase::Completed && ended_before)
        })
        .collect();
    earlier.sort_by_key(|(r, _)| *r);
    // An inout writer replaces the writers before it.
    if let Some(i) = earlier
        .iter()
        .rposition(|(_, w)| declares(w, symbol, scope) == Some(SymbolType::Inout))
    {
        earlier.drain(..i);
    }
    if let Some((_, w)) = earlier
        .iter()
        .find(|(_, w)| w.phase().is_terminal() && w.phase() != AllocationPhase::Completed)
    {
        return Ok(DepState::Never(format!(
            "writer {} of symbol {symbol:?} ended {}",
            w.name_any(),
            w.phase()
        )));
    }
    let pending: Vec<&Allocation> = earlier
        .iter()
        .filter(|(_, w)| !w.phase().is_terminal())
        .map(|(_, w)| *w)
        .collect();
    if pending.is_empty() {
        Ok(DepState::Holds)
    } else {
        Ok(DepState::Waiting(format!(
            "string:{symbol} (writers {})",
            names(&pending)
        )))
    }
}

async fn dependency_state(
    ctx: &Ctx,
    a: &Allocation,
    d: &Dependency,
    kind: DependencyKind<'_>,
    now: f64,
) -> Result<DepState, anyhow::Error> {
    Ok(match kind {
        DependencyKind::Allocation { target, condition } => allocation_state(
            &ctx.store,
            a,
            AllocationDep {
                target,
                condition,
                task_index: d.task_index,
                delay: d.delay_seconds(),
            },
            now,
        ),
        DependencyKind::BeginTime(t) => {
            if now >= t {
                DepState::Holds
            } else {
                DepState::Until(t, format!("begin time {}", rfc3339(t)))
            }
        }
        DependencyKind::Symbol { name, type_, scope } => {
            symbol_state(ctx, a, name, type_, scope).await?
        }
        DependencyKind::Singleton => lock_state(ctx, a, "singleton", job_name_of(a)).await?,
        DependencyKind::Mutex(lock) => lock_state(ctx, a, "mutex", lock).await?,
    })
}

/// The verdict over every dependency of an allocation.
#[derive(Debug)]
struct Verdict {
    records: Vec<DependencyStatus>,
    /// Every required dependency removed (satisfied), the any-of group (if any) satisfied
    /// by one of its entries, no fatal exception.
    ready: bool,
    waiting: Vec<String>,
    fatal: Option<String>,
    wake_at: Option<f64>,
}

/// The any-of group (`anyOf: true` entries, Slurm `?`) while it is evaluated.
#[derive(Debug, Default)]
struct AnyOf {
    members: usize,
    satisfied: bool,
    waiting: Vec<String>,
    never: Vec<String>,
}

async fn evaluate(ctx: &Ctx, a: &Allocation) -> Result<Verdict, anyhow::Error> {
    let now = epoch_now();
    let descriptions: Vec<String> = a.spec.depends_on.iter().map(|d| d.description()).collect();
    // Rebuild the RFC 26 tracker from the allocation's own status: what was added, and
    // what was satisfied (removed) before.
    let mut tracker = DependencyTracker::default();
    let posted = a
        .status
        .as_ref()
        .map(|s| s.dependencies.as_slice())
        .unwrap_or_default();
    for p in posted {
        if descriptions.contains(&p.description) {
            let _ = tracker.add(&p.description);
            if p.satisfied {
                let _ = tracker.remove(&p.description);
            }
        }
    }
    let mut v = Verdict {
        records: Vec::with_capacity(descriptions.len()),
        ready: false,
        waiting: Vec::new(),
        fatal: None,
        wake_at: None,
    };
    let mut group = AnyOf::default();
    let mut required_pending = 0usize;
    for (d, desc) in a.spec.depends_on.iter().zip(descriptions) {
        if d.any_of {
            group.members += 1;
        }
        // A duplicate add of a satisfied dependency is refused: it stays satisfied and
        // is not evaluated again.
        if let Err(EventError::DuplicateSatisfied(_)) = tracker.add(&desc) {
            group.satisfied |= d.any_of;
            v.records.push(DependencyStatus {
                description: desc,
                satisfied: true,
            });
            continue;
        }
        let Some(kind) = d.kind() else {
            tracker.raise_fatal(format!("{desc}: invalid dependency"));
            v.records.push(DependencyStatus {
                description: desc,
                satisfied: false,
            });
            continue;
        };
        let state = dependency_state(ctx, a, d, kind, now).await?;
        if let DepState::Until(t, _) = &state {
            v.wake_at = Some(v.wake_at.map_or(*t, |x: f64| x.min(*t)));
        }
        let satisfied = match state {
            DepState::Holds => {
                let _ = tracker.remove(&desc);
                group.satisfied |= d.any_of;
                true
            }
            DepState::Waiting(w) | DepState::Until(_, w) => {
                if d.any_of {
                    group.waiting.push(w);
                } else {
                    v.waiting.push(w);
                }
                false
            }
            // One alternative that can never hold only removes it from the group.
            DepState::Never(why) if d.any_of => {
                group.never.push(format!("{desc}: {why}"));
                false
            }
            DepState::Never(why) => {
                tracker.raise_fatal(format!("{desc}: {why}"));
                false
            }
        };
        if !satisfied && !d.any_of {
            required_pending += 1;
        }
        v.records.push(DependencyStatus {
            description: desc,
            satisfied,
        });
    }
    if group.members > 0 && !group.satisfied {
        if group.never.len() == group.members {
            tracker.raise_fatal(format!(
                "none of the any-of alternatives can hold ({})",
                group.never.join("; ")
            ));
        } else {
            v.waiting
                .push(format!("any of: {}", group.waiting.join(" | ")));
        }
    }
    v.fatal = tracker.fatal().map(str::to_string);
    v.ready = v.fatal.is_none() && required_pending == 0 && (group.members == 0 || group.satisfied);
    Ok(v)
}

/// `records`, keeping every dependency already recorded satisfied in `prev` satisfied.
fn merge_records(
    prev: &[DependencyStatus],
    mut records: Vec<DependencyStatus>,
) -> Vec<DependencyStatus> {
    for r in &mut records {
        if prev
            .iter()
            .any(|p| p.description == r.description && p.satisfied)
        {
            r.satisfied = true;
        }
    }
    records
}

async fn reconcile(a: Arc<Allocation>, ctx: Arc<Ctx>) -> Result<Action, anyhow::Error> {
    let api = ctx.api.for_obj(&a);
    let me = ObjectRef::from_obj(a.as_ref());
    if a.is_deleting() {
        ctx.shared.index().unregister(&me);
        return Ok(release_finalizer(&api, &a).await?);
    }
    if a.phase().is_terminal() || !unbound(&a) {
        ctx.shared.index().unregister(&me);
        return Ok(Action::await_change());
    }
    if lifecycle::cancel_requested(&a) {
        ctx.shared.index().unregister(&me);
        let why = a
            .metadata
            .annotations
            .get(CANCEL_REASON_ANNOTATION)
            .cloned();
        api.update_status_with_retry(a.name_any(), 5, |cur| {
            if cur.phase().is_terminal() || !unbound(cur) {
                return false;
            }
            let st = cur.status.get_or_insert_with(Default::default);
            st.phase = AllocationPhase::Cancelled;
            st.reason = Some(reason::CANCELLED.into());
            st.message = Some(
                why.clone()
                    .unwrap_or_else(|| "cancelled before it started".into()),
            );
            st.end_time = Some(now());
            true
        })
        .await?;
        tracing::info!(allocation = %a.object_ref(), "cancelled (never started)");
        return Ok(Action::await_change());
    }
    if a.spec.depends_on.is_empty() || dependencies_met(&a) {
        ctx.shared.index().unregister(&me);
        return Ok(Action::await_change());
    }
    if let Some(msg) = scope_violation(&ctx, &a).await? {
        ctx.shared.index().unregister(&me);
        end_unsatisfiable(
            &api,
            &a,
            AllocationPhase::Cancelled,
            (DEPENDENCY_NOT_PERMITTED, "NotPermitted"),
            &msg,
            Vec::new(),
        )
        .await?;
        return Ok(Action::await_change());
    }
    // Listen before looking: a change after the read below wakes this allocation again.
    ctx.shared.index().register(&me, wait_keys(&a));
    let v = evaluate(&ctx, &a).await?;

    if let Some(fatal) = &v.fatal {
        let msg = format!("dependency can never be satisfied: {fatal}");
        // Flux RFC 26: a dependency that can never be satisfied is a fatal exception,
        // the job fails (and `afternotok` on it holds, as on any failure).
        end_unsatisfiable(
            &api,
            &a,
            AllocationPhase::Failed,
            (reason::DEPENDENCY_NEVER_SATISFIED, "NeverSatisfied"),
            &msg,
            v.records.clone(),
        )
        .await?;
        ctx.shared.index().unregister(&me);
        return Ok(Action::await_change());
    }
    let met = v.ready;
    let (status, why, msg) = if met {
        (ConditionStatus::True, "AllSatisfied", String::new())
    } else {
        (
            ConditionStatus::False,
            "Waiting",
            format!("waiting for dependencies: {}", v.waiting.join(", ")),
        )
    };
    let records = v.records;
    api.update_status_with_retry(a.name_any(), 5, |cur| {
        if cur.phase().is_terminal() || !unbound(cur) || dependencies_met(cur) {
            return false;
        }
        let st = cur.status.get_or_insert_with(Default::default);
        let before = st.clone();
        st.dependencies = merge_records(&st.dependencies, records.clone());
        set_condition(
            &mut st.conditions,
            Condition::new(DEPENDENCIES_MET, status, why, &msg),
        );
        if status == ConditionStatus::True {
            if st.reason.as_deref() == Some(reason::WAITING_FOR_DEPENDENCIES) {
                st.reason = None;
                st.message = None;
            }
        } else {
            st.reason = Some(reason::WAITING_FOR_DEPENDENCIES.into());
            st.message = Some(msg.clone());
        }
        *st != before
    })
    .await?;
    if met {
        ctx.shared.index().unregister(&me);
        tracing::debug!(allocation = %a.object_ref(), "dependencies met");
        return Ok(Action::await_change());
    }
    Ok(match v.wake_at {
        Some(t) => {
            let wait =
                Duration::from_secs_f64((t - epoch_now()).max(0.0)) + Duration::from_millis(20);
            Action::requeue(wait.min(MAX_TIMER))
        }
        None => Action::await_change(),
    })
}

/// Flux RFC 26's scope rule: the message for an allocation declaring `out`/`inout` in
/// scope `global` when its user is not an instance owner (a tenant admin).
async fn scope_violation(ctx: &Ctx, a: &Allocation) -> Result<Option<String>, anyhow::Error> {
    let global_writes: Vec<(String, SymbolAccess)> = a
        .spec
        .depends_on
        .iter()
        .filter_map(|d| match d.kind() {
            Some(DependencyKind::Symbol {
                type_,
                scope: SymbolScope::Global,
                ..
            }) if type_.writes() => Some((
                d.description(),
                match type_ {
                    SymbolType::In => SymbolAccess::In,
                    SymbolType::Out => SymbolAccess::Out,
                    SymbolType::Inout => SymbolAccess::Inout,
                },
            )),
            _ => None,
        })
        .collect();
    if global_writes.is_empty() {
        return Ok(None);
    }
    let user = user_of(a);
    let owner = ctx
        .owners(a.namespace(), &[user])
        .await?
        .iter()
        .any(|o| o == user);
    let Some((desc, _)) = global_writes
        .into_iter()
        .find(|(_, access)| !scope_permits(*access, FluxScope::Global, owner))
    else {
        return Ok(None);
    };
    let tenant = a.namespace().unwrap_or_default();
    let who = if user.is_empty() {
        "this allocation names no user (annotation lattice.dev/user)".to_string()
    } else {
        format!("{user:?} is not one")
    };
    Ok(Some(format!(
        "{} (Flux RFC 26 scope rule: the instance owners of tenant {tenant:?} are the users in its Tenant's spec.admins, and {who}), or have a tenant admin submit it",
        FluxError::GlobalScopeDenied(desc)
    )))
}

/// Cancel an unbound allocation whose dependencies can never be satisfied (or are not
/// permitted): `reason` is (status reason, `DependenciesMet` condition reason).
/// End an allocation whose dependencies can never hold (`phase` Failed) or that may not
/// have them (Cancelled), before it ever ran.
async fn end_unsatisfiable(
    api: &Api<Allocation>,
    a: &Allocation,
    phase: AllocationPhase,
    reason: (&str, &str),
    msg: &str,
    records: Vec<DependencyStatus>,
) -> Result<(), anyhow::Error> {
    api.update_status_with_retry(a.name_any(), 5, |cur| {
        if cur.phase().is_terminal() || !unbound(cur) || dependencies_met(cur) {
            return false;
        }
        let st = cur.status.get_or_insert_with(Default::default);
        st.dependencies = merge_records(&st.dependencies, records.clone());
        st.phase = phase;
        st.reason = Some(reason.0.into());
        st.message = Some(msg.to_string());
        st.end_time = Some(now());
        set_condition(
            &mut st.conditions,
            Condition::new(DEPENDENCIES_MET, ConditionStatus::False, reason.1, msg),
        );
        true
    })
    .await?;
    tracing::info!(allocation = %a.object_ref(), ?phase, %msg, "dependencies cannot hold");
    Ok(())
}

/// A deleted allocation keeps `lattice.dev/nodes` until no node runs its processes any
/// more (its agents stop it: deletion counts as a cancel); then the finalizer goes, with a
/// patch guarded by a `test` of the entry, and the release controller frees the nodes.
async fn release_finalizer(
    api: &Api<Allocation>,
    a: &Allocation,
) -> Result<Action, lattice_runtime::Error> {
    let Some(i) = a
        .metadata
        .finalizers
        .iter()
        .position(|f| f == lifecycle::NODES_FINALIZER)
    else {
        return Ok(Action::await_change());
    };
    if !lifecycle::processes_gone(a) {
        return Ok(Action::await_change());
    }
    let patch = lattice_runtime::Patch::Json(serde_json::json!([
        {"op": "test", "path": format!("/metadata/finalizers/{i}"), "value": lifecycle::NODES_FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{i}")},
    ]));
    match api
        .patch(
            a.name_any(),
            &lattice_runtime::PatchParams::default(),
            &patch,
        )
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(e) if e.is_not_found() || e.is_patch_test_failed() => Ok(Action::await_change()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn alloc(v: serde_json::Value) -> Arc<Allocation> {
        Arc::new(serde_json::from_value(v).expect("allocation"))
    }

    #[test]
    fn wake_index_wakes_only_on_phase_changes_of_what_is_waited_on() {
        let mut idx = WakeIndex::default();
        let waiter = alloc(json!({
            "metadata": {"name": "w", "namespace": "t", "uid": "u-w",
                         "annotations": {"lattice.dev/user": "alice"}},
            "spec": {"tags": {"name": "job"}, "dependsOn": [
                {"ref": "a", "condition": "success"},
                {"symbol": "s", "type": "in"},
                {"singleton": true}
            ]}
        }));
        let wr = ObjectRef::from_obj(waiter.as_ref());
        idx.register(&wr, wait_keys(&waiter));
        let a = |phase: &str, extra: serde_json::Value| {
            let mut v = json!({
                "metadata": {"name": "a", "namespace": "t", "uid": "u-a"},
                "status": {"phase": phase}
            });
            crate::allocations::tests::merge(&mut v, extra);
            alloc(v)
        };
        // First sight counts as a change; the same phase again does not.
        assert_eq!(
            idx.on_event(&InformerEvent::Applied(a("Pending", json!({})))),
            vec![wr.clone()]
        );
        assert!(idx
            .on_event(&InformerEvent::Applied(a("Pending", json!({}))))
            .is_empty());
        assert_eq!(
            idx.on_event(&InformerEvent::Applied(a("Completed", json!({})))),
            vec![wr.clone()]
        );
        // A writer of the symbol (other name) and a job-name sibling wake it too.
        let writer = alloc(json!({
            "metadata": {"name": "x", "namespace": "t", "uid": "u-x"},
            "spec": {"dependsOn": [{"symbol": "s", "type": "out"}]},
            "status": {"phase": "Running"}
        }));
        assert_eq!(
            idx.on_event(&InformerEvent::Applied(writer)),
            vec![wr.clone()]
        );
        let sibling = alloc(json!({
            "metadata": {"name": "y", "namespace": "t", "uid": "u-y",
                         "annotations": {"lattice.dev/user": "alice"}},
            "spec": {"tags": {"name": "job"}},
            "status": {"phase": "Running"}
        }));
        assert_eq!(
            idx.on_event(&InformerEvent::Applied(sibling.clone())),
            vec![wr.clone()]
        );
        // Other tenants, users and symbols do not.
        let other = alloc(json!({
            "metadata": {"name": "a", "namespace": "t2", "uid": "u-a2"},
            "spec": {"tags": {"name": "job"}, "dependsOn": [{"symbol": "s2", "type": "out"}]},
            "status": {"phase": "Failed"}
        }));
        assert!(idx.on_event(&InformerEvent::Applied(other)).is_empty());
        // A terminal waiter is forgotten.
        idx.unregister(&wr);
        assert!(idx.waiters.is_empty());
        assert!(idx.on_event(&InformerEvent::Deleted(sibling)).is_empty());
    }

    pub(crate) fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    #[test]
    fn merged_records_never_lose_a_satisfied_dependency() {
        let prev = vec![
            DependencyStatus {
                description: "after:a".into(),
                satisfied: true,
            },
            DependencyStatus {
                description: "afterok:b".into(),
                satisfied: false,
            },
        ];
        let now = vec![
            DependencyStatus {
                description: "after:a".into(),
                satisfied: false,
            },
            DependencyStatus {
                description: "afterok:b".into(),
                satisfied: true,
            },
        ];
        let m = merge_records(&prev, now);
        assert!(m.iter().all(|r| r.satisfied));
    }
}
