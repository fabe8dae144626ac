//! Request bodies written in place: the parent's half of the zero-copy send (PROTOCOL.md 20).

use crate::Pool;

/// A buffer a parent writes a large request body into, sent to the worker without a copy (see
/// [`Pool::body_buf`]). The same type as the worker's `Context::body_buf`.
pub use wirepool_io::shm::BodyBuf;

impl Pool {
    /// A buffer to write a large request body into, sent without a copy: in a shared region of
    /// this process when the pool's lane is on ([`PoolBuilder::shm_lane`](crate::PoolBuilder::shm_lane))
    /// and `capacity` reaches its threshold, an ordinary heap buffer otherwise. Write the body,
    /// [`freeze`](BodyBuf::freeze) it and pass the `Bytes` to [`call_raw`](Pool::call_raw) (or
    /// as a `Bytes` or [`Encoded`](wirepool_codec::Encoded) value to the typed calls): a worker
    /// whose lane is on reads the very bytes written here (the region is announced to it once,
    /// then lent per call), one without it gets them over the socket. The region is not written
    /// again while the `Bytes`, any clone of it, or a worker's loan of it lives, so one body
    /// can be sent to many workers, or many times. Linux only.
    ///
    /// ```no_run
    /// # async fn demo(pool: &wirepool::Pool) -> wirepool::Result<()> {
    /// use std::io::Write;
    /// let mut body = pool.body_buf(256 << 20);
    /// body.write_all(b"a header").unwrap();
    /// body.unfilled(256 << 20).fill(1); // written in place, never copied
    /// let reply = pool.call_raw("checksum", body.freeze()).await?;
    /// # let _ = reply; Ok(()) }
    /// ```
    pub fn body_buf(&self, capacity: usize) -> BodyBuf {
        let lane = self
            .inner
            .shared
            .cfg
            .shm_threshold
            .is_some_and(|t| capacity >= t);
        if lane {
            if let Ok(buf) = BodyBuf::shared(capacity) {
                return buf;
            }
        }
        BodyBuf::heap(capacity)
    }
}
