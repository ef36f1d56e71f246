//! Prometheus metrics (`/metrics`, OpenMetrics text via prometheus-client).

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub kind: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    /// Registries of the other components in the process (store, controllers), exposed
    /// on the same `/metrics` endpoint.
    extra: std::sync::Mutex<Vec<Registry>>,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<RequestLabels, Histogram, fn() -> Histogram>,
    pub watchers: Family<KindLabel, Gauge<i64, AtomicI64>>,
    pub watch_cache_events: Family<KindLabel, Counter>,
    pub watch_events_sent: Family<KindLabel, Counter>,
    /// Watches served by a store watch of their own (their resourceVersion was older than
    /// the watch cache), by kind.
    pub watch_direct: Family<KindLabel, Counter>,
    /// Heartbeat lines accepted from node agents.
    pub heartbeats: Counter,
    /// Heartbeat lines (or opening sequences) that did not increase the sequence.
    pub heartbeat_replays: Counter,
    /// Heartbeat streams open now.
    pub heartbeat_streams: Gauge<i64, AtomicI64>,
    /// Store leases granted for heartbeat streams (a new stream after the old lease expired).
    pub heartbeat_lease_grants: Counter,
    /// Heartbeat renewals that failed for a reason other than an expired lease.
    pub heartbeat_errors: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lattice_apiserver");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let watchers = Family::<KindLabel, Gauge<i64, AtomicI64>>::default();
        let watch_cache_events = Family::<KindLabel, Counter>::default();
        let watch_events_sent = Family::<KindLabel, Counter>::default();
        let watch_direct = Family::<KindLabel, Counter>::default();
        registry.register(
            "requests",
            "API requests by verb, kind and HTTP code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "API request latency by verb, kind and HTTP code (watches: until the stream starts)",
            latency.clone(),
        );
        registry.register(
            "watchers",
            "Watch streams currently open, by kind",
            watchers.clone(),
        );
        registry.register(
            "watch_cache_events",
            "Changes received by the watch cache from the store, by kind",
            watch_cache_events.clone(),
        );
        registry.register(
            "watch_events_sent",
            "Watch events sent to clients, by kind",
            watch_events_sent.clone(),
        );
        registry.register(
            "watch_direct",
            "Watches served by a store watch of their own because their resourceVersion was older than the watch cache, by kind",
            watch_direct.clone(),
        );
        let heartbeats = Counter::default();
        let heartbeat_replays = Counter::default();
        let heartbeat_streams = Gauge::<i64, AtomicI64>::default();
        let heartbeat_lease_grants = Counter::default();
        let heartbeat_errors = Counter::default();
        registry.register(
            "heartbeats",
            "Node agent heartbeats accepted on heartbeat streams",
            heartbeats.clone(),
        );
        registry.register(
            "heartbeat_replays",
            "Heartbeats refused because their sequence number did not increase",
            heartbeat_replays.clone(),
        );
        registry.register(
            "heartbeat_streams",
            "Node agent heartbeat streams open now",
            heartbeat_streams.clone(),
        );
        registry.register(
            "heartbeat_lease_grants",
            "Store leases granted to heartbeat streams",
            heartbeat_lease_grants.clone(),
        );
        registry.register(
            "heartbeat_errors",
            "Heartbeat lease renewals that failed (other than an expired lease)",
            heartbeat_errors.clone(),
        );
        Self {
            registry,
            extra: std::sync::Mutex::new(Vec::new()),
            requests,
            latency,
            watchers,
            watch_cache_events,
            watch_events_sent,
            watch_direct,
            heartbeats,
            heartbeat_replays,
            heartbeat_streams,
            heartbeat_lease_grants,
            heartbeat_errors,
        }
    }

    pub fn observe(&self, verb: &str, kind: &str, code: u16, secs: f64) {
        let l = RequestLabels {
            verb: verb.to_string(),
            kind: kind.to_string(),
            code: code.to_string(),
        };
        self.requests.get_or_create(&l).inc();
        self.latency.get_or_create(&l).observe(secs);
    }

    /// Serve another component's metrics (e.g. the store's) from this server's `/metrics`.
    pub fn add_registry(&self, registry: Registry) {
        self.extra
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(registry);
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        for registry in self.extra.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
                tracing::error!(error = %e, "cannot encode metrics");
            }
        }
        out
    }
}

/// Convert prometheus-client's OpenMetrics text to the classic Prometheus text format
/// (counter families named `*_total`, no `# EOF`), which every scraper and `promtool`
/// accept.
pub fn to_prometheus_text(om: &str) -> String {
    let lines: Vec<&str> = om.lines().collect();
    let counters: std::collections::HashSet<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for l in lines {
        if l == "# EOF" || l.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = l.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        match renamed {
            Some(r) => out.push_str(r.trim_end()),
            None => out.push_str(l),
        }
        out.push('\n');
    }
    out
}
