//! Roles as resources, through the real HTTP server with authentication on: each built-in
//! role's allowed and refused verbs, the escalation check a tenant admin meets, the
//! built-in roles nobody changes, API tokens revoked on a second API server, and
//! `can-i`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{alloc, allocs, call, start_authenticated, until_allowed, TestServer, API};
use lattice_apiserver::{ApiConfig, ApiServer, Role};
use lattice_store::KvBackend;
use reqwest::Method;
use serde_json::{json, Value};

const SECRET: &[u8] = common::AUTH_SECRET;

fn token(user: &str, tenants: &[&str], role: Role) -> String {
    common::auth_token(user, tenants, role)
}

fn admin() -> String {
    common::admin_token()
}

/// A person whose token grants nothing of itself: what they may do comes from bindings.
fn nobody(user: &str) -> String {
    token(user, &[], Role::Readonly)
}

async fn server() -> TestServer {
    start_authenticated().await
}

async fn ok(s: &TestServer, method: Method, path: &str, body: Value) -> Value {
    let (code, v) = call(s, method.clone(), path, &admin(), Some(body)).await;
    assert!((200..300).contains(&code), "{method} {path}: {code} {v}");
    v
}

fn binding(kind: &str, name: &str, tenant: Option<&str>, role: &str, user: &str) -> Value {
    let b = common::role_binding(name, tenant, role, user);
    assert_eq!(b["kind"], kind);
    b
}

async fn bind(s: &TestServer, tenant: Option<&str>, role: &str, user: &str) {
    common::bind_role(s, &admin(), tenant, role, user, None).await;
}

async fn setup(s: &TestServer) {
    for t in ["t1", "t2"] {
        ok(
            s,
            Method::POST,
            &format!("{API}/tenants"),
            json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
                   "metadata": {"name": t}, "spec": {"quota": {"sensitivePoolSize": 4}}}),
        )
        .await;
    }
    ok(
        s,
        Method::POST,
        &format!("{API}/nodes"),
        json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Node", "metadata": {"name": "n1"}}),
    )
    .await;
}

