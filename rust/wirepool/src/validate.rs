//! Caller input (PROTOCOL.md 22): the one place where the pool's options and a call's options
//! are checked against their ranges. A value out of range is `INVALID_ARGUMENT` (308), raised
//! before any worker is spawned or anything is sent; nothing is clamped.

use std::fmt::Debug;
use std::time::Duration;

use wirepool_proto::constants as c;
use wirepool_proto::{
    HANDSHAKE_MAX_FRAME_SIZE as MIN_MAX_FRAME_SIZE, MAX_CREDIT, MAX_MAX_FRAME_SIZE,
};

use crate::config::PoolConfig;
use crate::error::{Error, Result};

// The bounds of `spec/constants.json` `caller_input` (the generated constants), in the types
// this module compares in.

/// `max_timeout_ms`: the longest duration the pool takes (about 24.8 days, the largest delay a
/// JavaScript timer holds).
pub const MAX_TIMEOUT_MS: u64 = c::MAX_TIMEOUT_MS as u64;
/// `max_workers`.
pub const MAX_WORKERS: usize = c::MAX_WORKERS as usize;
/// `max_count`: the largest count (`max_in_flight`, `max_restarts`, ...).
pub const MAX_COUNT: u64 = c::MAX_COUNT as u64;
/// `max_size`: the largest size in bytes or requests (2^53 - 1).
pub const MAX_SIZE: u64 = c::MAX_SIZE;
/// `quoted_max_chars`: how much of a caller's string an error message quotes.
pub const QUOTED_MAX_CHARS: usize = c::QUOTED_MAX_CHARS as usize;

const MAX_TIMEOUT: Duration = Duration::from_millis(MAX_TIMEOUT_MS);
const MS: Duration = Duration::from_millis(1);

fn invalid(option: &'static str, message: String) -> Error {
    Error::InvalidArgument { option, message }
}

/// `v` within `lo..=hi`, else INVALID_ARGUMENT naming `option` and the range.
fn within<T: PartialOrd + Debug>(option: &'static str, v: T, lo: T, hi: T) -> Result<()> {
    if v < lo || v > hi {
        return Err(invalid(
            option,
            format!("must be {lo:?} - {hi:?}, got {v:?}"),
        ));
    }
    Ok(())
}

/// A duration of 0 (when `zero` allows it) or 1 ms - `max_timeout_ms`.
fn duration(option: &'static str, d: Duration, zero: bool) -> Result<()> {
    if zero && d.is_zero() {
        return Ok(());
    }
    within(
        option,
        d,
        if zero { Duration::ZERO } else { MS },
        MAX_TIMEOUT,
    )
}

/// A count or size that is `None` (no limit) or 1 - `max_size`.
fn limit(option: &'static str, v: Option<u64>) -> Result<()> {
    v.map_or(Ok(()), |v| within(option, v, 1, MAX_SIZE))
}

/// Every pool option of PROTOCOL.md 22.2, called by the pool's start before anything else.
pub(crate) fn pool_options(cfg: &PoolConfig) -> Result<()> {
    within("workers", slots(cfg), 1, MAX_WORKERS)?;
    within("max_in_flight", u64::from(cfg.max_in_flight), 1, MAX_COUNT)?;
    timings(cfg)?;
    restart_policy(cfg)?;
    within(
        "max_frame_size",
        cfg.max_frame_size,
        MIN_MAX_FRAME_SIZE,
        MAX_MAX_FRAME_SIZE,
    )?;
    within(
        "initial_credit",
        i64::from(cfg.initial_credit),
        1,
        MAX_CREDIT,
    )?;
    let frame = u64::from(cfg.max_frame_size);
    within("max_message_size", cfg.max_message_size, frame, MAX_SIZE)?;
    within(
        "stderr_tail_lines",
        cfg.stderr_tail_lines as u64,
        0,
        MAX_COUNT,
    )?;
    within(
        "retry_attempts",
        cfg.retry.max_attempts(),
        1,
        crate::RetryPolicy::MAX_ATTEMPTS,
    )?;
    limit("max_requests", cfg.recycle.max_requests)?;
    limit("max_rss_bytes", cfg.recycle.max_rss_bytes)?;
    if let Some(idle) = cfg.recycle.max_idle {
        duration("max_idle", idle, false)?;
    }
    command(cfg)
}

