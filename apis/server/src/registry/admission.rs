//! The object-level half of the authorizer ([`crate::registry::authz`] decides on what a request
//! asks; this decides on what it would write, with the stored objects at hand). Called by
//! every write verb of [`crate::registry::resources::Resources`] once the object to store is known
//! and before it is committed, for every caller but the trusted in-process controllers:
//!
//! * a node writes the status of its own Node only, and of it only the fields an agent
//!   reports (capacity, fingerprint, agent, and Ready from Unknown/Booting/Down); its
//!   reports on allocations go through their `report` subresource ([`crate::reports`]);
//! * a node creates only its own Node, with only the spec an agent knows (topology
//!   group, features);
//! * people never write what the system owns: the scheduler's annotations and
//!   finalizer; nor name other users' objects as owners;
//! * a job step (`spec.stepOf`) belongs to an allocation of the same user;
//! * vClusters are their tenant's admins' (or admins'); which nodes are a vCluster's home
//!   (`spec.homeNodes`) takes nodes from others, so only admins change it (a tenant admin
//!   may list nodes that an admin made the vCluster's home on the Node); its scheduler
//!   extenders (`spec.extenders`) too: the scheduler calls them from the control plane
//!   with the cluster's nodes, so only admins choose them;
//! * limits: an allocation's walltime within its vCluster's `maxWalltime`, its nodes
//!   within its tenant's `maxNodes`.

use lattice_apis::lifecycle::{NODES_FINALIZER, PREEMPT_ANNOTATION};
use lattice_apis::{AllocationSpec, KindInfo, Node, Tenant, VCluster};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::registry::errors::{ApiError, ApiResult};
use crate::registry::identity::{Role, UserInfo, USER_ANNOTATION};
use crate::registry::objects::name_of;
use crate::registry::resources::Resources;

/// Annotations only the system writes.
const SYSTEM_ANNOTATIONS: [&str; 1] = [PREEMPT_ANNOTATION];
/// Finalizers only the system removes.
const SYSTEM_FINALIZERS: [&str; 1] = [NODES_FINALIZER];
/// Node status fields an agent reports.
const AGENT_NODE_STATUS: [&str; 3] = ["capacity", "conformanceFingerprint", "agent"];
/// ... and the state fields it may change when it brings its node up.
const AGENT_NODE_STATE: [&str; 4] = ["state", "reason", "message", "lastTransitionTime"];

fn forbidden(kind: &KindInfo, obj: &Value, field: &str, why: String) -> ApiError {
    let name = name_of(obj);
    ApiError::forbidden(format!(
        "{}.lattice.dev {name:?} is forbidden: {why}",
        kind.plural
    ))
    .with_details(json!({
        "name": name,
        "group": "lattice.dev",
        "kind": kind.plural,
        "causes": [{"reason": "FieldValueForbidden", "field": field, "message": why}],
    }))
}

fn invalid(kind: &KindInfo, obj: &Value, field: &str, why: String) -> ApiError {
    ApiError::invalid(kind.kind, name_of(obj), vec![(field.to_string(), why)])
}

fn decode<'v, T: Deserialize<'v>>(kind: &KindInfo, v: &'v Value) -> ApiResult<T> {
    T::deserialize(v)
        .map_err(|e| ApiError::internal(format!("a stored {} does not decode: {e}", kind.kind)))
}

/// The strings of the array at `pointer` in `v` (none when it is missing).
fn strings_at(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn annotations(obj: &Value) -> Option<&Map<String, Value>> {
    obj.pointer("/metadata/annotations")?.as_object()
}

fn finalizers(obj: &Value) -> Vec<&str> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn owner_refs(obj: &Value) -> Vec<&Value> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// Check (and for nodes' status writes, rewrite) the object `new` that `caller` would
/// store over `old` (`None`: a create), through `subresource`.
pub async fn admit_write(
    res: &Resources,
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: Value,
    subresource: Option<&str>,
) -> ApiResult<Value> {
    if caller.is_system() {
        return Ok(new);
    }
    if caller.role == Role::Node {
        return node_write(caller, kind, old, new, subresource);
    }
    if subresource == Some("status") {
        // The route authorizer refuses people's status writes before this; a second
        // guard costs nothing.
        return Err(forbidden(
            kind,
            &new,
            "status",
            "status is written only by the controllers and the node agents".into(),
        ));
    }
    system_owned_metadata(caller, kind, old, &new)?;
    crate::registry::rbac::admit_write(res, caller, kind, &new).await?;
    claim(caller, kind, old, &new)?;
    others_work(caller, kind, old, &new)?;
    user_label(caller, kind, &new)?;
    owner_references(res, caller, kind, old, &new).await?;
    match kind.kind {
        "Allocation" => allocation(res, caller, kind, old, &new).await?,
        "Dag" => dag(res, caller, kind, old, &new).await?,
        "VCluster" => vcluster(res, caller, kind, old, &new).await?,
        _ => {}
    }
    Ok(new)
}

/// What a [`admit_connect`] opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    /// The allocation's output.
    Logs,
    /// A terminal or command in it.
    Attach,
}

