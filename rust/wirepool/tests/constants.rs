//! The parent's error codes (`wirepool::codes`, `Error::code`) against `spec/constants.json`
//! (PROTOCOL.md section 18). Its defaults are checked by `config.rs`'s own unit test.

use std::path::PathBuf;

use serde_json::Value;
use wirepool::codes;

fn spec_code(c: &Value, name: &str) -> u32 {
    c["error_codes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["code"].as_u64())
        .unwrap_or_else(|| panic!("{name} is not in spec/constants.json")) as u32
}

#[test]
fn codes_are_the_spec_codes() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/constants.json");
    let c: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ours = [
        ("PROTOCOL", codes::PROTOCOL),
        ("CODEC_MISMATCH", codes::CODEC_MISMATCH),
        ("UNKNOWN_METHOD", codes::UNKNOWN_METHOD),
        ("CODEC_UNSUPPORTED", codes::CODEC_UNSUPPORTED),
        ("BAD_REQUEST", codes::BAD_REQUEST),
        ("HANDLER_ERROR", codes::HANDLER_ERROR),
        ("HANDLER_PANIC", codes::HANDLER_PANIC),
        ("CANCELLED", codes::CANCELLED),
        ("DEADLINE_EXCEEDED", codes::DEADLINE_EXCEEDED),
        ("OVERLOADED", codes::OVERLOADED),
        ("DRAINING", codes::DRAINING),
        ("ROW_TOO_LARGE", codes::ROW_TOO_LARGE),
        ("WORKER_EXITED", codes::WORKER_EXITED),
        ("WORKER_HUNG", codes::WORKER_HUNG),
        ("STARTUP_TIMEOUT", codes::STARTUP_TIMEOUT),
        ("SPAWN_FAILED", codes::SPAWN_FAILED),
        ("POOL_CLOSED", codes::POOL_CLOSED),
        ("LEASE_LOST", codes::LEASE_LOST),
        ("DECODE_FAILED", codes::DECODE_FAILED),
        ("PROTOCOL_VIOLATION", codes::PROTOCOL_VIOLATION),
        ("INVALID_ARGUMENT", codes::INVALID_ARGUMENT),
        ("MESSAGE_TOO_LARGE", codes::MESSAGE_TOO_LARGE),
    ];
    for (name, code) in ours {
        assert_eq!(code, spec_code(&c, name), "{name}");
    }
    // Every local outcome (3xx) a parent raises has its constant here.
    let local: Vec<&str> = c["error_codes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["class"] == "local")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for name in local {
        assert!(
            ours.iter().any(|(n, _)| *n == name),
            "codes::{name} is missing"
        );
    }
}
