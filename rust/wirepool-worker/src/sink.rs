//! Row sinks: rows are serialised straight into the ROWS frame being built, frames go out when
//! full, on a short timer, and at the end, and only while the stream has credit.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

// No poisoning: a row push never panics under the lock, and the std guard's poison check costs a
// thread-local read per row (measured: a third of the worker's time on 16-byte raw rows).
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::Serialize;
use tokio::sync::Notify;
use wirepool_codec::Codec;
use wirepool_proto::{AppendError, ErrorCode, RowsFrame};

use crate::error::StreamClosed;
use crate::state::{RequestShared, Shared};

/// One stream's batch and credit waiters. Lock order: this state, then the worker state.
pub(crate) struct RowBatcher {
    id: u64,
    codec: Codec,
    batch_bytes: usize,
    shared: Arc<Shared>,
    state: Mutex<StreamState>,
    /// Blocking sinks wait here for credit or cancellation.
    credit_cv: Condvar,
    /// Async sinks and the flush timer wait here for credit or cancellation.
    credit_notify: Notify,
    /// The batch went from empty to one row: start the flush timer.
    arm: Notify,
}

struct StreamState {
    /// The next ROWS frame, filled row by row on the handler's thread (serialised straight into
    /// it) and handed to the core whole (`Connection::send_rows`): no second pass over its rows.
    frame: RowsFrame,
    /// Bumped on every credit grant or cancellation, so a blocking waiter never misses one.
    epoch: u64,
    /// The stream broke (row too large, row not encodable): the request's terminal.
    failure: Option<StreamClosed>,
    /// The END went out (or is going): the timer stops.
    closed: bool,
}

/// Where a row went.
enum Pushed {
    /// Into the frame, which can take more.
    Added,
    /// Into the frame, which reached the batch size: send it now.
    Flush,
    /// Not added: the frame is too full for it. Send the frame, then push the row again.
    Full,
}

enum Submit {
    Sent,
    NoCredit,
    Gone,
}

impl RowBatcher {
    pub(crate) fn new(
        id: u64,
        codec: Codec,
        max_frame: u32,
        batch_bytes: usize,
        shared: Arc<Shared>,
    ) -> RowBatcher {
        RowBatcher {
            id,
            codec,
            // A frame's payload can never exceed max_frame_size.
            batch_bytes: batch_bytes.min(max_frame as usize),
            shared,
            state: Mutex::new(StreamState {
                frame: RowsFrame::new(id, max_frame),
                epoch: 0,
                failure: None,
                closed: false,
            }),
            credit_cv: Condvar::new(),
            credit_notify: Notify::new(),
            arm: Notify::new(),
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock()
    }

    /// Credit arrived or the request was cancelled: wake whoever waits.
    pub(crate) fn wake(&self) {
        self.lock().epoch += 1;
        self.credit_cv.notify_all();
        self.credit_notify.notify_waiters();
    }

    pub(crate) fn failure(&self) -> Option<StreamClosed> {
        self.lock().failure.clone()
    }

    /// Serialise one row into the frame being filled.
    #[inline]
    fn push_row<R: Serialize + ?Sized>(
        &self,
        req: &RequestShared,
        row: &R,
    ) -> Result<Pushed, StreamClosed> {
        let mut st = self.lock();
        if let Some(f) = &st.failure {
            return Err(f.clone());
        }
        if let Some(e) = req.cancel_error() {
            return Err(StreamClosed {
                code: code_of(e.code()),
                message: e.message().to_owned(),
            });
        }
        if st.closed {
            return Err(StreamClosed {
                code: ErrorCode::Protocol,
                message: "the stream already ended".into(),
            });
        }
        if st.frame.is_empty() {
            st.frame.reserve(self.batch_bytes + 256);
        }
        let codec = self.codec;
        // A panicking `Serialize` unwinds to the handler's own guard (HANDLER_PANIC), leaving
        // only a torn row behind, which the frame never counts; the lock does not poison.
        match st.frame.append_with(|buf| codec.encode(row, buf)) {
            Ok(true) => {}
            Ok(false) => return Ok(Pushed::Full),
            Err(AppendError::Write(e)) => {
                return Err(self.fail(
                    &mut st,
                    ErrorCode::HandlerError,
                    format!("a row could not be encoded: {e}"),
                ))
            }
            Err(AppendError::Refused(e)) => return Err(self.fail(&mut st, e.code, e.message)),
        }
        if st.frame.count() == 1 {
            self.arm.notify_one();
        }
        Ok(if st.frame.payload_len() >= self.batch_bytes {
            Pushed::Flush
        } else {
            Pushed::Added
        })
    }

    fn fail(&self, st: &mut StreamState, code: ErrorCode, message: String) -> StreamClosed {
        let closed = StreamClosed { code, message };
        st.failure = Some(closed.clone());
        closed
    }

    fn needs_flush(&self, st: &StreamState, everything: bool) -> bool {
        !st.frame.is_empty() && (everything || st.frame.payload_len() >= self.batch_bytes)
    }

    /// Hand the frame to the core if the stream has credit; the core checks and charges it.
    fn try_submit(&self, st: &mut StreamState) -> Submit {
        if st.frame.is_empty() {
            return Submit::Sent;
        }
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        if state.closed || !state.conn.is_in_flight(self.id) {
            return Submit::Gone;
        }
        if !state.conn.can_send_rows(self.id) {
            return Submit::NoCredit;
        }
        let wake = state.writer_needs_wake();
        if state.conn.send_rows(&mut st.frame, &mut state.out).is_err() {
            return Submit::Gone;
        }
        drop(guard);
        if wake {
            self.shared.wake_writer.notify_one();
        }
        Submit::Sent
    }

    async fn flush_async(&self, req: &RequestShared, everything: bool) -> Result<(), StreamClosed> {
        loop {
            let notified = self.credit_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                let mut waiting = false;
                while !waiting && self.needs_flush(&st, everything) {
                    match self.try_submit(&mut st) {
                        Submit::Sent => {}
                        Submit::Gone => return Err(closed_error(req)),
                        Submit::NoCredit => waiting = true,
                    }
                }
                if !waiting {
                    return Ok(());
                }
            }
            if let Some(e) = req.cancel_error() {
                return Err(StreamClosed {
                    code: code_of(e.code()),
                    message: e.message().to_owned(),
                });
            }
            notified.await;
        }
    }

