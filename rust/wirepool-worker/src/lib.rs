//! Worker SDK of wirepool: serve typed unary and streaming methods to a wirepool parent.
//!
//! A worker is a few lines: register methods with serde request, response and row types,
//! say which codecs each accepts, call [`Worker::run`]. The SDK does the rest:
//!
//! - **Handshake** (HELLO/WELCOME) on the socket inherited through `WIREPOOL_FD`; the variable is
//!   removed and the descriptor made close-on-exec; on Linux the worker gets `SIGKILL` when its
//!   parent dies, and it exits on end-of-file of its socket.
//! - **Remote**: started without `WIREPOOL_FD` and with a join ticket (`WIREPOOL_TICKET` or
//!   `WIREPOOL_TICKET_FILE`), the same binary connects to its parent over TCP + TLS 1.3, pins
//!   the parent's certificate by the ticket's fingerprint, presents the ticket's secret and
//!   serves the same protocol (PROTOCOL.md 21); it pings its parent and exits when three
//!   heartbeats go unanswered. Cargo feature `remote` (default; rustls with ring).
//! - **Batching**: rows are serialised straight into the `ROWS` frame being built; a frame goes
//!   out when full (64 KiB by default), a few ms after its first row, and at the end. All output
//!   frames are coalesced and written with one vectored syscall whenever the socket is free.
//! - **Flow control**: a stream sends only while it has credit; a handler producing rows faster
//!   than the parent reads simply waits in [`RowSink::send`].
//! - **Cancellation and deadlines**: `CANCEL`, the request's `timeout_us`, and a drain's grace
//!   set the [`Context`]'s flag; async handlers are dropped at their next `.await`. A request
//!   whose deadline passes ends `DEADLINE_EXCEEDED` at once, even if a blocking handler ignores
//!   it (what that handler returns later is dropped); a cancelled request ends with its flag's
//!   code whatever the handler returns (PROTOCOL.md 8.3). The parent always gets exactly one
//!   terminal per request.
//! - **Exit**: [`Worker::run`] returns `Ok` after GOODBYE or end of file and `Err` after a
//!   protocol violation or the parent's `ERROR`, so a `main` returning its result exits with
//!   status 0 or 1 (PROTOCOL.md 8.4).
//! - **Isolation**: a panicking handler fails its own request with `HANDLER_PANIC`; blocking
//!   handlers run on handler threads, so `PING` is answered even while they spin on the CPU.
//! - **Limits**: at most `max_concurrency` requests run at once; more end with `OVERLOADED`.
//!
//! ```no_run
//! use wirepool_worker::{Codec, Context, HandlerError, RowSink, Worker};
//!
//! #[derive(serde::Deserialize)]
//! struct AddReq { a: i64, b: i64 }
//! #[derive(serde::Serialize)]
//! struct AddResp { sum: i64 }
//! #[derive(serde::Deserialize)]
//! struct DeclsReq { n: u64 }
//! #[derive(serde::Serialize)]
//! struct Decl { i: u64, name: String, kind: &'static str }
//!
//! fn main() -> std::io::Result<()> {
//!     Worker::new("demo")
//!         .unary("add", |req: AddReq, _ctx: &Context| Ok(AddResp { sum: req.a + req.b }))
//!         .stream("decls", |req: DeclsReq, ctx: Context, rows: RowSink<Decl>| async move {
//!             for i in 0..req.n {
//!                 ctx.event("progress", &serde_json::json!({ "done": i }));
//!                 rows.send(Decl { i, name: format!("decl_{i}"), kind: "theorem" }).await?;
//!             }
//!             Ok::<_, HandlerError>(Some(req.n)) // the summary; `Ok(())` for none
//!         })
//!         .codecs(&[Codec::Json, Codec::MsgPack])
//!         .max_concurrency(64)
//!         .run()
//! }
//! ```
//!
//! Which kind of handler to use: [`Worker::unary`] and [`Worker::stream_blocking`] run plain
//! functions on handler threads (CPU-bound or blocking work); [`Worker::unary_async`] and
//! [`Worker::stream`] run futures on the I/O thread (work that mostly waits). An async
//! handler that computes for long without awaiting delays every other request of the worker.

#![warn(missing_docs)]

mod context;
mod driver;
mod error;
mod handler_threads;
mod remote;
mod sink;
mod state;
#[cfg(feature = "remote")]
mod tls;
mod transport;
mod worker;

pub use context::Context;
pub use driver::FD_ENV;
pub use error::{HandlerError, StreamClosed};
pub use remote::{TICKET_ENV, TICKET_FILE_ENV};
pub use sink::{BlockingRowSink, RowSink};
/// Arrow IPC helpers (cargo feature `arrow`): build the `Bytes` a handler returns or sends as a
/// row for a method that accepts [`Codec::ArrowIpc`].
#[cfg(feature = "arrow")]
pub use wirepool_codec::arrow;
pub use wirepool_codec::{Codec, Encoded};
/// A buffer a handler writes a large result into, sent without a copy (see
/// [`Context::body_buf`]).
#[cfg(target_os = "linux")]
pub use wirepool_io::shm::BodyBuf;
pub use wirepool_proto::ErrorCode;
pub use worker::{Summary, Worker};
