//! `spec.extenders`: scheduler extenders, HTTP services the built-in scheduler asks once
//! per cycle (the wire format is [`crate::extender`]).
//!
//! Only cluster administrators set or change them (the API server's admission refuses
//! anyone else, tenant admins included); the scheduler sends them no secrets (see
//! [`crate::extender`] for what it sends).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::parse_duration;
use crate::validation::{validate_dns1123_name, Errors};

/// Longest `timeout` accepted: a cycle waits for its extenders.
pub const MAX_EXTENDER_TIMEOUT_S: u64 = 30;
/// Default `timeout`.
pub const DEFAULT_EXTENDER_TIMEOUT: &str = "2s";

/// One scheduler extender.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Extender {
    /// Names the extender in pending reasons, metrics and logs (a DNS-1123 label).
    #[serde(default)]
    pub name: String,
    /// `http://` or `https://` URL the scheduler POSTs each cycle's request to.
    #[serde(default)]
    pub url: String,
    /// Ask it which nodes this vCluster's jobs may use (nodes it leaves out are not used
    /// this cycle).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub filter: bool,
    /// Ask it for a score per job, in [0, 1], added to `Score(j)` with `weight`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub score: bool,
    /// Weight of its score, 0–1 (with `score: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// How long a cycle waits for it, e.g. `500ms`, `2s` (default 2s, at most 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// What a cycle does when it does not answer in time or answers wrongly: `ignore`
    /// (schedule without it; default) or `fail` (its vCluster's jobs stay pending, with a
    /// reason naming it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<ExtenderFailurePolicy>,
}

/// [`Extender::failure_policy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExtenderFailurePolicy {
    /// Schedule without the extender (counted in `lattice_scheduler_extender_errors_total`).
    #[default]
    #[serde(alias = "Ignore")]
    Ignore,
    /// Keep the vCluster's jobs pending until the extender answers.
    #[serde(alias = "Fail")]
    Fail,
}

impl Extender {
    /// The timeout in milliseconds (the default when unset or unreadable; admission refuses
    /// unreadable ones).
    pub fn timeout_ms(&self) -> u64 {
        let t = self.timeout.as_deref().unwrap_or(DEFAULT_EXTENDER_TIMEOUT);
        parse_timeout_ms(t).unwrap_or(2000)
    }
}

/// `500ms` or a duration of [`parse_duration`] (`2s`, `1m`).
fn parse_timeout_ms(t: &str) -> Result<u64, String> {
    match t.strip_suffix("ms") {
        Some(ms) => ms
            .parse::<u64>()
            .map_err(|_| format!("{t:?} is not a duration; use e.g. 500ms or 2s")),
        None => parse_duration(t).map(|s| s.saturating_mul(1000)),
    }
}

/// Why `url` cannot be an extender's URL.
fn check_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "{url:?} is not a URL; give the extender's address, e.g. http://extender.example:8080/filter"
        ));
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(format!(
            "scheme {scheme:?} is not allowed: the scheduler speaks HTTP to extenders, so use http:// or https://"
        ));
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!(
            "{url:?} has no host; e.g. http://extender.example:8080/"
        ));
    }
    if host.contains('@') {
        return Err(
            "credentials in the URL would be logged and stored in the VCluster; remove user:password@"
                .into(),
        );
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace or control characters".into());
    }
    Ok(())
}

pub(super) fn validate(extenders: &[Extender], errs: &mut Errors) {
    let mut names = std::collections::BTreeSet::new();
    for (i, e) in extenders.iter().enumerate() {
        let at = |f: &str| format!("spec.extenders[{i}].{f}");
        if let Some(err) = validate_dns1123_name(format_args!("spec.extenders[{i}].name"), &e.name)
        {
            errs.0.push(err);
        } else if !names.insert(e.name.as_str()) {
            errs.push(at("name"), format!("extender {:?} is listed twice", e.name));
        }
        if e.url.len() > 2048 {
            errs.push(at("url"), "is longer than 2048 characters");
        } else if let Err(why) = check_url(&e.url) {
            errs.push(at("url"), why);
        }
        if !e.filter && !e.score {
            errs.push(
                at("filter"),
                "the extender is asked nothing: set filter: true, score: true or both",
            );
        }
        match e.weight {
            Some(w) if !w.is_finite() || !(0.0..=1.0).contains(&w) => {
                errs.push(at("weight"), format!("must be between 0 and 1, got {w}"))
            }
            Some(_) if !e.score => errs.push(
                at("weight"),
                "weighs the extender's score, which is not asked for; set score: true or remove it",
            ),
            None if e.score => errs.push(
                at("weight"),
                "is required with score: true (0–1, how much its score counts in Score(j))",
            ),
            _ => {}
        }
        if let Some(t) = &e.timeout {
            match parse_timeout_ms(t) {
                Err(why) => errs.push(at("timeout"), why),
                Ok(0) => errs.push(at("timeout"), "must be more than 0, e.g. 2s"),
                Ok(ms) if ms > MAX_EXTENDER_TIMEOUT_S * 1000 => errs.push(
                    at("timeout"),
                    format!(
                        "must be at most {MAX_EXTENDER_TIMEOUT_S}s, got {t:?}: every cycle of the vCluster waits for it"
                    ),
                ),
                Ok(_) => {}
            }
        }
    }
    if extenders.len() > 8 {
        errs.push(
            "spec.extenders",
            format!(
                "at most 8 extenders, got {}; each one adds a call to every cycle",
                extenders.len()
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(e: Extender) -> Vec<String> {
        let mut errs = Errors::default();
        validate(&[e], &mut errs);
        errs.0.iter().map(|e| e.to_string()).collect()
    }

    fn ok() -> Extender {
        Extender {
            name: "site".into(),
            url: "https://extender.example:8443/lattice".into(),
            filter: true,
            ..Extender::default()
        }
    }

    #[test]
    fn a_good_extender_passes() {
        assert!(errors(ok()).is_empty(), "{:?}", errors(ok()));
    }

    #[test]
    fn only_http_urls_and_the_error_says_why() {
        for (url, why) in [
            ("file:///etc/passwd", "use http:// or https://"),
            ("unix:/run/x.sock", "is not a URL"),
            ("http://", "has no host"),
            ("http://user:pw@host/", "credentials"),
        ] {
            let e = errors(Extender {
                url: url.into(),
                ..ok()
            });
            assert!(
                e.iter()
                    .any(|m| m.contains("spec.extenders[0].url") && m.contains(why)),
                "{url}: {e:?}"
            );
        }
    }

    #[test]
    fn score_needs_a_weight_and_timeouts_are_bounded() {
        let e = errors(Extender {
            score: true,
            ..ok()
        });
        assert!(
            e.iter()
                .any(|m| m.contains("weight") && m.contains("required")),
            "{e:?}"
        );
        let e = errors(Extender {
            timeout: Some("1m".into()),
            ..ok()
        });
        assert!(e.iter().any(|m| m.contains("at most 30s")), "{e:?}");
        assert_eq!(
            Extender {
                timeout: Some("250ms".into()),
                ..ok()
            }
            .timeout_ms(),
            250
        );
    }
}
