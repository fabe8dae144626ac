//! Every case of `spec/vectors/policies.json` (PROTOCOL.md 14.5), read at test time, through the
//! core's policy functions: `negotiate`, `rows_batch_bytes`, `grant`, `fit_error`,
//! `stream_window`; and the
//! connection's `consumed` (the live side of `grant`) while a request is still being sent.

use std::path::PathBuf;

use serde_json::{json, Value};
use wirepool_proto::{
    fit_error, grant, negotiate, rows_batch_bytes, stream_window, Connection, Event, Hello,
    MethodInfo, MethodKind, Offer, Welcome,
};

fn cases() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors/policies.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let doc: Value = serde_json::from_str(&text).expect("policies.json is JSON");
    assert_eq!(doc["protocol_version"], 1);
    doc
}

fn list<'a>(doc: &'a Value, name: &str) -> &'a [Value] {
    let cases = doc[name]
        .as_array()
        .unwrap_or_else(|| panic!("no list {name}"));
    assert!(!cases.is_empty(), "{name} has no cases");
    cases
}

fn i(v: &Value) -> i64 {
    v.as_i64()
        .unwrap_or_else(|| panic!("not a 64-bit integer: {v}"))
}

fn u32_of(v: &Value) -> u32 {
    u32::try_from(i(v)).unwrap_or_else(|_| panic!("not a u32: {v}"))
}

/// `[[text, count], ...]` joined.
fn runs(v: &Value) -> String {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r[0].as_str()
                .unwrap()
                .repeat(r[1].as_u64().unwrap() as usize)
        })
        .collect()
}

#[test]
fn negotiate_cases() {
    let doc = cases();
    for case in list(&doc, "negotiate") {
        let name = case["name"].as_str().unwrap();
        let (o, h) = (&case["offer"], &case["hello"]);
        let hello = Hello {
            min_version: i(&h["min_version"]) as u16,
            max_version: i(&h["max_version"]) as u16,
            max_concurrency: u32_of(&h["max_concurrency"]),
            max_frame_size: u32_of(&h["max_frame_size"]),
            ..Hello::new("policies", "0")
        };
        let offer = Offer {
            max_frame_size: i(&o["max_frame_size"]),
            initial_credit: i(&o["initial_credit"]),
            heartbeat_ms: i(&o["heartbeat_ms"]),
            max_in_flight: i(&o["max_in_flight"]),
            max_message_size: i(&o["max_message_size"]),
            worker_id: u32_of(&o["worker_id"]),
            remote: o["remote"].as_bool().unwrap(),
        };
        let got = match negotiate(&hello, &offer) {
            Ok((w, clamped)) => json!({
                "welcome": {
                    "version": w.version, "worker_id": w.worker_id,
                    "max_frame_size": w.max_frame_size, "initial_credit": w.initial_credit,
                    "heartbeat_ms": w.heartbeat_ms, "max_in_flight": w.max_in_flight,
                    "max_message_size": w.max_message_size,
                },
                "clamped": clamped,
            }),
            Err(e) => {
                let mut error = json!({"code": e.error.code.code(), "name": e.error.code.name()});
                if let Some(field) = e.field {
                    error["field"] = json!(field);
                }
                json!({ "error": error })
            }
        };
        assert_eq!(got, case["expect"], "negotiate {name}");
    }
}

#[test]
fn rows_batch_bytes_cases() {
    let doc = cases();
    for case in list(&doc, "rows_batch_bytes") {
        let got = rows_batch_bytes(
            i(&case["preferred"]) as usize,
            u32_of(&case["initial_credit"]),
            u32_of(&case["max_frame_size"]),
        );
        assert_eq!(got as i64, i(&case["expect"]), "{}", case["name"]);
    }
}

#[test]
fn grant_cases() {
    let doc = cases();
    for case in list(&doc, "grant") {
        let got = grant(
            u32_of(&case["initial_credit"]),
            i(&case["credit"]),
            i(&case["consumed"]) as u64,
        );
        assert_eq!(i64::from(got), i(&case["expect"]), "{}", case["name"]);
    }
}

