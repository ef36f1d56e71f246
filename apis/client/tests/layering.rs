//! The layering the crates promise: what links the client links neither the server nor
//! the store. A dependency added against it fails here, naming the crate.

use std::path::Path;

/// The `lattice-*` crates in the `[dependencies]` table of a manifest (dev-dependencies
/// may be anything: tests run against the real server).
fn lattice_dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).expect("read manifest");
    let mut in_deps = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && line.starts_with("lattice-") {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
            out.push(name.to_string());
        }
    }
    out.sort();
    out
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("repository root")
}

#[test]
fn the_client_depends_on_the_api_types_only() {
    let deps = lattice_dependencies(&repo().join("apis/client/Cargo.toml"));
    assert_eq!(
        deps,
        ["lattice-apis"],
        "lattice-client's lattice dependencies"
    );
}

#[test]
fn the_controller_runtime_depends_on_the_client_and_the_api_types_only() {
    let deps = lattice_dependencies(&repo().join("controllers/runtime/Cargo.toml"));
    assert_eq!(
        deps,
        ["lattice-apis", "lattice-client"],
        "lattice-runtime's lattice dependencies: a controller, an agent or a site \
         controller must not link the API server or the store"
    );
}

#[test]
fn the_manifest_reader_sees_a_forbidden_dependency() {
    let dir = std::env::temp_dir().join(format!("layering-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let manifest = dir.join("Cargo.toml");
    std::fs::write(
        &manifest,
        "[package]\nname = \"x\"\n\n[dependencies]\nlattice-apis.workspace = true\n\
         lattice-store = { workspace = true }\n\n[dev-dependencies]\nlattice-apiserver.workspace = true\n",
    )
    .expect("write");
    assert_eq!(
        lattice_dependencies(&manifest),
        ["lattice-apis", "lattice-store"]
    );
    std::fs::remove_dir_all(&dir).ok();
}
