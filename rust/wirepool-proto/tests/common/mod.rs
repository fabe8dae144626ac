//! Conversions between the JSON objects of spec/vectors and this crate's types.
#![allow(dead_code)]

use std::path::PathBuf;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use wirepool_proto::{
    Event, Frame, FrameBody, FrameType, Hello, MethodInfo, MethodKind, RowsPayload, Welcome,
};

pub fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/vectors")
}

pub fn load(name: &str) -> Value {
    let path = vectors_dir().join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("vector file is JSON")
}

pub fn unhex(text: &str) -> Vec<u8> {
    assert!(text.len() % 2 == 0, "odd hex length");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digit"))
        .collect()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("field {key} in {v}"))
}

fn s(v: &Value, key: &str) -> String {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("field {key} in {v}"))
        .to_owned()
}

fn b(v: &Value, key: &str) -> Bytes {
    Bytes::from(unhex(
        v[key]
            .as_str()
            .unwrap_or_else(|| panic!("field {key} in {v}")),
    ))
}

fn nonce(v: &Value) -> [u8; 8] {
    unhex(&s(v, "nonce")).try_into().expect("8-byte nonce")
}

fn kind_name(kind: MethodKind) -> &'static str {
    match kind {
        MethodKind::Unary => "unary",
        MethodKind::Stream => "stream",
    }
}

pub fn hello_from_json(v: &Value) -> Hello {
    Hello {
        min_version: u(v, "min_version") as u16,
        max_version: u(v, "max_version") as u16,
        pid: u(v, "pid") as u32,
        max_concurrency: u(v, "max_concurrency") as u32,
        max_frame_size: u(v, "max_frame_size") as u32,
        sdk_name: s(v, "sdk_name"),
        sdk_version: s(v, "sdk_version"),
        methods: v["methods"]
            .as_array()
            .expect("methods")
            .iter()
            .map(|m| MethodInfo {
                name: s(m, "name"),
                kind: if s(m, "kind") == "unary" {
                    MethodKind::Unary
                } else {
                    MethodKind::Stream
                },
                codecs: m["codecs"]
                    .as_array()
                    .expect("codecs")
                    .iter()
                    .map(|c| c.as_u64().expect("codec") as u8)
                    .collect(),
            })
            .collect(),
        extensions: Default::default(),
    }
}

pub fn frame_from_json(v: &Value) -> Frame {
    let id = u(v, "id");
    let more = v["more"].as_bool().unwrap_or(false);
    let ty = FrameType::from_name(&s(v, "type")).expect("known type");
    let body = match ty {
        FrameType::Hello => FrameBody::Hello(Box::new(hello_from_json(v))),
        FrameType::Welcome => FrameBody::Welcome(Welcome {
            version: u(v, "version") as u16,
            worker_id: u(v, "worker_id") as u32,
            max_frame_size: u(v, "max_frame_size") as u32,
            initial_credit: u(v, "initial_credit") as u32,
            heartbeat_ms: u(v, "heartbeat_ms") as u32,
            max_in_flight: u(v, "max_in_flight") as u32,
            max_message_size: u(v, "max_message_size"),
            extensions: Default::default(),
        }),
        FrameType::Request => FrameBody::Request {
            method: u(v, "method") as u16,
            codec: u(v, "codec") as u8,
            timeout_us: u(v, "timeout_us"),
            body: b(v, "body"),
        },
        FrameType::Cancel => FrameBody::Cancel,
        FrameType::Result => FrameBody::Result { body: b(v, "body") },
        FrameType::Error => FrameBody::Error {
            code: u(v, "code") as u32,
            message: s(v, "message"),
            details: s(v, "details"),
        },
        FrameType::Rows => {
            let rows: Vec<Vec<u8>> = v["rows"]
                .as_array()
                .expect("rows")
                .iter()
                .map(|r| unhex(r.as_str().expect("row")))
                .collect();
            let mut payload = Vec::new();
            payload.extend_from_slice(&(rows.len() as u32).to_le_bytes());
            for row in &rows {
                payload.extend_from_slice(&(row.len() as u32).to_le_bytes());
                payload.extend_from_slice(row);
            }
            FrameBody::Rows(RowsPayload::parse(payload.into()).expect("vector rows are valid"))
        }
        FrameType::End => FrameBody::End {
            row_count: u(v, "row_count"),
            summary: b(v, "summary"),
        },
        FrameType::Credit => FrameBody::Credit {
            bytes: u(v, "bytes") as u32,
        },
        FrameType::Event => FrameBody::Event {
            topic: s(v, "topic"),
            data: s(v, "data"),
        },
        FrameType::Ping => FrameBody::Ping { nonce: nonce(v) },
        FrameType::Pong => FrameBody::Pong { nonce: nonce(v) },
        FrameType::Drain => FrameBody::Drain {
            grace_ms: u(v, "grace_ms") as u32,
        },
        FrameType::Goodbye => FrameBody::Goodbye {
            reason: u(v, "reason") as u32,
        },
        FrameType::Continuation => FrameBody::Continuation {
            chunk: b(v, "body"),
        },
    };
    Frame { id, more, body }
}

