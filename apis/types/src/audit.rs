//! The audit log's records and how a log is verified: what the API server writes
//! (`lattice-apiserver`'s `audit` module), and what `lattice audit verify` checks, on the
//! server or on an exported file.
//!
//! Each API server keeps one chain: record `seq` carries `prev`, the `hash` of record
//! `seq - 1`, and its own `hash` = SHA-256(`prev` ‖ `\n` ‖ the record's canonical JSON
//! without `hash` and `sig`), signed with the server's Ed25519 key (`sig`, base64 of the
//! signature of the hash's 32 bytes; `keyId` names the key). Editing a record breaks its
//! hash (and the signature); removing or reordering records breaks `seq` and `prev`;
//! rewriting the chain from an edit onwards needs the server's private key.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How much of a request is recorded.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum Level {
    /// Nothing.
    None,
    /// Who, what, where, when, and how it ended.
    #[default]
    Metadata,
    /// ... and the request's body.
    Request,
    /// ... and the response's body.
    RequestResponse,
}

/// One audit record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Position in its server's chain, from 1.
    pub seq: u64,
    /// When (RFC 3339, UTC).
    pub time: String,
    /// The API server whose chain it is.
    pub server: String,
    /// `RequestReceived` (a sensitive record, committed before the action) or
    /// `ResponseComplete`.
    pub stage: String,
    /// The level it was recorded at.
    pub level: Level,
    /// The caller.
    pub user: String,
    /// The caller's groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Authenticated with an API token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub service_account: bool,
    /// get, list, watch, create, update, patch, delete, connect, ...
    pub verb: String,
    /// The resource (a kind's plural or a route's resource).
    pub resource: String,
    /// The subresource (`log`, `attach`, `status`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<String>,
    /// The tenant (namespace), when the request names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The object, when the request names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The request as sent: method and path.
    pub request_uri: String,
    /// The client's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The client's User-Agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// `allow` or `deny` (the authorizer's or admission's refusal).
    pub decision: String,
    /// The HTTP status of the answer (0 for a record made before the action).
    pub code: u16,
    /// Why it was refused or failed, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// About sensitive work (committed through the store before the action).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sensitive: bool,
    /// The request's body (level Request and above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    /// The response's body (level RequestResponse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    /// The previous record's hash (64 zeros before the first).
    pub prev: String,
    /// This record's hash.
    #[serde(default)]
    pub hash: String,
    /// Which key signed it.
    #[serde(default)]
    pub key_id: String,
    /// The signature of the hash.
    #[serde(default)]
    pub sig: String,
}

/// The `prev` of a chain's first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Record {
    /// The bytes the hash covers: the record without `hash`, `keyId` and `sig`.
    pub fn canonical(&self) -> Vec<u8> {
        let mut r = self.clone();
        r.hash.clear();
        r.key_id.clear();
        r.sig.clear();
        serde_json::to_vec(&r).unwrap_or_default()
    }

    /// SHA-256(`prev` ‖ `\n` ‖ canonical), hex.
    pub fn compute_hash(&self) -> String {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(self.prev.as_bytes());
        ctx.update(b"\n");
        ctx.update(&self.canonical());
        hex(ctx.finish().as_ref())
    }

    /// Sets `hash`, `keyId` and `sig`.
    pub fn seal(&mut self, key: &ring::signature::Ed25519KeyPair, key_id: &str) {
        self.hash = self.compute_hash();
        self.key_id = key_id.to_string();
        let raw = unhex(&self.hash).unwrap_or_default();
        self.sig = base64_encode(key.sign(&raw).as_ref());
    }
}

/// The id of a public key: the first 16 hex digits of its SHA-256.
pub fn key_id(public_key: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, public_key).as_ref())[..16].to_string()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 (padding optional); `None` if it is not.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = B64.iter().position(|x| *x == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Records read.
    pub records: u64,
    /// Per server: (first seq, last seq, last hash).
    pub chains: HashMap<String, (u64, u64, String)>,
    /// What is wrong, line by line (1-based); empty: the log is intact.
    pub problems: Vec<String>,
}

impl Report {
    /// Whether nothing is wrong.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Most problems reported (the rest are counted).
const MAX_PROBLEMS: usize = 100;

/// A server's public key, as the store publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// The server whose chain it signs.
    pub server: String,
    /// The raw Ed25519 public key.
    pub key: Vec<u8>,
}

