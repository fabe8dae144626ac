//! Behaviours of the typed send API that the vectors (which use the generic `send`) do not show.

use wirepool_proto::{
    Connection, ErrorCode, Event, FrameBody, FrameDecoder, Hello, MethodInfo, MethodKind,
    RowsBuilder, Welcome,
};

const UNARY: u16 = 0;
const STREAM: u16 = 1;

fn hello(max_concurrency: u32) -> Hello {
    Hello {
        max_concurrency,
        methods: vec![
            MethodInfo {
                name: "echo".into(),
                kind: MethodKind::Unary,
                codecs: vec![0, 1],
            },
            MethodInfo {
                name: "count".into(),
                kind: MethodKind::Stream,
                codecs: vec![1],
            },
        ],
        ..Hello::new("test", "1")
    }
}

/// Parent and worker past the handshake with these WELCOME limits.
fn open_pair(welcome: impl FnOnce(Welcome) -> Welcome) -> (Connection, Connection) {
    let mut parent = Connection::new_parent();
    let mut worker = Connection::new_worker();
    let hello = hello(4);
    let mut wire = Vec::new();
    worker.send_hello(&hello, &mut wire).unwrap();
    parent.receive(&wire);
    assert!(matches!(
        parent.next_event().unwrap(),
        Some(Event::Hello(_))
    ));
    let w = welcome(Welcome::for_hello(&hello, 1).unwrap());
    let mut wire = Vec::new();
    parent.send_welcome(&w, &mut wire).unwrap();
    worker.receive(&wire);
    assert!(matches!(
        worker.next_event().unwrap(),
        Some(Event::Welcome(_))
    ));
    (parent, worker)
}

/// Deliver `wire` to `to` and collect every event.
fn deliver(to: &mut Connection, wire: &mut Vec<u8>) -> Vec<Event> {
    to.receive(wire);
    wire.clear();
    let mut events = Vec::new();
    while let Some(ev) = to.next_event().unwrap() {
        events.push(ev);
    }
    events
}

fn start_stream(parent: &mut Connection, worker: &mut Connection) -> u64 {
    let mut wire = Vec::new();
    let id = parent.send_request(STREAM, 1, 0, b"{}", &mut wire).unwrap();
    let events = deliver(worker, &mut wire);
    assert!(matches!(events[..], [Event::Request { id: got, .. }] if got == id));
    id
}

#[test]
fn stream_credit_blocks_rows_until_a_grant_arrives() {
    let (mut parent, mut worker) = open_pair(|w| Welcome {
        initial_credit: 16,
        ..w
    });
    let id = start_stream(&mut parent, &mut worker);
    let mut wire = Vec::new();

    assert!(worker.can_send_rows(id));
    let mut rows = worker.rows(id, &mut wire).unwrap();
    for row in [&b"1"[..], b"2", b"3"] {
        assert!(rows.append(row).unwrap());
    }
    assert_eq!(rows.finish().unwrap().payload_len, 19);
    assert_eq!(worker.credit(id), Some(-3));
    assert!(!worker.can_send_rows(id));
    assert_eq!(
        worker.rows(id, &mut wire).err().unwrap().code,
        ErrorCode::FlowControl
    );

    let events = deliver(&mut parent, &mut wire);
    let [Event::Rows { rows, .. }] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(parent.credit(id), Some(-3));
    // The consumer reads the frame: 19 bytes is past half of the 16-byte window.
    assert_eq!(
        parent
            .consumed(id, rows.payload().len(), &mut wire)
            .unwrap(),
        19
    );
    assert_eq!(parent.credit(id), Some(16));

    let events = deliver(&mut worker, &mut wire);
    assert_eq!(events, vec![Event::Credit { id, bytes: 19 }]);
    assert!(worker.can_send_rows(id));
}

