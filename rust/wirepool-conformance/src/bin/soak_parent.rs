//! The Rust parent's soak driver (`wirepool::Pool`): mixed load on a pool of conformance workers
//! while their processes are killed and stopped at random, then a pool whose replacements keep
//! failing. It measures and prints one JSON line (the summary); `conformance/test_soak.py` holds
//! the invariants and asserts them on the summary. It does what the Python parent's driver
//! (`python/conformance/soak.py`, whose docstring describes the procedure) does, step for
//! step, so the two summaries have the same fields.
//!
//! ```sh
//! soak_parent --seed N [--seconds S] [--workers W] [--max-restarts R] [--fail-fast-seconds F]
//!             --python PY --fail-after conformance/soak/fail_after.py -- WORKER COMMAND...
//! ```
//!
//! The seed fixes every random choice (the schedule still depends on timing); it is in the
//! summary.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};
use wirepool::{codes, CallOptions, Error, Pool, RestartPolicy, WorkerCommand};

const LOAD_TASKS: usize = 6;
/// Calls at once in a burst (the pool's max_in_flight is 32 per worker).
const BURST: u64 = 48;
const MAP_ITEMS: u64 = 64;
/// An operation without an outcome by then is a hang.
const OP_BOUND: Duration = Duration::from_secs(30);
/// After the chaos: the pool back to `workers` live workers.
const SETTLE: Duration = Duration::from_secs(15);
/// The live count must hold this long (a late extra replacement shows up).
const LIVE_HOLD: Duration = Duration::from_millis(500);
const HEARTBEAT: Duration = Duration::from_millis(250);
/// A worker stopped before its HELLO is found by the start-up timeout, not the heartbeat: short
/// enough to settle soon after the chaos, long enough for a Python worker on a busy machine.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(4);
/// From the kill to the pool giving up.
const TRIP_BOUND: Duration = Duration::from_secs(20);
/// What a pool that gave up says (both parents).
const GAVE_UP: &str = "restart intensity exceeded";
/// What a killed or stopped worker's requests get.
const CHAOS_CODES: [&str; 2] = ["WORKER_EXITED", "WORKER_HUNG"];
/// Unexpected outcomes kept verbatim in the summary.
const SAMPLES: usize = 8;

struct Args {
    seed: u64,
    seconds: f64,
    workers: usize,
    max_restarts: u32,
    fail_fast_seconds: f64,
    python: String,
    fail_after: String,
    worker: Vec<String>,
}

