//! The HTTP transport: Kubernetes paths, `Status` errors, NDJSON watch.

use std::time::Duration;

use async_trait::async_trait;
use bytes::{Buf, BytesMut};
use futures::StreamExt;
use lattice_apis::{KindInfo, API_VERSION};
use reqwest::{Method, RequestBuilder, Response};
use serde_json::{json, Value};

use super::*;
use crate::error::Error;
use crate::rest::{describe_transport_error, ApiStatus, WatchLine};

/// Talks to a `lattice-server` over HTTP(S).
#[derive(Clone)]
pub struct HttpTransport {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// Never the token itself: a transport printed in a log must not hand out its credential.
impl std::fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTransport")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl HttpTransport {
    /// A transport for `base_url` (scheme, host and port; no path).
    pub fn new(base_url: &str, token: Option<String>) -> Result<Self> {
        Self::build(base_url, token, None)
    }

    /// A transport for `base_url` over TLS configured by `tls` (CA, client certificate).
    pub fn with_tls(
        base_url: &str,
        token: Option<String>,
        tls: rustls::ClientConfig,
    ) -> Result<Self> {
        Self::build(base_url, token, Some(tls))
    }

    fn build(
        base_url: &str,
        token: Option<String>,
        tls: Option<rustls::ClientConfig>,
    ) -> Result<Self> {
        let mut b = reqwest::Client::builder()
            .user_agent(crate::rest::USER_AGENT)
            .connect_timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(32);
        if let Some(tls) = tls {
            b = b.use_preconfigured_tls(tls);
        }
        let http = b.build().map_err(transport)?;
        Ok(Self {
            base: base_url.trim_end_matches('/').to_string(),
            token,
            http,
        })
    }

    fn url(
        &self,
        kind: &KindInfo,
        ns: Option<&str>,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> Result<String> {
        let mut u = format!("{}/apis/{API_VERSION}", self.base);
        if kind.namespaced {
            if let Some(ns) = ns {
                u.push_str("/namespaces/");
                u.push_str(ns);
            } else if name.is_some() {
                return Err(Error::Request(format!(
                    "{} is namespaced: a namespace (tenant) is required",
                    kind.kind
                )));
            }
        }
        u.push('/');
        u.push_str(kind.plural);
        if let Some(n) = name {
            u.push('/');
            u.push_str(n);
        }
        if let Some(s) = sub {
            u.push('/');
            u.push_str(s);
        }
        Ok(u)
    }

    fn request(&self, method: Method, url: &str) -> RequestBuilder {
        let rb = self.http.request(method, url);
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    async fn send(&self, rb: RequestBuilder) -> Result<Response> {
        let resp = rb.send().await.map_err(transport)?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        Err(Error::Api(status_error(code, &text)))
    }

    async fn json(&self, rb: RequestBuilder) -> Result<Value> {
        let resp = self.send(rb).await?;
        let bytes = resp.bytes().await.map_err(transport)?;
        serde_json::from_slice(&bytes).map_err(|e| Error::decode("response", e))
    }
}

/// Turn an error body into an [`ErrorResponse`] (a `Status`, or plain text).
fn status_error(code: u16, body: &str) -> ErrorResponse {
    let s = ApiStatus::from_body(code, body);
    ErrorResponse {
        code: s.code,
        reason: s.reason,
        message: s.message,
    }
}

fn transport(e: reqwest::Error) -> Error {
    Error::Transport(describe_transport_error(&e))
}

fn selector_query(label: &Option<String>, field: &Option<String>) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    if let Some(l) = label.as_ref().filter(|s| !s.is_empty()) {
        q.push(("labelSelector", l.clone()));
    }
    if let Some(f) = field.as_ref().filter(|s| !s.is_empty()) {
        q.push(("fieldSelector", f.clone()));
    }
    q
}

/// Parse one NDJSON watch line.
fn parse_event(line: &[u8]) -> Result<RawWatchEvent> {
    let WatchLine { ty, object: obj } =
        serde_json::from_slice(line).map_err(|e| Error::decode("watch event", e))?;
    let ty = ty.as_str();
    Ok(match ty {
        "ADDED" => RawWatchEvent::Added(obj),
        "MODIFIED" => RawWatchEvent::Modified(obj),
        "DELETED" => RawWatchEvent::Deleted(obj),
        "BOOKMARK" => RawWatchEvent::Bookmark(
            obj.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        ),
        "ERROR" => RawWatchEvent::Error(status_error(500, &obj.to_string())),
        other => {
            return Err(Error::decode(
                "watch event",
                format!("unknown event type {other:?}"),
            ))
        }
    })
}

#[async_trait]
impl Transport for HttpTransport {
    async fn get(&self, kind: &'static KindInfo, ns: Option<&str>, name: &str) -> Result<Value> {
        let url = self.url(kind, ns, Some(name), None)?;
        self.json(self.request(Method::GET, &url)).await
    }

    async fn list(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        params: &ListParams,
    ) -> Result<Value> {
        let url = self.url(kind, ns, None, None)?;
        let mut q = selector_query(&params.label_selector, &params.field_selector);
        if let Some(l) = params.limit.filter(|l| *l > 0) {
            q.push(("limit", l.to_string()));
        }
        if let Some(c) = params.continue_token.as_ref().filter(|c| !c.is_empty()) {
            q.push(("continue", c.clone()));
        }
        self.json(self.request(Method::GET, &url).query(&q)).await
    }

