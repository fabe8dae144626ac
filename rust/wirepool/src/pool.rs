//! The pool: builder, least-loaded dispatch, unary calls, streams, leases, supervision of the
//! worker slots (restart with backoff and intensity limit, recycling), shutdown, metrics.

use crate::lock::{Locked, RwLocked};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;
use wirepool_codec::Codec;

use crate::config::{
    MethodKind, MethodSpec, PoolConfig, RecyclePolicy, RestartPolicy, RetryPolicy,
};
use crate::error::{codes, Error, ExitCause, Result};
use crate::events::EventSender;
use crate::metrics::{
    code_name, LatencyHistogram, PoolMetrics, SlotCounters, WorkerMetrics, WorkerState,
};
use crate::spawn::{self, WorkerCommand, WorkerOutput};
use crate::stream::{Resend, RowQueue, RowStream, StreamRetry};
use crate::worker::{self, Awaiting, Incarnation, NotSent, PoolShared, Worker, WorkerRequest};

/// Options of one call or stream.
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    /// Time budget, sent to the worker (`timeout_us`) and enforced by the parent too (plus a
    /// grace): the call then fails with `DEADLINE_EXCEEDED`.
    pub timeout: Option<Duration>,
    /// Codec for this call; default: the method's configured codec, else the pool's.
    pub codec: Option<Codec>,
    /// Where this call's progress events go (see [`event_channel`](crate::event_channel));
    /// default: the pool's mailbox ([`PoolBuilder::events`]), else they are only logged
    /// (`tracing` target `wirepool::event`, debug level).
    pub events: Option<EventSender>,
    /// Whether this call may be sent again when its worker dies (PROTOCOL.md 21.7):
    /// `Some(true)` marks it idempotent, `Some(false)` never sends it again; default: what the
    /// pool's [`RetryPolicy`] says of its method.
    pub idempotent: Option<bool>,
}

impl CallOptions {
    /// Options with a time budget.
    pub fn timeout(timeout: Duration) -> Self {
        CallOptions {
            timeout: Some(timeout),
            ..Default::default()
        }
    }
}

/// Builds and starts a [`Pool`].
///
/// ```no_run
/// # async fn demo() -> wirepool::Result<()> {
/// use std::time::Duration;
/// use wirepool::{MethodKind, Pool, WorkerCommand};
///
/// let pool = Pool::builder(WorkerCommand::new("./my_worker"))
///     .workers(2)
///     .max_in_flight(64)
///     .startup_timeout(Duration::from_secs(5))
///     .require_method("add", MethodKind::Unary)
///     .start()
///     .await?;
/// let sum: i64 = pool.call("add", &(2, 3)).await?;
/// assert_eq!(sum, 5);
/// pool.shutdown().await;
/// # Ok(()) }
/// ```
pub struct PoolBuilder {
    cfg: PoolConfig,
}