fn hello_json(h: &Hello, obj: &mut Map<String, Value>) {
    obj.insert("min_version".into(), json!(h.min_version));
    obj.insert("max_version".into(), json!(h.max_version));
    obj.insert("pid".into(), json!(h.pid));
    obj.insert("max_concurrency".into(), json!(h.max_concurrency));
    obj.insert("max_frame_size".into(), json!(h.max_frame_size));
    obj.insert("sdk_name".into(), json!(h.sdk_name));
    obj.insert("sdk_version".into(), json!(h.sdk_version));
    let methods: Vec<Value> = h
        .methods
        .iter()
        .map(|m| json!({"name": m.name, "kind": kind_name(m.kind), "codecs": m.codecs}))
        .collect();
    obj.insert("methods".into(), Value::Array(methods));
}

fn welcome_json(w: &Welcome, obj: &mut Map<String, Value>) {
    obj.insert("version".into(), json!(w.version));
    obj.insert("worker_id".into(), json!(w.worker_id));
    obj.insert("max_frame_size".into(), json!(w.max_frame_size));
    obj.insert("initial_credit".into(), json!(w.initial_credit));
    obj.insert("heartbeat_ms".into(), json!(w.heartbeat_ms));
    obj.insert("max_in_flight".into(), json!(w.max_in_flight));
    obj.insert("max_message_size".into(), json!(w.max_message_size));
}

pub fn frame_to_json(f: &Frame) -> Value {
    let mut obj = Map::new();
    obj.insert("type".into(), json!(f.frame_type().name()));
    obj.insert("id".into(), json!(f.id));
    obj.insert("more".into(), json!(f.more));
    match &f.body {
        FrameBody::Hello(h) => hello_json(h, &mut obj),
        FrameBody::Welcome(w) => welcome_json(w, &mut obj),
        FrameBody::Request {
            method,
            codec,
            timeout_us,
            body,
        } => {
            obj.insert("method".into(), json!(method));
            obj.insert("codec".into(), json!(codec));
            obj.insert("timeout_us".into(), json!(timeout_us));
            obj.insert("body".into(), json!(hex(body)));
        }
        FrameBody::Cancel => {}
        FrameBody::Result { body } => {
            obj.insert("body".into(), json!(hex(body)));
        }
        FrameBody::Error {
            code,
            message,
            details,
        } => {
            obj.insert("code".into(), json!(code));
            obj.insert("message".into(), json!(message));
            obj.insert("details".into(), json!(details));
        }
        FrameBody::Rows(rows) => {
            obj.insert(
                "rows".into(),
                Value::Array(rows.iter().map(|r| json!(hex(r))).collect()),
            );
        }
        FrameBody::End { row_count, summary } => {
            obj.insert("row_count".into(), json!(row_count));
            obj.insert("summary".into(), json!(hex(summary)));
        }
        FrameBody::Credit { bytes } => {
            obj.insert("bytes".into(), json!(bytes));
        }
        FrameBody::Event { topic, data } => {
            obj.insert("topic".into(), json!(topic));
            obj.insert("data".into(), json!(data));
        }
        FrameBody::Ping { nonce } | FrameBody::Pong { nonce } => {
            obj.insert("nonce".into(), json!(hex(nonce)));
        }
        FrameBody::Drain { grace_ms } => {
            obj.insert("grace_ms".into(), json!(grace_ms));
        }
        FrameBody::Goodbye { reason } => {
            obj.insert("reason".into(), json!(reason));
        }
        FrameBody::Continuation { chunk } => {
            obj.insert("body".into(), json!(hex(chunk)));
        }
    }
    Value::Object(obj)
}

