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
//! Series (every one labelled `pool`; `slot` is the worker's stable place in the pool, kept
//! across restarts, so its counters are monotonic):
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `wirepool_workers` | gauge | | worker slots |
//! | `wirepool_worker_state` | gauge | slot, state | 1 for the slot's state (`starting`, `ready`, `leased`, `draining`, `dead`), 0 for the others |
//! | `wirepool_worker_pid` | gauge | slot | the current process id (absent while none runs) |
//! | `wirepool_worker_in_flight` | gauge | slot | requests in flight now |
//! | `wirepool_worker_requests_total` | counter | slot | requests sent |
//! | `wirepool_worker_rows_total` | counter | slot | stream rows received |
//! | `wirepool_worker_received_bytes_total` | counter | slot | bytes received from the worker |
//! | `wirepool_worker_sent_bytes_total` | counter | slot | bytes sent to the worker |
//! | `wirepool_worker_restarts_total` | counter | slot, cause | replacements, by [`ExitCause`](crate::ExitCause) name |
//! | `wirepool_worker_retries_total` | counter | slot | requests the slot's workers failed by dying that the retry policy sent again ([`RetryPolicy`](crate::RetryPolicy)) |
//! | `wirepool_worker_rss_bytes` | gauge | slot | resident set size of the current process |
//! | `wirepool_method_duration_seconds` | histogram | method | latency of completed calls and streams ([`LatencySnapshot`](crate::LatencySnapshot)) |

use std::fmt::Write as _;

use crate::metrics::{PoolMetrics, WorkerMetrics, WorkerState};

/// The `Content-Type` of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A per-slot series: name, type, help, and its value for a slot (None: no sample).
type PerSlot = (
    &'static str,
    &'static str,
    &'static str,
    fn(&WorkerMetrics) -> Option<u64>,
);

const STATES: [(WorkerState, &str); 5] = [
    (WorkerState::Starting, "starting"),
    (WorkerState::Ready, "ready"),
    (WorkerState::Leased, "leased"),
    (WorkerState::Draining, "draining"),
    (WorkerState::Dead, "dead"),
];

impl PoolMetrics {
    /// This snapshot in the Prometheus text format, every series labelled `pool="<pool>"`.
    pub fn to_prometheus(&self, pool: &str) -> String {
        encode(&[(pool, self)])
    }
}

