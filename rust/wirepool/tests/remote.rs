//! Remote workers of the Rust pool (PROTOCOL.md 21) on loopback: real worker processes join the
//! pool's listener over TLS 1.3 with a ticket, directly or through a test proxy that can cut or
//! blackhole their connections.
//!
//! - workers that join serve calls, streams and continued messages; a pool mixes local and
//!   remote workers and its metrics and errors say where each runs;
//! - tickets: a good one joins; a wrong secret, an expired or a revoked ticket is refused with
//!   the same `join refused`, and a certificate the ticket does not pin is refused by the
//!   worker; revoking with `drop_workers` disconnects the workers that used the ticket;
//! - a cut connection ends each request in flight with one WORKER_EXITED (connection lost), and
//!   the worker is replaced; a blackholed one is found by heartbeats on both sides;
//! - the Python conformance worker joins the Rust pool.
//!
//! The listener under a hostile crowd: tests/remote_listener.rs.

#![cfg(feature = "remote")]

mod common;
mod remote_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{bounded, builder, test_worker};
use remote_support::{error_message, raw_join, Proxy};
use wirepool::remote::{Launcher, Listener, ListenerOptions, Ticket};
use wirepool::{codes, Error, Pool, WorkerCommand, WorkerOutput};

const HEARTBEAT: Duration = Duration::from_millis(200);

fn alive(pid: u32) -> bool {
    // A zombie is not alive: it only waits to be reaped.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await; // polling, bounded by the deadline
    }
}

