//! Pool configuration: size, limits, timeouts, restart and recycle policies.

use std::time::Duration;

use wirepool_codec::Codec;

use crate::spawn::{WorkerCommand, WorkerOutput};

pub use wirepool_proto::MethodKind;

/// A method as the workers offer it in their HELLO (PROTOCOL.md section 4): what
/// [`Pool::methods`](crate::Pool::methods) lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferedMethod {
    /// The method's name.
    pub name: String,
    /// Unary or stream.
    pub kind: MethodKind,
    /// The codecs it accepts, in the worker's order (ids this version does not know are left out).
    pub codecs: Vec<Codec>,
}

/// A method the pool will call, checked against every worker's HELLO at start-up: a worker that
/// lacks it, offers the other kind, or does not accept the codec is refused with
/// `CODEC_MISMATCH` before any call is made.
#[derive(Clone, Debug)]
pub struct MethodSpec {
    /// The method's name as the worker lists it.
    pub name: String,
    /// Unary or stream.
    pub kind: MethodKind,
    /// The codec the pool will call it with; `None` means the pool's default codec.
    pub codec: Option<Codec>,
}

/// Crash restarts: exponential backoff and a restart-intensity limit.
///
/// With the defaults (PROTOCOL.md section 17) a crashing slot waits 10 ms, 20 ms, 40 ms ... up
/// to 5 s before each respawn; if the pool sees more than `max_restarts` (10) crash restarts
/// within `within` (60 s), it gives up and closes (calls then fail with `POOL_CLOSED`).
/// Recycling is not counted as a crash.
#[derive(Clone, Debug)]
pub struct RestartPolicy {
    /// First backoff delay.
    pub initial_backoff: Duration,
    /// Backoff ceiling.
    pub max_backoff: Duration,
    /// Crash restarts allowed within `within` before the pool gives up.
    pub max_restarts: u32,
    /// The sliding window of the intensity limit.
    pub within: Duration,
    /// A worker that stays up this long resets its slot's backoff.
    pub reset_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(5),
            max_restarts: 10,
            within: Duration::from_secs(60),
            reset_after: Duration::from_secs(30),
        }
    }
}

/// When to replace a healthy worker. It is drained first (no new requests, in-flight ones
/// finish), and a replacement is started at once, so recycling never fails a request.
#[derive(Clone, Debug, Default)]
pub struct RecyclePolicy {
    /// Replace after this many requests.
    pub max_requests: Option<u64>,
    /// Replace when the worker's resident set size goes above this many bytes.
    pub max_rss_bytes: Option<u64>,
    /// Replace after this long without a request.
    pub max_idle: Option<Duration>,
}

/// Which calls the pool may send again after their worker died (PROTOCOL.md 21.7). None by
/// default: a request whose worker dies ends with that death, because it may have run, partly
/// or fully, and only its caller knows whether running it twice is harmless.
///
/// A request of a method marked **idempotent** (here, or per call with
/// [`CallOptions::idempotent`](crate::CallOptions::idempotent)) that ends with `WORKER_EXITED`
/// or `WORKER_HUNG` (no other code: a handler's error, a deadline, a cancel or a protocol
/// violation is the answer) is sent again as a new request, to another worker when one is
/// free (else to the replacement), at most `attempts` times in all, within what is left of its
/// original deadline. A stream is sent again only if none of its rows had reached the caller.
/// The caller sees one outcome: the last attempt's; a worker's death then says how many
/// attempts there were ([`ExitInfo::attempts`](crate::ExitInfo::attempts)), and a worker's
/// error carries `"attempts"` in its JSON `details`. Calls on a [`Lease`](crate::Lease) are
/// never sent again (their worker is the point). [`WorkerMetrics::retries`](crate::WorkerMetrics::retries)
/// counts the requests each slot's workers failed and the pool sent again.
///
/// ```no_run
/// # async fn demo() -> wirepool::Result<()> {
/// use wirepool::{Pool, RetryPolicy, WorkerCommand};
///
/// let pool = Pool::builder(WorkerCommand::new("./my_worker"))
///     .retry(RetryPolicy::idempotent(["add", "get"]).attempts(3)) // 3 tries in all
///     .start()
///     .await?;
/// // A worker that dies while serving this call: it is sent again, up to twice more.
/// let sum: i64 = pool.call("add", &(2, 3)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    methods: Vec<String>,
    attempts: u32,
}

impl RetryPolicy {
    /// Tries in all (the first included) when [`attempts`](Self::attempts) is not given.
    pub const DEFAULT_ATTEMPTS: u32 = 3;

