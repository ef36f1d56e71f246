//! Shared helpers of the workload verbs (`submit`, `status`, `cancel`, `history`, `dag`,
//! `nodes`, the Slurm front-end): resource paths, cell formatting, state filters, times.

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::{json, Value};

use crate::errors::{exit, CliError};
use crate::kinds::GROUP_VERSION;
use crate::Ctx;

/// Shown for a missing value in workload tables (the seed's tables use an em dash).
pub const DASH: &str = "—";

/// Annotation naming the submitting user.
pub use lattice_apis::wellknown::USER_ANNOTATION;
/// Label naming the submitting user (for server-side selection).
pub use lattice_apis::wellknown::USER_ANNOTATION as USER_LABEL;

fn prefix() -> String {
    format!("/apis/{GROUP_VERSION}")
}

/// `/apis/lattice.dev/v1alpha1/namespaces/{tenant}/{plural}` (or cluster-wide with `None`).
pub fn collection(plural: &str, tenant: Option<&str>) -> String {
    match tenant {
        Some(t) => format!("{}/namespaces/{t}/{plural}", prefix()),
        None => format!("{}/{plural}", prefix()),
    }
}

/// Path of one object.
pub fn object(plural: &str, tenant: Option<&str>, name: &str) -> String {
    format!("{}/{name}", collection(plural, tenant))
}

/// A string at a JSON pointer.
pub fn s<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// `metadata.name`.
pub fn name(v: &Value) -> &str {
    s(v, "/metadata/name").unwrap_or_default()
}

/// An allocation's phase (Pending when it has no status yet).
pub fn phase(v: &Value) -> &str {
    s(v, "/status/phase").unwrap_or("Pending")
}

/// Completed, Failed or Cancelled.
pub fn is_terminal(phase: &str) -> bool {
    matches!(phase, "Completed" | "Failed" | "Cancelled")
}

/// RFC 3339 timestamp at a pointer.
pub fn time(v: &Value, ptr: &str) -> Option<DateTime<Utc>> {
    s(v, ptr)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// `HH:MM:SS` with as many hour digits as needed (`72:00:00`, `123:04:05`).
pub use lattice_apis::duration::format_hms as hms;

/// The walltime in seconds: `status.walltimeSeconds`, else the spec's.
pub fn walltime_secs(a: &Value) -> Option<u64> {
    if let Some(w) = a.pointer("/status/walltimeSeconds").and_then(Value::as_u64) {
        return Some(w);
    }
    s(a, "/spec/lifecycle/walltime").and_then(|w| lattice_apis::duration::parse_duration(w).ok())
}

/// WALLTIME cell.
pub fn walltime_cell(a: &Value) -> String {
    match walltime_secs(a) {
        Some(w) => hms(w),
        None => match s(a, "/spec/lifecycle/type") {
            Some("unbounded") | Some("reactive") => "unlimited".into(),
            _ => DASH.into(),
        },
    }
}

/// Seconds run so far (or in total, once ended); `None` before it started.
pub fn elapsed_secs(a: &Value, now: DateTime<Utc>) -> Option<u64> {
    let start = time(a, "/status/startTime")?;
    let end = time(a, "/status/endTime").unwrap_or(now);
    Some((end - start).num_seconds().max(0) as u64)
}

/// ELAPSED cell.
pub fn elapsed_cell(a: &Value, now: DateTime<Utc>) -> String {
    elapsed_secs(a, now).map(hms).unwrap_or_else(|| DASH.into())
}

/// The requested node count: `4`, or `2-8` for a range.
pub fn node_count(a: &Value) -> String {
    match a.pointer("/spec/resources/nodes") {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Object(o)) => format!(
            "{}-{}",
            o.get("min").map(|v| v.to_string()).unwrap_or_default(),
            o.get("max").map(|v| v.to_string()).unwrap_or_default()
        ),
        _ => "1".into(),
    }
}

/// Number of tasks a task-group range expands to.
fn task_count(range: &str) -> Option<u64> {
    lattice_apis::kinds::allocation::TaskRange::parse(range)
        .ok()
        .map(|r| r.count())
}

/// NODES cell: `4`, `2-8`, or `1×20` for a task group (nodes per task × tasks at once).
pub fn nodes_cell(a: &Value) -> String {
    let n = node_count(a);
    let Some(tg) = a.pointer("/spec/taskGroup") else {
        return n;
    };
    let width = tg
        .get("concurrency")
        .and_then(Value::as_u64)
        .or_else(|| tg.get("range").and_then(Value::as_str).and_then(task_count));
    match width {
        Some(w) => format!("{n}×{w}"),
        None => n,
    }
}

/// The human name: `spec.tags.name` (the script or job name), else the ID.
pub fn display_name(a: &Value) -> String {
    s(a, "/spec/tags/name")
        .map(str::to_string)
        .unwrap_or_else(|| name(a).to_string())
}

