//! The seed's Intent API (`/v1/...`) as thin translations onto the resources.
//!
//! * `POST /v1/allocations` / `POST /v1/dags`: the body is either a whole resource
//!   object (with `kind`) or an intent: `{"tenant": "t", "name": "n"?, ...spec fields}`
//!   (also wrapped as `{"allocation": {...}}` / `{"dag": {...}}`), which becomes
//!   `{metadata: {namespace: tenant, name | generateName}, spec: rest}`. The rest is
//!   the seed's request: snake_case or camelCase fields, the task-group form and the
//!   `workflow.yaml` short form (translated by [`lattice_apis::intent`]), or a `spec`.
//!   `tenant` may also come from `?tenant=`.
//! * `GET /v1/<plural>` lists (all tenants, or `?tenant=`); `GET /v1/<plural>/{id}`
//!   finds the object whose name is `id` in `?tenant=` (or `id` is `tenant/name`); without
//!   a tenant, among the tenants the caller may read (404 when none has it, 409 when
//!   several do).
//! * `DELETE /v1/allocations/{id}` is a cancel request: it sets the annotation
//!   `lattice.dev/cancel-requested: "true"` (the controllers stop the work and finish
//!   the allocation); the object is kept for its history. `DELETE /v1/dags/{id}` does
//!   the same for a DAG.
//! * `GET /v1/dags/{id}/graph` (`?tenant=`): the DAG's structure, see [`dag_graph`].
//! * `POST /v1/allocations/{id}/tasks` (`?tenant=`): run a command inside a running
//!   allocation (a job step, Slurm's `srun` in an allocation), see [`launch_tasks`].
//! * `GET /v1/nodes`, `/v1/tenants`, `/v1/vclusters` list those kinds.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::auth::UserInfo;
use crate::authz::{allow, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::objects::{name_of, parse_body};
use crate::patch::PatchType;
use crate::resources::{ListOptions, WriteOptions};
use crate::routes::{authenticate, json_response, kind_by_plural, read_body, Params};
use crate::Inner;

pub use lattice_apis::lifecycle::CANCEL_ANNOTATION;

fn kind(plural: &str) -> ApiResult<&'static lattice_apis::KindInfo> {
    match plural {
        "allocations" | "dags" | "nodes" | "tenants" | "vclusters" => {
            kind_by_plural(plural).ok_or_else(|| ApiError::path_not_found(plural))
        }
        _ => Err(ApiError::path_not_found(plural)),
    }
}

pub async fn collection(
    State(inner): State<Arc<Inner>>,
    Path(plural): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        let k = kind(&plural)?;
        let user = authenticate(&inner, &headers).await?;
        let params = Params::from_uri(&uri)?;
        let tenant = params.get("tenant").map(String::from);
        match method {
            Method::GET => {
                allow(&user, Verb::List, k, tenant.as_deref(), None)?;
                let list = inner
                    .resources
                    .list(k, tenant.as_deref(), &ListOptions::default())
                    .await?;
                let list = crate::redact::redact(Some(&user), k, list);
                Ok(json_response(StatusCode::OK, &list))
            }
            Method::POST if matches!(plural.as_str(), "allocations" | "dags") => {
                // Authorized before the body is read: in the tenant of `?tenant=`, else in
                // the caller's own (the body may name another, checked again below).
                let first = tenant
                    .clone()
                    .or_else(|| user.tenants.as_ref().and_then(|t| t.first().cloned()));
                allow(
                    &user,
                    Verb::Create,
                    k,
                    Some(first.as_deref().unwrap_or("default")),
                    None,
                )?;
                let b = read_body(&inner, &headers, body).await?;
                let v = parse_body(
                    &b,
                    headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or(""),
                )?;
                let (obj, t) = to_resource(k, v, tenant)?;
                allow(&user, Verb::Create, k, Some(&t), None)?;
                if k.kind == "Allocation" {
                    check_dependencies(&inner, k, &t, &obj).await?;
                }
                let created = inner
                    .resources
                    .create(
                        k,
                        Some(&t),
                        obj,
                        &WriteOptions {
                            field_manager: Some("intent-api".into()),
                            ..Default::default()
                        },
                        false,
                    )
                    .await?;
                Ok(json_response(StatusCode::CREATED, &created))
            }
            _ => Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on /v1/{plural}"
            ))),
        }
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

