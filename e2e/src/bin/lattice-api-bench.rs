//! `lattice-api-bench`: load generator for the resource API over HTTP (see
//! hack/bench-api.sh). Phases: concurrent creates, get and list latency, watch event
//! latency with many watchers, and server memory per stored allocation. Prints
//! `RESULT <name>=<value>` lines.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;

/// The server's allocator: the load generator shares the machine's cores with the
/// server, so it should spend as little of them as it can.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
struct Args {
    /// Base URL of the API server, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: String,
    /// File holding a bearer token (the server's admin.token).
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// Tenant (namespace) to write into.
    #[arg(long, default_value = "default")]
    tenant: String,
    /// Concurrent creating clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds of the create phase.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Concurrent watchers in the watch phase.
    #[arg(long, default_value_t = 1000)]
    watchers: usize,
    /// Writes observed by the watchers.
    #[arg(long, default_value_t = 200)]
    watch_events: usize,
    /// PID of the server, for its resident memory (/proc/PID/status).
    #[arg(long)]
    server_pid: Option<u32>,
    /// Write the watch phase's timeline to this file: one line per write, with when it
    /// was sent (ms into the phase), its create latency, and the median and slowest
    /// delivery to the watchers (ms).
    #[arg(long)]
    watch_timeline: Option<std::path::PathBuf>,
}

fn percentile(v: &mut [Duration], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1000.0
}

fn result(name: &str, value: f64) {
    println!("RESULT {name}={value:.2}");
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn allocation(tenant: &str, name: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation",
        "metadata": {"name": name, "namespace": tenant, "labels": {"bench": "api", "team": "ml"}},
        "spec": {
            "entrypoint": "/usr/bin/python3",
            "args": ["train.py", "--epochs", "10"],
            "resources": {"nodes": 4},
            "lifecycle": {"walltime": "2h"},
            "vcluster": "default"
        }
    })
}

/// Just what the watchers read of an event line.
#[derive(serde::Deserialize)]
struct EventLine {
    #[serde(rename = "type")]
    ty: String,
    object: EventObject,
}

#[derive(serde::Deserialize)]
struct EventObject {
    metadata: EventMeta,
}

#[derive(serde::Deserialize)]
struct EventMeta {
    #[serde(default)]
    name: String,
}

struct Bench {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// The create phase's request URL and body, built once: the body is `body.0`, the
    /// object's name, `body.1`.
    create_url: reqwest::Url,
    body: (String, String),
}

