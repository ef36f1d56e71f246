//! The garbage collector: deletes dependents whose owners are gone, and carries out
//! the three deletion propagation policies of Kubernetes.
//!
//! A DELETE chooses what happens to the object's dependents (the objects whose
//! `ownerReferences` carry its uid) with `DeleteOptions.propagationPolicy`
//! ([`DeleteParams::propagation_policy`]):
//!
//! * **Background** (the default): the API server deletes the owner at once; the
//!   collector then deletes the dependents, whose own dependents follow in turn.
//! * **Foreground**: the API server only marks the owner (`deletionTimestamp` and the
//!   finalizer `foregroundDeletion`). The collector deletes its dependents — with
//!   `Foreground` as well, so the whole tree goes bottom-up — and removes the finalizer
//!   (which completes the delete) once no dependent whose reference has
//!   `blockOwnerDeletion: true` remains. Non-blocking dependents are deleted too but
//!   are not waited for.
//! * **Orphan**: the API server marks the owner (finalizer `orphan`); the collector
//!   removes the owner from every dependent's `ownerReferences`, then removes the
//!   finalizer. The dependents survive.
//!
//! For every kind, a controller looks at each object:
//!
//! * marked for deletion with `orphan`: orphan its dependents, then drop the finalizer;
//! * marked for deletion with `foregroundDeletion`: wait for its blocking dependents,
//!   then drop the finalizer;
//! * otherwise, for each owner reference the owner is *alive* (it exists with that uid
//!   and is not waiting for its dependents), *gone*, or *waiting* (foreground deletion
//!   in progress):
//!   * every owner alive: nothing to do;
//!   * some owner alive: drop the references to the gone and waiting owners;
//!   * no owner alive: delete the dependent (foreground if an owner is waiting), with a
//!     uid precondition so that a recreated object of the same name is never hit.
//!
//! Owners trigger their dependents through the owner-uid index of the shared caches,
//! on deletion and as soon as they are marked for a foreground deletion; dependents
//! trigger their waiting owners when they change or go (and a waiting owner re-checks
//! every few seconds, for references removed from a dependent). An owner missing from
//! the cache is confirmed with a live GET before anything is deleted, because a cache
//! can lag (a dependent seen before its new owner). Every write is guarded (uid
//! precondition, or a JSON patch that tests the resourceVersion and is recomputed from
//! a live read after a lost race). Finalizers are respected: deleting a dependent with
//! finalizers only marks it, and a blocking dependent holds a foreground deletion until
//! it is really gone.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use lattice_apis::wellknown::{FOREGROUND_FINALIZER, ORPHAN_FINALIZER};
use lattice_apis::{
    Allocation, Dag, Event, KindInfo, Lease, NetworkDomain, Node, OwnerReference, Resource, Tenant,
    VCluster,
};
use serde_json::{json, Value};

use crate::api::{Api, DeleteResult};
use crate::client::{Client, DeleteParams, Patch, PatchParams, PropagationPolicy};
use crate::controller::Action;
use crate::error::{Error, ErrorResponse};
use crate::host::{ControllerHost, HostContext};
use crate::informer::{InformerEvent, InformerFactory, InformerParams};
use crate::resource::{kind_info, ObjectRef, ResourceExt};

/// Name of the controller in the host, logs and metrics.
pub const NAME: &str = "garbage-collector";

/// How often an owner in foreground deletion re-checks its dependents even without an
/// event (a reference removed from a dependent triggers nothing).
const RECHECK_WAITING: Duration = Duration::from_secs(2);

/// Guarded patches re-read the object and retry this many times after a lost race.
const PATCH_ATTEMPTS: usize = 5;

/// Register the garbage collector in a host.
pub fn register(host: &mut ControllerHost) {
    host.register(NAME, run);
}

/// What the cache knows of a possible owner.
struct CachedOwner {
    uid: String,
    waiting: bool,
}

/// A dependent of some owner, whatever its kind.
struct Dependent {
    kind: &'static KindInfo,
    namespace: Option<String>,
    name: String,
    uid: String,
    owner_references: Vec<OwnerReference>,
    /// The cached object as JSON: the base of a guarded patch (`None`: read it live).
    json: Option<Value>,
}

