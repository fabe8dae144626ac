//! Quick end-to-end measurements of the Rust parent against the test worker, each printed beside
//! a raw-socketpair baseline measured in the same run (same machine, same moment).
//!
//! ```sh
//! cargo run --release -p wirepool --example perf            # current_thread runtime (fastest here)
//! cargo run --release -p wirepool --example perf -- multi   # multi-thread runtime, PERF_THREADS (2)
//! ```
//! `PERF_ONLY` narrows the run: `inflight` (floors, then 256 calls in flight), `inflight_only`
//! (just the concurrent phase, for profilers; `PERF_CALLS` sets its size), `ping`, `ping_only`
//! (just one-at-a-time calls, for profilers and syscall counts; `PERF_CALLS`), `big`, `slow`.
//! `PERF_METHOD` picks the unary method (default `echo_raw_async`; `echo_raw_inline` is the
//! worker's no-task path).
//! Numbers on a shared 2-vCPU machine move 20-40% between runs; compare ratios within a run.
//! The raw floor and wirepool run in alternating blocks, so load bursts hit both alike.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;
use wirepool::{CallOptions, Codec, Pool, WorkerCommand};

#[derive(Deserialize)]
#[allow(dead_code)]
struct Decl {
    i: u64,
    name: String,
    kind: String,
}

fn worker_path() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().join("test_worker")
}

/// Raw floor: a child process (the test worker in raw mode) echoing length-prefixed messages
/// over a socketpair, driven by blocking reads and writes.
fn raw_echo_child() -> (std::process::Child, UnixStream) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let (parent, child_end) = UnixStream::pair().unwrap();
    let fd = child_end.as_raw_fd();
    let mut cmd = std::process::Command::new(worker_path());
    cmd.env("WIREPOOL_RAW_ECHO_FD", fd.to_string());
    // SAFETY: only fcntl between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::fcntl(fd, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(child_end);
    (child, parent)
}

fn raw_roundtrips(sock: &mut UnixStream, size: usize, count: usize) -> Vec<Duration> {
    let msg = vec![1u8; size];
    let mut back = vec![0u8; size];
    let mut lat = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        sock.write_all(&(size as u32).to_le_bytes()).unwrap();
        sock.write_all(&msg).unwrap();
        let mut len = [0u8; 4];
        sock.read_exact(&mut len).unwrap();
        sock.read_exact(&mut back).unwrap();
        lat.push(t.elapsed());
    }
    lat
}

