//! How a node agent knows a request to its HTTP endpoint (`/logs/...`) comes from the API
//! server: the server signs each proxied request with a key shared by the control plane
//! and the agents, in the header [`HEADER`]: `<expires>.<hex HMAC-SHA256>` over the
//! method, the path and the expiry (Unix seconds, [`TTL_SECS`] ahead). The key lives in
//! the store under [`STORE_KEY`] (made once, by the first API server that needs it);
//! agents fetch it with their admin credentials from [`KEY_PATH`].

use ring::hmac;

/// The request header carrying the signature.
pub const HEADER: &str = "x-lattice-proxy";
/// How long a signature is good for.
pub const TTL_SECS: u64 = 60;
/// Clock difference tolerated between the API server and an agent.
pub const SKEW_SECS: u64 = 30;
/// Where the key is kept.
pub const STORE_KEY: &str = "/lattice/agent-proxy-key";
/// The API route agents read the key from (admin credentials).
pub const KEY_PATH: &str = "/v1/agent/proxy-key";

fn message(method: &str, path: &str, expires: u64) -> String {
    format!("{method}\n{path}\n{expires}")
}

/// The header value for `method path`, good until `expires` (Unix seconds).
pub fn sign(key: &[u8], method: &str, path: &str, expires: u64) -> String {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let tag = hmac::sign(&k, message(method, path, expires).as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{expires}.{hex}")
}

/// Check a header value for `method path` at `now` (Unix seconds).
pub fn verify(key: &[u8], value: &str, method: &str, path: &str, now: u64) -> Result<(), String> {
    let (expires, hex) = value
        .split_once('.')
        .ok_or_else(|| format!("malformed {HEADER} header"))?;
    let expires: u64 = expires
        .parse()
        .map_err(|_| format!("malformed {HEADER} header"))?;
    if expires + SKEW_SECS < now {
        return Err(format!(
            "the {HEADER} signature expired (or this node's clock is more than {SKEW_SECS} s ahead)"
        ));
    }
    if expires > now + 10 * TTL_SECS {
        return Err(format!("the {HEADER} signature is valid for too long"));
    }
    let tag = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| format!("malformed {HEADER} header"))?;
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::verify(&k, message(method, path, expires).as_bytes(), &tag)
        .map_err(|_| format!("the {HEADER} signature does not match"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_the_method_path_and_expiry() {
        let key = b"k".repeat(32);
        let h = sign(&key, "GET", "/logs/t/a", 1000);
        assert!(verify(&key, &h, "GET", "/logs/t/a", 990).is_ok());
        assert!(verify(&key, &h, "GET", "/logs/t/a", 1000 + SKEW_SECS).is_ok());
        assert!(verify(&key, &h, "GET", "/logs/t/a", 1001 + SKEW_SECS)
            .unwrap_err()
            .contains("expired"));
        assert!(verify(&key, &h, "GET", "/logs/t/b", 990).is_err());
        assert!(verify(&key, &h, "POST", "/logs/t/a", 990).is_err());
        assert!(verify(&b"x".repeat(32), &h, "GET", "/logs/t/a", 990).is_err());
        let forged = h.replacen("1000", "9000", 1);
        assert!(verify(&key, &forged, "GET", "/logs/t/a", 990).is_err());
        assert!(verify(&key, "nonsense", "GET", "/logs/t/a", 990).is_err());
        assert!(verify(&key, "1000.zz", "GET", "/logs/t/a", 990).is_err());
    }
}
