//! Streams of rows: whole ROWS frames handed from the reader task to the consumer, rows decoded
//! lazily from the frame bytes, credit granted as the consumer reads.

use crate::lock::Locked;
use std::collections::VecDeque;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use wirepool_codec::Codec;
use wirepool_proto::RowsPayload;

use crate::error::{Error, Result};
use crate::worker::{Worker, WorkerRequest};

/// One stream's ROWS frames and terminal, queued by the reader task for the stream's consumer.
///
/// The queue is bounded by the protocol, not by a capacity here: the worker may only send ROWS
/// while the stream's credit is positive, and the credit only grows when the consumer pops
/// frames, so at most `initial_credit + max_frame_size` bytes ever wait here (the connection
/// closes the worker with `FLOW_CONTROL` otherwise).
pub(crate) struct RowQueue {
    state: Mutex<StreamState>,
}

struct StreamState {
    frames: VecDeque<RowsPayload>,
    /// Set once: the END summary or the error that ended the stream.
    terminal: Option<Result<Bytes>>,
    waker: Option<Waker>,
    /// The consumer is gone: frames are dropped on arrival.
    abandoned: bool,
}

impl RowQueue {
    pub fn new() -> Arc<Self> {
        Arc::new(RowQueue {
            state: Mutex::new(StreamState {
                frames: VecDeque::new(),
                terminal: None,
                waker: None,
                abandoned: false,
            }),
        })
    }

