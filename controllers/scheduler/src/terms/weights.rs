//! [`CostWeights`]: weight name → value, stored by registry position.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{index_of, REGISTRY};

/// The wᵢ of `Score(j) = Σ wᵢ·fᵢ(j)`, one per registered term. Read and written by name
/// (YAML: a map of weight names); held in registry order, so scoring never looks a name up.
/// A map that leaves a term out gives it the [`Default`] baseline's weight.
#[derive(Clone, PartialEq)]
pub struct CostWeights {
    values: Vec<f64>,
}

/// A weight name no registered term answers to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown weight {name:?}; known weights: {}", super::names().collect::<Vec<_>>().join(", "))]
pub struct UnknownWeight {
    pub name: String,
}

impl CostWeights {
    /// Every weight 0.
    pub fn zero() -> Self {
        CostWeights {
            values: vec![0.0; REGISTRY.len()],
        }
    }

    /// The seed's nine weights w₁..w₉ in the seed's order; later terms get 0.
    pub fn seed(w: [f64; 9]) -> Self {
        let mut out = CostWeights::zero();
        out.values[..9].copy_from_slice(&w);
        out
    }

    /// The weight of the term named `name` (or one of its aliases).
    pub fn get(&self, name: &str) -> Option<f64> {
        index_of(name).map(|i| self.values[i])
    }

    /// Set the weight of the term named `name` (or one of its aliases).
    pub fn set(&mut self, name: &str, value: f64) -> Result<(), UnknownWeight> {
        let i = index_of(name).ok_or_else(|| UnknownWeight {
            name: name.to_string(),
        })?;
        self.values[i] = value;
        Ok(())
    }

    /// Weights in registry order.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// `(name, weight)` in registry order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        REGISTRY
            .iter()
            .map(|t| t.name())
            .zip(self.values.iter().copied())
    }
}

impl Default for CostWeights {
    /// The seed's "balanced HPC" baseline (not identical to any named profile).
    fn default() -> Self {
        CostWeights::seed([0.20, 0.20, 0.20, 0.15, 0.10, 0.05, 0.00, 0.00, 0.10])
    }
}

impl fmt::Debug for CostWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for CostWeights {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.values.len()))?;
        for (k, v) in self.iter() {
            m.serialize_entry(k, &v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for CostWeights {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CostWeights;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of weight names to numbers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CostWeights, A::Error> {
                let mut w = CostWeights::default();
                while let Some((k, v)) = map.next_entry::<String, f64>()? {
                    w.set(&k, v).map_err(serde::de::Error::custom)?;
                }
                Ok(w)
            }
        }
        d.deserialize_map(V)
    }
}
