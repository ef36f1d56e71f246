//! `lattice-server` flags of the API server's flood limits: per-identity request rates,
//! requests in flight and sessions (`lattice_apiserver::limits`), and per-tenant
//! object-count quotas (`lattice_apiserver::quota`). `docs/security.md` ("Limits and
//! floods") lists them with their defaults. 0 turns a limit off.

use lattice_apiserver::limits::{ClassLimits, IdentityLimits};
use lattice_apiserver::quota::ObjectQuotas;

const D: IdentityLimits = IdentityLimits::DEFAULT;
const Q: ObjectQuotas = ObjectQuotas::DEFAULT;

#[derive(clap::Args, Debug, Clone)]
pub struct ApiLimitArgs {
    /// Requests per second each user (roles user and readonly) may make, sustained (a
    /// token bucket per identity; 429 with Retry-After past it).
    #[arg(long, default_value_t = D.users.requests_per_second, env = "LATTICE_USER_QPS")]
    user_qps: u32,
    /// Requests a user may make at once after a quiet spell (the bucket's size).
    #[arg(long, default_value_t = D.users.burst, env = "LATTICE_USER_BURST")]
    user_burst: u32,
    /// Requests of one user being served at once (watches, log streams and attach apart).
    #[arg(long, default_value_t = D.users.max_in_flight, env = "LATTICE_USER_MAX_IN_FLIGHT")]
    user_max_in_flight: u32,
    /// Watches one user may hold open.
    #[arg(long, default_value_t = D.users.max_watches, env = "LATTICE_USER_MAX_WATCHES")]
    user_max_watches: u32,
    /// Requests per second each administrator may make, sustained.
    #[arg(long, default_value_t = D.admins.requests_per_second, env = "LATTICE_ADMIN_QPS")]
    admin_qps: u32,
    /// An administrator's bucket size.
    #[arg(long, default_value_t = D.admins.burst, env = "LATTICE_ADMIN_BURST")]
    admin_burst: u32,
    /// Requests of one administrator being served at once.
    #[arg(long, default_value_t = D.admins.max_in_flight, env = "LATTICE_ADMIN_MAX_IN_FLIGHT")]
    admin_max_in_flight: u32,
    /// Watches one administrator may hold open.
    #[arg(long, default_value_t = D.admins.max_watches, env = "LATTICE_ADMIN_MAX_WATCHES")]
    admin_max_watches: u32,
    /// Requests per second each node agent may make, sustained (heartbeat streams are
    /// never limited).
    #[arg(long, default_value_t = D.nodes.requests_per_second, env = "LATTICE_NODE_QPS")]
    node_qps: u32,
    /// A node agent's bucket size.
    #[arg(long, default_value_t = D.nodes.burst, env = "LATTICE_NODE_BURST")]
    node_burst: u32,
    /// Requests of one node agent being served at once.
    #[arg(long, default_value_t = D.nodes.max_in_flight, env = "LATTICE_NODE_MAX_IN_FLIGHT")]
    node_max_in_flight: u32,
    /// Watches one node agent may hold open.
    #[arg(long, default_value_t = D.nodes.max_watches, env = "LATTICE_NODE_MAX_WATCHES")]
    node_max_watches: u32,
    /// Attach sessions one identity may hold open (the seed's 5).
    #[arg(long, default_value_t = D.max_attach_sessions, env = "LATTICE_MAX_ATTACH_SESSIONS")]
    max_attach_sessions: u32,
    /// Log streams one identity may hold open (the seed's 10).
    #[arg(long, default_value_t = D.max_log_streams, env = "LATTICE_MAX_LOG_STREAMS")]
    max_log_streams: u32,
    /// Allocations one tenant may hold (a Tenant's spec.objectQuotas.allocations
    /// overrides it).
    #[arg(long, default_value_t = Q.allocations, env = "LATTICE_TENANT_MAX_ALLOCATIONS")]
    tenant_max_allocations: u64,
    /// DAGs one tenant may hold.
    #[arg(long, default_value_t = Q.dags, env = "LATTICE_TENANT_MAX_DAGS")]
    tenant_max_dags: u64,
    /// Events one tenant may hold.
    #[arg(long, default_value_t = Q.events, env = "LATTICE_TENANT_MAX_EVENTS")]
    tenant_max_events: u64,
    /// Leases one tenant may hold.
    #[arg(long, default_value_t = Q.leases, env = "LATTICE_TENANT_MAX_LEASES")]
    tenant_max_leases: u64,
    /// vClusters one tenant may hold.
    #[arg(long, default_value_t = Q.vclusters, env = "LATTICE_TENANT_MAX_VCLUSTERS")]
    tenant_max_vclusters: u64,
    /// Network domains one tenant may hold (objects; maxNetworkDomains bounds their VNIs).
    #[arg(long, default_value_t = Q.network_domains, env = "LATTICE_TENANT_MAX_NETWORK_DOMAINS")]
    tenant_max_network_domains: u64,
}

impl ApiLimitArgs {
    /// The per-identity limits.
    pub fn identity_limits(&self) -> IdentityLimits {
        let class = |rps, burst, in_flight, watches| ClassLimits {
            requests_per_second: rps,
            burst,
            max_in_flight: in_flight,
            max_watches: watches,
        };
        IdentityLimits {
            users: class(
                self.user_qps,
                self.user_burst,
                self.user_max_in_flight,
                self.user_max_watches,
            ),
            admins: class(
                self.admin_qps,
                self.admin_burst,
                self.admin_max_in_flight,
                self.admin_max_watches,
            ),
            nodes: class(
                self.node_qps,
                self.node_burst,
                self.node_max_in_flight,
                self.node_max_watches,
            ),
            max_attach_sessions: self.max_attach_sessions,
            max_log_streams: self.max_log_streams,
        }
    }

    /// The per-tenant object-count quotas.
    pub fn object_quotas(&self) -> ObjectQuotas {
        ObjectQuotas {
            allocations: self.tenant_max_allocations,
            dags: self.tenant_max_dags,
            events: self.tenant_max_events,
            leases: self.tenant_max_leases,
            vclusters: self.tenant_max_vclusters,
            network_domains: self.tenant_max_network_domains,
        }
    }
}