    /// The methods whose requests may be sent again, with
    /// [`DEFAULT_ATTEMPTS`](Self::DEFAULT_ATTEMPTS) tries in all.
    pub fn idempotent<I, S>(methods: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RetryPolicy {
            methods: methods.into_iter().map(Into::into).collect(),
            attempts: Self::DEFAULT_ATTEMPTS,
        }
    }

    /// The most tries [`attempts`](Self::attempts) takes (PROTOCOL.md 22.2).
    pub const MAX_ATTEMPTS: u32 = 100;

    /// At most `n` tries in all, the first included (1 never sends again). Checked when the pool
    /// starts: outside 1 - [`MAX_ATTEMPTS`](Self::MAX_ATTEMPTS) it is `INVALID_ARGUMENT`, never
    /// clamped (PROTOCOL.md 22.2).
    pub fn attempts(mut self, n: u32) -> Self {
        self.attempts = n;
        self
    }

    /// The tries in all this policy allows.
    pub(crate) fn max_attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the policy marks `method` idempotent.
    pub fn is_idempotent(&self, method: &str) -> bool {
        self.methods.iter().any(|m| m == method)
    }

    /// Tries in all for a call of `method` (1: never sent again); `idempotent` is the call's
    /// own mark ([`CallOptions::idempotent`](crate::CallOptions::idempotent)), which wins.
    pub(crate) fn limit(&self, method: &str, idempotent: Option<bool>) -> u32 {
        match idempotent.unwrap_or_else(|| self.is_idempotent(method)) {
            true => self.attempts,
            false => 1,
        }
    }
}

impl Default for RetryPolicy {
    /// No method marked; [`DEFAULT_ATTEMPTS`](Self::DEFAULT_ATTEMPTS) tries for calls marked
    /// idempotent on their own.
    fn default() -> Self {
        RetryPolicy::idempotent(std::iter::empty::<String>())
    }
}

/// Everything a pool needs to start; built with [`PoolBuilder`](crate::PoolBuilder).
#[derive(Clone, Debug)]
pub(crate) struct PoolConfig {
    pub command: WorkerCommand,
    pub workers: usize,
    pub max_in_flight: u32,
    pub startup_timeout: Duration,
    pub codec: Codec,
    pub methods: Vec<MethodSpec>,
    pub heartbeat: Duration,
    pub cancel_grace: Duration,
    pub deadline_grace: Duration,
    pub drain_grace: Duration,
    pub restart: RestartPolicy,
    pub recycle: RecyclePolicy,
    pub retry: RetryPolicy,
    pub max_frame_size: u32,
    pub initial_credit: u32,
    pub max_message_size: u64,
    /// Accept a worker's shared-memory lane and send request bodies of at least this many
    /// bytes through it (PROTOCOL.md 20); `None`: the lane stays off.
    pub shm_threshold: Option<usize>,
    pub stderr_tail_lines: usize,
    pub worker_output: WorkerOutput,
    pub housekeeping_interval: Duration,
    /// Where events go when their call has no mailbox of its own, and connection-level ones.
    pub events: Option<crate::events::EventSender>,
    /// Set once the pool logged that a worker's offer clamped `max_in_flight` (PROTOCOL.md 4.2:
    /// said once per pool, not at every worker start).
    pub clamp_logged: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Where the `workers` slots' processes run (PROTOCOL.md 21.8; default local).
    #[cfg(feature = "remote")]
    pub launcher: crate::remote::Launcher,
    /// More slots, placed by their own launchers (a pool mixing local and remote workers).
    #[cfg(feature = "remote")]
    pub added: Vec<(usize, crate::remote::Launcher)>,
    /// Each slot's launcher, `workers` of them then the added ones: made at start.
    #[cfg(feature = "remote")]
    pub launchers: Vec<crate::remote::Launcher>,
    /// How the pool's own listener listens, when a slot has a remote launcher.
    #[cfg(feature = "remote")]
    pub listen: crate::remote::ListenerOptions,
    /// A listener started before the pool (instead of one of its own).
    #[cfg(feature = "remote")]
    pub listener: Option<crate::remote::Listener>,
}

