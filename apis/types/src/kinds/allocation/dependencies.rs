//! `spec.dependsOn`: what an allocation waits for (`Dependency`, its condition and the
//! Flux `string` scheme's symbols), its manifest forms (long, short, string), its JSON
//! Schema and its checks. The string grammars are [`crate::syntax::deps`].

#[allow(unused_imports)]
use super::*;

/// Dependency condition (the seed's table, plus Slurm/Flux `after`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum DependencyCondition {
    /// Run after the dependency completes successfully (default; Slurm/Flux `afterok`).
    #[default]
    Success,
    /// Run after the dependency fails (`afternotok`).
    Failure,
    /// Run after the dependency finishes either way, cancellation included (`afterany`).
    Any,
    /// Task groups: task N waits for task N of the dependency (`aftercorr`).
    Corresponding,
    /// Run once the dependency has started running, or ended after starting (Slurm/Flux
    /// `after`). A dependency that ends without ever starting can never satisfy it.
    /// Standalone allocations only (not DAG edges).
    Started,
    /// `ref` names a lock, not an allocation (Slurm `singleton` on that name): at most
    /// one allocation of the same user and tenant holding the lock runs at a time. An
    /// allocation holds the locks it declares with `mutex` and its job name
    /// (`spec.tags.name`, else its name), so a mutex also excludes Slurm `singleton`
    /// jobs of that name. Holders run in submission order.
    Mutex,
}

impl DependencyCondition {
    /// The allowed values, for messages.
    pub const ALLOWED: &'static str = "success, failure, any, corresponding, started, mutex";
    /// The conditions of DAG edges and `--depends-on`, for messages (`started`, Slurm's
    /// `after`, is for standalone allocations' `--dependency`).
    pub const EDGE_ALLOWED: &'static str = "success, failure, any, corresponding, mutex";

    /// Parse a condition name (`success`, ...).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "success" => Some(Self::Success),
            "failure" => Some(Self::Failure),
            "any" => Some(Self::Any),
            "corresponding" => Some(Self::Corresponding),
            "started" => Some(Self::Started),
            "mutex" => Some(Self::Mutex),
            _ => None,
        }
    }

    /// The manifest name (`success`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::Any => "any",
            Self::Corresponding => "corresponding",
            Self::Started => "started",
            Self::Mutex => "mutex",
        }
    }

    /// The Slurm/Flux spelling (`afterok`, `afternotok`, `afterany`, `aftercorr`, `after`,
    /// `singleton`).
    pub fn slurm_name(self) -> &'static str {
        match self {
            Self::Success => "afterok",
            Self::Failure => "afternotok",
            Self::Any => "afterany",
            Self::Corresponding => "aftercorr",
            Self::Started => "after",
            Self::Mutex => "singleton",
        }
    }

    /// Parse a Slurm/Flux spelling ([`slurm_name`](Self::slurm_name)).
    pub fn from_slurm_name(s: &str) -> Option<Self> {
        [
            Self::Success,
            Self::Failure,
            Self::Any,
            Self::Corresponding,
            Self::Started,
            Self::Mutex,
        ]
        .into_iter()
        .find(|c| c.slurm_name() == s)
    }
}

impl fmt::Display for DependencyCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Flux RFC 26 `string` scheme access type of a symbolic dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SymbolType {
    /// Wait for every current writer of the symbol (earlier `out`/`inout` allocations).
    In,
    /// Declare this allocation a writer: later `in`/`inout` allocations wait for it.
    Out,
    /// Both: wait for the current writers, then become the writer (chains allocations).
    Inout,
}

impl SymbolType {
    /// Parse `in` | `out` | `inout`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::In, Self::Out, Self::Inout]
            .into_iter()
            .find(|t| t.as_str() == s)
    }

    /// `in` | `out` | `inout`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::In => "in",
            Self::Out => "out",
            Self::Inout => "inout",
        }
    }

    /// Whether this declares a writer (`out`, `inout`).
    pub fn writes(self) -> bool {
        matches!(self, Self::Out | Self::Inout)
    }

    /// Whether this waits for writers (`in`, `inout`).
    pub fn reads(self) -> bool {
        matches!(self, Self::In | Self::Inout)
    }
}

