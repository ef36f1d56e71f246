//! `spec.weights`: cost-function weights by name (`Score(j) = Σ wᵢ·fᵢ(j)`).
//!
//! [`WEIGHT_TERMS`] is the one list of the weight names the API admits, with their older
//! spellings and the five profiles' values. The scheduling core registers one score term
//! per name (`lattice_scheduler::terms::REGISTRY`; a test of `lattice-controllers` checks
//! that the two lists agree). A name not in the list is refused at admission, naming the
//! field and listing the names that exist.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::WeightProfile;

/// One weight users may set.
#[derive(Debug, Clone, Copy)]
pub struct WeightTerm {
    /// The name under `spec.weights`.
    pub name: &'static str,
    /// Other accepted spellings (the seed's `wN`, older names), stored as `name`.
    pub aliases: &'static [&'static str],
    /// What the term measures.
    pub description: &'static str,
    /// Its weight in the profiles hpc-batch, ml-training, service, sensitive, interactive
    /// (the seed's "Weight Profiles" table).
    pub profiles: [f64; 5],
}

/// Every weight name, in the scheduling core's registry order.
pub const WEIGHT_TERMS: &[WeightTerm] = &[
    WeightTerm {
        name: "priority",
        aliases: &["w1"],
        description: "w₁: priority class.",
        profiles: [0.15, 0.10, 0.15, 0.90, 0.10],
    },
    WeightTerm {
        name: "waitTime",
        aliases: &["w2"],
        description: "w₂: wait time (anti-starvation).",
        profiles: [0.20, 0.10, 0.05, 0.00, 0.30],
    },
    WeightTerm {
        name: "fairShare",
        aliases: &["w3"],
        description: "w₃: fair-share deficit.",
        profiles: [0.20, 0.10, 0.10, 0.00, 0.10],
    },
    WeightTerm {
        name: "topology",
        aliases: &["w4"],
        description: "w₄: topology fitness.",
        profiles: [0.15, 0.25, 0.05, 0.00, 0.00],
    },
    WeightTerm {
        name: "dataReadiness",
        aliases: &["w5", "dataReady"],
        description: "w₅: data readiness.",
        profiles: [0.10, 0.15, 0.10, 0.00, 0.05],
    },
    WeightTerm {
        name: "backlog",
        aliases: &["w6"],
        description: "w₆: backlog pressure.",
        profiles: [0.05, 0.05, 0.05, 0.00, 0.15],
    },
    WeightTerm {
        name: "energy",
        aliases: &["w7"],
        description: "w₇: energy cost.",
        profiles: [0.00, 0.05, 0.10, 0.00, 0.00],
    },
    WeightTerm {
        name: "checkpointEfficiency",
        aliases: &["w8", "checkpoint"],
        description: "w₈: checkpoint efficiency.",
        profiles: [0.05, 0.10, 0.10, 0.00, 0.00],
    },
    WeightTerm {
        name: "conformance",
        aliases: &["w9"],
        description: "w₉: conformance fitness.",
        profiles: [0.10, 0.10, 0.30, 0.10, 0.30],
    },
];

/// The [`WEIGHT_TERMS`] entry a name or alias stands for.
pub fn weight_term(name: &str) -> Option<&'static WeightTerm> {
    WEIGHT_TERMS
        .iter()
        .find(|t| t.name == name || t.aliases.contains(&name))
}

