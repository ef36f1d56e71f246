//! Lattice's JSON-lines trace format. One JSON object per line, `type` tells which:
//!
//! ```text
//! {"type":"nodes","count":64,"groups":4,"template":{"gpus":4,"gpu_type":"H100","memory_gb":512}}
//! {"type":"node","id":100,"gpus":8,"topology_group":3,"conformance_fingerprint":7}
//! {"type":"tenant","id":1,"quota":{"target_share":0.5,"max_nodes":48}}
//! {"type":"submit","time":0,"id":1,"tenant":1,"nodes":4,"runtime":3600,"walltime":7200,"class":5}
//! {"type":"complete","id":1,"time":4000,"start":400}
//! ```
//!
//! * `nodes` adds `count` nodes from `template` (any `NodeView` field), ids continuing from the
//!   highest so far, spread over `groups` dragonfly groups in equal consecutive blocks, with
//!   `fingerprints` conformance fingerprints assigned round-robin (default 1).
//! * `submit` fields: `time`, `id` (unique), `tenant`, `vcluster` (0), `nodes`, `runtime`
//!   (actual seconds, may be given instead by a later `complete`), `walltime` (estimate,
//!   default = runtime), `class` (0-10, default 5), `sensitive`, `constraints`,
//!   `checkpoint` — same field names as the core's types.
//! * `complete` records when the job really finished in the original system; the actual
//!   runtime is `time - start`.

use std::collections::HashMap;
use std::io::BufRead;

use serde::Deserialize;

use super::engine::{SimJob, Workload};
use super::TraceError;
use crate::model::{CheckpointInfo, Constraints, NodeId, NodeView, Tenant, TenantId, VClusterId};
use crate::predict::RuntimeKey;

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Line {
    Nodes {
        count: u32,
        #[serde(default = "one")]
        groups: u32,
        #[serde(default = "one")]
        fingerprints: u32,
        #[serde(default)]
        template: Option<NodeView>,
    },
    Node(NodeView),
    Tenant(Tenant),
    Submit(Submit),
    Complete {
        id: u64,
        time: i64,
        start: i64,
    },
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Submit {
    time: i64,
    id: u64,
    #[serde(default)]
    tenant: u32,
    #[serde(default)]
    vcluster: u32,
    nodes: u32,
    #[serde(default)]
    runtime: Option<i64>,
    #[serde(default)]
    walltime: Option<i64>,
    #[serde(default = "five")]
    class: u8,
    #[serde(default)]
    sensitive: bool,
    #[serde(default)]
    constraints: Constraints,
    #[serde(default)]
    checkpoint: CheckpointInfo,
    /// Who submitted it (runtime prediction learns per user); default: none.
    #[serde(default)]
    user: Option<u32>,
    /// The job's name (an application number), for per-(user, name) runtime history.
    #[serde(default)]
    name: Option<u32>,
}

fn five() -> u8 {
    5
}

pub fn parse(reader: impl BufRead, path: &str) -> Result<Workload, TraceError> {
    let err = |line: usize, message: String| TraceError::Parse {
        path: path.to_string(),
        line,
        message,
    };
    let mut w = Workload::default();
    let mut job_line: HashMap<u64, (usize, usize)> = HashMap::new();
    let mut next_node = 0u32;
    let mut node_ids = std::collections::HashSet::new();
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        let line = line.map_err(|e| err(lineno, format!("cannot read line: {e}")))?;
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let parsed: Line = serde_json::from_str(t).map_err(|e| err(lineno, e.to_string()))?;
        match parsed {
            Line::Nodes {
                count,
                groups,
                fingerprints,
                template,
            } => {
                let template = template.unwrap_or_else(|| NodeView::slot(0));
                let per_group = count.div_ceil(groups.max(1)).max(1);
                for k in 0..count {
                    let mut n = template.clone();
                    n.id = NodeId(next_node);
                    n.topology_group = k / per_group;
                    n.conformance_fingerprint = u64::from(k % fingerprints.max(1));
                    node_ids.insert(next_node);
                    next_node += 1;
                    w.nodes.push(n);
                }
            }
            Line::Node(n) => {
                if !node_ids.insert(n.id.0) {
                    return Err(err(lineno, format!("duplicate node id {}", n.id.0)));
                }
                next_node = next_node.max(n.id.0 + 1);
                w.nodes.push(n);
            }
            Line::Tenant(t) => w.tenants.push(t),
            Line::Submit(s) => {
                if job_line.contains_key(&s.id) {
                    return Err(err(lineno, format!("duplicate job id {}", s.id)));
                }
                if s.nodes == 0 {
                    return Err(err(lineno, "nodes must be at least 1".into()));
                }
                if s.class > 10 {
                    return Err(err(lineno, format!("class {} outside 0..=10", s.class)));
                }
                let runtime = s.runtime.unwrap_or(-1);
                job_line.insert(s.id, (lineno, w.jobs.len()));
                w.jobs.push(SimJob {
                    id: s.id,
                    tenant: TenantId(s.tenant),
                    vcluster: VClusterId(s.vcluster),
                    submit: s.time,
                    runtime,
                    estimate: s.walltime.unwrap_or(runtime).max(1),
                    nodes: s.nodes,
                    class: s.class,
                    sensitive: s.sensitive,
                    constraints: s.constraints,
                    checkpoint: s.checkpoint,
                    runtime_key: RuntimeKey {
                        user: s.user,
                        name: s.name,
                    },
                });
            }
            Line::Complete { id, time, start } => {
                let Some(&(_, idx)) = job_line.get(&id) else {
                    return Err(err(lineno, format!("complete for unknown job {id}")));
                };
                if time < start {
                    return Err(err(
                        lineno,
                        format!("complete time {time} before start {start}"),
                    ));
                }
                let j = &mut w.jobs[idx];
                j.runtime = time - start;
                if j.estimate <= 1 {
                    j.estimate = j.runtime.max(1);
                }
            }
        }
    }
    for j in &w.jobs {
        if j.runtime < 0 {
            let line = job_line.get(&j.id).map_or(0, |l| l.0);
            return Err(err(
                line,
                format!("job {} has no runtime and no complete event", j.id),
            ));
        }
    }
    if w.nodes.is_empty() {
        return Err(TraceError::Invalid {
            path: path.to_string(),
            message: "trace defines no nodes".into(),
        });
    }
    Ok(w)
}

pub fn load(path: &str) -> Result<Workload, TraceError> {
    parse(super::open_trace(path)?, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_inventory_jobs_and_completions() {
        let text = r#"{"type":"nodes","count":8,"groups":2,"template":{"gpus":4}}
{"type":"tenant","id":1,"quota":{"target_share":0.5}}
{"type":"submit","time":0,"id":7,"tenant":1,"nodes":2,"walltime":100}
{"type":"complete","id":7,"time":90,"start":10}
"#;
        let w = parse(text.as_bytes(), "t.jsonl").unwrap();
        assert_eq!(w.nodes.len(), 8);
        assert_eq!(w.nodes[5].topology_group, 1);
        assert_eq!(w.jobs[0].runtime, 80);
        assert_eq!(w.tenants.len(), 1);
    }

    #[test]
    fn errors_carry_line_numbers() {
        let text = "{\"type\":\"nodes\",\"count\":2}\n{\"type\":\"submit\",\"id\":1}\n";
        let e = parse(text.as_bytes(), "t.jsonl").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }
}
