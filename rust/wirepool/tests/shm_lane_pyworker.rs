//! The shared-memory lane between the Rust pool and the Python worker (PROTOCOL.md 20):
//! 16 and 256 MiB echoes travel through regions both ways (the socket carries only the small
//! frames: counted with the pool's byte counters, and the worker sees its bodies as views of a
//! region), equal what the socket path carries, leave the parent's shared memory flat across
//! calls, and a Python worker SIGKILLed while it holds the parent's region leaks nothing in the
//! parent. A Python worker with the lane off still serves the same calls over the socket.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use common::bounded;
use wirepool::{Pool, WorkerCommand};

/// This process's descriptors and mappings of wirepool's memory files.
fn shm_footprint() -> (usize, usize) {
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:wirepool-shm"))
        })
        .count();
    let maps = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("/memfd:wirepool-shm"))
        .count();
    (fds, maps)
}

fn payload(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

/// python/tests/workers/shm_worker.py under the repository's venv (python3 without one).
fn python_worker(lane: bool) -> WorkerCommand {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = repo.join(".venv/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    WorkerCommand::new(python)
        .arg(repo.join("python/tests/workers/shm_worker.py"))
        .env("PYTHONPATH", repo.join("python"))
        .env("WIREPOOL_SHM", if lane { "1" } else { "0" })
}

async fn start(lane: bool) -> Pool {
    Pool::builder(python_worker(lane))
        .workers(1)
        .max_frame_size(16 << 20)
        .startup_timeout(Duration::from_secs(20))
        // A 256 MiB echo over the socket (the lane-off pool) ended WORKER_HUNG here in CI at
        // load ~15: the worker's PONG waited behind its whole RESULT. PING and PONG now go at
        // the next frame boundary on both sides (PROTOCOL.md 8.5: the pool's outbox, the Python
        // worker's _transport feed), so 2 s (6 s without a PONG) holds for any body size.
        .heartbeat(Duration::from_secs(2))
        .shm_lane(Some(1 << 20))
        .start()
        .await
        .unwrap()
}

/// Socket bytes (in, out) of the pool's one worker so far.
fn socket_bytes(pool: &Pool) -> (u64, u64) {
    let m = pool.metrics();
    (m.workers[0].bytes_in, m.workers[0].bytes_out)
}

#[derive(serde::Deserialize, Debug, PartialEq)]
struct LaneBodies {
    lane: u64,
    socket: u64,
}

// One test: the footprint counts are of the whole process, so nothing else may run beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_to_a_python_worker_travel_through_the_lane_without_leaks() {
    bounded(240, async {
        assert_eq!(shm_footprint(), (0, 0), "nothing mapped before the pools");
        let pool = start(true).await;
        let socket_pool = start(false).await;

        // 16 and 256 MiB echoes: through regions both ways, equal to the socket path's answer.
        for (len, seed) in [(16usize << 20, 1u8), (256 << 20, 2)] {
            let body = payload(len, seed);
            let (in0, out0) = socket_bytes(&pool);
            let through_lane = pool.call_raw("echo_raw", body.clone()).await.unwrap();
            let (in1, out1) = socket_bytes(&pool);
            assert!(through_lane == body, "{len} bytes through the lane");
            assert!(
                in1 - in0 < 4096 && out1 - out0 < 4096,
                "{len} bytes echoed with {} bytes in and {} out on the socket",
                in1 - in0,
                out1 - out0
            );
            drop(through_lane);
            let through_socket = socket_pool
                .call_raw("echo_raw", body.clone())
                .await
                .unwrap();
            assert!(through_socket == body, "{len} bytes over the socket");
            let (sin, sout) = socket_bytes(&socket_pool);
            assert!(
                sin >= len as u64 && sout >= len as u64,
                "the lane-off worker used the socket"
            );
        }
        let seen: LaneBodies = pool.call("lane_bodies", &()).await.unwrap();
        assert_eq!(seen, LaneBodies { lane: 2, socket: 0 });
        let seen: LaneBodies = socket_pool.call("lane_bodies", &()).await.unwrap();
        assert_eq!(seen, LaneBodies { lane: 0, socket: 2 });
        // A small body still goes over the socket, as do results below the threshold.
        assert_eq!(
            pool.call_raw("echo_raw", Bytes::from_static(b"small"))
                .await
                .unwrap(),
            Bytes::from_static(b"small")
        );

        // Many calls, inline and from a handler thread: regions are reused and every range
        // released (the worker's views are dropped), so nothing grows in the parent.
        let body = payload(8 << 20, 3);
        for method in ["echo_raw", "echo_thread_raw"] {
            for _ in 0..5 {
                let warm = pool.call_raw(method, body.clone()).await.unwrap();
                assert!(warm == body);
            }
        }
        let before = shm_footprint();
        assert!(
            before.1 >= 2,
            "the parent maps its region and the worker's: {before:?}"
        );
        for i in 0..30 {
            let method = if i % 2 == 0 {
                "echo_raw"
            } else {
                "echo_thread_raw"
            };
            let back = pool.call_raw(method, body.clone()).await.unwrap();
            assert!(back == body);
        }
        assert_eq!(
            shm_footprint(),
            before,
            "descriptors and mappings flat over 30 calls"
        );

        // The worker is SIGKILLed while it holds a view of the parent's region: one outcome,
        // and nothing of it left in the parent.
        let pid: u32 = pool.call("pid", &()).await.unwrap();
        let mut held = Box::pin(pool.call_raw("hold_raw", body.clone()));
        // The hold is sent first (polled first), then `lane_bodies`: the worker reads its
        // requests in order, so once that answers it has the hold's body; its handler thread
        // counts it soon after (polled, bounded).
        tokio::select! {
            biased;
            early = &mut held => panic!("hold_raw ended before the kill: {early:?}"),
            seen = pool.call::<_, LaneBodies>("lane_bodies", &()) => { seen.unwrap(); }
        }
        let mut holding = false;
        for _ in 0..500 {
            let seen: LaneBodies = pool.call("lane_bodies", &()).await.unwrap();
            if seen.lane == 43 {
                holding = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(holding, "the held body came through the lane");
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        let outcome = held.await;
        assert!(
            matches!(outcome, Err(wirepool::Error::WorkerExited(_))),
            "{outcome:?}"
        );
        let mut replaced = false;
        for _ in 0..500 {
            match pool.call::<_, u32>("pid", &()).await {
                Ok(p) if p != pid => {
                    replaced = true;
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        assert!(replaced, "the worker was replaced");
        for _ in 0..5 {
            let back = pool.call_raw("echo_raw", body.clone()).await.unwrap();
            assert!(back == body);
        }
        assert_eq!(
            shm_footprint(),
            before,
            "nothing of the dead worker is left"
        );
        pool.shutdown().await;
        socket_pool.shutdown().await;
    })
    .await;
    assert_eq!(shm_footprint(), (0, 0), "all unmapped after shutdown");
}