impl PoolBuilder {
    /// Number of worker processes (default: the number of CPUs; 1 - 4,096 with the added
    /// ones, else `start` fails with `INVALID_ARGUMENT`).
    pub fn workers(mut self, n: usize) -> Self {
        self.cfg.workers = n;
        self
    }
    /// Most requests in flight on one worker (default 64, the worker SDKs' default offer). A
    /// worker whose HELLO offers fewer (`max_concurrency`) gets its offer, and the pool logs the
    /// clamp once (PROTOCOL.md 4.2).
    ///
    /// At least 1, else `start` fails with `INVALID_ARGUMENT`.
    pub fn max_in_flight(mut self, n: u32) -> Self {
        self.cfg.max_in_flight = n;
        self
    }
    /// How long a worker may take to say HELLO (default 10 s; 1 ms - `max_timeout_ms`).
    pub fn startup_timeout(mut self, d: Duration) -> Self {
        self.cfg.startup_timeout = d;
        self
    }
    /// The default codec of calls (default JSON).
    pub fn codec(mut self, codec: Codec) -> Self {
        self.cfg.codec = codec;
        self
    }
    /// Declares a method the pool will call with the default codec: workers lacking it are
    /// refused at start-up with `CODEC_MISMATCH`.
    pub fn require_method(mut self, name: impl Into<String>, kind: MethodKind) -> Self {
        self.cfg.methods.push(MethodSpec {
            name: name.into(),
            kind,
            codec: None,
        });
        self
    }
    /// Declares a method with its own codec.
    pub fn require_method_with_codec(
        mut self,
        name: impl Into<String>,
        kind: MethodKind,
        codec: Codec,
    ) -> Self {
        self.cfg.methods.push(MethodSpec {
            name: name.into(),
            kind,
            codec: Some(codec),
        });
        self
    }
    /// Heartbeat interval (default 1 s; zero disables). Liveness is progress, not bytes: a
    /// worker is killed and its requests end with `WORKER_HUNG` when a PING stays unanswered,
    /// or one frame stays incomplete, for three intervals, whatever else it sends meanwhile.
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.cfg.heartbeat = d;
        self
    }
    /// How long a cancelled request may take to end before its worker is killed (default 2 s).
    pub fn cancel_grace(mut self, d: Duration) -> Self {
        self.cfg.cancel_grace = d;
        self
    }
    /// Extra time past a call's timeout before the parent gives up on the worker's answer
    /// (default 500 ms).
    pub fn deadline_grace(mut self, d: Duration) -> Self {
        self.cfg.deadline_grace = d;
        self
    }
    /// How long draining workers (recycling, shutdown) may finish in-flight work (default 10 s).
    pub fn drain_grace(mut self, d: Duration) -> Self {
        self.cfg.drain_grace = d;
        self
    }
    /// Crash restart policy.
    pub fn restart_policy(mut self, p: RestartPolicy) -> Self {
        self.cfg.restart = p;
        self
    }
    /// Recycling policy.
    pub fn recycle_policy(mut self, p: RecyclePolicy) -> Self {
        self.cfg.recycle = p;
        self
    }
    /// Which calls may be sent again after their worker died (default: none; PROTOCOL.md
    /// 21.7): requests of the methods the policy marks idempotent that end with
    /// `WORKER_EXITED` or `WORKER_HUNG`, at most `attempts` tries in all, within their
    /// deadline, preferably on another worker. See [`RetryPolicy`].
    ///
    /// ```no_run
    /// # async fn demo() -> wirepool::Result<()> {
    /// use wirepool::{Pool, RetryPolicy, WorkerCommand};
    /// let pool = Pool::builder(WorkerCommand::new("./my_worker"))
    ///     .workers(2)
    ///     .retry(RetryPolicy::idempotent(["add", "get"]).attempts(3))
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.cfg.retry = policy;
        self
    }
    /// Largest frame payload (default 4 MiB, so a 1 MiB payload fits one frame; 64 KiB - 16
    /// MiB, else `start` fails with `INVALID_ARGUMENT`).
    pub fn max_frame_size(mut self, bytes: u32) -> Self {
        self.cfg.max_frame_size = bytes;
        self
    }
    /// Largest message (a request, result or stream summary) in bytes, across its frames
    /// (default 1 GiB; `max_frame_size` - 2^53 - 1). A request above it is refused locally with
    /// `MESSAGE_TOO_LARGE`, before anything is sent.
    pub fn max_message_size(mut self, bytes: u64) -> Self {
        self.cfg.max_message_size = bytes;
        self
    }
    /// The shared-memory lane (PROTOCOL.md 20, Linux; default `Some(1 MiB)`, `None` turns it
    /// off): accepted when a worker offers it, so request bodies of at least `threshold` bytes
    /// go to the worker through a memory region instead of the socket, and the worker's large
    /// results come back the same way, received as zero-copy views (the `Bytes` of a result
    /// holds its range until dropped). Each direction maps at most `max_message_size` bytes of
    /// the other side's regions; a region is kept for reuse while bodies go into it and retired
    /// on both sides after 1 s unused (`shm_idle_retire`), so an idle pool holds no shared memory.
    /// Measured through this pool (`examples/shm_lane_pool.rs`): one-way 1 MiB 2.6x, 16 MiB
    /// 4.4x, 256 MiB 2.6x the socket path, capped by the sender's copy into the region.
    ///
    /// ```no_run
    /// # let builder = wirepool::Pool::builder(wirepool::WorkerCommand::new("my-worker"));
    /// let builder = builder.shm_lane(Some(1 << 20));
    /// ```
    pub fn shm_lane(mut self, threshold: Option<usize>) -> Self {
        self.cfg.shm_threshold = threshold
            .filter(|_| cfg!(target_os = "linux"))
            .map(|t| t.max(1));
        self
    }
    /// Credit window of each stream in bytes (default 1 MiB; 1 - 2^31 - 1): bounds the rows
    /// buffered per stream.
    pub fn stream_window(mut self, bytes: u32) -> Self {
        self.cfg.initial_credit = bytes;
        self
    }
    /// The pool-wide mailbox for progress events: events of calls that have no mailbox of
    /// their own ([`CallOptions::events`]) and connection-level events (request id 0).
    ///
    /// ```no_run
    /// # async fn demo() -> wirepool::Result<()> {
    /// use wirepool::{event_channel, Pool, WorkerCommand};
    /// let (events, mut rx) = event_channel(64);
    /// let pool = Pool::builder(WorkerCommand::new("./my_worker")).events(events).start().await?;
    /// tokio::spawn(async move {
    ///     while let Some(e) = rx.recv().await {
    ///         println!("worker {} request {}: {} {}", e.worker_id, e.request_id, e.topic, e.data);
    ///     }
    /// });
    /// # Ok(()) }
    /// ```
    pub fn events(mut self, sender: EventSender) -> Self {
        self.cfg.events = Some(sender);
        self
    }
    /// Lines of each worker's stderr kept for error reports (default 20).
    pub fn stderr_tail_lines(mut self, n: usize) -> Self {
        self.cfg.stderr_tail_lines = n;
        self
    }
    /// What becomes of the workers' stdout and stderr (default [`WorkerOutput::Log`]: each line
    /// to `tracing` at WARN with the worker's id and pid; `Inherit`: the parent's own streams,
    /// no stderr tail; `Discard`: dropped, the stderr tail kept).
    ///
    /// ```no_run
    /// # async fn demo() -> wirepool::Result<()> {
    /// use wirepool::{Pool, WorkerCommand, WorkerOutput};
    ///
    /// // The workers' prints appear on this process's own terminal, unprefixed.
    /// let pool = Pool::builder(WorkerCommand::new("./my_worker"))
    ///     .worker_output(WorkerOutput::Inherit)
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn worker_output(mut self, output: WorkerOutput) -> Self {
        self.cfg.worker_output = output;
        self
    }

    /// Where the pool's `workers` slots run (default [`Launcher::local`](crate::remote::Launcher::local)):
    /// for example children that join over TLS with a ticket
    /// ([`Launcher::subprocess`](crate::remote::Launcher::subprocess)), or workers started by
    /// anything else ([`Launcher::external`](crate::remote::Launcher::external)). Remote workers
    /// join the pool's listener ([`listen`](Self::listen)); from their HELLO on they are served
    /// like local ones, and their restarts and recycling are the pool's.
    ///
    /// ```no_run
    /// # async fn demo() -> wirepool::Result<()> {
    /// use wirepool::remote::Launcher;
    /// use wirepool::{Pool, WorkerCommand};
    /// let pool = Pool::builder(WorkerCommand::new("./my_worker"))
    ///     .workers(2)
    ///     .launcher(Launcher::subprocess())
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "remote")]
    pub fn launcher(mut self, launcher: crate::remote::Launcher) -> Self {
        self.cfg.launcher = launcher;
        self
    }
    /// Adds `n` slots whose workers `launcher` places, beside the [`workers`](Self::workers)
    /// ones: a pool can mix local and remote workers. Calls go to the least loaded worker
    /// wherever it runs; [`Pool::metrics`] says where each one does (`host`, `pid`).
    ///
    /// ```no_run
    /// # async fn demo() -> wirepool::Result<()> {
    /// use wirepool::remote::Launcher;
    /// use wirepool::{Pool, WorkerCommand};
    /// // Two local workers and two that join over TLS.
    /// let pool = Pool::builder(WorkerCommand::new("./my_worker"))
    ///     .workers(2)
    ///     .add_workers(2, Launcher::subprocess())
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "remote")]
    pub fn add_workers(mut self, n: usize, launcher: crate::remote::Launcher) -> Self {
        if n > 0 {
            self.cfg.added.push((n, launcher));
        }
        self
    }
    /// How the pool's own listener listens, when any slot has a remote launcher (default:
    /// TLS on 127.0.0.1, a free port; [`ListenerOptions`](crate::remote::ListenerOptions)).
    #[cfg(feature = "remote")]
    pub fn listen(mut self, options: crate::remote::ListenerOptions) -> Self {
        self.cfg.listen = options;
        self
    }
    /// A listener started before the pool (its tickets can be handed out before the pool
    /// waits for its workers), instead of one of the pool's own.
    #[cfg(feature = "remote")]
    pub fn listener(mut self, listener: crate::remote::Listener) -> Self {
        self.cfg.listener = Some(listener);
        self
    }

    /// Checks every option (PROTOCOL.md 22.2: a value out of its range is `INVALID_ARGUMENT`,
    /// before anything is spawned), then spawns every worker and completes their handshakes.
    /// Fails, with every spawned process
    /// killed and reaped, if any worker cannot start (`SPAWN_FAILED`, `STARTUP_TIMEOUT`,
    /// `CODEC_MISMATCH`, `WORKER_EXITED`, `PROTOCOL_VIOLATION`).
    ///
    /// Must be called within a tokio runtime (with the `time`, `net` and `process` drivers).
    pub async fn start(self) -> Result<Pool> {
        Pool::start(self.cfg).await
    }
}

