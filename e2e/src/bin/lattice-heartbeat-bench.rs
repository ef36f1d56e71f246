//! Heartbeat load on the control plane: `--agents` simulated node agents each hold a
//! heartbeat stream open to a running `lattice-server` (exactly what `lattice-agent`
//! does: `POST .../nodes/<node>/heartbeat?sequence=N` upgraded to `lattice-heartbeat/1`,
//! then one line per interval) and
//! beat every `--interval`, spread evenly over the interval. The server's CPU time
//! (utime + stime of `--server-pid`, all threads) is measured over `--measure-s` once
//! every stream is open, and again with no streams for the idle baseline.
//!
//! With `--agent-pid`, the RSS and CPU per heartbeat interval of a real idle
//! `lattice-agent` are measured over the same window.
//!
//! Each simulated agent has a node identity of its own, as a real one does: a certificate
//! for `node:sim-NNNNN` issued from the cluster CA in `--pki-dir`, shown on a TLS
//! connection to `--tls-addr` (mutual TLS, what the API server authorizes a heartbeat by).
//!
//! Prints `RESULT` lines; `hack/bench-heartbeat.sh` runs it. The streams are raw HTTP/1.1
//! over TLS so that the simulator itself stays cheap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

#[derive(Parser)]
struct Args {
    /// API base URL (`http://HOST:PORT`, the server's loopback listener) for its metrics.
    #[arg(long)]
    url: String,
    /// The server's HTTPS address (`HOST:PORT`), where the heartbeat streams go.
    #[arg(long)]
    tls_addr: String,
    /// The server's PKI directory: its CA (`ca.crt`, `ca.key`) issues each simulated
    /// agent's certificate.
    #[arg(long)]
    pki_dir: std::path::PathBuf,
    /// File with an administrator's bearer token (for the metrics).
    #[arg(long)]
    token_file: std::path::PathBuf,
    /// PID of the lattice-server whose CPU is measured.
    #[arg(long)]
    server_pid: u32,
    /// Simulated agents.
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    /// Heartbeat interval in seconds (the agent's default is 10).
    #[arg(long, default_value_t = 10.0)]
    interval: f64,
    /// Seconds of measurement (with the streams open, and for the idle baseline).
    #[arg(long, default_value_t = 60)]
    measure_s: u64,
    /// PID of a real `lattice-agent` to report RSS and CPU per heartbeat of.
    #[arg(long)]
    agent_pid: Option<u32>,
    /// The real agent's heartbeat interval in seconds.
    #[arg(long, default_value_t = 10.0)]
    agent_interval: f64,
    /// Streams opened at once while connecting.
    #[arg(long, default_value_t = 64)]
    open_concurrency: usize,
}

/// utime + stime of a process in seconds (all threads, dead ones included).
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the ")" that closes the command name: state is field 3, utime 14.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/<pid>/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11).context("utime")?.parse()?;
    let stime: f64 = f.get(12).context("stime")?.parse()?;
    // /proc reports clock ticks of USER_HZ, which is 100 on Linux.
    Ok((utime + stime) / 100.0)
}

/// The TLS client of simulated agent `node`: its own certificate from the cluster CA.
fn node_tls(ca: &lattice_pki::Ca, node: &str) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let issued = ca.issue(&lattice_pki::IssueRequest::new(
        lattice_pki::Identity::Node(node.to_string()),
        lattice_pki::Usage::ClientAndServer,
    ))?;
    let config =
        lattice_pki::client_config(ca.cert_pem(), Some((&issued.cert_pem, &issued.key_pem)))?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Open one stream: send the upgrade request and wait for `101 Switching Protocols`.