impl Dependent {
    /// Whether this dependent holds a foreground deletion of `owner_uid`.
    fn blocks(&self, owner_uid: &str) -> bool {
        self.owner_references
            .iter()
            .any(|o| o.uid == owner_uid && o.block_owner_deletion == Some(true))
    }
}

type CacheLookup = Box<dyn Fn(Option<&str>, &str) -> Option<CachedOwner> + Send + Sync>;
type DependentsLookup = Box<dyn Fn(&str) -> Vec<Dependent> + Send + Sync>;

/// The collector's view of the object graph: the shared caches of every kind, and the
/// client to confirm and act.
struct Graph {
    client: Client,
    /// Kind → (namespace, name) → cached uid and whether it waits for its dependents.
    owners: HashMap<&'static str, CacheLookup>,
    /// One per kind: the cached objects that carry an owner reference to a uid.
    dependents: Vec<DependentsLookup>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnerState {
    /// Exists with the referenced uid, not in foreground deletion.
    Alive,
    /// No object with the referenced uid.
    Gone,
    /// Exists, marked for deletion with `foregroundDeletion`: its dependents must go.
    Waiting,
}

/// Whether `obj` is in a foreground deletion (marked, finalizer `foregroundDeletion`).
fn waits_for_dependents<K: Resource>(obj: &K) -> bool {
    obj.is_deleting() && obj.finalizers().iter().any(|f| f == FOREGROUND_FINALIZER)
}

fn json_finalizers(v: &Value) -> Vec<String> {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn json_is_deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

impl Graph {
    fn new(client: Client, factory: &InformerFactory) -> Self {
        let mut graph = Self {
            client,
            owners: HashMap::new(),
            dependents: Vec::new(),
        };
        fn add<O: Resource + Send + Sync + 'static>(g: &mut Graph, factory: &InformerFactory) {
            let store = factory.all::<O>().store();
            let owners = store.clone();
            g.owners.insert(
                O::KIND,
                Box::new(move |ns, name| {
                    owners.get_named(ns, name).and_then(|o| {
                        o.uid().map(|uid| CachedOwner {
                            uid: uid.to_string(),
                            waiting: waits_for_dependents(&*o),
                        })
                    })
                }),
            );
            let kind = kind_info::<O>();
            g.dependents.push(Box::new(move |owner_uid| {
                store
                    .by_owner_uid(owner_uid)
                    .iter()
                    .map(|d| Dependent {
                        kind,
                        namespace: d.namespace().map(str::to_string),
                        name: d.name_any().to_string(),
                        uid: d.uid().unwrap_or("").to_string(),
                        owner_references: d.owner_references().to_vec(),
                        json: serde_json::to_value(&**d).ok(),
                    })
                    .collect()
            }));
        }
        add::<Allocation>(&mut graph, factory);
        add::<Dag>(&mut graph, factory);
        add::<Tenant>(&mut graph, factory);
        add::<VCluster>(&mut graph, factory);
        add::<NetworkDomain>(&mut graph, factory);
        add::<Node>(&mut graph, factory);
        add::<Lease>(&mut graph, factory);
        add::<Event>(&mut graph, factory);
        graph
    }

    /// The cached dependents (every kind) of the object with this uid.
    fn dependents_of(&self, owner_uid: &str) -> Vec<Dependent> {
        self.dependents
            .iter()
            .flat_map(|lookup| lookup(owner_uid))
            .collect()
    }

    async fn state(&self, owner: &OwnerReference, ns: Option<&str>) -> crate::Result<OwnerState> {
        let Some(info) = lattice_apis::kinds().iter().find(|k| k.kind == owner.kind) else {
            // A kind we cannot look up: never delete on a guess.
            return Ok(OwnerState::Alive);
        };
        let ns = if info.namespaced { ns } else { None };
        if let Some(lookup) = self.owners.get(info.kind) {
            if let Some(cached) = lookup(ns, &owner.name).filter(|c| c.uid == owner.uid) {
                return Ok(if cached.waiting {
                    OwnerState::Waiting
                } else {
                    OwnerState::Alive
                });
            }
        }
        // Confirm against the API before acting on a cache miss.
        match self.client.transport().get(info, ns, &owner.name).await {
            Ok(v) => {
                let uid = v.pointer("/metadata/uid").and_then(|u| u.as_str());
                Ok(if uid != Some(owner.uid.as_str()) {
                    OwnerState::Gone
                } else if json_is_deleting(&v)
                    && json_finalizers(&v)
                        .iter()
                        .any(|f| f == FOREGROUND_FINALIZER)
                {
                    OwnerState::Waiting
                } else {
                    OwnerState::Alive
                })
            }
            Err(e) if e.is_not_found() => Ok(OwnerState::Gone),
            Err(e) => Err(e),
        }
    }

    /// Change the object (`kind`, `ns`, `name`, which must still have `uid`) with a JSON
    /// patch guarded by a `test` of its resourceVersion. `edit` computes the operations
    /// from the object (`None`: nothing to do); `current` is where to start (the cached
    /// object), and after a lost race the object is read again live.
    /// `Ok(true)`: patched; `Ok(false)`: nothing to do, or the object is gone.
    async fn guarded_patch<F>(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        uid: &str,
        mut current: Option<Value>,
        edit: F,
    ) -> crate::Result<bool>
    where
        F: Fn(&Value) -> Option<Vec<Value>>,
    {
        let transport = self.client.transport();
        for _ in 0..PATCH_ATTEMPTS {
            let obj = match current.take() {
                Some(v) => v,
                None => match transport.get(kind, ns, name).await {
                    Ok(v) => v,
                    Err(e) if e.is_not_found() => return Ok(false),
                    Err(e) => return Err(e),
                },
            };
            if obj.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid) {
                // Gone and recreated under the same name: not ours.
                return Ok(false);
            }
            let Some(ops) = edit(&obj) else {
                return Ok(false);
            };
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            let mut all =
                vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv})];
            all.extend(ops);
            let patch = Patch::Json(Value::Array(all));
            match transport
                .patch(kind, ns, name, &patch, None, &PatchParams::default())
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if e.is_not_found() => return Ok(false),
                // Changed since it was read: read it again and recompute.
                Err(e) if e.is_patch_test_failed() || e.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        Err(Error::Api(ErrorResponse {
            code: 409,
            reason: "Conflict".into(),
            message: format!(
                "{} {name}: still changing after {PATCH_ATTEMPTS} guarded patches",
                kind.kind
            ),
        }))
    }

    /// Remove the owner references whose uid is in `uids`.
    async fn drop_owner_refs(&self, d: Dependent, uids: &[String]) -> crate::Result<bool> {
        self.guarded_patch(
            d.kind,
            d.namespace.as_deref(),
            &d.name,
            &d.uid,
            d.json,
            |obj| {
                let refs = obj.pointer("/metadata/ownerReferences")?.as_array()?;
                let keep: Vec<&Value> = refs
                    .iter()
                    .filter(|r| {
                        !r.get("uid")
                            .and_then(Value::as_str)
                            .is_some_and(|u| uids.iter().any(|x| x == u))
                    })
                    .collect();
                if keep.len() == refs.len() {
                    return None;
                }
                Some(vec![if keep.is_empty() {
                    json!({"op": "remove", "path": "/metadata/ownerReferences"})
                } else {
                    json!({"op": "replace", "path": "/metadata/ownerReferences", "value": keep})
                }])
            },
        )
        .await
    }

    /// Remove `finalizer` from an object marked for deletion (the last one deletes it).
    async fn remove_finalizer<K: Resource>(&self, obj: &K, finalizer: &str) -> crate::Result<bool> {
        let Some(uid) = obj.uid() else {
            return Ok(false);
        };
        self.guarded_patch(
            kind_info::<K>(),
            obj.namespace(),
            obj.name_any(),
            uid,
            serde_json::to_value(obj).ok(),
            |v| {
                let fins = json_finalizers(v);
                if !json_is_deleting(v) || !fins.iter().any(|f| f == finalizer) {
                    return None;
                }
                let keep: Vec<&String> = fins.iter().filter(|f| *f != finalizer).collect();
                Some(vec![
                    json!({"op": "replace", "path": "/metadata/finalizers", "value": keep}),
                ])
            },
        )
        .await
    }

    /// The owner side of a deletion: orphan the dependents, or wait for them.
    async fn finish_deletion<K: Resource>(&self, obj: &K) -> crate::Result<Action> {
        let Some(uid) = obj.uid() else {
            return Ok(Action::await_change());
        };
        let has = |f: &str| obj.finalizers().iter().any(|x| x == f);
        if has(ORPHAN_FINALIZER) {
            let owner = vec![uid.to_string()];
            let mut orphaned = 0;
            for d in self.dependents_of(uid) {
                if self.drop_owner_refs(d, &owner).await? {
                    orphaned += 1;
                }
            }
            if self.remove_finalizer(obj, ORPHAN_FINALIZER).await? {
                tracing::info!(object = %obj.object_ref(), orphaned, "orphan deletion: dependents released");
            }
            // A `foregroundDeletion` finalizer as well, oddly: the update brings us back.
            return Ok(Action::await_change());
        }
        if has(FOREGROUND_FINALIZER) {
            let blocking = self
                .dependents_of(uid)
                .iter()
                .filter(|d| d.blocks(uid))
                .count();
            if blocking > 0 {
                tracing::debug!(object = %obj.object_ref(), blocking, "foreground deletion: waiting for dependents");
                return Ok(Action::requeue(RECHECK_WAITING));
            }
            if self.remove_finalizer(obj, FOREGROUND_FINALIZER).await? {
                tracing::info!(object = %obj.object_ref(), "foreground deletion: dependents gone");
            }
        }
        Ok(Action::await_change())
    }
}

