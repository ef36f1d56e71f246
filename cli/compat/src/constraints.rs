//! `--constraint` → `resources.constraints`: Slurm's feature expressions (`&`, `|`,
//! `[...]`, `(...)`, `*N`) and Lattice's `key=value` terms, in the API's shape.
//!
//! The API holds feature constraints as a conjunction of disjunctions: `features` (every
//! node has each) and `anyOf` (groups of alternatives; every node has at least one of
//! each group). A Slurm expression is brought into that form by distributing `&` over
//! `|`, so `nvme&(a100|h100)` is `features: [nvme], anyOf: [[a100, h100]]` and
//! `gpu&ib|cpu` is `anyOf: [[gpu, cpu], [ib, cpu]]`: the same set of nodes qualifies.
//!
//! What the API cannot say is approximated, each with a note for the user's warning:
//! * `[a|b]` (Slurm: every node has the *same* alternative) becomes an `anyOf` group, so
//!   an allocation of several nodes may mix `a` and `b` nodes;
//! * `a*N` (N nodes with `a`) requires `a` on every node;
//! * an alternative that is not a plain feature (`gpu_type=GH200|gpu_type=MI300A`) keeps
//!   the first alternative, since `anyOf` lists node features only.
//!
//! ```
//! use lattice_compat::constraints::build;
//! use lattice_compat::values::parse_constraint;
//!
//! let c = build(&parse_constraint("nvme&(a100|h100)").unwrap(), true).unwrap();
//! assert_eq!(c.fields["features"], serde_json::json!(["nvme"]));
//! assert_eq!(c.fields["anyOf"], serde_json::json!([["a100", "h100"]]));
//! assert!(c.notes.is_empty());
//! ```

use lattice_apis::kinds::allocation::{MAX_ANY_OF_ALTERNATIVES, MAX_ANY_OF_GROUPS};
use lattice_apis::validation::{is_feature_name, FEATURE_NAME_RULE};
use serde_json::{json, Map, Value};

use crate::error::ValueError;
use crate::values::ConstraintExpr;

/// Lattice constraint keys that are flags (`require_unified_memory` or `...=true`).
const BOOL_KEYS: &[&str] = &[
    "require_unified_memory",
    "prefer_same_numa",
    "require_conformance",
    "allow_cxl_memory",
];

const CONSTRAINT_KEYS: &str = "gpu_type, gpu_count, memory_gb, topology, require_unified_memory, prefer_same_numa, require_conformance, allow_cxl_memory";

/// Most clauses the distribution of `&` over `|` may produce before simplification; the
/// API's bound ([`MAX_ANY_OF_GROUPS`]) applies after it.
const MAX_EXPANDED_CLAUSES: usize = 256;

/// A constraint expression in the API's shape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Built {
    /// `resources.constraints` fields (camelCase): `features`, `anyOf`, `gpuType`,
    /// `gpuCount`, `memoryGb`, `topology` and the flags.
    pub fields: Map<String, Value>,
    /// What could only be approximated, one sentence each.
    pub notes: Vec<String>,
}

/// Translate a parsed `--constraint`. `multi_node`: the allocation may have more than one
/// node (Slurm's `[a|b]` then differs from `anyOf`, and says so in a note).
pub fn build(e: &ConstraintExpr, multi_node: bool) -> Result<Built, ValueError> {
    let mut b = Builder {
        fields: Map::new(),
        clauses: Vec::new(),
        notes: Vec::new(),
        multi_node,
    };
    b.conjunct(e)?;
    let (features, any_of) = simplify(std::mem::take(&mut b.clauses))?;
    if !features.is_empty() {
        b.fields.insert("features".into(), json!(features));
    }
    if !any_of.is_empty() {
        b.fields.insert("anyOf".into(), json!(any_of));
    }
    Ok(Built {
        fields: b.fields,
        notes: b.notes,
    })
}

struct Builder {
    fields: Map<String, Value>,
    /// Feature clauses: each inner list is a disjunction, the list a conjunction.
    clauses: Vec<Vec<String>>,
    notes: Vec<String>,
    multi_node: bool,
}

