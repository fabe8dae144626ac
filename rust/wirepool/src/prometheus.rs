//! Pool metrics in the Prometheus text exposition format (version 0.0.4), for any HTTP server.
//!
//! The pool already counts everything lock-free; this encodes a [`PoolMetrics`] snapshot when
//! scraped, so the hot path pays nothing and no metrics registry holds a second copy.
//!
//! ```no_run
//! # async fn serve(pool: wirepool::Pool) {
//! // In your HTTP handler for GET /metrics:
//! let body = pool.metrics().to_prometheus("default");
//! let content_type = wirepool::prometheus::CONTENT_TYPE;
//! # let _ = (body, content_type); }
//! ```
//!
//! The series are the shared metrics contract, `spec/metrics.json` (PROTOCOL.md section 23):
//! the same names, types, labels, help texts and histogram buckets as the Python, Node and Go
//! parents, so one dashboard serves them all. Every series is labelled `pool`; per-worker ones
//! `worker` too, the worker's slot (`"0"` to size-1), kept across restarts, so its counters are
//! monotonic.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `wirepool_workers`, `wirepool_workers_alive` | gauge | pool |
//! | `wirepool_calls_total`, `wirepool_streams_total`, `wirepool_retries_total` | counter | pool |
//! | `wirepool_errors_total` | counter | pool, code (the code's name: `HANDLER_ERROR`, ...) |
//! | `wirepool_restarts_total` | counter | pool, cause (`crashed`, `hung`, `protocol_violation`, `cancel_timeout`, `start_failed`, `left_by_itself`) |
//! | `wirepool_recycles_total` | counter | pool, reason (`requests`, `rss`, `idle`) |
//! | `wirepool_queue_wait_seconds` | histogram | pool |
//! | `wirepool_method_duration_seconds` | histogram | pool, method |
//! | `wirepool_worker_state` | gauge | pool, worker, state |
//! | `wirepool_worker_pid`, `_in_flight`, `_rss_bytes`, `_heartbeat_rtt_seconds` | gauge | pool, worker |
//! | `wirepool_worker_requests_total`, `_rows_total`, `_sent_bytes_total`, `_received_bytes_total` | counter | pool, worker |
//! | `wirepool_worker_restarts_total` (optional in the contract) | counter | pool, worker, cause |
//! | `wirepool_worker_retries_total` (optional in the contract) | counter | pool, worker |
//!
//! A value the pool cannot know (the pid of a slot with no process, the RSS of a remote worker,
//! the round trip before the first PONG) is left out; a closed pool exports no samples.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::metrics::{LatencySnapshot, PoolMetrics, WorkerMetrics, WorkerState};

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A series of the contract: name, type, help (spec/metrics.json, word for word).
type Family = (&'static str, &'static str, &'static str);

const WORKERS: Family = (
    "wirepool_workers",
    "gauge",
    "Workers the pool keeps (its size).",
);
const WORKERS_ALIVE: Family = (
    "wirepool_workers_alive",
    "gauge",
    "Workers whose process runs and finished its handshake (ready, leased or draining).",
);
const CALLS: Family = (
    "wirepool_calls_total",
    "counter",
    "Unary calls sent to a worker (a retry counts again).",
);
const STREAMS: Family = (
    "wirepool_streams_total",
    "counter",
    "Streams sent to a worker (a retry counts again).",
);
const ERRORS: Family = (
    "wirepool_errors_total",
    "counter",
    "Calls and streams that ended in an error, by error code name.",
);
const RESTARTS: Family = (
    "wirepool_restarts_total",
    "counter",
    "Workers replaced after an unexpected death, by cause.",
);
const RECYCLES: Family = (
    "wirepool_recycles_total",
    "counter",
    "Healthy workers retired and replaced by a recycling limit, by limit.",
);
const RETRIES: Family = (
    "wirepool_retries_total",
    "counter",
    "Requests sent again under the pool's retry policy after their worker died.",
);
const QUEUE_WAIT: Family = (
    "wirepool_queue_wait_seconds",
    "histogram",
    "Time a call or stream waited for a worker with room before it was sent (0 when one had room).",
);
const DURATION: Family = (
    "wirepool_method_duration_seconds",
    "histogram",
    "Latency of completed calls and streams, from sending to the outcome, by method.",
);
const STATE: Family = (
    "wirepool_worker_state",
    "gauge",
    "1 for the worker's current state, 0 for the others.",
);
const WORKER_RESTARTS: Family = (
    "wirepool_worker_restarts_total",
    "counter",
    "Replacements of the worker in this slot after an unexpected death, by cause.",
);

/// A pool-wide series without labels but `pool`, and its value.
type PoolWide = (Family, fn(&PoolMetrics) -> f64);

/// A per-worker series with one sample per slot, and its value for a slot (None: no sample).
type PerWorker = (Family, fn(&WorkerMetrics) -> Option<f64>);

const PER_WORKER: [PerWorker; 9] = [
    (
        (
            "wirepool_worker_pid",
            "gauge",
            "Process id of the worker (a remote worker's on its own machine); absent while none runs.",
        ),
        |w| w.pid.map(f64::from),
    ),
    (
        (
            "wirepool_worker_in_flight",
            "gauge",
            "Requests in flight on the worker now.",
        ),
        |w| Some(w.in_flight as f64),
    ),
    (
        (
            "wirepool_worker_requests_total",
            "counter",
            "Requests (calls and streams) sent to the worker.",
        ),
        |w| Some(w.requests as f64),
    ),
    (
        (
            "wirepool_worker_rows_total",
            "counter",
            "Stream rows received from the worker.",
        ),
        |w| Some(w.rows as f64),
    ),
    (
        (
            "wirepool_worker_sent_bytes_total",
            "counter",
            "Bytes sent to the worker (frames, headers included).",
        ),
        |w| Some(w.bytes_out as f64),
    ),
    (
        (
            "wirepool_worker_received_bytes_total",
            "counter",
            "Bytes received from the worker (frames, headers included).",
        ),
        |w| Some(w.bytes_in as f64),
    ),
    (
        (
            "wirepool_worker_rss_bytes",
            "gauge",
            "Resident set size of the worker process; absent when it is not a child of this process or the OS does not say.",
        ),
        |w| w.rss_bytes.map(|b| b as f64),
    ),
    (
        (
            "wirepool_worker_heartbeat_rtt_seconds",
            "gauge",
            "Round trip of the worker's last answered heartbeat PING; absent before the first PONG.",
        ),
        |w| w.heartbeat_rtt.map(|d| d.as_secs_f64()),
    ),
    (
        (
            "wirepool_worker_retries_total",
            "counter",
            "Requests that the worker in this slot failed by dying and the retry policy sent again.",
        ),
        |w| Some(w.retries as f64),
    ),
];

const STATES: [(WorkerState, &str); 5] = [
    (WorkerState::Starting, "starting"),
    (WorkerState::Ready, "ready"),
    (WorkerState::Leased, "leased"),
    (WorkerState::Draining, "draining"),
    (WorkerState::Dead, "dead"),
];

/// The prefix of a recycling's [`ExitCause`](crate::ExitCause) name: the rest is the contract's
/// `reason` (`recycled_rss` is `rss`).
const RECYCLED: &str = "recycled_";

impl PoolMetrics {
    /// This snapshot in the Prometheus text format, every series labelled `pool="<pool>"`.
    pub fn to_prometheus(&self, pool: &str) -> String {
        encode(&[(pool, self)])
    }
}

/// Encodes the snapshots of several pools, each labelled `pool="<name>"`, as one exposition
/// (each metric's `HELP` and `TYPE` once, as the format requires). A closed pool's snapshot
/// adds no samples.
pub fn encode(pools: &[(&str, &PoolMetrics)]) -> String {
    let mut out = String::with_capacity(8192);
    let o = &mut out;
    let pools: Vec<(String, &PoolMetrics)> = pools
        .iter()
        .filter(|(_, m)| !m.closed)
        .map(|(n, m)| (format!("pool=\"{}\"", escape(n)), *m))
        .collect();

    let pool_wide: [PoolWide; 5] = [
        (WORKERS, |m| m.workers.len() as f64),
        (WORKERS_ALIVE, |m| m.workers_alive() as f64),
        (CALLS, |m| (m.total_requests() - m.total_streams()) as f64),
        (STREAMS, |m| m.total_streams() as f64),
        (RETRIES, |m| m.total_retries() as f64),
    ];
    for (f, value) in pool_wide {
        family(o, f);
        for (p, m) in &pools {
            sample(o, f.0, p, value(m));
        }
    }

    family(o, ERRORS);
    for (p, m) in &pools {
        for (code, n) in &m.errors {
            sample(o, ERRORS.0, &format!("{p},code=\"{}\"", escape(code)), n);
        }
    }
    family(o, RESTARTS);
    for (p, m) in &pools {
        for (cause, n) in causes(m.workers.iter()) {
            sample(
                o,
                RESTARTS.0,
                &format!("{p},cause=\"{}\"", escape(&cause)),
                n,
            );
        }
    }
    family(o, RECYCLES);
    for (p, m) in &pools {
        let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
        for w in &m.workers {
            for (cause, n) in &w.restart_causes {
                if let Some(reason) = cause.strip_prefix(RECYCLED) {
                    *reasons.entry(reason).or_default() += n;
                }
            }
        }
        for (reason, n) in reasons {
            sample(
                o,
                RECYCLES.0,
                &format!("{p},reason=\"{}\"", escape(reason)),
                n,
            );
        }
    }

    family(o, QUEUE_WAIT);
    for (p, m) in &pools {
        histogram(o, QUEUE_WAIT.0, p, &m.queue_wait);
    }
    family(o, DURATION);
    for (p, m) in &pools {
        for (method, lat) in &m.methods {
            let labels = format!("{p},method=\"{}\"", escape(method));
            histogram(o, DURATION.0, &labels, lat);
        }
    }

    family(o, STATE);
    for (p, m) in &pools {
        for w in &m.workers {
            for (state, name) in STATES {
                let labels = format!("{p},worker=\"{}\",state=\"{name}\"", w.slot);
                sample(o, STATE.0, &labels, u8::from(w.state == state));
            }
        }
    }
    for (f, value) in &PER_WORKER {
        family(o, *f);
        for (p, m) in &pools {
            for w in &m.workers {
                if let Some(v) = value(w) {
                    sample(o, f.0, &format!("{p},worker=\"{}\"", w.slot), v);
                }
            }
        }
    }
    family(o, WORKER_RESTARTS);
    for (p, m) in &pools {
        for w in &m.workers {
            for (cause, n) in causes(std::iter::once(w)) {
                let labels = format!("{p},worker=\"{}\",cause=\"{}\"", w.slot, escape(&cause));
                sample(o, WORKER_RESTARTS.0, &labels, n);
            }
        }
    }
    out
}

/// Replacements after an unexpected death by cause, summed over `workers` (recycles and
/// shutdowns are not deaths).
fn causes<'a>(workers: impl Iterator<Item = &'a WorkerMetrics>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for w in workers {
        for (cause, n) in &w.restart_causes {
            if !cause.starts_with(RECYCLED) && cause != "shutdown" {
                *out.entry(cause.clone()).or_default() += n;
            }
        }
    }
    out
}