/// Collect garbage of one object: finish its own deletion, or act on its owners.
async fn collect<D: Resource + Send + Sync + 'static>(
    obj: Arc<D>,
    graph: Arc<Graph>,
) -> crate::Result<Action> {
    if obj.is_deleting() {
        return graph.finish_deletion(&*obj).await;
    }
    if obj.owner_references().is_empty() {
        return Ok(Action::await_change());
    }
    let mut alive = false;
    let mut gone = Vec::new();
    let mut waiting = Vec::new();
    for o in obj.owner_references() {
        match graph.state(o, obj.namespace()).await? {
            OwnerState::Alive => alive = true,
            OwnerState::Gone => gone.push(o.uid.clone()),
            OwnerState::Waiting => waiting.push(o.uid.clone()),
        }
    }
    if gone.is_empty() && waiting.is_empty() {
        return Ok(Action::await_change());
    }
    let name = obj.name_any();
    if alive {
        // Another owner keeps it: only the references to the others go.
        let drop: Vec<String> = gone.iter().chain(&waiting).cloned().collect();
        let d = Dependent {
            kind: kind_info::<D>(),
            namespace: obj.namespace().map(str::to_string),
            name: name.to_string(),
            uid: obj.uid().unwrap_or("").to_string(),
            owner_references: Vec::new(),
            json: serde_json::to_value(&*obj).ok(),
        };
        if graph.drop_owner_refs(d, &drop).await? {
            tracing::info!(object = %obj.object_ref(), removed = drop.len(), "dropped owner references to gone or deleting owners");
        }
        return Ok(Action::await_change());
    }
    let api: Api<D> = Api::scoped(graph.client.clone(), obj.namespace());
    let uid = obj.uid().unwrap_or("");
    let mut params = DeleteParams::with_uid(uid);
    if !waiting.is_empty() {
        // An owner waits for its dependents: take ours down first as well.
        params = params.propagation(PropagationPolicy::Foreground);
    }
    match api.delete(name, &params).await {
        Ok(DeleteResult::Deleted(_)) => {
            tracing::info!(object = %obj.object_ref(), "garbage collected: no owner left")
        }
        Ok(DeleteResult::Pending(_)) => {
            tracing::info!(object = %obj.object_ref(), "garbage collecting: waiting for finalizers")
        }
        // Already gone, or a new object took the name: nothing of ours to delete.
        Err(e) if e.is_not_found() || e.is_conflict() => {}
        Err(e) => return Err(e),
    }
    Ok(Action::await_change())
}

