//! DAG definitions: parsing (the seed's short YAML form and `kind: Dag`
//! manifests) and admission-time validation in O(V+E).

use std::collections::{HashMap, HashSet};
use std::fmt;

use lattice_apis::Dag;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::deps::{is_ident_char, Condition, ParseError};
use crate::taskgroup::{parse_task_group_with_limit, TaskGroupSpec, DEFAULT_MAX_ELEMENTS};

/// `apiVersion` of the manifest form.
pub use lattice_apis::wellknown::API_VERSION;
/// Default maximum number of steps (allocations) in one DAG.
pub const DEFAULT_MAX_DAG_SIZE: usize = 1000;

/// One dependency edge of a step: `{ref: preprocess, condition: success}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Edge {
    /// The predecessor step (or the mutex name for `mutex`).
    #[serde(rename = "ref")]
    pub target: String,
    /// When the edge is satisfied.
    pub condition: Condition,
}

/// Move a `%N` suffix of `range` into `concurrency` (the API keeps them apart). Left
/// unchanged when it does not parse, so validation can point at the problem.
fn normalized(mut tg: TaskGroupDef) -> TaskGroupDef {
    if let Some((r, c)) = tg.range.split_once('%') {
        if let Ok(n) = c.parse::<u32>() {
            if n > 0 && tg.concurrency.is_none_or(|x| x == n) {
                tg.concurrency = Some(n);
                tg.range = r.to_string();
            }
        }
    }
    tg
}

impl Edge {
    /// Build an edge.
    pub fn new(target: impl Into<String>, condition: Condition) -> Self {
        Self {
            target: target.into(),
            condition,
        }
    }
}

/// A task group as written in a DAG: range string (`%N` allowed here) and optional
/// concurrency; the API's [`lattice_apis::TaskGroup`].
pub use lattice_apis::TaskGroup as TaskGroupDef;

/// One step of a DAG.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepDef {
    /// Unique step name.
    pub name: String,
    /// Incoming edges.
    pub depends_on: Vec<Edge>,
    /// Task group (job array), if any.
    pub task_group: Option<TaskGroupDef>,
    /// The rest of the allocation spec, in the types crate's camelCase shape
    /// (without `taskGroup` / `dependsOn`, which are lifted out).
    pub spec: Map<String, Value>,
}

impl StepDef {
    /// A step with just a name and edges.
    pub fn new(name: impl Into<String>, depends_on: Vec<Edge>) -> Self {
        Self {
            name: name.into(),
            depends_on,
            ..Default::default()
        }
    }
}

/// A parsed, not yet validated DAG.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DagDef {
    /// `name:` / `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace` (the tenant).
    pub namespace: Option<String>,
    /// Steps in declaration order.
    pub steps: Vec<StepDef>,
    /// Other DagSpec fields (`failurePolicy`, `maxParallel`, `defaults`), kept verbatim.
    pub extra: Map<String, Value>,
}

