//! `GET /logs/{namespace}/{name}`: an allocation's output as `text/plain`.
//!
//! Query parameters: `stream=stdout|stderr|all` (default all), `tailLines=N`,
//! `sinceTime=RFC3339`, `untilTime=RFC3339`, `follow=true` (stream until the process
//! is gone and its output stored), `timestamps=true` (prefix each line with its RFC 3339
//! time), `attempt=N` (default: the latest on this node), `uid=UID` (only logs of the
//! allocation with that uid: the API server always sends it).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio_stream::wrappers::ReceiverStream;

use super::{LogError, LogLine, LogQuery, Logs, Stream};

/// Bytes gathered before a write to the response.
const BATCH: usize = 64 * 1024;

/// Parse the query string (the last value of a repeated parameter wins).
pub fn parse_query(params: &[(String, String)]) -> Result<LogQuery, String> {
    let get = |k: &str| {
        params
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let flag = |k: &str| -> Result<bool, String> {
        match get(k) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(v) => Err(format!("{k} must be true or false, got {v:?}")),
        }
    };
    let time = |k: &str| -> Result<Option<DateTime<Utc>>, String> {
        get(k)
            .filter(|v| !v.is_empty())
            .map(|v| {
                DateTime::parse_from_rfc3339(v)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|e| {
                        format!("{k} must be an RFC 3339 time such as 2026-03-01T10:00:00Z, got {v:?} ({e})")
                    })
            })
            .transpose()
    };
    let streams = match get("stream").unwrap_or("all") {
        "all" | "" => Stream::ALL.to_vec(),
        "stdout" => vec![Stream::Stdout],
        "stderr" => vec![Stream::Stderr],
        other => {
            return Err(format!(
                "stream must be stdout, stderr or all, got {other:?}"
            ))
        }
    };
    let tail_lines = get("tailLines")
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<usize>()
                .map_err(|_| format!("tailLines must be a non-negative integer, got {v:?}"))
        })
        .transpose()?;
    let attempt = get("attempt")
        .filter(|v| !v.is_empty())
        .map(|v| {
            v.parse::<u32>()
                .map_err(|_| format!("attempt must be a non-negative integer, got {v:?}"))
        })
        .transpose()?;
    let q = LogQuery {
        streams,
        tail_lines,
        since: time("sinceTime")?,
        until: time("untilTime")?,
        follow: flag("follow")?,
        timestamps: flag("timestamps")?,
        attempt,
        uid: get("uid").filter(|u| !u.is_empty()).map(String::from),
    };
    if let (Some(s), Some(u)) = (q.since, q.until) {
        if u < s {
            return Err("untilTime is before sinceTime".into());
        }
    }
    Ok(q)
}

fn text(code: StatusCode, msg: String) -> Response {
    let mut r = (code, format!("{msg}\n")).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The handler.
pub async fn get_logs(
    State(logs): State<Arc<Logs>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let q = match parse_query(&params) {
        Ok(q) => q,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let timestamps = q.timestamps;
    let read = {
        let logs = logs.clone();
        tokio::task::spawn_blocking(move || logs.read(&namespace, &name, &q)).await
    };
    let read = match read {
        Ok(Ok(r)) => r,
        Ok(Err(LogError::NotFound(m))) => return text(StatusCode::NOT_FOUND, m),
        Ok(Err(e)) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        if send_lines(&tx, &read.history, timestamps).await.is_err() {
            return;
        }
        if let Some(mut f) = read.follower {
            while let Some(batch) = f.next_batch().await {
                if send_lines(&tx, &batch, timestamps).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut resp = Response::new(Body::from_stream(ReceiverStream::new(rx)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Write `lines` in batches; `Err` once the client is gone.
async fn send_lines(
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    lines: &[LogLine],
    timestamps: bool,
) -> Result<(), ()> {
    let mut buf = Vec::new();
    for l in lines {
        l.write_to(timestamps, &mut buf);
        if buf.len() >= BATCH {
            tx.send(Ok(Bytes::from(std::mem::take(&mut buf))))
                .await
                .map_err(|_| ())?;
        }
    }
    if !buf.is_empty() {
        tx.send(Ok(Bytes::from(buf))).await.map_err(|_| ())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn query_parameters() {
        let q = parse_query(&p(&[
            ("stream", "stderr"),
            ("tailLines", "10"),
            ("follow", "true"),
            ("sinceTime", "2026-03-01T10:00:00Z"),
        ]))
        .unwrap();
        assert_eq!(q.streams, vec![Stream::Stderr]);
        assert_eq!(q.tail_lines, Some(10));
        assert!(q.follow);
        assert!(!q.timestamps);
        assert!(q.since.is_some());
        assert_eq!(parse_query(&[]).unwrap().streams, Stream::ALL.to_vec());
        assert!(parse_query(&p(&[("stream", "stdin")])).is_err());
        assert!(parse_query(&p(&[("tailLines", "-1")])).is_err());
        assert!(parse_query(&p(&[("sinceTime", "yesterday")])).is_err());
        assert!(parse_query(&p(&[("follow", "maybe")])).is_err());
        assert!(parse_query(&p(&[
            ("sinceTime", "2026-03-01T10:00:00Z"),
            ("untilTime", "2026-03-01T09:00:00Z")
        ]))
        .is_err());
    }
}
