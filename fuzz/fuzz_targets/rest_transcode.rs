//! The REST transcoder: a method, a path with query and a body, routed and
//! transcoded both ways (JSON request → protobuf, protobuf answer → JSON).
//! Input: method, a NUL, the target, a NUL, the body.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == 0);
    let (Some(method), Some(target), body) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let Ok(target) = std::str::from_utf8(target) else {
        return;
    };
    taskmesh_gateway::fuzzing::transcode(method, target, body.unwrap_or_default());
});