/// Flux RFC 26 `string` scheme scope of a symbolic dependency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SymbolScope {
    /// Allocations of the same user (annotation `lattice.dev/user`) in the same tenant (default).
    #[default]
    User,
    /// Every allocation of the tenant.
    Global,
}

impl SymbolScope {
    /// Parse `user` | `global`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::User, Self::Global]
            .into_iter()
            .find(|t| t.as_str() == s)
    }

    /// `user` | `global`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Global => "global",
        }
    }
}

/// One entry of `spec.dependsOn`. Exactly one of these is set:
///
/// * `ref` (+ `condition`): another allocation of the tenant, by name or uid —
///   `{ref: preprocess, condition: success}`; the seed's short form
///   `{preprocess: success}` and the CLI's `"preprocess:success"` are accepted on input
///   and normalized to the long form; with `condition: mutex`, `ref` is a lock name
///   (`{gpu-lock: mutex}`), see [`DependencyCondition::Mutex`];
/// * `beginTime`: not before this wall-clock time, in seconds since the UNIX epoch
///   (Flux `begin-time`, Slurm `--begin`) — `{beginTime: 1767225600}`;
/// * `symbol` (+ `type`, `scope`): a Flux RFC 26 `string` dependency —
///   `{symbol: checkpoint, type: inout, scope: user}`;
/// * `singleton: true`: Slurm `singleton`, at most one allocation with the same job name
///   (`spec.tags.name`, else the allocation name) and user runs at a time.
///
/// Options of standalone allocations' entries (all optional; DAG edges take none):
///
/// * `taskIndex` (with `ref` on a job array, condition success | failure | any |
///   started): wait for that one element of the array, not the whole array (Slurm
///   `afterok:ID_TASK`) — `{ref: sweep, taskIndex: 3}`;
/// * `delay` (with `ref`, condition success | failure | any | started): hold only this
///   long after the event — the dependency's recorded start for `started`, its recorded
///   end otherwise (Slurm `after:ID+MINUTES`) — a duration (`"90s"`, `"5m"`, `"1h"`; a
///   bare string number is minutes as in Slurm) or a number of seconds;
/// * `anyOf: true` (with `ref` — not `corresponding` or `mutex` —, `beginTime` or
///   `singleton`): the entry is one of the alternatives of the allocation's any-of group
///   (Slurm's `?` separator): the group holds once any of its entries holds, and can
///   never hold only when none of them can. Entries without `anyOf` must all hold, as
///   well as the group.
///
/// (An allocation named like one of these keys — `type`, `scope`, `symbol`,
/// `singleton`, `beginTime`, `taskIndex`, `delay`, `anyOf` — needs the long form
/// `{ref: NAME}`.)
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dependency {
    /// Name or uid of the allocation (or DAG task) depended on; empty for the other
    /// kinds of dependency. Alias: `allocation`.
    pub ref_: String,
    /// With `ref`: success (default) | failure | any | corresponding | started | mutex.
    pub condition: DependencyCondition,
    /// Not before this time (seconds since the UNIX epoch).
    pub begin_time: Option<f64>,
    /// Flux `string` scheme symbol.
    pub symbol: Option<String>,
    /// With `symbol`: in | out | inout.
    pub type_: Option<SymbolType>,
    /// With `symbol`: user (default) | global.
    pub scope: SymbolScope,
    /// Slurm `singleton`.
    pub singleton: bool,
    /// With `ref` on a job array: the one element waited for (Slurm `ID_TASK`).
    pub task_index: Option<u64>,
    /// With `ref`: how long after the dependency's start (`started`) or end (the other
    /// conditions) the entry holds, as written (a duration, see [`parse_duration`]; a
    /// number of seconds is stored as `"Ns"`).
    pub delay: Option<String>,
    /// The entry belongs to the allocation's any-of group (Slurm `?`).
    pub any_of: bool,
}

