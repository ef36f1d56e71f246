//! What an allocation may use on this node: the node's capacity less what the agent is
//! told to keep for the system (`--system-reserved`). With full-node scheduling every
//! allocation (and its job steps, together) gets this whole share.
//!
//! `--system-reserved` is a comma-separated list of `resource=quantity`:
//!
//! | resource | quantity | example |
//! |---|---|---|
//! | `memory` | bytes, with an optional suffix `Ki`, `Mi`, `Gi`, `Ti` (powers of 1024) or `k`/`K`, `M`, `G`, `T` (powers of 1000) | `memory=2Gi` |
//! | `cpu` | cores, decimal (`1`, `0.5`) or millicores (`500m`) | `cpu=1` |
//! | `pids` | processes and threads | `pids=1024` |
//!
//! e.g. `--system-reserved memory=2Gi,cpu=1,pids=1024`. Each resource at most once;
//! what is not named is not reserved. The agent refuses to start when a reserve leaves
//! nothing of the node's capacity.

use std::fmt;
use std::str::FromStr;

/// What `--system-reserved` keeps for the system.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemReserved {
    /// Bytes of memory.
    pub memory: u64,
    /// CPU in millicores.
    pub cpu_millis: u64,
    /// Processes and threads.
    pub pids: u64,
}

/// A node's capacity, or an allocation's share of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    /// Bytes of memory.
    pub memory: u64,
    /// CPU in millicores.
    pub cpu_millis: u64,
    /// Processes and threads.
    pub pids: u64,
}

impl FromStr for SystemReserved {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut r = SystemReserved::default();
        let mut seen = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(format!(
                    "{item:?} is not resource=quantity; e.g. memory=2Gi,cpu=1,pids=1024"
                ));
            };
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(format!("{key} is given twice"));
            }
            match key {
                "memory" => r.memory = parse_bytes(value)?,
                "cpu" => r.cpu_millis = parse_cpu(value)?,
                "pids" => {
                    r.pids = value.parse().map_err(|_| {
                        format!("pids={value:?} is not a whole number of processes, e.g. pids=1024")
                    })?
                }
                other => {
                    return Err(format!(
                        "{other:?} is not a resource the agent reserves; use memory, cpu or pids"
                    ))
                }
            }
            seen.push(key);
        }
        Ok(r)
    }
}

/// `2Gi`, `512Mi`, `1G`, `1000` → bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "memory={s:?} is not a quantity of bytes; use e.g. 2Gi, 512Mi (powers of 1024) or 2G (powers of 1000)"
        )
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let factor: u64 = match unit {
        "" => 1,
        "k" | "K" => 1000,
        "M" => 1000_u64.pow(2),
        "G" => 1000_u64.pow(3),
        "T" => 1000_u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(bad()),
    };
    if num.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(factor).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    let bytes = f * factor as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes.round() as u64)
}

/// `1`, `0.5`, `500m` → millicores.
pub fn parse_cpu(s: &str) -> Result<u64, String> {
    let bad = || format!("cpu={s:?} is not a number of cores; use e.g. 1, 0.5 or 500m");
    if let Some(m) = s.strip_suffix('m') {
        return m.parse::<u64>().map_err(|_| bad());
    }
    let f: f64 = s.parse().map_err(|_| bad())?;
    if !f.is_finite() || !(0.0..=1e12).contains(&f) {
        return Err(bad());
    }
    Ok((f * 1000.0).round() as u64)
}

impl SystemReserved {
    /// `capacity` less this reserve; an error naming the resource when nothing is left.
    pub fn allocatable(&self, capacity: Resources) -> Result<Resources, String> {
        let left = |what: &str, cap: u64, res: u64, show: &dyn Fn(u64) -> String| {
            if res >= cap {
                Err(format!(
                    "--system-reserved {what}={} leaves nothing of this node's {} {what}; reserve less",
                    show(res),
                    show(cap)
                ))
            } else {
                Ok(cap - res)
            }
        };
        Ok(Resources {
            memory: left("memory", capacity.memory, self.memory, &|b| format_bytes(b))?,
            cpu_millis: left("cpu", capacity.cpu_millis, self.cpu_millis, &format_cpu)?,
            pids: left("pids", capacity.pids, self.pids, &|n| n.to_string())?,
        })
    }
}

