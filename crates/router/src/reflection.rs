//! gRPC server reflection for the `cellfleet.v1` services, so `grpcurl` and other tools can discover the API.

use tonic_reflection::server::v1::{ServerReflection, ServerReflectionServer};

/// The reflection service (v1 protocol) describing every `cellfleet.v1` file.
pub fn reflection_service(
) -> Result<ServerReflectionServer<impl ServerReflection>, tonic_reflection::server::Error> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(cellfleet_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
}
