//! `Tenant` (cluster-scoped): quotas and usage. A tenant's name is the
//! namespace of its allocations, DAGs, vClusters and network domains.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::meta::{Condition, ObjectMeta};
use crate::resource::{impl_resource_meta, Resource};
use crate::validation::{check_len, validate_dns1123_label, Errors};

/// Default rolling budget window in days (`scheduling.budget_period_days`).
pub const DEFAULT_BUDGET_PERIOD_DAYS: u32 = 90;
/// The highest preemption class a tenant's users may ask for unless an administrator
/// sets `spec.quota.maxPreemptionClass`.
pub const DEFAULT_MAX_PREEMPTION_CLASS: u32 = 7;
/// Default maximum network domains per tenant.
pub const DEFAULT_MAX_NETWORK_DOMAINS: u32 = 50;

/// A tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tenant {
    /// `lattice.dev/v1alpha1`.
    #[serde(default)]
    pub api_version: String,
    /// `Tenant`.
    #[serde(default)]
    pub kind: String,
    /// Name (a DNS label: it becomes the namespace of the tenant's objects).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Quotas.
    #[serde(default)]
    pub spec: TenantSpec,
    /// Usage, written by the quota controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TenantStatus>,
}

/// Tenant configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantSpec {
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Hard (quorum-enforced) and soft (scheduler-enforced) quotas.
    #[serde(default)]
    pub quota: TenantQuota,
    /// Rolling window for GPU-/node-hour budgets in days (default 90).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_period_days: Option<u32>,
    /// Most network domains the tenant may hold (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_network_domains: Option<u32>,
    /// Users (OIDC subjects) with tenant-admin rights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admins: Vec<String>,
    /// Local accounts the tenant's work may run as on the nodes beyond the agents'
    /// default rule (root and system accounts). Only cluster admins may set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<TenantRunAs>,
    /// Most objects of each kind the tenant may hold (see [`TenantObjectQuotas`]).
    #[serde(default, skip_serializing_if = "TenantObjectQuotas::is_empty")]
    pub object_quotas: TenantObjectQuotas,
}

/// The node agents' rule for the local account a job runs as. By default a root agent
/// runs no job as uid 0 or below its `--min-uid` (default 1000: system and service
/// accounts); `allowUsers` names local accounts that may run anyway, `root` included
/// (`lattice up`, a one-user cluster, lists its own user here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantRunAs {
    /// Local user names (as in `/etc/passwd`, e.g. `root`, `slurm`) whose jobs run even
    /// though their uid is 0 or below the agent's `--min-uid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_users: Vec<String>,
}

/// Longest local user name accepted in `spec.runAs.allowUsers` (glibc's `LOGIN_NAME_MAX`
/// less the terminating NUL is 255; useradd's own limit is 32).
pub const MAX_USER_NAME: usize = 32;