fn usage(problem: &str) -> ! {
    eprintln!("soak_parent: {problem}");
    eprintln!(
        "usage: soak_parent --seed N [--seconds S] [--workers W] [--max-restarts R] \
         [--fail-fast-seconds F] --python PY --fail-after SCRIPT -- WORKER COMMAND..."
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut args = std::env::args().skip(1);
    let mut out = Args {
        seed: 0,
        seconds: 20.0,
        workers: 3,
        max_restarts: 5,
        fail_fast_seconds: 2.0,
        python: "python3".into(),
        fail_after: String::new(),
        worker: Vec::new(),
    };
    let mut seed = None;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--seed" => seed = value("--seed").parse().ok(),
            "--seconds" => {
                out.seconds = value("--seconds")
                    .parse()
                    .unwrap_or_else(|_| usage("bad --seconds"))
            }
            "--workers" => {
                out.workers = value("--workers")
                    .parse()
                    .unwrap_or_else(|_| usage("bad --workers"))
            }
            "--max-restarts" => {
                out.max_restarts = value("--max-restarts")
                    .parse()
                    .unwrap_or_else(|_| usage("bad --max-restarts"))
            }
            "--fail-fast-seconds" => {
                out.fail_fast_seconds = value("--fail-fast-seconds")
                    .parse()
                    .unwrap_or_else(|_| usage("bad --fail-fast-seconds"))
            }
            "--python" => out.python = value("--python"),
            "--fail-after" => out.fail_after = value("--fail-after"),
            "--" => out.worker.extend(args.by_ref()),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    out.seed = seed.unwrap_or_else(|| usage("--seed N is required"));
    if out.worker.is_empty() {
        usage("the worker command follows --");
    }
    if out.fail_after.is_empty() {
        usage("--fail-after SCRIPT is required");
    }
    out
}

fn log(msg: &str) {
    eprintln!("soak_parent: {msg}");
}

// ---------------------------------------------------------------------------------------------
// Randomness (seeded, no dependency): SplitMix64
// ---------------------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in [lo, hi].
    fn int(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

type SharedRng = Arc<Mutex<Rng>>;

// ---------------------------------------------------------------------------------------------
// The process: memory, descriptors, children
// ---------------------------------------------------------------------------------------------

fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Our child processes that have not exited (zombies excluded), with their state letter (`T`
/// for a stopped one).
fn children() -> BTreeMap<u32, String> {
    let me = std::process::id();
    let mut found = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(at) = stat.rfind(')') else { continue };
        let mut fields = stat[at + 1..].split_whitespace(); // after the command name
        let (state, ppid) = (
            fields.next(),
            fields.next().and_then(|p| p.parse::<u32>().ok()),
        );
        if ppid == Some(me) && state != Some("Z") {
            found.insert(pid, state.unwrap_or("?").to_string());
        }
    }
    found
}

/// The child has run exec (its argv is no longer ours). Between fork and exec a child is this
/// process's own copy (with vfork, sharing its memory while the forking thread waits): stopping
/// it there stops the parent's spawn, not a worker, so the chaos leaves it alone.
fn execd(pid: u32) -> bool {
    static SELF: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let me = SELF.get_or_init(|| std::fs::read("/proc/self/cmdline").unwrap_or_default());
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|argv| argv != *me)
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid we just saw as our child; ESRCH (it died meanwhile) is fine.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// An error's outcome name: its code's name.
fn code_name(e: &Error) -> String {
    let code = e.code();
    let name = match code {
        codes::PROTOCOL..=199 => "PROTOCOL",
        codes::UNKNOWN_METHOD => "UNKNOWN_METHOD",
        codes::CODEC_UNSUPPORTED => "CODEC_UNSUPPORTED",
        codes::BAD_REQUEST => "BAD_REQUEST",
        codes::HANDLER_ERROR => "HANDLER_ERROR",
        codes::HANDLER_PANIC => "HANDLER_PANIC",
        codes::CANCELLED => "CANCELLED",
        codes::DEADLINE_EXCEEDED => "DEADLINE_EXCEEDED",
        codes::OVERLOADED => "OVERLOADED",
        codes::DRAINING => "DRAINING",
        codes::ROW_TOO_LARGE => "ROW_TOO_LARGE",
        codes::WORKER_EXITED => "WORKER_EXITED",
        codes::WORKER_HUNG => "WORKER_HUNG",
        codes::STARTUP_TIMEOUT => "STARTUP_TIMEOUT",
        codes::SPAWN_FAILED => "SPAWN_FAILED",
        codes::POOL_CLOSED => "POOL_CLOSED",
        codes::LEASE_LOST => "LEASE_LOST",
        codes::DECODE_FAILED => "DECODE_FAILED",
        codes::PROTOCOL_VIOLATION => "PROTOCOL_VIOLATION",
        _ => return format!("CODE_{code}"),
    };
    name.to_string()
}

// ---------------------------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Stats {
    outcomes: BTreeMap<String, u64>,
    /// Requests started, by operation.
    started: BTreeMap<String, u64>,
    by_op: BTreeMap<String, BTreeMap<String, u64>>,
    unexpected: Vec<String>,
    rows: BTreeMap<&'static str, u64>,
    actions: BTreeMap<&'static str, u64>,
}

#[derive(Clone)]
struct Soak {
    pool: Pool,
    rng: SharedRng,
    stats: Arc<Mutex<Stats>>,
    running: Arc<AtomicBool>,
}

#[derive(Deserialize, PartialEq, Debug)]
struct Decl {
    i: u64,
    name: String,
    kind: String,
}

#[derive(Deserialize)]
struct Sum {
    sum: u64,
}

impl Soak {
    /// One operation's single outcome; an outcome outside `allowed` (besides the chaos codes)
    /// is unexpected.
    fn record(&self, op: &str, outcome: &str, allowed: &[&str], detail: &str) {
        let mut s = self.stats.lock().unwrap();
        *s.outcomes.entry(outcome.into()).or_default() += 1;
        *s.by_op
            .entry(op.into())
            .or_default()
            .entry(outcome.into())
            .or_default() += 1;
        if !allowed.contains(&outcome) && !CHAOS_CODES.contains(&outcome) {
            *s.outcomes.entry("unexpected".into()).or_default() += 1;
            if s.unexpected.len() < SAMPLES {
                let mut text = format!("{op}: {outcome}: {detail}");
                text.truncate(400);
                s.unexpected.push(text);
            }
        }
    }

    fn count_rows(&self, key: &'static str, n: u64) {
        *self.stats.lock().unwrap().rows.entry(key).or_default() += n;
    }

    fn random(&self) -> f64 {
        self.rng.lock().unwrap().unit()
    }

    fn int(&self, lo: u64, hi: u64) -> u64 {
        self.rng.lock().unwrap().int(lo, hi)
    }

    /// Runs one operation, which records its own outcome, within OP_BOUND. A burst's calls are
    /// counted as requests each (`burst_call`), the burst itself not.
    async fn bounded(
        &self,
        op: &str,
        allowed: &[&str],
        fut: impl std::future::Future<Output = ()>,
    ) {
        {
            let mut st = self.stats.lock().unwrap();
            let (what, n) = if op == "burst" {
                ("burst_call", BURST)
            } else {
                (op, 1)
            };
            *st.started.entry(what.into()).or_default() += n;
        }
        if tokio::time::timeout(OP_BOUND, fut).await.is_err() {
            self.record(
                op,
                "no_outcome",
                allowed,
                &format!("no outcome within {OP_BOUND:?}"),
            );
        }
    }

    async fn add(&self, i: u64, op: &str) {
        let allowed = ["ok"];
        match self
            .pool
            .call::<_, Sum>("add", &json!({"a": i, "b": 2 * i}))
            .await
        {
            Ok(got) if got.sum == 3 * i => self.record(op, "ok", &allowed, ""),
            Ok(got) => self.record(
                op,
                "wrong_result",
                &allowed,
                &format!("add {i} answered {}", got.sum),
            ),
            Err(e) => self.record(op, &code_name(&e), &allowed, &e.to_string()),
        }
    }

    async fn burst(&self) {
        let base = self.int(0, 1 << 20);
        let handles: Vec<_> = (0..BURST)
            .map(|k| {
                let me = self.clone();
                tokio::spawn(async move { me.add(base + k, "burst_call").await })
            })
            .collect();
        for h in handles {
            let _ = h.await;
        }
    }

    /// A map counts as one operation: every result in order, or the first error.
    async fn map(&self) {
        let allowed = ["ok"];
        let base = self.int(0, 1 << 20);
        let handles: Vec<_> = (0..MAP_ITEMS)
            .map(|k| {
                let pool = self.pool.clone();
                let i = base + k;
                tokio::spawn(async move {
                    pool.call::<_, Sum>("add", &json!({"a": i, "b": 2 * i}))
                        .await
                })
            })
            .collect();
        let mut first_problem: Option<(String, String)> = None;
        for (k, h) in handles.into_iter().enumerate() {
            let got = h.await;
            if first_problem.is_some() {
                continue; // the map has failed: the rest still end, unread
            }
            first_problem = match got {
                Ok(Ok(sum)) if sum.sum == 3 * (base + k as u64) => None,
                Ok(Ok(sum)) => Some((
                    "wrong_result".into(),
                    format!("item {k} answered {}", sum.sum),
                )),
                Ok(Err(e)) => Some((code_name(&e), e.to_string())),
                Err(e) => Some(("task_failed".into(), e.to_string())),
            };
        }
        match first_problem {
            None => self.record("map", "ok", &allowed, ""),
            Some((outcome, detail)) => self.record("map", &outcome, &allowed, &detail),
        }
    }

    /// `decls`: row k must be row number k (nothing lost or repeated), then the summary; with
    /// `close_after`, the stream is dropped (cancelled) after that many rows.
    async fn stream(&self, close_after: Option<u64>) {
        let op = if close_after.is_some() {
            "stream_closed_early"
        } else {
            "stream"
        };
        let allowed = ["ok"];
        let n = self.int(1, 3000);
        self.count_rows("streams", 1);
        let mut rows = match self.pool.stream::<_, Decl>("decls", &json!({"n": n})).await {
            Ok(rows) => rows,
            Err(e) => {
                self.count_rows("broken", 1);
                return self.record(op, &code_name(&e), &allowed, &format!("at the start: {e}"));
            }
        };
        let mut k = 0u64;
        while let Some(row) = rows.next().await {
            match row {
                Ok(row) => {
                    let want = Decl {
                        i: k,
                        name: format!("decl_{k}"),
                        kind: "theorem".into(),
                    };
                    if row != want {
                        self.count_rows("seq_errors", 1);
                        return self.record(
                            op,
                            "wrong_row",
                            &allowed,
                            &format!("row {k} of {n} was {row:?}"),
                        );
                    }
                    k += 1;
                    self.count_rows("total", 1);
                    if close_after.is_some_and(|c| k >= c) {
                        drop(rows);
                        self.count_rows("closed_early", 1);
                        return self.record(op, "ok", &allowed, "");
                    }
                }
                Err(e) => {
                    self.count_rows("broken", 1);
                    return self.record(
                        op,
                        &code_name(&e),
                        &allowed,
                        &format!("after {k} of {n} rows: {e}"),
                    );
                }
            }
        }
        // A second read of an ended stream yields nothing new.
        if let Some(again) = rows.next().await {
            let what = again
                .map(|r| format!("{r:?}"))
                .unwrap_or_else(|e| e.to_string());
            return self.record(op, "read_after_end", &allowed, &format!("got {what}"));
        }
        let summary = rows.summary::<Value>();
        if k != n || !matches!(&summary, Ok(Some(s)) if *s == json!({"rows": n})) {
            self.count_rows("seq_errors", 1);
            return self.record(
                op,
                "wrong_rows",
                &allowed,
                &format!("{k} of {n} rows, summary {summary:?}"),
            );
        }
        self.count_rows("complete", 1);
        self.record(op, "ok", &allowed, "");
    }

    async fn deadline(&self) {
        let allowed = ["DEADLINE_EXCEEDED"];
        let ms = self.int(300, 600);
        let opts = CallOptions::timeout(Duration::from_millis(100));
        match self.pool.call_with::<_, Value>("sleep", &ms, opts).await {
            Ok(got) => self.record(
                "deadline",
                "ok",
                &allowed,
                &format!("sleep {ms} with a 100 ms deadline gave {got}"),
            ),
            Err(e) => self.record("deadline", &code_name(&e), &allowed, &e.to_string()),
        }
    }

    async fn fail(&self) {
        let allowed = ["HANDLER_ERROR"];
        match self.pool.call::<_, Value>("fail", &Value::Null).await {
            Ok(got) => self.record("fail", "ok", &allowed, &format!("fail answered {got}")),
            Err(e) => self.record("fail", &code_name(&e), &allowed, &e.to_string()),
        }
    }

    async fn load(self) {
        while self.running.load(SeqCst) {
            let r = self.random();
            if r < 0.30 {
                let i = self.int(0, 1 << 30);
                self.bounded("add", &["ok"], self.add(i, "add")).await;
            } else if r < 0.55 {
                self.bounded("stream", &["ok"], self.stream(None)).await;
            } else if r < 0.62 {
                let c = self.int(1, 200);
                self.bounded("stream_closed_early", &["ok"], self.stream(Some(c)))
                    .await;
            } else if r < 0.75 {
                self.bounded("burst", &["ok"], self.burst()).await;
            } else if r < 0.85 {
                self.bounded("map", &["ok"], self.map()).await;
            } else if r < 0.95 {
                self.bounded("deadline", &["DEADLINE_EXCEEDED"], self.deadline())
                    .await;
            } else {
                self.bounded("fail", &["HANDLER_ERROR"], self.fail()).await;
            }
        }
    }

    fn act(&self, what: &'static str) {
        *self.stats.lock().unwrap().actions.entry(what).or_default() += 1;
    }

    async fn chaos(self) {
        while self.running.load(SeqCst) {
            let pause = self.rng.lock().unwrap().uniform(0.05, 0.4);
            tokio::time::sleep(Duration::from_secs_f64(pause)).await;
            let kids: Vec<u32> = children().into_keys().filter(|&pid| execd(pid)).collect();
            if kids.is_empty() || !self.running.load(SeqCst) {
                continue;
            }
            let pid = kids[self.int(0, kids.len() as u64 - 1) as usize];
            let r = self.random();
            if r < 0.5 {
                signal(pid, libc::SIGKILL);
                self.act("kill");
            } else if r < 0.8 {
                signal(pid, libc::SIGSTOP);
                let after = Duration::from_secs_f64(self.rng.lock().unwrap().uniform(0.05, 0.6));
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    if children().contains_key(&pid) {
                        signal(pid, libc::SIGCONT); // still ours (not reaped and reused)
                    }
                });
                self.act("stop_cont");
            } else {
                signal(pid, libc::SIGSTOP);
                self.act("stop_left");
            }
        }
    }
}

