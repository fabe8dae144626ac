//! PROTOCOL.md 14.3, "Refusal": every row of the refused-send table, table-driven. A refused send
//! returns a `ProtocolError` with the table's code, writes nothing, changes no state (the whole
//! core, compared through its `Debug` form) and does not fail the connection.

use wirepool_proto::{
    Connection, ErrorCode, Frame, FrameBody, Hello, MethodInfo, MethodKind, ProtocolError,
    RowsFrame, Welcome,
};

const UNARY: u16 = 0;
const STREAM: u16 = 1;

fn hello() -> Hello {
    Hello {
        max_concurrency: 4,
        methods: vec![
            MethodInfo {
                name: "echo".into(),
                kind: MethodKind::Unary,
                codecs: vec![0],
            },
            MethodInfo {
                name: "count".into(),
                kind: MethodKind::Stream,
                codecs: vec![0],
            },
        ],
        ..Hello::new("test", "1")
    }
}

/// A parent and a worker past the handshake: max_in_flight 2, 64 KiB frames, 200 KB messages,
/// 100 bytes of stream credit.
fn open_pair() -> (Connection, Connection) {
    let (mut parent, mut worker) = (Connection::new_parent(), Connection::new_worker());
    let mut wire = Vec::new();
    worker.send_hello(&hello(), &mut wire).unwrap();
    parent.receive(&wire);
    parent.next_event().unwrap().unwrap();
    let welcome = Welcome {
        max_in_flight: 2,
        max_frame_size: 65_536,
        max_message_size: 200_000,
        initial_credit: 100,
        ..Welcome::for_hello(&hello(), 1).unwrap()
    };
    wire.clear();
    parent.send_welcome(&welcome, &mut wire).unwrap();
    worker.receive(&wire);
    worker.next_event().unwrap().unwrap();
    (parent, worker)
}

/// Sends request `method` from the parent and delivers it to the worker; returns its id.
fn start(parent: &mut Connection, worker: &mut Connection, method: u16) -> u64 {
    let mut wire = Vec::new();
    let id = parent.send_request(method, 0, 0, b"x", &mut wire).unwrap();
    worker.receive(&wire);
    worker.next_event().unwrap().unwrap();
    id
}

type Setup = fn() -> Connection;
type Refused = fn(&mut Connection, &mut Vec<u8>) -> Result<(), ProtocolError>;

fn parent_open() -> Connection {
    open_pair().0
}

fn worker_open() -> Connection {
    open_pair().1
}

fn parent_with_unary() -> Connection {
    let (mut parent, mut worker) = open_pair();
    start(&mut parent, &mut worker, UNARY);
    parent
}

fn parent_with_stream() -> Connection {
    let (mut parent, mut worker) = open_pair();
    start(&mut parent, &mut worker, STREAM);
    parent
}

fn worker_with_unary() -> Connection {
    let (mut parent, mut worker) = open_pair();
    start(&mut parent, &mut worker, UNARY);
    worker
}

fn worker_with_stream() -> Connection {
    let (mut parent, mut worker) = open_pair();
    start(&mut parent, &mut worker, STREAM);
    worker
}

/// Request 1 is a stream whose 100 bytes of credit are spent.
fn worker_out_of_credit() -> Connection {
    let mut worker = worker_with_stream();
    let mut wire = Vec::new();
    let mut rows = worker.rows(1, &mut wire).unwrap();
    assert!(rows.append(&[0; 200]).unwrap());
    rows.finish().unwrap();
    assert!(!worker.can_send_rows(1));
    worker
}

/// Request 1 (unary) has the first frame of a 100 KB RESULT written, the rest not yet.
fn worker_mid_result() -> Connection {
    let mut worker = worker_with_unary();
    let cursor = worker
        .begin_result(1, &[7; 100_000], &mut Vec::new())
        .unwrap();
    assert!(!cursor.is_done());
    worker
}

fn request_frame(id: u64, body: usize) -> Frame {
    Frame::new(
        id,
        FrameBody::Request {
            method: UNARY,
            codec: 0,
            timeout_us: 0,
            body: vec![0; body].into(),
        },
    )
}