/// A supervised pool of worker processes. Cheap to clone; all clones share the workers.
///
/// Dropping the last clone kills the workers; call [`shutdown`](Pool::shutdown) to drain them.
#[derive(Clone)]
pub struct Pool {
    pub(crate) inner: Arc<PoolInner>,
    _guard: Arc<DropGuard>,
}

struct DropGuard(Arc<PoolInner>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.closed.store(true, SeqCst);
        self.0.shared.notify_state_changed();
        for w in self.0.live.locked().values() {
            w.kill_now();
        }
    }
}

struct Slot {
    counters: Arc<SlotCounters>,
    causes: Mutex<BTreeMap<String, u64>>,
    current: Mutex<Option<Arc<Worker>>>,
    state: Mutex<WorkerState>,
}

pub(crate) struct PoolInner {
    pub(crate) shared: Arc<PoolShared>,
    slots: Vec<Slot>,
    /// The workers taking traffic, read by every dispatch; replaced as a whole on change.
    ready: RwLock<Arc<Vec<Arc<Worker>>>>,
    /// Every incarnation whose process is not yet reaped (including draining ones).
    live: Mutex<HashMap<u32, Arc<Worker>>>,
    live_changed: Notify,
    /// Incarnations being spawned or in their handshake (not yet in `live`).
    starting: AtomicUsize,
    closed: AtomicBool,
    close_reason: OnceLock<&'static str>,
    next_worker_id: AtomicU32,
    crash_times: Mutex<VecDeque<Instant>>,
    rotate: AtomicUsize,
    /// Waits in `acquire` for a worker with room (only those that waited: the requests sent
    /// without waiting count as 0 in the snapshot).
    queue_wait: LatencyHistogram,
}

impl Pool {
    /// A builder for a pool running `command`.
    pub fn builder(command: WorkerCommand) -> PoolBuilder {
        PoolBuilder {
            cfg: PoolConfig::new(command),
        }
    }