/// Whether `name` is a portable local user name: starts with a letter or `_`, then
/// letters, digits, `_`, `-` or `.`, optionally ending in `$` (Samba machine accounts).
pub fn is_local_user_name(name: &str) -> bool {
    let body = name.strip_suffix('$').unwrap_or(name);
    let mut bytes = body.bytes();
    let Some(first) = bytes.next() else {
        return false;
    };
    name.len() <= MAX_USER_NAME
        && (first.is_ascii_alphabetic() || first == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl Tenant {
    /// Whether `spec.runAs.allowUsers` lists the local user `name`.
    pub fn allows_user(&self, name: &str) -> bool {
        self.spec
            .run_as
            .as_ref()
            .is_some_and(|r| r.allow_users.iter().any(|u| u == name))
    }
}

impl TenantSpec {
    /// The rolling budget period in days: `budgetPeriodDays`, else the default (90); at
    /// least one day.
    pub fn budget_period(&self) -> u32 {
        self.budget_period_days
            .unwrap_or(DEFAULT_BUDGET_PERIOD_DAYS)
            .max(1)
    }
}

/// Quotas. Hard quotas (`maxNodes`, `maxConcurrentAllocations`,
/// `sensitivePoolSize`) can never be exceeded, even momentarily; soft quotas
/// (`gpuHoursBudget`, `nodeHoursBudget`, `fairShareTarget`, `burstAllowance`)
/// only influence scheduling scores. Unset = unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantQuota {
    /// Hard: most nodes in use at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nodes: Option<u32>,
    /// Hard: most running allocations at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_allocations: Option<u32>,
    /// Hard: most nodes claimable for sensitive work. A tenant's users submit sensitive
    /// work only where an administrator set this (above 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitive_pool_size: Option<u32>,
    /// Hard: the highest `preemptionClass` the tenant's users may ask for (0–10, default
    /// [`DEFAULT_MAX_PREEMPTION_CLASS`]): higher classes preempt other tenants' work and
    /// are not preempted, so an administrator grants them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_preemption_class: Option<u32>,
    /// Soft: GPU-hours per budget period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_hours_budget: Option<f64>,
    /// Soft: node-hours per budget period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_hours_budget: Option<f64>,
    /// Soft: share of system capacity the tenant should get (0–1, e.g. 0.15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share_target: Option<f64>,
    /// Soft: multiple of the fair share usable when resources are idle (>= 1, e.g. 1.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_allowance: Option<f64>,
}

/// Current usage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantUsage {
    /// Nodes owned by the tenant's running allocations.
    #[serde(default)]
    pub nodes: u32,
    /// Running allocations.
    #[serde(default)]
    pub running_allocations: u32,
    /// Pending allocations.
    #[serde(default)]
    pub pending_allocations: u32,
    /// Nodes claimed for sensitive work.
    #[serde(default)]
    pub sensitive_nodes: u32,
    /// GPU-hours used in the budget period.
    #[serde(default)]
    pub gpu_hours_used: f64,
    /// Node-hours used in the budget period.
    #[serde(default)]
    pub node_hours_used: f64,
    /// Network domains held.
    #[serde(default)]
    pub network_domains: u32,
    /// The internal budget ledger: node- and GPU-hours per day and user, kept for the
    /// budget period (`gpuHoursUsed` / `nodeHoursUsed` are its sums).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ledger: Vec<UsageBucket>,
}

/// Node- and GPU-hours one user of a tenant used on one day (UTC).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsageBucket {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    /// The submitting user (`lattice.dev/user`), or `unknown`.
    pub user: String,
    /// Node-hours.
    #[serde(default)]
    pub node_hours: f64,
    /// GPU-hours.
    #[serde(default)]
    pub gpu_hours: f64,
}

impl TenantUsage {
    /// Charge `node_hours`/`gpu_hours` to `user` on `day` and drop buckets older than
    /// `period_days` before `day`; the totals are recomputed from what is kept.
    pub fn charge(
        &mut self,
        day: chrono::NaiveDate,
        user: &str,
        node_hours: f64,
        gpu_hours: f64,
        period_days: u32,
    ) {
        let key = day.format("%Y-%m-%d").to_string();
        match self
            .ledger
            .iter_mut()
            .find(|b| b.day == key && b.user == user)
        {
            Some(b) => {
                b.node_hours += node_hours;
                b.gpu_hours += gpu_hours;
            }
            None => self.ledger.push(UsageBucket {
                day: key,
                user: user.to_string(),
                node_hours,
                gpu_hours,
            }),
        }
        let oldest = day - chrono::Days::new(u64::from(period_days.max(1)) - 1);
        let oldest = oldest.format("%Y-%m-%d").to_string();
        self.ledger.retain(|b| b.day >= oldest);
        self.ledger
            .sort_by(|a, b| (&a.day, &a.user).cmp(&(&b.day, &b.user)));
        self.node_hours_used = self.ledger.iter().map(|b| b.node_hours).sum();
        self.gpu_hours_used = self.ledger.iter().map(|b| b.gpu_hours).sum();
    }
}