/// A frame for request `id` holding one row of `len` bytes.
fn one_row_frame(id: u64, max_frame_size: u32, len: usize) -> RowsFrame {
    let mut frame = RowsFrame::new(id, max_frame_size);
    assert!(frame.append(&vec![0; len]).unwrap());
    frame
}

/// One row of 14.3's table (a row may take several cases), in the table's order.
const CASES: &[(&str, ErrorCode, Setup, Refused)] = &[
    (
        "REQUEST before the handshake",
        ErrorCode::UnexpectedFrame,
        Connection::new_parent,
        |c, out| c.send_request(UNARY, 0, 0, b"x", out).map(drop),
    ),
    (
        "PING before the worker's HELLO",
        ErrorCode::UnexpectedFrame,
        Connection::new_worker,
        |c, out| c.send_ping([1; 8], out),
    ),
    (
        "anything after GOODBYE",
        ErrorCode::UnexpectedFrame,
        || {
            let mut worker = worker_open();
            worker.send_goodbye(0, &mut Vec::new()).unwrap();
            worker
        },
        |c, out| c.send_ping([1; 8], out),
    ),
    (
        "anything after a fatal report",
        ErrorCode::UnexpectedFrame,
        || {
            let mut parent = parent_open();
            let fatal = ProtocolError::new(ErrorCode::BadFlags, 0, "test");
            parent.send_fatal(&fatal, &mut Vec::new()).unwrap();
            parent
        },
        |c, out| c.send_drain(0, out),
    ),
    (
        "a frame type the side cannot send (parent RESULT)",
        ErrorCode::UnexpectedFrame,
        parent_with_unary,
        |c, out| {
            let result = Frame::new(1, FrameBody::Result { body: "x".into() });
            c.send(&result, out)
        },
    ),
    (
        "a frame type the side cannot send (worker CANCEL)",
        ErrorCode::UnexpectedFrame,
        worker_with_unary,
        |c, out| c.send_cancel(1, out),
    ),
    (
        "REQUEST after DRAIN",
        ErrorCode::Draining,
        || {
            let mut parent = parent_open();
            parent.send_drain(0, &mut Vec::new()).unwrap();
            parent
        },
        |c, out| c.send_request(UNARY, 0, 0, b"x", out).map(drop),
    ),
    (
        "REQUEST with a method index not in HELLO",
        ErrorCode::UnknownMethod,
        parent_open,
        |c, out| c.send_request(9, 0, 0, b"x", out).map(drop),
    ),
    (
        "REQUEST while max_in_flight requests are in flight",
        ErrorCode::Overloaded,
        || {
            let mut parent = parent_open();
            for _ in 0..2 {
                parent
                    .send_request(UNARY, 0, 0, b"x", &mut Vec::new())
                    .unwrap();
            }
            parent
        },
        |c, out| c.send_request(UNARY, 0, 0, b"x", out).map(drop),
    ),
    (
        "REQUEST id not above the last (send)",
        ErrorCode::DuplicateId,
        parent_with_unary,
        |c, out| c.send(&request_frame(1, 1), out),
    ),
    (
        "CANCEL for an id not in flight",
        ErrorCode::UnknownId,
        parent_open,
        |c, out| c.send_cancel(7, out),
    ),
    (
        "CREDIT for an id not in flight",
        ErrorCode::UnknownId,
        parent_open,
        |c, out| c.send_credit(7, 10, out),
    ),
    (
        "RESULT for an id not in flight",
        ErrorCode::UnknownId,
        worker_open,
        |c, out| c.send_result(7, b"x", out),
    ),
    (
        "ROWS for an id not in flight",
        ErrorCode::UnknownId,
        worker_open,
        |c, out| c.rows(7, out).map(drop),
    ),
    (
        "END for an id not in flight",
        ErrorCode::UnknownId,
        worker_open,
        |c, out| c.send_end(7, b"", out),
    ),
    (
        "ERROR for an id not in flight",
        ErrorCode::UnknownId,
        worker_open,
        |c, out| c.send_error(7, 500, "x", "", out),
    ),
    (
        "EVENT for an id not in flight",
        ErrorCode::UnknownId,
        worker_open,
        |c, out| c.send_event(7, "progress", "", out),
    ),
    (
        "a second terminal",
        ErrorCode::UnknownId,
        || {
            let mut worker = worker_with_unary();
            worker.send_result(1, b"x", &mut Vec::new()).unwrap();
            worker
        },
        |c, out| c.send_error(1, 500, "x", "", out),
    ),
    (
        "CREDIT taking the counter above 2^31-1",
        ErrorCode::CreditOverflow,
        parent_with_stream,
        |c, out| c.send_credit(1, i32::MAX as u32, out),
    ),
    (
        "ROWS while the stream's credit is not positive",
        ErrorCode::FlowControl,
        worker_out_of_credit,
        |c, out| c.rows(1, out).map(drop),
    ),
    (
        "a ROWS frame filled away from the core while the credit is not positive",
        ErrorCode::FlowControl,
        worker_out_of_credit,
        |c, out| {
            c.send_rows(&mut one_row_frame(1, 65_536, 10), out)
                .map(drop)
        },
    ),
    (
        "ROWS on a unary request",
        ErrorCode::KindMismatch,
        worker_with_unary,
        |c, out| c.rows(1, out).map(drop),
    ),
    (
        "a ROWS frame filled away from the core for a unary request",
        ErrorCode::KindMismatch,
        worker_with_unary,
        |c, out| {
            c.send_rows(&mut one_row_frame(1, 65_536, 10), out)
                .map(drop)
        },
    ),
    (
        "END on a unary request",
        ErrorCode::KindMismatch,
        worker_with_unary,
        |c, out| c.send_end(1, b"", out),
    ),
    (
        "RESULT on a stream",
        ErrorCode::KindMismatch,
        worker_with_stream,
        |c, out| c.send_result(1, b"x", out),
    ),
    (
        "CREDIT on a unary request",
        ErrorCode::KindMismatch,
        parent_with_unary,
        |c, out| c.send_credit(1, 10, out),
    ),
    (
        "END whose row_count differs from the rows sent (send)",
        ErrorCode::RowCountMismatch,
        worker_with_stream,
        |c, out| {
            let end = FrameBody::End {
                row_count: 5,
                summary: Default::default(),
            };
            c.send(&Frame::new(1, end), out)
        },
    ),
    (
        "a frame above max_frame_size (send)",
        ErrorCode::FrameTooLarge,
        parent_open,
        |c, out| c.send(&request_frame(1, 70_000), out),
    ),
    (
        "a ROWS frame filled away from the core above max_frame_size",
        ErrorCode::FrameTooLarge,
        worker_with_stream,
        |c, out| {
            c.send_rows(&mut one_row_frame(1, 1 << 20, 70_000), out)
                .map(drop)
        },
    ),
    (
        "a single row that cannot fit in one ROWS frame",
        ErrorCode::RowTooLarge,
        worker_with_stream,
        |c, out| c.rows(1, out)?.append(&[0; 70_000]).map(drop),
    ),
    (
        "a request body above max_message_size",
        ErrorCode::MessageTooLarge,
        parent_open,
        |c, out| c.send_request(UNARY, 0, 0, &[0; 200_001], out).map(drop),
    ),
    (
        "a result above max_message_size",
        ErrorCode::MessageTooLarge,
        worker_with_unary,
        |c, out| c.send_result(1, &[0; 200_001], out),
    ),
    (
        "CONTINUATION with no message of that id being sent",
        ErrorCode::Continuation,
        worker_with_unary,
        |c, out| {
            let chunk = FrameBody::Continuation { chunk: "x".into() };
            c.send(&Frame::new(1, chunk), out)
        },
    ),
    (
        "another frame for an id mid-message",
        ErrorCode::Continuation,
        worker_mid_result,
        |c, out| c.send_event(1, "progress", "", out),
    ),
    (
        "CREDIT for a request still being sent",
        ErrorCode::Continuation,
        || {
            let mut parent = parent_open();
            let cursor = parent
                .begin_request(STREAM, 0, 0, &[7; 100_000], &mut Vec::new())
                .unwrap();
            assert!(!cursor.is_done());
            parent
        },
        |c, out| c.send_credit(1, 10, out),
    ),
];

