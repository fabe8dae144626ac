//! The worker the parent's integration tests, examples and demo run: one method per behaviour
//! a pool must handle (results, rows, errors, panics, crashes, hangs, chatter, memory growth).
//!
//! Run by a [`wirepool::Pool`], never by hand: it expects the socket in `WIREPOOL_FD`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use wirepool_worker::{BlockingRowSink, Codec, Context, HandlerError, RowSink, Worker};

#[derive(Serialize)]
struct Decl {
    i: u64,
    name: String,
    kind: &'static str,
}

/// Memory a worker holds on purpose (the RSS recycle test).
static HELD: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
/// Where the last `fill_raw` wrote, and whether its buffer was shared memory.
static LAST_FILL: Mutex<(usize, bool)> = Mutex::new((0, false));
/// Per-worker session state (the lease test).
static SESSION: Mutex<Option<String>> = Mutex::new(None);

/// The benchmark's floor: echo `u32 length + bytes` messages with blocking socket calls, no
/// protocol at all (only when started with `WIREPOOL_RAW_ECHO_FD`).
fn raw_echo(fd: i32) -> std::io::Result<()> {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    // SAFETY: the descriptor was inherited for this purpose and is used only here.
    let mut sock = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 4];
        if sock.read_exact(&mut len).is_err() {
            return Ok(());
        }
        buf.resize(u32::from_le_bytes(len) as usize, 0);
        sock.read_exact(&mut buf)?;
        sock.write_all(&len)?;
        sock.write_all(&buf)?;
    }
}

/// A protocol-floor worker for benchmarks (`WIREPOOL_FAST_ECHO=1`): one thread, the proto core
/// driven directly, every request answered at once, one write per read. It shows what the
/// parent can do when the worker costs next to nothing.
///
/// Its second method, `event_flood` (raw codec, request text `"<count> <pad bytes>"`), sends
/// `count` EVENT frames `progress {"i":..,"pad":".."}` as fast as the socket takes them, then
/// the count as its result: the misbehaving worker a parent's event mailbox must survive (SDK
/// workers coalesce events; this one does not).
///
/// Its third and fourth, `deaf_stream` (raw codec, request text `"<bytes>"`) and
/// `deaf_report`: a stream that sends one 1 KiB row per ROWS frame while it has credit, and
/// reads a CANCEL but goes on until it has sent `<bytes>` of rows after it (a worker that has
/// not seen its CANCEL yet, made permanent); then it ends with CANCELLED, and `deaf_report`
/// answers (once that happened) with the bytes it sent after the CANCEL. It only ends if the
/// parent keeps granting credit for rows nobody reads (PROTOCOL.md 14.3).
fn fast_echo() -> std::io::Result<()> {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    use wirepool_proto::{Connection, Event, Hello, MethodInfo, MethodKind};
    let fd: i32 = std::env::var("WIREPOOL_FD")
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("WIREPOOL_FD");
    // SAFETY: the inherited descriptor is ours alone.
    let mut sock = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    let mut conn = Connection::new_worker();
    let mut out = bytes::BytesMut::new();
    let hello = Hello {
        pid: std::process::id(),
        max_concurrency: 4096,
        methods: vec![
            MethodInfo {
                name: "echo_raw".into(),
                kind: MethodKind::Unary,
                codecs: vec![0],
            },
            MethodInfo {
                name: "event_flood".into(),
                kind: MethodKind::Unary,
                codecs: vec![0],
            },
            MethodInfo {
                name: "deaf_stream".into(),
                kind: MethodKind::Stream,
                codecs: vec![0],
            },
            MethodInfo {
                name: "deaf_report".into(),
                kind: MethodKind::Unary,
                codecs: vec![0],
            },
        ],
        ..Hello::new("fast-echo", "0")
    };
    conn.send_hello(&hello, &mut out)
        .map_err(std::io::Error::other)?;
    sock.write_all(&out)?;
    out.clear();
    let mut buf = vec![0u8; 1 << 20];
    // The deaf stream: (id, bytes to send after the CANCEL, CANCEL seen, bytes sent after it).
    let mut deaf: Option<(u64, usize, bool, usize)> = None;
    let mut deaf_sent_after_cancel: Option<usize> = None;
    let mut deaf_reports: Vec<u64> = Vec::new();
    loop {
        let n = sock.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        conn.receive(&buf[..n]);
        while let Some(ev) = conn.next_event().map_err(std::io::Error::other)? {
            match ev {
                Event::Request {
                    id,
                    method: 2,
                    body,
                    ..
                } => {
                    let target = String::from_utf8_lossy(&body).trim().parse().unwrap_or(0);
                    deaf = Some((id, target, false, 0));
                }
                Event::Request { id, method: 3, .. } => deaf_reports.push(id),
                Event::Cancel { id } => {
                    if let Some((deaf_id, _, cancelled, _)) = &mut deaf {
                        *cancelled |= *deaf_id == id;
                    }
                }
                Event::Request {
                    id,
                    method: 1,
                    body,
                    ..
                } => {
                    let text = String::from_utf8_lossy(&body);
                    let mut it = text
                        .split_whitespace()
                        .map(|v| v.parse::<usize>().unwrap_or(0));
                    let (count, pad) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
                    let pad = ".".repeat(pad);
                    for i in 0..count {
                        let data = format!("{{\"i\":{i},\"pad\":\"{pad}\"}}");
                        conn.send_event(id, "progress", &data, &mut out)
                            .map_err(std::io::Error::other)?;
                        if out.len() >= 1 << 16 {
                            sock.write_all(&out)?;
                            out.clear();
                        }
                    }
                    conn.send_result(id, count.to_string().as_bytes(), &mut out)
                        .map_err(std::io::Error::other)?;
                }
                Event::Request { id, body, .. } => conn
                    .send_result(id, &body, &mut out)
                    .map_err(std::io::Error::other)?,
                Event::Ping { nonce } => conn
                    .send_pong(nonce, &mut out)
                    .map_err(std::io::Error::other)?,
                Event::Drain { .. } => {
                    conn.send_goodbye(0, &mut out)
                        .map_err(std::io::Error::other)?;
                    sock.write_all(&out)?;
                    return Ok(());
                }
                _ => {}
            }
        }
        if let Some((id, target, cancelled, sent)) = &mut deaf {
            while conn.can_send_rows(*id) && !(*cancelled && *sent >= *target) {
                let mut rows = conn.rows(*id, &mut out).map_err(std::io::Error::other)?;
                rows.append(&[b'r'; 1024]).map_err(std::io::Error::other)?;
                let written = rows.finish().map_err(std::io::Error::other)?;
                if *cancelled {
                    *sent += written.payload_len;
                }
            }
            if *cancelled && *sent >= *target {
                conn.send_error(
                    *id,
                    wirepool_proto::ErrorCode::Cancelled.code(),
                    "cancelled",
                    "",
                    &mut out,
                )
                .map_err(std::io::Error::other)?;
                deaf_sent_after_cancel = Some(*sent);
                deaf = None;
            }
        }
        if let Some(sent) = deaf_sent_after_cancel {
            for id in deaf_reports.drain(..) {
                conn.send_result(id, sent.to_string().as_bytes(), &mut out)
                    .map_err(std::io::Error::other)?;
            }
        }
        sock.write_all(&out)?;
        out.clear();
    }
}

