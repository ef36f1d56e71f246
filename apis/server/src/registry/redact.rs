//! What a person sees of an object that also describes other tenants' work.
//!
//! A Node is cluster-wide, and anyone may list nodes to see what the machine has, but its
//! `status.owner` (the tenant, vCluster, allocation, uid and user of the work bound to it)
//! and `status.allocations` describe the owning tenant's work. A user or readonly caller
//! outside that tenant sees that the node is taken (an empty `owner`) and nothing of
//! whose work it is. Administrators, the controllers and nodes see every field. Applied to
//! every read route: get, list (Table output included), watch and the `/v1` routes.

use serde_json::Value;

use crate::registry::identity::{Role, UserInfo};
use lattice_apis::KindInfo;

/// Whether `user` gets [`redact`]ed objects of `kind` at all.
pub fn applies(user: Option<&UserInfo>, kind: &KindInfo) -> bool {
    kind.kind == "Node" && user.is_some_and(|u| matches!(u.role, Role::User | Role::Readonly))
}

/// One object (`Node`), or a list of them, as `user` may see it.
pub fn redact(user: Option<&UserInfo>, kind: &KindInfo, mut v: Value) -> Value {
    let Some(user) = user.filter(|_| applies(user, kind)) else {
        return v;
    };
    match v.get_mut("items").and_then(Value::as_array_mut) {
        Some(items) => items.iter_mut().for_each(|n| node(user, n)),
        None => node(user, &mut v),
    }
    v
}

fn node(user: &UserInfo, n: &mut Value) {
    let Some(status) = n.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    let owner_tenant = status
        .get("owner")
        .and_then(|o| o.get("tenant"))
        .and_then(Value::as_str);
    let theirs = match owner_tenant {
        Some(t) => !user.in_tenant(t),
        // No tenant named: whatever the rest says is nobody's of the caller's.
        None => status.contains_key("owner") || status.contains_key("allocations"),
    };
    if theirs {
        if status.contains_key("owner") {
            status.insert("owner".into(), Value::Object(Default::default()));
        }
        status.remove("allocations");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nodes() -> &'static KindInfo {
        lattice_apis::kinds()
            .iter()
            .find(|k| k.kind == "Node")
            .expect("Node")
    }

    fn who(role: Role, tenants: &[&str]) -> UserInfo {
        UserInfo {
            name: "alice".into(),
            tenants: Some(tenants.iter().map(|t| t.to_string()).collect()),
            role,
            ..Default::default()
        }
    }

    #[test]
    fn others_work_on_a_node_is_hidden_from_people_outside_its_tenant() {
        let n = json!({"metadata": {"name": "n1"}, "status": {"state": "Ready",
            "owner": {"tenant": "t2", "vcluster": "vc", "allocation": "secret-project",
                      "allocationUid": "u", "user": "bob"},
            "allocations": ["secret-project"]}});
        let out = redact(Some(&who(Role::User, &["t1"])), nodes(), n.clone());
        assert_eq!(out["status"]["owner"], json!({}));
        assert!(out["status"].get("allocations").is_none());
        assert_eq!(out["status"]["state"], "Ready");
        // In a list too.
        let list = json!({"items": [n.clone()]});
        let out = redact(Some(&who(Role::Readonly, &["t1"])), nodes(), list);
        assert_eq!(out["items"][0]["status"]["owner"], json!({}));
        // The owner's tenant-mates, admins and in-process callers see it whole.
        for u in [
            Some(who(Role::User, &["t2"])),
            Some(who(Role::Admin, &[])),
            None,
        ] {
            assert_eq!(redact(u.as_ref(), nodes(), n.clone()), n);
        }
    }
}
