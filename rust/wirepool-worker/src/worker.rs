//! The `Worker` builder and the type erasure of handlers.

use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use wirepool_codec::{Codec, CodecError};
use wirepool_proto::{ErrorCode, MethodKind};

use crate::context::Context;
use crate::error::HandlerError;
use crate::sink::{BlockingRowSink, RowSink};
use crate::state::{CancelReason, RequestShared, Terminal};
use crate::transport::Transport;

pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
/// An inline handler borrows its request's state, so the driver can reuse it.
type InlineFn = dyn Fn(&Arc<RequestShared>, Bytes) + Send + Sync;

/// A handler with its types erased: it decodes the body, runs, encodes, and ends the request.
pub(crate) enum Handler {
    /// Runs on a handler thread.
    Blocking(Arc<dyn Fn(Arc<RequestShared>, Bytes) + Send + Sync>),
    /// Runs to completion on the I/O thread, straight from the read loop.
    Inline(Arc<InlineFn>),
    /// Runs as a task on the I/O thread.
    Async(Arc<dyn Fn(Arc<RequestShared>, Bytes) -> BoxFuture + Send + Sync>),
}

pub(crate) struct Method {
    pub(crate) name: String,
    pub(crate) kind: MethodKind,
    pub(crate) codecs: Vec<Codec>,
    pub(crate) handler: Handler,
}

/// What a streaming handler may return besides its rows: `()` for no summary, or
/// `Option<S>` (`None`: no summary) encoded with the request's codec.
pub trait Summary: Send + 'static {
    /// Encode the summary (empty means none).
    fn encode_summary(self, codec: Codec) -> Result<Bytes, CodecError>;
}

impl Summary for () {
    fn encode_summary(self, _codec: Codec) -> Result<Bytes, CodecError> {
        Ok(Bytes::new())
    }
}

impl<S: Serialize + Send + 'static> Summary for Option<S> {
    fn encode_summary(self, codec: Codec) -> Result<Bytes, CodecError> {
        match self {
            None => Ok(Bytes::new()),
            Some(s) => codec.encode_bytes(s),
        }
    }
}

/// Bodies at least this large go through the shared-memory lane when it is on (PROTOCOL.md
/// 20.2's `shm_threshold`).
pub const DEFAULT_SHM_THRESHOLD: usize = 1 << 20;

/// A worker process: its methods, limits, and the loop that serves them.
///
/// ```no_run
/// use wirepool_worker::{Codec, Context, HandlerError, RowSink, Worker};
///
/// #[derive(serde::Deserialize)]
/// struct AddReq { a: i64, b: i64 }
/// #[derive(serde::Serialize)]
/// struct AddResp { sum: i64 }
/// #[derive(serde::Deserialize)]
/// struct Req { n: u64 }
/// #[derive(serde::Serialize)]
/// struct Row { i: u64, name: String, kind: &'static str }
///
/// fn main() -> std::io::Result<()> {
///     Worker::new("demo")
///         .unary("add", |req: AddReq, _ctx: &Context| Ok(AddResp { sum: req.a + req.b }))
///         .codecs(&[Codec::Json, Codec::MsgPack])
///         .stream("decls", |req: Req, ctx: Context, rows: RowSink<Row>| async move {
///             for i in 0..req.n {
///                 if ctx.is_cancelled() { break }
///                 rows.send(Row { i, name: format!("decl_{i}"), kind: "theorem" }).await?;
///             }
///             Ok::<_, HandlerError>(Some(req.n)) // summary; `Ok(())` for none
///         })
///         .max_concurrency(64)
///         .run()
/// }
/// ```
pub struct Worker {
    pub(crate) sdk_name: String,
    pub(crate) methods: Vec<Method>,
    pub(crate) max_concurrency: u32,
    pub(crate) max_frame_size: u32,
    pub(crate) batch_bytes: usize,
    pub(crate) flush_interval: Duration,
    pub(crate) shm_threshold: Option<usize>,
}

