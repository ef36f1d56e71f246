//! Value parsers for Slurm and Lattice option syntax. Each returns a
//! [`ValueError`] (what is wrong + a hint); callers add the location.

use serde::Serialize;

use lattice_apis::syntax::tasks::{
    parse_range_with_limit, RangeError, RangeErrorKind, MAX_TASK_INDEX,
};

use crate::error::ValueError;

/// Longest walltime accepted (366 days, as the API server enforces).
pub use lattice_apis::syntax::duration::MAX_DURATION_SECS as MAX_WALLTIME_SECS;
/// Longest dependency delay (`ID+MINUTES`) accepted (366 days, as the API server enforces
/// for durations).
pub use lattice_apis::syntax::duration::MAX_DURATION_SECS;
/// Most tasks one task group may expand to (as the API server enforces).
pub use lattice_apis::wellknown::MAX_TASKS;

const TIME_HINT: &str = "use minutes (\"30\"), MM:SS, HH:MM:SS (\"72:00:00\"), D-HH, D-HH:MM, D-HH:MM:SS (\"1-12:00:00\"), UNLIMITED, or Lattice's \"24h\" / \"30m\" / \"1h30m\"";

/// A parsed walltime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Walltime {
    /// A limit in seconds.
    Seconds(u64),
    /// `UNLIMITED`, `INFINITE`, `-1` or `0`: no limit requested.
    Unlimited,
}

impl Walltime {
    /// `HH:MM:SS` (hours may exceed 24), the normalized form put in the manifest.
    pub fn to_hms(self) -> Option<String> {
        match self {
            Walltime::Seconds(s) => Some(format_hms(s)),
            Walltime::Unlimited => None,
        }
    }
}

/// `HH:MM:SS`, hours unbounded.
pub use lattice_apis::syntax::duration::format_hms;

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 12 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parse every `--time` form Slurm accepts (`minutes`, `minutes:seconds`,
/// `hours:minutes:seconds`, `days-hours`, `days-hours:minutes`,
/// `days-hours:minutes:seconds`, `UNLIMITED`/`INFINITE`/`-1`, and `0` which
/// Slurm reads as "no limit") plus Lattice's unit forms `24h`, `30m`,
/// `1h30m`, `2d`, `90s`. Like Slurm, fields are not range-checked
/// (`0:90` is 90 seconds, `1-30` is 54 hours).
pub fn parse_walltime(s: &str) -> Result<Walltime, ValueError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(ValueError::new("the time limit is empty", TIME_HINT));
    }
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") || t == "-1" {
        return Ok(Walltime::Unlimited);
    }
    if t.len() > 32 {
        return Err(ValueError::new("is too long to be a time limit", TIME_HINT));
    }
    let bad = || ValueError::new(format!("{t:?} is not a time limit"), TIME_HINT);
    let secs = if t
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b':' || b == b'-')
    {
        slurm_time(t).ok_or_else(bad)?
    } else {
        unit_time(t).ok_or_else(bad)?
    };
    if secs == 0 {
        // Slurm: "A time limit of zero requests that no time limit be imposed."
        return Ok(Walltime::Unlimited);
    }
    if secs > MAX_WALLTIME_SECS {
        return Err(ValueError::new(
            format!("{t:?} is longer than the 366-day limit"),
            "use a shorter time limit, or UNLIMITED to take the vCluster's default",
        ));
    }
    Ok(Walltime::Seconds(secs))
}

/// Slurm's `time_str2secs`: digits, at most one `-` (after the day count),
/// at most two `:` without a day, three fields after the day.
fn slurm_time(t: &str) -> Option<u64> {
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (Some(digits(d)?), r),
        None => (None, t),
    };
    if days.is_some() && rest.is_empty() {
        // Slurm's sscanf("%d-%d:%d:%d") reads "2-" as two days.
        return days?.checked_mul(86_400);
    }
    let parts: Vec<&str> = rest.split(':').collect();
    let nums: Vec<u64> = parts.iter().map(|p| digits(p)).collect::<Option<_>>()?;
    let (d, h, m, s) = match (days, nums.as_slice()) {
        (Some(d), [h]) => (d, *h, 0, 0),
        (Some(d), [h, m]) => (d, *h, *m, 0),
        (Some(d), [h, m, s]) => (d, *h, *m, *s),
        (None, [m]) => (0, 0, *m, 0),
        (None, [m, s]) => (0, 0, *m, *s),
        (None, [h, m, s]) => (0, *h, *m, *s),
        _ => return None,
    };
    d.checked_mul(86_400)?
        .checked_add(h.checked_mul(3_600)?)?
        .checked_add(m.checked_mul(60)?)?
        .checked_add(s)
}

/// Lattice's `1d2h3m4s` (any subset, in that order): the API's duration units
/// ([`lattice_apis::syntax::duration::parse_units`]), read case-insensitively as Slurm
/// users write them (`1H30M`).
fn unit_time(t: &str) -> Option<u64> {
    lattice_apis::syntax::duration::parse_units(&t.to_ascii_lowercase())
}

const ARRAY_HINT: &str = "use START-END (\"0-99\"), a list (\"1,3,5-7\"), a step (\"0-15:4\") and an optional %LIMIT (\"0-99%20\")";

/// A parsed `--array` / `--task-group`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArraySpec {
    /// The index expression without the `%` limit, normalized (no spaces), e.g. `0-15:4,20`.
    pub range: String,
    /// Inclusive `(start, end, step)` segments.
    pub segments: Vec<(u64, u64, u64)>,
    /// The `%N` concurrency limit.
    pub limit: Option<u32>,
}

impl ArraySpec {
    /// Number of distinct indices.
    pub fn count(&self) -> u64 {
        let mut v = self.indices_capped(MAX_TASKS as usize + 1);
        v.dedup();
        v.len() as u64
    }

    /// Sorted, deduplicated indices, at most `cap` of them.
    pub fn indices_capped(&self, cap: usize) -> Vec<u64> {
        let mut set = std::collections::BTreeSet::new();
        for &(a, b, s) in &self.segments {
            let mut i = a;
            while i <= b && set.len() < cap {
                set.insert(i);
                match i.checked_add(s) {
                    Some(n) => i = n,
                    None => break,
                }
            }
        }
        set.into_iter().collect()
    }
}

/// Parse every `--array` form Slurm accepts: `0-15`, `0,6,16-32`, `0-15:4`,
/// `0-15%4`, `1,3,5-7:2%10`. The grammar is the API's task range
/// ([`lattice_apis::syntax::tasks`]): what this accepts, admission accepts.
pub fn parse_array(s: &str) -> Result<ArraySpec, ValueError> {
    let (range, limit) = parse_range_with_limit(s, MAX_TASKS).map_err(|e| array_error(s, e))?;
    Ok(ArraySpec {
        range: range.to_string(),
        segments: range.segments,
        limit,
    })
}

