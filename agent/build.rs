//! Compiles `proto/pmi.proto` (the agents' PMI fence) with protox, a pure-Rust protobuf
//! compiler, so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/pmi.proto");
    let fds = protox::compile(["proto/pmi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
