//! Status conditions, Kubernetes style: `lastTransitionTime` moves only when the
//! status flips, and every condition records the generation it was computed from.

use lattice_apis::{Condition, ConditionStatus};

/// Set condition `type_` to `status`, stamping `observedGeneration`. Returns whether
/// anything but timestamps changed (i.e. whether a status write is needed).
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> bool {
    let mut c = Condition::new(type_, status, reason, message);
    c.observed_generation = observed_generation;
    let changed = match get(conditions, type_) {
        Some(old) => {
            old.status != c.status
                || old.reason != c.reason
                || old.message != c.message
                || old.observed_generation != c.observed_generation
        }
        None => true,
    };
    if changed {
        lattice_apis::meta::set_condition(conditions, c);
    }
    changed
}

/// The condition of this type, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True)
}

/// Whether the condition is `True` *and* was computed from `generation` (not stale).
pub fn is_true_for(conditions: &[Condition], type_: &str, generation: Option<i64>) -> bool {
    get(conditions, type_)
        .is_some_and(|c| c.status == ConditionStatus::True && c.observed_generation == generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_flip() {
        let mut cs = Vec::new();
        assert!(set(
            &mut cs,
            "Ready",
            ConditionStatus::False,
            "Starting",
            "",
            Some(1)
        ));
        let t0 = cs[0].last_transition_time;
        assert!(!set(
            &mut cs,
            "Ready",
            ConditionStatus::False,
            "Starting",
            "",
            Some(1)
        ));
        assert!(set(
            &mut cs,
            "Ready",
            ConditionStatus::False,
            "Waiting",
            "x",
            Some(2)
        ));
        assert_eq!(cs[0].last_transition_time, t0);
        assert_eq!(cs[0].observed_generation, Some(2));
        assert!(set(
            &mut cs,
            "Ready",
            ConditionStatus::True,
            "Up",
            "",
            Some(2)
        ));
        assert!(is_true(&cs, "Ready"));
        assert!(is_true_for(&cs, "Ready", Some(2)));
        assert!(!is_true_for(&cs, "Ready", Some(3)));
        assert_eq!(cs.len(), 1);
    }
}