#[test]
fn stream_window_cases() {
    let doc = cases();
    for case in list(&doc, "stream_window") {
        let got = stream_window(
            u32_of(&case["window"]),
            u32_of(&case["initial_credit"]),
            i(&case["drained_us"]) as u64,
            i(&case["rtt_us"]) as u64,
            u32_of(&case["max_stream_window"]),
            i(&case["connection_room"]) as u64,
        );
        assert_eq!(i64::from(got), i(&case["expect"]), "{}", case["name"]);
    }
}

#[test]
fn fit_error_cases() {
    let doc = cases();
    for case in list(&doc, "fit_error") {
        let name = case["name"].as_str().unwrap();
        let (message, details) = (runs(&case["message"]), runs(&case["details"]));
        let (m, d) = fit_error(&message, &details, u32_of(&case["max_frame_size"]));
        let expect = &case["expect"];
        assert_eq!(m.len() as i64, i(&expect["message_bytes"]), "{name}");
        assert!(message.as_bytes().starts_with(m.as_bytes()), "{name}");
        match expect["details"].as_str() {
            None => assert_eq!(d, details, "{name}: details unchanged"),
            Some(want) => assert_eq!(d, want, "{name}"),
        }
        assert!(
            6 + m.len() + d.len() <= u32_of(&case["max_frame_size"]) as usize,
            "{name}"
        );
    }
}

/// A parent and a worker past the handshake with one stream method, window `window`.
fn pair(window: u32) -> (Connection, Connection) {
    let (mut worker, mut parent) = (Connection::new_worker(), Connection::new_parent());
    let mut wire = Vec::new();
    let hello = Hello {
        methods: vec![MethodInfo {
            name: "rows".into(),
            kind: MethodKind::Stream,
            codecs: vec![1],
        }],
        max_concurrency: 4,
        ..Hello::new("t", "0")
    };
    worker.send_hello(&hello, &mut wire).unwrap();
    parent.receive(&wire);
    let Some(Event::Hello(hello)) = parent.next_event().unwrap() else {
        panic!("no HELLO")
    };
    let welcome = Welcome {
        initial_credit: window,
        max_frame_size: 65_536,
        ..Welcome::for_hello(&hello, 1).unwrap()
    };
    wire.clear();
    parent.send_welcome(&welcome, &mut wire).unwrap();
    worker.receive(&wire);
    assert!(matches!(
        worker.next_event().unwrap(),
        Some(Event::Welcome(_))
    ));
    (parent, worker)
}

/// 14.5: no grant while the stream's request is still being sent (a CREDIT then would break
/// the continuation rule): `consumed` answers 0 and writes nothing, the bytes stay counted, and
/// the grant comes with the first `consumed` after the request's last frame.
#[test]
fn consumed_while_the_request_is_still_being_sent() {
    let (mut parent, _worker) = pair(1_000);
    let body = vec![7u8; 100_000]; // above max_frame_size: continued
    let mut out = Vec::new();
    let mut cursor = parent.begin_request(0, 1, 0, &body, &mut out).unwrap();
    let id = cursor.id();
    let before = out.len();
    assert_eq!(parent.consumed(id, 600, &mut out), Ok(0));
    assert_eq!(out.len(), before, "nothing written");
    while !cursor.is_done() {
        parent
            .send_next_frame(&mut cursor, &body, &mut out)
            .unwrap();
    }
    let before = out.len();
    assert_eq!(
        parent.consumed(id, 0, &mut out),
        Ok(600),
        "the counted bytes"
    );
    assert_eq!(out.len(), before + 20, "one CREDIT");
    assert_eq!(parent.credit(id), Some(1_600));
    // Unknown and ended ids: 0, never an error.
    assert_eq!(parent.consumed(id + 1, 10_000, &mut out), Ok(0));
}

const MIB: u32 = 1 << 20;

