//! The gateway's own request counters, appended to the pool's Prometheus text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

#[derive(Default)]
pub(crate) struct Stats {
    /// Responses by (route, status): bounded, both come from fixed sets.
    responses: Mutex<BTreeMap<(&'static str, u16), u64>>,
    pub shed: AtomicU64,
    pub connections_refused: AtomicU64,
    pub disconnects: AtomicU64,
}

impl Stats {
    pub fn count(&self, route: &'static str, status: u16) {
        let mut map = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((route, status)).or_insert(0) += 1;
    }

    pub fn prometheus(&self, out: &mut String, in_flight: usize) {
        out.push_str(
            "# HELP wirepool_gateway_responses_total HTTP responses by route and status.\n",
        );
        out.push_str("# TYPE wirepool_gateway_responses_total counter\n");
        let map = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        for ((route, status), n) in map.iter() {
            let _ = writeln!(
                out,
                "wirepool_gateway_responses_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        drop(map);
        let counters = [
            (
                "shed_total",
                "Requests refused with 503 because max_pending was reached.",
                &self.shed,
            ),
            (
                "connections_refused_total",
                "Connections closed at accept because max_connections were open.",
                &self.connections_refused,
            ),
            (
                "client_disconnects_total",
                "Requests whose client went away before the end (cancelled on the worker).",
                &self.disconnects,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP wirepool_gateway_{name} {help}");
            let _ = writeln!(out, "# TYPE wirepool_gateway_{name} counter");
            let _ = writeln!(out, "wirepool_gateway_{name} {}", v.load(Relaxed));
        }
        out.push_str(
            "# HELP wirepool_gateway_pending Requests admitted now (in flight or queued).\n",
        );
        out.push_str("# TYPE wirepool_gateway_pending gauge\n");
        let _ = writeln!(out, "wirepool_gateway_pending {in_flight}");
    }
}