    async fn watch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        params: &WatchParams,
    ) -> Result<RawWatchStream> {
        let url = self.url(kind, ns, None, None)?;
        let mut q = selector_query(&params.label_selector, &params.field_selector);
        q.push(("watch", "1".into()));
        if !params.resource_version.is_empty() {
            q.push(("resourceVersion", params.resource_version.clone()));
        }
        if params.bookmarks {
            q.push(("allowWatchBookmarks", "true".into()));
        }
        if let Some(t) = params.timeout {
            q.push(("timeoutSeconds", t.as_secs().max(1).to_string()));
        }
        let resp = self.send(self.request(Method::GET, &url).query(&q)).await?;
        let body = resp.bytes_stream();
        // State: the body, the bytes not yet split into lines, how much of them is
        // known to hold no newline (so each chunk is scanned once), and whether done.
        let stream = futures::stream::unfold(
            (body, BytesMut::new(), 0usize, false),
            |(mut body, mut buf, mut scanned, done)| async move {
                if done {
                    return None;
                }
                loop {
                    if let Some(i) = buf[scanned..].iter().position(|b| *b == b'\n') {
                        let line = buf.split_to(scanned + i + 1);
                        scanned = 0;
                        let line = &line[..line.len() - 1];
                        if line.iter().all(u8::is_ascii_whitespace) {
                            continue;
                        }
                        return Some((parse_event(line), (body, buf, scanned, false)));
                    }
                    scanned = buf.len();
                    match body.next().await {
                        Some(Ok(chunk)) => buf.extend_from_slice(chunk.chunk()),
                        Some(Err(e)) => {
                            return Some((Err(transport(e)), (body, buf, scanned, true)))
                        }
                        None => {
                            // A last line without a newline.
                            if buf.iter().any(|b| !b.is_ascii_whitespace()) {
                                let line = buf.split();
                                return Some((parse_event(&line), (body, buf, 0, true)));
                            }
                            return None;
                        }
                    }
                }
            },
        );
        Ok(stream.boxed())
    }

    async fn create(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        obj: Value,
        params: &PostParams,
    ) -> Result<Value> {
        let url = self.url(kind, ns, None, None)?;
        let mut q = Vec::new();
        if let Some(m) = &params.field_manager {
            q.push(("fieldManager", m.clone()));
        }
        if params.dry_run {
            q.push(("dryRun", "All".into()));
        }
        self.json(self.request(Method::POST, &url).query(&q).json(&obj))
            .await
    }

    async fn replace(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        subresource: Option<&str>,
        params: &PostParams,
    ) -> Result<Value> {
        let url = self.url(kind, ns, Some(name), subresource)?;
        let mut q = Vec::new();
        if let Some(m) = &params.field_manager {
            q.push(("fieldManager", m.clone()));
        }
        if params.dry_run {
            q.push(("dryRun", "All".into()));
        }
        self.json(self.request(Method::PUT, &url).query(&q).json(&obj))
            .await
    }

    async fn patch(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        patch: &Patch,
        subresource: Option<&str>,
        params: &PatchParams,
    ) -> Result<Value> {
        let url = self.url(kind, ns, Some(name), subresource)?;
        let mut q = Vec::new();
        if let Some(m) = &params.field_manager {
            q.push(("fieldManager", m.clone()));
        }
        if params.force {
            q.push(("force", "true".into()));
        }
        if params.dry_run {
            q.push(("dryRun", "All".into()));
        }
        let body = serde_json::to_vec(patch.body()).map_err(|e| Error::decode("patch", e))?;
        self.json(
            self.request(Method::PATCH, &url)
                .query(&q)
                .header(reqwest::header::CONTENT_TYPE, patch.content_type())
                .body(body),
        )
        .await
    }

    async fn delete(
        &self,
        kind: &'static KindInfo,
        ns: Option<&str>,
        name: &str,
        params: &DeleteParams,
    ) -> Result<Value> {
        let url = self.url(kind, ns, Some(name), None)?;
        let mut body = json!({"kind": "DeleteOptions", "apiVersion": "v1"});
        if let Some(p) = &params.preconditions {
            let mut pre = serde_json::Map::new();
            if let Some(uid) = &p.uid {
                pre.insert("uid".into(), Value::String(uid.clone()));
            }
            if let Some(rv) = &p.resource_version {
                pre.insert("resourceVersion".into(), Value::String(rv.clone()));
            }
            body["preconditions"] = Value::Object(pre);
        }
        if let Some(p) = params.propagation_policy {
            body["propagationPolicy"] = Value::String(p.as_str().into());
        }
        if params.dry_run {
            body["dryRun"] = json!(["All"]);
        }
        self.json(self.request(Method::DELETE, &url).json(&body))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_the_token() {
        let t = HttpTransport::new("http://127.0.0.1:1", Some("s3cr3t-token".into())).unwrap();
        let shown = format!("{t:?}");
        assert!(!shown.contains("s3cr3t-token"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn parses_watch_lines_and_status_errors() {
        let ev =
            parse_event(br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"42"}}}"#)
                .expect("bookmark");
        assert_eq!(ev, RawWatchEvent::Bookmark("42".into()));
        let ev = parse_event(
            br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","code":410,"reason":"Expired","message":"too old"}}"#,
        )
        .expect("error");
        match ev {
            RawWatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
            other => panic!("unexpected {other:?}"),
        }
        assert!(parse_event(b"{\"type\":\"WHAT\"}").is_err());
        let e = status_error(502, "bad gateway");
        assert_eq!((e.code, e.message.as_str()), (502, "bad gateway"));
    }
}