/// Waits (bounded) for exactly `want` live, running children held for LIVE_HOLD, which must be
/// the pool's own pids; returns what it saw.
async fn settle_live(pool: &Pool, want: usize) -> serde_json::Map<String, Value> {
    let started = Instant::now();
    let pool_pids = || {
        let mut p = pool.worker_pids();
        p.sort_unstable();
        p
    };
    loop {
        let seen = children();
        let running: Vec<u32> = seen
            .iter()
            .filter(|(_, st)| *st != "T")
            .map(|(p, _)| *p)
            .collect();
        if seen.len() == want && running.len() == want && pool_pids() == running {
            let held_until = Instant::now() + LIVE_HOLD;
            while Instant::now() < held_until && children() == seen {
                tokio::time::sleep(Duration::from_millis(50)).await; // polling /proc: nothing to wait on
            }
            if children() == seen {
                let mut out = serde_json::Map::new();
                out.insert("settled".into(), json!(true));
                out.insert(
                    "after_s".into(),
                    json!(round(started.elapsed().as_secs_f64(), 3)),
                );
                out.insert("live_pids".into(), json!(seen.keys().collect::<Vec<_>>()));
                out.insert("pool_pids".into(), json!(pool_pids()));
                return out;
            }
        }
        if started.elapsed() >= SETTLE {
            let stopped: Vec<u32> = seen
                .iter()
                .filter(|(_, st)| *st == "T")
                .map(|(p, _)| *p)
                .collect();
            let mut out = serde_json::Map::new();
            out.insert("settled".into(), json!(false));
            out.insert(
                "after_s".into(),
                json!(round(started.elapsed().as_secs_f64(), 3)),
            );
            out.insert("live_pids".into(), json!(seen.keys().collect::<Vec<_>>()));
            out.insert("stopped_pids".into(), json!(stopped));
            out.insert("pool_pids".into(), json!(pool_pids()));
            return out;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // polling /proc, bounded by SETTLE
    }
}

/// `n` leases held at once, each answering `whoami`: the pids of n serving workers.
async fn lease_pids(pool: &Pool, n: usize) -> Result<Vec<u64>, String> {
    let mut leases = Vec::with_capacity(n);
    let mut pids = Vec::with_capacity(n);
    for _ in 0..n {
        let lease = tokio::time::timeout(Duration::from_secs(10), pool.lease())
            .await
            .map_err(|_| format!("no lease within 10s with {} held", leases.len()))?
            .map_err(|e| format!("lease: {e}"))?;
        let pid: u64 =
            tokio::time::timeout(Duration::from_secs(10), lease.call("whoami", &Value::Null))
                .await
                .map_err(|_| "whoami through a lease: no answer within 10s".to_string())?
                .map_err(|e| format!("whoami through a lease: {e}"))?;
        pids.push(pid);
        leases.push(lease);
    }
    drop(leases);
    pids.sort_unstable();
    Ok(pids)
}

/// Our children left after the pool closed (bounded wait for them to be reaped).
async fn no_children() -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !children().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await; // polling /proc, bounded
    }
    children().into_keys().collect()
}

