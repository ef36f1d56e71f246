//! Task ranges (job arrays): `0-99`, `0-15:4` (a step), `1,3,5-7` (a list), and the
//! command line's `RANGE%N` (at most N tasks at once), as `spec.taskGroup`, Slurm's
//! `--array`, `lattice submit --task-group` and a DAG step's `task_group` write them.
//!
//! One grammar, one parser ([`parse_range`], [`parse_range_with_limit`]); the front ends
//! differ only in how they word a [`RangeError`]: admission names the field
//! ([`TaskRange::parse`]), the DAG core points at a column (`lattice_dag::taskgroup`).
//!
//! ```
//! use lattice_apis::syntax::tasks::{parse_range_with_limit, TaskRange};
//!
//! let r = TaskRange::parse("0-15:4,20").unwrap();
//! assert_eq!(r.indices(), vec![0, 4, 8, 12, 20]);
//! assert_eq!(r.to_string(), "0-15:4,20");
//!
//! let (r, limit) = parse_range_with_limit("0-99%20", 1000).unwrap();
//! assert_eq!((r.count(), limit), (100, Some(20)));
//! ```

use std::collections::BTreeSet;
use std::fmt;

use crate::validation::truncate;
use crate::wellknown::MAX_TASKS;

pub use crate::wellknown::MAX_TASK_INDEX;

/// How to write a range, for admission's messages.
pub const RANGE_SYNTAX: &str =
    "use START-END (e.g. \"0-99\"), START-END:STEP (\"0-15:4\") or a comma list (\"1,3,5-7\")";

/// A parsed task index range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRange {
    /// Inclusive `(start, end, step)` segments.
    pub segments: Vec<(u64, u64, u64)>,
}

/// What is wrong with a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeErrorKind {
    /// Nothing but blanks.
    Empty,
    /// An empty entry of the comma list (`1,,2`).
    EmptyEntry,
    /// A `%` where no limit may be given (`spec.taskGroup.range`).
    LimitNotAllowed,
    /// The `%N` limit is not a number.
    BadLimit,
    /// The `%N` limit is 0.
    ZeroLimit,
    /// Not a run of digits; `what` is `start`, `end`, `index` or `step`.
    NotANumber {
        /// Which number.
        what: &'static str,
    },
    /// A number above [`MAX_TASK_INDEX`] (or past `u64`); `what` as for `NotANumber`.
    TooLarge {
        /// Which number.
        what: &'static str,
    },
    /// A step of 0.
    ZeroStep,
    /// `START-END` with START > END.
    Reversed {
        /// START.
        start: u64,
        /// END.
        end: u64,
    },
    /// More tasks than the limit (duplicates across entries counted each time).
    TooMany {
        /// Tasks up to and including the entry that went over.
        count: u64,
        /// The limit.
        limit: u64,
    },
}

/// A range that does not parse: what, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeError {
    /// Byte offset in the input of the entry (or the number, or the `%N` limit) at fault.
    pub position: usize,
    /// The entry at fault, trimmed (the `%N` limit's text for the limit's errors).
    pub entry: String,
    /// The text of the number at fault, for `NotANumber` and `TooLarge`.
    pub text: String,
    /// What is wrong.
    pub kind: RangeErrorKind,
}

impl RangeError {
    fn new(position: usize, entry: &str, kind: RangeErrorKind) -> Self {
        Self {
            position,
            entry: entry.to_string(),
            text: String::new(),
            kind,
        }
    }

    fn number(position: usize, entry: &str, text: &str, kind: RangeErrorKind) -> Self {
        Self {
            text: text.to_string(),
            ..Self::new(position, entry, kind)
        }
    }
}

/// `s` without its blanks, and the byte offset of what is left in `s`.
fn trimmed(s: &str) -> (usize, &str) {
    let t = s.trim_start();
    (s.len() - t.len(), t.trim_end())
}

/// One number of an entry, at `pos`.
fn number(text: &str, pos: usize, entry: &str, what: &'static str) -> Result<u64, RangeError> {
    let (lead, t) = trimmed(text);
    let pos = pos + lead;
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RangeError::number(
            pos,
            entry,
            t,
            RangeErrorKind::NotANumber { what },
        ));
    }
    t.parse::<u64>()
        .map_err(|_| RangeError::number(pos, entry, t, RangeErrorKind::TooLarge { what }))
}

/// Parse a range (no `%N`), rejecting one of more than `limit` tasks.
pub fn parse_range(input: &str, limit: u64) -> Result<TaskRange, RangeError> {
    let (lead, t) = trimmed(input);
    if t.is_empty() {
        return Err(RangeError::new(0, "", RangeErrorKind::Empty));
    }
    if let Some(p) = t.find('%') {
        return Err(RangeError::new(
            lead + p,
            t,
            RangeErrorKind::LimitNotAllowed,
        ));
    }
    parse_list(t, lead, limit)
}