/// Resident set of this process (VmRSS), KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// 64 B unary calls, 256 in flight (PERF_CALLS in total, default 1 M).
async fn inflight(pool: &Pool, method: &str, body: &Bytes) {
    let total: usize = std::env::var("PERF_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let in_flight = 256;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..in_flight {
        let pool = pool.clone();
        let body = body.clone();
        let method = method.to_string();
        tasks.push(tokio::spawn(async move {
            for _ in 0..total / in_flight {
                pool.call_raw(&method, body.clone()).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let rate = (total / in_flight * in_flight) as f64 / t.elapsed().as_secs_f64();
    println!(
        "64 B unary, 256 in flight: {:.2} M calls/s (target >= 1 M)",
        rate / 1e6
    );
}

fn main() {
    let current = !std::env::args().any(|a| a == "multi");
    let threads: usize = std::env::var("PERF_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let rt = if current {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap()
    };
    if current {
        println!("runtime: current_thread");
    } else {
        println!("runtime: multi_thread({threads})");
    }

    // The raw floor runs in blocks alternating with ours (below), so a burst of load from other
    // processes hits both sides of a ratio alike.
    let (mut child, mut sock) = raw_echo_child();
    raw_roundtrips(&mut sock, 64, 2000);
    raw_roundtrips(&mut sock, 1 << 20, 20);
    const BLOCKS: usize = 5;
    let n_big = 200;

    rt.block_on(async {
        let method = std::env::var("PERF_METHOD").unwrap_or_else(|_| "echo_raw_async".into());
        let method = method.as_str();
        let frame: u32 = std::env::var("PERF_FRAME").ok().and_then(|v| v.parse().ok()).unwrap_or(wirepool_proto::DEFAULT_MAX_FRAME_SIZE);
        let mut cmd = WorkerCommand::new(worker_path());
        if std::env::var_os("PERF_FAST_ECHO").is_some() {
            cmd = cmd.env("WIREPOOL_FAST_ECHO", "1");
        }
        let pool = Pool::builder(cmd).workers(1).max_frame_size(frame).start().await.unwrap();
        println!("unary method {method}, max_frame_size {frame}");

        let only = std::env::var("PERF_ONLY").unwrap_or_default();
        if only == "slow" {
            // Slow consumer: 1 ms pause every 1,000 rows; the credit window bounds what waits.
            let start = rss_kib();
            let mut peak = start;
            let n = 10_000_000u64;
            let t = Instant::now();
            let mut rows = pool.stream::<_, Decl>("decls", &n).await.unwrap();
            let mut got = 0u64;
            while let Some(r) = rows.next().await {
                r.unwrap();
                got += 1;
                if got % 1000 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    if got % 100_000 == 0 {
                        peak = peak.max(rss_kib());
                    }
                }
            }
            assert_eq!(got, n);
            println!(
                "slow consumer, {n} JSON rows: {:.1} s, parent RSS {} KiB at start, peak {} KiB (+{} KiB; target <= +65536)",
                t.elapsed().as_secs_f64(),
                start,
                peak,
                peak - start
            );
            pool.shutdown().await;
            return;
        }
        // One call at a time, alternating blocks of raw and wirepool round trips.
        let body = Bytes::from(vec![1u8; 64]);
        if only == "inflight_only" {
            // For profilers: only the concurrent phase, no floors or warm-up blocks around it.
            inflight(&pool, method, &body).await;
            pool.shutdown().await;
            return;
        }
        if only == "ping_only" {
            // For profilers: only one-at-a-time calls (PERF_CALLS of them, default 200,000).
            let n: usize = std::env::var("PERF_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000);
            let t = Instant::now();
            for _ in 0..n {
                pool.call_raw(method, body.clone()).await.unwrap();
            }
            println!("ping-pong: {:.1} us per round trip", t.elapsed().as_secs_f64() * 1e6 / n as f64);
            pool.shutdown().await;
            return;
        }
        for _ in 0..2000 {
            pool.call_raw(method, body.clone()).await.unwrap();
        }
        let (mut raw_lat, mut lat) = (Vec::new(), Vec::new());
        for _ in 0..BLOCKS {
            raw_lat.extend(raw_roundtrips(&mut sock, 64, 4000));
            for _ in 0..4000 {
                let t = Instant::now();
                pool.call_raw(method, body.clone()).await.unwrap();
                lat.push(t.elapsed());
            }
        }
        let (ours, raw_ping) = (p50(lat), p50(raw_lat));
        println!(
            "64 B ping-pong p50: wirepool {:.1} us, raw socketpair {:.1} us, ratio {:.2}x (target <= 1.3x)",
            ours.as_secs_f64() * 1e6,
            raw_ping.as_secs_f64() * 1e6,
            ours.as_secs_f64() / raw_ping.as_secs_f64()
        );

        // 1 MiB payloads, both ways, alternating blocks again.
        let big = Bytes::from(vec![1u8; 1 << 20]);
        for _ in 0..20 {
            pool.call_raw(method, big.clone()).await.unwrap();
        }
        let (mut raw_time, mut our_time) = (Duration::ZERO, Duration::ZERO);
        for _ in 0..BLOCKS {
            let t = Instant::now();
            raw_roundtrips(&mut sock, 1 << 20, n_big);
            raw_time += t.elapsed();
            let t = Instant::now();
            for _ in 0..n_big {
                pool.call_raw(method, big.clone()).await.unwrap();
            }
            our_time += t.elapsed();
        }
        let mib = (BLOCKS * n_big * 2) as f64;
        let (ours, raw_mib_s) = (mib / our_time.as_secs_f64(), mib / raw_time.as_secs_f64());
        println!(
            "1 MiB echo: wirepool {ours:.0} MiB/s, raw socketpair {raw_mib_s:.0} MiB/s, ratio {:.2} (target >= 0.70)",
            ours / raw_mib_s
        );
        drop(sock);
        let _ = child.wait();

        if only == "ping" {
            let t = Instant::now();
            let mut n = 0u64;
            while t.elapsed() < Duration::from_secs(4) {
                pool.call_raw(method, body.clone()).await.unwrap();
                n += 1;
            }
            println!("ping-pong: {:.1} us per round trip", 4e6 / n as f64);
            return;
        }
        if only == "big" {
            let big = Bytes::from(vec![1u8; 1 << 20]);
            let t = Instant::now();
            for _ in 0..3000 {
                pool.call_raw(method, big.clone()).await.unwrap();
            }
            println!("1 MiB echo: {:.0} MiB/s", 6000.0 / t.elapsed().as_secs_f64());
            return;
        }
        if only == "inflight" || only.is_empty() {
            inflight(&pool, method, &body).await;
        }
        if only == "inflight" {
            return;
        }

        // JSON rows decoded into structs.
        let n = 5_000_000u64;
        let t = Instant::now();
        let mut rows = pool.stream::<_, Decl>("decls", &n).await.unwrap();
        let mut got = 0u64;
        while let Some(r) = rows.next().await {
            r.unwrap();
            got += 1;
        }
        assert_eq!(got, n);
        println!("JSON rows -> structs, one worker: {:.2} M rows/s (target >= 2 M)", n as f64 / t.elapsed().as_secs_f64() / 1e6);

        // Raw rows (16 B), whole frames.
        let n = 20_000_000u64;
        let t = Instant::now();
        let opts = CallOptions::codec(Codec::Raw);
        let mut rows = pool.stream_with::<_, Bytes>("raw_rows", &format!("{n} 16"), opts.clone()).await.unwrap();
        let mut got = 0u64;
        while let Some(frame) = rows.next_frame().await {
            got += frame.unwrap().iter().count() as u64;
        }
        assert_eq!(got, n);
        println!("raw 16 B rows, frame iteration: {:.2} M rows/s (target >= 10 M)", n as f64 / t.elapsed().as_secs_f64() / 1e6);
        let t = Instant::now();
        let mut rows = pool.stream_with::<_, Bytes>("raw_rows", &format!("{n} 16"), opts).await.unwrap();
        let mut got = 0u64;
        while let Some(r) = rows.next().await {
            r.unwrap();
            got += 1;
        }
        assert_eq!(got, n);
        println!("raw 16 B rows as Bytes, row by row: {:.2} M rows/s", n as f64 / t.elapsed().as_secs_f64() / 1e6);
        pool.shutdown().await;
    });
}