async fn open(
    addr: &str,
    tls: tokio_rustls::TlsConnector,
    node: &str,
    first: u64,
) -> anyhow::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = rustls_pki_types::ServerName::try_from("localhost")?;
    let mut s = tls.connect(name, tcp).await?;
    let head = format!(
        "POST /apis/lattice.dev/v1alpha1/nodes/{node}/heartbeat?sequence={first} HTTP/1.1\r\n\
         Host: localhost\r\nConnection: Upgrade\r\n\
         Upgrade: lattice-heartbeat/1\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await?;
    // TLS keeps what the socket did not take at once until a flush.
    s.flush().await?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = s.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the server closed the stream while opening it");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]);
            anyhow::ensure!(
                head.starts_with("HTTP/1.1 101"),
                "heartbeat stream refused: {}",
                head.lines().next().unwrap_or("")
            );
            return Ok(s);
        }
        anyhow::ensure!(buf.len() < 16 * 1024, "response headers too long");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let token = std::fs::read_to_string(&args.token_file)?
        .trim()
        .to_string();
    let ca = Arc::new(
        lattice_pki::Ca::load(&args.pki_dir)
            .with_context(|| format!("the cluster CA in {}", args.pki_dir.display()))?,
    );
    let metrics_url = format!("{}/metrics", args.url.trim_end_matches('/'));
    let http = reqwest::Client::new();
    let server_beats = || async {
        let text = http
            .get(&metrics_url)
            .bearer_auth(&token)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines().find_map(|l| {
            l.strip_prefix("lattice_apiserver_heartbeats_total ")?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    let measure = Duration::from_secs(args.measure_s);

    // Idle baseline: the server with no heartbeat streams.
    let c0 = cpu_seconds(args.server_pid)?;
    tokio::time::sleep(measure).await;
    let idle = (cpu_seconds(args.server_pid)? - c0) / measure.as_secs_f64();
    println!("RESULT heartbeat_idle_server_cpu_pct={:.3}", idle * 100.0);

    // Open every stream (each one is a Lease write and a store-lease grant). Sequences
    // start at the clock's milliseconds, above any an earlier run against this server used.
    let first = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let t_open = Instant::now();
    let mut streams = Vec::with_capacity(args.agents);
    {
        use futures::StreamExt;
        let mut opening = futures::stream::iter(0..args.agents)
            .map(|i| {
                let (addr, ca) = (args.tls_addr.clone(), ca.clone());
                async move {
                    let node = format!("sim-{i:05}");
                    let tls = node_tls(&ca, &node)?;
                    tokio::time::timeout(Duration::from_secs(30), open(&addr, tls, &node, first))
                        .await
                        .map_err(|_| anyhow::anyhow!("no answer in 30 s"))
                        .and_then(|r| r)
                        .with_context(|| format!("opening the stream of {node}"))
                }
            })
            .buffer_unordered(args.open_concurrency);
        while let Some(s) = opening.next().await {
            streams.push(s?);
        }
    }
    let open_s = t_open.elapsed().as_secs_f64();
    println!("RESULT heartbeat_streams_open={}", streams.len());
    println!(
        "RESULT heartbeat_stream_opens_per_s={:.0}",
        streams.len() as f64 / open_s
    );

    // Beat: agent i first beats at i/N of the interval, then every interval.
    let sent = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let interval = Duration::from_secs_f64(args.interval);
    let n = streams.len().max(1);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for (i, mut s) in streams.into_iter().enumerate() {
        let (sent, failed) = (sent.clone(), failed.clone());
        let offset = interval.mul_f64(i as f64 / n as f64);
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(start + offset, interval);
            let mut seq: u64 = first;
            loop {
                tick.tick().await;
                seq += 1;
                let line = format!("{seq}\n");
                if s.write_all(line.as_bytes()).await.is_err() || s.flush().await.is_err() {
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // One interval to settle, then measure.
    tokio::time::sleep(interval + Duration::from_secs(2)).await;
    let beats0 = server_beats().await.unwrap_or(0.0);
    let c0 = cpu_seconds(args.server_pid)?;
    let a0 = args.agent_pid.map(cpu_seconds).transpose()?;
    let t0 = Instant::now();
    tokio::time::sleep(measure).await;
    let cpu = cpu_seconds(args.server_pid)? - c0;
    let secs = t0.elapsed().as_secs_f64();
    if let (Some(pid), Some(a0)) = (args.agent_pid, a0) {
        let agent_cpu = cpu_seconds(pid)? - a0;
        let intervals = secs / args.agent_interval;
        println!(
            "RESULT agent_cpu_ms_per_heartbeat_interval={:.3}",
            agent_cpu / intervals * 1e3
        );
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        if let Some(kb) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        {
            println!("RESULT agent_rss_mib={:.1}", kb / 1024.0);
        }
    }
    let beats = server_beats().await.unwrap_or(0.0) - beats0;
    for t in &tasks {
        t.abort();
    }
    let pct = cpu / secs * 100.0;
    let rate = beats / secs;
    println!("RESULT heartbeat_agents={n}");
    println!("RESULT heartbeat_interval_s={}", args.interval);
    println!("RESULT heartbeats_per_s={rate:.0}");
    println!("RESULT heartbeat_server_cpu_pct_of_core={pct:.3}");
    println!(
        "RESULT heartbeat_server_cpu_pct_above_idle={:.3}",
        pct - idle * 100.0
    );
    if rate > 0.0 {
        println!(
            "RESULT heartbeat_server_cpu_us_per_beat={:.2}",
            (cpu - idle * secs) / beats * 1e6
        );
    }
    println!(
        "RESULT heartbeat_stream_failures={}",
        failed.load(Ordering::Relaxed)
    );
    println!(
        "RESULT heartbeat_target_under_1pct={}",
        if pct < 1.0 { "met" } else { "not met" }
    );
    Ok(())
}