/// Who submitted it, if recorded.
pub fn user_of(a: &Value) -> Option<String> {
    let u = lattice_compat::slurm::alloc_user(a);
    (u != "-").then_some(u)
}

/// Which allocations a listing shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Everyone's.
    All,
    /// This user's, plus allocations that record no user (created by `apply` or the DAG
    /// controller).
    Mine(Option<String>),
    /// Exactly this user's.
    User(String),
}

impl Owner {
    pub fn from_flags(all: bool, user: Option<&str>, me: Option<String>) -> Owner {
        match (all, user) {
            (_, Some(u)) => Owner::User(u.to_string()),
            (true, None) => Owner::All,
            (false, None) => Owner::Mine(me),
        }
    }

    pub fn keeps(&self, a: &Value) -> bool {
        match self {
            Owner::All => true,
            Owner::User(u) => user_of(a).as_deref() == Some(u.as_str()),
            Owner::Mine(None) => true,
            Owner::Mine(Some(me)) => match user_of(a) {
                Some(u) => &u == me,
                None => true,
            },
        }
    }
}

/// Allocation phases, lowercase.
pub const PHASES: [&str; 8] = [
    "pending",
    "staging",
    "running",
    "checkpointing",
    "suspended",
    "completed",
    "failed",
    "cancelled",
];

/// A parsed `--state` filter (empty = everything).
#[derive(Debug, Clone, Default)]
pub struct StateFilter(Vec<String>);

impl StateFilter {
    /// Validates `--state` values against `allowed` (plus `aliases`, each expanding to phases).
    pub fn parse(
        values: &[String],
        allowed: &[&str],
        aliases: &[(&str, &[&str])],
    ) -> Result<StateFilter, CliError> {
        let mut out = Vec::new();
        for v in values {
            let v = v.trim().to_lowercase();
            if v.is_empty() {
                continue;
            }
            if let Some((_, phases)) = aliases.iter().find(|(a, _)| *a == v) {
                out.extend(phases.iter().map(|p| p.to_string()));
            } else if allowed.contains(&v.as_str()) {
                out.push(v);
            } else {
                let mut all: Vec<&str> = allowed.to_vec();
                all.extend(aliases.iter().map(|(a, _)| *a));
                return Err(CliError::new(format!("--state={v}"), "unknown state")
                    .detail(format!("Known states: {}", all.join(", ")))
                    .hint("pass one or more of the known states, comma separated")
                    .exit_code(exit::USAGE));
            }
        }
        Ok(StateFilter(out))
    }