    async fn start(cfg: PoolConfig) -> Result<Pool> {
        crate::validate::pool_options(&cfg)?;
        #[cfg(feature = "remote")]
        let (cfg, listener) = open_remote(cfg).await?;
        let n = cfg.workers;
        let shared = Arc::new(PoolShared {
            #[cfg(feature = "remote")]
            listener,
            cfg,
            capacity: Notify::new(),
            slot_waiters: AtomicUsize::new(0),
            state_changed: Notify::new(),
            epoch: Instant::now(),
            methods: OnceLock::new(),
            errors: Mutex::new(BTreeMap::new()),
        });
        let inner = Arc::new(PoolInner {
            shared: shared.clone(),
            slots: (0..n)
                .map(|_| Slot {
                    counters: Arc::new(SlotCounters::default()),
                    causes: Mutex::new(BTreeMap::new()),
                    current: Mutex::new(None),
                    state: Mutex::new(WorkerState::Starting),
                })
                .collect(),
            ready: RwLock::new(Arc::new(Vec::new())),
            live: Mutex::new(HashMap::new()),
            live_changed: Notify::new(),
            starting: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            close_reason: OnceLock::new(),
            next_worker_id: AtomicU32::new(1),
            crash_times: Mutex::new(VecDeque::new()),
            rotate: AtomicUsize::new(0),
            queue_wait: LatencyHistogram::new(),
        });
        // The first worker defines the method table; the others start together after it.
        let mut first = Vec::with_capacity(n);
        match inner.start_incarnation(0).await {
            Ok(inc) => first.push(inc),
            Err(e) => return Err(e),
        }
        let rest = futures_join_all((1..n).map(|slot| {
            let inner = inner.clone();
            async move { inner.start_incarnation(slot).await }
        }))
        .await;
        let mut failure = None;
        for r in rest {
            match r {
                Ok(inc) => first.push(inc),
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failure {
            inner.closed.store(true, SeqCst);
            for inc in first {
                inc.worker.kill(ExitCause::Shutdown);
                let _ = inc.lifecycle.await;
            }
            return Err(e);
        }
        for (slot, inc) in first.into_iter().enumerate() {
            tokio::spawn(run_slot(inner.clone(), slot, Some(inc)));
        }
        Ok(Pool {
            _guard: Arc::new(DropGuard(inner.clone())),
            inner,
        })
    }

    /// Calls a unary method on the least-loaded worker and decodes its result.
    ///
    /// Dropping the returned future before it completes cancels the request on the worker.
    pub async fn call<Req, Resp>(&self, method: &str, req: &Req) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned + 'static,
    {
        self.call_with(method, req, CallOptions::default()).await
    }

    /// [`call`](Self::call) with a timeout or codec.
    pub async fn call_with<Req, Resp>(
        &self,
        method: &str,
        req: &Req,
        opts: CallOptions,
    ) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned + 'static,
    {
        let timeout = crate::validate::call_timeout(opts.timeout)?;
        let (method_no, codec) = self.inner.resolve(method, opts.codec)?;
        let body = encode(codec, req)?;
        let result = self
            .inner
            .unary(
                None,
                method_no,
                codec,
                timeout,
                body,
                opts.events.as_ref(),
                opts.idempotent,
            )
            .await?;
        decode_result(codec, result)
    }

    /// Calls a unary method with raw bytes in and out (codec 0), without copying the result.
    pub async fn call_raw(&self, method: &str, body: Bytes) -> Result<Bytes> {
        let (method_no, _) = self.inner.resolve(method, Some(Codec::Raw))?;
        self.inner
            .unary(None, method_no, Codec::Raw, None, body, None, None)
            .await
    }

    /// Starts a stream on the least-loaded worker. Rows are decoded lazily as you read them,
    /// and credit is granted as you read, so memory stays bounded by the stream window.
    pub async fn stream<Req, Row>(&self, method: &str, req: &Req) -> Result<RowStream<Row>>
    where
        Req: Serialize + ?Sized,
    {
        self.stream_with(method, req, CallOptions::default()).await
    }

    /// [`stream`](Self::stream) with a timeout or codec.
    pub async fn stream_with<Req, Row>(
        &self,
        method: &str,
        req: &Req,
        opts: CallOptions,
    ) -> Result<RowStream<Row>>
    where
        Req: Serialize + ?Sized,
    {
        let timeout = crate::validate::call_timeout(opts.timeout)?;
        let (method_no, codec) = self.inner.resolve(method, opts.codec)?;
        let body = encode(codec, req)?;
        self.inner
            .open_stream(
                None,
                method_no,
                codec,
                timeout,
                body,
                opts.events.as_ref(),
                opts.idempotent,
            )
            .await
    }

    /// Takes a worker for exclusive use by a sequence of calls (its session state and caches
    /// stay warm); the other workers keep serving the pool. If the worker dies, calls on the
    /// lease fail with `LEASE_LOST`.
    pub async fn lease(&self) -> Result<Lease> {
        loop {
            let notified = self.inner.shared.state_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.inner.check_open()?;
            let ready = self.inner.ready.read_locked().clone();
            let mut best: Option<&Arc<Worker>> = None;
            for w in ready.iter() {
                if w.state() == WorkerState::Ready
                    && best.is_none_or(|b| w.in_flight() < b.in_flight())
                {
                    best = Some(w);
                }
            }
            if let Some(w) = best {
                if w.try_lease() {
                    return Ok(Lease {
                        pool: self.clone(),
                        worker: w.clone(),
                    });
                }
                continue;
            }
            notified.await;
        }
    }

    /// Drains every worker (in-flight requests finish within the drain grace, new calls fail
    /// with `POOL_CLOSED`), then stops them and kills whatever is left. Every process is reaped
    /// when this returns.
    pub async fn shutdown(&self) {
        self.inner.close("shut down");
        let grace = self.inner.shared.cfg.drain_grace;
        let deadline = Instant::now() + grace + Duration::from_secs(2);
        loop {
            let notified = self.inner.live_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.live.locked().is_empty() && self.inner.starting.load(SeqCst) == 0 {
                break;
            }
            if Instant::now() >= deadline {
                for w in self.inner.live.locked().values() {
                    w.kill(ExitCause::Shutdown);
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// The methods the workers offer, from the first worker's HELLO (every later worker is
    /// mapped onto it by name): what a gateway or a CLI lists. Empty until a worker has said
    /// HELLO, which [`PoolBuilder::start`] waits for.
    pub fn methods(&self) -> Vec<crate::OfferedMethod> {
        self.inner
            .shared
            .methods
            .get()
            .map(|t| t.offered.clone())
            .unwrap_or_default()
    }

    /// A snapshot of every worker's counters and the per-method latencies.
    pub fn metrics(&self) -> PoolMetrics {
        self.inner.metrics()
    }

    /// The listener remote workers join (PROTOCOL.md 21), when a slot has a remote launcher:
    /// its tickets, revocation and counters.
    #[cfg(feature = "remote")]
    pub fn listener(&self) -> Option<&crate::remote::Listener> {
        self.inner.shared.listener.as_ref()
    }

    /// Process ids of the workers currently running (including draining ones).
    pub fn worker_pids(&self) -> Vec<u32> {
        self.inner
            .live
            .lock()
            .unwrap()
            .values()
            .map(|w| w.pid)
            .collect()
    }

    /// Waits until every slot has a ready worker (e.g. after a crash), up to `timeout`.
    /// Returns whether they all are.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        // Duration::MAX and the like: no deadline the clock can hold, so none.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let notified = self.inner.shared.state_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let up = self
                .inner
                .ready
                .read()
                .unwrap()
                .iter()
                .filter(|w| matches!(w.state(), WorkerState::Ready | WorkerState::Leased))
                .count();
            if up == self.inner.slots.len() {
                return true;
            }
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() || self.inner.closed.load(Acquire) {
                return false;
            }
            // Every change of the ready set notifies; the cap only bounds a missed wake-up.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(50)), notified).await;
        }
    }
}

/// A worker held for a sequence of calls. Dropping the lease returns the worker to the pool.
///
/// ```no_run
/// # async fn demo(pool: wirepool::Pool) -> wirepool::Result<()> {
/// let lease = pool.lease().await?;
/// let _: () = lease.call("load", &"model.bin").await?;   // warms the worker's cache
/// let score: f64 = lease.call("score", &[1.0, 2.0]).await?; // same worker, same cache
/// # Ok(()) }
/// ```
pub struct Lease {
    pool: Pool,
    worker: Arc<Worker>,
}

impl Lease {
    /// The leased worker's process id.
    pub fn pid(&self) -> u32 {
        self.worker.pid
    }

    /// A unary call on the leased worker.
    pub async fn call<Req, Resp>(&self, method: &str, req: &Req) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned + 'static,
    {
        self.call_with(method, req, CallOptions::default()).await
    }

    /// A unary call on the leased worker, with options.
    pub async fn call_with<Req, Resp>(
        &self,
        method: &str,
        req: &Req,
        opts: CallOptions,
    ) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned + 'static,
    {
        let timeout = crate::validate::call_timeout(opts.timeout)?;
        let (method_no, codec) = self.pool.inner.resolve(method, opts.codec)?;
        let body = encode(codec, req)?;
        let result = self
            .pool
            .inner
            .unary(
                Some(&self.worker),
                method_no,
                codec,
                timeout,
                body,
                opts.events.as_ref(),
                opts.idempotent,
            )
            .await?;
        decode_result(codec, result)
    }

    /// A stream on the leased worker.
    pub async fn stream<Req, Row>(&self, method: &str, req: &Req) -> Result<RowStream<Row>>
    where
        Req: Serialize + ?Sized,
    {
        let (method_no, codec) = self.pool.inner.resolve(method, None)?;
        let body = encode(codec, req)?;
        self.pool
            .inner
            .open_stream(Some(&self.worker), method_no, codec, None, body, None, None)
            .await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.worker.end_lease();
    }
}

fn encode<T: Serialize + ?Sized>(codec: Codec, value: &T) -> Result<Bytes> {
    let mut buf = BytesMut::new();
    codec
        .encode(value, &mut buf)
        .map_err(|e| Error::Encode(e.to_string()))?;
    Ok(buf.freeze())
}

fn decode_result<T: DeserializeOwned + 'static>(codec: Codec, body: Bytes) -> Result<T> {
    codec.decode_bytes(body).map_err(|e| Error::Decode {
        what: "result",
        message: e.to_string(),
    })
}

/// The request's id and its worker, on a call's span.
fn record_sent(span: &tracing::Span, worker: &Worker, request_id: u64) {
    if !span.is_disabled() {
        span.record("request_id", request_id);
        span.record("worker_id", worker.id);
        span.record("worker_pid", worker.pid);
    }
}

/// A failed call's error code, on its span.
fn record_outcome<T>(span: &tracing::Span, outcome: &Result<T>) {
    if let (Err(e), false) = (outcome, span.is_disabled()) {
        span.record("error_code", e.code());
    }
}

/// `f`'s outcome, or an error once `deadline` passes first (a retry's wait for a worker,
/// bounded by what is left of the call's deadline; PROTOCOL.md 21.7).
async fn before<T>(
    deadline: Option<Instant>,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match deadline {
        None => f.await,
        Some(d) => tokio::time::timeout_at(d.into(), f)
            .await
            .unwrap_or(Err(Error::DeadlineExceeded(Duration::ZERO))),
    }
}

/// A caller counted in `slot_waiters` until it leaves `acquire`.
struct WaitingForSlot<'a>(&'a AtomicUsize);

impl Drop for WaitingForSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// The outcome of a unary request; dropping it before then cancels the request on the worker.
struct UnaryCall<'a> {
    worker: &'a Worker,
    id: u64,
    /// Not polled yet: the route already holds this task's waker (given to `submit` in the
    /// same poll), so the first poll need not look; an outcome that came meanwhile woke the
    /// task, which polls again.
    first: bool,
    done: bool,
}

impl std::future::Future for UnaryCall<'_> {
    type Output = Result<Bytes>;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Bytes>> {
        if std::mem::take(&mut self.first) {
            return std::task::Poll::Pending;
        }
        let polled = self.worker.poll_unary(self.id, cx);
        self.done = polled.is_ready();
        polled
    }
}