/// Observed tenant state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantStatus {
    /// Usage counters.
    #[serde(default)]
    pub usage: TenantUsage,
    /// `metadata.generation` this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions such as `QuotaExceeded`, `BudgetExhausted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl Resource for Tenant {
    const KIND: &'static str = "Tenant";
    const PLURAL: &'static str = "tenants";
    const NAMESPACED: bool = false;
    impl_resource_meta!();

    fn default_fields(&mut self) {
        self.spec
            .budget_period_days
            .get_or_insert(DEFAULT_BUDGET_PERIOD_DAYS);
        self.spec
            .max_network_domains
            .get_or_insert(DEFAULT_MAX_NETWORK_DOMAINS);
    }

    fn validate_fields(&self, errs: &mut Errors) {
        // The tenant name becomes a namespace: it must be a DNS label (no dots).
        if let Some(n) = &self.metadata.name {
            if n.contains('.') {
                errs.extend(validate_dns1123_label("metadata.name", n));
            }
        }
        let q = &self.spec.quota;
        if let Some(d) = &self.spec.display_name {
            check_len(errs, "spec.displayName", d, 256);
        }
        for (field, v) in [
            ("gpuHoursBudget", q.gpu_hours_budget),
            ("nodeHoursBudget", q.node_hours_budget),
        ] {
            if let Some(v) = v {
                if !v.is_finite() || v < 0.0 {
                    errs.push(
                        format!("spec.quota.{field}"),
                        format!("must be a non-negative number of hours, got {v}"),
                    );
                }
            }
        }
        if let Some(f) = q.fair_share_target {
            if !(0.0..=1.0).contains(&f) {
                errs.push(
                    "spec.quota.fairShareTarget",
                    format!("must be a fraction between 0 and 1, got {f}; e.g. 0.15 for 15% of the system"),
                );
            }
        }
        if let Some(b) = q.burst_allowance {
            if !b.is_finite() || !(1.0..=100.0).contains(&b) {
                errs.push(
                    "spec.quota.burstAllowance",
                    format!("must be a multiple of the fair share between 1 and 100, got {b}; e.g. 1.5 allows 150%"),
                );
            }
        }
        if let Some(c) = q.max_preemption_class {
            if c > 10 {
                errs.push(
                    "spec.quota.maxPreemptionClass",
                    format!("must be between 0 and 10 (the preemption classes), got {c}"),
                );
            }
        }
        if let (Some(s), Some(m)) = (q.sensitive_pool_size, q.max_nodes) {
            if s > m {
                errs.push(
                    "spec.quota.sensitivePoolSize",
                    format!("({s}) cannot exceed maxNodes ({m}); lower it or raise maxNodes"),
                );
            }
        }
        if self.spec.budget_period_days == Some(0) {
            errs.push(
                "spec.budgetPeriodDays",
                "must be at least 1 day (default 90)",
            );
        }
        for (i, a) in self.spec.admins.iter().enumerate() {
            if a.trim().is_empty() {
                errs.push(
                    format!("spec.admins[{i}]"),
                    "is empty; set a user name or OIDC subject",
                );
            }
            check_len(errs, format_args!("spec.admins[{i}]"), a, 256);
        }
        if let Some(r) = &self.spec.run_as {
            let mut seen = std::collections::BTreeSet::new();
            for (i, u) in r.allow_users.iter().enumerate() {
                let field = format!("spec.runAs.allowUsers[{i}]");
                if !is_local_user_name(u) {
                    errs.push(
                        field,
                        format!(
                            "{:?} is not a local user name: use up to {MAX_USER_NAME} letters, digits, \
                             '_', '-' or '.', starting with a letter or '_' (e.g. \"root\", \"slurm\")",
                            crate::validation::truncate(u, 40)
                        ),
                    );
                } else if !seen.insert(u.as_str()) {
                    errs.push(field, format!("{u:?} is listed twice"));
                }
            }
        }
    }
}