    /// Allocation phases, with `active` and `finished`.
    pub fn phases(values: &[String]) -> Result<StateFilter, CliError> {
        StateFilter::parse(
            values,
            &PHASES,
            &[
                (
                    "active",
                    &[
                        "pending",
                        "staging",
                        "running",
                        "checkpointing",
                        "suspended",
                    ],
                ),
                ("finished", &["completed", "failed", "cancelled"]),
            ],
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn keeps(&self, state: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|s| s.eq_ignore_ascii_case(state))
    }
}

/// Parses a point in time: RFC 3339, a date `YYYY-MM-DD` (midnight UTC), `now`, or a
/// duration ago (`10m`, `2h`, `7d`).
/// A time window `[since, until]` from two optional flags (`(flag name, value)`), each
/// parsed with [`parse_when`].
pub type Window = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// Parse both ends of a time window.
pub fn parse_window(
    since: (&str, Option<&str>),
    until: (&str, Option<&str>),
    now: DateTime<Utc>,
) -> Result<Window, CliError> {
    let one = |(flag, v): (&str, Option<&str>)| v.map(|v| parse_when(flag, v, now)).transpose();
    Ok((one(since)?, one(until)?))
}

pub fn parse_when(flag: &str, v: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, CliError> {
    let t = v.trim();
    if t.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    if let Ok(d) = DateTime::parse_from_rfc3339(t) {
        return Ok(d.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
        if let Some(dt) = d.and_hms_opt(0, 0, 0) {
            return Ok(dt.and_utc());
        }
    }
    if let Ok(dt) = chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S") {
        return Ok(dt.and_utc());
    }
    match lattice_apis::duration::parse_duration(t) {
        Ok(secs) => Ok(now - chrono::Duration::seconds(secs as i64)),
        Err(_) => Err(CliError::new(
            format!("{flag}={v}"),
            "not a time",
        )
        .hint("use RFC 3339 (2026-03-05T10:00:00Z), a date (2026-03-05) or a duration ago (10m, 2h, 7d)")
        .exit_code(exit::USAGE)),
    }
}

/// RFC 3339 with seconds and `Z`.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The merge patch that asks for cancellation (the object is kept).
pub fn cancel_patch() -> Value {
    json!({"metadata": {"annotations": {lattice_apis::lifecycle::CANCEL_ANNOTATION: "true"}}})
}

/// True when a cancel was already requested.
pub fn cancel_requested(v: &Value) -> bool {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(lattice_apis::lifecycle::CANCEL_ANNOTATION))
        .and_then(Value::as_str)
        == Some("true")
}

/// Lists a collection's items (all pages).
pub async fn list_items(
    ctx: &Ctx,
    plural: &str,
    tenant: Option<&str>,
) -> Result<Vec<Value>, CliError> {
    let what = match tenant {
        Some(t) => format!("list {plural} in tenant {t:?}"),
        None => format!("list {plural}"),
    };
    let list = ctx
        .client
        .list(&collection(plural, tenant), &Default::default())
        .await
        .map_err(|e| CliError::from_client(what, e))?;
    Ok(list
        .get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default())
}

/// Error for a missing object, with the tenant and a hint naming the listing command.
pub fn not_found(kind: &str, id: &str, tenant: Option<&str>, list_cmd: &str) -> CliError {
    let where_ = tenant
        .map(|t| format!(" in tenant {t:?}"))
        .unwrap_or_default();
    CliError::new(format!("{kind} {id:?} not found{where_}"), "")
        .hint(format!(
            "check the ID{}; `{list_cmd}` lists what exists",
            if tenant.is_some() {
                " and the tenant (-t TENANT)"
            } else {
                ""
            }
        ))
        .exit_code(exit::NOT_FOUND)
}

/// GET an object; a 404 becomes [`not_found`].
/// An allocation by name or id in `tenant` (the not-found hint points at `lattice status`).
pub async fn get_allocation(ctx: &Ctx, tenant: &str, id: &str) -> Result<Value, CliError> {
    get_object(
        ctx,
        "allocations",
        "allocation",
        Some(tenant),
        id,
        "lattice status",
    )
    .await
}

pub async fn get_object(
    ctx: &Ctx,
    plural: &str,
    kind: &str,
    tenant: Option<&str>,
    id: &str,
    list_cmd: &str,
) -> Result<Value, CliError> {
    match ctx.client.get(&object(plural, tenant, id)).await {
        Ok(v) => Ok(v),
        Err(e) if e.is_not_found() => Err(not_found(kind, id, tenant, list_cmd)),
        Err(e) => Err(CliError::from_client(format!("get {kind} {id:?}"), e)),
    }
}

/// Sorts allocations newest first by creation, then by name.
pub fn sort_by_creation(items: &mut [Value]) {
    items.sort_by(|a, b| {
        let ta = s(a, "/metadata/creationTimestamp").unwrap_or_default();
        let tb = s(b, "/metadata/creationTimestamp").unwrap_or_default();
        ta.cmp(tb).then_with(|| name(a).cmp(name(b)))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells() {
        assert_eq!(hms(0), "00:00:00");
        assert_eq!(hms(72 * 3600), "72:00:00");
        assert_eq!(hms(51781), "14:23:01");
        let a = json!({"spec": {"resources": {"nodes": 1}, "taskGroup": {"range": "0-99", "concurrency": 20},
                        "lifecycle": {"walltime": "4h"}}});
        assert_eq!(nodes_cell(&a), "1×20");
        assert_eq!(walltime_cell(&a), "04:00:00");
        let b = json!({"spec": {"resources": {"nodes": {"min": 2, "max": 8}}, "lifecycle": {"type": "unbounded"}}});
        assert_eq!(nodes_cell(&b), "2-8");
        assert_eq!(walltime_cell(&b), "unlimited");
        let c = json!({"spec": {"taskGroup": {"range": "0-9"}}});
        assert_eq!(nodes_cell(&c), "1×10");
    }

    #[test]
    fn when() {
        let now = DateTime::parse_from_rfc3339("2026-03-05T12:00:00Z")
            .expect("ts")
            .with_timezone(&Utc);
        assert_eq!(
            rfc3339(parse_when("--since", "10m", now).expect("d")),
            "2026-03-05T11:50:00Z"
        );
        assert_eq!(
            rfc3339(parse_when("--since", "2026-03-01", now).expect("d")),
            "2026-03-01T00:00:00Z"
        );
        assert!(parse_when("--since", "yesterday", now).is_err());
    }

    #[test]
    fn owners_and_states() {
        let mine = json!({"metadata": {"annotations": {"lattice.dev/user": "alice"}}});
        let theirs = json!({"metadata": {"annotations": {"lattice.dev/user": "bob"}}});
        let nobody = json!({"metadata": {}});
        let o = Owner::from_flags(false, None, Some("alice".into()));
        assert!(o.keeps(&mine) && !o.keeps(&theirs) && o.keeps(&nobody));
        let o = Owner::from_flags(false, Some("bob"), None);
        assert!(!o.keeps(&mine) && o.keeps(&theirs) && !o.keeps(&nobody));
        let f = StateFilter::phases(&["Running".into(), "finished".into()]).expect("ok");
        assert!(f.keeps("Running") && f.keeps("Failed") && !f.keeps("Pending"));
        assert!(StateFilter::phases(&["bogus".into()]).is_err());
    }
}
