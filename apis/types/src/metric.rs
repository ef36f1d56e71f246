//! The metric of a reactive allocation's scale policy: a Prometheus metric name with
//! optional label matchers, `gpu_utilization` or `queue_depth{queue="inference"}`. Only
//! this form is accepted (no functions, no operators): the autoscaler always adds the
//! allocation's own matchers (`lattice_allocation`, `lattice_tenant`), so a tenant can
//! read only series labelled as its own allocation's.

/// Labels the autoscaler sets itself; a policy may not match on them.
pub const SCOPE_LABELS: [&str; 2] = ["lattice_allocation", "lattice_tenant"];

/// A parsed metric selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricSelector {
    /// The metric name.
    pub name: String,
    /// `(label, operator, value)`; operator is `=`, `!=`, `=~` or `!~`; the value
    /// unescaped.
    pub matchers: Vec<(String, String, String)>,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

const HINT: &str = "write a metric name with optional label matchers, e.g. gpu_utilization or queue_depth{queue=\"inference\"}";

impl MetricSelector {
    /// Parses `name` or `name{label="value", ...}`; the error says what is wrong and how
    /// to write it.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let name_end = s.find('{').unwrap_or(s.len());
        let name = &s[..name_end];
        let mut chars = name.chars();
        if !chars.next().is_some_and(is_name_start) || !chars.all(is_name_char) {
            return Err(format!("{name:?} is not a metric name; {HINT}"));
        }
        let mut matchers = Vec::new();
        if name_end < s.len() {
            let body = s[name_end + 1..]
                .strip_suffix('}')
                .ok_or_else(|| format!("the label matchers must end with '}}'; {HINT}"))?;
            let mut rest = body.trim();
            while !rest.is_empty() {
                let label_len = rest
                    .char_indices()
                    .find(|(i, c)| {
                        !(if *i == 0 {
                            c.is_ascii_alphabetic() || *c == '_'
                        } else {
                            c.is_ascii_alphanumeric() || *c == '_'
                        })
                    })
                    .map_or(rest.len(), |(i, _)| i);
                if label_len == 0 {
                    return Err(format!("expected a label name at {rest:?}; {HINT}"));
                }
                let label = &rest[..label_len];
                if SCOPE_LABELS.contains(&label) {
                    return Err(format!(
                        "label {label} is set by Lattice (the allocation's own series); remove that matcher"
                    ));
                }
                rest = rest[label_len..].trim_start();
                let op = ["=~", "!~", "!=", "="]
                    .into_iter()
                    .find(|op| rest.starts_with(op))
                    .ok_or_else(|| format!("expected =, !=, =~ or !~ after {label}; {HINT}"))?;
                rest = rest[op.len()..].trim_start();
                let quote = rest
                    .chars()
                    .next()
                    .filter(|c| *c == '"' || *c == '\'')
                    .ok_or_else(|| format!("the value of {label} must be quoted; {HINT}"))?;
                let mut value = String::new();
                let mut escaped = false;
                let mut end = None;
                for (i, c) in rest.char_indices().skip(1) {
                    if escaped {
                        value.push(match c {
                            'n' => '\n',
                            other => other,
                        });
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == quote {
                        end = Some(i);
                        break;
                    } else {
                        value.push(c);
                    }
                }
                let end =
                    end.ok_or_else(|| format!("the value of {label} is not closed; {HINT}"))?;
                matchers.push((label.to_string(), op.to_string(), value));
                rest = rest[end + 1..].trim_start();
                if let Some(r) = rest.strip_prefix(',') {
                    rest = r.trim_start();
                } else if !rest.is_empty() {
                    return Err(format!(
                        "expected ',' between label matchers at {rest:?}; {HINT}"
                    ));
                }
            }
        }
        Ok(Self {
            name: name.to_string(),
            matchers,
        })
    }

    /// The PromQL selector with `scope` matchers added (values escaped).
    pub fn to_promql(&self, scope: &[(&str, &str)]) -> String {
        let esc = |v: &str| {
            v.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        };
        let all: Vec<String> = self
            .matchers
            .iter()
            .map(|(l, op, v)| format!("{l}{op}\"{}\"", esc(v)))
            .chain(scope.iter().map(|(l, v)| format!("{l}=\"{}\"", esc(v))))
            .collect();
        format!("{}{{{}}}", self.name, all.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_matchers() {
        let m = MetricSelector::parse("gpu_utilization").unwrap();
        assert_eq!(
            m.to_promql(&[("lattice_allocation", "svc")]),
            "gpu_utilization{lattice_allocation=\"svc\"}"
        );
        let m = MetricSelector::parse(r#" queue_depth{queue="inf\"x", zone!~'a|b'} "#).unwrap();
        assert_eq!(
            m.to_promql(&[("lattice_tenant", "t")]),
            r#"queue_depth{queue="inf\"x",zone!~"a|b",lattice_tenant="t"}"#
        );
        for bad in [
            "",
            "1abc",
            "rate(x[5m])",
            "a/b",
            "x y",
            "x{a=b}",
            "x{a=\"b\"",
            "x{a=\"b\" c=\"d\"}",
            "x{lattice_tenant=\"other\"}",
            "sum(x)",
        ] {
            assert!(MetricSelector::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