/// A task-range error in `--array`'s words.
fn array_error(s: &str, e: RangeError) -> ValueError {
    let part = &e.entry;
    match &e.kind {
        RangeErrorKind::Empty => ValueError::new("the array index list is empty", ARRAY_HINT),
        RangeErrorKind::LimitNotAllowed | RangeErrorKind::BadLimit => ValueError::new(
            format!("the limit {part:?} after '%' is not a number"),
            ARRAY_HINT,
        ),
        RangeErrorKind::ZeroLimit => ValueError::new(
            "the '%' limit must be at least 1",
            "write e.g. \"0-99%20\" to run at most 20 tasks at once, or drop the '%'",
        ),
        RangeErrorKind::EmptyEntry
            if s.trim()
                .split('%')
                .next()
                .unwrap_or_default()
                .trim()
                .is_empty() =>
        {
            ValueError::new("no indices before '%'", ARRAY_HINT)
        }
        RangeErrorKind::TooLarge {
            what: "end" | "index",
        } if e.text.parse::<u64>().is_ok() => ValueError::new(
            format!("index {} is too large", e.text),
            format!("use indices below {}", MAX_TASK_INDEX + 1),
        ),
        RangeErrorKind::EmptyEntry
        | RangeErrorKind::NotANumber { .. }
        | RangeErrorKind::TooLarge { .. } => ValueError::new(
            format!("{part:?} is not an index, range or stepped range"),
            ARRAY_HINT,
        ),
        RangeErrorKind::ZeroStep => ValueError::new(format!("{part:?} has step 0"), ARRAY_HINT),
        RangeErrorKind::Reversed { start, end } => ValueError::new(
            format!("{part:?}: start {start} is greater than end {end}"),
            format!("write it as \"{end}-{start}\""),
        ),
        RangeErrorKind::TooMany { count, limit } => ValueError::new(
            format!(
                "{:?} expands to {count} tasks, the limit is {limit}",
                s.trim().split('%').next().unwrap_or_default().trim()
            ),
            "split the array into several submissions",
        ),
    }
}

const NODES_HINT: &str = "use a count (\"4\") or a range MIN-MAX (\"2-8\")";

/// A node count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum NodeCount {
    /// Exactly this many.
    Exact(u32),
    /// Between min and max.
    Range {
        /// At least.
        min: u32,
        /// At most.
        max: u32,
    },
}

impl NodeCount {
    /// The minimum.
    pub fn min(self) -> u32 {
        match self {
            NodeCount::Exact(n) => n,
            NodeCount::Range { min, .. } => min,
        }
    }

    /// The maximum.
    pub fn max(self) -> u32 {
        match self {
            NodeCount::Exact(n) => n,
            NodeCount::Range { max, .. } => max,
        }
    }
}

/// Parse `--nodes`: `N` or `N-M` (Slurm's min-max), `k` suffix allowed (`1k` = 1024).
pub fn parse_nodes(s: &str) -> Result<NodeCount, ValueError> {
    let t = s.trim();
    let one = |x: &str| -> Result<u32, ValueError> {
        let x = x.trim();
        let (num, mult) = match x.strip_suffix(['k', 'K']) {
            Some(n) => (n, 1024u64),
            None => (x, 1u64),
        };
        let n = digits(num)
            .and_then(|n| n.checked_mul(mult))
            .ok_or_else(|| ValueError::new(format!("{x:?} is not a node count"), NODES_HINT))?;
        if n == 0 {
            return Err(ValueError::new(
                "the node count must be at least 1",
                NODES_HINT,
            ));
        }
        if n > 100_000 {
            return Err(ValueError::new(
                format!("{n} nodes is above the 100000 limit"),
                NODES_HINT,
            ));
        }
        Ok(n as u32)
    };
    if t.contains(',') || t.contains(':') {
        return Err(ValueError::new(
            format!("{t:?}: node-count lists are not supported"),
            NODES_HINT,
        ));
    }
    match t.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (one(a)?, one(b)?);
            if a > b {
                return Err(ValueError::new(
                    format!("minimum {a} is greater than maximum {b}"),
                    format!("write \"{b}-{a}\""),
                ));
            }
            Ok(if a == b {
                NodeCount::Exact(a)
            } else {
                NodeCount::Range { min: a, max: b }
            })
        }
        None => Ok(NodeCount::Exact(one(t)?)),
    }
}

/// Parse a positive count (`--ntasks`, `--ntasks-per-node`, `--min-nodes`, ...).
pub fn parse_count(s: &str, what: &str) -> Result<u32, ValueError> {
    let t = s.trim();
    match digits(t).and_then(|n| u32::try_from(n).ok()) {
        Some(0) => Err(ValueError::new(
            format!("{what} must be at least 1"),
            format!("write a positive {what}, e.g. \"4\""),
        )),
        Some(n) => Ok(n),
        None => Err(ValueError::new(
            format!("{t:?} is not a number"),
            format!("write a positive {what}, e.g. \"4\""),
        )),
    }
}

/// Most names one `--nodelist` may expand to.
pub const MAX_NODELIST: usize = 100_000;

/// Parse `--nodelist` (Slurm hostlist syntax: `sn-[01-04],gpu7`, `nid[001-003,007]`) into
/// node names, in the order written. Names must be valid node (object) names; a node
/// listed twice is an error.
pub fn parse_nodelist(s: &str) -> Result<Vec<String>, ValueError> {
    let hint = "write node names or Slurm hostlist ranges, e.g. sn-[01-04],gpu7";
    let t = s.trim();
    if t.is_empty() {
        return Err(ValueError::new("the node list is empty", hint));
    }
    let names = crate::hostlist::expand(t, MAX_NODELIST).ok_or_else(|| {
        ValueError::new(
            format!(
                "{t:?} is not a valid hostlist (unbalanced brackets, a bad range, more than one \
                 bracket group per name, or more than {MAX_NODELIST} nodes)"
            ),
            hint,
        )
    })?;
    if names.is_empty() {
        return Err(ValueError::new("the node list names no node", hint));
    }
    let mut seen = std::collections::BTreeSet::new();
    for n in &names {
        let ok = n.len() <= 253
            && n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && n.as_bytes()[0].is_ascii_alphanumeric()
            && n.as_bytes()[n.len() - 1].is_ascii_alphanumeric();
        if !ok {
            return Err(ValueError::new(
                format!(
                    "{n:?} is not a node name: use lower-case letters, digits, '-' and '.', \
                     starting and ending with a letter or digit"
                ),
                "use the names `lattice nodes` shows",
            ));
        }
        if !seen.insert(n.as_str()) {
            return Err(ValueError::new(
                format!("node {n:?} is listed twice"),
                "list each node once",
            ));
        }
    }
    Ok(names)
}

