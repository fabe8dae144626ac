//! Metrics: per-worker counters and per-method latency histograms, read as a snapshot.
//!
//! What [`crate::prometheus`] exports from it is the shared metrics contract,
//! `spec/metrics.json` (PROTOCOL.md section 23).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A lock-free latency histogram with log-linear buckets (4 per power of two, so any
/// percentile is within ~19% of the true value), from 1 ns to ~584 years.
pub(crate) struct LatencyHistogram {
    buckets: Box<[AtomicU64; BUCKETS]>,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

const SUB_BITS: u32 = 2;
const BUCKETS: usize = (64 << SUB_BITS) as usize;

fn bucket_of(ns: u64) -> usize {
    let ns = ns.max(1);
    let exp = 63 - ns.leading_zeros();
    let sub = if exp >= SUB_BITS {
        (ns >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1)
    } else {
        0
    };
    ((exp << SUB_BITS) as u64 + sub) as usize
}

/// The upper bound (inclusive) of a bucket, in nanoseconds.
fn bucket_high(b: usize) -> u64 {
    let exp = (b >> SUB_BITS) as u32;
    let sub = (b & ((1 << SUB_BITS) - 1)) as u64;
    if exp < SUB_BITS {
        return (1u64 << exp) * 2 - 1;
    }
    let base = 1u64 << exp;
    let step = base >> SUB_BITS;
    base.saturating_add(step.saturating_mul(sub + 1))
        .saturating_sub(1)
}

impl LatencyHistogram {
    pub fn new() -> Self {
        LatencyHistogram {
            buckets: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }

    pub fn record(&self, d: Duration) {
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        self.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
        // Recorded on every call: a plain load first spares the locked update when no new
        // maximum (nearly always). The count is the buckets' sum.
        if ns > self.max_ns.load(Relaxed) {
            self.max_ns.fetch_max(ns, Relaxed);
        }
    }

    pub fn snapshot(&self) -> LatencySnapshot {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let count: u64 = counts.iter().sum();
        let max_ns = self.max_ns.load(Relaxed);
        // Interpolated inside the bucket that holds the rank (its observations taken as spread
        // evenly over its range), and never above the observed maximum: a bucket's upper bound
        // alone would report a p99 (or a p50) above the slowest call.
        let pct = |q: f64| -> Duration {
            if count == 0 {
                return Duration::ZERO;
            }
            let rank = ((count as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, &c) in counts.iter().enumerate() {
                if c > 0 && seen + c >= rank {
                    let low = if i == 0 { 0 } else { bucket_high(i - 1) + 1 };
                    let width = (bucket_high(i) - low) as f64;
                    let at = low as f64 + width * ((rank - seen) as f64 / c as f64);
                    return Duration::from_nanos((at as u64).min(max_ns));
                }
                seen += c;
            }
            Duration::from_nanos(max_ns)
        };
        let sum = self.sum_ns.load(Relaxed);
        // Cumulative counts at the exported bounds: a bucket counts below a bound only when its
        // whole range does, so an observation up to ~19% under a bound may land in the next.
        let mut buckets = Vec::with_capacity(LATENCY_BOUNDS_NS.len());
        let (mut i, mut seen) = (0, 0);
        for &bound in &LATENCY_BOUNDS_NS {
            while i < BUCKETS && bucket_high(i) <= bound {
                seen += counts[i];
                i += 1;
            }
            buckets.push((Duration::from_nanos(bound), seen));
        }
        LatencySnapshot {
            count,
            sum: Duration::from_nanos(sum),
            buckets,
            mean: Duration::from_nanos(sum.checked_div(count).unwrap_or(0)),
            p50: pct(0.50),
            p90: pct(0.90),
            p99: pct(0.99),
            max: Duration::from_nanos(max_ns),
        }
    }
}

/// The upper bounds of [`LatencySnapshot::buckets`], in nanoseconds: 5 us to 5 min, the usual
/// 1-2.5-5 steps (the `+Inf` bucket is `count`).
const LATENCY_BOUNDS_NS: [u64; 23] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
    300_000_000_000,
];

/// Latency of one method: a histogram on the contract's bounds, and percentiles interpolated
/// inside the internal buckets, never above the observed maximum.
///
/// A unary call counts from when it was sent (the call itself reads the clock when its worker
/// had nothing else in flight or it has a timeout; otherwise the writer task stamps the batch
/// it takes, one clock read per batch) to the socket read that delivered its outcome. A stream
/// counts from its start to the moment its consumer reached the end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Number of completed calls or streams.
    pub count: u64,
    /// Sum of their latencies.
    pub sum: Duration,
    /// A histogram: (upper bound, calls that took at most that long), cumulative, bounds from
    /// 5 us to 5 min in 1-2.5-5 steps; `count` is the implicit last (infinite) bucket. A
    /// call slightly (up to ~19%) under a bound may be counted in the next bucket only.
    pub buckets: Vec<(Duration, u64)>,
    /// Mean latency.
    pub mean: Duration,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Largest latency seen.
    pub max: Duration,
}

/// The state of a worker as reported in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkerState {
    /// Spawned, handshake not finished.
    Starting,
    /// Serving requests.
    Ready,
    /// Held by a lease.
    Leased,
    /// Taking no new requests; finishing its in-flight ones before it is replaced.
    Draining,
    /// Gone; the slot is waiting to respawn (backoff) or gave up.
    Dead,
}