impl Worker {
    /// A worker with no methods. `name` is sent as the HELLO `sdk_name` (1-64 bytes).
    pub fn new(name: impl Into<String>) -> Worker {
        use wirepool_proto::constants as d;
        Worker {
            sdk_name: name.into(),
            methods: Vec::new(),
            max_concurrency: d::WORKER_DEFAULT_MAX_CONCURRENCY,
            max_frame_size: d::WORKER_DEFAULT_MAX_FRAME_SIZE,
            batch_bytes: d::WORKER_DEFAULT_ROWS_BATCH_BYTES as usize,
            flush_interval: Duration::from_millis(d::WORKER_DEFAULT_ROWS_FLUSH_INTERVAL_MS),
            shm_threshold: cfg!(target_os = "linux").then_some(DEFAULT_SHM_THRESHOLD),
        }
    }

    fn add(mut self, name: &str, kind: MethodKind, handler: Handler) -> Worker {
        assert!(
            self.methods.iter().all(|m| m.name != name),
            "method {name:?} registered twice"
        );
        let codecs = Codec::available()
            .into_iter()
            .filter(|c| !c.is_opaque())
            .collect();
        self.methods.push(Method {
            name: name.to_owned(),
            kind,
            codecs,
            handler,
        });
        self
    }

    /// Register a unary method served by a blocking function on a handler thread (so CPU-bound
    /// work never delays the I/O loop). It accepts the serde codecs of this build (JSON,
    /// MessagePack, CBOR) unless [`codecs`](Worker::codecs) says otherwise.
    pub fn unary<Req, Resp, F>(self, name: &str, handler: F) -> Worker
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(Req, &Context) -> Result<Resp, HandlerError> + Send + Sync + 'static,
    {
        self.add(
            name,
            MethodKind::Unary,
            Handler::Blocking(Arc::new(sync_unary(handler))),
        )
    }

    /// Register a unary method whose handler is cheap (microseconds, never blocking): it runs
    /// on the I/O thread straight from the read loop, with no thread hand-off, task or future.
    /// The fastest path for small calls; anything slower delays every other request and PONG,
    /// so use [`unary`](Worker::unary) for real work.
    ///
    /// ```no_run
    /// use wirepool_worker::{Context, Worker};
    /// Worker::new("demo")
    ///     .unary_inline("add", |(a, b): (i64, i64), _ctx: &Context| Ok(a + b))
    ///     .run()
    ///     .unwrap();
    /// ```
    pub fn unary_inline<Req, Resp, F>(self, name: &str, handler: F) -> Worker
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(Req, &Context) -> Result<Resp, HandlerError> + Send + Sync + 'static,
    {
        self.add(
            name,
            MethodKind::Unary,
            Handler::Inline(Arc::new(inline_unary(handler))),
        )
    }

