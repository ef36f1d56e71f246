//! # lattice-agent
//!
//! The Lattice node agent (the kubelet of Lattice). One runs per compute node (several
//! per machine in tests), each with its own node identity and state directory. It
//!
//! * registers the node ([`registration`]) with its hardware ([`discovery`]) and keeps
//!   a heartbeat stream open to the API server ([`heartbeat`]);
//! * runs the allocations bound to the node — only those its `Node`'s ownership names
//!   ([`binding`]), only as an allowed account ([`policy`]) — as process groups under a
//!   small shim ([`runtime`], [`shim`], [`supervisor`]), with the seed's environment
//!   ([`env`]) applied only after the drop to the user, in cgroups limited to the node's
//!   allocatable share ([`cgroup`]), with job files made through directory descriptors
//!   ([`files`]), enforcing walltime and stopping them when `lifecycle::should_run` says
//!   so;
//! * reports each run through `lifecycle::record_node_state` ([`reporter`]) — the
//!   contract of `docs/adr/002-allocation-execution.md`;
//! * captures, keeps and serves their logs ([`logs`], [`server`]);
//! * survives its own restarts without touching workloads ([`state`]).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use clap::Parser;
//! let cli = lattice_agent::config::Cli::parse_from([
//!     "lattice-agent", "--node-id", "n1", "--state-dir", "/var/lib/lattice",
//! ]);
//! let cfg = lattice_agent::config::Config::from_args(cli.agent)?;
//! lattice_agent::agent::run(cfg).await
//! # }
//! ```

#![warn(missing_docs)]

pub mod agent;
pub mod api;
pub mod attach;
pub mod binding;
pub mod cgroup;
pub mod config;
pub mod context;
pub mod credentials;
pub mod discovery;
pub mod dispatcher;
pub mod env;
pub mod files;
pub mod heartbeat;
pub mod identity;
pub mod logs;
pub mod metrics;
pub mod oci;
pub mod pmi;
pub mod pmix;
pub mod policy;
pub mod registration;
pub mod reporter;
pub mod runtime;
pub mod server;
pub mod shim;
pub mod state;
pub mod supervisor;
pub mod tasks;
pub mod topology;
pub mod uenv;
