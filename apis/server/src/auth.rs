//! Authentication (pluggable: HS256 JWT bearer tokens today; OIDC or mTLS can implement
//! [`Authenticator`] later) and authorization by role and tenant.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use axum::http::HeaderMap;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use lattice_apis::KindInfo;
use serde::{Deserialize, Serialize};

use crate::errors::{ApiError, ApiResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Admin,
    User,
    Readonly,
}

/// `tenants` claim: a list or `"*"` for all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Tenants {
    All(String),
    List(Vec<String>),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub tenants: Tenants,
    pub role: Role,
    pub exp: u64,
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    /// `None`: every tenant.
    pub tenants: Option<Vec<String>>,
    pub role: Role,
}

impl UserInfo {
    pub fn anonymous_admin() -> Self {
        Self {
            name: "system:anonymous".into(),
            tenants: None,
            role: Role::Admin,
        }
    }

    pub fn in_tenant(&self, t: &str) -> bool {
        match &self.tenants {
            None => true,
            Some(ts) => ts.iter().any(|x| x == t || x == "*"),
        }
    }

    pub fn all_tenants(&self) -> bool {
        match &self.tenants {
            None => true,
            Some(ts) => ts.iter().any(|x| x == "*"),
        }
    }
}

/// Turns a request's credentials into a user. `Ok(None)`: no credentials given.
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    async fn authenticate(&self, headers: &HeaderMap) -> ApiResult<Option<UserInfo>>;
}

/// Authentication off: everyone is an admin (tests, `--dev`).
pub struct AllowAll;

#[async_trait]
impl Authenticator for AllowAll {
    async fn authenticate(&self, _headers: &HeaderMap) -> ApiResult<Option<UserInfo>> {
        Ok(Some(UserInfo::anonymous_admin()))
    }
}

/// HS256 JWT bearer tokens with [`Claims`].
pub struct JwtAuthenticator {
    key: DecodingKey,
    validation: Validation,
}

impl JwtAuthenticator {
    pub fn new(secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 5;
        Self {
            key: DecodingKey::from_secret(secret),
            validation,
        }
    }

    pub fn verify(&self, token: &str) -> ApiResult<UserInfo> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| ApiError::unauthorized(format!("invalid bearer token: {e}")))?;
        let c = data.claims;
        let tenants = match c.tenants {
            Tenants::All(s) if s == "*" => None,
            Tenants::All(s) => Some(vec![s]),
            Tenants::List(l) if l.iter().any(|t| t == "*") => None,
            Tenants::List(l) => Some(l),
        };
        Ok(UserInfo {
            name: c.sub,
            tenants,
            role: c.role,
        })
    }
}

#[async_trait]
impl Authenticator for JwtAuthenticator {
    async fn authenticate(&self, headers: &HeaderMap) -> ApiResult<Option<UserInfo>> {
        let Some(h) = headers.get(axum::http::header::AUTHORIZATION) else {
            return Ok(None);
        };
        let h = h
            .to_str()
            .map_err(|_| ApiError::unauthorized("the Authorization header is not valid text"))?;
        let token = h
            .strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
            .ok_or_else(|| ApiError::unauthorized("expected 'Authorization: Bearer <token>'"))?;
        self.verify(token.trim()).map(Some)
    }
}

/// Mint an HS256 token (for `lattice up`, tests and admins).
pub fn mint_token(
    secret: &[u8],
    sub: &str,
    tenants: &[String],
    role: Role,
    ttl: Duration,
) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        + ttl;
    let tenants = if tenants.iter().any(|t| t == "*") {
        Tenants::All("*".into())
    } else {
        Tenants::List(tenants.to_vec())
    };
    let claims = Claims {
        sub: sub.to_string(),
        tenants,
        role,
        exp: exp.as_secs(),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// admin: everything; user: read/write namespaced kinds in its tenants, read
/// cluster-scoped kinds; readonly: reads only (namespaced kinds in its tenants).
pub fn authorize(
    user: &UserInfo,
    access: Access,
    kind: &KindInfo,
    ns: Option<&str>,
) -> ApiResult<()> {
    let deny = |why: String| {
        Err(ApiError::forbidden(format!(
            "{} {:?} cannot {} {}.lattice.dev{}: {why}",
            "user",
            user.name,
            if access == Access::Read {
                "read"
            } else {
                "write"
            },
            kind.plural,
            ns.map(|n| format!(" in tenant {n:?}")).unwrap_or_default()
        )))
    };
    if user.role == Role::Admin {
        return Ok(());
    }
    if access == Access::Write && user.role == Role::Readonly {
        return deny("the readonly role may only read".into());
    }
    if !kind.namespaced {
        return if access == Access::Read {
            Ok(())
        } else {
            deny("cluster-scoped kinds are admin-only".into())
        };
    }
    match ns {
        Some(t) if user.in_tenant(t) => Ok(()),
        Some(_) => deny("not a member of this tenant".into()),
        None if user.all_tenants() => Ok(()),
        None => deny("listing across tenants needs access to every tenant".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let t = mint_token(
            b"s3cret",
            "alice",
            &["t1".to_string()],
            Role::User,
            Duration::from_secs(60),
        );
        let u = JwtAuthenticator::new(b"s3cret").verify(&t).unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.tenants, Some(vec!["t1".into()]));
        assert_eq!(u.role, Role::User);
        assert_eq!(
            JwtAuthenticator::new(b"other").verify(&t).unwrap_err().code,
            401
        );
        let t = mint_token(
            b"s3cret",
            "root",
            &["*".to_string()],
            Role::Admin,
            Duration::from_secs(60),
        );
        assert_eq!(
            JwtAuthenticator::new(b"s3cret").verify(&t).unwrap().tenants,
            None
        );
    }
}