/// A submission through the Intent API is imperative, like `sbatch`: a dependency on an
/// allocation that does not exist is refused (422 naming `spec.dependsOn[i].ref`) instead
/// of waiting forever, as Slurm ("Job dependency problem") and Flux (unknown job id) do.
/// Refs are names in the tenant, or uids. (The resource API stays declarative: a manifest
/// may name an allocation applied later, and waits for it.)
async fn check_dependencies(
    inner: &Inner,
    k: &'static lattice_apis::KindInfo,
    tenant: &str,
    obj: &Value,
) -> ApiResult<()> {
    let Some(deps) = obj.pointer("/spec/dependsOn").and_then(Value::as_array) else {
        return Ok(());
    };
    let mut uids: Option<Vec<String>> = None;
    for (i, d) in deps.iter().enumerate() {
        // `mutex` names a lock, not an allocation.
        let (Some(r), false) = (d["ref"].as_str(), d["condition"] == "mutex") else {
            continue;
        };
        match inner.resources.get(k, Some(tenant), r).await {
            Err(e) if e.code == 404 => {}
            _ => continue,
        }
        if uids.is_none() {
            let list = inner
                .resources
                .list(k, Some(tenant), &ListOptions::default())
                .await?;
            uids = Some(
                list.get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|o| o.pointer("/metadata/uid").and_then(Value::as_str))
                    .map(String::from)
                    .collect(),
            );
        }
        if uids.as_ref().is_some_and(|u| u.iter().any(|u| u == r)) {
            continue;
        }
        return Err(ApiError::invalid(
            k.kind,
            name_of(obj),
            vec![(
                format!("spec.dependsOn[{i}].ref"),
                format!(
                    "no allocation {r:?} in tenant {tenant:?}: a submission may depend only on \
                     allocations already submitted (by name or uid)"
                ),
            )],
        ));
    }
    Ok(())
}

fn to_resource(
    k: &lattice_apis::KindInfo,
    v: Value,
    tenant: Option<String>,
) -> ApiResult<(Value, String)> {
    let Value::Object(mut m) = v else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    if m.contains_key("kind") || m.contains_key("metadata") {
        let t = m
            .get("metadata")
            .and_then(|md| md.get("namespace"))
            .and_then(Value::as_str)
            .map(String::from)
            .or(tenant)
            .ok_or_else(|| ApiError::bad_request("metadata.namespace (the tenant) is required"))?;
        return Ok((Value::Object(m), t));
    }
    // The seed's request shapes: `{"allocation": {...}}` / `{"dag": {...}}`, snake_case
    // fields, the task-group form `{type: task_group, template, range: {start, end},
    // concurrency}` and the workflow short form (`lattice_apis::intent`).
    let wrapper = match k.kind {
        "Allocation" => "allocation",
        "Dag" => "dag",
        _ => "",
    };
    // Unwrapped when nothing but `tenant` and `name` stands beside the wrapper (those
    // count as the inner ones' defaults); anything else is left for admission to report.
    if matches!(m.get(wrapper), Some(Value::Object(_)))
        && m.keys()
            .all(|k| k == wrapper || k == "tenant" || k == "name")
    {
        if let Some(Value::Object(mut inner)) = m.remove(wrapper) {
            for (k, v) in std::mem::take(&mut m) {
                inner.entry(k).or_insert(v);
            }
            m = inner;
        }
    }
    let t = m
        .remove("tenant")
        .and_then(|v| v.as_str().map(String::from))
        .or(tenant)
        .ok_or_else(|| ApiError::bad_request("\"tenant\" is required"))?;
    let mut meta = Map::new();
    meta.insert("namespace".into(), Value::String(t.clone()));
    match m.remove("name").and_then(|v| v.as_str().map(String::from)) {
        Some(n) => meta.insert("name".into(), Value::String(n)),
        None => meta.insert(
            "generateName".into(),
            Value::String(format!("{}-", k.singular)),
        ),
    };
    if let Some(l) = m.remove("labels") {
        meta.insert("labels".into(), l);
    }
    let spec = match (m.remove("spec"), k.kind) {
        (Some(spec), _) => spec,
        (None, "Allocation") => {
            lattice_apis::intent::allocation_from_intent(&Value::Object(m)).spec
        }
        (None, "Dag") => lattice_apis::intent::dag_from_workflow(&Value::Object(m)).spec,
        (None, _) => Value::Object(m),
    };
    Ok((
        json!({"apiVersion": lattice_apis::API_VERSION, "kind": k.kind, "metadata": meta, "spec": spec}),
        t,
    ))
}