    /// Register a unary method served by an async function on the I/O thread: for handlers
    /// that wait (timers, I/O) rather than compute. The future is dropped at cancellation.
    pub fn unary_async<Req, Resp, F, Fut>(self, name: &str, handler: F) -> Worker
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
        F: Fn(Req, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let run = move |req: Arc<RequestShared>, body: Bytes| -> BoxFuture {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                let work = async {
                    let input: Req = decode_request(&req, body)?;
                    let out = handler(
                        input,
                        Context {
                            req: Arc::clone(&req),
                        },
                    )
                    .await?;
                    req.codec.encode_bytes(out).map_err(encode_failed)
                };
                let terminal = match guarded(&req, work).await {
                    Ok(body) => Terminal::Result(body),
                    Err(e) => Terminal::Error(e),
                };
                end(&req, terminal);
            })
        };
        self.add(name, MethodKind::Unary, Handler::Async(Arc::new(run)))
    }

    /// Register a streaming method served by an async function on the I/O thread. It sends
    /// rows into a [`RowSink`] and returns a [`Summary`] (`()` or `Option<S>`). Rows are
    /// batched into frames by the SDK; `send` waits while the stream has no credit.
    pub fn stream<Req, Row, S, F, Fut>(self, name: &str, handler: F) -> Worker
    where
        Req: DeserializeOwned + Send + 'static,
        Row: Serialize + 'static,
        S: Summary,
        F: Fn(Req, Context, RowSink<Row>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S, HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let run = move |req: Arc<RequestShared>, body: Bytes| -> BoxFuture {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                let stream = Arc::clone(req.stream.as_ref().expect("stream request has a stream"));
                let work = async {
                    let input: Req = decode_request(&req, body)?;
                    let sink = RowSink {
                        req: Arc::clone(&req),
                        stream: Arc::clone(&stream),
                        _row: PhantomData,
                    };
                    let handler = std::pin::pin!(handler(
                        input,
                        Context {
                            req: Arc::clone(&req),
                        },
                        sink,
                    ));
                    // Polled through the stream: its rows are pushed without a lock per row.
                    let mut handler = handler;
                    let summary =
                        std::future::poll_fn(|cx| stream.poll_handler(handler.as_mut(), cx))
                            .await?;
                    let summary = summary.encode_summary(req.codec).map_err(encode_failed)?;
                    if let Some(failed) = stream.failure() {
                        return Err(HandlerError::protocol(failed.code(), failed.message));
                    }
                    stream
                        .finish_async(&req)
                        .await
                        .map_err(|e| HandlerError::protocol(e.code(), e.message))?;
                    Ok(summary)
                };
                let result = guarded(&req, work).await;
                end(&req, stream_terminal(&stream, result));
            })
        };
        self.add(name, MethodKind::Stream, Handler::Async(Arc::new(run)))
    }

    /// Register a streaming method served by a blocking function on a handler thread; its
    /// [`BlockingRowSink::send`] blocks while the stream has no credit.
    pub fn stream_blocking<Req, Row, S, F>(self, name: &str, handler: F) -> Worker
    where
        Req: DeserializeOwned + Send + 'static,
        Row: Serialize + 'static,
        S: Summary,
        F: Fn(Req, &Context, &BlockingRowSink<Row>) -> Result<S, HandlerError>
            + Send
            + Sync
            + 'static,
    {
        let run = move |req: Arc<RequestShared>, body: Bytes| {
            if let Some(e) = req.cancel_error() {
                return end(&req, Terminal::Error(e));
            }
            let stream = Arc::clone(req.stream.as_ref().expect("stream request has a stream"));
            let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<Bytes, HandlerError> {
                let input: Req = decode_request(&req, body)?;
                let sink = BlockingRowSink {
                    req: Arc::clone(&req),
                    stream: Arc::clone(&stream),
                    _row: PhantomData,
                };
                let summary = handler(
                    input,
                    &Context {
                        req: Arc::clone(&req),
                    },
                    &sink,
                )?;
                let summary = summary.encode_summary(req.codec).map_err(encode_failed)?;
                if let Some(failed) = stream.failure() {
                    return Err(HandlerError::protocol(failed.code(), failed.message));
                }
                stream
                    .finish_blocking(&req)
                    .map_err(|e| HandlerError::protocol(e.code(), e.message))?;
                Ok(summary)
            }));
            end(&req, stream_terminal(&stream, flatten_panic(outcome)));
        };
        self.add(name, MethodKind::Stream, Handler::Blocking(Arc::new(run)))
    }

    /// Set the codecs the most recently registered method accepts (1-16, no duplicates).
    ///
    /// # Panics
    /// If no method is registered yet, or the list is empty, too long, or repeats a codec.
    pub fn codecs(mut self, codecs: &[Codec]) -> Worker {
        let method = self
            .methods
            .last_mut()
            .expect("codecs() applies to the method registered before it");
        assert!(
            (1..=wirepool_proto::MAX_CODECS_PER_METHOD).contains(&codecs.len()),
            "a method accepts 1-16 codecs"
        );
        for (i, c) in codecs.iter().enumerate() {
            assert!(!codecs[..i].contains(c), "codec {c} listed twice");
        }
        method.codecs = codecs.to_vec();
        self
    }

    /// How many requests may run at once (sent in HELLO; the parent may lower it). Default 64.
    /// Blocking handlers get up to this many threads, started on demand.
    pub fn max_concurrency(mut self, n: u32) -> Worker {
        self.max_concurrency = n.max(1);
        self
    }

    /// The largest frame payload this worker accepts (65,536 - 16,777,216; default the maximum,
    /// the parent chooses the value used).
    pub fn max_frame_size(mut self, bytes: u32) -> Worker {
        self.max_frame_size = bytes.clamp(
            wirepool_proto::HANDSHAKE_MAX_FRAME_SIZE,
            wirepool_proto::MAX_MAX_FRAME_SIZE,
        );
        self
    }

    /// The preferred size of a ROWS frame (default 64 KiB). A batch goes out once it holds
    /// `wirepool_proto::rows_batch_bytes(bytes, initial_credit, max_frame_size)` bytes: this,
    /// at most a quarter of the stream window, at least 4,096, below the negotiated frame size
    /// (PROTOCOL.md 14.5).
    pub fn batch_bytes(mut self, bytes: usize) -> Worker {
        self.batch_bytes = bytes.max(64);
        self
    }

    /// The shared-memory lane (PROTOCOL.md 20, Linux): the worker offers it in its HELLO and,
    /// when the parent accepts, sends results and summaries of at least `threshold` bytes
    /// through a memory region shared with the parent instead of the socket. `None` offers
    /// nothing (a version 1 HELLO). Default: offered, 1 MiB (`shm_threshold` of section 20.2).
    pub fn shm_threshold(mut self, threshold: Option<usize>) -> Worker {
        self.shm_threshold = threshold
            .filter(|_| cfg!(target_os = "linux"))
            .map(|t| t.max(1));
        self
    }

    /// How long a partial batch may wait for more rows before it is sent (default 2 ms).
    pub fn flush_interval(mut self, interval: Duration) -> Worker {
        self.flush_interval = interval;
        self
    }

    /// Serve the parent until it drains the worker, closes the connection, or dies. Returns
    /// `Err` on a protocol violation, an I/O error, or a join that failed.
    ///
    /// Started by a local parent, the worker serves the socket named by `WIREPOOL_FD`: the
    /// variable is removed from the environment and the descriptor marked close-on-exec, so the
    /// worker's own children never inherit the connection; on Linux the process also asks for
    /// `SIGKILL` when its parent dies.
    ///
    /// Without `WIREPOOL_FD`, it joins a remote parent (PROTOCOL.md 21) with the ticket in
    /// `WIREPOOL_TICKET`, or in the file named by `WIREPOOL_TICKET_FILE` (both removed from the
    /// environment): TCP and TLS 1.3 with the parent's certificate pinned by the ticket's
    /// fingerprint, the ticket's secret, then the same protocol. It pings its parent and exits
    /// (`Ok`, a line on stderr saying why) once three heartbeats go unanswered. The same binary
    /// runs locally or remotely. TLS needs the cargo feature `remote` (on by default); without
    /// it only a plain ticket for a loopback parent is usable.
    ///
    /// A worker that cannot join (an unusable or expired ticket, no connection, a refusal by
    /// the parent) or whose remote session fails says why in one line on stderr and exits with
    /// status 1: a program started as a remote worker has no caller to return an error to.
    pub fn run(self) -> io::Result<()> {
        if std::env::var_os(crate::driver::FD_ENV).is_none() {
            match crate::remote::ticket_from_env() {
                Ok(Some(ticket)) => return self.join(ticket).or_else(|e| leave(&e)),
                Ok(None) => {}
                Err(e) => leave(&e),
            }
        }
        let socket = crate::driver::take_inherited_socket()?;
        crate::driver::set_parent_death_signal();
        self.serve(socket)
    }

    /// Serve the parent on an already connected socket (tests, or a custom launcher).
    pub fn serve(self, socket: std::os::unix::net::UnixStream) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = Arc::new(AtomicI32::new(socket.as_raw_fd()));
        let runtime = runtime(fd)?;
        runtime.block_on(async {
            let socket = Transport::socket(socket.into())?;
            crate::driver::serve(self, socket, None).await
        })
    }

    /// Join the remote parent named by `ticket` and serve it (no parent-death signal: the
    /// parent is whatever started this process, not the pool; the heartbeat watches the pool).
    fn join(self, ticket: crate::remote::Ticket) -> io::Result<()> {
        let fd = Arc::new(AtomicI32::new(-1));
        let runtime = runtime(Arc::clone(&fd))?;
        runtime.block_on(async {
            let (transport, connected_at) = crate::remote::connect(&ticket).await?;
            fd.store(transport.raw_fd(), Ordering::Relaxed);
            let watch = crate::remote::ParentWatch::new(connected_at);
            crate::driver::serve(self, transport, Some(watch)).await
        })
    }
}

