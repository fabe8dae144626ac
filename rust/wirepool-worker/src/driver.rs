//! The I/O loop: handshake, one reader that decodes and dispatches, one writer that coalesces.

use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Notify;
use wirepool_codec::Codec;
use wirepool_proto::{ErrorCode, Event, Hello, MethodInfo, MethodKind, ProtocolError, Welcome};

use crate::error::HandlerError;
use crate::handler_threads::{HandlerThreads, Task};
use crate::remote::ParentWatch;
use crate::sink::RowBatcher;
use crate::state::{send_error, CancelReason, RequestShared, Shared, Terminal};
use crate::transport::Transport;
use crate::worker::{Handler, Method, Worker};
use wirepool_io::outbox::WriteQueue;

/// The environment variable holding the inherited socket's descriptor number.
pub const FD_ENV: &str = "WIREPOOL_FD";

/// Stop reading new frames while this much output waits for the socket (a parent that stops
/// reading cannot make the worker buffer without bound, e.g. with PINGs).
const OUT_HIGH_WATER: usize = 8 << 20;
/// After a drain's grace ran out and handlers were cancelled, how long blocking handlers get to
/// notice before their requests are ended for them.
const CANCEL_GRACE: Duration = Duration::from_millis(200);
/// How long the last frames (GOODBYE, a fatal ERROR) may take to reach a parent that is slow
/// to read before the worker gives up and exits anyway.
const FINAL_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

const GOODBYE_DRAINED: u32 = 0;
/// How long queued blocking work may see no thread start a task before another handler thread is started.
const POOL_MONITOR_TICK: Duration = Duration::from_millis(1);

pub(crate) fn take_inherited_socket() -> io::Result<StdUnixStream> {
    let value = std::env::var(FD_ENV).map_err(|_| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{FD_ENV} is not set: start this worker from a wirepool parent"),
        )
    })?;
    let fd: RawFd = value.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{FD_ENV}={value:?} is not a descriptor number"),
        )
    })?;
    std::env::remove_var(FD_ENV);
    // SAFETY: fcntl on an arbitrary integer is safe; it fails with EBADF if fd is not open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; only the close-on-exec bit changes.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the parent handed this descriptor to this process alone; nothing else owns it.
    Ok(unsafe { StdUnixStream::from_raw_fd(fd) })
}

