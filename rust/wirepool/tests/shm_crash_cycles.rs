//! Crash cycles with large payloads in flight on the shared-memory lane (PROTOCOL.md 20.4,
//! "either side dies"; issue 13): in each cycle a worker is SIGKILLed while it holds a view of
//! the parent's region (a `hold_raw` body), with an echo of its own in flight, while the other
//! worker serves large echoes. Every request ends with exactly one outcome (the killed worker's
//! `WorkerExited`, or its answer), every answer equals what was sent, the pool is back to
//! exactly `workers` workers after each death (each counted once), and at the end the parent
//! holds no memory file, no mapping of one, and no descriptor more than before.
//!
//! `WIREPOOL_SHM_CRASH_CYCLES` sets the number of cycles (default 100, about 10 s in `make
//! test`); `make test-shm-crash-cycles` runs the 1,000 (CI's fuzz stage).

mod common;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{bounded, builder, children};
use wirepool::{CallOptions, Codec, Error, RestartPolicy};

/// This process's descriptors: all of them, and those of wirepool's memory files.
fn descriptors() -> (usize, usize) {
    let mut all = 0;
    let mut memfd = 0;
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        all += 1;
        if std::fs::read_link(e.path())
            .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:wirepool-shm"))
        {
            memfd += 1;
        }
    }
    (all, memfd)
}

/// This process's mappings: all of them, and those of wirepool's memory files.
fn mappings() -> (usize, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let memfd = maps
        .lines()
        .filter(|l| l.contains("/memfd:wirepool-shm"))
        .count();
    (maps.lines().count(), memfd)
}

fn payload(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

type Call = Pin<Box<dyn Future<Output = wirepool::Result<Bytes>> + Send>>;

/// A call polled once (which writes its request) and its outcome if that poll ended it.
struct Sent {
    call: Call,
    early: Option<wirepool::Result<Bytes>>,
}

impl Sent {
    async fn outcome(self) -> wirepool::Result<Bytes> {
        match self.early {
            Some(r) => r,
            None => self.call.await,
        }
    }
}

/// Polls each call once, in order: each request is written to its worker's connection in
/// that order.
async fn send_all(calls: Vec<Call>) -> Vec<Sent> {
    let mut sent: Vec<Sent> = calls
        .into_iter()
        .map(|call| Sent { call, early: None })
        .collect();
    std::future::poll_fn(|cx| {
        for s in sent.iter_mut() {
            if let Poll::Ready(r) = s.call.as_mut().poll(cx) {
                s.early = Some(r);
            }
        }
        Poll::Ready(())
    })
    .await;
    sent
}

// One test: the descriptor and mapping counts are of the whole process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_cycles_with_large_payloads_in_flight_leak_nothing() {
    const WORKERS: usize = 2;
    let cycles: usize = std::env::var("WIREPOOL_SHM_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let before_pool = descriptors();
    let raw = || CallOptions::codec(Codec::Raw);
    // Bodies above the lane's 1 MiB threshold, each of another size and content.
    let held = payload(2 << 20, 1);
    let echoed = payload(3 << 20, 2);
    let elsewhere = payload(4 << 20, 3);
    let started = Instant::now();
    bounded(60 + cycles as u64 / 2, async {
        let pool = builder(WORKERS)
            .restart_policy(RestartPolicy {
                initial_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(1),
                max_restarts: u32::MAX,
                within: Duration::from_secs(3600),
                reset_after: Duration::from_secs(3600),
            })
            .start()
            .await
            .unwrap();
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let with_workers = descriptors();
        let (mut answered, mut exited) = (0usize, 0usize);
        for cycle in 0..cycles {
            assert!(
                pool.wait_ready(Duration::from_secs(10)).await,
                "cycle {cycle}: the pool did not get back to {WORKERS} workers"
            );
            let lease = pool.lease().await.unwrap();
            let victim = lease.pid();
            let lease = std::sync::Arc::new(lease);
            let on_victim = |method: &'static str, body: &Bytes| -> Call {
                let (lease, body) = (lease.clone(), body.clone());
                Box::pin(async move { lease.call_with(method, &body, raw()).await })
            };
            let on_pool = |body: &Bytes| -> Call {
                let (pool, body) = (pool.clone(), body.clone());
                Box::pin(async move { pool.call_raw("echo_raw", body).await })
            };
            let sent = send_all(vec![
                on_victim("hold_raw", &held),
                on_victim("echo_raw", &echoed),
                on_pool(&elsewhere),
                on_pool(&elsewhere),
            ])
            .await;
            // The victim reads its requests in order: once `pid` answers, it holds the hold's
            // body (a view of the parent's region) and has the echo.
            assert_eq!(lease.call::<_, u32>("pid", &()).await.unwrap(), victim);
            common::kill(victim, libc::SIGKILL);
            let outcomes: Vec<_> = futures_outcomes(sent).await;
            drop(lease);
            let mut expected =
                [None, Some(&echoed), Some(&elsewhere), Some(&elsewhere)].into_iter();
            for (i, outcome) in outcomes.into_iter().enumerate() {
                let want = expected.next().unwrap();
                match (outcome, want) {
                    (Ok(body), Some(want)) => {
                        assert!(body == *want, "cycle {cycle}, call {i}: a wrong answer");
                        answered += 1;
                    }
                    (Err(Error::WorkerExited(exit)), _) if i < 2 => {
                        assert_eq!(exit.pid, victim, "cycle {cycle}, call {i}");
                        exited += 1;
                    }
                    (other, _) => panic!("cycle {cycle}, call {i}: {other:?}"),
                }
            }
            let kids = children();
            assert!(
                kids.iter().filter(|(_, s)| *s != 'Z').count() <= WORKERS,
                "cycle {cycle}: more than {WORKERS} workers: {kids:?}"
            );
        }
        assert_eq!(answered + exited, 4 * cycles, "one outcome per request");
        assert!(exited >= cycles, "every hold ended WorkerExited");
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        assert_eq!(pool.worker_pids().len(), WORKERS);
        assert_eq!(
            children().len(),
            WORKERS,
            "exactly {WORKERS} workers, every dead one reaped"
        );
        assert_eq!(
            pool.metrics().total_restarts(),
            cycles as u64,
            "each death counted once"
        );
        // Idle now: the live workers' regions are retired (20.4), so nothing of any memory file
        // is left, and the descriptors are those of the same number of workers as before.
        let deadline = Instant::now() + wirepool_io::shm::IDLE_RETIRE * 5;
        while (descriptors().1, mappings().1) != (0, 0) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            (descriptors().1, mappings().1),
            (0, 0),
            "memory files left after {cycles} crash cycles"
        );
        assert_eq!(
            descriptors(),
            with_workers,
            "descriptors after {cycles} cycles"
        );
        pool.shutdown().await;
    })
    .await;
    assert_eq!(descriptors(), before_pool, "descriptors after shutdown");
    assert_eq!(mappings().1, 0, "memory files mapped after shutdown");
    eprintln!(
        "{cycles} crash cycles in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

async fn futures_outcomes(sent: Vec<Sent>) -> Vec<wirepool::Result<Bytes>> {
    let mut out = Vec::with_capacity(sent.len());
    for s in sent {
        out.push(s.outcome().await);
    }
    out
}
