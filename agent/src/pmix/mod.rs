//! PMIx for OpenMPI (`spec.launch.mpi: pmix`): a sidecar PMIx server per job step and
//! node, built on OpenPMIx's server library (cargo feature `pmix`).
//!
//! The agent starts `lattice-agent pmix-server` for the step as the job's user, in the
//! run's cgroups, with one end of a socket pair on descriptor 3 ([`host`]). Over it:
//!
//! * the agent sends the step's layout ([`Job`], frame `J`);
//! * the sidecar registers the namespace and this node's ranks with the library and
//!   answers with each rank's environment (`PMIX_NAMESPACE`, `PMIX_RANK`, the server's
//!   URI, ..., frame `E`), which the agent gives the tasks;
//! * at each fence the library hands the sidecar this node's contribution, which goes
//!   to the agent (frame `F`); the agent exchanges it with the step's other nodes through
//!   the same gRPC tree as the PMI-2 fence and sends every node's contributions back,
//!   concatenated in node order (frame `R`, or `X` when the fence failed);
//! * a rank's `PMIx_Abort` becomes frame `A`, which stops the step on every node like an
//!   `MPI_Abort` under PMI-2.
//!
//! A frame is a kind byte, a big-endian `u32` length and the payload. The sidecar ends
//! when the agent closes its end (the step is over).

#[cfg(feature = "pmix")]
mod ffi;
pub mod host;
#[cfg(feature = "pmix")]
pub mod sidecar;

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

/// The most one frame may carry (a fence's contributions from every node).
pub const MAX_FRAME: usize = 64 << 20;
/// The most one node's fence contribution may be, per local rank.
pub const MAX_CONTRIBUTION_PER_RANK: usize = 64 << 10;

/// What the sidecar needs to know of the step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Job {
    /// The PMIx namespace (the step's job id).
    pub nspace: String,
    /// The step's nodes, in order (host names as the ranks see them).
    pub nodes: Vec<String>,
    /// This node's index in `nodes`.
    pub node_index: u32,
    /// The ranks on each node, in local order.
    pub ranks: Vec<Vec<u32>>,
    /// The user the ranks run as.
    pub uid: u32,
    /// ... and their group.
    pub gid: u32,
    /// The server's rendezvous directory (the user's own).
    pub tmpdir: String,
}

impl Job {
    /// Ranks in all.
    pub fn size(&self) -> u32 {
        self.ranks.iter().map(|r| r.len() as u32).sum()
    }
}

/// The rank that aborted, with its status and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Aborted {
    /// Rank (`u32::MAX`: unknown).
    pub rank: u32,
    /// Its status.
    pub status: i32,
    /// What it said.
    pub message: String,
    /// It went away without finalizing (no abort call).
    #[serde(default)]
    pub lost: bool,
}

/// Write one frame.
pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a {}-byte frame; at most {MAX_FRAME}",
            payload.len()
        )));
    }
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    w.write_all(&head)?;
    w.write_all(payload)?;
    w.flush()
}

/// Read one frame (`None` at the end of the stream).
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a {len}-byte frame; at most {MAX_FRAME}"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((head[0], payload)))
}

/// `PMIx_generate_ppn`'s input: each node's ranks, `;` between nodes.
pub fn ppn(ranks: &[Vec<u32>]) -> String {
    ranks
        .iter()
        .map(|r| r.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
        .collect::<Vec<_>>()
        .join(";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_are_bounded() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b'F', b"abc").unwrap();
        write_frame(&mut buf, b'R', b"").unwrap();
        let mut r = buf.as_slice();
        assert_eq!(read_frame(&mut r).unwrap(), Some((b'F', b"abc".to_vec())));
        assert_eq!(read_frame(&mut r).unwrap(), Some((b'R', Vec::new())));
        assert_eq!(read_frame(&mut r).unwrap(), None);
        let huge = [b'F', 0xff, 0xff, 0xff, 0xff];
        assert!(read_frame(&mut huge.as_slice()).is_err());
        // A frame cut short is an error, not an end.
        assert!(read_frame(&mut [b'F', 0, 0, 0, 9, 1].as_slice()).is_err());
    }

    #[test]
    fn the_process_map_lists_each_nodes_ranks() {
        assert_eq!(ppn(&[vec![0, 2], vec![1, 3]]), "0,2;1,3");
        assert_eq!(ppn(&[vec![0, 1, 2]]), "0,1,2");
    }
}
