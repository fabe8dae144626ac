//! The parent killed mid-transfer on the shared-memory lane (PROTOCOL.md 20.4, "either side
//! dies"; issue 13). Two views of it:
//!
//! - a real pool (this binary re-run as the parent) moving 16 MiB echoes through the lane with
//!   two Rust workers is SIGKILLed: both workers are gone within a bound (none lingers holding
//!   its regions);
//! - a Rust worker served in this process (`Worker::serve`) by a raw parent (this binary re-run)
//!   that announced a region, lent the worker two 4 MiB bodies from it (one held by the
//!   handler, one echoed back through the worker's own region) and was half-way through a 2 MiB
//!   body on the socket when it was SIGKILLed: `serve` returns, the held request is cancelled,
//!   and this process is left with no memory file open or mapped and no descriptor more.
//!
//! The re-run binary plays the parent when `WIREPOOL_SHM_PARENT` names its role.

mod common;

use std::io::{BufRead, BufReader, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;

const ROLE: &str = "WIREPOOL_SHM_PARENT";
/// The raw parent's end of the socket, in the re-run binary.
const PARENT_SOCK: i32 = 3;
const BOUND: Duration = Duration::from_secs(20);

/// Descriptors and mappings of wirepool's memory files in process `pid` ("self": this one).
fn shm_footprint(pid: &str) -> (usize, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:wirepool-shm"))
                })
                .count()
        })
        .unwrap_or(0);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| {
            m.lines()
                .filter(|l| l.contains("/memfd:wirepool-shm"))
                .count()
        })
        .unwrap_or(0);
    (fds, maps)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Re-runs this binary's test as the parent `role`, its stdout piped.
fn rerun(role: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "the_parent_killed_mid_transfer_leaves_nothing",
        "--nocapture",
    ])
    .env(ROLE, role)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    cmd
}

/// The child's stdout lines, read on a thread so that waiting for one is bounded.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line holding `prefix`, from it on (libtest's "test NAME ... " may come first),
/// within the bound.
fn line_with(rx: &mpsc::Receiver<String>, prefix: &str) -> String {
    let deadline = Instant::now() + BOUND;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no line {prefix:?} from the parent: {e}"));
        if let Some(at) = line.find(prefix) {
            return line[at..].to_owned();
        }
    }
}

