//! Dependency strings: Lattice `--depends-on`, Slurm `--dependency`, and Flux
//! RFC 26 URI-like forms, each parsed to a [`DependencyExpr`] (convertible to the API's
//! [`crate::Dependency`]). The condition names and their Slurm spellings are
//! [`DependencyCondition`]'s, the `string` scheme's access types and scopes
//! [`SymbolType`]'s and [`SymbolScope`]'s: one vocabulary for manifests, command lines
//! and the DAG core.
//!
//! Every parser returns a [`ParseError`] naming the byte position of the
//! problem (rendered as a column with a caret) and a hint on how to fix it.
//!
//! ```
//! use lattice_apis::syntax::deps::{parse_slurm_dependency, DependencyExpr};
//! use lattice_apis::DependencyCondition;
//!
//! let deps = parse_slurm_dependency("afterok:prep,after:warmup+5", None).unwrap();
//! assert_eq!(deps[0], DependencyExpr::on("prep", DependencyCondition::Success));
//! assert_eq!(deps[1].to_string(), "warmup:started+300s");
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

// The manifest vocabulary under the short names the grammar is written in.
use crate::kinds::allocation::{
    DependencyCondition as Condition, SymbolScope, SymbolType as SymbolAccess,
};
#[cfg(doc)]
use crate::kinds::allocation::{DependencyCondition, SymbolType};

/// One dependency as a dependency string says it: the parse of `--depends-on`, Slurm
/// `--dependency` and Flux RFC 26 forms. [`crate::Dependency`] (`spec.dependsOn`) is what
/// an allocation stores; `From` converts.
///
/// JSON: `{"kind":"allocation","ref":"train","condition":"success"}`,
/// `{"kind":"beginTime","epochSeconds":1700000000.5}`,
/// `{"kind":"symbol","name":"foo","type":"inout","scope":"user"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum DependencyExpr {
    /// On another allocation / DAG step (or a mutex name for `Condition::Mutex`).
    Allocation {
        /// Allocation id, DAG step name, or mutex name.
        #[serde(rename = "ref")]
        target: String,
        /// When it is satisfied.
        condition: Condition,
        /// Extra delay after the condition holds (Slurm `after:ID+MIN`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delay_seconds: Option<u64>,
    },
    /// Not before this wall-clock time (Flux `begin-time`).
    BeginTime {
        /// Seconds since the UNIX epoch.
        epoch_seconds: f64,
    },
    /// Flux `string` scheme symbolic dependency.
    Symbol {
        /// The symbol.
        name: String,
        /// in | out | inout.
        #[serde(rename = "type")]
        access: SymbolAccess,
        /// user | global.
        scope: SymbolScope,
    },
}

impl DependencyExpr {
    /// `{ref: target, condition}` without delay.
    pub fn on(target: impl Into<String>, condition: Condition) -> Self {
        Self::Allocation {
            target: target.into(),
            condition,
            delay_seconds: None,
        }
    }

    /// A mutex (singleton) on `name`.
    pub fn mutex(name: impl Into<String>) -> Self {
        Self::on(name, Condition::Mutex)
    }

    /// Render in the Flux RFC 26 object form, if the dependency has one.
    pub fn to_flux(&self) -> Option<FluxDependency> {
        let mut options = BTreeMap::new();
        let (scheme, value) = match self {
            Self::Allocation {
                target,
                condition,
                delay_seconds: None,
            } => {
                let scheme = match condition {
                    Condition::Started => "after",
                    Condition::Any => "afterany",
                    Condition::Success => "afterok",
                    Condition::Failure => "afternotok",
                    _ => return None,
                };
                (scheme.to_string(), target.clone())
            }
            Self::Allocation { .. } => return None,
            Self::BeginTime { epoch_seconds } => {
                ("begin-time".to_string(), format!("{epoch_seconds}"))
            }
            Self::Symbol {
                name,
                access,
                scope,
            } => {
                options.insert("type".to_string(), access.as_str().to_string());
                options.insert("scope".to_string(), scope.as_str().to_string());
                ("string".to_string(), name.clone())
            }
        };
        Some(FluxDependency {
            scheme,
            value,
            options,
        })
    }
}

