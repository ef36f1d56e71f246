//! `lattice-store`: an MVCC key-value store with etcd semantics.
//!
//! * [`types`]: etcd-shaped requests and responses.
//! * [`KvBackend`]: the trait the rest of Lattice programs against.
//! * [`mvcc`]: the deterministic in-memory engine (revisions, history, compaction).
//! * [`persist`]: durability on redb, checksummed records, backup and restore.
//! * [`EmbeddedStore`]: the engine made durable, with group commit, watches and leases.
//! * [`raft`]: Raft replication (openraft) — [`raft::RaftStore`], a replicated `KvBackend`.
//!
//! ```no_run
//! # async fn demo() -> lattice_store::StoreResult<()> {
//! use lattice_store::{EmbeddedStore, KvBackend, PutRequest, RangeRequest, StoreConfig};
//! let store = EmbeddedStore::open("/tmp/lattice-demo", StoreConfig::default()).await?;
//! store.put(PutRequest::new("/registry/a", "1")).await?;
//! let got = store.range(RangeRequest::prefix("/registry/")).await?;
//! assert_eq!(got.count, 1);
//! # Ok(()) }
//! ```

pub mod backend;
pub mod embedded;
pub mod error;
pub mod etcd_backend;
pub mod grpc;
pub mod metrics;
pub mod mvcc;
pub mod persist;
pub mod quota;
pub mod raft;
pub mod tls;
pub mod types;
pub mod wal;
pub mod watch;

pub use backend::{KvBackend, WatchStream, WithFaults};
pub use embedded::{EmbeddedStore, StoreConfig};
pub use error::{StoreError, StoreResult};
pub use metrics::{RaftMetrics, StoreMetrics};
pub use mvcc::Limits;
pub use persist::Backup;
pub use types::*;
