//! Liveness is progress, not bytes (PROTOCOL.md 8.4, 8.5): hand-written workers (python3, no
//! SDK) that keep sending bytes without progress, or say GOODBYE and stay, against the pool.
//! The first process of each test misbehaves on its first call; its replacements behave, so
//! each test also checks that the pool replaced it and goes on serving.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use wirepool::{codes, ExitCause, Pool, PoolBuilder, RestartPolicy};

/// The fake worker: a HELLO offering `echo` and `pid` (unary, JSON); PINGs answered until it
/// misbehaves. argv: the misbehaviour, and a directory where the first process leaves a mark.
const FAKE: &str = r#"
import os, select, struct, sys, time
fd = int(os.environ['WIREPOOL_FD'])
mode, state = sys.argv[1], sys.argv[2]
try:
    os.close(os.open(os.path.join(state, 'first'), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    hostile = True
except FileExistsError:
    hostile = False
def str16(s): b = s.encode(); return struct.pack('<H', len(b)) + b
def frame(t, i, p=b''): return struct.pack('<IBBHQ', len(p), t, 0, 0, i) + p
hello = b'WIREPOOL' + struct.pack('<HHIII', 1, 1, os.getpid(), 8, 1 << 20) + str16('fake') + str16('0')
hello += struct.pack('<H', 2) + bytes([1, 1, 1]) + str16('echo') + bytes([1, 1, 1]) + str16('pid')
os.write(fd, frame(0x01, 0, hello))
def read():
    data = os.read(fd, 1 << 16)
    if not data:
        sys.exit(0)
    return data
def discard_forever():  # alive, reading, answering nothing (not even PINGs)
    while True:
        read()
buf = b''
while True:
    buf += read()
    while len(buf) >= 16:
        length, ftype, _, _, fid = struct.unpack_from('<IBBHQ', buf)
        if len(buf) < 16 + length:
            break
        payload, buf = buf[16:16 + length], buf[16 + length:]
        if ftype == 0x31:  # PING -> PONG
            os.write(fd, frame(0x32, 0, payload))
        elif ftype == 0x10 and hostile:
            if mode == 'goodbye_and_stay':
                os.write(fd, frame(0x41, 0, struct.pack('<I', 2)))
                discard_forever()
            elif mode == 'trickle_frame':  # one RESULT, a byte at a time, never finished
                data = frame(0x12, fid, b'x' * 4096)
                for i in range(len(data)):
                    os.write(fd, data[i:i + 1])
                    time.sleep(0.02)
                discard_forever()
            elif mode == 'events_without_pong':  # whole frames, but no PONG
                while True:
                    os.write(fd, frame(0x30, 0, str16('tick') + b'{}'))
                    if select.select([fd], [], [], 0.02)[0]:
                        read()
        elif ftype == 0x10:
            method = struct.unpack_from('<H', payload)[0]
            body = payload[12:] if method == 0 else str(os.getpid()).encode()
            os.write(fd, frame(0x12, fid, body))
"#;

/// A directory of its own for one test's fake workers, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("wirepool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fake_pool(mode: &str, scratch: &Scratch, heartbeat: Duration) -> PoolBuilder {
    Pool::builder(python(FAKE).arg(mode).arg(scratch.0.to_str().unwrap()))
        .workers(1)
        .heartbeat(heartbeat)
        .drain_grace(Duration::from_millis(200))
        .restart_policy(RestartPolicy {
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            max_restarts: 100,
            within: Duration::from_secs(60),
            reset_after: Duration::from_secs(1),
        })
}

/// The process the pool has in its (only) slot now, if any.
fn slot_pid(pool: &Pool) -> Option<u32> {
    pool.metrics().workers[0].pid
}

/// A worker whose first call makes it misbehave: the call must end `code`, the worker must be
/// killed (SIGKILL) and reaped, and a replacement must serve.
async fn misbehaves_on_call(mode: &str, heartbeat: Duration, code: u32) -> wirepool::Error {
    let scratch = Scratch::new(mode);
    let pool = fake_pool(mode, &scratch, heartbeat).start().await.unwrap();
    let first = pool.worker_pids()[0];
    let err = pool
        .call::<_, serde_json::Value>("echo", &1)
        .await
        .unwrap_err();
    assert_eq!(err.code(), code, "{err}");
    let exit = err
        .exit_info()
        .expect("the error carries the worker's exit");
    assert_eq!(exit.pid, first);
    assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit}");
    assert_reaped(&[first]);
    assert!(pool.wait_ready(Duration::from_secs(10)).await);
    let pid: u32 = pool.call("pid", &()).await.unwrap();
    assert_ne!(pid, first);
    pool.shutdown().await;
    assert_reaped(&[pid]);
    err
}