/// The pool's slots: `workers` and the added ones.
fn slots(cfg: &PoolConfig) -> usize {
    #[cfg(feature = "remote")]
    let added = cfg
        .added
        .iter()
        .fold(0usize, |n, (k, _)| n.saturating_add(*k));
    #[cfg(not(feature = "remote"))]
    let added = 0;
    cfg.workers.saturating_add(added)
}

fn timings(cfg: &PoolConfig) -> Result<()> {
    duration("startup_timeout", cfg.startup_timeout, false)?;
    duration("heartbeat_ms", cfg.heartbeat, true)?;
    duration("cancel_grace", cfg.cancel_grace, true)?;
    duration("deadline_grace", cfg.deadline_grace, true)?;
    duration("drain_grace", cfg.drain_grace, true)
}

fn restart_policy(cfg: &PoolConfig) -> Result<()> {
    let p = &cfg.restart;
    duration("restart_backoff", p.initial_backoff, true)?;
    duration("restart_backoff_max", p.max_backoff, true)?;
    if p.initial_backoff > p.max_backoff {
        return Err(invalid(
            "restart_backoff",
            format!(
                "must be at most restart_backoff_max ({:?}), got {:?}",
                p.max_backoff, p.initial_backoff
            ),
        ));
    }
    duration("restart_window", p.within, false)?;
    duration("restart_reset_after", p.reset_after, true)
}

fn command(cfg: &PoolConfig) -> Result<()> {
    if cfg.command.program().is_empty() {
        return Err(invalid("command", "must name a program, got \"\"".into()));
    }
    Ok(())
}

/// A call's timeout (PROTOCOL.md 22.3): none, or 0 (already expired: `DEADLINE_EXCEEDED` at
/// once) - `max_timeout_ms`. Checked before anything is sent.
pub(crate) fn call_timeout(timeout: Option<Duration>) -> Result<Option<Duration>> {
    match timeout {
        Some(t) if t.is_zero() => Err(Error::DeadlineExceeded(t)),
        Some(t) if t > MAX_TIMEOUT => Err(invalid(
            "timeout",
            format!("must be none or 0 - {MAX_TIMEOUT:?}, got {t:?}"),
        )),
        other => Ok(other),
    }
}

/// A validated duration in whole milliseconds, rounded up (a positive value is never 0).
pub(crate) fn ceil_ms(d: Duration) -> u32 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u32::try_from(ms).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_follow_the_spec_table() {
        let path =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/constants.json");
        let c: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let c = &c["caller_input"];
        assert_eq!(c["max_timeout_ms"], MAX_TIMEOUT_MS);
        assert_eq!(c["max_workers"], MAX_WORKERS as u64);
        assert_eq!(c["max_count"], MAX_COUNT);
        assert_eq!(c["max_size"], MAX_SIZE);
        assert_eq!(c["quoted_max_chars"], QUOTED_MAX_CHARS as u64);
    }

    #[test]
    fn timeouts() {
        assert!(matches!(
            call_timeout(Some(Duration::ZERO)),
            Err(Error::DeadlineExceeded(_))
        ));
        assert_eq!(call_timeout(Some(Duration::MAX)).unwrap_err().code(), 308);
        assert_eq!(call_timeout(Some(MAX_TIMEOUT)).unwrap(), Some(MAX_TIMEOUT));
        assert_eq!(call_timeout(None).unwrap(), None);
        assert_eq!(ceil_ms(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_ms(Duration::from_millis(7)), 7);
    }

    #[test]
    fn quotes_are_bounded() {
        let long = "m".repeat(1 << 20);
        let q = crate::error::quote(&long);
        assert!(q.len() < 300, "{q}");
        assert!(q.ends_with("(1048576 bytes)"), "{q}");
        assert_eq!(crate::error::quote("add"), "\"add\"");
    }
}
