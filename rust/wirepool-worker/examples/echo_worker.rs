//! The reference test worker: every behaviour the parent SDKs, the conformance tests and the
//! benchmarks need, under stable method names.
//!
//! | method | kind | codecs | request -> answer |
//! |---|---|---|---|
//! | `echo` | unary | raw, json, msgpack | any body -> the same bytes (no decode, no copy) |
//! | `echo_async` | unary (async) | raw, json, msgpack | same as `echo`, served on the I/O thread (no handler-thread hop) |
//! | `add` | unary | json | `{"a": i64, "b": i64}` -> `{"sum": a + b}` |
//! | `decls` | stream | json, msgpack, cbor | `{"n": N}` -> rows `{"i":i,"name":"decl_i","kind":"theorem"}`, summary `{"rows": N}` |
//! | `decls_blocking` | stream | json, msgpack, cbor | same, from a blocking handler |
//! | `trickle` | stream (async) | json | `{"n": N, "ms": M}` -> rows `0..N`, sleeping M ms after each (the flush timer sends them) |
//! | `panic_row` | stream | json | `n` -> rows `0..n`, but serialising row 3 panics (-> `HANDLER_PANIC`, rows 0-2 intact) |
//! | `shared_rows` | stream (async) | json | `n` -> rows `"h0".."h<n-1>"` from the handler and `"t0".."t<n-1>"` from a thread that sends on the same sink at the same time; rows `"s0".."s<n-1>"` from a task it spawns after, one per await |
//! | `raw_rows` | stream | raw | `"N SIZE"` (text) -> N rows of SIZE bytes (first 8 = i LE), no summary |
//! | `sleep` | unary (async) | json | `ms` -> `ms` after sleeping; dropped at cancellation |
//! | `sleep_blocking` | unary | json | `ms` -> `ms`; polls cancellation every millisecond |
//! | `spin` | unary | json | `us` -> busy-loops `us` microseconds on a handler thread (stops if cancelled) |
//! | `gather` | unary | json | `n` -> blocks until `n` gather calls are running at once, returns `n` (proves concurrency) |
//! | `crash` | unary | json | aborts the whole process |
//! | `panic` | unary | json | panics (-> `HANDLER_PANIC`) |
//! | `fail` | unary | json | any -> `HANDLER_ERROR` with details `{"request": <it>}` |
//! | `print` | unary | json | `{"stream": "stdout"\|"stderr", "n": N}` -> writes N bytes there, returns N |
//! | `progress` | unary | json | `n` -> sends n `progress` events (coalesced), returns n |
//! | `add_inline` | unary (inline) | json | as `add`, run straight from the read loop; `a == -1` panics |
//!
//! Run it from a wirepool parent (it needs `WIREPOOL_FD`); `--max-concurrency N` changes the
//! limit it declares.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use wirepool_worker::{BlockingRowSink, Codec, Context, Encoded, HandlerError, RowSink, Worker};

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
struct DeclsReq {
    n: u64,
}

#[derive(Serialize)]
struct Decl {
    i: u64,
    name: String,
    kind: &'static str,
}

#[derive(Serialize)]
struct DeclsSummary {
    rows: u64,
}

/// A row whose `Serialize` panics for the value 3.
struct PanicRow(u64);

impl Serialize for PanicRow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        assert!(self.0 != 3, "row 3 refuses to serialise");
        serializer.serialize_u64(self.0)
    }
}

#[derive(Deserialize)]
struct TrickleReq {
    n: u64,
    ms: u64,
}

#[derive(Deserialize)]
struct PrintReq {
    stream: String,
    n: usize,
}

impl Decl {
    /// Rewrite this row in place for index `i` (no allocation per row).
    fn set(&mut self, i: u64) {
        self.i = i;
        self.name.clear();
        let _ = write!(self.name, "decl_{i}");
    }
}

fn parse_raw_rows(req: &str) -> Result<(u64, usize), HandlerError> {
    let mut parts = req.split_whitespace();
    let n = parts.next().unwrap_or("0").parse()?;
    let size = parts.next().unwrap_or("16").parse()?;
    Ok((n, size))
}

