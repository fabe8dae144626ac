//! State shared by the I/O loop, handler threads and row sinks, behind one short lock.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Notify;
use wirepool_codec::Codec;
use wirepool_proto::{Connection, ErrorCode};

use crate::error::HandlerError;
use crate::sink::RowBatcher;
use wirepool_io::outbox::Outbox;
#[cfg(target_os = "linux")]
use wirepool_io::shm::Regions;

/// Minimum spacing of EVENT frames per request (PROTOCOL.md 2: events are not flow controlled,
/// so SDKs coalesce them).
pub(crate) const EVENT_SPACING: Duration = Duration::from_millis(10);

// Maps keyed by request id: ids are accepted only when increasing and bounded in number by
// `max_in_flight`, so the core's cheap multiplicative hash is enough (SipHash was visible in
// the profile of small unary calls).
pub(crate) use wirepool_proto::IdMap;

pub(crate) struct Shared {
    state: Mutex<WorkerState>,
    /// Something was queued in the outbox.
    pub(crate) wake_writer: Notify,
    /// The writer took everything queued (reader back-pressure).
    pub(crate) out_drained: Notify,
    /// A request ended (drain waits for the last one); signalled only while draining.
    pub(crate) request_ended: Notify,
    pub(crate) draining: AtomicBool,
    /// Woken when a result goes through a region, and when this state goes: the task retiring
    /// idle regions sleeps on it instead of a timer while there are none (an armed timer costs
    /// every park of the runtime, i.e. every small call).
    #[cfg(target_os = "linux")]
    pub(crate) region_placed: Arc<Notify>,
}

#[cfg(target_os = "linux")]
impl Drop for Shared {
    fn drop(&mut self) {
        self.region_placed.notify_one();
    }
}

pub(crate) struct WorkerState {
    pub(crate) conn: Connection,
    pub(crate) out: Outbox,
    pub(crate) requests: IdMap<Arc<RequestShared>>,
    pub(crate) streams: IdMap<Arc<RowBatcher>>,
    /// GOODBYE or a fatal ERROR went out: nothing more may be sent.
    pub(crate) closed: bool,
    /// The writer task holds bytes it has not finished writing: nobody else may write now.
    pub(crate) writer_busy: bool,
    /// The I/O loop is handling a read's frames and flushes the outbox when done: frames queued
    /// meanwhile need not wake the writer task (see [`WorkerState::writer_needs_wake`]).
    pub(crate) reader_flushes: bool,
    /// Results and summaries at least this large go through the shared-memory lane when the
    /// parent accepted it (`usize::MAX`: never).
    pub(crate) shm_threshold: usize,
    /// This worker's regions on the lane.
    #[cfg(target_os = "linux")]
    pub(crate) regions: Regions,
}

impl WorkerState {
    /// Whether a frame about to be queued must wake the writer task: only the first one after
    /// the writer took the outbox, and none while the I/O loop will flush it anyway.
    pub(crate) fn writer_needs_wake(&self) -> bool {
        self.out.is_empty() && !self.reader_flushes
    }
}