/// Parse `RANGE[%N]`: the range and its limit of tasks at once, rejecting a range of
/// more than `limit` tasks.
pub fn parse_range_with_limit(
    input: &str,
    limit: u64,
) -> Result<(TaskRange, Option<u32>), RangeError> {
    let (lead, t) = trimmed(input);
    if t.is_empty() {
        return Err(RangeError::new(0, "", RangeErrorKind::Empty));
    }
    let (list, at_once) = match t.split_once('%') {
        Some((l, c)) => {
            let pos = lead + l.len() + 1;
            let digits = c.trim();
            let n: u32 = digits
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| digits.parse().ok())
                .flatten()
                .ok_or_else(|| RangeError::new(pos, c, RangeErrorKind::BadLimit))?;
            if n == 0 {
                return Err(RangeError::new(pos, c, RangeErrorKind::ZeroLimit));
            }
            (l, Some(n))
        }
        None => (t, None),
    };
    Ok((parse_list(list, lead, limit)?, at_once))
}

/// The comma list `list`, which starts `offset` bytes into the input.
fn parse_list(list: &str, offset: usize, limit: u64) -> Result<TaskRange, RangeError> {
    let mut segments = Vec::new();
    let mut total: u64 = 0;
    let mut start_of_part = offset;
    for raw in list.split(',') {
        let (lead, part) = trimmed(raw);
        let pos = start_of_part + lead;
        start_of_part += raw.len() + 1;
        if part.is_empty() {
            return Err(RangeError::new(pos, part, RangeErrorKind::EmptyEntry));
        }
        let (range, step) = match part.split_once(':') {
            Some((r, st)) => (r, Some((st, pos + r.len() + 1))),
            None => (part, None),
        };
        let (a, b) = match range.split_once('-') {
            Some((a, b)) => (
                number(a, pos, part, "start")?,
                number(b, pos + a.len() + 1, part, "end")?,
            ),
            None => {
                let v = number(range, pos, part, "index")?;
                (v, v)
            }
        };
        if a > b {
            return Err(RangeError::new(
                pos,
                part,
                RangeErrorKind::Reversed { start: a, end: b },
            ));
        }
        let step = match step {
            Some((st, p)) => match number(st, p, part, "step")? {
                0 => return Err(RangeError::new(p, part, RangeErrorKind::ZeroStep)),
                s if s > MAX_TASK_INDEX => {
                    return Err(RangeError::number(
                        p,
                        part,
                        st.trim(),
                        RangeErrorKind::TooLarge { what: "step" },
                    ))
                }
                s => s,
            },
            None => 1,
        };
        // The count is checked before the indices' size, so that a range of absurd
        // length is reported as such, whatever its end.
        total = total.saturating_add((b - a) / step + 1);
        if total > limit {
            return Err(RangeError::new(
                pos,
                part,
                RangeErrorKind::TooMany {
                    count: total,
                    limit,
                },
            ));
        }
        if b > MAX_TASK_INDEX {
            let (what, text) = match range.split_once('-') {
                Some((_, e)) => ("end", e.trim()),
                None => ("index", range.trim()),
            };
            return Err(RangeError::number(
                pos,
                part,
                text,
                RangeErrorKind::TooLarge { what },
            ));
        }
        segments.push((a, b, step));
    }
    Ok(TaskRange { segments })
}

impl TaskRange {
    /// Parse `0-99`, `0-15:4`, `1,3,5-7` (at most [`MAX_TASKS`] tasks), as
    /// `spec.taskGroup.range` takes it. The error explains the syntax (without a path).
    pub fn parse(s: &str) -> Result<TaskRange, String> {
        parse_range(s, MAX_TASKS).map_err(|e| e.admission_message(s))
    }

    /// Number of task indices (duplicates across segments counted once).
    pub fn count(&self) -> u64 {
        // Cheap upper bound first, to avoid expanding absurd ranges.
        let bound: u64 = self
            .segments
            .iter()
            .map(|(a, b, s)| b.saturating_sub(*a) / (*s).max(1) + 1)
            .fold(0u64, u64::saturating_add);
        if bound > MAX_TASKS {
            return bound;
        }
        self.indices().len() as u64
    }

    /// Whether `i` is one of the indices (without expanding the range).
    pub fn contains(&self, i: u64) -> bool {
        self.segments
            .iter()
            .any(|&(a, b, s)| (a..=b).contains(&i) && (i - a) % s.max(1) == 0)
    }

    /// All indices in ascending order, deduplicated.
    pub fn indices(&self) -> Vec<u64> {
        let mut set = BTreeSet::new();
        for &(a, b, s) in &self.segments {
            // Segments are public: guard against hand-built zero steps.
            let s = s.max(1);
            let mut i = a;
            while i <= b {
                set.insert(i);
                match i.checked_add(s) {
                    Some(n) => i = n,
                    None => break,
                }
            }
        }
        set.into_iter().collect()
    }
}

/// The normalized spelling: `A`, `A-B` or `A-B:S` per segment, joined by `,` (what
/// [`TaskRange::parse`] reads back to the same indices, and to the same segments when
/// no single index carries a step).
impl fmt::Display for TaskRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(a, b, s)) in self.segments.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            // A single index needs no step (`3:2` is spelled `3`).
            match (a == b, s) {
                (true, _) => write!(f, "{a}")?,
                (_, 1) => write!(f, "{a}-{b}")?,
                (_, s) => write!(f, "{a}-{b}:{s}")?,
            }
        }
        Ok(())
    }
}

