//! Row sinks: rows are serialised straight into the ROWS frame being built, frames go out when
//! full, on a short timer, and at the end, and only while the stream has credit.
//!
//! The frame being filled (with the stream's failure and closed flag: a [`Fill`]) lives in the
//! stream's locked state, except while the async handler is being polled: then the thread that
//! polls it ([`RowBatcher::poll_handler`]) takes it on its first row and fills it without a lock
//! or an atomic read-modify-write per row, and puts it back when the poll returns. The flush
//! timer, a blocking handler's sink and a sink used from another task or thread go through the
//! lock, and wait for a fill that another thread's poll holds.

use std::cell::{Cell, UnsafeCell};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
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
    /// The token ([`thread_token`]) of the thread inside `poll_handler`, 0 when none. Only that
    /// thread stores its token here, and it clears it before `poll_handler` returns (or unwinds).
    poller: AtomicUsize,
    /// The fill checked out to the thread in `poller`. Touched only by that thread, while it is
    /// in `poll_handler` and `busy` is false (see `with_fill`).
    local: UnsafeCell<Option<Fill>>,
    /// A row is being pushed into `local` (a `Serialize` that sends a row must not reach it).
    /// Touched only by the thread in `poller`.
    busy: Cell<bool>,
    /// Senders waiting for a fill that a poll holds (changed under the state lock).
    fill_waiters: AtomicUsize,
    /// Blocking sinks wait here for credit or cancellation.
    credit_cv: Condvar,
    /// Async sinks and the flush timer wait here for credit or cancellation.
    credit_notify: Notify,
    /// The batch went from empty to one row: start the flush timer.
    arm: Notify,
}

// SAFETY: `local` and `busy` are the only fields that are not `Sync`. They are touched only by
// the thread whose token is in `poller`, between its store of the token and its clear (both in
// `poll_handler`, on that thread); every other thread reads another token there and takes the
// locked path. The fill moves between threads only through the state's mutex (`check_in`, and
// the check-out in `with_fill`), which orders its accesses.
unsafe impl Sync for RowBatcher {}

/// The frame being filled and the stream's own ending.
struct Fill {
    /// The next ROWS frame, filled row by row on the handler's thread (serialised straight into
    /// it) and handed to the core whole (`Connection::send_rows`): no second pass over its rows.
    frame: RowsFrame,
    /// The stream broke (row too large, row not encodable): the request's terminal.
    failure: Option<StreamClosed>,
    /// The END went out (or is going): the timer stops.
    closed: bool,
}

struct StreamState {
    /// `None` while a poll of the handler holds it (`RowBatcher::local`).
    fill: Option<Fill>,
    /// Bumped on every credit grant, cancellation and check-in, so a blocking waiter never
    /// misses one.
    epoch: u64,
}

/// Why `with_fill` could not reach the fill.
enum Unavailable {
    /// Another thread's poll of the handler holds it; `fill_waiters` counts this caller.
    Elsewhere,
    /// A row is being serialised into it on this thread.
    Reentrant,
}

/// Where a row went.
enum Pushed {
    /// Into the frame, which can take more.
    Added,
    /// Into the frame, which reached the batch size: send it now.
    Flush,
    /// Not added: the frame is too full for it. Send the frame, then push the row again.
    Full,
    /// Not added: another thread's poll of the handler holds the frame. Wait for it
    /// (`fill_back`), then push the row again.
    Elsewhere,
}

enum Submit {
    Sent,
    NoCredit,
    Gone,
}

/// A token for the calling thread: the address of a thread-local (one `fs`-relative address,
/// no call), distinct for every live thread and never 0.
#[inline]
fn thread_token() -> usize {
    thread_local! {
        static TOKEN: u8 = const { 0 };
    }
    TOKEN.with(|t| t as *const u8 as usize)
}

/// Puts the fill back and clears `poller` when a poll returns or unwinds.
struct CheckIn<'a>(&'a RowBatcher);

impl Drop for CheckIn<'_> {
    fn drop(&mut self) {
        self.0.check_in();
    }
}

/// Clears `busy` when a push returns or unwinds.
struct NotBusy<'a>(&'a Cell<bool>);