/// A parsed GPU request (`--gres=gpu:[type:]N`, `--gpus-per-node=[type:]N`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct GresSpec {
    /// GPU model, if given.
    pub gpu_type: Option<String>,
    /// GPUs per node, if a GPU was requested.
    pub gpu_count: Option<u32>,
    /// Non-GPU GRES as written (ignored with a warning).
    pub other: Vec<String>,
}

const GRES_HINT: &str = "use gpu:N (\"gpu:4\") or gpu:TYPE:N (\"gpu:a100:4\")";

/// Parse `--gres`: comma-separated `name[:type][:count]`, e.g. `gpu:4`,
/// `gpu:a100:2`, `gpu`, `gpu:4,nvme:1` (non-GPU entries are returned in
/// `other`), `none`.
pub fn parse_gres(s: &str) -> Result<GresSpec, ValueError> {
    let t = s.trim();
    let mut out = GresSpec::default();
    if t.is_empty() {
        return Err(ValueError::new("the GRES list is empty", GRES_HINT));
    }
    if t.eq_ignore_ascii_case("none") {
        return Ok(out);
    }
    for item in t.split(',') {
        let item = item.trim();
        // Drop a socket binding suffix such as "(S:0-1)".
        let core = item.split('(').next().unwrap_or(item);
        let mut parts = core.split(':');
        let name = parts.next().unwrap_or("");
        let rest: Vec<&str> = parts.collect();
        if name.is_empty() {
            return Err(ValueError::new(
                format!("{item:?} has no GRES name"),
                GRES_HINT,
            ));
        }
        if !name.eq_ignore_ascii_case("gpu") {
            out.other.push(item.to_string());
            continue;
        }
        let (ty, count) = gpu_type_count(&rest, item)?;
        if out.gpu_count.is_some() {
            return Err(ValueError::new(
                "GPUs are requested twice",
                "request GPUs once, e.g. \"gpu:4\"",
            ));
        }
        out.gpu_type = ty;
        out.gpu_count = Some(count);
    }
    Ok(out)
}

fn gpu_type_count(rest: &[&str], item: &str) -> Result<(Option<String>, u32), ValueError> {
    let count = |c: &str| -> Result<u32, ValueError> {
        match digits(c).and_then(|n| u32::try_from(n).ok()) {
            Some(0) => Err(ValueError::new(
                format!("{item:?} asks for 0 GPUs"),
                "drop the option for CPU-only work",
            )),
            Some(n) if n <= 64 => Ok(n),
            Some(n) => Err(ValueError::new(
                format!("{n} GPUs per node is above the limit of 64"),
                GRES_HINT,
            )),
            None => Err(ValueError::new(
                format!("{c:?} in {item:?} is not a GPU count"),
                GRES_HINT,
            )),
        }
    };
    let valid_type = |t: &str| {
        !t.is_empty()
            && t.len() <= 64
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    match rest {
        [] => Ok((None, 1)),
        [c] if c.bytes().all(|b| b.is_ascii_digit()) => Ok((None, count(c)?)),
        [t] if valid_type(t) => Ok((Some((*t).to_string()), 1)),
        [t, c] if valid_type(t) => Ok((Some((*t).to_string()), count(c)?)),
        _ => Err(ValueError::new(
            format!("{item:?} is not a GPU request"),
            GRES_HINT,
        )),
    }
}

/// Parse `--gpus-per-node=[type:]N`.
pub fn parse_gpus_per_node(s: &str) -> Result<GresSpec, ValueError> {
    let t = s.trim();
    let rest: Vec<&str> = t.split(':').collect();
    if t.is_empty() {
        return Err(ValueError::new(
            "the GPU count is empty",
            "use N or TYPE:N, e.g. \"4\" or \"a100:4\"",
        ));
    }
    let (ty, count) = gpu_type_count(&rest, t)?;
    Ok(GresSpec {
        gpu_type: ty,
        gpu_count: Some(count),
        other: vec![],
    })
}

/// A constraint expression (Slurm `--constraint` and Lattice `--constraint`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum ConstraintExpr {
    /// A bare feature, optionally with a Slurm node count (`a*4`).
    Feature {
        /// Feature name.
        name: String,
        /// `*N` count.
        count: Option<u32>,
    },
    /// Lattice `key=value` / `key>=value`.
    Compare {
        /// Key, e.g. `gpu_type`.
        key: String,
        /// `=` or `>=`.
        cmp: String,
        /// Value as written.
        value: String,
    },
    /// All must hold (`&`, `,`).
    And {
        /// Operands.
        items: Vec<ConstraintExpr>,
    },
    /// Any may hold (`|`).
    Or {
        /// Operands.
        items: Vec<ConstraintExpr>,
        /// `[a|b]`: all nodes must share the same alternative.
        matching: bool,
    },
}

const CONSTRAINT_HINT: &str = "use features joined by '&' (AND) or '|' (OR), e.g. \"gpu&nvme\", \"[a100|h100]\", counts \"gpu*4\", or Lattice's \"gpu_type=GH200,gpu_count=4\", \"memory_gb>=512\"";

/// Parse a constraint expression: Slurm's `&`, `|`, `,`, `[...]`, `(...)`
/// and `*N` counts, and Lattice's `key=value`, `key>=value`, bare features.
pub fn parse_constraint(s: &str) -> Result<ConstraintExpr, ValueError> {
    let toks = tokenize_constraint(s)?;
    let mut p = CParser {
        toks,
        pos: 0,
        depth: 0,
    };
    let e = p.or_expr()?;
    if p.pos != p.toks.len() {
        return Err(ValueError::new(
            format!(
                "unexpected {:?} in constraint {:?}",
                p.toks[p.pos].text(),
                s.trim()
            ),
            CONSTRAINT_HINT,
        ));
    }
    Ok(e)
}

#[derive(Debug, Clone, PartialEq)]
enum CTok {
    Word(String),
    Op(char),
    Ge,
}

impl CTok {
    fn text(&self) -> String {
        match self {
            CTok::Word(w) => w.clone(),
            CTok::Op(c) => c.to_string(),
            CTok::Ge => ">=".into(),
        }
    }
}

fn tokenize_constraint(s: &str) -> Result<Vec<CTok>, ValueError> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut chars = s.trim().chars().peekable();
    if s.trim().is_empty() {
        return Err(ValueError::new("the constraint is empty", CONSTRAINT_HINT));
    }
    while let Some(c) = chars.next() {
        match c {
            '&' | '|' | ',' | '[' | ']' | '(' | ')' | '*' | '=' | '>' | '<' | '!' => {
                if !word.is_empty() {
                    out.push(CTok::Word(std::mem::take(&mut word)));
                }
                if c == '>' && chars.peek() == Some(&'=') {
                    chars.next();
                    out.push(CTok::Ge);
                } else if c == '>' || c == '<' || c == '!' {
                    return Err(ValueError::new(
                        format!("operator '{c}' is not supported in constraints"),
                        "use key=value or key>=value (minimum), e.g. \"memory_gb>=512\"",
                    ));
                } else {
                    out.push(CTok::Op(c));
                }
            }
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    out.push(CTok::Word(std::mem::take(&mut word)));
                }
            }
            c if c.is_ascii_alphanumeric() || "_-.:/+@".contains(c) => word.push(c),
            c => {
                return Err(ValueError::new(
                    format!("character {c:?} is not allowed in a constraint"),
                    CONSTRAINT_HINT,
                ))
            }
        }
    }
    if !word.is_empty() {
        out.push(CTok::Word(word));
    }
    Ok(out)
}

