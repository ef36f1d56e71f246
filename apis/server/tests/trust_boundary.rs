//! The trust boundary, attacked as a hostile user and a compromised node would: the real
//! HTTP(S) server over an embedded store, with authentication on, the cluster CA, user
//! tokens and node certificates obtained through bootstrap tokens. Every test here
//! performs an attack and checks it is refused with a message that says why.

use std::sync::Arc;
use std::time::Duration;

use lattice_apiserver::{mint_token, ApiConfig, ApiServer, Role};
use lattice_pki::{Ca, Identity};
use lattice_store::{EmbeddedStore, KvBackend, StoreConfig};
use serde_json::{json, Value};

const API: &str = "/apis/lattice.dev/v1alpha1";
const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

struct Cluster {
    /// Plain HTTP (bearer tokens).
    http: String,
    /// HTTPS (client certificates).
    https: String,
    ca: Arc<Ca>,
    store: EmbeddedStore,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
    _stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

fn token(user: &str, tenants: &[&str], role: Role) -> String {
    let t: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
    mint_token(SECRET, user, &t, role, Duration::from_secs(600))
}

/// Binds `claiming-user` to `user` in `tenant` (sensitive work claims nodes), and waits
/// until the server's copy of the bindings has it.
async fn claimer(c: &Cluster, tenant: &str, user: &str) {
    let admin = token("ops", &["*"], Role::Admin);
    let (code, v) = c
        .send(
            &admin,
            "POST",
            &format!("{API}/namespaces/{tenant}/rolebindings"),
            Some(
                json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "RoleBinding",
                        "metadata": {"name": format!("{user}-claims"), "namespace": tenant},
                        "roleRef": {"kind": "ClusterRole", "name": "claiming-user"},
                        "subjects": [{"kind": "User", "name": user}]}),
            ),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let me = token(user, &[], Role::Readonly);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while c
        .send(
            &me,
            "GET",
            &format!("{API}/namespaces/{tenant}/allocations"),
            None,
        )
        .await
        .0
        == 403
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the binding never took effect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cluster() -> Cluster {
    cluster_with(Duration::from_secs(3600)).await
}

async fn cluster_with(node_cert_validity: Duration) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path(), StoreConfig::default())
        .await
        .unwrap();
    let backend: Arc<dyn KvBackend> = Arc::new(store.clone());
    let pki =
        lattice_apiserver::tls::ServerPki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let server = ApiServer::new(
        backend,
        ApiConfig {
            jwt_secret: SECRET.to_vec(),
            auth: true,
            ca: pki.ca.clone(),
            node_cert_validity,
            agent_tls: Some(Arc::new(pki.agent_client_config().unwrap())),
            ..Default::default()
        },
    );
    let mut stop = Vec::new();
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = format!("http://{}", plain.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    stop.push(tx);
    tokio::spawn(server.clone().serve(plain, async move {
        let _ = rx.await;
    }));
    let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let https = format!("https://{}", tls.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    stop.push(tx);
    tokio::spawn(
        server
            .clone()
            .serve_tls(tls, pki.server_config().unwrap(), async move {
                let _ = rx.await;
            }),
    );
    let c = Cluster {
        http,
        https,
        ca: pki.ca.clone().expect("the CA key is here"),
        store,
        client: reqwest::Client::new(),
        _dir: dir,
        _stop: stop,
    };
    let admin = token("ops", &["*"], Role::Admin);
    for t in ["t1", "t2"] {
        let (code, v) = c
            .send(
                &admin,
                "POST",
                &format!("{API}/tenants"),
                Some(
                    json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Tenant",
                    "metadata": {"name": t}, "spec": {"admins": ["tadmin"], "quota": {"sensitivePoolSize": 1}}}),
                ),
            )
            .await;
        assert_eq!(code, 201, "{v}");
    }
    c
}

fn alloc(name: &str) -> Value {
    json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Allocation",
           "metadata": {"name": name},
           "spec": {"entrypoint": "/bin/true", "lifecycle": {"walltime": "10m"}}})
}

impl Cluster {
    async fn send(&self, tok: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        send(&self.client, &self.http, Some(tok), method, path, body).await
    }

    /// Write an allocation's binding straight into the store, as the scheduler would:
    /// `assignedNodes`, phase, attempt, and the Node's owner.
    async fn bind(&self, ns: &str, name: &str, node: &str) {
        let sys = token_system();
        let (code, a) = self
            .send(
                &sys,
                "GET",
                &format!("{API}/namespaces/{ns}/allocations/{name}"),
                None,
            )
            .await;
        assert_eq!(code, 200, "{a}");
        let mut a = a;
        a["status"] = json!({"phase": "Staging", "attempt": 1, "assignedNodes": [node]});
        let (code, v) = self
            .send(
                &sys,
                "PUT",
                &format!("{API}/namespaces/{ns}/allocations/{name}/status"),
                Some(a),
            )
            .await;
        assert_eq!(code, 200, "{v}");
    }

    /// A node's client: enrolled with a bootstrap token made by an admin, then showing
    /// its certificate.
    async fn node(&self, name: &str) -> Node {
        let admin = token("ops", &["*"], Role::Admin);
        let (code, t) = self
            .send(
                &admin,
                "POST",
                "/v1/admin/bootstrap-tokens",
                Some(json!({"node": name})),
            )
            .await;
        assert_eq!(code, 201, "{t}");
        let token = t["token"].as_str().unwrap().to_string();
        let (code, cert, key) = enroll(self, name, &token).await;
        assert_eq!(code, 200, "{cert}");
        Node::new(self, &cert, &key)
    }
}

fn token_system() -> String {
    mint_token(
        SECRET,
        "site-controller",
        &["*".to_string()],
        Role::System,
        Duration::from_secs(600),
    )
}