/// Largest `taskIndex` (task ranges take at most 9 digits).
pub use crate::syntax::tasks::MAX_TASK_INDEX;

/// What a [`Dependency`] waits for (a borrowed view).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DependencyKind<'a> {
    /// Another allocation, by name or uid.
    Allocation {
        /// Name or uid.
        target: &'a str,
        /// When it holds.
        condition: DependencyCondition,
    },
    /// A wall-clock time (epoch seconds).
    BeginTime(f64),
    /// A Flux `string` symbol.
    Symbol {
        /// The symbol.
        name: &'a str,
        /// in | out | inout.
        type_: SymbolType,
        /// user | global.
        scope: SymbolScope,
    },
    /// Slurm `singleton`.
    Singleton,
    /// A lock by name (`{ref: NAME, condition: mutex}`).
    Mutex(&'a str),
}

impl Dependency {
    /// `{ref: target, condition}`.
    pub fn on(target: impl Into<String>, condition: DependencyCondition) -> Self {
        Self {
            ref_: target.into(),
            condition,
            ..Default::default()
        }
    }

    /// `{beginTime: epoch_seconds}`.
    pub fn begin_at(epoch_seconds: f64) -> Self {
        Self {
            begin_time: Some(epoch_seconds),
            ..Default::default()
        }
    }

    /// `{symbol, type, scope}`.
    pub fn symbolic(name: impl Into<String>, type_: SymbolType, scope: SymbolScope) -> Self {
        Self {
            symbol: Some(name.into()),
            type_: Some(type_),
            scope,
            ..Default::default()
        }
    }

    /// `{singleton: true}`.
    pub fn singleton() -> Self {
        Self {
            singleton: true,
            ..Default::default()
        }
    }

    /// This entry on element `index` of the job array it names (`taskIndex`).
    pub fn task(mut self, index: u64) -> Self {
        self.task_index = Some(index);
        self
    }

    /// This entry, holding only `delay` (a duration, e.g. `"5m"`) after the event.
    pub fn delayed(mut self, delay: impl Into<String>) -> Self {
        self.delay = Some(delay.into());
        self
    }

    /// This entry as one alternative of the any-of group (`anyOf: true`).
    pub fn alternative(mut self) -> Self {
        self.any_of = true;
        self
    }

    /// `delay` in seconds; `None` when unset or not a duration (admission rejects that).
    pub fn delay_seconds(&self) -> Option<u64> {
        self.delay.as_deref().and_then(|d| parse_duration(d).ok())
    }

    /// The first option set on this entry that only standalone allocations understand
    /// (`taskIndex`, `delay`, `anyOf`), for validators of DAG edges.
    pub fn standalone_option(&self) -> Option<&'static str> {
        [
            ("taskIndex", self.task_index.is_some()),
            ("delay", self.delay.is_some()),
            ("anyOf", self.any_of),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        .map(|(f, _)| f)
    }

    /// The kinds set on this entry (a valid entry has exactly one).
    fn kinds_set(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if !self.ref_.is_empty() {
            v.push("ref");
        }
        if self.begin_time.is_some() {
            v.push("beginTime");
        }
        if self.symbol.is_some() {
            v.push("symbol");
        }
        if self.singleton {
            v.push("singleton");
        }
        v
    }