/// An event as the vectors write it: a frame object without `more`, or LATE / REJECT.
pub fn event_to_json(e: &Event) -> Value {
    let frame = |id: u64, body: FrameBody| {
        let mut v = frame_to_json(&Frame::new(id, body));
        v.as_object_mut().expect("object").remove("more");
        v
    };
    match e.clone() {
        Event::Hello(h) => frame(0, FrameBody::Hello(h)),
        Event::Welcome(w) => frame(0, FrameBody::Welcome(w)),
        Event::Request {
            id,
            method,
            codec,
            timeout_us,
            body,
        } => frame(
            id,
            FrameBody::Request {
                method,
                codec,
                timeout_us,
                body,
            },
        ),
        Event::Cancel { id } => frame(id, FrameBody::Cancel),
        Event::Result { id, body } => frame(id, FrameBody::Result { body }),
        Event::Error {
            id,
            code,
            message,
            details,
        } => frame(
            id,
            FrameBody::Error {
                code,
                message,
                details,
            },
        ),
        Event::Rows { id, rows } => frame(id, FrameBody::Rows(rows)),
        Event::End {
            id,
            row_count,
            summary,
        } => frame(id, FrameBody::End { row_count, summary }),
        Event::Credit { id, bytes } => frame(id, FrameBody::Credit { bytes }),
        Event::Notification { id, topic, data } => frame(id, FrameBody::Event { topic, data }),
        Event::Ping { nonce } => frame(0, FrameBody::Ping { nonce }),
        Event::Pong { nonce } => frame(0, FrameBody::Pong { nonce }),
        Event::Drain { grace_ms } => frame(0, FrameBody::Drain { grace_ms }),
        Event::Goodbye { reason } => frame(0, FrameBody::Goodbye { reason }),
        Event::Late { id, frame } => json!({"type": "LATE", "id": id, "frame": frame.name()}),
        Event::Reject { id, code } => {
            json!({"type": "REJECT", "id": id, "code": code.code(), "name": code.name()})
        }
    }
}

/// Where frames start in `data`, and where their payloads start (walking the length fields).
fn frame_boundaries(data: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 16 <= data.len() {
        out.push(pos);
        out.push(pos + 16);
        let len = u32::from_le_bytes(data[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        pos = pos.saturating_add(16).saturating_add(len);
    }
    out.push(pos.min(data.len()));
    out
}

/// The chunkings every vector is fed with: at once, split in two at every position, and one
/// byte at a time.
pub fn chunkings(data: &[u8]) -> Vec<Vec<usize>> {
    let len = data.len();
    let mut out = vec![vec![len]];
    out.extend(split_positions(data).into_iter().map(|p| vec![p, len - p]));
    out.push(vec![1; len]);
    out
}

/// The positions (1..len) of the two-chunk splits. Past 4,096 bytes they follow the split rule
/// of PROTOCOL.md section 16: every position within 32 bytes of a frame (or payload) boundary,
/// plus every 251st position.
pub fn split_positions(data: &[u8]) -> Vec<usize> {
    let len = data.len();
    if len <= 4096 {
        return (1..len).collect();
    }
    let mut keep = vec![false; len];
    for b in frame_boundaries(data) {
        keep[b.saturating_sub(32)..=(b + 32).min(len - 1)].fill(true);
    }
    (1..len).filter(|&p| keep[p] || p % 251 == 0).collect()
}