/// Polls `done` until it holds, within the bound.
fn within_bound(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` is gone or a zombie (dead, its memory and descriptors freed).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 2..].chars().next())
            .is_some_and(|state| state == 'Z' || state == 'X'),
    }
}

// One test: the second part counts this process's descriptors, which the first part's
// processes and pipes would move.
#[test]
fn the_parent_killed_mid_transfer_leaves_nothing() {
    match std::env::var(ROLE).as_deref() {
        Ok("pool") => return pool_parent(),
        Ok("raw") => return raw_parent(),
        _ => {}
    }
    pool_workers_exit_when_their_parent_is_killed_mid_transfer();
    a_worker_releases_everything_when_its_parent_is_killed_mid_transfer();
}

fn pool_workers_exit_when_their_parent_is_killed_mid_transfer() {
    // This process adopts the orphaned workers, so it can reap them (no zombie is left).
    // SAFETY: prctl with integer arguments.
    assert_eq!(
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) },
        0
    );
    let mut parent = rerun("pool").spawn().unwrap();
    let rx = lines(&mut parent);
    let pids: Vec<u32> = line_with(&rx, "pids ")
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    line_with(&rx, "busy");
    // Mid-transfer: each worker maps a region of the parent's and has one of its own.
    for pid in &pids {
        within_bound("the lane in use", || {
            let (fds, maps) = shm_footprint(&pid.to_string());
            fds >= 1 && maps >= 2
        });
    }
    common::kill(parent.id(), libc::SIGKILL);
    parent.wait().unwrap();
    for &pid in &pids {
        within_bound(&format!("worker {pid} gone"), || dead(pid));
        // Reap it (adopted): nothing of it is left.
        let mut status = 0;
        // SAFETY: waitpid on a child of this process (adopted as the subreaper).
        unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    }
}

/// The re-run parent: a pool of two workers echoing 16 MiB bodies through the lane until it is
/// killed (bounded: it stops by itself after the test's bound).
fn pool_parent() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = common::builder(2).start().await.unwrap();
        assert!(pool.wait_ready(BOUND).await);
        let pids = pool.worker_pids();
        println!("pids {} {}", pids[0], pids[1]);
        let body = Bytes::from(vec![5u8; 16 << 20]);
        let started = Instant::now();
        let mut said_busy = false;
        while started.elapsed() < BOUND {
            let calls: Vec<_> = (0..4)
                .map(|_| {
                    let (pool, body) = (pool.clone(), body.clone());
                    tokio::spawn(async move { pool.call_raw("echo_raw", body).await })
                })
                .collect();
            for c in calls {
                assert!(c.await.unwrap().unwrap().len() == body.len());
            }
            if !said_busy {
                println!("busy");
                said_busy = true;
            }
        }
    });
}

/// Set by the in-process worker's `hold_raw` when it saw its request cancelled.
static HOLD_CANCELLED: AtomicBool = AtomicBool::new(false);

fn a_worker_releases_everything_when_its_parent_is_killed_mid_transfer() {
    // A tokio runtime's signal driver opens a socket pair once per process, for good: open it
    // before counting (the worker's runtime would, and it is no leak).
    drop(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    );
    let before = (open_fds(), shm_footprint("self"));
    assert_eq!(before.1, (0, 0));
    let (ours, theirs) = UnixStream::pair().unwrap();
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = rerun("raw");
    // SAFETY: dup2 is async-signal-safe; the child's copy of the descriptor becomes its fd 3.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(theirs_fd, PARENT_SOCK) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut parent = cmd.spawn().unwrap();
    drop(theirs);
    let rx = lines(&mut parent);
    let (done_tx, done_rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        let served = wirepool_worker::Worker::new("in-process")
            .unary("hold_raw", |b: Bytes, ctx: &wirepool_worker::Context| {
                let end = Instant::now() + BOUND;
                while Instant::now() < end && !ctx.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                HOLD_CANCELLED.store(ctx.is_cancelled(), Ordering::SeqCst);
                Ok(Bytes::from(b.len().to_string()))
            })
            .codecs(&[wirepool_worker::Codec::Raw])
            .unary("echo_raw", |b: Bytes, _: &wirepool_worker::Context| Ok(b))
            .codecs(&[wirepool_worker::Codec::Raw])
            .serve(ours);
        let _ = done_tx.send(served.map_err(|e| e.to_string()));
    });
    line_with(&rx, "sent");
    // The worker maps the parent's region and answered the echo through a region of its own.
    within_bound("the worker using the lane", || {
        let (fds, maps) = shm_footprint("self");
        fds >= 1 && maps >= 2
    });
    common::kill(parent.id(), libc::SIGKILL);
    parent.wait().unwrap();
    let served = done_rx
        .recv_timeout(BOUND)
        .expect("serve returns once its parent is gone");
    assert!(served.is_ok(), "{served:?}");
    server.join().unwrap();
    // The held view goes when its handler notices the cancellation.
    within_bound("the held request cancelled", || {
        HOLD_CANCELLED.load(Ordering::SeqCst)
    });
    within_bound("every memory file closed and unmapped", || {
        shm_footprint("self") == (0, 0)
    });
    // The last to go is the pipe of the parent's stdout, once its reader thread sees the end.
    within_bound("the descriptors of before", || open_fds() == before.0);
}

/// The re-run raw parent: handshake with the lane on, one 8 MiB region lent as two 4 MiB
/// bodies (`hold_raw`, `echo_raw`), then half of a 2 MiB body on the socket; then it waits to
/// be killed (it exits by itself after the bound).
fn raw_parent() {
    use wirepool_proto::shm::{ShmAccept, ShmRange};
    use wirepool_proto::{Connection, Event, Welcome};

    // SAFETY: the test put the socket at this descriptor for this process alone.
    let mut sock = unsafe { UnixStream::from_raw_fd(PARENT_SOCK) };
    sock.set_read_timeout(Some(BOUND)).unwrap();
    let mut conn = Connection::new_parent();
    let mut buf = vec![0u8; 1 << 16];
    let hello = loop {
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0, "the worker closed before HELLO");
        conn.receive(&buf[..n]);
        if let Some(Event::Hello(h)) = conn.next_event().unwrap() {
            break h;
        }
    };
    let method = |name: &str| hello.methods.iter().position(|m| m.name == name).unwrap() as u16;
    let mut welcome = Welcome::for_hello(&hello, 1).unwrap();
    welcome.extensions.shm = Some(ShmAccept {
        to_worker_window: 1 << 30,
        to_parent_window: 1 << 30,
    });
    let mut out = Vec::new();
    conn.send_welcome(&welcome, &mut out).unwrap();
    sock.write_all(&out).unwrap();
    out.clear();

    let mut region = wirepool_io::shm::OwnedRegion::create(8 << 20).unwrap();
    region.as_mut_slice().fill(9);
    let id = conn.send_shm_region(8 << 20, &mut out).unwrap();
    let n = wirepool_io::shm::send_with_fds(sock.as_fd(), &[IoSlice::new(&out)], &[region.as_fd()])
        .unwrap();
    sock.write_all(&out[n..]).unwrap();
    out.clear();
    for (i, name) in ["hold_raw", "echo_raw"].into_iter().enumerate() {
        let range = ShmRange {
            region: id,
            offset: i as u64 * (4 << 20),
            length: 4 << 20,
        };
        conn.send_request_shm(method(name), 0, 0, range, &mut out)
            .unwrap();
    }
    sock.write_all(&out).unwrap();
    out.clear();
    // Mid-transfer: half of a body that travels on the socket.
    let body = vec![3u8; 2 << 20];
    conn.send_request(method("echo_raw"), 0, 0, &body, &mut out)
        .unwrap();
    sock.write_all(&out[..out.len() / 2]).unwrap();
    println!("sent");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(BOUND);
}