/// Every built-in role, bound to a user whose token grants nothing itself, against the
/// same requests: what the roles table in `docs/security.md` says, through the HTTP API.
#[tokio::test]
async fn each_builtin_role_allows_and_refuses_what_its_table_says() {
    let s = server().await;
    setup(&s).await;
    // (role, bound in tenant t1 or cluster-wide)
    let roles: &[(&str, Option<&str>)] = &[
        ("system-admin", None),
        ("tenant-admin", Some("t1")),
        ("operator", None),
        ("user", Some("t1")),
        ("readonly", Some("t1")),
        ("claiming-user", Some("t1")),
        ("", None),
    ];
    // Columns: create in t1, list t1, list t2, sensitive in t1, drain a node, bind `user`
    // in t1, create a tenant, list nodes, read the cluster settings.
    let table: &[[bool; 9]] = &[
        [true, true, true, true, true, true, true, true, true],
        [true, true, false, true, false, true, false, true, true],
        [false, true, true, false, true, false, false, true, true],
        [true, true, false, false, false, false, false, true, true],
        [false, true, false, false, false, false, false, true, true],
        [true, true, false, true, false, false, false, true, true],
        [false, false, false, false, false, false, false, true, true],
    ];
    for (i, ((role, scope), expect)) in roles.iter().zip(table).enumerate() {
        let user = format!("u{i}");
        if !role.is_empty() {
            bind(&s, *scope, role, &user).await;
        }
        let tok = nobody(&user);
        until_allowed(&s, &tok, &format!("{API}/nodes")).await;
        if !role.is_empty() && *role != "operator" {
            until_allowed(&s, &tok, &allocs("t1")).await;
        }
        let mut sensitive = alloc(&format!("s{i}"), "t1");
        sensitive["spec"]["sensitive"] = json!(true);
        let asks: Vec<(Method, String, Option<Value>)> = vec![
            (
                Method::POST,
                allocs("t1"),
                Some(alloc(&format!("a{i}"), "t1")),
            ),
            (Method::GET, allocs("t1"), None),
            (Method::GET, allocs("t2"), None),
            (Method::POST, allocs("t1"), Some(sensitive)),
            (
                Method::PATCH,
                format!("{API}/nodes/n1"),
                Some(json!({"spec": {"unschedulable": i % 2 == 0}})),
            ),
            (
                Method::POST,
                format!("{API}/namespaces/t1/rolebindings"),
                Some(binding(
                    "RoleBinding",
                    &format!("by-{user}"),
                    Some("t1"),
                    "user",
                    "friend",
                )),
            ),
            (
                Method::POST,
                format!("{API}/tenants"),
                Some(
                    json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
                            "metadata": {"name": format!("new{i}")}}),
                ),
            ),
            (Method::GET, format!("{API}/nodes"), None),
            (Method::GET, "/v1/admin/config".to_string(), None),
        ];
        for (col, ((method, path, body), allowed)) in asks.into_iter().zip(expect).enumerate() {
            let mut r = s
                .client
                .request(method.clone(), s.url(&path))
                .bearer_auth(&tok);
            if let Some(b) = body {
                r = if method == Method::PATCH {
                    r.header("content-type", "application/merge-patch+json")
                        .body(b.to_string())
                } else {
                    r.json(&b)
                };
            }
            let resp = r.send().await.unwrap();
            let code = resp.status().as_u16();
            let text = resp.text().await.unwrap();
            let role = if role.is_empty() { "(none)" } else { role };
            if *allowed {
                assert!(
                    (200..300).contains(&code),
                    "{role}: column {col} ({method} {path}) should be allowed: {code} {text}"
                );
            } else {
                assert_eq!(
                    code, 403,
                    "{role}: column {col} ({method} {path}) should be refused: {text}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_tenant_admin_grants_only_what_it_holds_in_its_own_tenant() {
    let s = server().await;
    setup(&s).await;
    bind(&s, Some("t1"), "tenant-admin", "ta").await;
    let ta = nobody("ta");
    until_allowed(&s, &ta, &allocs("t1")).await;
    let rb = |name: &str, tenant: &str, role: &str| {
        binding("RoleBinding", name, Some(tenant), role, "mallory")
    };
    let post = |path: String, body: Value| {
        let ta = ta.clone();
        let s = &s;
        async move { call(s, Method::POST, &path, &ta, Some(body)).await }
    };
    let rbs = |t: &str| format!("{API}/namespaces/{t}/rolebindings");
    // Within its tenant, what it holds: yes.
    let (code, v) = post(rbs("t1"), rb("ok-user", "t1", "claiming-user")).await;
    assert_eq!(code, 201, "{v}");
    // More than it holds: system-admin, even only inside t1.
    let (code, v) = post(rbs("t1"), rb("up", "t1", "system-admin")).await;
    assert_eq!(code, 403, "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.contains("does not hold * on *"), "{msg}");
    // A Role of its own with more than it holds: nodes are not in its tenant.
    let (code, v) = post(
        format!("{API}/namespaces/t1/roles"),
        json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Role",
               "metadata": {"name": "drainer", "namespace": "t1"},
               "rules": [{"verbs": ["patch"], "resources": ["nodes"]}]}),
    )
    .await;
    assert_eq!(code, 403, "{v}");
    // Another tenant; cluster-wide.
    let (code, v) = post(rbs("t2"), rb("other", "t2", "user")).await;
    assert_eq!(code, 403, "{v}");
    let (code, v) = post(
        format!("{API}/clusterrolebindings"),
        binding("ClusterRoleBinding", "everywhere", None, "user", "mallory"),
    )
    .await;
    assert_eq!(code, 403, "{v}");
    // Changing an existing binding to a bigger role is the same check.
    let (_, mut b) = call(
        &s,
        Method::GET,
        &format!("{}/ok-user", rbs("t1")),
        &ta,
        None,
    )
    .await;
    b["roleRef"]["name"] = json!("operator");
    let (code, v) = call(
        &s,
        Method::PUT,
        &format!("{}/ok-user", rbs("t1")),
        &ta,
        Some(b),
    )
    .await;
    assert_eq!(code, 403, "{v}");
    // A binding to a role that does not exist: refused, naming the field.
    let (code, v) = post(rbs("t1"), rb("ghost", "t1", "no-such-role")).await;
    assert_eq!(code, 422, "{v}");
    assert!(v.to_string().contains("roleRef.name"), "{v}");
    // The user it bound may now work in t1, and claim nodes there; not in t2.
    let m = nobody("mallory");
    until_allowed(&s, &m, &allocs("t1")).await;
    let mut sensitive = alloc("s", "t1");
    sensitive["spec"]["sensitive"] = json!(true);
    let (code, v) = call(&s, Method::POST, &allocs("t1"), &m, Some(sensitive)).await;
    assert_eq!(code, 201, "{v}");
    let (code, _) = call(&s, Method::GET, &allocs("t2"), &m, None).await;
    assert_eq!(code, 403);
    // A user role cannot claim.
    let u = token("plain", &["t1"], Role::User);
    let mut sensitive = alloc("s2", "t1");
    sensitive["spec"]["sensitive"] = json!(true);
    let (code, v) = call(&s, Method::POST, &allocs("t1"), &u, Some(sensitive)).await;
    assert_eq!(code, 403, "{v}");
    assert!(v.to_string().contains("claiming-user"), "{v}");
}

#[tokio::test]
async fn the_builtin_roles_are_in_the_store_and_nobody_changes_them() {
    let s = server().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let names = loop {
        let (code, v) = call(
            &s,
            Method::GET,
            &format!("{API}/clusterroles"),
            &admin(),
            None,
        )
        .await;
        assert_eq!(code, 200, "{v}");
        let names: Vec<String> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        if names.len() >= 7 || Instant::now() > deadline {
            break names;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for n in [
        "system-admin",
        "tenant-admin",
        "operator",
        "user",
        "readonly",
        "claiming-user",
        "basic-reader",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    let path = format!("{API}/clusterroles/user");
    let (_, mut role) = call(&s, Method::GET, &path, &admin(), None).await;
    role["rules"] = json!([{"verbs": ["*"], "resources": ["*"]}]);
    let (code, v) = call(&s, Method::PUT, &path, &admin(), Some(role)).await;
    assert_eq!(code, 403, "{v}");
    assert!(v["message"].as_str().unwrap().contains("built in"), "{v}");
    let (code, v) = call(&s, Method::DELETE, &path, &admin(), None).await;
    assert_eq!(code, 403, "{v}");
    // Rules naming what does not exist are refused by name.
    let (code, v) = call(
        &s,
        Method::POST,
        &format!("{API}/clusterroles"),
        &admin(),
        Some(
            json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "ClusterRole",
                    "metadata": {"name": "typo"},
                    "rules": [{"verbs": ["get"], "resources": ["allocation"]}]}),
        ),
    )
    .await;
    assert_eq!(code, 422, "{v}");
    assert!(v.to_string().contains("rules[0].resources[0]"), "{v}");
}

/// A second API server over the same store, on its own port.
async fn second_server(s: &TestServer) -> (String, tokio::sync::oneshot::Sender<()>) {
    let backend: Arc<dyn KvBackend> = Arc::new(s.store.clone());
    let b = ApiServer::new(
        backend,
        ApiConfig {
            jwt_secret: SECRET.to_vec(),
            auth: true,
            ..Default::default()
        },
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(b.serve(l, async move {
        let _ = rx.await;
    }));
    (url, tx)
}

#[tokio::test]
async fn an_api_token_works_until_revoked_and_then_on_no_server() {
    let s = server().await;
    setup(&s).await;
    let (b, _stop) = second_server(&s).await;
    let made = ok(
        &s,
        Method::POST,
        "/v1/admin/tokens",
        json!({"user": "gitops-bot", "tenant": "t1", "role": "user", "ttlSeconds": 3600}),
    )
    .await;
    let tok = made["token"].as_str().unwrap().to_string();
    let id = made["id"].as_str().unwrap().to_string();
    assert!(tok.starts_with("lt_"), "{made}");
    // Only the hash is kept: the list never shows the secret.
    let (_, listed) = call(&s, Method::GET, "/v1/admin/tokens", &admin(), None).await;
    assert!(
        !listed.to_string().contains(tok.split('_').nth(2).unwrap()),
        "{listed}"
    );
    assert_eq!(listed["items"][0]["user"], "gitops-bot");
    // It works on both servers, within its tenant and role.
    let on_b = |path: String, tok: String| {
        let b = b.clone();
        let client = s.client.clone();
        async move {
            client
                .get(format!("{b}{path}"))
                .bearer_auth(tok)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(on_b(allocs("t1"), tok.clone()).await, 200);
    assert_eq!(on_b(allocs("t2"), tok.clone()).await, 403);
    let (code, v) = call(
        &s,
        Method::POST,
        &allocs("t1"),
        &tok,
        Some(alloc("bot", "t1")),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(
        v["metadata"]["annotations"]["lattice.dev/user"],
        "gitops-bot"
    );
    // A token may not be made for more than its maker holds, nor by a non-admin.
    let (code, v) = call(
        &s,
        Method::POST,
        "/v1/admin/tokens",
        &token("alice", &["t1"], Role::User),
        Some(json!({"user": "x", "tenant": "t1", "role": "user"})),
    )
    .await;
    assert_eq!(code, 403, "{v}");
    // A guessed or mangled token is refused.
    let forged = format!("{}x", &tok[..tok.len() - 1]);
    assert_eq!(on_b(allocs("t1"), forged).await, 401);
    assert_eq!(on_b(allocs("t1"), format!("lt_{id}_")).await, 401);
    // Revoked through the first server: the second refuses it within a second.
    let (code, v) = call(
        &s,
        Method::DELETE,
        &format!("/v1/admin/tokens/{id}"),
        &admin(),
        None,
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let revoked = Instant::now();
    loop {
        let code = on_b(allocs("t1"), tok.clone()).await;
        if code == 401 {
            break;
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "server B still takes the revoked token after {:?}",
            revoked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // By user: every token of the account.
    for _ in 0..2 {
        ok(
            &s,
            Method::POST,
            "/v1/admin/tokens",
            json!({"user": "ci", "role": "readonly", "tenant": "t2"}),
        )
        .await;
    }
    let (code, v) = call(
        &s,
        Method::DELETE,
        "/v1/admin/tokens?user=ci",
        &admin(),
        None,
    )
    .await;
    assert_eq!(
        (code, v["revoked"].as_array().map(Vec::len)),
        (200, Some(2)),
        "{v}"
    );
    // Expiry.
    let short = ok(
        &s,
        Method::POST,
        "/v1/admin/tokens",
        json!({"user": "brief", "ttlSeconds": 1}),
    )
    .await;
    let short = short["token"].as_str().unwrap().to_string();
    assert_eq!(on_b(format!("{API}/nodes"), short.clone()).await, 200);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (code, v) = call(&s, Method::GET, &format!("{API}/nodes"), &short, None).await;
    assert_eq!(code, 401, "{v}");
    assert!(v.to_string().contains("expired"), "{v}");
}

#[tokio::test]
async fn service_account_bindings_and_can_i() {
    let s = server().await;
    setup(&s).await;
    let made = ok(
        &s,
        Method::POST,
        "/v1/admin/tokens",
        json!({"user": "deployer"}),
    )
    .await;
    let tok = made["token"].as_str().unwrap().to_string();
    // No role of its own: bound as a ServiceAccount, it may manage dags in t2.
    ok(
        &s,
        Method::POST,
        &format!("{API}/namespaces/t2/roles"),
        json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Role",
               "metadata": {"name": "dags-only", "namespace": "t2"},
               "rules": [{"verbs": ["get", "list", "create"], "resources": ["dags"]}]}),
    )
    .await;
    ok(
        &s,
        Method::POST,
        &format!("{API}/namespaces/t2/rolebindings"),
        json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "RoleBinding",
               "metadata": {"name": "deployer", "namespace": "t2"},
               "roleRef": {"kind": "Role", "name": "dags-only"},
               "subjects": [{"kind": "ServiceAccount", "name": "deployer"}]}),
    )
    .await;
    until_allowed(&s, &tok, &format!("{API}/namespaces/t2/dags")).await;
    let can = |tok: String, body: Value| {
        let s = &s;
        async move { call(s, Method::POST, "/v1/auth/can-i", &tok, Some(body)).await }
    };
    let (code, v) = can(
        tok.clone(),
        json!({"verb": "create", "resource": "dags", "tenant": "t2"}),
    )
    .await;
    assert_eq!((code, v["allowed"].as_bool()), (200, Some(true)), "{v}");
    let (_, v) = can(
        tok.clone(),
        json!({"verb": "delete", "resource": "dags", "tenant": "t2"}),
    )
    .await;
    assert_eq!(v["allowed"], false, "{v}");
    let (_, v) = can(
        tok.clone(),
        json!({"verb": "create", "resource": "allocations", "tenant": "t2"}),
    )
    .await;
    assert_eq!(v["allowed"], false, "{v}");
    // A person named deployer is not the account.
    let (_, v) = can(
        nobody("deployer"),
        json!({"verb": "list", "resource": "dags", "tenant": "t2"}),
    )
    .await;
    assert_eq!(v["allowed"], false, "{v}");
    // --as: an admin may ask for others; a user may not.
    bind(&s, Some("t1"), "readonly", "carol").await;
    let (_, v) = can(
        admin(),
        json!({"verb": "list", "resource": "allocations", "tenant": "t1", "as": "carol"}),
    )
    .await;
    assert_eq!(v["allowed"], true, "{v}");
    let (_, v) = can(
        admin(),
        json!({"verb": "delete", "resource": "allocations", "tenant": "t1", "as": "carol"}),
    )
    .await;
    assert_eq!(v["allowed"], false, "{v}");
    assert!(
        v["roles"].to_string().contains("readonly in tenant t1"),
        "{v}"
    );
    let (code, v) = can(
        token("alice", &["t1"], Role::User),
        json!({"verb": "get", "resource": "allocations", "tenant": "t1", "as": "carol"}),
    )
    .await;
    assert_eq!(code, 403, "{v}");
    let (code, v) = can(admin(), json!({"verb": "eat", "resource": "allocations"})).await;
    assert_eq!(code, 400, "{v}");
    let (code, v) = call(&s, Method::GET, "/v1/auth/whoami", &tok, None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["user"], "deployer");
    assert_eq!(v["serviceAccount"], true);
}

/// A job's token acts for its job: `user` in the job's tenant, even when its user is an
/// administrator through a binding (a node, or the job's own processes, hold the token).
#[tokio::test]
async fn a_job_token_is_never_more_than_user_in_its_tenant() {
    let s = server().await;
    setup(&s).await;
    bind(&s, None, "system-admin", "boss").await;
    let boss = nobody("boss");
    until_allowed(&s, &boss, &format!("{API}/tenants")).await;
    let (code, job) = call(
        &s,
        Method::POST,
        &allocs("t1"),
        &boss,
        Some(alloc("job", "t1")),
    )
    .await;
    assert_eq!(code, 201, "{job}");
    let tok = lattice_apiserver::auth::mint_job_token(
        common::AUTH_SECRET,
        "boss",
        lattice_apiserver::auth::BoundAllocation {
            ns: "t1".into(),
            name: "job".into(),
            uid: job["metadata"]["uid"].as_str().unwrap().into(),
        },
        Duration::from_secs(600),
    );
    // What a job does: in its tenant.
    let (code, v) = call(
        &s,
        Method::POST,
        &allocs("t1"),
        &tok,
        Some(alloc("step", "t1")),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    // Nothing of its user's administration.
    for (method, path, body) in [
        (Method::GET, format!("{API}/tenants"), None),
        (Method::GET, allocs("t2"), None),
        (
            Method::POST,
            format!("{API}/clusterrolebindings"),
            Some(binding(
                "ClusterRoleBinding",
                "mine",
                None,
                "system-admin",
                "mallory",
            )),
        ),
        (
            Method::POST,
            "/v1/admin/tokens".to_string(),
            Some(json!({"user": "boss"})),
        ),
    ] {
        let (code, v) = call(&s, method.clone(), &path, &tok, body).await;
        assert_eq!(code, 403, "{method} {path}: {v}");
    }
}

/// An API token acts as its user and in its groups: issuing one for someone else, or in a
/// group, takes `impersonate` on them, whatever right to issue tokens was delegated.
#[tokio::test]
async fn issuing_a_token_for_another_user_or_group_takes_impersonation() {
    let s = server().await;
    setup(&s).await;
    ok(
        &s,
        Method::POST,
        &format!("{API}/clusterroles"),
        json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "ClusterRole",
               "metadata": {"name": "token-issuer"},
               "rules": [{"verbs": ["create", "list"], "resources": ["apitokens"]}]}),
    )
    .await;
    bind(&s, None, "token-issuer", "delegate").await;
    bind(&s, None, "system-admin", "alice").await;
    let d = nobody("delegate");
    until_allowed(&s, &d, "/v1/admin/tokens").await;
    let mint = |body: Value| {
        let d = d.clone();
        let s = &s;
        async move { call(s, Method::POST, "/v1/admin/tokens", &d, Some(body)).await }
    };
    let (code, v) = mint(json!({"user": "alice"})).await;
    assert_eq!(code, 403, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("impersonate"),
        "{v}"
    );
    let (code, v) = mint(json!({"user": "delegate", "groups": ["hpc-admins"]})).await;
    assert_eq!(code, 403, "{v}");
    let (code, v) = mint(json!({"user": "delegate"})).await;
    assert_eq!(code, 201, "{v}");
}

/// A Dag's sensitive task claims nodes like a sensitive allocation does.
#[tokio::test]
async fn a_dag_cannot_smuggle_in_sensitive_work() {
    let s = server().await;
    setup(&s).await;
    let u = token("plain", &["t1"], Role::User);
    let dag = |sensitive: bool| {
        json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Dag",
               "metadata": {"name": format!("d{sensitive}"), "namespace": "t1"},
               "spec": {"allocations": [{"name": "a", "spec": {
                   "entrypoint": "/bin/true", "sensitive": sensitive,
                   "lifecycle": {"walltime": "10m"}}}]}})
    };
    let dags = format!("{API}/namespaces/t1/dags");
    let (code, v) = call(&s, Method::POST, &dags, &u, Some(dag(true))).await;
    assert_eq!(code, 403, "{v}");
    assert!(
        v.to_string().contains("spec.allocations[0].spec.sensitive"),
        "{v}"
    );
    let (code, v) = call(&s, Method::POST, &dags, &u, Some(dag(false))).await;
    assert_eq!(code, 201, "{v}");
}
