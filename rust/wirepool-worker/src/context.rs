//! What a handler knows about its request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wirepool_codec::Codec;

use crate::state::RequestShared;

/// The request a handler is serving: its id, codec, deadline, cancellation, and a way to send
/// progress events. Cheap to clone; clones refer to the same request.
///
/// Cancellation is cooperative: the flag is set when the parent sends `CANCEL`, when the
/// request's deadline passes, or when a drain's grace runs out. Blocking handlers poll
/// [`is_cancelled`](Context::is_cancelled); async handlers are simply dropped at their next
/// `.await` (and may also await [`cancelled`](Context::cancelled)). Either way the parent gets
/// `CANCELLED` or `DEADLINE_EXCEEDED`, never a late result.
#[derive(Clone)]
pub struct Context {
    pub(crate) req: Arc<RequestShared>,
}

impl Context {
    /// The request id chosen by the parent.
    pub fn request_id(&self) -> u64 {
        self.req.id
    }

    /// The codec of the request body, result, rows and summary.
    pub fn codec(&self) -> Codec {
        self.req.codec
    }

    /// True once the parent cancelled the request or its deadline passed.
    pub fn is_cancelled(&self) -> bool {
        self.req.token.is_cancelled()
    }

    /// Completes when the request is cancelled (see [`is_cancelled`](Context::is_cancelled)).
    pub async fn cancelled(&self) {
        self.req.token.cancelled().await
    }

    /// When the request's time budget (`timeout_us` of the REQUEST, counted from receipt) runs
    /// out, if it has one.
    pub fn deadline(&self) -> Option<Instant> {
        self.req.deadline
    }

    /// Time left before the deadline (`None`: no deadline; zero: passed).
    pub fn remaining(&self) -> Option<Duration> {
        self.req
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Send a progress event (`topic` 1-255 bytes, `data` serialised as JSON). Events are
    /// coalesced to at most one per 10 ms per request: a newer event replaces one still waiting,
    /// and the last one waiting goes out before the request's terminal. Invalid topics are
    /// ignored.
    pub fn event<T: serde::Serialize + ?Sized>(&self, topic: &str, data: &T) {
        let data = serde_json::to_string(data).unwrap_or_default();
        self.req.event(topic, data);
    }

    /// A buffer to write a large result (or summary) into, sent without a copy: in a region of
    /// this worker's shared memory when the parent accepted the lane (PROTOCOL.md 20) and
    /// `capacity` reaches the worker's `shm_threshold`, an ordinary heap buffer otherwise.
    /// Write the body, [`freeze`](crate::BodyBuf::freeze) it, and return the `Bytes` from a
    /// method whose codec is opaque (raw, Arrow IPC, ...) or as an [`Encoded`](crate::Encoded)
    /// (for a value you encoded into it yourself): the parent reads the very bytes written
    /// here. Where the lane is off, or the parent's window cannot take the region, the same
    /// `Bytes` goes over the socket. Dropping the buffer (a handler that fails after
    /// allocating) gives the region back at once. Linux only.
    ///
    /// ```no_run
    /// use bytes::Bytes;
    /// use wirepool_worker::{Codec, Context, HandlerError, Worker};
    ///
    /// fn main() -> std::io::Result<()> {
    ///     Worker::new("big")
    ///         .unary("zeros", |n: u64, ctx: &Context| -> Result<Bytes, HandlerError> {
    ///             let mut body = ctx.body_buf(n as usize);
    ///             body.resize(n as usize, 0); // written in place, never copied
    ///             Ok(body.freeze())
    ///         })
    ///         .codecs(&[Codec::Json, Codec::Raw])
    ///         .run()
    /// }
    /// ```
    #[cfg(target_os = "linux")]
    pub fn body_buf(&self, capacity: usize) -> crate::BodyBuf {
        let lane = {
            let state = self.req.shared.lock();
            capacity >= state.shm_threshold
                && state
                    .conn
                    .shm()
                    .is_some_and(|a| a.to_parent_window >= capacity as u64)
        };
        if lane {
            if let Ok(buf) = crate::BodyBuf::shared(capacity) {
                return buf;
            }
        }
        crate::BodyBuf::heap(capacity)
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("request_id", &self.req.id)
            .field("codec", &self.req.codec)
            .field("deadline", &self.req.deadline)
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
