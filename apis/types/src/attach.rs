//! `lattice attach`: a terminal (or a plain command) inside a running allocation.
//!
//! The client opens a WebSocket to the API server at
//! `GET /apis/lattice.dev/v1alpha1/namespaces/{tenant}/allocations/{name}/attach` (or the
//! seed's `/v1/allocations/{id}/attach`) with the query parameters `node`, `command`
//! (repeated: one per argument; none: the owner's login shell), `tty`, `stdin`, `rows`,
//! `cols` and `term`. The API server checks who may attach, writes a single-use
//! [`AttachTicket`] into the store (under [`TICKET_PREFIX`], on a lease of
//! [`TICKET_TTL_SECS`]), and opens a WebSocket to the node agent's
//! `/attach/{tenant}/{name}` with the ticket as its bearer token. The agent redeems the
//! ticket (`POST` [`REDEEM_PATH`] with its own token: the ticket is deleted as it is
//! read), starts the command as the allocation's user, in its cgroup, environment and
//! working directory, and the API server relays the frames between the two sockets.
//!
//! Every frame is a binary message whose first byte is its channel (the numbering of
//! Kubernetes' `channel.k8s.io` streams): [`STDIN`], [`STDOUT`], [`STDERR`], [`STATUS`]
//! (one JSON [`AttachStatus`] when the command ended, then a close), [`RESIZE`] (JSON
//! [`TerminalSize`]) and [`CLOSE`] (payload `[STDIN]`: end of input).

use serde::{Deserialize, Serialize};

/// The WebSocket subprotocol.
pub const PROTOCOL: &str = "v1.attach.lattice.dev";
/// Client → agent: input bytes.
pub const STDIN: u8 = 0;
/// Agent → client: output bytes (all output with a terminal).
pub const STDOUT: u8 = 1;
/// Agent → client: error output (without a terminal).
pub const STDERR: u8 = 2;
/// Agent → client: how the command ended ([`AttachStatus`]), the last frame.
pub const STATUS: u8 = 3;
/// Client → agent: the terminal's new size ([`TerminalSize`]).
pub const RESIZE: u8 = 4;
/// Client → agent: close a stream (payload: the channel, i.e. [`STDIN`]).
pub const CLOSE: u8 = 255;

/// Where the API server keeps tickets until an agent redeems them.
pub const TICKET_PREFIX: &str = "/lattice/attach-tickets/";
/// How long an unredeemed ticket lives.
pub const TICKET_TTL_SECS: i64 = 60;
/// The API route agents redeem tickets at.
pub const REDEEM_PATH: &str = "/v1/attach/redeem";

/// One frame: `channel` then `data`.
pub fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    v
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// How an attached command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachStatus {
    /// Its exit status, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it could not run or was stopped (the allocation ended, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl AttachStatus {
    /// The exit status a shell would report: the code, 128 + the signal, or 1 for an error.
    pub fn shell_code(&self) -> i32 {
        match (self.exit_code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 1,
        }
    }
}

/// What the API server allowed; the agent runs exactly this.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachTicket {
    /// Tenant.
    pub namespace: String,
    /// Allocation name.
    pub name: String,
    /// Allocation uid (a re-created allocation of the same name is not it).
    pub uid: String,
    /// The node to run on.
    pub node: String,
    /// Who attached (for the agent's log; the command runs as the allocation's user).
    pub user: String,
    /// Program and arguments; empty: the user's login shell.
    #[serde(default)]
    pub command: Vec<String>,
    /// Run it on a terminal.
    #[serde(default)]
    pub tty: bool,
    /// Forward input.
    #[serde(default)]
    pub stdin: bool,
}

/// `POST` [`REDEEM_PATH`] body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedeemRequest {
    /// The bearer token the agent was given.
    pub ticket: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_start_with_their_channel() {
        assert_eq!(frame(STDOUT, b"hi"), vec![1, b'h', b'i']);
        assert_eq!(frame(CLOSE, &[STDIN]), vec![255, 0]);
    }

    #[test]
    fn shell_codes() {
        let s = |c, sig| AttachStatus {
            exit_code: c,
            signal: sig,
            error: None,
        };
        assert_eq!(s(Some(3), None).shell_code(), 3);
        assert_eq!(s(None, Some(9)).shell_code(), 137);
        assert_eq!(s(None, None).shell_code(), 1);
    }
}