impl Drop for NotBusy<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
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
            // `wirepool_proto::rows_batch_bytes`: below max_frame_size by the rule.
            batch_bytes,
            shared,
            state: Mutex::new(StreamState {
                fill: Some(Fill {
                    frame: RowsFrame::new(id, max_frame),
                    failure: None,
                    closed: false,
                }),
                epoch: 0,
            }),
            poller: AtomicUsize::new(0),
            local: UnsafeCell::new(None),
            busy: Cell::new(false),
            fill_waiters: AtomicUsize::new(0),
            credit_cv: Condvar::new(),
            credit_notify: Notify::new(),
            arm: Notify::new(),
        }
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock()
    }

    /// Polls the async handler's future: its rows go into a fill this thread holds for the
    /// length of the poll (no lock per row), put back for the timer and other senders after.
    pub(crate) fn poll_handler<F: Future>(
        &self,
        handler: Pin<&mut F>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<F::Output> {
        self.poller.store(thread_token(), Ordering::Relaxed);
        let _check_in = CheckIn(self);
        handler.poll(cx)
    }

    /// The end of a poll (on the polling thread): the fill goes back to the state.
    fn check_in(&self) {
        // SAFETY: this thread stored its token in `poller` (`poll_handler`) and has not cleared
        // it; no push is running on it (the poll returned or unwound through `NotBusy`).
        let fill = unsafe { (*self.local.get()).take() };
        self.poller.store(0, Ordering::Relaxed);
        if let Some(fill) = fill {
            let waiting = {
                let mut st = self.lock();
                st.fill = Some(fill);
                st.epoch += 1;
                self.fill_waiters.load(Ordering::Relaxed) > 0
            };
            if waiting {
                self.credit_cv.notify_all();
                self.credit_notify.notify_waiters();
            }
        }
    }

    /// Runs `f` on the fill: without a lock on the thread polling the handler (checking the
    /// fill out on its first use in the poll), under the lock elsewhere.
    #[inline]
    fn with_fill<R>(&self, f: impl FnOnce(&mut Fill) -> R) -> Result<R, Unavailable> {
        if self.poller.load(Ordering::Relaxed) == thread_token() {
            if self.busy.get() {
                return Err(Unavailable::Reentrant);
            }
            // SAFETY: this thread is the poller (only it stores its own token, and it clears it
            // before leaving `poll_handler`) and no push runs on it (`busy`): no other reference
            // to `local` exists until `busy` is cleared.
            let local = unsafe { &mut *self.local.get() };
            if local.is_none() {
                *local = self.lock().fill.take();
            }
            let Some(fill) = local.as_mut() else {
                // Only a poller checks the fill out, and a poll checks it back in.
                return Err(self.wait_for_fill());
            };
            self.busy.set(true);
            let _not_busy = NotBusy(&self.busy);
            return Ok(f(fill));
        }
        let mut st = self.lock();
        match st.fill.as_mut() {
            Some(fill) => Ok(f(fill)),
            None => {
                self.fill_waiters.fetch_add(1, Ordering::Relaxed);
                Err(Unavailable::Elsewhere)
            }
        }
    }

    #[cold]
    fn wait_for_fill(&self) -> Unavailable {
        let _st = self.lock();
        self.fill_waiters.fetch_add(1, Ordering::Relaxed);
        Unavailable::Elsewhere
    }

    /// Credit arrived or the request was cancelled: wake whoever waits.
    pub(crate) fn wake(&self) {
        self.lock().epoch += 1;
        self.credit_cv.notify_all();
        self.credit_notify.notify_waiters();
    }

    pub(crate) fn failure(&self) -> Option<StreamClosed> {
        match self.with_fill(|fill| fill.failure.clone()) {
            Ok(failure) => failure,
            Err(e) => {
                self.done_waiting(e);
                None
            }
        }
    }

    fn done_waiting(&self, e: Unavailable) {
        if let Unavailable::Elsewhere = e {
            self.fill_waiters.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Serialise one row into the frame being filled.
    #[inline]
    fn push_row<R: Serialize + ?Sized>(
        &self,
        req: &RequestShared,
        row: &R,
    ) -> Result<Pushed, StreamClosed> {
        match self.with_fill(|fill| self.push(fill, req, row)) {
            Ok(pushed) => pushed,
            Err(e) => self.unavailable(e),
        }
    }

    /// A row that cannot reach the fill now: another thread polls the handler (rare: the sink
    /// was moved to another task or thread), or a row's `Serialize` sends a row on its own
    /// stream.
    #[cold]
    fn unavailable(&self, e: Unavailable) -> Result<Pushed, StreamClosed> {
        match e {
            Unavailable::Elsewhere => {
                self.fill_waiters.fetch_sub(1, Ordering::Relaxed);
                Ok(Pushed::Elsewhere)
            }
            Unavailable::Reentrant => Err(StreamClosed {
                code: ErrorCode::HandlerError,
                message: "a row's Serialize sent a row on its own stream".into(),
            }),
        }
    }

    /// Waits until no other thread's poll holds the fill.
    async fn fill_back(&self) -> Result<(), StreamClosed> {
        loop {
            let notified = self.credit_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.with_fill(|_| ()) {
                Ok(()) => return Ok(()),
                Err(Unavailable::Elsewhere) => {}
                Err(e) => return self.unavailable(e).map(|_| ()),
            }
            notified.await;
            self.fill_waiters.fetch_sub(1, Ordering::Relaxed);
        }
    }

    #[inline]
    fn push<R: Serialize + ?Sized>(
        &self,
        fill: &mut Fill,
        req: &RequestShared,
        row: &R,
    ) -> Result<Pushed, StreamClosed> {
        if let Some(f) = &fill.failure {
            return Err(f.clone());
        }
        if let Some(e) = req.cancel_error() {
            return Err(StreamClosed {
                code: code_of(e.code()),
                message: e.message().to_owned(),
            });
        }
        if fill.closed {
            return Err(StreamClosed {
                code: ErrorCode::Protocol,
                message: "the stream already ended".into(),
            });
        }
        if fill.frame.is_empty() {
            fill.frame.reserve(self.batch_bytes + 256);
        }
        let codec = self.codec;
        // A panicking `Serialize` unwinds to the handler's own guard (HANDLER_PANIC), leaving
        // only a torn row behind, which the frame never counts; the lock does not poison.
        match fill.frame.append_with(|buf| codec.encode(row, buf)) {
            Ok(true) => {}
            Ok(false) => return Ok(Pushed::Full),
            Err(AppendError::Write(e)) => {
                return Err(fail(
                    fill,
                    ErrorCode::HandlerError,
                    format!("a row could not be encoded: {e}"),
                ))
            }
            Err(AppendError::Refused(e)) => return Err(fail(fill, e.code, e.message)),
        }
        if fill.frame.count() == 1 {
            self.arm.notify_one();
        }
        Ok(if fill.frame.payload_len() >= self.batch_bytes {
            Pushed::Flush
        } else {
            Pushed::Added
        })
    }

    fn needs_flush(&self, fill: &Fill, everything: bool) -> bool {
        !fill.frame.is_empty() && (everything || fill.frame.payload_len() >= self.batch_bytes)
    }

    /// Hand the frame to the core while it needs sending and the stream has credit.
    fn submit_all(&self, fill: &mut Fill, everything: bool) -> Submit {
        while self.needs_flush(fill, everything) {
            match self.try_submit(fill) {
                Submit::Sent => {}
                other => return other,
            }
        }
        Submit::Sent
    }

    /// Hand the frame to the core if the stream has credit; the core checks and charges it.
    fn try_submit(&self, fill: &mut Fill) -> Submit {
        if fill.frame.is_empty() {
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
        if state
            .conn
            .send_rows(&mut fill.frame, &mut state.out)
            .is_err()
        {
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
            let waited_for_fill = match self.with_fill(|fill| self.submit_all(fill, everything)) {
                Ok(Submit::Sent) => return Ok(()),
                Ok(Submit::Gone) => return Err(closed_error(req)),
                Ok(Submit::NoCredit) => false,
                Err(Unavailable::Elsewhere) => true,
                Err(e) => return self.unavailable(e).map(|_| ()),
            };
            if let Some(e) = req.cancel_error() {
                if waited_for_fill {
                    self.fill_waiters.fetch_sub(1, Ordering::Relaxed);
                }
                return Err(StreamClosed {
                    code: code_of(e.code()),
                    message: e.message().to_owned(),
                });
            }
            notified.await;
            if waited_for_fill {
                self.fill_waiters.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    fn flush_blocking(&self, req: &RequestShared, everything: bool) -> Result<(), StreamClosed> {
        let mut st = self.lock();
        loop {
            let waited_for_fill = match st.fill.as_mut().map(|f| self.submit_all(f, everything)) {
                Some(Submit::Sent) => return Ok(()),
                Some(Submit::Gone) => return Err(closed_error(req)),
                Some(Submit::NoCredit) => false,
                None => {
                    // An async poll holds the fill (a blocking sink used next to it).
                    self.fill_waiters.fetch_add(1, Ordering::Relaxed);
                    true
                }
            };
            if let Some(e) = req.cancel_error() {
                if waited_for_fill {
                    self.fill_waiters.fetch_sub(1, Ordering::Relaxed);
                }
                return Err(StreamClosed {
                    code: code_of(e.code()),
                    message: e.message().to_owned(),
                });
            }
            let epoch = st.epoch;
            while st.epoch == epoch {
                self.credit_cv.wait(&mut st);
            }
            if waited_for_fill {
                self.fill_waiters.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// A blocking sink's row (under the lock: the flush timer may take the frame at any time).
    fn push_row_blocking<R: Serialize + ?Sized>(
        &self,
        req: &RequestShared,
        row: &R,
    ) -> Result<Pushed, StreamClosed> {
        let mut st = self.lock();
        loop {
            if let Some(fill) = st.fill.as_mut() {
                return self.push(fill, req, row);
            }
            // An async poll holds the fill (a blocking sink used next to it): wait for it.
            self.fill_waiters.fetch_add(1, Ordering::Relaxed);
            let epoch = st.epoch;
            while st.epoch == epoch {
                self.credit_cv.wait(&mut st);
            }
            self.fill_waiters.fetch_sub(1, Ordering::Relaxed);
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
        // The handler returned: no poll holds the fill any more.
        if let Err(e) = self.with_fill(|fill| fill.closed = true) {
            self.done_waiting(e);
        }
        self.arm.notify_one();
    }

    fn is_closed(&self) -> bool {
        match self.with_fill(|fill| fill.closed) {
            Ok(closed) => closed,
            Err(e) => {
                self.done_waiting(e);
                false
            }
        }
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
            if self.is_closed() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = req.token.cancelled() => return,
            }
            if self.is_closed() || self.flush_async(&req, true).await.is_err() {
                return;
            }
        }
    }
}

fn fail(fill: &mut Fill, code: ErrorCode, message: String) -> StreamClosed {
    let closed = StreamClosed { code, message };
    fill.failure = Some(closed.clone());
    closed
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
    ///
    /// The row is serialised when the future is first polled, like an `async fn`'s body.
    #[inline]
    pub fn send(&self, row: Row) -> impl Future<Output = Result<(), StreamClosed>> + '_ {
        SendRow {
            sink: self,
            row,
            step: Step::Push,
            _row: PhantomData,
        }
    }

    /// Send one row by reference.
    #[inline]
    pub fn send_ref<'a>(
        &'a self,
        row: &'a Row,
    ) -> impl Future<Output = Result<(), StreamClosed>> + 'a {
        SendRow {
            sink: self,
            row,
            step: Step::Push,
            _row: PhantomData,
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

/// The future of [`RowSink::send`]: a row that fits the frame is pushed on the first poll with
/// nothing else to do (no `async fn` state machine: its setup and teardown cost more than the
/// push of a small row); a full frame is sent in a boxed flush, once per frame.
struct SendRow<'a, Row, B> {
    sink: &'a RowSink<Row>,
    row: B,
    step: Step<'a>,
    _row: PhantomData<fn(Row)>,
}

type Flush<'a> = Pin<Box<dyn Future<Output = Result<(), StreamClosed>> + Send + 'a>>;

enum Step<'a> {
    Push,
    /// Sending the frame (or waiting for it); then push the row again or end.
    Flush {
        flush: Flush<'a>,
        push_again: bool,
    },
    Done,
}

// The row is never pinned: `poll` only lends it out by reference.
impl<Row, B> Unpin for SendRow<'_, Row, B> {}

impl<'a, Row: Serialize, B: std::borrow::Borrow<Row>> Future for SendRow<'a, Row, B> {
    type Output = Result<(), StreamClosed>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.step {
                Step::Push => {
                    let sink: &'a RowSink<Row> = this.sink;
                    let (stream, req) = (&*sink.stream, &*sink.req);
                    let (flush, push_again): (Flush<'a>, bool) =
                        match stream.push_row(req, this.row.borrow()) {
                            Ok(Pushed::Added) => {
                                this.step = Step::Done;
                                return Poll::Ready(Ok(()));
                            }
                            Ok(Pushed::Flush) => (
                                Box::pin(async move {
                                    stream.flush_async(req, false).await?;
                                    // Let the writer put the frame on the socket (and the
                                    // reader see CANCEL/PING) before serialising the next batch
                                    // on this thread.
                                    tokio::task::yield_now().await;
                                    Ok(())
                                }),
                                false,
                            ),
                            // Rare: a big row after smaller ones. It opens the next frame.
                            Ok(Pushed::Full) => (Box::pin(stream.flush_async(req, true)), true),
                            Ok(Pushed::Elsewhere) => (Box::pin(stream.fill_back()), true),
                            Err(e) => {
                                this.step = Step::Done;
                                return Poll::Ready(Err(e));
                            }
                        };
                    this.step = Step::Flush { flush, push_again };
                }
                Step::Flush { flush, push_again } => {
                    let outcome = std::task::ready!(flush.as_mut().poll(cx));
                    let push_again = *push_again;
                    this.step = if outcome.is_ok() && push_again {
                        Step::Push
                    } else {
                        Step::Done
                    };
                    if !push_again || outcome.is_err() {
                        return Poll::Ready(outcome);
                    }
                }
                Step::Done => return Poll::Ready(Ok(())),
            }
        }
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
            match self.stream.push_row_blocking(&self.req, row)? {
                Pushed::Added => return Ok(()),
                Pushed::Flush => return self.stream.flush_blocking(&self.req, false),
                // Rare: a big row after smaller ones. It opens the next frame.
                Pushed::Full => self.stream.flush_blocking(&self.req, true)?,
                Pushed::Elsewhere => unreachable!("push_row_blocking waits for the fill"),
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