#[test]
fn every_refused_send_has_its_code_writes_nothing_and_changes_no_state() {
    for (what, code, setup, refused) in CASES {
        let mut conn = setup();
        let before = format!("{conn:?}");
        let mut out = Vec::new();
        let e = refused(&mut conn, &mut out).expect_err(what);
        assert_eq!(e.code, *code, "{what}: {e}");
        assert!(out.is_empty(), "{what}: wrote {} bytes", out.len());
        assert_eq!(format!("{conn:?}"), before, "{what}: the state changed");
        // A refusal is not a failure: receiving goes on.
        assert!(conn.failure().is_none(), "{what}: the core failed");
        assert!(conn.next_event().is_ok(), "{what}: receiving failed");
        // Refused again, the same way: nothing was half done.
        assert_eq!(
            refused(&mut conn, &mut out).unwrap_err().code,
            *code,
            "{what}"
        );
    }
}

/// The table's codes are the whole of 14.3's table, so a row added there without a case here
/// shows up.
#[test]
fn every_code_of_the_table_has_a_case() {
    for code in [
        ErrorCode::UnexpectedFrame,
        ErrorCode::Draining,
        ErrorCode::UnknownMethod,
        ErrorCode::Overloaded,
        ErrorCode::DuplicateId,
        ErrorCode::UnknownId,
        ErrorCode::CreditOverflow,
        ErrorCode::FlowControl,
        ErrorCode::KindMismatch,
        ErrorCode::RowCountMismatch,
        ErrorCode::FrameTooLarge,
        ErrorCode::RowTooLarge,
        ErrorCode::MessageTooLarge,
        ErrorCode::Continuation,
    ] {
        assert!(
            CASES.iter().any(|(_, c, _, _)| *c == code),
            "no case for {code:?}"
        );
    }
}