/// Error while reading a DAG document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}\nHint: {hint}")]
pub struct DagParseError {
    /// Where: `allocations[2].depends_on[0]`, or `line 3 column 5`.
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

fn perr(
    path: impl Into<String>,
    message: impl Into<String>,
    hint: impl Into<String>,
) -> DagParseError {
    DagParseError {
        path: path.into(),
        message: message.into(),
        hint: hint.into(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn snake_to_camel(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut up = false;
    for c in s.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn parse_condition(v: &Value, path: &str) -> Result<Condition, DagParseError> {
    let s = v.as_str().ok_or_else(|| {
        perr(
            path,
            format!("condition must be a string, got {}", type_name(v)),
            format!("use one of: {}", Condition::EDGE_ALLOWED),
        )
    })?;
    match Condition::parse(s) {
        Some(c) => Ok(c),
        None => Err(perr(
            path,
            format!("unknown condition {s:?}"),
            format!("use one of: {}", Condition::EDGE_ALLOWED),
        )),
    }
}

fn parse_edge(v: &Value, path: &str) -> Result<Edge, DagParseError> {
    const FORMS: &str = "write `- preprocess: success`, `- {ref: preprocess, condition: success}` or `- preprocess:success`";
    match v {
        Value::String(s) => {
            let (t, c) = match s.split_once(':') {
                Some((t, c)) => (t, parse_condition(&Value::String(c.to_string()), path)?),
                None => (s.as_str(), Condition::Success),
            };
            if t.is_empty() {
                return Err(perr(path, "empty step name", FORMS));
            }
            Ok(Edge::new(t, c))
        }
        Value::Object(m) => {
            let r = m.get("ref").or_else(|| m.get("allocation"));
            if let Some(r) = r {
                let target = r.as_str().ok_or_else(|| {
                    perr(
                        format!("{path}.ref"),
                        format!("must be a string, got {}", type_name(r)),
                        FORMS,
                    )
                })?;
                if let Some(k) = m
                    .keys()
                    .find(|k| !matches!(k.as_str(), "ref" | "allocation" | "condition"))
                {
                    return Err(perr(path, format!("unknown key {k:?}"), FORMS));
                }
                if m.contains_key("ref") && m.contains_key("allocation") {
                    return Err(perr(
                        path,
                        "`ref` and `allocation` both given",
                        "they are aliases; keep one",
                    ));
                }
                let condition = match m.get("condition") {
                    Some(c) => parse_condition(c, &format!("{path}.condition"))?,
                    None => Condition::Success,
                };
                return Ok(Edge::new(target, condition));
            }
            if m.len() != 1 {
                return Err(perr(
                    path,
                    format!("expected one `STEP: CONDITION` pair, got {} keys", m.len()),
                    FORMS,
                ));
            }
            let Some((k, c)) = m.iter().next() else {
                return Err(perr(path, "empty mapping", FORMS));
            };
            if k == "condition" {
                return Err(perr(path, "`condition` without `ref`", FORMS));
            }
            Ok(Edge::new(
                k.clone(),
                parse_condition(c, &format!("{path}.{k}"))?,
            ))
        }
        other => Err(perr(
            path,
            format!("expected a dependency, got {}", type_name(other)),
            FORMS,
        )),
    }
}

fn parse_edges(v: Option<&Value>, path: &str) -> Result<Vec<Edge>, DagParseError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, e)| parse_edge(e, &format!("{path}[{i}]")))
            .collect(),
        Some(other) => Err(perr(
            path,
            format!("must be a list, got {}", type_name(other)),
            "write depends_on: [{preprocess: success}]",
        )),
    }
}

fn parse_task_group_def(v: &Value, path: &str) -> Result<TaskGroupDef, DagParseError> {
    const HINT: &str = "write task_group: \"0-99%20\" or {range: \"0-99\", concurrency: 20}";
    match v {
        Value::String(s) => Ok(TaskGroupDef {
            range: s.clone(),
            concurrency: None,
        }),
        Value::Object(m) => {
            if let Some(k) = m
                .keys()
                .find(|k| !matches!(k.as_str(), "range" | "concurrency"))
            {
                return Err(perr(path, format!("unknown key {k:?}"), HINT));
            }
            let range = match m.get("range") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) => n.to_string(),
                _ => {
                    return Err(perr(
                        format!("{path}.range"),
                        "missing or not a string",
                        HINT,
                    ))
                }
            };
            let concurrency = match m.get("concurrency") {
                None | Some(Value::Null) => None,
                Some(c) => Some(
                    c.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| *n > 0)
                        .ok_or_else(|| {
                            perr(
                                format!("{path}.concurrency"),
                                "must be a positive integer",
                                HINT,
                            )
                        })?,
                ),
            };
            Ok(TaskGroupDef { range, concurrency })
        }
        other => Err(perr(
            path,
            format!("expected a range, got {}", type_name(other)),
            HINT,
        )),
    }
}

