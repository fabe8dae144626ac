//! Fuzz the connection core with a minimal driver on top. Input: one config byte, then the
//! bytes the peer sends. Config bit 0: role (0 parent, 1 worker); bits 1-7: chunk size - 1.
//!
//! The driver does what a real one does: the worker sends HELLO first and answers requests
//! (a result, a 70 KB result frame by frame, or rows while credit lasts then END), rejects
//! and pings; the parent answers HELLO with WELCOME, starts a unary, a stream and a 70 KB
//! request (frame by frame), and grants credit as it "consumes" rows. Checks: no panic; a refused send writes nothing; the same events and
//! error whatever the chunking.
//!
//! The shared-memory lane (PROTOCOL.md 20) is on: the worker offers it, the parent accepts it,
//! one descriptor is reported (so one region of the peer maps, as zeros), the parent sends a
//! request through a region and the worker answers `echo` through one; views are released.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

use bytes::Bytes;
use wirepool_proto::shm::{ShmAccept, ShmMapping, ShmOffer, ShmRange};
use wirepool_proto::{
    Connection, Event, Hello, HelloExtensions, MethodInfo, MethodKind, ProtocolError, Role,
    Welcome, WelcomeExtensions,
};

/// The lane's window each way: small, so the fuzzer reaches its limits.
const WINDOW: u64 = 1 << 20;

/// A peer's region as zeros of its size (at most the window).
struct Zeros(Bytes);

impl ShmMapping for Zeros {
    fn lend(
        &self,
        offset: u64,
        length: u64,
        on_release: Box<dyn FnOnce() + Send>,
    ) -> Result<Bytes, ProtocolError> {
        on_release(); // a copy-out SDK releases at once (20.4)
        Ok(self.0.slice(offset as usize..(offset + length) as usize))
    }
}

fn hello() -> Hello {
    Hello {
        pid: 4242,
        max_concurrency: 4,
        max_frame_size: 1 << 20,
        methods: vec![
            MethodInfo { name: "echo".into(), kind: MethodKind::Unary, codecs: vec![0, 1] },
            MethodInfo { name: "count".into(), kind: MethodKind::Stream, codecs: vec![1, 2] },
            MethodInfo { name: "fail".into(), kind: MethodKind::Unary, codecs: vec![1] },
        ],
        extensions: HelloExtensions { shm: Some(ShmOffer { window: WINDOW }) },
        ..Hello::new("wirepool-py", "0.1.0")
    }
}

/// Run a send; if it was refused, it must not have written anything.
fn checked<T>(out: &mut Vec<u8>, send: impl FnOnce(&mut Vec<u8>) -> Result<T, wirepool_proto::ProtocolError>) {
    let before = out.len();
    if send(out).is_err() {
        assert_eq!(out.len(), before, "a refused send wrote bytes");
    }
}

