//! The Rust conformance worker: the method set of `conformance/README.md` on `wirepool-worker`.
//!
//! Every conformance worker (one per language) offers exactly these methods, with the same kinds,
//! codecs and behaviour, so every parent runner drives every worker with one scenario list
//! (`conformance/scenarios.json`). Names and semantics follow `wirepool-worker`'s `echo_worker`
//! where they overlap; the rest exist for scenarios `echo_worker` cannot express (a crash after N
//! rows, a producer position for the slow-consumer bound, an application error code).
//!
//! | method | kind | codecs | request -> answer |
//! |---|---|---|---|
//! | `echo` | unary | raw, json, msgpack, cbor | any body -> the same bytes |
//! | `add` | unary | json | `{"a": i64, "b": i64}` -> `{"sum": a + b}` |
//! | `decls` | stream | json, msgpack, cbor | `{"n": N}` -> rows `{"i","name":"decl_i","kind":"theorem"}`, summary `{"rows": N}` |
//! | `raw_rows` | stream | raw | `"N SIZE"` -> N rows of SIZE bytes (first 8 = i LE, rest 0xAB), no summary |
//! | `raw_rows_produced` | unary | json | any -> rows handed to the SDK by the latest `raw_rows` |
//! | `forever` | stream | json | any -> rows 0, 1, 2, ... until cancelled |
//! | `one_row_then_wait` | stream | json | any -> row 0, then waits until cancelled (the flush rule) |
//! | `sleep` | unary | json | ms -> ms after sleeping; stops at cancellation or deadline |
//! | `hang` | unary | json | ms -> ms after blocking ms, ignoring cancellation and deadline |
//! | `fail` | unary | json | any -> `HANDLER_ERROR` "the fail method was called" |
//! | `fail_app` | unary | json | any -> code 1042 "application failure", details `{"request": <it>}` |
//! | `crash` | unary | json | writes a line to stderr, then aborts (SIGABRT) |
//! | `crash_stream` | stream | json | `{"n": N}` -> decl rows 0..N, then a stderr line and abort |
//! | `fail_long` | unary | json | `{"n": N}` -> code 1042, message "long failure: " then N x "é" (2N bytes of UTF-8) |
//! | `big_summary` | stream | json | `{"size": N}` -> one row 0, then the summary: the pattern string of N characters |
//! | `fail_after` | stream | json | `{"n": N}` -> decl rows 0..N, then `HANDLER_ERROR` "failed after the rows" |
//! | `gather` | unary | json | n -> n, once n `gather` calls have arrived at this worker (blocks until then; stops if cancelled) |
//! | `spin` | unary | json | ms -> ms, after busy-looping ms on a handler thread (stops if cancelled) |
//! | `whoami` | unary | json | any -> this worker's process id |
//! | `exit` | unary | json | `{"status": N}` -> the process exits with status N at once |
//! | `freeze` | unary | json | any -> stops the whole process (SIGSTOP): it answers nothing, not even PING, and never answers once resumed |
//! | `print` | unary | json | `{"stream": "stdout"\|"stderr", "n": N}` -> writes N bytes `x` there, returns N |
//!
//! Started by a parent (it needs `WIREPOOL_FD`); not meant to be run by hand.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use wirepool_worker::{Codec, Context, Encoded, HandlerError, RowSink, Worker};

const CRASH_LINE: &str = "conformance worker: crash requested";
const APP_ERROR_CODE: u32 = 1042;

/// Rows handed to the SDK by the latest `raw_rows` stream (read by `raw_rows_produced`).
static RAW_ROWS_PRODUCED: AtomicU64 = AtomicU64::new(0);

/// `gather` calls that have arrived so far (each scenario runs on fresh worker processes).
static GATHERED: Mutex<u64> = Mutex::new(0);
static GATHER_CHANGED: Condvar = Condvar::new();

fn gather(n: u64, ctx: &Context) -> Result<u64, HandlerError> {
    let mut arrived = GATHERED.lock().unwrap();
    *arrived += 1;
    GATHER_CHANGED.notify_all();
    while *arrived < n {
        if ctx.is_cancelled() {
            return Err(HandlerError::new("cancelled while gathering"));
        }
        // Timed wait: cancellation sets a flag, it does not signal this condvar.
        arrived = GATHER_CHANGED
            .wait_timeout(arrived, Duration::from_millis(5))
            .unwrap()
            .0;
    }
    Ok(n)
}