/// Ends a remote worker that could not join or serve: one line for people, status 1.
fn leave(e: &io::Error) -> ! {
    let text = e.to_string();
    let prefix = if text.starts_with("wirepool worker:") {
        ""
    } else {
        "wirepool worker: "
    };
    eprintln!("{prefix}{text}");
    std::process::exit(1)
}

/// The worker's runtime: one I/O thread that watches the socket `fd` (once known) briefly
/// before it sleeps.
fn runtime(fd: Arc<AtomicI32>) -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(move || {
            let fd = fd.load(Ordering::Relaxed);
            if fd >= 0 {
                wirepool_io::spin_until_readable(fd, SPIN_BEFORE_PARK);
            }
        })
        .build()
}

/// How long the I/O thread watches the socket before it sleeps. A parent making one call at a
/// time answers within microseconds; catching its next request while still awake saves the
/// wake-up of a sleeping (virtual) CPU, measured at several microseconds per call.
const SPIN_BEFORE_PARK: std::time::Duration = std::time::Duration::from_micros(30);

fn decode_request<Req: DeserializeOwned + 'static>(
    req: &RequestShared,
    body: Bytes,
) -> Result<Req, HandlerError> {
    req.codec
        .decode_bytes(body)
        .map_err(|e| HandlerError::protocol(ErrorCode::BadRequest, e.to_string()))
}

