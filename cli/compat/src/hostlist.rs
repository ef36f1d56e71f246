//! Slurm hostlist compression and expansion (`nid[001-004,007]`).

use std::collections::BTreeMap;

fn split_host(h: &str) -> (&str, Option<&str>) {
    let digits = h.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 18 {
        (h, None)
    } else {
        (&h[..h.len() - digits], Some(&h[h.len() - digits..]))
    }
}

/// Compress host names the way Slurm prints `SLURM_NODELIST`: sorted,
/// deduplicated, runs of numeric suffixes sharing a prefix and zero-padding
/// folded into brackets (`nid001,nid002,nid003,nid004,nid007` →
/// `nid[001-004,007]`). A lone host keeps its plain name.
pub fn compress(hosts: &[String]) -> String {
    // Zero-padded widths seen per prefix: "nid100" joins "nid001"'s group.
    let mut padded: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for h in hosts {
        if let (p, Some(d)) = split_host(h.trim()) {
            if d.len() > 1 && d.starts_with('0') {
                padded.entry(p.to_string()).or_default().push(d.len());
            }
        }
    }
    // (prefix, pad width (0 = natural)) -> numbers
    let mut groups: BTreeMap<(String, usize), Vec<u64>> = BTreeMap::new();
    let mut plain: Vec<String> = Vec::new();
    for h in hosts {
        let h = h.trim();
        if h.is_empty() {
            continue;
        }
        match split_host(h) {
            (p, Some(d)) => {
                let is_padded = d.len() > 1 && d.starts_with('0');
                let joins = padded.get(p).is_some_and(|w| w.contains(&d.len()));
                let width = if is_padded || joins { d.len() } else { 0 };
                let n: u64 = d.parse().unwrap_or(0);
                groups.entry((p.to_string(), width)).or_default().push(n);
            }
            (p, None) => plain.push(p.to_string()),
        }
    }
    let mut parts: Vec<(String, u64, String)> = Vec::new();
    for ((prefix, width), mut nums) in groups {
        nums.sort_unstable();
        nums.dedup();
        let fmt = |n: u64| format!("{n:0width$}");
        let mut ranges: Vec<String> = Vec::new();
        let mut i = 0;
        while i < nums.len() {
            let start = nums[i];
            let mut end = start;
            while i + 1 < nums.len() && nums[i + 1] == end + 1 {
                i += 1;
                end = nums[i];
            }
            ranges.push(if start == end {
                fmt(start)
            } else {
                format!("{}-{}", fmt(start), fmt(end))
            });
            i += 1;
        }
        let text = if nums.len() == 1 {
            format!("{prefix}{}", ranges[0])
        } else {
            format!("{prefix}[{}]", ranges.join(","))
        };
        parts.push((prefix, nums[0], text));
    }
    plain.sort();
    plain.dedup();
    for p in plain {
        parts.push((p.clone(), 0, p));
    }
    parts.sort();
    parts
        .into_iter()
        .map(|(_, _, t)| t)
        .collect::<Vec<_>>()
        .join(",")
}

/// Expand a Slurm hostlist (`nid[001-003,007],login1`) into host names.
/// Supports one bracket group per host expression. `None` when malformed or
/// larger than `limit` hosts.
pub fn expand(list: &str, limit: usize) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    let mut items = Vec::new();
    for c in list.chars() {
        match c {
            '[' => {
                depth += 1;
                cur.push(c)
            }
            ']' => {
                if depth == 0 {
                    return None;
                }
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => items.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    if depth != 0 {
        return None;
    }
    items.push(cur);
    for item in items {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        match item.find('[') {
            None => out.push(item.to_string()),
            Some(open) => {
                let close = item.rfind(']')?;
                let (prefix, inner, suffix) =
                    (&item[..open], &item[open + 1..close], &item[close + 1..]);
                if inner.contains('[') {
                    return None;
                }
                for r in inner.split(',') {
                    let (a, b) = match r.split_once('-') {
                        Some((a, b)) => (a, b),
                        None => (r, r),
                    };
                    let width = a.len();
                    let (x, y): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
                    if x > y || (y - x) as usize > limit {
                        return None;
                    }
                    for n in x..=y {
                        out.push(format!("{prefix}{n:0width$}{suffix}"));
                        if out.len() > limit {
                            return None;
                        }
                    }
                }
            }
        }
        if out.len() > limit {
            return None;
        }
    }
    Some(out)
}
