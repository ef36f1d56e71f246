//! Slurm names as Lattice names.
//!
//! Tenants and vClusters are DNS-1123 labels: lower-case letters, digits and `-`,
//! starting and ending with a letter or digit, at most 63 characters. Slurm accounts and
//! partitions often are not (`proj_1234`, `ABC-DEF99`, `gpu_long`). When the site
//! mapping (`lattice-compat.yaml`) does not name such an account or partition, the
//! translator uses the label [`label_from`] makes of it and says so in a warning, so a
//! centre's scripts run unchanged; a mapping chooses another name.
//!
//! ```
//! use lattice_compat::names::label_from;
//!
//! assert_eq!(label_from("proj_1234").as_deref(), Some("proj-1234"));
//! assert_eq!(label_from("ABC-DEF99").as_deref(), Some("abc-def99"));
//! assert_eq!(label_from("__"), None);
//! ```

pub use lattice_apis::validation::is_dns1123_label;

/// Longest DNS-1123 label.
pub const MAX_LABEL_LEN: usize = 63;

/// The DNS-1123 label made of `name`: ASCII letters lower-cased, every run of other
/// characters (`_`, `.`, spaces, non-ASCII) one `-`, no `-` at either end, at most 63
/// characters. `None` when nothing is left (no ASCII letter or digit).
pub fn label_from(name: &str) -> Option<String> {
    let mut out = String::with_capacity(name.len().min(MAX_LABEL_LEN));
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(MAX_LABEL_LEN);
    let out = out.trim_end_matches('-');
    (!out.is_empty()).then(|| out.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_names_become_labels() {
        for (slurm, label) in [
            ("proj_1234", "proj-1234"),
            ("ABC-DEF99", "abc-def99"),
            ("gpu_long", "gpu-long"),
            ("_lead__and.trail_", "lead-and-trail"),
            ("s1234", "s1234"),
            ("Müller", "m-ller"),
        ] {
            let got = label_from(slurm);
            assert_eq!(got.as_deref(), Some(label), "{slurm}");
            assert!(is_dns1123_label(label), "{label}");
        }
    }

    #[test]
    fn long_names_are_cut_to_a_valid_label() {
        let long = format!("{}_x", "a".repeat(62));
        let got = label_from(&long).expect("label");
        assert_eq!(got, "a".repeat(62), "the cut leaves no trailing '-'");
        assert!(is_dns1123_label(&got));
        assert_eq!(label_from(&"b".repeat(80)).map(|l| l.len()), Some(63));
    }

    #[test]
    fn names_without_letters_or_digits_have_no_label() {
        for name in ["", "_", "__", "-._", "ü"] {
            assert_eq!(label_from(name), None, "{name:?}");
        }
    }
}
