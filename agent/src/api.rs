//! Raw HTTP to the API server, for the routes the typed client does not cover (job
//! tokens, attach tickets, node reports, the heartbeat stream), with this node's
//! identity. Error answers decode as the typed client's do
//! ([`lattice_client::rest::ApiStatus`]).

use std::time::Duration;

use lattice_client::rest::ApiStatus;

/// Raw HTTP to the API server, for the routes the typed client does not cover (job
/// tokens, attach tickets, the heartbeat stream), with this node's identity.
#[derive(Debug, Clone)]
pub struct ApiHttp {
    base: String,
    tls: Option<rustls::ClientConfig>,
    /// The client (TLS with the node's certificate, when it has one).
    pub http: reqwest::Client,
}

impl ApiHttp {
    /// For the API at `base`, over `tls` when given.
    pub fn new(base: &str, tls: Option<rustls::ClientConfig>) -> anyhow::Result<Self> {
        let http = Self::builder_with(tls.clone())
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            tls,
            http,
        })
    }

    fn builder_with(tls: Option<rustls::ClientConfig>) -> reqwest::ClientBuilder {
        let b = reqwest::Client::builder();
        match tls {
            Some(t) => b.use_preconfigured_tls(t),
            None => b,
        }
    }

    /// A builder for a client of its own (the heartbeat stream's), with the same TLS.
    pub fn builder(&self) -> reqwest::ClientBuilder {
        Self::builder_with(self.tls.clone())
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// The message of an error answer with status `code` and body `body`: the API's
/// `Status` message (or reason), else the start of the text.
pub fn error_message(code: u16, body: &[u8]) -> String {
    ApiStatus::from_body(code, &String::from_utf8_lossy(body)).message_or_reason()
}