/// Calls of `gather` currently running.
static GATHERED: Mutex<u64> = Mutex::new(0);
static GATHER_CHANGED: Condvar = Condvar::new();

fn gather(n: u64, ctx: &Context) -> Result<u64, HandlerError> {
    let mut count = GATHERED.lock().unwrap();
    *count += 1;
    GATHER_CHANGED.notify_all();
    while *count < n && !ctx.is_cancelled() {
        // Timed wait: the cancellation flag is polled, it does not signal this condvar.
        count = GATHER_CHANGED
            .wait_timeout(count, Duration::from_millis(5))
            .unwrap()
            .0;
    }
    Ok(n)
}

/// Runs a future on this thread (a thread of the handler's own, off the worker's runtime).
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        match fut.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(out) => return out,
            std::task::Poll::Pending => std::thread::park(),
        }
    }
}

/// `shared_rows`: one sink used by the handler, a thread and a spawned task (the handler's
/// rows are pushed by the thread polling it without a lock; the others take the lock and wait
/// for the frame while a poll holds it). Each source's rows must arrive whole and in order.
async fn shared_rows(n: u64, rows: RowSink<String>) -> Result<(), HandlerError> {
    let rows = std::sync::Arc::new(rows);
    let sink = std::sync::Arc::clone(&rows);
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let sent = block_on(async {
            for i in 0..n {
                sink.send(format!("t{i}")).await?;
            }
            Ok::<_, wirepool_worker::StreamClosed>(())
        });
        let _ = done_tx.send(sent);
    });
    for i in 0..n {
        rows.send(format!("h{i}")).await?;
    }
    done_rx
        .await
        .map_err(|_| HandlerError::new("the sending thread died"))??;
    for i in 0..n {
        let sink = std::sync::Arc::clone(&rows);
        tokio::spawn(async move { sink.send(format!("s{i}")).await })
            .await
            .map_err(|e| HandlerError::new(e.to_string()))??;
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let mut max_concurrency = 64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--max-concurrency" {
            max_concurrency = args.next().and_then(|v| v.parse().ok()).unwrap_or(64);
        }
    }
    Worker::new("wirepool-rust-echo")
        .unary("echo", |body: Encoded, _ctx: &Context| Ok(body))
        .codecs(&[Codec::Raw, Codec::Json, Codec::MsgPack])
        .unary_async("echo_async", |body: Encoded, _ctx: Context| async move {
            Ok(body)
        })
        .codecs(&[Codec::Raw, Codec::Json, Codec::MsgPack])
        .unary("add", |req: AddReq, _ctx: &Context| {
            Ok(AddResp { sum: req.a + req.b })
        })
        .codecs(&[Codec::Json])
        .stream(
            "decls",
            |req: DeclsReq, _ctx: Context, rows: RowSink<Decl>| async move {
                let mut row = Decl {
                    i: 0,
                    name: String::with_capacity(32),
                    kind: "theorem",
                };
                for i in 0..req.n {
                    row.set(i);
                    rows.send_ref(&row).await?;
                }
                Ok(Some(DeclsSummary { rows: req.n }))
            },
        )
        .stream_blocking(
            "decls_blocking",
            |req: DeclsReq, _ctx: &Context, rows: &BlockingRowSink<Decl>| {
                let mut row = Decl {
                    i: 0,
                    name: String::with_capacity(32),
                    kind: "theorem",
                };
                for i in 0..req.n {
                    row.set(i);
                    rows.send_ref(&row)?;
                }
                Ok(Some(DeclsSummary { rows: req.n }))
            },
        )
        .stream(
            "trickle",
            |req: TrickleReq, _ctx: Context, rows: RowSink<u64>| async move {
                for i in 0..req.n {
                    rows.send(i).await?;
                    tokio::time::sleep(Duration::from_millis(req.ms)).await;
                }
                Ok(())
            },
        )
        .codecs(&[Codec::Json])
        .stream(
            "panic_row",
            |n: u64, _ctx: Context, rows: RowSink<PanicRow>| async move {
                for i in 0..n {
                    rows.send(PanicRow(i)).await?;
                }
                Ok(())
            },
        )
        .codecs(&[Codec::Json])
        .stream(
            "shared_rows",
            |n: u64, _ctx: Context, rows: RowSink<String>| shared_rows(n, rows),
        )
        .codecs(&[Codec::Json])
        .stream(
            "raw_rows",
            |req: String, _ctx: Context, rows: RowSink<ByteBuf>| async move {
                let (n, size) = parse_raw_rows(&req)?;
                let mut row = ByteBuf::from(vec![0xAB; size]);
                for i in 0..n {
                    let prefix = size.min(8);
                    row[..prefix].copy_from_slice(&i.to_le_bytes()[..prefix]);
                    rows.send_ref(&row).await?;
                }
                Ok(())
            },
        )
        .codecs(&[Codec::Raw])
        .unary_async("sleep", |ms: u64, _ctx: Context| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ms)
        })
        .codecs(&[Codec::Json])
        .unary("sleep_blocking", |ms: u64, ctx: &Context| {
            let end = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < end && !ctx.is_cancelled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(ms)
        })
        .codecs(&[Codec::Json])
        // Deaf to cancellation and deadline: PROTOCOL.md 8.3's answers are the SDK's, not its.
        .unary("deaf", |ms: u64, _ctx: &Context| {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(ms)
        })
        .codecs(&[Codec::Json])
        // Fails once it notices its cancellation: the request still ends with the flag's code.
        .unary(
            "fail_when_cancelled",
            |_: serde_json::Value, ctx: &Context| -> Result<(), HandlerError> {
                while !ctx.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(HandlerError::new("noticed the cancellation"))
            },
        )
        .codecs(&[Codec::Json])
        .unary("spin", |us: u64, ctx: &Context| {
            let end = Instant::now() + Duration::from_micros(us);
            let mut turns = 0u64;
            while Instant::now() < end && !ctx.is_cancelled() {
                turns = std::hint::black_box(turns + 1);
            }
            Ok(turns)
        })
        .codecs(&[Codec::Json])
        .unary("gather", gather)
        .codecs(&[Codec::Json])
        .unary(
            "crash",
            |_: serde_json::Value, _ctx: &Context| -> Result<(), HandlerError> {
                std::process::abort()
            },
        )
        .codecs(&[Codec::Json])
        .unary(
            "panic",
            |_: serde_json::Value, _ctx: &Context| -> Result<(), HandlerError> {
                panic!("the panic method was called")
            },
        )
        .codecs(&[Codec::Json])
        .unary(
            "fail",
            |req: serde_json::Value, _ctx: &Context| -> Result<(), HandlerError> {
                Err(HandlerError::new("the fail method was called")
                    .with_details(&serde_json::json!({ "request": req })))
            },
        )
        .codecs(&[Codec::Json])
        .unary("print", |req: PrintReq, _ctx: &Context| {
            let text = vec![b'x'; req.n];
            match req.stream.as_str() {
                "stdout" => std::io::stdout().write_all(&text)?,
                "stderr" => std::io::stderr().write_all(&text)?,
                other => return Err(HandlerError::new(format!("no stream named {other:?}"))),
            }
            Ok(req.n)
        })
        .codecs(&[Codec::Json])
        .unary("progress", |n: u64, ctx: &Context| {
            for i in 0..n {
                ctx.event("progress", &serde_json::json!({ "i": i, "of": n }));
            }
            Ok(n)
        })
        .codecs(&[Codec::Json])
        .unary_inline("add_inline", |req: AddReq, _ctx: &Context| {
            assert!(req.a != -1, "add_inline was asked to panic");
            Ok(AddResp { sum: req.a + req.b })
        })
        .codecs(&[Codec::Json])
        .max_concurrency(max_concurrency)
        .run()
}