impl Builder {
    /// One operand of the top-level conjunction.
    fn conjunct(&mut self, e: &ConstraintExpr) -> Result<(), ValueError> {
        match e {
            ConstraintExpr::And { items } => {
                for i in items {
                    self.conjunct(i)?;
                }
            }
            ConstraintExpr::Feature { name, .. } if BOOL_KEYS.contains(&name.as_str()) => {
                self.fields.insert(camel(name), json!(true));
            }
            ConstraintExpr::Feature { .. } => {
                let clauses = self.cnf(e)?;
                self.add(clauses)?;
            }
            ConstraintExpr::Compare { key, cmp, value } => self.compare(key, cmp, value)?,
            ConstraintExpr::Or { items, matching } => {
                if !items.iter().all(only_features) {
                    // `anyOf` lists node features; keep the first alternative.
                    let Some((first, rest)) = items.split_first() else {
                        return Ok(());
                    };
                    let dropped: Vec<String> =
                        rest.iter().map(|d| format!("{:?}", expr_text(d))).collect();
                    self.notes.push(format!(
                        "alternatives other than node features are not supported (anyOf lists features); using {:?} and dropping {} (pick one)",
                        expr_text(first),
                        dropped.join(", ")
                    ));
                    return self.conjunct(first);
                }
                if *matching && self.multi_node {
                    self.notes.push(format!(
                        "[{}] asks Slurm to give every node the same alternative; Lattice requires one of them on each node but may mix them across nodes",
                        items.iter().map(expr_text).collect::<Vec<_>>().join("|")
                    ));
                }
                let clauses = self.cnf(e)?;
                self.add(clauses)?;
            }
        }
        Ok(())
    }

    /// More clauses of the top-level conjunction, bounded as one expansion is (what comes
    /// after is quadratic in their number).
    fn add(&mut self, clauses: Vec<Vec<String>>) -> Result<(), ValueError> {
        let total = self.clauses.len().saturating_add(clauses.len());
        if total > MAX_EXPANDED_CLAUSES {
            return Err(too_complex(total));
        }
        self.clauses.extend(clauses);
        Ok(())
    }

    /// The clauses of an expression of plain features: distribute `&` over `|`.
    fn cnf(&mut self, e: &ConstraintExpr) -> Result<Vec<Vec<String>>, ValueError> {
        Ok(match e {
            ConstraintExpr::Feature { name, count } => {
                if let Some(n) = count {
                    self.notes.push(format!(
                        "'{name}*{n}' requires the feature on all nodes (counts are not supported)"
                    ));
                }
                if !is_feature_name(name) {
                    return Err(ValueError::new(
                        format!("{name:?} is not a feature name"),
                        FEATURE_NAME_RULE,
                    ));
                }
                vec![vec![name.clone()]]
            }
            ConstraintExpr::And { items } => {
                let mut out = Vec::new();
                for i in items {
                    out.extend(self.cnf(i)?);
                }
                out
            }
            ConstraintExpr::Or { items, .. } => {
                // (A1 & A2) | (B1 & B2) = (A1|B1) & (A1|B2) & (A2|B1) & (A2|B2).
                let mut out: Vec<Vec<String>> = vec![Vec::new()];
                for i in items {
                    let alt = self.cnf(i)?;
                    if out.len().saturating_mul(alt.len()) > MAX_EXPANDED_CLAUSES {
                        return Err(too_complex(out.len().saturating_mul(alt.len())));
                    }
                    out = out
                        .iter()
                        .flat_map(|c| {
                            alt.iter().map(move |a| {
                                let mut c = c.clone();
                                c.extend(a.iter().cloned());
                                c
                            })
                        })
                        .collect();
                }
                out
            }
            // Excluded by `only_features`.
            ConstraintExpr::Compare { .. } => Vec::new(),
        })
    }

