//! # lattice-client
//!
//! The client of the Lattice API, for every program that talks to it: the CLI, node
//! agents, the controller runtime and site controllers. It depends on `lattice-apis`
//! only; nothing that links it links the server or the store.
//!
//! | module | what |
//! |---|---|
//! | [`client`] | the [`Transport`] trait (the verbs over JSON), [`HttpTransport`], [`Client`], request parameters |
//! | [`api`] | [`Api<K>`]: typed get, list, watch, create, replace, patch, delete |
//! | [`error`] | [`Error`]: a `Status` answer of the API, or a transport failure |
//! | [`resource`] | [`ResourceExt`], [`ObjectRef`], owner references |
//! | [`rest`] | the path-level client: any route by its path, `Status` causes, paginated lists, streamed bodies, WebSocket upgrades, NDJSON watches (what the CLI uses) |
//!
//! The API server offers a second transport, `lattice_apiserver::in_process`, for the
//! controllers built into `lattice-server`: the same verbs as function calls.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lattice_client::Error> {
//! use lattice_apis::Allocation;
//! use lattice_client::{Api, Client, ListParams};
//!
//! let client = Client::http("https://lattice.example.org:8443", Some("TOKEN".into()))?;
//! let api: Api<Allocation> = Api::namespaced(client, "ml-team");
//! for a in api.list(&ListParams::default()).await?.items {
//!     println!("{}", a.metadata.name.unwrap_or_default());
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod api;
pub mod client;
pub mod error;
pub mod resource;
pub mod rest;

pub use api::{Api, DeleteResult, ObjectList, WatchEvent};
pub use client::{
    Client, DeleteParams, HttpTransport, ListParams, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy, RawWatchEvent, RawWatchStream, StoredEvent, StoredEventType, Transport,
    WatchParams,
};
pub use error::{Error, ErrorResponse, Result};
pub use lattice_apis::Resource;
pub use resource::{ObjectRef, ResourceExt};
