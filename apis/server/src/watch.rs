//! Watch over HTTP: NDJSON `{"type":..,"object":..}` events, flushed one by one, served
//! from the watch cache (see [`crate::watch_cache`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use lattice_apis::KindInfo;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::errors::ApiResult;
use crate::objects::{list_prefix, parse_rv};
use crate::resources::ListOptions;
use crate::selectors::Selectors;
use crate::table::{self, IncludeObject};
use crate::watch_cache::{classify, Filter, Item, Source};
use crate::Inner;

#[derive(Debug, Clone, Default)]
pub struct WatchParams {
    pub resource_version: Option<String>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
    pub selectors: Selectors,
    pub table: Option<IncludeObject>,
}

fn event_line(kind: &KindInfo, ty: &str, obj: &Value, tbl: Option<IncludeObject>) -> Bytes {
    let ev = match tbl {
        Some(inc) if ty != "BOOKMARK" && ty != "ERROR" => {
            json!({"type": ty, "object": table::to_table(kind, obj, inc)})
        }
        _ => json!({"type": ty, "object": obj}),
    };
    let mut v = serde_json::to_vec(&ev).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn bookmark(kind: &KindInfo, rev: i64, initial_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rev.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": kind.kind, "apiVersion": lattice_apis::API_VERSION, "metadata": meta})
}

type Tx = mpsc::Sender<Result<Bytes, Infallible>>;

async fn send(tx: &Tx, b: Bytes, deadline: Instant) -> bool {
    tokio::select! {
        r = tx.send(Ok(b)) => r.is_ok(),
        _ = tokio::time::sleep_until(deadline) => false,
    }
}

struct WatcherGuard {
    inner: Arc<Inner>,
    kind: &'static str,
}

impl Drop for WatcherGuard {
    fn drop(&mut self) {
        self.inner
            .metrics
            .watchers
            .get_or_create(&crate::metrics::KindLabel {
                kind: self.kind.into(),
            })
            .dec();
    }
}

/// Start a watch; errors before the stream (410 for a compacted resourceVersion) are
/// returned as normal responses.
pub async fn serve_watch(
    inner: Arc<Inner>,
    kind: &'static KindInfo,
    ns: Option<String>,
    params: WatchParams,
) -> ApiResult<Response> {
    // Before any work for it: a caller at their cap of watches gets 429 here.
    let slot = crate::limits::acquire_for_request(&inner, crate::limits::Session::Watch)?;
    let rv = params.resource_version.as_deref().filter(|s| !s.is_empty());
    let want_initial = params.send_initial_events || rv.is_none() || rv == Some("0");
    let (initial, from) = if want_initial {
        let list = inner
            .resources
            .list(
                kind,
                ns.as_deref(),
                &ListOptions {
                    selectors: params.selectors.clone(),
                    ..Default::default()
                },
            )
            .await?;
        let rev = list
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<i64>().ok())
            .unwrap_or(0);
        let items = match list.get("items") {
            Some(Value::Array(a)) => a.clone(),
            _ => Vec::new(),
        };
        (items, rev)
    } else {
        (Vec::new(), parse_rv(rv.unwrap_or("0"))?)
    };
    let prefix = list_prefix(kind, ns.as_deref());
    let filter = Filter {
        prefix: prefix.clone(),
        selectors: params.selectors.clone(),
    };
    let mut source =
        Source::open(&inner.caches, &inner.resources.backend, kind, from, filter).await?;

    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let timeout = params.timeout.unwrap_or(inner.config.default_watch_timeout);
    let mut deadline = Instant::now() + timeout;
    // A watch does not outlive the credential it was opened with: it ends when the token
    // or certificate expires, and (checked every RECHECK) when the certificate is revoked
    // or the job token's allocation ends.
    let caller = crate::auth::request_user();
    if let Some(ends) = caller.as_ref().and_then(|u| u.credential_ends()) {
        let left = ends
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        deadline = deadline.min(Instant::now() + left);
    }
    let redacted = crate::redact::applies(caller.as_ref(), kind);
    let recheck_caller = caller
        .clone()
        .filter(|u| u.cert.is_some() || u.bound_to.is_some());
    let bookmark_every = inner.config.bookmark_interval;
    inner
        .metrics
        .watchers
        .get_or_create(&crate::metrics::KindLabel {
            kind: kind.kind.into(),
        })
        .inc();
    let guard = WatcherGuard {
        inner: inner.clone(),
        kind: kind.kind,
    };
    let mut stop = inner.shutting_down.subscribe();
    if *stop.borrow_and_update() {
        return Err(crate::errors::ApiError::unavailable(
            "the server is shutting down",
        ));
    }
    tokio::spawn(async move {
        let _guard = guard;
        let _slot = slot;
        let sent = guard_counter(&_guard.inner, kind.kind);
        let tbl = params.table;
        for obj in &initial {
            let obj = &crate::redact::redact(caller.as_ref(), kind, obj.clone());
            if !send(&tx, event_line(kind, "ADDED", obj, tbl), deadline).await {
                return;
            }
            sent.inc();
        }
        let mut last = from;
        if params.send_initial_events && params.bookmarks {
            let b = bookmark(kind, last, true);
            if !send(&tx, event_line(kind, "BOOKMARK", &b, None), deadline).await {
                return;
            }
        }
        let mut tick = tokio::time::interval_at(Instant::now() + bookmark_every, bookmark_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut recheck = tokio::time::interval_at(Instant::now() + RECHECK, RECHECK);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tx.closed() => break,
                _ = stop.changed() => break,
                _ = tokio::time::sleep_until(deadline) => break,
                _ = recheck.tick(), if recheck_caller.is_some() => {
                    if let Some(u) = &recheck_caller {
                        if !credential_live(&_guard.inner, u).await {
                            tracing::info!(user = %u.name, "watch ended: its credential was revoked or its job ended");
                            break;
                        }
                    }
                }
                _ = tick.tick(), if params.bookmarks => {
                    let b = bookmark(kind, last, false);
                    if !send(&tx, event_line(kind, "BOOKMARK", &b, None), deadline).await {
                        break;
                    }
                }
                item = source.next() => match item {
                    Ok(Item::Change(c)) => {
                        // Other keys of this revision may still be on their way: a
                        // bookmark names it once a later change or the cache's progress
                        // shows it complete (a resume from one revision earlier at most
                        // repeats this revision's events, never skips one).
                        last = last.max(c.rev - 1);
                        if !c.key.starts_with(&prefix) {
                            continue;
                        }
                        if let Some((ty, obj)) = classify(&c, &params.selectors) {
                            let line = match tbl {
                                None if !redacted => c.line(ty),
                                _ => event_line(
                                    kind,
                                    ty,
                                    &crate::redact::redact(caller.as_ref(), kind, obj.clone()),
                                    tbl,
                                ),
                            };
                            if !send(&tx, line, deadline).await {
                                break;
                            }
                            sent.inc();
                        }
                    }
                    Ok(Item::Progress(r)) => last = last.max(r),
                    Err(e) => {
                        let _ = send(&tx, event_line(kind, "ERROR", &e.to_status(), None), deadline).await;
                        break;
                    }
                }
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

/// How often a watch opened with a certificate or a job token checks that it still holds.
const RECHECK: Duration = Duration::from_secs(2);

/// Whether `user`'s credential still holds: its certificate not revoked, its job token's
/// allocation still running. An error reading either ends the watch too (the client
/// watches again and is authenticated afresh).
async fn credential_live(inner: &Arc<Inner>, user: &crate::auth::UserInfo) -> bool {
    if let Some(c) = &user.cert {
        match inner
            .revocations
            .is_revoked(&inner.resources.backend, &c.serial)
            .await
        {
            Ok(false) => {}
            _ => return false,
        }
    }
    if user.bound_to.is_some() {
        return crate::auth::job_token_alive(inner, user.clone())
            .await
            .is_ok();
    }
    true
}

fn guard_counter(inner: &Inner, kind: &str) -> prometheus_client::metrics::counter::Counter {
    inner
        .metrics
        .watch_events_sent
        .get_or_create(&crate::metrics::KindLabel { kind: kind.into() })
        .clone()
}
