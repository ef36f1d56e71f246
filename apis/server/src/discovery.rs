//! Discovery documents: `/version`, `/api`, `/apis`, `/apis/lattice.dev`,
//! `/apis/lattice.dev/v1alpha1`.

use serde_json::{json, Value};

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": format!("v1.32.0-lattice.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "unknown",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

pub fn core_api() -> Value {
    json!({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": ""}
    ]})
}

fn group_version() -> Value {
    json!({"groupVersion": lattice_apis::API_VERSION, "version": lattice_apis::VERSION})
}

pub fn api_group() -> Value {
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": lattice_apis::GROUP,
        "versions": [group_version()],
        "preferredVersion": group_version(),
    })
}

pub fn api_group_list() -> Value {
    let mut g = api_group();
    if let Some(o) = g.as_object_mut() {
        o.remove("kind");
        o.remove("apiVersion");
    }
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [g]})
}

pub fn api_resource_list() -> Value {
    let mut resources = Vec::new();
    for k in lattice_apis::kinds() {
        resources.push(json!({
            "name": k.plural,
            "singularName": k.singular,
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortNames": k.short_names,
            "categories": ["all", "lattice"],
        }));
        if k.has_status {
            resources.push(json!({
                "name": format!("{}/status", k.plural),
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": lattice_apis::API_VERSION,
        "resources": resources,
    })
}