struct CParser {
    toks: Vec<CTok>,
    pos: usize,
    depth: usize,
}

impl CParser {
    fn peek(&self) -> Option<&CTok> {
        self.toks.get(self.pos)
    }

    fn or_expr(&mut self) -> Result<ConstraintExpr, ValueError> {
        let mut items = vec![self.and_expr()?];
        while self.peek() == Some(&CTok::Op('|')) {
            self.pos += 1;
            items.push(self.and_expr()?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            ConstraintExpr::Or {
                items,
                matching: false,
            }
        })
    }

    fn and_expr(&mut self) -> Result<ConstraintExpr, ValueError> {
        let mut items = vec![self.term()?];
        while matches!(self.peek(), Some(CTok::Op('&')) | Some(CTok::Op(','))) {
            self.pos += 1;
            items.push(self.term()?);
        }
        Ok(if items.len() == 1 {
            items.remove(0)
        } else {
            ConstraintExpr::And { items }
        })
    }

    fn term(&mut self) -> Result<ConstraintExpr, ValueError> {
        self.depth += 1;
        if self.depth > 32 {
            return Err(ValueError::new(
                "the constraint is nested too deeply",
                CONSTRAINT_HINT,
            ));
        }
        let r = self.term_inner();
        self.depth -= 1;
        r
    }

    fn term_inner(&mut self) -> Result<ConstraintExpr, ValueError> {
        match self.peek().cloned() {
            Some(CTok::Op(open @ ('[' | '('))) => {
                self.pos += 1;
                let mut inner = self.or_expr()?;
                let close = if open == '[' { ']' } else { ')' };
                if self.peek() != Some(&CTok::Op(close)) {
                    return Err(ValueError::new(
                        format!("'{open}' is not closed"),
                        format!("add the matching '{close}'"),
                    ));
                }
                self.pos += 1;
                if open == '[' {
                    if let ConstraintExpr::Or { matching, .. } = &mut inner {
                        *matching = true;
                    }
                }
                Ok(inner)
            }
            Some(CTok::Word(w)) => {
                self.pos += 1;
                match self.peek().cloned() {
                    Some(CTok::Op('*')) => {
                        self.pos += 1;
                        let n = match self.peek() {
                            Some(CTok::Word(n)) => digits(n).and_then(|n| u32::try_from(n).ok()),
                            _ => None,
                        }
                        .ok_or_else(|| {
                            ValueError::new(
                                format!("'{w}*' needs a node count"),
                                "write e.g. \"gpu*4\"",
                            )
                        })?;
                        self.pos += 1;
                        Ok(ConstraintExpr::Feature {
                            name: w,
                            count: Some(n),
                        })
                    }
                    Some(c @ (CTok::Op('=') | CTok::Ge)) => {
                        self.pos += 1;
                        let v = match self.peek() {
                            Some(CTok::Word(v)) => v.clone(),
                            _ => {
                                return Err(ValueError::new(
                                    format!("'{w}{}' needs a value", c.text()),
                                    "write e.g. \"gpu_type=GH200\"",
                                ))
                            }
                        };
                        self.pos += 1;
                        Ok(ConstraintExpr::Compare {
                            key: w,
                            cmp: c.text(),
                            value: v,
                        })
                    }
                    _ => Ok(ConstraintExpr::Feature {
                        name: w,
                        count: None,
                    }),
                }
            }
            Some(t) => Err(ValueError::new(
                format!("expected a feature, found {:?}", t.text()),
                CONSTRAINT_HINT,
            )),
            None => Err(ValueError::new(
                "the constraint ends with an operator",
                CONSTRAINT_HINT,
            )),
        }
    }
}

/// A dependency condition: the API's ([`lattice_apis::DependencyCondition`]; its
/// `as_str` is the manifest name, `slurm_name` the Slurm type). A standalone job's edge
/// never holds `Mutex` (Slurm `singleton` is [`DependencySpec`]'s own flag).
pub use lattice_apis::DependencyCondition as DepCondition;

/// The condition of an edge, `None` for a mutex (a DAG lock, not an edge).
fn edge_condition(c: DepCondition) -> Option<DepCondition> {
    (c != DepCondition::Mutex).then_some(c)
}

/// One dependency edge.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DepEdge {
    /// Allocation (job) id depended on: a name or a uid.
    pub target: String,
    /// Condition.
    pub condition: DepCondition,
    /// Slurm `ID_TASK`: only this element of the job array `target` (`taskIndex`).
    pub task: Option<u64>,
    /// Slurm `+MINUTES`, in seconds: hold only this long after `target` started
    /// (`after`) or ended (the others) (`delay`).
    pub delay_seconds: Option<u64>,
    /// One of the alternatives of a `?` list (`anyOf: true`).
    pub any_of: bool,
}

impl DepEdge {
    /// `{target, condition}` without options.
    pub fn new(target: impl Into<String>, condition: DepCondition) -> Self {
        DepEdge {
            target: target.into(),
            condition,
            ..Default::default()
        }
    }

    /// As Slurm writes it: `afterok:123_4+5`.
    pub fn slurm(&self) -> String {
        let mut s = format!("{}:{}", self.condition.slurm_name(), self.target);
        if let Some(t) = self.task {
            s.push_str(&format!("_{t}"));
        }
        if let Some(d) = self.delay_seconds {
            s.push_str(&format!("+{}", d / 60));
        }
        s
    }
}

/// A Flux RFC 26 `string` (symbolic) dependency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SymbolDep {
    /// The symbol.
    pub name: String,
    /// `in`, `out` or `inout`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `user` or `global`.
    pub scope: String,
}

/// A parsed dependency option; `raw` is kept verbatim.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DependencySpec {
    /// As written.
    pub raw: String,
    /// Edges, in order, deduplicated by target and task (first wins).
    pub edges: Vec<DepEdge>,
    /// Slurm `?` separators were used: the edges (and `singleton`) of that list are
    /// alternatives (`any_of` on each), satisfied when any one is.
    pub any_of: bool,
    /// Slurm `singleton` was requested.
    pub singleton: bool,
    /// `singleton` is one of the alternatives of a `?` list (and not required elsewhere).
    pub singleton_any_of: bool,
    /// Flux `begin-time`: not before this time (seconds since the UNIX epoch).
    pub begin_time: Option<f64>,
    /// Flux `string` dependencies, in order, one per symbol.
    pub symbols: Vec<SymbolDep>,
    /// Notes about approximations (e.g. `afterburstbuffer`, a duplicate job).
    pub notes: Vec<String>,
}