impl Shared {
    pub(crate) fn new() -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(WorkerState {
                conn: Connection::new_worker(),
                out: Outbox::default(),
                requests: IdMap::default(),
                streams: IdMap::default(),
                closed: false,
                writer_busy: false,
                reader_flushes: false,
                shm_threshold: usize::MAX,
                #[cfg(target_os = "linux")]
                regions: Regions::default(),
            }),
            wake_writer: Notify::new(),
            out_drained: Notify::new(),
            request_ended: Notify::new(),
            draining: AtomicBool::new(false),
            #[cfg(target_os = "linux")]
            region_placed: Arc::new(Notify::new()),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, WorkerState> {
        // A panic while holding the lock can only come from this crate's own code (handlers never
        // run under it); the state is still consistent frame-wise, so keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// End request `req` with `terminal`, exactly once: later calls for the same request are
    /// ignored (a handler finishing after its cancellation was already answered).
    pub(crate) fn finish(&self, req: &RequestShared, terminal: Terminal) {
        let mut guard = self.lock();
        let state = &mut *guard;
        // An inline request is not in the map (it starts and ends within one dispatch, so
        // nothing can cancel or end it meanwhile) and has exactly one caller of `finish`.
        if !req.inline && state.requests.remove(&req.id).is_none() {
            return;
        }
        if req.stream.is_some() {
            state.streams.remove(&req.id);
        }
        if state.closed {
            return;
        }
        let wake = state.writer_needs_wake();
        if let Some((topic, data)) = req.take_pending_event() {
            let _ = state
                .conn
                .send_event(req.id, &topic, &data, state.out.tail());
        }
        let sent = match &terminal {
            #[cfg(target_os = "linux")]
            Terminal::Result(body) | Terminal::End { summary: body }
                if body.len() >= state.shm_threshold && state.conn.shm().is_some() =>
            {
                self.region_placed.notify_one();
                send_through_region(state, req.id, &terminal, body)
            }
            Terminal::Result(body) => {
                state
                    .conn
                    .send_result(req.id, body, &mut state.out.message_writer(body))
            }
            Terminal::End { summary } => {
                state
                    .conn
                    .send_end(req.id, summary, &mut state.out.message_writer(summary))
            }
            Terminal::Error(e) => send_error(state, req.id, e),
        };
        if let Err(e) = sent {
            // A result or summary the parent's limits refuse (above max_message_size): the
            // request still needs its one terminal.
            let e = HandlerError::new(format!("the handler's value could not be sent: {e}"));
            let _ = send_error(state, req.id, &e);
        }
        // A result that was the request's own body (an echo) held the parent's range until
        // now: its release goes in the same write, so the parent has the region back before
        // its caller sends again.
        drop(terminal);
        if state.conn.has_shm_releases() {
            state.conn.send_shm_releases(&mut state.out);
        }
        drop(guard);
        // The writer empties the outbox each time it wakes, so only the first frame queued
        // after that needs to wake it: one wake-up per write, not one per result.
        if wake {
            self.wake_writer.notify_one();
        }
        if self.draining.load(Ordering::Acquire) {
            self.request_ended.notify_waiters();
        }
        // Release the request's helper tasks (deadline timer, flush timer) now rather than when
        // the deadline would have passed. The handler is done, so the flag is no longer read.
        if req.deadline.is_some() || req.stream.is_some() {
            req.token.cancel();
        }
    }
}

/// A result or summary through the shared-memory lane: lent where it is when it was built in a
/// [`BodyBuf`](crate::BodyBuf), else copied into a free region; then the first frame and its
/// SHM_BODY, the region held until the parent releases the range; over the socket when no
/// region can take it (window full).
#[cfg(target_os = "linux")]
fn send_through_region(
    state: &mut WorkerState,
    id: u64,
    terminal: &Terminal,
    body: &Bytes,
) -> Result<(), wirepool_proto::ProtocolError> {
    let placed = state.regions.place(&mut state.conn, body, &mut state.out);
    match (placed, terminal) {
        (Some(p), Terminal::End { .. }) => {
            state.conn.send_end_shm(id, p.range, &mut state.out)?;
            let _ = state.conn.shm_hold(p.range, p.keep);
            Ok(())
        }
        (Some(p), _) => {
            state.conn.send_result_shm(id, p.range, &mut state.out)?;
            let _ = state.conn.shm_hold(p.range, p.keep);
            Ok(())
        }
        (None, Terminal::End { .. }) => {
            state
                .conn
                .send_end(id, body, &mut state.out.message_writer(body))
        }
        (None, _) => state
            .conn
            .send_result(id, body, &mut state.out.message_writer(body)),
    }
}

/// Send an ERROR for request `id`. ERROR cannot continue: the core fits the message and the
/// details to one frame (`wirepool_proto::fit_error`, PROTOCOL.md 14.5: too large details
/// become a note of their size, never dropped silently).
pub(crate) fn send_error(
    state: &mut WorkerState,
    id: u64,
    e: &HandlerError,
) -> Result<(), wirepool_proto::ProtocolError> {
    state
        .conn
        .send_error(id, e.code(), e.message(), e.details(), state.out.tail())
}

pub(crate) enum Terminal {
    Result(Bytes),
    /// The row count is the core's own.
    End {
        summary: Bytes,
    },
    Error(HandlerError),
}

const NOT_CANCELLED: u8 = 0;
const BY_PARENT: u8 = 1;
const BY_DEADLINE: u8 = 2;

/// A request's cancellation flag: an atomic for the blocking check, a `Notify` for async
/// waiters. Lighter than `tokio_util`'s `CancellationToken` (no tree node to allocate and lock),
/// which measured about 6% of a small unary call.
#[derive(Default)]
pub(crate) struct CancelFlag {
    set: AtomicBool,
    waiters: Notify,
}

impl CancelFlag {
    pub(crate) fn cancel(&self) {
        if !self.set.swap(true, Ordering::AcqRel) {
            self.waiters.notify_waiters();
        }
    }

