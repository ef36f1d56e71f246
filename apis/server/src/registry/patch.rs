//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the
//! server-side apply content type.

use serde_json::Value;

use crate::registry::errors::{ApiError, ApiResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> ApiResult<Self> {
        let base = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match base.as_str() {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(Self::Apply),
            // kubectl's strategic merge patch is only for built-in types; treat as merge
            // patch would be wrong for lists, so refuse it as Kubernetes does for CRDs.
            _ => Err(ApiError::unsupported_media(if ct.is_empty() {
                "<none>"
            } else {
                ct
            })),
        }
    }
}

/// Apply a merge or JSON patch to `target`.
pub fn apply_patch(target: &Value, kind: PatchType, body: &[u8]) -> ApiResult<Value> {
    match kind {
        PatchType::Merge => {
            let p: Value =
                crate::registry::parse::value(body, crate::registry::parse::Format::Json).map_err(
                    |e| e.into_api(|m| format!("the merge patch is not valid JSON: {m}")),
                )?;
            if !p.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            let mut out = target.clone();
            json_patch::merge(&mut out, &p);
            Ok(out)
        }
        PatchType::Json => {
            let invalid = |m: &str| format!("the JSON patch is invalid: {m}");
            let p = crate::registry::parse::value(body, crate::registry::parse::Format::Json)
                .map_err(|e| e.into_api(invalid))?;
            let p: json_patch::Patch = serde_json::from_value(p)
                .map_err(|e| ApiError::bad_request(invalid(&e.to_string())))?;
            let mut out = target.clone();
            json_patch::patch(&mut out, &p).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the JSON patch could not be applied: {e}"),
                )
            })?;
            Ok(out)
        }
        PatchType::Apply => Err(ApiError::internal(
            "apply patches go through server-side apply",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_and_json_patch() {
        let t = json!({"spec": {"a": 1, "b": 2}});
        let m = apply_patch(&t, PatchType::Merge, br#"{"spec":{"a":null,"c":3}}"#).unwrap();
        assert_eq!(m, json!({"spec": {"b": 2, "c": 3}}));
        let j = apply_patch(
            &t,
            PatchType::Json,
            br#"[{"op":"replace","path":"/spec/a","value":5}]"#,
        )
        .unwrap();
        assert_eq!(j["spec"]["a"], 5);
        assert_eq!(
            apply_patch(
                &t,
                PatchType::Json,
                br#"[{"op":"test","path":"/spec/a","value":9}]"#
            )
            .unwrap_err()
            .code,
            422
        );
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json")
                .unwrap_err()
                .code,
            415
        );
    }
}