/// Bytes for people: `256 MiB`, `1.5 GiB`, `1000 bytes`.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if b >= size {
            return if b.is_multiple_of(size) {
                format!("{} {unit}", b / size)
            } else {
                format!("{:.1} {unit}", b as f64 / size as f64)
            };
        }
    }
    format!("{b} bytes")
}

/// Millicores for people: `2`, `1.5`, `0.25`.
pub fn format_cpu(m: u64) -> String {
    if m.is_multiple_of(1000) {
        (m / 1000).to_string()
    } else {
        let s = format!("{:.3}", m as f64 / 1000.0);
        s.trim_end_matches('0').to_string()
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory {}, cpu {}, pids {}",
            format_bytes(self.memory),
            format_cpu(self.cpu_millis),
            self.pids
        )
    }
}

/// The node's pid capacity: the kernel's `pid_max` or `threads-max`, whichever is lower
/// (`proc` is `/proc`).
pub fn pid_capacity(proc: &std::path::Path) -> u64 {
    let read = |f: &str| {
        std::fs::read_to_string(proc.join("sys/kernel").join(f))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    match (read("pid_max"), read("threads-max")) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => 32768,
    }
}

/// `MemTotal` of `meminfo` in bytes.
pub fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_syntax() {
        let r: SystemReserved = "memory=2Gi, cpu=1,pids=1024".parse().unwrap();
        assert_eq!(
            r,
            SystemReserved {
                memory: 2 << 30,
                cpu_millis: 1000,
                pids: 1024
            }
        );
        assert_eq!(
            "".parse::<SystemReserved>().unwrap(),
            SystemReserved::default()
        );
        let r: SystemReserved = "cpu=500m,memory=1.5G".parse().unwrap();
        assert_eq!((r.cpu_millis, r.memory), (500, 1_500_000_000));
        assert_eq!(parse_cpu("0.25").unwrap(), 250);
        assert_eq!(parse_bytes("768Mi").unwrap(), 768 << 20);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        for bad in [
            "memory",
            "memory=2GB",
            "memory=-1",
            "memory=Gi",
            "cpu=lots",
            "cpu=-1",
            "pids=1.5",
            "disk=1G",
            "memory=1G,memory=2G",
            "memory=99999999999Ti",
        ] {
            let e = bad.parse::<SystemReserved>();
            assert!(e.is_err(), "{bad} parsed: {e:?}");
        }
        assert!("disk=1G"
            .parse::<SystemReserved>()
            .unwrap_err()
            .contains("use memory, cpu or pids"));
    }

    #[test]
    fn allocatable_is_capacity_less_the_reserve() {
        let cap = Resources {
            memory: 1 << 30,
            cpu_millis: 4000,
            pids: 64,
        };
        let r: SystemReserved = "memory=768Mi,cpu=1".parse().unwrap();
        let a = r.allocatable(cap).unwrap();
        assert_eq!(
            a,
            Resources {
                memory: 256 << 20,
                cpu_millis: 3000,
                pids: 64
            }
        );
        assert_eq!(a.to_string(), "memory 256 MiB, cpu 3, pids 64");
        let e = "memory=1Gi"
            .parse::<SystemReserved>()
            .unwrap()
            .allocatable(cap)
            .unwrap_err();
        assert_eq!(
            e,
            "--system-reserved memory=1 GiB leaves nothing of this node's 1 GiB memory; reserve less"
        );
        assert!("pids=64"
            .parse::<SystemReserved>()
            .unwrap()
            .allocatable(cap)
            .is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(256 << 20), "256 MiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(999), "999 bytes");
        assert_eq!(format_cpu(1500), "1.5");
        assert_eq!(format_cpu(250), "0.25");
        assert_eq!(mem_total("MemTotal:   1024 kB\n"), Some(1 << 20));
    }
}
