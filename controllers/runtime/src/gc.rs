//! The garbage collector: deletes dependents whose owners are gone.
//!
//! For every kind, a controller looks at objects with `ownerReferences`:
//!
//! * every owner still exists (same uid): nothing to do;
//! * no owner exists any more: delete the dependent (background propagation: the
//!   owner is already gone, the dependent's own dependents follow in turn), with a uid
//!   precondition so that a recreated object of the same name is never hit;
//! * some owners exist: drop the dangling references (guarded JSON patch).
//!
//! Owner deletions trigger the dependents through the owner-uid index of the shared
//! caches. An owner missing from the cache is confirmed with a live GET before anything
//! is deleted, because a cache can lag (a dependent seen before its new owner).
//! Finalizers are respected: deleting a dependent with finalizers only marks it.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use lattice_apis::{
    Allocation, Dag, Event, Lease, NetworkDomain, Node, OwnerReference, Resource, Tenant, VCluster,
};
use serde_json::json;

use crate::api::{Api, DeleteResult};
use crate::client::{Client, DeleteParams, Patch, PatchParams};
use crate::controller::Action;
use crate::host::{ControllerHost, HostContext};
use crate::informer::{InformerEvent, InformerFactory, InformerParams};
use crate::resource::{ObjectRef, ResourceExt};

/// Name of the controller in the host, logs and metrics.
pub const NAME: &str = "garbage-collector";

/// Register the garbage collector in a host.
pub fn register(host: &mut ControllerHost) {
    host.register(NAME, run);
}

type CacheLookup = Box<dyn Fn(Option<&str>, &str) -> Option<String> + Send + Sync>;

/// Tells whether an owner still exists.
struct Owners {
    client: Client,
    /// Kind → (namespace, name) → cached uid.
    caches: HashMap<&'static str, CacheLookup>,
}

#[derive(Debug, PartialEq, Eq)]
enum OwnerState {
    Alive,
    Gone,
}

impl Owners {
    fn new(client: Client, factory: &InformerFactory) -> Self {
        let mut caches: HashMap<&'static str, CacheLookup> = HashMap::new();
        fn add<O: Resource + Send + Sync + 'static>(
            caches: &mut HashMap<&'static str, CacheLookup>,
            factory: &InformerFactory,
        ) {
            let store = factory.all::<O>().store();
            caches.insert(
                O::KIND,
                Box::new(move |ns, name| {
                    store
                        .get_named(ns, name)
                        .and_then(|o| o.uid().map(str::to_string))
                }),
            );
        }
        add::<Allocation>(&mut caches, factory);
        add::<Dag>(&mut caches, factory);
        add::<Tenant>(&mut caches, factory);
        add::<VCluster>(&mut caches, factory);
        add::<NetworkDomain>(&mut caches, factory);
        add::<Node>(&mut caches, factory);
        add::<Lease>(&mut caches, factory);
        add::<Event>(&mut caches, factory);
        Self { client, caches }
    }

    async fn state(&self, owner: &OwnerReference, ns: Option<&str>) -> crate::Result<OwnerState> {
        let Some(info) = lattice_apis::kinds().iter().find(|k| k.kind == owner.kind) else {
            // A kind we cannot look up: never delete on a guess.
            return Ok(OwnerState::Alive);
        };
        let ns = if info.namespaced { ns } else { None };
        if let Some(lookup) = self.caches.get(info.kind) {
            if lookup(ns, &owner.name).as_deref() == Some(owner.uid.as_str()) {
                return Ok(OwnerState::Alive);
            }
        }
        // Confirm against the API before acting on a cache miss.
        match self.client.transport().get(info, ns, &owner.name).await {
            Ok(v) => {
                let uid = v.pointer("/metadata/uid").and_then(|u| u.as_str());
                Ok(if uid == Some(owner.uid.as_str()) {
                    OwnerState::Alive
                } else {
                    OwnerState::Gone
                })
            }
            Err(e) if e.is_not_found() => Ok(OwnerState::Gone),
            Err(e) => Err(e),
        }
    }
}

