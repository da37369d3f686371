//! What checking a submit's request rules costs: a `SubmitTasks` body of
//! 1,000 tasks as the bench sends them, checked whole (`RequestRules::check`),
//! and its parts: decoding the body as a `DynamicMessage`, and decoding it
//! as the typed message the service reads anyway.
//! Run with `make bench` or `cargo bench -p taskmesh-dispatcher --bench rules`.

use divan::Bencher;
use prost::Message;
use prost_reflect::DynamicMessage;
use taskmesh::v1 as pb;
use taskmesh_dispatcher::rules::RequestRules;

const SUBMIT: &str = "/taskmesh.v1.TaskApi/SubmitTasks";
const TASKS: usize = 1_000;

fn main() {
    divan::main();
}

/// A gRPC frame of `SubmitTasks` with `TASKS` echo tasks.
fn body() -> Vec<u8> {
    let request = pb::SubmitTasksRequest {
        tasks: (0..TASKS)
            .map(|i| pb::SubmitTaskRequest {
                handler: "echo".into(),
                payload: Some(pb::Payload {
                    data: b"{}".to_vec(),
                    content_type: "application/json".into(),
                }),
                client_request_id: format!("bench-{i}"),
                ..Default::default()
            })
            .collect(),
    };
    let message = request.encode_to_vec();
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    frame
}

#[divan::bench(items_count = TASKS)]
fn check_whole(bencher: Bencher) {
    let rules = RequestRules::load().expect("the contract loads");
    let body = body();
    assert!(rules.check(SUBMIT, &body).is_ok());
    bencher.bench_local(|| rules.check(SUBMIT, divan::black_box(&body)));
}

#[divan::bench(items_count = TASKS)]
fn decode_dynamic(bencher: Bencher) {
    let rules = RequestRules::load().expect("the contract loads");
    let input = rules.input(SUBMIT).expect("SubmitTasks").clone();
    let body = body();
    bencher.bench_local(|| DynamicMessage::decode(input.clone(), divan::black_box(&body[5..])));
}

#[divan::bench(items_count = TASKS)]
fn decode_typed(bencher: Bencher) {
    let body = body();
    bencher.bench_local(|| pb::SubmitTasksRequest::decode(divan::black_box(&body[5..])));
}