/// Creates `path` holding this process's pid; `false` when it existed already (atomically: two
/// workers racing for it never both create it).
fn create_marker(path: &str) -> std::io::Result<bool> {
    use std::io::Write;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(mut f) => {
            write!(f, "{}", std::process::id())?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

fn main() -> std::io::Result<()> {
    if std::env::var_os("WIREPOOL_FAST_ECHO").is_some() {
        return fast_echo();
    }
    if let Some(fd) = std::env::var("WIREPOOL_RAW_ECHO_FD")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return raw_echo(fd);
    }
    let all_serde = [Codec::Json, Codec::MsgPack, Codec::Cbor];
    // A worker that does not offer the shm lane (a v1 HELLO): the zero-copy tests' peer that
    // refused it.
    let lane = std::env::var_os("WIREPOOL_TEST_NO_SHM")
        .is_none()
        .then_some(1 << 20);
    Worker::new("wirepool-test-worker")
        .shm_threshold(lane)
        .unary("echo", |v: serde_json::Value, _: &Context| Ok(v))
        .codecs(&all_serde)
        .unary("echo_raw", |b: Bytes, _: &Context| Ok(b))
        .codecs(&[Codec::Raw])
        // One-way: answers only the body's length (the shm lane's benchmark).
        .unary("len_raw", |b: Bytes, _: &Context| {
            Ok(Bytes::from(b.len().to_string()))
        })
        .codecs(&[Codec::Raw])
        // Holds its body (a view of the parent's region when the lane is on) until cancelled
        // or 20 s pass, then returns its length: the shm lane's crash test kills it meanwhile.
        .unary("hold_raw", |b: Bytes, ctx: &Context| {
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end && !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(Bytes::from(b.len().to_string()))
        })
        .codecs(&[Codec::Raw])
        // The zero-copy result (Context::body_buf): `[len, seed]` -> `len` bytes of
        // `pattern(seed)` written in place; `fail` set: fails after writing them (the region
        // must be given back). The address written is kept for `shm_probe`.
        .unary(
            "fill_raw",
            |(len, seed, fail): (usize, u8, bool), ctx: &Context| {
                let mut body = ctx.body_buf(len);
                for (i, b) in body.unfilled(len).iter_mut().enumerate() {
                    *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
                }
                *LAST_FILL.lock().unwrap() = (body.as_ptr() as usize, body.is_shared());
                if fail {
                    return Err(HandlerError::new("failed after allocating").with_code(1401));
                }
                Ok(wirepool_worker::Encoded(body.freeze()))
            },
        )
        .codecs(&[Codec::Json])
        // Wrapping sum of the body's bytes (reads every byte of a view of the parent's region).
        .unary("sum_raw", |b: Bytes, _: &Context| {
            let sum = b.iter().fold(0u64, |s, &x| s.wrapping_add(x as u64));
            Ok(Bytes::from(sum.to_string()))
        })
        .codecs(&[Codec::Raw])
        // This worker's own shared regions (its read-write memfd mappings, start and end), and
        // the last `fill_raw`: where it wrote and whether in shared memory.
        .unary("shm_probe", |_: (), _: &Context| {
            let maps = std::fs::read_to_string("/proc/self/maps")?;
            let own: Vec<(usize, usize)> = maps
                .lines()
                .filter(|l| l.contains("/memfd:wirepool-shm") && l.contains(" rw-s "))
                .filter_map(|l| {
                    let (a, b) = l.split_whitespace().next()?.split_once('-')?;
                    Some((
                        usize::from_str_radix(a, 16).ok()?,
                        usize::from_str_radix(b, 16).ok()?,
                    ))
                })
                .collect();
            Ok((own, *LAST_FILL.lock().unwrap()))
        })
        .codecs(&[Codec::Json])
        // Served on the worker's I/O thread: no handler-thread hop (the latency benchmarks).
        .unary_inline("echo_raw_inline", |b: Bytes, _: &Context| Ok(b))
        .codecs(&[Codec::Raw])
        .unary_async(
            "echo_raw_async",
            |b: Bytes, _: Context| async move { Ok(b) },
        )
        .codecs(&[Codec::Raw])
        .unary("add", |(a, b): (i64, i64), _: &Context| Ok(a + b))
        .codecs(&all_serde)
        .unary("pid", |_: (), _: &Context| Ok(std::process::id()))
        .unary("set", |v: String, _: &Context| {
            *SESSION.lock().unwrap() = Some(v);
            Ok(())
        })
        .unary("get", |_: (), _: &Context| {
            Ok(SESSION.lock().unwrap().clone())
        })
        .unary(
            "fail",
            |code: u32, _: &Context| -> Result<(), HandlerError> {
                Err(HandlerError::new("failed on purpose").with_code(code))
            },
        )
        .unary("panic", |_: (), _: &Context| -> Result<(), HandlerError> {
            panic!("handler panicked on purpose")
        })
        .unary(
            "crash",
            |code: i32, _: &Context| -> Result<(), HandlerError> {
                eprintln!("about to crash with status {code}");
                std::process::exit(code)
            },
        )
        .unary("abort", |_: (), _: &Context| -> Result<(), HandlerError> {
            eprintln!("about to abort");
            std::process::abort()
        })
        // Ignores cancellation and deadlines: the parent must kill it after the grace.
        .unary("spin", |ms: u64, _: &Context| {
            let end = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < end {
                std::hint::spin_loop();
            }
            Ok(ms)
        })
        // Reports `{"done": i, "of": n}` every 12 ms (just over the SDK's 10 ms event spacing, so
        // none is coalesced away), then returns n.
        .unary("progress", |n: u64, ctx: &Context| {
            for i in 1..=n {
                std::thread::sleep(Duration::from_millis(12));
                ctx.event("progress", &serde_json::json!({"done": i, "of": n}));
            }
            Ok(n)
        })
        // Cooperative: returns early when cancelled.
        .unary("sleep", |ms: u64, ctx: &Context| {
            let end = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < end {
                if ctx.is_cancelled() {
                    return Err(HandlerError::new("noticed cancellation").with_code(1001));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(ms)
        })
        .unary(
            "print",
            |(stdout_bytes, stderr_lines): (usize, usize), _: &Context| {
                use std::io::Write;
                let line = [b'x'; 1023];
                let mut out = std::io::stdout().lock();
                let mut left = stdout_bytes;
                while left > 0 {
                    let n = left.min(1023);
                    out.write_all(&line[..n])?;
                    out.write_all(b"\n")?;
                    left = left.saturating_sub(n + 1);
                }
                out.flush()?;
                for i in 0..stderr_lines {
                    eprintln!("stderr line {i}");
                }
                Ok(stdout_bytes)
            },
        )
        .unary("alloc_mb", |mb: usize, _: &Context| {
            let mut block = vec![0u8; mb << 20];
            // Touch every page so it counts in RSS.
            for i in (0..block.len()).step_by(4096) {
                block[i] = 1;
            }
            HELD.lock().unwrap().push(block);
            Ok(mb)
        })
        .stream_blocking(
            "decls",
            |n: u64, ctx: &Context, rows: &BlockingRowSink<Decl>| {
                let mut name = String::new();
                for i in 0..n {
                    if ctx.is_cancelled() {
                        break;
                    }
                    use std::fmt::Write;
                    name.clear();
                    let _ = write!(name, "decl_{i}");
                    rows.send(Decl {
                        i,
                        name: name.clone(),
                        kind: "theorem",
                    })?;
                }
                Ok(Some(n))
            },
        )
        .codecs(&all_serde)
        // Raw codec end to end: the request is the text "<rows> <row size>", no summary.
        .stream_blocking(
            "raw_rows",
            |req: String, ctx: &Context, rows: &BlockingRowSink<Bytes>| {
                let mut it = req.split_whitespace().map(|s| s.parse::<u64>());
                let (Some(Ok(n)), Some(Ok(size))) = (it.next(), it.next()) else {
                    return Err(HandlerError::new("expected \"<rows> <size>\"").with_code(1400));
                };
                let row = Bytes::from(vec![7u8; size as usize]);
                for i in 0..n {
                    if i % 4096 == 0 && ctx.is_cancelled() {
                        break;
                    }
                    rows.send_ref(&row)?;
                }
                Ok(())
            },
        )
        .codecs(&[Codec::Raw])
        .stream(
            "count_slowly",
            |(n, ms): (u64, u64), _ctx: Context, rows: RowSink<u64>| async move {
                for i in 0..n {
                    rows.send(i).await?;
                    rows.flush().await?;
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Ok::<_, HandlerError>(())
            },
        )
        // Streams some rows, then dies (the crash-mid-stream test).
        .stream_blocking(
            "rows_then_crash",
            |n: u64, _: &Context, rows: &BlockingRowSink<u64>| -> Result<(), HandlerError> {
                for i in 0..n {
                    rows.send(i)?;
                }
                rows.flush()?;
                eprintln!("crashing mid-stream after {n} rows");
                std::thread::sleep(Duration::from_millis(20));
                std::process::abort()
            },
        )
        // The retry tests (PROTOCOL.md 21.7): the first attempt creates the marker file named
        // in the request (holding its pid), waits `crash_after_ms` and aborts; any later one
        // (the marker exists) waits `then_ms` (returning early when cancelled) and answers
        // its pid.
        .unary(
            "crash_unless_marked",
            |(marker, crash_after_ms, then_ms): (String, u64, u64), ctx: &Context| {
                if create_marker(&marker)? {
                    std::thread::sleep(Duration::from_millis(crash_after_ms));
                    eprintln!("crashing: {marker} was not there");
                    std::process::abort()
                }
                let end = Instant::now() + Duration::from_millis(then_ms);
                while Instant::now() < end {
                    if ctx.is_cancelled() {
                        return Err(HandlerError::new("noticed cancellation").with_code(1001));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(std::process::id())
            },
        )
        // A stream that aborts before its first row when the marker did not exist (and creates
        // it), else sends `n` rows and its pid as the summary.
        .stream_blocking(
            "rows_unless_marked",
            |(marker, n): (String, u64),
             _: &Context,
             rows: &BlockingRowSink<u64>|
             -> Result<Option<u32>, HandlerError> {
                if create_marker(&marker)? {
                    eprintln!("crashing before any row: {marker} was not there");
                    std::process::abort()
                }
                for i in 0..n {
                    rows.send(i)?;
                }
                Ok(Some(std::process::id()))
            },
        )
        .max_concurrency(1024)
        .run()
}
