//! Integration tests of the pool against real worker processes (`examples/test_worker.rs` and
//! small python3 fakes). Every test is bounded in time and checks its workers were reaped.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use serde::Deserialize;
use wirepool::{
    codes, CallOptions, Codec, Error, MethodKind, RecyclePolicy, RestartPolicy, WorkerCommand,
};

#[derive(Deserialize, Debug, PartialEq)]
struct Decl {
    i: u64,
    name: String,
    kind: String,
}

fn fast_restarts() -> RestartPolicy {
    RestartPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        max_restarts: 100_000,
        within: Duration::from_secs(60),
        reset_after: Duration::from_secs(1),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_return_typed_results_in_every_codec() {
    bounded(30, async {
        let pool = builder(2)
            .require_method("add", MethodKind::Unary)
            .start()
            .await
            .unwrap();
        let sum: i64 = pool.call("add", &(2, 40)).await.unwrap();
        assert_eq!(sum, 42);
        for codec in [Codec::Json, Codec::MsgPack, Codec::Cbor] {
            let v: serde_json::Value = pool
                .call_with(
                    "echo",
                    &serde_json::json!({"a": [1, 2, 3], "b": "x"}),
                    CallOptions {
                        codec: Some(codec),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            assert_eq!(v, serde_json::json!({"a": [1, 2, 3], "b": "x"}), "{codec}");
        }
        let big = Bytes::from(vec![0xabu8; 3 << 20]); // 3 MiB: continuation frames both ways
        let back = pool.call_raw("echo_raw", big.clone()).await.unwrap();
        assert_eq!(back, big);
        let many: Vec<i64> = futures_join((0..1000i64).map(|i| {
            let pool = pool.clone();
            async move { pool.call::<_, i64>("add", &(i, 1)).await.unwrap() }
        }))
        .await;
        assert_eq!(many, (1..=1000).collect::<Vec<i64>>());
        let m = pool.metrics();
        // Exactly one latency sample per call, also for calls sent while others were in flight
        // (their start is stamped by the writer task).
        assert_eq!(m.methods["add"].count, 1001);
        assert_eq!(m.workers.iter().map(|w| w.in_flight).sum::<u64>(), 0);
        let pids = pool.worker_pids();
        pool.shutdown().await;
        assert_reaped(&pids);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_lists_the_workers_hello_with_kinds_and_codecs() {
    bounded(30, async {
        // Nothing required: the list comes from the workers, not from the builder.
        let pool = builder(1).start().await.unwrap();
        let methods = pool.methods();
        let find = |name: &str| {
            methods
                .iter()
                .find(|m| m.name == name)
                .unwrap_or_else(|| panic!("{name} missing from {methods:?}"))
        };
        let echo = find("echo");
        assert_eq!(echo.kind, MethodKind::Unary);
        assert_eq!(echo.codecs, [Codec::Json, Codec::MsgPack, Codec::Cbor]);
        assert_eq!(find("echo_raw").codecs, [Codec::Raw]);
        assert_eq!(find("decls").kind, MethodKind::Stream);
        let mut names: Vec<&str> = methods.iter().map(|m| m.name.as_str()).collect();
        let listed = names.len();
        names.dedup();
        assert_eq!(names.len(), listed, "each method once");
        let pids = pool.worker_pids();
        pool.shutdown().await;
        assert_reaped(&pids);
    })
    .await
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_delivers_every_row_then_the_summary() {
    bounded(60, async {
        let pool = builder(1)
            .require_method("decls", MethodKind::Stream)
            .start()
            .await
            .unwrap();
        let n = 200_000u64;
        let mut rows = pool.stream::<_, Decl>("decls", &n).await.unwrap();
        let mut expect = 0u64;
        while let Some(row) = rows.next().await {
            let row = row.unwrap();
            assert_eq!(row.i, expect);
            assert_eq!(row.name, format!("decl_{expect}"));
            expect += 1;
        }
        assert_eq!(expect, n);
        assert_eq!(rows.summary::<u64>().unwrap(), Some(n));
        assert_eq!(pool.metrics().total_rows(), n);
        // Raw rows come out as shared slices of the frame.
        let mut raw = pool
            .stream_with::<_, Bytes>(
                "raw_rows",
                "10000 16",
                CallOptions {
                    codec: Some(Codec::Raw),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut count = 0;
        while let Some(r) = raw.next().await {
            assert_eq!(r.unwrap(), Bytes::from_static(&[7u8; 16]));
            count += 1;
        }
        assert_eq!(count, 10_000);
        let pids = pool.worker_pids();
        pool.shutdown().await;
        assert_reaped(&pids);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_batch_hands_out_the_rest_of_a_frame_then_whole_frames() {
    bounded(60, async {
        let pool = builder(1)
            .require_method("decls", MethodKind::Stream)
            .start()
            .await
            .unwrap();
        let n = 100_000u64;
        let mut rows = pool.stream::<_, Decl>("decls", &n).await.unwrap();
        // Three rows one at a time, then batches: the first batch is the rest of that frame.
        for i in 0..3 {
            assert_eq!(rows.next().await.unwrap().unwrap().i, i);
        }
        let (mut expect, mut batches) = (3u64, 0);
        while let Some(batch) = rows.next_batch().await {
            let batch = batch.unwrap();
            let len = batch.len() as u64;
            assert!(len > 0);
            if batches > 0 {
                assert_eq!(len, u64::from(batch.frame().count()), "a whole frame");
            }
            for row in batch {
                let row = row.unwrap();
                assert_eq!((row.i, row.name), (expect, format!("decl_{expect}")));
                expect += 1;
            }
            batches += 1;
        }
        assert_eq!(expect, n);
        assert!(batches > 1);
        assert!(rows.next().await.is_none());
        assert_eq!(rows.summary::<u64>().unwrap(), Some(n));
        // A batch dropped half-read skips its rows; the stream carries on with the next frame.
        let mut rows = pool.stream::<_, Decl>("decls", &n).await.unwrap();
        let mut first = rows.next_batch().await.unwrap().unwrap();
        let frame_rows = u64::from(first.frame().count());
        assert_eq!(first.next().unwrap().unwrap().i, 0);
        drop(first);
        assert_eq!(rows.next().await.unwrap().unwrap().i, frame_rows);
        drop(rows);
        let pids = pool.worker_pids();
        pool.shutdown().await;
        assert_reaped(&pids);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_ends_the_stream_with_one_typed_error_and_the_worker_is_replaced() {
    bounded(30, async {
        let pool = builder(1)
            .stream_window(64 * 1024)
            .restart_policy(fast_restarts())
            .start()
            .await
            .unwrap();
        let victim = pool.worker_pids()[0];
        let mut rows = pool
            .stream::<_, Decl>("decls", &100_000_000u64)
            .await
            .unwrap();
        for _ in 0..10 {
            rows.next().await.unwrap().unwrap();
        }
        kill(victim, libc::SIGKILL);
        let mut errors = Vec::new();
        while let Some(r) = rows.next().await {
            if let Err(e) = r {
                errors.push(e);
            }
        }
        assert_eq!(errors.len(), 1, "{errors:?}");
        let info = errors[0].exit_info().expect("carries exit info");
        assert_eq!(errors[0].code(), codes::WORKER_EXITED);
        assert_eq!(info.signal, Some(libc::SIGKILL));
        assert_eq!(info.pid, victim);
        assert_reaped(&[victim]);
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let pid: u32 = pool.call("pid", &()).await.unwrap();
        assert_ne!(pid, victim);
        let m = pool.metrics();
        assert_eq!(m.workers[0].restart_causes.get("crashed"), Some(&1));
        pool.shutdown().await;
        assert_reaped(&[pid]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_death_fails_every_request_in_flight_with_status_and_stderr_tail() {
    bounded(30, async {
        let pool = builder(1)
            .restart_policy(fast_restarts())
            .start()
            .await
            .unwrap();
        let victim = pool.worker_pids()[0];
        let sleepers: Vec<_> = (0..5)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.call::<_, u64>("sleep", &10_000u64).await })
            })
            .collect();
        wait_in_flight(&pool, 5).await;
        let crash = pool.call::<_, ()>("crash", &3i32).await.unwrap_err();
        for e in std::iter::once(crash).chain(
            futures_join(
                sleepers
                    .into_iter()
                    .map(|h| async move { h.await.unwrap() }),
            )
            .await
            .into_iter()
            .map(|r| r.unwrap_err()),
        ) {
            assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
            let info = e.exit_info().unwrap();
            assert_eq!(info.code, Some(3));
            assert!(
                info.stderr_tail
                    .iter()
                    .any(|l| l.contains("about to crash with status 3")),
                "{:?}",
                info.stderr_tail
            );
        }
        assert_reaped(&[victim]);
        // A stream cut by an abort carries the signal.
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let mut rows = pool
            .stream::<_, u64>("rows_then_crash", &100u64)
            .await
            .unwrap();
        let mut got = 0;
        let err = loop {
            match rows.next().await {
                Some(Ok(_)) => got += 1,
                Some(Err(e)) => break e,
                None => panic!("stream ended without error"),
            }
        };
        assert_eq!(got, 100);
        assert_eq!(err.exit_info().unwrap().signal, Some(libc::SIGABRT));
        assert!(
            rows.next().await.is_none(),
            "exactly one error, then the end"
        );
        pool.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_is_found_by_heartbeat_killed_and_replaced() {
    bounded(30, async {
        let pool = builder(1)
            .heartbeat(Duration::from_millis(100))
            .restart_policy(fast_restarts())
            .start()
            .await
            .unwrap();
        let victim = pool.worker_pids()[0];
        let call = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.call::<_, u64>("sleep", &20_000u64).await })
        };
        wait_in_flight(&pool, 1).await;
        kill(victim, libc::SIGSTOP);
        let err = call.await.unwrap().unwrap_err();
        assert_eq!(err.code(), codes::WORKER_HUNG, "{err}");
        assert_eq!(err.exit_info().unwrap().signal, Some(libc::SIGKILL));
        assert_reaped(&[victim]);
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let pid: u32 = pool.call("pid", &()).await.unwrap();
        assert_ne!(pid, victim);
        assert_eq!(
            pool.metrics().workers[0].restart_causes.get("hung"),
            Some(&1)
        );
        pool.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_panic_and_handler_error_fail_only_their_request() {
    bounded(30, async {
        let pool = builder(1).start().await.unwrap();
        let pid = pool.worker_pids()[0];
        let e = pool.call::<_, ()>("panic", &()).await.unwrap_err();
        assert_eq!(e.code(), codes::HANDLER_PANIC, "{e}");
        let e = pool.call::<_, ()>("fail", &1042u32).await.unwrap_err();
        assert_eq!(e.code(), 1042);
        assert!(
            matches!(&e, Error::Remote { message, .. } if message.contains("failed on purpose"))
        );
        let same: u32 = pool.call("pid", &()).await.unwrap();
        assert_eq!(same, pid, "the worker survived");
        assert_eq!(pool.metrics().total_restarts(), 0);
        let e = pool.call::<_, ()>("no_such_method", &()).await.unwrap_err();
        assert_eq!(e.code(), codes::UNKNOWN_METHOD);
        pool.shutdown().await;
        assert_reaped(&[pid]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_travel_on_the_wire_and_are_enforced_by_the_parent_too() {
    bounded(30, async {
        let pool = builder(1)
            .deadline_grace(Duration::from_millis(100))
            .cancel_grace(Duration::from_millis(300))
            .restart_policy(fast_restarts())
            .start()
            .await
            .unwrap();
        let pid = pool.worker_pids()[0];
        // A cooperative handler: the worker ends it with DEADLINE_EXCEEDED itself.
        let e = pool
            .call_with::<_, u64>(
                "sleep",
                &5_000u64,
                CallOptions::timeout(Duration::from_millis(100)),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), codes::DEADLINE_EXCEEDED, "{e}");
        let same: u32 = pool.call("pid", &()).await.unwrap();
        assert_eq!(same, pid);
        // A handler that ignores its deadline: the worker still ends the request when its
        // timer fires (spec 8.3), so nothing is left for the parent to cancel and the worker is
        // not killed; the abandoned handler spins on on its own thread.
        let e = pool
            .call_with::<_, u64>(
                "spin",
                &1_000u64,
                CallOptions::timeout(Duration::from_millis(100)),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code(), codes::DEADLINE_EXCEEDED, "{e}");
        // Past the parent's deadline grace and cancel grace: had the request stayed in flight,
        // the worker would be gone by now (an absence can only be checked by waiting).
        tokio::time::sleep(Duration::from_millis(600)).await;
        let same: u32 = pool.call("pid", &()).await.unwrap();
        assert_eq!(
            same, pid,
            "the worker answered the deadline itself and was not killed"
        );
        assert!(pool.metrics().workers[0].restart_causes.is_empty());
        // A handler that ignores CANCEL keeps its request in flight (spec 8.3): the parent
        // kills the worker once the cancel grace is over.
        let started = std::time::Instant::now();
        let spinning = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.call::<_, u64>("spin", &10_000u64).await })
        };
        while pool
            .metrics()
            .workers
            .iter()
            .map(|w| w.in_flight)
            .sum::<u64>()
            == 0
        {
            tokio::task::yield_now().await;
        }
        // Let the handler start: a CANCEL that finds the request still queued for a thread
        // ends it CANCELLED without running it (correctly), and nothing would be left to kill.
        tokio::time::sleep(Duration::from_millis(200)).await;
        spinning.abort(); // dropping the call sends CANCEL
        assert!(spinning.await.unwrap_err().is_cancelled());
        // Other calls are still served meanwhile (by the spinning worker's other threads), until
        // the cancel grace runs out and a fresh worker takes over. Unlike an overrun deadline, a
        // pending CANCEL does not stop routing to the worker, so a call caught by the kill ends
        // WORKER_EXITED.
        loop {
            match pool.call::<_, u32>("pid", &()).await {
                Ok(now) if now != pid => break,
                Ok(_) => {}
                Err(e) => assert_eq!(e.code(), codes::WORKER_EXITED, "{e}"),
            }
            tokio::task::yield_now().await;
        }
        // The spinning handler would run 10 s: the process ends far sooner only if killed.
        wait_reaped(&[pid], Duration::from_secs(4)).await;
        assert!(started.elapsed() < Duration::from_secs(6));
        assert_eq!(
            pool.metrics().workers[0]
                .restart_causes
                .get("cancel_timeout"),
            Some(&1)
        );
        pool.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_beyond_the_in_flight_limit_wait_and_all_finish() {
    bounded(30, async {
        // One worker with 3 slots, leased, serving 300 concurrent calls on the lease: most
        // callers wait for a freed slot while another caller waits for the worker itself (a
        // second lease); no freed slot's wake-up may go to that one and be lost.
        let pool = builder(1).max_in_flight(3).start().await.unwrap();
        let held = std::sync::Arc::new(pool.lease().await.unwrap());
        let waiting_lease = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.lease().await.map(|l| l.pid()) })
        };
        let sums: Vec<i64> = futures_join((0..300i64).map(|i| {
            let held = held.clone();
            async move { held.call::<_, i64>("add", &(i, 1)).await.unwrap() }
        }))
        .await;
        assert_eq!(sums, (1..=300).collect::<Vec<i64>>());
        assert!(
            !waiting_lease.is_finished(),
            "the only worker is still leased"
        );
        let pid = held.pid();
        drop(held);
        let second = tokio::time::timeout(Duration::from_secs(10), waiting_lease)
            .await
            .expect("the waiting lease got the released worker")
            .unwrap()
            .unwrap();
        assert_eq!(second, pid);
        assert_eq!(pool.metrics().methods["add"].count, 300);
        let pids = pool.worker_pids();
        pool.shutdown().await;
        assert_reaped(&pids);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_call_or_a_stream_cancels_it_on_the_worker() {
    bounded(30, async {
        // One slot on one worker: the next call can only run once the cancelled one ended.
        let pool = builder(1).max_in_flight(1).start().await.unwrap();
        let pid = pool.worker_pids()[0];
        let dropped = tokio::time::timeout(
            Duration::from_millis(50),
            pool.call::<_, u64>("sleep", &30_000u64),
        )
        .await;
        assert!(dropped.is_err(), "the call was still running");
        let sum: i64 = pool.call("add", &(1, 2)).await.unwrap();
        assert_eq!(sum, 3);

        let mut rows = pool
            .stream::<_, Decl>("decls", &100_000_000u64)
            .await
            .unwrap();
        for _ in 0..1000 {
            rows.next().await.unwrap().unwrap();
        }
        drop(rows);
        let sum: i64 = pool.call("add", &(2, 2)).await.unwrap();
        assert_eq!(sum, 4);
        let m = pool.metrics();
        assert_eq!(
            m.total_restarts(),
            0,
            "cancellation never killed the worker"
        );
        assert_eq!(pool.worker_pids(), vec![pid]);
        pool.shutdown().await;
        assert_reaped(&[pid]);
    })
    .await
}

/// PROTOCOL.md 14.3: rows nobody will read (the stream was dropped with frames queued, and
/// frames keep arriving after it) still count as consumed, so a worker that has not seen the
/// CANCEL yet is never left waiting for credit. The worker here never stops on CANCEL: it ends
/// only after 256 KiB of rows past it, sixteen times the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_of_a_dropped_stream_still_give_credit_back() {
    bounded(30, async {
        let window = 16 * 1024;
        let cmd = WorkerCommand::new(test_worker()).env("WIREPOOL_FAST_ECHO", "1");
        let pool = wirepool::Pool::builder(cmd)
            .workers(1)
            .stream_window(window)
            .start()
            .await
            .unwrap();
        let raw = || CallOptions {
            codec: Some(Codec::Raw),
            ..Default::default()
        };
        let mut rows = pool
            .stream_with::<_, Bytes>("deaf_stream", "262144", raw())
            .await
            .unwrap();
        assert_eq!(rows.next().await.unwrap().unwrap().len(), 1024);
        // Let the worker fill the window, so frames are queued unread when the stream goes.
        while pool.metrics().workers[0].bytes_in < window as u64 {
            tokio::task::yield_now().await;
        }
        drop(rows);
        // Answered only once the deaf stream has ended, which needs the credit.
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            pool.call_raw("deaf_report", Bytes::new()),
        )
        .await
        .expect("the worker was left waiting for credit")
        .unwrap();
        let sent: usize = std::str::from_utf8(&sent).unwrap().parse().unwrap();
        assert!(sent >= 262_144, "{sent}");
        pool.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_bounds_what_the_worker_sends_ahead() {
    bounded(30, async {
        let window = 64 * 1024;
        let pool = builder(1).stream_window(window).start().await.unwrap();
        let mut rows = pool
            .stream_with::<_, Bytes>(
                "raw_rows",
                "1000000 100",
                CallOptions {
                    codec: Some(Codec::Raw),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let mut read = 0u64;
        for round in 0..5 {
            for _ in 0..1000 {
                rows.next().await.unwrap().unwrap();
                read += 1;
            }
            // Give the worker every chance to run ahead; the credit window must stop it.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let received = pool.metrics().workers[0].bytes_in;
            let consumed = read * 104;
            // At most credit + one frame unread (section 6), plus headers and the handshake.
            let bound = consumed + window as u64 + (1 << 20) + 64 * 1024;
            assert!(
                received <= bound,
                "round {round}: received {received} > bound {bound}"
            );
        }
        drop(rows);
        pool.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycling_by_request_count_fails_no_request() {
    bounded(60, async {
        let pool = builder(1)
            .recycle_policy(RecyclePolicy {
                max_requests: Some(10),
                ..Default::default()
            })
            .start()
            .await
            .unwrap();
        let mut pids = HashSet::new();
        let calls: Vec<_> = (0..60)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.call::<_, u32>("pid", &()).await })
            })
            .collect();
        for c in calls {
            pids.insert(c.await.unwrap().expect("no request fails during recycling"));
        }
        assert!(pids.len() >= 6, "pids {pids:?}");
        let m = pool.metrics();
        assert!(
            m.workers[0]
                .restart_causes
                .get("recycled_requests")
                .copied()
                .unwrap_or(0)
                >= 5
        );
        pool.shutdown().await;
        assert_reaped(&pids.into_iter().collect::<Vec<_>>());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycling_by_rss_replaces_a_bloated_worker() {
    bounded(60, async {
        let pool = builder(1)
            .recycle_policy(RecyclePolicy {
                max_rss_bytes: Some(150 << 20),
                ..Default::default()
            })
            .start()
            .await
            .unwrap();
        let fat = pool.worker_pids()[0];
        let mb: usize = pool.call("alloc_mb", &200usize).await.unwrap();
        assert_eq!(mb, 200);
        // Keep calling until a fresh worker answers: every call must succeed meanwhile.
        loop {
            let pid: u32 = pool.call("pid", &()).await.unwrap();
            if pid != fat {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            pool.metrics().workers[0].restart_causes.get("recycled_rss"),
            Some(&1)
        );
        pool.shutdown().await;
        assert_reaped(&[fat]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_failures_are_typed_and_leave_no_process() {
    bounded(30, async {
        let e = wirepool::Pool::builder(WorkerCommand::new("/nonexistent/wirepool-worker")).workers(1).start().await.err().unwrap();
        assert_eq!(e.code(), codes::SPAWN_FAILED, "{e}");

        let e = wirepool::Pool::builder(python("import time; time.sleep(60)"))
            .workers(1)
            .startup_timeout(Duration::from_millis(300))
            .start()
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), codes::STARTUP_TIMEOUT, "{e}");

        let e = wirepool::Pool::builder(python("import sys; sys.stderr.write('leaving early\\n'); sys.exit(7)"))
            .workers(1)
            .start()
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        let info = e.exit_info().unwrap();
        assert_eq!(info.code, Some(7));
        assert_eq!(info.stderr_tail, vec!["leaving early".to_string()]);
        assert!(!e.to_string().contains("serve"), "{e}");

        // Status 0 and silent: a program that never served gets the hint (issue 28).
        let e = wirepool::Pool::builder(python("pass")).workers(1).start().await.err().unwrap();
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        assert!(e.to_string().contains("did the worker program call its SDK's serve"), "{e}");

        let e = wirepool::Pool::builder(python(
            "import os, time; fd = int(os.environ['WIREPOOL_FD']); os.write(fd, b'GARBAGE! not a frame at all'); time.sleep(30)",
        ))
        .workers(1)
        .start()
        .await
        .err()
        .unwrap();
        assert_eq!(e.code(), codes::PROTOCOL_VIOLATION, "{e}");

        let e = builder(2).require_method("no_such_method", MethodKind::Unary).start().await.err().unwrap();
        assert_eq!(e.code(), codes::CODEC_MISMATCH, "{e}");
        let e = builder(1).require_method("decls", MethodKind::Unary).start().await.err().unwrap();
        assert_eq!(e.code(), codes::CODEC_MISMATCH, "{e}");
        let e = builder(1).require_method_with_codec("echo_raw", MethodKind::Unary, Codec::Json).start().await.err().unwrap();
        assert_eq!(e.code(), codes::CODEC_MISMATCH, "{e}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_work_in_flight_then_refuses_new_calls() {
    bounded(30, async {
        let pool = builder(2).start().await.unwrap();
        let pids = pool.worker_pids();
        let calls: Vec<_> = (0..10)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.call::<_, u64>("sleep", &300u64).await })
            })
            .collect();
        // Every call is on a worker, so shutdown has work in flight to drain.
        wait_in_flight(&pool, 10).await;
        pool.shutdown().await;
        for c in calls {
            assert_eq!(c.await.unwrap().unwrap(), 300);
        }
        let e = pool.call::<_, i64>("add", &(1, 1)).await.unwrap_err();
        assert_eq!(e.code(), codes::POOL_CLOSED);
        assert_reaped(&pids);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_keeps_its_worker_and_fails_typed_when_the_worker_dies() {
    bounded(30, async {
        let pool = builder(2)
            .restart_policy(fast_restarts())
            .start()
            .await
            .unwrap();
        let lease = pool.lease().await.unwrap();
        let _: () = lease.call("set", &"warm").await.unwrap();
        for _ in 0..20 {
            let v: Option<String> = lease.call("get", &()).await.unwrap();
            assert_eq!(v.as_deref(), Some("warm"));
            // The rest of the pool keeps serving, on the other worker.
            let other: u32 = pool.call("pid", &()).await.unwrap();
            assert_ne!(other, lease.pid());
        }
        kill(lease.pid(), libc::SIGKILL);
        let first = lease
            .call::<_, Option<String>>("get", &())
            .await
            .unwrap_err();
        assert!(
            matches!(first.code(), codes::WORKER_EXITED | codes::LEASE_LOST),
            "{first}"
        );
        let second = lease
            .call::<_, Option<String>>("get", &())
            .await
            .unwrap_err();
        assert_eq!(second.code(), codes::LEASE_LOST, "{second}");
        drop(lease);
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        pool.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_printing_100_mb_never_blocks() {
    bounded(60, async {
        let pool = builder(1).start().await.unwrap();
        let n: usize = pool
            .call("print", &(100usize << 20, 50usize))
            .await
            .unwrap();
        assert_eq!(n, 100 << 20);
        let sum: i64 = pool.call("add", &(1, 1)).await.unwrap();
        assert_eq!(sum, 2);
        pool.shutdown().await;
    })
    .await
}

#[test]
fn the_blocking_facade_calls_and_streams() {
    let pool = wirepool::blocking::BlockingPool::start(builder(1)).unwrap();
    let sum: i64 = pool.call("add", &(20, 22)).unwrap();
    assert_eq!(sum, 42);
    let mut rows = pool.stream::<_, Decl>("decls", &1000u64).unwrap();
    let got: Vec<Decl> = rows.by_ref().map(|r| r.unwrap()).collect();
    assert_eq!(got.len(), 1000);
    assert_eq!(
        got[999],
        Decl {
            i: 999,
            name: "decl_999".into(),
            kind: "theorem".into()
        }
    );
    assert_eq!(rows.summary::<u64>().unwrap(), Some(1000));
    drop(rows);
    let lease = pool.lease().unwrap();
    let _: () = lease.call("set", &"s").unwrap();
    drop(lease);
    pool.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_past_the_restart_intensity_closes_the_pool() {
    bounded(30, async {
        let pool = builder(1)
            .restart_policy(RestartPolicy {
                max_restarts: 3,
                within: Duration::from_secs(60),
                ..fast_restarts()
            })
            .start()
            .await
            .unwrap();
        let mut crashes = 0;
        let closed = loop {
            match pool.call::<_, ()>("crash", &9i32).await {
                Err(e) if e.code() == codes::WORKER_EXITED => crashes += 1,
                Err(e) => break e,
                Ok(()) => panic!("crash returned"),
            }
            assert!(crashes <= 10, "the pool never gave up");
        };
        assert_eq!(closed.code(), codes::POOL_CLOSED, "{closed}");
        assert!(
            closed.to_string().contains(
                "restart intensity exceeded: 4 worker deaths within 60s (max_restarts 3)"
            ),
            "the count and window are named: {closed}"
        );
        assert_eq!(
            crashes, 4,
            "three restarts allowed, the fourth crash closes the pool"
        );
        pool.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_is_recycled() {
    bounded(30, async {
        let pool = builder(1)
            .recycle_policy(RecyclePolicy {
                max_idle: Some(Duration::from_millis(200)),
                ..Default::default()
            })
            .start()
            .await
            .unwrap();
        let first: u32 = pool.call("pid", &()).await.unwrap();
        // Stay idle past the limit (the scenario itself, not a synchronisation).
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(pool.wait_ready(Duration::from_secs(5)).await);
        let second: u32 = pool.call("pid", &()).await.unwrap();
        assert_ne!(first, second);
        assert!(
            pool.metrics().workers[0]
                .restart_causes
                .get("recycled_idle")
                .copied()
                .unwrap_or(0)
                >= 1
        );
        pool.shutdown().await;
        assert_reaped(&[first]);
    })
    .await
}

/// A hand-written worker (python3, no SDK): a valid HELLO offering `echo` (unary, JSON), then
/// garbage in answer to the first request.
const GARBAGE_AFTER_HANDSHAKE: &str = r#"
import os, struct, sys, time
fd = int(os.environ['WIREPOOL_FD'])
def str16(s): b = s.encode(); return struct.pack('<H', len(b)) + b
hello = b'WIREPOOL' + struct.pack('<HHIII', 1, 1, os.getpid(), 8, 1 << 20) + str16('py-fake') + str16('0')
hello += struct.pack('<H', 1) + struct.pack('<BBB', 1, 1, 1) + str16('echo')
os.write(fd, struct.pack('<IBBHQ', len(hello), 0x01, 0, 0, 0) + hello)
def read_exact(n):
    b = b''
    while len(b) < n:
        c = os.read(fd, n - len(b))
        if not c: sys.exit(0)
        b += c
    return b
while True:
    length, ftype = struct.unpack('<IB', read_exact(16)[:5])
    read_exact(length)
    if ftype == 0x10:
        os.write(fd, struct.pack('<IBBHQ', 0, 0x55, 0, 0, 1))  # unknown frame type
        sys.stderr.write('sent garbage\n'); sys.stderr.flush()
        time.sleep(30)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_the_handshake_is_a_protocol_violation_and_the_worker_is_replaced() {
    bounded(30, async {
        // The fake answers neither PING nor DRAIN: no heartbeat, and a short drain at the end.
        let pool = wirepool::Pool::builder(python(GARBAGE_AFTER_HANDSHAKE))
            .workers(1)
            .heartbeat(Duration::ZERO)
            .drain_grace(Duration::from_millis(200))
            .require_method("echo", MethodKind::Unary)
            .restart_policy(fast_restarts())
            .start()
            .await
            .unwrap();
        let first = pool.worker_pids()[0];
        let e = pool
            .call::<_, serde_json::Value>("echo", &1)
            .await
            .unwrap_err();
        assert_eq!(e.code(), codes::PROTOCOL_VIOLATION, "{e}");
        let exit = e
            .exit_info()
            .expect("the violation carries the worker's exit");
        assert_eq!(exit.pid, first);
        assert_eq!(exit.stderr_tail, vec!["sent garbage".to_string()]);
        assert!(
            matches!(e, Error::ProtocolViolation { code: 103, .. }),
            "UNKNOWN_FRAME_TYPE expected: {e:?}"
        );
        assert_reaped(&[first]);
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        assert_ne!(pool.metrics().workers[0].pid, Some(first));
        assert_eq!(
            pool.metrics().workers[0]
                .restart_causes
                .get("protocol_violation"),
            Some(&1)
        );
        pool.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_pool_without_shutdown_kills_and_reaps_its_workers() {
    bounded(30, async {
        let pool = builder(2).start().await.unwrap();
        let pids = pool.worker_pids();
        assert_eq!(pids.len(), 2);
        let sum: i64 = pool.call("add", &(1, 1)).await.unwrap();
        assert_eq!(sum, 2);
        drop(pool);
        // Killed at once, reaped by the pool's tasks still running on this runtime.
        wait_reaped(&pids, Duration::from_secs(5)).await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_deadline_ends_with_one_deadline_error() {
    bounded(30, async {
        let pool = builder(1).start().await.unwrap();
        let pid = pool.worker_pids()[0];
        let mut rows = pool
            .stream_with::<_, Decl>(
                "decls",
                &100_000_000u64,
                CallOptions::timeout(Duration::from_millis(200)),
            )
            .await
            .unwrap();
        let mut errors = Vec::new();
        let mut got = 0u64;
        while let Some(r) = rows.next().await {
            match r {
                Ok(_) => got += 1,
                Err(e) => errors.push(e),
            }
        }
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].code(), codes::DEADLINE_EXCEEDED, "{}", errors[0]);
        assert!(got > 0 && got < 100_000_000);
        let same: u32 = pool.call("pid", &()).await.unwrap();
        assert_eq!(same, pid, "the worker honoured its deadline and lives on");
        pool.shutdown().await;
    })
    .await
}

/// A lone call's caller reads its answer itself; a caller that stops polling (busy elsewhere,
/// or a forgotten future) must not keep the connection unread: the next call, and heartbeats,
/// still get their answers, and the first call's answer is still there when it is polled.
#[tokio::test(flavor = "current_thread")]
async fn a_caller_that_stops_polling_does_not_stall_other_calls() {
    bounded(30, async {
        let pool = builder(1).start().await.unwrap();
        let pid = pool.worker_pids()[0];
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let first = pool.call_raw("echo_raw_inline", Bytes::from_static(b"first"));
        tokio::pin!(first);
        // One poll sends the request; then its caller goes quiet while its answer arrives.
        let polled = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(first.as_mut(), cx))
        })
        .await;
        assert!(polled.is_pending());
        let in_flight: u64 = pool.metrics().workers.iter().map(|w| w.in_flight).sum();
        assert_eq!(in_flight, 1, "the first poll sent the request");
        for i in 0..20u32 {
            let body = Bytes::from(i.to_le_bytes().to_vec());
            assert_eq!(
                pool.call_raw("echo_raw_inline", body.clone())
                    .await
                    .unwrap(),
                body
            );
        }
        assert_eq!(first.await.unwrap(), Bytes::from_static(b"first"));
        assert_eq!(
            pool.worker_pids(),
            vec![pid],
            "the worker was not judged hung"
        );
        pool.shutdown().await;
        assert_reaped(&[pid]);
    })
    .await
}
