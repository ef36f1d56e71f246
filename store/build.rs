//! Compiles `proto/raft.proto` (the Raft transport) with protox, a pure-Rust protobuf
//! compiler, so no `protoc` is needed for our own protos.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/raft.proto");
    let fds = protox::compile(["proto/raft.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
