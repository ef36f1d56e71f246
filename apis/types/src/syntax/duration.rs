//! Durations as users write them: `24h`, `1h30m`, `90s`, `2d`, Slurm's
//! `HH:MM:SS`, `MM:SS`, `D-HH[:MM[:SS]]`, or a bare number of minutes.

/// The formats accepted by [`parse_duration`], for error messages.
pub const DURATION_FORMATS: &str =
    "use e.g. \"24h\", \"1h30m\", \"90s\", \"2d\", \"72:00:00\" (HH:MM:SS), \"1-12:00:00\" (D-HH:MM:SS) or \"30\" (minutes)";

pub use crate::wellknown::MAX_DURATION_SECS;

/// Parse a duration into whole seconds. The error says what is wrong (without a path).
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("is empty; {DURATION_FORMATS}"));
    }
    if t.len() > 32 {
        return Err(format!("is not a duration; {DURATION_FORMATS}"));
    }
    let secs = if t.contains(':') || t.contains('-') {
        parse_clock(t)
    } else if t.bytes().all(|b| b.is_ascii_digit()) {
        // Slurm: a bare number means minutes.
        t.parse::<u64>().ok().and_then(|m| m.checked_mul(60))
    } else {
        parse_units(t)
    }
    .ok_or_else(|| {
        format!(
            "{:?} is not a duration; {DURATION_FORMATS}",
            crate::validation::truncate(s, 40)
        )
    })?;
    if secs > MAX_DURATION_SECS {
        return Err(format!(
            "{s:?} is longer than the 366-day limit; use a shorter duration"
        ));
    }
    Ok(secs)
}

/// `[D-]HH:MM:SS`, `MM:SS`, `D-HH`, `D-HH:MM`.
fn parse_clock(t: &str) -> Option<u64> {
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (num(d)?, Some(r)),
        None => (0, None),
    };
    let (h, m, s) = match rest {
        Some(r) => {
            let p: Vec<&str> = r.split(':').collect();
            match p.as_slice() {
                [h] => (num(h)?, 0, 0),
                [h, m] => (num(h)?, num(m)?, 0),
                [h, m, s] => (num(h)?, num(m)?, num(s)?),
                _ => return None,
            }
        }
        None => {
            let p: Vec<&str> = t.split(':').collect();
            match p.as_slice() {
                [m, s] => (0, num(m)?, num(s)?),
                [h, m, s] => (num(h)?, num(m)?, num(s)?),
                _ => return None,
            }
        }
    };
    if m >= 60 || s >= 60 || (rest.is_some() && h >= 24) {
        return None;
    }
    days.checked_mul(86_400)?
        .checked_add(h.checked_mul(3600)?)?
        .checked_add(m * 60 + s)
}

/// `1d2h3m4s` in any combination, each unit at most once, in that order (lower-case
/// units); `None` when `t` is not of that form or overflows.
pub fn parse_units(t: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut last_rank = 0u8;
    let mut any = false;
    for c in t.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let (mult, rank) = match c {
            'd' => (86_400, 1),
            'h' => (3_600, 2),
            'm' => (60, 3),
            's' => (1, 4),
            _ => return None,
        };
        if digits.is_empty() || rank <= last_rank {
            return None;
        }
        last_rank = rank;
        total = total.checked_add(num(&digits)?.checked_mul(mult)?)?;
        digits.clear();
        any = true;
    }
    if !digits.is_empty() || !any {
        return None;
    }
    Some(total)
}

/// A run of at most 12 ASCII digits (what every field of a duration is).
pub(crate) fn num(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 12 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Format seconds as `HH:MM:SS` (hours may exceed 24), as `lattice status` prints walltimes.
pub fn format_hms(secs: u64) -> String {
    format!(
        "{:02}:{:02}:{:02}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        assert_eq!(parse_duration("24h"), Ok(86_400));
        assert_eq!(parse_duration("1h30m"), Ok(5_400));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("2d"), Ok(172_800));
        assert_eq!(parse_duration("10m"), Ok(600));
        assert_eq!(parse_duration("72:00:00"), Ok(259_200));
        assert_eq!(parse_duration("05:30"), Ok(330));
        assert_eq!(parse_duration("1-12:00:00"), Ok(129_600));
        assert_eq!(parse_duration("1-12"), Ok(129_600));
        assert_eq!(parse_duration("30"), Ok(1_800));
    }

    #[test]
    fn rejected_forms() {
        for bad in [
            "",
            "h",
            "1x",
            "1m1h",
            "1h1h",
            "12:61:00",
            "1:2:3:4",
            "-5",
            "1-25:00",
            "abc",
            "99999999999999d",
            "400d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse_duration("1y").unwrap_err().contains("24h"));
    }

    #[test]
    fn hms() {
        assert_eq!(format_hms(259_200), "72:00:00");
        assert_eq!(format_hms(3_661), "01:01:01");
    }

    proptest::proptest! {
        #[test]
        fn hms_spelling_round_trips(secs in 0u64..=MAX_DURATION_SECS) {
            proptest::prop_assert_eq!(parse_duration(&format_hms(secs)), Ok(secs));
        }

        #[test]
        fn unit_spelling_round_trips(d in 0u64..366, h in 0u64..24, m in 0u64..60, s in 0u64..60) {
            let text: String = [(d, 'd'), (h, 'h'), (m, 'm'), (s, 's')]
                .iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, u)| format!("{n}{u}"))
                .collect();
            proptest::prop_assume!(!text.is_empty());
            proptest::prop_assert_eq!(parse_duration(&text), Ok(d * 86_400 + h * 3_600 + m * 60 + s));
        }
    }
}