/// The object named by `id` for `user`: `tenant/name`, `name` in `?tenant=`, or `name`
/// looked up across the tenants the user may read. Only readable tenants are searched, so
/// another tenant's object of the same name is neither returned nor revealed (a 404, not a
/// 403); a name in several readable tenants is a 409 asking for `?tenant=`. The caller
/// still authorizes the access it needs on the object's tenant.
pub(crate) async fn find(
    inner: &Inner,
    k: &'static lattice_apis::KindInfo,
    id: &str,
    tenant: Option<&str>,
    user: &UserInfo,
) -> ApiResult<Value> {
    if !k.namespaced {
        return inner.resources.get(k, None, id).await;
    }
    // A tenant the caller names: refused (403) before looking, so the answer says nothing
    // about what exists there.
    if let Some((t, n)) = id.split_once('/') {
        allow(user, Verb::Get, k, Some(t), Some(n))?;
        return inner.resources.get(k, Some(t), n).await;
    }
    if let Some(t) = tenant {
        allow(user, Verb::Get, k, Some(t), Some(id))?;
        return inner.resources.get(k, Some(t), id).await;
    }
    let mut opts = ListOptions::default();
    opts.selectors.fields =
        crate::selectors::FieldSelector::parse(&format!("metadata.name={id}"), &[])
            .map_err(ApiError::bad_request)?;
    let list = inner.resources.list(k, None, &opts).await?;
    let mut found: Vec<Value> = list
        .get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|o| {
            let ns = o.pointer("/metadata/namespace").and_then(Value::as_str);
            ns.is_some()
                && allow(user, Verb::Get, k, ns, Some(id)).is_ok()
                && crate::authz::node_read(user, k, o).is_ok()
        })
        .cloned()
        .collect();
    match found.len() {
        0 => Err(ApiError::not_found(k.kind, k.plural, id)),
        1 => Ok(found.remove(0)),
        _ => {
            let tenants: Vec<&str> = found
                .iter()
                .filter_map(|o| o.pointer("/metadata/namespace").and_then(Value::as_str))
                .collect();
            Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "{} {id:?} exists in several tenants you can read ({}); name one with \
                     ?tenant=TENANT",
                    k.singular,
                    tenants.join(", ")
                ),
            )
            .with_details(json!({"name": id, "group": "lattice.dev", "kind": k.plural})))
        }
    }
}

