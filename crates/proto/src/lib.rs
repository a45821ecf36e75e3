//! The `cellfleet.v1` gRPC API: generated messages, clients and servers, and the descriptor set for server reflection.
//!
//! The `.proto` files live in the repository's top-level `proto/` folder and
//! are the reference for other languages (the signing rule is documented in
//! `proto/cellfleet/v1/envelope.proto`). This crate holds generated code only.

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

/// Package `cellfleet.v1`.
pub mod v1 {
    tonic::include_proto!("cellfleet.v1");
}

/// The encoded `FileDescriptorSet` of every `cellfleet.v1` file, for
/// `tonic_reflection::server::Builder::register_encoded_file_descriptor_set`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/cellfleet_v1_descriptor.bin"));
