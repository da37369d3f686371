//! Compiles `proto/` with protox (no protoc needed) and tonic-prost-build.
//!
//! The runtime descriptor set is written with `encode_file_descriptor_set()`
//! straight from protox: re-encoding prost-types' copy would drop the
//! `google.api.http` options the REST gateway is built from.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/taskmesh/v1/task.proto",
        "proto/taskmesh/v1/logs.proto",
        "proto/taskmesh/v1/schedule.proto",
        "proto/taskmesh/v1/workflow.proto",
        "proto/taskmesh/v1/task_api.proto",
        "proto/taskmesh/v1/dispatcher.proto",
        "proto/taskmesh/v1/worker.proto",
        "proto/taskmesh/v1/admin.proto",
        "proto/taskmesh/options/v1/options.proto",
    ];
    println!("cargo:rerun-if-changed=proto");

    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_source_info(true);
    compiler.include_imports(true);
    compiler.open_files(files)?;

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("taskmesh_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // `Dispatcher.Connect` would clash with the generated `connect(dst)`
        // constructor; clients are built with `new(channel)` instead.
        .build_transport(false)
        // prost's codec, but an undecodable message is INVALID_ARGUMENT.
        .codec_path("crate::codec::Codec")
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