pub async fn item(
    State(inner): State<Arc<Inner>>,
    Path((plural, id)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let k = kind(&plural)?;
        let user = authenticate(&inner, &headers).await?;
        let params = Params::from_uri(&uri)?;
        let obj = find(&inner, k, &id, params.get("tenant"), &user).await?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(String::from);
        match method {
            Method::GET => {
                allow(&user, Verb::Get, k, ns.as_deref(), Some(name_of(&obj)))?;
                let obj = crate::redact::redact(Some(&user), k, obj);
                Ok(json_response(StatusCode::OK, &obj))
            }
            Method::DELETE if matches!(plural.as_str(), "allocations" | "dags") => {
                allow(&user, Verb::Patch, k, ns.as_deref(), Some(name_of(&obj)))?;
                let patch = json!({"metadata": {"annotations": {CANCEL_ANNOTATION: "true"}}});
                let body = serde_json::to_vec(&patch).unwrap_or_default();
                let (v, _) = inner
                    .resources
                    .patch(
                        k,
                        ns.as_deref(),
                        name_of(&obj),
                        PatchType::Merge,
                        &body,
                        None,
                        &WriteOptions {
                            field_manager: Some("intent-api".into()),
                            ..Default::default()
                        },
                    )
                    .await?;
                Ok(json_response(StatusCode::ACCEPTED, &v))
            }
            _ => Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on /v1/{plural}/{{id}}"
            ))),
        }
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/dags/{id}/graph[?tenant=T]`: the DAG's structure (the seed's "allocations
/// and edges") with each step's phase from the Dag's status:
///
/// ```json
/// {"kind": "DagGraph", "dag": "pipeline", "tenant": "t", "phase": "Running",
///  "nodes": [{"name": "train", "allocation": "pipeline-train", "phase": "Running"}],
///  "edges": [{"from": "preprocess", "to": "train", "condition": "success"}]}
/// ```
///
/// Nodes are in declaration order; edges follow each step's `dependsOn` in order
/// (`from` is the predecessor). A step the controller has not reported yet is `Waiting`.
/// Without `?tenant=` the DAG is looked up by name across the tenants the caller may read
/// (or as `tenant/name`); 404 names the DAG when there is none, 409 (asking for `?tenant=`)
/// when several of those tenants have one. Other tenants' DAGs are not considered.
pub async fn dag_graph(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let k = kind("dags")?;
        let user = authenticate(&inner, &headers).await?;
        let params = Params::from_uri(&uri)?;
        let obj = match params.get("tenant") {
            Some(t) => {
                allow(&user, Verb::Get, k, Some(t), Some(&id))?;
                inner
                    .resources
                    .get(k, Some(t), &id)
                    .await
                    .map_err(|e| match e.code {
                        404 => ApiError::new(
                            404,
                            "NotFound",
                            format!("DAG {id:?} not found in tenant {t:?}"),
                        )
                        .with_details(json!({"name": id, "group": "lattice.dev", "kind": "dags"})),
                        _ => e,
                    })?
            }
            None => {
                // Only the tenants the caller may read are searched (see `find`).
                let obj = find(&inner, k, &id, None, &user)
                    .await
                    .map_err(|e| match e.code {
                        404 => ApiError::new(404, "NotFound", format!("DAG {id:?} not found"))
                            .with_details(
                                json!({"name": id, "group": "lattice.dev", "kind": "dags"}),
                            ),
                        _ => e,
                    })?;
                allow(
                    &user,
                    Verb::Get,
                    k,
                    obj.pointer("/metadata/namespace").and_then(Value::as_str),
                    Some(&id),
                )?;
                obj
            }
        };
        let dag: lattice_apis::Dag = serde_json::from_value(obj).map_err(|e| {
            ApiError::internal(format!("the stored DAG {id:?} cannot be read: {e}"))
        })?;
        Ok::<_, ApiError>(json_response(StatusCode::OK, &graph_of(&dag)))
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}

/// The graph document of [`dag_graph`].
pub fn graph_of(dag: &lattice_apis::Dag) -> Value {
    let name = dag.metadata.name.as_deref().unwrap_or_default();
    let status = dag.status.as_ref();
    let nodes: Vec<Value> = dag
        .spec
        .allocations
        .iter()
        .map(|t| {
            let st = status.and_then(|s| s.tasks.get(&t.name));
            json!({
                "name": t.name,
                "allocation": st
                    .and_then(|s| s.allocation.clone())
                    .unwrap_or_else(|| t.allocation_name(name)),
                "phase": st.map(|s| s.phase).unwrap_or_default(),
            })
        })
        .collect();
    let edges: Vec<Value> = dag
        .spec
        .allocations
        .iter()
        .flat_map(|t| {
            // A `mutex` entry names a lock, not a step: it is not an edge of the graph.
            t.depends_on
                .iter()
                .filter(|d| d.condition != lattice_apis::DependencyCondition::Mutex)
                .map(move |d| json!({"from": d.ref_, "to": t.name, "condition": d.condition.as_str()}))
        })
        .collect();
    json!({
        "kind": "DagGraph",
        "dag": name,
        "tenant": dag.metadata.namespace,
        "phase": status.map(|s| s.phase).unwrap_or_default(),
        "nodes": nodes,
        "edges": edges,
    })
}