    /// Called by the reader task for each ROWS frame. A frame nobody will read (the consumer
    /// is gone or the stream already ended) comes back: the reader reports it consumed.
    pub fn push_rows(&self, rows: RowsPayload) -> std::result::Result<(), RowsPayload> {
        let waker = {
            let mut s = self.state.locked();
            if s.abandoned || s.terminal.is_some() {
                return Err(rows);
            }
            s.frames.push_back(rows);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Called exactly once per stream, with the summary or the error that ended it.
    pub fn finish(&self, outcome: Result<Bytes>) {
        let waker = {
            let mut s = self.state.locked();
            if s.terminal.is_some() {
                return;
            }
            s.terminal = Some(outcome);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The consumer is gone: drops the frames it will never read and returns their payload
    /// bytes, which count as consumed (PROTOCOL.md 14.3).
    fn abandon(&self) -> usize {
        let mut s = self.state.locked();
        s.abandoned = true;
        s.frames.drain(..).map(|f| f.payload().len()).sum()
    }

    /// The next frame, or the terminal outcome (handed out once) after the last frame.
    fn poll_frame(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<std::result::Result<RowsPayload, Result<Bytes>>> {
        let mut s = self.state.locked();
        if let Some(f) = s.frames.pop_front() {
            return Poll::Ready(Ok(f));
        }
        match s.terminal.take() {
            Some(t) => Poll::Ready(Err(t)),
            None => {
                match &s.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => s.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

/// A stream's request being sent again: the new request and its queue, or an error when no
/// worker took it in time.
pub(crate) type Resending =
    Pin<Box<dyn Future<Output = Result<(WorkerRequest, Arc<RowQueue>)>> + Send>>;

/// Sends a stream's request again with what is left of its deadline.
pub(crate) type Resend = Box<dyn Fn(Option<Duration>) -> Resending + Send + Sync>;

/// A stream the pool's retry policy may send again (PROTOCOL.md 21.7): if its worker dies
/// before any of its rows reached the caller, tries are left and so is time.
pub(crate) struct StreamRetry {
    /// Tries in all, and requests sent so far.
    limit: u32,
    tries: u32,
    /// The first request's start plus its timeout.
    deadline: Option<Instant>,
    resend: Resend,
    /// The request being sent again (in a `Mutex` only so the stream stays `Sync`: it is
    /// reached through `&mut`, never locked), and the error of the attempt before it.
    pending: Option<(Mutex<Resending>, Error)>,
}

impl StreamRetry {
    pub fn new(limit: u32, deadline: Option<Instant>, resend: Resend) -> Self {
        StreamRetry {
            limit,
            tries: 1,
            deadline,
            resend,
            pending: None,
        }
    }
}

/// A stream of typed rows from one worker, ending with an optional summary.
///
/// Implements [`futures_core::Stream`]; [`next`](RowStream::next) is the same without a
/// `StreamExt` import. Rows are decoded one at a time from the frame they arrived in, so the
/// memory held is bounded by the stream's credit window whatever the consumer's speed.
/// Dropping the stream before its end cancels the request on the worker.
///
/// ```no_run
/// # async fn demo(pool: wirepool::Pool) -> wirepool::Result<()> {
/// #[derive(serde::Deserialize)]
/// struct Decl { i: u64, name: String }
/// let mut rows = pool.stream::<_, Decl>("decls", &10_000u64).await?;
/// while let Some(row) = rows.next().await {
///     let decl = row?;
///     assert!(decl.name.len() > 0 || decl.i == 0);
/// }
/// let summary: Option<serde_json::Value> = rows.summary()?;
/// # Ok(()) }
/// ```
pub struct RowStream<T> {
    worker: Arc<Worker>,
    id: u64,
    queue: Arc<RowQueue>,
    codec: Codec,
    /// The frame being read, and where the next row starts in it.
    current: Option<(RowsPayload, usize, u32)>,
    rows: u64,
    summary: Option<Bytes>,
    done: bool,
    started: Instant,
    method_no: usize,
    /// Set when the stream may be sent again after its worker's death.
    retry: Option<Box<StreamRetry>>,
    _row: PhantomData<fn() -> T>,
}

impl<T> RowStream<T> {
    pub(crate) fn new(
        req: WorkerRequest,
        queue: Arc<RowQueue>,
        codec: Codec,
        retry: Option<Box<StreamRetry>>,
    ) -> Self {
        RowStream {
            worker: req.worker,
            id: req.id,
            queue,
            codec,
            current: None,
            rows: 0,
            summary: None,
            done: false,
            started: req.started.unwrap_or_else(Instant::now),
            method_no: req.method_no,
            retry,
            _row: PhantomData,
        }
    }

    /// Rows read so far.
    pub fn rows_read(&self) -> u64 {
        self.rows
    }

    /// The END summary, decoded with the stream's codec: `Ok(None)` before the end or when the
    /// worker sent none.
    pub fn summary<S: DeserializeOwned + 'static>(&self) -> Result<Option<S>> {
        match &self.summary {
            Some(b) if !b.is_empty() => {
                self.codec
                    .decode_bytes(b.clone())
                    .map(Some)
                    .map_err(|e| Error::Decode {
                        what: "summary",
                        message: e.to_string(),
                    })
            }
            _ => Ok(None),
        }
    }

    /// The raw END summary bytes, once the stream has ended; `None` before the end or when the
    /// worker sent none (an empty summary on the wire, PROTOCOL.md section 4).
    pub fn summary_bytes(&self) -> Option<&Bytes> {
        self.summary.as_ref().filter(|b| !b.is_empty())
    }

    /// The next whole ROWS frame, for consumers that iterate rows themselves (the fastest path:
    /// no per-row decode call). Must not be mixed with partially read rows.
    pub async fn next_frame(&mut self) -> Option<Result<RowsPayload>> {
        if let Some((frame, _, _)) = self.current.take() {
            return Some(Ok(frame));
        }
        std::future::poll_fn(|cx| self.poll_next_frame(cx)).await
    }

    fn poll_next_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RowsPayload>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            if let Some(Poll::Pending) = self.poll_resend(cx) {
                return Poll::Pending;
            }
            match self.queue.poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(frame)) => {
                    self.rows += frame.count() as u64;
                    // The core applies the grant policy (a CREDIT once half the window is read).
                    self.worker.consumed(self.id, frame.payload().len());
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Err(Err(e))) if self.may_resend(&e) => {
                    let r = self.retry.as_deref_mut().expect("checked by may_resend");
                    let left = r
                        .deadline
                        .map(|d| d.saturating_duration_since(Instant::now()));
                    self.worker.counters.retries.fetch_add(1, Relaxed);
                    tracing::debug!(
                        target: "wirepool::call",
                        worker = self.worker.id,
                        attempt = r.tries + 1,
                        error = %e,
                        "sending an idempotent stream again"
                    );
                    r.pending = Some((Mutex::new((r.resend)(left)), e));
                }
                Poll::Ready(Err(outcome)) => {
                    self.done = true;
                    self.worker
                        .record_latency(self.method_no, self.started.elapsed());
                    match outcome {
                        Ok(summary) => {
                            self.summary = Some(summary);
                            return Poll::Ready(None);
                        }
                        Err(e) => {
                            let tries = self.retry.as_ref().map_or(1, |r| r.tries);
                            return Poll::Ready(Some(Err(e.with_attempts(tries))));
                        }
                    }
                }
            }
        }
    }

    /// Whether the stream's end with `e` sends it again (PROTOCOL.md 21.7): its worker died,
    /// none of its rows reached the caller, and tries and time are left.
    fn may_resend(&self, e: &Error) -> bool {
        self.retry.as_ref().is_some_and(|r| {
            self.rows == 0
                && e.is_worker_death()
                && r.tries < r.limit
                && r.deadline.is_none_or(|d| Instant::now() < d)
        })
    }

    /// Drives a request being sent again: `Pending` while it waits for a worker; once sent,
    /// the stream follows the new request; if it could not be, the stream ends with the last
    /// attempt's outcome. `None` when nothing is being sent again.
    fn poll_resend(&mut self, cx: &mut Context<'_>) -> Option<Poll<()>> {
        let r = self.retry.as_deref_mut()?;
        let (pending, _) = r.pending.as_mut()?;
        // The blocking facade first polls outside the runtime, where the wait's timer cannot
        // be made: it then waits in `block_on`, which polls again inside.
        if tokio::runtime::Handle::try_current().is_err() {
            cx.waker().wake_by_ref();
            return Some(Poll::Pending);
        }
        let sent = match pending
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
            .poll(cx)
        {
            Poll::Pending => return Some(Poll::Pending),
            Poll::Ready(sent) => sent,
        };
        let (_, last) = r.pending.take().expect("polled above");
        match sent {
            Ok((req, queue)) => {
                r.tries += 1;
                self.worker = req.worker;
                self.id = req.id;
                self.queue = queue;
            }
            Err(_) => {
                // No worker took it in time (or the pool closed): the last attempt's outcome
                // ends the stream, through its (emptied) queue, without another try.
                r.limit = r.tries;
                self.queue.finish(Err(last));
            }
        }
        Some(Poll::Ready(()))
    }
}

/// The row starting at `start` in a checked ROWS payload, and where the next one starts.
fn row_at(frame: &RowsPayload, start: usize) -> Option<(std::ops::Range<usize>, usize)> {
    let payload = frame.payload();
    let len_bytes: [u8; 4] = payload.get(start..start + 4)?.try_into().ok()?;
    let len = u32::from_le_bytes(len_bytes) as usize;
    let end = start + 4 + len;
    payload.get(start + 4..end)?;
    Some((start + 4..end, end))
}

impl<T: DeserializeOwned + 'static> RowStream<T> {
    /// The next row, `None` at the end of the stream (then [`summary`](Self::summary) is set).
    pub async fn next(&mut self) -> Option<Result<T>> {
        std::future::poll_fn(|cx| self.poll_row(cx)).await
    }

    /// The rows of the next `ROWS` frame (the rest of the frame [`next`](Self::next) was
    /// reading, if any), decoded one at a time as the batch is iterated: one wait per frame
    /// instead of one per row. `None` at the end of the stream, as for `next`.
    ///
    /// The frame's credit goes back to the worker when the frame is handed out, as with `next`;
    /// a batch dropped before its end skips its remaining rows.
    ///
    /// ```no_run
    /// # async fn demo(pool: wirepool::Pool) -> wirepool::Result<()> {
    /// #[derive(serde::Deserialize)]
    /// struct Decl { i: u64, name: String }
    /// let mut rows = pool.stream::<_, Decl>("decls", &10_000u64).await?;
    /// let mut total = 0;
    /// while let Some(batch) = rows.next_batch().await {
    ///     for decl in batch? {
    ///         total += decl?.i;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn next_batch(&mut self) -> Option<Result<RowBatch<T>>> {
        if let Some((frame, offset, left)) = self.current.take() {
            if left > 0 {
                return Some(Ok(RowBatch::new(frame, offset, left, self.codec)));
            }
        }
        let codec = self.codec;
        let frame = std::future::poll_fn(|cx| self.poll_next_frame(cx)).await?;
        Some(frame.map(|frame| {
            let count = frame.count();
            RowBatch::new(frame, 4, count, codec)
        }))
    }

    /// Reads every remaining row into a vector.
    pub async fn collect_rows(&mut self) -> Result<Vec<T>> {
        let mut out = Vec::new();
        while let Some(row) = self.next().await {
            out.push(row?);
        }
        Ok(out)
    }

    pub(crate) fn poll_row(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T>>> {
        loop {
            if let Some((frame, offset, left)) = &mut self.current {
                if *left > 0 {
                    let Some((range, next)) = row_at(frame, *offset) else {
                        self.current = None;
                        return Poll::Ready(Some(Err(Error::Decode {
                            what: "row",
                            message: "row out of bounds".into(),
                        })));
                    };
                    *offset = next;
                    *left -= 1;
                    return Poll::Ready(Some(decode_row(self.codec, frame, range)));
                }
                self.current = None;
            }
            match self.poll_next_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let count = frame.count();
                    self.current = Some((frame, 4, count));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// The rows of one `ROWS` frame, decoded one at a time from the frame's bytes
/// ([`RowStream::next_batch`]). An iterator of `Result<T>`: a row that does not decode is an
/// error for that row; a row that overruns the frame ends the batch with an error.
pub struct RowBatch<T> {
    frame: RowsPayload,
    offset: usize,
    left: u32,
    codec: Codec,
    _row: PhantomData<fn() -> T>,
}

impl<T> RowBatch<T> {
    fn new(frame: RowsPayload, offset: usize, left: u32, codec: Codec) -> Self {
        RowBatch {
            frame,
            offset,
            left,
            codec,
            _row: PhantomData,
        }
    }

    /// The frame the rows come from (rows already iterated included).
    pub fn frame(&self) -> &RowsPayload {
        &self.frame
    }
}

impl<T: DeserializeOwned + 'static> Iterator for RowBatch<T> {
    type Item = Result<T>;

    #[inline]
    fn next(&mut self) -> Option<Result<T>> {
        if self.left == 0 {
            return None;
        }
        let Some((range, next)) = row_at(&self.frame, self.offset) else {
            self.left = 0;
            return Some(Err(Error::Decode {
                what: "row",
                message: "row out of bounds".into(),
            }));
        };
        self.offset = next;
        self.left -= 1;
        Some(decode_row(self.codec, &self.frame, range))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl<T: DeserializeOwned + 'static> ExactSizeIterator for RowBatch<T> {}

impl<T> std::fmt::Debug for RowBatch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowBatch")
            .field("rows_left", &self.left)
            .field("codec", &self.codec)
            .finish()
    }
}

/// One row of a frame: opaque codecs hand out a shared slice of the frame (no copy); serde
/// codecs decode straight from the frame's bytes (no reference-count traffic).
#[inline]
fn decode_row<T: DeserializeOwned + 'static>(
    codec: Codec,
    frame: &RowsPayload,
    range: std::ops::Range<usize>,
) -> Result<T> {
    let decoded = if codec.is_opaque() {
        codec.decode_bytes(frame.payload().slice(range))
    } else {
        codec.decode(&frame.payload()[range])
    };
    decoded.map_err(|e| Error::Decode {
        what: "row",
        message: e.to_string(),
    })
}

impl<T: DeserializeOwned + 'static> futures_core::Stream for RowStream<T> {
    type Item = Result<T>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<T>>> {
        self.get_mut().poll_row(cx)
    }
}

impl<T> Unpin for RowStream<T> {}

impl<T> Drop for RowStream<T> {
    fn drop(&mut self) {
        if !self.done {
            // Rows nobody will read still count as consumed, so a worker that has not yet seen
            // the CANCEL is not left waiting for credit (the core grants nothing once the stream
            // has ended); frames arriving from now on are reported by the reader.
            let unread = self.queue.abandon();
            if unread > 0 {
                self.worker.consumed(self.id, unread);
            }
            self.worker.cancel(self.id);
        }
    }
}