/// Checks a log (lines of JSON records, as written or exported, possibly from several
/// servers' chains interleaved) against the servers' public keys (`keyId` → key; a record
/// must be signed by a key of its own server). A chain may start after 1 (older records
/// rotated away): its first record is taken as the start, and said so only if
/// `from_start` is asked.
pub fn verify<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    keys: &HashMap<String, PublicKey>,
    from_start: bool,
) -> Report {
    let mut report = Report::default();
    let mut more = 0usize;
    let mut problem = |report: &mut Report, line: usize, what: String| {
        if report.problems.len() < MAX_PROBLEMS {
            report.problems.push(format!("line {line}: {what}"));
        } else {
            more += 1;
        }
    };
    for (i, line) in lines.into_iter().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        report.records += 1;
        let r: Record = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(e) => {
                problem(&mut report, n, format!("not a record: {e}"));
                continue;
            }
        };
        let hash = r.compute_hash();
        if hash != r.hash {
            problem(
                &mut report,
                n,
                format!(
                    "record {} of {} was edited: its hash does not match its content",
                    r.seq, r.server
                ),
            );
        }
        match keys.get(&r.key_id) {
            None => problem(
                &mut report,
                n,
                format!(
                    "record {} is signed with key {:?}, which is not the server's",
                    r.seq, r.key_id
                ),
            ),
            Some(pk) if pk.server != r.server => problem(
                &mut report,
                n,
                format!(
                    "record {} of {} is signed with a key of {}, not its own server's",
                    r.seq, r.server, pk.server
                ),
            ),
            Some(pk) => {
                let good = unhex(&r.hash)
                    .zip(base64_decode(&r.sig))
                    .is_some_and(|(h, s)| {
                        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &pk.key)
                            .verify(&h, &s)
                            .is_ok()
                    });
                if !good {
                    problem(
                        &mut report,
                        n,
                        format!("record {}: the signature does not verify", r.seq),
                    );
                }
            }
        }
        match report.chains.get(&r.server).cloned() {
            None => {
                if from_start && (r.seq != 1 || r.prev != GENESIS) {
                    problem(
                        &mut report,
                        n,
                        format!(
                            "the chain of {} starts at record {}, not 1: records before it are missing",
                            r.server, r.seq
                        ),
                    );
                }
                report
                    .chains
                    .insert(r.server.clone(), (r.seq, r.seq, r.hash.clone()));
            }
            Some((first, last, last_hash)) => {
                if r.seq != last + 1 {
                    let what = if r.seq <= last {
                        format!(
                            "record {} comes after record {last}: records were reordered or repeated",
                            r.seq
                        )
                    } else {
                        format!(
                            "records {} to {} are missing (removed)",
                            last + 1,
                            r.seq - 1
                        )
                    };
                    problem(&mut report, n, what);
                } else if r.prev != last_hash {
                    problem(
                        &mut report,
                        n,
                        format!(
                            "record {} does not follow record {last}: its prev is not that record's hash",
                            r.seq
                        ),
                    );
                }
                report
                    .chains
                    .insert(r.server.clone(), (first, r.seq, r.hash.clone()));
            }
        }
    }
    if more > 0 {
        report
            .problems
            .push(format!("... and {more} more problems"));
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: u64) -> (Vec<String>, HashMap<String, PublicKey>) {
        use ring::signature::KeyPair;
        let rng = ring::rand::SystemRandom::new();
        let pk8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let key = ring::signature::Ed25519KeyPair::from_pkcs8(pk8.as_ref()).unwrap();
        let id = key_id(key.public_key().as_ref());
        let mut prev = GENESIS.to_string();
        let mut lines = Vec::new();
        for seq in 1..=n {
            let mut r = Record {
                seq,
                server: "s1".into(),
                user: "alice".into(),
                verb: "create".into(),
                resource: "allocations".into(),
                prev: prev.clone(),
                ..Default::default()
            };
            r.seal(&key, &id);
            prev = r.hash.clone();
            lines.push(serde_json::to_string(&r).unwrap());
        }
        let pk = PublicKey {
            server: "s1".into(),
            key: key.public_key().as_ref().to_vec(),
        };
        (lines, HashMap::from([(id, pk)]))
    }

    #[test]
    fn an_intact_chain_verifies_and_every_tampering_is_named() {
        let (lines, keys) = chain(5);
        let v = |ls: &[String]| verify(ls.iter().map(String::as_str), &keys, true);
        assert!(v(&lines).ok(), "{:?}", v(&lines).problems);
        // Edited.
        let mut edited = lines.clone();
        edited[2] = edited[2].replace("\"alice\"", "\"mallory\"");
        let r = v(&edited);
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains("line 3") && p.contains("edited")),
            "{:?}",
            r.problems
        );
        // Removed.
        let mut removed = lines.clone();
        removed.remove(1);
        let r = v(&removed);
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains("records 2 to 2 are missing")),
            "{:?}",
            r.problems
        );
        // Reordered.
        let mut reordered = lines.clone();
        reordered.swap(1, 2);
        assert!(v(&reordered)
            .problems
            .iter()
            .any(|p| p.contains("reordered")));
        // The first removed.
        assert!(v(&lines[1..])
            .problems
            .iter()
            .any(|p| p.contains("starts at record 2")));
        // Another key.
        let (_, other) = chain(1);
        assert!(!verify(lines.iter().map(String::as_str), &other, true).ok());
        // The right key, said to be another server's.
        let mut elsewhere = keys.clone();
        for k in elsewhere.values_mut() {
            k.server = "s2".into();
        }
        let r = verify(lines.iter().map(String::as_str), &elsewhere, true);
        assert!(
            r.problems
                .iter()
                .any(|p| p.contains("not its own server's")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn base64_round_trips() {
        for n in 0..70u8 {
            let b: Vec<u8> = (0..n).collect();
            assert_eq!(base64_decode(&base64_encode(&b)).unwrap(), b);
        }
        assert_eq!(
            base64_encode(b"any carnal pleas"),
            "YW55IGNhcm5hbCBwbGVhcw=="
        );
    }
}
