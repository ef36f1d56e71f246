//! Golden corpus: every `tests/corpus/*.sh` must translate (with the site
//! mapping in common/mod.rs), pass API admission, warn once for every
//! unsupported directive, and match `<name>.golden.json`.
//!
//! Regenerate the golden files with `UPDATE_GOLDEN=1 cargo test -p lattice-compat --test corpus`.

mod common;
use common::*;

use std::path::{Path, PathBuf};

use lattice_compat::directives::scan_script;
use lattice_compat::translate::unsupported_reason;
use lattice_compat::{translate, SubmitFlags};
use serde_json::json;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn scripts() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("corpus dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "sh"))
        .collect();
    v.sort();
    v
}

#[test]
fn corpus_has_at_least_30_scripts() {
    assert!(scripts().len() >= 30, "only {} scripts", scripts().len());
}

#[test]
fn corpus_matches_golden() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut failures = Vec::new();
    for path in scripts() {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let text = std::fs::read_to_string(&path).expect("read script");
        let f = SubmitFlags {
            script_name: Some(name.clone()),
            ..flags()
        };
        let t = match translate(&text, &f, &site()) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: translation failed: {e}"));
                continue;
            }
        };
        admit(&t);

        // Every unsupported #SBATCH option in the header has exactly one warning on its line.
        let d = scan_script(&text).expect("scan");
        for o in d
            .options
            .iter()
            .filter(|o| unsupported_reason(&o.name).is_some())
        {
            let n = t
                .warnings
                .iter()
                .filter(|w| w.source == o.source && w.option == o.written)
                .count();
            if n != 1 {
                failures.push(format!(
                    "{name}: {} on {} has {n} warnings",
                    o.written, o.source
                ));
            }
        }

        let mut alloc = t.allocation.clone();
        // Keep golden files short: the script text is the input itself.
        alloc["spec"]["script"] = json!(format!("<{} bytes>", text.len()));
        let got = json!({
            "allocation": alloc,
            "warnings": t.warnings.iter().map(|w| w.with_location()).collect::<Vec<_>>(),
            "client": t.client,
        });
        let golden = path.with_extension("golden.json");
        let pretty = serde_json::to_string_pretty(&got).expect("json") + "\n";
        if update {
            std::fs::write(&golden, &pretty).expect("write golden");
            continue;
        }
        match std::fs::read_to_string(&golden) {
            Ok(want) if want == pretty => {}
            Ok(want) => failures.push(format!(
                "{name}: differs from {}\n--- want\n{want}\n--- got\n{pretty}",
                golden.display()
            )),
            Err(_) => failures.push(format!(
                "{name}: missing {} (run with UPDATE_GOLDEN=1)",
                golden.display()
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