fn step_name(m: &Map<String, Value>, path: &str) -> Result<String, DagParseError> {
    const HINT: &str = "give every step a unique `name:`";
    let name = m.get("name");
    let id = m.get("id");
    let v = match (name, id) {
        (Some(n), Some(i)) if n != i => {
            return Err(perr(
                path,
                "`name` and `id` both given with different values",
                "they are aliases; keep one",
            ))
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => return Err(perr(path, "missing `name`", HINT)),
    };
    v.as_str().map(str::to_string).ok_or_else(|| {
        perr(
            format!("{path}.name"),
            format!("must be a string, got {}", type_name(v)),
            HINT,
        )
    })
}

/// Map the seed's short allocation keys onto the types crate's AllocationSpec shape.
fn short_spec(m: &Map<String, Value>) -> Map<String, Value> {
    let mut spec = Map::new();
    let nested = |outer: &str, inner: &str, v: &Value, spec: &mut Map<String, Value>| {
        let o = spec
            .entry(outer.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(o) = o {
            o.insert(inner.to_string(), v.clone());
        }
    };
    for (k, v) in m {
        match k.as_str() {
            "name" | "id" | "depends_on" | "dependsOn" | "task_group" | "taskGroup" => {}
            "nodes" => nested("resources", "nodes", v, &mut spec),
            "walltime" => nested("lifecycle", "walltime", v, &mut spec),
            "uenv" | "view" | "image" => nested("environment", k, v, &mut spec),
            _ => {
                let key = snake_to_camel(k);
                match (spec.get_mut(&key), v) {
                    (Some(Value::Object(existing)), Value::Object(add)) => {
                        for (ak, av) in add {
                            existing.insert(ak.clone(), av.clone());
                        }
                    }
                    _ => {
                        spec.insert(key, v.clone());
                    }
                }
            }
        }
    }
    spec
}

impl DagDef {
    /// Parse YAML (or JSON) in either form: the seed's short form
    /// (`name:` + `allocations:`), the API form (`dag: {allocations: ...}`),
    /// or a manifest (`apiVersion: lattice.dev/v1alpha1`, `kind: Dag`).
    pub fn from_yaml(text: &str) -> Result<DagDef, DagParseError> {
        let v: Value = serde_yaml::from_str(text).map_err(|e| {
            let path = e
                .location()
                .map(|l| format!("line {} column {}", l.line(), l.column()))
                .unwrap_or_else(|| "document".to_string());
            perr(
                path,
                format!("not valid YAML: {e}"),
                "check indentation and quoting",
            )
        })?;
        Self::from_value(&v)
    }

    /// Parse from an already-decoded document (see [`from_yaml`](Self::from_yaml)).
    pub fn from_value(v: &Value) -> Result<DagDef, DagParseError> {
        let Value::Object(root) = v else {
            return Err(perr(
                "document",
                format!("expected a mapping, got {}", type_name(v)),
                "start with `name:` and `allocations:`",
            ));
        };
        if root.contains_key("kind") || root.contains_key("apiVersion") || root.contains_key("spec")
        {
            return Self::from_manifest(root);
        }
        if let Some(inner) = root.get("dag") {
            let Value::Object(inner) = inner else {
                return Err(perr(
                    "dag",
                    format!("expected a mapping, got {}", type_name(inner)),
                    "write dag: {allocations: [...]}",
                ));
            };
            let mut d = Self::from_short(inner, "dag.")?;
            if d.name.is_none() {
                d.name = root.get("name").and_then(Value::as_str).map(str::to_string);
            }
            return Ok(d);
        }
        Self::from_short(root, "")
    }

    fn from_short(root: &Map<String, Value>, prefix: &str) -> Result<DagDef, DagParseError> {
        let (key, list) = match (root.get("allocations"), root.get("steps")) {
            (Some(l), None) => ("allocations", l),
            (None, Some(l)) => ("steps", l),
            (Some(_), Some(_)) => {
                return Err(perr(
                    format!("{prefix}allocations"),
                    "both `allocations` and `steps` given",
                    "use `allocations`",
                ))
            }
            (None, None) => {
                return Err(perr(
                    prefix.trim_end_matches('.').to_string() + "",
                    "missing `allocations`",
                    "list the steps under `allocations:`",
                ))
            }
        };
        let Value::Array(items) = list else {
            return Err(perr(
                format!("{prefix}{key}"),
                format!("must be a list, got {}", type_name(list)),
                "write allocations: [- name: step-1 ...]",
            ));
        };
        let name = match root.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(o) => {
                return Err(perr(
                    format!("{prefix}name"),
                    format!("must be a string, got {}", type_name(o)),
                    "write name: my-pipeline",
                ))
            }
        };
        let mut steps = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let path = format!("{prefix}{key}[{i}]");
            let Value::Object(m) = it else {
                return Err(perr(
                    &path,
                    format!("expected a mapping, got {}", type_name(it)),
                    "each step is a mapping with `name:`",
                ));
            };
            let name = step_name(m, &path)?;
            let (dk, dv) = match (m.get("depends_on"), m.get("dependsOn")) {
                (Some(_), Some(_)) => {
                    return Err(perr(
                        &path,
                        "`depends_on` and `dependsOn` both given",
                        "keep one",
                    ))
                }
                (Some(d), None) => ("depends_on", Some(d)),
                (None, d) => ("dependsOn", d),
            };
            let depends_on = parse_edges(dv, &format!("{path}.{dk}"))?;
            let task_group = match m.get("task_group").or_else(|| m.get("taskGroup")) {
                None | Some(Value::Null) => None,
                Some(t) => Some(normalized(parse_task_group_def(
                    t,
                    &format!("{path}.task_group"),
                )?)),
            };
            steps.push(StepDef {
                name,
                depends_on,
                task_group,
                spec: short_spec(m),
            });
        }
        let mut extra = Map::new();
        for (k, v) in root {
            if !matches!(k.as_str(), "name" | "allocations" | "steps") {
                extra.insert(snake_to_camel(k), v.clone());
            }
        }
        Ok(DagDef {
            name,
            namespace: None,
            steps,
            extra,
        })
    }

    fn from_manifest(root: &Map<String, Value>) -> Result<DagDef, DagParseError> {
        const HINT: &str = "a manifest is {apiVersion: lattice.dev/v1alpha1, kind: Dag, metadata: {name}, spec: {allocations: [...]}}";
        match root.get("kind").and_then(Value::as_str) {
            Some("Dag") => {}
            Some(k) => return Err(perr("kind", format!("expected Dag, got {k:?}"), HINT)),
            None => return Err(perr("kind", "missing or not a string", HINT)),
        }
        match root.get("apiVersion").and_then(Value::as_str) {
            Some(API_VERSION) | None => {}
            Some(v) => {
                return Err(perr(
                    "apiVersion",
                    format!("unsupported {v:?}"),
                    format!("use {API_VERSION}"),
                ))
            }
        }
        let meta = root.get("metadata").and_then(Value::as_object);
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let namespace = meta
            .and_then(|m| m.get("namespace"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let Some(Value::Object(spec)) = root.get("spec") else {
            return Err(perr("spec", "missing or not a mapping", HINT));
        };
        let Some(Value::Array(items)) = spec.get("allocations") else {
            return Err(perr("spec.allocations", "missing or not a list", HINT));
        };
        let mut steps = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let path = format!("spec.allocations[{i}]");
            let Value::Object(m) = it else {
                return Err(perr(
                    &path,
                    format!("expected a mapping, got {}", type_name(it)),
                    HINT,
                ));
            };
            if let Some(k) = m
                .keys()
                .find(|k| !matches!(k.as_str(), "name" | "id" | "dependsOn" | "spec"))
            {
                return Err(perr(
                    &path,
                    format!("unknown key {k:?}"),
                    "a task has name, dependsOn and spec",
                ));
            }
            let name = step_name(m, &path)?;
            let depends_on = parse_edges(m.get("dependsOn"), &format!("{path}.dependsOn"))?;
            let mut s = match m.get("spec") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(s)) => s.clone(),
                Some(o) => {
                    return Err(perr(
                        format!("{path}.spec"),
                        format!("expected a mapping, got {}", type_name(o)),
                        HINT,
                    ))
                }
            };
            if s.get("dependsOn")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
            {
                return Err(perr(
                    format!("{path}.spec.dependsOn"),
                    "edges between DAG tasks do not go in the allocation spec",
                    format!("move them to {path}.dependsOn"),
                ));
            }
            s.remove("dependsOn");
            let task_group = match s.remove("taskGroup") {
                None | Some(Value::Null) => None,
                Some(t) => Some(normalized(parse_task_group_def(
                    &t,
                    &format!("{path}.spec.taskGroup"),
                )?)),
            };
            steps.push(StepDef {
                name,
                depends_on,
                task_group,
                spec: s,
            });
        }
        let mut extra = spec.clone();
        extra.remove("allocations");
        Ok(DagDef {
            name,
            namespace,
            steps,
            extra,
        })
    }

    /// Render as a `kind: Dag` manifest in the types crate's JSON shape.
    pub fn to_manifest(&self) -> Value {
        let mut meta = Map::new();
        if let Some(n) = &self.name {
            meta.insert("name".into(), Value::String(n.clone()));
        }
        if let Some(n) = &self.namespace {
            meta.insert("namespace".into(), Value::String(n.clone()));
        }
        let allocations: Vec<Value> = self
            .steps
            .iter()
            .map(|s| {
                let mut spec = s.spec.clone();
                if let Some(tg) = &s.task_group {
                    spec.insert(
                        "taskGroup".into(),
                        serde_json::to_value(tg).unwrap_or(Value::Null),
                    );
                }
                let mut t = Map::new();
                t.insert("name".into(), Value::String(s.name.clone()));
                if !s.depends_on.is_empty() {
                    t.insert(
                        "dependsOn".into(),
                        serde_json::to_value(&s.depends_on).unwrap_or(Value::Null),
                    );
                }
                t.insert("spec".into(), Value::Object(spec));
                Value::Object(t)
            })
            .collect();
        let mut spec = self.extra.clone();
        spec.insert("allocations".into(), Value::Array(allocations));
        serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": "Dag",
            "metadata": meta,
            "spec": spec,
        })
    }
}