impl fmt::Display for DependencyExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Allocation {
                target,
                condition,
                delay_seconds,
            } => {
                write!(f, "{target}:{condition}")?;
                if let Some(d) = delay_seconds {
                    write!(f, "+{d}s")?;
                }
                Ok(())
            }
            Self::BeginTime { epoch_seconds } => write!(f, "begin-time:{epoch_seconds}"),
            Self::Symbol {
                name,
                access,
                scope,
            } => write!(
                f,
                "string:{name}?type={}&scope={}",
                access.as_str(),
                scope.as_str()
            ),
        }
    }
}

impl From<DependencyExpr> for crate::Dependency {
    fn from(d: DependencyExpr) -> Self {
        match d {
            DependencyExpr::Allocation {
                target,
                condition,
                delay_seconds,
            } => {
                let dep = crate::Dependency::on(target, condition);
                match delay_seconds {
                    Some(s) => dep.delayed(format!("{s}s")),
                    None => dep,
                }
            }
            DependencyExpr::BeginTime { epoch_seconds } => {
                crate::Dependency::begin_at(epoch_seconds)
            }
            DependencyExpr::Symbol {
                name,
                access,
                scope,
            } => crate::Dependency::symbolic(name, access, scope),
        }
    }
}

/// A parse error with position and hint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ParseError {
    /// What was being parsed, e.g. `--depends-on`.
    pub what: &'static str,
    /// The full input.
    pub input: String,
    /// Byte offset of the problem in `input`.
    pub position: usize,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

impl ParseError {
    /// An error at byte `position` of `input` (clamped to its length).
    pub fn new(
        what: &'static str,
        input: &str,
        position: usize,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Self {
            what,
            input: input.to_string(),
            position: position.min(input.len()),
            message: message.into(),
            hint: hint.into(),
        }
    }

    /// 1-based character column of the problem.
    pub fn column(&self) -> usize {
        self.input
            .get(..self.position)
            .map(|s| s.chars().count())
            .unwrap_or(self.position)
            + 1
    }

    fn render(&self) -> String {
        let shown: String = self
            .input
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        format!(
            "invalid {} at column {}: {}\n  {}\n  {}^\nHint: {}",
            self.what,
            self.column(),
            self.message,
            shown,
            " ".repeat(self.column() - 1),
            self.hint
        )
    }
}

/// Characters allowed in allocation ids, step names and mutex names.
pub fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Check an identifier; return the byte offset (within `s`) of the first bad char.
fn bad_ident_char(s: &str) -> Option<(usize, char)> {
    s.char_indices().find(|(_, c)| !is_ident_char(*c))
}

/// Split `s` on `sep`, yielding `(byte_offset, piece)`.
fn split_with_offsets(s: &str, sep: char) -> impl Iterator<Item = (usize, &str)> {
    let mut start = 0usize;
    s.split(sep).map(move |piece| {
        let off = start;
        start += piece.len() + sep.len_utf8();
        (off, piece)
    })
}

