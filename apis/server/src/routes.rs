//! HTTP routing for `/apis/lattice.dev/v1alpha1/...`: path parsing, verb dispatch,
//! auth, body limits, Table output and request metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use lattice_apis::KindInfo;
use serde_json::Value;

use crate::auth::{record_request_user, UserInfo};
use crate::authz::{self, Attributes, Verb};
use crate::errors::{ApiError, ApiResult};
use crate::objects::parse_body;
use crate::patch::PatchType;
use crate::resources::{
    invalid_delete_options, ListOptions, Preconditions, PropagationPolicy, WriteOptions,
};
use crate::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::table::{self, IncludeObject};
use crate::watch::{serve_watch, WatchParams};
use crate::Inner;

pub fn json_response(code: StatusCode, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut resp = (code, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Parsed query parameters (last value wins).
#[derive(Debug, Default)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn from_uri(uri: &Uri) -> ApiResult<Self> {
        match Query::<Vec<(String, String)>>::try_from_uri(uri) {
            Ok(Query(v)) => Ok(Self(v)),
            Err(e) => Err(ApiError::bad_request(format!("invalid query string: {e}"))),
        }
    }
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("1" | "true" | "True" | ""))
    }
    fn write_options(&self) -> ApiResult<WriteOptions> {
        let dry_run = match self.get("dryRun") {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "unsupported dryRun value {other:?}; use dryRun=All"
                )))
            }
        };
        Ok(WriteOptions {
            dry_run,
            field_manager: self
                .get("fieldManager")
                .filter(|s| !s.is_empty())
                .map(String::from),
            force: self.flag("force") && self.get("force").is_some(),
        })
    }
    fn selectors(&self, kind: &KindInfo) -> ApiResult<Selectors> {
        let labels = LabelSelector::parse(self.get("labelSelector").unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
        let fields = FieldSelector::parse(
            self.get("fieldSelector").unwrap_or(""),
            kind.selectable_fields,
        )
        .map_err(|e| ApiError::bad_request(format!("unable to parse fieldSelector: {e}")))?;
        Ok(Selectors { labels, fields })
    }
}

/// A parsed resource path.
#[derive(Debug)]
pub struct Target {
    pub kind: &'static KindInfo,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

pub use crate::registry::objects::kind_by_plural;

pub fn parse_target(rest: &str) -> ApiResult<Target> {
    let segs: Vec<&str> = rest.trim_matches('/').split('/').collect();
    let nf = || ApiError::path_not_found(rest);
    let (ns, tail): (Option<&str>, &[&str]) = if segs.len() >= 3 && segs[0] == "namespaces" {
        (Some(segs[1]), &segs[2..])
    } else {
        (None, &segs[..])
    };
    let plural = tail
        .first()
        .copied()
        .filter(|s| !s.is_empty())
        .ok_or_else(nf)?;
    let kind = kind_by_plural(plural).ok_or_else(nf)?;
    if ns.is_some() && !kind.namespaced {
        return Err(nf());
    }
    if let Some(n) = ns {
        if n.is_empty() {
            return Err(nf());
        }
    }
    let name = tail
        .get(1)
        .copied()
        .filter(|s| !s.is_empty())
        .map(String::from);
    let subresource = match tail.get(2) {
        None => None,
        Some(&"status") if kind.has_status => Some("status".to_string()),
        Some(_) => return Err(nf()),
    };
    if tail.len() > 3 {
        return Err(nf());
    }
    if name.is_some() && kind.namespaced && ns.is_none() {
        return Err(nf());
    }
    Ok(Target {
        kind,
        namespace: ns.map(String::from),
        name,
        subresource,
    })
}

pub async fn read_body(inner: &Inner, headers: &HeaderMap, body: Body) -> ApiResult<Bytes> {
    let limit = inner.config.max_body_bytes;
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(ApiError::too_large(limit));
        }
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::too_large(limit))
}

