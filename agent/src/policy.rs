//! Which local account a job runs as, and whether it may.
//!
//! * A **root agent** runs each allocation as the local user its `lattice.dev/user`
//!   annotation names (set by the API server from the submitter's credentials). An
//!   allocation without the annotation is refused: the agent would not know whose work
//!   it is. A user with no account on the node is refused too, unless
//!   `--unknown-user=agent` runs such work as the agent's own user — root.
//! * An **unprivileged agent** cannot switch users: every job runs as the agent's own
//!   user, whatever the annotation says (a laptop, `lattice up` as a normal user).
//!
//! Either way the account is then checked: a job never runs as uid 0 or below
//! `--min-uid` (default 1000: system and service accounts, whose files and daemons a
//! job could take over) unless the allocation's Tenant lists the account in
//! `spec.runAs.allowUsers` — an admin's decision (`lattice up`, a one-user cluster,
//! lists its own user). For an unprivileged agent at uid >= 1000 (a person's account)
//! this never stands in the way; one running as a service account needs the tenant's
//! leave like anyone else, because the job would hold everything that account holds
//! (the agent's own credentials included).

use std::time::Duration;

use lattice_apis::lifecycle::node_reason;
use lattice_apis::{Allocation, Tenant};
use lattice_runtime::Api;

use crate::agent::Ctx;
use crate::config::UnknownUser;
use crate::runtime::RunAs;

/// Annotation naming the local user to run as.
pub use lattice_apis::wellknown::USER_ANNOTATION;

/// Why the agent does not start a run: a node reason and a message for the allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `lattice_apis::lifecycle::node_reason`.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

impl Refusal {
    fn not_permitted(message: String) -> Self {
        Self {
            reason: node_reason::NOT_PERMITTED,
            message,
        }
    }
}

/// The account a job would run as, before the tenant's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Switch to this user (`None`: stay the agent's own user).
    pub run_as: Option<RunAs>,
    /// Its uid.
    pub uid: u32,
    /// Its name (`uid N` when it has none).
    pub name: String,
    /// Why it is the agent's own user when another was named, for messages.
    pub substituted: Option<String>,
}

/// What the account decision depends on besides the allocation (the agent's process and
/// flags, and the node's user database), so it can be tested without root.
pub struct Host<'a> {
    /// The agent's own uid.
    pub euid: u32,
    /// `--unknown-user`.
    pub unknown: UnknownUser,
    /// The local user of a name: `Ok(None)` when there is none.
    pub lookup: &'a (dyn Fn(&str) -> Result<Option<RunAs>, String> + Sync),
    /// The agent's own account name, if it has one.
    pub own_name: Option<String>,
}

/// The user a name refers to on this node (`getpwnam`, and its groups as login gives them).
pub fn lookup_user(name: &str) -> Result<Option<RunAs>, String> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => {
            let groups = std::ffi::CString::new(u.name.as_str())
                .ok()
                .and_then(|n| nix::unistd::getgrouplist(&n, u.gid).ok())
                .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_else(|| vec![u.gid.as_raw()]);
            Ok(Some(RunAs {
                name: u.name,
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
                home: u.dir,
                groups,
            }))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// This host, as the agent process sees it.
pub fn this_host(unknown: UnknownUser) -> Host<'static> {
    let euid = nix::unistd::geteuid();
    Host {
        euid: euid.as_raw(),
        unknown,
        lookup: &lookup_user,
        own_name: nix::unistd::User::from_uid(euid)
            .ok()
            .flatten()
            .map(|u| u.name),
    }
}

