//! Field-level validation errors and the helpers every kind's validation uses.
//!
//! Every error names the exact JSON path of the offending field (camelCase, the
//! way it appears in a manifest) and says how to fix it, so `lattice apply` and
//! the API server can show it to a user unchanged.

use std::fmt;

use serde::Serialize;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.resources.nodes` or `spec.dependsOn[1].ref`.
    pub path: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl FieldError {
    /// Build an error for `path` with `message`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// All problems found in one object. Never empty when returned as an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    /// A single error.
    pub fn single(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self(vec![FieldError::new(path, message)])
    }

    /// The errors, in the order they were found.
    pub fn errors(&self) -> &[FieldError] {
        &self.0
    }

    /// True when there are no errors.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The paths of all errors (handy in tests and for API `Status` causes).
    pub fn paths(&self) -> Vec<&str> {
        self.0.iter().map(|e| e.path.as_str()).collect()
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}

impl From<FieldError> for ValidationErrors {
    fn from(e: FieldError) -> Self {
        Self(vec![e])
    }
}

/// Accumulates errors while a validator walks an object. Errors on list elements (paths
/// with `[`) are kept up to [`MAX_REPORTED_ERRORS`] and only counted beyond, so a huge
/// bad request costs no more than a small one; errors on whole-object fields (the cycle
/// of a DAG, say) are always kept.
#[derive(Debug, Default)]
pub struct Errors(pub Vec<FieldError>, usize);

impl Errors {
    /// Record an error at `path`.
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.keep(FieldError::new(path, message));
    }

    /// Record `e` if it is an error.
    pub fn extend(&mut self, e: Option<FieldError>) {
        if let Some(e) = e {
            self.keep(e);
        }
    }

    fn keep(&mut self, e: FieldError) {
        if self.0.len() >= MAX_REPORTED_ERRORS - 1 && e.path.contains('[') {
            self.1 += 1;
        } else {
            self.0.push(e);
        }
    }

    /// `Ok` when nothing was recorded. At most [`MAX_REPORTED_ERRORS`] element errors
    /// are reported, then one saying how many more there were (an answer must not grow
    /// with a bad request's size).
    pub fn into_result(mut self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() && self.1 == 0 {
            return Ok(());
        }
        if self.1 > 0 {
            self.0.push(FieldError::new(
                "(more)",
                format!(
                    "{} more errors like the ones above; fix those and submit again",
                    self.1
                ),
            ));
        }
        Err(ValidationErrors(self.0))
    }
}

/// Most field errors one answer reports.
pub const MAX_REPORTED_ERRORS: usize = 100;

/// Longest free-text string (messages, scripts are separate) we accept in a spec.
pub(crate) const MAX_TEXT_LEN: usize = 4096;
/// Longest inline script (`spec.script`).
pub(crate) const MAX_SCRIPT_LEN: usize = 1024 * 1024;

/// Checks that a free-text field is not absurdly long.
/// `path` is formatted only when the check fails (pass `format_args!`).
pub(crate) fn check_len(errs: &mut Errors, path: impl fmt::Display, value: &str, max: usize) {
    if value.len() > max {
        errs.push(
            path.to_string(),
            format!(
                "is {} bytes long, the limit is {max}; shorten it",
                value.len()
            ),
        );
    }
}

/// DNS-1123 label: lower-case alphanumerics and '-', starts and ends alphanumeric, at most 63.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Longest node feature name (`Node.spec.features`, `resources.constraints.features`).
pub const MAX_FEATURE_NAME_LEN: usize = 63;

/// What a node feature name may contain, for error messages.
pub const FEATURE_NAME_RULE: &str = "use letters, digits, '_', '-' or '.' (e.g. \"nvme_scratch\")";

/// A node feature name: 1–63 ASCII letters, digits, `_`, `-` or `.` (Slurm's feature
/// names, so scripts' `--constraint` values are used as written).
pub fn is_feature_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_FEATURE_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Validate a resource name (DNS-1123 subdomain: lower-case letters, digits,
/// '-' and '.', starting and ending with a letter or digit, at most 253 chars).
///
/// Returns `None` when the name is valid.
pub fn validate_dns1123_name(path: impl fmt::Display, name: &str) -> Option<FieldError> {
    if is_dns1123_subdomain(name) {
        return None;
    }
    let path = path.to_string();
    let path = path.as_str();
    if name.is_empty() {
        return Some(FieldError::new(
            path,
            "is required; set a name of lower-case letters, digits and '-' (e.g. \"my-job-1\")",
        ));
    }
    if name.len() > 253 {
        return Some(FieldError::new(
            path,
            format!(
                "is {} characters long, the limit is 253; use a shorter name",
                name.len()
            ),
        ));
    }
    if !is_dns1123_subdomain(name) {
        return Some(FieldError::new(
            path,
            format!(
                "{:?} is not a valid name: use only lower-case letters, digits, '-' and '.', starting and ending with a letter or digit (e.g. {:?})",
                truncate(name, 80),
                suggest_dns_name(name)
            ),
        ));
    }
    None
}

/// Validate a DNS-1123 label (at most 63 characters, no dots): used for
/// namespaces (tenants) and other names that become path segments or labels.
pub fn validate_dns1123_label(path: impl fmt::Display, name: &str) -> Option<FieldError> {
    if is_dns1123_label(name) {
        return None;
    }
    let path = path.to_string();
    let path = path.as_str();
    if name.is_empty() {
        return Some(FieldError::new(
            path,
            "is required; set a name of lower-case letters, digits and '-' (e.g. \"ml-team\")",
        ));
    }
    if name.len() > 63 {
        return Some(FieldError::new(
            path,
            format!(
                "is {} characters long, the limit is 63; use a shorter name",
                name.len()
            ),
        ));
    }
    if !is_dns1123_label(name) {
        return Some(FieldError::new(
            path,
            format!(
                "{:?} is not a valid name: use only lower-case letters, digits and '-', starting and ending with a letter or digit (e.g. {:?})",
                truncate(name, 80),
                suggest_dns_name(name).replace('.', "-")
            ),
        ));
    }
    None
}

/// A best-effort valid name derived from an invalid one, for error hints.
pub(crate) fn suggest_dns_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars().take(63) {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches(|c| c == '-' || c == '.').to_string();
    if out.is_empty() {
        "my-name".to_string()
    } else {
        out
    }
}

/// Shortens a user string for inclusion in an error message.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(validate_dns1123_name("metadata.name", "train-1").is_none());
        assert!(validate_dns1123_name("metadata.name", "a.b-c").is_none());
        let e = validate_dns1123_name("metadata.name", "Train_1").expect("invalid");
        assert_eq!(e.path, "metadata.name");
        assert!(e.message.contains("\"train-1\""), "{}", e.message);
        assert!(validate_dns1123_name("metadata.name", "-a").is_some());
        assert!(validate_dns1123_name("metadata.name", "").is_some());
        assert!(validate_dns1123_name("metadata.name", &"a".repeat(254)).is_some());
        assert!(validate_dns1123_label("metadata.namespace", "a.b").is_some());
        assert!(validate_dns1123_label("metadata.namespace", &"a".repeat(64)).is_some());
    }

    #[test]
    fn display_is_one_line_per_error() {
        let e = ValidationErrors(vec![FieldError::new("a", "x"), FieldError::new("b.c", "y")]);
        assert_eq!(e.to_string(), "a: x\nb.c: y");
    }
}