impl LatencySnapshot {
    /// The same histogram with `n` more observations of 0 (every bucket counts them).
    pub(crate) fn with_zeros(mut self, n: u64) -> LatencySnapshot {
        if n == 0 {
            return self;
        }
        for (_, c) in &mut self.buckets {
            *c += n;
        }
        self.count += n;
        self.mean = Duration::from_nanos(
            (self.sum.as_nanos() / u128::from(self.count)).min(u128::from(u64::MAX)) as u64,
        );
        self
    }
}

/// The name of an error code as `spec/constants.json` lists it; a code the table does not list
/// gets its range's name (PROTOCOL.md section 3: `APPLICATION` for a handler's own code).
pub(crate) fn code_name(code: u32) -> &'static str {
    use wirepool_proto::{ErrorClass, ErrorCode};
    match ErrorCode::from_code(code) {
        Some(c) => c.name(),
        None => match ErrorClass::of(code) {
            ErrorClass::Protocol => "PROTOCOL",
            ErrorClass::Request => "REQUEST_ERROR",
            ErrorClass::Local => "LOCAL_ERROR",
            ErrorClass::Application => "APPLICATION",
            ErrorClass::Unassigned => "UNKNOWN",
        },
    }
}

/// Counters of one worker slot.
#[derive(Default)]
pub(crate) struct SlotCounters {
    pub requests: AtomicU64,
    /// The streams among `requests`.
    pub streams: AtomicU64,
    pub rows: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub restarts: AtomicU64,
    pub retries: AtomicU64,
}

/// A snapshot of one worker slot.
#[derive(Clone, Debug)]
pub struct WorkerMetrics {
    /// Slot index in the pool (stable across restarts).
    pub slot: usize,
    /// The current incarnation's worker id (as sent in WELCOME), if any.
    pub worker_id: Option<u32>,
    /// The current process id, if a process is running (a remote worker's on its own machine,
    /// from its HELLO).
    pub pid: Option<u32>,
    /// Where the current worker runs: the peer address of a remote worker (PROTOCOL.md 21.6),
    /// `None` for a local one.
    pub host: Option<String>,
    /// State of the current incarnation.
    pub state: WorkerState,
    /// Requests in flight right now.
    pub in_flight: u64,
    /// Requests (calls and streams) sent over the slot's lifetime.
    pub requests: u64,
    /// The streams among `requests`.
    pub streams: u64,
    /// Stream rows received.
    pub rows: u64,
    /// Bytes received from the worker (frames, headers included).
    pub bytes_in: u64,
    /// Bytes sent to the worker.
    pub bytes_out: u64,
    /// Times the slot's worker was replaced.
    pub restarts: u64,
    /// Replacements by cause ([`ExitCause`](crate::ExitCause) names, and `start_failed` for
    /// a replacement that failed to start).
    pub restart_causes: BTreeMap<String, u64>,
    /// Requests the slot's workers failed by dying (`WORKER_EXITED`, `WORKER_HUNG`) that the
    /// pool's retry policy sent again (PROTOCOL.md 21.7; [`RetryPolicy`](crate::RetryPolicy)).
    pub retries: u64,
    /// Resident set size of the current process, in bytes (read now from /proc; for a remote
    /// worker only when it is a child of this process).
    pub rss_bytes: Option<u64>,
    /// Round trip of the current worker's last answered heartbeat PING (`None` before its
    /// first PONG, or with heartbeats off).
    pub heartbeat_rtt: Option<Duration>,
}

