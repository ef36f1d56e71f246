//! Errors of the client layer: a server's `Status` answer, or a transport failure.

use std::fmt;

/// A `Status` error returned by the API (the same for both transports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorResponse {
    /// HTTP status code: 404, 409, 410, 422, ...
    pub code: u16,
    /// Machine-readable reason: `NotFound`, `Conflict`, `AlreadyExists`, `Expired`, ...
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

impl fmt::Display for ErrorResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

/// Errors of [`Api`](crate::Api) calls.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The API answered with a `Status` error.
    #[error("api error: {0}")]
    Api(ErrorResponse),
    /// The request never got an answer (connection refused, reset, timeout, ...).
    #[error("transport error: {0}")]
    Transport(String),
    /// The answer was not the expected object.
    #[error("cannot decode {what}: {message}")]
    Decode {
        /// What was being decoded, e.g. `Allocation`.
        what: String,
        /// serde's message.
        message: String,
    },
    /// The request could not be built (e.g. a namespaced kind without a namespace).
    #[error("invalid request: {0}")]
    Request(String),
}

/// Result of client calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The API's status code, if the API answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Error::Api(r) => Some(r.code),
            _ => None,
        }
    }

    /// The API's reason, if the API answered.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Error::Api(r) => Some(&r.reason),
            _ => None,
        }
    }

    /// 404.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// 409 `Conflict`: a stale resourceVersion or a failed precondition.
    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409) && self.reason() != Some("AlreadyExists")
    }

    /// 409 `AlreadyExists`.
    pub fn is_already_exists(&self) -> bool {
        self.reason() == Some("AlreadyExists")
    }

    /// 410 `Expired`/`Gone`: the resourceVersion was compacted; relist.
    pub fn is_gone(&self) -> bool {
        self.code() == Some(410)
    }

    /// A JSON patch `test` operation failed (the guard of a guarded patch).
    pub fn is_patch_test_failed(&self) -> bool {
        matches!(self, Error::Api(r) if r.code == 422 && r.message.contains("patch"))
    }

    /// A [`Error::Decode`] of `what`.
    pub fn decode(what: &str, e: impl fmt::Display) -> Self {
        Error::Decode {
            what: what.to_string(),
            message: e.to_string(),
        }
    }
}
