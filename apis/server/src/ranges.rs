//! Numeric query parameters, each with its range: a value outside it is a 400 that
//! names the parameter and the range, never a number the server goes on to compute with.
//! (`timeoutSeconds=18446744073709551615` became a `Duration` added to an `Instant`,
//! which overflows and panics the connection's task.)
//!
//! | parameter | where | range |
//! |---|---|---|
//! | `timeoutSeconds` | watch | 0–86,400 (0: the server's default, as in Kubernetes) |
//! | `limit` | list | 0–1,000,000 (0: no limit) |
//! | `tailLines` | allocation logs | 0–10,000,000 |
//! | `attempt` | allocation logs | 0–1,000,000 |
//! | `rows`, `cols` | attach | 1–65,535 (a terminal's size) |
//! | `sequence` | node heartbeat | 0–9,223,372,036,854,775,807 |
//!
//! Durations in bodies are bounded where they are parsed
//! ([`lattice_apis::duration::parse_duration`]: 366 days at most), and the bootstrap
//! token's `ttlSeconds` by [`crate::node_identity`] (1 s – 7 days).

use std::ops::RangeInclusive;

use crate::errors::{ApiError, ApiResult};

/// A watch's longest lifetime, in seconds (one day; clients re-watch from where they
/// were, so a bound costs them one request a day).
pub const WATCH_TIMEOUT_SECONDS: RangeInclusive<u64> = 0..=86_400;
/// A list's page size.
pub const LIST_LIMIT: RangeInclusive<u64> = 0..=1_000_000;
/// Log lines from the end.
pub const TAIL_LINES: RangeInclusive<u64> = 0..=10_000_000;
/// An allocation's run (attempt) number.
pub const ATTEMPT: RangeInclusive<u64> = 0..=1_000_000;
/// A terminal's rows or columns.
pub const TERMINAL_SIZE: RangeInclusive<u64> = 1..=65_535;
/// A heartbeat sequence number (kept within a signed 64-bit integer, as every reader of
/// the Lease's annotation can hold it).
pub const HEARTBEAT_SEQUENCE: RangeInclusive<u64> = 0..=(i64::MAX as u64);

/// `value` of the query parameter `name` as an integer in `range`; a 400 naming both
/// otherwise.
pub fn integer(name: &str, value: &str, range: &RangeInclusive<u64>) -> ApiResult<u64> {
    let out_of_range = || {
        let shown: String = value.chars().take(40).collect();
        ApiError::bad_request(format!(
            "{name}={shown:?} is out of range: {name} must be an integer from {} to {}",
            range.start(),
            range.end()
        ))
        .with_details(serde_json::json!({
            "causes": [{
                "reason": "FieldValueInvalid",
                "field": name,
                "message": format!("must be an integer from {} to {}", range.start(), range.end()),
            }],
        }))
    };
    match value.trim().parse::<u64>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(out_of_range()),
    }
}

/// [`integer`] of an optional parameter (absent or empty: `None`).
pub fn optional(
    name: &str,
    value: Option<&str>,
    range: &RangeInclusive<u64>,
) -> ApiResult<Option<u64>> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => integer(name, v, range).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_names_the_parameter_and_the_range() {
        assert_eq!(integer("limit", "500", &LIST_LIMIT).unwrap(), 500);
        for bad in ["-1", "1000001", "x", "18446744073709551616", "1e3"] {
            let e = integer("limit", bad, &LIST_LIMIT).unwrap_err();
            assert_eq!(e.code, 400, "{bad}");
            assert!(
                e.message
                    .contains("limit must be an integer from 0 to 1000000"),
                "{}",
                e.message
            );
        }
        let e = integer(
            "timeoutSeconds",
            "18446744073709551615",
            &WATCH_TIMEOUT_SECONDS,
        )
        .unwrap_err();
        assert!(e.message.contains("from 0 to 86400"), "{}", e.message);
        assert_eq!(optional("tailLines", Some(""), &TAIL_LINES).unwrap(), None);
        assert_eq!(optional("tailLines", None, &TAIL_LINES).unwrap(), None);
        assert_eq!(
            optional("rows", Some("24"), &TERMINAL_SIZE).unwrap(),
            Some(24)
        );
        assert!(optional("rows", Some("0"), &TERMINAL_SIZE).is_err());
    }
}