fn encode_failed(e: CodecError) -> HandlerError {
    HandlerError::new(format!("the handler's value could not be encoded: {e}"))
}

fn panic_error(payload: Box<dyn std::any::Any + Send>) -> HandlerError {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned());
    HandlerError::protocol(ErrorCode::HandlerPanic, format!("handler panicked: {what}"))
}

fn flatten_panic<T>(
    outcome: std::thread::Result<Result<T, HandlerError>>,
) -> Result<T, HandlerError> {
    outcome.unwrap_or_else(|payload| Err(panic_error(payload)))
}

/// A cancelled request ends `CANCELLED`/`DEADLINE_EXCEEDED` whatever its handler returned
/// (spec 8.3: the flag decides when the driver takes the outcome).
fn end(req: &RequestShared, terminal: Terminal) {
    if req.inline && req.deadline.is_some_and(|d| Instant::now() >= d) {
        // An inline handler ran on the I/O loop, so no deadline timer could fire meanwhile.
        req.cancel(CancelReason::Deadline);
    }
    let terminal = match req.cancel_error() {
        Some(e) => Terminal::Error(e),
        None => terminal,
    };
    req.shared.finish(req, terminal);
}

fn stream_terminal(
    stream: &crate::sink::RowBatcher,
    result: Result<Bytes, HandlerError>,
) -> Terminal {
    if let Some(failed) = stream.failure() {
        return Terminal::Error(HandlerError::protocol(failed.code(), failed.message));
    }
    match result {
        Ok(summary) => Terminal::End { summary },
        Err(e) => Terminal::Error(e),
    }
}

