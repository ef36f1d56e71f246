//! OpenAPI v3 (`/openapi/v3`, `/openapi/v3/apis/lattice.dev/v1alpha1`) built from the
//! kinds' JSON Schemas, with `x-kubernetes-group-version-kind` so `kubectl explain` works.

use serde_json::{json, Map, Value};

fn schema_name(kind: &str) -> String {
    format!("dev.lattice.{}.{kind}", lattice_apis::VERSION)
}

/// Rewrite `#/$defs/X` and `#/definitions/X` references to component references.
fn rewrite_refs(v: &mut Value, prefix: &str) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                for p in ["#/$defs/", "#/definitions/"] {
                    if let Some(name) = r.strip_prefix(p) {
                        *r = format!("#/components/schemas/{prefix}{name}");
                        break;
                    }
                }
            }
            for (_, c) in m.iter_mut() {
                rewrite_refs(c, prefix);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|c| rewrite_refs(c, prefix)),
        _ => {}
    }
}

/// OpenAPI 3.0 does not know `type: [x, "null"]`; turn it into `nullable`.
fn downgrade(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(types)) = m.get("type").cloned() {
                let non_null: Vec<Value> = types
                    .iter()
                    .filter(|t| t.as_str() != Some("null"))
                    .cloned()
                    .collect();
                if non_null.len() == 1 {
                    m.insert("type".into(), non_null[0].clone());
                    if non_null.len() != types.len() {
                        m.insert("nullable".into(), Value::Bool(true));
                    }
                }
            }
            m.remove("$schema");
            for (_, c) in m.iter_mut() {
                downgrade(c);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(downgrade),
        _ => {}
    }
}

pub fn group_version_doc() -> Value {
    let mut schemas = Map::new();
    let mut paths = Map::new();
    for k in lattice_apis::kinds() {
        let mut s = (k.schema)();
        let name = schema_name(k.kind);
        let prefix = format!("{name}.");
        if let Some(o) = s.as_object_mut() {
            for defs_key in ["$defs", "definitions"] {
                if let Some(Value::Object(defs)) = o.remove(defs_key) {
                    for (dn, mut dv) in defs {
                        rewrite_refs(&mut dv, &prefix);
                        downgrade(&mut dv);
                        schemas.insert(format!("{prefix}{dn}"), dv);
                    }
                }
            }
            o.remove("title");
            o.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": lattice_apis::GROUP, "version": lattice_apis::VERSION, "kind": k.kind}]),
            );
        }
        rewrite_refs(&mut s, &prefix);
        downgrade(&mut s);
        schemas.insert(name.clone(), s);
        let r = json!({"$ref": format!("#/components/schemas/{name}")});
        let ok =
            json!({"200": {"description": "OK", "content": {"application/json": {"schema": r}}}});
        let base = if k.namespaced {
            format!(
                "/apis/{}/namespaces/{{namespace}}/{}",
                lattice_apis::API_VERSION,
                k.plural
            )
        } else {
            format!("/apis/{}/{}", lattice_apis::API_VERSION, k.plural)
        };
        let gvk =
            json!({"group": lattice_apis::GROUP, "version": lattice_apis::VERSION, "kind": k.kind});
        // kubectl looks for these to decide it may use server-side field validation
        // (and dry-run) instead of falling back to OpenAPI v2.
        let q = |name: &str, ty: &str| json!({"name": name, "in": "query", "schema": {"type": ty}, "uniqueItems": true});
        let write_params = json!([
            q("dryRun", "string"),
            q("fieldManager", "string"),
            q("fieldValidation", "string")
        ]);
        let patch_params = json!([
            q("dryRun", "string"),
            q("fieldManager", "string"),
            q("fieldValidation", "string"),
            q("force", "boolean")
        ]);
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "get": {"operationId": format!("read{}", k.kind), "responses": ok.clone(), "x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk.clone()},
                "put": {"operationId": format!("replace{}", k.kind), "parameters": write_params.clone(), "responses": ok.clone(), "x-kubernetes-action": "put", "x-kubernetes-group-version-kind": gvk.clone()},
                "delete": {"operationId": format!("delete{}", k.kind), "responses": ok.clone(), "x-kubernetes-action": "delete", "x-kubernetes-group-version-kind": gvk.clone()},
                "patch": {"operationId": format!("patch{}", k.kind), "parameters": patch_params, "responses": ok.clone(), "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk.clone()},
            }),
        );
        paths.insert(
            base,
            json!({
                "get": {"operationId": format!("list{}", k.kind), "responses": {"200": {"description": "OK"}}, "x-kubernetes-action": "list", "x-kubernetes-group-version-kind": gvk.clone()},
                "post": {"operationId": format!("create{}", k.kind), "parameters": write_params, "responses": ok, "x-kubernetes-action": "post", "x-kubernetes-group-version-kind": gvk},
            }),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Lattice", "version": lattice_apis::VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

pub fn index(hash: &str) -> Value {
    json!({
        "paths": {
            format!("apis/{}", lattice_apis::API_VERSION): {
                "serverRelativeURL": format!("/openapi/v3/apis/{}?hash={hash}", lattice_apis::API_VERSION)
            }
        }
    })
}
