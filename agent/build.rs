//! Compiles `proto/pmi.proto` (the agents' PMI fence) with protox, a pure-Rust protobuf
//! compiler, so no `protoc` is needed; with the `pmix` feature, also the C side of the
//! PMIx sidecar (`pmix/glue.c`) against OpenPMIx, found by `pkg-config pmix`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/pmi.proto");
    let fds = protox::compile(["proto/pmi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    #[cfg(feature = "pmix")]
    pmix()?;
    Ok(())
}

/// `pkg-config ARGS pmix`, split into words.
#[cfg(feature = "pmix")]
fn pkg_config(args: &[&str]) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let out = std::process::Command::new("pkg-config")
        .args(args)
        .arg("pmix")
        .output()
        .map_err(|e| {
            format!("the pmix feature needs pkg-config and libpmix-dev (hack/install-deps.sh): {e}")
        })?;
    if !out.status.success() {
        return Err(format!(
            "pkg-config {} pmix failed: {} (install libpmix-dev: hack/install-deps.sh)",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8(out.stdout)?
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

#[cfg(feature = "pmix")]
fn pmix() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=pmix/glue.c");
    let mut build = cc::Build::new();
    build
        .file("pmix/glue.c")
        .warnings(true)
        .extra_warnings(true);
    for flag in pkg_config(&["--cflags"])? {
        if let Some(dir) = flag.strip_prefix("-I") {
            build.include(dir);
        }
    }
    build.compile("lattice_pmix_glue");
    for flag in pkg_config(&["--libs"])? {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
            // The library's own directory is searched at run time too (as its .pc asks).
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={lib}");
        }
    }
    Ok(())
}