/// A worker process started by hand with `ticket` (as an external launcher would).
fn start_worker(ticket: &Ticket) -> tokio::process::Child {
    tokio::process::Command::new(test_worker())
        .env_remove("WIREPOOL_FD")
        .env("WIREPOOL_TICKET", ticket.encode())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Its exit status and stderr.
async fn finished(child: tokio::process::Child) -> (Option<i32>, String) {
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .expect("the worker exits")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subprocess_workers_join_over_tls_and_serve_calls_streams_and_continued_messages() {
    bounded(60, async {
        let pool = builder(2)
            .launcher(Launcher::subprocess())
            .max_frame_size(1 << 20)
            .worker_output(WorkerOutput::Discard)
            .start()
            .await
            .unwrap();
        let listener = pool.listener().expect("a pool with remote workers listens");
        assert!(listener.fingerprint().unwrap().starts_with("sha256:"));
        assert_eq!(pool.call::<_, i64>("add", &(2, 3)).await.unwrap(), 5);
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let mut rows = pool
            .stream::<_, serde_json::Value>("decls", &1000u64)
            .await
            .unwrap();
        let mut n = 0;
        while let Some(row) = rows.next().await {
            assert_eq!(row.unwrap()["i"], n);
            n += 1;
        }
        assert_eq!(n, 1000);
        // 6 MiB each way, in continued frames of 1 MiB, through TLS records of 16 KiB.
        let big: Bytes = (0..6 << 20)
            .map(|i: u32| (i * 31 + 7) as u8)
            .collect::<Vec<u8>>()
            .into();
        assert_eq!(pool.call_raw("echo_raw", big.clone()).await.unwrap(), big);
        let metrics = pool.metrics();
        let pids: Vec<u32> = metrics.workers.iter().map(|w| w.pid.unwrap()).collect();
        for w in &metrics.workers {
            assert_eq!(w.host.as_deref(), Some("127.0.0.1"), "{w:?}");
            // Children of this process: their RSS is read as for local workers.
            assert!(w.rss_bytes.is_some(), "{w:?}");
        }
        let served: std::collections::BTreeSet<u32> =
            futures_all((0..20).map(|_| pool.call::<_, u32>("pid", &()))).await;
        assert!(
            served.iter().all(|p| pids.contains(p)),
            "{served:?} {pids:?}"
        );
        let stats = listener.stats();
        assert_eq!(
            (stats.joined, stats.refused, stats.pending),
            (2, 0, 0),
            "{stats:?}"
        );
        pool.shutdown().await;
        // Drained: each said GOODBYE and exited, and was reaped before shutdown returned.
        for pid in pids {
            assert!(!alive(pid), "worker {pid} still runs");
        }
    })
    .await;
}

async fn futures_all<F, T>(futs: impl Iterator<Item = F>) -> std::collections::BTreeSet<T>
where
    F: std::future::Future<Output = wirepool::Result<T>>,
    T: Ord,
{
    let mut out = std::collections::BTreeSet::new();
    for f in futs {
        out.insert(f.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_mixes_local_and_remote_workers_and_says_where_each_runs() {
    bounded(60, async {
        let pool = builder(1)
            .add_workers(1, Launcher::subprocess())
            .worker_output(WorkerOutput::Discard)
            .start()
            .await
            .unwrap();
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let metrics = pool.metrics();
        let hosts: Vec<Option<&str>> = metrics.workers.iter().map(|w| w.host.as_deref()).collect();
        assert_eq!(hosts, [None, Some("127.0.0.1")]);
        // Both take calls: hold one busy, the other answers.
        let slow = pool.call::<_, u64>("sleep", &300u64);
        let quick = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            pool.call::<_, u32>("pid", &()).await
        };
        let (slow, quick) = tokio::join!(slow, quick);
        assert_eq!(slow.unwrap(), 300);
        let pids: Vec<u32> = metrics.workers.iter().map(|w| w.pid.unwrap()).collect();
        assert!(pids.contains(&quick.unwrap()));
        // The remote one's death says where it ran and that its connection was lost.
        let remote_pid = pids[1];
        // Lease the remote one (the local one stays leased meanwhile if it comes first).
        let first = pool.lease().await.unwrap();
        let lease = if first.pid() == remote_pid {
            first
        } else {
            let other = pool.lease().await.unwrap();
            drop(first);
            other
        };
        assert_eq!(lease.pid(), remote_pid);
        let e = lease.call::<_, ()>("abort", &()).await.unwrap_err();
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        let info = e.exit_info().expect("an exit record");
        assert_eq!(info.host.as_deref(), Some("127.0.0.1"));
        assert!(
            info.connection_lost && info.code.is_none() && info.signal.is_none(),
            "{info:?}"
        );
        assert_eq!(info.pid, remote_pid);
        assert!(e.to_string().contains("at 127.0.0.1 (pid "), "{e}");
        assert!(e.to_string().contains("lost its connection"), "{e}");
        drop(lease);
        assert!(pool.wait_ready(Duration::from_secs(20)).await);
        let hosts: Vec<Option<String>> = pool
            .metrics()
            .workers
            .iter()
            .map(|w| w.host.clone())
            .collect();
        assert_eq!(hosts, [None, Some("127.0.0.1".to_owned())]);
        pool.shutdown().await;
    })
    .await;
}

/// A pool of one external slot, its listener given, and the first worker joined with the pool
/// ticket (started by hand).
async fn external_pool(listener: &Listener) -> (Pool, tokio::process::Child) {
    let starting = tokio::spawn(
        builder(1)
            .launcher(Launcher::external().join_wait(Duration::from_secs(20)))
            .listener(listener.clone())
            .heartbeat(HEARTBEAT)
            .restart_policy(wirepool::RestartPolicy {
                initial_backoff: Duration::from_millis(10),
                ..Default::default()
            })
            .start(),
    );
    let worker = start_worker(&listener.ticket());
    let pool = starting.await.unwrap().unwrap();
    assert!(pool.wait_ready(Duration::from_secs(10)).await);
    (pool, worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_good_wrong_secret_wrong_fingerprint_expired_revoked() {
    bounded(90, async {
        let listener =
            Listener::start(ListenerOptions::default().hello_timeout(Duration::from_secs(2)))
                .await
                .unwrap();
        let ticket = listener.ticket();
        let (pool, first) = external_pool(&listener).await;
        // The good ticket joined: the pool serves, and says where its worker runs.
        assert_eq!(pool.call::<_, i64>("add", &(20, 22)).await.unwrap(), 42);
        let pid = first.id().unwrap();
        let w = &pool.metrics().workers[0];
        assert_eq!((w.host.as_deref(), w.pid), (Some("127.0.0.1"), Some(pid)));

        // A wrong secret: the same answer as every refusal, the cause only in the parent's log.
        let (code, err) = finished(start_worker(&ticket.with_secret([7; 32]))).await;
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("join refused"), "{err}");
        // A certificate the ticket does not pin: the worker refuses it before sending its secret.
        let (code, err) = finished(start_worker(&ticket.with_fingerprint([9; 32]))).await;
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains("fingerprint") && err.contains(&"09".repeat(32)),
            "{err}"
        );
        // Expired: a worker checks the expiry itself, so a raw client presents it once the
        // listener's record of it has run out (tickets expire by the second).
        let expired = listener.issue(Duration::ZERO);
        let now = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64
        };
        until(Duration::from_secs(3), "the ticket's expiry", || {
            now() > expired.expires()
        })
        .await;
        let answer = raw_join(listener.local_addr(), true, &expired.join_block())
            .await
            .unwrap();
        assert_eq!(
            error_message(&answer),
            Some((codes_bad_handshake(), "join refused".to_owned()))
        );
        // Another multi-use ticket, revoked: refused like the others.
        let other = listener.issue(Duration::from_secs(60));
        listener.revoke(&other, false);
        let (code, err) = finished(start_worker(&other)).await;
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("join refused"), "{err}");
        // A good ticket while the pool is full: parked until the HELLO bound, then told so.
        let (code, err) = finished(start_worker(&ticket)).await;
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("the pool is full"), "{err}");

        let stats = listener.stats();
        let cause = |c: &str| stats.refused_by_cause.get(c).copied().unwrap_or(0);
        assert_eq!(cause("wrong secret"), 1, "{stats:?}");
        assert_eq!(cause("tls handshake failed"), 1, "{stats:?}");
        assert_eq!(cause("expired ticket"), 1, "{stats:?}");
        assert_eq!(cause("revoked ticket"), 1, "{stats:?}");
        assert_eq!(cause("pool full"), 1, "{stats:?}");
        assert_eq!((stats.joined, stats.refused), (1, 5), "{stats:?}");
        // The first worker was never disturbed.
        assert_eq!(pool.call::<_, u32>("pid", &()).await.unwrap(), pid);
        pool.shutdown().await;
        let (code, _) = finished(first).await;
        assert_eq!(code, Some(0));
    })
    .await;
}

fn codes_bad_handshake() -> u32 {
    wirepool_proto::ErrorCode::BadHandshake.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_with_drop_workers_disconnects_them_and_the_slot_takes_the_next_join() {
    bounded(60, async {
        let listener = Listener::start(ListenerOptions::default()).await.unwrap();
        let (pool, first) = external_pool(&listener).await;
        let call = pool.call::<_, u64>("sleep", &30_000u64);
        let revoke = async {
            until(Duration::from_secs(10), "the call in flight", || {
                pool.metrics().workers[0].in_flight == 1
            })
            .await;
            listener.revoke(&listener.ticket(), true);
        };
        let (outcome, ()) = tokio::join!(call, revoke);
        let e = outcome.unwrap_err();
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        assert!(e.exit_info().unwrap().connection_lost, "{e}");
        // The worker saw end of file and left (status 0); nobody may join with the ticket now.
        assert_eq!(finished(first).await.0, Some(0));
        let (code, err) = finished(start_worker(&listener.ticket())).await;
        assert_eq!(code, Some(1), "{err}");
        // A new ticket fills the slot again.
        let fresh = listener.issue(Duration::from_secs(60));
        let second = start_worker(&fresh);
        assert!(pool.wait_ready(Duration::from_secs(20)).await);
        assert_eq!(
            pool.call::<_, u32>("pid", &()).await.unwrap(),
            second.id().unwrap()
        );
        pool.shutdown().await;
        assert_eq!(finished(second).await.0, Some(0));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_worker_that_never_joins() {
    bounded(60, async {
        let listener = Listener::start(ListenerOptions::default()).await.unwrap();
        let (pool, first) = external_pool(&listener).await;
        // The worker leaves; its slot now waits (join_wait 20 s) for another that never comes.
        let e = pool.call::<_, ()>("abort", &()).await.unwrap_err();
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        until(
            Duration::from_secs(10),
            "the slot waiting for a join",
            || pool.metrics().workers[0].state == wirepool::WorkerState::Starting,
        )
        .await;
        let started = Instant::now();
        pool.shutdown().await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let _ = finished(first).await;
    })
    .await;
}

/// A pool whose subprocess workers join through `proxy` (started on the pool's listener).
async fn proxied_pool(workers: usize, stop_grace: Duration) -> (Pool, Arc<Proxy>) {
    let listener = Listener::start(ListenerOptions::default()).await.unwrap();
    let proxy = Arc::new(Proxy::start(listener.local_addr()).await);
    let port = proxy.port;
    let pool = builder(workers)
        .launcher(
            Launcher::subprocess()
                .child_ticket(move |t| t.with_address("127.0.0.1", port).unwrap())
                .stop_grace(stop_grace),
        )
        .listener(listener)
        .heartbeat(HEARTBEAT)
        .restart_policy(wirepool::RestartPolicy {
            initial_backoff: Duration::from_millis(10),
            ..Default::default()
        })
        .worker_output(WorkerOutput::Discard)
        .start()
        .await
        .unwrap();
    assert!(pool.wait_ready(Duration::from_secs(10)).await);
    (pool, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_ends_each_request_once_and_the_worker_is_replaced() {
    bounded(60, async {
        let (pool, proxy) = proxied_pool(2, Duration::from_secs(1)).await;
        let old: Vec<u32> = pool
            .metrics()
            .workers
            .iter()
            .map(|w| w.pid.unwrap())
            .collect();
        let calls: Vec<_> = (0..6)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.call::<_, u64>("sleep", &30_000u64).await })
            })
            .collect();
        let stream = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut rows = pool
                    .stream::<_, u64>("count_slowly", &(1_000_000u64, 5u64))
                    .await?;
                let mut got = 0u64;
                while let Some(row) = rows.next().await {
                    row?;
                    got += 1;
                }
                Ok::<u64, Error>(got)
            })
        };
        until(Duration::from_secs(10), "7 requests in flight", || {
            pool.metrics()
                .workers
                .iter()
                .map(|w| w.in_flight)
                .sum::<u64>()
                == 7
        })
        .await;
        let started = Instant::now();
        proxy.cut();
        for call in calls {
            let e = call.await.unwrap().unwrap_err();
            assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
            let info = e.exit_info().unwrap();
            assert!(info.connection_lost && info.code.is_none(), "{info:?}");
            assert_eq!(info.host.as_deref(), Some("127.0.0.1"));
            assert!(old.contains(&info.pid), "{info:?}");
        }
        let e = stream.await.unwrap().unwrap_err();
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // Both replaced (through the proxy again), each death counted once.
        assert!(pool.wait_ready(Duration::from_secs(20)).await);
        assert_eq!(pool.call::<_, i64>("add", &(1, 1)).await.unwrap(), 2);
        let metrics = pool.metrics();
        assert!(metrics
            .workers
            .iter()
            .all(|w| !old.contains(&w.pid.unwrap())));
        assert_eq!(metrics.total_restarts(), 2, "{metrics:?}");
        pool.shutdown().await;
        for pid in old {
            assert!(!alive(pid), "the old worker {pid} still runs");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_is_found_by_heartbeats_on_both_sides() {
    bounded(60, async {
        // The child is given 30 s to leave by itself: if it goes sooner, its own clock did it.
        let (pool, proxy) = proxied_pool(1, Duration::from_secs(30)).await;
        let pid = pool.metrics().workers[0].pid.unwrap();
        let call = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.call::<_, u64>("sleep", &30_000u64).await })
        };
        until(Duration::from_secs(10), "the call in flight", || {
            pool.metrics().workers[0].in_flight == 1
        })
        .await;
        let started = Instant::now();
        proxy.blackhole();
        let e = call.await.unwrap().unwrap_err();
        let hung = started.elapsed();
        assert_eq!(e.code(), codes::WORKER_HUNG, "{e}");
        // Three heartbeats and a housekeeping tick, plus a loaded machine's slack.
        assert!(hung < HEARTBEAT * 3 + Duration::from_secs(2), "{hung:?}");
        // The worker's PINGs went unanswered too: it left by itself though the proxy keeps its
        // connection open.
        until(
            HEARTBEAT * 3 + Duration::from_secs(5),
            "the worker's exit",
            || !alive(pid),
        )
        .await;
        assert!(
            started.elapsed() >= HEARTBEAT * 3,
            "{:?}",
            started.elapsed()
        );
        drop(proxy);
        pool.shutdown().await;
    })
    .await;
}

/// python/conformance/worker.py under the repository's venv (python3 without one).
fn python_conformance_worker() -> WorkerCommand {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = repo.join(".venv/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    WorkerCommand::new(python)
        .arg(repo.join("python/conformance/worker.py"))
        .env("PYTHONPATH", repo.join("python"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_conformance_worker_joins_the_rust_pool() {
    bounded(60, async {
        let pool = Pool::builder(python_conformance_worker())
            .workers(2)
            .launcher(Launcher::subprocess())
            .heartbeat(HEARTBEAT)
            .worker_output(WorkerOutput::Discard)
            .start()
            .await
            .unwrap();
        let sum: serde_json::Value = pool
            .call("add", &serde_json::json!({"a": 2, "b": 40}))
            .await
            .unwrap();
        assert_eq!(sum, serde_json::json!({"sum": 42}));
        let big = Bytes::from(vec![0xa5u8; 3 << 20]);
        assert_eq!(pool.call_raw("echo", big.clone()).await.unwrap(), big);
        let mut rows = pool
            .stream::<_, serde_json::Value>("decls", &serde_json::json!({"n": 500}))
            .await
            .unwrap();
        let mut n = 0;
        while let Some(row) = rows.next().await {
            assert_eq!(row.unwrap()["name"], format!("decl_{n}"));
            n += 1;
        }
        assert_eq!(n, 500);
        // Heartbeats both ways keep an idle remote worker in the pool.
        let pids: Vec<Option<u32>> = pool.metrics().workers.iter().map(|w| w.pid).collect();
        tokio::time::sleep(HEARTBEAT * 6).await; // idle on purpose: no call for 6 heartbeats
        let after: Vec<Option<u32>> = pool.metrics().workers.iter().map(|w| w.pid).collect();
        assert_eq!(pids, after);
        assert_eq!(pool.metrics().total_restarts(), 0);
        pool.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_tcp_is_for_loopback_only_and_works_there() {
    bounded(60, async {
        let e = Listener::start(
            ListenerOptions::default()
                .bind("0.0.0.0:0".parse().unwrap())
                .advertise("10.0.0.7")
                .plain_tcp(),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("loopback only"), "{e}");
        let e = Listener::start(ListenerOptions::default().bind("0.0.0.0:0".parse().unwrap()))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("advertise"), "{e}");
        let pool = builder(1)
            .launcher(Launcher::subprocess())
            .listen(ListenerOptions::default().plain_tcp())
            .worker_output(WorkerOutput::Discard)
            .start()
            .await
            .unwrap();
        let listener = pool.listener().unwrap();
        assert!(listener.fingerprint().is_none() && !listener.ticket().tls());
        let big = Bytes::from(vec![3u8; 5 << 20]);
        assert_eq!(pool.call_raw("echo_raw", big.clone()).await.unwrap(), big);
        pool.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_cannot_join_fails_its_start_with_its_status() {
    bounded(60, async {
        // The child exits at once (a bad program for a worker): its own status and stderr, not
        // a wait for the whole join bound.
        let started = Instant::now();
        let e = Pool::builder(common::python(
            "import sys; sys.stderr.write('no joining\\n'); sys.exit(3)",
        ))
        .workers(1)
        .launcher(Launcher::subprocess())
        .startup_timeout(Duration::from_secs(30))
        .start()
        .await
        .err()
        .expect("the start fails");
        assert_eq!(e.code(), codes::WORKER_EXITED, "{e}");
        let info = e.exit_info().unwrap();
        assert_eq!(info.code, Some(3));
        assert!(
            info.stderr_tail.iter().any(|l| l.contains("no joining")),
            "{info:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    })
    .await;
}