/// Linux: SIGKILL when the parent dies (spec 8.4: SIGKILL, as a stopped worker ignores
/// SIGTERM). A parent that died between the fork and the `prctl` sends nothing, so the parent's
/// pid is compared before and after; one that died even earlier is caught by EOF.
pub(crate) fn set_parent_death_signal() {
    #[cfg(target_os = "linux")]
    // SAFETY: getppid has no preconditions; prctl(PR_SET_PDEATHSIG) only records a signal number
    // for this process; kill on our own pid has no memory-safety preconditions.
    unsafe {
        let parent = libc::getppid();
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
        if libc::getppid() != parent {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

fn hello_for(worker: &Worker) -> Hello {
    Hello {
        pid: std::process::id(),
        max_concurrency: worker.max_concurrency,
        max_frame_size: worker.max_frame_size,
        methods: worker
            .methods
            .iter()
            .map(|m| MethodInfo {
                name: m.name.clone(),
                kind: m.kind,
                codecs: m.codecs.iter().map(|c| c.id()).collect(),
            })
            .collect(),
        extensions: wirepool_proto::HelloExtensions {
            // The parent's regions this worker maps at once: as much as one message may hold.
            shm: worker.shm_threshold.map(|_| wirepool_proto::shm::ShmOffer {
                window: wirepool_proto::DEFAULT_MAX_MESSAGE_SIZE,
            }),
        },
        ..Hello::new(worker.sdk_name.clone(), env!("CARGO_PKG_VERSION"))
    }
}

/// Descriptors received with the socket's bytes, oldest first, until a SHM_REGION takes one.
#[cfg(target_os = "linux")]
type FdQueue = wirepool_io::shm::DescriptorQueue;

/// Sets the lane up on the core before the HELLO offers it: the mapper that checks and maps
/// each region the parent announces, and the waker that sends releases (PROTOCOL.md 20.7).
#[cfg(target_os = "linux")]
fn set_up_lane(shared: &Arc<Shared>, threshold: usize) -> FdQueue {
    let fds: FdQueue = Arc::default();
    let weak = Arc::downgrade(shared);
    let mut guard = shared.lock();
    guard.shm_threshold = threshold;
    guard
        .conn
        .set_shm_mapper(wirepool_io::shm::descriptor_mapper(Arc::clone(&fds)));
    guard.conn.set_shm_release_waker(Arc::new(move || {
        if let Some(shared) = weak.upgrade() {
            shared.wake_writer.notify_one();
        }
    }));
    fds
}

/// Retires this worker's regions that no result used for `IDLE_RETIRE` (PROTOCOL.md 20.4), so
/// an idle connection holds no shared memory; ends with the connection. While there are no
/// regions it waits for one to be placed, with no timer armed.
#[cfg(target_os = "linux")]
async fn retire_idle_regions(shared: std::sync::Weak<Shared>, placed: Arc<tokio::sync::Notify>) {
    loop {
        let none = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let state = shared.lock();
            if state.closed {
                return;
            }
            state.regions.is_empty()
        };
        if none {
            // A region placed after the check left a permit: this returns at once.
            placed.notified().await;
            continue;
        }
        tokio::time::sleep(wirepool_io::shm::IDLE_RETIRE / 4).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut guard = shared.lock();
        let state = &mut *guard;
        if state.closed {
            return;
        }
        let now = std::time::Instant::now();
        if state
            .regions
            .retire_idle(&mut state.conn, &mut state.out, now)
            > 0
        {
            drop(guard);
            shared.wake_writer.notify_one();
        }
    }
}

fn protocol_io_error(e: ProtocolError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Serves the parent on `socket` until GOODBYE, end of file or an error. `watch` is a remote
/// worker's clock on its parent (PROTOCOL.md 21.5); a remote worker offers no shared memory.
pub(crate) async fn serve(
    mut worker: Worker,
    socket: Transport,
    watch: Option<Arc<ParentWatch>>,
) -> io::Result<()> {
    if watch.is_some() {
        worker.shm_threshold = None;
    }
    let socket = Arc::new(socket);
    let hello = hello_for(&worker);
    let shared = Shared::new();
    #[cfg(feature = "remote")]
    if let Transport::Tls(tls) = &*socket {
        tls.set_writer(&shared);
    }
    if let Some(watch) = &watch {
        tokio::spawn(Arc::clone(watch).run(Arc::clone(&shared)));
    }
    #[cfg(target_os = "linux")]
    let fds = worker.shm_threshold.map(|t| set_up_lane(&shared, t));
    {
        let mut guard = shared.lock();
        let state = &mut *guard;
        state
            .conn
            .send_hello(&hello, state.out.tail())
            .map_err(protocol_io_error)?;
    }
    let writer = tokio::spawn(write_loop(Arc::clone(&shared), Arc::clone(&socket)));
    #[cfg(target_os = "linux")]
    if fds.is_some() {
        tokio::spawn(retire_idle_regions(
            Arc::downgrade(&shared),
            Arc::clone(&shared.region_placed),
        ));
    }
    let mut driver = Driver {
        handler_threads: HandlerThreads::new(worker.max_concurrency as usize),
        methods: worker.methods.into_iter().map(Arc::new).collect(),
        batch_bytes: worker.batch_bytes,
        flush_interval: worker.flush_interval,
        welcome: None,
        shared: Arc::clone(&shared),
        draining: false,
        goodbye: Arc::new(Notify::new()),
        tasks: Vec::new(),
        inline_req: None,
        #[cfg(target_os = "linux")]
        fds,
        watch,
    };
    let outcome = driver.read_loop(&socket).await;
    match &outcome {
        Ok(Exit::ParentGone(why)) => {
            // As after end of file (21.5), saying why.
            eprintln!("wirepool worker: the parent is gone: {why}; exiting");
            driver.cancel_all();
            writer.abort();
        }
        Ok(Exit::Goodbye) => {
            // GOODBYE is queued and the outbox closed: the writer ends once it is written.
            let _ = tokio::time::timeout(FINAL_WRITE_TIMEOUT, writer).await;
        }
        Ok(Exit::Eof) => {
            driver.cancel_all();
            writer.abort();
        }
        Err(e) => {
            driver.cancel_all();
            let fatal = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<ProtocolError>())
                .cloned();
            let sent = fatal.is_some_and(|fatal| {
                let mut guard = shared.lock();
                let state = &mut *guard;
                let ok = !state.closed && state.conn.send_fatal(&fatal, state.out.tail()).is_ok();
                state.closed = true;
                ok
            });
            if sent {
                shared.wake_writer.notify_one();
                let _ = tokio::time::timeout(FINAL_WRITE_TIMEOUT, writer).await;
            } else {
                writer.abort();
            }
        }
    }
    outcome.map(|_| ())
}

enum Exit {
    Goodbye,
    Eof,
    /// A remote worker's clock found its parent silent (PROTOCOL.md 21.5).
    ParentGone(String),
}

struct Driver {
    handler_threads: HandlerThreads,
    methods: Vec<Arc<Method>>,
    batch_bytes: usize,
    flush_interval: Duration,
    /// Set once the handshake completes.
    welcome: Option<Welcome>,
    shared: Arc<Shared>,
    draining: bool,
    /// Set by the drain task once GOODBYE is queued.
    goodbye: Arc<Notify>,
    /// Blocking handlers of the current read, handed to the handler threads together.
    tasks: Vec<Task>,
    /// The state of the last inline request, reused by the next one.
    inline_req: Option<Arc<RequestShared>>,
    /// The descriptors received, when this worker offered the shared-memory lane (it then
    /// reads with `recvmsg` from its HELLO on, PROTOCOL.md 20.5).
    #[cfg(target_os = "linux")]
    fds: Option<FdQueue>,
    /// A remote worker's watch on its parent.
    watch: Option<Arc<ParentWatch>>,
}

/// Resolves when a remote worker's parent is judged gone; never for a local one.
async fn parent_gone(watch: Option<&ParentWatch>) -> String {
    match watch {
        Some(watch) => watch.gone().await,
        None => std::future::pending().await,
    }
}

impl Driver {
    async fn read_loop(&mut self, socket: &Transport) -> io::Result<Exit> {
        let mut events = Vec::new();
        let mut spare = bytes::BytesMut::with_capacity(64 * 1024);
        let watch = self.watch.clone();
        loop {
            loop {
                let drained = self.shared.out_drained.notified();
                tokio::pin!(drained);
                drained.as_mut().enable();
                if self.shared.lock().out.len() <= OUT_HIGH_WATER {
                    break;
                }
                tokio::select! {
                    _ = drained => {}
                    _ = self.goodbye.notified() => return Ok(Exit::Goodbye),
                    why = parent_gone(watch.as_deref()) => return Ok(Exit::ParentGone(why)),
                }
            }
            // The core owns the receive buffer; borrow it for the read so the lock is not held
            // across the await (handler threads keep sending meanwhile). An empty spare takes
            // its place meanwhile; it already has the room `read_buffer` reserves, so lending and
            // returning allocate nothing.
            let mut buf = std::mem::replace(
                self.shared.lock().conn.read_buffer(),
                std::mem::take(&mut spare),
            );
            #[cfg(target_os = "linux")]
            let mut received = Vec::new();
            let read = tokio::select! {
                read = std::future::poll_fn(|cx| {
                    #[cfg(target_os = "linux")]
                    if self.fds.is_some() {
                        return socket.poll_read_buf_fds(cx, &mut buf, &mut received);
                    }
                    socket.poll_read_buf(cx, &mut buf)
                }) => read,
                _ = self.goodbye.notified() => return Ok(Exit::Goodbye),
                why = parent_gone(watch.as_deref()) => return Ok(Exit::ParentGone(why)),
            };
            #[cfg(target_os = "linux")]
            if let Err(e) = &read {
                if let Some(violation) = wirepool_io::shm::protocol_error(e) {
                    return Err(protocol_io_error(violation.clone()));
                }
            }
            let eof = {
                let mut state = self.shared.lock();
                std::mem::swap(state.conn.read_buffer(), &mut buf);
                spare = buf;
                #[cfg(target_os = "linux")]
                if let (Some(queue), false) = (&self.fds, received.is_empty()) {
                    state.conn.shm_descriptors_received(received.len());
                    queue
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend(received);
                }
                match read {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => true,
                    Err(e) => return Err(e),
                }
            };
            if eof {
                // A parent that died mid-frame leaves a truncated frame: it is gone either way.
                let _ = self.shared.lock().conn.end_of_input();
                return Ok(Exit::Eof);
            }
            let violation = {
                let mut state = self.shared.lock();
                // What this read's frames produce (inline results, PONGs, refusals) is flushed
                // by `end_pass` below, so it need not wake the writer task.
                state.reader_flushes = true;
                // On a violation, act on what arrived before it, then report it.
                state.conn.next_events(&mut events).err()
            };
            let handled = events.drain(..).try_for_each(|event| self.on_event(event));
            self.end_pass(socket);
            handled?;
            if let Some(e) = violation {
                return Err(protocol_io_error(e));
            }
            if self.handler_threads.submit(&mut self.tasks) {
                let threads = self.handler_threads.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(POOL_MONITOR_TICK).await;
                        if !threads.check_progress() {
                            break;
                        }
                    }
                });
            }
        }
    }

    /// Ends the handling of one read: what it queued is written now, in one write from this
    /// task, when the writer task is idle (the latency path of one call at a time: no task
    /// switch before the answer leaves); anything left over goes to the writer task.
    fn end_pass(&self, socket: &Transport) {
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        state.reader_flushes = false;
        if state.out.is_empty() {
            return;
        }
        if !state.writer_busy && !state.closed {
            if let Some(tail) = state.out.tail_only() {
                // WouldBlock (or a broken socket) leaves the bytes for the writer task.
                if let Ok(n) = socket.try_write(tail) {
                    if n == tail.len() {
                        tail.clear();
                    } else {
                        bytes::Buf::advance(tail, n);
                    }
                }
            }
        }
        // TLS records the socket did not take are the writer's to send.
        let wake = !state.out.is_empty() || socket.has_pending_output();
        drop(guard);
        if wake {
            self.shared.wake_writer.notify_one();
        }
    }

    fn on_event(&mut self, event: Event) -> io::Result<()> {
        match event {
            Event::Welcome(welcome) => {
                if let Some(watch) = &self.watch {
                    watch.welcome(welcome.heartbeat_ms);
                }
                self.welcome = Some(welcome);
            }
            Event::Pong { nonce } => {
                if let Some(watch) = &self.watch {
                    watch.pong(nonce);
                }
            }
            Event::Request {
                id,
                method,
                codec,
                timeout_us,
                body,
            } => self.admit(id, method, codec, timeout_us, body),
            Event::Reject { id, code } => {
                let message = match code {
                    ErrorCode::UnknownMethod => "no method with this index".to_owned(),
                    ErrorCode::CodecUnsupported => {
                        "the method does not accept this codec".to_owned()
                    }
                    ErrorCode::Overloaded => format!(
                        "{} requests already in flight",
                        self.welcome.map_or(0, |w| w.max_in_flight)
                    ),
                    ErrorCode::Draining => "the worker is draining".to_owned(),
                    other => other.name().to_lowercase().replace('_', " "),
                };
                self.reject(id, code, message);
            }
            Event::Cancel { id } => {
                let req = self.shared.lock().requests.get(&id).cloned();
                if let Some(req) = req {
                    req.cancel(CancelReason::Parent);
                }
            }
            Event::Credit { id, .. } => {
                let stream = self.shared.lock().streams.get(&id).cloned();
                if let Some(stream) = stream {
                    stream.wake();
                }
            }
            Event::Ping { nonce } => {
                let mut guard = self.shared.lock();
                let state = &mut *guard;
                let wake = state.writer_needs_wake();
                // Ahead of what is queued, at the writer's next frame boundary (8.5).
                if !state.closed && state.conn.send_pong(nonce, state.out.urgent()).is_ok() && wake
                {
                    drop(guard);
                    self.shared.wake_writer.notify_one();
                }
            }
            Event::Drain { grace_ms } => self.start_drain(Duration::from_millis(grace_ms.into())),
            Event::Error { code, message, .. } => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!("the parent closed the connection with error {code}: {message}"),
                ));
            }
            // Late frames for finished requests, and parent-only events.
            _ => {}
        }
        Ok(())
    }

    /// Answer a request that will not run.
    fn reject(&self, id: u64, code: ErrorCode, message: String) {
        let mut state = self.shared.lock();
        if state.closed {
            return;
        }
        let wake = state.writer_needs_wake();
        let _ = send_error(&mut state, id, &HandlerError::protocol(code, message));
        drop(state);
        if wake {
            self.shared.wake_writer.notify_one();
        }
    }

    fn admit(&mut self, id: u64, method: u16, codec: u8, timeout_us: u64, body: Bytes) {
        // The core checked the method index, codec, drain and in-flight limit.
        let Some(m) = self.methods.get(usize::from(method)).cloned() else {
            return;
        };
        let Some(codec) = Codec::from_id(codec) else {
            return;
        };
        let (max_frame_size, initial_credit) = self.welcome.map_or(
            (
                wirepool_proto::DEFAULT_MAX_FRAME_SIZE,
                wirepool_proto::DEFAULT_INITIAL_CREDIT,
            ),
            |w| (w.max_frame_size, w.initial_credit),
        );
        // The budget counts from the REQUEST event (this read; spec 2); no clock read for
        // requests without one. Any u64 is valid: a deadline past the clock's range is none.
        let deadline = (timeout_us > 0)
            .then(|| Instant::now().checked_add(Duration::from_micros(timeout_us)))
            .flatten();
        let stream = (m.kind == MethodKind::Stream).then(|| {
            Arc::new(RowBatcher::new(
                id,
                codec,
                max_frame_size,
                // The core's rule (PROTOCOL.md 14.5), the same in every SDK.
                wirepool_proto::rows_batch_bytes(self.batch_bytes, initial_credit, max_frame_size),
                Arc::clone(&self.shared),
            ))
        });
        if let Handler::Inline(run) = &m.handler {
            // No map entry and no timer: the handler runs to its end right here, before the
            // reader looks at another frame, so no CANCEL or timer could reach it meanwhile.
            let mut req = match self.inline_req.take() {
                Some(mut req) => {
                    Arc::get_mut(&mut req)
                        .expect("kept only while unshared")
                        .reuse(id, codec, deadline);
                    req
                }
                None => Arc::new(RequestShared::new(
                    id,
                    codec,
                    deadline,
                    Arc::clone(&self.shared),
                    None,
                    true,
                )),
            };
            run(&req, body);
            // A handler that kept a clone of its `Context` keeps that state; take a fresh one.
            if Arc::get_mut(&mut req).is_some() {
                self.inline_req = Some(req);
            }
            return;
        }
        let req = Arc::new(RequestShared::new(
            id,
            codec,
            deadline,
            Arc::clone(&self.shared),
            stream.clone(),
            false,
        ));
        {
            let mut state = self.shared.lock();
            state.requests.insert(id, Arc::clone(&req));
            if let Some(stream) = &stream {
                state.streams.insert(id, Arc::clone(stream));
            }
        }
        if let Some(deadline) = deadline {
            let req = Arc::clone(&req);
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline.into()) => {
                        // Spec 8.3: the request ends when its budget runs out, whether or not
                        // its handler notices (a CANCEL seen first keeps its code); what the
                        // handler returns later is dropped by `finish`.
                        req.cancel(CancelReason::Deadline);
                        let e = req.cancel_error().unwrap_or_else(|| {
                            HandlerError::protocol(ErrorCode::DeadlineExceeded, "the request's time budget ran out")
                        });
                        req.shared.finish(&req, Terminal::Error(e));
                    }
                    _ = req.token.cancelled() => {}
                }
            });
        }
        if let Some(stream) = stream {
            tokio::spawn(stream.run_flush_timer(Arc::clone(&req), self.flush_interval));
        }
        match &m.handler {
            Handler::Blocking(run) => {
                let run = Arc::clone(run);
                self.tasks.push(Box::new(move || run(req, body)));
            }
            Handler::Inline(_) => unreachable!("inline handlers return above"),
            Handler::Async(run) => {
                // Most calls of a trivial async handler complete on their first poll: run that
                // poll here and spawn a task only for a handler that really waits. A waker
                // registered during this poll is replaced when the task polls it again.
                let mut handler = run(req, body);
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                if handler.as_mut().poll(&mut cx).is_pending() {
                    tokio::spawn(handler);
                }
            }
        }
    }

    fn start_drain(&mut self, grace: Duration) {
        if self.draining {
            return;
        }
        self.draining = true;
        self.shared
            .draining
            .store(true, std::sync::atomic::Ordering::Release);
        let shared = Arc::clone(&self.shared);
        let goodbye = Arc::clone(&self.goodbye);
        tokio::spawn(async move {
            let all_ended = |shared: &Shared| shared.lock().requests.is_empty();
            let grace_end = tokio::time::Instant::now() + grace;
            if !wait_until(&shared, grace_end, all_ended).await {
                cancel_requests(&shared);
                let cancel_end = tokio::time::Instant::now() + CANCEL_GRACE;
                if !wait_until(&shared, cancel_end, all_ended).await {
                    // Blocking handlers that ignore cancellation: their requests end here; the
                    // threads stop when the process exits.
                    let left: Vec<_> = shared.lock().requests.values().cloned().collect();
                    for req in left {
                        shared.finish(
                            &req,
                            Terminal::Error(req.cancel_error().unwrap_or_else(|| {
                                HandlerError::protocol(ErrorCode::Cancelled, "cancelled by drain")
                            })),
                        );
                    }
                }
            }
            {
                let mut guard = shared.lock();
                let state = &mut *guard;
                let _ = state.conn.send_goodbye(GOODBYE_DRAINED, state.out.tail());
                state.closed = true;
            }
            shared.wake_writer.notify_one();
            goodbye.notify_one();
        });
    }

    fn cancel_all(&self) {
        cancel_requests(&self.shared);
    }
}

