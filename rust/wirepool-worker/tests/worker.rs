//! The worker SDK against a fake parent over a socketpair (see `common`).

mod common;

use common::{error_code, result_body, Options, Parent};
use serde_json::{json, Value};
use wirepool_proto::{ErrorCode, Frame, FrameBody, MethodKind};

const RAW: u8 = 0;
const JSON: u8 = 1;
const MSGPACK: u8 = 2;

fn json_body(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

fn rows_of(frames: &[Frame], id: u64) -> Vec<Vec<u8>> {
    frames
        .iter()
        .filter(|f| f.id == id)
        .filter_map(|f| match &f.body {
            FrameBody::Rows(rows) => Some(rows.iter().map(<[u8]>::to_vec).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn hello_lists_methods_kinds_codecs_and_pid() {
    let p = Parent::start();
    assert_eq!(p.hello.sdk_name, "wirepool-rust-echo");
    assert_eq!(p.hello.pid, p.child.id());
    assert_eq!(p.hello.max_concurrency, 64);
    let echo = &p.hello.methods[p.method("echo") as usize];
    assert_eq!(
        (echo.kind, echo.codecs.clone()),
        (MethodKind::Unary, vec![RAW, JSON, MSGPACK])
    );
    let decls = &p.hello.methods[p.method("decls") as usize];
    assert_eq!(
        (decls.kind, decls.codecs.clone()),
        (MethodKind::Stream, vec![JSON, MSGPACK, 3])
    );
}

#[test]
fn unary_echo_returns_the_same_bytes_in_every_codec() {
    let mut p = Parent::start();
    let msgpack_body = rmp_like_map();
    for (codec, body) in [
        (RAW, b"\x00\x01raw bytes".to_vec()),
        (JSON, br#"{"x":[1,2,3]}"#.to_vec()),
        (MSGPACK, msgpack_body),
    ] {
        let id = p.request("echo", codec, 0, &body);
        assert_eq!(result_body(&p.terminal(id)), body, "codec {codec}");
    }
}

fn rmp_like_map() -> Vec<u8> {
    // {"a": 1} in MessagePack.
    vec![0x81, 0xa1, b'a', 0x01]
}

#[test]
fn unary_add_decodes_and_encodes_json() {
    let mut p = Parent::start();
    let id = p.request("add", JSON, 0, &json_body(json!({"a": 40, "b": 2})));
    let body = result_body(&p.terminal(id));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"sum": 42})
    );
}

#[test]
fn inline_unary_answers_errors_and_panics_per_request() {
    let mut p = Parent::start();
    let ids: Vec<u64> = (0..50)
        .map(|i| p.request("add_inline", JSON, 0, &json_body(json!({"a": i, "b": 1}))))
        .collect();
    for (i, id) in ids.into_iter().enumerate() {
        let body = result_body(&p.terminal(id));
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({"sum": i + 1})
        );
    }
    let id = p.request("add_inline", JSON, 0, b"{not json");
    assert_eq!(error_code(&p.terminal(id)), ErrorCode::BadRequest.code());
    let id = p.request("add_inline", JSON, 0, &json_body(json!({"a": -1, "b": 0})));
    assert_eq!(error_code(&p.terminal(id)), ErrorCode::HandlerPanic.code());
    let id = p.request("add_inline", JSON, 0, &json_body(json!({"a": 2, "b": 3})));
    let body = result_body(&p.terminal(id));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap(),
        json!({"sum": 5})
    );
}

#[test]
fn bad_request_body_is_bad_request_and_worker_carries_on() {
    let mut p = Parent::start();
    let id = p.request("add", JSON, 0, b"{not json");
    assert_eq!(error_code(&p.terminal(id)), ErrorCode::BadRequest.code());
    let id = p.request("add", JSON, 0, &json_body(json!({"a": 1, "b": 2})));
    assert!(matches!(p.terminal(id).body, FrameBody::Result { .. }));
}

#[test]
fn unknown_method_and_unsupported_codec_are_request_errors() {
    let mut p = Parent::start();
    p.request_with_id(1, 999, JSON, 0, b"1");
    assert_eq!(error_code(&p.terminal(1)), ErrorCode::UnknownMethod.code());
    let add = p.method("add");
    p.request_with_id(2, add, RAW, 0, b"1");
    assert_eq!(
        error_code(&p.terminal(2)),
        ErrorCode::CodecUnsupported.code()
    );
    let id = p.request("add", JSON, 0, &json_body(json!({"a": 1, "b": 1})));
    assert!(matches!(p.terminal(id).body, FrameBody::Result { .. }));
}

fn check_decls(p: &mut Parent, method: &str, n: u64) {
    let id = p.request(method, JSON, 0, &json_body(json!({"n": n})));
    let frames = p.collect_until_terminal(id);
    let rows = rows_of(&frames, id);
    assert_eq!(rows.len() as u64, n);
    for (i, row) in rows.iter().enumerate() {
        let v: Value = serde_json::from_slice(row).unwrap();
        assert_eq!(
            v,
            json!({"i": i, "name": format!("decl_{i}"), "kind": "theorem"})
        );
    }
    match &frames.last().unwrap().body {
        FrameBody::End { row_count, summary } => {
            assert_eq!(*row_count, n);
            assert_eq!(
                serde_json::from_slice::<Value>(summary).unwrap(),
                json!({"rows": n})
            );
        }
        other => panic!("expected END, got {other:?}"),
    }
}

#[test]
fn stream_sends_every_row_in_order_then_end_with_count_and_summary() {
    let mut p = Parent::start();
    check_decls(&mut p, "decls", 20_000);
    check_decls(&mut p, "decls", 0);
    check_decls(&mut p, "decls_blocking", 20_000);
}

/// The worker must stop at its credit and resume on CREDIT, for async and blocking handlers.
fn credit_stalls_and_resumes(method: &str) {
    let credit = 4096u32;
    let mut p = Parent::start_with(Options {
        initial_credit: credit,
        ..Options::default()
    });
    let n = 5_000u64; // ~200 KB of rows: far above the credit
    let id = p.request(method, JSON, 0, &json_body(json!({"n": n})));
    let mut balance = i64::from(credit);
    let mut rows = 0u64;
    let mut grants = 0;
    loop {
        // Probe: everything the worker sent before answering this PING is in front of the PONG.
        let nonce = (grants as u64).to_le_bytes();
        p.send(&Frame::new(0, FrameBody::Ping { nonce }));
        loop {
            let frame = p.next_frame();
            match frame.body {
                FrameBody::Rows(r) => {
                    assert!(balance > 0, "ROWS sent while credit was {balance}");
                    balance -= r.payload().len() as i64;
                    rows += u64::from(r.count());
                }
                FrameBody::Pong { nonce: got } if got == nonce => break,
                FrameBody::End { row_count, .. } => {
                    assert_eq!((row_count, rows), (n, n));
                    assert!(
                        grants > 10,
                        "the stream cannot finish on {credit} bytes of credit"
                    );
                    return;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if balance > 0 {
            continue; // the worker may still be producing: probe again
        }
        // Out of credit: the worker must be stalled. Grant and go on.
        let grant = 8192u32;
        balance += i64::from(grant);
        grants += 1;
        p.send(&Frame::new(id, FrameBody::Credit { bytes: grant }));
    }
}

#[test]
fn async_stream_stops_at_credit_and_resumes_on_credit() {
    credit_stalls_and_resumes("decls");
}

#[test]
fn blocking_stream_stops_at_credit_and_resumes_on_credit() {
    credit_stalls_and_resumes("decls_blocking");
}

#[test]
fn cancel_mid_stream_ends_with_cancelled() {
    for method in ["decls", "decls_blocking"] {
        let mut p = Parent::start_with(Options {
            initial_credit: 1 << 16,
            ..Options::default()
        });
        let id = p.request(method, JSON, 0, &json_body(json!({"n": 1u64 << 40})));
        // Wait for the first batch, then cancel; the stream is then stalled on credit or running.
        loop {
            if matches!(p.next_frame().body, FrameBody::Rows(_)) {
                break;
            }
        }
        p.send(&Frame::new(id, FrameBody::Cancel));
        assert_eq!(
            error_code(&p.terminal(id)),
            ErrorCode::Cancelled.code(),
            "{method}"
        );
        // The worker is still healthy.
        let id = p.request("echo", RAW, 0, b"after");
        assert_eq!(&result_body(&p.terminal(id))[..], b"after");
    }
}

#[test]
fn deadline_ends_async_and_blocking_handlers_with_deadline_exceeded() {
    let mut p = Parent::start();
    let a = p.request("sleep", JSON, 50_000, b"60000");
    let b = p.request("sleep_blocking", JSON, 50_000, b"60000");
    let c = p.request("decls", JSON, 50_000, &json_body(json!({"n": 1u64 << 40})));
    for frame in p.terminals(&[a, b, c]) {
        assert_eq!(
            error_code(&frame),
            ErrorCode::DeadlineExceeded.code(),
            "request {}",
            frame.id
        );
    }
}

/// PROTOCOL.md 8.3: the deadline ends the request when the timer fires, whether or not the
/// handler notices; what the handler returns later is dropped.
#[test]
fn a_deaf_handler_is_answered_deadline_exceeded_at_the_timer() {
    let mut p = Parent::start();
    let started = std::time::Instant::now();
    let deaf = p.request("deaf", JSON, 50_000, b"1500");
    assert_eq!(
        error_code(&p.terminal(deaf)),
        ErrorCode::DeadlineExceeded.code()
    );
    assert!(
        started.elapsed() < std::time::Duration::from_millis(1200),
        "answered when the handler returned"
    );
    // A request answered after the deaf handler has returned: its late result was dropped.
    let later = p.request("sleep", JSON, 0, b"2000");
    let frames = p.collect_until_terminal(later);
    assert!(
        frames.iter().all(|f| f.id != deaf),
        "a frame for the ended request: {frames:?}"
    );
    assert_eq!(&result_body(frames.last().unwrap())[..], b"2000");
}

/// PROTOCOL.md 8.3: the flag keeps the code of the first cause (here CANCEL), and the deadline
/// timer still ends a request whose handler ignores both.
#[test]
fn cancel_before_the_deadline_keeps_its_code_when_the_timer_ends_the_request() {
    let mut p = Parent::start();
    let id = p.request("deaf", JSON, 200_000, b"2000");
    p.send(&Frame::new(id, FrameBody::Cancel));
    let started = std::time::Instant::now();
    assert_eq!(error_code(&p.terminal(id)), ErrorCode::Cancelled.code());
    assert!(
        started.elapsed() < std::time::Duration::from_millis(1500),
        "answered at the deadline"
    );
}

/// PROTOCOL.md 8.3: a cancelled handler's error is replaced by the flag's code.
#[test]
fn a_cancelled_handler_that_fails_ends_cancelled() {
    let mut p = Parent::start();
    let id = p.request("fail_when_cancelled", JSON, 0, b"null");
    p.send(&Frame::new(id, FrameBody::Cancel));
    assert_eq!(error_code(&p.terminal(id)), ErrorCode::Cancelled.code());
}

#[test]
fn cancel_wakes_a_sleeping_handler() {
    let mut p = Parent::start();
    let a = p.request("sleep", JSON, 0, b"60000");
    let b = p.request("sleep_blocking", JSON, 0, b"60000");
    p.send(&Frame::new(a, FrameBody::Cancel));
    p.send(&Frame::new(b, FrameBody::Cancel));
    for frame in p.terminals(&[a, b]) {
        assert_eq!(error_code(&frame), ErrorCode::Cancelled.code());
    }
}

#[test]
fn panic_is_handler_panic_for_that_request_only() {
    let mut p = Parent::start();
    let id = p.request("panic", JSON, 0, b"null");
    let frame = p.terminal(id);
    assert_eq!(error_code(&frame), ErrorCode::HandlerPanic.code());
    let FrameBody::Error { message, .. } = frame.body else {
        unreachable!()
    };
    assert!(message.contains("the panic method was called"), "{message}");
    let id = p.request("echo", RAW, 0, b"still alive");
    assert_eq!(&result_body(&p.terminal(id))[..], b"still alive");
}

#[test]
fn fail_returns_handler_error_with_json_details() {
    let mut p = Parent::start();
    let id = p.request("fail", JSON, 0, br#"{"why":"test"}"#);
    match p.terminal(id).body {
        FrameBody::Error { code, details, .. } => {
            assert_eq!(code, ErrorCode::HandlerError.code());
            assert_eq!(
                serde_json::from_str::<Value>(&details).unwrap(),
                json!({"request": {"why": "test"}})
            );
        }
        other => panic!("expected ERROR, got {other:?}"),
    }
}

/// ERROR cannot continue: details too large for one frame become the core's note of their
/// size (`wirepool_proto::fit_error`, PROTOCOL.md 14.5), never dropped silently.
#[test]
fn error_details_too_large_for_a_frame_become_a_note_of_their_size() {
    let mut p = Parent::start_with(Options {
        max_frame_size: 65_536,
        ..Options::default()
    });
    let why = "x".repeat(70_000);
    let body = serde_json::to_vec(&json!({ "why": why })).unwrap();
    let id = p.request("fail", JSON, 0, &body);
    match p.terminal(id).body {
        FrameBody::Error { code, details, .. } => {
            assert_eq!(code, ErrorCode::HandlerError.code());
            let full = serde_json::to_string(&json!({"request": {"why": why}})).unwrap();
            assert_eq!(
                serde_json::from_str::<Value>(&details).unwrap(),
                json!({"truncated": true, "details_bytes": full.len()})
            );
        }
        other => panic!("expected ERROR, got {other:?}"),
    }
    let id = p.request("echo", RAW, 0, b"still alive");
    assert_eq!(&result_body(&p.terminal(id))[..], b"still alive");
}

#[test]
fn requests_over_max_in_flight_are_overloaded() {
    let mut p = Parent::start_with(Options {
        max_in_flight: 2,
        ..Options::default()
    });
    let a = p.request("sleep", JSON, 0, b"60000");
    let b = p.request("sleep_blocking", JSON, 0, b"60000");
    let c = p.request("echo", RAW, 0, b"x");
    assert_eq!(error_code(&p.terminal(c)), ErrorCode::Overloaded.code());
    p.send(&Frame::new(a, FrameBody::Cancel));
    assert_eq!(error_code(&p.terminal(a)), ErrorCode::Cancelled.code());
    let d = p.request("echo", RAW, 0, b"y");
    assert_eq!(&result_body(&p.terminal(d))[..], b"y");
    p.send(&Frame::new(b, FrameBody::Cancel));
    assert_eq!(error_code(&p.terminal(b)), ErrorCode::Cancelled.code());
}

#[test]
fn blocking_handlers_run_concurrently_up_to_the_limit() {
    // Each `gather` call blocks until 16 are running at once: it can only finish if the pool
    // gives every one its own thread (the deadline turns a failure into DEADLINE_EXCEEDED).
    let mut p = Parent::start();
    let ids: Vec<u64> = (0..16)
        .map(|_| p.request("gather", JSON, 15_000_000, b"16"))
        .collect();
    for frame in p.terminals(&ids) {
        assert_eq!(&result_body(&frame)[..], b"16");
    }
}

#[test]
fn large_request_and_result_travel_as_continuations() {
    let mut p = Parent::start_with(Options {
        max_frame_size: 65_536,
        ..Options::default()
    });
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
    let id = p.request("echo", RAW, 0, &body);
    let frames = p.collect_until_terminal(id);
    assert_eq!(result_body(frames.last().unwrap()), body);
}

#[test]
fn ping_is_answered_while_a_handler_spins_on_the_cpu() {
    let mut p = Parent::start();
    let spin = p.request("spin", JSON, 0, b"1500000"); // 1.5 s of CPU
    let nonce = *b"spinning";
    p.send(&Frame::new(0, FrameBody::Ping { nonce }));
    match p.next_frame().body {
        FrameBody::Pong { nonce: got } => assert_eq!(got, nonce),
        other => panic!("expected PONG before the spin result, got {other:?}"),
    }
    assert!(matches!(p.terminal(spin).body, FrameBody::Result { .. }));
}

#[test]
fn progress_events_are_coalesced_and_precede_the_result() {
    let mut p = Parent::start();
    let id = p.request("progress", JSON, 0, b"100000");
    let frames = p.collect_until_terminal(id);
    let events: Vec<_> = frames
        .iter()
        .filter_map(|f| match &f.body {
            FrameBody::Event { topic, data } => Some((topic.clone(), data.clone())),
            _ => None,
        })
        .collect();
    assert!(
        !events.is_empty() && events.len() < 1000,
        "{} events",
        events.len()
    );
    assert!(events.iter().all(|(t, _)| t == "progress"));
    // The last event waiting is flushed before the terminal.
    assert_eq!(
        serde_json::from_str::<Value>(&events.last().unwrap().1).unwrap(),
        json!({"i": 99_999, "of": 100_000})
    );
    assert!(matches!(
        frames.last().unwrap().body,
        FrameBody::Result { .. }
    ));
}

#[test]
fn a_row_larger_than_a_frame_is_row_too_large() {
    // Credit for all 6 MB of rows: this test reads without granting.
    let mut p = Parent::start_with(Options {
        max_frame_size: 65_536,
        initial_credit: 1 << 24,
        ..Options::default()
    });
    let id = p.request("raw_rows", RAW, 0, b"3 70000");
    assert_eq!(error_code(&p.terminal(id)), ErrorCode::RowTooLarge.code());
    let id = p.request("raw_rows", RAW, 0, b"100 60000"); // each fits alone, never two per frame
    let frames = p.collect_until_terminal(id);
    let rows = rows_of(&frames, id);
    assert_eq!(rows.len(), 100);
    assert!(rows
        .iter()
        .enumerate()
        .all(|(i, r)| r.len() == 60_000 && r[..8] == (i as u64).to_le_bytes()));
}

#[test]
fn drain_lets_requests_finish_then_says_goodbye_and_exits() {
    let mut p = Parent::start();
    let a = p.request("sleep", JSON, 0, b"100");
    let b = p.request("sleep_blocking", JSON, 0, b"100");
    p.send(&Frame::new(0, FrameBody::Drain { grace_ms: 10_000 }));
    let late = p.request("echo", RAW, 0, b"late");
    let mut seen = Vec::new();
    loop {
        let frame = p.next_frame();
        match frame.body {
            FrameBody::Result { .. } => seen.push((frame.id, "result")),
            FrameBody::Error { code, .. } => {
                assert_eq!((frame.id, code), (late, ErrorCode::Draining.code()));
                seen.push((frame.id, "draining"));
            }
            FrameBody::Goodbye { reason } => {
                assert_eq!(reason, 0);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    seen.sort();
    assert_eq!(seen, vec![(a, "result"), (b, "result"), (late, "draining")]);
    assert!(p.try_next_frame().is_none(), "nothing after GOODBYE");
    assert!(p.wait_exit().success());
}

#[test]
fn drain_with_zero_grace_cancels_what_runs() {
    let mut p = Parent::start();
    let a = p.request("sleep", JSON, 0, b"60000");
    let b = p.request("sleep_blocking", JSON, 0, b"60000");
    p.send(&Frame::new(0, FrameBody::Drain { grace_ms: 0 }));
    let mut cancelled = Vec::new();
    loop {
        let frame = p.next_frame();
        match frame.body {
            FrameBody::Error { code, .. } => {
                assert_eq!(code, ErrorCode::Cancelled.code());
                cancelled.push(frame.id);
            }
            FrameBody::Goodbye { .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    cancelled.sort();
    assert_eq!(cancelled, vec![a, b]);
    assert!(p.wait_exit().success());
}

#[test]
fn end_of_file_makes_the_worker_exit() {
    let mut p = Parent::start();
    let _running = p.request("sleep_blocking", JSON, 0, b"60000");
    p.sock.shutdown(std::net::Shutdown::Both).unwrap();
    assert!(p.wait_exit().success());
}

#[test]
fn crash_closes_the_socket_and_kills_the_process() {
    use std::os::unix::process::ExitStatusExt;
    let mut p = Parent::start();
    let _ = p.request("crash", JSON, 0, b"null");
    assert!(p.try_next_frame().is_none());
    assert_eq!(p.wait_exit().signal(), Some(libc::SIGABRT));
}

#[test]
fn protocol_violation_gets_error_id_0_and_the_worker_exits_nonzero() {
    let mut p = Parent::start();
    // A REQUEST id that does not increase.
    let id = p.request("echo", RAW, 0, b"1");
    let _ = p.terminal(id);
    p.request_with_id(id, 0, RAW, 0, b"again");
    let frame = p.next_frame();
    assert_eq!(
        (frame.id, error_code(&frame)),
        (0, ErrorCode::DuplicateId.code())
    );
    assert!(p.try_next_frame().is_none());
    assert!(!p.wait_exit().success());
}

#[test]
fn print_writes_to_the_workers_own_stdout_and_stderr() {
    let mut p = Parent::start();
    for stream in ["stdout", "stderr"] {
        let id = p.request(
            "print",
            JSON,
            0,
            &json_body(json!({"stream": stream, "n": 100_000})),
        );
        assert_eq!(&result_body(&p.terminal(id))[..], b"100000");
    }
}

#[test]
fn the_worker_dies_with_its_parent() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};
    // The worker's parent is a shell we kill; we keep our end of the socket open, so the only
    // way the worker can go away is the parent-death signal.
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let fd = theirs.as_raw_fd();
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
    }
    let mut shell = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" & wait")
        .arg(common::worker_binary())
        .env("WIREPOOL_FD", fd.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(theirs);
    ours.set_read_timeout(Some(common::STEP_TIMEOUT)).unwrap();
    // HELLO proves the worker runs (it asks for the signal before sending it).
    let mut header = [0u8; 16];
    ours.read_exact(&mut header).unwrap();
    assert_eq!(header[4], 0x01, "HELLO");
    shell.kill().unwrap();
    shell.wait().unwrap();
    // Drain HELLO's payload, then the worker's death closes its end: end of file.
    let mut rest = Vec::new();
    let read = ours.read_to_end(&mut rest);
    assert!(read.is_ok(), "the worker outlived its parent: {read:?}");
}

#[test]
fn stream_rows_and_summary_use_the_request_codec() {
    use wirepool_codec::Codec;
    let mut p = Parent::start();
    for codec in [Codec::MsgPack, Codec::Cbor] {
        let body = codec.to_vec(&json!({"n": 3})).unwrap();
        let id = p.request("decls", codec.id(), 0, &body);
        let frames = p.collect_until_terminal(id);
        let rows: Vec<Value> = rows_of(&frames, id)
            .iter()
            .map(|r| codec.decode(r).unwrap())
            .collect();
        assert_eq!(
            rows[2],
            json!({"i": 2, "name": "decl_2", "kind": "theorem"}),
            "{codec}"
        );
        let FrameBody::End {
            row_count: 3,
            summary,
        } = &frames.last().unwrap().body
        else {
            panic!("{codec}: no END")
        };
        assert_eq!(
            codec.decode::<Value>(summary).unwrap(),
            json!({"rows": 3}),
            "{codec}"
        );
    }
}

#[test]
fn a_sink_shared_with_a_thread_and_a_task_keeps_each_senders_rows_in_order() {
    // The handler pushes without a lock while it is polled; a thread sending at the same time
    // waits for the frame, a spawned task takes the lock. Nothing is lost, torn or reordered.
    let mut p = Parent::start();
    let n = 20_000;
    let id = p.request("shared_rows", JSON, 0, &json_body(json!(n)));
    let frames = p.collect_until_terminal(id);
    assert!(
        matches!(frames.last().unwrap().body, FrameBody::End { row_count, .. } if row_count == 3 * n),
        "{:?}",
        frames.last()
    );
    let mut next = [0u64; 3];
    for row in rows_of(&frames, id) {
        let text: String = serde_json::from_slice(&row).unwrap();
        let source = ["h", "t", "s"]
            .iter()
            .position(|s| text.starts_with(s))
            .unwrap();
        assert_eq!(text[1..].parse::<u64>().unwrap(), next[source], "{text}");
        next[source] += 1;
        // The spawned task's rows come after both others'.
        assert!(source < 2 || next[0] + next[1] == 2 * n);
    }
    assert_eq!(next, [n; 3]);
}

#[test]
fn a_partial_batch_goes_out_on_the_flush_timer() {
    // One row, then the handler sleeps for a minute: only the flush timer can deliver the row.
    let mut p = Parent::start();
    let id = p.request(
        "trickle",
        JSON,
        0,
        &json_body(json!({"n": 2, "ms": 60_000})),
    );
    match p.next_frame().body {
        FrameBody::Rows(rows) => assert_eq!(rows.iter().collect::<Vec<_>>(), vec![&b"0"[..]]),
        other => panic!("expected the first row, got {other:?}"),
    }
    p.send(&Frame::new(id, FrameBody::Cancel));
    assert_eq!(error_code(&p.terminal(id)), ErrorCode::Cancelled.code());
}

#[test]
fn malformed_input_gets_a_typed_fatal_error_before_the_worker_leaves() {
    // (header bytes, expected code): an unknown frame type, a length above max_frame_size, and
    // a request-level frame with id 0.
    let mut too_large = vec![0u8; 16];
    too_large[..4].copy_from_slice(&(2u32 << 20).to_le_bytes());
    too_large[4] = 0x10;
    too_large[8] = 1;
    let mut unknown_type = vec![0u8; 16];
    unknown_type[4] = 0x55;
    let mut cancel_id_0 = vec![0u8; 16];
    cancel_id_0[4] = 0x11;
    for (bytes, code) in [
        (too_large, ErrorCode::FrameTooLarge),
        (unknown_type, ErrorCode::UnknownFrameType),
        (cancel_id_0, ErrorCode::BadId),
    ] {
        let mut p = Parent::start();
        p.send_bytes(&bytes);
        let frame = p.next_frame();
        assert_eq!((frame.id, error_code(&frame)), (0, code.code()), "{code:?}");
        assert!(
            p.try_next_frame().is_none(),
            "{code:?}: the worker must close after a fatal error"
        );
        assert!(!p.wait_exit().success(), "{code:?}");
    }
}

#[test]
fn a_panicking_row_serializer_fails_the_stream_with_handler_panic() {
    let mut p = Parent::start();
    let id = p.request("panic_row", JSON, 0, b"10");
    let frames = p.collect_until_terminal(id);
    // Rows still batched when a stream fails are dropped; any that the flush timer sent first
    // must be whole rows 0, 1, 2 (no half-encoded row 3).
    let rows = rows_of(&frames, id);
    assert!(
        rows.len() <= 3
            && rows
                .iter()
                .enumerate()
                .all(|(i, r)| *r == i.to_string().into_bytes()),
        "{rows:?}"
    );
    assert_eq!(
        error_code(frames.last().unwrap()),
        ErrorCode::HandlerPanic.code()
    );
    let id = p.request("echo", RAW, 0, b"ok");
    assert_eq!(&result_body(&p.terminal(id))[..], b"ok");
}
