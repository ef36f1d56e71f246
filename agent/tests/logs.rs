//! Logs through the API server's log route: both streams, filters, timestamps, follow
//! streaming live output until the process ends, several nodes, errors.

mod common;

use common::*;
use futures::StreamExt;
use lattice_apis::AllocationPhase;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_filters_follow_and_several_nodes() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let marks = tempfile::tempdir().unwrap();
    let _a = Agent::start(&server, "node-a", root.path(), &[]);
    let mut b = Agent::start(&server, "node-b", root.path(), &[]);
    let mark = marks.path().join("go");

    submit(
        &server,
        "talker",
        "node-a",
        json!({"script": format!(
            "echo line 1\necho line 2\nsleep 0.3\necho oops >&2\nsleep 0.3\necho line 3\nwhile [ ! -e {} ]; do sleep 0.1; done\necho after\nprintf 'no newline'\n",
            mark.display()
        )}),
    )
    .await;
    wait_phase(&server, "talker", AllocationPhase::Running).await;
    let api_out = wait_for("the first lines", LIMIT, || async {
        let (c, o) = server.logs("talker", "").await;
        (c == 200 && o.contains("line 3")).then_some(o)
    })
    .await;
    // Interleaving across the two streams follows read times; within a stream the order
    // is exact.
    let mut all: Vec<&str> = api_out.lines().collect();
    all.sort();
    assert_eq!(
        all,
        vec!["line 1", "line 2", "line 3", "oops"],
        "{api_out:?}"
    );
    assert_eq!(server.logs("talker", "stream=stderr").await.1, "oops\n");
    assert_eq!(
        server.logs("talker", "stream=stdout").await.1,
        "line 1\nline 2\nline 3\n"
    );
    assert_eq!(
        server.logs("talker", "stream=stdout&tailLines=1").await.1,
        "line 3\n"
    );
    assert_eq!(
        server.logs("talker", "stream=stdout&tailLines=2").await.1,
        "line 2\nline 3\n"
    );
    let (_, ts) = server.logs("talker", "timestamps=true&tailLines=1").await;
    let (t, rest) = ts.split_once(' ').unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(t).is_ok(), "{ts}");
    assert_eq!(rest, "line 3\n");
    let far_future = "2999-01-01T00:00:00Z";
    assert_eq!(
        server
            .logs("talker", &format!("sinceTime={far_future}"))
            .await
            .1,
        ""
    );

    // Follow: the history, then live lines, then the end of the stream once the
    // process is gone and its output stored.
    let resp = server.logs_stream("talker", "follow=true").await;
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("line 3") {
        let chunk = tokio::time::timeout(LIMIT, body.next())
            .await
            .expect("history in time")
            .expect("stream open")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    std::fs::write(&mark, "").unwrap();
    let rest = tokio::time::timeout(LIMIT, async {
        let mut s = String::new();
        while let Some(c) = body.next().await {
            s.push_str(&String::from_utf8_lossy(&c.unwrap()));
        }
        s
    })
    .await
    .expect("the follow stream ends when the process does");
    seen.push_str(&rest);
    assert!(
        seen.ends_with("line 3\nafter\nno newline") || seen.ends_with("oops\nafter\nno newline"),
        "{seen:?}"
    );
    assert_eq!(seen.matches('\n').count(), 5, "{seen:?}");
    wait_phase(&server, "talker", AllocationPhase::Completed).await;
    // Logs outlive the process.
    assert_eq!(
        server.logs("talker", "stream=stdout&tailLines=2").await.1,
        "after\nno newline"
    );

    // Several nodes: each line prefixed with its node.
    create(
        &server,
        "pair",
        json!({"entrypoint": "echo rank $LATTICE_NODE_RANK of $LATTICE_NNODES; echo warn $LATTICE_NODEID >&2"}),
    )
    .await;
    bind(&server, "pair", &["node-a", "node-b"], Some(600)).await;
    wait_phase(&server, "pair", AllocationPhase::Completed).await;
    let (code, out) = server.logs("pair", "").await;
    assert_eq!(code, 200, "{out}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![
            "node-a| rank 0 of 2",
            "node-a| warn node-a",
            "node-b| rank 1 of 2",
            "node-b| warn node-b"
        ]
    );
    assert_eq!(
        server.logs("pair", "node=node-b&stream=stdout").await.1,
        "rank 1 of 2\n"
    );

    // Errors are Status objects.
    let (code, out) = server.logs("nope", "").await;
    assert_eq!(code, 404, "{out}");
    assert!(out.contains("\"kind\":\"Status\""), "{out}");
    assert_eq!(server.logs("pair", "tailLines=lots").await.0, 400);
    assert_eq!(server.logs("pair", "node=node-z").await.0, 400);
    b.kill9();
    let (code, out) = server.logs("pair", "node=node-b").await;
    assert_eq!(code, 503, "{out}");
    assert!(out.contains("unreachable"), "{out}");
}