fn cancel_requests(shared: &Shared) {
    let reqs: Vec<Arc<RequestShared>> = shared.lock().requests.values().cloned().collect();
    for req in reqs {
        req.cancel(CancelReason::Parent);
    }
}

/// Wait until `done` holds or `until` passes; returns whether `done` held.
async fn wait_until(
    shared: &Shared,
    until: tokio::time::Instant,
    done: impl Fn(&Shared) -> bool,
) -> bool {
    loop {
        let ended = shared.request_ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if done(shared) {
            return true;
        }
        tokio::select! {
            _ = ended => {}
            _ = tokio::time::sleep_until(until) => return done(shared),
        }
    }
}

async fn write_loop(shared: Arc<Shared>, socket: Arc<Transport>) -> io::Result<()> {
    let mut queue = WriteQueue::default();
    loop {
        let closed = {
            let mut guard = shared.lock();
            let state = &mut *guard;
            // Views of request bodies the handlers dropped: their ranges go back to the parent.
            if state.conn.has_shm_releases() && !state.closed {
                state.conn.send_shm_releases(&mut state.out);
            }
            // The reader waits while more than OUT_HIGH_WATER waits in the outbox: taken, it
            // reads on at once (PINGs among its frames must be answered, 8.5), not only when
            // all of it was written.
            let reader_waits = state.out.len() > OUT_HIGH_WATER;
            state.out.take_into(&mut queue);
            state.writer_busy = !queue.is_empty();
            if reader_waits {
                shared.out_drained.notify_waiters();
            }
            state.closed
        };
        if queue.is_empty() {
            // TLS records encrypted but not yet taken by the socket go before the writer sleeps.
            while socket.has_pending_output() {
                match socket.flush_pending() {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => socket.writable().await?,
                    Err(e) => return Err(e),
                }
            }
            if closed {
                let _ = socket.shutdown_write();
                return Ok(());
            }
            shared.out_drained.notify_waiters();
            shared.wake_writer.notified().await;
            continue;
        }
        while !queue.is_empty() {
            let mut fds_sent = 0;
            let written = match queue.with_slices_and_fds(|slices, fds| {
                fds_sent = fds.len();
                if fds.is_empty() {
                    socket.try_write_vectored(slices)
                } else {
                    write_with_fds(&socket, slices, fds)
                }
            }) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    socket.writable().await?;
                    take_between_writes(&shared, &mut queue);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if written == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            queue.advance_fds(written, fds_sent);
            // A long output (a large RESULT, or a full socket): a PONG or PING queued since
            // goes at its next frame boundary, not after all of it (PROTOCOL.md 8.5). The
            // usual write takes everything and skips this.
            if !queue.is_empty() {
                take_between_writes(&shared, &mut queue);
            }
        }
    }
}

/// Between two writes of a long output: urgent frames go to its next frame boundary, and an
/// outbox above OUT_HIGH_WATER (another large message, queued meanwhile) joins the queue, so
/// that the reader, which waits for that, reads on and answers PINGs instead of waiting for all
/// of the output ahead to be written. What the outbox holds is mostly handlers' bodies queued
/// by reference: taking it costs no memory; the queue stays bounded by the requests in flight.
fn take_between_writes(shared: &Shared, queue: &mut WriteQueue) {
    let mut state = shared.lock();
    if state.out.len() > OUT_HIGH_WATER {
        state.out.take_into(queue);
        drop(state);
        shared.out_drained.notify_waiters();
    } else {
        state.out.take_urgent_into(queue);
    }
}

#[cfg(target_os = "linux")]
fn write_with_fds(
    socket: &Transport,
    slices: &[std::io::IoSlice<'_>],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<usize> {
    socket.try_write_vectored_fds(slices, fds)
}

#[cfg(not(target_os = "linux"))]
fn write_with_fds(
    socket: &Transport,
    slices: &[std::io::IoSlice<'_>],
    _fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<usize> {
    socket.try_write_vectored(slices)
}