/// `POST /v1/allocations/{id}/tasks[?tenant=T]`: runs a command inside a running
/// allocation. The body is a [`TaskLaunch`](lattice_apis::steps::TaskLaunch)
/// (`{"command": ["hostname"], "ntasks": 4, "nodes": 2, "tasksPerNode": 2, "env": {...},
/// "workingDir": "/scratch"}`); the answer (201) is the step Allocation
/// (`<id>.<n>`, `spec.stepOf: <id>`) that the step controller binds to the allocation's
/// first nodes; its output is its `log` subresource. Needs write access to the
/// allocation's tenant. The step runs as the allocation's user: a non-admin caller must
/// be that user (else the step fails with `step_not_permitted`); an admin launches as
/// the allocation's user. A finished allocation, or a request for more nodes than it
/// has, is a 400 saying why.
pub async fn launch_tasks(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    use lattice_apis::steps;
    let r = async {
        let k = kind("allocations")?;
        let user = authenticate(&inner, &headers).await?;
        let params = Params::from_uri(&uri)?;
        let obj = find(&inner, k, &id, params.get("tenant"), &user).await?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        allow(&user, Verb::Create, k, Some(&ns), None)?;
        let b = read_body(&inner, &headers, body).await?;
        let launch: steps::TaskLaunch = crate::parse::json_as(&b, |e| {
            format!(
                "invalid task launch: {e}; expected {{\"command\": [\"prog\", \"arg\"], \"ntasks\"?: N, \"nodes\"?: N, \"tasksPerNode\"?: K, \"env\"?: {{}}, \"workingDir\"?: \"/dir\"}}"
            )
        })?;
        let parent: lattice_apis::Allocation = serde_json::from_value(obj)
            .map_err(|e| ApiError::internal(format!("stored allocation does not decode: {e}")))?;
        let parent_name = parent.metadata.name_str().to_string();
        // A step runs as its starter, who must be the allocation's user (admission
        // refuses anyone else: the step runs on the allocation's nodes).
        let step_user = if user.is_system() {
            parent.metadata.annotations.get(steps::USER_ANNOTATION).cloned()
        } else {
            Some(user.name.clone())
        };
        let mut opts = ListOptions::default();
        opts.selectors.labels = crate::selectors::LabelSelector::parse(&format!(
            "{}={parent_name}",
            steps::STEP_OF_LABEL
        ))
        .map_err(ApiError::bad_request)?;
        let existing = inner.resources.list(k, Some(&ns), &opts).await?;
        let mut n = steps::next_number(
            &parent_name,
            existing
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(name_of),
        );
        for _ in 0..8 {
            let step = steps::step_allocation(
                &parent,
                &format!("{parent_name}.{n}"),
                &launch,
                step_user.as_deref(),
            )
            .map_err(ApiError::bad_request)?;
            let v = serde_json::to_value(&step).map_err(|e| ApiError::internal(e.to_string()))?;
            match inner
                .resources
                .create(
                    k,
                    Some(&ns),
                    v,
                    &WriteOptions {
                        field_manager: Some("intent-api".into()),
                        ..Default::default()
                    },
                    false,
                )
                .await
            {
                Ok(created) => return Ok(json_response(StatusCode::CREATED, &created)),
                // A concurrent launch took the number.
                Err(e) if e.code == 409 => n += 1,
                Err(e) => return Err(e),
            }
        }
        Err(ApiError::new(
            409,
            "Conflict",
            format!("could not find a free step number for allocation {parent_name}; try again"),
        ))
    }
    .await;
    r.unwrap_or_else(IntoResponse::into_response)
}
