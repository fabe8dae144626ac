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

use common::{bounded, python, test_worker};
use wirepool::Pool;
use wirepool_worker::Encoded;

/// Relays the pool's socket to a test worker it starts on a socket pair of its own, the
/// worker's output at `argv[2]` bytes a second (a token bucket: after an idle spell one read
/// goes at once), the pool's as fast as it comes.
/// The worker asks for a parent-death signal, so it goes with the relay when the pool kills it.
const RELAY: &str = r#"
import os, socket, subprocess, sys, threading, time
up = socket.socket(fileno=int(os.environ.pop("WIREPOOL_FD")))
mine, theirs = socket.socketpair()
child = subprocess.Popen([sys.argv[1]], env=dict(os.environ, WIREPOOL_FD=str(theirs.fileno())),
                         pass_fds=[theirs.fileno()])
theirs.close()
rate = float(sys.argv[2])
def relay(src, dst, rate):
    due = time.monotonic()
    while True:
        data = src.recv(65536)
        if not data:
            break
        dst.sendall(data)
        if rate:
            now = time.monotonic()
            due = max(due, now) + len(data) / rate
            if due > now:
                time.sleep(due - now)
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
for src, dst, r in ((up, mine, 0), (mine, up, rate)):
    threading.Thread(target=relay, args=(src, dst, r), daemon=True).start()
sys.exit(child.wait())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_over_a_slow_link_keeps_its_worker_alive_with_a_short_heartbeat() {
    bounded(120, async {
        let relay = python(RELAY)
            .arg(test_worker())
            .arg((25_000_000u64).to_string());
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
