//! The path-level REST client: any route of the API by its path (Kubernetes paths of
//! kinds known only at run time, the `/v1` routes, `/readyz`, `/metrics`), with
//! `Status` errors decoded with their causes, paginated lists followed, streamed bodies
//! (followed logs), WebSocket upgrades (attach) and NDJSON watches. The CLI is built on
//! it; typed access is [`Api`](crate::Api) over [`HttpTransport`](crate::HttpTransport),
//! which shares its `Status` decoding and its description of transport errors.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

/// Page size for lists.
pub const LIST_PAGE_SIZE: u32 = 500;

/// One `details.causes[]` entry of a `Status`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusCause {
    /// The field the cause is about (`spec.resources.nodes`).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
    /// Machine-readable reason (`FieldValueInvalid`, ...).
    pub reason: String,
}

impl StatusCause {
    /// `field: message`, or just the message when no field is given.
    pub fn render(&self) -> String {
        match (self.field.is_empty(), self.message.is_empty()) {
            (false, false) => format!("{}: {}", self.field, self.message),
            (false, true) => format!("{}: {}", self.field, self.reason),
            (true, false) => self.message.clone(),
            (true, true) => self.reason.clone(),
        }
    }
}

/// A decoded Kubernetes `Status` (the error body of every failed request).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApiStatus {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Invalid`, ...).
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// Per-field causes (`details.causes`).
    pub causes: Vec<StatusCause>,
}

impl ApiStatus {
    /// Parses a `Status` JSON value; `None` when it is not one.
    pub fn from_value(v: &Value, http_code: u16) -> Option<ApiStatus> {
        if v.get("kind").and_then(Value::as_str) != Some("Status") && v.get("message").is_none() {
            return None;
        }
        let s = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let code = v
            .get("code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| *c != 0)
            .unwrap_or(http_code);
        let causes = v
            .pointer("/details/causes")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let g = |k: &str| {
                            c.get(k)
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_string()
                        };
                        StatusCause {
                            field: g("field"),
                            message: g("message"),
                            reason: g("reason"),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(ApiStatus {
            code,
            reason: s("reason"),
            message: s("message"),
            causes,
        })
    }

    /// The error body of an answer with HTTP status `code`: its `Status`, or, when the
    /// body is not one (a proxy's page, plain text), the start of the text or the
    /// status's name.
    pub fn from_body(code: u16, body: &str) -> ApiStatus {
        serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| ApiStatus::from_value(&v, code))
            .unwrap_or_else(|| {
                let mut message: String = body.trim().chars().take(300).collect();
                if message.is_empty() {
                    message = reqwest::StatusCode::from_u16(code)
                        .ok()
                        .and_then(|c| c.canonical_reason())
                        .unwrap_or("error")
                        .to_string();
                }
                ApiStatus {
                    code,
                    reason: String::new(),
                    message,
                    causes: Vec::new(),
                }
            })
    }

    /// The message, or the reason, or the HTTP status text.
    pub fn message_or_reason(&self) -> String {
        if !self.message.is_empty() {
            self.message.clone()
        } else if !self.reason.is_empty() {
            self.reason.clone()
        } else {
            reqwest::StatusCode::from_u16(self.code)
                .ok()
                .and_then(|c| c.canonical_reason())
                .unwrap_or("unknown error")
                .to_string()
        }
    }
}

/// What can go wrong talking to the API.
#[derive(Debug, Clone)]
pub enum ClientError {
    /// The server could not be reached at all: its URL and why.
    Connect {
        /// The API's base URL.
        url: String,
        /// Why, in a few words ("connection refused").
        reason: String,
    },
    /// The request timed out.
    Timeout {
        /// The request's URL.
        url: String,
    },
    /// The server answered with a non-2xx status.
    Status {
        /// The request's method.
        method: String,
        /// The request's URL.
        url: String,
        /// The API's answer.
        status: Box<ApiStatus>,
    },
    /// The body was not what we expected.
    Decode {
        /// The request's URL.
        url: String,
        /// What did not parse.
        reason: String,
    },
    /// Anything else.
    Other(String),
}

impl ClientError {
    /// The HTTP code for `Status` errors.
    pub fn code(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(status.code),
            _ => None,
        }
    }

    /// 404.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// 410: the resourceVersion was compacted; list again.
    pub fn is_gone(&self) -> bool {
        self.code() == Some(410)
    }