impl PoolConfig {
    /// The SDK defaults of PROTOCOL.md section 17 (`spec/constants.json`, `sdk_defaults`; the
    /// test below keeps them equal).
    pub fn new(command: WorkerCommand) -> Self {
        use wirepool_proto::constants as d;
        PoolConfig {
            command,
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            max_in_flight: d::PARENT_DEFAULT_MAX_IN_FLIGHT,
            startup_timeout: Duration::from_millis(d::PARENT_DEFAULT_STARTUP_TIMEOUT_MS),
            codec: Codec::Json,
            methods: Vec::new(),
            heartbeat: Duration::from_millis(d::PARENT_DEFAULT_HEARTBEAT_MS),
            cancel_grace: Duration::from_millis(d::PARENT_DEFAULT_CANCEL_GRACE_MS),
            deadline_grace: Duration::from_millis(d::PARENT_DEFAULT_DEADLINE_GRACE_MS),
            drain_grace: Duration::from_millis(d::PARENT_DEFAULT_DRAIN_GRACE_MS),
            restart: RestartPolicy::default(),
            recycle: RecyclePolicy::default(),
            retry: RetryPolicy::default(),
            max_frame_size: d::PARENT_DEFAULT_MAX_FRAME_SIZE,
            initial_credit: d::PARENT_DEFAULT_INITIAL_CREDIT,
            max_message_size: d::PARENT_DEFAULT_MAX_MESSAGE_SIZE,
            // PROTOCOL.md 20.2's defaults: on where memfd exists, bodies from 1 MiB.
            shm_threshold: cfg!(target_os = "linux").then_some(1 << 20),
            stderr_tail_lines: d::PARENT_DEFAULT_STDERR_TAIL_LINES as usize,
            worker_output: WorkerOutput::Log,
            housekeeping_interval: Duration::from_millis(50),
            events: None,
            clamp_logged: Default::default(),
            #[cfg(feature = "remote")]
            launcher: crate::remote::Launcher::local(),
            #[cfg(feature = "remote")]
            added: Vec::new(),
            #[cfg(feature = "remote")]
            launchers: Vec::new(),
            #[cfg(feature = "remote")]
            listen: Default::default(),
            #[cfg(feature = "remote")]
            listener: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every parent default of `spec/constants.json` that this SDK has, in the table's unit.
    #[test]
    fn defaults_follow_the_spec_table() {
        let path =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/constants.json");
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cfg = PoolConfig::new(WorkerCommand::new("true"));
        let ms = |d: Duration| d.as_millis() as u64;
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1) as u64;
        let mut checked = 0;
        for d in c["sdk_defaults"].as_array().unwrap() {
            if d["side"] != "parent" || !(d["language"] == "all" || d["language"] == "rust") {
                continue;
            }
            let name = d["name"].as_str().unwrap();
            let ours = match name {
                "workers" => cfg.workers as u64,
                "max_in_flight" => cfg.max_in_flight.into(),
                "startup_timeout" => ms(cfg.startup_timeout),
                "heartbeat_ms" => ms(cfg.heartbeat),
                "cancel_grace" => ms(cfg.cancel_grace),
                "deadline_grace" => ms(cfg.deadline_grace),
                "drain_grace" => ms(cfg.drain_grace),
                // worker.rs's EXIT_GRACE, private to the lifecycle code
                "goodbye_grace" => continue,
                "restart_backoff" => ms(cfg.restart.initial_backoff),
                "restart_backoff_max" => ms(cfg.restart.max_backoff),
                "max_restarts" => cfg.restart.max_restarts.into(),
                "restart_window" => ms(cfg.restart.within),
                "max_frame_size" => cfg.max_frame_size.into(),
                "initial_credit" => cfg.initial_credit.into(),
                "max_message_size" => cfg.max_message_size,
                "stderr_tail_lines" => cfg.stderr_tail_lines as u64,
                other => panic!("parent default {other} has no Rust counterpart: add it here"),
            };
            let want = if d["unit"] == "cpus" {
                cpus
            } else {
                d["value"].as_u64().unwrap()
            };
            assert_eq!(ours, want, "{name}: {}", d["reason"]);
            checked += 1;
        }
        assert!(checked >= 15, "only {checked} parent defaults checked");
    }

    /// The listener's defaults are `remote.sdk_defaults` of `spec/constants.json`.
    #[cfg(feature = "remote")]
    #[test]
    fn remote_defaults_follow_the_spec_table() {
        let path =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/constants.json");
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let d = &c["remote"]["sdk_defaults"];
        let o = crate::remote::ListenerOptions::default();
        let ms = |d: Duration| d.as_millis() as u64;
        assert_eq!(d["join_timeout_ms"], ms(o.join_timeout));
        assert_eq!(d["hello_timeout_ms"], ms(o.hello_timeout));
        assert_eq!(d["max_pending_joins"], o.max_pending_joins as u64);
        assert_eq!(
            d["refusal_log_per_second"],
            u64::from(o.refusal_log_per_second)
        );
        assert_eq!(d["pool_ticket_ttl_s"], o.ticket_ttl.as_secs());
        assert_eq!(
            d["remote_heartbeat_ms"],
            // A remote connection with heartbeats off gets the default (negotiate, 14.5).
            u64::from(wirepool_proto::DEFAULT_HEARTBEAT_MS)
        );
    }
}
