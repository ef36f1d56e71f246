//! The CLI's API client: `lattice-client`'s path-level REST client.

pub use lattice_client::rest::*;

/// Field manager used for server-side apply.
pub const DEFAULT_FIELD_MANAGER: &str = "lattice-cli";

/// The CLI's `User-Agent`.
pub const USER_AGENT: &str = concat!("lattice-cli/", env!("CARGO_PKG_VERSION"));