    #[inline]
    pub(crate) fn is_cancelled(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Completes once the flag is set.
    pub(crate) async fn cancelled(&self) {
        loop {
            let notified = self.waiters.notified();
            tokio::pin!(notified);
            // Registered before the check, so a `cancel` in between is not missed.
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

/// Why a request was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CancelReason {
    /// CANCEL from the parent, or a drain whose grace ran out.
    Parent,
    /// `timeout_us` ran out.
    Deadline,
}

/// One request in flight, shared by its handler's [`Context`](crate::Context), its sink and the
/// I/O loop.
pub(crate) struct RequestShared {
    pub(crate) id: u64,
    pub(crate) codec: Codec,
    pub(crate) deadline: Option<Instant>,
    pub(crate) token: CancelFlag,
    reason: AtomicU8,
    pub(crate) shared: Arc<Shared>,
    events: Mutex<EventGate>,
    pub(crate) stream: Option<Arc<RowBatcher>>,
    /// Run by an inline handler: not in `WorkerState::requests`, no deadline timer.
    pub(crate) inline: bool,
}

#[derive(Default)]
struct EventGate {
    last_sent: Option<Instant>,
    pending: Option<(String, String)>,
}

impl RequestShared {
    pub(crate) fn new(
        id: u64,
        codec: Codec,
        deadline: Option<Instant>,
        shared: Arc<Shared>,
        stream: Option<Arc<RowBatcher>>,
        inline: bool,
    ) -> RequestShared {
        RequestShared {
            id,
            codec,
            deadline,
            token: CancelFlag::default(),
            reason: AtomicU8::new(NOT_CANCELLED),
            shared,
            events: Mutex::new(EventGate::default()),
            stream,
            inline,
        }
    }

    /// Make an ended inline request's state the fresh state of the next inline request, so
    /// small inline calls allocate nothing here.
    pub(crate) fn reuse(&mut self, id: u64, codec: Codec, deadline: Option<Instant>) {
        debug_assert!(self.inline && self.stream.is_none());
        self.id = id;
        self.codec = codec;
        self.deadline = deadline;
        *self.token.set.get_mut() = false;
        *self.reason.get_mut() = NOT_CANCELLED;
        *self.events.get_mut().unwrap_or_else(|p| p.into_inner()) = EventGate::default();
    }

    /// Set the cancellation flag (first reason wins) and wake a sink waiting for credit.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        let code = match reason {
            CancelReason::Parent => BY_PARENT,
            CancelReason::Deadline => BY_DEADLINE,
        };
        let _ =
            self.reason
                .compare_exchange(NOT_CANCELLED, code, Ordering::AcqRel, Ordering::Acquire);
        self.token.cancel();
        if let Some(stream) = &self.stream {
            stream.wake();
        }
    }

    /// The terminal error a cancelled request ends with, or `None` if it was not cancelled.
    #[inline]
    pub(crate) fn cancel_error(&self) -> Option<HandlerError> {
        match self.reason.load(Ordering::Acquire) {
            BY_PARENT => Some(HandlerError::protocol(
                ErrorCode::Cancelled,
                "cancelled by the parent",
            )),
            BY_DEADLINE => Some(HandlerError::protocol(
                ErrorCode::DeadlineExceeded,
                "the request's time budget ran out",
            )),
            _ => None,
        }
    }

    /// Send a progress event now, or keep it (replacing an older one) until the spacing allows.
    pub(crate) fn event(&self, topic: &str, data: String) {
        if topic.is_empty() || topic.len() > 255 {
            return;
        }
        let now = Instant::now();
        let send = {
            let mut gate = self.events.lock().unwrap_or_else(|p| p.into_inner());
            if gate
                .last_sent
                .is_some_and(|t| now.duration_since(t) < EVENT_SPACING)
            {
                gate.pending = Some((topic.to_owned(), data));
                None
            } else {
                gate.last_sent = Some(now);
                gate.pending = None;
                Some((topic.to_owned(), data))
            }
        };
        if let Some((topic, data)) = send {
            let mut guard = self.shared.lock();
            let state = &mut *guard;
            if state.closed
                || state
                    .conn
                    .send_event(self.id, &topic, &data, state.out.tail())
                    .is_err()
            {
                return;
            }
            drop(guard);
            self.shared.wake_writer.notify_one();
        }
    }

    fn take_pending_event(&self) -> Option<(String, String)> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .take()
    }
}