/// The request's caller, authenticated by [`crate::auth::authn`] around every route (401
/// there without valid credentials).
pub async fn authenticate(inner: &Inner, headers: &HeaderMap) -> ApiResult<UserInfo> {
    match crate::auth::request_user() {
        Some(u) => Ok(u),
        // Outside the middleware (a handler called directly): authenticate here.
        None => {
            let user = crate::auth::authenticate_request(inner, headers, None).await?;
            record_request_user(&user);
            Ok(user)
        }
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn accept(headers: &HeaderMap) -> &str {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Everything under `/apis/lattice.dev/v1alpha1/`.
pub async fn resource_handler(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let start = Instant::now();
    let mut verb = verb_name(&method, None, false);
    let mut kind_label = "unknown";
    let resp = match dispatch(
        &inner,
        &method,
        &uri,
        &headers,
        body,
        &mut verb,
        &mut kind_label,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => {
            if e.code >= 500 {
                tracing::warn!(%method, path = uri.path(), error = %e, "request failed");
            } else {
                tracing::debug!(%method, path = uri.path(), error = %e, "request rejected");
            }
            e.into_response()
        }
    };
    inner.metrics.observe(
        verb,
        kind_label,
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

fn verb_name(method: &Method, name: Option<&str>, watch: bool) -> &'static str {
    match *method {
        Method::GET if watch => "watch",
        Method::GET if name.is_some() => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

async fn dispatch(
    inner: &Arc<Inner>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
    verb: &mut &'static str,
    kind_label: &mut &'static str,
) -> ApiResult<Response> {
    let prefix = format!("/apis/{}/", lattice_apis::API_VERSION);
    let rest = uri.path().strip_prefix(&prefix).unwrap_or("");
    let user = authenticate(inner, headers).await?;
    let t = parse_target(rest)?;
    let params = Params::from_uri(uri)?;
    let watch = params.flag("watch") && params.get("watch").is_some();
    *verb = verb_name(method, t.name.as_deref(), watch);
    *kind_label = t.kind.kind;
    let authz_verb = match *method {
        Method::GET if watch => Verb::Watch,
        Method::GET if t.name.is_some() => Verb::Get,
        Method::GET => Verb::List,
        Method::POST => Verb::Create,
        Method::PUT => Verb::Update,
        Method::PATCH => Verb::Patch,
        Method::DELETE => Verb::Delete,
        _ => Verb::Update,
    };
    // The field selector is part of what is asked (a node may watch only its own
    // allocations), so it is parsed before authorizing; the body after.
    let list_selectors = if *method == Method::GET && t.name.is_none() {
        Some(params.selectors(t.kind)?)
    } else {
        None
    };
    let mut attrs = Attributes::kind(authz_verb, t.kind, t.namespace.as_deref())
        .named(t.name.as_deref())
        .subresource(t.subresource.as_deref());
    if let Some(sel) = &list_selectors {
        attrs = attrs.fields(&sel.fields);
    }
    authz::authorize(&user, &attrs)?;
    let kind = t.kind;
    let ns = t.namespace.as_deref();
    let sub = t.subresource.as_deref();
    let res = &inner.resources.acting_as(&user);
    let tbl = table::wants_table(accept(headers))
        .then(|| IncludeObject::parse(params.get("includeObject")));
    let ok = |v: Value| -> ApiResult<Response> {
        let v = crate::redact::redact(Some(&user), kind, v);
        let v = match tbl {
            Some(inc) if *method == Method::GET => table::to_table(kind, &v, inc),
            _ => v,
        };
        Ok(json_response(StatusCode::OK, &v))
    };
    match (method.clone(), t.name.as_deref()) {
        (Method::GET, None) => {
            let selectors = list_selectors.unwrap_or_default();
            if watch {
                // 0 is the server's default, as in Kubernetes.
                let timeout = crate::ranges::optional(
                    "timeoutSeconds",
                    params.get("timeoutSeconds"),
                    &crate::ranges::WATCH_TIMEOUT_SECONDS,
                )?
                .filter(|s| *s > 0)
                .map(Duration::from_secs);
                let wp = WatchParams {
                    resource_version: params.get("resourceVersion").map(String::from),
                    bookmarks: params.flag("allowWatchBookmarks")
                        && params.get("allowWatchBookmarks").is_some(),
                    send_initial_events: params.flag("sendInitialEvents")
                        && params.get("sendInitialEvents").is_some(),
                    timeout,
                    selectors,
                    table: tbl,
                };
                return serve_watch(inner.clone(), kind, t.namespace.clone(), wp).await;
            }
            let limit =
                crate::ranges::optional("limit", params.get("limit"), &crate::ranges::LIST_LIMIT)?
                    .unwrap_or(0) as i64;
            let opts = ListOptions {
                selectors,
                limit,
                continue_token: params.get("continue").map(String::from),
                resource_version: params.get("resourceVersion").map(String::from),
                resource_version_match: params.get("resourceVersionMatch").map(String::from),
            };
            ok(res.list(kind, ns, &opts).await?)
        }
        (Method::GET, Some(name)) => ok(res.get(kind, ns, name).await?),
        (Method::POST, None) => {
            let opts = params.write_options()?;
            let b = read_body(inner, headers, body).await?;
            let obj = parse_body(&b, content_type(headers))?;
            let v = res.create(kind, ns, obj, &opts, false).await?;
            Ok(json_response(StatusCode::CREATED, &v))
        }
        (Method::PUT, Some(name)) => {
            let opts = params.write_options()?;
            let b = read_body(inner, headers, body).await?;
            let obj = parse_body(&b, content_type(headers))?;
            ok(res.replace(kind, ns, name, obj, sub, &opts).await?)
        }
        (Method::PATCH, Some(name)) => {
            let ptype = PatchType::from_content_type(content_type(headers))?;
            let opts = params.write_options()?;
            let b = read_body(inner, headers, body).await?;
            let (v, created) = res.patch(kind, ns, name, ptype, &b, sub, &opts).await?;
            Ok(json_response(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                &v,
            ))
        }
        (Method::DELETE, Some(name)) => {
            if sub.is_some() {
                return Err(ApiError::method_not_allowed(
                    "DELETE is not supported on the status subresource",
                ));
            }
            let mut opts = params.write_options()?;
            let b = read_body(inner, headers, body).await?;
            let mut pre = Preconditions::default();
            // Query parameters first; the DeleteOptions body overrides them.
            let mut policy = match params.get("propagationPolicy") {
                None | Some("") => None,
                Some(p) => Some(PropagationPolicy::parse(p)?),
            };
            let mut orphan = match params.get("orphanDependents") {
                None | Some("") => None,
                Some("true") => Some(true),
                Some("false") => Some(false),
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "orphanDependents must be true or false",
                    ))
                }
            };
            if !b.iter().all(|c| c.is_ascii_whitespace()) {
                let v: Value =
                    crate::parse::value(&b, crate::parse::Format::Json).map_err(|e| {
                        e.into_api(|m| format!("the DeleteOptions body is not valid JSON: {m}"))
                    })?;
                if let Some(p) = v.get("preconditions") {
                    pre = serde_json::from_value(p.clone()).map_err(|e| {
                        ApiError::bad_request(format!("invalid preconditions: {e}"))
                    })?;
                }
                if let Some(d) = v.get("dryRun").and_then(Value::as_array) {
                    if d.iter().any(|x| x.as_str() == Some("All")) {
                        opts.dry_run = true;
                    }
                }
                match v.get("propagationPolicy") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(p)) => policy = Some(PropagationPolicy::parse(p)?),
                    Some(_) => {
                        return Err(invalid_delete_options(
                            "propagationPolicy",
                            "FieldValueInvalid",
                            format!(
                                "Invalid value: must be one of {}",
                                PropagationPolicy::SUPPORTED.join(", ")
                            ),
                        ))
                    }
                }
                match v.get("orphanDependents") {
                    None | Some(Value::Null) => {}
                    Some(Value::Bool(o)) => orphan = Some(*o),
                    Some(_) => {
                        return Err(ApiError::bad_request(
                            "orphanDependents must be true or false",
                        ))
                    }
                }
            }
            // The deprecated `orphanDependents`, as Kubernetes reads it.
            let policy = match (policy, orphan) {
                (Some(_), Some(_)) => {
                    let why = "orphanDependents and propagationPolicy cannot be both set";
                    return Err(invalid_delete_options(
                        "propagationPolicy",
                        "FieldValueInvalid",
                        format!("Invalid value: {why}"),
                    ));
                }
                (Some(p), None) => Some(p),
                (None, Some(true)) => Some(PropagationPolicy::Orphan),
                (None, Some(false)) => Some(PropagationPolicy::Background),
                (None, None) => None,
            };
            let v = res
                .delete_propagating(kind, ns, name, &pre, policy, opts.dry_run)
                .await?;
            ok(v)
        }
        (m, _) => Err(ApiError::method_not_allowed(format!(
            "{m} is not supported on {}",
            uri.path()
        ))),
    }
}