fn command(argv: &[String]) -> WorkerCommand {
    WorkerCommand::new(&argv[0]).args(&argv[1..])
}

/// How long each phase took (seconds), for the summary: where a run's time goes.
struct Phases {
    times: serde_json::Map<String, Value>,
    last: Instant,
}

impl Phases {
    fn new() -> Self {
        Phases {
            times: serde_json::Map::new(),
            last: Instant::now(),
        }
    }

    fn mark(&mut self, name: &str) {
        let now = Instant::now();
        self.times.insert(
            name.into(),
            json!(round((now - self.last).as_secs_f64(), 2)),
        );
        self.last = now;
    }
}

async fn soak(args: &Args, rng: SharedRng, phases: &mut Phases) -> serde_json::Map<String, Value> {
    let fds_before = open_fds();
    let policy = RestartPolicy {
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(200),
        max_restarts: 100_000,
        within: Duration::from_secs(60),
        reset_after: Duration::from_secs(1),
    };
    let pool = Pool::builder(command(&args.worker))
        .workers(args.workers)
        .max_in_flight(32)
        .heartbeat(HEARTBEAT)
        .startup_timeout(STARTUP_TIMEOUT)
        .restart_policy(policy)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the soak pool did not start: {e}"));
    for i in 0..200u64 {
        // Warm up before the memory baseline.
        let _: Result<Sum, _> = pool.call("add", &json!({"a": i, "b": 2 * i})).await;
    }
    let rss_before = status_mb("VmRSS");
    phases.mark("start");
    let s = Soak {
        pool: pool.clone(),
        rng,
        stats: Arc::new(Mutex::new(Stats::default())),
        running: Arc::new(AtomicBool::new(true)),
    };
    let started = Instant::now();
    let chaos = tokio::spawn(s.clone().chaos());
    let loads: Vec<_> = (0..LOAD_TASKS)
        .map(|_| tokio::spawn(s.clone().load()))
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await; // load and chaos run meanwhile
    phases.mark("chaos");
    s.running.store(false, SeqCst);
    let _ = chaos.await;
    for l in loads {
        let _ = l.await;
    }
    let load_s = started.elapsed().as_secs_f64();
    phases.mark("load_ends");
    {
        let st = s.stats.lock().unwrap();
        log(&format!(
            "load done after {load_s:.1}s: {:?}; chaos {:?}",
            st.outcomes, st.actions
        ));
    }
    let mut live = settle_live(&pool, args.workers).await;
    phases.mark("settle");
    match lease_pids(&pool, args.workers).await {
        Ok(pids) => live.insert("lease_pids".into(), json!(pids)),
        Err(e) => live.insert("answer_error".into(), json!(e)),
    };
    let mut health: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..50u64 {
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            pool.call::<_, Sum>("add", &json!({"a": i, "b": 2 * i})),
        )
        .await;
        let outcome = match got {
            Ok(Ok(sum)) if sum.sum == 3 * i => "ok".to_string(),
            Ok(Ok(_)) => "wrong_result".to_string(),
            Ok(Err(e)) => code_name(&e),
            Err(_) => "no_outcome".to_string(),
        };
        *health.entry(outcome).or_default() += 1;
    }
    live.insert("health".into(), json!(health));
    let in_flight: u64 = pool.metrics().workers.iter().map(|w| w.in_flight).sum();
    live.insert("in_flight".into(), json!(in_flight));
    let rss_after = status_mb("VmRSS");
    phases.mark("final_checks");
    if tokio::time::timeout(Duration::from_secs(30), pool.shutdown())
        .await
        .is_err()
    {
        log("the soak pool's shutdown took more than 30s");
    }
    drop(pool);
    let st = std::mem::take(&mut *s.stats.lock().unwrap());
    drop(s);
    let total: u64 = st
        .outcomes
        .iter()
        .filter(|(k, _)| *k != "unexpected")
        .map(|(_, v)| v)
        .sum();
    let rows: BTreeMap<&str, u64> = [
        "total",
        "streams",
        "complete",
        "closed_early",
        "broken",
        "seq_errors",
    ]
    .into_iter()
    .map(|k| (k, st.rows.get(k).copied().unwrap_or(0)))
    .collect();
    let actions: BTreeMap<&str, u64> = ["kill", "stop_cont", "stop_left"]
        .into_iter()
        .map(|k| (k, st.actions.get(k).copied().unwrap_or(0)))
        .collect();
    let children_after_close = no_children().await;
    phases.mark("close");
    let mut out = serde_json::Map::new();
    out.insert("load_s".into(), json!(round(load_s, 2)));
    out.insert(
        "requests".into(),
        json!({"total": total, "by_outcome": st.outcomes, "by_op": st.by_op,
               "started_by_op": st.started, "unexpected_samples": st.unexpected}),
    );
    out.insert("rows".into(), json!(rows));
    out.insert("chaos".into(), json!(actions));
    out.insert("final".into(), Value::Object(live));
    out.insert(
        "memory_mb".into(),
        json!({"before": round(rss_before, 1), "after": round(rss_after, 1)}),
    );
    out.insert("children_after_close".into(), json!(children_after_close));
    out.insert(
        "fds".into(),
        json!({"before": fds_before, "after": open_fds()}),
    );
    out
}

