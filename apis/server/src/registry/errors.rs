//! Kubernetes `Status` errors: every failure the API answers is one of these.

use lattice_store::StoreError;
use serde_json::{json, Value};

/// An API failure, rendered as a `meta.k8s.io/v1 Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", msg)
    }
    pub fn unauthorized(msg: impl Into<String>) -> Self {
        Self::new(401, "Unauthorized", msg)
    }
    pub fn forbidden(msg: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", msg)
    }
    pub fn not_found(kind: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{plural}.lattice.dev \"{name}\" not found"),
        )
        .with_details(
            json!({"name": name, "group": "lattice.dev", "kind": plural_or(kind, plural)}),
        )
    }
    pub fn path_not_found(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }
    pub fn already_exists(plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{plural}.lattice.dev \"{name}\" already exists"),
        )
        .with_details(json!({"name": name, "group": "lattice.dev", "kind": plural}))
    }
    pub fn conflict(plural: &str, name: &str, why: impl AsRef<str>) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {plural}.lattice.dev \"{name}\": {}",
                why.as_ref()
            ),
        )
        .with_details(json!({"name": name, "group": "lattice.dev", "kind": plural}))
    }
    pub fn stale(plural: &str, name: &str) -> Self {
        Self::conflict(
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub fn expired(msg: impl Into<String>) -> Self {
        Self::new(410, "Expired", msg)
    }
    /// 422 with `details.causes[{field, message, reason}]`.
    pub fn invalid(kind: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        let summary: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let causes: Vec<Value> = causes
            .into_iter()
            .map(|(field, message)| json!({"reason": "FieldValueInvalid", "field": field, "message": message}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!(
                "{kind}.lattice.dev \"{name}\" is invalid: {}",
                summary.join(", ")
            ),
        )
        .with_details(json!({"name": name, "group": "lattice.dev", "kind": kind, "causes": causes}))
    }
    pub fn method_not_allowed(msg: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", msg)
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }
    pub fn unsupported_media(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format: {ct}"),
        )
    }
    pub fn not_acceptable(msg: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(500, "InternalError", msg)
    }
    pub fn unavailable(msg: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", msg)
    }
    pub fn timeout(msg: impl Into<String>) -> Self {
        Self::new(504, "Timeout", msg)
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

fn plural_or<'a>(kind: &'a str, plural: &'a str) -> &'a str {
    if kind.is_empty() {
        plural
    } else {
        kind
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Compacted { compact_revision } => ApiError::expired(format!(
                "The resourceVersion for the provided list is too old (compacted at {compact_revision})."
            )),
            StoreError::FutureRevision { requested, current } => ApiError::timeout(format!(
                "Too large resource version: {requested}, current: {current}"
            )),
            StoreError::ValueTooLarge { .. } | StoreError::RequestTooLarge { .. } => {
                ApiError::new(413, "RequestEntityTooLarge", e.to_string())
            }
            StoreError::KeyTooLarge { .. } | StoreError::EmptyKey | StoreError::InvalidArgument(_) => {
                ApiError::bad_request(e.to_string())
            }
            StoreError::NoLeader(_) | StoreError::Stopped => ApiError::unavailable(e.to_string()),
            // The store's quota (its message names the quota and the fix).
            StoreError::NoSpace { .. } => ApiError::new(507, "InsufficientStorage", e.to_string()),
            _ => {
                tracing::error!(error = %e, "store error");
                ApiError::internal(e.to_string())
            }
        }
    }
}
