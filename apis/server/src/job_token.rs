//! `POST /v1/allocations/{id}/token`: a bearer token for the work of one allocation, so
//! that commands in a job (`srun` and `lattice launch` starting steps, `sbatch` submitting
//! more work) reach the API as the job's user, as Slurm's job credentials let them.
//!
//! Only the agents of the nodes the allocation is bound to ask for it, when they start
//! the allocation's run.
//! The token is an ordinary user token: subject the allocation's `lattice.dev/user`,
//! tenant its own only, role `user`, valid for the walltime plus [`MARGIN`] (services and
//! other allocations without a walltime: [`UNBOUNDED_TTL`]). With authentication off
//! there is nothing to mint and the answer says so (`"token": null`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Value};

use crate::attach::observed;
use crate::auth::{mint_token, Role};
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
                .sub(Some("token")),
        )?;
        if !(user.role == Role::Node || user.is_system()) {
            return Err(ApiError::forbidden(
                "job tokens are made for the node agents running the job",
            ));
        }
        let obj = crate::intent::find(&inner, k, &id, params.get("tenant"), &user).await?;
        // The run asking is of this very allocation, not of one that had its name.
        if let Some(uid) = params.get("uid").filter(|u| !u.is_empty()) {
            let have = obj.pointer("/metadata/uid").and_then(Value::as_str);
            if have != Some(uid) {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!("allocation {id} is not the one with uid {uid} (it was replaced)"),
                ));
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
        let token = mint_token(
            &inner.config.jwt_secret,
            &owner,
            std::slice::from_ref(&ns),
            Role::User,
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
