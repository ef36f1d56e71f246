//! The two PMI wires a rank may speak on its `PMI_FD` socket.
//!
//! * PMI-1 "simple" (MPICH's built-in client): newline-ended lines of space-separated
//!   `key=value` words, the first `cmd=NAME`; e.g. `cmd=put kvsname=k key=a value=b`.
//! * PMI-2 (Slurm's libpmi2, Intel MPI): after a PMI-1 style
//!   `cmd=init pmi_version=2 pmi_subversion=0` line and its answer, every message is a
//!   6-digit decimal length followed by that many bytes of `;`-separated `key=value`
//!   pairs, e.g. `000036cmd=fullinit;pmirank=0;threaded=FALSE;`.
//!
//! A PMI-1 value ends at a space and is never escaped (MPICH hex-encodes its own); a
//! PMI-2 value ends at a single `;`, and `;;` stands for a `;` in it.

use std::collections::BTreeMap;

/// The longest PMI-1 line accepted (MPICH's client allows 1024 bytes; values that the
/// server hands out stay below [`VALLEN_MAX`]).
pub const MAX_LINE: usize = 4096;
/// The longest PMI-2 message accepted (its length prefix has 6 digits).
pub const MAX_MESSAGE: usize = 999_999;
/// `kvsname_max` announced to PMI-1 clients.
pub const KVSNAME_MAX: usize = 256;
/// `keylen_max` announced to PMI-1 clients.
pub const KEYLEN_MAX: usize = 64;
/// `vallen_max` announced to PMI-1 clients (as Slurm does; MPICH's client lowers it so
/// that its lines fit its 1024-byte buffer).
pub const VALLEN_MAX: usize = 1024;

/// One decoded message: its command and the other pairs, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// The `cmd` (or `mcmd`) value.
    pub cmd: String,
    /// The remaining `key=value` pairs (later duplicates win on lookup).
    pub args: BTreeMap<String, String>,
}

impl Message {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.args.get(key).map(String::as_str)
    }
}

/// Decode the pairs of one message, separated by `sep`.
fn decode(text: &str, sep: char) -> Result<Message, String> {
    let mut msg = Message::default();
    for word in text.split(sep).map(str::trim).filter(|w| !w.is_empty()) {
        let (k, v) = word
            .split_once('=')
            .ok_or_else(|| format!("malformed PMI pair {word:?} (expected key=value)"))?;
        if (k == "cmd" || k == "mcmd") && msg.cmd.is_empty() {
            msg.cmd = v.to_string();
            continue;
        }
        msg.args.insert(k.to_string(), v.to_string());
    }
    if msg.cmd.is_empty() {
        return Err(format!("PMI message without cmd: {:?}", truncate(text)));
    }
    Ok(msg)
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Decode a PMI-1 line (without its newline).
pub fn decode_v1(line: &str) -> Result<Message, String> {
    decode(line, ' ')
}

/// Decode the body of a PMI-2 message (after its length prefix): `key=value;` pairs,
/// `;;` a `;` inside a value.
pub fn decode_v2(body: &str) -> Result<Message, String> {
    let mut msg = Message::default();
    let mut chars = body.chars().peekable();
    loop {
        let mut key = String::new();
        loop {
            match chars.next() {
                Some('=') => break,
                Some(';') if key.trim().is_empty() => key.clear(),
                Some(c) => key.push(c),
                None if key.trim().is_empty() => {
                    if msg.cmd.is_empty() {
                        return Err(format!("PMI message without cmd: {:?}", truncate(body)));
                    }
                    return Ok(msg);
                }
                None => return Err(format!("malformed PMI pair {key:?} (expected key=value;)")),
            }
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                Some(';') if chars.peek() == Some(&';') => {
                    chars.next();
                    value.push(';');
                }
                Some(';') | None => break,
                Some(c) => value.push(c),
            }
        }
        let key = key.trim().to_string();
        if (key == "cmd" || key == "mcmd") && msg.cmd.is_empty() {
            msg.cmd = value;
        } else {
            msg.args.insert(key, value);
        }
    }
}

/// A PMI-1 answer line: `cmd=NAME k=v ...\n`.
pub fn encode_v1(cmd: &str, args: &[(&str, &str)]) -> Vec<u8> {
    let mut s = format!("cmd={cmd}");
    for (k, v) in args {
        s.push(' ');
        s.push_str(k);
        s.push('=');
        s.push_str(v);
    }
    s.push('\n');
    s.into_bytes()
}

/// A PMI-2 message: the 6-digit length, then `cmd=NAME;k=v;...;`.
pub fn encode_v2(cmd: &str, args: &[(&str, &str)]) -> Vec<u8> {
    let mut body = format!("cmd={cmd};");
    for (k, v) in args {
        body.push_str(k);
        body.push('=');
        body.push_str(&v.replace(';', ";;"));
        body.push(';');
    }
    let mut out = format!("{:06}", body.len()).into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_wires_round_trip() {
        let m = decode_v1("cmd=put kvsname=kvs_1 key=P0-businesscard value=description#x$port#1$")
            .unwrap();
        assert_eq!(m.cmd, "put");
        assert_eq!(m.get("key"), Some("P0-businesscard"));
        assert_eq!(m.get("value"), Some("description#x$port#1$"));
        let out = encode_v2(
            "kvs-get-response",
            &[("rc", "0"), ("found", "TRUE"), ("value", "a=b")],
        );
        let s = String::from_utf8(out).unwrap();
        assert_eq!(&s[..6], format!("{:06}", s.len() - 6));
        let m = decode_v2(&s[6..]).unwrap();
        assert_eq!(m.cmd, "kvs-get-response");
        assert_eq!(m.get("value"), Some("a=b"));
        // Slurm's libpmi2 as seen on the wire: `;;` is a `;` in a value.
        let m = decode_v2("cmd=kvs-put;key=k0;value=a;;b=c d;").unwrap();
        assert_eq!(m.get("value"), Some("a;b=c d"));
        let m = decode_v2("cmd=abort;isworld=TRUE;msg=bye;; now;").unwrap();
        assert_eq!(m.get("msg"), Some("bye; now"));
        let out = String::from_utf8(encode_v2("kvs-get-response", &[("value", "a;b")])).unwrap();
        assert!(out.ends_with("value=a;;b;"), "{out}");
        assert_eq!(decode_v2(&out[6..]).unwrap().get("value"), Some("a;b"));
        assert_eq!(
            encode_v1("get_result", &[("rc", "0"), ("value", "v")]),
            b"cmd=get_result rc=0 value=v\n"
        );
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        assert!(decode_v1("").is_err());
        assert!(decode_v1("put key=a").is_err());
        assert!(decode_v1("key=a value=b").is_err());
        assert!(decode_v2(";;;").is_err());
        assert!(decode_v2("key").is_err());
    }
}
