//! The shared-memory lane through the real pool (PROTOCOL.md 20): one-way and echo of large
//! raw payloads to the test worker with the lane on, beside the same pool over the socket, a
//! raw socketpair floor and the sender's memcpy, all in one run, in alternating blocks so load
//! bursts hit each alike; min/median/max of the repeats in GB/s (payload bytes one way per
//! second; an echo counts the payload once).
//!
//! ```sh
//! cargo build --release -p wirepool --examples
//! target/release/examples/shm_lane_pool [payload_mib=256] [repeats=5] [calls=8]
//! ```

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use bytes::Bytes;
use wirepool::{Pool, WorkerCommand};

fn stats(v: &mut [f64]) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    format!(
        "min {:6.2}  median {:6.2}  max {:6.2} GB/s",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

/// A blocking socketpair: the payload written whole, read by another thread into one buffer.
fn socketpair_floor(payload: &[u8], calls: usize) -> f64 {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let len = payload.len();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; len];
        for _ in 0..calls {
            b.read_exact(&mut buf).unwrap();
            b.write_all(&[1]).unwrap();
        }
    });
    let start = Instant::now();
    let mut ack = [0u8; 1];
    for _ in 0..calls {
        a.write_all(payload).unwrap();
        a.read_exact(&mut ack).unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    reader.join().unwrap();
    (len * calls) as f64 / secs / 1e9
}

fn memcpy(payload: &[u8], calls: usize) -> f64 {
    let mut dst = vec![0u8; payload.len()];
    dst.copy_from_slice(payload); // fault the pages in once, as a reused region has them
    let start = Instant::now();
    for _ in 0..calls {
        dst.copy_from_slice(std::hint::black_box(payload));
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(&dst);
    (payload.len() * calls) as f64 / secs / 1e9
}

async fn through(pool: &Pool, method: &str, payload: &Bytes, calls: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        let back = pool.call_raw(method, payload.clone()).await.unwrap();
        std::hint::black_box(&back);
    }
    (payload.len() * calls) as f64 / start.elapsed().as_secs_f64() / 1e9
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let mib = args.first().copied().unwrap_or(256);
    let repeats = args.get(1).copied().unwrap_or(5);
    let calls = args.get(2).copied().unwrap_or(8);
    let worker = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("test_worker");
    let start = |lane: bool| {
        let mut b = Pool::builder(WorkerCommand::new(&worker)).workers(1);
        if lane {
            b = b.shm_lane(Some(1 << 20));
        } else {
            b = b.shm_lane(None);
        }
        b.start()
    };
    let lane = start(true).await.unwrap();
    let socket = start(false).await.unwrap();
    let payload: Bytes = vec![7u8; mib << 20].into();
    // Warm-up: regions created and their pages faulted in once.
    for pool in [&lane, &socket] {
        through(pool, "len_raw", &payload, 2).await;
        through(pool, "echo_raw", &payload, 2).await;
    }
    let mut rows: Vec<(&str, Vec<f64>)> = [
        "oneway lane",
        "oneway socket",
        "echo lane",
        "echo socket",
        "socketpair floor",
        "memcpy",
    ]
    .into_iter()
    .map(|n| (n, Vec::new()))
    .collect();
    for _ in 0..repeats {
        rows[0]
            .1
            .push(through(&lane, "len_raw", &payload, calls).await);
        rows[1]
            .1
            .push(through(&socket, "len_raw", &payload, calls).await);
        rows[2]
            .1
            .push(through(&lane, "echo_raw", &payload, calls).await);
        rows[3]
            .1
            .push(through(&socket, "echo_raw", &payload, calls).await);
        rows[4].1.push(socketpair_floor(&payload, calls));
        rows[5].1.push(memcpy(&payload, calls));
    }
    println!("payload {mib} MiB, {repeats} repeats of {calls} calls");
    for (name, v) in &mut rows {
        println!("{name:18} {}", stats(v));
    }
    lane.shutdown().await;
    socket.shutdown().await;
}