    fn flush_blocking(&self, req: &RequestShared, everything: bool) -> Result<(), StreamClosed> {
        let mut st = self.lock();
        loop {
            let mut waiting = false;
            while !waiting && self.needs_flush(&st, everything) {
                match self.try_submit(&mut st) {
                    Submit::Sent => {}
                    Submit::Gone => return Err(closed_error(req)),
                    Submit::NoCredit => waiting = true,
                }
            }
            if !waiting {
                return Ok(());
            }
            if let Some(e) = req.cancel_error() {
                return Err(StreamClosed {
                    code: code_of(e.code()),
                    message: e.message().to_owned(),
                });
            }
            let epoch = st.epoch;
            while st.epoch == epoch {
                self.credit_cv.wait(&mut st);
            }
        }
    }

    /// Send what is left (waiting for credit) and close.
    pub(crate) async fn finish_async(&self, req: &RequestShared) -> Result<(), StreamClosed> {
        self.flush_async(req, true).await?;
        self.close();
        Ok(())
    }

    pub(crate) fn finish_blocking(&self, req: &RequestShared) -> Result<(), StreamClosed> {
        self.flush_blocking(req, true)?;
        self.close();
        Ok(())
    }

    fn close(&self) {
        self.lock().closed = true;
        self.arm.notify_one();
    }

    /// Flush a partial batch `interval` after its first row, so slow producers still stream.
    pub(crate) async fn run_flush_timer(
        self: Arc<Self>,
        req: Arc<RequestShared>,
        interval: Duration,
    ) {
        loop {
            tokio::select! {
                _ = self.arm.notified() => {}
                _ = req.token.cancelled() => return,
            }
            if self.lock().closed {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = req.token.cancelled() => return,
            }
            if self.lock().closed || self.flush_async(&req, true).await.is_err() {
                return;
            }
        }
    }
}

fn code_of(code: u32) -> ErrorCode {
    ErrorCode::from_code(code).unwrap_or(ErrorCode::Cancelled)
}

fn closed_error(req: &RequestShared) -> StreamClosed {
    match req.cancel_error() {
        Some(e) => StreamClosed {
            code: code_of(e.code()),
            message: e.message().to_owned(),
        },
        None => StreamClosed {
            code: ErrorCode::Cancelled,
            message: "the request already ended".into(),
        },
    }
}

/// Where an async streaming handler sends its rows.
///
/// Rows are serialised with the request's codec straight into the `ROWS` frame being built.
/// A frame goes out when it reaches the worker's batch size, a few milliseconds after its first
/// row, and when the handler returns. `send` waits while the stream has no credit, so a handler
/// producing rows faster than the parent reads simply waits; it fails with [`StreamClosed`] once
/// the request is cancelled, its deadline passed, or a row cannot be sent (return the error with
/// `?`: the terminal is already decided).
///
/// ```no_run
/// # use wirepool_worker::{Worker, Context, RowSink, HandlerError};
/// #[derive(serde::Serialize)]
/// struct Row { i: u64 }
/// # let worker = Worker::new("doc");
/// worker.stream("count", |n: u64, _ctx: Context, rows: RowSink<Row>| async move {
///     for i in 0..n {
///         rows.send(Row { i }).await?;
///     }
///     Ok::<_, HandlerError>(())
/// });
/// ```
pub struct RowSink<Row> {
    pub(crate) req: Arc<RequestShared>,
    pub(crate) stream: Arc<RowBatcher>,
    pub(crate) _row: PhantomData<fn(Row)>,
}