#[derive(Deserialize)]
struct AddReq {
    a: i64,
    b: i64,
}

#[derive(Serialize)]
struct AddResp {
    sum: i64,
}

#[derive(Deserialize)]
struct CountReq {
    n: u64,
}

#[derive(Serialize)]
struct Decl {
    i: u64,
    name: String,
    kind: &'static str,
}

impl Decl {
    fn new() -> Self {
        Decl {
            i: 0,
            name: String::with_capacity(32),
            kind: "theorem",
        }
    }

    /// Rewrites this row for index `i` without allocating.
    fn set(&mut self, i: u64) {
        self.i = i;
        self.name.clear();
        let _ = write!(self.name, "decl_{i}");
    }
}

#[derive(Deserialize)]
struct ExitReq {
    status: i32,
}

#[derive(Deserialize)]
struct SizeReq {
    size: usize,
}

/// The pattern string of the scenarios' `{"string": {"size": N}}`: character i is 'a' + (31 i + 17) mod 26.
fn pattern_string(size: usize) -> String {
    (0..size)
        .map(|i| (b'a' + ((i * 31 + 17) % 26) as u8) as char)
        .collect()
}

#[derive(Deserialize)]
struct PrintReq {
    stream: String,
    n: usize,
}

#[derive(Serialize)]
struct DeclsSummary {
    rows: u64,
}

fn parse_raw_rows(req: &[u8]) -> Result<(u64, usize), HandlerError> {
    let text = std::str::from_utf8(req)
        .map_err(|e| HandlerError::new(format!("raw_rows wants text: {e}")))?;
    let mut parts = text.split_whitespace();
    let n = parts
        .next()
        .ok_or_else(|| HandlerError::new("raw_rows wants \"N SIZE\""))?
        .parse()?;
    let size = parts
        .next()
        .ok_or_else(|| HandlerError::new("raw_rows wants \"N SIZE\""))?
        .parse()?;
    Ok((n, size))
}

/// Says why on stderr (the parent reports its stderr tail), then dies by SIGABRT.
fn crash_now<T>() -> T {
    eprintln!("{CRASH_LINE}");
    std::process::abort()
}

