//! The checked-in `docs/openapi.json` is exactly what the code generates
//! from the contract. When this fails, run `make openapi` and commit.

#[test]
fn checked_in_document_matches_the_contract() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let checked_in = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {path}: {e}; run `make openapi`"));
    let generated = taskmesh_gateway::openapi::render(
        &taskmesh_gateway::openapi::document().expect("the document builds"),
    );
    assert!(
        checked_in == generated,
        "docs/openapi.json is out of date with proto/: run `make openapi` and commit the result"
    );
}