/// Whether the allocation `obj` is sensitive work: sensitive itself, or a step (`srun`) of
/// a sensitive allocation.
pub async fn sensitive_work(res: &Resources, obj: &Value) -> ApiResult<bool> {
    let sensitive = |v: &Value| v.pointer("/spec/sensitive").and_then(Value::as_bool) == Some(true);
    if sensitive(obj) {
        return Ok(true);
    }
    let Some(parent) = obj.pointer("/spec/stepOf").and_then(Value::as_str) else {
        return Ok(false);
    };
    let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
    let kind = crate::registry::objects::kind_by_plural("allocations")
        .ok_or_else(|| ApiError::internal("allocations not registered"))?;
    // The parent it was a step of: the one its owner reference names. When that is gone
    // (or another allocation took the name), what it was cannot be known: sensitive.
    let owner_uid = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|refs| {
            refs.iter()
                .find(|r| r.get("name").and_then(Value::as_str) == Some(parent))
        })
        .and_then(|r| r.get("uid").and_then(Value::as_str));
    match res.trusted().get(kind, ns, parent).await {
        Ok(p) => {
            let uid = p.pointer("/metadata/uid").and_then(Value::as_str);
            Ok(sensitive(&p) || owner_uid.is_some_and(|o| Some(o) != uid))
        }
        Err(e) if e.code == 404 => Ok(true),
        Err(e) => Err(e),
    }
}

/// Whether `caller` may read the output of, or attach to, the allocation `obj` (the route
/// authorized the tenant): its user always; of a sensitive allocation, its user only (the
/// seed's "claiming user only"); otherwise admins, and for logs its tenant's admins.
pub async fn admit_connect(
    res: &Resources,
    caller: &UserInfo,
    obj: &Value,
    what: Connect,
) -> ApiResult<()> {
    if caller.is_system() {
        return Ok(());
    }
    if let Some(b) = &caller.bound_to {
        // A job's token: the logs of its own job's steps, nothing else.
        let step_of = obj.pointer("/spec/stepOf").and_then(Value::as_str);
        let in_ns = obj.pointer("/metadata/namespace").and_then(Value::as_str);
        if !(matches!(what, Connect::Logs)
            && step_of == Some(b.name.as_str())
            && in_ns == Some(b.ns.as_str()))
        {
            return Err(ApiError::forbidden(format!(
                "a job's token reads only the output of its own job's steps (allocation {}/{}'s); \
                 use your own credentials",
                b.ns, b.name
            )));
        }
    }
    let kind = crate::registry::objects::kind_by_plural("allocations")
        .ok_or_else(|| ApiError::internal("allocations not registered"))?;
    let owner = obj
        .pointer("/metadata/annotations")
        .and_then(|m| m.get(USER_ANNOTATION))
        .and_then(Value::as_str);
    if caller.role != Role::Node && owner == Some(caller.name.as_str()) {
        return Ok(());
    }
    let (ns, name) = (
        obj.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        name_of(obj),
    );
    let owner = owner.unwrap_or("(nobody)");
    let verb = match what {
        Connect::Logs => "read the output of",
        Connect::Attach => "attach to",
    };
    if sensitive_work(res, obj).await? {
        return Err(forbidden(
            kind,
            obj,
            "spec.sensitive",
            format!(
                "allocation {ns}/{name} is sensitive work: only the user who claimed its \
                 nodes ({owner}) may {verb} it"
            ),
        ));
    }
    if caller.role == Role::Admin {
        return Ok(());
    }
    if what == Connect::Logs
        && tenant_admin(res, caller, kind, obj, "read it")
            .await
            .is_ok()
    {
        return Ok(());
    }
    Err(forbidden(
        kind,
        obj,
        "metadata.annotations[lattice.dev/user]",
        format!(
            "allocation {ns}/{name} belongs to user {owner}; only its user{} or an admin may \
             {verb} it",
            if what == Connect::Logs {
                ", its tenant's admins"
            } else {
                ""
            }
        ),
    ))
}

/// A delete by `caller` of `old`.
pub async fn admit_delete(
    res: &Resources,
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: &Value,
) -> ApiResult<()> {
    if caller.is_system() {
        return Ok(());
    }
    crate::registry::rbac::admit_delete(caller, kind, old)?;
    if caller.role == Role::Admin {
        return Ok(());
    }
    if caller.role == Role::Node {
        return Err(forbidden(
            kind,
            old,
            "metadata",
            "a node's agent deletes nothing".into(),
        ));
    }
    if kind.kind == "VCluster" {
        tenant_admin(res, caller, kind, old, "delete it").await?;
    }
    Ok(())
}