#[test]
fn consumed_waits_for_half_the_window() {
    let (mut parent, mut worker) = open_pair(|w| Welcome {
        initial_credit: 1000,
        ..w
    });
    let id = start_stream(&mut parent, &mut worker);
    let mut wire = Vec::new();
    assert_eq!(parent.consumed(id, 300, &mut wire).unwrap(), 0);
    assert!(wire.is_empty());
    assert_eq!(parent.consumed(id, 250, &mut wire).unwrap(), 550);
    assert_eq!(wire.len(), 20);
}

#[test]
fn send_end_carries_the_row_count_the_core_counted() {
    let (mut parent, mut worker) = open_pair(|w| w);
    let id = start_stream(&mut parent, &mut worker);
    let mut wire = Vec::new();
    for batch in 0..3 {
        let mut rows = worker.rows(id, &mut wire).unwrap();
        for i in 0..=batch {
            assert!(rows
                .append_with(|buf| buf.extend_from_slice(format!("row {i}").as_bytes()))
                .unwrap());
        }
        rows.finish().unwrap();
    }
    worker.send_end(id, b"summary", &mut wire).unwrap();
    assert_eq!(worker.in_flight(), 0);
    let events = deliver(&mut parent, &mut wire);
    assert_eq!(events.len(), 4);
    assert!(
        matches!(&events[3], Event::End { row_count: 6, summary, .. } if &summary[..] == b"summary")
    );
    assert_eq!(parent.in_flight(), 0);
}

#[test]
fn large_result_is_split_and_reassembled() {
    let (mut parent, mut worker) = open_pair(|w| Welcome {
        max_frame_size: 65_536,
        ..w
    });
    let mut wire = Vec::new();
    let id = parent.send_request(UNARY, 0, 0, b"", &mut wire).unwrap();
    deliver(&mut worker, &mut wire);
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    worker.send_result(id, &body, &mut wire).unwrap();
    assert_eq!(
        wire.len(),
        body.len() + 4 * 16,
        "4 frames of at most 65,536 bytes"
    );
    let events = deliver(&mut parent, &mut wire);
    let [Event::Result {
        id: got,
        body: got_body,
    }] = &events[..]
    else {
        panic!("{events:?}")
    };
    assert_eq!(*got, id);
    assert_eq!(&got_body[..], &body[..]);
}

#[test]
fn message_above_max_message_size_is_refused_before_anything_is_written() {
    let (mut parent, _worker) = open_pair(|w| Welcome {
        max_frame_size: 65_536,
        max_message_size: 100_000,
        ..w
    });
    let mut wire = Vec::new();
    let e = parent
        .send_request(UNARY, 0, 0, &[0; 100_000], &mut wire)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::MessageTooLarge);
    assert!(wire.is_empty());
    assert_eq!(parent.in_flight(), 0);
}

#[test]
fn requests_beyond_max_in_flight_are_refused_locally() {
    let (mut parent, _worker) = open_pair(|w| Welcome {
        max_in_flight: 2,
        ..w
    });
    let mut wire = Vec::new();
    assert!(parent.can_send_request());
    parent.send_request(UNARY, 0, 0, b"", &mut wire).unwrap();
    parent.send_request(UNARY, 0, 0, b"", &mut wire).unwrap();
    assert!(!parent.can_send_request());
    let len = wire.len();
    assert_eq!(
        parent
            .send_request(UNARY, 0, 0, b"", &mut wire)
            .unwrap_err()
            .code,
        ErrorCode::Overloaded
    );
    assert_eq!(wire.len(), len);
}

#[test]
fn unknown_method_and_drain_are_refused_on_send() {
    let (mut parent, _worker) = open_pair(|w| w);
    let mut wire = Vec::new();
    assert_eq!(
        parent
            .send_request(7, 0, 0, b"", &mut wire)
            .unwrap_err()
            .code,
        ErrorCode::UnknownMethod
    );
    parent.send_drain(100, &mut wire).unwrap();
    assert_eq!(
        parent
            .send_request(UNARY, 0, 0, b"", &mut wire)
            .unwrap_err()
            .code,
        ErrorCode::Draining
    );
}

