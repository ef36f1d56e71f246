//! How a node's agent gets and keeps its identity, a `node:<name>` client certificate from
//! the cluster CA (the kubelet's TLS bootstrap, see `docs/security.md`):
//!
//! 1. an administrator creates a bootstrap token (`lattice admin node bootstrap-token
//!    [--node NAME] [--ttl 1h]`): single use, expiring, optionally bound to one node name;
//! 2. the agent makes a key pair and a CSR, and sends it with the token to
//!    [`BOOTSTRAP_PATH`] (`Authorization: Bearer <token>`); the server spends the token and
//!    answers with a certificate for `node:<name>` ([`CertificateResponse`]);
//! 3. from then on the agent authenticates with that certificate, and renews it at two
//!    thirds of its lifetime at [`RENEW_PATH`] (authenticated by the certificate itself);
//! 4. an administrator can revoke every certificate of a node (`lattice admin node revoke
//!    NAME`, [`revoke_path`]): the node is refused at once on every API server and needs a
//!    new bootstrap token.

use serde::{Deserialize, Serialize};

/// `POST`: a certificate for a CSR, against a bootstrap token.
pub const BOOTSTRAP_PATH: &str = "/v1/nodes/certificate";
/// `POST`: a renewed certificate, for a node authenticated by its current one.
pub const RENEW_PATH: &str = "/v1/nodes/certificate/renew";
/// `POST` (create), `GET` (list): bootstrap tokens (administrators).
pub const BOOTSTRAP_TOKENS_PATH: &str = "/v1/admin/bootstrap-tokens";
/// Default lifetime of a bootstrap token.
pub const DEFAULT_TOKEN_TTL_SECS: u64 = 3600;
/// Longest lifetime of a bootstrap token.
pub const MAX_TOKEN_TTL_SECS: u64 = 7 * 24 * 3600;

/// `POST`: revoke every certificate of node `name` (administrators).
pub fn revoke_path(name: &str) -> String {
    format!("/v1/admin/nodes/{name}/revoke")
}

/// `DELETE`: a bootstrap token by its id.
pub fn bootstrap_token_path(id: &str) -> String {
    format!("{BOOTSTRAP_TOKENS_PATH}/{id}")
}

/// The body of a bootstrap or renewal request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateRequest {
    /// The node's name (bootstrap only; a renewal is for the node of the certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A PEM `CERTIFICATE REQUEST` signed by the key the certificate is for. Only its
    /// public key is used: the server decides everything else.
    pub csr: String,
}

/// The answer: the certificate and the CA to trust.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateResponse {
    /// PEM certificate for `node:<name>`.
    pub certificate: String,
    /// PEM certificate of the cluster CA.
    pub ca: String,
    /// When the certificate expires (RFC 3339).
    pub not_after: String,
}

/// The body of a bootstrap token request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapTokenRequest {
    /// The only node name the token may enroll; any name not yet enrolled when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Lifetime in seconds (default [`DEFAULT_TOKEN_TTL_SECS`], at most
    /// [`MAX_TOKEN_TTL_SECS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// Free text for the list (who or what the token is for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A bootstrap token as listed (the secret is shown once, at creation, in `token`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapToken {
    /// Public part (`<id>.<secret>` is the token).
    pub id: String,
    /// The whole token; only in the answer to its creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The node it is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// When it expires (RFC 3339).
    pub expires: String,
    /// Who made it.
    pub created_by: String,
    /// What it is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `<id>.<secret>`: 6 and 16 characters of `[a-z0-9]`, as kubeadm's tokens.
pub fn parse_bootstrap_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.trim().split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_one_shape() {
        assert_eq!(
            parse_bootstrap_token("abc123.0123456789abcdef"),
            Some(("abc123", "0123456789abcdef"))
        );
        for bad in [
            "",
            "abc123",
            "abc12.0123456789abcdef",
            "ABC123.0123456789abcdef",
            "abc123.0123456789abcde",
            "abc123.0123456789abcdef.x",
            "abc123.0123456789abcde/",
        ] {
            assert_eq!(parse_bootstrap_token(bad), None, "{bad}");
        }
    }
}