    /// True for errors worth retrying in a watch loop (network trouble, server restarts).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Connect { .. } | ClientError::Timeout { .. } | ClientError::Other(_) => {
                true
            }
            ClientError::Decode { .. } => true,
            ClientError::Status { status, .. } => {
                status.code >= 500 || status.code == 429 || status.code == 410
            }
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Connect { url, reason } => write!(f, "cannot reach {url}: {reason}"),
            ClientError::Timeout { url } => write!(f, "request to {url} timed out"),
            ClientError::Status {
                method,
                url,
                status,
            } => write!(
                f,
                "{method} {url}: {} ({})",
                status.message_or_reason(),
                status.code
            ),
            ClientError::Decode { url, reason } => write!(f, "bad answer from {url}: {reason}"),
            ClientError::Other(s) => f.write_str(s),
        }
    }
}

/// Describes a reqwest error in a few words ("connection refused"): the innermost
/// cause, not reqwest's "error sending request for url ...".
pub fn describe_transport_error(e: &reqwest::Error) -> String {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut innermost = e.to_string();
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                std::io::ErrorKind::ConnectionReset => "connection reset by the server".to_string(),
                std::io::ErrorKind::TimedOut => "connection timed out".to_string(),
                _ => io.to_string(),
            };
        }
        innermost = s.to_string();
        src = s.source();
    }
    let lower = innermost.to_lowercase();
    if lower.contains("dns error") || lower.contains("failed to lookup") {
        return format!("host name could not be resolved ({innermost})");
    }
    innermost
}

/// Options for a write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// Validate only; write nothing (`dryRun=All`).
    pub dry_run: bool,
}

/// Parameters of a list or watch.
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    /// Label selector, e.g. `app=web,tier!=db`.
    pub label_selector: Option<String>,
    /// Field selector, e.g. `metadata.name=x`.
    pub field_selector: Option<String>,
}

impl ListParams {
    fn push_query(&self, q: &mut Vec<(String, String)>) {
        if let Some(l) = self.label_selector.as_deref().filter(|s| !s.is_empty()) {
            q.push(("labelSelector".into(), l.to_string()));
        }
        if let Some(f) = self.field_selector.as_deref().filter(|s| !s.is_empty()) {
            q.push(("fieldSelector".into(), f.to_string()));
        }
    }
}

/// The `User-Agent` of a client that names none.
pub const USER_AGENT: &str = concat!("lattice-client/", env!("CARGO_PKG_VERSION"));

/// TLS settings, and how the client introduces itself.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// Extra root certificates (PEM bundle).
    pub ca_pem: Option<Vec<u8>>,
    /// Accept any server certificate.
    pub insecure: bool,
    /// `User-Agent` (default [`USER_AGENT`]), e.g. `lattice-cli/0.1.0`.
    pub user_agent: Option<String>,
}

