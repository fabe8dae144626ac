//! One worker incarnation: start-up and handshake, the reader and writer tasks, and the
//! lifecycle task that owns the process (heartbeats, deadlines, cancel grace, recycling, exit).

use crate::lock::Locked;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use wirepool_codec::Codec;

use wirepool_proto::{
    check_methods, negotiate, Connection, ErrorClass, ErrorCode, Event, Hello, MethodKind,
    MethodRequirement, Offer, ProtocolError, Welcome,
};

use crate::config::PoolConfig;
use crate::error::{Error, ExitCause, ExitInfo, Result};
use crate::events::EventSender;
use crate::liveness::{Liveness, Seen};
use crate::metrics::{LatencyHistogram, SlotCounters, WorkerState};
use crate::pending::Pending;
use crate::remote::Transport;
use crate::spawn::{self, Process, StderrTail};
use crate::stream::RowQueue;
use wirepool_io::outbox::{Outbox, WriteQueue};

/// What the pool shares with every worker incarnation.
pub(crate) struct PoolShared {
    pub cfg: PoolConfig,
    /// Woken when a worker gains free capacity, becomes ready, or the pool closes.
    pub capacity: Notify,
    /// Callers in `acquire` waiting for a free slot: slots freed with nobody waiting wake nobody.
    pub slot_waiters: std::sync::atomic::AtomicUsize,
    /// Woken when a worker's state changes (ready, leased, draining, gone) or the pool closes;
    /// leases and `wait_ready` wait here, so they never take a freed slot's wake-up.
    pub state_changed: Notify,
    pub epoch: Instant,
    /// Method names the pool can call, and their latency histograms, indexed by method number.
    pub methods: OnceLock<MethodTable>,
    /// Where remote workers join (PROTOCOL.md 21), when a slot has a remote launcher.
    #[cfg(feature = "remote")]
    pub listener: Option<crate::remote::Listener>,
    /// Calls and streams that ended in an error, by code (off the hot path: errors only).
    pub errors: Mutex<std::collections::BTreeMap<u32, u64>>,
}

pub(crate) struct MethodTable {
    pub by_name: HashMap<String, usize, wirepool_proto::IdBuildHasher>,
    pub names: Vec<String>,
    pub latency: Vec<LatencyHistogram>,
    /// The first HELLO's method list, as `Pool::methods` returns it.
    pub offered: Vec<crate::config::OfferedMethod>,
}

impl PoolShared {
    /// Wakes everyone waiting for capacity or a state change.
    pub fn notify_state_changed(&self) {
        self.capacity.notify_waiters();
        self.state_changed.notify_waiters();
    }

