//! The shared-memory lane through the Rust pool and the Rust worker (PROTOCOL.md 20): large
//! bodies both ways equal what the socket carries, the parent's shared memory stays flat across
//! many calls (regions reused, ranges released), and a worker killed while it holds a region
//! leaks nothing in the parent and ends its request with one outcome.

mod common;

use bytes::Bytes;
use common::{bounded, builder};

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

// One test: the footprint counts are of the whole process, so nothing else may run beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_travel_through_the_lane_without_leaks_even_when_a_worker_is_killed() {
    bounded(120, async {
        let pool = builder(1).shm_lane(Some(1 << 20)).start().await.unwrap();
        let socket_pool = builder(1).shm_lane(None).start().await.unwrap();
        assert_eq!(
            shm_footprint(),
            (0, 0),
            "nothing mapped before a large call"
        );

        // 16 and 64 MiB echoes: the lane's answer equals the socket's.
        for (len, seed) in [(16 << 20, 1u8), (64 << 20, 2)] {
            let body = payload(len, seed);
            let through_lane = pool.call_raw("echo_raw", body.clone()).await.unwrap();
            // Right after the call: the answer is a view of the worker's region (mapped here);
            // the 16 MiB region was retired for the 64 MiB one (or both by the idle rule on a
            // slow machine), and received regions cost no descriptor.
            let (fds, maps) = shm_footprint();
            assert!(maps >= 1, "the lane was used: {maps} mappings");
            assert!(
                fds <= 1,
                "the parent keeps its own region's descriptor only: {fds}"
            );
            let through_socket = socket_pool
                .call_raw("echo_raw", body.clone())
                .await
                .unwrap();
            assert_eq!(through_lane.len(), len);
            assert!(through_lane == body && through_socket == body);
        }
        // A small body still goes over the socket.
        assert_eq!(
            pool.call_raw("echo_raw", Bytes::from_static(b"small"))
                .await
                .unwrap(),
            Bytes::from_static(b"small")
        );

        // Many calls: regions are reused and every range released, so nothing grows.
        let body = payload(8 << 20, 3);
        for _ in 0..10 {
            let warm = pool.call_raw("echo_raw", body.clone()).await.unwrap();
            assert!(warm == body);
        }
        let before = shm_footprint();
        for _ in 0..40 {
            let back = pool.call_raw("echo_raw", body.clone()).await.unwrap();
            assert!(back == body);
        }
        assert_eq!(
            shm_footprint(),
            before,
            "descriptors and mappings flat over 40 calls"
        );

        // The worker is SIGKILLed while it holds the parent's region: one outcome, no leak.
        let pid: u32 = pool.call("pid", &()).await.unwrap();
        let mut held = Box::pin(pool.call_raw("hold_raw", body.clone()));
        // The hold is sent first (polled first), then `pid`: the worker reads its requests in
        // order, so once `pid` answers it holds the hold's body, a view of the parent's region.
        tokio::select! {
            biased;
            early = &mut held => panic!("hold_raw ended before the kill: {early:?}"),
            p = pool.call::<_, u32>("pid", &()) => assert_eq!(p.unwrap(), pid),
        }
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        let outcome = held.await;
        assert!(
            matches!(outcome, Err(wirepool::Error::WorkerExited(_))),
            "{outcome:?}"
        );
        // The replacement serves the same calls; the dead worker's regions are gone.
        let mut replaced = false;
        for _ in 0..200 {
            match pool.call::<_, u32>("pid", &()).await {
                Ok(p) if p != pid => {
                    replaced = true;
                    break;
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
        assert!(replaced, "the worker was replaced");
        let back = pool.call_raw("echo_raw", body.clone()).await.unwrap();
        assert!(back == body);
        drop(back);
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