impl<Row: Serialize> RowSink<Row> {
    /// Send one row (waits only when the batch is full and the stream has no credit).
    #[inline]
    pub async fn send(&self, row: Row) -> Result<(), StreamClosed> {
        self.send_ref(&row).await
    }

    /// Send one row by reference.
    #[inline]
    pub async fn send_ref(&self, row: &Row) -> Result<(), StreamClosed> {
        loop {
            match self.stream.push_row(&self.req, row)? {
                Pushed::Added => return Ok(()),
                Pushed::Flush => {
                    self.stream.flush_async(&self.req, false).await?;
                    // Let the writer put the frame on the socket (and the reader see
                    // CANCEL/PING) before serialising the next batch on this thread.
                    tokio::task::yield_now().await;
                    return Ok(());
                }
                // Rare: a big row after smaller ones. It opens the next frame.
                Pushed::Full => self.stream.flush_async(&self.req, true).await?,
            }
        }
    }

    /// Send every row of an iterator.
    pub async fn send_all<I: IntoIterator<Item = Row>>(&self, rows: I) -> Result<(), StreamClosed> {
        for row in rows {
            self.send_ref(&row).await?;
        }
        Ok(())
    }

    /// Send every row a `Stream` yields (for handlers whose rows come from another async
    /// source).
    ///
    /// ```no_run
    /// # use wirepool_worker::{Worker, Context, RowSink, HandlerError};
    /// # let worker = Worker::new("doc");
    /// worker.stream("squares", |n: u64, _ctx: Context, rows: RowSink<u64>| async move {
    ///     let (tx, rx) = tokio::sync::mpsc::channel(64);
    ///     tokio::spawn(async move {
    ///         for i in 0..n {
    ///             if tx.send(i * i).await.is_err() { break }
    ///         }
    ///     });
    ///     rows.send_stream(tokio_stream_like(rx)).await?;
    ///     Ok::<_, HandlerError>(())
    /// });
    /// # fn tokio_stream_like(mut rx: tokio::sync::mpsc::Receiver<u64>) -> impl futures_core::Stream<Item = u64> {
    /// #     struct S(tokio::sync::mpsc::Receiver<u64>);
    /// #     impl futures_core::Stream for S {
    /// #         type Item = u64;
    /// #         fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<u64>> { self.0.poll_recv(cx) }
    /// #     }
    /// #     S(rx)
    /// # }
    /// ```
    pub async fn send_stream<S: futures_core::Stream<Item = Row>>(
        &self,
        rows: S,
    ) -> Result<(), StreamClosed> {
        let mut rows = std::pin::pin!(rows);
        while let Some(row) = std::future::poll_fn(|cx| rows.as_mut().poll_next(cx)).await {
            self.send_ref(&row).await?;
        }
        Ok(())
    }

    /// Send the partial batch now (waiting for credit if needed).
    pub async fn flush(&self) -> Result<(), StreamClosed> {
        self.stream.flush_async(&self.req, true).await
    }
}

impl<Row> std::fmt::Debug for RowSink<Row> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowSink")
            .field("request_id", &self.req.id)
            .finish()
    }
}

/// Where a blocking streaming handler (run on a handler thread) sends its rows; like
/// [`RowSink`], but `send` blocks the thread while the stream has no credit.
pub struct BlockingRowSink<Row> {
    pub(crate) req: Arc<RequestShared>,
    pub(crate) stream: Arc<RowBatcher>,
    pub(crate) _row: PhantomData<fn(Row)>,
}

impl<Row: Serialize> BlockingRowSink<Row> {
    /// Send one row (blocks only when the batch is full and the stream has no credit).
    #[inline]
    pub fn send(&self, row: Row) -> Result<(), StreamClosed> {
        self.send_ref(&row)
    }

    /// Send one row by reference.
    #[inline]
    pub fn send_ref(&self, row: &Row) -> Result<(), StreamClosed> {
        loop {
            match self.stream.push_row(&self.req, row)? {
                Pushed::Added => return Ok(()),
                Pushed::Flush => return self.stream.flush_blocking(&self.req, false),
                // Rare: a big row after smaller ones. It opens the next frame.
                Pushed::Full => self.stream.flush_blocking(&self.req, true)?,
            }
        }
    }

    /// Send every row of an iterator.
    pub fn send_all<I: IntoIterator<Item = Row>>(&self, rows: I) -> Result<(), StreamClosed> {
        rows.into_iter().try_for_each(|row| self.send_ref(&row))
    }

    /// Send the partial batch now (blocking for credit if needed).
    pub fn flush(&self) -> Result<(), StreamClosed> {
        self.stream.flush_blocking(&self.req, true)
    }
}

impl<Row> std::fmt::Debug for BlockingRowSink<Row> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingRowSink")
            .field("request_id", &self.req.id)
            .finish()
    }
}