/// Admission limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum allocations per DAG, a task group's elements each counted
    /// (`scheduling.max_dag_size`, default 1000).
    pub max_dag_size: usize,
    /// Maximum elements per task group.
    pub max_task_group_elements: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_dag_size: DEFAULT_MAX_DAG_SIZE,
            max_task_group_elements: DEFAULT_MAX_ELEMENTS,
        }
    }
}

/// One validation problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DagError {
    /// More allocations than `max_dag_size` (steps, task-group elements each counted).
    TooLarge {
        /// Steps submitted.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// No steps.
    Empty,
    /// A step name that is empty or has characters outside `[A-Za-z0-9._-]`.
    InvalidName {
        /// Step position.
        step: usize,
        /// The name.
        name: String,
    },
    /// A mutex name that is empty or has characters outside `[A-Za-z0-9._-]`.
    InvalidMutexName {
        /// The step using it.
        step: String,
        /// The name.
        name: String,
    },
    /// Two steps share a name.
    DuplicateName {
        /// The name.
        name: String,
        /// First position.
        first: usize,
        /// Second position.
        second: usize,
    },
    /// A `depends_on` entry names no step of the DAG.
    UnknownRef {
        /// The depending step.
        step: String,
        /// The missing name.
        target: String,
        /// A similarly spelled step, if any.
        suggestion: Option<String>,
    },
    /// A step depends on itself.
    SelfDependency {
        /// The step.
        step: String,
    },
    /// The same predecessor is listed twice.
    DuplicateEdge {
        /// The depending step.
        step: String,
        /// The repeated predecessor.
        target: String,
    },
    /// A dependency cycle; `path` starts and ends with the same step.
    Cycle {
        /// e.g. `[a, b, c, a]`.
        path: Vec<String>,
    },
    /// `corresponding` between steps that are not both task groups.
    CorrespondingNeedsTaskGroups {
        /// The depending step.
        step: String,
        /// The predecessor.
        target: String,
    },
    /// A condition not usable inside a DAG (`started`).
    ConditionNotAllowed {
        /// The depending step.
        step: String,
        /// The predecessor.
        target: String,
        /// The condition.
        condition: Condition,
    },
    /// The task-group range does not parse.
    InvalidTaskGroup {
        /// The step.
        step: String,
        /// The parse error.
        error: ParseError,
    },
}