fn main() -> std::io::Result<()> {
    Worker::new("wirepool-rust-conformance")
        .unary("echo", |body: Encoded, _ctx: &Context| Ok(body))
        .codecs(&[Codec::Raw, Codec::Json, Codec::MsgPack, Codec::Cbor])
        .unary("add", |req: AddReq, _ctx: &Context| {
            Ok(AddResp { sum: req.a + req.b })
        })
        .codecs(&[Codec::Json])
        .stream(
            "decls",
            |req: CountReq, _ctx: Context, rows: RowSink<Decl>| async move {
                let mut row = Decl::new();
                for i in 0..req.n {
                    row.set(i);
                    rows.send_ref(&row).await?;
                }
                Ok(Some(DeclsSummary { rows: req.n }))
            },
        )
        .codecs(&[Codec::Json, Codec::MsgPack, Codec::Cbor])
        .stream(
            "raw_rows",
            |req: ByteBuf, _ctx: Context, rows: RowSink<ByteBuf>| async move {
                let (n, size) = parse_raw_rows(&req)?;
                RAW_ROWS_PRODUCED.store(0, Ordering::SeqCst);
                let mut row = ByteBuf::from(vec![0xAB; size]);
                let prefix = size.min(8);
                for i in 0..n {
                    row[..prefix].copy_from_slice(&i.to_le_bytes()[..prefix]);
                    RAW_ROWS_PRODUCED.store(i + 1, Ordering::SeqCst);
                    rows.send_ref(&row).await?;
                }
                Ok(())
            },
        )
        .codecs(&[Codec::Raw])
        .unary(
            "raw_rows_produced",
            |_: serde_json::Value, _ctx: &Context| Ok(RAW_ROWS_PRODUCED.load(Ordering::SeqCst)),
        )
        .codecs(&[Codec::Json])
        .stream(
            "forever",
            |_: serde_json::Value, ctx: Context, rows: RowSink<u64>| async move {
                let mut i = 0u64;
                while !ctx.is_cancelled() {
                    rows.send(i).await?;
                    i += 1;
                }
                Ok(())
            },
        )
        .codecs(&[Codec::Json])
        .stream(
            "one_row_then_wait",
            |_: serde_json::Value, ctx: Context, rows: RowSink<u64>| async move {
                rows.send(0).await?;
                // Blocked after one row: the SDK must still send it within the flush bound.
                ctx.cancelled().await;
                Ok(())
            },
        )
        .codecs(&[Codec::Json])
        .unary_async("sleep", |ms: u64, _ctx: Context| async move {
            // Cancellation and the deadline drop this future at its await.
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ms)
        })
        .codecs(&[Codec::Json])
        .unary("hang", |ms: u64, _ctx: &Context| {
            // Deliberately deaf to cancellation: the parent must enforce the deadline itself.
            std::thread::sleep(Duration::from_millis(ms));
            Ok(ms)
        })
        .codecs(&[Codec::Json])
        .unary(
            "fail",
            |_: serde_json::Value, _ctx: &Context| -> Result<(), HandlerError> {
                Err(HandlerError::new("the fail method was called"))
            },
        )
        .codecs(&[Codec::Json])
        .unary(
            "fail_app",
            |req: serde_json::Value, _ctx: &Context| -> Result<(), HandlerError> {
                Err(HandlerError::new("application failure")
                    .with_code(APP_ERROR_CODE)
                    .with_details(&serde_json::json!({ "request": req })))
            },
        )
        .codecs(&[Codec::Json])
        .stream(
            "fail_after",
            |req: CountReq, _ctx: Context, rows: RowSink<Decl>| async move {
                let mut row = Decl::new();
                for i in 0..req.n {
                    row.set(i);
                    rows.send_ref(&row).await?;
                }
                Err::<(), _>(HandlerError::new("failed after the rows"))
            },
        )
        .codecs(&[Codec::Json])
        .unary("gather", gather)
        .codecs(&[Codec::Json])
        .unary(
            "fail_long",
            |req: CountReq, _ctx: &Context| -> Result<(), HandlerError> {
                let message = format!("long failure: {}", "\u{e9}".repeat(req.n as usize));
                Err(HandlerError::new(message).with_code(APP_ERROR_CODE))
            },
        )
        .codecs(&[Codec::Json])
        .stream(
            "big_summary",
            |req: SizeReq, _ctx: Context, rows: RowSink<u64>| async move {
                rows.send(0).await?;
                Ok(Some(pattern_string(req.size)))
            },
        )
        .codecs(&[Codec::Json])
        .unary(
            "crash",
            |_: serde_json::Value, _ctx: &Context| -> Result<(), HandlerError> { crash_now() },
        )
        .codecs(&[Codec::Json])
        .stream(
            "crash_stream",
            |req: CountReq, _ctx: Context, rows: RowSink<Decl>| async move {
                let mut row = Decl::new();
                for i in 0..req.n {
                    row.set(i);
                    rows.send_ref(&row).await?;
                }
                crash_now::<Result<(), HandlerError>>()
            },
        )
        .codecs(&[Codec::Json])
        .unary("spin", |ms: u64, ctx: &Context| {
            let end = std::time::Instant::now() + Duration::from_millis(ms);
            let mut turns = 0u64;
            while std::time::Instant::now() < end && !ctx.is_cancelled() {
                turns = std::hint::black_box(turns + 1);
            }
            Ok(ms)
        })
        .codecs(&[Codec::Json])
        .unary("whoami", |_: serde_json::Value, _ctx: &Context| {
            Ok(std::process::id())
        })
        .codecs(&[Codec::Json])
        .unary(
            "exit",
            |req: ExitReq, _ctx: &Context| -> Result<(), HandlerError> {
                std::process::exit(req.status)
            },
        )
        .codecs(&[Codec::Json])
        .unary(
            "freeze",
            |_: serde_json::Value, _ctx: &Context| -> Result<(), HandlerError> {
                // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
                unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                // Resumed (e.g. while the parent replaces it): never answer, so the outcome cannot
                // depend on when the resume came; the parent's WORKER_HUNG is the one terminal.
                loop {
                    std::thread::park();
                }
            },
        )
        .codecs(&[Codec::Json])
        .unary("print", |req: PrintReq, _ctx: &Context| {
            let text = vec![b'x'; req.n];
            match req.stream.as_str() {
                "stdout" => std::io::stdout().lock().write_all(&text)?,
                "stderr" => std::io::stderr().lock().write_all(&text)?,
                other => return Err(HandlerError::new(format!("no stream named {other:?}"))),
            }
            Ok(req.n)
        })
        .codecs(&[Codec::Json])
        .max_concurrency(64)
        .run()
}
