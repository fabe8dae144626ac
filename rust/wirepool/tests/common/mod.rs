//! Shared helpers of the integration tests: where the test worker is, bounded runs, and checks
//! that every child process was reaped.

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use wirepool::{Pool, PoolBuilder, WorkerCommand};

/// The `test_worker` example, which cargo builds next to the test binaries.
pub fn test_worker() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target/<profile>");
    let path = dir.join("examples").join("test_worker");
    assert!(
        path.exists(),
        "{} missing: run through `cargo test`, which builds examples",
        path.display()
    );
    path
}

/// A builder for `n` test workers with test-friendly timings.
pub fn builder(n: usize) -> PoolBuilder {
    Pool::builder(WorkerCommand::new(test_worker()))
        .workers(n)
        .startup_timeout(Duration::from_secs(10))
        .heartbeat(Duration::from_secs(1))
}

/// A python3 one-liner as a fake worker (no shell involved).
pub fn python(code: &str) -> WorkerCommand {
    WorkerCommand::new("python3").arg("-c").arg(code)
}

/// Runs a test body with a hard time bound.
pub async fn bounded<F: Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test exceeded its time bound")
}

/// Child processes of this test process that are still there (running or zombie).
pub fn children() -> Vec<(u32, char)> {
    let me = std::process::id();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state, ppid, ...
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid: u32 = f.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        if ppid == me {
            out.push((pid, state));
        }
    }
    out
}

/// Asserts that this process has no children left (only for test binaries whose tests do not
/// run in parallel with others).
pub fn assert_no_children() {
    let kids = children();
    assert!(
        kids.is_empty(),
        "children left behind (pid, state): {kids:?}"
    );
}

/// This process's open descriptors and what they point to.
pub fn open_fds() -> std::collections::BTreeMap<u32, String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_string_lossy().parse().ok()?;
            let target = std::fs::read_link(e.path())
                .ok()?
                .to_string_lossy()
                .into_owned();
            Some((fd, target))
        })
        .collect()
}

pub fn kill(pid: u32, signal: i32) {
    // SAFETY: plain syscall on a pid we own.
    unsafe {
        libc::kill(pid as i32, signal);
    }
}

/// Asserts that none of `pids` is a child of this process any more (neither running nor a
/// zombie). Call it after the pool reported their end (errors are delivered after the reap, and
/// `shutdown` returns after every reap), so there is nothing to wait for.
pub fn assert_reaped(pids: &[u32]) {
    let left: Vec<_> = children()
        .into_iter()
        .filter(|(p, _)| pids.contains(p))
        .collect();
    assert!(left.is_empty(), "workers not reaped (pid, state): {left:?}");
}

/// Waits until none of `pids` is a child of this process any more, for at most `within`.
/// For workers the pool kills in the background (nothing to await on the API).
pub async fn wait_reaped(pids: &[u32], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while children().iter().any(|(p, _)| pids.contains(p)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers {pids:?} still alive after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded) until `n` requests are in flight on the pool's workers.
pub async fn wait_in_flight(pool: &Pool, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pool
        .metrics()
        .workers
        .iter()
        .map(|w| w.in_flight)
        .sum::<u64>()
        < n
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} requests never got in flight"
        );
        tokio::task::yield_now().await;
    }
}