#[test]
fn kind_is_checked_on_send() {
    let (mut parent, mut worker) = open_pair(|w| w);
    let mut wire = Vec::new();
    let unary = parent.send_request(UNARY, 0, 0, b"", &mut wire).unwrap();
    deliver(&mut worker, &mut wire);
    assert_eq!(
        worker.rows(unary, &mut wire).err().unwrap().code,
        ErrorCode::KindMismatch
    );
    assert_eq!(
        worker.send_end(unary, b"", &mut wire).unwrap_err().code,
        ErrorCode::KindMismatch
    );
    assert_eq!(
        parent.send_credit(unary, 10, &mut wire).unwrap_err().code,
        ErrorCode::KindMismatch
    );
    assert!(wire.is_empty());
    worker.send_result(unary, b"ok", &mut wire).unwrap();
    assert_eq!(
        worker
            .send_result(unary, b"again", &mut wire)
            .unwrap_err()
            .code,
        ErrorCode::UnknownId
    );
}

#[test]
fn nothing_is_sent_after_goodbye_or_a_fatal_error() {
    let (mut parent, mut worker) = open_pair(|w| w);
    let mut wire = Vec::new();
    worker.send_goodbye(0, &mut wire).unwrap();
    assert_eq!(
        worker.send_ping(*b"12345678", &mut wire).unwrap_err().code,
        ErrorCode::UnexpectedFrame
    );
    assert_eq!(
        deliver(&mut parent, &mut wire),
        vec![Event::Goodbye { reason: 0 }]
    );
    assert_eq!(
        parent
            .send_request(UNARY, 0, 0, b"", &mut wire)
            .unwrap_err()
            .code,
        ErrorCode::UnexpectedFrame
    );

    let (mut parent, _worker) = open_pair(|w| w);
    let fatal = wirepool_proto::ProtocolError::new(ErrorCode::BadFlags, 0, "test");
    parent.send_fatal(&fatal, &mut wire).unwrap();
    assert_eq!(
        parent.send_ping(*b"12345678", &mut wire).unwrap_err().code,
        ErrorCode::UnexpectedFrame
    );
    let frame = wirepool_proto::decode_frame(&wire, 65_536).unwrap();
    assert!(matches!(frame.body, FrameBody::Error { code: 104, .. }));
}

#[test]
fn hello_must_fit_the_handshake_frame_limit() {
    let mut worker = Connection::new_worker();
    let methods = (0..300)
        .map(|i| MethodInfo {
            name: format!("{i:0>250}"),
            kind: MethodKind::Unary,
            codecs: vec![0],
        })
        .collect();
    let big = Hello {
        methods,
        ..Hello::new("test", "1")
    };
    let mut wire = Vec::new();
    assert_eq!(
        worker.send_hello(&big, &mut wire).unwrap_err().code,
        ErrorCode::FrameTooLarge
    );
    assert!(wire.is_empty());
}

#[test]
fn rows_builder_refuses_a_row_that_can_never_fit() {
    let mut wire = vec![1, 2, 3];
    let mut rows = RowsBuilder::new(&mut wire, 5, 65_536);
    assert_eq!(
        rows.append(&[0; 65_529]).unwrap_err().code,
        ErrorCode::RowTooLarge
    );
    assert!(
        rows.append(&[0; 65_528]).unwrap(),
        "count + length + 65,528 bytes is exactly 65,536"
    );
    assert!(!rows.append(b"").unwrap(), "frame full");
    let written = rows.finish().unwrap();
    assert_eq!(written.payload_len, 65_536);
    assert_eq!(wire.len(), 3 + 16 + 65_536);
}

