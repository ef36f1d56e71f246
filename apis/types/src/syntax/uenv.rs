//! uenv references (`environment.uenv`, `--uenv`): comma-separated
//! `NAME[/VERSION][:TAG]`, e.g. `prgenv-gnu/24.11:v1,tools/1.0`. Names, versions and tags
//! are letters, digits and `._+-`, up to 64 characters each.

/// The most images one allocation mounts (`uenv` and `toolsUenv` together).
pub const MAX_UENVS: usize = 8;

/// One reference: name, version, tag.
pub type Ref = (String, Option<String>, Option<String>);

fn part(what: &str, s: &str, whole: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{whole:?}: the {what} {s:?} must be 1 to 64 letters, digits or ._+-, starting with a letter or digit (e.g. prgenv-gnu/24.11:v1)"
        ))
    }
}

/// Parse a comma-separated list of references.
pub fn parse(spec: &str) -> Result<Vec<Ref>, String> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!(
                "{spec:?} has an empty entry; write NAME/VERSION:TAG[,...]"
            ));
        }
        let (rest, tag) = match item.split_once(':') {
            Some((r, t)) => (r, Some(part("tag", t, item)?)),
            None => (item, None),
        };
        let (name, version) = match rest.split_once('/') {
            Some((n, v)) => (n, Some(part("version", v, item)?)),
            None => (rest, None),
        };
        out.push((part("name", name, item)?, version, tag));
    }
    if out.len() > MAX_UENVS {
        return Err(format!(
            "{spec:?} names {} uenvs; at most {MAX_UENVS}",
            out.len()
        ));
    }
    Ok(out)
}

/// Check a view list (`VIEW` or `NAME:VIEW`, comma-separated).
pub fn check_views(views: &str) -> Result<(), String> {
    for v in views.split(',').map(str::trim) {
        let (u, name) = match v.split_once(':') {
            Some((u, n)) => (Some(u), n),
            None => (None, v),
        };
        if let Some(u) = u {
            part("uenv name", u, v)?;
        }
        part("view", name, v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_views() {
        assert_eq!(
            parse("prgenv-gnu/24.11:v1, tools").unwrap(),
            vec![
                ("prgenv-gnu".into(), Some("24.11".into()), Some("v1".into())),
                ("tools".into(), None, None)
            ]
        );
        assert_eq!(
            parse("a:b").unwrap(),
            vec![("a".into(), None, Some("b".into()))]
        );
        for bad in ["", "a,,b", "a/", "/x", "a:b:c", "a b", "../x", "a/b/c"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(check_views("default,prgenv-gnu:modules").is_ok());
        assert!(check_views("a:").is_err());
        assert!(check_views("x y").is_err());
    }
}