impl DagError {
    /// The one-line message (the CLI prints `Error: <message>`).
    pub fn message(&self) -> String {
        match self {
            Self::TooLarge { count, limit } => {
                format!("DAG exceeds maximum size ({count} allocations, limit: {limit})")
            }
            Self::Empty => "DAG has no allocations".into(),
            Self::InvalidName { step, name } => format!("allocation #{step} has invalid name {name:?}"),
            Self::InvalidMutexName { step, name } => {
                format!("allocation {step:?} uses invalid mutex name {name:?}")
            }
            Self::DuplicateName { name, first, second } => {
                format!("duplicate allocation name {name:?} (allocations #{first} and #{second})")
            }
            Self::UnknownRef { step, target, .. } => {
                format!("allocation {step:?} depends on {target:?}, which is not in this DAG")
            }
            Self::SelfDependency { step } => format!("allocation {step:?} depends on itself"),
            Self::DuplicateEdge { step, target } => {
                format!("allocation {step:?} lists dependency {target:?} more than once")
            }
            Self::Cycle { path } => format!("dependency cycle: {}", path.join(" → ")),
            Self::CorrespondingNeedsTaskGroups { step, target } => format!(
                "allocation {step:?} uses `corresponding` on {target:?}, but `corresponding` links task groups and both must have one"
            ),
            Self::ConditionNotAllowed { step, target, condition } => {
                format!("allocation {step:?}: condition `{condition}` on {target:?} is not allowed in a DAG")
            }
            Self::InvalidTaskGroup { step, error } => {
                format!("allocation {step:?} has an invalid task group: {}", error.message)
            }
        }
    }

    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            Self::TooLarge { .. } => {
                "Split the workflow into smaller DAGs or increase the limit via system configuration.".into()
            }
            Self::Empty => "List at least one allocation under `allocations:`.".into(),
            Self::InvalidName { .. } | Self::InvalidMutexName { .. } => {
                "Names use letters, digits, '-', '_' or '.'.".into()
            }
            Self::DuplicateName { .. } => "Allocation names must be unique within a DAG; rename one of them.".into(),
            Self::UnknownRef { suggestion, .. } => match suggestion {
                Some(s) => format!("Did you mean {s:?}? Dependencies must name allocations of the same DAG."),
                None => "Dependencies must name allocations of the same DAG; check the spelling or add the missing allocation.".into(),
            },
            Self::SelfDependency { .. } => "Remove the dependency on itself.".into(),
            Self::DuplicateEdge { .. } => "Keep one entry per dependency.".into(),
            Self::Cycle { .. } => "Remove one of the edges on the cycle; a DAG must not loop.".into(),
            Self::CorrespondingNeedsTaskGroups { .. } => {
                "Add a task_group to both allocations, or use success, failure or any.".into()
            }
            Self::ConditionNotAllowed { .. } => "Inside a DAG use success, failure, any, corresponding or mutex.".into(),
            Self::InvalidTaskGroup { error, .. } => error.hint.clone(),
        }
    }
}