#[test]
fn rows_builder_undoes_unfinished_and_rejected_rows() {
    let mut wire = vec![9];
    {
        let mut rows = RowsBuilder::new(&mut wire, 5, 65_536);
        rows.append(b"kept only if finished").unwrap();
    }
    assert_eq!(wire, [9], "a dropped builder leaves nothing behind");

    let mut rows = RowsBuilder::new(&mut wire, 5, 65_536);
    assert!(rows.append(b"a").unwrap());
    let e = rows
        .append_with(|buf| buf.extend_from_slice(&[0; 70_000]))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::RowTooLarge);
    assert!(rows
        .append_with(|buf| buf.extend_from_slice(&[0; 65_525]))
        .is_ok_and(|fit| !fit));
    assert_eq!(rows.count(), 1);
    rows.finish().unwrap();
    let frame = wirepool_proto::decode_frame(&wire[1..], 65_536).unwrap();
    let FrameBody::Rows(rows) = frame.body else {
        panic!()
    };
    assert_eq!(rows.iter().collect::<Vec<_>>(), vec![&b"a"[..]]);

    let mut empty = Vec::new();
    assert_eq!(
        RowsBuilder::new(&mut empty, 5, 65_536)
            .finish()
            .unwrap()
            .count,
        0
    );
    assert!(empty.is_empty(), "no rows, no frame");
}

#[test]
fn read_buffer_reserves_the_whole_checked_frame() {
    let mut wire = Vec::new();
    wirepool_proto::encode_message(
        &mut wire,
        1,
        wirepool_proto::MessageHead::Result,
        &[7; 1 << 20],
        1 << 20,
    )
    .unwrap();
    let mut dec = FrameDecoder::new(1 << 20);
    dec.read_buffer().extend_from_slice(&wire[..16]);
    assert!(dec.next_frame().unwrap().is_none());
    assert!(
        dec.read_buffer().capacity() >= 1 << 20,
        "room for the payload after its length was checked"
    );
    dec.read_buffer().extend_from_slice(&wire[16..]);
    let frame = dec.next_frame().unwrap().unwrap();
    assert!(matches!(frame.body, FrameBody::Result { ref body } if body.len() == 1 << 20));
}

#[test]
fn frame_too_large_is_refused_from_the_header_alone() {
    let mut dec = FrameDecoder::new(65_536);
    let header = [
        0xff, 0xff, 0xff, 0xff, 0x12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
    ];
    dec.receive(&header);
    assert_eq!(dec.next_frame().unwrap_err().code, ErrorCode::FrameTooLarge);
    assert!(
        dec.read_buffer().capacity() < 1 << 20,
        "nothing reserved for the bogus length"
    );
}

#[test]
fn core_types_move_between_tasks() {
    fn send_static<T: Send + Sync + 'static>() {}
    send_static::<Connection>();
    send_static::<Event>();
    send_static::<wirepool_proto::Frame>();
    send_static::<wirepool_proto::ProtocolError>();
}

#[test]
fn a_result_sent_frame_by_frame_lets_other_requests_through() {
    let (mut parent, mut worker) = open_pair(|w| Welcome {
        max_frame_size: 65_536,
        ..w
    });
    let mut wire = Vec::new();
    let unary = parent.send_request(UNARY, 0, 0, b"", &mut wire).unwrap();
    deliver(&mut worker, &mut wire);
    let stream = start_stream(&mut parent, &mut worker);

    let body = vec![5u8; 150_000];
    let mut cursor = worker.begin_result(unary, &body, &mut wire).unwrap();
    assert_eq!(cursor.remaining(), 150_000 - 65_536);
    // While the result is half sent, EVENT for it is refused (it would break the message) but
    // the other request's rows go out between its frames.
    assert_eq!(
        worker
            .send_event(unary, "t", "", &mut wire)
            .unwrap_err()
            .code,
        ErrorCode::Continuation
    );
    let mut frames = 0;
    loop {
        let mut rows = worker.rows(stream, &mut wire).unwrap();
        assert!(rows.append(format!("row {frames}").as_bytes()).unwrap());
        rows.finish().unwrap();
        frames += 1;
        if worker
            .send_next_frame(&mut cursor, &body, &mut wire)
            .unwrap()
        {
            break;
        }
    }
    assert_eq!(
        frames, 2,
        "150,000 bytes: a first frame and two CONTINUATIONs"
    );
    assert!(!worker.is_in_flight(unary));
    worker.send_end(stream, b"", &mut wire).unwrap();

    let events = deliver(&mut parent, &mut wire);
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            Event::Rows { .. } => "rows",
            Event::Result { body, .. } if body.len() == 150_000 => "result",
            Event::End { row_count: 2, .. } => "end",
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["rows", "rows", "result", "end"]);
}