impl Drop for UnaryCall<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.worker.abandon_unary(self.id);
        }
    }
}

impl PoolInner {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Acquire) {
            return Err(Error::PoolClosed(
                self.close_reason.get().copied().unwrap_or("shut down"),
            ));
        }
        Ok(())
    }

    fn close(&self, reason: &'static str) {
        let _ = self.close_reason.set(reason);
        self.closed.store(true, SeqCst);
        *self.ready.write_locked() = Arc::new(Vec::new());
        for w in self.live.locked().values() {
            w.begin_drain(ExitCause::Shutdown, self.shared.cfg.drain_grace);
        }
        // Slots waiting for a remote worker to join stop waiting (shutdown does not wait out
        // an external launcher's join_wait).
        #[cfg(feature = "remote")]
        if let Some(listener) = &self.shared.listener {
            listener.stop_waiting();
        }
        self.shared.notify_state_changed();
        self.live_changed.notify_waiters();
    }

    fn resolve(&self, method: &str, codec: Option<Codec>) -> Result<(usize, Codec)> {
        let table = self
            .shared
            .methods
            .get()
            .ok_or(Error::PoolClosed("not started"))?;
        // A few names compare faster than they hash; the last of equal names wins, as in
        // `by_name` (hashed with a multiply per eight bytes: SipHash showed in the profile).
        let no = if table.names.len() <= 8 {
            table.names.iter().rposition(|n| n == method)
        } else {
            table.by_name.get(method).copied()
        }
        .ok_or_else(|| {
            // The call's outcome (wirepool_errors_total), though nothing is sent.
            let e = Error::UnknownMethod(method.to_string());
            self.shared.count_error(&e);
            e
        })?;
        let codec = codec
            .or_else(|| {
                self.shared
                    .cfg
                    .methods
                    .iter()
                    .find(|m| m.name == method)
                    .and_then(|m| m.codec)
            })
            .unwrap_or(self.shared.cfg.codec);
        Ok((no, codec))
    }

    /// Waits for a slot on the least-loaded ready worker (or on the leased one).
    async fn acquire(&self, leased: Option<&Arc<Worker>>) -> Result<Arc<Worker>> {
        // Fast path: a free slot now, without registering for wake-ups.
        if leased.is_none() && !self.closed.load(Acquire) {
            if let Some(w) = self.pick() {
                return Ok(w);
            }
        }
        // Counted as waiting from before the first look at the slots until we leave (see
        // `Worker::release_slots`).
        self.shared.slot_waiters.fetch_add(1, SeqCst);
        let _waiting = WaitingForSlot(&self.shared.slot_waiters);
        let since = Instant::now();
        let waited = |w: Arc<Worker>| -> Result<Arc<Worker>> {
            self.queue_wait.record(since.elapsed());
            Ok(w)
        };
        loop {
            let notified = self.shared.capacity.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(w) = leased {
                if w.state() == WorkerState::Dead || w.state() == WorkerState::Draining {
                    return Err(Error::LeaseLost(w.exit_info()));
                }
                if w.try_reserve(true) {
                    return waited(w.clone());
                }
            } else {
                self.check_open()?;
                if let Some(w) = self.pick() {
                    return waited(w);
                }
            }
            notified.await;
        }
    }

    fn pick(&self) -> Option<Arc<Worker>> {
        // Scanned under the read lock (nothing here waits), not cloned: one call's worth of
        // reference counting less.
        let ready = self.ready.read_locked();
        let n = ready.len();
        if n == 0 {
            return None;
        }
        if n == 1 {
            let w = &ready[0];
            return w.try_reserve(false).then(|| w.clone());
        }
        // Rotate the starting point so equally loaded workers share the traffic.
        let start = if n > 1 {
            self.rotate.fetch_add(1, Relaxed) % n
        } else {
            0
        };
        for _attempt in 0..4 {
            let mut best: Option<&Arc<Worker>> = None;
            for i in 0..n {
                let w = &ready[(start + i) % n];
                if w.state() != WorkerState::Ready {
                    continue;
                }
                if best.is_none_or(|b| w.in_flight() < b.in_flight()) {
                    best = Some(w);
                }
            }
            let best = best?;
            if best.try_reserve(false) {
                return Some(best.clone());
            }
        }
        None
    }

    /// The span of one request: `tracing` target `wirepool::call`, DEBUG level, fields
    /// `method`, `kind` ("unary" or "stream"), `request_id`, `worker_id`, `worker_pid`, and
    /// `error_code` when it failed. A unary request's span runs from its sending to its outcome
    /// (a call retried elsewhere after DRAINING has one per request); a stream's covers its
    /// start only. Disabled, at the cost of a level check, unless a subscriber enables it.
    fn call_span(&self, kind: &'static str, method_no: usize) -> tracing::Span {
        tracing::debug_span!(
            target: "wirepool::call",
            "call",
            method = self
                .shared
                .methods
                .get()
                .and_then(|t| t.names.get(method_no))
                .map_or("", String::as_str),
            kind,
            request_id = tracing::field::Empty,
            worker_id = tracing::field::Empty,
            worker_pid = tracing::field::Empty,
            error_code = tracing::field::Empty,
        )
    }

    /// Tries in all for a call of `method_no` (1: never sent again, PROTOCOL.md 21.7).
    fn retry_limit(&self, method_no: usize, idempotent: Option<bool>) -> u32 {
        let name = self
            .shared
            .methods
            .get()
            .and_then(|t| t.names.get(method_no))
            .map_or("", String::as_str);
        self.shared.cfg.retry.limit(name, idempotent)
    }

    #[allow(clippy::too_many_arguments)]
    async fn unary(
        &self,
        leased: Option<&Arc<Worker>>,
        method_no: usize,
        codec: Codec,
        timeout: Option<Duration>,
        body: Bytes,
        events: Option<&EventSender>,
        idempotent: Option<bool>,
    ) -> Result<Bytes> {
        // A worker that started draining between dispatch and receipt answers DRAINING without
        // running the request: that is safe to send elsewhere.
        let mut attempts = 0;
        // The retry policy's count (PROTOCOL.md 21.7): requests that may have run, this one
        // included; the call's deadline, from its first request's start; the error of the
        // attempt before this one.
        let mut tries = 1u32;
        let mut timeout = timeout;
        let mut deadline: Option<Instant> = None;
        let mut last: Option<Error> = None;
        loop {
            attempts += 1;
            let acquired = match &last {
                None => self.acquire(leased).await,
                Some(_) => before(deadline, self.acquire(leased)).await,
            };
            let worker = match (acquired, last.take()) {
                (Ok(w), last_error) => {
                    last = last_error;
                    w
                }
                // No worker for the retry (in time): the caller gets the last attempt's outcome.
                (Err(_), Some(e)) => return Err(e.with_attempts(tries - 1)),
                (Err(e), None) => return Err(e),
            };
            // The caller's waker travels with the request, so the reader can wake it without
            // a first poll registering it.
            let waker = std::future::poll_fn(|cx| std::task::Poll::Ready(cx.waker().clone())).await;
            let awaiting = Awaiting::Unary(waker);
            let req = match worker.submit(method_no, codec, timeout, &body, awaiting, events) {
                Ok(sent) => sent,
                Err(NotSent::WorkerGone(_)) if leased.is_none() && attempts < 8 => continue,
                Err(NotSent::WorkerGone(_)) if leased.is_some() => {
                    return Err(Error::LeaseLost(worker.exit_info()))
                }
                Err(NotSent::WorkerGone(e) | NotSent::Final(e)) => {
                    // Refused before it left (an unknown method, a body too large): an error
                    // of the call all the same; a retry's refusal returns the death counted.
                    return Err(match last {
                        Some(last) => last.with_attempts(tries - 1),
                        None => {
                            self.shared.count_error(&e);
                            e
                        }
                    });
                }
            };
            last = None;
            if tries == 1 {
                deadline = timeout.zip(req.started).map(|(t, at)| at + t);
            }
            // One span per request sent, from here to its outcome. Made only now and not entered
            // on each poll (no `Instrument`), it does not grow the call's future: held from the
            // start it did, and callers then moved the future by memcpy (+3.6% instructions per
            // call with tracing off, callgrind on `perf` ping_only).
            let span = self.call_span("unary", method_no);
            record_sent(&span, &worker, req.id);
            let outcome = UnaryCall {
                worker: &worker,
                id: req.id,
                first: true,
                done: false,
            }
            .await;
            record_outcome(&span, &outcome);
            match outcome {
                Err(Error::Remote {
                    code: codes::DRAINING,
                    ..
                }) if leased.is_none() && attempts < 4 => continue,
                // Its worker died: sent again if the call is idempotent, tries are left and so
                // is time (PROTOCOL.md 21.7). On a lease, WORKER_EXITED / WORKER_HUNG are the
                // call's own outcome.
                Err(e)
                    if e.is_worker_death()
                        && leased.is_none()
                        && tries < self.retry_limit(method_no, idempotent) =>
                {
                    self.shared.count_error(&e);
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Err(e.with_attempts(tries));
                    }
                    timeout = deadline.map(|d| d - now);
                    worker.counters.retries.fetch_add(1, Relaxed);
                    tracing::debug!(
                        target: "wirepool::call",
                        worker = worker.id,
                        attempt = tries + 1,
                        error = %e,
                        "sending an idempotent request again"
                    );
                    tries += 1;
                    attempts = 0;
                    last = Some(e);
                }
                other => {
                    return other.map_err(|e| {
                        self.shared.count_error(&e);
                        e.with_attempts(tries)
                    })
                }
            }
        }
    }

    /// Sends a stream's request on the least-loaded worker (or the leased one); a worker that
    /// began draining after it was picked refuses locally: another is picked.
    async fn submit_stream(
        &self,
        leased: Option<&Arc<Worker>>,
        method_no: usize,
        codec: Codec,
        timeout: Option<Duration>,
        body: &Bytes,
        events: Option<&EventSender>,
    ) -> Result<(WorkerRequest, Arc<RowQueue>)> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let worker = self.acquire(leased).await?;
            let queue = RowQueue::new();
            match worker.submit(
                method_no,
                codec,
                timeout,
                body,
                Awaiting::Stream(queue.clone()),
                events,
            ) {
                Ok(req) => return Ok((req, queue)),
                Err(NotSent::WorkerGone(_)) if leased.is_none() && attempts < 8 => continue,
                Err(NotSent::WorkerGone(_)) if leased.is_some() => {
                    return Err(Error::LeaseLost(worker.exit_info()))
                }
                Err(NotSent::WorkerGone(e) | NotSent::Final(e)) => {
                    self.shared.count_error(&e);
                    return Err(e);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn open_stream<Row>(
        self: &Arc<Self>,
        leased: Option<&Arc<Worker>>,
        method_no: usize,
        codec: Codec,
        timeout: Option<Duration>,
        body: Bytes,
        events: Option<&EventSender>,
        idempotent: Option<bool>,
    ) -> Result<RowStream<Row>> {
        // The span covers the start (waiting for a slot, sending); the rows are read later,
        // outside it (a span over the whole stream would live in `RowStream`). A stream sent
        // again (PROTOCOL.md 21.7) is sent by its `RowStream`, outside it too.
        let span = self.call_span("stream", method_no);
        let sent = self
            .submit_stream(leased, method_no, codec, timeout, &body, events)
            .await;
        let outcome = sent.map(|(req, queue)| {
            record_sent(&span, &req.worker, req.id);
            let limit = match leased {
                None => self.retry_limit(method_no, idempotent),
                Some(_) => 1,
            };
            let retry = (limit > 1).then(|| {
                let deadline = timeout.zip(req.started).map(|(t, at)| at + t);
                let inner = self.clone();
                let events = events.cloned();
                let resend: Resend = Box::new(move |timeout| {
                    let (inner, body, events) = (inner.clone(), body.clone(), events.clone());
                    Box::pin(async move {
                        let sent = inner.submit_stream(
                            None,
                            method_no,
                            codec,
                            timeout,
                            &body,
                            events.as_ref(),
                        );
                        before(deadline, sent).await
                    })
                });
                Box::new(StreamRetry::new(limit, deadline, resend))
            });
            RowStream::new(req, queue, codec, retry)
        });
        record_outcome(&span, &outcome);
        outcome
    }

    async fn start_incarnation(self: &Arc<Self>, slot: usize) -> Result<Incarnation> {
        *self.slots[slot].state.locked() = WorkerState::Starting;
        let id = self.next_worker_id.fetch_add(1, Relaxed);
        // Counted from before the spawn until the worker is in `live` (or has failed and been
        // reaped), so `shutdown` never returns while a process is half started.
        self.starting.fetch_add(1, SeqCst);
        let started =
            worker::start(&self.shared, slot, id, self.slots[slot].counters.clone()).await;
        if let Ok(inc) = &started {
            self.live.locked().insert(id, inc.worker.clone());
        }
        self.starting.fetch_sub(1, SeqCst);
        self.live_changed.notify_waiters();
        started
    }

    fn publish(&self, slot: usize, worker: Option<Arc<Worker>>) {
        let s = &self.slots[slot];
        let old = std::mem::replace(&mut *s.current.locked(), worker.clone());
        *s.state.locked() = if worker.is_some() {
            WorkerState::Ready
        } else {
            WorkerState::Dead
        };
        let mut ready = self.ready.write_locked();
        let mut list: Vec<Arc<Worker>> = ready
            .iter()
            .filter(|w| !old.as_ref().is_some_and(|o| Arc::ptr_eq(o, w)))
            .cloned()
            .collect();
        if let Some(w) = worker {
            if !self.closed.load(Acquire) {
                list.push(w);
            }
        }
        *ready = Arc::new(list);
        drop(ready);
        self.shared.notify_state_changed();
    }

    fn forget(&self, worker: &Worker) {
        self.live.locked().remove(&worker.id);
        self.live_changed.notify_waiters();
    }

    /// Counts a replacement of `slot`'s worker under `cause`: an [`ExitCause`] name, or
    /// `start_failed` for a replacement that did not start.
    fn record_cause(&self, slot: usize, cause: &str) {
        self.slots[slot].counters.restarts.fetch_add(1, Relaxed);
        *self.slots[slot]
            .causes
            .lock()
            .unwrap()
            .entry(cause.to_string())
            .or_default() += 1;
    }

    /// Counts a crash against the restart-intensity limit; `false` means the pool gives up.
    /// The restart limit tripped: the pool closes, and every later call's POOL_CLOSED says
    /// why, with the count and the window (issue 12: a bare "restart intensity exceeded" left
    /// the user guessing).
    fn close_restart_intensity(&self, slot: usize) {
        let p = &self.shared.cfg.restart;
        let deaths = self.crash_times.locked().len();
        let reason = format!(
            "restart intensity exceeded: {deaths} worker deaths within {:?} (max_restarts {}); \
             the pool closed",
            p.within, p.max_restarts
        );
        tracing::error!(slot, "{reason}");
        // Once per pool at most (a closed pool never closes again), so leaking the text to
        // keep `Error::PoolClosed`'s `&'static str` costs a few bytes per pool that gave up.
        self.close(Box::leak(reason.into_boxed_str()));
    }

    fn allow_crash_restart(&self) -> bool {
        let p = &self.shared.cfg.restart;
        let now = Instant::now();
        let mut times = self.crash_times.locked();
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) > p.within)
        {
            times.pop_front();
        }
        times.push_back(now);
        times.len() as u32 <= p.max_restarts
    }

    fn metrics(&self) -> PoolMetrics {
        let workers = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let cur = s.current.locked().clone();
                let state = match &cur {
                    Some(w) => w.state(),
                    None => *s.state.locked(),
                };
                WorkerMetrics {
                    slot: i,
                    worker_id: cur.as_ref().map(|w| w.id),
                    pid: cur.as_ref().map(|w| w.pid),
                    host: cur
                        .as_ref()
                        .and_then(|w| w.host.as_deref().map(str::to_owned)),
                    state,
                    in_flight: cur.as_ref().map(|w| w.in_flight() as u64).unwrap_or(0),
                    requests: s.counters.requests.load(Relaxed),
                    streams: s.counters.streams.load(Relaxed),
                    rows: s.counters.rows.load(Relaxed),
                    bytes_in: s.counters.bytes_in.load(Relaxed),
                    bytes_out: s.counters.bytes_out.load(Relaxed),
                    restarts: s.counters.restarts.load(Relaxed),
                    restart_causes: s.causes.locked().clone(),
                    retries: s.counters.retries.load(Relaxed),
                    rss_bytes: cur
                        .as_ref()
                        .filter(|w| w.local_pid > 0)
                        .and_then(|w| spawn::rss_bytes(w.local_pid)),
                    heartbeat_rtt: cur.as_ref().and_then(|w| w.heartbeat_rtt()),
                }
            })
            .collect();
        let methods = match self.shared.methods.get() {
            Some(t) => t
                .names
                .iter()
                .cloned()
                .zip(t.latency.iter().map(|h| h.snapshot()))
                .filter(|(_, s)| s.count > 0)
                .collect(),
            None => BTreeMap::new(),
        };
        let errors =
            self.shared
                .errors
                .locked()
                .iter()
                .fold(BTreeMap::new(), |mut m, (code, n)| {
                    *m.entry(code_name(*code).to_string()).or_default() += n;
                    m
                });
        let mut m = PoolMetrics {
            workers,
            methods,
            errors,
            queue_wait: Default::default(),
            closed: self.closed.load(Acquire),
        };
        // Every request sent waited: those that found room at once waited 0.
        let waited = self.queue_wait.snapshot();
        let zeros = m.total_requests().saturating_sub(waited.count);
        m.queue_wait = waited.with_zeros(zeros);
        m
    }
}