#[cfg(test)]
mod run_as_tests {
    use super::*;
    use crate::resource::Resource;

    fn tenant(users: &[&str]) -> Tenant {
        let mut t = Tenant::default();
        t.metadata.name = Some("ml".into());
        t.spec.run_as = Some(TenantRunAs {
            allow_users: users.iter().map(|u| u.to_string()).collect(),
        });
        t
    }

    fn errors(t: &Tenant) -> Vec<String> {
        let mut e = Errors::default();
        t.validate_fields(&mut e);
        e.0.into_iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect()
    }

    #[test]
    fn allow_users_names_local_accounts() {
        let t = tenant(&["root", "slurm", "_svc", "web-1", "m.x", "host$"]);
        assert!(errors(&t).is_empty(), "{:?}", errors(&t));
        assert!(t.allows_user("root"));
        assert!(!t.allows_user("alice"));
        assert!(!Tenant::default().allows_user("root"));
        for bad in ["", "1abc", "a b", "a/b", "root\n", &"x".repeat(33)] {
            let e = errors(&tenant(&[bad]));
            assert_eq!(e.len(), 1, "{bad:?}: {e:?}");
            assert!(e[0].starts_with("spec.runAs.allowUsers[0]: "), "{e:?}");
        }
        let e = errors(&tenant(&["root", "root"]));
        assert_eq!(
            e,
            vec!["spec.runAs.allowUsers[1]: \"root\" is listed twice"]
        );
    }

    #[test]
    fn run_as_round_trips_in_camel_case() {
        let t: Tenant = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ml"},
            "spec": {"runAs": {"allowUsers": ["root"]}}
        }))
        .unwrap();
        assert!(t.allows_user("root"));
        let back = serde_json::to_value(&t).unwrap();
        assert_eq!(back["spec"]["runAs"]["allowUsers"][0], "root");
        assert!(serde_json::from_value::<Tenant>(serde_json::json!({
            "spec": {"runAs": {"allowUser": ["root"]}}
        }))
        .is_err());
    }
}

/// Object-count quotas of a tenant: the most objects of each kind it may hold at once.
/// The API server refuses a create past one with 403 ("exceeded quota", naming the quota,
/// the count and the limit). Unset: the server's default (`lattice-server
/// --tenant-max-<kind>`); 0: none of that kind. Counted are all of the tenant's objects of
/// the kind, whoever made them; refused are creates by people (the controllers, which make
/// a DAG's allocations and record events, are not refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantObjectQuotas {
    /// Allocations (a DAG's steps and job steps included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations: Option<u64>,
    /// DAGs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dags: Option<u64>,
    /// Events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    /// Leases (the tenant's own controllers' leader election).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<u64>,
    /// vClusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vclusters: Option<u64>,
    /// Network domains (objects; `maxNetworkDomains` bounds the VNIs they take).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networkdomains: Option<u64>,
}

impl TenantObjectQuotas {
    /// Whether no quota is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

#[cfg(test)]
mod ledger_tests {
    use super::*;

    #[test]
    fn the_ledger_rolls_over_the_budget_period() {
        let mut u = TenantUsage::default();
        let d = |s: &str| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        u.charge(d("2026-01-01"), "alice", 10.0, 40.0, 3);
        u.charge(d("2026-01-01"), "alice", 1.0, 4.0, 3);
        u.charge(d("2026-01-02"), "bob", 2.0, 0.0, 3);
        assert_eq!(u.node_hours_used, 13.0);
        assert_eq!(u.gpu_hours_used, 44.0);
        assert_eq!(u.ledger.len(), 2);
        // Three days later the first day falls out of the 3-day window.
        u.charge(d("2026-01-04"), "alice", 1.0, 0.0, 3);
        assert_eq!(u.node_hours_used, 3.0);
        assert!(u.ledger.iter().all(|b| b.day.as_str() >= "2026-01-02"));
    }
}