/// The frame clock: a RESULT trickled a byte every 20 ms (far faster than the heartbeat) and
/// never finished. Bytes keep arriving, but no frame completes: the worker is hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_trickled_and_never_finished_is_hung() {
    bounded(30, async {
        let err = misbehaves_on_call(
            "trickle_frame",
            Duration::from_millis(100),
            codes::WORKER_HUNG,
        )
        .await;
        assert_eq!(err.exit_info().unwrap().cause, ExitCause::Hung);
    })
    .await
}

/// The PONG clock: whole EVENT frames every 20 ms, but no PONG. Other frames are not progress:
/// the worker is hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_frames_without_a_pong_are_hung() {
    bounded(30, async {
        let err = misbehaves_on_call(
            "events_without_pong",
            Duration::from_millis(100),
            codes::WORKER_HUNG,
        )
        .await;
        assert_eq!(err.exit_info().unwrap().cause, ExitCause::Hung);
    })
    .await
}

/// GOODBYE, then alive and silent: the pool routes nothing new to it and replaces it at once,
/// and after a short grace (1 s) kills it; its call ends WORKER_EXITED, not WORKER_HUNG (the
/// heartbeat is 10 s, so only the grace can end it within the test's bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_says_goodbye_and_stays_is_killed_after_a_grace_and_replaced() {
    bounded(30, async {
        let scratch = Scratch::new("goodbye_and_stay");
        let pool = fake_pool("goodbye_and_stay", &scratch, Duration::from_secs(10))
            .start()
            .await
            .unwrap();
        let first = pool.worker_pids()[0];
        let call = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.call::<_, serde_json::Value>("echo", &1).await })
        };
        // The slot gets a replacement while the old worker is still in its grace.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while slot_pid(&pool).is_none_or(|p| p == first) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the worker that said GOODBYE was not replaced"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Nothing new goes to the old worker: this call is the replacement's.
        let pid: u32 = pool.call("pid", &()).await.unwrap();
        assert_ne!(pid, first);
        let err = call.await.unwrap().unwrap_err();
        assert_eq!(err.code(), codes::WORKER_EXITED, "{err}");
        let exit = err
            .exit_info()
            .expect("the error carries the worker's exit");
        assert_eq!(exit.pid, first);
        assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit}");
        assert_eq!(exit.cause, ExitCause::LeftByItself);
        assert_reaped(&[first]);
        assert_eq!(
            pool.metrics().workers[0]
                .restart_causes
                .get("left_by_itself"),
            Some(&1)
        );
        pool.shutdown().await;
        assert_reaped(&[pid]);
    })
    .await
}

/// A parent whose runtime keeps being blocked (here 400 ms at a time, 4 heartbeats, ten times
/// over) must not blame a healthy worker whose PONGs wait unread in the socket: after a tick
/// that ran late the clocks judge again only once the reader had a heartbeat to catch up.
#[tokio::test(flavor = "current_thread")]
async fn a_parent_that_ran_late_does_not_blame_its_worker() {
    bounded(30, async {
        let pool = builder(1)
            .heartbeat(Duration::from_millis(100))
            .start()
            .await
            .unwrap();
        let pid = pool.worker_pids()[0];
        assert!(pool.wait_ready(Duration::from_secs(10)).await);
        let sum: i64 = pool.call("add", &(1, 2)).await.unwrap();
        assert_eq!(sum, 3);
        for _ in 0..10 {
            // Not a synchronisation: this is the starvation under test (no task runs
            // meanwhile); the yield lets the pool's tasks run once in between.
            std::thread::sleep(Duration::from_millis(400));
            tokio::task::yield_now().await;
        }
        let sum: i64 = pool.call("add", &(2, 2)).await.unwrap();
        assert_eq!(sum, 4);
        assert_eq!(pool.worker_pids(), vec![pid], "the worker was judged hung");
        assert!(pool.metrics().workers[0].restart_causes.is_empty());
        pool.shutdown().await;
        assert_reaped(&[pid]);
    })
    .await
}
