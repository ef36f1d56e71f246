//! The Prometheus [`MetricSource`]: instant queries over the HTTP API.

#[allow(unused_imports)]
use super::*;

/// A [`MetricSource`] backed by the Prometheus HTTP API (instant queries); see the
/// module docs for the query built from `scalePolicy.metric`.
#[derive(Clone)]
pub struct PrometheusSource {
    base_url: String,
    client: reqwest::Client,
}

impl fmt::Debug for PrometheusSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrometheusSource")
            .field("base_url", &self.base_url)
            .finish()
    }
}

/// Timeout of one Prometheus query.
pub const PROMETHEUS_TIMEOUT: Duration = Duration::from_secs(5);

impl PrometheusSource {
    /// A source querying the Prometheus (or compatible TSDB) at `base_url`, e.g.
    /// `http://prometheus:9090` (a path prefix is kept: `http://h/prom`).
    pub fn new(base_url: &str) -> Result<Self, String> {
        let base = base_url.trim().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) || base.len() < 8 {
            return Err(format!(
                "metrics URL {base_url:?} must be an http:// or https:// URL, e.g. http://prometheus:9090"
            ));
        }
        let client = reqwest::Client::builder()
            .timeout(PROMETHEUS_TIMEOUT)
            .connect_timeout(PROMETHEUS_TIMEOUT)
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(Self {
            base_url: base,
            client,
        })
    }

    /// The base URL queries go to.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The PromQL query for `metric` of `alloc` (see the module docs).
    pub fn promql(alloc: &Allocation, metric: &str) -> Result<String, String> {
        let sel = lattice_apis::metric::MetricSelector::parse(metric)?;
        Ok(format!(
            "avg({})",
            sel.to_promql(&[
                ("lattice_allocation", alloc.name_any()),
                ("lattice_tenant", alloc.namespace().unwrap_or_default()),
            ])
        ))
    }
}

/// The value of a Prometheus `/api/v1/query` response body for query `q`.
pub fn parse_prometheus_response(body: &str, q: &str) -> Result<f64, String> {
    let v: serde_json::Value = serde_json::from_str(body).map_err(|e| {
        format!(
            "query {q}: the response is not Prometheus JSON ({e}): {}",
            snippet(body)
        )
    })?;
    let status = v.get("status").and_then(|s| s.as_str()).unwrap_or("");
    if status != "success" {
        let kind = v.get("errorType").and_then(|s| s.as_str()).unwrap_or("");
        let msg = v
            .get("error")
            .and_then(|s| s.as_str())
            .unwrap_or("no error given");
        return Err(format!(
            "query {q}: prometheus answered status {status:?}: {kind} {msg}"
        ));
    }
    let data = v
        .get("data")
        .ok_or_else(|| format!("query {q}: the response has no data"))?;
    let result_type = data
        .get("resultType")
        .and_then(|s| s.as_str())
        .unwrap_or("");
    let sample = match result_type {
        "vector" => {
            let result = data
                .get("result")
                .and_then(|r| r.as_array())
                .ok_or_else(|| format!("query {q}: the vector result is not a list"))?;
            let Some(first) = result.first() else {
                return Err(format!("no samples for {q}"));
            };
            first
                .get("value")
                .ok_or_else(|| format!("query {q}: the first sample has no value"))?
        }
        "scalar" => data
            .get("result")
            .ok_or_else(|| format!("query {q}: the scalar result is missing"))?,
        other => {
            return Err(format!(
                "query {q}: expected an instant vector, got resultType {other:?}"
            ))
        }
    };
    let raw = sample
        .get(1)
        .and_then(|s| s.as_str())
        .ok_or_else(|| format!("query {q}: the sample is not [time, \"value\"]"))?;
    let value: f64 = raw
        .trim()
        .parse()
        .map_err(|_| format!("query {q}: the value {raw:?} is not a number"))?;
    if !value.is_finite() {
        return Err(format!(
            "query {q}: the value is {raw}, not a finite number"
        ));
    }
    Ok(value)
}

fn snippet(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[async_trait]
impl MetricSource for PrometheusSource {
    async fn query(&self, alloc: &Allocation, metric: &str) -> Result<f64, String> {
        let q = Self::promql(alloc, metric)?;
        let url = format!("{}/api/v1/query", self.base_url);
        let resp = self
            .client
            .get(&url)
            .query(&[("query", q.as_str())])
            .send()
            .await
            .map_err(|e| {
                if e.is_timeout() {
                    format!("query {q}: {url} did not answer within {PROMETHEUS_TIMEOUT:?}")
                } else {
                    format!("query {q}: {url}: {e}")
                }
            })?;
        let code = resp.status();
        let body = resp
            .text()
            .await
            .map_err(|e| format!("query {q}: reading the response: {e}"))?;
        match parse_prometheus_response(&body, &q) {
            Ok(v) if code.is_success() => Ok(v),
            Ok(_) => Err(format!("query {q}: HTTP {code}")),
            // Prometheus explains a 4xx/5xx in the JSON body; say both.
            Err(e) if !code.is_success() => Err(format!("HTTP {code}: {e}")),
            Err(e) => Err(e),
        }
    }
}