fn node_write(
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: Value,
    subresource: Option<&str>,
) -> ApiResult<Value> {
    let me = caller.node_name().unwrap_or_default();
    match (kind.kind, old, subresource) {
        ("Node", Some(old), Some("status")) if name_of(old) == me => {
            node_status(me, kind, old, new)
        }
        ("Node", None, None) if name_of(&new) == me => node_create(kind, new),
        ("Node", None, None) => Err(forbidden(
            kind,
            &new,
            "metadata.name",
            format!(
                "node {me:?} may register only itself, not {:?}",
                name_of(&new)
            ),
        )),
        _ => Err(forbidden(
            kind,
            &new,
            subresource.unwrap_or("spec"),
            format!(
                "node {me:?} may write only its own Node's status, and report on the \
                 allocations bound to it through their report subresource (NodeRestriction)"
            ),
        )),
    }
}

/// A node's own Node status: what an agent reports, and Ready when an agent may bring
/// it up; everything else (owner, running allocations, heartbeat times) stays.
fn node_status(me: &str, kind: &'static KindInfo, old: &Value, new: Value) -> ApiResult<Value> {
    let empty = Map::new();
    let old_st = old
        .get("status")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let new_st = new
        .get("status")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let state_changes = AGENT_NODE_STATE
        .iter()
        .any(|f| old_st.get(*f) != new_st.get(*f));
    if state_changes && new_st.get("state") != old_st.get("state") {
        let node: Node = decode(kind, old)?;
        let to_ready = new_st.get("state").and_then(Value::as_str) == Some("Ready");
        if !(to_ready && lattice_apis::kinds::node::agent_may_ready(&node)) {
            return Err(forbidden(
                kind,
                old,
                "status.state",
                format!(
                    "node {me:?} may move its Node only to Ready, and only from Unknown, \
                     Booting or Down when not disabled; other states are the controllers'"
                ),
            ));
        }
    }
    let mut allowed: Vec<&str> = AGENT_NODE_STATUS.to_vec();
    if new_st.get("state") != old_st.get("state") {
        allowed.extend(AGENT_NODE_STATE);
    }
    for (k, v) in new_st.iter().chain(old_st.iter()) {
        if allowed.contains(&k.as_str()) {
            continue;
        }
        if old_st.get(k) != new_st.get(k) {
            return Err(forbidden(
                kind,
                old,
                &format!("status.{k}"),
                format!(
                    "status.{k} of a Node is written by the controllers, not by its agent \
                     (node {me:?} tried to change it to {v})"
                ),
            ));
        }
    }
    let mut st = old_st.clone();
    for f in allowed {
        match new_st.get(f) {
            Some(v) => st.insert(f.to_string(), v.clone()),
            None => st.remove(f),
        };
    }
    let mut result = new;
    if let Some(o) = result.as_object_mut() {
        o.insert("status".into(), Value::Object(st));
    }
    Ok(result)
}

/// A node registering itself: its name, and of the spec only what an agent knows.
fn node_create(kind: &'static KindInfo, new: Value) -> ApiResult<Value> {
    if let Some(meta) = new.get("metadata").and_then(Value::as_object) {
        for f in ["labels", "annotations", "finalizers", "ownerReferences"] {
            let set = meta.get(f).is_some_and(|v| {
                v.as_object().is_some_and(|m| !m.is_empty())
                    || v.as_array().is_some_and(|a| !a.is_empty())
            });
            if set {
                return Err(forbidden(
                    kind,
                    &new,
                    &format!("metadata.{f}"),
                    format!(
                        "a node's agent registers its Node by name only; metadata.{f} is the \
                         administrators'"
                    ),
                ));
            }
        }
    }
    if let Some(spec) = new.get("spec").and_then(Value::as_object) {
        for (k, v) in spec {
            let agent_knows = matches!(k.as_str(), "topologyGroup" | "features");
            let default =
                v.is_null() || v == &Value::Bool(false) || v.as_array().is_some_and(Vec::is_empty);
            if !agent_knows && !default {
                return Err(forbidden(
                    kind,
                    &new,
                    &format!("spec.{k}"),
                    format!(
                        "a node's agent registers its Node with spec.topologyGroup and \
                         spec.features only; spec.{k} is the administrators'"
                    ),
                ));
            }
        }
    }
    Ok(new)
}