impl Bench {
    fn new(
        http: reqwest::Client,
        base: &str,
        token: Option<String>,
        tenant: &str,
    ) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_string();
        const NAME: &str = "@@name@@";
        let template = serde_json::to_string(&allocation(tenant, NAME))?;
        let (pre, post) = template
            .split_once(NAME)
            .ok_or_else(|| anyhow::anyhow!("no name in the template"))?;
        Ok(Self {
            create_url: reqwest::Url::parse(&format!(
                "{base}/apis/lattice.dev/v1alpha1/namespaces/{tenant}/allocations"
            ))?,
            body: (pre.to_string(), post.to_string()),
            http,
            base,
            token,
        })
    }

    fn collection(&self, tenant: &str) -> String {
        format!(
            "{}/apis/lattice.dev/v1alpha1/namespaces/{tenant}/allocations",
            self.base
        )
    }

    fn req(&self, b: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => b.bearer_auth(t),
            None => b,
        }
    }

    /// Create allocation `name` (names are `[a-z0-9-]`: nothing to escape).
    async fn create(&self, name: &str) -> anyhow::Result<()> {
        let mut body = String::with_capacity(self.body.0.len() + name.len() + self.body.1.len());
        body.push_str(&self.body.0);
        body.push_str(name);
        body.push_str(&self.body.1);
        let resp = self
            .req(self.http.post(self.create_url.clone()))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await?;
        if !resp.status().is_success() {
            anyhow::bail!("create {name}: {} {}", resp.status(), resp.text().await?);
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let token = match &args.token_file {
        Some(p) => Some(std::fs::read_to_string(p)?.trim().to_string()),
        None => None,
    };
    let tenant = args.tenant.clone();
    let bench = Arc::new(Bench::new(
        reqwest::Client::builder()
            .pool_max_idle_per_host(args.clients * 2)
            .tcp_nodelay(true)
            .build()?,
        &args.url,
        token,
        &tenant,
    )?);
    let rss_before = args.server_pid.and_then(rss_kib);

    // 1. Concurrent creates.
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicU64::new(0));
    let lat: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (bench, stop, created, lat) =
            (bench.clone(), stop.clone(), created.clone(), lat.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                bench.create(&format!("c{c}-{i}")).await?;
                mine.push(t.elapsed());
                created.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            lat.lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .extend(mine);
            anyhow::Ok(i)
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_client = Vec::new();
    for t in tasks {
        per_client.push(t.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = created.load(Ordering::Relaxed);
    result("creates_per_s", n as f64 / elapsed);
    let mut l = std::mem::take(&mut *lat.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    result("create_p50_ms", percentile(&mut l, 0.50));
    result("create_p99_ms", percentile(&mut l, 0.99));
    result("allocations_stored", n as f64);

    // 2. Memory per stored allocation (after the creates, before the watchers).
    if let (Some(pid), Some(before)) = (args.server_pid, rss_before) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some(after) = rss_kib(pid) {
            result("server_rss_mib", after as f64 / 1024.0);
            if n > 0 {
                let per = after.saturating_sub(before) as f64 * 1024.0 / n as f64;
                result("server_bytes_per_allocation", per);
                result(
                    "server_mib_per_100k_allocations",
                    per * 100_000.0 / 1048576.0,
                );
            }
        }
    }

    // 3. Get and list latency, one client.
    let mut gets = Vec::new();
    for i in 0..2000u64 {
        let c = (i as usize) % args.clients;
        let name = format!("c{c}-{}", i % per_client[c].max(1));
        let t = Instant::now();
        let resp = bench
            .req(
                bench
                    .http
                    .get(format!("{}/{name}", bench.collection(&tenant))),
            )
            .send()
            .await?;
        let ok = resp.status().is_success();
        let _ = resp.bytes().await?;
        if ok {
            gets.push(t.elapsed());
        }
    }
    result("get_p50_ms", percentile(&mut gets, 0.50));
    result("get_p99_ms", percentile(&mut gets, 0.99));
    let mut lists = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let resp = bench
            .req(bench.http.get(format!(
                "{}?limit=100&labelSelector=bench%3Dapi",
                bench.collection(&tenant)
            )))
            .send()
            .await?;
        let _ = resp.bytes().await?;
        lists.push(t.elapsed());
    }
    result("list100_p50_ms", percentile(&mut lists, 0.50));
    result("list100_p99_ms", percentile(&mut lists, 0.99));

    // 4. Watch latency: `watchers` streams from now; time from sending a create to each
    // watcher's ADDED event for it.
    let rv = {
        let resp = bench
            .req(
                bench
                    .http
                    .get(format!("{}?limit=1", bench.collection(&tenant))),
            )
            .send()
            .await?;
        let v: serde_json::Value = resp.json().await?;
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("0")
            .to_string()
    };
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let seen: Arc<Mutex<HashMap<String, Vec<Duration>>>> = Arc::default();
    let received = Arc::new(AtomicU64::new(0));
    let mut watchers = Vec::new();
    let opened = Arc::new(AtomicU64::new(0));
    for _ in 0..args.watchers {
        let (bench, sent, seen, received, opened, rv, tenant) = (
            bench.clone(),
            sent.clone(),
            seen.clone(),
            received.clone(),
            opened.clone(),
            rv.clone(),
            tenant.clone(),
        );
        watchers.push(tokio::spawn(async move {
            let url = format!(
                "{}?watch=true&resourceVersion={rv}&labelSelector=bench%3Dwatch",
                bench.collection(&tenant)
            );
            let resp = bench.req(bench.http.get(url)).send().await?;
            opened.fetch_add(1, Ordering::Relaxed);
            let mut stream = resp.bytes_stream();
            let mut buf = Vec::new();
            while let Some(chunk) = stream.next().await {
                let now = Instant::now();
                buf.extend_from_slice(&chunk?);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let Ok(ev) = serde_json::from_slice::<EventLine>(&line) else {
                        continue;
                    };
                    if ev.ty != "ADDED" {
                        continue;
                    }
                    let name = ev.object.metadata.name.as_str();
                    let at = sent.lock().ok().and_then(|s| s.get(name).copied());
                    if let Some(at) = at {
                        if let Ok(mut s) = seen.lock() {
                            s.entry(name.to_string())
                                .or_default()
                                .push(now.duration_since(at));
                        }
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while (opened.load(Ordering::Relaxed) as usize) < args.watchers && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    result("watchers_open", opened.load(Ordering::Relaxed) as f64);
    let mut write_lat = Vec::new();
    let phase = Instant::now();
    let phase_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let mut sent_at = Vec::new();
    for i in 0..args.watch_events {
        let name = format!("w-{i}");
        let mut obj = allocation(&tenant, &name);
        obj["metadata"]["labels"]["bench"] = "watch".into();
        let t = Instant::now();
        if let Ok(mut s) = sent.lock() {
            s.insert(name.clone(), t);
        }
        let resp = bench
            .req(bench.http.post(bench.collection(&tenant)))
            .json(&obj)
            .send()
            .await?;
        if !resp.status().is_success() {
            anyhow::bail!("create {name}: {}", resp.status());
        }
        write_lat.push(t.elapsed());
        sent_at.push(t.duration_since(phase));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let expected = (args.watch_events * args.watchers) as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for w in watchers {
        w.abort();
    }
    let got = received.load(Ordering::Relaxed);
    result(
        "watch_events_received_ratio",
        got as f64 / expected.max(1) as f64,
    );
    let mut per_write = std::mem::take(&mut *seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    if let Some(path) = &args.watch_timeline {
        let mut out = format!(
            "# watch phase from unix time {phase_unix:.3}\n# write sent_ms create_ms p50_ms max_ms\n"
        );
        for (i, (at, lat)) in sent_at.iter().zip(&write_lat).enumerate() {
            let mut d = per_write
                .get(&format!("w-{i}"))
                .cloned()
                .unwrap_or_default();
            let (p50, max) = (percentile(&mut d, 0.5), percentile(&mut d, 1.0));
            out += &format!(
                "{i} {:.1} {:.2} {p50:.2} {max:.2}\n",
                at.as_secs_f64() * 1000.0,
                lat.as_secs_f64() * 1000.0
            );
        }
        std::fs::write(path, out)?;
    }
    let mut s: Vec<Duration> = per_write.drain().flat_map(|(_, v)| v).collect();
    result("watch_p50_ms", percentile(&mut s, 0.50));
    result("watch_p99_ms", percentile(&mut s, 0.99));
    result(
        "create_p99_ms_with_watchers",
        percentile(&mut write_lat, 0.99),
    );
    Ok(())
}
