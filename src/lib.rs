//! The taskmesh contract: the Rust code generated from `proto/` and the
//! encoded descriptor set. Everything in `crates/` implements this contract;
//! this crate holds no behaviour of its own beyond the wire's (the codec,
//! batching on a Connect stream) and must never depend on them.

/// `taskmesh.v1`: tasks, the `TaskApi`, `Dispatcher` and `Worker` services.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("taskmesh.v1");
}

/// `google.api`: the HTTP annotations the REST gateway reads.
pub mod google_api {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("google.api");
}

pub mod batch;
pub mod codec;

/// The encoded `FileDescriptorSet` of every file in `proto/` (imports
/// included, source info and `google.api.http` options kept), for server
/// reflection and the REST gateway.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/taskmesh_descriptor.bin"));