impl fmt::Display for DagError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\nHint: {}", self.message(), self.hint())
    }
}

/// All validation problems found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<DagError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "Error: {e}")?;
        }
        Ok(())
    }
}

/// A compiled edge between two steps (by index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CEdge {
    /// Predecessor step index.
    pub from: u32,
    /// Successor step index.
    pub to: u32,
    /// Condition (never `Mutex` or `Started`).
    pub condition: Condition,
}

/// A validated DAG in index form, ready for [`crate::dispatch::Engine`].
#[derive(Debug, Clone)]
pub struct ValidatedDag {
    /// Step names by index.
    pub names: Vec<String>,
    index: HashMap<String, u32>,
    /// Task group of each step.
    pub groups: Vec<Option<TaskGroupSpec>>,
    /// All step-to-step edges.
    pub edges: Vec<CEdge>,
    /// `out_edges[out_start[s]..out_start[s+1]]` are the edge ids leaving `s`.
    pub out_start: Vec<u32>,
    /// Edge ids grouped by predecessor.
    pub out_edges: Vec<u32>,
    /// Edge ids entering each step.
    pub in_edges: Vec<Vec<u32>>,
    /// Mutex names.
    pub mutexes: Vec<String>,
    /// Mutex ids each step must hold while it runs.
    pub step_mutexes: Vec<Vec<u32>>,
    /// Non-fatal remarks (e.g. mismatched corresponding sizes).
    pub warnings: Vec<String>,
}

/// Allocations steps with these task groups make: a task group's elements each, else one.
fn allocation_count(groups: &[Option<TaskGroupSpec>]) -> usize {
    groups
        .iter()
        .map(|g| g.as_ref().map_or(1, |g| g.len()))
        .fold(0usize, usize::saturating_add)
}

impl ValidatedDag {
    /// Allocations the DAG makes, as its size limit counts them: a task group's elements
    /// each, else one per step.
    pub fn allocation_count(&self) -> usize {
        allocation_count(&self.groups)
    }
    /// Index of a step name.
    pub fn step_index(&self, name: &str) -> Option<usize> {
        self.index.get(name).map(|i| *i as usize)
    }
    /// Number of steps.
    pub fn len(&self) -> usize {
        self.names.len()
    }
    /// True for an empty DAG (never returned by `validate`).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
    /// Edge ids leaving step `s`.
    pub fn outgoing(&self, s: usize) -> &[u32] {
        let a = self.out_start[s] as usize;
        let b = self.out_start[s + 1] as usize;
        &self.out_edges[a..b]
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn suggest<'a>(target: &str, names: impl Iterator<Item = &'a String>) -> Option<String> {
    let max = (target.chars().count() / 3).clamp(1, 3);
    names
        .filter(|n| n.len().abs_diff(target.len()) <= max)
        .map(|n| (edit_distance(&n.to_lowercase(), &target.to_lowercase()), n))
        .filter(|(d, _)| *d <= max)
        .min()
        .map(|(_, n)| n.clone())
}

/// Validate a DAG: size, names, references, conditions, task groups, cycles.
/// Runs in O(V+E) (plus task-group expansion). Returns every problem found;
/// the cycle check runs only when all references resolve.
pub fn validate(def: &DagDef, limits: &Limits) -> Result<ValidatedDag, ValidationErrors> {
    let steps: Vec<StepView<'_>> = def
        .steps
        .iter()
        .map(|s| StepView {
            name: &s.name,
            depends_on: s
                .depends_on
                .iter()
                .map(|e| EdgeView {
                    target: &e.target,
                    condition: e.condition,
                })
                .collect(),
            task_group: s.task_group.as_ref(),
        })
        .collect();
    validate_steps(&steps, limits)
}

/// Validate a typed, admitted [`Dag`] the way [`validate`] validates a [`DagDef`]: the
/// live controller hands its Dag to the engine as it is, without a detour through JSON.
pub fn validate_dag(dag: &Dag, limits: &Limits) -> Result<ValidatedDag, ValidationErrors> {
    let steps: Vec<StepView<'_>> = dag
        .spec
        .allocations
        .iter()
        .map(|t| StepView {
            name: &t.name,
            depends_on: t
                .depends_on
                .iter()
                .map(|d| EdgeView {
                    target: &d.ref_,
                    condition: d.condition,
                })
                .collect(),
            task_group: t.spec.task_group.as_ref(),
        })
        .collect();
    validate_steps(&steps, limits)
}

/// What validation reads of a step, borrowed from a [`DagDef`] or a [`Dag`].
struct StepView<'a> {
    name: &'a str,
    depends_on: Vec<EdgeView<'a>>,
    task_group: Option<&'a TaskGroupDef>,
}