    /// What this entry waits for; `None` for an entry that admission rejects (no kind,
    /// or several).
    pub fn kind(&self) -> Option<DependencyKind<'_>> {
        if self.kinds_set().len() != 1 {
            return None;
        }
        if !self.ref_.is_empty() {
            if self.condition == DependencyCondition::Mutex {
                return Some(DependencyKind::Mutex(&self.ref_));
            }
            return Some(DependencyKind::Allocation {
                target: &self.ref_,
                condition: self.condition,
            });
        }
        if let Some(t) = self.begin_time {
            return Some(DependencyKind::BeginTime(t));
        }
        if let Some(s) = &self.symbol {
            return Some(DependencyKind::Symbol {
                name: s,
                type_: self.type_?,
                scope: self.scope,
            });
        }
        Some(DependencyKind::Singleton)
    }

    /// The RFC 26 description of this dependency (how its `dependency-add` and
    /// `dependency-remove` events are matched): `afterok:prep`, `after:prep`,
    /// `afterok:sweep_3` (`taskIndex`), `after:prep+300s` (`delay`),
    /// `begin-time:1767225600`, `string:ckpt?scope=user&type=inout`, `singleton`,
    /// `mutex:gpu-lock`. (`anyOf` does not change it.)
    pub fn description(&self) -> String {
        match self.kind() {
            Some(DependencyKind::Allocation { target, condition }) => {
                let mut s = format!("{}:{target}", condition.slurm_name());
                if let Some(i) = self.task_index {
                    s.push_str(&format!("_{i}"));
                }
                match (self.delay_seconds(), &self.delay) {
                    (Some(secs), _) => s.push_str(&format!("+{secs}s")),
                    (None, Some(d)) => s.push_str(&format!("+{d}")),
                    (None, None) => {}
                }
                s
            }
            Some(DependencyKind::BeginTime(t)) => format!("begin-time:{t}"),
            Some(DependencyKind::Symbol { name, type_, scope }) => format!(
                "string:{name}?scope={}&type={}",
                scope.as_str(),
                type_.as_str()
            ),
            Some(DependencyKind::Singleton) => "singleton".to_string(),
            Some(DependencyKind::Mutex(name)) => format!("mutex:{name}"),
            None => format!("invalid:{}", self.kinds_set().join("+")),
        }
    }

    pub(crate) fn validate(
        &self,
        dp: &str,
        self_name: Option<&str>,
        task_group: bool,
        errs: &mut Errors,
    ) {
        let set = self.kinds_set();
        match set.as_slice() {
            [] => {
                errs.push(
                    dp.to_string(),
                    "names nothing to wait for: set ref (an allocation name or uid, with condition), beginTime (epoch seconds), symbol (with type in|out|inout) or singleton: true",
                );
                return;
            }
            [_] => {}
            [first, rest @ ..] => {
                errs.push(
                    format!("{dp}.{}", rest[0]),
                    format!(
                        "set only one of ref, beginTime, symbol, singleton per entry (this one also has {first}); split it into separate dependsOn entries"
                    ),
                );
                return;
            }
        }
        if !self.ref_.is_empty() && self.condition == DependencyCondition::Mutex {
            if let Some(msg) = lock_name_error(&self.ref_) {
                errs.push(format!("{dp}.ref"), msg);
            }
        } else if !self.ref_.is_empty() {
            if let Some(e) = validate_dns1123_name(format_args!("{dp}.ref"), &self.ref_) {
                errs.0.push(e);
            } else if Some(self.ref_.as_str()) == self_name {
                errs.push(
                    format!("{dp}.ref"),
                    "an allocation cannot depend on itself; remove this entry",
                );
            }
            if self.condition == DependencyCondition::Corresponding && !task_group {
                errs.push(
                    format!("{dp}.condition"),
                    "`corresponding` links task N to task N of the dependency and needs spec.taskGroup; add a taskGroup or use success|failure|any|started",
                );
            }
        }
        self.validate_options(dp, errs);
        if let Some(t) = self.begin_time {
            if !t.is_finite() || !(0.0..=MAX_BEGIN_TIME).contains(&t) {
                errs.push(
                    format!("{dp}.beginTime"),
                    format!("{t} is not a time: use seconds since the UNIX epoch, e.g. 1767225600 (2026-01-01T00:00:00Z)"),
                );
            }
        }
        if let Some(s) = &self.symbol {
            if s.is_empty()
                || s.len() > 253
                || s.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                errs.push(
                    format!("{dp}.symbol"),
                    format!(
                        "{:?} must be 1-253 characters without spaces, e.g. \"checkpoint\"",
                        truncate(s, 60)
                    ),
                );
            }
            if self.type_.is_none() {
                errs.push(
                    format!("{dp}.type"),
                    "is required with symbol: in (wait for the writers), out (become a writer) or inout (both; chains allocations)",
                );
            }
        }
    }
}