/// Annotations and finalizers the system owns: a person adds, changes or removes none
/// (an admin may, to repair).
fn system_owned_metadata(
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    if caller.role == Role::Admin {
        return Ok(());
    }
    for a in SYSTEM_ANNOTATIONS {
        let before = old.and_then(annotations).and_then(|m| m.get(a));
        let after = annotations(new).and_then(|m| m.get(a));
        if before != after {
            return Err(forbidden(
                kind,
                new,
                &format!("metadata.annotations[{a}]"),
                format!("the annotation {a} is set by the scheduler only; leave it as it is"),
            ));
        }
    }
    let before = old.map(finalizers).unwrap_or_default();
    let after = finalizers(new);
    for f in SYSTEM_FINALIZERS {
        if before.contains(&f) && !after.contains(&f) {
            return Err(forbidden(
                kind,
                new,
                "metadata.finalizers",
                format!(
                    "the finalizer {f} keeps the allocation until every node has confirmed \
                     its processes are gone, and only the controllers remove it; cancel or \
                     delete the allocation and it goes by itself"
                ),
            ));
        }
        if !before.contains(&f) && after.contains(&f) {
            return Err(forbidden(
                kind,
                new,
                "metadata.finalizers",
                format!("the finalizer {f} is added by the scheduler only"),
            ));
        }
    }
    Ok(())
}

/// Sensitive work claims nodes for itself alone: making an allocation sensitive takes the
/// `claim` verb in its tenant (the `claiming-user` and `tenant-admin` roles hold it).
fn claim(
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    let sensitive = |v: &Value| v.pointer("/spec/sensitive").and_then(Value::as_bool) == Some(true);
    if kind.kind != "Allocation" || !sensitive(new) || old.is_some_and(sensitive) {
        return Ok(());
    }
    claim_in(caller, kind, new, "spec.sensitive")
}

/// `caller` may claim nodes (the `claim` verb on allocations) in `obj`'s tenant; the
/// refusal names `field`.
fn claim_in(caller: &UserInfo, kind: &'static KindInfo, obj: &Value, field: &str) -> ApiResult<()> {
    let new = obj;
    let allocations = crate::registry::objects::kind_by_plural("allocations")
        .ok_or_else(|| ApiError::internal("allocations not registered"))?;
    let ns = new.pointer("/metadata/namespace").and_then(Value::as_str);
    crate::registry::authz::authorize(
        caller,
        &crate::registry::authz::Attributes::kind(
            crate::registry::authz::Verb::Claim,
            allocations,
            ns,
        ),
    )
    .map_err(|e| {
        forbidden(
            kind,
            new,
            field,
            format!(
                "{}; sensitive work claims nodes for itself alone, which takes the \
                 claiming-user role in the tenant (its tenant admin binds it)",
                e.message
            ),
        )
    })
}

/// Another user's Allocation or Dag runs as that user: an admin may cancel, hold, label
/// or delete it, but not change what it runs.
fn others_work(
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    let Some(old) = old else {
        return Ok(());
    };
    if !matches!(kind.kind, "Allocation" | "Dag") || caller.role != Role::Admin {
        return Ok(());
    }
    let owner = annotations(old)
        .and_then(|a| a.get(USER_ANNOTATION))
        .and_then(Value::as_str);
    if owner.is_none_or(|o| o == caller.name) || old.get("spec") == new.get("spec") {
        return Ok(());
    }
    Err(forbidden(
        kind,
        old,
        "spec",
        format!(
            "it runs as user {:?}, and what it runs is that user's to change; an admin may \
             cancel, hold, relabel or delete it",
            owner.unwrap_or_default()
        ),
    ))
}

/// The label `lattice.dev/user` (what `--all-mine` and label selectors find work by), when
/// present, names the same user as the annotation the work runs as.
fn user_label(caller: &UserInfo, kind: &'static KindInfo, new: &Value) -> ApiResult<()> {
    if !matches!(kind.kind, "Allocation" | "Dag") || caller.role == Role::Admin {
        return Ok(());
    }
    let label = new
        .pointer("/metadata/labels")
        .and_then(|l| l.get(USER_ANNOTATION))
        .and_then(Value::as_str);
    let owner = annotations(new)
        .and_then(|a| a.get(USER_ANNOTATION))
        .and_then(Value::as_str);
    match label {
        Some(l) if Some(l) != owner => Err(forbidden(
            kind,
            new,
            &format!("metadata.labels[{USER_ANNOTATION}]"),
            format!(
                "the label {USER_ANNOTATION} is {l:?}, but the work runs as {:?} (the \
                 annotation of the same name); set the label to that or leave it out",
                owner.unwrap_or_default()
            ),
        )),
        _ => Ok(()),
    }
}