#[test]
fn error_abandons_a_result_being_sent_and_cancel_a_request_being_sent() {
    let (mut parent, mut worker) = open_pair(|w| Welcome {
        max_frame_size: 65_536,
        ..w
    });
    let mut wire = Vec::new();
    let body = vec![1u8; 100_000];

    let mut request = parent.begin_request(UNARY, 0, 0, &body, &mut wire).unwrap();
    parent.send_cancel(request.id(), &mut wire).unwrap();
    let e = parent
        .send_next_frame(&mut request, &body, &mut wire)
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Continuation);
    assert_eq!(
        deliver(&mut worker, &mut wire),
        vec![Event::Reject {
            id: request.id(),
            code: ErrorCode::Cancelled
        }]
    );
    worker
        .send_error(request.id(), ErrorCode::Cancelled.code(), "", "", &mut wire)
        .unwrap();
    assert!(matches!(
        deliver(&mut parent, &mut wire)[..],
        [Event::Error { code: 205, .. }]
    ));

    let id = parent.send_request(UNARY, 0, 0, b"", &mut wire).unwrap();
    deliver(&mut worker, &mut wire);
    let mut result = worker.begin_result(id, &body, &mut wire).unwrap();
    worker
        .send_error(id, ErrorCode::HandlerError.code(), "gave up", "", &mut wire)
        .unwrap();
    assert_eq!(
        worker
            .send_next_frame(&mut result, &body, &mut wire)
            .unwrap_err()
            .code,
        ErrorCode::Continuation
    );
    let events = deliver(&mut parent, &mut wire);
    assert!(
        matches!(&events[..], [Event::Error { code: 203, message, .. }] if message == "gave up")
    );
    assert_eq!(parent.in_flight(), 0);
}

#[test]
fn a_second_terminal_is_refused_but_a_reject_is_answered_once() {
    let (mut parent, mut worker) = open_pair(|w| w);
    let mut wire = Vec::new();
    let id = parent.send_request(UNARY, 0, 0, b"", &mut wire).unwrap();
    let bad_codec = parent.send_request(STREAM, 0, 0, b"", &mut wire).unwrap();
    let events = deliver(&mut worker, &mut wire);
    assert_eq!(
        events[1],
        Event::Reject {
            id: bad_codec,
            code: ErrorCode::CodecUnsupported
        }
    );

    worker.send_result(id, b"done", &mut wire).unwrap();
    let late = worker.send_error(id, ErrorCode::DeadlineExceeded.code(), "", "", &mut wire);
    assert_eq!(late.unwrap_err().code, ErrorCode::UnknownId);

    let code = ErrorCode::CodecUnsupported.code();
    worker
        .send_error(bad_codec, code, "codec 0", "", &mut wire)
        .unwrap();
    let again = worker.send_error(bad_codec, code, "codec 0", "", &mut wire);
    assert_eq!(again.unwrap_err().code, ErrorCode::UnknownId);

    let events = deliver(&mut parent, &mut wire);
    assert!(matches!(
        &events[..],
        [Event::Result { .. }, Event::Error { code: 201, .. }]
    ));
    assert_eq!(parent.in_flight(), 0);
}