impl DependencySpec {
    fn new(raw: &str) -> Self {
        DependencySpec {
            raw: raw.to_string(),
            edges: vec![],
            any_of: false,
            singleton: false,
            singleton_any_of: false,
            begin_time: None,
            symbols: vec![],
            notes: vec![],
        }
    }

    /// Add `other`'s dependencies (e.g. `--depends-on` and `--dependency` both given).
    /// An allocation has one group of alternatives, so two `?` lists are refused.
    pub fn merge(&mut self, other: DependencySpec) -> Result<(), ValueError> {
        if self.any_of && other.any_of {
            return Err(ValueError::new(
                format!(
                    "{:?} and {:?} are two '?' (any-of) lists; a job has one group of alternatives",
                    self.raw, other.raw
                ),
                "join the alternatives into one '?' list, or list required dependencies with ','",
            ));
        }
        self.raw = format!("{},{}", self.raw, other.raw);
        for e in other.edges {
            self.push_edge(e);
        }
        self.any_of |= other.any_of;
        if other.singleton {
            self.set_singleton(other.singleton_any_of);
        }
        if let Some(t) = other.begin_time {
            self.set_begin_time(t);
        }
        for s in other.symbols {
            self.push_symbol(s);
        }
        self.notes.extend(other.notes);
        Ok(())
    }

    /// `singleton`, as an alternative of a `?` list or not: a required one wins.
    fn set_singleton(&mut self, alternative: bool) {
        self.singleton_any_of = if self.singleton {
            self.singleton_any_of && alternative
        } else {
            alternative
        };
        self.singleton = true;
    }

    fn push_edge(&mut self, e: DepEdge) {
        if self
            .edges
            .iter()
            .any(|x| x.target == e.target && x.task == e.task)
        {
            let job = match e.task {
                Some(t) => format!("{}_{t}", e.target),
                None => e.target.clone(),
            };
            self.notes.push(format!(
                "{job} is listed more than once; keeping the first condition"
            ));
        } else {
            self.edges.push(e);
        }
    }

    fn push_symbol(&mut self, s: SymbolDep) {
        if self.symbols.iter().any(|x| x.name == s.name) {
            self.notes.push(format!(
                "string:{} is listed more than once; keeping the first (type=inout both reads and writes)",
                s.name
            ));
        } else {
            self.symbols.push(s);
        }
    }

    fn set_begin_time(&mut self, t: f64) {
        if let Some(prev) = self.begin_time {
            self.notes.push(format!(
                "begin-time given more than once; keeping the latest ({})",
                prev.max(t)
            ));
            self.begin_time = Some(prev.max(t));
        } else {
            self.begin_time = Some(t);
        }
    }

    /// The `spec.dependsOn` entries (manifest JSON), and notes for approximations:
    /// `aftercorr` without a task group (`has_array`) waits for the whole job to succeed.
    pub fn depends_on(&self, has_array: bool) -> (Vec<serde_json::Value>, Vec<String>) {
        use serde_json::json;
        let mut out = Vec::new();
        let mut notes = Vec::new();
        for e in &self.edges {
            let condition = if e.condition == DepCondition::Corresponding && !has_array {
                notes.push(format!(
                    "aftercorr:{} needs an array (--array); waiting for the whole job to succeed",
                    e.target
                ));
                DepCondition::Success
            } else {
                e.condition
            };
            let mut entry = json!({"ref": e.target, "condition": condition.as_str()});
            if let Some(t) = e.task {
                entry["taskIndex"] = json!(t);
            }
            if let Some(d) = e.delay_seconds {
                entry["delay"] = json!(if d % 60 == 0 {
                    format!("{}m", d / 60)
                } else {
                    format!("{d}s")
                });
            }
            if e.any_of {
                entry["anyOf"] = json!(true);
            }
            out.push(entry);
        }
        if let Some(t) = self.begin_time {
            out.push(json!({ "beginTime": t }));
        }
        for s in &self.symbols {
            out.push(json!({"symbol": s.name, "type": s.type_, "scope": s.scope}));
        }
        if self.singleton {
            out.push(if self.singleton_any_of {
                json!({"singleton": true, "anyOf": true})
            } else {
                json!({"singleton": true})
            });
        }
        (out, notes)
    }
}

const DEP_HINT: &str = "use TYPE:JOBID[:JOBID...] with TYPE one of after, afterok, afternotok, afterany, aftercorr, or singleton (JOBID_TASK: one array task; JOBID+MINUTES: a delay), or a Flux form begin-time:EPOCH_SECONDS / string:NAME?type=in|out|inout[&scope=user|global]; join with ',' (all) or '?' (any), e.g. \"afterok:123:124,afterany:125\"";

/// A job / allocation id usable as a dependency `ref` (a DNS-1123 name; uids are too).
fn valid_job_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 253
        && id.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A dependency-string parse error as a [`ValueError`], its column shifted by `offset`
/// characters (the parser saw only one entry of the list).
fn from_parse_error(e: lattice_apis::syntax::deps::ParseError, offset: usize) -> ValueError {
    ValueError::new(
        format!("{} (at column {})", e.message, e.column() + offset),
        e.hint,
    )
}

/// Flux RFC 26 schemes that only exist in the URI-like form (the others, `after`,
/// `afterany`, `afterok` and `afternotok`, are Slurm types too).
const FLUX_ONLY_SCHEMES: [&str; 3] = ["string", "begin-time", "fluid"];

fn is_flux_only(item: &str) -> bool {
    let scheme = item.split(':').next().unwrap_or("").trim();
    FLUX_ONLY_SCHEMES.contains(&scheme)
}

/// `s` split on `sep`, with each piece's character offset in `s`.
fn split_offsets(s: &str, sep: char) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = 0usize;
    for piece in s.split(sep) {
        out.push((s[..start].chars().count(), piece));
        start += piece.len() + sep.len_utf8();
    }
    out
}