/// Collect garbage of one dependent.
async fn collect<D: Resource + Send + Sync + 'static>(
    obj: Arc<D>,
    owners: Arc<Owners>,
) -> crate::Result<Action> {
    if obj.owner_references().is_empty() || obj.is_deleting() {
        return Ok(Action::await_change());
    }
    let mut dangling = Vec::new();
    for o in obj.owner_references() {
        if owners.state(o, obj.namespace()).await? == OwnerState::Gone {
            dangling.push(o.uid.clone());
        }
    }
    if dangling.is_empty() {
        return Ok(Action::await_change());
    }
    let api: Api<D> = Api::scoped(owners.client.clone(), obj.namespace());
    let name = obj.name_any();
    if dangling.len() == obj.owner_references().len() {
        let uid = obj.uid().unwrap_or("");
        match api.delete(name, &DeleteParams::with_uid(uid)).await {
            Ok(DeleteResult::Deleted(_)) => {
                tracing::info!(object = %obj.object_ref(), "garbage collected: every owner is gone")
            }
            Ok(DeleteResult::Pending(_)) => {
                tracing::info!(object = %obj.object_ref(), "garbage collecting: waiting for finalizers")
            }
            // Already gone, or a new object took the name: nothing of ours to delete.
            Err(e) if e.is_not_found() || e.is_conflict() => {}
            Err(e) => return Err(e),
        }
    } else {
        let keep: Vec<&OwnerReference> = obj
            .owner_references()
            .iter()
            .filter(|o| !dangling.contains(&o.uid))
            .collect();
        let patch = Patch::Json(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": obj.resource_version().unwrap_or("")},
            {"op": "replace", "path": "/metadata/ownerReferences", "value": keep},
        ]));
        match api.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                tracing::info!(object = %obj.object_ref(), removed = dangling.len(), "dropped dangling owner references")
            }
            Err(e) if e.is_not_found() || e.is_patch_test_failed() || e.is_conflict() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Action::await_change())
}

/// Dependents (kind `D`) of a deleted owner (kind `O`).
fn on_owner_deleted<D, O>(
    c: crate::Controller<D>,
    dependents: crate::reflector::Store<D>,
) -> crate::Controller<D>
where
    D: Resource + Send + Sync + 'static,
    O: Resource + Send + Sync + 'static,
{
    c.watches_events::<O, _>(&InformerParams::default(), move |ev| match ev {
        InformerEvent::Deleted(owner) => owner
            .uid()
            .map(|uid| {
                dependents
                    .by_owner_uid(uid)
                    .iter()
                    .map(|d| d.object_ref())
                    .collect::<Vec<ObjectRef>>()
            })
            .unwrap_or_default(),
        InformerEvent::Applied(_) => Vec::new(),
    })
}

fn collector<D: Resource + Send + Sync + 'static>(
    ctx: &HostContext,
    owners: Arc<Owners>,
    ready: &mut Vec<tokio::sync::watch::Receiver<bool>>,
) -> BoxFuture<'static, ()> {
    // Each collector reports its own readiness; the host sees them all-or-nothing.
    let c = crate::Controller::<D>::new(&ctx.factory)
        .name(&ctx.name)
        .metrics(ctx.metrics.clone());
    ready.push(c.ready());
    let store = c.store();
    let c = on_owner_deleted::<D, Allocation>(c, store.clone());
    let c = on_owner_deleted::<D, Dag>(c, store.clone());
    let c = on_owner_deleted::<D, Tenant>(c, store.clone());
    let c = on_owner_deleted::<D, VCluster>(c, store.clone());
    let c = on_owner_deleted::<D, NetworkDomain>(c, store.clone());
    let c = on_owner_deleted::<D, Node>(c, store.clone());
    let c = on_owner_deleted::<D, Lease>(c, store.clone());
    let c = on_owner_deleted::<D, Event>(c, store);
    c.run(
        |obj: Arc<D>, owners: Arc<Owners>| collect(obj, owners),
        owners,
    )
    .boxed()
}

/// The garbage collector's body, as registered by [`register`].
pub async fn run(ctx: HostContext) {
    let owners = Arc::new(Owners::new(ctx.client.clone(), &ctx.factory));
    // One controller per dependent kind; they share the host's informers and report
    // under one name.
    let mut ready = Vec::new();
    let collectors = [
        collector::<Allocation>(&ctx, owners.clone(), &mut ready),
        collector::<Dag>(&ctx, owners.clone(), &mut ready),
        collector::<Tenant>(&ctx, owners.clone(), &mut ready),
        collector::<VCluster>(&ctx, owners.clone(), &mut ready),
        collector::<NetworkDomain>(&ctx, owners.clone(), &mut ready),
        collector::<Node>(&ctx, owners.clone(), &mut ready),
        collector::<Lease>(&ctx, owners.clone(), &mut ready),
        collector::<Event>(&ctx, owners, &mut ready),
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
