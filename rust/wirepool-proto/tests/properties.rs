//! Property tests: encode/decode round trips, and chunking never changes what comes out.

mod common;

use bytes::Bytes;
use common::{event_to_json, frame_to_json};
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::Value;
use wirepool_proto::{
    Connection, Frame, FrameBody, FrameDecoder, Hello, MethodInfo, MethodKind, RowsBuilder,
    RowsPayload, Welcome,
};

fn bytes_up_to(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn text(min: usize, max: usize) -> impl Strategy<Value = String> {
    // Multi-byte characters included; the byte length is checked by the filter.
    proptest::string::string_regex(&format!("[a-z\u{e9}\u{4e2d}\u{1f600} ]{{{min},{max}}}"))
        .expect("regex")
        .prop_filter("byte length in range", move |s| {
            (min..=max).contains(&s.len())
        })
}

fn rows_payload() -> impl Strategy<Value = RowsPayload> {
    vec(vec(any::<u8>(), 0..40), 1..20).prop_map(|rows| {
        let mut out = Vec::new();
        let mut b = RowsBuilder::new(&mut out, 1, 1 << 20);
        for r in &rows {
            assert!(b.append(r).expect("fits"));
        }
        b.finish().expect("finish");
        RowsPayload::parse(Bytes::from(out).slice(16..)).expect("valid rows")
    })
}

fn hello() -> impl Strategy<Value = Hello> {
    let method = (
        text(1, 20),
        prop_oneof![Just(MethodKind::Unary), Just(MethodKind::Stream)],
        proptest::sample::subsequence((0u8..=255).collect::<Vec<_>>(), 1..5),
    );
    (
        1u16..4,
        0u16..3,
        any::<u32>(),
        1u32..64,
        65_536u32..=16_777_216,
        text(1, 30),
        text(0, 20),
        vec(method, 0..6),
    )
        .prop_map(|(min, extra, pid, conc, mfs, name, version, methods)| {
            let mut seen = std::collections::HashSet::new();
            Hello {
                min_version: min,
                max_version: min + extra,
                pid,
                max_concurrency: conc,
                max_frame_size: mfs,
                sdk_name: name,
                sdk_version: version,
                methods: methods
                    .into_iter()
                    .filter(|(n, _, _)| seen.insert(n.clone()))
                    .map(|(name, kind, codecs)| MethodInfo { name, kind, codecs })
                    .collect(),
                extensions: Default::default(),
            }
        })
}

fn welcome() -> impl Strategy<Value = Welcome> {
    (
        1u16..4,
        any::<u32>(),
        65_536u32..=16_777_216,
        1u32..=0x7fff_ffff,
        any::<u32>(),
        1u32..1000,
        any::<u32>(),
    )
        .prop_map(
            |(version, worker_id, mfs, credit, hb, mif, extra)| Welcome {
                version,
                worker_id,
                max_frame_size: mfs,
                initial_credit: credit,
                heartbeat_ms: hb,
                max_in_flight: mif,
                max_message_size: u64::from(mfs) + u64::from(extra),
                extensions: Default::default(),
            },
        )
}

/// Any valid frame: ids and MORE follow the rules of its type.
fn frame() -> impl Strategy<Value = Frame> {
    let body = prop_oneof![
        hello().prop_map(|h| FrameBody::Hello(Box::new(h))),
        welcome().prop_map(FrameBody::Welcome),
        (any::<u16>(), any::<u8>(), any::<u64>(), bytes_up_to(100)).prop_map(
            |(method, codec, timeout_us, body)| FrameBody::Request {
                method,
                codec,
                timeout_us,
                body
            }
        ),
        Just(FrameBody::Cancel),
        bytes_up_to(100).prop_map(|body| FrameBody::Result { body }),
        (any::<u32>(), text(0, 40), text(0, 40)).prop_map(|(code, message, details)| {
            FrameBody::Error {
                code,
                message,
                details,
            }
        }),
        rows_payload().prop_map(FrameBody::Rows),
        (any::<u64>(), bytes_up_to(50))
            .prop_map(|(row_count, summary)| FrameBody::End { row_count, summary }),
        (1u32..).prop_map(|bytes| FrameBody::Credit { bytes }),
        (text(1, 30), text(0, 30)).prop_map(|(topic, data)| FrameBody::Event { topic, data }),
        any::<[u8; 8]>().prop_map(|nonce| FrameBody::Ping { nonce }),
        any::<[u8; 8]>().prop_map(|nonce| FrameBody::Pong { nonce }),
        any::<u32>().prop_map(|grace_ms| FrameBody::Drain { grace_ms }),
        any::<u32>().prop_map(|reason| FrameBody::Goodbye { reason }),
        bytes_up_to(100).prop_map(|chunk| FrameBody::Continuation { chunk }),
    ];
    // Mostly small ids, so frames hit the requests a core has in flight.
    (
        body,
        prop_oneof![3 => 1u64..4, 1 => 1u64..],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(body, id, more, zero)| {
            let ty = body.frame_type();
            let id = match ty.id_rule() {
                wirepool_proto::IdRule::Zero => 0,
                wirepool_proto::IdRule::NonZero => id,
                wirepool_proto::IdRule::Any => {
                    if zero {
                        0
                    } else {
                        id
                    }
                }
            };
            Frame {
                id,
                more: more && ty.can_continue(),
                body,
            }
        })
}

fn decode_all(data: &[u8], cuts: &[usize]) -> (Vec<Value>, Option<u32>) {
    let mut dec = FrameDecoder::new(16_777_216);
    let mut frames = Vec::new();
    let mut at = 0;
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    bounds.push(data.len());
    bounds.sort_unstable();
    for end in bounds {
        dec.receive(&data[at..end]);
        at = end;
        loop {
            match dec.next_frame() {
                Ok(Some(f)) => frames.push(frame_to_json(&f)),
                Ok(None) => break,
                Err(e) => return (frames, Some(e.code.code())),
            }
        }
    }
    (frames, dec.end_of_input().err().map(|e| e.code.code()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn encode_then_decode_is_identity(frames in vec(frame(), 1..8), cuts in vec(any::<usize>(), 0..6)) {
        let mut wire = Vec::new();
        for f in &frames {
            f.encode(&mut wire).expect("valid frame encodes");
        }
        let expected_len: usize = frames.iter().map(Frame::encoded_len).sum();
        prop_assert_eq!(wire.len(), expected_len);
        let (decoded, error) = decode_all(&wire, &cuts);
        prop_assert_eq!(error, None);
        let want: Vec<Value> = frames.iter().map(frame_to_json).collect();
        prop_assert_eq!(decoded, want);
    }

    #[test]
    fn arbitrary_bytes_decode_the_same_under_any_chunking(data in vec(any::<u8>(), 0..300), cuts in vec(any::<usize>(), 1..8)) {
        prop_assert_eq!(decode_all(&data, &[]), decode_all(&data, &cuts));
    }

    #[test]
    fn parent_core_is_chunking_invariant(frames in vec(frame(), 0..10), cuts in vec(any::<usize>(), 1..8)) {
        let mut wire = Vec::new();
        for f in &frames {
            f.encode(&mut wire).expect("valid frame encodes");
        }
        prop_assert_eq!(run_parent(&wire, &[]), run_parent(&wire, &cuts));
    }

    #[test]
    fn rows_builder_splits_rows_across_frames_without_loss(shapes in vec((0usize..3000, any::<u8>()), 1..200)) {
        // A small limit so frames fill up; every row comes back once, in order. Rows are
        // (length, fill byte): random lengths are what matter here, and cheap to generate.
        let rows: Vec<Vec<u8>> = shapes.iter().map(|&(len, fill)| vec![fill; len]).collect();
        let limit = 8192u32;
        let mut wire = Vec::new();
        let mut pending = rows.iter().peekable();
        while pending.peek().is_some() {
            let mut b = RowsBuilder::new(&mut wire, 3, limit);
            while let Some(row) = pending.peek() {
                if !b.append(row).expect("a row of < 3000 bytes fits 8 KiB") {
                    break;
                }
                pending.next();
            }
            prop_assert!(b.count() > 0);
            b.finish().expect("finish");
        }
        let mut dec = FrameDecoder::new(limit);
        dec.receive(&wire);
        let mut back = Vec::new();
        while let Some(f) = dec.next_frame().expect("valid") {
            let FrameBody::Rows(r) = f.body else { panic!("not ROWS") };
            prop_assert!(r.payload().len() <= limit as usize);
            back.extend(r.iter().map(<[u8]>::to_vec));
        }
        prop_assert_eq!(back, rows);
    }

}

proptest! {
    // Bodies up to 300 KB: fewer cases keep the debug build fast.
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn continued_messages_reassemble_at_the_worker(body in vec(any::<u8>(), 0..300_000), cuts in vec(any::<usize>(), 0..6)) {
        let (mut parent, mut worker) = open_pair(65_536);
        let mut wire = Vec::new();
        let id = parent.send_request(0, 0, 7, &body, &mut wire).expect("request");
        let mut got = None;
        let mut at = 0;
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
        bounds.push(wire.len());
        bounds.sort_unstable();
        for end in bounds {
            worker.receive(&wire[at..end]);
            at = end;
            while let Some(ev) = worker.next_event().expect("valid stream") {
                prop_assert!(got.is_none(), "one event per message");
                got = Some(ev);
            }
        }
        match got {
            Some(wirepool_proto::Event::Request { id: got_id, body: got_body, timeout_us, .. }) => {
                prop_assert_eq!(got_id, id);
                prop_assert_eq!(timeout_us, 7);
                prop_assert_eq!(&got_body[..], &body[..]);
            }
            other => prop_assert!(false, "expected REQUEST, got {:?}", other),
        }
    }
}

/// A parent that has completed the handshake and sent requests 1 (unary) and 2 (stream), fed
/// `wire` in the chunks `cuts` picks: its events (as JSON) and final error code.
fn run_parent(wire: &[u8], cuts: &[usize]) -> (Vec<Value>, Option<u32>) {
    let (mut parent, _) = open_pair(1 << 20);
    let mut out = Vec::new();
    parent.send_request(0, 0, 0, b"", &mut out).expect("unary");
    parent.send_request(1, 0, 0, b"", &mut out).expect("stream");
    let mut events = Vec::new();
    let mut at = 0;
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    bounds.push(wire.len());
    bounds.sort_unstable();
    for end in bounds {
        parent.receive(&wire[at..end]);
        at = end;
        loop {
            match parent.next_event() {
                Ok(Some(ev)) => events.push(event_to_json(&ev)),
                Ok(None) => break,
                Err(e) => return (events, Some(e.code.code())),
            }
        }
    }
    (events, parent.end_of_input().err().map(|e| e.code.code()))
}

/// A parent and a worker past the handshake, with methods 0 (unary) and 1 (stream).
fn open_pair(max_frame_size: u32) -> (Connection, Connection) {
    let mut parent = Connection::new_parent();
    let mut worker = Connection::new_worker();
    let hello = Hello {
        max_concurrency: 8,
        methods: vec![
            MethodInfo {
                name: "unary".into(),
                kind: MethodKind::Unary,
                codecs: vec![0],
            },
            MethodInfo {
                name: "stream".into(),
                kind: MethodKind::Stream,
                codecs: vec![0],
            },
        ],
        ..Hello::new("prop", "1")
    };
    let mut wire = Vec::new();
    worker.send_hello(&hello, &mut wire).expect("hello");
    parent.receive(&wire);
    assert!(matches!(
        parent.next_event(),
        Ok(Some(wirepool_proto::Event::Hello(_)))
    ));
    let welcome = Welcome {
        max_frame_size,
        max_message_size: 1 << 30,
        ..Welcome::for_hello(&hello, 1).expect("v1")
    };
    let mut wire = Vec::new();
    parent.send_welcome(&welcome, &mut wire).expect("welcome");
    worker.receive(&wire);
    assert!(matches!(
        worker.next_event(),
        Ok(Some(wirepool_proto::Event::Welcome(_)))
    ));
    (parent, worker)
}
