//! `wirepool-bench-count`: the Rust parent of the instruction-count gate (`bench/icount.py`).
//!
//! ```sh
//! wirepool-bench-count [--worker rust|python] OP=N [OP=N ...]
//! ```
//! Starts a pool of one worker, then runs one phase per argument (operation `OP`, `N` times),
//! with a mark before every phase and after the last: the parent calls `getpgrp()` and then the
//! worker's `mark` method, which calls `getpgrp()` in the worker. It measures nothing itself:
//! the gate (`bench/harness/icount.py`) runs it under `valgrind --tool=callgrind
//! --trace-children=yes --dump-before=getpgrp`, so every process writes its instructions per
//! phase, and divides the difference between two phases of one operation (parent and worker
//! together) by the difference in their counts: the cost of a mark, like start-up, cancels.
//! Operations (the same in `bench/icount/count_python.py`):
//!
//! | op | one operation |
//! |---|---|
//! | `unary` | `call_raw("echo", 64 B)`: one round trip |
//! | `rows_json` | one small row of one `rows` stream, decoded from JSON into a typed struct |
//! | `large_rows` | one 4 KiB row (`large_rows`) of one `rows` stream, JSON, into a typed struct (not in `count_python.py` yet) |
//! | `rows_raw` | one small row of one `raw_rows` stream, walked undecoded a frame at a time |
//! | `echo_1mib` | `call_raw("echo", 1 MiB)`: 1 MiB to the worker and back |
//! | `handshake` | a second pool of one worker started (spawn, HELLO), marked and shut down |
//!
//! Heartbeats are off: a PING every second would add instructions that depend on how long
//! the run took. `WIREPOOL_ICOUNT_PLANT=op:iters` spins `iters` loop turns after every
//! operation `op`: the planted regression of `bench/tests/test_icount.py`.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use wirepool::{CallOptions, Codec, Pool, WorkerCommand};
use wirepool_bench::{payload_bytes, LargeRow, RowsReq, SmallRow};

const OPS: [&str; 6] = [
    "unary",
    "rows_json",
    "large_rows",
    "rows_raw",
    "echo_1mib",
    "handshake",
];

