//! Chainable construction of [`CallOptions`], so a per-call codec or budget takes one line
//! instead of a struct literal.

use std::time::Duration;

use wirepool_codec::Codec;

use crate::events::EventSender;
use crate::pool::CallOptions;

/// `CallOptions::timeout(d)` and `CallOptions::codec(c)` start from one option; the `with_*`
/// methods add the others, in any order.
///
/// ```no_run
/// use std::time::Duration;
/// use wirepool::{CallOptions, Codec, Pool};
///
/// # async fn demo(pool: Pool) -> wirepool::Result<()> {
/// // MessagePack for this call only, with a 2 s budget that travels to the worker.
/// let opts = CallOptions::codec(Codec::MsgPack).with_timeout(Duration::from_secs(2));
/// let sum: i64 = pool.call_with("add", &(2, 3), opts).await?;
/// # Ok(()) }
/// ```
///
/// They set the public fields, so the two forms are the same options:
///
/// ```
/// use std::time::Duration;
/// use wirepool::{CallOptions, Codec};
///
/// let opts = CallOptions::timeout(Duration::from_millis(200)).with_codec(Codec::Cbor);
/// assert_eq!(opts.codec, Some(Codec::Cbor));
/// assert_eq!(opts.timeout, Some(Duration::from_millis(200)));
/// ```
impl CallOptions {
    /// Options with a codec for this call (a method that does not accept it ends the call
    /// with `CODEC_UNSUPPORTED`).
    pub fn codec(codec: Codec) -> Self {
        CallOptions::default().with_codec(codec)
    }
    /// Options that mark this call idempotent (`true`: it may be sent again when its worker
    /// dies, under the pool's [`RetryPolicy`](crate::RetryPolicy)'s attempts, even if the
    /// policy does not name its method) or not (`false`: never sent again).
    ///
    /// ```no_run
    /// # async fn demo(pool: wirepool::Pool) -> wirepool::Result<()> {
    /// use wirepool::CallOptions;
    /// // Reading a key twice is harmless, whatever the method's other uses are.
    /// let v: Option<String> = pool.call_with("kv", &("get", "k"), CallOptions::idempotent(true)).await?;
    /// # Ok(()) }
    /// ```
    pub fn idempotent(idempotent: bool) -> Self {
        CallOptions::default().with_idempotent(idempotent)
    }
    /// The same options, marked idempotent or not (see [`idempotent`](Self::idempotent)).
    pub fn with_idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = Some(idempotent);
        self
    }
    /// The same options with a time budget (see [`CallOptions::timeout`](Self#structfield.timeout)).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
    /// The same options with a codec for this call.
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = Some(codec);
        self
    }
    /// The same options with this call's progress events going to `events` (see
    /// [`event_channel`](crate::event_channel)).
    pub fn with_events(mut self, events: EventSender) -> Self {
        self.events = Some(events);
        self
    }
}