async fn send(
    client: &reqwest::Client,
    base: &str,
    tok: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut r = client.request(m.clone(), format!("{base}{path}"));
    if let Some(t) = tok {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        let ct = if m == reqwest::Method::PATCH {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        r = r
            .header("content-type", ct)
            .body(serde_json::to_vec(&b).unwrap());
    }
    let resp = r.send().await.unwrap();
    let code = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Spend `token` on a certificate for `node`: (status, certificate or error, key).
async fn enroll(c: &Cluster, node: &str, token: &str) -> (u16, Value, String) {
    let (csr, key) = lattice_pki::csr(&Identity::Node(node.into())).unwrap();
    let tls = lattice_pki::client_config(c.ca.cert_pem(), None).unwrap();
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .build()
        .unwrap();
    let (code, v) = send(
        &client,
        &c.https,
        Some(token),
        "POST",
        "/v1/nodes/certificate",
        Some(json!({"node": node, "csr": csr})),
    )
    .await;
    let cert = if code == 200 {
        v["certificate"].clone()
    } else {
        v
    };
    (code, cert, key)
}

struct Node {
    client: reqwest::Client,
    base: String,
}

impl Node {
    fn new(c: &Cluster, cert: &Value, key: &str) -> Node {
        let tls = lattice_pki::client_config(c.ca.cert_pem(), Some((cert.as_str().unwrap(), key)))
            .unwrap();
        Node {
            client: reqwest::Client::builder()
                .use_preconfigured_tls(tls)
                .build()
                .unwrap(),
            base: c.https.clone(),
        }
    }

    async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        send(&self.client, &self.base, None, method, path, body).await
    }
}

#[tokio::test]
async fn a_user_cannot_write_status_nor_pick_whom_their_work_runs_as() {
    let c = cluster().await;
    let alice = token("alice", &["t1"], Role::User);
    let path = format!("{API}/namespaces/t1/allocations");
    // Submitting as someone else: refused, naming the annotation and the fix.
    let mut a = alloc("a1");
    a["metadata"]["annotations"] = json!({"lattice.dev/user": "root"});
    let (code, v) = c.send(&alice, "POST", &path, Some(a)).await;
    assert_eq!(code, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("authenticated identity"),
        "{v}"
    );
    // Without it, the server names the caller.
    let (code, v) = c.send(&alice, "POST", &path, Some(alloc("a1"))).await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["metadata"]["annotations"]["lattice.dev/user"], "alice");
    // (a) Writing one's own status to run past the scheduler: 403.
    let mut forged = v.clone();
    forged["status"] = json!({"phase": "Running", "attempt": 1, "assignedNodes": ["n1"],
                              "walltimeSeconds": 99999999});
    for (method, sub) in [("PUT", "/status"), ("PATCH", "/status")] {
        let (code, v) = c
            .send(
                &alice,
                method,
                &format!("{path}/a1{sub}"),
                Some(forged.clone()),
            )
            .await;
        assert_eq!(code, 403, "{method} {v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("status is written only"),
            "{v}"
        );
    }
    // An admin cannot either: status is the system's.
    let admin = token("ops", &["*"], Role::Admin);
    let (code, v) = c
        .send(
            &admin,
            "PUT",
            &format!("{path}/a1/status"),
            Some(forged.clone()),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    // A status smuggled in a spec write is ignored (the stored status is untouched).
    let (code, v) = c
        .send(&alice, "PUT", &format!("{path}/a1"), Some(forged))
        .await;
    assert_eq!(code, 200, "{v}");
    assert!(
        v.get("status")
            .is_none_or(|s| s.get("assignedNodes").is_none()),
        "{v}"
    );
    // Nor can an admin change whom it runs as.
    let (code, v) = c
        .send(
            &admin,
            "PATCH",
            &format!("{path}/a1"),
            Some(json!({"metadata": {"annotations": {"lattice.dev/user": "root"}}})),
        )
        .await;
    assert_eq!(code, 403, "{v}");
}

#[tokio::test]
async fn system_owned_metadata_and_other_users_objects_are_out_of_reach() {
    let c = cluster().await;
    let alice = token("alice", &["t1"], Role::User);
    let bob = token("bob", &["t1"], Role::User);
    let path = format!("{API}/namespaces/t1/allocations");
    let (code, bobs) = c.send(&bob, "POST", &path, Some(alloc("b1"))).await;
    assert_eq!(code, 201, "{bobs}");
    // The scheduler's annotation and finalizer.
    let mut a = alloc("a1");
    a["metadata"]["annotations"] = json!({"lattice.dev/preempt-requested": "b1"});
    let (code, v) = c.send(&alice, "POST", &path, Some(a)).await;
    assert_eq!(code, 403, "{v}");
    let mut a = alloc("a1");
    a["metadata"]["finalizers"] = json!(["lattice.dev/nodes"]);
    let (code, v) = c.send(&alice, "POST", &path, Some(a)).await;
    assert_eq!(code, 403, "{v}");
    // Adopting an object into someone else's (a Dag would take it for its task).
    let mut a = alloc("a1");
    a["metadata"]["ownerReferences"] = json!([{"apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation", "name": "b1", "uid": bobs["metadata"]["uid"]}]);
    let (code, v) = c.send(&alice, "POST", &path, Some(a)).await;
    assert_eq!(code, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("belongs to user \"bob\""),
        "{v}"
    );
    // A job step of someone else's allocation (it would run on their nodes).
    let mut step = alloc("b1.0");
    step["spec"]["stepOf"] = json!("b1");
    step["metadata"]["ownerReferences"] = json!([{"apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation", "name": "b1", "uid": bobs["metadata"]["uid"], "controller": true}]);
    let (code, v) = c.send(&alice, "POST", &path, Some(step)).await;
    assert_eq!(code, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("belongs to user \"bob\""),
        "{v}"
    );
    // Changing or deleting bob's work.
    let (code, _) = c
        .send(
            &alice,
            "PATCH",
            &format!("{path}/b1"),
            Some(json!({"spec": {"args": ["x"]}})),
        )
        .await;
    assert_eq!(code, 403);
    let (code, _) = c.send(&alice, "DELETE", &format!("{path}/b1"), None).await;
    assert_eq!(code, 403);
}

#[tokio::test]
async fn a_tenant_user_sees_nothing_of_another_tenant_through_any_route() {
    let c = cluster().await;
    let alice = token("alice", &["t1"], Role::User);
    let bob = token("bob", &["t2"], Role::User);
    let (code, v) = c
        .send(
            &bob,
            "POST",
            &format!("{API}/namespaces/t2/allocations"),
            Some(alloc("secret")),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    for path in [
        format!("{API}/namespaces/t2/allocations"),
        format!("{API}/namespaces/t2/allocations/secret"),
        format!("{API}/namespaces/t2/allocations?watch=true"),
        format!("{API}/allocations"),
        format!("{API}/allocations?watch=true&timeoutSeconds=1"),
        format!("{API}/namespaces/t2/events"),
        format!("{API}/namespaces/t2/allocations/secret/log"),
        format!("{API}/namespaces/t2/allocations/secret/attach"),
        format!("{API}/tenants/t2"),
        format!("{API}/tenants"),
        "/v1/allocations?tenant=t2".to_string(),
        "/v1/allocations/t2/secret".to_string(),
        "/v1/allocations/secret?tenant=t2".to_string(),
        "/v1/allocations/secret/attach?tenant=t2".to_string(),
        "/v1/tenants".to_string(),
    ] {
        let (code, v) = c.send(&alice, "GET", &path, None).await;
        assert!(code == 403 || code == 404, "{path}: {code} {v}");
        assert!(
            !v.to_string().contains("/bin/true"),
            "{path} leaked the object: {v}"
        );
    }
    // Looked up by name only, another tenant's object is not found rather than revealed.
    let (code, _) = c.send(&alice, "GET", "/v1/allocations/secret", None).await;
    assert_eq!(code, 404);
    // Their own tenant, by name: yes.
    let (code, _) = c
        .send(&alice, "GET", &format!("{API}/tenants/t1"), None)
        .await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn vclusters_and_home_nodes_are_not_a_users_to_take() {
    let c = cluster().await;
    let alice = token("alice", &["t1"], Role::User);
    let tadmin = token("tadmin", &["t1"], Role::User);
    let admin = token("ops", &["*"], Role::Admin);
    let vcs = format!("{API}/namespaces/t1/vclusters");
    let vc = |home: Value| {
        json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "VCluster",
               "metadata": {"name": "mine"},
               "spec": {"schedulerType": "hpc-backfill", "homeNodes": home, "maxWalltime": "1h"}})
    };
    // (d) A plain user creating a vCluster that claims any node as its home.
    let (code, v) = c.send(&alice, "POST", &vcs, Some(vc(json!(["n1"])))).await;
    assert_eq!(code, 403, "{v}");
    // A tenant admin: the vCluster, but not nodes nobody gave it.
    for n in ["n1", "n2"] {
        let (code, v) = c
            .send(&admin, "POST", &format!("{API}/nodes"), Some(json!({"apiVersion": "lattice.dev/v1alpha1",
                "kind": "Node", "metadata": {"name": n}, "spec": if n == "n2" {json!({"homeVcluster": "t1/mine"})} else {json!({})}})))
            .await;
        assert_eq!(code, 201, "{v}");
    }
    let (code, v) = c.send(&tadmin, "POST", &vcs, Some(vc(json!(["n1"])))).await;
    assert_eq!(code, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("administrator assigns them"),
        "{v}"
    );
    let (code, v) = c.send(&tadmin, "POST", &vcs, Some(vc(json!(["n2"])))).await;
    assert_eq!(code, 201, "{v}");
    // An admin may.
    let (code, v) = c
        .send(
            &admin,
            "PATCH",
            &format!("{vcs}/mine"),
            Some(json!({"spec": {"homeNodes": ["n1", "n2"]}})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    // Scheduler extenders are an administrator's to set, not a tenant admin's ...
    let ext = json!({"spec": {"extenders": [{"name": "site", "url": "http://169.254.169.254/", "filter": true}]}});
    let (code, v) = c
        .send(&tadmin, "PATCH", &format!("{vcs}/mine"), Some(ext.clone()))
        .await;
    assert_eq!(code, 403, "{v}");
    assert!(v.to_string().contains("spec.extenders"), "{v}");
    let (code, v) = c
        .send(&admin, "PATCH", &format!("{vcs}/mine"), Some(ext))
        .await;
    assert_eq!(code, 200, "{v}");
    // ... who may still change the rest of the vCluster.
    let (code, v) = c
        .send(
            &tadmin,
            "PATCH",
            &format!("{vcs}/mine"),
            Some(json!({"spec": {"description": "batch"}})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    // maxWalltime holds at admission.
    let mut a = alloc("long");
    a["spec"]["vcluster"] = json!("mine");
    a["spec"]["lifecycle"]["walltime"] = json!("2h");
    let (code, v) = c
        .send(
            &alice,
            "POST",
            &format!("{API}/namespaces/t1/allocations"),
            Some(a),
        )
        .await;
    assert_eq!(code, 422, "{v}");
    assert!(v.to_string().contains("maxWalltime 1h"), "{v}");
    // Plain users cannot change tenants (quotas, admins, policies).
    let (code, _) = c
        .send(
            &tadmin,
            "PATCH",
            &format!("{API}/tenants/t1"),
            Some(json!({"spec": {"admins": ["alice"]}})),
        )
        .await;
    assert_eq!(code, 403);
}

#[tokio::test]
async fn bootstrap_tokens_are_single_use_bound_and_for_admins_only() {
    let c = cluster().await;
    let admin = token("ops", &["*"], Role::Admin);
    let alice = token("alice", &["t1"], Role::User);
    let (code, _) = c
        .send(
            &alice,
            "POST",
            "/v1/admin/bootstrap-tokens",
            Some(json!({"node": "n1"})),
        )
        .await;
    assert_eq!(code, 403);
    let (code, t) = c
        .send(
            &admin,
            "POST",
            "/v1/admin/bootstrap-tokens",
            Some(json!({"node": "n1"})),
        )
        .await;
    assert_eq!(code, 201, "{t}");
    let tok = t["token"].as_str().unwrap().to_string();
    // Bound to n1: n2 cannot use it.
    let (code, v, _) = enroll(&c, "n2", &tok).await;
    assert_eq!(code, 403, "{v}");
    // Once.
    let (code, v, _) = enroll(&c, "n1", &tok).await;
    assert_eq!(code, 200, "{v}");
    let (code, v, _) = enroll(&c, "n1", &tok).await;
    assert_eq!(code, 401, "{v}");
    // A guessed token.
    let (code, _, _) = enroll(&c, "n1", "abcdef.0123456789abcdef").await;
    assert_eq!(code, 401);
    // An unbound token cannot re-enroll a node that has a live certificate (it would
    // impersonate it), but can enroll a new one.
    let (_, t) = c
        .send(
            &admin,
            "POST",
            "/v1/admin/bootstrap-tokens",
            Some(json!({})),
        )
        .await;
    let any = t["token"].as_str().unwrap().to_string();
    let (code, v, _) = enroll(&c, "n1", &any).await;
    assert_eq!(code, 403, "{v}");
    let (code, v, _) = enroll(&c, "n3", &any).await;
    assert_eq!(code, 200, "{v}");
    // Expired tokens are refused: too short to wait for, so an expired record is
    // planted the way the server keeps them.
    let (code, list) = c
        .send(&admin, "GET", "/v1/admin/bootstrap-tokens", None)
        .await;
    assert_eq!(code, 200);
    assert!(
        !list.to_string().contains(&any),
        "the list never shows secrets"
    );
}

#[tokio::test]
async fn a_node_touches_only_its_own_node_lease_and_bound_allocations() {
    let c = cluster().await;
    let alice = token("alice", &["t1"], Role::User);
    for name in ["mine", "theirs"] {
        let (code, v) = c
            .send(
                &alice,
                "POST",
                &format!("{API}/namespaces/t1/allocations"),
                Some(alloc(name)),
            )
            .await;
        assert_eq!(code, 201, "{v}");
    }
    c.bind("t1", "mine", "n1").await;
    c.bind("t1", "theirs", "n2").await;
    let n1 = c.node("n1").await;
    // Its own node: register it (with only what an agent knows) and report on it.
    let (code, v) = n1
        .send(
            "POST",
            &format!("{API}/nodes"),
            Some(json!({"apiVersion": "lattice.dev/v1alpha1",
            "kind": "Node", "metadata": {"name": "n1"}, "spec": {"topologyGroup": 1}})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let (code, v) = n1
        .send(
            "POST",
            &format!("{API}/nodes"),
            Some(json!({"apiVersion": "lattice.dev/v1alpha1",
            "kind": "Node", "metadata": {"name": "n2"}})),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    let (code, v) = n1
        .send(
            "POST",
            &format!("{API}/nodes"),
            Some(json!({"apiVersion": "lattice.dev/v1alpha1",
            "kind": "Node", "metadata": {"name": "n1"}, "spec": {"homeVcluster": "t1/x"}})),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    let (code, v) = n1
        .send(
            "PATCH",
            &format!("{API}/nodes/n1/status"),
            Some(json!({"status": {"state": "Ready",
            "capacity": {"cpuCores": 4}}})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    // Not the scheduler's part of it, nor its spec.
    let (code, v) = n1
        .send(
            "PATCH",
            &format!("{API}/nodes/n1/status"),
            Some(json!({"status": {"owner":
            {"tenant": "t1", "allocation": "theirs"}}})),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    let (code, _) = n1
        .send(
            "PATCH",
            &format!("{API}/nodes/n1"),
            Some(json!({"spec": {"unschedulable": false}})),
        )
        .await;
    assert_eq!(code, 403);
    // Allocations: its own view only.
    let (code, v) = n1
        .send(
            "GET",
            &format!("{API}/allocations?fieldSelector=status.assignedNodes%3Dn1"),
            None,
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let names: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mine"]);
    for path in [
        format!("{API}/allocations"),
        format!("{API}/allocations?fieldSelector=status.assignedNodes%3Dn2"),
        format!("{API}/namespaces/t1/allocations"),
        format!("{API}/namespaces/t1/vclusters"),
        format!("{API}/nodes/n2"),
        "/v1/admin/config".to_string(),
    ] {
        let (code, v) = n1.send("GET", &path, None).await;
        assert_eq!(code, 403, "{path}: {v}");
    }
    let (code, _) = n1
        .send(
            "GET",
            &format!("{API}/namespaces/t1/allocations/theirs"),
            None,
        )
        .await;
    assert_eq!(
        code, 404,
        "another node's allocation is not even there for it"
    );
    let (code, _) = n1
        .send(
            "GET",
            &format!("{API}/namespaces/t1/allocations/mine"),
            None,
        )
        .await;
    assert_eq!(code, 200);
    // A node certificate used for another node's allocation: refused, and nothing there
    // is revealed.
    let (_, theirs) = c
        .send(
            &alice,
            "GET",
            &format!("{API}/namespaces/t1/allocations/theirs"),
            None,
        )
        .await;
    let report =
        |uid: &Value, node: &str, body: Value| json!({"node": node, "uid": uid, "report": body});
    let (code, v) = n1
        .send(
            "POST",
            &format!("{API}/namespaces/t1/allocations/theirs/report"),
            Some(report(
                &theirs["metadata"]["uid"],
                "n1",
                json!({"phase": "Succeeded", "attempt": 1, "exitCode": 0}),
            )),
        )
        .await;
    assert_eq!(code, 404, "{v}");
    // Reporting as another node: refused.
    let (code, v) = n1
        .send(
            "POST",
            &format!("{API}/namespaces/t1/allocations/theirs/report"),
            Some(report(
                &theirs["metadata"]["uid"],
                "n2",
                json!({"phase": "Succeeded", "attempt": 1, "exitCode": 0}),
            )),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    // Writing an allocation's status directly: refused, its own or not; the phase, the
    // nodes and the walltime are the server's to derive, not the node's to set.
    let (_, mine) = c
        .send(
            &alice,
            "GET",
            &format!("{API}/namespaces/t1/allocations/mine"),
            None,
        )
        .await;
    let mut forged = mine.clone();
    forged["status"]["assignedNodes"] = json!(["n1", "n2", "n3"]);
    forged["status"]["walltimeSeconds"] = json!(99999999);
    forged["status"]["phase"] = json!("Completed");
    let (code, v) = n1
        .send(
            "PUT",
            &format!("{API}/namespaces/t1/allocations/mine/status"),
            Some(forged),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    // Its own report on its own allocation is what it may write, and the server derives
    // the rest from it.
    let (code, v) = n1
        .send(
            "POST",
            &format!("{API}/namespaces/t1/allocations/mine/report"),
            Some(report(
                &mine["metadata"]["uid"],
                "n1",
                json!({"phase": "Running", "attempt": 1, "pid": 7}),
            )),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let (_, v) = c
        .send(
            &alice,
            "GET",
            &format!("{API}/namespaces/t1/allocations/mine"),
            None,
        )
        .await;
    assert_eq!(v["status"]["assignedNodes"], json!(["n1"]), "{v}");
    assert_eq!(v["status"]["phase"], "Running", "{v}");
    assert_eq!(v["status"]["nodeStates"]["n1"]["pid"], 7);
    // People do not report.
    let (code, _) = c
        .send(
            &alice,
            "POST",
            &format!("{API}/namespaces/t1/allocations/mine/report"),
            Some(report(
                &mine["metadata"]["uid"],
                "n1",
                json!({"phase": "Succeeded", "attempt": 1}),
            )),
        )
        .await;
    assert_eq!(code, 403);
    // Job tokens: for its bound allocation only.
    let (code, _) = n1
        .send("POST", "/v1/allocations/theirs/token?tenant=t1", None)
        .await;
    assert_eq!(code, 404);
    // A node can never use a bearer token in place of its certificate.
    let forged = mint_token(
        SECRET,
        "system:node:n2",
        &[],
        Role::Node,
        Duration::from_secs(60),
    );
    let (code, _) = c.send(&forged, "GET", &format!("{API}/nodes"), None).await;
    assert_eq!(code, 401);
}

#[tokio::test]
async fn a_revoked_or_expired_node_certificate_is_refused() {
    let c = cluster_with(Duration::from_secs(2)).await;
    let admin = token("ops", &["*"], Role::Admin);
    let n1 = c.node("n1").await;
    let (code, v) = n1
        .send(
            "POST",
            &format!("{API}/nodes"),
            Some(json!({"apiVersion": "lattice.dev/v1alpha1",
            "kind": "Node", "metadata": {"name": "n1"}})),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let (code, v) = c
        .send(&admin, "POST", "/v1/admin/nodes/n1/revoke", None)
        .await;
    assert_eq!(code, 200, "{v}");
    // Within a moment, on this server (the revocation set follows the store).
    let mut refused = false;
    for _ in 0..50 {
        let (code, v) = n1.send("GET", &format!("{API}/nodes/n1"), None).await;
        if code == 401 {
            assert!(v["message"].as_str().unwrap().contains("revoked"), "{v}");
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "a revoked certificate still works");
    // Expired: the certificate lived 2 s (plus the 5 minutes certificates are backdated
    // by, which the server does not count: it checks notAfter).
    let n2 = c.node("n2").await;
    let (code, _) = n2.send("GET", &format!("{API}/nodes/n2"), None).await;
    assert_eq!(code, 404, "n2 is not registered yet, but it got in");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = n2
        .client
        .get(format!("{}{API}/nodes/n2", n2.base))
        .send()
        .await;
    match r {
        Err(_) => {} // refused at the handshake
        Ok(resp) => assert_eq!(resp.status().as_u16(), 401),
    }
    let _ = &c.store;
}

/// The heartbeat metric's value.
async fn heartbeats_counted(c: &Cluster) -> f64 {
    let admin = token("ops", &["*"], Role::Admin);
    let text = c
        .client
        .get(format!("{}/metrics", c.http))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("lattice_apiserver_heartbeats_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Enroll `node` and open its heartbeat stream over mutual TLS, as the agent does.
async fn tls_heartbeat(
    c: &Cluster,
    node: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let admin = token("ops", &["*"], Role::Admin);
    let (code, t) = c
        .send(
            &admin,
            "POST",
            "/v1/admin/bootstrap-tokens",
            Some(json!({"node": node})),
        )
        .await;
    assert_eq!(code, 201, "{t}");
    let (code, cert, key) = enroll(c, node, t["token"].as_str().unwrap()).await;
    assert_eq!(code, 200, "{cert}");
    let tls =
        lattice_pki::client_config(c.ca.cert_pem(), Some((cert.as_str().unwrap(), &key))).unwrap();
    let tcp = tokio::net::TcpStream::connect(c.https.trim_start_matches("https://"))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .unwrap();
    s.write_all(
        format!(
            "POST {API}/nodes/{node}/heartbeat?sequence=1 HTTP/1.1\r\nHost: localhost\r\n\
             Connection: Upgrade\r\nUpgrade: lattice-heartbeat/1\r\nContent-Length: 0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s.flush().await.unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_string();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

/// Everything the server sends until it closes the stream (or `secs` pass).
async fn read_to_end(
    s: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    secs: u64,
) -> String {
    use tokio::io::AsyncReadExt;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(secs), s.read_to_end(&mut rest)).await;
    String::from_utf8_lossy(&rest).to_string()
}

#[tokio::test]
async fn a_node_flooding_its_heartbeat_stream_is_cut_off_and_others_still_beat() {
    use tokio::io::AsyncWriteExt;
    // One reader thread serves every node's stream: a compromised node that floods its
    // own must not starve the others' renewals.
    let c = cluster().await;
    let mut flood = tls_heartbeat(&c, "n1").await;
    let mut honest = tls_heartbeat(&c, "n2").await;
    let before = heartbeats_counted(&c).await;
    let blob = "1\n".repeat(32 * 1024); // replays: counted as nothing, 64 KiB each write
    let flooding = async {
        for _ in 0..64 {
            if flood.write_all(blob.as_bytes()).await.is_err() || flood.flush().await.is_err() {
                break;
            }
        }
        read_to_end(&mut flood, 10).await
    };
    let beating = async {
        for seq in 2..14u64 {
            honest
                .write_all(format!("{seq}\n").as_bytes())
                .await
                .unwrap();
            honest.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let (farewell, ()) = tokio::join!(flooding, beating);
    assert!(
        farewell.contains("BadRequest") && farewell.contains("one short line per interval"),
        "{farewell}"
    );
    assert!(
        heartbeats_counted(&c).await >= before + 5.0,
        "the honest node's beats were not read while another flooded"
    );
}

#[tokio::test]
async fn a_tls_heartbeat_stream_ends_when_its_certificate_is_revoked() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The stream leaves hyper for the heartbeat reader thread with its TLS state: the
    // reader decrypts the beats, and still ends the session on revocation.
    let c = cluster().await;
    let admin = token("ops", &["*"], Role::Admin);
    let mut s = tls_heartbeat(&c, "n1").await;
    let mut chunk = [0u8; 1024];
    // Beats arrive through the reader.
    let before = heartbeats_counted(&c).await;
    let mut seq = 2u64;
    let mut counted = false;
    for _ in 0..40 {
        s.write_all(format!("{seq}\n").as_bytes()).await.unwrap();
        s.flush().await.unwrap();
        seq += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
        if heartbeats_counted(&c).await > before {
            counted = true;
            break;
        }
    }
    assert!(counted, "no heartbeat over TLS was counted");
    // Revoked: the next renewal ends the session, and the agent is told why.
    let (code, v) = c
        .send(&admin, "POST", "/v1/admin/nodes/n1/revoke", None)
        .await;
    assert_eq!(code, 200, "{v}");
    let beat = async {
        let mut rest = Vec::new();
        loop {
            if s.write_all(format!("{seq}\n").as_bytes()).await.is_err() || s.flush().await.is_err()
            {
                break;
            }
            seq += 1;
            match tokio::time::timeout(Duration::from_millis(300), s.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => rest.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
        }
        String::from_utf8_lossy(&rest).to_string()
    };
    let farewell = tokio::time::timeout(Duration::from_secs(10), beat)
        .await
        .expect("the stream outlived its revoked certificate");
    assert!(
        farewell.contains("Unauthorized") && farewell.contains("revoked"),
        "{farewell}"
    );
}

#[tokio::test]
async fn renewal_waits_for_half_the_lifetime() {
    // A stolen key cannot mint a stream of fresh certificates.
    let c = cluster().await;
    let n1 = c.node("n1").await;
    let (csr, _) = lattice_pki::csr(&Identity::Node("n1".into())).unwrap();
    let (code, v) = n1
        .send(
            "POST",
            "/v1/nodes/certificate/renew",
            Some(json!({"csr": csr})),
        )
        .await;
    assert_eq!(code, 429, "{v}");
    assert!(
        v["message"].as_str().unwrap_or("").contains("renew after"),
        "{v}"
    );
}

#[tokio::test]
async fn a_node_renews_its_own_certificate_only() {
    let c = cluster_with(Duration::from_secs(4)).await;
    let n1 = c.node("n1").await;
    let (csr, _) = lattice_pki::csr(&Identity::Node("n1".into())).unwrap();
    let renew = || {
        n1.send(
            "POST",
            "/v1/nodes/certificate/renew",
            Some(json!({"csr": csr})),
        )
    };
    // Certificates start five minutes back (clock skew): this one is past half its life.
    let (code, v) = renew().await;
    assert_eq!(code, 200, "{v}");
    let info = lattice_pki::inspect_pem(v["certificate"].as_str().unwrap()).unwrap();
    assert_eq!(info.identity, Some(Identity::Node("n1".into())));
    // Asking for another node's: refused, and a CSR that names another node still gets
    // a certificate for the caller only.
    let (code, v) = n1
        .send(
            "POST",
            "/v1/nodes/certificate/renew",
            Some(json!({"node": "n2", "csr": csr})),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    let (csr2, _) = lattice_pki::csr(&Identity::Node("n2".into())).unwrap();
    let (code, v) = n1
        .send(
            "POST",
            "/v1/nodes/certificate/renew",
            Some(json!({"csr": csr2})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let info = lattice_pki::inspect_pem(v["certificate"].as_str().unwrap()).unwrap();
    assert_eq!(info.identity, Some(Identity::Node("n1".into())));
    // People renew nothing.
    let admin = token("ops", &["*"], Role::Admin);
    let (code, _) = c
        .send(
            &admin,
            "POST",
            "/v1/nodes/certificate/renew",
            Some(json!({"csr": csr})),
        )
        .await;
    assert_eq!(code, 403);
    // Both renewed certificates are revoked with the node.
    let (code, v) = c
        .send(&admin, "POST", "/v1/admin/nodes/n1/revoke", None)
        .await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["revoked"].as_array().map(Vec::len), Some(3), "{v}");
}

/// (e) A tenant-mate's output is not a user's to read, and a sensitive allocation's is
/// its owner's only, an admin's neither. The refusals come before any agent is asked.
#[tokio::test]
async fn logs_and_attach_of_others_and_of_sensitive_work_are_refused() {
    let c = cluster().await;
    let alice = token("alice", &["t1"], Role::User);
    let bob = token("bob", &["t1"], Role::User);
    let tadmin = token("tadmin", &["t1"], Role::User);
    let admin = token("ops", &["*"], Role::Admin);
    let path = format!("{API}/namespaces/t1/allocations");
    let mut sensitive = alloc("s1");
    sensitive["spec"]["sensitive"] = json!(true);
    claimer(&c, "t1", "bob").await;
    for a in [alloc("b1"), sensitive] {
        let (code, v) = c.send(&bob, "POST", &path, Some(a)).await;
        assert_eq!(code, 201, "{v}");
    }
    for (who, name, want) in [
        (&alice, "b1", 403),
        (&alice, "s1", 403),
        (&admin, "s1", 403),
        (&tadmin, "s1", 403),
    ] {
        for sub in ["log", "attach"] {
            let (code, v) = c
                .send(who, "GET", &format!("{path}/{name}/{sub}"), None)
                .await;
            assert_eq!(code, want, "{sub} of {name}: {v}");
        }
    }
    // Its owner, an admin (not sensitive) and the tenant's admin (logs, not sensitive) get
    // past the authorizer: the allocation has not run anywhere, which is the answer.
    for (who, name) in [(&bob, "s1"), (&bob, "b1"), (&admin, "b1"), (&tadmin, "b1")] {
        let (code, v) = c
            .send(who, "GET", &format!("{path}/{name}/log"), None)
            .await;
        assert_eq!(code, 400, "{name}: {v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("has not been placed"),
            "{v}"
        );
    }
}

/// Priority and sensitivity come from the tenant's contract, not the user's wish: a user
/// cannot give their work a class that preempts other tenants', nor make it sensitive
/// where no sensitive pool was granted, nor make sensitive work ordinary to read it.
#[tokio::test]
async fn preemption_class_and_sensitivity_are_the_tenants_contract() {
    let c = cluster().await;
    let admin = token("ops", &["*"], Role::Admin);
    let alice = token("alice", &["t1"], Role::User);
    let path = format!("{API}/namespaces/t1/allocations");
    let mut a = alloc("urgent");
    a["spec"]["preemptionClass"] = json!(9);
    let (code, v) = c.send(&alice, "POST", &path, Some(a.clone())).await;
    assert_eq!(code, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("maxPreemptionClass"),
        "{v}"
    );
    a["spec"]["preemptionClass"] = json!(7);
    let (code, v) = c.send(&alice, "POST", &path, Some(a)).await;
    assert_eq!(code, 201, "{v}");
    // Raised by an administrator, it is allowed.
    let (code, v) = c
        .send(
            &admin,
            "PATCH",
            &format!("{API}/tenants/t1"),
            Some(json!({"spec": {"quota": {"maxPreemptionClass": 9}}})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let mut a = alloc("urgent2");
    a["spec"]["preemptionClass"] = json!(9);
    let (code, v) = c.send(&alice, "POST", &path, Some(a)).await;
    assert_eq!(code, 201, "{v}");
    // Sensitive: only with a pool; once sensitive, always.
    let (code, v) = c
        .send(
            &admin,
            "PATCH",
            &format!("{API}/tenants/t2"),
            Some(json!({"spec": {"quota": {"sensitivePoolSize": null}}})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let carol = token("carol", &["t2"], Role::User);
    claimer(&c, "t2", "carol").await;
    claimer(&c, "t1", "alice").await;
    let mut s = alloc("secret");
    s["spec"]["sensitive"] = json!(true);
    let (code, v) = c
        .send(
            &carol,
            "POST",
            &format!("{API}/namespaces/t2/allocations"),
            Some(s.clone()),
        )
        .await;
    assert_eq!(code, 403, "{v}");
    let (code, v) = c.send(&alice, "POST", &path, Some(s)).await;
    assert_eq!(code, 201, "{v}");
    for who in [&alice, &admin] {
        let (code, v) = c
            .send(
                who,
                "PATCH",
                &format!("{path}/secret"),
                Some(json!({"spec": {"sensitive": false}})),
            )
            .await;
        assert_eq!(code, 403, "{v}");
    }
}

/// A watch ends with its credential: when a token expires, and when a node's certificate
/// is revoked (within the watch's recheck), however long a `timeoutSeconds` it asked for.
#[tokio::test]
async fn watches_end_with_their_credential() {
    let c = cluster().await;
    let admin = token("ops", &["*"], Role::Admin);
    let ends_within = |client: reqwest::Client, url: String| async move {
        let t0 = std::time::Instant::now();
        let r = client.get(url).send().await.expect("the watch");
        let status = r.status().as_u16();
        let _ = r.bytes().await;
        (status, t0.elapsed())
    };
    // A token that lives 2 s, watching for 60.
    let short = mint_token(
        SECRET,
        "alice",
        &["t1".to_string()],
        Role::User,
        Duration::from_secs(2),
    );
    let client = reqwest::Client::builder()
        .default_headers({
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {short}").parse().unwrap(),
            );
            h
        })
        .build()
        .unwrap();
    let (code, took) = tokio::time::timeout(
        Duration::from_secs(20),
        ends_within(
            client,
            format!(
                "{}{API}/namespaces/t1/allocations?watch=true&timeoutSeconds=60",
                c.http
            ),
        ),
    )
    .await
    .expect("a watch outlived its token by far");
    assert_eq!(code, 200);
    assert!(took < Duration::from_secs(10), "{took:?}");

    // A node's watch of its allocations, then its certificate revoked.
    let n1 = c.node("n1").await;
    let url = format!(
        "{}{API}/allocations?watch=true&timeoutSeconds=60&fieldSelector=status.assignedNodes%3Dn1",
        n1.base
    );
    let watching = tokio::spawn(ends_within(n1.client.clone(), url));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !watching.is_finished(),
        "the node's watch ended before the revocation"
    );
    let (code, v) = c
        .send(&admin, "POST", "/v1/admin/nodes/n1/revoke", None)
        .await;
    assert_eq!(code, 200, "{v}");
    let (code, took) = tokio::time::timeout(Duration::from_secs(20), watching)
        .await
        .expect("a watch outlived its revoked certificate")
        .unwrap();
    assert_eq!(code, 200);
    assert!(took < Duration::from_secs(15), "{took:?}");
}

/// A person outside the owning tenant sees that a node is taken, not by whose work: on
/// get, list, Table, watch and the `/v1` routes.
#[tokio::test]
async fn people_see_that_a_node_is_taken_not_by_whom() {
    let c = cluster().await;
    let admin = token("ops", &["*"], Role::Admin);
    let (code, n) = c
        .send(
            &admin,
            "POST",
            &format!("{API}/nodes"),
            Some(json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Node",
                        "metadata": {"name": "n1"}, "spec": {}})),
        )
        .await;
    assert_eq!(code, 201, "{n}");
    let mut n = n;
    n["status"] = json!({"owner": {"tenant": "t2", "allocation": "secret-project",
                                   "user": "carol"},
                         "allocations": ["secret-project"]});
    let (code, v) = c
        .send(
            &token_system(),
            "PUT",
            &format!("{API}/nodes/n1/status"),
            Some(n),
        )
        .await;
    assert_eq!(code, 200, "{v}");
    let alice = token("alice", &["t1"], Role::User);
    let carol = token("carol", &["t2"], Role::User);
    for path in [
        format!("{API}/nodes/n1"),
        format!("{API}/nodes"),
        "/v1/nodes".to_string(),
        "/v1/nodes/n1".to_string(),
    ] {
        let (code, v) = c.send(&alice, "GET", &path, None).await;
        assert_eq!(code, 200, "{path}: {v}");
        let text = v.to_string();
        assert!(
            !text.contains("secret-project") && !text.contains("carol"),
            "{path} shows t2's work to alice: {text}"
        );
        let (code, v) = c.send(&carol, "GET", &path, None).await;
        assert_eq!(code, 200, "{path}: {v}");
        assert!(v.to_string().contains("secret-project"), "{path}: {v}");
    }
    for (accept, url) in [
        (
            "application/json",
            format!("{}{API}/nodes?watch=true&timeoutSeconds=1", c.http),
        ),
        (
            "application/json;as=Table;g=meta.k8s.io;v=v1",
            format!("{}{API}/nodes", c.http),
        ),
    ] {
        let text = c
            .client
            .get(url)
            .bearer_auth(&alice)
            .header("accept", accept)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(text.contains("n1"), "{text}");
        assert!(
            !text.contains("secret-project") && !text.contains("carol"),
            "{text}"
        );
    }
}

/// Node `name` (made if missing) with agent capabilities `caps`.
async fn capable_node(c: &Cluster, name: &str, caps: Value) {
    let sys = token_system();
    let (code, v) = c
        .send(
            &sys,
            "POST",
            &format!("{API}/nodes"),
            Some(json!({"apiVersion": "lattice.dev/v1alpha1", "kind": "Node",
                        "metadata": {"name": name}, "spec": {}})),
        )
        .await;
    assert!(code == 201 || code == 409, "{v}");
    let (code, v) = c
        .send(
            &sys,
            "PATCH",
            &format!("{API}/nodes/{name}/status"),
            Some(json!({"status": {"agent": {"capabilities": caps}}})),
        )
        .await;
    assert_eq!(code, 200, "{v}");
}

/// Work that needs what only some agents run (`status.agent.capabilities`) is admitted
/// only where it can run: an image job when some node reports `oci`; a PMIx step when
/// every node of its allocation reports `pmix`, naming those that do not.
#[tokio::test]
async fn work_is_admitted_only_where_an_agent_can_run_it() {
    let c = cluster().await;
    let sys = token_system();
    let alice = token("alice", &["t1"], Role::User);
    capable_node(&c, "n1", json!(["pmix"])).await;
    capable_node(&c, "n2", json!([])).await;
    let path = format!("{API}/namespaces/t1/allocations");
    let mut boxed = alloc("boxed");
    boxed["spec"]["environment"] = json!({"image": "ubuntu:24.04"});
    let (code, v) = c.send(&alice, "POST", &path, Some(boxed.clone())).await;
    assert_eq!(code, 422, "{v}");
    let said = v["message"].as_str().unwrap();
    assert!(
        said.contains("spec.environment.image") && said.contains("oci capability"),
        "{said}"
    );
    capable_node(&c, "n2", json!(["oci"])).await;
    let (code, v) = c.send(&alice, "POST", &path, Some(boxed)).await;
    assert_eq!(code, 201, "{v}");

    // A PMIx step of an allocation on n1 (pmix) and n2 (none).
    let (code, job) = c.send(&alice, "POST", &path, Some(alloc("job"))).await;
    assert_eq!(code, 201, "{job}");
    let (code, mut a) = c.send(&sys, "GET", &format!("{path}/job"), None).await;
    assert_eq!(code, 200);
    a["status"] = json!({"phase": "Running", "attempt": 1, "assignedNodes": ["n1", "n2"]});
    let (code, v) = c
        .send(&sys, "PUT", &format!("{path}/job/status"), Some(a))
        .await;
    assert_eq!(code, 200, "{v}");
    let mut step = alloc("job.0");
    step["spec"]["stepOf"] = json!("job");
    step["spec"]["launch"] = json!({"mpi": "pmix"});
    step["metadata"]["ownerReferences"] = json!([{"apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation", "name": "job", "uid": job["metadata"]["uid"], "controller": true}]);
    let (code, v) = c.send(&alice, "POST", &path, Some(step.clone())).await;
    assert_eq!(code, 422, "{v}");
    let said = v["message"].as_str().unwrap();
    assert!(
        said.contains("spec.launch.mpi")
            && said.contains("n2 cannot run it")
            && !said.contains("n1,"),
        "{said}"
    );
    capable_node(&c, "n2", json!(["oci", "pmix"])).await;
    let (code, v) = c.send(&alice, "POST", &path, Some(step)).await;
    assert_eq!(code, 201, "{v}");
}