/// Run an async handler until it finishes, panics, or its request is cancelled (then it is
/// dropped at its current `.await`).
async fn guarded<T, F: Future<Output = Result<T, HandlerError>>>(
    req: &RequestShared,
    work: F,
) -> Result<T, HandlerError> {
    if let Some(e) = req.cancel_error() {
        return Err(e);
    }
    // The handler is polled first: one that completes at once never registers with the
    // cancellation token (a lock and an unlock per call). A late result of a cancelled request
    // is still replaced by CANCELLED in `end`.
    tokio::select! {
        biased;
        outcome = CatchUnwind(work) => flatten_panic(outcome),
        _ = req.token.cancelled() => Err(req.cancel_error().unwrap_or_else(|| HandlerError::protocol(ErrorCode::Cancelled, "cancelled"))),
    }
}

/// Polls a future inside `catch_unwind`, so a panicking async handler fails only its request.
struct CatchUnwind<F>(F);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of the only field; it is never moved out.
        let inner = unsafe { self.map_unchecked_mut(|s| &mut s.0) };
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

/// The request runner of a synchronous unary handler: decode, call (panics caught), encode, end.
fn sync_unary<Req, Resp, F>(
    handler: F,
) -> impl Fn(Arc<RequestShared>, Bytes) + Send + Sync + 'static
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: Fn(Req, &Context) -> Result<Resp, HandlerError> + Send + Sync + 'static,
{
    move |req: Arc<RequestShared>, body: Bytes| run_sync_unary(&handler, &req, body)
}

/// The inline variant borrows the request, so the driver can reuse its allocation.
fn inline_unary<Req, Resp, F>(
    handler: F,
) -> impl Fn(&Arc<RequestShared>, Bytes) + Send + Sync + 'static
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: Fn(Req, &Context) -> Result<Resp, HandlerError> + Send + Sync + 'static,
{
    move |req: &Arc<RequestShared>, body: Bytes| run_sync_unary(&handler, req, body)
}

fn run_sync_unary<Req, Resp, F>(handler: &F, req: &Arc<RequestShared>, body: Bytes)
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: Fn(Req, &Context) -> Result<Resp, HandlerError> + Send + Sync + 'static,
{
    if let Some(e) = req.cancel_error() {
        // Cancelled or timed out while queued for a thread: do not start it.
        return end(req, Terminal::Error(e));
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<Bytes, HandlerError> {
        let input: Req = decode_request(req, body)?;
        let ctx = Context {
            req: Arc::clone(req),
        };
        let out = handler(input, &ctx)?;
        req.codec.encode_bytes(out).map_err(encode_failed)
    }));
    let terminal = match flatten_panic(outcome) {
        Ok(body) => Terminal::Result(body),
        Err(e) => Terminal::Error(e),
    };
    end(req, terminal);
}

#[cfg(test)]
mod default_tests {
    use super::*;

    /// The worker defaults of `spec/constants.json` (PROTOCOL.md section 17) that apply to Rust.
    #[test]
    fn defaults_follow_the_spec_table() {
        let path =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/constants.json");
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let w = Worker::new("defaults");
        let mut checked = 0;
        for d in c["sdk_defaults"].as_array().unwrap() {
            if d["side"] != "worker" || !(d["language"] == "all" || d["language"] == "rust") {
                continue;
            }
            let name = d["name"].as_str().unwrap();
            let ours = match name {
                "max_concurrency" => u64::from(w.max_concurrency),
                "max_frame_size" => u64::from(w.max_frame_size),
                "rows_flush_interval" => w.flush_interval.as_millis() as u64,
                "rows_batch_bytes" => w.batch_bytes as u64,
                "event_interval" => crate::state::EVENT_SPACING.as_millis() as u64,
                other => panic!("worker default {other} has no Rust counterpart: add it here"),
            };
            assert_eq!(
                ours,
                d["value"].as_u64().unwrap(),
                "{name}: {}",
                d["reason"]
            );
            checked += 1;
        }
        assert_eq!(checked, 5);
        let bound = c["timing"]["rows_flush_bound_ms"].as_u64().unwrap();
        assert!(
            (w.flush_interval.as_millis() as u64) < bound,
            "the flush rule (spec 6)"
        );
    }
}