/// The account `alloc` would run as on `host` (see the module docs).
pub fn account(alloc: &Allocation, host: &Host<'_>) -> Result<Account, Refusal> {
    let own = |substituted: Option<String>| Account {
        run_as: None,
        uid: host.euid,
        name: host
            .own_name
            .clone()
            .unwrap_or_else(|| format!("uid {}", host.euid)),
        substituted,
    };
    let named = alloc.metadata.annotations.get(USER_ANNOTATION);
    if host.euid != 0 {
        // Nothing to switch to: the agent's own user, whoever submitted it.
        return Ok(own(None));
    }
    let Some(name) = named else {
        return Err(Refusal::not_permitted(format!(
            "the allocation names no user (metadata.annotations[\"{USER_ANNOTATION}\"]): a root \
             agent runs nothing without knowing whose it is; the API server sets it from the \
             submitter's credentials"
        )));
    };
    match (host.lookup)(name) {
        Ok(Some(u)) => Ok(Account {
            uid: u.uid,
            name: u.name.clone(),
            run_as: Some(u),
            substituted: None,
        }),
        found => {
            let why = match found {
                Err(e) => format!("cannot look up user {name:?} on this node: {e}"),
                _ => format!("user {name:?} has no account on this node"),
            };
            if host.unknown == UnknownUser::Agent {
                tracing::warn!(user = %name, "{why}; running as the agent's user (--unknown-user=agent)");
                return Ok(own(Some(format!(
                    "{why}, and --unknown-user=agent runs such work as the agent's own user"
                ))));
            }
            // A node without the account: another node may have it (requeued as a
            // start failure).
            Err(Refusal {
                reason: node_reason::START_FAILED,
                message: format!(
                    "{why} (metadata.annotations[\"{USER_ANNOTATION}\"]); create the account, or \
                     start the agent with --unknown-user=agent to run such work as the agent's user"
                ),
            })
        }
    }
}

/// Whether `account` needs the tenant's leave: uid 0, or below `min_uid`.
pub fn privileged(account: &Account, min_uid: u32) -> bool {
    account.uid == 0 || account.uid < min_uid
}

/// The tenant's decision on a privileged account (`tenant`: `None` when it does not
/// exist).
pub fn check(
    account: &Account,
    min_uid: u32,
    tenant_name: &str,
    tenant: Option<&Tenant>,
) -> Result<(), Refusal> {
    if !privileged(account, min_uid) || tenant.is_some_and(|t| t.allows_user(&account.name)) {
        return Ok(());
    }
    let who = if account.uid == 0 {
        format!("root (uid 0, {:?})", account.name)
    } else {
        format!("{:?} (uid {})", account.name, account.uid)
    };
    let via = account
        .substituted
        .as_ref()
        .map(|s| format!(" because {s}"))
        .unwrap_or_default();
    let missing = if tenant.is_none() {
        format!(" (Tenant {tenant_name:?} was not found)")
    } else {
        String::new()
    };
    Err(Refusal::not_permitted(format!(
        "it would run as {who}{via}; jobs run as root or below --min-uid {min_uid} only where \
         the tenant allows the account{missing}: an admin can add {:?} to spec.runAs.allowUsers \
         of Tenant {tenant_name:?}",
        account.name
    )))
}