/// The HTTP client.
#[derive(Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    request_timeout: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Client {
    /// A client for the API at `base` (e.g. `http://127.0.0.1:8080`).
    pub fn new(base: &str, token: Option<String>) -> Result<Client, ClientError> {
        Client::with_tls(base, token, &TlsOptions::default())
    }

    /// A client with TLS settings for an https API.
    pub fn with_tls(
        base: &str,
        token: Option<String>,
        tls: &TlsOptions,
    ) -> Result<Client, ClientError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(tls.user_agent.as_deref().unwrap_or(USER_AGENT));
        if let Some(pem) = &tls.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
                ClientError::Other(format!("the CA file is not a PEM certificate bundle: {e}"))
            })?;
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        if tls.insecure {
            builder = builder.danger_accept_invalid_certs(true);
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Other(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client {
            base: base.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
            http,
            request_timeout: Duration::from_secs(60),
        })
    }

    /// The base URL (no trailing slash).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut rb = self
            .http
            .request(method, self.url(path))
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(t) = &self.token {
            rb = rb.bearer_auth(t);
        }
        rb
    }

    fn transport_error(&self, url: &str, e: reqwest::Error) -> ClientError {
        if e.is_timeout() {
            ClientError::Timeout {
                url: url.to_string(),
            }
        } else if e.is_connect() {
            ClientError::Connect {
                url: self.base.clone(),
                reason: describe_transport_error(&e),
            }
        } else {
            ClientError::Other(format!(
                "request to {url} failed: {}",
                describe_transport_error(&e)
            ))
        }
    }

    /// Opens a WebSocket at `path` (GET with the upgrade headers, subprotocol
    /// `protocol`) and returns the upgraded connection; an answer other than 101 is the
    /// API's error.
    pub async fn websocket(
        &self,
        path: &str,
        protocol: &str,
    ) -> Result<reqwest::Upgraded, ClientError> {
        use tokio_tungstenite::tungstenite::handshake::client::generate_key;
        let url = self.url(path);
        let resp = self
            .request(reqwest::Method::GET, path)
            .version(reqwest::Version::HTTP_11)
            .header(reqwest::header::CONNECTION, "Upgrade")
            .header(reqwest::header::UPGRADE, "websocket")
            .header(reqwest::header::SEC_WEBSOCKET_VERSION, "13")
            .header(reqwest::header::SEC_WEBSOCKET_KEY, generate_key())
            .header(reqwest::header::SEC_WEBSOCKET_PROTOCOL, protocol)
            .send()
            .await
            .map_err(|e| self.transport_error(&url, e))?;
        if resp.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            return Err(Self::error_from_response("GET", &url, resp).await);
        }
        resp.upgrade()
            .await
            .map_err(|e| ClientError::Other(format!("upgrading {url} to a WebSocket: {e}")))
    }

    async fn error_from_response(method: &str, url: &str, resp: reqwest::Response) -> ClientError {
        let code = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let status = ApiStatus::from_body(code, &text);
        ClientError::Status {
            method: method.to_string(),
            url: url.to_string(),
            status: Box::new(status),
        }
    }

    async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(String, String)],
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Value, ClientError> {
        let url = self.url(path);
        let mut rb = self
            .request(method.clone(), path)
            .query(query)
            .timeout(self.request_timeout);
        if let Some((ct, bytes)) = body {
            rb = rb.header(reqwest::header::CONTENT_TYPE, ct).body(bytes);
        }
        let resp = rb.send().await.map_err(|e| self.transport_error(&url, e))?;
        if !resp.status().is_success() {
            return Err(Self::error_from_response(method.as_str(), &url, resp).await);
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| self.transport_error(&url, e))?;
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
            url,
            reason: e.to_string(),
        })
    }

    /// GET a JSON document.
    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.send_json(reqwest::Method::GET, path, &[], None).await
    }

    /// GET a text document (`/readyz`, `/metrics`); non-2xx answers are errors.
    pub async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let url = self.url(path);
        let resp = self
            .request(reqwest::Method::GET, path)
            .header(reqwest::header::ACCEPT, "text/plain, */*")
            .timeout(self.request_timeout)
            .send()
            .await
            .map_err(|e| self.transport_error(&url, e))?;
        if !resp.status().is_success() {
            return Err(Self::error_from_response("GET", &url, resp).await);
        }
        resp.text().await.map_err(|e| self.transport_error(&url, e))
    }

    /// GET a streamed body (`.../log?follow=true`): the chunks as they arrive. No overall
    /// timeout (a followed log lasts as long as the allocation).
    pub async fn get_stream(
        &self,
        path: &str,
        query: &[(String, String)],
    ) -> Result<ByteChunks, ClientError> {
        let url = self.url(path);
        let resp = self
            .request(reqwest::Method::GET, path)
            .header(reqwest::header::ACCEPT, "text/plain, */*")
            .query(query)
            .send()
            .await
            .map_err(|e| self.transport_error(&url, e))?;
        if !resp.status().is_success() {
            return Err(Self::error_from_response("GET", &url, resp).await);
        }
        Ok(ByteChunks {
            body: Box::pin(resp.bytes_stream()),
        })
    }

    /// GET an object, `None` on 404.
    pub async fn get_opt(&self, path: &str) -> Result<Option<Value>, ClientError> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Lists a collection, following `continue` tokens; returns the merged list (its
    /// `metadata.resourceVersion` is the one of the first page).
    pub async fn list(&self, path: &str, params: &ListParams) -> Result<Value, ClientError> {
        let mut items: Vec<Value> = Vec::new();
        let mut first: Option<Value> = None;
        let mut cont: Option<String> = None;
        loop {
            let mut q = Vec::new();
            params.push_query(&mut q);
            q.push(("limit".into(), LIST_PAGE_SIZE.to_string()));
            if let Some(c) = &cont {
                q.push(("continue".into(), c.clone()));
            }
            let mut page = self.send_json(reqwest::Method::GET, path, &q, None).await?;
            if let Some(Value::Array(page_items)) = page.get_mut("items").map(Value::take) {
                items.extend(page_items);
            }
            cont = page
                .pointer("/metadata/continue")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string);
            if first.is_none() {
                first = Some(page);
            }
            if cont.is_none() {
                break;
            }
        }
        let mut list = first.unwrap_or_else(|| serde_json::json!({}));
        if let Some(obj) = list.as_object_mut() {
            obj.insert("items".into(), Value::Array(items));
            if let Some(Value::Object(md)) = obj.get_mut("metadata") {
                md.remove("continue");
                md.remove("remainingItemCount");
            }
        }
        Ok(list)
    }

    /// POST (create).
    pub async fn create(
        &self,
        path: &str,
        obj: &Value,
        opts: &WriteOptions,
    ) -> Result<Value, ClientError> {
        let q = dry_run_query(opts);
        let body = serde_json::to_vec(obj).map_err(|e| ClientError::Other(e.to_string()))?;
        self.send_json(
            reqwest::Method::POST,
            path,
            &q,
            Some(("application/json", body)),
        )
        .await
    }

    /// Server-side apply: `PATCH` with `application/apply-patch+yaml`.
    pub async fn apply(
        &self,
        path: &str,
        obj: &Value,
        field_manager: &str,
        force: bool,
        opts: &WriteOptions,
    ) -> Result<Value, ClientError> {
        let mut q = vec![
            ("fieldManager".to_string(), field_manager.to_string()),
            ("force".to_string(), force.to_string()),
        ];
        q.extend(dry_run_query(opts));
        // JSON is YAML, and keeps the body unambiguous.
        let body = serde_json::to_vec(obj).map_err(|e| ClientError::Other(e.to_string()))?;
        self.send_json(
            reqwest::Method::PATCH,
            path,
            &q,
            Some(("application/apply-patch+yaml", body)),
        )
        .await
    }

    /// JSON merge patch.
    pub async fn merge_patch(
        &self,
        path: &str,
        patch: &Value,
        opts: &WriteOptions,
    ) -> Result<Value, ClientError> {
        let q = dry_run_query(opts);
        let body = serde_json::to_vec(patch).map_err(|e| ClientError::Other(e.to_string()))?;
        self.send_json(
            reqwest::Method::PATCH,
            path,
            &q,
            Some(("application/merge-patch+json", body)),
        )
        .await
    }

    /// PUT a JSON document (not an object write: `/v1/admin/config/{key}`).
    pub async fn put_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Other(e.to_string()))?;
        self.send_json(
            reqwest::Method::PUT,
            path,
            &[],
            Some(("application/json", bytes)),
        )
        .await
    }

    /// DELETE an object.
    pub async fn delete(&self, path: &str, opts: &WriteOptions) -> Result<Value, ClientError> {
        let q = dry_run_query(opts);
        self.send_json(reqwest::Method::DELETE, path, &q, None)
            .await
    }

    /// Starts a watch from `resource_version`.
    pub async fn watch(
        &self,
        path: &str,
        params: &ListParams,
        resource_version: &str,
    ) -> Result<WatchStream, ClientError> {
        let url = self.url(path);
        let mut q = vec![
            ("watch".to_string(), "true".to_string()),
            ("allowWatchBookmarks".to_string(), "true".to_string()),
        ];
        if !resource_version.is_empty() {
            q.push(("resourceVersion".into(), resource_version.to_string()));
        }
        params.push_query(&mut q);
        let resp = self
            .request(reqwest::Method::GET, path)
            .query(&q)
            .send()
            .await
            .map_err(|e| self.transport_error(&url, e))?;
        if !resp.status().is_success() {
            return Err(Self::error_from_response("GET", &url, resp).await);
        }
        Ok(WatchStream {
            url,
            body: Box::pin(resp.bytes_stream()),
            decoder: NdjsonDecoder::default(),
            pending: VecDeque::new(),
        })
    }
}

