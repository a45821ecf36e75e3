//! Compiles the repository's `proto/` files with protox (pure Rust, no `protoc` needed) and generates prost/tonic code plus the descriptor set served by reflection.

use std::path::PathBuf;

use prost::Message;

/// The API files, relative to `proto/`.
const FILES: &[&str] = &[
    "cellfleet/v1/envelope.proto",
    "cellfleet/v1/errors.proto",
    "cellfleet/v1/client.proto",
    "cellfleet/v1/peer.proto",
    "cellfleet/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_dir = manifest_dir.join("../../proto");
    println!("cargo:rerun-if-changed={}", proto_dir.display());
    for file in FILES {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }
    let descriptors = protox::compile(FILES, [&proto_dir])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("cellfleet_v1_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