/// Events of kind `O` that concern the collector of kind `D`:
///
/// * an `O` deleted, or marked for a foreground deletion: its `D` dependents;
/// * an `O` changed or deleted while one of its `D` owners is in a foreground
///   deletion: that owner (it may have been waiting for this dependent).
fn related<D, O>(c: crate::Controller<D>, store: crate::reflector::Store<D>) -> crate::Controller<D>
where
    D: Resource + Send + Sync + 'static,
    O: Resource + Send + Sync + 'static,
{
    c.watches_events::<O, _>(&InformerParams::default(), move |ev| {
        let o = ev.object();
        let mut refs = Vec::new();
        let owner_done = match ev {
            InformerEvent::Deleted(_) => true,
            InformerEvent::Applied(o) => waits_for_dependents(&**o),
        };
        if owner_done {
            if let Some(uid) = o.uid() {
                refs.extend(store.by_owner_uid(uid).iter().map(|d| d.object_ref()));
            }
        }
        for r in o.owner_references().iter().filter(|r| r.kind == D::KIND) {
            let owner = ObjectRef::from_owner(r, o.namespace());
            let waiting = store
                .get(&owner)
                .is_some_and(|w| w.uid() == Some(r.uid.as_str()) && waits_for_dependents(&*w));
            if waiting {
                refs.push(owner);
            }
        }
        refs
    })
}

