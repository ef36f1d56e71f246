//! One module per kind.

pub mod allocation;
pub mod audit_policy;
pub mod dag;
pub mod event;
pub mod lease;
pub mod network_domain;
pub mod node;
pub mod rbac;
pub mod tenant;
pub mod topology;
pub mod vcluster;