fn dry_run_query(opts: &WriteOptions) -> Vec<(String, String)> {
    if opts.dry_run {
        vec![("dryRun".to_string(), "All".to_string())]
    } else {
        Vec::new()
    }
}

/// Type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created, or entered the selector.
    Added,
    /// Changed.
    Modified,
    /// Deleted, or left the selector.
    Deleted,
    /// Every later event has a higher resourceVersion.
    Bookmark,
    /// An in-stream `Status` (410 when the watch fell behind).
    Error,
}

impl EventType {
    fn parse(s: &str) -> Option<EventType> {
        Some(match s {
            "ADDED" => EventType::Added,
            "MODIFIED" => EventType::Modified,
            "DELETED" => EventType::Deleted,
            "BOOKMARK" => EventType::Bookmark,
            "ERROR" => EventType::Error,
            _ => return None,
        })
    }
}

/// One watch event.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    /// ADDED, MODIFIED, ...
    pub kind: EventType,
    /// The object (a `Status` for [`EventType::Error`]).
    pub object: Value,
}

impl WatchEvent {
    /// The object's `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        self.object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
    }
}

/// One NDJSON watch line. Deserialised into this (rather than a `Value` that the
/// object is then cloned out of) so the object is parsed once and moved, not copied.
#[derive(serde::Deserialize)]
pub(crate) struct WatchLine {
    #[serde(rename = "type", default)]
    pub(crate) ty: String,
    #[serde(default)]
    pub(crate) object: Value,
}