/// A histogram's samples: its cumulative buckets at the contract's bounds, `+Inf`, sum, count.
fn histogram(out: &mut String, name: &str, labels: &str, h: &LatencySnapshot) {
    for (bound, n) in &h.buckets {
        let le = format!("{labels},le=\"{}\"", bound.as_secs_f64());
        sample(out, &format!("{name}_bucket"), &le, n);
    }
    let inf = format!("{labels},le=\"+Inf\"");
    sample(out, &format!("{name}_bucket"), &inf, h.count);
    sample(out, &format!("{name}_sum"), labels, h.sum.as_secs_f64());
    sample(out, &format!("{name}_count"), labels, h.count);
}

fn family(out: &mut String, (name, kind, help): Family) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{name}{{{labels}}} {value}");
}

/// A label value as the format requires: backslash, double quote and newline escaped.
fn escape(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    fn worker(slot: usize, state: WorkerState) -> WorkerMetrics {
        WorkerMetrics {
            slot,
            worker_id: Some(slot as u32 + 1),
            pid: Some(1000 + slot as u32),
            host: None,
            state,
            in_flight: 2,
            requests: 10,
            streams: 4,
            rows: 300,
            bytes_in: 4096,
            bytes_out: 512,
            restarts: 3,
            restart_causes: BTreeMap::from([
                ("crashed".to_string(), 1),
                ("start_failed".to_string(), 1),
                ("recycled_rss".to_string(), 1),
            ]),
            retries: 3,
            rss_bytes: None,
            heartbeat_rtt: Some(Duration::from_micros(250)),
        }
    }

    fn pool(
        workers: Vec<WorkerMetrics>,
        methods: BTreeMap<String, LatencySnapshot>,
    ) -> PoolMetrics {
        PoolMetrics {
            workers,
            methods,
            errors: BTreeMap::from([("HANDLER_ERROR".to_string(), 2)]),
            queue_wait: LatencySnapshot::default(),
            closed: false,
        }
    }

    #[test]
    fn encodes_every_family_once_with_escaped_labels() {
        let lat = LatencySnapshot {
            count: 3,
            sum: Duration::from_millis(3),
            buckets: vec![
                (Duration::from_micros(500), 1),
                (Duration::from_millis(1), 3),
            ],
            ..Default::default()
        };
        let a = pool(
            vec![worker(0, WorkerState::Ready), worker(1, WorkerState::Dead)],
            BTreeMap::from([("say \"hi\"\\\n".to_string(), lat)]),
        );
        let b = pool(vec![worker(0, WorkerState::Leased)], BTreeMap::new());
        let mut closed = pool(vec![worker(0, WorkerState::Ready)], BTreeMap::new());
        closed.closed = true;
        let text = encode(&[("a", &a), ("b", &b), ("gone", &closed)]);
        for family in [
            "wirepool_workers",
            "wirepool_worker_state",
            "wirepool_method_duration_seconds",
        ] {
            assert_eq!(
                text.matches(&format!("# TYPE {family} ")).count(),
                1,
                "{text}"
            );
        }
        assert!(
            !text.contains("pool=\"gone\""),
            "a closed pool has no samples"
        );
        assert!(text.contains("wirepool_workers{pool=\"a\"} 2\n"));
        assert!(text.contains("wirepool_workers_alive{pool=\"a\"} 1\n"));
        assert!(text.contains("wirepool_calls_total{pool=\"a\"} 12\n"));
        assert!(text.contains("wirepool_streams_total{pool=\"a\"} 8\n"));
        assert!(text.contains("wirepool_errors_total{pool=\"b\",code=\"HANDLER_ERROR\"} 2\n"));
        assert!(text.contains("wirepool_restarts_total{pool=\"a\",cause=\"crashed\"} 2\n"));
        assert!(text.contains("wirepool_restarts_total{pool=\"a\",cause=\"start_failed\"} 2\n"));
        assert!(text.contains("wirepool_recycles_total{pool=\"a\",reason=\"rss\"} 2\n"));
        assert!(!text.contains("cause=\"recycled_rss\""), "{text}");
        assert!(text.contains("wirepool_worker_state{pool=\"a\",worker=\"0\",state=\"ready\"} 1\n"));
        assert!(text.contains("wirepool_worker_state{pool=\"a\",worker=\"1\",state=\"ready\"} 0\n"));
        assert!(
            text.contains("wirepool_worker_state{pool=\"b\",worker=\"0\",state=\"leased\"} 1\n")
        );
        assert!(text.contains("wirepool_worker_pid{pool=\"a\",worker=\"1\"} 1001\n"));
        assert!(text.contains("wirepool_worker_rows_total{pool=\"b\",worker=\"0\"} 300\n"));
        assert!(text.contains("wirepool_worker_retries_total{pool=\"a\",worker=\"1\"} 3\n"));
        assert!(text
            .contains("wirepool_worker_heartbeat_rtt_seconds{pool=\"a\",worker=\"0\"} 0.00025\n"));
        assert!(
            !text.contains("wirepool_worker_rss_bytes{"),
            "no RSS, no sample"
        );
        assert!(text.contains(
            "wirepool_worker_restarts_total{pool=\"a\",worker=\"1\",cause=\"crashed\"} 1\n"
        ));
        assert!(text.contains("wirepool_queue_wait_seconds_count{pool=\"a\"} 0\n"));
        let m = "pool=\"a\",method=\"say \\\"hi\\\"\\\\\\n\"";
        assert!(
            text.contains(&format!(
                "wirepool_method_duration_seconds_bucket{{{m},le=\"0.0005\"}} 1\n"
            )),
            "{text}"
        );
        assert!(text.contains(&format!(
            "wirepool_method_duration_seconds_bucket{{{m},le=\"+Inf\"}} 3\n"
        )));
        assert!(text.contains(&format!(
            "wirepool_method_duration_seconds_sum{{{m}}} 0.003\n"
        )));
        assert!(text.contains(&format!(
            "wirepool_method_duration_seconds_count{{{m}}} 3\n"
        )));
        assert!(text
            .lines()
            .all(|l| l.starts_with('#') || l.starts_with("wirepool_")));
    }
}