/// PROTOCOL.md 6 on a live core: half windows drained in half a round trip double the window
/// (the grant is the consumed bytes plus the growth) up to 16 MiB; a slow consumer halves it
/// back to `initial_credit`, the halving taken out of the grants.
#[test]
fn consumed_at_grows_a_window_limited_stream_to_the_cap_and_back() {
    let (mut parent, _worker) = pair(MIB);
    let mut out = Vec::new();
    let id = parent.send_request(0, 1, 0, b"", &mut out).unwrap();
    for rtt in [150_000, 100_000, 400_000] {
        parent.observe_rtt(rtt); // the smallest counts
    }
    assert_eq!(parent.consumed_at(id, 0, 1_000, &mut out), Ok(0));
    let (mut now, mut windows) = (1_000u64, Vec::new());
    for _ in 0..8 {
        let half = parent.window(id).unwrap() / 2;
        assert_eq!(
            parent.consumed_at(id, half as usize - 1, now, &mut out),
            Ok(0)
        );
        now += 50_000;
        let old = parent.window(id).unwrap();
        let granted = parent.consumed_at(id, 1, now, &mut out).unwrap();
        let new = parent.window(id).unwrap();
        assert_eq!(granted, half + new - old);
        windows.push(new / MIB);
    }
    assert_eq!(windows, [2, 4, 8, 16, 16, 16, 16, 16]);
    let mut shrinking = Vec::new();
    while parent.window(id).unwrap() > MIB {
        now += 10_000_000; // 10 s for half a window: more than 8 round trips
        let old = parent.window(id).unwrap();
        let granted = parent
            .consumed_at(id, (old / 2) as usize, now, &mut out)
            .unwrap();
        let new = parent.window(id).unwrap();
        assert_eq!(granted, old / 2 + new - old);
        shrinking.push(new / MIB);
    }
    assert_eq!(shrinking, [8, 4, 2, 1]);
    now += 10_000_000;
    parent
        .consumed_at(id, (MIB / 2) as usize, now, &mut out)
        .unwrap();
    assert_eq!(parent.window(id), Some(MIB), "never below initial_credit");
}

#[test]
fn consumed_at_without_a_round_trip_and_consumed_never_adapt() {
    let (mut parent, _worker) = pair(MIB);
    let mut out = Vec::new();
    let id = parent.send_request(0, 1, 0, b"", &mut out).unwrap();
    assert_eq!(parent.consumed_at(id, 0, 0, &mut out), Ok(0));
    let half = (MIB / 2) as usize;
    assert_eq!(parent.consumed_at(id, half, 10, &mut out), Ok(MIB / 2));
    assert_eq!(parent.window(id), Some(MIB));
    parent.observe_rtt(100_000);
    assert_eq!(parent.consumed(id, half, &mut out), Ok(MIB / 2));
    assert_eq!(
        (parent.window(id), parent.window(id + 1)),
        (Some(MIB), None)
    );
}

#[test]
fn the_connection_cap_bounds_the_sum_of_windows() {
    let (mut parent, _worker) = pair(MIB);
    let mut out = Vec::new();
    let a = parent.send_request(0, 1, 0, b"", &mut out).unwrap();
    let b = parent.send_request(0, 1, 0, b"", &mut out).unwrap();
    parent.set_window_caps(16 * MIB, 3 * MIB);
    parent.observe_rtt(100_000);
    for id in [a, b] {
        parent.consumed_at(id, 0, 0, &mut out).unwrap();
    }
    for now in 1..6u64 {
        for id in [a, b] {
            let half = (parent.window(id).unwrap() / 2) as usize;
            parent.consumed_at(id, half, now * 1_000, &mut out).unwrap();
        }
        assert!(parent.window(a).unwrap() + parent.window(b).unwrap() <= 3 * MIB);
    }
    assert_eq!(
        (parent.window(a), parent.window(b)),
        (Some(2 * MIB), Some(MIB))
    );
}