/// One edge of a [`StepView`].
struct EdgeView<'a> {
    target: &'a str,
    condition: Condition,
}

fn validate_steps(
    steps: &[StepView<'_>],
    limits: &Limits,
) -> Result<ValidatedDag, ValidationErrors> {
    let n = steps.len();
    if n > limits.max_dag_size {
        return Err(ValidationErrors(vec![DagError::TooLarge {
            count: n,
            limit: limits.max_dag_size,
        }]));
    }
    if n == 0 {
        return Err(ValidationErrors(vec![DagError::Empty]));
    }
    let mut errs = Vec::new();
    let mut index: HashMap<String, u32> = HashMap::with_capacity(n);
    for (i, s) in steps.iter().enumerate() {
        if s.name.is_empty() || !s.name.chars().all(is_ident_char) {
            errs.push(DagError::InvalidName {
                step: i,
                name: s.name.to_string(),
            });
            continue;
        }
        if let Some(&first) = index.get(s.name) {
            errs.push(DagError::DuplicateName {
                name: s.name.to_string(),
                first: first as usize,
                second: i,
            });
        } else {
            index.insert(s.name.to_string(), i as u32);
        }
    }
    let mut groups: Vec<Option<TaskGroupSpec>> = Vec::with_capacity(n);
    for s in steps {
        groups.push(match s.task_group {
            None => None,
            Some(tg) => {
                match parse_task_group_with_limit(&tg.range, limits.max_task_group_elements) {
                    Ok(mut g) => {
                        if tg.concurrency.is_some() {
                            g.concurrency = tg.concurrency;
                        }
                        Some(g)
                    }
                    Err(error) => {
                        errs.push(DagError::InvalidTaskGroup {
                            step: s.name.to_string(),
                            error,
                        });
                        None
                    }
                }
            }
        });
    }
    // The limit counts allocations, as the seed does: a task group's elements each.
    let allocations = allocation_count(&groups);
    if allocations > limits.max_dag_size {
        errs.push(DagError::TooLarge {
            count: allocations,
            limit: limits.max_dag_size,
        });
    }
    let mut edges: Vec<CEdge> = Vec::new();
    let mut mutex_ids: HashMap<&str, u32> = HashMap::new();
    let mut mutexes: Vec<String> = Vec::new();
    let mut step_mutexes: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut warnings = Vec::new();
    let mut refs_ok = true;
    for (i, s) in steps.iter().enumerate() {
        let mut seen: HashSet<(&str, bool)> = HashSet::with_capacity(s.depends_on.len());
        for e in &s.depends_on {
            let is_mutex = e.condition == Condition::Mutex;
            if !seen.insert((e.target, is_mutex)) {
                errs.push(DagError::DuplicateEdge {
                    step: s.name.to_string(),
                    target: e.target.to_string(),
                });
                continue;
            }
            if is_mutex {
                if e.target.is_empty() || !e.target.chars().all(is_ident_char) {
                    errs.push(DagError::InvalidMutexName {
                        step: s.name.to_string(),
                        name: e.target.to_string(),
                    });
                    continue;
                }
                let next = mutexes.len() as u32;
                let id = *mutex_ids.entry(e.target).or_insert_with(|| {
                    mutexes.push(e.target.to_string());
                    next
                });
                step_mutexes[i].push(id);
                continue;
            }
            let Some(&j) = index.get(e.target) else {
                refs_ok = false;
                errs.push(DagError::UnknownRef {
                    step: s.name.to_string(),
                    target: e.target.to_string(),
                    suggestion: suggest(e.target, index.keys()),
                });
                continue;
            };
            if j as usize == i {
                refs_ok = false;
                errs.push(DagError::SelfDependency {
                    step: s.name.to_string(),
                });
                continue;
            }
            match e.condition {
                Condition::Started => {
                    errs.push(DagError::ConditionNotAllowed {
                        step: s.name.to_string(),
                        target: e.target.to_string(),
                        condition: e.condition,
                    });
                    continue;
                }
                Condition::Corresponding => {
                    if s.task_group.is_none() || steps[j as usize].task_group.is_none() {
                        errs.push(DagError::CorrespondingNeedsTaskGroups {
                            step: s.name.to_string(),
                            target: e.target.to_string(),
                        });
                        continue;
                    }
                    if let (Some(sg), Some(pg)) = (&groups[i], &groups[j as usize]) {
                        let extra = sg
                            .indices
                            .iter()
                            .filter(|x| pg.position(**x).is_none())
                            .count();
                        if extra > 0 {
                            warnings.push(format!(
                                "{}: {extra} of {} elements have no matching {} element; they start as soon as their other dependencies hold",
                                s.name,
                                sg.len(),
                                e.target
                            ));
                        }
                    }
                }
                _ => {}
            }
            edges.push(CEdge {
                from: j,
                to: i as u32,
                condition: e.condition,
            });
        }
    }
    // A step named like a mutex also holds it (mutex "by name").
    for (m, name) in mutexes.iter().enumerate() {
        if let Some(&s) = index.get(name) {
            let sm = &mut step_mutexes[s as usize];
            if !sm.contains(&(m as u32)) {
                sm.push(m as u32);
            }
        }
    }
    // CSR of outgoing edges.
    let mut out_start = vec![0u32; n + 1];
    for e in &edges {
        out_start[e.from as usize + 1] += 1;
    }
    for i in 0..n {
        out_start[i + 1] += out_start[i];
    }
    let mut fill = out_start.clone();
    let mut out_edges = vec![0u32; edges.len()];
    let mut in_edges: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (id, e) in edges.iter().enumerate() {
        let f = &mut fill[e.from as usize];
        out_edges[*f as usize] = id as u32;
        *f += 1;
        in_edges[e.to as usize].push(id as u32);
    }
    if refs_ok
        && errs.iter().all(|e| {
            !matches!(
                e,
                DagError::DuplicateName { .. } | DagError::InvalidName { .. }
            )
        })
    {
        if let Some(path) = find_cycle(n, &edges, &out_start, &out_edges) {
            errs.push(DagError::Cycle {
                path: path
                    .into_iter()
                    .map(|i| steps[i].name.to_string())
                    .collect(),
            });
        }
    }
    if !errs.is_empty() {
        return Err(ValidationErrors(errs));
    }
    Ok(ValidatedDag {
        names: steps.iter().map(|s| s.name.to_string()).collect(),
        index,
        groups,
        edges,
        out_start,
        out_edges,
        in_edges,
        mutexes,
        step_mutexes,
        warnings,
    })
}

/// Iterative three-colour DFS along predecessor → successor edges.
/// Returns one cycle as step indices, first == last.
fn find_cycle(
    n: usize,
    edges: &[CEdge],
    out_start: &[u32],
    out_edges: &[u32],
) -> Option<Vec<usize>> {
    let mut color = vec![0u8; n];
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in 0..n {
        if color[root] != 0 {
            continue;
        }
        color[root] = 1;
        stack.push((root, out_start[root] as usize));
        while let Some(top) = stack.last_mut() {
            let (node, next) = *top;
            if next < out_start[node + 1] as usize {
                top.1 += 1;
                let to = edges[out_edges[next] as usize].to as usize;
                match color[to] {
                    0 => {
                        color[to] = 1;
                        stack.push((to, out_start[to] as usize));
                    }
                    1 => {
                        let pos = stack.iter().position(|(k, _)| *k == to).unwrap_or(0);
                        let mut path: Vec<usize> = stack[pos..].iter().map(|(k, _)| *k).collect();
                        path.push(to);
                        return Some(path);
                    }
                    _ => {}
                }
            } else {
                color[node] = 2;
                stack.pop();
            }
        }
    }
    None
}

/// Parse YAML and validate in one go, rendering all problems as text.
pub fn parse_and_validate(text: &str, limits: &Limits) -> Result<(DagDef, ValidatedDag), String> {
    let def = DagDef::from_yaml(text).map_err(|e| format!("Error: {e}"))?;
    let v = validate(&def, limits).map_err(|e| e.to_string())?;
    Ok((def, v))
}
