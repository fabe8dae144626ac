//! Every case of spec/vectors/frames.json and sessions.json, fed at once, split in two at every
//! position, and one byte at a time.

mod common;

use common::{
    chunkings, event_to_json, frame_from_json, frame_to_json, hex, load, split_positions, unhex,
};
use serde_json::{json, Value};
use wirepool_proto::{Connection, FrameBody, FrameDecoder, ProtocolError, Role};

fn error_json(e: &ProtocolError) -> Value {
    json!({"code": e.code.code(), "name": e.code.name()})
}

/// Decode `data` fed in `chunks`: the frames, then the error (or null).
fn decode_chunked(data: &[u8], chunks: &[usize], max_frame_size: u32) -> (Vec<Value>, Value) {
    let mut dec = FrameDecoder::new(max_frame_size);
    let mut frames = Vec::new();
    let mut at = 0;
    for &n in chunks {
        dec.receive(&data[at..at + n]);
        at += n;
        loop {
            match dec.next_frame() {
                Ok(Some(f)) => frames.push(frame_to_json(&f)),
                Ok(None) => break,
                Err(e) => return (frames, error_json(&e)),
            }
        }
    }
    match dec.end_of_input() {
        Ok(()) => (frames, Value::Null),
        Err(e) => (frames, error_json(&e)),
    }
}

#[test]
fn frames_json_every_case_every_chunking() {
    let doc = load("frames.json");
    assert_eq!(doc["protocol_version"], 1);
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 100, "frames.json has {} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let data = unhex(case["hex"].as_str().expect("hex"));
        let max = case["max_frame_size"].as_u64().unwrap_or(1_048_576) as u32;
        let want_frames = case["frames"].as_array().expect("frames").clone();
        let want_error = case["error"].clone();
        for chunks in chunkings(&data) {
            let (frames, error) = decode_chunked(&data, &chunks, max);
            assert_eq!(
                frames,
                want_frames,
                "{name}: frames with chunks {:?}",
                &chunks[..chunks.len().min(3)]
            );
            assert_eq!(
                error,
                want_error,
                "{name}: error with chunks {:?}",
                &chunks[..chunks.len().min(3)]
            );
        }
        if want_error.is_null() && !case["decode_only"].as_bool().unwrap_or(false) {
            let mut out = Vec::new();
            for f in &want_frames {
                frame_from_json(f)
                    .encode(&mut out)
                    .unwrap_or_else(|e| panic!("{name}: encode: {e}"));
            }
            assert_eq!(
                hex(&out),
                case["hex"].as_str().expect("hex"),
                "{name}: encoding"
            );
        }
    }
}

/// Run one session case with every recv step fed in the chunking `pick` chooses for it.
fn run_session(case: &Value, pick: &dyn Fn(usize) -> Vec<usize>) {
    let name = case["name"].as_str().expect("name");
    let role = match case["role"].as_str() {
        Some("parent") => Role::Parent,
        Some("worker") => Role::Worker,
        other => panic!("{name}: role {other:?}"),
    };
    let mut conn = Connection::new(role);
    let steps = case["steps"].as_array().expect("steps");
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{name} step {i}");
        if let Some(frame) = step.get("send") {
            let frame = frame_from_json(frame);
            let mut out = Vec::new();
            conn.send(&frame, &mut out)
                .unwrap_or_else(|e| panic!("{at}: send refused: {e}"));
            let mut expected = Vec::new();
            frame.encode(&mut expected).expect("vector frame encodes");
            assert_eq!(hex(&out), hex(&expected), "{at}: bytes sent");
            continue;
        }
        let mut events = Vec::new();
        let mut error = Value::Null;
        if let Some(data) = step.get("recv") {
            let data = unhex(data.as_str().expect("recv hex"));
            let mut pos = 0;
            'feed: for n in pick(data.len()) {
                conn.receive(&data[pos..pos + n]);
                pos += n;
                loop {
                    match conn.next_event() {
                        Ok(Some(event)) => events.push(event_to_json(&event)),
                        Ok(None) => break,
                        Err(e) => {
                            error = error_json(&e);
                            break 'feed;
                        }
                    }
                }
            }
        } else {
            assert_eq!(step["eof"], true, "{at}: unknown step");
            if let Err(e) = conn.end_of_input() {
                error = error_json(&e);
            }
        }
        assert_eq!(Value::Array(events), step["events"], "{at}: events");
        let want_error = step.get("error").cloned().unwrap_or(Value::Null);
        assert_eq!(error, want_error, "{at}: error");
        if !want_error.is_null() {
            assert_eq!(i, steps.len() - 1, "{at}: steps after an error");
            // Errors are sticky.
            assert!(conn.next_event().is_err(), "{at}: error not sticky");
        }
    }
}

fn sessions() -> Vec<Value> {
    let doc = load("sessions.json");
    assert_eq!(doc["protocol_version"], 1);
    let cases = doc["cases"].as_array().expect("cases").clone();
    assert!(cases.len() >= 50, "sessions.json has {} cases", cases.len());
    cases
}

#[test]
fn sessions_json_fed_at_once() {
    for case in sessions() {
        run_session(&case, &|len| vec![len]);
    }
}

#[test]
fn sessions_json_one_byte_at_a_time() {
    for case in sessions() {
        run_session(&case, &|len| vec![1; len]);
    }
}

#[test]
fn sessions_json_split_at_every_position() {
    for case in sessions() {
        // One run per (recv step, position): that step is split in two there, the others are
        // fed whole. Past 4 KiB the positions follow the sampling of PROTOCOL.md section 16.
        let steps = case["steps"].as_array().expect("steps");
        let recvs: Vec<Vec<u8>> = steps
            .iter()
            .filter_map(|s| s.get("recv").and_then(Value::as_str))
            .map(unhex)
            .collect();
        for (target, data) in recvs.iter().enumerate() {
            for split in split_positions(data) {
                let seen = std::cell::Cell::new(0usize);
                run_session(&case, &|len| {
                    let k = seen.replace(seen.get() + 1);
                    if k == target {
                        vec![split, len - split]
                    } else {
                        vec![len]
                    }
                });
            }
        }
    }
}

#[test]
fn rows_events_slice_the_frame() {
    // The vector harness compares values; this checks the zero-copy promise on one case.
    let doc = load("frames.json");
    let case = doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == "rows_several_with_empty_row")
        .expect("case");
    let data = unhex(case["hex"].as_str().expect("hex"));
    let mut dec = FrameDecoder::new(1 << 20);
    dec.receive(&data);
    let frame = dec.next_frame().expect("valid").expect("complete");
    let FrameBody::Rows(rows) = frame.body else {
        panic!("not ROWS")
    };
    let base = rows.payload().as_ptr() as usize;
    for row in rows.iter() {
        let p = row.as_ptr() as usize;
        assert!(
            p >= base && p + row.len() <= base + rows.payload().len(),
            "row copied out of the frame"
        );
    }
}