/// Parse a `--dependency` value: Slurm's list (`afterok:1:2,afterany:3`, `after:4+10`,
/// `singleton`, `?` for any-of) and Flux RFC 26's command-line forms (`afterok:ID`,
/// `after:ID`, `begin-time:1767225600.5`, `string:NAME?type=in|out|inout&scope=user|global`),
/// mixed freely with ','. Entries are parsed by `lattice_apis::syntax::deps`.
///
/// * `?` (only one separator per list, as in Slurm): every entry of the list is an
///   alternative ([`DepEdge::any_of`], `singleton_any_of`); `aftercorr` cannot be one;
/// * `ID+MINUTES` ([`DepEdge::delay_seconds`]): after `after`, from the job's start; after
///   `afterok`, `afternotok` and `afterany` (a Lattice extension: Slurm documents the
///   delay for `after` only), from its end;
/// * `ID_TASK` ([`DepEdge::task`]): element TASK of the job array ID.
pub fn parse_slurm_dependency(s: &str) -> Result<DependencySpec, ValueError> {
    let raw = s.trim();
    if raw.is_empty() {
        return Err(ValueError::new("the dependency list is empty", DEP_HINT));
    }
    let lead = s.chars().count() - s.trim_start().chars().count();
    let items = split_offsets(raw, ',');
    let any_of = items
        .iter()
        .any(|(_, i)| !is_flux_only(i) && i.contains('?'));
    if any_of && items.len() > 1 {
        return Err(ValueError::new(
            "',' and '?' cannot be mixed in one dependency list",
            DEP_HINT,
        ));
    }
    let mut spec = DependencySpec::new(raw);
    spec.any_of = any_of;
    for (off, item) in items {
        let off = off + lead;
        if item.trim().is_empty() {
            return Err(ValueError::new(
                "empty entry in the dependency list",
                DEP_HINT,
            ));
        }
        if is_flux_only(item) {
            parse_flux_item(item.trim(), off, &mut spec)?;
            continue;
        }
        for (o, part) in split_offsets(item, '?') {
            parse_slurm_item(part, off + o, any_of, &mut spec)?;
        }
    }
    Ok(spec)
}

fn parse_flux_item(item: &str, offset: usize, spec: &mut DependencySpec) -> Result<(), ValueError> {
    use lattice_apis::syntax::deps::DependencyExpr as D;
    match lattice_apis::syntax::deps::parse_flux_dependency(item)
        .map_err(|e| from_parse_error(e, offset))?
    {
        D::BeginTime { epoch_seconds } => spec.set_begin_time(epoch_seconds),
        D::Symbol {
            name,
            access,
            scope,
        } => spec.push_symbol(SymbolDep {
            name,
            type_: access.as_str().to_string(),
            scope: scope.as_str().to_string(),
        }),
        D::Allocation { .. } => {
            return Err(ValueError::new(
                format!("{item:?} is not a Flux begin-time or string dependency"),
                DEP_HINT,
            ))
        }
    }
    Ok(())
}

fn parse_slurm_item(
    part: &str,
    offset: usize,
    alternative: bool,
    spec: &mut DependencySpec,
) -> Result<(), ValueError> {
    let t = part.trim();
    if t.is_empty() {
        return Err(ValueError::new(
            "empty entry in the dependency list",
            DEP_HINT,
        ));
    }
    if t.eq_ignore_ascii_case("singleton") {
        spec.set_singleton(alternative);
        return Ok(());
    }
    let lower;
    let mut t = match t.split_once(':') {
        Some((k, rest)) if k.chars().any(|c| c.is_ascii_uppercase()) => {
            lower = format!("{}:{rest}", k.to_ascii_lowercase());
            lower.as_str()
        }
        _ => t,
    };
    let burst;
    if let Some(rest) = t.strip_prefix("afterburstbuffer:") {
        spec.notes.push(format!(
            "{t:?}: burst buffers are not supported; waiting for the job to finish (any)"
        ));
        burst = format!("afterany:{rest}");
        t = &burst;
    }
    let offset = offset + (part.chars().count() - part.trim_start().chars().count());
    // `syntax::deps` takes `+MINUTES` after `after` ids only; Lattice also delays the
    // other types (from the job's end), so their offsets are parsed here.
    let deps = match t.split_once(':') {
        Some((k @ ("afterok" | "afternotok" | "afterany"), rest)) if rest.contains('+') => {
            parse_delayed_ids(k, rest, offset)?
        }
        _ => lattice_apis::syntax::deps::parse_slurm_dependency(t, Some("-"))
            .map_err(|e| from_parse_error(e, offset))?,
    };
    for d in deps {
        let lattice_apis::syntax::deps::DependencyExpr::Allocation {
            target,
            condition,
            delay_seconds,
        } = d
        else {
            continue;
        };
        let Some(condition) = edge_condition(condition) else {
            spec.set_singleton(alternative);
            continue;
        };
        if condition == DepCondition::Corresponding && alternative {
            return Err(ValueError::new(
                format!("aftercorr:{target} cannot be one of '?' alternatives: each array task waits for its own counterpart"),
                "join aftercorr with ',' (all must hold), or wait for one task with afterok:JOBID_TASK",
            ));
        }
        if let Some(secs) = delay_seconds.filter(|s| *s > MAX_DURATION_SECS) {
            return Err(ValueError::new(
                format!("{target}+{}: the delay is longer than 366 days", secs / 60),
                format!("use at most {} minutes", MAX_DURATION_SECS / 60),
            ));
        }
        // Array tasks: "123_4" is element 4 of the job array 123.
        let (id, task) = match target.split_once('_') {
            Some((p, i)) => match i.parse::<u64>() {
                Ok(n) if !i.is_empty() && i.len() <= 9 && i.bytes().all(|b| b.is_ascii_digit()) => {
                    (p.to_string(), Some(n))
                }
                _ => {
                    return Err(ValueError::new(
                        format!("{target:?} is not a job id or array task"),
                        "an array task is JOBID_INDEX with a numeric index, e.g. afterok:123_4",
                    ))
                }
            },
            None => (target, None),
        };
        if !valid_job_id(&id) {
            return Err(ValueError::new(format!("{id:?} is not a job id"), DEP_HINT));
        }
        spec.push_edge(DepEdge {
            target: id,
            condition,
            task,
            delay_seconds: delay_seconds.filter(|s| *s > 0),
            any_of: alternative,
        });
    }
    Ok(())
}

/// The ids of `kind:rest` (`afterok`, `afternotok`, `afterany`), some with a `+MINUTES`
/// delay, checked one by one by `syntax::deps` (errors keep their columns in `rest`,
/// which starts `offset + kind + 1` characters into the option).
fn parse_delayed_ids(
    kind: &str,
    rest: &str,
    offset: usize,
) -> Result<Vec<lattice_apis::syntax::deps::DependencyExpr>, ValueError> {
    let base = offset + kind.chars().count() + 1;
    let mut out = Vec::new();
    for (o, idt) in split_offsets(rest, ':') {
        let (id, minutes) = match idt.split_once('+') {
            Some((id, m)) => {
                let col = base + o + id.chars().count() + 2;
                let minutes = m
                    .parse::<u64>()
                    .ok()
                    .filter(|_| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| {
                        ValueError::new(
                            format!("invalid time offset {m:?} (at column {col})"),
                            format!("the offset is whole minutes, e.g. {kind}:123+10"),
                        )
                    })?;
                (id, Some(minutes))
            }
            None => (idt, None),
        };
        // The id alone, as `syntax::deps` sees it (`kind:` is `kind.len() + 1` characters).
        let sub = format!("{kind}:{id}");
        let deps =
            lattice_apis::syntax::deps::parse_slurm_dependency(&sub, Some("-")).map_err(|e| {
                let col = base + o + e.column().saturating_sub(kind.chars().count() + 1);
                ValueError::new(format!("{} (at column {col})", e.message), e.hint)
            })?;
        let secs = match minutes {
            Some(m) => Some(m.checked_mul(60).ok_or_else(|| {
                ValueError::new(
                    format!("{id}+{m}: the time offset is too large"),
                    format!("use at most {} minutes", MAX_DURATION_SECS / 60),
                )
            })?),
            None => None,
        };
        out.extend(deps.into_iter().map(|d| match d {
            lattice_apis::syntax::deps::DependencyExpr::Allocation {
                target, condition, ..
            } => lattice_apis::syntax::deps::DependencyExpr::Allocation {
                target,
                condition,
                delay_seconds: secs,
            },
            other => other,
        }));
    }
    Ok(out)
}