/// The agent serves logs only to the API server: its endpoint is HTTPS and takes only the
/// API server's client certificate. A request straight to it over plain HTTP, over TLS
/// without a certificate, or with a node's certificate (a compromised node trying another
/// node's agent, or a job's user who found the agent's key) gets nothing, while the same
/// logs come through the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_logs_only_to_the_api_server() {
    let server = Server::start();
    let root = tempfile::tempdir().unwrap();
    let a = Agent::start(&server, "node-a", root.path(), &[]);
    submit(
        &server,
        "secret",
        "node-a",
        json!({"entrypoint": "echo s3cr3t"}),
    )
    .await;
    wait_phase(&server, "secret", AllocationPhase::Completed).await;
    let (c, out) = server.logs("secret", "").await;
    assert_eq!((c, out.as_str()), (200, "s3cr3t\n"));
    let node = server.nodes().get("node-a").await.expect("node");
    let addr: std::net::SocketAddr = node
        .status
        .and_then(|s| s.agent)
        .and_then(|a| a.address)
        .expect("agent address")
        .parse()
        .expect("socket address");
    let name = "node-a.nodes.lattice.internal";
    let url = format!("https://{name}:{}/logs/default/secret", addr.port());
    let ca = std::fs::read_to_string(server.ca_file()).unwrap();
    let client = |identity: Option<(String, String)>| {
        let tls = lattice_pki::client_config(
            &ca,
            identity.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
        )
        .unwrap();
        // A request that hangs is a failure to report, not a test run that never ends.
        reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .resolve(name, addr)
            .timeout(std::time::Duration::from_secs(20))
            .build()
            .unwrap()
    };
    let got = |r: Result<reqwest::Response, reqwest::Error>| async move {
        match r {
            Err(_) => None,
            Ok(resp) => Some((
                resp.status().as_u16(),
                resp.text().await.unwrap_or_default(),
            )),
        }
    };
    let plain_client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(20))
        .build()
        .unwrap();
    let plain = got(plain_client
        .get(format!("http://{addr}/logs/default/secret"))
        .send()
        .await)
    .await;
    assert!(
        plain.as_ref().is_none_or(|(_, b)| !b.contains("s3cr3t")),
        "{plain:?}"
    );
    let anonymous = got(client(None).get(&url).send().await).await;
    assert!(
        anonymous.is_none(),
        "no certificate, no connection: {anonymous:?}"
    );
    let pki = a.state_dir.join("pki");
    let node_cert = (
        std::fs::read_to_string(pki.join("node.crt")).unwrap(),
        std::fs::read_to_string(pki.join("node.key")).unwrap(),
    );
    // Another node's agent may connect (for a step's PMI exchange), but not read logs.
    let as_node = got(client(Some(node_cert)).get(&url).send().await).await;
    assert!(
        as_node
            .as_ref()
            .is_some_and(|(c, b)| *c == 403 && !b.contains("s3cr3t")),
        "a node's certificate is not the API server's: {as_node:?}"
    );
    let api = server.dir.path().join("data/pki");
    let as_api = (
        std::fs::read_to_string(api.join("apiserver.crt")).unwrap(),
        std::fs::read_to_string(api.join("apiserver.key")).unwrap(),
    );
    let ok = got(client(Some(as_api)).get(&url).send().await).await;
    assert_eq!(
        ok.map(|(c, _)| c),
        Some(200),
        "the API server's certificate gets in"
    );
}
