//! The core's constants against `spec/constants.json` (PROTOCOL.md section 18): frame types and
//! their rules, error codes and classes, codecs, limits and the protocol defaults. The spec's
//! tests check the file against PROTOCOL.md; this checks the crate against the file.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;
use wirepool_proto::{
    Direction, ErrorClass, ErrorCode, FrameType, IdRule, MethodKind, DEFAULT_HEARTBEAT_MS,
    DEFAULT_INITIAL_CREDIT, DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_MESSAGE_SIZE, FLAG_MORE,
    HANDSHAKE_MAX_FRAME_SIZE, HEADER_LEN, HELLO_MAGIC, MAX_CODECS_PER_METHOD, MAX_CREDIT,
    MAX_MAX_FRAME_SIZE, MAX_METHODS, PROTOCOL_VERSION,
};

fn constants() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/constants.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("constants.json is JSON")
}

fn int(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

#[test]
fn frame_types_and_their_rules() {
    let c = constants();
    let spec = c["frame_types"].as_array().unwrap();
    assert_eq!(spec.len(), FrameType::ALL.len());
    for (t, ours) in spec.iter().zip(FrameType::ALL) {
        let name = t["name"].as_str().unwrap();
        assert_eq!(ours.name(), name);
        assert_eq!(*ours as u8 as u64, int(&t["code"]), "{name}");
        assert_eq!(FrameType::from_name(name), Some(*ours));
        let direction = match ours.direction() {
            Direction::WorkerToParent => "worker_to_parent",
            Direction::ParentToWorker => "parent_to_worker",
            Direction::Both => "both",
        };
        assert_eq!(direction, t["direction"], "{name}");
        let id = match ours.id_rule() {
            IdRule::Zero => "zero",
            IdRule::NonZero => "request",
            IdRule::Any => "any",
        };
        assert_eq!(id, t["id"], "{name}");
        assert_eq!(
            ours.can_continue(),
            t["more_allowed"].as_bool().unwrap(),
            "{name}"
        );
        if ours.can_continue() {
            assert_eq!(
                ours.fixed_prefix_len() as u64,
                int(&t["continued_prefix"]),
                "{name}"
            );
        }
    }
    // No other header byte is a frame type.
    let codes: Vec<u64> = spec.iter().map(|t| int(&t["code"])).collect();
    for byte in 0..=255u8 {
        assert_eq!(
            FrameType::from_u8(byte).is_some(),
            codes.contains(&(byte as u64)),
            "byte {byte:#04x}"
        );
    }
}

#[test]
fn error_codes_and_classes() {
    let c = constants();
    // Version 1's codes and the extensions' (PROTOCOL.md 20.6).
    let spec: BTreeMap<u64, &str> = c["error_codes"]
        .as_array()
        .unwrap()
        .iter()
        .chain(c["extensions"]["shm"]["error_codes"].as_array().unwrap())
        .map(|e| (int(&e["code"]), e["name"].as_str().unwrap()))
        .collect();
    let ours: BTreeMap<u64, &str> = ErrorCode::ALL
        .iter()
        .map(|e| (e.code() as u64, e.name()))
        .collect();
    assert_eq!(ours, spec);
    for e in c["error_codes"]
        .as_array()
        .unwrap()
        .iter()
        .chain(c["extensions"]["shm"]["error_codes"].as_array().unwrap())
    {
        let code = ErrorCode::from_name(e["name"].as_str().unwrap()).unwrap();
        assert_eq!(code.is_fatal(), e["fate"] == "connection_closed", "{code}");
    }
    for class in c["error_classes"].as_array().unwrap() {
        let want = match class["class"].as_str().unwrap() {
            "protocol" => ErrorClass::Protocol,
            "request" => ErrorClass::Request,
            "local" => ErrorClass::Local,
            "application" => ErrorClass::Application,
            _ => ErrorClass::Unassigned,
        };
        for code in [int(&class["from"]), int(&class["to"])] {
            assert_eq!(ErrorClass::of(code as u32), want, "code {code}");
        }
    }
}

#[test]
fn limits_kinds_and_protocol_defaults() {
    let c = constants();
    let lim = &c["limits"];
    assert_eq!(HEADER_LEN as u64, int(&c["header"]["size"]));
    assert_eq!(FLAG_MORE as u64, int(&c["flags"]["MORE"]));
    assert_eq!(PROTOCOL_VERSION as u64, int(&c["protocol_version"]));
    assert_eq!(&HELLO_MAGIC[..], c["magic"].as_str().unwrap().as_bytes());
    assert_eq!(
        HANDSHAKE_MAX_FRAME_SIZE as u64,
        int(&lim["handshake_max_frame_size"])
    );
    assert_eq!(
        HANDSHAKE_MAX_FRAME_SIZE as u64,
        int(&lim["min_max_frame_size"])
    );
    assert_eq!(MAX_MAX_FRAME_SIZE as u64, int(&lim["max_max_frame_size"]));
    assert_eq!(MAX_CREDIT as u64, int(&lim["max_credit"]));
    assert_eq!(MAX_METHODS as u64, int(&lim["max_methods"]));
    assert_eq!(
        MAX_CODECS_PER_METHOD as u64,
        int(&lim["max_codecs_per_method"])
    );
    assert_eq!(
        MethodKind::Unary.to_u8() as u64,
        int(&c["method_kinds"]["unary"])
    );
    assert_eq!(
        MethodKind::Stream.to_u8() as u64,
        int(&c["method_kinds"]["stream"])
    );
    let d = &c["protocol_defaults"];
    assert_eq!(DEFAULT_MAX_FRAME_SIZE as u64, int(&d["max_frame_size"]));
    assert_eq!(DEFAULT_INITIAL_CREDIT as u64, int(&d["initial_credit"]));
    assert_eq!(DEFAULT_HEARTBEAT_MS as u64, int(&d["heartbeat_ms"]));
    assert_eq!(DEFAULT_MAX_MESSAGE_SIZE, int(&d["max_message_size"]));
}

/// The crate's named constants are the generated ones (`spec/generate_constants.py` writes
/// `generated.rs`, the `constants` module, from `spec/constants.json`): no hand-written copy.
#[test]
fn named_constants_are_the_generated_ones() {
    use wirepool_proto::constants as g;
    assert_eq!(HEADER_LEN, g::HEADER_SIZE);
    assert_eq!(FLAG_MORE, g::FLAG_MORE);
    assert_eq!(PROTOCOL_VERSION, g::PROTOCOL_VERSION);
    assert_eq!(HANDSHAKE_MAX_FRAME_SIZE, g::HANDSHAKE_MAX_FRAME_SIZE);
    assert_eq!(MAX_MAX_FRAME_SIZE, g::MAX_MAX_FRAME_SIZE);
    assert_eq!(MAX_CREDIT, g::MAX_CREDIT);
    assert_eq!(MAX_METHODS, g::MAX_METHODS);
    assert_eq!(MAX_CODECS_PER_METHOD, g::MAX_CODECS_PER_METHOD);
    assert_eq!(DEFAULT_MAX_FRAME_SIZE, g::DEFAULT_MAX_FRAME_SIZE);
    assert_eq!(DEFAULT_INITIAL_CREDIT, g::DEFAULT_INITIAL_CREDIT);
    assert_eq!(DEFAULT_HEARTBEAT_MS, g::DEFAULT_HEARTBEAT_MS);
    assert_eq!(DEFAULT_MAX_MESSAGE_SIZE, g::DEFAULT_MAX_MESSAGE_SIZE);
    assert_eq!(wirepool_proto::shm::TAG_SHM, g::SHM_TAG);
    assert_eq!(
        wirepool_proto::shm::MAX_LIVE_REGIONS,
        g::SHM_MAX_LIVE_REGIONS
    );
    assert_eq!(
        wirepool_proto::shm::MAX_QUEUED_DESCRIPTORS,
        g::SHM_MAX_QUEUED_DESCRIPTORS
    );
    // The error codes are the generated table itself.
    assert_eq!(
        std::any::TypeId::of::<ErrorCode>(),
        std::any::TypeId::of::<g::ErrorCode>()
    );
}

/// The shared-memory extension's codes (PROTOCOL.md 20.6) are protocol violations by their range,
/// so a core that does not know them yet still closes the connection on one; a core that knows
/// them names them as the spec does.
#[test]
fn shm_extension_error_codes() {
    let c = constants();
    let shm = c["extensions"]["shm"]["error_codes"].as_array().unwrap();
    assert_eq!(shm.len(), 4);
    for e in shm {
        let code = int(&e["code"]) as u32;
        assert_eq!(ErrorClass::of(code), ErrorClass::Protocol, "code {code}");
        if let Some(known) = ErrorCode::from_code(code) {
            assert_eq!(known.name(), e["name"].as_str().unwrap());
        }
    }
}

/// Every operation of PROTOCOL.md section 14, called by its name: this function is compiled,
/// not run, so a renamed or missing operation fails the build, and the test below fails when
/// `core_api` names an operation this function does not call.
#[allow(dead_code, unused_must_use)]
fn every_core_operation(
    c: &mut wirepool_proto::Connection,
    out: &mut Vec<u8>,
    hello: &wirepool_proto::Hello,
    welcome: &wirepool_proto::Welcome,
    frame: &wirepool_proto::Frame,
    error: &wirepool_proto::ProtocolError,
) {
    // receiving
    c.receive(b"");
    c.read_buffer();
    c.next_event();
    c.end_of_input();
    c.incomplete_frame_len();
    // sending
    c.send_hello(hello, out);
    c.send_welcome(welcome, out);
    c.refuse(ErrorCode::CodecMismatch, "", out);
    c.send_fatal(error, out);
    c.send_request(0, 0, 0, b"", out);
    c.send_cancel(1, out);
    c.consumed(1, 0, out);
    c.consumed_at(1, 0, 0, out);
    c.observe_rtt(1);
    c.set_window_caps(1, 1);
    c.send_credit(1, 1, out);
    c.send_drain(0, out);
    c.send_result(1, b"", out);
    c.send_end(1, b"", out);
    if let Ok(mut cursor) = c.begin_request(0, 0, 0, b"", out) {
        c.send_next_frame(&mut cursor, b"", out);
    }
    c.begin_result(1, b"", out);
    c.begin_end(1, b"", out);
    if let Ok(mut rows) = c.rows(1, out) {
        rows.append(b"");
        rows.finish();
    }
    c.send_error(1, 0, "", "", out);
    c.send_event(1, "", "", out);
    c.send_goodbye(0, out);
    c.send_ping([0; 8], out);
    c.send_pong([0; 8], out);
    c.send(frame, out);
    // queries
    c.role();
    c.is_open();
    c.hello();
    c.welcome();
    c.max_frame_size();
    c.in_flight();
    c.in_flight_ids();
    c.is_in_flight(1);
    c.can_send_request();
    c.credit(1);
    c.window(1);
    c.can_send_rows(1);
    c.is_draining();
    c.is_goodbye();
    c.failure();
    // batch (14.4): the Rust core offers next_events
    c.next_events(&mut Vec::new());
    // policies (14.5): pure functions of the crate
    let offer = wirepool_proto::Offer {
        max_frame_size: 0,
        initial_credit: 0,
        heartbeat_ms: 0,
        max_in_flight: 0,
        max_message_size: 0,
        worker_id: 0,
        remote: false,
    };
    wirepool_proto::negotiate(hello, &offer);
    wirepool_proto::rows_batch_bytes(0, 0, 0);
    wirepool_proto::grant(0, 0, 0);
    wirepool_proto::fit_error("", "", 0);
    wirepool_proto::stream_window(0, 0, 0, 0, 0, 0);
}

#[test]
fn the_core_offers_every_operation_of_section_14() {
    let c = constants();
    let api = &c["core_api"];
    let source = include_str!("constants.rs");
    let body = &source[source.find("fn every_core_operation").unwrap()..];
    let body = &body[..body.find("\n}\n").unwrap()];
    let mut missing = Vec::new();
    for part in ["receiving", "sending", "queries", "rows_builder"] {
        for name in api[part].as_array().unwrap() {
            let name = name.as_str().unwrap();
            if !body.contains(&format!(".{name}(")) {
                missing.push(name.to_string());
            }
        }
    }
    for name in api["policies"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        if !body.contains(&format!("wirepool_proto::{name}(")) {
            missing.push(name.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "section 14 operations not called: {missing:?}"
    );
}