    fn compare(&mut self, key: &str, cmp: &str, value: &str) -> Result<(), ValueError> {
        let ge = cmp == ">=";
        match key {
            "gpu_type" if !ge => {
                self.fields.insert("gpuType".into(), json!(value));
            }
            "gpu_count" => {
                let n = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| {
                        ValueError::new(
                            format!("gpu_count {value:?} is not a GPU count (1-64)"),
                            "write e.g. \"gpu_count=4\"",
                        )
                    })?;
                self.fields.insert("gpuCount".into(), json!(n));
            }
            "memory_gb" => {
                let v = value.trim_end_matches(['G', 'g', 'B', 'b']);
                let n = v.parse::<u64>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                    ValueError::new(
                        format!("memory_gb {value:?} is not a number of GB"),
                        "write e.g. \"memory_gb>=512\"",
                    )
                })?;
                self.fields.insert("memoryGb".into(), json!(n));
            }
            "topology" if !ge => match value {
                "tight" | "any" => {
                    self.fields.insert("topology".into(), json!(value));
                }
                _ => {
                    return Err(ValueError::new(
                        format!("topology {value:?} is unknown"),
                        "use topology=tight or topology=any",
                    ))
                }
            },
            k if BOOL_KEYS.contains(&k) && !ge => match value {
                "true" | "yes" | "1" => {
                    self.fields.insert(camel(k), json!(true));
                }
                "false" | "no" | "0" => {
                    self.fields.remove(&camel(k));
                }
                _ => {
                    return Err(ValueError::new(
                        format!("{k}={value:?} is not a boolean"),
                        format!("write {k}=true or just {k}"),
                    ))
                }
            },
            k => {
                return Err(ValueError::new(
                    format!("'{k}{cmp}{value}' is not a supported constraint"),
                    format!("keys are {CONSTRAINT_KEYS} (only gpu_count and memory_gb take >=); plain features have no '='"),
                ))
            }
        }
        Ok(())
    }
}

/// Whether an expression holds node features only (no `key=value`, no Lattice flag).
fn only_features(e: &ConstraintExpr) -> bool {
    match e {
        ConstraintExpr::Feature { name, .. } => !BOOL_KEYS.contains(&name.as_str()),
        ConstraintExpr::Compare { .. } => false,
        ConstraintExpr::And { items } | ConstraintExpr::Or { items, .. } => {
            items.iter().all(only_features)
        }
    }
}

/// Clauses → (`features`, `anyOf`): one-feature clauses are required features; a clause
/// holding a required feature, or a superset of another clause, is implied and dropped.
/// Order follows the expression.
fn simplify(clauses: Vec<Vec<String>>) -> Result<(Vec<String>, Vec<Vec<String>>), ValueError> {
    let clauses: Vec<Vec<String>> = clauses
        .into_iter()
        .map(|c| {
            let mut seen = Vec::with_capacity(c.len());
            for f in c {
                if !seen.contains(&f) {
                    seen.push(f);
                }
            }
            seen
        })
        .collect();
    let mut features: Vec<String> = Vec::new();
    for c in clauses.iter().filter(|c| c.len() == 1) {
        if !features.contains(&c[0]) {
            features.push(c[0].clone());
        }
    }
    let open: Vec<&Vec<String>> = clauses
        .iter()
        .filter(|c| !c.iter().any(|f| features.contains(f)))
        .collect();
    let subset = |a: &Vec<String>, b: &Vec<String>| a.iter().all(|f| b.contains(f));
    let mut any_of: Vec<Vec<String>> = Vec::new();
    for (i, c) in open.iter().enumerate() {
        // Implied by a smaller clause, or by an equal one that comes first.
        let implied = open
            .iter()
            .enumerate()
            .any(|(j, d)| j != i && subset(d, c) && (d.len() < c.len() || (subset(c, d) && j < i)));
        if !implied {
            any_of.push((*c).clone());
        }
    }
    if any_of.len() > MAX_ANY_OF_GROUPS {
        return Err(too_complex(any_of.len()));
    }
    if let Some(c) = any_of.iter().find(|c| c.len() > MAX_ANY_OF_ALTERNATIVES) {
        return Err(ValueError::new(
            format!(
                "one group of alternatives has {} features; Lattice allows {MAX_ANY_OF_ALTERNATIVES}",
                c.len()
            ),
            "list fewer alternatives",
        ));
    }
    Ok((features, any_of))
}

fn too_complex(groups: usize) -> ValueError {
    ValueError::new(
        format!(
            "the alternatives expand to {groups} groups of features (every node needs one feature of each group); Lattice allows {MAX_ANY_OF_GROUPS}"
        ),
        "simplify the expression: take features every node needs out of the alternatives, e.g. \"nvme&(a100|h100)\" rather than \"nvme&a100|nvme&h100\" with more terms",
    )
}