/// Parse Lattice's `--depends-on=ID[:CONDITION][,ID[:CONDITION]...]`.
/// The condition defaults to `success`. All entries must hold (AND).
pub fn parse_depends_on(input: &str) -> Result<Vec<DependencyExpr>, ParseError> {
    const WHAT: &str = "--depends-on";
    const SYNTAX: &str =
        "use ID:CONDITION[,ID:CONDITION...], e.g. --depends-on=job1:success,job2:any \
                          (conditions: success, failure, any, corresponding, mutex)";
    if input.trim().is_empty() {
        return Err(ParseError::new(WHAT, input, 0, "is empty", SYNTAX));
    }
    let mut out = Vec::new();
    for (off, item) in split_with_offsets(input, ',') {
        let lead = item.len() - item.trim_start().len();
        let trimmed = item.trim();
        let off = off + lead;
        if trimmed.is_empty() {
            return Err(ParseError::new(
                WHAT,
                input,
                off,
                "empty entry",
                "remove the extra ',' (entries are ID:CONDITION separated by single commas)",
            ));
        }
        let (id, cond) = match trimmed.split_once(':') {
            Some((id, c)) => (id, Some((off + id.len() + 1, c))),
            None => (trimmed, None),
        };
        if id.is_empty() {
            return Err(ParseError::new(
                WHAT,
                input,
                off,
                "missing allocation id before ':'",
                SYNTAX,
            ));
        }
        if let Some((p, c)) = bad_ident_char(id) {
            return Err(ParseError::new(
                WHAT,
                input,
                off + p,
                format!("unexpected character {c:?} in allocation id"),
                "ids contain letters, digits, '-', '_' or '.'; separate entries with ','",
            ));
        }
        let condition = match cond {
            None => Condition::Success,
            Some((p, c)) => match Condition::parse(c) {
                Some(Condition::Started) | None => {
                    let hint = match Condition::from_slurm_name(c) {
                        Some(sc) if sc != Condition::Started => format!(
                            "{c:?} is Slurm syntax; in Lattice write {id}:{}",
                            sc.as_str()
                        ),
                        _ if c.is_empty() => {
                            format!("add a condition after ':' ({})", Condition::EDGE_ALLOWED)
                        }
                        _ => format!("use one of: {}", Condition::EDGE_ALLOWED),
                    };
                    return Err(ParseError::new(
                        WHAT,
                        input,
                        p,
                        format!("unknown condition {c:?}"),
                        hint,
                    ));
                }
                Some(c) => c,
            },
        };
        out.push(DependencyExpr::on(id, condition));
    }
    Ok(out)
}

