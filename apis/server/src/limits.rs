//! Per-identity limits: a token bucket of requests, a cap on requests being served at
//! once, and caps on the long-lived sessions each identity holds (watches, log streams,
//! attach sessions). Every limit is per authenticated identity (the user name), so one
//! caller's flood is answered with 429 while everybody else is served.
//!
//! Identities fall into classes, each with its own [`ClassLimits`]:
//!
//! * people with the `user` or `readonly` role: [`IdentityLimits::users`];
//! * administrators: [`IdentityLimits::admins`], higher, because bulk imports and the
//!   API benchmark (`hack/bench-api.sh`: 16 clients on one admin token at more than
//!   10,000 creates/s, then 1,000 watches) run as an administrator;
//! * node agents (`system:node:<n>`): [`IdentityLimits::nodes`], a budget of each node's
//!   own, so no other identity's flood spends it; heartbeat streams are not limited at
//!   all (a node whose heartbeats were refused would be declared lost);
//! * exempt: the controllers' identity (trusted, and they must never fall behind) and the
//!   anonymous caller of a server without authentication (there every caller is one
//!   identity, so per-identity limits would throttle everybody at once). In-process
//!   controllers do not go through HTTP at all.
//!
//! Long-running requests (watches, log streams, attach, heartbeats) are not counted as in
//! flight (Kubernetes' rule for `--max-requests-inflight`): they have caps of their own,
//! and their opening request spends a token like any other. The seed's table sets the
//! session caps: attach 5 and log streams 10 concurrent per user, for every class.
//! A rejection is `429 TooManyRequests` with a message naming the limit; the token
//! bucket's also carries `Retry-After` (seconds). Rejections are counted in
//! `lattice_apiserver_limit_rejections_total{class, limit}`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::auth::{Role, UserInfo};
use crate::errors::ApiError;

/// The limits of one class of identities (each identity has its own of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassLimits {
    /// Sustained requests per second (the token bucket's refill); 0: no limit.
    pub requests_per_second: u32,
    /// The bucket's size: requests accepted at once after a quiet spell (at least 1).
    pub burst: u32,
    /// Requests being served at once, long-running ones apart; 0: no limit.
    pub max_in_flight: u32,
    /// Watches open at once; 0: no limit.
    pub max_watches: u32,
}

/// Per-identity limits of the API server (`ApiConfig::limits`; `lattice-server` flags
/// `--user-*`, `--admin-*`, `--node-*`, `--max-attach-sessions`, `--max-log-streams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentityLimits {
    /// People with the `user` or `readonly` role.
    pub users: ClassLimits,
    /// Administrators.
    pub admins: ClassLimits,
    /// Node agents (their heartbeat streams are never limited).
    pub nodes: ClassLimits,
    /// Attach sessions open at once, per identity (the seed: 5); 0: no limit.
    pub max_attach_sessions: u32,
    /// Log streams open at once, per identity (the seed: 10); 0: no limit.
    pub max_log_streams: u32,
}

impl IdentityLimits {
    /// The defaults (see `docs/security.md`, "Limits and floods").
    pub const DEFAULT: IdentityLimits = IdentityLimits {
        users: ClassLimits {
            requests_per_second: 100,
            burst: 400,
            max_in_flight: 64,
            max_watches: 100,
        },
        admins: ClassLimits {
            requests_per_second: 20_000,
            burst: 40_000,
            max_in_flight: 512,
            max_watches: 2_000,
        },
        nodes: ClassLimits {
            requests_per_second: 200,
            burst: 1_000,
            max_in_flight: 64,
            max_watches: 64,
        },
        max_attach_sessions: 5,
        max_log_streams: 10,
    };

    /// No limits at all.
    pub const UNLIMITED: IdentityLimits = IdentityLimits {
        users: ClassLimits::UNLIMITED,
        admins: ClassLimits::UNLIMITED,
        nodes: ClassLimits::UNLIMITED,
        max_attach_sessions: 0,
        max_log_streams: 0,
    };

    fn of(&self, class: Class) -> &ClassLimits {
        match class {
            Class::User => &self.users,
            Class::Admin => &self.admins,
            Class::Node => &self.nodes,
        }
    }
}