/// Encodes the snapshots of several pools, each labelled `pool="<name>"`, as one exposition
/// (each metric's `HELP` and `TYPE` once, as the format requires).
pub fn encode(pools: &[(&str, &PoolMetrics)]) -> String {
    let mut out = String::with_capacity(4096);
    let o = &mut out;
    let pools: Vec<(String, &PoolMetrics)> = pools.iter().map(|(n, m)| (escape(n), *m)).collect();

    family(o, "wirepool_workers", "gauge", "Worker slots of the pool.");
    for (p, m) in &pools {
        sample(
            o,
            "wirepool_workers",
            &format!("pool=\"{p}\""),
            m.workers.len(),
        );
    }

    family(
        o,
        "wirepool_worker_state",
        "gauge",
        "1 for the slot's current state, 0 for the others.",
    );
    for (p, m) in &pools {
        for w in &m.workers {
            for (state, name) in STATES {
                let labels = format!("pool=\"{p}\",slot=\"{}\",state=\"{name}\"", w.slot);
                sample(
                    o,
                    "wirepool_worker_state",
                    &labels,
                    u8::from(w.state == state),
                );
            }
        }
    }

    let per_slot: [PerSlot; 8] = [
        (
            "wirepool_worker_pid",
            "gauge",
            "Process id of the slot's current worker.",
            |w| w.pid.map(u64::from),
        ),
        (
            "wirepool_worker_in_flight",
            "gauge",
            "Requests in flight on the worker now.",
            |w| Some(w.in_flight),
        ),
        (
            "wirepool_worker_requests_total",
            "counter",
            "Requests sent to the slot's workers.",
            |w| Some(w.requests),
        ),
        (
            "wirepool_worker_rows_total",
            "counter",
            "Stream rows received from the slot's workers.",
            |w| Some(w.rows),
        ),
        (
            "wirepool_worker_received_bytes_total",
            "counter",
            "Bytes received from the slot's workers.",
            |w| Some(w.bytes_in),
        ),
        (
            "wirepool_worker_sent_bytes_total",
            "counter",
            "Bytes sent to the slot's workers.",
            |w| Some(w.bytes_out),
        ),
        (
            "wirepool_worker_retries_total",
            "counter",
            "Requests the slot's workers failed by dying that the retry policy sent again.",
            |w| Some(w.retries),
        ),
        (
            "wirepool_worker_rss_bytes",
            "gauge",
            "Resident set size of the slot's current worker.",
            |w| w.rss_bytes,
        ),
    ];
    for (name, kind, help, value) in &per_slot {
        family(o, name, kind, help);
        for (p, m) in &pools {
            for w in &m.workers {
                if let Some(v) = value(w) {
                    sample(o, name, &format!("pool=\"{p}\",slot=\"{}\"", w.slot), v);
                }
            }
        }
    }

    let name = "wirepool_worker_restarts_total";
    family(
        o,
        name,
        "counter",
        "Replacements of the slot's worker, by cause.",
    );
    for (p, m) in &pools {
        for w in &m.workers {
            for (cause, n) in &w.restart_causes {
                let labels = format!(
                    "pool=\"{p}\",slot=\"{}\",cause=\"{}\"",
                    w.slot,
                    escape(cause)
                );
                sample(o, name, &labels, n);
            }
        }
    }

    let name = "wirepool_method_duration_seconds";
    family(
        o,
        name,
        "histogram",
        "Latency of completed calls and streams, by method.",
    );
    for (p, m) in &pools {
        for (method, lat) in &m.methods {
            let base = format!("pool=\"{p}\",method=\"{}\"", escape(method));
            for (bound, n) in &lat.buckets {
                let labels = format!("{base},le=\"{}\"", bound.as_secs_f64());
                sample(o, &format!("{name}_bucket"), &labels, n);
            }
            sample(
                o,
                &format!("{name}_bucket"),
                &format!("{base},le=\"+Inf\""),
                lat.count,
            );
            sample(o, &format!("{name}_sum"), &base, lat.sum.as_secs_f64());
            sample(o, &format!("{name}_count"), &base, lat.count);
        }
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
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
    use crate::metrics::LatencySnapshot;

    fn worker(slot: usize, state: WorkerState) -> WorkerMetrics {
        WorkerMetrics {
            slot,
            worker_id: Some(slot as u32 + 1),
            pid: Some(1000 + slot as u32),
            host: None,
            state,
            in_flight: 2,
            requests: 10,
            rows: 300,
            bytes_in: 4096,
            bytes_out: 512,
            restarts: 1,
            restart_causes: BTreeMap::from([("crashed".to_string(), 1)]),
            retries: 3,
            rss_bytes: None,
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
        let a = PoolMetrics {
            workers: vec![worker(0, WorkerState::Ready), worker(1, WorkerState::Dead)],
            methods: BTreeMap::from([("say \"hi\"\\\n".to_string(), lat)]),
        };
        let b = PoolMetrics {
            workers: vec![worker(0, WorkerState::Leased)],
            methods: BTreeMap::new(),
        };
        let text = encode(&[("a", &a), ("b", &b)]);
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
        assert!(text.contains("wirepool_workers{pool=\"a\"} 2\n"));
        assert!(text.contains("wirepool_worker_state{pool=\"a\",slot=\"0\",state=\"ready\"} 1\n"));
        assert!(text.contains("wirepool_worker_state{pool=\"a\",slot=\"1\",state=\"ready\"} 0\n"));
        assert!(text.contains("wirepool_worker_state{pool=\"b\",slot=\"0\",state=\"leased\"} 1\n"));
        assert!(text.contains("wirepool_worker_pid{pool=\"a\",slot=\"1\"} 1001\n"));
        assert!(text.contains("wirepool_worker_rows_total{pool=\"b\",slot=\"0\"} 300\n"));
        assert!(text.contains("wirepool_worker_retries_total{pool=\"a\",slot=\"1\"} 3\n"));
        assert!(
            !text.contains("wirepool_worker_rss_bytes{"),
            "no RSS, no sample"
        );
        assert!(text.contains(
            "wirepool_worker_restarts_total{pool=\"a\",slot=\"1\",cause=\"crashed\"} 1\n"
        ));
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
