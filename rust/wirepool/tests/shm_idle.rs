//! Idle regions are retired (PROTOCOL.md 20.4, `shm_idle_retire`): after large bodies both
//! ways, a connection that sends nothing more holds no shared memory on either side a moment
//! later (the parent's and the worker's own regions closed and unmapped, each side's mapping of
//! the other's gone), and the next large call simply announces a new region; a region lent for
//! longer than the idle time is kept for the next body.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{bounded, builder};

/// Descriptors and mappings of wirepool's memory files in process `pid` ("self" for this one).
fn shm_footprint(pid: &str) -> (usize, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:wirepool-shm"))
        })
        .count();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("/memfd:wirepool-shm"))
        .count();
    (fds, maps)
}

/// The inodes of the memory files this process holds a descriptor of (its own regions).
fn memfd_inodes() -> std::collections::BTreeSet<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:wirepool-shm"))
        })
        .filter_map(|e| std::fs::metadata(e.path()).ok().map(|m| m.ino()))
        .collect()
}

/// Polls (bounded) until both processes hold no shared memory; returns how long it took.
async fn until_released(worker: &str, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if shm_footprint("self") == (0, 0) && shm_footprint(worker) == (0, 0) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_regions_are_retired_on_both_sides() {
    bounded(60, async {
        let pool = builder(1).start().await.unwrap();
        let pid: u32 = pool.call("pid", &()).await.unwrap();
        let worker = pid.to_string();
        let body = Bytes::from(vec![7u8; 3 << 20]);
        for _ in 0..2 {
            let back = pool.call_raw("echo_raw", body.clone()).await.unwrap();
            assert!(back == body);
            // The answer came through the worker's region: the parent maps it (the view holds
            // it) and the worker keeps it (lent until the view goes), whatever the idle rule
            // did meanwhile to the parent's region on a slow machine.
            let (_, maps) = shm_footprint("self");
            assert!(maps >= 1, "parent: {maps} maps");
            let (fds, _) = shm_footprint(&worker);
            assert!(fds >= 1, "worker: {fds} fds");
            drop(back);
            // Idle: everything goes within the idle time plus the drivers' ticks (and slack for
            // a loaded machine).
            let took = until_released(&worker, wirepool_io::shm::IDLE_RETIRE * 5).await;
            assert!(
                took.is_some(),
                "still held after {:?}: parent {:?}, worker {:?}",
                wirepool_io::shm::IDLE_RETIRE * 5,
                shm_footprint("self"),
                shm_footprint(&worker)
            );
        }
        // A region lent for longer than the idle time (a handler holding its body) was in use:
        // it is kept for the next body, not retired as soon as it comes back.
        let held = tokio::time::timeout(
            wirepool_io::shm::IDLE_RETIRE * 2,
            pool.call_raw("hold_raw", body.clone()),
        )
        .await;
        assert!(held.is_err(), "hold_raw holds until cancelled: {held:?}");
        let regions = memfd_inodes();
        assert_eq!(regions.len(), 1, "the parent's region of the hold");
        // The cancelled hold ends (its release travels with its terminal), then a few of the
        // parent's housekeeping ticks pass: a region retired on its release would be gone.
        let ended = Instant::now() + Duration::from_secs(10);
        while pool.metrics().workers.iter().any(|w| w.in_flight > 0) {
            assert!(Instant::now() < ended, "the cancelled hold did not end");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(wirepool_io::shm::IDLE_RETIRE / 4).await;
        let back = pool.call_raw("echo_raw", body.clone()).await.unwrap();
        assert!(back == body);
        assert_eq!(memfd_inodes(), regions, "the held region was reused");
        drop(back);
        // The lane still works after its regions were retired, and the worker never changed.
        assert_eq!(pool.call::<_, u32>("pid", &()).await.unwrap(), pid);
        pool.shutdown().await;
    })
    .await;
}

/// The idle time is the spec's `shm_idle_retire` (constants.json).
#[test]
fn idle_retire_is_the_spec_default() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../spec/constants.json");
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ms = c["extensions"]["shm"]["sdk_defaults"]["shm_idle_retire_ms"]
        .as_u64()
        .expect("shm_idle_retire_ms in constants.json");
    assert_eq!(
        wirepool_io::shm::IDLE_RETIRE,
        Duration::from_millis(ms),
        "wirepool_io::shm::IDLE_RETIRE"
    );
}