fn worker_command(python: bool) -> WorkerCommand {
    let exe = std::env::current_exe().expect("own path");
    if !python {
        return WorkerCommand::new(exe.with_file_name("wirepool-bench-worker"));
    }
    // <repo>/rust/target/release/wirepool-bench-count, unless WIREPOOL_REPO says otherwise.
    let root: PathBuf = std::env::var_os("WIREPOOL_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| exe.ancestors().nth(4).expect("repo root").to_path_buf());
    let python = std::env::var("WIREPOOL_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    // The gate points this at a snapshot of python/wirepool taken before it counts.
    let src =
        std::env::var_os("WIREPOOL_PYTHON_SRC").map_or_else(|| root.join("python"), PathBuf::from);
    WorkerCommand::new(python)
        .arg(root.join("bench/runners/wirepool_python_worker.py"))
        .env("PYTHONPATH", src)
}

async fn start_pool(python: bool) -> wirepool::Result<Pool> {
    Pool::builder(worker_command(python))
        .workers(1)
        .max_in_flight(4)
        .max_frame_size(16 << 20)
        .heartbeat(Duration::ZERO)
        // valgrind runs a Python worker ~50x slower than usual.
        .startup_timeout(Duration::from_secs(120))
        .start()
        .await
}

fn json() -> CallOptions {
    CallOptions {
        codec: Some(Codec::Json),
        ..Default::default()
    }
}

/// The planted slowdown: `iters` turns of a loop the optimiser cannot remove.
fn plant(iters: u64) {
    let mut x = 0u64;
    for i in 0..iters {
        x = black_box(x.wrapping_add(i));
    }
    black_box(x);
}

/// A phase boundary, in this process and then in the worker (valgrind dumps its counts on
/// every entry to `getpgrp`, which neither SDK calls).
async fn mark(pool: &Pool) -> wirepool::Result<()> {
    // SAFETY: getpgrp takes nothing and cannot fail.
    black_box(unsafe { libc::getpgrp() });
    pool.call_raw("mark", Bytes::new()).await?;
    Ok(())
}

async fn run(
    python: bool,
    counts: &[(String, u64)],
    planted: Option<(String, u64)>,
) -> wirepool::Result<()> {
    let slow = |op: &str| match &planted {
        Some((p, iters)) if p == op => *iters,
        _ => 0,
    };
    let pool = start_pool(python).await?;
    let small = Bytes::from(payload_bytes(64));
    let big = Bytes::from(payload_bytes(1 << 20));
    for (op, n) in counts {
        mark(&pool).await?;
        let spin = slow(op);
        match op.as_str() {
            "unary" | "echo_1mib" => {
                let body = if op == "unary" { &small } else { &big };
                for _ in 0..*n {
                    let reply = pool.call_raw("echo", body.clone()).await?;
                    assert_eq!(reply.len(), body.len(), "echo length");
                    plant(spin);
                }
            }
            "rows_json" => {
                let req = RowsReq {
                    shape: "small_rows".into(),
                    n: *n,
                };
                let mut rows = pool
                    .stream_with::<_, SmallRow>("rows", &req, json())
                    .await?;
                let mut got = 0u64;
                while let Some(row) = rows.next().await {
                    assert_eq!(row?.i, got, "row index");
                    got += 1;
                    plant(spin);
                }
                assert_eq!(got, *n, "row count");
            }
            "large_rows" => {
                let req = RowsReq {
                    shape: "large_rows".into(),
                    n: *n,
                };
                let mut rows = pool
                    .stream_with::<_, LargeRow>("rows", &req, json())
                    .await?;
                let mut got = 0u64;
                while let Some(row) = rows.next().await {
                    assert_eq!(row?.i, got, "row index");
                    got += 1;
                    plant(spin);
                }
                assert_eq!(got, *n, "row count");
            }
            "rows_raw" => {
                let opts = CallOptions {
                    codec: Some(Codec::Raw),
                    ..Default::default()
                };
                let req = Bytes::from(n.to_string());
                let mut rows = pool.stream_with::<_, Bytes>("raw_rows", &req, opts).await?;
                let mut got = 0u64;
                while let Some(frame) = rows.next_frame().await {
                    for row in frame?.iter() {
                        assert!(row.len() >= 30, "raw row too short");
                        got += 1;
                        plant(spin);
                    }
                }
                assert_eq!(got, *n, "row count");
            }
            "handshake" => {
                for _ in 0..*n {
                    let extra = start_pool(python).await?;
                    // The mark ends the new worker's first part of its count: its start-up,
                    // HELLO and one call. Its exit is timed by the SDK's grace periods, which
                    // valgrind's slowness can exceed, so the gate leaves it out.
                    extra.call_raw("mark", Bytes::new()).await?;
                    extra.shutdown().await;
                    plant(spin);
                }
            }
            other => unreachable!("checked in main: {other}"),
        }
    }
    mark(&pool).await?;
    pool.shutdown().await;
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let python = args
        .windows(2)
        .any(|w| w[0] == "--worker" && w[1] == "python");
    let mut counts = Vec::new();
    for a in &args {
        if let Some((op, n)) = a.split_once('=') {
            assert!(
                OPS.contains(&op),
                "unknown operation {op:?} (one of {OPS:?})"
            );
            counts.push((op.to_string(), n.parse::<u64>().expect("count")));
        }
    }
    let planted = std::env::var("WIREPOOL_ICOUNT_PLANT").ok().and_then(|v| {
        let (op, iters) = v.split_once(':')?;
        Some((op.to_string(), iters.parse().ok()?))
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = rt.block_on(run(python, &counts, planted)) {
        eprintln!("wirepool-bench-count: {e}");
        std::process::exit(1);
    }
}