const DEPENDS_HINT: &str = "use ID[:CONDITION][,ID[:CONDITION]...] with CONDITION one of success (default), failure, any, corresponding, e.g. \"a1b2c3d4:success\" (for `after` write --dependency=after:ID)";

/// Parse Lattice's `--depends-on=ID[:COND],...` (parsed by `lattice_apis::syntax::deps`;
/// `ok`/`notok` are accepted for success/failure). Slurm and Flux syntax (`afterok:ID`,
/// `string:NAME?type=in`) are accepted too.
pub fn parse_depends_on(s: &str) -> Result<DependencySpec, ValueError> {
    let raw = s.trim();
    if raw.is_empty() {
        return Err(ValueError::new(
            "the dependency list is empty",
            DEPENDS_HINT,
        ));
    }
    let first = raw
        .split([':', ',', '?'])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    if first.starts_with("after") || first == "singleton" || is_flux_only(raw) {
        return parse_slurm_dependency(raw);
    }
    let normalized: String = split_offsets(raw, ',')
        .into_iter()
        .map(|(_, item)| match item.trim().rsplit_once(':') {
            Some((id, "ok")) => format!("{id}:success"),
            Some((id, "notok")) => format!("{id}:failure"),
            _ => item.trim().to_string(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let deps = lattice_apis::syntax::deps::parse_depends_on(&normalized).map_err(|e| {
        let hint = if e.message.contains("\"started\"") {
            "`started` is Slurm/Flux `after`: write --dependency=after:ID".to_string()
        } else if e.message.contains("\"mutex\"") || e.hint.contains("mutex") {
            DEPENDS_HINT.to_string()
        } else {
            e.hint.clone()
        };
        ValueError::new(
            format!("{} (in {normalized:?} at column {})", e.message, e.column()),
            hint,
        )
    })?;
    let mut spec = DependencySpec::new(raw);
    for d in deps {
        let lattice_apis::syntax::deps::DependencyExpr::Allocation {
            target, condition, ..
        } = d
        else {
            continue;
        };
        let Some(condition) = edge_condition(condition) else {
            return Err(ValueError::new(
                format!("{target}:mutex is a DAG lock"),
                "for a standalone allocation write --dependency=singleton (one job of this name and user at a time)",
            ));
        };
        if !valid_job_id(&target) {
            return Err(ValueError::new(
                format!("{target:?} is not an allocation id"),
                DEPENDS_HINT,
            ));
        }
        spec.push_edge(DepEdge::new(target, condition));
    }
    Ok(spec)
}

/// A parsed `--data-mount=SOURCE:TARGET[:ro|:rw]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DataMountSpec {
    /// e.g. `s3://bucket/dataset`.
    pub source: String,
    /// Absolute mount path.
    pub target: String,
    /// Read-write when `:rw` was given.
    pub read_write: bool,
}

/// Parse `--data-mount`.
pub fn parse_data_mount(s: &str) -> Result<DataMountSpec, ValueError> {
    const HINT: &str = "use SOURCE:/TARGET[:ro|:rw], e.g. \"s3://bucket/dataset:/data\"";
    let mut t = s.trim();
    let mut rw = false;
    if let Some(x) = t.strip_suffix(":rw") {
        t = x;
        rw = true;
    } else if let Some(x) = t.strip_suffix(":ro") {
        t = x;
    }
    // The target is the last ":/..." component.
    let idx = t
        .rfind(":/")
        .ok_or_else(|| ValueError::new(format!("{t:?} has no :/TARGET"), HINT))?;
    let (src, tgt) = (&t[..idx], &t[idx + 1..]);
    if src.is_empty() {
        return Err(ValueError::new("the source is empty", HINT));
    }
    if tgt.len() < 2 || tgt.split('/').any(|c| c == "..") {
        return Err(ValueError::new(
            format!("{tgt:?} is not a usable mount path"),
            HINT,
        ));
    }
    Ok(DataMountSpec {
        source: src.to_string(),
        target: tgt.to_string(),
        read_write: rw,
    })
}

/// A parsed `--expose=[NAME:]PORT[/tcp|/udp]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExposeSpec {
    /// Port name (DNS label); `port-<N>` when not given.
    pub name: String,
    /// 1–65535.
    pub port: u32,
    /// udp instead of tcp.
    pub udp: bool,
}

/// Parse `--expose`.
pub fn parse_expose(s: &str) -> Result<ExposeSpec, ValueError> {
    const HINT: &str = "use PORT, NAME:PORT or PORT/udp, e.g. \"8080\" or \"http:8080\"";
    let t = s.trim();
    let (t, udp) = match t.rsplit_once('/') {
        Some((p, "udp")) => (p, true),
        Some((p, "tcp")) => (p, false),
        Some(_) => {
            return Err(ValueError::new(
                format!("{t:?} has an unknown protocol"),
                HINT,
            ))
        }
        None => (t, false),
    };
    let (name, port) = match t.split_once(':') {
        Some((n, p)) => (Some(n), p),
        None => (None, t),
    };
    let port = digits(port)
        .filter(|p| (1..=65535).contains(p))
        .ok_or_else(|| ValueError::new(format!("{port:?} is not a port (1-65535)"), HINT))?
        as u32;
    let name = match name {
        Some(n)
            if !n.is_empty()
                && n.len() <= 63
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') =>
        {
            n.to_string()
        }
        Some(n) => {
            return Err(ValueError::new(
                format!("{n:?} is not a port name (lowercase letters, digits, '-')"),
                HINT,
            ))
        }
        None => format!("port-{port}"),
    };
    Ok(ExposeSpec { name, port, udp })
}

/// Parse `KEY=VALUE` (`--env`, `--export` entries).
pub fn parse_env_pair(s: &str) -> Result<(String, String), ValueError> {
    const HINT: &str =
        "use KEY=VALUE with KEY made of letters, digits and '_' (e.g. \"OMP_NUM_THREADS=8\")";
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| ValueError::new(format!("{s:?} has no '='"), HINT))?;
    let k = k.trim();
    let ok = !k.is_empty()
        && !k.as_bytes()[0].is_ascii_digit()
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !ok {
        return Err(ValueError::new(
            format!("{k:?} is not an environment variable name"),
            HINT,
        ));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Checkpoint strategies accepted by `--checkpoint`.
pub const CHECKPOINT_STRATEGIES: &[&str] = &["auto", "manual", "signal", "grpc", "shmem", "none"];

/// Parse `--checkpoint`.
pub fn parse_checkpoint(s: &str) -> Result<String, ValueError> {
    let t = s.trim().to_ascii_lowercase();
    if CHECKPOINT_STRATEGIES.contains(&t.as_str()) {
        Ok(t)
    } else {
        Err(ValueError::new(
            format!("{s:?} is not a checkpoint strategy"),
            format!("use one of {}", CHECKPOINT_STRATEGIES.join(", ")),
        ))
    }
}

/// Parse `--preemption-class` (0–10).
pub fn parse_preemption_class(s: &str) -> Result<i32, ValueError> {
    match digits(s.trim()) {
        Some(n) if n <= 10 => Ok(n as i32),
        _ => Err(ValueError::new(
            format!("{s:?} is not a preemption class"),
            "use 0 (best effort) … 5 (normal, the default) … 10 (never preempted)",
        )),
    }
}

/// Parse `--scale-target`: a number (`0.8`) or a value with a unit (`100ms`).
pub fn parse_scale_target(s: &str) -> Result<serde_json::Value, ValueError> {
    let t = s.trim();
    if t.is_empty() || t.len() > 64 {
        return Err(ValueError::new(
            "the scale target is empty or too long",
            "use a number (\"0.8\") or a value with a unit (\"100ms\")",
        ));
    }
    match t.parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => Ok(serde_json::json!(n)),
        Ok(_) => Err(ValueError::new(
            format!("{t:?} must be a non-negative number"),
            "use e.g. \"0.8\"",
        )),
        Err(_) => Ok(serde_json::Value::String(t.to_string())),
    }
}

const BEGIN_HINT: &str = "use now+N[seconds|minutes|hours|days|weeks] (e.g. now+1hour), HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY][-HH:MM[:SS]], midnight, noon, teatime, today or tomorrow (local time)";

/// Parse Slurm's `--begin` (`now+1hour`, `16:00`, `2026-01-20T12:34`, `12/24-08:00`,
/// `tomorrow`, ...) into seconds since the UNIX epoch, in the local time zone as sbatch
/// does; `now` is the submission time. A time of day that has passed means tomorrow.
pub fn parse_begin(s: &str, now: chrono::DateTime<chrono::Local>) -> Result<i64, ValueError> {
    use chrono::{Datelike, Duration, Local, NaiveDate, NaiveDateTime, NaiveTime, TimeZone};
    let t = s.trim().to_ascii_lowercase();
    let bad = || ValueError::new(format!("{:?} is not a begin time", s.trim()), BEGIN_HINT);
    let local = |dt: NaiveDateTime| -> Result<i64, ValueError> {
        Local
            .from_local_datetime(&dt)
            .earliest()
            .map(|d| d.timestamp())
            .ok_or_else(bad)
    };
    let time_of_day = |x: &str| -> Option<NaiveTime> {
        let parts: Vec<&str> = x.split(':').collect();
        let num = |p: &str| (!p.is_empty() && p.len() <= 2).then(|| digits(p)).flatten();
        let (h, m, sec) = match parts.as_slice() {
            [h, m] => (num(h)?, num(m)?, 0),
            [h, m, s] => (num(h)?, num(m)?, num(s)?),
            _ => return None,
        };
        NaiveTime::from_hms_opt(h as u32, m as u32, sec as u32)
    };
    let today = now.date_naive();
    // A time of day today, or tomorrow once it has passed.
    let next = |tod: NaiveTime| -> Result<i64, ValueError> {
        let at = local(today.and_time(tod))?;
        if at < now.timestamp() {
            local((today + Duration::days(1)).and_time(tod))
        } else {
            Ok(at)
        }
    };
    if let Some(rest) = t.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now.timestamp());
        }
        let rest = rest.strip_prefix('+').ok_or_else(bad)?;
        let n_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n = digits(&rest[..n_len]).ok_or_else(bad)?;
        let unit: i64 = match &rest[n_len..] {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 604_800,
            _ => return Err(bad()),
        };
        let n = i64::try_from(n)
            .ok()
            .filter(|n| *n <= 10 * 366 * 86_400)
            .ok_or_else(bad)?;
        return Ok(now.timestamp() + n * unit);
    }
    let named = |h: u32| NaiveTime::from_hms_opt(h, 0, 0).ok_or_else(bad);
    match t.as_str() {
        "midnight" => return local((today + Duration::days(1)).and_time(named(0)?)),
        "noon" => return next(named(12)?),
        "elevenses" => return next(named(11)?),
        "fika" => return next(named(15)?),
        "teatime" => return next(named(16)?),
        "today" => return local(today.and_time(named(0)?)),
        "tomorrow" => return local((today + Duration::days(1)).and_time(named(0)?)),
        _ => {}
    }
    // YYYY-MM-DD[THH:MM[:SS]]
    if t.len() >= 10 && t.as_bytes().get(4) == Some(&b'-') {
        let (d, tod) = match t.split_once('t') {
            Some((d, x)) => (d, Some(time_of_day(x).ok_or_else(bad)?)),
            None => (t.as_str(), None),
        };
        let date = NaiveDate::parse_from_str(d, "%Y-%m-%d").map_err(|_| bad())?;
        return local(date.and_time(tod.unwrap_or_default()));
    }
    // MM/DD[/YY][-HH:MM[:SS]] (also MM.DD)
    if t.contains('/') || (t.contains('.') && !t.contains(':')) {
        let (d, tod) = match t.split_once('-') {
            Some((d, x)) => (d, Some(time_of_day(x).ok_or_else(bad)?)),
            None => (t.as_str(), None),
        };
        let p: Vec<u64> = d
            .split(['/', '.'])
            .map(|x| digits(x).ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        let (m, day, y) = match p.as_slice() {
            [m, d] => (*m, *d, None),
            [m, d, y] => (*m, *d, Some(if *y < 100 { 2000 + *y } else { *y })),
            _ => return Err(bad()),
        };
        let year = y.map_or(today.year(), |y| y as i32);
        let date = NaiveDate::from_ymd_opt(year, m as u32, day as u32).ok_or_else(bad)?;
        let mut at = local(date.and_time(tod.unwrap_or_default()))?;
        if y.is_none() && at < now.timestamp() {
            let date = NaiveDate::from_ymd_opt(year + 1, m as u32, day as u32).ok_or_else(bad)?;
            at = local(date.and_time(tod.unwrap_or_default()))?;
        }
        return Ok(at);
    }
    if let Some(tod) = time_of_day(&t) {
        return next(tod);
    }
    Err(bad())
}