/// `require_unified_memory` → `requireUnifiedMemory`.
fn camel(s: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for c in s.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.push(c.to_ascii_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// An expression as the user would write it.
pub fn expr_text(e: &ConstraintExpr) -> String {
    match e {
        ConstraintExpr::Feature {
            name,
            count: Some(n),
        } => format!("{name}*{n}"),
        ConstraintExpr::Feature { name, count: None } => name.clone(),
        ConstraintExpr::Compare { key, cmp, value } => format!("{key}{cmp}{value}"),
        ConstraintExpr::And { items } => items.iter().map(expr_text).collect::<Vec<_>>().join("&"),
        ConstraintExpr::Or { items, .. } => format!(
            "({})",
            items.iter().map(expr_text).collect::<Vec<_>>().join("|")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::parse_constraint;

    fn shape(s: &str) -> (Value, Value, Vec<String>) {
        let b = build(&parse_constraint(s).expect("parses"), true).expect("builds");
        (
            b.fields.get("features").cloned().unwrap_or(Value::Null),
            b.fields.get("anyOf").cloned().unwrap_or(Value::Null),
            b.notes,
        )
    }

    #[test]
    fn alternatives_become_any_of_groups() {
        assert_eq!(shape("a|b"), (Value::Null, json!([["a", "b"]]), vec![]));
        assert_eq!(
            shape("nvme&(a100|h100)"),
            (json!(["nvme"]), json!([["a100", "h100"]]), vec![])
        );
        // '&' binds tighter than '|': distributed into one group per pair.
        assert_eq!(
            shape("gpu&ib|cpu"),
            (Value::Null, json!([["gpu", "cpu"], ["ib", "cpu"]]), vec![])
        );
        assert_eq!(
            shape("(a|b)&(c|d)"),
            (Value::Null, json!([["a", "b"], ["c", "d"]]), vec![])
        );
    }

    #[test]
    fn implied_groups_are_dropped() {
        // `a` is required, so `a|b` holds on every node that qualifies.
        assert_eq!(shape("a&(a|b)"), (json!(["a"]), Value::Null, vec![]));
        // The same group twice, in another order, and a superset of it.
        assert_eq!(
            shape("(a|b)&(b|a)&(a|b|c)"),
            (Value::Null, json!([["a", "b"]]), vec![])
        );
        assert_eq!(shape("a|a"), (json!(["a"]), Value::Null, vec![]));
    }

    #[test]
    fn brackets_warn_only_for_several_nodes() {
        let (_, any_of, notes) = shape("[a100|h100]");
        assert_eq!(any_of, json!([["a100", "h100"]]));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("may mix them across nodes"), "{notes:?}");
        let one = build(&parse_constraint("[a100|h100]").expect("parses"), false).expect("b");
        assert!(one.notes.is_empty(), "{:?}", one.notes);
    }

    #[test]
    fn alternatives_of_other_keys_keep_the_first() {
        let b = build(
            &parse_constraint("gpu_type=GH200|gpu_type=MI300A").expect("parses"),
            true,
        )
        .expect("builds");
        assert_eq!(b.fields["gpuType"], "GH200");
        assert!(
            b.notes[0].contains("dropping \"gpu_type=MI300A\""),
            "{:?}",
            b.notes
        );
    }

    #[test]
    fn expansion_is_bounded() {
        let side = |p: &str| {
            (0..5)
                .map(|i| format!("{p}{i}"))
                .collect::<Vec<_>>()
                .join("&")
        };
        // 5 × 5 = 25 groups after distribution: over the API's 16.
        let e = parse_constraint(&format!("{}|{}", side("a"), side("b"))).expect("parses");
        let err = build(&e, true).expect_err("too many groups");
        assert!(err.message.contains("25 groups"), "{err}");
        let many = (0..17)
            .map(|i| format!("f{i}"))
            .collect::<Vec<_>>()
            .join("|");
        let err = build(&parse_constraint(&many).expect("parses"), true).expect_err("17");
        assert!(err.message.contains("17 features"), "{err}");
        // Many small alternatives joined by `&`: refused once the clauses pass the bound,
        // before the pairwise simplification could take long.
        let wide = (0..300)
            .map(|i| format!("(x{i}|y{i})"))
            .collect::<Vec<_>>()
            .join("&");
        let err = build(&parse_constraint(&wide).expect("parses"), true).expect_err("300");
        assert!(err.message.contains("257 groups"), "{err}");
    }
}