// ---------------------------------------------------------------------------------------------
// The restart limit
// ---------------------------------------------------------------------------------------------

/// A fresh directory for `fail_after.py`'s incarnation files, removed afterwards.
struct StateDir(std::path::PathBuf);

impl StateDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("wirepool-soak-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a state directory");
        StateDir(dir)
    }

    fn spawns(&self) -> usize {
        std::fs::read_dir(&self.0).map_or(0, |d| d.count())
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Calls on a pool that gave up: their outcomes and the slowest.
#[derive(Default)]
struct FailFast {
    calls: u64,
    outcomes: BTreeMap<String, u64>,
    slowest: Duration,
}

impl FailFast {
    async fn call(&mut self, pool: &Pool) {
        let t = Instant::now();
        let req = json!({"a": 1, "b": 2});
        let got = tokio::time::timeout(Duration::from_secs(5), pool.call::<_, Sum>("add", &req));
        let outcome = match got.await {
            Ok(Ok(_)) => "ok".to_string(),
            Ok(Err(e)) => code_name(&e),
            Err(_) => "no_outcome".to_string(),
        };
        *self.outcomes.entry(outcome).or_default() += 1;
        self.slowest = self.slowest.max(t.elapsed());
        self.calls += 1;
    }
}

async fn restart_limit(args: &Args) -> serde_json::Map<String, Value> {
    let r = args.max_restarts;
    let state = StateDir::new();
    let mut argv = vec![
        args.python.clone(),
        args.fail_after.clone(),
        state.0.to_string_lossy().into_owned(),
        "1".into(),
        "--".into(),
    ];
    argv.extend(args.worker.iter().cloned());
    let policy = RestartPolicy {
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
        max_restarts: r,
        within: Duration::from_secs(60),
        reset_after: Duration::from_secs(30),
    };
    let pool = Pool::builder(command(&argv))
        .workers(1)
        .heartbeat(HEARTBEAT)
        .restart_policy(policy)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the restart-limit pool did not start: {e}"));
    let mut out = serde_json::Map::new();
    out.insert("max_restarts".into(), json!(r));
    let first: u32 = pool
        .call("whoami", &Value::Null)
        .await
        .expect("whoami on the first worker");
    let killed_at = Instant::now();
    signal(first, libc::SIGKILL);
    // Calls wait while the slot is being refilled (one sent before the pool saw the kill fails
    // with it); once the pool gives up, they fail saying so.
    let mut trip: Option<Error> = None;
    let mut before: BTreeMap<String, u64> = BTreeMap::new();
    while killed_at.elapsed() < TRIP_BOUND {
        match tokio::time::timeout(
            TRIP_BOUND,
            pool.call::<_, Sum>("add", &json!({"a": 1, "b": 2})),
        )
        .await
        {
            Ok(Ok(_)) => *before.entry("ok".into()).or_default() += 1,
            Ok(Err(e)) if e.to_string().contains(GAVE_UP) => {
                trip = Some(e);
                break;
            }
            Ok(Err(e)) => *before.entry(code_name(&e)).or_default() += 1,
            Err(_) => *before.entry("no_outcome".into()).or_default() += 1,
        }
    }
    out.insert(
        "trip_s".into(),
        json!(round(killed_at.elapsed().as_secs_f64(), 3)),
    );
    out.insert("before_trip".into(), json!(before));
    out.insert(
        "error".into(),
        json!(trip.as_ref().map_or("none".to_string(), code_name)),
    );
    out.insert(
        "message".into(),
        json!(trip.as_ref().map_or(String::new(), |e| e.to_string())),
    );
    drop(trip);
    // Anything the pool would still start shows up within a few backoffs.
    tokio::time::sleep(Duration::from_secs(1)).await; // the time a late spawn gets to appear
    out.insert("spawns".into(), json!(state.spawns()));
    out.insert(
        "live_after_trip".into(),
        json!(children().into_keys().collect::<Vec<_>>()),
    );
    let mut ff = FailFast::default();
    for _ in 0..500 {
        ff.call(&pool).await; // warm up before the memory baseline
    }
    let rss_before = status_mb("VmRSS");
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < args.fail_fast_seconds {
        for _ in 0..100 {
            ff.call(&pool).await;
        }
    }
    let rss_after = status_mb("VmRSS");
    let took = started.elapsed().as_secs_f64();
    let (calls, outcomes, slowest) = (ff.calls, ff.outcomes, ff.slowest);
    out.insert(
        "fail_fast".into(),
        json!({"calls": calls, "outcomes": outcomes,
               "max_call_ms": round(slowest.as_secs_f64() * 1000.0, 2),
               "calls_per_s": (calls as f64 / took).round(),
               "rss_before_mb": round(rss_before, 1), "rss_after_mb": round(rss_after, 1)}),
    );
    out.insert("spawns_after_calls".into(), json!(state.spawns()));
    if tokio::time::timeout(Duration::from_secs(30), pool.shutdown())
        .await
        .is_err()
    {
        log("the restart-limit pool's shutdown took more than 30s");
    }
    drop(pool);
    out.insert("children_after_close".into(), json!(no_children().await));
    out
}

fn main() {
    let args = parse_args();
    log(&format!("seed {}", args.seed));
    let _ = std::fs::write("/proc/self/clear_refs", "5"); // VmHWM from here
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let summary = runtime.block_on(async {
        let started = Instant::now();
        let rng = Arc::new(Mutex::new(Rng(args.seed)));
        let mut summary = serde_json::Map::new();
        summary.insert("parent".into(), json!("rust"));
        summary.insert("worker".into(), json!(args.worker));
        summary.insert("seed".into(), json!(args.seed));
        summary.insert("seconds".into(), json!(args.seconds));
        summary.insert("workers".into(), json!(args.workers));
        let mut phases = Phases::new();
        summary.extend(soak(&args, rng, &mut phases).await);
        summary.insert(
            "restart_limit".into(),
            Value::Object(restart_limit(&args).await),
        );
        phases.mark("restart_limit");
        summary.insert("phases_s".into(), Value::Object(phases.times));
        // VmHWM is updated lazily by the kernel: never report a peak below an RSS we read.
        let ff = summary["restart_limit"]["fail_fast"].clone();
        if let Some(Value::Object(m)) = summary.get_mut("memory_mb") {
            let read = ["before", "after"].map(|k| m[k].as_f64().unwrap_or(0.0));
            let ff_read = ["rss_before_mb", "rss_after_mb"].map(|k| ff[k].as_f64().unwrap_or(0.0));
            let peak = read
                .into_iter()
                .chain(ff_read)
                .fold(status_mb("VmHWM"), f64::max);
            m.insert("peak".into(), json!(round(peak, 1)));
        }
        summary.insert(
            "elapsed_s".into(),
            json!(round(started.elapsed().as_secs_f64(), 2)),
        );
        summary
    });
    println!("{}", Value::Object(summary));
}