/// Parse Slurm's `--dependency=` value. `,` separates dependencies that must
/// all hold. `?` (any-of) is rejected with an explanation. `job_name` is the
/// submitting job's name, needed for `singleton` (which becomes a mutex on it).
pub fn parse_slurm_dependency(
    input: &str,
    job_name: Option<&str>,
) -> Result<Vec<DependencyExpr>, ParseError> {
    const WHAT: &str = "--dependency";
    const SYNTAX: &str = "use TYPE:JOBID[:JOBID...] joined by ',' where TYPE is after, afterany, afterok, \
                          afternotok or aftercorr, or the word singleton (e.g. afterok:123:124,afterany:125)";
    if input.trim().is_empty() {
        return Err(ParseError::new(WHAT, input, 0, "is empty", SYNTAX));
    }
    if let Some(p) = input.find('?') {
        return Err(ParseError::new(
            WHAT,
            input,
            p,
            "'?' (satisfy any one dependency) is not supported",
            "Lattice dependencies must all hold: use ',' instead, or submit a DAG with a failure/any \
             edge for the alternative path",
        ));
    }
    let mut out = Vec::new();
    for (off, item) in split_with_offsets(input, ',') {
        if item.is_empty() {
            return Err(ParseError::new(
                WHAT,
                input,
                off,
                "empty dependency",
                "remove the extra ','",
            ));
        }
        let (kind, rest) = match item.split_once(':') {
            Some((k, r)) => (k, Some(r)),
            None => (item, None),
        };
        let cond = match Condition::from_slurm_name(kind) {
            Some(c) => c,
            None => {
                let (msg, hint) = match kind {
                    "afterburstbuffer" | "expand" => (
                        format!("dependency type {kind:?} is not supported by Lattice"),
                        "use afterok, afterany, afternotok, aftercorr, after or singleton"
                            .to_string(),
                    ),
                    _ => match Condition::parse(kind) {
                        Some(c) => (
                            format!("{kind:?} is a Lattice condition, not a Slurm dependency type"),
                            format!(
                                "write {}:JOBID, or use --depends-on=JOBID:{kind}",
                                c.slurm_name()
                            ),
                        ),
                        None => (
                            format!("unknown dependency type {kind:?}"),
                            SYNTAX.to_string(),
                        ),
                    },
                };
                return Err(ParseError::new(WHAT, input, off, msg, hint));
            }
        };
        if cond == Condition::Mutex {
            if let Some(r) = rest {
                return Err(ParseError::new(
                    WHAT,
                    input,
                    off + kind.len(),
                    format!("singleton takes no job ids (got {r:?})"),
                    "write just `singleton`: it serializes jobs with the same name and user",
                ));
            }
            let name = job_name.filter(|n| !n.is_empty()).ok_or_else(|| {
                ParseError::new(
                    WHAT,
                    input,
                    off,
                    "singleton needs a job name",
                    "set --job-name (jobs with the same name run one at a time)",
                )
            })?;
            out.push(DependencyExpr::mutex(name));
            continue;
        }
        let rest = match rest {
            Some(r) if !r.is_empty() => r,
            _ => {
                return Err(ParseError::new(
                    WHAT,
                    input,
                    off + item.len(),
                    format!("{kind} needs at least one job id"),
                    format!("write {kind}:JOBID[:JOBID...]"),
                ))
            }
        };
        let base = off + kind.len() + 1;
        for (o, idt) in split_with_offsets(rest, ':') {
            let pos = base + o;
            if idt.is_empty() {
                return Err(ParseError::new(
                    WHAT,
                    input,
                    pos,
                    "empty job id",
                    "separate job ids with a single ':'",
                ));
            }
            let (id, delay) = match idt.split_once('+') {
                Some((id, t)) => {
                    if cond != Condition::Started {
                        return Err(ParseError::new(
                            WHAT,
                            input,
                            pos + id.len(),
                            format!("a +time offset is only allowed with `after`, not `{kind}`"),
                            format!(
                                "remove +{t}, or use after:{id}+{t} to wait after the job starts"
                            ),
                        ));
                    }
                    let minutes: u64 = t.parse().map_err(|_| {
                        ParseError::new(
                            WHAT,
                            input,
                            pos + id.len() + 1,
                            format!("invalid time offset {t:?}"),
                            "the offset is whole minutes, e.g. after:123+10",
                        )
                    })?;
                    let secs = minutes.checked_mul(60).ok_or_else(|| {
                        ParseError::new(
                            WHAT,
                            input,
                            pos + id.len() + 1,
                            "time offset too large",
                            "use a smaller number of minutes",
                        )
                    })?;
                    (id, Some(secs))
                }
                None => (idt, None),
            };
            if id.is_empty() {
                return Err(ParseError::new(WHAT, input, pos, "empty job id", SYNTAX));
            }
            if let Some((p, c)) = bad_ident_char(id) {
                return Err(ParseError::new(
                    WHAT,
                    input,
                    pos + p,
                    format!("unexpected character {c:?} in job id"),
                    "job ids are like 123 or 123_4; separate ids with ':' and dependencies with ','",
                ));
            }
            out.push(DependencyExpr::Allocation {
                target: id.to_string(),
                condition: cond,
                delay_seconds: delay,
            });
        }
    }
    Ok(out)
}

/// Flux RFC 26 dependency object: `{scheme, value, ...options}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FluxDependency {
    /// Scheme name (`afterok`, `string`, ...).
    pub scheme: String,
    /// Scheme-specific value.
    pub value: String,
    /// Additional keys (`type`, `scope`, ...).
    #[serde(flatten)]
    pub options: BTreeMap<String, String>,
}

/// Flux schemes Lattice implements.
pub const FLUX_SCHEMES: &str = "after, afterany, afterok, afternotok, begin-time, string";

