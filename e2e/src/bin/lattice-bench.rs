//! `lattice-bench`: one etcd v3 client load generator, pointed at Lattice's etcd port or at
//! a real etcd, so both are measured with the same client and load. Prints
//! `RESULT <prefix>_<name>=<value>` lines (see hack/bench-store.sh).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};
use futures::StreamExt;

#[derive(Parser, Debug)]
struct Args {
    /// host:port of the etcd v3 endpoint.
    #[arg(long)]
    endpoint: String,
    /// Prefix of the RESULT names (e.g. lattice, etcd).
    #[arg(long)]
    name: String,
    /// Sequential puts.
    #[arg(long, default_value_t = 2000)]
    puts: usize,
    /// Seconds per concurrent phase.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, default_value_t = 1000)]
    watchers: usize,
    /// Only the put phases (for the 3-member comparison).
    #[arg(long)]
    puts_only: bool,
    /// Only the no-op round trip and the sequential puts (the paired rounds of
    /// `hack/bench-store.sh`).
    #[arg(long)]
    seq_only: bool,
    /// Only concurrent puts, from this many clients for `--seconds` (the etcd reference
    /// of `hack/bench-api.sh`): prints `<name>_puts_per_s_<N>_clients`.
    #[arg(long)]
    concurrent_clients: Option<usize>,
    /// Mutual TLS (as etcdctl's flags): the CA certificate that signed the server's...
    #[arg(long, requires_all = ["cert", "key"])]
    cacert: Option<std::path::PathBuf>,
    /// ...the client certificate...
    #[arg(long, requires = "cacert")]
    cert: Option<std::path::PathBuf>,
    /// ...and its key.
    #[arg(long, requires = "cacert")]
    key: Option<std::path::PathBuf>,
}

/// The TLS client configuration of every connection (`--cacert/--cert/--key`).
static TLS: std::sync::OnceLock<Option<Arc<lattice_store::tls::TlsClientConfig>>> =
    std::sync::OnceLock::new();

/// The `q` quantile of `v` in milliseconds.
fn quantile(mut v: Vec<Duration>, q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort();
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1000.0
}

fn p99(v: Vec<Duration>) -> f64 {
    quantile(v, 0.99)
}

fn result(args: &Args, name: &str, value: f64) {
    println!("RESULT {}_{name}={value:.2}", args.name);
}

async fn connect(endpoint: &str) -> anyhow::Result<Client> {
    match TLS.get().cloned().flatten() {
        Some(tls) => Ok(lattice_store::tls::etcd_client(&[endpoint.to_string()], Some(tls)).await?),
        None => Ok(Client::connect([endpoint], None).await?),
    }
}

