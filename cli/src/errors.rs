//! Human error messages: what failed, why, and what to do about it.
//!
//! Every error the CLI prints has the shape
//!
//! ```text
//! Error: <what failed> — <why>
//!   <detail>
//!   Hint: <what to do>
//! ```
//!
//! (the seed's "Error Messages" layout). Exit codes are in [`exit`].

use std::fmt;

use crate::client::{ApiStatus, ClientError};

/// Process exit codes (documented in the README).
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// Any other error (also: `watch`/`--wait` saw the allocation end Failed or Cancelled).
    pub const ERROR: i32 = 1;
    /// Bad command line: unknown flag, missing or conflicting arguments.
    pub const USAGE: i32 = 2;
    /// The named allocation, node, DAG, tenant or vCluster does not exist.
    pub const NOT_FOUND: i32 = 3;
    /// Not authenticated (401) or not allowed (403).
    pub const DENIED: i32 = 4;
    /// The API server cannot be reached or did not answer in time.
    pub const UNREACHABLE: i32 = 5;
}

/// An error ready to be shown to a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    /// What failed ("get allocations", "cannot reach the Lattice API at ...").
    pub what: String,
    /// Why it failed.
    pub why: String,
    /// Extra lines (field causes, conflicting managers, known kinds).
    pub details: Vec<String>,
    /// What to do about it.
    pub hint: Option<String>,
    /// Process exit code.
    pub exit_code: i32,
}

impl CliError {
    pub fn new(what: impl Into<String>, why: impl Into<String>) -> Self {
        CliError {
            what: what.into(),
            why: why.into(),
            details: Vec::new(),
            hint: None,
            exit_code: 1,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn detail(mut self, line: impl Into<String>) -> Self {
        self.details.push(line.into());
        self
    }

    pub fn exit_code(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }

    /// Builds a human error out of a client error, `what` naming the action that failed.
    pub fn from_client(what: impl Into<String>, err: ClientError) -> Self {
        let what = what.into();
        match err {
            ClientError::Connect { url, reason } => {
                CliError::new(format!("cannot reach the Lattice API at {url}"), reason)
                    .hint(
                        "start a server with `lattice-server --dev` (or `lattice up`) or set \
                         LATTICE_API_URL (or --api-url) to the address of a running one",
                    )
                    .exit_code(exit::UNREACHABLE)
            }
            ClientError::Timeout { url } => CliError::new(
                what,
                format!("the Lattice API at {url} did not answer in time"),
            )
            .hint("check that the server is healthy and retry")
            .exit_code(exit::UNREACHABLE),
            ClientError::Decode { url, reason } => CliError::new(
                what,
                format!("the answer from {url} could not be read: {reason}"),
            )
            .hint("check that --api-url points at a Lattice API server (not another service)"),
            ClientError::Status { status, .. } => from_status(what, &status),
            ClientError::Other(reason) => CliError::new(what, reason),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.why.is_empty() {
            write!(f, "Error: {}", self.what)?;
        } else {
            write!(f, "Error: {} — {}", self.what, self.why)?;
        }
        for line in &self.details {
            write!(f, "\n  {line}")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "\n  Hint: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CliError {}

/// Generic mapping of an API `Status` to a human error.
pub fn from_status(what: String, st: &ApiStatus) -> CliError {
    let msg = st.message_or_reason();
    match st.code {
        401 => CliError::new(what, format!("not authenticated (401 Unauthorized): {msg}")).hint(
            "set LATTICE_TOKEN (or --token / --token-file, or `lattice config set-token`) to a \
             valid token; a dev server writes its admin token to `admin.token` in its data directory",
        )
        .exit_code(exit::DENIED),
        403 => CliError::new(what, format!("permission denied (403 Forbidden): {msg}"))
            .hint("ask your tenant or system administrator for a role that allows this")
            .exit_code(exit::DENIED),
        404 => CliError::new(what, format!("not found (404): {msg}"))
            .hint("check the name and tenant (-t); `lattice get KIND` lists what exists")
            .exit_code(exit::NOT_FOUND),
        409 if st.reason == "AlreadyExists" => {
            CliError::new(what, format!("already exists (409): {msg}"))
                .hint("use `lattice apply -f` to update an existing object")
        }
        409 => {
            let mut e = CliError::new(what, format!("conflict (409): {msg}"));
            for c in &st.causes {
                e = e.detail(c.render());
            }
            e.hint("the object changed underneath you; fetch it again and retry")
        }
        410 => CliError::new(what, format!("resource version expired (410 Gone): {msg}"))
            .hint("retry; the client relists automatically where it can"),
        422 => {
            let mut e = CliError::new(what, format!("the object is invalid (422): {msg}"));
            for c in &st.causes {
                e = e.detail(c.render());
            }
            e.hint("fix the fields listed above in your manifest and apply again")
        }
        400 => {
            let mut e = CliError::new(what, format!("bad request (400): {msg}"));
            for c in &st.causes {
                e = e.detail(c.render());
            }
            e.hint("check the flags and selectors you passed; `lattice <command> --help` shows the syntax")
        }
        429 => CliError::new(what, format!("too many requests (429): {msg}"))
            .hint("the server is rate-limiting this client; wait a moment and retry"),
        c if c >= 500 => CliError::new(what, format!("the server failed ({c}): {msg}"))
            .hint("retry; if it persists, check the lattice-server logs"),
        c => CliError::new(what, format!("request failed ({c}): {msg}")),
    }
}