impl RangeError {
    /// Admission's wording (`spec.taskGroup.range: ...`, the path added by the caller).
    pub fn admission_message(&self, input: &str) -> String {
        let t = input.trim();
        let part = &self.entry;
        match &self.kind {
            RangeErrorKind::Empty => format!("is empty; {RANGE_SYNTAX}"),
            RangeErrorKind::LimitNotAllowed | RangeErrorKind::BadLimit | RangeErrorKind::ZeroLimit => format!(
                "{t:?} contains '%': put the concurrency limit in spec.taskGroup.concurrency; {RANGE_SYNTAX}"
            ),
            RangeErrorKind::NotANumber { what: "step" }
            | RangeErrorKind::TooLarge { what: "step" }
            | RangeErrorKind::ZeroStep => {
                format!("{part:?} has an invalid step; {RANGE_SYNTAX}")
            }
            RangeErrorKind::EmptyEntry
            | RangeErrorKind::NotANumber { .. }
            | RangeErrorKind::TooLarge { .. } => format!(
                "{:?} is not a valid range; {RANGE_SYNTAX}",
                truncate(part, 40)
            ),
            RangeErrorKind::Reversed { start, end } => format!(
                "{part:?}: start {start} is greater than end {end}; write it as \"{end}-{start}\""
            ),
            RangeErrorKind::TooMany { count, limit } => format!(
                "{t:?} expands to {count} tasks, the limit is {limit}; split the task group"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn forms() {
        let r = TaskRange::parse(" 1, 3 ,5-7:2 ").expect("blanks are allowed");
        assert_eq!(r.indices(), vec![1, 3, 5, 7]);
        assert_eq!(r.to_string(), "1,3,5-7:2");
        assert_eq!(
            TaskRange::parse("3:2").expect("a stepped index").indices(),
            vec![3]
        );
        let (r, n) = parse_range_with_limit("0-9%3", MAX_TASKS).expect("limit");
        assert_eq!((r.count(), n), (10, Some(3)));
    }

    #[test]
    fn errors_say_where_and_what() {
        let cases: &[(&str, usize, RangeErrorKind)] = &[
            ("", 0, RangeErrorKind::Empty),
            ("1,,2", 2, RangeErrorKind::EmptyEntry),
            ("0-9:0", 4, RangeErrorKind::ZeroStep),
            ("a-3", 0, RangeErrorKind::NotANumber { what: "start" }),
            ("1-b", 2, RangeErrorKind::NotANumber { what: "end" }),
            ("5-1", 0, RangeErrorKind::Reversed { start: 5, end: 1 }),
            (
                "7-1000000000",
                0,
                RangeErrorKind::TooMany {
                    count: 999_999_994,
                    limit: MAX_TASKS,
                },
            ),
            ("1000000000", 0, RangeErrorKind::TooLarge { what: "index" }),
            ("0-9%20", 3, RangeErrorKind::LimitNotAllowed),
        ];
        for (s, pos, kind) in cases {
            let e = parse_range(s, MAX_TASKS).expect_err(s);
            assert_eq!((e.position, &e.kind), (*pos, kind), "{s}");
        }
        assert_eq!(
            parse_range_with_limit("0-9%x", MAX_TASKS)
                .expect_err("x")
                .kind,
            RangeErrorKind::BadLimit
        );
    }

    #[test]
    fn admission_messages_name_the_fix() {
        let m = TaskRange::parse("99-0").expect_err("reversed");
        assert_eq!(
            m,
            "\"99-0\": start 99 is greater than end 0; write it as \"0-99\""
        );
        let m = TaskRange::parse("0-99999999999").expect_err("huge");
        assert!(
            m.contains("expands to") && m.contains("split the task group"),
            "{m}"
        );
        let m = TaskRange::parse("0-99%20").expect_err("%");
        assert!(m.contains("spec.taskGroup.concurrency"), "{m}");
    }

    fn segment() -> impl Strategy<Value = (u64, u64, u64)> {
        (0u64..1_000, 0u64..200, 1u64..7).prop_map(|(a, len, s)| {
            // A single index is spelled without a step; the parse gives step 1.
            if len == 0 {
                (a, a, 1)
            } else {
                (a, a + len, s)
            }
        })
    }

    proptest! {
        #[test]
        fn spelling_round_trips(segments in proptest::collection::vec(segment(), 1..6)) {
            let r = TaskRange { segments };
            let again = TaskRange::parse(&r.to_string()).expect("a rendered range parses");
            prop_assert_eq!(&again, &r);
            prop_assert_eq!(again.to_string(), r.to_string());
        }

        #[test]
        fn parse_then_render_is_stable(s in "[0-9 ,:-]{1,24}") {
            if let Ok(r) = TaskRange::parse(&s) {
                let text = r.to_string();
                let again = TaskRange::parse(&text).expect("a rendered range parses");
                prop_assert_eq!(again.indices(), r.indices());
                prop_assert_eq!(again.to_string(), text);
            }
        }
    }
}