/// A person's owner references: only to objects that exist, by name and uid, and never to
/// another user's (a Dag would adopt it as its task, a job step would run on its nodes,
/// garbage collection would follow it).
async fn owner_references(
    res: &Resources,
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    if caller.role == Role::Admin {
        return Ok(());
    }
    let before = old.map(owner_refs).unwrap_or_default();
    for r in owner_refs(new) {
        if before.contains(&r) {
            continue;
        }
        let owner_kind = r.get("kind").and_then(Value::as_str).unwrap_or_default();
        let owner_name = r.get("name").and_then(Value::as_str).unwrap_or_default();
        let owner_uid = r.get("uid").and_then(Value::as_str).unwrap_or_default();
        let refused = |why: String| forbidden(kind, new, "metadata.ownerReferences", why);
        let Some(ok) = lattice_apis::kinds().iter().find(|k| k.kind == owner_kind) else {
            return Err(refused(format!(
                "{owner_kind:?} is not a kind of this API; an owner must be an object that exists"
            )));
        };
        let ns = new.pointer("/metadata/namespace").and_then(Value::as_str);
        // The controllers match owners by uid: the reference must name the object whose
        // uid it carries, and that object must exist.
        let owner = match res.get(ok, ns.filter(|_| ok.namespaced), owner_name).await {
            Ok(o) => o,
            Err(_) => {
                return Err(refused(format!(
                    "there is no {owner_kind} {owner_name:?} to own it; name an existing object"
                )))
            }
        };
        if owner.pointer("/metadata/uid").and_then(Value::as_str) != Some(owner_uid) {
            return Err(refused(format!(
                "{owner_kind} {owner_name:?} has another uid than {owner_uid:?}; an owner \
                 reference names the object and its uid"
            )));
        }
        let theirs = owner
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(USER_ANNOTATION))
            .and_then(Value::as_str);
        if theirs.is_some_and(|u| u != caller.name) {
            return Err(forbidden(
                kind,
                new,
                "metadata.ownerReferences",
                format!(
                    "{owner_kind} {owner_name:?} belongs to user {:?}; an object may name only \
                     its own user's objects as owners",
                    theirs.unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

/// A person's allocation: a step of their own allocation only; within the vCluster's
/// walltime and the tenant's node quota; sensitive for good once sensitive.
async fn allocation(
    res: &Resources,
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    // The spec alone: admission judges nothing else, and the object was validated whole
    // before it came here.
    let spec_of = |o: &Value| AllocationSpec::deserialize(o.get("spec").unwrap_or(&Value::Null));
    let spec =
        spec_of(new).map_err(|e| ApiError::bad_request(format!("not an allocation: {e}")))?;
    let before = old.and_then(|o| spec_of(o).ok());
    let ns = new
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let check = SpecCheck {
        res,
        caller,
        kind,
        obj: new,
        ns: &ns,
        field: "spec",
    };
    check.spec(&spec, before.as_ref()).await
}

/// A person's Dag: each task's allocation is held to what an allocation would be (the
/// Dag controller creates them with the system's rights, so this is where they are
/// checked).
async fn dag(
    res: &Resources,
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    let d = lattice_apis::Dag::deserialize(new)
        .map_err(|e| ApiError::bad_request(format!("not a dag: {e}")))?;
    let before = old.and_then(|o| lattice_apis::Dag::deserialize(o).ok());
    let ns = d.metadata.namespace_str().to_string();
    let defaults_vc = d.spec.defaults.as_ref().and_then(|x| x.vcluster.clone());
    for (i, task) in d.spec.allocations.iter().enumerate() {
        let mut spec = task.spec.clone();
        if spec.vcluster.is_none() {
            spec.vcluster = defaults_vc.clone();
        }
        let prior = before.as_ref().and_then(|b| {
            b.spec
                .allocations
                .iter()
                .find(|t| t.name == task.name)
                .map(|t| t.spec.clone())
        });
        let field = format!("spec.allocations[{i}].spec");
        let check = SpecCheck {
            res,
            caller,
            kind,
            obj: new,
            ns: &ns,
            field: &field,
        };
        if spec.step_of.is_some() {
            return Err(invalid(
                kind,
                new,
                &format!("{field}.stepOf"),
                "a Dag's task is an allocation of its own, not a job step; remove stepOf".into(),
            ));
        }
        // A sensitive task claims nodes like a sensitive allocation (the Dag controller
        // creates it with the system's rights, so the claim is checked here).
        if spec.sensitive && !prior.as_ref().is_some_and(|p| p.sensitive) {
            claim_in(caller, kind, new, &format!("{field}.sensitive"))?;
        }
        check.spec(&spec, prior.as_ref()).await?;
    }
    Ok(())
}

/// The checks of one allocation spec (an Allocation's, or a Dag task's).
struct SpecCheck<'a> {
    res: &'a Resources,
    caller: &'a UserInfo,
    kind: &'static KindInfo,
    obj: &'a Value,
    ns: &'a str,
    /// Where the spec is in the object (`spec`, `spec.allocations[2].spec`).
    field: &'a str,
}

/// Whether Node `n` reports capability `c` (and is not disabled).
fn has(n: &Value, c: &str) -> bool {
    n.pointer("/spec/disabled").and_then(Value::as_bool) != Some(true)
        && n.pointer("/status/agent/capabilities")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(c)))
}

/// What agents need for capability `c`.
fn hint(c: &str) -> &'static str {
    use lattice_apis::kinds::node::capability;
    match c {
        capability::OCI => "agents run OCI images as root, with an OCI runtime (lattice-agent --oci-runtime) and cgroups",
        capability::UENV => "agents mount uenv images from a repository (lattice-agent --uenv-repo)",
        capability::PMIX => "agents serve PMIx when built with the cargo feature pmix; use --mpi=pmi2 for MPICH, or OpenMPI's own mpirun",
        _ => "",
    }
}

impl SpecCheck<'_> {
    fn at(&self, f: &str) -> String {
        format!("{}.{f}", self.field)
    }

    /// Work that needs what only some agents can run (`needs`: capability and field) is
    /// admitted only where it can run: a job step, when every node of its allocation
    /// reports the capability (a step of an allocation not yet placed: when the allocation
    /// needs it too, so the scheduler places it on such nodes, else as other work); other
    /// work, when some node of the cluster does.
    async fn runnable(
        &self,
        spec: &lattice_apis::AllocationSpec,
        needs: &[(&'static str, &'static str)],
    ) -> ApiResult<()> {
        let nk = crate::registry::objects::kind_by_plural("nodes")
            .ok_or_else(|| ApiError::internal("nodes not registered"))?;
        if let Some(parent) = &spec.step_of {
            let ak = crate::registry::objects::kind_by_plural("allocations")
                .ok_or_else(|| ApiError::internal("allocations not registered"))?;
            let p = self.res.get(ak, Some(self.ns), parent).await?;
            let assigned = strings_at(&p, "/status/assignedNodes");
            if !assigned.is_empty() {
                for (c, field) in needs {
                    let mut missing = Vec::new();
                    // Each of the allocation's nodes, read by name.
                    for a in &assigned {
                        let n = self.res.get(nk, None, a).await.ok();
                        if !n.as_ref().is_some_and(|n| has(n, c)) {
                            missing.push(a.as_str());
                        }
                    }
                    if !missing.is_empty() {
                        return Err(invalid(
                            self.kind,
                            self.obj,
                            &self.at(field),
                            format!(
                                "the step runs on the nodes of allocation {parent:?}, and {} cannot run it: their agents do not report the {c} capability (status.agent.capabilities); {}",
                                missing.join(", "),
                                hint(c)
                            ),
                        ));
                    }
                }
                return Ok(());
            }
            let parent_needs: Vec<&str> =
                lattice_apis::AllocationSpec::deserialize(p.get("spec").unwrap_or(&Value::Null))
                    .map(|s| {
                        lattice_apis::kinds::node::capability::needed(&s)
                            .into_iter()
                            .map(|(c, _)| c)
                            .collect()
                    })
                    .unwrap_or_default();
            let rest: Vec<(&'static str, &'static str)> = needs
                .iter()
                .filter(|(c, _)| !parent_needs.contains(c))
                .copied()
                .collect();
            return self.somewhere(nk, &rest).await;
        }
        self.somewhere(nk, needs).await
    }

    /// Some node of the cluster reports each capability of `needs` (Nodes read a page at
    /// a time, until each is found).
    async fn somewhere(
        &self,
        nk: &'static KindInfo,
        needs: &[(&'static str, &'static str)],
    ) -> ApiResult<()> {
        let mut left: Vec<(&'static str, &'static str)> = needs.to_vec();
        let mut opts = crate::registry::resources::ListOptions {
            limit: 500,
            ..Default::default()
        };
        while !left.is_empty() {
            let page = self.res.list(nk, None, &opts).await?;
            if let Some(items) = page.get("items").and_then(Value::as_array) {
                left.retain(|(c, _)| !items.iter().any(|n| has(n, c)));
            }
            match page
                .pointer("/metadata/continue")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                Some(t) => opts.continue_token = Some(t.to_string()),
                None => break,
            }
        }
        if let Some((c, field)) = left.first() {
            return Err(invalid(
                self.kind,
                self.obj,
                &self.at(field),
                format!(
                    "no node of the cluster can run this: no agent reports the {c} capability (status.agent.capabilities); {}",
                    hint(c)
                ),
            ));
        }
        Ok(())
    }

    async fn spec(
        &self,
        spec: &lattice_apis::AllocationSpec,
        before: Option<&lattice_apis::AllocationSpec>,
    ) -> ApiResult<()> {
        let (kind, new, ns) = (self.kind, self.obj, self.ns);
        let changed = |f: &dyn Fn(&lattice_apis::AllocationSpec) -> String| {
            before.is_none_or(|b| f(b) != f(spec))
        };
        if before.is_some_and(|b| b.sensitive && !spec.sensitive) {
            return Err(forbidden(
                kind,
                new,
                &self.at("sensitive"),
                "a sensitive allocation stays sensitive (its output and sessions are its \
                 owner's alone); submit the work anew instead"
                    .into(),
            ));
        }
        if let Some(parent) = &spec.step_of {
            if changed(&|x| x.step_of.clone().unwrap_or_default()) {
                let ak = crate::registry::objects::kind_by_plural("allocations")
                    .ok_or_else(|| ApiError::internal("allocations not registered"))?;
                let p = self.res.get(ak, Some(ns), parent).await.map_err(|_| {
                    invalid(
                        kind,
                        new,
                        &self.at("stepOf"),
                        format!(
                            "there is no allocation {parent:?} in tenant {ns:?} to run a step of"
                        ),
                    )
                })?;
                let owner = p
                    .pointer("/metadata/annotations")
                    .and_then(|m| m.get(USER_ANNOTATION))
                    .and_then(Value::as_str);
                if owner != Some(self.caller.name.as_str()) {
                    return Err(forbidden(
                        kind,
                        new,
                        &self.at("stepOf"),
                        format!(
                            "allocation {parent:?} belongs to user {:?}; a job step runs on its \
                             nodes, so only its user may start one",
                            owner.unwrap_or("(none)")
                        ),
                    ));
                }
            }
        }
        let needs = lattice_apis::kinds::node::capability::needed(spec);
        if !needs.is_empty()
            && changed(&|x| {
                format!(
                    "{:?}{:?}{:?}",
                    lattice_apis::kinds::node::capability::needed(x),
                    x.step_of,
                    x.environment
                )
            })
        {
            self.runnable(spec, &needs).await?;
        }
        if let Some(vc_name) = spec.vcluster.as_ref().filter(|v| !v.is_empty()) {
            let vk = crate::registry::objects::kind_by_plural("vclusters")
                .ok_or_else(|| ApiError::internal("vclusters not registered"))?;
            if let Some(vc) = self.res.typed::<VCluster>(vk, Some(ns), vc_name).await? {
                if let Some(max) = vc.spec.max_walltime.as_deref() {
                    let limit = lattice_apis::duration::parse_duration(max).ok();
                    let asked = spec.lifecycle.walltime_seconds();
                    let relevant = changed(&|x| {
                        format!("{:?}{:?}", x.lifecycle.walltime_seconds(), x.vcluster)
                    });
                    if let (Some(limit), true) = (limit, relevant) {
                        match asked {
                            Some(w) if w > limit => {
                                return Err(invalid(
                                    kind,
                                    new,
                                    &self.at("lifecycle.walltime"),
                                    format!(
                                        "{} is longer than vCluster {vc_name:?} allows \
                                         (maxWalltime {max}); ask for at most {max}",
                                        lattice_apis::duration::format_hms(w)
                                    ),
                                ))
                            }
                            None if matches!(
                                spec.lifecycle.type_,
                                lattice_apis::LifecycleType::Unbounded
                                    | lattice_apis::LifecycleType::Reactive
                            ) =>
                            {
                                return Err(invalid(
                                    kind,
                                    new,
                                    &self.at("lifecycle.type"),
                                    format!(
                                        "vCluster {vc_name:?} runs work for at most {max} \
                                         (maxWalltime), and this allocation has no walltime; \
                                         give it one, or use a vCluster without maxWalltime"
                                    ),
                                ))
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        let tk = crate::registry::objects::kind_by_plural("tenants")
            .ok_or_else(|| ApiError::internal("tenants not registered"))?;
        let tenant = self.res.typed::<Tenant>(tk, None, ns).await?;
        // What the tenant's contract grants: how high a class, and sensitive work at all.
        let quota = tenant
            .as_ref()
            .map(|t| t.spec.quota.clone())
            .unwrap_or_default();
        let class = spec.preemption_class.unwrap_or(5);
        // Sensitive work runs at the sensitive class, granted with the sensitive pool below.
        let max_class = if spec.sensitive {
            lattice_apis::kinds::allocation::SENSITIVE_PREEMPTION_CLASS as u32
        } else {
            quota
                .max_preemption_class
                .unwrap_or(lattice_apis::kinds::tenant::DEFAULT_MAX_PREEMPTION_CLASS)
        };
        if class > max_class as i32 && changed(&|x| format!("{:?}", x.preemption_class)) {
            return Err(forbidden(
                kind,
                new,
                &self.at("preemptionClass"),
                format!(
                    "class {class} is above what tenant {ns:?} may ask for ({max_class}, its \
                     spec.quota.maxPreemptionClass): higher classes preempt other tenants' \
                     work; ask for at most {max_class}, or ask an administrator"
                ),
            ));
        }
        if spec.sensitive
            && quota.sensitive_pool_size.unwrap_or(0) == 0
            && changed(&|x| x.sensitive.to_string())
        {
            return Err(forbidden(
                kind,
                new,
                &self.at("sensitive"),
                format!(
                    "tenant {ns:?} has no sensitive pool (spec.quota.sensitivePoolSize): \
                     sensitive work claims nodes for itself alone, so an administrator grants it"
                ),
            ));
        }
        if let Some(t) = tenant {
            let n = spec.resources.nodes.min();
            if let Some(max) = t.spec.quota.max_nodes {
                if n > max && changed(&|x| x.resources.nodes.min().to_string()) {
                    return Err(invalid(
                        kind,
                        new,
                        &self.at("resources.nodes"),
                        format!(
                            "{n} nodes is more than tenant {ns:?} may ever hold (quota maxNodes \
                             {max}); ask for at most {max}, or ask an admin to raise the quota"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `caller` is an admin of the object's tenant (or an admin).
async fn tenant_admin(
    res: &Resources,
    caller: &UserInfo,
    kind: &'static KindInfo,
    obj: &Value,
    what: &str,
) -> ApiResult<()> {
    if caller.role == Role::Admin {
        return Ok(());
    }
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let tk = crate::registry::objects::kind_by_plural("tenants")
        .ok_or_else(|| ApiError::internal("tenants not registered"))?;
    let admins: Vec<String> = match res.typed::<Tenant>(tk, None, ns).await? {
        Some(t) => t.spec.admins.clone(),
        None => Vec::new(),
    };
    // (A job's token acts for its job only: never as its user's tenant admin.)
    if caller.bound_to.is_none()
        && caller.role == Role::User
        && admins.iter().any(|a| a == &caller.name)
    {
        return Ok(());
    }
    if crate::registry::rbac::holds(caller, lattice_apis::kinds::rbac::builtin::TENANT_ADMIN, ns) {
        return Ok(());
    }
    Err(forbidden(
        kind,
        obj,
        "metadata",
        format!(
            "user {:?} cannot {what}: vClusters of tenant {ns:?} are managed by its admins \
             (Tenant spec.admins) and cluster administrators",
            caller.name
        ),
    ))
}

/// vClusters: their tenant's admins'; `homeNodes` only as an admin assigned them.
async fn vcluster(
    res: &Resources,
    caller: &UserInfo,
    kind: &'static KindInfo,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    tenant_admin(
        res,
        caller,
        kind,
        new,
        if old.is_some() {
            "change it"
        } else {
            "create it"
        },
    )
    .await?;
    if caller.role == Role::Admin {
        return Ok(());
    }
    // The scheduler POSTs each cycle's jobs and the cluster's nodes to an extender, from
    // inside the control plane: a tenant choosing the URL could read the node inventory or
    // make the scheduler call anything it can reach. Unchanged extenders are fine (a tenant
    // admin may edit the rest of a vCluster an administrator gave extenders).
    let extenders = |v: Option<&Value>| -> Value {
        match v.and_then(|v| v.pointer("/spec/extenders")) {
            Some(Value::Array(a)) if !a.is_empty() => Value::Array(a.clone()),
            _ => Value::Null,
        }
    };
    if extenders(Some(new)) != extenders(old) {
        return Err(forbidden(
            kind,
            new,
            "spec.extenders",
            format!(
                "user {:?} cannot change a vCluster's scheduler extenders: the scheduler sends                  them the cluster's nodes and calls them from the control plane, so cluster                  administrators configure them",
                caller.name
            ),
        ));
    }
    let homes = |v: &Value| strings_at(v, "/spec/homeNodes");
    let before = old.map(homes).unwrap_or_default();
    let ns = new
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let me = format!("{ns}/{}", name_of(new));
    let nk = crate::registry::objects::kind_by_plural("nodes")
        .ok_or_else(|| ApiError::internal("nodes not registered"))?;
    for n in homes(new).iter().filter(|n| !before.contains(n)) {
        // A tenant admin may list a node an administrator already gave this vCluster on
        // the Node itself (`spec.homeVcluster`); choosing whose nodes they are is not
        // theirs.
        let assigned = match res.get(nk, None, n).await {
            Ok(node) => decode::<Node>(nk, &node)?
                .spec
                .home_vcluster
                .is_some_and(|h| h == me || (ns == "default" && h == name_of(new))),
            Err(_) => false,
        };
        if !assigned {
            return Err(forbidden(
                kind,
                new,
                "spec.homeNodes",
                format!(
                    "node {n:?} is not this vCluster's to take: home nodes keep other work off \
                     them and reclaim them from borrowers, so an administrator assigns them \
                     (Node spec.homeVcluster: {me})"
                ),
            ));
        }
    }
    Ok(())
}