/// Supervises one slot for the pool's lifetime: serves the incarnation, replaces it when it
/// retires (at once) or dies (after backoff), and stops when the pool closes.
async fn run_slot(inner: Arc<PoolInner>, slot: usize, mut first: Option<Incarnation>) {
    let policy: RestartPolicy = inner.shared.cfg.restart.clone();
    let mut backoff = policy.initial_backoff;
    loop {
        if inner.closed.load(Acquire) {
            if let Some(inc) = first.take() {
                inc.worker
                    .begin_drain(ExitCause::Shutdown, inner.shared.cfg.drain_grace);
                let _ = inc.lifecycle.await;
                inner.forget(&inc.worker);
            }
            inner.publish(slot, None);
            return;
        }
        let inc = match first.take() {
            Some(inc) => inc,
            None => match inner.start_incarnation(slot).await {
                Ok(inc) => inc,
                Err(e) => {
                    tracing::warn!(slot, error = %e, "worker failed to start");
                    inner.record_cause(slot, "start_failed");
                    if !inner.allow_crash_restart() {
                        inner.close_restart_intensity(slot);
                        continue;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(policy.max_backoff);
                    continue;
                }
            },
        };
        if inner.closed.load(Acquire) {
            first = Some(inc);
            continue;
        }
        let started = Instant::now();
        let worker = inc.worker.clone();
        inner.publish(slot, Some(worker.clone()));
        let mut lifecycle = inc.lifecycle;
        tokio::select! {
            cause = inc.retiring => {
                // Recycling (or shutdown): the old worker drains in the background, a fresh
                // one takes the slot now.
                let cause = cause.unwrap_or(ExitCause::Shutdown);
                inner.publish(slot, None);
                if cause != ExitCause::Shutdown {
                    inner.record_cause(slot, cause.as_str());
                }
                let inner2 = inner.clone();
                tokio::spawn(async move {
                    let _ = lifecycle.await;
                    inner2.forget(&worker);
                });
                backoff = policy.initial_backoff;
            }
            info = &mut lifecycle => {
                inner.publish(slot, None);
                inner.forget(&worker);
                let cause = info.map(|i| i.cause).unwrap_or(ExitCause::Crashed);
                if inner.closed.load(Acquire) {
                    continue;
                }
                inner.record_cause(slot, cause.as_str());
                if started.elapsed() >= policy.reset_after {
                    backoff = policy.initial_backoff;
                }
                if matches!(cause, ExitCause::Crashed | ExitCause::Hung | ExitCause::ProtocolViolation | ExitCause::CancelTimeout) {
                    if !inner.allow_crash_restart() {
                        inner.close_restart_intensity(slot);
                        continue;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(policy.max_backoff);
                }
            }
        }
    }
}

/// Lays the slots out (the `workers` ones, then the added ones) and, when any is remote, starts
/// the pool's listener (or takes the one given) and tells external launchers its ticket.
#[cfg(feature = "remote")]
async fn open_remote(mut cfg: PoolConfig) -> Result<(PoolConfig, Option<crate::remote::Listener>)> {
    let mut launchers = vec![cfg.launcher.clone(); cfg.workers];
    for (n, launcher) in &cfg.added {
        launchers.extend(std::iter::repeat_n(launcher.clone(), *n));
    }
    cfg.workers = launchers.len();
    let remote = launchers.iter().any(|l| !l.is_local());
    cfg.launchers = launchers;
    if !remote {
        return Ok((cfg, None));
    }
    let listener = match cfg.listener.clone() {
        Some(listener) => listener,
        None => crate::remote::Listener::start(cfg.listen.clone())
            .await
            .map_err(|e| Error::SpawnFailed {
                program: format!("the pool's listener on {}", cfg.listen.bind),
                source: Arc::new(e),
            })?,
    };
    for launcher in &cfg.launchers {
        launcher.opened(&listener).await;
    }
    Ok((cfg, Some(listener)))
}

/// Runs futures concurrently and collects their outputs in order (avoids a `futures` dependency).
async fn futures_join_all<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("start-up task panicked"));
    }
    out
}