impl ClassLimits {
    /// No limits.
    pub const UNLIMITED: ClassLimits = ClassLimits {
        requests_per_second: 0,
        burst: 1,
        max_in_flight: 0,
        max_watches: 0,
    };
}

impl Default for IdentityLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The class of an identity; `None`: exempt (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    User,
    Admin,
    Node,
}

impl Class {
    pub fn of(user: &UserInfo) -> Option<Class> {
        if user.is_system() {
            return None;
        }
        match user.role {
            Role::User | Role::Readonly => Some(Class::User),
            Role::Admin => Some(Class::Admin),
            Role::Node => Some(Class::Node),
            Role::System => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Class::User => "user",
            Class::Admin => "admin",
            Class::Node => "node",
        }
    }

    fn index(self) -> usize {
        match self {
            Class::User => 0,
            Class::Admin => 1,
            Class::Node => 2,
        }
    }
}

/// What an identity holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Session {
    /// A request being served (not a long-running one).
    InFlight,
    Watch,
    LogStream,
    Attach,
}

impl Session {
    fn label(self) -> &'static str {
        match self {
            Session::InFlight => "in_flight",
            Session::Watch => "watches",
            Session::LogStream => "log_streams",
            Session::Attach => "attach",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Session::InFlight => "requests in flight",
            Session::Watch => "watches",
            Session::LogStream => "log streams",
            Session::Attach => "attach sessions",
        }
    }

    fn close_hint(self) -> &'static str {
        match self {
            Session::InFlight => "wait for earlier requests to finish and retry",
            Session::Watch => "close a watch to open a new one",
            Session::LogStream => "close a log stream to open a new one",
            Session::Attach => "close an existing session to open a new one",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectLabels {
    class: &'static str,
    limit: &'static str,
}

type Bucket = RateLimiter<String, DefaultKeyedStateStore<String>, DefaultClock>;

/// Token-bucket checks between two sweeps of idle identities from the buckets.
const SWEEP_EVERY: u64 = 8192;

/// The limits in force and what each identity uses of them.
pub struct Limiter {
    limits: IdentityLimits,
    /// One keyed token bucket per class (`None`: no rate limit for the class).
    buckets: [Option<Bucket>; 3],
    clock: DefaultClock,
    checks: AtomicU64,
    /// Sessions held per identity; an entry goes when its count drops to 0.
    held: Mutex<HashMap<(Session, String), u32>>,
    rejections: Family<RejectLabels, Counter>,
}

impl Limiter {
    /// The limiter of `limits`, counting its rejections in `metrics`.
    pub fn new(limits: IdentityLimits, metrics: &crate::metrics::Metrics) -> Arc<Limiter> {
        let bucket = |c: &ClassLimits| {
            let rate = NonZeroU32::new(c.requests_per_second)?;
            let burst = NonZeroU32::new(c.burst.max(1)).unwrap_or(NonZeroU32::MIN);
            Some(RateLimiter::keyed(
                Quota::per_second(rate).allow_burst(burst),
            ))
        };
        let rejections = Family::<RejectLabels, Counter>::default();
        let mut registry = prometheus_client::registry::Registry::with_prefix("lattice_apiserver");
        registry.register(
            "limit_rejections",
            "Requests refused with 429 by a per-identity limit, by class of identity and limit (rate, in_flight, watches, log_streams, attach)",
            rejections.clone(),
        );
        metrics.add_registry(registry);
        Arc::new(Limiter {
            buckets: [
                bucket(&limits.users),
                bucket(&limits.admins),
                bucket(&limits.nodes),
            ],
            limits,
            clock: DefaultClock::default(),
            checks: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            rejections,
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> &IdentityLimits {
        &self.limits
    }

    fn reject(&self, class: Class, limit: &'static str) {
        self.rejections
            .get_or_create(&RejectLabels {
                class: class.label(),
                limit,
            })
            .inc();
    }

    /// Spend one token of `user`'s bucket; `Err` is the 429 to answer (see
    /// [`too_many`]), and the seconds to wait.
    pub fn check_rate(&self, user: &UserInfo) -> Result<(), (ApiError, u64)> {
        let Some(class) = Class::of(user) else {
            return Ok(());
        };
        let Some(bucket) = &self.buckets[class.index()] else {
            return Ok(());
        };
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            // Identities whose bucket is full again are indistinguishable from new ones.
            for b in self.buckets.iter().flatten() {
                b.retain_recent();
            }
        }
        match bucket.check_key(&user.name) {
            Ok(()) => Ok(()),
            Err(not_until) => {
                self.reject(class, "rate");
                let wait = not_until.wait_time_from(self.clock.now());
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                let secs = secs.max(1);
                let c = self.limits.of(class);
                let msg = format!(
                    "too many requests from {:?}: the limit is {} requests per second (bursts \
                     of {}) for each {} identity; retry after {secs} s",
                    user.name,
                    c.requests_per_second,
                    c.burst.max(1),
                    class.label()
                );
                let e = ApiError::new(429, "TooManyRequests", msg)
                    .with_details(serde_json::json!({"retryAfterSeconds": secs}));
                Err((e, secs))
            }
        }
    }

    fn cap(&self, class: Class, session: Session) -> u32 {
        match session {
            Session::InFlight => self.limits.of(class).max_in_flight,
            Session::Watch => self.limits.of(class).max_watches,
            Session::LogStream => self.limits.max_log_streams,
            Session::Attach => self.limits.max_attach_sessions,
        }
    }

    /// Take one `session` for `user`, released when the guard drops; `Ok(None)` for
    /// exempt identities and unlimited sessions; `Err` is the 429.
    pub fn acquire(
        self: &Arc<Self>,
        user: &UserInfo,
        session: Session,
    ) -> Result<Option<SessionGuard>, ApiError> {
        let Some(class) = Class::of(user) else {
            return Ok(None);
        };
        let cap = self.cap(class, session);
        if cap == 0 {
            return Ok(None);
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let key = (session, user.name.clone());
        let n = held.get(&key).copied().unwrap_or(0);
        if n >= cap {
            drop(held);
            self.reject(class, session.label());
            return Err(ApiError::new(
                429,
                "TooManyRequests",
                format!(
                    "maximum concurrent {} reached ({n}/{cap}) for {:?}; {}",
                    session.what(),
                    user.name,
                    session.close_hint()
                ),
            )
            .with_details(serde_json::json!({"limit": session.label(), "max": cap})));
        }
        held.insert(key.clone(), n + 1);
        Ok(Some(SessionGuard {
            limiter: self.clone(),
            key,
        }))
    }

    /// Sessions `name` holds now.
    pub fn held(&self, name: &str, session: Session) -> u32 {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&(session, name.to_string())).copied().unwrap_or(0)
    }
}

/// The answer to a request refused by a limit: its `Status`, with `Retry-After`.
pub fn too_many(e: ApiError, retry_after_secs: u64) -> Response {
    let mut resp = e.into_response();
    if let Ok(v) = HeaderValue::from_str(&retry_after_secs.to_string()) {
        resp.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, v);
    }
    resp
}

/// One session held; released on drop.
pub struct SessionGuard {
    limiter: Arc<Limiter>,
    key: (Session, String),
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let mut held = self.limiter.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// Take a `session` for the caller of the request being served (see
/// [`crate::auth::request_user`]); `Ok(None)` outside a request and for exempt callers.
pub fn acquire_for_request(
    inner: &crate::Inner,
    session: Session,
) -> Result<Option<SessionGuard>, ApiError> {
    match crate::auth::request_user() {
        Some(user) => inner.limiter.acquire(&user, session),
        None => Ok(None),
    }
}

/// Whether a request is long-running: a watch, a log stream, an attach session or a
/// heartbeat stream.
fn long_running(method: &Method, path: &str, query: Option<&str>) -> bool {
    if path.ends_with("/log") || path.ends_with("/attach") || is_heartbeat(path) {
        return true;
    }
    *method == Method::GET
        && query.is_some_and(|q| {
            q.split('&').any(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                k == "watch" && matches!(v, "" | "1" | "true" | "True")
            })
        })
}

fn is_heartbeat(path: &str) -> bool {
    path.strip_prefix("/apis/")
        .and_then(|p| p.strip_prefix(lattice_apis::API_VERSION))
        .and_then(|p| p.strip_prefix("/nodes/"))
        .is_some_and(|p| p.ends_with("/heartbeat") && p.matches('/').count() == 1)
}

/// Middleware inside [`crate::auth::authn`]: the caller's token bucket and in-flight cap
/// (heartbeat streams exempt), before any handler runs, so a refused request costs no
/// body read or parse.
pub async fn admit(State(inner): State<Arc<crate::Inner>>, req: Request, next: Next) -> Response {
    let Some(user) = req.extensions().get::<UserInfo>() else {
        // Public paths: health, metrics, node enrolment (checked there).
        return next.run(req).await;
    };
    let path = req.uri().path();
    if is_heartbeat(path) {
        return next.run(req).await;
    }
    if let Err((e, secs)) = inner.limiter.check_rate(user) {
        return too_many(e, secs);
    }
    let _in_flight = if long_running(req.method(), path, req.uri().query()) {
        None
    } else {
        match inner.limiter.acquire(user, Session::InFlight) {
            Ok(g) => g,
            Err(e) => return too_many(e, 1),
        }
    };
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn person(name: &str, role: Role) -> UserInfo {
        UserInfo {
            name: name.into(),
            tenants: Some(vec!["t1".into()]),
            role,
            ..Default::default()
        }
    }

    fn limiter(limits: IdentityLimits) -> Arc<Limiter> {
        Limiter::new(limits, &crate::metrics::Metrics::new())
    }

    #[test]
    fn buckets_are_per_identity_and_per_class() {
        let mut limits = IdentityLimits::DEFAULT;
        limits.users.requests_per_second = 1;
        limits.users.burst = 3;
        let l = limiter(limits);
        let (alice, bob) = (person("alice", Role::User), person("bob", Role::Readonly));
        for _ in 0..3 {
            l.check_rate(&alice).unwrap();
        }
        let (e, secs) = l.check_rate(&alice).unwrap_err();
        let resp = too_many(e, secs);
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()["retry-after"], "1");
        // Another identity of the class has its own bucket.
        l.check_rate(&bob).unwrap();
        // Admins, nodes and the exempt are not users.
        for who in [
            person("ops", Role::Admin),
            UserInfo::node("n1"),
            UserInfo::controllers(),
            UserInfo::anonymous_admin(),
        ] {
            for _ in 0..10 {
                l.check_rate(&who).unwrap();
            }
        }
    }

    #[test]
    fn sessions_are_capped_and_released() {
        let l = limiter(IdentityLimits::DEFAULT);
        let alice = person("alice", Role::User);
        let held: Vec<_> = (0..5)
            .map(|_| l.acquire(&alice, Session::Attach).unwrap())
            .collect();
        let e = l.acquire(&alice, Session::Attach).err().unwrap();
        assert_eq!(e.code, 429);
        assert!(e.message.contains("(5/5)"), "{}", e.message);
        assert!(
            e.message.contains("close an existing session"),
            "{}",
            e.message
        );
        // Another user is not affected; neither are other sessions of alice.
        l.acquire(&person("bob", Role::User), Session::Attach)
            .unwrap();
        l.acquire(&alice, Session::LogStream).unwrap();
        drop(held);
        assert_eq!(l.held("alice", Session::Attach), 0);
        assert!(l.acquire(&alice, Session::Attach).unwrap().is_some());
        // Exempt identities hold nothing.
        assert!(l
            .acquire(&UserInfo::controllers(), Session::Watch)
            .unwrap()
            .is_none());
    }

    #[test]
    fn long_running_requests() {
        let p = |s: &str| format!("/apis/{}{s}", lattice_apis::API_VERSION);
        assert!(long_running(
            &Method::GET,
            &p("/allocations"),
            Some("watch=true")
        ));
        assert!(long_running(
            &Method::GET,
            &p("/allocations"),
            Some("a=b&watch")
        ));
        assert!(!long_running(
            &Method::GET,
            &p("/allocations"),
            Some("watch=false")
        ));
        assert!(!long_running(
            &Method::POST,
            &p("/allocations"),
            Some("watch=1")
        ));
        assert!(long_running(
            &Method::GET,
            &p("/namespaces/t/allocations/a/log"),
            None
        ));
        assert!(is_heartbeat(&p("/nodes/n1/heartbeat")));
        assert!(!is_heartbeat(&p("/nodes/n1/x/heartbeat")));
        assert!(!is_heartbeat("/v1/nodes/n1/heartbeat"));
    }
}