impl Dependency {
    /// `taskIndex`, `delay` and `anyOf`: each names the entries it applies to, and the fix.
    fn validate_options(&self, dp: &str, errs: &mut Errors) {
        use DependencyCondition as C;
        let on_ref = !self.ref_.is_empty();
        if let Some(i) = self.task_index {
            let p = format!("{dp}.taskIndex");
            if !on_ref {
                errs.push(
                    p,
                    "needs ref (the job array): write {ref: ARRAY, taskIndex: N}, e.g. {ref: sweep, taskIndex: 3}",
                );
            } else if self.condition == C::Mutex {
                errs.push(
                    p,
                    "condition mutex names a lock, not a job array; remove taskIndex",
                );
            } else if self.condition == C::Corresponding {
                errs.push(
                    p,
                    "`corresponding` already pairs every element with the element of the same index; remove taskIndex, or use success|failure|any|started to wait for this one element",
                );
            } else if i > MAX_TASK_INDEX {
                errs.push(
                    p,
                    format!("{i} is not a task index: indices go up to {MAX_TASK_INDEX}"),
                );
            }
        }
        if let Some(d) = &self.delay {
            let p = format!("{dp}.delay");
            if !on_ref {
                errs.push(
                    p,
                    "needs ref: a delay counts from another allocation's start (condition started) or end; for a fixed time use beginTime",
                );
            } else if matches!(self.condition, C::Mutex | C::Corresponding) {
                errs.push(
                    p,
                    format!(
                        "applies to conditions success, failure, any and started, not {}; remove delay",
                        self.condition
                    ),
                );
            } else if let Err(e) = parse_duration(d) {
                errs.push(p, e);
            }
        }
        if self.any_of {
            let p = format!("{dp}.anyOf");
            if self.symbol.is_some() {
                errs.push(
                    p,
                    "a symbol (Flux string dependency) cannot be an alternative: it declares a reader or writer; remove anyOf",
                );
            } else if on_ref && self.condition == C::Mutex {
                errs.push(
                    p,
                    "a mutex is a lock this allocation holds, not an alternative; remove anyOf",
                );
            } else if on_ref && self.condition == C::Corresponding {
                errs.push(
                    p,
                    "`corresponding` is evaluated per array element and cannot be an alternative; remove anyOf (or wait for one element with success and taskIndex)",
                );
            }
        }
    }
}

/// Largest accepted `beginTime` (year 9999).
const MAX_BEGIN_TIME: f64 = 253_402_300_799.0;

/// Why `name` is not a valid lock name (`mutex`), if it is not: 1-253 letters, digits,
/// `-`, `_` or `.` (what a job name used with Slurm `singleton` usually is).
pub(crate) fn lock_name_error(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (!ok).then(|| {
        format!(
            "{:?} is not a lock name: use 1-253 letters, digits, '-', '_' or '.', e.g. \"gpu-lock\"",
            truncate(name, 60)
        )
    })
}

impl Serialize for Dependency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        if !self.ref_.is_empty() {
            m.serialize_entry("ref", &self.ref_)?;
            m.serialize_entry("condition", &self.condition)?;
        }
        if let Some(t) = self.begin_time {
            m.serialize_entry("beginTime", &t)?;
        }
        if let Some(sym) = &self.symbol {
            m.serialize_entry("symbol", sym)?;
            if let Some(t) = self.type_ {
                m.serialize_entry("type", &t)?;
            }
            m.serialize_entry("scope", &self.scope)?;
        }
        if self.singleton {
            m.serialize_entry("singleton", &true)?;
        }
        if let Some(i) = self.task_index {
            m.serialize_entry("taskIndex", &i)?;
        }
        if let Some(d) = &self.delay {
            m.serialize_entry("delay", d)?;
        }
        if self.any_of {
            m.serialize_entry("anyOf", &true)?;
        }
        m.end()
    }
}

