//! OCI image references (`environment.image`, `--image`), as Docker and the OCI
//! distribution specification write them: `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]`,
//! e.g. `ubuntu:24.04`, `ghcr.io/acme/train:v3`,
//! `localhost:5000/tools@sha256:0123…`.
//!
//! The first component is a registry when it has a `.` or a `:` or is `localhost`;
//! otherwise the registry is Docker Hub (`docker.io`, repository `library/NAME` for a
//! one-component name). Repository components are lowercase letters and digits joined by
//! `.`, `_`, `__` or dashes; a tag is up to 128 letters, digits, `_`, `.` and `-`, not
//! starting with `.` or `-`; a digest is `sha256:` and 64 lowercase hex digits.

/// Docker Hub, where a reference without a registry points.
pub const DOCKER_HUB: &str = "docker.io";

/// A parsed reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `host[:port]`.
    pub registry: String,
    /// `a/b/c`.
    pub repository: String,
    /// The tag, when given (`latest` when neither tag nor digest is).
    pub tag: Option<String>,
    /// `sha256:…`, when given; it wins over the tag.
    pub digest: Option<String>,
}

impl ImageRef {
    /// What to ask the registry for: the digest, else the tag, else `latest`.
    pub fn reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

const EXAMPLE: &str = "e.g. ghcr.io/acme/train:v3 or ubuntu:24.04";

fn component_ok(c: &str) -> bool {
    // [a-z0-9]+ ((\.|_|__|-+) [a-z0-9]+)*
    let b = c.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let x = b[i];
        if x.is_ascii_lowercase() || x.is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !(b[i].is_ascii_lowercase() || b[i].is_ascii_digit()) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|s| s == b'-');
        if !ok {
            return false;
        }
    }
    true
}

fn registry_ok(r: &str) -> bool {
    let (host, port) = match r.rsplit_once(':') {
        Some((h, p)) if !h.contains(']') || h.ends_with(']') => (h, Some(p)),
        _ => (r, None),
    };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    };
    host_ok && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|n| n > 0))
}

/// Parse one reference.
pub fn parse(s: &str) -> Result<ImageRef, String> {
    if s.is_empty() || s.len() > 512 {
        return Err(format!(
            "the image reference must be 1 to 512 characters ({EXAMPLE})"
        ));
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => {
            let hex = d
                .strip_prefix("sha256:")
                .ok_or_else(|| format!("{s:?}: the digest {d:?} must be sha256:<64 hex digits>"))?;
            if hex.len() != 64
                || !hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(format!(
                    "{s:?}: the digest {d:?} must be sha256: followed by 64 lowercase hex digits"
                ));
            }
            (r, Some(d.to_string()))
        }
        None => (s, None),
    };
    // A tag follows the last ':' after the last '/' (a ':' before it is a port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => {
            let t = &rest[last_slash + i + 1..];
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.as_bytes()[0] != b'.'
                && t.as_bytes()[0] != b'-'
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
            if !ok {
                return Err(format!(
                    "{s:?}: the tag {t:?} must be 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
                ));
            }
            (&rest[..last_slash + i], Some(t.to_string()))
        }
        None => (rest, None),
    };
    let mut parts: Vec<&str> = name.split('/').collect();
    let first = parts[0];
    let registry = if parts.len() > 1
        && (first.contains('.') || first.contains(':') || first == "localhost")
    {
        if !registry_ok(first) {
            return Err(format!(
                "{s:?}: the registry {first:?} must be a host name or address with an optional port ({EXAMPLE})"
            ));
        }
        parts.remove(0);
        first.to_string()
    } else {
        DOCKER_HUB.to_string()
    };
    if let Some(bad) = parts.iter().find(|c| !component_ok(c)) {
        return Err(format!(
            "{s:?}: the repository component {bad:?} must be lowercase letters and digits, joined by '.', '_', '__' or '-' ({EXAMPLE})"
        ));
    }
    let mut repository = parts.join("/");
    if registry == DOCKER_HUB && parts.len() == 1 {
        repository = format!("library/{repository}");
    }
    if repository.len() > 255 {
        return Err(format!(
            "{s:?}: the repository name is longer than 255 characters"
        ));
    }
    Ok(ImageRef {
        registry,
        repository,
        tag,
        digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> (String, String, Option<String>, Option<String>) {
        let r = parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        (r.registry, r.repository, r.tag, r.digest)
    }

    #[test]
    fn references_as_docker_reads_them() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            p("ubuntu"),
            ("docker.io".into(), "library/ubuntu".into(), None, None)
        );
        assert_eq!(
            p("ubuntu:24.04"),
            (
                "docker.io".into(),
                "library/ubuntu".into(),
                Some("24.04".into()),
                None
            )
        );
        assert_eq!(
            p("acme/train:v3"),
            (
                "docker.io".into(),
                "acme/train".into(),
                Some("v3".into()),
                None
            )
        );
        assert_eq!(
            p("localhost:5000/a/b_c__d.e-f"),
            ("localhost:5000".into(), "a/b_c__d.e-f".into(), None, None)
        );
        assert_eq!(
            p(&format!("ghcr.io/x/y:t@{d}")),
            (
                "ghcr.io".into(),
                "x/y".into(),
                Some("t".into()),
                Some(d.clone())
            )
        );
        assert_eq!(
            p("[::1]:5000/x"),
            ("[::1]:5000".into(), "x".into(), None, None)
        );
        assert_eq!(
            parse(&format!("x@{d}")).map(|r| r.reference().to_string()),
            Ok(d)
        );
        assert_eq!(
            parse("x").map(|r| r.reference().to_string()),
            Ok("latest".into())
        );
        assert_eq!(
            parse("localhost/x:1").map(|r| r.to_string()),
            Ok("localhost/x:1".into())
        );
    }

    #[test]
    fn malformed_references_are_refused_naming_the_part() {
        for (bad, part) in [
            ("", "1 to 512"),
            ("Ubuntu", "component \"Ubuntu\""),
            ("a//b", "component \"\""),
            ("a/-b", "component \"-b\""),
            ("a:", "tag \"\""),
            ("a:.x", "tag \".x\""),
            ("a@sha256:zz", "digest"),
            ("a@md5:00", "digest"),
            ("reg.io:99999/a", "registry"),
            ("a..b", "component"),
            ("a/b/../c", "component \"..\""),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains(part), "{bad}: {e}");
        }
    }
}