/// `clients` connections putting for `seconds`; returns puts per second.
async fn concurrent_puts(
    endpoint: &str,
    clients: usize,
    seconds: f64,
    tag: &str,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let value = Arc::new(vec![b'x'; 256]);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = connect(endpoint).await?;
        let value = value.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                client
                    .put(format!("/bench/{tag}/{c}/{n}"), value.as_slice(), None)
                    .await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let start = Instant::now();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64().max(seconds))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tls = match (&args.cacert, &args.cert, &args.key) {
        (Some(ca), Some(cert), Some(key)) => {
            Some(lattice_store::tls::load_etcd_client_config(ca, cert, key)?)
        }
        _ => None,
    };
    let _ = TLS.set(tls);
    if let Some(clients) = args.concurrent_clients {
        let rate = concurrent_puts(&args.endpoint, clients, args.seconds, "api").await?;
        result(&args, &format!("puts_per_s_{clients}_clients"), rate);
        return Ok(());
    }
    let mut c = connect(&args.endpoint).await?;

    // The floor under every request: a serializable get of a missing key is one client
    // round trip and an in-memory lookup, no consensus and no disk.
    let mut lat = Vec::with_capacity(args.puts);
    for _ in 0..args.puts {
        let t = Instant::now();
        c.get("/bench/none", Some(GetOptions::new().with_serializable()))
            .await?;
        lat.push(t.elapsed());
    }
    result(&args, "round_trip_p50_ms", quantile(lat, 0.5));

    // Sequential puts: throughput and p99 latency.
    let mut lat = Vec::with_capacity(args.puts);
    let start = Instant::now();
    for i in 0..args.puts {
        let t = Instant::now();
        c.put(format!("/bench/seq/{i}"), vec![b'x'; 256], None)
            .await?;
        lat.push(t.elapsed());
    }
    result(
        &args,
        "seq_puts_per_s",
        args.puts as f64 / start.elapsed().as_secs_f64(),
    );
    result(&args, "seq_put_p50_ms", quantile(lat.clone(), 0.5));
    result(&args, "seq_put_p99_ms", p99(lat));
    if args.seq_only {
        return Ok(());
    }

    for clients in [8, 64] {
        let rate = concurrent_puts(
            &args.endpoint,
            clients,
            args.seconds,
            &format!("c{clients}"),
        )
        .await?;
        result(&args, &format!("puts_per_s_{clients}_clients"), rate);
    }
    if args.puts_only {
        return Ok(());
    }

    // Linearizable gets (the default for etcd clients).
    let mut lat = Vec::new();
    for i in 0..args.puts {
        let t = Instant::now();
        c.get(format!("/bench/seq/{}", i % 1000), None).await?;
        lat.push(t.elapsed());
    }
    result(&args, "get_p99_ms", p99(lat));

    // Compare-and-swap on one key: read mod revision, txn guarded on it.
    c.put("/bench/cas", "0", None).await?;
    let start = Instant::now();
    let mut done = 0;
    while start.elapsed() < Duration::from_secs_f64(args.seconds) {
        let rev = c
            .get("/bench/cas", None)
            .await?
            .kvs()
            .first()
            .map_or(0, |kv| kv.mod_revision());
        let txn = Txn::new()
            .when([Compare::mod_revision("/bench/cas", CompareOp::Equal, rev)])
            .and_then([TxnOp::put("/bench/cas", format!("{done}"), None)]);
        if c.txn(txn).await?.succeeded() {
            done += 1;
        }
    }
    result(
        &args,
        "txn_cas_per_s",
        done as f64 / start.elapsed().as_secs_f64(),
    );

    // Watch fan-out: `watchers` watches on one key over a handful of connections; each put
    // is timed until the last watcher has seen it.
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(connect(&args.endpoint).await?);
    }
    let mut watch_tasks = Vec::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(i64, Instant)>();
    for w in 0..args.watchers {
        let n = clients.len();
        let client = &mut clients[w % n];
        let tx = tx.clone();
        let mut stream = client
            .watch("/bench/watched", Some(WatchOptions::new()))
            .await?;
        watch_tasks.push(tokio::spawn(async move {
            while let Some(Ok(resp)) = stream.next().await {
                for e in resp.events() {
                    if let Some(kv) = e.kv() {
                        let _ = tx.send((kv.mod_revision(), Instant::now()));
                    }
                }
            }
        }));
    }
    drop(tx);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lat = Vec::new();
    let writer_start = Instant::now();
    for i in 0..50 {
        let t = Instant::now();
        let rev = c
            .put("/bench/watched", format!("{i}"), None)
            .await?
            .header()
            .map_or(0, |h| h.revision());
        let mut seen = 0;
        let mut last = t;
        while seen < args.watchers {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
                Ok(Some((r, at))) if r == rev => {
                    seen += 1;
                    last = last.max(at);
                }
                Ok(Some(_)) => {}
                _ => anyhow::bail!(
                    "watch events stopped arriving ({seen}/{} for revision {rev})",
                    args.watchers
                ),
            }
        }
        lat.push(last - t);
    }
    result(&args, "watch_p99_ms", p99(lat));
    result(
        &args,
        "watch_writes_per_s",
        50.0 / writer_start.elapsed().as_secs_f64(),
    );
    for t in watch_tasks {
        t.abort();
    }
    let _ = c
        .get(
            "/bench/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?;
    Ok(())
}