    pub fn record_latency(&self, method_no: usize, d: Duration) {
        if let Some(h) = self.methods.get().and_then(|t| t.latency.get(method_no)) {
            h.record(d);
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Counts a call or stream that ended with `e` (`wirepool_errors_total`).
    pub fn count_error(&self, e: &Error) {
        *self.errors.locked().entry(e.code()).or_default() += 1;
    }
}

/// How one of a worker's methods is called on the wire.
#[derive(Clone, Debug)]
pub(crate) struct WireMethod {
    pub index: u16,
    pub kind: MethodKind,
}

const STATE_READY: u8 = 0;
const STATE_LEASED: u8 = 1;
const STATE_DRAINING: u8 = 2;
const STATE_DEAD: u8 = 3;

/// How long a worker that said GOODBYE, or closed its connection, has to exit before it is
/// killed (PROTOCOL.md 8.4: "a short grace, SDK default 1 s").
const EXIT_GRACE: Duration = Duration::from_secs(1);

enum Sink {
    /// A unary caller's completion cell: the reader fills it and wakes the caller, which takes
    /// the outcome out of the route (no channel, no allocation per call).
    Unary(UnaryCell),
    Stream(Arc<RowQueue>),
}

enum UnaryCell {
    Waiting(Option<Waker>),
    Done(Result<Bytes>),
}

struct Route {
    /// `None` once nobody waits for an outcome (cancelled, stream finished, or the caller took
    /// its outcome early at the deadline) and only the terminal is awaited.
    sink: Option<Sink>,
    /// The worker has not sent the terminal yet: the request holds one in-flight slot.
    on_wire: bool,
    /// When CANCEL was sent; the worker must end the request within the cancel grace.
    cancelled_at: Option<Instant>,
    /// Parent-side deadline: the request's timeout plus a grace.
    deadline: Option<(Instant, Duration)>,
    /// The method's number in the pool's table, for its latency histogram.
    method_no: u32,
    /// When the request left: read in `submit` when the worker was idle (the latency-critical
    /// case), else when the writer task took it (one clock read per batch of requests).
    started: Option<Instant>,
    /// The call's own mailbox for progress events (else the pool's).
    events: Option<EventSender>,
}

impl Route {
    /// Hands the request's outcome to whoever waits; a unary caller's waker goes to `wakers`
    /// (woken once the driver lock is released). The first outcome wins.
    ///
    /// A unary call's latency is recorded here, ending at `at`; a stream records its own when
    /// its consumer reaches the end.
    fn deliver(
        &mut self,
        outcome: Result<Bytes>,
        wakers: &mut Vec<Waker>,
        at: &mut ReadClock,
        pool: &PoolShared,
    ) {
        match self.sink.take() {
            Some(Sink::Unary(UnaryCell::Waiting(w))) => {
                wakers.extend(w);
                self.sink = Some(Sink::Unary(UnaryCell::Done(outcome)));
                if let Some(started) = self.started {
                    pool.record_latency(
                        self.method_no as usize,
                        at.now().saturating_duration_since(started),
                    );
                }
            }
            done @ Some(Sink::Unary(UnaryCell::Done(_))) => self.sink = done,
            Some(Sink::Stream(s)) => {
                if let Err(e) = &outcome {
                    pool.count_error(e);
                }
                s.finish(outcome)
            }
            None => {}
        }
    }

    /// The route may leave the table: its terminal arrived and nobody has an outcome to take.
    fn finished(&self) -> bool {
        !self.on_wire && self.sink.is_none()
    }
}

type RouteMap = Pending<Route>;

/// The time of one read, taken from the clock only when something needs it (a unary call's
/// latency): a read of rows, events or PONGs reads no clock.
struct ReadClock(Option<Instant>);

impl ReadClock {
    fn unread() -> ReadClock {
        ReadClock(None)
    }

    fn at(now: Instant) -> ReadClock {
        ReadClock(Some(now))
    }

    fn now(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

struct DriverState {
    conn: Connection,
    /// Encoded frames waiting for the writer task, which takes them all at once.
    out: Outbox,
    routes: RouteMap,
    /// Set when the connection is gone: new requests fail with this.
    closed: Option<Error>,
    /// The writer task holds bytes it has not finished writing: nobody else may write now.
    writer_busy: bool,
    /// A caller woke the writer since it last took the output: later callers need not.
    writer_woken: bool,
    /// Requests sent without a start time: the writer stamps them when it takes the output.
    unstamped: Vec<u64>,
    /// The socket's sending half for the direct-write fast path; dropped when the worker is
    /// gone, so a `Worker` kept alive by a caller's handle does not keep the descriptor open.
    socket_out: Option<Arc<Transport>>,
    /// A unary caller (its request id) reads the socket itself instead of the reader task: set
    /// in `submit` when its request is the only one in flight, so its task is woken by the
    /// socket and handles the answer in its own poll (no reader-task hop, no extra driver
    /// poll per call). Handed back when the call ends or is dropped, or by the lifecycle task
    /// if the caller is not polled for a housekeeping interval.
    direct_reader: Option<u64>,
    /// The direct reader held the socket at the last housekeeping tick (revoked at the next).
    direct_reader_seen: Option<u64>,
    /// The reader task's waker, for the hand-back.
    reader_waker: Option<Waker>,
    /// A direct reader met the end of the connection (a protocol violation): the reader task
    /// reports it.
    reader_end: Option<ReaderEnd>,
    /// Bytes read from this worker: with the decoder's incomplete frame, the frame clock's
    /// measure of progress (see `liveness`).
    bytes_in: u64,
    /// The shared-memory lane, when the WELCOME accepted it.
    #[cfg(target_os = "linux")]
    shm: Option<ParentLane>,
}

/// The parent's side of the shared-memory lane of one worker (PROTOCOL.md 20.7).
#[cfg(target_os = "linux")]
struct ParentLane {
    /// Request bodies at least this large go through a region.
    threshold: usize,
    /// This side's regions.
    regions: wirepool_io::shm::Regions,
    /// Descriptors received, oldest first, until a SHM_REGION takes one (the core's mapper).
    fds: FdQueue,
}

#[cfg(target_os = "linux")]
type FdQueue = wirepool_io::shm::DescriptorQueue;

impl DriverState {
    /// Reads once into the core's buffer: with `recvmsg` when the lane is on, its descriptors
    /// reported to the core and queued for the mapper.
    fn poll_read(
        &mut self,
        sock: &Transport,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<usize>> {
        #[cfg(target_os = "linux")]
        if let Some(lane) = &self.shm {
            let mut fds = Vec::new();
            let read = sock.poll_read_buf_fds(cx, self.conn.read_buffer(), &mut fds);
            if !fds.is_empty() {
                self.conn.shm_descriptors_received(fds.len());
                lane.fds.locked().extend(fds);
            }
            if let Poll::Ready(Err(e)) = &read {
                // More than 8 descriptors in one read (MSG_CTRUNC): a protocol violation, not
                // an end of file; the reader task reports it.
                if let Some(violation) = wirepool_io::shm::protocol_error(e) {
                    let _ = self.conn.send_fatal(violation, &mut self.out);
                    self.reader_end = Some(ReaderEnd::Protocol {
                        code: violation.code.code(),
                        message: violation.message.clone(),
                    });
                }
            }
            return read;
        }
        sock.poll_read_buf(cx, self.conn.read_buffer())
    }
}

impl DriverState {
    /// The socket goes back to the reader task: its waker is registered for read readiness, or
    /// woken at once if input (or the end of the connection) already waits.
    fn hand_back_reading(&mut self) {
        self.direct_reader = None;
        self.direct_reader_seen = None;
        let Some(w) = self.reader_waker.as_ref() else {
            // The reader task has not run yet; it reads when it does.
            return;
        };
        let ready = self.reader_end.is_some()
            || match &self.socket_out {
                Some(sock) => sock.poll_readable(&mut Context::from_waker(w)).is_ready(),
                None => true,
            };
        if ready {
            w.wake_by_ref();
        }
    }
}

/// Orders for the lifecycle task.
enum Control {
    Kill(ExitCause),
}

/// One running worker process and its connection.
pub(crate) struct Worker {
    pub id: u32,
    pub slot: usize,
    /// The worker's process id: a remote worker's on its own machine (from its HELLO).
    pub pid: u32,
    /// A process of this machine the pool signals and reads the RSS of (the local child, or a
    /// remote worker's child); 0 when none.
    pub local_pid: u32,
    /// Where a remote worker runs (the peer address); `None` for a local worker.
    pub host: Option<Arc<str>>,
    pub wire: Vec<Option<WireMethod>>,
    pub counters: Arc<SlotCounters>,
    pool: Arc<PoolShared>,
    state: AtomicU8,
    in_flight: AtomicU32,
    max_in_flight: u32,
    driver: Mutex<DriverState>,
    writer_wake: Notify,
    control: mpsc::Sender<Control>,
    /// The highest PING nonce sent; a PONG above it answers nothing (PROTOCOL.md 8.5).
    last_ping: AtomicU64,
    /// The highest nonce a PONG answered (it answers every earlier PING too).
    last_pong: AtomicU64,
    /// When the PING `last_ping` left, in ns since the pool's epoch.
    ping_sent_ns: AtomicU64,
    /// Round trip of the last PING answered by its own PONG, in ns (0: none yet).
    heartbeat_rtt_ns: AtomicU64,
    last_request_ms: AtomicU64,
    requests: AtomicU64,
    /// GOODBYE reason + 1, or 0 before any GOODBYE.
    goodbye: AtomicU32,
    retire: Mutex<Option<oneshot::Sender<ExitCause>>>,
    drain_deadline: Mutex<Option<Instant>>,
    exit: OnceLock<Arc<ExitInfo>>,
    stderr_tail: Arc<StderrTail>,
}

/// Who waits for a request's outcome.
pub(crate) enum Awaiting {
    /// A unary caller, woken through this waker once the outcome is in the route.
    Unary(Waker),
    Stream(Arc<RowQueue>),
}

/// Why a request was not sent.
pub(crate) enum NotSent {
    /// The worker is draining or gone: the request never left, another worker may take it.
    WorkerGone(Error),
    /// The request itself is wrong (unknown method, too large, ...): no retry helps.
    Final(Error),
}

/// A request accepted by a worker: its id and what the caller needs to follow it.
pub(crate) struct WorkerRequest {
    pub worker: Arc<Worker>,
    pub id: u64,
    pub method_no: usize,
    /// When the request was sent; `None` when the writer task stamps it later (unary calls
    /// submitted while others are in flight, see `Route::started`).
    pub started: Option<Instant>,
}

/// Handles the slot loop keeps on an incarnation.
pub(crate) struct Incarnation {
    pub worker: Arc<Worker>,
    pub lifecycle: JoinHandle<Arc<ExitInfo>>,
    pub retiring: oneshot::Receiver<ExitCause>,
}

impl Worker {
    pub fn state(&self) -> WorkerState {
        match self.state.load(Acquire) {
            STATE_READY => WorkerState::Ready,
            STATE_LEASED => WorkerState::Leased,
            STATE_DRAINING => WorkerState::Draining,
            _ => WorkerState::Dead,
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Relaxed)
    }

    /// Round trip of the last heartbeat PING its own PONG answered (`None` before the first).
    pub fn heartbeat_rtt(&self) -> Option<Duration> {
        match self.heartbeat_rtt_ns.load(Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    pub fn exit_info(&self) -> Option<Arc<ExitInfo>> {
        self.exit.get().cloned()
    }

    /// Reserves one in-flight slot if the worker takes general traffic (`leased == false`) or
    /// is held by a lease (`leased == true`).
    pub fn try_reserve(&self, leased: bool) -> bool {
        let want = if leased { STATE_LEASED } else { STATE_READY };
        if self.state.load(Acquire) != want {
            return false;
        }
        let mut cur = self.in_flight.load(SeqCst);
        loop {
            if cur >= self.max_in_flight {
                return false;
            }
            match self
                .in_flight
                .compare_exchange_weak(cur, cur + 1, AcqRel, Relaxed)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    fn release_slot(&self) {
        self.release_slots(1);
    }

    /// Frees `n` in-flight slots (a read's worth of terminals at once) and wakes as many
    /// callers waiting for one, if any wait: the common case costs no wake-up at all.
    fn release_slots(&self, n: u32) {
        if n == 0 {
            return;
        }
        // SeqCst pairs with `PoolInner::acquire`, which counts itself in `slot_waiters` before
        // it looks at `in_flight` again: either it sees these slots free, or we see it waiting.
        self.in_flight.fetch_sub(n, SeqCst);
        if self.pool.slot_waiters.load(SeqCst) > 0 {
            for _ in 0..n {
                self.pool.capacity.notify_one();
            }
        }
    }

    /// Ready -> Leased. The caller then owns the worker until [`end_lease`](Self::end_lease).
    pub fn try_lease(&self) -> bool {
        self.state
            .compare_exchange(STATE_READY, STATE_LEASED, AcqRel, Relaxed)
            .is_ok()
    }

    pub fn end_lease(&self) {
        if self
            .state
            .compare_exchange(STATE_LEASED, STATE_READY, AcqRel, Relaxed)
            .is_ok()
        {
            self.pool.notify_state_changed();
            self.check_request_quota();
        }
    }

    /// Sends a request on a reserved slot. The reservation is consumed (released when the
    /// request ends, or now on error). A unary caller then follows it with
    /// [`poll_unary`](Self::poll_unary), a stream through `RowQueue`.
    pub fn submit(
        self: &Arc<Self>,
        method_no: usize,
        codec: Codec,
        timeout: Option<Duration>,
        body: &Bytes,
        awaiting: Awaiting,
        events: Option<&EventSender>,
    ) -> Result<WorkerRequest, NotSent> {
        let wire = match self.wire_method(method_no, &awaiting) {
            Ok(wire) => wire,
            Err(e) => return Err(self.not_sent(e)),
        };
        let stream = matches!(awaiting, Awaiting::Stream(_));
        let (id, started) =
            match self.queue_request(wire, method_no, codec, timeout, body, awaiting, events) {
                Ok(sent) => sent,
                Err(e) => return Err(self.not_sent(e)),
            };
        self.counters.requests.fetch_add(1, Relaxed);
        if stream {
            self.counters.streams.fetch_add(1, Relaxed);
        }
        if let Some(now) = started {
            self.last_request_ms.store(
                now.saturating_duration_since(self.pool.epoch).as_millis() as u64,
                Relaxed,
            );
        }
        self.requests.fetch_add(1, Relaxed);
        self.check_request_quota();
        Ok(WorkerRequest {
            worker: self.clone(),
            id,
            method_no,
            started,
        })
    }

    /// A request refused before it left gives its reserved slot back.
    #[cold]
    fn not_sent(&self, e: NotSent) -> NotSent {
        self.release_slot();
        e
    }

    /// How method `method_no` is called on this worker; an unknown method, or one called as
    /// the wrong kind (unary vs stream), is the caller's error.
    fn wire_method(&self, method_no: usize, awaiting: &Awaiting) -> Result<&WireMethod, NotSent> {
        let name = || {
            self.pool
                .methods
                .get()
                .and_then(|t| t.names.get(method_no))
                .cloned()
                .unwrap_or_default()
        };
        let Some(Some(wire)) = self.wire.get(method_no) else {
            return Err(NotSent::Final(Error::UnknownMethod(name())));
        };
        let want_kind = match awaiting {
            Awaiting::Stream(_) => MethodKind::Stream,
            Awaiting::Unary(_) => MethodKind::Unary,
        };
        if wire.kind != want_kind {
            return Err(NotSent::Final(Error::UnknownMethod(format!(
                "{} (is {:?}, called as {:?})",
                crate::error::cut(&name()),
                wire.kind,
                want_kind
            ))));
        }
        Ok(wire)
    }

    /// Encodes the request into the driver's output under its lock and adds its route; returns
    /// its id and, when the clock was read, its start time. The request leaves by the writer
    /// task, or at once when it is the only one (see `write_alone`).
    #[allow(clippy::too_many_arguments)]
    fn queue_request(
        &self,
        wire: &WireMethod,
        method_no: usize,
        codec: Codec,
        timeout: Option<Duration>,
        body: &Bytes,
        awaiting: Awaiting,
        events: Option<&EventSender>,
    ) -> Result<(u64, Option<Instant>), NotSent> {
        let timeout_us = timeout
            .map(|t| t.as_micros().clamp(1, u64::MAX as u128) as u64)
            .unwrap_or(0);
        // in_flight was incremented by try_reserve: 1 means no other request is on this worker.
        let alone = self.in_flight.load(Relaxed) <= 1;
        // A clock read per call showed in the profile of small calls; under load the writer
        // stamps a whole batch with one read instead.
        let clocked = alone || timeout.is_some() || matches!(awaiting, Awaiting::Stream(_));
        let now = clocked.then(Instant::now);
        let direct_waker = match &awaiting {
            Awaiting::Unary(w) if alone => Some(w.clone()),
            _ => None,
        };
        let deadline = match timeout.zip(now) {
            None => None,
            Some((t, now)) => Some((self.deadline_of(now, t)?, t)),
        };
        let sink = match awaiting {
            Awaiting::Stream(s) => Sink::Stream(s),
            Awaiting::Unary(w) => Sink::Unary(UnaryCell::Waiting(Some(w))),
        };
        let (id, wake_writer) = {
            let mut driver = self.driver.locked();
            let c = &mut *driver;
            if let Some(e) = &c.closed {
                return Err(NotSent::WorkerGone(e.clone()));
            }
            let id =
                send_request(c, wire.index, codec.id(), timeout_us, body).map_err(|e| {
                    match e.code {
                        ErrorCode::Draining => NotSent::WorkerGone(refusal(e, self.id)),
                        _ => NotSent::Final(refusal(e, self.id)),
                    }
                })?;
            c.routes.insert(
                id,
                Route {
                    sink: Some(sink),
                    on_wire: true,
                    cancelled_at: None,
                    deadline,
                    method_no: method_no as u32,
                    started: now,
                    events: events.cloned(),
                },
            );
            if now.is_none() {
                c.unstamped.push(id);
            }
            if alone {
                self.write_alone(c);
            }
            if let Some(w) = &direct_waker {
                read_own_answer(c, id, w);
            }
            // One wake-up per batch: the writer takes everything queued when it runs.
            let wake = !c.out.is_empty() && !c.writer_woken;
            c.writer_woken |= wake;
            (id, wake)
        };
        if wake_writer {
            self.writer_wake.notify_one();
        }
        Ok((id, now))
    }

    /// When the parent gives up on a request sent at `now` with timeout `t`: checked, before
    /// any lock is taken (PROTOCOL.md 22.1; the call checked `t` against `max_timeout_ms`).
    fn deadline_of(&self, now: Instant, t: Duration) -> Result<Instant, NotSent> {
        now.checked_add(t)
            .and_then(|d| d.checked_add(self.pool.cfg.deadline_grace))
            .ok_or_else(|| {
                NotSent::Final(Error::InvalidArgument {
                    option: "timeout",
                    message: format!("{t:?} from now is beyond the clock"),
                })
            })
    }

    /// Latency fast path: when this is the only request and the writer is idle, write now
    /// instead of waking the writer task (a task switch, or a cross-thread wake-up). Under load
    /// requests keep queueing for the writer, so they still share a write. Only a request of
    /// small frames is written here; a large body queued by reference goes to the writer
    /// task's vectored writes.
    fn write_alone(&self, c: &mut DriverState) {
        // (writer_busy first: tail_only moves urgent frames into the tail, which must not
        // happen while the writer splices them into a long output.)
        if c.writer_busy {
            return;
        }
        if let (Some(tail), Some(sock)) = (c.out.tail_only(), &c.socket_out) {
            // WouldBlock (or a broken socket) leaves the bytes for the writer task.
            if let Ok(n) = sock.try_write(tail) {
                self.counters.bytes_out.fetch_add(n as u64, Relaxed);
                // All written (the usual case): keep the buffer from its start, unsplit.
                if n == tail.len() {
                    tail.clear();
                } else {
                    bytes::Buf::advance(tail, n);
                }
            }
        }
    }

    /// The outcome of unary request `id`, once the reader (or the deadline, or the worker's
    /// exit) delivered it; until then `cx`'s waker is kept in the route.
    pub fn poll_unary(&self, id: u64, cx: &mut Context<'_>) -> Poll<Result<Bytes>> {
        let mut driver = self.driver.locked();
        let mut others = Vec::new();
        let mut pass = ReadPass::default();
        if driver.direct_reader == Some(id) {
            self.read_directly(&mut driver, id, cx, &mut others, &mut pass);
        }
        let polled = match driver.routes.get_mut(id) {
            // Not reachable: the route stays until its outcome is taken. Still one outcome.
            None => Poll::Ready(Err(driver
                .closed
                .clone()
                .unwrap_or(Error::PoolClosed("request lost")))),
            Some(route) => match &mut route.sink {
                Some(Sink::Unary(UnaryCell::Waiting(w))) => {
                    match w {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        _ => *w = Some(cx.waker().clone()),
                    }
                    Poll::Pending
                }
                Some(Sink::Unary(UnaryCell::Done(_))) => {
                    let Some(Sink::Unary(UnaryCell::Done(outcome))) = route.sink.take() else {
                        unreachable!()
                    };
                    if route.finished() {
                        driver.routes.remove(id);
                    }
                    Poll::Ready(outcome)
                }
                _ => Poll::Ready(Err(Error::PoolClosed("request lost"))),
            },
        };
        if polled.is_ready() && driver.direct_reader == Some(id) {
            driver.hand_back_reading();
        }
        drop(driver);
        for w in others {
            w.wake();
        }
        self.release_slots(pass.completed);
        if pass.wake_writer {
            self.writer_wake.notify_one();
        }
        if pass.goodbye {
            self.said_goodbye();
        }
        polled
    }

    /// The caller of request `id` reads the socket itself (see `DriverState::direct_reader`): every
    /// read's frames are handled as the reader task would, until its own outcome is in or the
    /// socket has nothing more (then `cx` is registered for read readiness).
    fn read_directly(
        &self,
        c: &mut DriverState,
        id: u64,
        cx: &mut Context<'_>,
        wakers: &mut Vec<Waker>,
        pass: &mut ReadPass,
    ) {
        // Its own outcome wakes nobody: this poll looks at it right after.
        let own = match c.routes.get_mut(id) {
            Some(Route {
                sink: Some(Sink::Unary(UnaryCell::Waiting(w))),
                ..
            }) => w.take(),
            _ => return,
        };
        while let Some(sock) = &c.socket_out {
            let sock = sock.clone();
            match c.poll_read(&sock, cx) {
                Poll::Pending => break,
                Poll::Ready(Ok(n)) if n > 0 => {
                    let read = handle_read(self, c, n, wakers);
                    pass.completed += read.completed;
                    pass.wake_writer |= read.wake_writer;
                    pass.goodbye |= read.goodbye;
                    if let Some(end) = read.end {
                        c.reader_end = Some(end);
                        c.hand_back_reading();
                        break;
                    }
                    let waiting = matches!(
                        c.routes.get_mut(id),
                        Some(Route {
                            sink: Some(Sink::Unary(UnaryCell::Waiting(_))),
                            ..
                        })
                    );
                    if !waiting {
                        break;
                    }
                }
                // End of file or an error: the reader task meets it again and ends the
                // connection (a crash is reported through the worker's exit).
                Poll::Ready(_) => {
                    c.hand_back_reading();
                    break;
                }
            }
        }
        if let Some(Route {
            sink: Some(Sink::Unary(UnaryCell::Waiting(w @ None))),
            ..
        }) = c.routes.get_mut(id)
        {
            *w = own;
        }
    }

    /// The caller of unary request `id` went away: cancel it if it is still running, and
    /// forget an outcome nobody will take.
    pub fn abandon_unary(&self, id: u64) {
        self.cancel(id);
    }

    fn check_request_quota(&self) {
        if let Some(max) = self.pool.cfg.recycle.max_requests {
            if self.requests.load(Relaxed) >= max && self.state.load(Acquire) == STATE_READY {
                self.begin_drain(ExitCause::RecycledRequests, self.pool.cfg.drain_grace);
            }
        }
    }

    /// Asks the worker to stop a request. The request stays in flight until its terminal
    /// arrives; if that takes longer than the cancel grace, the worker is killed.
    pub fn cancel(&self, id: u64) {
        let mut driver = self.driver.locked();
        let c = &mut *driver;
        if c.direct_reader == Some(id) {
            c.hand_back_reading();
        }
        let Some(route) = c.routes.get_mut(id) else {
            return;
        };
        route.sink = None;
        if !route.on_wire {
            // Ended: the outcome nobody will take now goes.
            c.routes.remove(id);
            return;
        }
        // A worker that is gone has nothing to cancel; its routes end with its exit.
        if route.cancelled_at.is_some() || c.closed.is_some() {
            return;
        }
        route.cancelled_at = Some(Instant::now());
        let _ = c.conn.send_cancel(id, &mut c.out);
        drop(driver);
        self.writer_wake.notify_one();
    }

    /// The consumer of stream `id` has read `bytes` of ROWS payload; the core decides when
    /// that is worth a CREDIT (half the window).
    pub fn consumed(&self, id: u64, bytes: usize) {
        let mut driver = self.driver.locked();
        if driver.closed.is_some() {
            return;
        }
        let c = &mut *driver;
        if let Ok(granted) = c.conn.consumed(id, bytes, &mut c.out) {
            drop(driver);
            if granted > 0 {
                self.writer_wake.notify_one();
            }
        }
    }

    pub fn record_latency(&self, method_no: usize, d: Duration) {
        self.pool.record_latency(method_no, d);
    }

    /// Stops sending new requests to this worker, tells it to drain, and hands the slot to a
    /// replacement. In-flight requests finish normally within `grace`.
    pub fn begin_drain(&self, cause: ExitCause, grace: Duration) {
        let prev = self.state.swap(STATE_DRAINING, AcqRel);
        if prev == STATE_DRAINING || prev == STATE_DEAD {
            if prev == STATE_DEAD {
                self.state.store(STATE_DEAD, Release);
            }
            return;
        }
        *self.drain_deadline.locked() = Some(Instant::now() + grace + Duration::from_secs(1));
        {
            let mut driver = self.driver.locked();
            if driver.closed.is_none() {
                let c = &mut *driver;
                let _ = c
                    .conn
                    .send_drain(grace.as_millis().min(u32::MAX as u128) as u32, &mut c.out);
            }
        }
        self.writer_wake.notify_one();
        if let Some(tx) = self.retire.locked().take() {
            let _ = tx.send(cause);
        }
        tracing::debug!(worker = self.id, slot = self.slot, pid = self.pid, %cause, "draining worker");
    }

    /// The worker said GOODBYE (its core refuses new requests already): it takes no new work,
    /// and its slot gets a replacement now. The lifecycle task gives it [`EXIT_GRACE`] to
    /// exit, then kills it.
    fn said_goodbye(&self) {
        let _ = self
            .state
            .compare_exchange(STATE_READY, STATE_DRAINING, AcqRel, Relaxed);
        let _ = self
            .state
            .compare_exchange(STATE_LEASED, STATE_DRAINING, AcqRel, Relaxed);
        if let Some(tx) = self.retire.locked().take() {
            let _ = tx.send(ExitCause::LeftByItself);
        }
        self.pool.notify_state_changed();
        tracing::debug!(
            worker = self.id,
            slot = self.slot,
            pid = self.pid,
            "worker said GOODBYE"
        );
    }

    /// Kills the worker's process group now (it is then reaped and replaced).
    pub fn kill(&self, cause: ExitCause) {
        let _ = self.control.try_send(Control::Kill(cause));
    }

    /// Kills without going through the lifecycle task (used when the pool is dropped).
    pub fn kill_now(&self) {
        if self.state.load(Acquire) != STATE_DEAD {
            // The pool is going: a remote worker's child goes with it at once.
            spawn::signal_group(self.local_pid, libc::SIGKILL);
            self.kill_process();
        }
    }

    /// Ends the process: a local one's group is killed; a remote worker's connection is closed
    /// (PROTOCOL.md 21.6: its launcher stops the process where it runs, after a grace).
    fn kill_process(&self) {
        if self.host.is_none() {
            spawn::signal_group(self.local_pid, libc::SIGKILL);
            return;
        }
        let transport = self.driver.locked().socket_out.clone();
        if let Some(t) = transport {
            t.shut_down();
        }
    }
}

/// One call at a time: its caller reads the answer itself (see `DriverState::direct_reader`).
/// Registering its waker costs no syscall. Input already waiting (say a PONG) is left to the
/// reader task; the registration may still have replaced the reader's (readiness can arrive
/// from another thread while it is stored), so the reader is woken to register again.
fn read_own_answer(c: &mut DriverState, id: u64, waker: &Waker) {
    if let (None, Some(sock)) = (c.direct_reader, &c.socket_out) {
        if sock
            .poll_readable(&mut Context::from_waker(waker))
            .is_pending()
        {
            c.direct_reader = Some(id);
        } else if let Some(reader) = &c.reader_waker {
            reader.wake_by_ref();
        }
    }
}

/// Maps a send the core refused to the caller's error: request-level refusals (DRAINING,
/// OVERLOADED, CODEC_UNSUPPORTED, ...) keep their code, anything else is a protocol failure.
fn refusal(e: ProtocolError, worker_id: u32) -> Error {
    if e.code == ErrorCode::MessageTooLarge {
        return Error::MessageTooLarge(e.message);
    }
    match ErrorClass::of(e.code.code()) {
        ErrorClass::Request => Error::Remote {
            code: e.code.code(),
            message: e.message,
            details: String::new(),
        },
        _ => Error::ProtocolViolation {
            code: e.code.code(),
            message: e.message,
            worker_id,
            exit: None,
        },
    }
}

/// A worker's process and connection before its HELLO, wherever its launcher placed it.
struct Placed {
    transport: Transport,
    process: Process,
    /// See `Worker::local_pid`.
    local_pid: u32,
    /// A remote worker's peer address and the ticket it joined with.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    remote: Option<(std::net::SocketAddr, [u8; 16])>,
    /// The HELLO is due within this.
    hello_within: Duration,
    stderr_tail: Arc<StderrTail>,
    logs_done: JoinHandle<()>,
}

/// Starts the slot's worker process where its launcher says (PROTOCOL.md 21.8): a local child
/// with a socketpair, or a worker that joins the pool's listener with a ticket.
async fn place(pool: &PoolShared, slot: usize, worker_id: u32) -> Result<Placed> {
    let cfg = &pool.cfg;
    #[cfg(feature = "remote")]
    if let Some(launcher) = cfg.launchers.get(slot).filter(|l| !l.is_local()) {
        let listener = pool
            .listener
            .as_ref()
            .ok_or(Error::PoolClosed("no listener for remote workers"))?;
        let p = crate::remote::place(launcher, listener, cfg, worker_id).await?;
        return Ok(Placed {
            transport: p.transport,
            process: Process::Remote {
                child: p.child,
                stop_grace: p.stop_grace,
            },
            local_pid: p.child_pid,
            remote: Some((p.peer, p.ticket_id)),
            hello_within: p
                .hello_deadline
                .saturating_duration_since(Instant::now())
                .min(cfg.startup_timeout),
            stderr_tail: p.stderr_tail,
            logs_done: p.logs_done.unwrap_or_else(|| tokio::spawn(async {})),
        });
    }
    let _ = slot;
    let spawned = spawn::spawn_worker(
        &cfg.command,
        worker_id,
        cfg.stderr_tail_lines,
        cfg.worker_output,
    )?;
    Ok(Placed {
        transport: spawned.transport.expect("a local worker has a socketpair"),
        process: Process::Local(spawned.child),
        local_pid: spawned.pid,
        remote: None,
        hello_within: cfg.startup_timeout,
        stderr_tail: spawned.stderr_tail,
        logs_done: spawned.logs_done,
    })
}

/// Starts one worker: spawn (or wait for its join), handshake (bounded by the start-up timeout,
/// and for a remote worker by the listener's HELLO bound), then the reader, writer and
/// lifecycle tasks.
pub(crate) async fn start(
    pool: &Arc<PoolShared>,
    slot: usize,
    worker_id: u32,
    counters: Arc<SlotCounters>,
) -> Result<Incarnation> {
    let cfg = &pool.cfg;
    let Placed {
        transport,
        mut process,
        local_pid,
        remote,
        hello_within,
        stderr_tail,
        logs_done,
    } = place(pool, slot, worker_id).await?;
    let host: Option<Arc<str>> = remote.map(|(peer, _)| peer.ip().to_string().into());
    let socket = Arc::new(transport);
    let mut conn = Connection::new_parent();
    let agreed = handshake(
        cfg,
        worker_id,
        &socket,
        &mut conn,
        hello_within,
        host.is_some(),
    )
    .await;
    let (hello, welcome) = match agreed {
        Ok(agreed) => agreed,
        Err(fail) => {
            #[cfg(feature = "remote")]
            if let (Some((peer, _)), Some(listener)) = (remote, &pool.listener) {
                if matches!(fail, StartFail::Timeout) {
                    listener.refused(&peer, "hello timeout");
                }
            }
            socket.shut_down();
            let exit = reap_failed(
                &mut process,
                local_pid,
                worker_id,
                fail.cause(),
                &stderr_tail,
                logs_done,
                host.clone(),
            )
            .await;
            process.release_remote().await;
            return Err(fail.into_error(exit, worker_id, hello_within));
        }
    };
    #[cfg(feature = "remote")]
    if let (Some((_, ticket)), Some(listener)) = (remote, &pool.listener) {
        listener.joined(ticket, &socket);
    }
    let pid = if host.is_some() { hello.pid } else { local_pid };
    let wire = wire_methods(pool, &hello);

    let (control_tx, control_rx) = mpsc::channel(8);
    let (retire_tx, retire_rx) = oneshot::channel();
    let worker = Arc::new(Worker {
        id: worker_id,
        slot,
        pid,
        local_pid,
        host,
        wire,
        counters,
        pool: pool.clone(),
        state: AtomicU8::new(STATE_READY),
        in_flight: AtomicU32::new(0),
        max_in_flight: welcome.max_in_flight,
        driver: Mutex::new(DriverState {
            conn,
            out: Outbox::default(),
            routes: RouteMap::new(welcome.max_in_flight),
            closed: None,
            writer_busy: false,
            writer_woken: false,
            unstamped: Vec::new(),
            socket_out: Some(socket.clone()),
            direct_reader: None,
            direct_reader_seen: None,
            reader_waker: None,
            reader_end: None,
            bytes_in: 0,
            #[cfg(target_os = "linux")]
            shm: None,
        }),
        writer_wake: Notify::new(),
        control: control_tx,
        last_ping: AtomicU64::new(0),
        last_pong: AtomicU64::new(0),
        ping_sent_ns: AtomicU64::new(0),
        heartbeat_rtt_ns: AtomicU64::new(0),
        last_request_ms: AtomicU64::new(pool.now_ms()),
        requests: AtomicU64::new(0),
        goodbye: AtomicU32::new(0),
        retire: Mutex::new(Some(retire_tx)),
        drain_deadline: Mutex::new(None),
        exit: OnceLock::new(),
        stderr_tail,
    });
    #[cfg(target_os = "linux")]
    if let (Some(threshold), Some(_)) = (cfg.shm_threshold, welcome.extensions.shm) {
        set_up_lane(&worker, threshold);
    }
    let weak = Arc::downgrade(&worker);
    socket.set_output_waker(Box::new(move || {
        if let Some(worker) = weak.upgrade() {
            worker.writer_wake.notify_one();
        }
    }));
    let reader = tokio::spawn(reader_loop(worker.clone(), socket.clone()));
    let writer = tokio::spawn(writer_loop(worker.clone(), socket));
    let lifecycle = tokio::spawn(lifecycle(
        worker.clone(),
        process,
        reader,
        writer,
        logs_done,
        control_rx,
    ));
    Ok(Incarnation {
        worker,
        lifecycle,
        retiring: retire_rx,
    })
}

/// Why a worker failed before it served anything. Each ends the same way: the process is
/// killed (or its own exit awaited) and reaped, and the error names what happened.
enum StartFail {
    /// The connection ended before HELLO, or the WELCOME could not be written: a crash.
    Eof,
    /// The worker broke the protocol before HELLO, or reported a fatal error of its own.
    Protocol(u32, String),
    /// No HELLO within the start-up timeout.
    Timeout,
    /// The HELLO was refused: a method or codec the pool calls is missing, or no common version.
    Refused(ProtocolError),
}

impl StartFail {
    fn cause(&self) -> ExitCause {
        match self {
            StartFail::Eof => ExitCause::Crashed,
            StartFail::Protocol(..) | StartFail::Refused(_) => ExitCause::ProtocolViolation,
            StartFail::Timeout => ExitCause::Hung,
        }
    }

    fn into_error(self, exit: Arc<ExitInfo>, worker_id: u32, startup_timeout: Duration) -> Error {
        match self {
            StartFail::Eof => Error::WorkerExited(exit),
            StartFail::Protocol(code, message) => Error::ProtocolViolation {
                code,
                message,
                worker_id,
                exit: Some(exit),
            },
            StartFail::Timeout => Error::StartupTimeout {
                after: startup_timeout,
                stderr_tail: exit.stderr_tail.clone(),
            },
            StartFail::Refused(e) if e.code == ErrorCode::CodecMismatch => {
                Error::CodecMismatch(e.message)
            }
            StartFail::Refused(e) => Error::ProtocolViolation {
                code: e.code.code(),
                message: e.message,
                worker_id,
                exit: Some(exit),
            },
        }
    }
}

/// A request, its body through a region of the lane when it is on and the body is large enough
/// (over the socket when no region can take it).
fn send_request(
    c: &mut DriverState,
    method: u16,
    codec: u8,
    timeout_us: u64,
    body: &Bytes,
) -> std::result::Result<u64, ProtocolError> {
    #[cfg(target_os = "linux")]
    if c.shm.is_some() && c.conn.has_shm_releases() {
        // Results the caller dropped: their releases go before this request, so the worker
        // has its regions back before it answers (no new region per call).
        c.conn.send_shm_releases(&mut c.out);
    }
    #[cfg(target_os = "linux")]
    if let Some(lane) = c.shm.as_mut().filter(|l| body.len() >= l.threshold) {
        if let Some(placed) = lane.regions.place(&mut c.conn, body, &mut c.out) {
            let id =
                c.conn
                    .send_request_shm(method, codec, timeout_us, placed.range, &mut c.out)?;
            // The region stays unwritten until the worker releases the range.
            let _ = c.conn.shm_hold(placed.range, placed.keep);
            return Ok(id);
        }
    }
    c.conn.send_request(
        method,
        codec,
        timeout_us,
        body,
        &mut c.out.message_writer(body),
    )
}

/// The lane the WELCOME accepted: the core's mapper for the worker's regions and the waker that
/// sends releases when views of results are dropped (PROTOCOL.md 20.7).
#[cfg(target_os = "linux")]
fn set_up_lane(worker: &Arc<Worker>, threshold: usize) {
    let fds: FdQueue = Arc::default();
    let weak = Arc::downgrade(worker);
    let mut driver = worker.driver.locked();
    driver
        .conn
        .set_shm_mapper(wirepool_io::shm::descriptor_mapper(fds.clone()));
    driver.conn.set_shm_release_waker(Arc::new(move || {
        if let Some(worker) = weak.upgrade() {
            worker.writer_wake.notify_one();
        }
    }));
    driver.shm = Some(ParentLane {
        threshold,
        regions: wirepool_io::shm::Regions::default(),
        fds,
    });
}

/// Retires the parent's regions that no request used for `IDLE_RETIRE` (PROTOCOL.md 20.4):
/// an idle connection gives its shared memory back on both sides.
#[cfg(target_os = "linux")]
fn retire_idle_regions(worker: &Worker, now: Instant) {
    let mut driver = worker.driver.locked();
    let c = &mut *driver;
    if c.closed.is_some() {
        return;
    }
    let Some(lane) = c.shm.as_mut() else {
        return;
    };
    if lane.regions.is_empty() {
        return;
    }
    if lane.regions.retire_idle(&mut c.conn, &mut c.out, now) > 0 {
        drop(driver);
        worker.writer_wake.notify_one();
    }
}

/// HELLO in (within `within`: the start-up timeout, or what is left of a remote worker's HELLO
/// bound), WELCOME out. A failure is first reported to the worker where the spec says so (a
/// fatal ERROR, or the refusal of its HELLO).
async fn handshake(
    cfg: &PoolConfig,
    worker_id: u32,
    socket: &Transport,
    conn: &mut Connection,
    within: Duration,
    remote: bool,
) -> std::result::Result<(Box<Hello>, Welcome), StartFail> {
    let mut out = BytesMut::new();
    let hello = match tokio::time::timeout(within, read_hello(socket, conn)).await {
        Ok(Ok(hello)) => hello,
        Ok(Err(StartFail::Protocol(code, message))) => {
            let e = ProtocolError::new(
                ErrorCode::from_code(code).unwrap_or(ErrorCode::Protocol),
                0,
                message.clone(),
            );
            let _ = conn.send_fatal(&e, &mut out);
            let _ = write_now(socket, &out).await;
            return Err(StartFail::Protocol(code, message));
        }
        Ok(Err(fail)) => return Err(fail),
        Err(_) => return Err(StartFail::Timeout),
    };
    let welcome = match welcome_for(cfg, worker_id, &hello, conn, &mut out, remote) {
        Ok(w) => w,
        Err(e) => {
            out.clear();
            let _ = conn.refuse(e.code, &e.message, &mut out);
            let _ = write_now(socket, &out).await;
            return Err(StartFail::Refused(e));
        }
    };
    if write_now(socket, &out).await.is_err() {
        return Err(StartFail::Eof);
    }
    Ok((hello, welcome))
}

/// Reads until the worker's HELLO (or whatever else it says first).
async fn read_hello(
    socket: &Transport,
    conn: &mut Connection,
) -> std::result::Result<Box<Hello>, StartFail> {
    loop {
        match conn.next_event() {
            Ok(Some(Event::Hello(h))) => return Ok(h),
            Ok(Some(Event::Error { code, message, .. })) => {
                return Err(StartFail::Protocol(
                    code,
                    format!("worker reported: {message}"),
                ))
            }
            Ok(Some(other)) => {
                return Err(StartFail::Protocol(
                    ErrorCode::UnexpectedFrame.code(),
                    format!("unexpected {other:?} before HELLO"),
                ))
            }
            Ok(None) => {}
            Err(e) => return Err(StartFail::Protocol(e.code.code(), e.message)),
        }
        match std::future::poll_fn(|cx| socket.poll_read_buf(cx, conn.read_buffer())).await {
            Ok(0) | Err(_) => {
                return Err(match conn.end_of_input() {
                    Err(e) if e.code != ErrorCode::Truncated => {
                        StartFail::Protocol(e.code.code(), e.message)
                    }
                    _ => StartFail::Eof,
                })
            }
            Ok(_) => {}
        }
    }
}

/// The WELCOME for `hello`, encoded into `out`: refused, at start-up, when the worker lacks a
/// method or codec the pool is configured to call.
fn welcome_for(
    cfg: &PoolConfig,
    worker_id: u32,
    hello: &Hello,
    conn: &mut Connection,
    out: &mut BytesMut,
    remote: bool,
) -> std::result::Result<Welcome, ProtocolError> {
    let required: Vec<MethodRequirement> = cfg
        .methods
        .iter()
        .map(|m| MethodRequirement {
            name: m.name.clone(),
            kind: m.kind,
            codec: m.codec.unwrap_or(cfg.codec).id(),
        })
        .collect();
    check_methods(hello, &required)?;
    // The WELCOME's numbers are the core's (PROTOCOL.md 14.5). `validate::pool_options` refused
    // an out-of-range option at start, so only VERSION_MISMATCH can come from here.
    let offer = Offer {
        max_frame_size: i64::from(cfg.max_frame_size),
        initial_credit: i64::from(cfg.initial_credit),
        heartbeat_ms: i64::from(crate::validate::ceil_ms(cfg.heartbeat)),
        max_in_flight: i64::from(cfg.max_in_flight),
        max_message_size: i64::try_from(cfg.max_message_size).unwrap_or(i64::MAX),
        worker_id,
        remote,
    };
    let (mut w, clamped) = negotiate(hello, &offer)?;
    if clamped && !cfg.clamp_logged.swap(true, Relaxed) {
        tracing::warn!(
            configured = cfg.max_in_flight,
            offered = hello.max_concurrency,
            "max_in_flight {} is above the worker's max_concurrency {}: using {} (said once per pool)",
            cfg.max_in_flight,
            hello.max_concurrency,
            w.max_in_flight
        );
    }
    // The lane needs the socketpair: never accepted on a remote connection (21.1).
    if let (Some(_), Some(offer), false) = (cfg.shm_threshold, hello.extensions.shm, remote) {
        // Each side maps at most one largest message's worth of the other's regions.
        w.extensions.shm = Some(wirepool_proto::shm::ShmAccept {
            to_worker_window: offer.window.min(w.max_message_size),
            to_parent_window: w.max_message_size,
        });
    }
    conn.send_welcome(&w, out)?;
    Ok(w)
}

/// Maps the worker's methods onto the pool's method table. The table comes from the first
/// worker that says HELLO; later workers are mapped onto it by name.
fn wire_methods(pool: &PoolShared, hello: &Hello) -> Vec<Option<WireMethod>> {
    let table = pool.methods.get_or_init(|| {
        let names: Vec<String> = hello.methods.iter().map(|m| m.name.clone()).collect();
        MethodTable {
            by_name: names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i))
                .collect(),
            latency: names.iter().map(|_| LatencyHistogram::new()).collect(),
            names,
            offered: hello
                .methods
                .iter()
                .map(|m| crate::config::OfferedMethod {
                    name: m.name.clone(),
                    kind: m.kind,
                    codecs: m
                        .codecs
                        .iter()
                        .filter_map(|&id| wirepool_codec::Codec::from_id(id))
                        .collect(),
                })
                .collect(),
        }
    });
    let mut wire: Vec<Option<WireMethod>> = vec![None; table.names.len()];
    for (index, m) in hello.methods.iter().enumerate() {
        if let Some(&no) = table.by_name.get(&m.name) {
            wire[no] = Some(WireMethod {
                index: index as u16,
                kind: m.kind,
            });
        }
    }
    wire
}

async fn write_now(socket: &Transport, bytes: &[u8]) -> std::io::Result<()> {
    // Only used before the writer task exists (handshake).
    if bytes.is_empty() {
        return Ok(());
    }
    socket.write_all(bytes).await
}

/// Kills and reaps a worker that failed before it served anything (a remote worker's connection
/// is closed already; its child, if any, is released by the caller).
async fn reap_failed(
    process: &mut Process,
    pid: u32,
    worker_id: u32,
    cause: ExitCause,
    tail: &Arc<StderrTail>,
    logs_done: JoinHandle<()>,
    host: Option<Arc<str>>,
) -> Arc<ExitInfo> {
    let Process::Local(child) = process else {
        let _ = tokio::time::timeout(Duration::from_millis(200), logs_done).await;
        let mut info = exit_info(worker_id, pid, None, cause, tail);
        info.host = host.map(|h| h.to_string());
        return Arc::new(info);
    };
    // A worker that closed its end is usually exiting: give it a moment so its own exit
    // status (not our SIGKILL) is reported; otherwise kill its group.
    let grace = if cause == ExitCause::Crashed {
        Duration::from_millis(500)
    } else {
        Duration::ZERO
    };
    let status = match tokio::time::timeout(grace, child.wait()).await {
        Ok(Ok(s)) => Some(s),
        _ => {
            spawn::signal_group(pid, libc::SIGKILL);
            child.wait().await.ok()
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(200), logs_done).await;
    Arc::new(exit_info(worker_id, pid, status, cause, tail))
}

fn exit_info(
    worker_id: u32,
    pid: u32,
    status: Option<std::process::ExitStatus>,
    cause: ExitCause,
    tail: &StderrTail,
) -> ExitInfo {
    use std::os::unix::process::ExitStatusExt;
    ExitInfo {
        worker_id,
        pid,
        code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        cause,
        stderr_tail: tail.snapshot(),
        host: None,
        connection_lost: false,
        attempts: 1,
    }
}

/// Why the reader stopped.
enum ReaderEnd {
    Eof,
    Protocol { code: u32, message: String },
}

/// Reads straight into the connection's receive buffer (a non-blocking read under the driver
/// lock, so the bytes are never copied) and handles every complete frame of that read under the
/// same lock: results, rows and errors go to their callers, PINGs are answered.
///
/// While a unary caller reads the socket itself (`DriverState::direct_reader`, see
/// [`Worker::poll_unary`]) this task waits; the caller hands the socket back by registering
/// this task's waker for read readiness (or waking it) when its call ends.
async fn reader_loop(worker: Arc<Worker>, socket: Arc<Transport>) -> ReaderEnd {
    let mut wakers: Vec<Waker> = Vec::with_capacity(64);
    loop {
        // The read is polled under the lock (never held across a suspension) straight into the
        // core's buffer; a short read clears readiness, so there is no extra EAGAIN read per
        // wake-up.
        let read = std::future::poll_fn(|cx| {
            let mut driver = worker.driver.locked();
            if let Some(end) = driver.reader_end.take() {
                return Poll::Ready(Err(end));
            }
            match &driver.reader_waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => driver.reader_waker = Some(cx.waker().clone()),
            }
            if driver.direct_reader.is_some() {
                return Poll::Pending;
            }
            driver.poll_read(&socket, cx).map(Ok)
        })
        .await;
        let n = match read {
            Err(end) => return end,
            Ok(Ok(0) | Err(_)) => {
                // A read that was a protocol violation (see `DriverState::poll_read`).
                let violation = worker.driver.locked().reader_end.take();
                if let Some(end) = violation {
                    worker.writer_wake.notify_one();
                    return end;
                }
                return reader_eof(&worker);
            }
            Ok(Ok(n)) => n,
        };
        let pass = {
            let mut driver = worker.driver.locked();
            handle_read(&worker, &mut driver, n, &mut wakers)
        };
        for w in wakers.drain(..) {
            w.wake();
        }
        worker.release_slots(pass.completed);
        if pass.wake_writer {
            worker.writer_wake.notify_one();
        }
        if pass.goodbye {
            worker.said_goodbye();
        }
        if let Some(end) = pass.end {
            return end;
        }
    }
}

/// What handling one read's frames left to do once the driver lock is released.
#[derive(Default)]
struct ReadPass {
    /// The connection must end (a protocol violation, or the worker's fatal ERROR).
    end: Option<ReaderEnd>,
    wake_writer: bool,
    /// In-flight slots freed (terminals received).
    completed: u32,
    /// The worker said GOODBYE: see [`Worker::said_goodbye`].
    goodbye: bool,
}

/// Handles every complete frame in the receive buffer after a read of `n` bytes; the wakers of
/// unary callers whose outcome arrived go to `wakers` (to be woken after the lock).
fn handle_read(
    worker: &Worker,
    c: &mut DriverState,
    n: usize,
    wakers: &mut Vec<Waker>,
) -> ReadPass {
    let mut pass = ReadPass::default();
    worker.counters.bytes_in.fetch_add(n as u64, Relaxed);
    // Liveness reads no clock here: the lifecycle's tick compares these bytes with the
    // decoder's incomplete frame (see `liveness`).
    c.bytes_in += n as u64;
    // At most one clock read per read, shared by every call it completes.
    let mut read_at = ReadClock::unread();
    pass.end = loop {
        let ev = match c.conn.next_event() {
            Ok(Some(ev)) => ev,
            Ok(None) => break None,
            Err(e) => {
                let _ = c.conn.send_fatal(&e, &mut c.out);
                pass.wake_writer = true;
                break Some(ReaderEnd::Protocol {
                    code: e.code.code(),
                    message: e.message,
                });
            }
        };
        match ev {
            Event::Result { id, body } => {
                pass.completed += end_route(
                    &mut c.routes,
                    id,
                    Ok(body),
                    wakers,
                    &mut read_at,
                    &worker.pool,
                );
            }
            Event::Error {
                id: 0,
                code,
                message,
                ..
            } => {
                // The worker's fatal report; it closes next.
                break Some(ReaderEnd::Protocol {
                    code,
                    message: format!("worker reported: {message}"),
                });
            }
            Event::Error {
                id,
                code,
                message,
                details,
            } => {
                let e = Err(Error::Remote {
                    code,
                    message,
                    details,
                });
                pass.completed +=
                    end_route(&mut c.routes, id, e, wakers, &mut read_at, &worker.pool);
            }
            Event::Rows { id, rows } => {
                worker.counters.rows.fetch_add(rows.count() as u64, Relaxed);
                let unread = match c.routes.get_mut(id) {
                    Some(Route {
                        sink: Some(Sink::Stream(s)),
                        ..
                    }) => s.push_rows(rows).err(),
                    _ => Some(rows),
                };
                // Nobody reads these rows (cancelled, or the consumer is gone): they count as
                // consumed (PROTOCOL.md 14.3), so a handler blocked on credit can go on to see
                // its cancellation.
                if let Some(rows) = unread {
                    if let Ok(g) = c.conn.consumed(id, rows.payload().len(), &mut c.out) {
                        pass.wake_writer |= g > 0;
                    }
                }
            }
            Event::End { id, summary, .. } => {
                pass.completed += end_route(
                    &mut c.routes,
                    id,
                    Ok(summary),
                    wakers,
                    &mut read_at,
                    &worker.pool,
                );
            }
            Event::Notification { id, topic, data } => {
                // Into a bounded mailbox, never waiting for its reader (events.rs).
                let own = match id {
                    0 => None,
                    _ => c.routes.get_mut(id).and_then(|r| r.events.as_ref()),
                };
                match own.or(worker.pool.cfg.events.as_ref()) {
                    Some(tx) => tx.deliver(crate::events::WorkerEvent {
                        worker_id: worker.id,
                        request_id: id,
                        topic,
                        data,
                    }),
                    None => {
                        tracing::debug!(target: "wirepool::event", worker = worker.id, id, %topic, %data)
                    }
                }
            }
            Event::Ping { nonce } => {
                // Ahead of what is queued, at the writer's next frame boundary (8.5).
                let _ = c.conn.send_pong(nonce, c.out.urgent());
                pass.wake_writer = true;
            }
            Event::Pong { nonce } => {
                // Our nonces count up; one we never sent answers nothing (unsolicited).
                let nonce = u64::from_le_bytes(nonce);
                let last = worker.last_ping.load(Acquire);
                if nonce <= last {
                    worker.last_pong.fetch_max(nonce, Release);
                }
                if nonce == last {
                    let sent = worker.ping_sent_ns.load(Acquire);
                    let rtt = (worker.pool.epoch.elapsed().as_nanos() as u64).saturating_sub(sent);
                    worker.heartbeat_rtt_ns.store(rtt.max(1), Relaxed);
                }
            }
            Event::Goodbye { reason } => {
                // PROTOCOL.md 8.4: nothing new goes to it; the lifecycle waits a short grace
                // for its exit, then kills it, and the pool replaces it now.
                worker.goodbye.store(reason.saturating_add(1), Relaxed);
                if c.closed.is_none() {
                    c.closed = Some(Error::PoolClosed("the worker said GOODBYE"));
                }
                pass.goodbye = true;
            }
            _ => {}
        }
    };
    pass
}

/// The terminal of request `id` arrived: its outcome goes to the caller, and the route leaves
/// the table unless a unary caller has yet to take the outcome. Returns the slots freed.
fn end_route(
    routes: &mut RouteMap,
    id: u64,
    outcome: Result<Bytes>,
    wakers: &mut Vec<Waker>,
    read_at: &mut ReadClock,
    pool: &PoolShared,
) -> u32 {
    let Some(r) = routes.get_mut(id) else {
        return 0;
    };
    r.on_wire = false;
    r.deliver(outcome, wakers, read_at, pool);
    if r.finished() {
        routes.remove(id);
    }
    1
}

/// End of file. Stopping inside a frame (`TRUNCATED`) is what a crash looks like, so it is
/// reported as the worker's exit (with its status), not as a protocol violation.
fn reader_eof(worker: &Worker) -> ReaderEnd {
    if let Err(e) = worker.driver.locked().conn.end_of_input() {
        tracing::debug!(worker = worker.id, error = %e, "connection ended inside a frame");
    }
    ReaderEnd::Eof
}

/// Writes every pending outgoing frame in one `write` per wake-up: callers only append to the
/// driver's output buffer under the lock and wake this task, so under load hundreds of requests
/// share one syscall.
async fn writer_loop(worker: Arc<Worker>, socket_out: Arc<Transport>) {
    let mut queue = WriteQueue::default();
    loop {
        {
            let mut driver = worker.driver.locked();
            let c = &mut *driver;
            // Views of results the callers dropped: their ranges go back to the worker.
            if c.conn.has_shm_releases() && c.closed.is_none() {
                c.conn.send_shm_releases(&mut c.out);
            }
            driver.out.take_into(&mut queue);
            driver.writer_busy = !queue.is_empty();
            driver.writer_woken = false;
            if !driver.unstamped.is_empty() {
                let now = Instant::now();
                let c = &mut *driver;
                for id in c.unstamped.drain(..) {
                    if let Some(r) = c.routes.get_mut(id) {
                        r.started.get_or_insert(now);
                    }
                }
                let ms = now.saturating_duration_since(worker.pool.epoch).as_millis() as u64;
                worker.last_request_ms.store(ms, Relaxed);
            }
        }
        if queue.is_empty() {
            // TLS records encrypted but not yet taken by the socket go before the writer sleeps.
            while socket_out.has_pending_output() {
                match socket_out.flush_pending() {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if socket_out.writable().await.is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
            worker.writer_wake.notified().await;
            // Let the callers woken with this one (by the same batch of results) queue their
            // requests first, so they share this write.
            tokio::task::yield_now().await;
            continue;
        }
        while !queue.is_empty() {
            let mut fds_sent = 0;
            let written = queue.with_slices_and_fds(|slices, fds| {
                fds_sent = fds.len();
                write_with_fds(&socket_out, slices, fds)
            });
            match written {
                Ok(n) => {
                    worker.counters.bytes_out.fetch_add(n as u64, Relaxed);
                    queue.advance_fds(n, fds_sent);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if socket_out.writable().await.is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
            // A long output (a large message, or a full socket): a PING or PONG queued since
            // goes at its next frame boundary, not after all of it (PROTOCOL.md 8.5). The
            // usual write takes everything and skips this.
            if !queue.is_empty() {
                worker
                    .driver
                    .lock()
                    .unwrap()
                    .out
                    .take_urgent_into(&mut queue);
            }
        }
    }
}

/// One write, with the SHM_REGION descriptors due with it (PROTOCOL.md 20.5).
fn write_with_fds(
    socket: &Transport,
    slices: &[std::io::IoSlice<'_>],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<usize> {
    #[cfg(target_os = "linux")]
    if !fds.is_empty() {
        return socket.try_write_vectored_fds(slices, fds);
    }
    let _ = fds;
    socket.try_write_vectored(slices)
}

/// Owns the process: reaps it, enforces heartbeats, deadlines, cancel grace and recycling, and
/// when it ends, gives every request still in flight exactly one typed error.
async fn lifecycle(
    worker: Arc<Worker>,
    mut process: Process,
    mut reader: JoinHandle<ReaderEnd>,
    writer: JoinHandle<()>,
    logs_done: JoinHandle<()>,
    mut control: mpsc::Receiver<Control>,
) -> Arc<ExitInfo> {
    let mut tick = tokio::time::interval(worker.pool.cfg.housekeeping_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watch = Watch::new(worker.clone());
    let status = loop {
        tokio::select! {
            st = process.wait_local() => break st,
            end = &mut reader, if !watch.reader_done => {
                watch.reader_ended(end);
                // A remote worker ends with its connection (PROTOCOL.md 21.6).
                if worker.host.is_some() {
                    break None;
                }
            }
            Some(ctl) = control.recv() => match ctl {
                Control::Kill(c) => watch.kill(c),
            },
            _ = tick.tick() => watch.tick(),
        }
    };
    // Reaped. Let the reader consume what the worker wrote before it died (its last results),
    // then stop it; the socket has no other writer, so end of file follows at once.
    worker.state.store(STATE_DEAD, Release);
    if !watch.reader_done {
        match tokio::time::timeout(Duration::from_millis(500), &mut reader).await {
            Ok(end) => {
                if let Ok(ReaderEnd::Protocol { code, message }) = end {
                    watch.protocol_error.get_or_insert((code, message));
                    watch.cause.get_or_insert(ExitCause::ProtocolViolation);
                }
            }
            Err(_) => {
                reader.abort();
                let _ = reader.await;
            }
        }
    }
    // Wait until the writer is gone too and drop the fast path's handle: the socket is closed
    // when this function returns, whoever still holds the `Worker`.
    writer.abort();
    let _ = writer.await;
    worker.driver.locked().socket_out = None;
    let _ = tokio::time::timeout(Duration::from_millis(200), logs_done).await;
    let (info, error) = watch.exit(status);
    let _ = worker.exit.set(info.clone());
    fail_in_flight(&worker, error);
    worker.pool.notify_state_changed();
    // A remote worker's child is reaped before the slot moves on (shutdown reaps everything).
    process.release_remote().await;
    if info.cause == ExitCause::Crashed || info.cause == ExitCause::Hung {
        tracing::warn!(worker = worker.id, "{info}");
    } else {
        tracing::debug!(worker = worker.id, "{info}");
    }
    info
}

/// What the lifecycle task knows about the process while it runs: why it is to end, and the
/// clocks that may end it.
struct Watch {
    worker: Arc<Worker>,
    /// The first reason found to end the process (the one reported).
    cause: Option<ExitCause>,
    protocol_error: Option<(u32, String)>,
    reader_done: bool,
    /// Killed at this time unless it exits first (after GOODBYE, end of file, a violation).
    kill_at: Option<Instant>,
    /// Heartbeats and the frame clock; `None` when heartbeats are off or nothing is left to judge.
    liveness: Option<Liveness>,
    goodbye_seen: bool,
    next_rss: Instant,
    killed: bool,
}

impl Watch {
    fn new(worker: Arc<Worker>) -> Watch {
        let cfg = &worker.pool.cfg;
        // The negotiated period (the WELCOME's: a remote connection always has one, 21.5).
        let heartbeat_ms = worker
            .driver
            .locked()
            .conn
            .welcome()
            .map_or(0, |w| u64::from(w.heartbeat_ms));
        let tick_ms = cfg.housekeeping_interval.as_millis() as u64;
        // With heartbeat 0 the user turned liveness checks off: neither clock runs.
        let liveness =
            (heartbeat_ms > 0).then(|| Liveness::new(heartbeat_ms, tick_ms, worker.pool.now_ms()));
        Watch {
            worker,
            cause: None,
            protocol_error: None,
            reader_done: false,
            kill_at: None,
            liveness,
            goodbye_seen: false,
            next_rss: Instant::now(),
            killed: false,
        }
    }

    /// Kills the process group (once); the first cause given is the one reported.
    fn kill(&mut self, cause: ExitCause) {
        self.cause.get_or_insert(cause);
        if !self.killed {
            self.killed = true;
            self.worker.kill_process();
        }
    }

    fn reader_ended(&mut self, end: std::result::Result<ReaderEnd, tokio::task::JoinError>) {
        self.reader_done = true;
        close_connection(&self.worker);
        match end {
            Ok(ReaderEnd::Eof) => {
                // A worker that closed its end should exit promptly; give it a moment to write
                // its last stderr lines and exit status.
                self.kill_at.get_or_insert(Instant::now() + EXIT_GRACE);
            }
            Ok(ReaderEnd::Protocol { code, message }) => {
                tracing::warn!(worker = self.worker.id, pid = self.worker.pid, code, %message, "protocol violation");
                self.protocol_error = Some((code, message));
                // Give the writer a moment to send the ERROR frame before the kill.
                self.cause.get_or_insert(ExitCause::ProtocolViolation);
                self.kill_at = Some(Instant::now() + Duration::from_millis(100));
            }
            Err(_) => self.kill(ExitCause::Crashed),
        }
    }

    /// One housekeeping interval: the kill and drain deadlines, GOODBYE, heartbeats, request
    /// deadlines and cancel grace, recycling.
    fn tick(&mut self) {
        let now = Instant::now();
        let now_ms = self.worker.pool.now_ms();
        if let Some(at) = self.kill_at {
            if now >= at {
                self.kill(ExitCause::Crashed);
            }
        }
        let drain_deadline = *self.worker.drain_deadline.locked();
        if let Some(at) = drain_deadline {
            if now >= at {
                self.kill(ExitCause::Shutdown);
            }
        }
        if !self.goodbye_seen && self.worker.goodbye.load(Relaxed) != 0 {
            self.goodbye_seen(now);
        }
        if !self.reader_done {
            self.check_liveness(now_ms);
        }
        if let Some(c) = housekeep_routes(&self.worker, now) {
            self.kill(c);
        }
        #[cfg(target_os = "linux")]
        if !self.reader_done {
            retire_idle_regions(&self.worker, now);
        }
        if self.worker.state.load(Acquire) == STATE_READY {
            self.check_recycling(now, now_ms);
        }
    }

    /// PROTOCOL.md 8.4: after GOODBYE the worker sends nothing more and should exit; it gets a
    /// short grace, then is killed. Its heartbeat stops: there is nothing to judge.
    fn goodbye_seen(&mut self, now: Instant) {
        self.goodbye_seen = true;
        self.liveness = None;
        if self.worker.drain_deadline.locked().is_none() {
            self.cause.get_or_insert(ExitCause::LeftByItself);
        }
        self.kill_at = Some(
            self.kill_at
                .map_or(now + EXIT_GRACE, |at| at.min(now + EXIT_GRACE)),
        );
    }

    /// Kills a worker that made no progress within three heartbeats, or sends the PING due.
    fn check_liveness(&mut self, now_ms: u64) {
        let worker = &self.worker;
        let Some(clocks) = self.liveness.as_mut() else {
            return;
        };
        let seen = {
            let driver = worker.driver.locked();
            Seen {
                answered: worker.last_pong.load(Acquire),
                incomplete_frame: driver.conn.incomplete_frame_len(),
                bytes_in: driver.bytes_in,
            }
        };
        let due = clocks.tick(now_ms, seen);
        if let Some(hung) = due.hung {
            tracing::warn!(
                worker = worker.id,
                pid = worker.pid,
                ?hung,
                "no progress within 3 heartbeats, killing"
            );
            self.kill(ExitCause::Hung);
            self.liveness = None;
        } else if let Some(nonce) = due.ping {
            // Published before the PING leaves, so its PONG is never taken for an unsolicited
            // one; its time first, so the PONG that matches `last_ping` finds it.
            let sent = worker.pool.epoch.elapsed().as_nanos() as u64;
            worker.ping_sent_ns.store(sent, Release);
            worker.last_ping.store(nonce, Release);
            let mut driver = worker.driver.locked();
            let c = &mut *driver;
            // Ahead of what is queued, at the writer's next frame boundary: a large REQUEST
            // being written delays it by one frame at most (PROTOCOL.md 8.5).
            let _ = c.conn.send_ping(nonce.to_le_bytes(), c.out.urgent());
            drop(driver);
            worker.writer_wake.notify_one();
        }
    }

    /// Drains a ready worker above its memory limit, or idle for too long.
    fn check_recycling(&mut self, now: Instant, now_ms: u64) {
        let worker = &self.worker;
        let cfg = &worker.pool.cfg;
        if let Some(max) = cfg.recycle.max_rss_bytes {
            if now >= self.next_rss {
                self.next_rss = now + Duration::from_millis(250);
                if spawn::rss_bytes(worker.local_pid).is_some_and(|rss| rss > max) {
                    worker.begin_drain(ExitCause::RecycledRss, cfg.drain_grace);
                }
            }
        }
        if let Some(idle) = cfg.recycle.max_idle {
            let idle_ms = now_ms.saturating_sub(worker.last_request_ms.load(Relaxed));
            // A worker that never served anything has nothing to shed: keep it.
            let served = worker.requests.load(Relaxed) > 0;
            if served && worker.in_flight() == 0 && idle_ms >= idle.as_millis() as u64 {
                worker.begin_drain(ExitCause::RecycledIdle, cfg.drain_grace);
            }
        }
    }

    /// The reaped process's exit record, and the error its requests still in flight end with.
    fn exit(self, status: Option<std::process::ExitStatus>) -> (Arc<ExitInfo>, Error) {
        let worker = &self.worker;
        let drained = worker.drain_deadline.locked().is_some();
        let said_goodbye = worker.goodbye.load(Relaxed) != 0;
        let cause = self.cause.unwrap_or(if drained {
            ExitCause::Shutdown
        } else if said_goodbye {
            ExitCause::LeftByItself
        } else {
            ExitCause::Crashed
        });
        let mut info = exit_info(worker.id, worker.pid, status, cause, &worker.stderr_tail);
        if let Some(host) = &worker.host {
            // Its connection is all the pool knew of it: an end before GOODBYE that the pool
            // did not ask for is a lost connection (PROTOCOL.md 21.6).
            info.host = Some(host.to_string());
            info.connection_lost = !said_goodbye && !drained && !self.killed;
        }
        let info = Arc::new(info);
        let error = match (self.protocol_error, cause) {
            (Some((code, message)), _) => Error::ProtocolViolation {
                code,
                message,
                worker_id: worker.id,
                exit: Some(info.clone()),
            },
            (None, ExitCause::Hung) => Error::WorkerHung(info.clone()),
            _ => Error::WorkerExited(info.clone()),
        };
        (info, error)
    }
}

/// Every request still on the wire ends now with the worker's `error`; unary outcomes stay in
/// their routes until their callers take them.
fn fail_in_flight(worker: &Worker, error: Error) {
    let mut wakers = Vec::new();
    let mut freed = 0;
    let mut now = ReadClock::unread();
    {
        let mut driver = worker.driver.locked();
        driver.closed = Some(error.clone());
        driver.routes.retain(|_, r| {
            if r.on_wire {
                r.on_wire = false;
                freed += 1;
                r.deliver(Err(error.clone()), &mut wakers, &mut now, &worker.pool);
            }
            !r.finished()
        });
    }
    for w in wakers {
        w.wake();
    }
    worker.release_slots(freed);
}

/// Marks the connection closed so no new request is accepted while the process is reaped.
fn close_connection(worker: &Worker) {
    let mut driver = worker.driver.locked();
    if driver.closed.is_none() {
        driver.closed = Some(Error::PoolClosed("worker connection closed"));
    }
    // Nothing goes through the lane any more: the parent's own regions and the descriptors no
    // SHM_REGION took are closed now (PROTOCOL.md 20.4), not when the last handle of the
    // worker goes. The worker's regions stay mapped while views of them exist.
    #[cfg(target_os = "linux")]
    if let Some(lane) = driver.shm.as_mut() {
        lane.regions = wirepool_io::shm::Regions::default();
        lane.fds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
    drop(driver);
    let _ = worker
        .state
        .compare_exchange(STATE_READY, STATE_DRAINING, AcqRel, Relaxed);
    let _ = worker
        .state
        .compare_exchange(STATE_LEASED, STATE_DRAINING, AcqRel, Relaxed);
}

/// Parent-side deadlines and cancel grace. Returns a cause when the worker must be killed.
///
/// A worker that let a request overrun its deadline (plus grace) is suspect: it takes no new
/// work from then on (drained, replaced at once), so only what is already on it can be lost
/// if it must be killed when the cancel grace runs out.
fn housekeep_routes(worker: &Worker, now: Instant) -> Option<ExitCause> {
    let cancel_grace = worker.pool.cfg.cancel_grace;
    let (overdue, expired) = {
        let mut driver = worker.driver.locked();
        if driver.closed.is_some() {
            return None;
        }
        // A caller reading the socket itself that was not polled for a whole interval (busy
        // elsewhere, or its future was forgotten) must not stall other calls or heartbeats.
        if driver.direct_reader.is_some() {
            if driver.direct_reader_seen == driver.direct_reader {
                driver.hand_back_reading();
            } else {
                driver.direct_reader_seen = driver.direct_reader;
            }
        }
        let mut overdue = false;
        let mut expired = false;
        for (_, r) in driver.routes.iter_mut().filter(|(_, r)| r.on_wire) {
            match (r.cancelled_at, r.deadline) {
                (Some(at), _) => overdue |= now.duration_since(at) > cancel_grace,
                (None, Some((deadline, _))) => expired |= now >= deadline,
                _ => {}
            }
        }
        (overdue, expired)
    };
    if expired {
        worker.begin_drain(ExitCause::CancelTimeout, cancel_grace);
        let mut driver = worker.driver.locked();
        let c = &mut *driver;
        let mut cancelled = false;
        let mut wakers = Vec::new();
        for (id, r) in c.routes.iter_mut() {
            if let (true, None, Some((deadline, budget))) = (r.on_wire, r.cancelled_at, r.deadline)
            {
                if now >= deadline {
                    // The worker ignored its time budget: answer the caller now, cancel on the wire.
                    r.deliver(
                        Err(Error::DeadlineExceeded(budget)),
                        &mut wakers,
                        &mut ReadClock::at(now),
                        &worker.pool,
                    );
                    r.cancelled_at = Some(now);
                    let _ = c.conn.send_cancel(id, &mut c.out);
                    cancelled = true;
                }
            }
        }
        drop(driver);
        for w in wakers {
            w.wake();
        }
        if cancelled {
            worker.writer_wake.notify_one();
        }
    }
    overdue.then_some(ExitCause::CancelTimeout)
}