impl FluxDependency {
    /// Compact command-line form `scheme:value[?k=v&k=v]`.
    pub fn to_uri(&self) -> String {
        let mut s = format!("{}:{}", self.scheme, self.value);
        for (i, (k, v)) in self.options.iter().enumerate() {
            s.push(if i == 0 { '?' } else { '&' });
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s
    }

    /// Convert the object form to a [`DependencyExpr`], validating scheme and keys.
    pub fn to_dependency(&self) -> Result<DependencyExpr, String> {
        let unknown_keys = |allowed: &[&str]| -> Result<(), String> {
            match self.options.keys().find(|k| !allowed.contains(&k.as_str())) {
                Some(k) => Err(format!(
                    "scheme {:?} does not take key {k:?}; remove it",
                    self.scheme
                )),
                None => Ok(()),
            }
        };
        if self.value.is_empty() {
            return Err(format!("scheme {:?} needs a value", self.scheme));
        }
        match self.scheme.as_str() {
            "after" | "afterany" | "afterok" | "afternotok" => {
                unknown_keys(&[])?;
                if let Some(c) = self.value.chars().find(|c| c.is_whitespace() || c.is_control()) {
                    return Err(format!("job id contains {c:?}"));
                }
                let condition = match self.scheme.as_str() {
                    "after" => Condition::Started,
                    "afterany" => Condition::Any,
                    "afterok" => Condition::Success,
                    _ => Condition::Failure,
                };
                Ok(DependencyExpr::on(self.value.clone(), condition))
            }
            "begin-time" => {
                unknown_keys(&[])?;
                let t: f64 = self
                    .value
                    .parse()
                    .map_err(|_| format!("begin-time {:?} is not a number of seconds since the epoch", self.value))?;
                if !t.is_finite() || t < 0.0 {
                    return Err(format!("begin-time {:?} must be a finite, non-negative timestamp", self.value));
                }
                Ok(DependencyExpr::BeginTime { epoch_seconds: t })
            }
            "string" => {
                unknown_keys(&["type", "scope"])?;
                let ty = self
                    .options
                    .get("type")
                    .ok_or("scheme \"string\" requires type=in|out|inout")?;
                let access = SymbolAccess::parse(ty)
                    .ok_or_else(|| format!("type {ty:?} is not one of in, out, inout"))?;
                let sc = self
                    .options
                    .get("scope")
                    .ok_or("scheme \"string\" requires scope=user|global")?;
                let scope = SymbolScope::parse(sc)
                    .ok_or_else(|| format!("scope {sc:?} is not one of user, global"))?;
                Ok(DependencyExpr::Symbol {
                    name: self.value.clone(),
                    access,
                    scope,
                })
            }
            "fluid" => Err("scheme \"fluid\" is reserved by RFC 26 and not supported; use afterok/afterany with the job id".into()),
            other => Err(format!("unknown scheme {other:?}; supported: {FLUX_SCHEMES}")),
        }
    }
}

/// Parse the Flux RFC 26 command-line form `scheme:value[?key=val[&key=val...]]`
/// (`;` also separates options) into the object form. For the `string` scheme
/// a missing `scope` defaults to `user` (the RFC's own example omits it).
pub fn parse_flux_uri(input: &str) -> Result<FluxDependency, ParseError> {
    const WHAT: &str = "flux dependency";
    let syntax = format!("use scheme:value[?key=val&key=val], schemes: {FLUX_SCHEMES}");
    let (scheme, rest) = input.split_once(':').ok_or_else(|| {
        ParseError::new(
            WHAT,
            input,
            input.len(),
            "missing ':' after the scheme",
            syntax.clone(),
        )
    })?;
    if scheme.is_empty() {
        return Err(ParseError::new(WHAT, input, 0, "missing scheme", syntax));
    }
    if let Some(p) = scheme.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
        return Err(ParseError::new(
            WHAT,
            input,
            p,
            "invalid character in scheme",
            syntax,
        ));
    }
    let voff = scheme.len() + 1;
    let (value, query) = match rest.split_once('?') {
        Some((v, q)) => (v, Some(q)),
        None => (rest, None),
    };
    if value.is_empty() {
        return Err(ParseError::new(
            WHAT,
            input,
            voff,
            format!("missing value after {scheme:?}"),
            format!("write {scheme}:VALUE"),
        ));
    }
    let mut options = BTreeMap::new();
    if let Some(q) = query {
        let qoff = voff + value.len() + 1;
        let mut start = 0usize;
        for piece in q.split(['&', ';']) {
            let pos = qoff + start;
            start += piece.len() + 1;
            let (k, v) = piece.split_once('=').ok_or_else(|| {
                ParseError::new(
                    WHAT,
                    input,
                    pos,
                    format!("option {piece:?} is not key=val"),
                    "write ?key=val&key=val",
                )
            })?;
            if k.is_empty() || v.is_empty() {
                return Err(ParseError::new(
                    WHAT,
                    input,
                    pos,
                    "empty option key or value",
                    "write ?key=val&key=val",
                ));
            }
            if options.insert(k.to_string(), v.to_string()).is_some() {
                return Err(ParseError::new(
                    WHAT,
                    input,
                    pos,
                    format!("option {k:?} given twice"),
                    "keep one",
                ));
            }
        }
    }
    if scheme == "string" && !options.contains_key("scope") {
        options.insert("scope".to_string(), "user".to_string());
    }
    let dep = FluxDependency {
        scheme: scheme.to_string(),
        value: value.to_string(),
        options,
    };
    // Validate now so command-line errors carry a position and a scheme-specific hint.
    if let Err(msg) = dep.to_dependency() {
        let qpos = voff + value.len();
        let key_pos = |k: &str| {
            input
                .get(qpos..)
                .and_then(|q| q.find(&format!("{k}=")))
                .map(|p| qpos + p + k.len() + 1)
        };
        let pos = if msg.starts_with("unknown scheme") || msg.contains("reserved") {
            0
        } else if msg.starts_with("type ") {
            key_pos("type").unwrap_or(qpos)
        } else if msg.starts_with("scope ") {
            key_pos("scope").unwrap_or(qpos)
        } else if msg.contains("does not take key") {
            qpos + 1
        } else if msg.contains("requires") {
            qpos
        } else {
            voff
        };
        let hint = match scheme {
            "after" | "afterany" | "afterok" | "afternotok" => {
                format!("write {scheme}:JOBID with no options, e.g. {scheme}:ƒ2oLkTLb")
            }
            "begin-time" => {
                "write begin-time:SECONDS_SINCE_EPOCH, e.g. begin-time:1700000000.5".to_string()
            }
            "string" => "write string:NAME?type=in|out|inout[&scope=user|global]".to_string(),
            _ => syntax,
        };
        return Err(ParseError::new(WHAT, input, pos, msg, hint));
    }
    Ok(dep)
}