/// The admitted weight names, comma-separated (for error messages).
pub fn known_weight_names() -> String {
    WEIGHT_TERMS
        .iter()
        .map(|t| t.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cost-function weights `name → value`, each 0–1; names a user leaves out come from the
/// profile. Aliases (`w1`..`w9`, `dataReady`, `checkpoint`) are stored under their names.
/// Names that are not weights are kept as written, so that admission can refuse them by
/// name ([`Weights::unknown`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Weights(BTreeMap<String, f64>);

impl Weights {
    /// The weight set for `name` (or an alias of it).
    pub fn get(&self, name: &str) -> Option<f64> {
        let canonical = weight_term(name).map_or(name, |t| t.name);
        self.0.get(canonical).copied()
    }

    /// Set a weight; an alias is stored under its name.
    pub fn set(&mut self, name: &str, value: f64) {
        let canonical = weight_term(name).map_or(name, |t| t.name);
        self.0.insert(canonical.to_string(), value);
    }

    /// Every weight set, admitted names in [`WEIGHT_TERMS`] order, then unknown names.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        let known = WEIGHT_TERMS
            .iter()
            .filter_map(|t| self.0.get(t.name).map(|v| (t.name, *v)));
        let unknown = self
            .0
            .iter()
            .filter(|(k, _)| weight_term(k).is_none())
            .map(|(k, v)| (k.as_str(), *v));
        known.chain(unknown)
    }

    /// Names set that are not weights.
    pub fn unknown(&self) -> impl Iterator<Item = &str> + '_ {
        self.0
            .keys()
            .map(String::as_str)
            .filter(|k| weight_term(k).is_none())
    }

    /// Whether no weight is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Fill unset weights from `profile`.
    pub fn fill_from(&mut self, profile: WeightProfile) {
        let column = profile.column();
        for t in WEIGHT_TERMS {
            self.0
                .entry(t.name.to_string())
                .or_insert(t.profiles[column]);
        }
    }
}

impl FromIterator<(&'static str, f64)> for Weights {
    fn from_iter<I: IntoIterator<Item = (&'static str, f64)>>(it: I) -> Self {
        let mut w = Weights::default();
        for (k, v) in it {
            w.set(k, v);
        }
        w
    }
}

impl Serialize for Weights {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.iter() {
            m.serialize_entry(k, &v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Weights {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Weights;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of weight names to numbers between 0 and 1")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Weights, A::Error> {
                let mut w = Weights::default();
                while let Some((k, v)) = map.next_entry::<String, Option<f64>>()? {
                    let canonical = weight_term(&k).map_or(k.as_str(), |t| t.name);
                    // As with the former struct, a name given twice (as itself and as an
                    // alias) is an error rather than a silent choice.
                    if w.0.contains_key(canonical) {
                        return Err(serde::de::Error::custom(format!(
                            "weight {canonical:?} is given twice (as {k:?} and under another spelling)"
                        )));
                    }
                    if let Some(v) = v {
                        w.0.insert(canonical.to_string(), v);
                    }
                }
                Ok(w)
            }
        }
        d.deserialize_map(V)
    }
}

impl JsonSchema for Weights {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Weights".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let properties: serde_json::Map<String, serde_json::Value> = WEIGHT_TERMS
            .iter()
            .map(|t| {
                (
                    t.name.to_string(),
                    serde_json::json!({
                        "description": t.description,
                        "format": "double",
                        "type": ["number", "null"],
                    }),
                )
            })
            .collect();
        schemars::json_schema!({
            "description": "Cost-function weights w₁..w₉ (`Score(j) = Σ wᵢ·fᵢ(j)`), each 0–1. Unset\nweights are filled from the profile. Aliases `w1`..`w9` are accepted.",
            "type": "object",
            "properties": properties,
            "additionalProperties": false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_stored_under_their_names() {
        let w: Weights =
            serde_yaml::from_str("w1: 0.3\ndataReady: 0.2\ncheckpoint: 0.1\nwaitTime: 0.4")
                .expect("weights");
        assert_eq!(w.get("priority"), Some(0.3));
        assert_eq!(w.get("dataReadiness"), Some(0.2));
        assert_eq!(w.get("checkpointEfficiency"), Some(0.1));
        assert_eq!(
            serde_json::to_string(&w).expect("json"),
            r#"{"priority":0.3,"waitTime":0.4,"dataReadiness":0.2,"checkpointEfficiency":0.1}"#
        );
        assert!(w.unknown().next().is_none());
    }

    #[test]
    fn a_name_given_twice_is_refused() {
        let e = serde_yaml::from_str::<Weights>("w1: 0.3\npriority: 0.2").unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    #[test]
    fn unknown_names_are_kept_for_admission_to_name() {
        let w: Weights = serde_yaml::from_str("speed: 0.3").expect("weights");
        assert_eq!(w.unknown().collect::<Vec<_>>(), ["speed"]);
    }
}