fn collector<D: Resource + Send + Sync + 'static>(
    ctx: &HostContext,
    graph: Arc<Graph>,
    ready: &mut Vec<tokio::sync::watch::Receiver<bool>>,
) -> BoxFuture<'static, ()> {
    // Each collector reports its own readiness; the host sees them all-or-nothing.
    // `collect` has nothing to do for an object with no owners that is not being
    // deleted; such objects (most of a busy kind) need not wake the collector. Owners'
    // changes still reach their dependents through `related`.
    let c = crate::Controller::<D>::new(&ctx.factory)
        .name(&ctx.name)
        .metrics(ctx.metrics.clone())
        .filter(|o: &D| o.is_deleting() || !o.owner_references().is_empty());
    ready.push(c.ready());
    let store = c.store();
    let c = related::<D, Allocation>(c, store.clone());
    let c = related::<D, Dag>(c, store.clone());
    let c = related::<D, Tenant>(c, store.clone());
    let c = related::<D, VCluster>(c, store.clone());
    let c = related::<D, NetworkDomain>(c, store.clone());
    let c = related::<D, Node>(c, store.clone());
    let c = related::<D, Lease>(c, store.clone());
    let c = related::<D, Event>(c, store);
    c.run(|obj: Arc<D>, graph: Arc<Graph>| collect(obj, graph), graph)
        .boxed()
}

/// The garbage collector's body, as registered by [`register`].
pub async fn run(ctx: HostContext) {
    let graph = Arc::new(Graph::new(ctx.client.clone(), &ctx.factory));
    // One controller per kind; they share the host's informers and report under one
    // name.
    let mut ready = Vec::new();
    let collectors = [
        collector::<Allocation>(&ctx, graph.clone(), &mut ready),
        collector::<Dag>(&ctx, graph.clone(), &mut ready),
        collector::<Tenant>(&ctx, graph.clone(), &mut ready),
        collector::<VCluster>(&ctx, graph.clone(), &mut ready),
        collector::<NetworkDomain>(&ctx, graph.clone(), &mut ready),
        collector::<Node>(&ctx, graph.clone(), &mut ready),
        collector::<Lease>(&ctx, graph.clone(), &mut ready),
        collector::<Event>(&ctx, graph, &mut ready),
    ];
    let report = {
        let ctx = ctx.clone();
        async move {
            for mut r in ready {
                let _ = r.wait_for(|v| *v).await;
            }
            ctx.set_ready(true);
            futures::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = futures::future::join_all(collectors) => {}
        _ = report => {}
    }
}