/// Parse a Flux command-line dependency straight to a [`DependencyExpr`].
pub fn parse_flux_dependency(input: &str) -> Result<DependencyExpr, ParseError> {
    let d = parse_flux_uri(input)?;
    d.to_dependency()
        .map_err(|m| ParseError::new("flux dependency", input, 0, m, FLUX_SCHEMES))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::allocation::{DependencyCondition, SymbolType};
    use proptest::prelude::*;

    const CONDITIONS: [DependencyCondition; 6] = [
        DependencyCondition::Success,
        DependencyCondition::Failure,
        DependencyCondition::Any,
        DependencyCondition::Corresponding,
        DependencyCondition::Started,
        DependencyCondition::Mutex,
    ];

    #[test]
    fn every_spelling_of_a_condition_reads_back() {
        for c in CONDITIONS {
            assert_eq!(DependencyCondition::parse(c.as_str()), Some(c));
            assert_eq!(
                DependencyCondition::from_slurm_name(c.slurm_name()),
                Some(c)
            );
            assert_eq!(c.to_string(), c.as_str());
        }
        for t in [SymbolType::In, SymbolType::Out, SymbolType::Inout] {
            assert_eq!(SymbolType::parse(t.as_str()), Some(t));
        }
        for s in [SymbolScope::User, SymbolScope::Global] {
            assert_eq!(SymbolScope::parse(s.as_str()), Some(s));
        }
    }

    #[test]
    fn a_parsed_string_is_the_manifest_entry_it_describes() {
        let deps = parse_slurm_dependency("afterok:prep,after:warmup+5", None).expect("valid");
        let api: Vec<crate::Dependency> = deps.into_iter().map(Into::into).collect();
        assert_eq!(api[0], crate::Dependency::on("prep", Condition::Success));
        assert_eq!(api[1].description(), "after:warmup+300s");
        let sym: crate::Dependency = parse_flux_dependency("string:ckpt?type=inout")
            .expect("valid")
            .into();
        assert_eq!(sym.description(), "string:ckpt?scope=user&type=inout");
    }

    fn ident() -> impl Strategy<Value = String> {
        "[a-z0-9][a-z0-9._-]{0,10}"
    }

    /// A dependency that has a Flux RFC 26 spelling.
    fn flux_expr() -> impl Strategy<Value = DependencyExpr> {
        let after = (
            ident(),
            prop::sample::select(vec![
                Condition::Started,
                Condition::Any,
                Condition::Success,
                Condition::Failure,
            ]),
        )
            .prop_map(|(t, c)| DependencyExpr::on(t, c));
        let begin =
            (0u64..4_000_000_000, 0u32..1000).prop_map(|(s, ms)| DependencyExpr::BeginTime {
                epoch_seconds: s as f64 + f64::from(ms) / 1000.0,
            });
        let symbol = (
            ident(),
            prop::sample::select(vec![
                SymbolAccess::In,
                SymbolAccess::Out,
                SymbolAccess::Inout,
            ]),
            prop::sample::select(vec![SymbolScope::User, SymbolScope::Global]),
        )
            .prop_map(|(name, access, scope)| DependencyExpr::Symbol {
                name,
                access,
                scope,
            });
        prop_oneof![after, begin, symbol]
    }

    proptest! {
        #[test]
        fn depends_on_spelling_round_trips(
            items in proptest::collection::vec((ident(), 0usize..6), 1..6)
        ) {
            // `started` has no `--depends-on` spelling (it is `--dependency=after:ID`).
            let want: Vec<DependencyExpr> = items
                .iter()
                .map(|(id, c)| DependencyExpr::on(id.clone(), CONDITIONS[*c]))
                .filter(|d| !matches!(d, DependencyExpr::Allocation { condition: Condition::Started, .. }))
                .collect();
            prop_assume!(!want.is_empty());
            let text = want.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
            prop_assert_eq!(parse_depends_on(&text).expect("a rendered list parses"), want);
        }

        #[test]
        fn flux_spelling_round_trips(d in flux_expr()) {
            let flux = d.to_flux().expect("every generated dependency has a Flux form");
            let uri = flux.to_uri();
            prop_assert_eq!(&parse_flux_uri(&uri).expect("a rendered URI parses"), &flux);
            prop_assert_eq!(parse_flux_dependency(&uri).expect("parses"), d);
        }

        #[test]
        fn slurm_lists_read_as_written(
            items in proptest::collection::vec(
                (prop::sample::select(vec!["after", "afterok", "afternotok", "afterany", "aftercorr"]),
                 proptest::collection::vec(("[0-9]{1,6}", proptest::option::of(0u64..10_000)), 1..4)),
                1..4)
        ) {
            let mut text = Vec::new();
            let mut want = Vec::new();
            for (kind, ids) in &items {
                let condition = Condition::from_slurm_name(kind).expect("a Slurm type");
                let mut entry = kind.to_string();
                for (id, delay) in ids {
                    // Only `after` takes `+MINUTES` here.
                    let delay = delay.filter(|_| *kind == "after");
                    entry.push(':');
                    entry.push_str(id);
                    if let Some(m) = delay {
                        entry.push_str(&format!("+{m}"));
                    }
                    want.push(DependencyExpr::Allocation {
                        target: id.clone(),
                        condition,
                        delay_seconds: delay.map(|m| m * 60),
                    });
                }
                text.push(entry);
            }
            let text = text.join(",");
            prop_assert_eq!(parse_slurm_dependency(&text, None).expect("valid"), want);
        }
    }
}