/// A snapshot of the whole pool.
#[derive(Clone, Debug)]
pub struct PoolMetrics {
    /// One entry per worker slot.
    pub workers: Vec<WorkerMetrics>,
    /// Latency of completed calls and streams, by method name.
    pub methods: BTreeMap<String, LatencySnapshot>,
    /// Calls and streams that ended in an error, by the code's name (`HANDLER_ERROR`,
    /// `WORKER_EXITED`, `APPLICATION` for a handler's own code...).
    pub errors: BTreeMap<String, u64>,
    /// How long calls and streams waited for a worker with room before they were sent (0 for
    /// the ones that found room at once).
    pub queue_wait: LatencySnapshot,
    /// The pool is shut down (or gave up restarting): its exporter exports no samples.
    pub closed: bool,
}

impl PoolMetrics {
    /// Total replacements over all slots.
    pub fn total_restarts(&self) -> u64 {
        self.workers.iter().map(|w| w.restarts).sum()
    }
    /// Total requests sent again after their worker died, over all slots.
    pub fn total_retries(&self) -> u64 {
        self.workers.iter().map(|w| w.retries).sum()
    }
    /// Total rows received over all slots.
    pub fn total_rows(&self) -> u64 {
        self.workers.iter().map(|w| w.rows).sum()
    }
    /// Total requests (calls and streams) sent over all slots.
    pub fn total_requests(&self) -> u64 {
        self.workers.iter().map(|w| w.requests).sum()
    }
    /// Total streams sent over all slots.
    pub fn total_streams(&self) -> u64 {
        self.workers.iter().map(|w| w.streams).sum()
    }
    /// Slots whose worker runs and finished its handshake (ready, leased or draining).
    pub fn workers_alive(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| {
                matches!(
                    w.state,
                    WorkerState::Ready | WorkerState::Leased | WorkerState::Draining
                )
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_cover_their_values() {
        let mut last = 0;
        for b in 0..BUCKETS - 1 {
            let hi = bucket_high(b);
            assert!(hi >= last, "bucket {b}");
            last = hi;
        }
        for ns in [
            1u64,
            2,
            3,
            4,
            5,
            7,
            8,
            100,
            1000,
            1023,
            1024,
            1025,
            123_456_789,
            u64::MAX / 2,
        ] {
            let b = bucket_of(ns);
            assert!(
                bucket_high(b) >= ns,
                "{ns} in bucket {b} high {}",
                bucket_high(b)
            );
            if b > 0 {
                assert!(bucket_high(b - 1) < ns, "{ns} also fits bucket {}", b - 1);
            }
        }
    }

    #[test]
    fn percentiles_never_exceed_the_observed_maximum() {
        // Issue 28: a bucket's upper bound reported as p99 (20.97 ms) above max (17.9 ms).
        let h = LatencyHistogram::new();
        for us in [17_000u64, 17_500, 17_900] {
            h.record(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.max, Duration::from_micros(17_900));
        for (name, p) in [("p50", s.p50), ("p90", s.p90), ("p99", s.p99)] {
            assert!(p <= s.max, "{name} {p:?} above max {:?}", s.max);
            assert!(
                p >= Duration::from_micros(16_384),
                "{name} {p:?} below its bucket"
            );
        }
        let one = LatencyHistogram::new();
        one.record(Duration::from_nanos(1));
        assert_eq!(one.snapshot().p99, Duration::from_nanos(1));
    }

    #[test]
    fn percentiles_land_within_a_bucket_of_the_truth() {
        let h = LatencyHistogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.count, 1000);
        // Interpolated in their bucket: near the truth for evenly spread values, never past max.
        let p50 = s.p50.as_micros() as f64;
        assert!((500.0 * 0.95..=500.0 * 1.05).contains(&p50), "p50 {p50}");
        let p99 = s.p99.as_micros() as f64;
        assert!((990.0 * 0.95..=1000.0).contains(&p99), "p99 {p99}");
        assert_eq!(s.max, Duration::from_micros(1000));
        assert_eq!(s.sum, Duration::from_micros(500_500));
        let at = |us: u64| {
            s.buckets
                .iter()
                .find(|(b, _)| *b == Duration::from_micros(us))
                .unwrap()
                .1
        };
        // Never more than the true count at a bound; less only within a bucket's width.
        for us in [5, 10, 25, 50, 100, 250, 500] {
            assert!(
                at(us) <= us && at(us) as f64 >= us as f64 / 1.25,
                "{us}: {}",
                at(us)
            );
        }
        assert!(at(1000) >= 800 && at(1000) <= 1000);
        assert_eq!(at(2500), 1000);
        assert!(s
            .buckets
            .windows(2)
            .all(|w| w[0].1 <= w[1].1 && w[0].0 < w[1].0));
        assert_eq!(s.buckets.last().unwrap().1, 1000);
    }
}
