//! The opt-in retry policy (PROTOCOL.md 21.7) against real worker processes: a request of a
//! method marked idempotent whose worker dies is sent again, as a new request, preferably to
//! another worker, at most `attempts` times, within its deadline; a stream only before any of
//! its rows reached the caller; nothing else is ever sent twice.
//!
//! The test worker's `crash_unless_marked` and `rows_unless_marked` create a marker file named
//! in the request: the first attempt (no marker yet) aborts, a later one serves, so each test
//! knows how often its request ran and on which process (the marker holds the first's pid).

mod common;
#[cfg(feature = "remote")]
mod remote_support;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use wirepool::blocking::BlockingPool;
use wirepool::{codes, CallOptions, Error, Pool, RestartPolicy, RetryPolicy, RowStream};

fn fast_restarts() -> RestartPolicy {
    RestartPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        max_restarts: 1_000,
        within: Duration::from_secs(60),
        reset_after: Duration::from_secs(1),
    }
}

/// A marker path of its own for each use, removed when dropped.
struct Marker(PathBuf);

impl Marker {
    fn new() -> Marker {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("wirepool-retry-{}-{n}.marker", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Marker(path)
    }
    fn path(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
    /// The pid of the attempt that created it, if one did.
    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(&self.0).ok()?.trim().parse().ok()
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn pool(workers: usize, retry: RetryPolicy) -> Pool {
    let pool = builder(workers)
        .restart_policy(fast_restarts())
        .worker_output(wirepool::WorkerOutput::Discard)
        .retry(retry)
        .start()
        .await
        .unwrap();
    assert!(pool.wait_ready(Duration::from_secs(10)).await);
    pool
}

fn requests(pool: &Pool) -> u64 {
    pool.metrics().workers.iter().map(|w| w.requests).sum()
}

async fn finish(pool: Pool) {
    let pids = pool.worker_pids();
    pool.shutdown().await;
    assert_reaped(&pids);
}

// The stream and its future cross tasks and threads as before the retry state was added.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<RowStream<u64>>();
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_call_whose_worker_dies_succeeds_on_its_second_attempt() {
    bounded(30, async {
        let pool = pool(
            1,
            RetryPolicy::idempotent(["crash_unless_marked"]).attempts(3),
        )
        .await;
        let marker = Marker::new();
        let pid: u32 = pool
            .call("crash_unless_marked", &(marker.path(), 0u64, 0u64))
            .await
            .unwrap();
        let first = marker.pid().expect("the first attempt ran");
        assert_ne!(pid, first, "answered by the replacement");
        let m = pool.metrics();
        assert_eq!(m.total_retries(), 1, "{m:?}");
        assert_eq!(requests(&pool), 2);
        assert_eq!(m.methods["crash_unless_marked"].count, 2, "{m:?}");
        finish(pool).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_not_marked_idempotent_is_never_sent_again() {
    bounded(30, async {
        let pool = pool(1, RetryPolicy::idempotent(["add"]).attempts(3)).await;
        let marker = Marker::new();
        let e = pool
            .call::<_, u32>("crash_unless_marked", &(marker.path(), 0u64, 0u64))
            .await
            .unwrap_err();
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        let info = e.exit_info().unwrap();
        assert_eq!(info.attempts, 1, "{info:?}");
        assert_eq!(Some(info.pid), marker.pid(), "{info:?}");
        assert!(!e.to_string().contains("attempts"), "{e}");
        assert_eq!(requests(&pool), 1);
        // The call's own mark wins over the policy, both ways.
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let marker = Marker::new();
        let e = pool
            .call_with::<_, u32>(
                "crash_unless_marked",
                &(marker.path(), 0u64, 0u64),
                CallOptions::idempotent(false),
            )
            .await
            .unwrap_err();
        assert_eq!(e.exit_info().unwrap().attempts, 1, "{e}");
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let marker = Marker::new();
        let pid: u32 = pool
            .call_with(
                "crash_unless_marked",
                &(marker.path(), 0u64, 0u64),
                CallOptions::idempotent(true),
            )
            .await
            .unwrap();
        assert_ne!(Some(pid), marker.pid());
        assert_eq!(pool.metrics().total_retries(), 1);
        finish(pool).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_attempt_dies_the_caller_gets_the_last_with_the_count() {
    bounded(30, async {
        let pool = pool(1, RetryPolicy::idempotent(["abort"]).attempts(4)).await;
        let first_pid = pool.worker_pids()[0];
        let e = pool.call::<_, ()>("abort", &()).await.unwrap_err();
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        let info = e.exit_info().unwrap();
        assert_eq!(info.attempts, 4, "{info:?}");
        assert_ne!(info.pid, first_pid, "the last attempt's worker");
        assert!(e.to_string().contains("after 4 attempts"), "{e}");
        assert_eq!(requests(&pool), 4);
        let m = pool.metrics();
        assert_eq!(m.total_retries(), 3, "{m:?}");
        // The last death is counted by its slot once it was reaped: maybe not yet.
        assert!(m.total_restarts() >= 3, "{m:?}");
        // The default policy: three tries in all (as the Python pool's).
        finish(pool).await;
        let pool = pool_default_attempts().await;
        let e = pool.call::<_, ()>("abort", &()).await.unwrap_err();
        assert_eq!(e.exit_info().unwrap().attempts, 3, "{e}");
        finish(pool).await;
    })
    .await
}

async fn pool_default_attempts() -> Pool {
    pool(1, RetryPolicy::idempotent(["abort"])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_or_panic_is_the_answer_not_retried() {
    bounded(30, async {
        let pool = pool(1, RetryPolicy::idempotent(["fail", "panic"]).attempts(3)).await;
        let e = pool.call::<_, ()>("fail", &1234u32).await.unwrap_err();
        assert_eq!(e.code(), 1234, "{e}");
        let Error::Remote { details, .. } = &e else {
            panic!("{e:?}")
        };
        assert!(!details.contains("attempts"), "{details}");
        let e = pool.call::<_, ()>("panic", &()).await.unwrap_err();
        assert_eq!(e.code(), codes::HANDLER_PANIC, "{e}");
        assert_eq!(requests(&pool), 2);
        assert_eq!(pool.metrics().total_retries(), 0);
        finish(pool).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stay_within_the_original_deadline_and_a_deadline_is_not_retried() {
    bounded(30, async {
        let pool = pool(
            2,
            RetryPolicy::idempotent(["crash_unless_marked"]).attempts(3),
        )
        .await;
        let marker = Marker::new();
        // 2 s in all: the first attempt dies at 1.5 s, the second would take 10 s. Sent with a
        // fresh 2 s budget it would end at 3.5 s or later; within what is left, at 2 s.
        let started = Instant::now();
        let e = pool
            .call_with::<_, u32>(
                "crash_unless_marked",
                &(marker.path(), 1_500u64, 10_000u64),
                CallOptions::timeout(Duration::from_secs(2)),
            )
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert_eq!(e.code(), codes::DEADLINE_EXCEEDED, "{e}");
        assert!(
            took >= Duration::from_millis(1_500) && took < Duration::from_millis(3_000),
            "{took:?}"
        );
        if let Error::Remote { details, .. } = &e {
            let details: serde_json::Value = serde_json::from_str(details).unwrap();
            assert_eq!(details["attempts"], 2, "{details}");
        }
        // The deadline ended the second attempt: no third.
        assert_eq!(requests(&pool), 2);
        assert_eq!(pool.metrics().total_retries(), 1);
        finish(pool).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_rows_reached_the_caller_is_not_sent_again() {
    bounded(30, async {
        let pool = pool(1, RetryPolicy::idempotent(["rows_then_crash"]).attempts(3)).await;
        let mut rows = pool
            .stream::<_, u64>("rows_then_crash", &3u64)
            .await
            .unwrap();
        let mut got = Vec::new();
        let e = loop {
            match rows.next().await {
                Some(Ok(row)) => got.push(row),
                Some(Err(e)) => break e,
                None => panic!("the stream ended without its worker's death"),
            }
        };
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        assert_eq!(e.exit_info().unwrap().attempts, 1);
        assert!(rows.next().await.is_none());
        assert_eq!(requests(&pool), 1);
        assert_eq!(pool.metrics().total_retries(), 0);
        finish(pool).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_worker_died_before_any_row_is_sent_again() {
    bounded(30, async {
        let pool = pool(1, RetryPolicy::idempotent(["rows_unless_marked"])).await;
        let marker = Marker::new();
        let mut rows = pool
            .stream::<_, u64>("rows_unless_marked", &(marker.path(), 5u64))
            .await
            .unwrap();
        assert_eq!(rows.collect_rows().await.unwrap(), [0, 1, 2, 3, 4]);
        let pid: u32 = rows.summary().unwrap().unwrap();
        assert_ne!(Some(pid), marker.pid());
        assert_eq!(pool.metrics().total_retries(), 1);
        assert_eq!(pool.metrics().methods["rows_unless_marked"].count, 1);
        // Every try dies: the last death, with the count.
        drop(marker);
        let pool2 = pool;
        let e = {
            let mut rows = pool2
                .stream_with::<_, u64>("rows_then_crash", &0u64, CallOptions::idempotent(true))
                .await
                .unwrap();
            rows.next().await.unwrap().unwrap_err()
        };
        assert_eq!(e.exit_info().unwrap().attempts, 3, "{e}");
        finish(pool2).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_workers_the_retry_goes_to_the_other_one() {
    bounded(30, async {
        let pool = pool(2, RetryPolicy::idempotent(["crash_unless_marked"])).await;
        let before = pool.worker_pids();
        for _ in 0..3 {
            assert!(pool.wait_ready(Duration::from_secs(10)).await);
            let ready: Vec<u32> = pool.worker_pids();
            let marker = Marker::new();
            let pid: u32 = pool
                .call("crash_unless_marked", &(marker.path(), 0u64, 0u64))
                .await
                .unwrap();
            let first = marker.pid().unwrap();
            assert_ne!(pid, first);
            assert!(
                ready.contains(&pid),
                "answered by {pid}, not the other worker of {ready:?} (the first was {first})"
            );
        }
        assert!(!before.is_empty());
        assert_eq!(pool.metrics().total_retries(), 3);
        finish(pool).await;
    })
    .await
}

/// The blocking facade gets the policy from the pool: its stream is first polled outside the
/// runtime, where a retry's wait must not start.
#[test]
fn the_blocking_facade_retries_calls_and_streams() {
    let pool = BlockingPool::start(
        builder(1)
            .restart_policy(fast_restarts())
            .worker_output(wirepool::WorkerOutput::Discard)
            .retry(RetryPolicy::idempotent([
                "crash_unless_marked",
                "rows_unless_marked",
            ])),
    )
    .unwrap();
    let started = Instant::now();
    let marker = Marker::new();
    let pid: u32 = pool
        .call("crash_unless_marked", &(marker.path(), 0u64, 0u64))
        .unwrap();
    assert_ne!(Some(pid), marker.pid());
    let marker = Marker::new();
    let rows = pool
        .stream::<_, u64>("rows_unless_marked", &(marker.path(), 3u64))
        .unwrap();
    // Its worker's death is in the stream before the first look: the retry starts in the
    // poll made outside the runtime.
    while pool.metrics().total_restarts() < 2 {
        assert!(started.elapsed() < Duration::from_secs(20), "no death");
        std::thread::sleep(Duration::from_millis(5)); // polling, bounded
    }
    let rows: Vec<u64> = rows.collect::<Result<_, _>>().unwrap();
    assert_eq!(rows, [0, 1, 2]);
    assert_eq!(pool.metrics().total_retries(), 2);
    assert!(started.elapsed() < Duration::from_secs(30));
    pool.shutdown();
}

/// A remote worker whose connection is cut mid-call: WORKER_EXITED (connection lost), and the
/// idempotent call is sent again to its replacement, which joins through the proxy again.
#[cfg(feature = "remote")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_call_cut_off_with_its_connection_is_sent_again() {
    use remote_support::Proxy;
    use std::sync::Arc;
    use wirepool::remote::{Launcher, Listener, ListenerOptions};
    bounded(60, async {
        let listener = Listener::start(ListenerOptions::default()).await.unwrap();
        let proxy = Arc::new(Proxy::start(listener.local_addr()).await);
        let port = proxy.port;
        let pool = builder(1)
            .launcher(
                Launcher::subprocess()
                    .child_ticket(move |t| t.with_address("127.0.0.1", port).unwrap())
                    .stop_grace(Duration::from_secs(1)),
            )
            .listener(listener)
            .heartbeat(Duration::from_millis(200))
            .restart_policy(RestartPolicy {
                initial_backoff: Duration::from_millis(10),
                ..Default::default()
            })
            .worker_output(wirepool::WorkerOutput::Discard)
            .retry(RetryPolicy::idempotent(["crash_unless_marked"]))
            .start()
            .await
            .unwrap();
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let marker = Marker::new();
        let call = {
            let (pool, path) = (pool.clone(), marker.path());
            // The first attempt would run 30 s before it aborts: the cut comes first.
            tokio::spawn(async move {
                pool.call::<_, u32>("crash_unless_marked", &(path, 30_000u64, 0u64))
                    .await
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while marker.pid().is_none() {
            assert!(Instant::now() < deadline, "the first attempt never ran");
            tokio::time::sleep(Duration::from_millis(10)).await; // polling, bounded
        }
        let first = marker.pid().unwrap();
        proxy.cut();
        let pid = call.await.unwrap().unwrap();
        assert_ne!(pid, first);
        let m = pool.metrics();
        assert_eq!(m.total_retries(), 1, "{m:?}");
        assert_eq!(m.workers[0].host.as_deref(), Some("127.0.0.1"));
        pool.shutdown().await;
    })
    .await
}