fn drive(conn: &mut Connection, event: &Event, out: &mut Vec<u8>) {
    match event {
        Event::Hello(h) => match Welcome::for_hello(h, 1) {
            Ok(w) => {
                let shm = ShmAccept { to_worker_window: WINDOW, to_parent_window: WINDOW };
                let w = Welcome {
                    max_frame_size: 65_536,
                    initial_credit: 64,
                    extensions: WelcomeExtensions { shm: h.extensions.shm.map(|_| shm) },
                    ..w
                };
                checked(out, |o| conn.send_welcome(&w, o));
                if conn.shm().is_some() {
                    conn.shm_descriptors_received(1);
                    if let Ok(region) = conn.send_shm_region(4096, out) {
                        let r = ShmRange { region, offset: 10, length: 100 };
                        checked(out, |o| conn.send_request_shm(0, 1, 0, r, o));
                    }
                }
                checked(out, |o| conn.send_request(0, 1, 0, b"{}", o));
                checked(out, |o| conn.send_request(1, 1, 0, b"{}", o));
                let body = vec![0xa5; 70_000];
                if let Ok(mut cursor) = conn.begin_request(2, 1, 0, &body, out) {
                    while !cursor.is_done() {
                        let before = out.len();
                        if conn.send_next_frame(&mut cursor, &body, out).is_err() {
                            assert_eq!(out.len(), before, "a refused send wrote bytes");
                            break;
                        }
                    }
                }
            }
            Err(e) => checked(out, |o| conn.refuse(e.code, &e.message, o)),
        },
        Event::Request { id, method, .. } => {
            if *method == 1 {
                // A few frames while credit lasts (the peer may grant up to 2^31 - 1 bytes).
                for _ in 0..4 {
                    if !conn.can_send_rows(*id) {
                        break;
                    }
                    let Ok(mut rows) = conn.rows(*id, out) else { break };
                    for _ in 0..3 {
                        let _ = rows.append(b"row");
                    }
                    rows.finish().expect("finish");
                }
                checked(out, |o| conn.send_end(*id, b"", o));
            } else if *method == 2 {
                // A result larger than a frame, sent frame by frame with an EVENT refused and a
                // PING allowed in between.
                let body = vec![0x5a; 70_000];
                if let Ok(mut cursor) = conn.begin_result(*id, &body, out) {
                    checked(out, |o| conn.send_event(*id, "progress", "{}", o));
                    while !cursor.is_done() {
                        checked(out, |o| conn.send_ping([7; 8], o));
                        let before = out.len();
                        if conn.send_next_frame(&mut cursor, &body, out).is_err() {
                            assert_eq!(out.len(), before, "a refused send wrote bytes");
                            break;
                        }
                    }
                }
            } else if *method == 0 && conn.shm().is_some() {
                if let Ok(region) = conn.send_shm_region(64, out) {
                    let r = ShmRange { region, offset: 0, length: 64 };
                    checked(out, |o| conn.send_result_shm(*id, r, o));
                }
            } else {
                checked(out, |o| conn.send_result(*id, b"ok", o));
            }
        }
        Event::Reject { id, code } => checked(out, |o| conn.send_error(*id, code.code(), "", "", o)),
        Event::Rows { id, rows } => checked(out, |o| conn.consumed(*id, rows.payload().len(), o)),
        Event::Ping { nonce } => checked(out, |o| conn.send_pong(*nonce, o)),
        Event::Drain { .. } => checked(out, |o| conn.send_goodbye(0, o)),
        _ => {}
    }
}

fn run(role: Role, data: &[u8], chunk: usize) -> (Vec<Event>, Option<wirepool_proto::ErrorCode>, Vec<u8>) {
    let mut conn = Connection::new(role);
    let mut out = Vec::new();
    let mut events = Vec::new();
    conn.set_shm_mapper(Box::new(|_region, size| {
        Ok(Arc::new(Zeros(Bytes::from(vec![0u8; size as usize]))) as Arc<dyn ShmMapping>)
    }));
    if role == Role::Worker {
        conn.send_hello(&hello(), &mut out).expect("hello");
        conn.shm_descriptors_received(1);
    }
    for piece in data.chunks(chunk.max(1)) {
        conn.receive(piece);
        loop {
            match conn.next_event() {
                Ok(Some(event)) => {
                    drive(&mut conn, &event, &mut out);
                    conn.send_shm_releases(&mut out);
                    events.push(event);
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = conn.send_fatal(&e, &mut out);
                    return (events, Some(e.code), out);
                }
            }
        }
    }
    let error = conn.end_of_input().err().map(|e| e.code);
    assert!(conn.in_flight() <= 8, "in flight bounded by max_in_flight");
    (events, error, out)
}

fuzz_target!(|input: &[u8]| {
    let Some((&config, data)) = input.split_first() else { return };
    let role = if config & 1 == 0 { Role::Parent } else { Role::Worker };
    let chunk = usize::from(config >> 1) + 1;
    let whole = run(role, data, data.len());
    let chunked = run(role, data, chunk);
    assert_eq!(whole, chunked, "chunking changed the result");
});
