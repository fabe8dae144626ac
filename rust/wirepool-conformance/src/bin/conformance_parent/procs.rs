//! The runner's own process checks: its peak and current RSS (`max_parent_rss_mb`,
//! `max_rss_after_mb`) and its live child processes (`live_workers`), read from /proc.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{setting, Check, Suite};

/// Restarts VmHWM at the current RSS, so each scenario's peak is its own.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The runner's peak RSS since the last [`reset_peak_rss`], in MB.
pub fn peak_rss_mb() -> f64 {
    status_mb("VmHWM:")
}

fn rss_mb() -> f64 {
    status_mb("VmRSS:")
}

/// A `/proc/self/status` field given in kB, in MB (0 if absent).
fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// `max_rss_after_mb`: while the caller still holds the outcome (an error must not pin the dead
/// worker's buffers), the runner's RSS comes back under `limit` within `settle_s`.
pub async fn check_rss_after(suite: &Suite, sc: &Value, limit: f64) -> Check {
    let settle = Duration::from_secs_f64(setting(suite, sc, "settle_s").as_f64().unwrap_or(3.0));
    let deadline = Instant::now() + settle;
    loop {
        if rss_mb() <= limit {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the runner still holds {:.0} MB {settle:?} after the outcome (bound {limit} MB): \
                 the outcome keeps buffers alive",
                rss_mb()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // polling /proc, bounded by the deadline
    }
}

/// Our child processes that have not exited (zombies excluded): the pool's workers.
fn live_children() -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
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
            found.push(pid);
        }
    }
    found.sort_unstable();
    found
}

/// live_workers: the count must hold this long (failed replacements come and go).
const LIVE_HOLD: Duration = Duration::from_millis(500);

/// With `live_workers` (true, or an explicit count that overrides `want`): within `settle_s`,
/// our live child processes number exactly `want` and keep that number for `LIVE_HOLD` (an
/// over-spawning pool is caught once its failed replacements stop coming and going).
pub async fn check_live_workers(suite: &Suite, sc: &Value, want: usize) -> Check {
    let want = match setting(suite, sc, "live_workers") {
        Value::Bool(true) => want,
        Value::Number(n) => n.as_u64().unwrap_or(0) as usize, // an explicit count
        _ => return Ok(()),
    };
    let settle = Duration::from_secs_f64(setting(suite, sc, "settle_s").as_f64().unwrap_or(3.0));
    let deadline = Instant::now() + settle + LIVE_HOLD;
    let mut since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        since = if live_children().len() == want {
            since.or(Some(now))
        } else {
            None
        };
        if since.is_some_and(|t| now - t >= LIVE_HOLD) {
            return Ok(());
        }
        if now >= deadline {
            let live = live_children();
            return Err(format!(
                "{} live worker processes {live:?} {settle:?} after the outcome, expected {want} (for {LIVE_HOLD:?})",
                live.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // polling /proc, bounded by the deadline
    }
}