/// Parent -> worker: a continued REQUEST of `len` bytes of `fill`; the body the worker gets.
fn send_large(
    parent: &mut Connection,
    worker: &mut Connection,
    len: usize,
    fill: u8,
) -> bytes::Bytes {
    let mut wire = Vec::new();
    parent
        .send_request(UNARY, 0, 0, &vec![fill; len], &mut wire)
        .unwrap();
    assert!(wire.len() > 65_536 + 16, "the request must be continued");
    let mut events = deliver(worker, &mut wire);
    let Some(Event::Request { body, .. }) = events.pop() else {
        panic!("no request")
    };
    assert!(events.is_empty());
    body
}

#[test]
fn continued_messages_land_in_one_buffer_reused_once_the_reader_drops_them() {
    let (mut parent, mut worker) = open_pair(|w| Welcome {
        max_frame_size: 65_536,
        ..w
    });
    let first = send_large(&mut parent, &mut worker, 200_000, 1);
    // Held by the reader: the next message must not touch it.
    let second = send_large(&mut parent, &mut worker, 200_000, 2);
    assert!(first.iter().all(|&b| b == 1) && first.len() == 200_000);
    assert!(second.iter().all(|&b| b == 2) && second.len() == 200_000);
    let second_at = second.as_ptr();
    drop((first, second));
    // Dropped: the next message reuses the last one's memory instead of fresh pages.
    let third = send_large(&mut parent, &mut worker, 150_000, 3);
    assert_eq!(third.as_ptr(), second_at);
    assert!(third.iter().all(|&b| b == 3) && third.len() == 150_000);
    // Larger than the buffer held: it grows, and the content is whole.
    drop(third);
    let fourth = send_large(&mut parent, &mut worker, 300_000, 4);
    assert!(fourth.iter().all(|&b| b == 4) && fourth.len() == 300_000);
}

/// Writes `wire` into `dec` the way a socket read does: at most the spare capacity of
/// `read_buffer()` at a time, and at most `step` bytes.
fn read_like_a_socket(
    dec: &mut FrameDecoder,
    wire: &[u8],
    step: usize,
) -> Vec<wirepool_proto::Frame> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let buf = dec.read_buffer();
        let room = buf.capacity() - buf.len();
        assert!(room > 0, "read_buffer offers no room");
        let n = room.min(step).min(wire.len() - at);
        buf.extend_from_slice(&wire[at..at + n]);
        at += n;
        while let Some(frame) = dec.next_frame().unwrap() {
            frames.push(frame);
        }
    }
    frames
}

#[test]
fn a_large_payload_is_read_into_a_buffer_of_its_own_size_reused_once_dropped() {
    let mut wire = Vec::new();
    for fill in [1u8, 2, 3] {
        let body = bytes::Bytes::from(vec![fill; 3 << 20]);
        wirepool_proto::Frame::new(7, FrameBody::Result { body })
            .encode(&mut wire)
            .unwrap();
    }
    let one = wire.len() / 3;
    for step in [10_000, 65_536, 70_000, usize::MAX] {
        let mut dec = FrameDecoder::new(4 << 20);
        // The first frame's header and a little of its payload: from then on, the room offered
        // is exactly the missing payload, so a read never runs into the next frame.
        let first = read_like_a_socket(&mut dec, &wire[..16 + 10], step);
        assert!(first.is_empty());
        let buf = dec.read_buffer();
        assert_eq!(buf.capacity() - buf.len(), (3 << 20) - 10);
        let mut frames = read_like_a_socket(&mut dec, &wire[16 + 10..one], step);
        assert_eq!(frames.len(), 1);
        let first_at = match &frames[0].body {
            FrameBody::Result { body } => body.as_ptr(),
            other => panic!("{other:?}"),
        };
        frames.clear();
        // Dropped: the next large payload lands in the same memory.
        frames.extend(read_like_a_socket(&mut dec, &wire[one..], step));
        assert_eq!(frames.len(), 2);
        for (frame, fill) in frames.iter().zip([2u8, 3]) {
            let FrameBody::Result { body } = &frame.body else {
                panic!("{:?}", frame.body)
            };
            assert!(body.len() == 3 << 20 && body.iter().all(|&b| b == fill));
        }
        let FrameBody::Result { body } = &frames[0].body else {
            unreachable!()
        };
        assert_eq!(body.as_ptr(), first_at, "step {step}");
        assert!(dec.is_idle());
    }
}

