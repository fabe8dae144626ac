//! The parent side of wirepool: a supervised pool of worker processes (of any language) behind
//! a fast, typed, binary wire protocol (`spec/PROTOCOL.md`).
//!
//! - [`Pool::call`]: a typed unary call on the least-loaded worker.
//! - [`Pool::stream`]: typed rows streamed back with credit flow control; rows are decoded
//!   lazily from the frame they arrived in, so memory stays bounded whatever the consumer's pace.
//! - [`Pool::lease`]: one worker held for a sequence of calls (warm session state).
//! - Progress events from workers ([`event_channel`]): per call or pool-wide, into a bounded
//!   mailbox that coalesces instead of growing.
//! - Cancellation by dropping a call or stream; per-call deadlines that travel on the wire.
//! - Supervision: heartbeats, restarts with backoff and an intensity limit, recycling by request
//!   count, RSS or idle time (drained first, so no request fails), graceful [`Pool::shutdown`].
//! - Every request ends in exactly one outcome; a worker's death gives each of its requests one
//!   typed [`Error`] carrying the exit status or signal and the tail of its stderr.
//! - [`Pool::metrics`]: per-worker counters and RSS, per-method latency percentiles; in the
//!   Prometheus text format with [`PoolMetrics::to_prometheus`] ([`prometheus`]).
//! - [`blocking::BlockingPool`]: the same for synchronous code.
//! - Remote workers ([`remote`], cargo feature `remote`, on by default): workers on other
//!   machines connect back over TLS 1.3 and join with a ticket; launchers decide where workers
//!   run (local children, children joining over TLS, or workers started by anything else), and
//!   a pool can mix them.
//!
//! ```no_run
//! use wirepool::{MethodKind, Pool, WorkerCommand};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> wirepool::Result<()> {
//! let pool = Pool::builder(WorkerCommand::new("./target/release/examples/echo_worker"))
//!     .workers(2)
//!     .require_method("add", MethodKind::Unary)
//!     .require_method("decls", MethodKind::Stream)
//!     .start()
//!     .await?;
//!
//! let sum: i64 = pool.call("add", &[2, 3]).await?;
//!
//! #[derive(serde::Deserialize)]
//! struct Decl { i: u64, name: String, kind: String }
//! let mut rows = pool.stream::<_, Decl>("decls", &1_000_000u64).await?;
//! let mut n = 0;
//! while let Some(decl) = rows.next().await {
//!     let decl = decl?;
//!     n += 1;
//! }
//! pool.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Workers are started directly (never through a shell), each in its own process group, with
//! one end of a Unix socketpair inherited as the descriptor named by `WIREPOOL_FD`. Their stdout
//! and stderr are read continuously and forwarded to [`tracing`] at WARN (target
//! `wirepool::worker`, fields `worker`, `pid`, `stream`), or inherited or discarded
//! ([`WorkerOutput`]).

#![warn(missing_docs)]

pub mod blocking;
#[cfg(target_os = "linux")]
mod body;
mod call_options;
mod config;
mod error;
mod events;
mod liveness;
mod lock;
mod metrics;
mod pending;
mod pool;
pub mod prometheus;
pub mod remote;
mod spawn;
mod stream;
mod validate;
mod worker;

#[cfg(target_os = "linux")]
pub use body::BodyBuf;
pub use config::{
    MethodKind, MethodSpec, OfferedMethod, RecyclePolicy, RestartPolicy, RetryPolicy,
};
pub use error::{codes, Error, ExitCause, ExitInfo, Result};
pub use events::{event_channel, EventReceiver, EventSender, WorkerEvent};
pub use metrics::{LatencySnapshot, PoolMetrics, WorkerMetrics, WorkerState};
pub use pool::{CallOptions, Lease, Pool, PoolBuilder};
pub use spawn::{peak_rss_bytes, WorkerCommand, WorkerOutput};
pub use stream::{RowBatch, RowStream};
pub use wirepool_codec::Codec;
pub use wirepool_proto::RowsPayload;