/// The account `alloc` runs as on this node, or why it may not run (the allocation's
/// Tenant is read only when the account needs its leave).
pub async fn resolve(ctx: &Ctx, alloc: &Allocation) -> Result<Option<RunAs>, Refusal> {
    let host = this_host(ctx.cfg.unknown_user);
    let account = account(alloc, &host)?;
    if !privileged(&account, ctx.cfg.min_uid) {
        return Ok(account.run_as);
    }
    let tenant_name = alloc.metadata.namespace_str();
    let api: Api<Tenant> = Api::all(ctx.client.clone());
    let mut delay = Duration::from_millis(200);
    let tenant = loop {
        match api.get_opt(tenant_name).await {
            Ok(t) => break t,
            Err(e) if delay < Duration::from_secs(5) => {
                tracing::warn!(tenant = %tenant_name, error = %e, "cannot read the tenant; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => {
                return Err(Refusal {
                    reason: node_reason::START_FAILED,
                    message: format!(
                        "cannot read Tenant {tenant_name:?} to check its spec.runAs: {e}"
                    ),
                })
            }
        }
    };
    check(&account, ctx.cfg.min_uid, tenant_name, tenant.as_ref())?;
    tracing::info!(allocation = %alloc.metadata.name_str(), tenant = %tenant_name, account = %account.name, uid = account.uid, "running as a privileged account: the tenant's spec.runAs.allowUsers lists it");
    Ok(account.run_as)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lattice_apis::TenantRunAs;

    fn user(name: &str, uid: u32) -> RunAs {
        RunAs {
            name: name.into(),
            uid,
            gid: uid,
            groups: vec![uid],
            home: "/".into(),
        }
    }

    fn lookup(name: &str) -> Result<Option<RunAs>, String> {
        Ok(match name {
            "root" => Some(user("root", 0)),
            "daemon" => Some(user("daemon", 1)),
            "alice" => Some(user("alice", 1001)),
            _ => None,
        })
    }

    fn alloc(user: Option<&str>) -> Allocation {
        let mut a = Allocation::default();
        a.metadata.name = Some("job".into());
        a.metadata.namespace = Some("ml".into());
        if let Some(u) = user {
            a.metadata
                .annotations
                .insert(USER_ANNOTATION.into(), u.into());
        }
        a
    }

    fn root_host(unknown: UnknownUser) -> Host<'static> {
        Host {
            euid: 0,
            unknown,
            lookup: &lookup,
            own_name: Some("root".into()),
        }
    }

    fn tenant(allow: &[&str]) -> Tenant {
        let mut t = Tenant::default();
        t.spec.run_as = Some(TenantRunAs {
            allow_users: allow.iter().map(|s| s.to_string()).collect(),
        });
        t
    }

    #[test]
    fn a_root_agent_runs_named_users_and_refuses_the_rest() {
        let h = root_host(UnknownUser::Refuse);
        let a = account(&alloc(Some("alice")), &h).unwrap();
        assert_eq!(
            (a.uid, a.run_as.as_ref().map(|u| u.uid)),
            (1001, Some(1001))
        );
        assert!(
            check(&a, 1000, "ml", None).is_ok(),
            "an ordinary user needs no leave"
        );

        let e = account(&alloc(None), &h).unwrap_err();
        assert_eq!(e.reason, "NotPermitted");
        assert!(e.message.contains("names no user"), "{}", e.message);
        // Even when unknown users run as the agent.
        assert!(account(&alloc(None), &root_host(UnknownUser::Agent)).is_err());

        let e = account(&alloc(Some("ghost")), &h).unwrap_err();
        assert_eq!(e.reason, "StartFailed");
        assert!(e.message.contains("--unknown-user=agent"), "{}", e.message);
    }

    #[test]
    fn root_and_system_accounts_need_the_tenants_leave() {
        let h = root_host(UnknownUser::Refuse);
        let daemon = account(&alloc(Some("daemon")), &h).unwrap();
        let e = check(&daemon, 1000, "ml", Some(&tenant(&[]))).unwrap_err();
        assert_eq!(e.reason, "NotPermitted");
        assert!(
            e.message.contains("\"daemon\" (uid 1)")
                && e.message.contains("--min-uid 1000")
                && e.message.contains("spec.runAs.allowUsers of Tenant \"ml\""),
            "{}",
            e.message
        );
        assert!(check(&daemon, 1000, "ml", Some(&tenant(&["daemon"]))).is_ok());
        assert!(
            check(&daemon, 1, "ml", Some(&tenant(&[]))).is_ok(),
            "--min-uid 1"
        );
        let root = account(&alloc(Some("root")), &h).unwrap();
        assert!(
            check(&root, 0, "ml", Some(&tenant(&[]))).is_err(),
            "root always needs leave"
        );
        assert!(check(&root, 0, "ml", Some(&tenant(&["root"]))).is_ok());
        let e = check(&root, 1000, "ml", None).unwrap_err();
        assert!(e.message.contains("was not found"), "{}", e.message);
    }

    #[test]
    fn unknown_users_as_a_root_agents_own_user_are_root() {
        let h = root_host(UnknownUser::Agent);
        let a = account(&alloc(Some("ghost")), &h).unwrap();
        assert_eq!((a.uid, a.run_as.is_none()), (0, true));
        let e = check(&a, 1000, "ml", Some(&tenant(&["daemon"]))).unwrap_err();
        assert!(
            e.message.contains("root (uid 0")
                && e.message
                    .contains("has no account on this node, and --unknown-user=agent"),
            "{}",
            e.message
        );
        assert!(check(&a, 1000, "ml", Some(&tenant(&["root"]))).is_ok());
    }

    #[test]
    fn an_unprivileged_agent_runs_everything_as_itself() {
        let laptop = Host {
            euid: 1000,
            unknown: UnknownUser::Refuse,
            lookup: &lookup,
            own_name: Some("me".into()),
        };
        for named in [None, Some("root"), Some("ghost")] {
            let a = account(&alloc(named), &laptop).unwrap();
            assert_eq!((a.uid, &a.run_as, a.name.as_str()), (1000, &None, "me"));
            assert!(check(&a, 1000, "ml", None).is_ok());
        }
        let service = Host {
            euid: 998,
            own_name: None,
            ..laptop
        };
        let a = account(&alloc(Some("alice")), &service).unwrap();
        let e = check(&a, 1000, "ml", Some(&tenant(&[]))).unwrap_err();
        assert!(e.message.contains("\"uid 998\" (uid 998)"), "{}", e.message);
    }
}