#[test]
fn continued_messages_read_in_any_chunking_arrive_whole() {
    // Large continuations are read straight into the message's buffer: whatever the reads look
    // like, with frames of other requests in between, every message arrives byte for byte.
    let bodies: Vec<Vec<u8>> = [(1u32, 5 << 20), (2, (4 << 20) - 12), (3, (5 << 20) + 1)]
        .iter()
        .map(|&(seed, len)| {
            (0..len)
                .map(|i| (i as u32).wrapping_mul(seed) as u8)
                .collect()
        })
        .collect();
    for step in [7_000, 65_536 + 16, 1_000_003, usize::MAX] {
        let (mut parent, mut worker) = open_pair(|w| Welcome {
            max_frame_size: 2 << 20,
            max_in_flight: 4,
            ..w
        });
        let mut wire = Vec::new();
        for (i, body) in bodies.iter().enumerate() {
            parent.send_request(UNARY, 0, 0, body, &mut wire).unwrap();
            if i == 0 {
                parent
                    .send_request(UNARY, 0, 0, b"small", &mut wire)
                    .unwrap();
            }
        }
        let mut got = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let buf = worker.read_buffer();
            let n = (buf.capacity() - buf.len()).min(step).min(wire.len() - at);
            buf.extend_from_slice(&wire[at..at + n]);
            at += n;
            while let Some(ev) = worker.next_event().unwrap() {
                let Event::Request { body, .. } = ev else {
                    panic!("{ev:?}")
                };
                got.push(body);
            }
        }
        assert_eq!(got.len(), 4, "step {step}");
        assert_eq!(&got[1][..], b"small");
        for (body, want) in [&got[0], &got[2], &got[3]].into_iter().zip(&bodies) {
            assert!(body[..] == want[..], "step {step}");
        }
        assert_eq!(worker.incomplete_frame_len(), 0);
    }
}

/// A row whose writer fails or panics leaves nothing in a `RowsFrame`; one that does not fit is
/// removed; one that can never fit is ROW_TOO_LARGE.
#[test]
fn rows_frame_keeps_only_whole_rows() {
    use wirepool_proto::{AppendError, RowsFrame};
    let mut frame = RowsFrame::new(3, 64);
    assert!(frame.append(b"kept").unwrap());
    let failed = frame.append_with(|buf| {
        buf.extend_from_slice(b"half");
        Err("no")
    });
    assert_eq!(failed, Err(AppendError::Write("no")));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = frame.append_with(|buf| -> Result<(), ()> {
            buf.extend_from_slice(b"torn");
            panic!("a row's serializer panicked")
        });
    }));
    assert!(panicked.is_err());
    assert!(
        !frame.append(&[1; 50]).unwrap(),
        "12 + 4 + 50 bytes do not fit 64"
    );
    assert!(matches!(
        frame.append(&[1; 57]),
        Err(e) if e.code == ErrorCode::RowTooLarge
    ));
    assert!(frame.append(b"last").unwrap());
    assert_eq!((frame.count(), frame.payload_len()), (2, 4 + 8 + 8));
    let wire = frame.finish_standalone().unwrap();
    let FrameBody::Rows(rows) = wirepool_proto::decode_frame(&wire, 64).unwrap().body else {
        panic!("not ROWS")
    };
    assert_eq!(rows.iter().collect::<Vec<_>>(), vec![&b"kept"[..], b"last"]);
}