/// Incremental NDJSON decoder for watch streams: feed it chunks, get whole events.
#[derive(Debug, Default)]
pub struct NdjsonDecoder {
    buf: Vec<u8>,
}

impl NdjsonDecoder {
    /// Feeds a chunk; returns the events completed by it (one per non-empty line).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Result<WatchEvent, String>> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            if let Some(ev) = Self::decode_line(&line) {
                out.push(ev);
            }
        }
        out
    }

    /// Decodes what is left at the end of the stream (a last line without newline).
    pub fn finish(&mut self) -> Option<Result<WatchEvent, String>> {
        let rest = std::mem::take(&mut self.buf);
        Self::decode_line(&rest)
    }

    fn decode_line(line: &[u8]) -> Option<Result<WatchEvent, String>> {
        let text = std::str::from_utf8(line).ok()?.trim();
        if text.is_empty() {
            return None;
        }
        let WatchLine { ty, object } = match serde_json::from_str(text) {
            Ok(l) => l,
            Err(e) => return Some(Err(format!("bad watch event: {e}"))),
        };
        let Some(kind) = EventType::parse(&ty) else {
            return Some(Err(format!("unknown watch event type {ty:?}")));
        };
        Some(Ok(WatchEvent { kind, object }))
    }
}

type ByteStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Send>>;

/// A streamed response body.
pub struct ByteChunks {
    body: ByteStream,
}

impl ByteChunks {
    /// The next chunk; `None` at the end of the body.
    pub async fn next(&mut self) -> Option<Result<bytes::Bytes, ClientError>> {
        match self.body.next().await? {
            Ok(b) => Some(Ok(b)),
            Err(e) => Some(Err(ClientError::Other(format!(
                "the stream broke: {}",
                describe_transport_error(&e)
            )))),
        }
    }
}

/// An open watch.
pub struct WatchStream {
    url: String,
    body: ByteStream,
    decoder: NdjsonDecoder,
    pending: VecDeque<Result<WatchEvent, String>>,
}

impl WatchStream {
    /// The next event; `None` when the server closed the stream.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, ClientError>> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Some(ev.map_err(|reason| ClientError::Decode {
                    url: self.url.clone(),
                    reason,
                }));
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.pending.extend(self.decoder.push(&chunk)),
                Some(Err(e)) => {
                    return Some(Err(ClientError::Other(format!(
                        "watch stream broke: {}",
                        describe_transport_error(&e)
                    ))))
                }
                None => {
                    let last = self.decoder.finish()?;
                    self.pending.push_back(last);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndjson_split_across_chunks() {
        let mut d = NdjsonDecoder::default();
        let a = br#"{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}"#;
        let mut out = d.push(&a[..10]);
        assert!(out.is_empty());
        out = d.push(&a[10..]);
        assert!(out.is_empty());
        out = d.push(
            b"\n\n{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"9\"}}}\n",
        );
        assert_eq!(out.len(), 2);
        let e0 = out[0].clone().expect("event");
        assert_eq!(e0.kind, EventType::Added);
        assert_eq!(e0.resource_version(), Some("5"));
        let e1 = out[1].clone().expect("event");
        assert_eq!(e1.kind, EventType::Bookmark);
        assert!(d.finish().is_none());
    }

    #[test]
    fn ndjson_last_line_without_newline_and_garbage() {
        let mut d = NdjsonDecoder::default();
        assert_eq!(d.push(b"not json\n").len(), 1);
        assert!(d
            .push(b"{\"type\":\"ERROR\",\"object\":{\"code\":410}}")
            .is_empty());
        let last = d.finish().expect("some").expect("ok");
        assert_eq!(last.kind, EventType::Error);
    }

    #[test]
    fn status_parsing() {
        let v = serde_json::json!({"kind":"Status","status":"Failure","message":"bad","reason":"Invalid","code":422,
            "details":{"causes":[{"field":"spec.nodes","message":"must be >= 1"}]}});
        let s = ApiStatus::from_value(&v, 400).expect("status");
        assert_eq!(s.code, 422);
        assert_eq!(s.causes[0].render(), "spec.nodes: must be >= 1");
        assert!(ApiStatus::from_value(&serde_json::json!({"x":1}), 500).is_none());
    }
}
