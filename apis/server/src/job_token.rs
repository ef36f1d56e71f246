//! `POST /v1/allocations/{id}/token`: a bearer token for the work of one allocation, so
//! that commands in a job (`srun` and `lattice launch` starting steps, `sbatch` submitting
//! more work) reach the API as the job's user, as Slurm's job credentials let them.
//!
//! Only the agents of the nodes the allocation is bound to ask for it, when they start
//! the allocation's run.
//! The token acts as the allocation's `lattice.dev/user`, in its tenant only, role
//! `user`, and it is bound to the allocation: it works while that allocation (that uid)
//! runs, and dies with it; it reads no output and opens no sessions. It is made only for
//! the agent of a node the current attempt runs on, while it runs; its lifetime is the
//! walltime plus [`MARGIN`] (services and other allocations without a walltime:
//! [`UNBOUNDED_TTL`]) as a backstop. With authentication off
//! there is nothing to mint and the answer says so (`"token": null`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};

use crate::attach::observed;
use crate::auth::Role;
use crate::authz::{self, Attributes, Verb};
use crate::errors::ApiError;
use crate::routes::{authenticate, json_response, kind_by_plural, Params};
use crate::Inner;

/// Beyond the walltime: the agent's grace period and clock skew.
pub const MARGIN: Duration = Duration::from_secs(3600);
/// For an allocation without a walltime.
pub const UNBOUNDED_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The handler.
pub async fn job_token(
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let start = Instant::now();
    let r = async {
        let user = authenticate(&inner, &headers).await?;
        let params = Params::from_uri(&uri)?;
        let k = kind_by_plural("allocations")
            .ok_or_else(|| ApiError::internal("allocations not registered"))?;
        // The agent of a node the allocation is bound to (the object check is in `find`'s
        // read), or the controllers: a token acts as the allocation's user, so nobody else
        // may have one made, admins included.
        authz::authorize(
            &user,
            &Attributes::kind(Verb::Get, k, params.get("tenant"))
                .named(Some(&id))
                .subresource(Some("token")),
        )?;
        if !(user.role == Role::Node || user.is_system()) {
            return Err(ApiError::forbidden(
                "job tokens are made for the node agents running the job",
            ));
        }
        let obj = crate::intent::find(&inner, k, &id, params.get("tenant"), &user).await?;
        // The run asking is of this very allocation, not of one that had its name.
        let uid = params.get("uid").filter(|u| !u.is_empty()).ok_or_else(|| {
            ApiError::bad_request("uid: the allocation's uid is required (the run asking is of that very allocation)")
        })?;
        let have = obj.pointer("/metadata/uid").and_then(Value::as_str);
        if have != Some(uid) {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!("allocation {id} is not the one with uid {uid} (it was replaced)"),
            ));
        }
        // Only for work that runs now, on the asking node: a node that ran the job once, or
        // runs a later attempt elsewhere, gets nothing.
        let phase = obj.pointer("/status/phase").and_then(Value::as_str).unwrap_or("Pending");
        if !matches!(phase, "Staging" | "Running") {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!("allocation {id} is {phase}: job tokens are for running work"),
            ));
        }
        if let Some(me) = user.node_name() {
            let assigned = obj
                .pointer("/status/assignedNodes")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|n| n.as_str() == Some(me)));
            let attempt = obj.pointer("/status/attempt").and_then(Value::as_u64);
            let asked = params.get("attempt").and_then(|a| a.parse::<u64>().ok());
            if !assigned || (asked.is_some() && asked != attempt) {
                return Err(ApiError::forbidden(format!(
                    "allocation {id}'s current attempt does not run on node {me}"
                )));
            }
        }
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let owner = obj
            .pointer(&format!(
                "/metadata/annotations/{}",
                lattice_apis::steps::USER_ANNOTATION.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "allocation {ns}/{id} names no user (metadata.annotations[\"{}\"]); a job \
                         token acts as that user",
                        lattice_apis::steps::USER_ANNOTATION
                    ),
                )
            })?
            .to_string();
        if !inner.config.auth {
            return Ok(json_response(
                StatusCode::OK,
                &json!({"token": null, "user": owner, "tenant": ns}),
            ));
        }
        let ttl = obj
            .pointer("/spec/lifecycle/walltime")
            .and_then(Value::as_str)
            .and_then(|w| lattice_apis::duration::parse_duration(w).ok())
            .map(|s| Duration::from_secs(s) + MARGIN)
            .unwrap_or(UNBOUNDED_TTL);
        let token = crate::auth::mint_job_token(
            &inner.config.jwt_secret,
            &owner,
            crate::auth::BoundAllocation {
                ns: ns.clone(),
                name: obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                uid: uid.to_string(),
            },
            ttl,
        );
        let expires = lattice_apis::meta::now() + chrono::Duration::seconds(ttl.as_secs() as i64);
        tracing::info!(allocation = %id, tenant = %ns, user = %owner, ttl_s = ttl.as_secs(), "job token issued");
        Ok(json_response(
            StatusCode::OK,
            &json!({"token": token, "user": owner, "tenant": ns, "expirationTimestamp": expires}),
        ))
    }
    .await;
    observed(&inner, "token", start, r)
}