/// 14.3: `consumed` grants nothing once a stream has ended, whatever was read.
#[test]
fn consumed_grants_nothing_once_the_stream_has_ended() {
    let (mut parent, mut worker) = open_pair();
    let id = start(&mut parent, &mut worker, STREAM);
    let mut wire = Vec::new();
    let mut rows = worker.rows(id, &mut wire).unwrap();
    assert!(rows.append(&[1; 120]).unwrap());
    rows.finish().unwrap();
    worker.send_end(id, b"", &mut wire).unwrap();
    parent.receive(&wire);
    let Some(wirepool_proto::Event::Rows { rows, .. }) = parent.next_event().unwrap() else {
        panic!("no rows")
    };
    assert!(parent.next_event().unwrap().is_some(), "no END");
    assert!(!parent.is_in_flight(id));
    let mut out = Vec::new();
    assert_eq!(parent.consumed(id, rows.payload().len(), &mut out), Ok(0));
    assert!(out.is_empty());
}

/// A refused `send_rows` leaves the frame as it was: it goes whole once the credit is there.
#[test]
fn a_refused_rows_frame_is_kept_for_later() {
    let (mut parent, mut worker) = open_pair();
    let id = start(&mut parent, &mut worker, STREAM);
    let mut wire = Vec::new();
    let mut spend = RowsFrame::new(id, 65_536);
    assert!(spend.append(&[0; 200]).unwrap());
    worker.send_rows(&mut spend, &mut wire).unwrap();
    assert!(spend.is_empty());

    let mut frame = one_row_frame(id, 65_536, 10);
    assert!(frame.append(b"second").unwrap());
    let mut out = Vec::new();
    let e = worker.send_rows(&mut frame, &mut out).unwrap_err();
    assert_eq!(e.code, ErrorCode::FlowControl);
    assert_eq!((frame.count(), out.len()), (2, 0));

    parent.receive(&wire);
    let Some(wirepool_proto::Event::Rows { rows, .. }) = parent.next_event().unwrap() else {
        panic!("no rows")
    };
    wire.clear();
    assert!(
        parent
            .consumed(id, rows.payload().len(), &mut wire)
            .unwrap()
            > 0
    );
    worker.receive(&wire);
    assert!(worker.next_event().unwrap().is_some());
    let written = worker.send_rows(&mut frame, &mut out).unwrap();
    assert_eq!(written.count, 2);
    parent.receive(&out);
    let Some(wirepool_proto::Event::Rows { rows, .. }) = parent.next_event().unwrap() else {
        panic!("no rows")
    };
    let got: Vec<&[u8]> = rows.iter().collect();
    assert_eq!(got, vec![&[0; 10][..], b"second"]);
    worker.send_end(id, b"", &mut out).unwrap();
}
