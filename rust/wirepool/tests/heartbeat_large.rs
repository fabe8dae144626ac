//! Heartbeats beside a large message (PROTOCOL.md 8.5): PING and PONG go at the next frame
//! boundary of their peer's output, ahead of the rest of a message already queued, so a message
//! of any size over a slow link never makes a healthy worker look hung. The link here is a
//! relay between the pool and the Rust test worker that passes the worker's output at 25 MB/s
//! (a slow link): a 32 MiB RESULT takes over 1.3 s, the heartbeat is 200 ms (a worker is hung
//! after 600 ms without a PONG) and frames are 1 MiB (40 ms each).
//! Before the urgent lane the worker's PONG waited behind the rest of its RESULT and the call
//! ended WORKER_HUNG.
//!
//! The request is small (`fill_raw` makes the body): a large REQUEST sits partly in the pool's
//! 4 MiB socket buffers (up to 8 MiB in flight), which no queue order can get a PING ahead of,
//! and the debug build's worker reads it slowly at high load, which made a 128 MiB echo here
//! fail one run in six even with the fix. The parent's side of the splice is checked byte by
//! byte in wirepool-io's tests. (With a 100 ms heartbeat the fixed worker was still judged hung
//! now and then at load ~12: a PONG crosses four processes, each scheduled late at times.)

mod common;

use std::time::{Duration, Instant};

use common::{bounded, test_worker};
use wirepool::{Pool, WorkerCommand};
use wirepool_worker::Encoded;

/// The slow link every SDK's heartbeat test uses: `slow_relay.py DOWN_RATE UP_RATE worker...`
/// relays the pool's socket to a worker it starts on a socket pair of its own, the worker's
/// output at DOWN_RATE bytes a second. The worker asks for a parent-death signal, so it goes with
/// the relay when the pool kills it.
const RELAY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../conformance/tools/slow_relay.py"
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_over_a_slow_link_keeps_its_worker_alive_with_a_short_heartbeat() {
    bounded(120, async {
        let relay = WorkerCommand::new("python3")
            .arg(RELAY)
            .arg((25_000_000u64).to_string())
            .arg("0")
            .arg(test_worker());
        let pool = Pool::builder(relay)
            .workers(1)
            .startup_timeout(Duration::from_secs(20))
            .max_frame_size(1 << 20)
            .heartbeat(Duration::from_millis(200))
            // Over the socket (the relay passes no descriptors), as over a remote link.
            .shm_lane(None)
            .start()
            .await
            .unwrap();
        let pid = pool.worker_pids()[0];
        let len = 32usize << 20;
        let started = Instant::now();
        let filled: wirepool::Result<Encoded> = pool.call("fill_raw", &(len, 7u8, false)).await;
        let took = started.elapsed();
        let filled = filled.unwrap_or_else(|e| panic!("after {took:?}: {e}"));
        assert_eq!(filled.0.len(), len);
        assert!(
            filled
                .0
                .iter()
                .enumerate()
                .step_by(4093)
                .all(|(i, &b)| b == (i as u8).wrapping_mul(31).wrapping_add(7)),
            "the body arrived changed"
        );
        // The link was slow enough for the old behaviour to fail: many heartbeats passed.
        assert!(
            took > Duration::from_millis(1200),
            "32 MiB at 25 MB/s took only {took:?}"
        );
        assert_eq!(pool.worker_pids(), [pid], "the worker was not replaced");
        pool.shutdown().await;
    })
    .await;
}