impl JsonSchema for Dependency {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Dependency".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let cond = g.subschema_for::<DependencyCondition>();
        let ty = g.subschema_for::<SymbolType>();
        let scope = g.subschema_for::<SymbolScope>();
        schemars::json_schema!({
            "description": "A dependency. Exactly one of: ref (+condition) on another allocation by name or uid; beginTime (epoch seconds); symbol (+type, scope), a Flux RFC 26 string dependency; singleton: true (Slurm singleton). Standalone allocations' entries may add taskIndex and delay (with ref) and anyOf. Short forms {NAME: CONDITION} and \"NAME[:CONDITION]\" are accepted and normalized to {ref, condition}.",
            "anyOf": [
                {
                    "type": "object",
                    "properties": {
                        "ref": { "type": "string", "description": "Name or uid of the allocation (or DAG task) depended on; with condition mutex, the lock name." },
                        "allocation": { "type": "string", "description": "Alias of ref." },
                        "condition": cond.clone(),
                        "beginTime": { "type": "number", "minimum": 0, "description": "Not before this time, in seconds since the UNIX epoch (Flux begin-time, Slurm --begin)." },
                        "symbol": { "type": "string", "description": "Flux RFC 26 string dependency: the symbol." },
                        "type": ty,
                        "scope": scope,
                        "singleton": { "type": "boolean", "description": "Slurm singleton: at most one allocation with the same job name and user runs at a time." },
                        "taskIndex": { "type": "integer", "minimum": 0, "maximum": MAX_TASK_INDEX, "description": "With ref on a job array (condition success, failure, any or started): wait for this one element (Slurm afterok:ID_TASK)." },
                        "delay": {
                            "anyOf": [{ "type": "string" }, { "type": "integer", "minimum": 0 }],
                            "description": "With ref (condition success, failure, any or started): hold only this long after the dependency's recorded start (started) or end (the others), e.g. \"90s\", \"5m\" (Slurm after:ID+MINUTES); a number is seconds."
                        },
                        "anyOf": { "type": "boolean", "description": "This entry is one alternative of the allocation's any-of group (Slurm '?'): the group holds once any of its entries holds; entries without anyOf must all hold. With ref (not corresponding or mutex), beginTime or singleton." }
                    },
                    "additionalProperties": false
                },
                {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": 1,
                    "additionalProperties": cond
                },
                { "type": "string" }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for Dependency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Dependency;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a dependency {ref: NAME, condition: success|failure|any|corresponding|started|mutex[, taskIndex: N][, delay: DURATION][, anyOf: true]}, {NAME: CONDITION}, {beginTime: EPOCH_SECONDS}, {symbol: NAME, type: in|out|inout, scope: user|global} or {singleton: true}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Dependency, E> {
                // "name" or "name:condition" (the CLI's --depends-on form).
                let (r, c) = match v.rsplit_once(':') {
                    Some((r, c)) => (
                        r,
                        DependencyCondition::parse(c).ok_or_else(|| {
                            E::custom(format!(
                                "unknown dependency condition `{c}`, expected one of {}",
                                DependencyCondition::ALLOWED
                            ))
                        })?,
                    ),
                    None => (v, DependencyCondition::Success),
                };
                Ok(Dependency::on(r, c))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Dependency, A::Error> {
                const FIELDS: &str =
                    "`ref`, `condition`, `beginTime`, `symbol`, `type`, `scope`, `singleton`, `taskIndex`, `delay`, `anyOf` (or a single `NAME: CONDITION` pair)";
                let mut out = Dependency::default();
                let mut ref_seen = false;
                let mut condition: Option<DependencyCondition> = None;
                let mut scope: Option<SymbolScope> = None;
                let mut short: Option<(String, DependencyCondition)> = None;
                let mut keys = 0usize;
                while let Some(key) = map.next_key::<String>()? {
                    keys += 1;
                    match key.as_str() {
                        "ref" | "allocation" => {
                            if ref_seen {
                                return Err(de::Error::custom(
                                    "`ref` given twice (ref and allocation are aliases); keep one",
                                ));
                            }
                            ref_seen = true;
                            out.ref_ = map.next_value()?;
                        }
                        "condition" => condition = Some(map.next_value()?),
                        "beginTime" => out.begin_time = Some(map.next_value()?),
                        "symbol" => out.symbol = Some(map.next_value()?),
                        "type" => out.type_ = Some(map.next_value()?),
                        "scope" => scope = Some(map.next_value()?),
                        "singleton" => out.singleton = map.next_value()?,
                        "taskIndex" => out.task_index = Some(map.next_value()?),
                        "delay" => out.delay = Some(map.next_value::<DelayValue>()?.0),
                        "anyOf" => out.any_of = map.next_value()?,
                        _ => {
                            if short.is_some() || keys > 1 {
                                return Err(de::Error::custom(format!(
                                    "unknown field `{key}`, expected one of {FIELDS}"
                                )));
                            }
                            let c: DependencyCondition = map.next_value()?;
                            short = Some((key, c));
                        }
                    }
                }
                if let Some((k, c)) = short {
                    if keys > 1 {
                        return Err(de::Error::custom(format!(
                            "unknown field `{k}`, expected one of {FIELDS}"
                        )));
                    }
                    return Ok(Dependency::on(k, c));
                }
                if let Some(c) = condition {
                    if !ref_seen {
                        return Err(de::Error::custom(
                            "`condition` needs `ref` (the allocation it applies to): write {ref: NAME, condition: CONDITION}",
                        ));
                    }
                    out.condition = c;
                }
                if out.symbol.is_none() {
                    if out.type_.is_some() {
                        return Err(de::Error::custom(
                            "`type` needs `symbol`: write {symbol: NAME, type: in|out|inout}",
                        ));
                    }
                    if scope.is_some() {
                        return Err(de::Error::custom(
                            "`scope` needs `symbol`: write {symbol: NAME, type: in|out|inout, scope: user|global}",
                        ));
                    }
                }
                out.scope = scope.unwrap_or_default();
                if ref_seen && out.ref_.is_empty() {
                    return Err(de::Error::custom(
                        "`ref` is empty: name the allocation (or its uid) depended on",
                    ));
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

/// A `delay` as written: a duration string, or a whole number of seconds (kept as `"Ns"`).
struct DelayValue(String);

impl<'de> Deserialize<'de> for DelayValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DelayValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a delay: a duration such as \"90s\" or \"5m\", or a whole number of seconds",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DelayValue, E> {
                Ok(DelayValue(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DelayValue, E> {
                Ok(DelayValue(format!("{v}s")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DelayValue, E> {
                u64::try_from(v)
                    .map(|v| DelayValue(format!("{v}s")))
                    .map_err(|_| {
                        E::custom(format!(
                            "delay {v} is negative; write a duration such as \"90s\" or \"5m\""
                        ))
                    })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<DelayValue, E> {
                if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= u64::MAX as f64 {
                    Ok(DelayValue(format!("{}s", v as u64)))
                } else {
                    Err(E::custom(format!(
                        "delay {v} is not a whole number of seconds; write a duration such as \"90s\" or \"5m\""
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// RFC 26 bookkeeping of one dependency, written by the allocation controller: a
/// `dependency-add` was posted for `description`, and a `dependency-remove` when
/// `satisfied`. A satisfied dependency stays satisfied (its dependency may be requeued or
/// deleted later).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DependencyStatus {
    /// `afterok:prep`, `after:prep`, `begin-time:1767225600`,
    /// `string:ckpt?scope=user&type=inout`, `singleton`, `mutex:gpu-lock`.
    pub description: String,
    /// The dependency holds.
    #[serde(default)]
    pub satisfied: bool,
}
