//! `wirepool-bench`: the wirepool runner of `bench/` with the Rust parent (`rust/wirepool`).
//!
//! ```sh
//! wirepool-bench [--worker rust|python|node|go] '<scenario json>'   # one JSON result line on stdout
//! ```
//! Called by `bench/runners/wirepool_rust.sh` (Rust workers),
//! `bench/runners/wirepool_rust_pyworker.sh` (Python workers),
//! `bench/runners/wirepool_rust_nodeworker.sh` (Node workers) and
//! `bench/runners/wirepool_rust_goworker.sh` (Go workers); see `bench/README.md` for the
//! scenario kinds. The workers are `wirepool-bench-worker` (built next to this binary),
//! `bench/runners/wirepool_python_worker.py`, `bench/runners/wirepool_node_worker.mjs` (on
//! `node/dist`) or `bench/.build/go/wirepool-go-worker` (built by `wirepool_go.sh --prepare`
//! from `bench/runners/go`); all serve the same methods.
//!
//! How the SDK is used (the fast way a user would): a `current_thread` tokio runtime (measured
//! faster than `multi_thread` on 2 vCPUs); 16 MiB frames, the largest the protocol allows and
//! what both worker SDKs offer, so 1 MiB payloads travel in one frame; raw codec and `call_raw`
//! for payloads (no copy of the result); `inflight` spawned tasks each looping on `call_raw` for
//! pipelined echo; `pool.stream_with::<_, SmallRow>` decoding rows (in the scenario's codec:
//! json, msgpack or cbor) into typed structs one at a time as they are read, or walking raw rows
//! a frame at a time; a pool of `workers` with two tasks in flight each for W5.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use wirepool::{CallOptions, Codec, Pool, WorkerCommand};
use wirepool_bench::{
    figure, load_scenario, payload_bytes, peak_rss_kib, LargeRow, RowsReq, SmallRow,
};

const MAX_FRAME: u32 = 16 << 20;

#[derive(Clone, Copy, PartialEq)]
enum WorkerLang {
    Rust,
    Python,
    Node,
    Go,
}

fn repo_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("WIREPOOL_REPO") {
        return dir.into();
    }
    // <repo>/rust/target/release/wirepool-bench
    let exe = std::env::current_exe().expect("own path");
    exe.ancestors()
        .nth(4)
        .expect("repo root above target/release")
        .to_path_buf()
}

fn worker_command(lang: WorkerLang) -> WorkerCommand {
    match lang {
        WorkerLang::Rust => {
            let exe = std::env::current_exe().expect("own path");
            WorkerCommand::new(exe.with_file_name("wirepool-bench-worker"))
        }
        WorkerLang::Python => {
            let root = repo_root();
            let python =
                std::env::var("WIREPOOL_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
            WorkerCommand::new(python)
                .arg(root.join("bench/runners/wirepool_python_worker.py"))
                .env("PYTHONPATH", root.join("python"))
        }
        WorkerLang::Node => {
            let node = std::env::var("WIREPOOL_BENCH_NODE").unwrap_or_else(|_| "node".into());
            WorkerCommand::new(node).arg(repo_root().join("bench/runners/wirepool_node_worker.mjs"))
        }
        WorkerLang::Go => {
            let root = repo_root();
            WorkerCommand::new(root.join("bench/.build/go/wirepool-go-worker"))
                .env("WIREPOOL_REPO", root)
        }
    }
}

/// The scenario's `max_frame_size` when it sets one (the large-message variants run with the
/// SDK default and around it), else 16 MiB.
fn frame_size(sc: &Value) -> u32 {
    sc["max_frame_size"]
        .as_u64()
        .map_or(MAX_FRAME, |n| n as u32)
}

/// `--no-shm`: the shared-memory lane off (runner `wirepool_rust_socket`), the socket path
/// measured beside the lane in the same run (W3 only).
static SOCKET_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--zero-copy`: W3 one-way bodies are written once into `Pool::body_buf` (shared memory) and
/// that body is sent on every call, lent to the worker without a copy (runner
/// `wirepool_rust_zerocopy`); W7 asks the worker for the zero-copy result the same way.
static ZERO_COPY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--fill` (with `--zero-copy`): every call writes its body anew into a fresh
/// `Pool::body_buf` (a memset of the payload, the least a producer pays), instead of sending
/// one body built once (runner `wirepool_rust_zerocopy_fill`).
static FILL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

async fn start_pool(
    lang: WorkerLang,
    workers: usize,
    max_in_flight: u32,
    max_frame: u32,
) -> wirepool::Result<Pool> {
    Pool::builder(worker_command(lang))
        .workers(workers)
        .max_in_flight(max_in_flight)
        .max_frame_size(max_frame)
        .startup_timeout(Duration::from_secs(20))
        .shm_lane(if SOCKET_ONLY.load(std::sync::atomic::Ordering::Relaxed) {
            None
        } else {
            Some(1 << 20)
        })
        .start()
        .await
}

/// Nearest-rank percentile of sorted nanoseconds, in microseconds (same rule as floor.c).
fn percentile_us(sorted: &[u64], q: f64) -> f64 {
    let n = sorted.len();
    let rank = ((q / 100.0 * n as f64 + 0.5) as usize).clamp(1, n);
    sorted[rank - 1] as f64 / 1000.0
}

fn children_peak_kib(pool: &Pool) -> Option<u64> {
    pool.worker_pids()
        .into_iter()
        .filter_map(peak_rss_kib)
        .max()
}

/// What an echo window sends: the method, its body, how many calls stay outstanding, and the
/// reply size each call must get.
struct EchoLoad {
    method: &'static str,
    body: Bytes,
    inflight: usize,
    expect: usize,
}

/// One timed window of echo/oneway calls with `inflight` outstanding; (calls, seconds, latencies).
async fn echo_window(
    pool: &Pool,
    load: &EchoLoad,
    window: Duration,
    min_calls: u64,
    latency: bool,
) -> wirepool::Result<(u64, f64, Vec<u64>)> {
    let EchoLoad {
        method,
        ref body,
        inflight,
        expect,
    } = *load;
    let start = Instant::now();
    let deadline = start + window;
    if inflight == 1 {
        let mut lat = Vec::new();
        let mut calls = 0u64;
        let mut now = start;
        let fill = FILL.load(Relaxed);
        while now < deadline || calls < min_calls {
            let t0 = now;
            let body = if fill {
                let mut b = pool.body_buf(body.len());
                b.resize(body.len(), 0x77);
                b.freeze()
            } else {
                body.clone()
            };
            let reply = pool.call_raw(method, body).await?;
            check_reply(method, &reply, expect)?;
            now = Instant::now();
            if latency {
                lat.push((now - t0).as_nanos() as u64);
            }
            calls += 1;
        }
        return Ok((calls, (now - start).as_secs_f64(), lat));
    }
    // `inflight` tasks each keep one call outstanding until the window and min_calls are done.
    let calls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(inflight);
    for _ in 0..inflight {
        let (pool, body, calls, stop) = (pool.clone(), body.clone(), calls.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let reply = pool.call_raw(method, body.clone()).await?;
                check_reply(method, &reply, expect)?;
                let done = calls.fetch_add(1, Relaxed) + 1;
                // The clock is read every 16th call: the loop should cost the SDK, not the timer.
                if done % 16 == 0 && done >= min_calls && Instant::now() >= deadline {
                    stop.store(true, Relaxed);
                }
            }
            Ok::<_, wirepool::Error>(())
        }));
    }
    for t in tasks {
        t.await.expect("echo task panicked")?;
    }
    Ok((
        calls.load(Relaxed),
        start.elapsed().as_secs_f64(),
        Vec::new(),
    ))
}

fn check_reply(method: &str, reply: &Bytes, expect: usize) -> wirepool::Result<()> {
    let got = if method == "oneway" {
        u64::from_le_bytes(reply[..8].try_into().unwrap_or([0; 8])) as usize
    } else {
        reply.len()
    };
    if got != expect {
        panic!("{method} answered {got} bytes, expected {expect}");
    }
    Ok(())
}

async fn run_echo(
    sc: &Value,
    lang: WorkerLang,
) -> wirepool::Result<(Vec<Value>, Option<u64>, String)> {
    let kind = sc["kind"].as_str().unwrap_or("echo");
    let payload = sc["payload"].as_u64().unwrap_or(64) as usize;
    let inflight = sc["inflight"].as_u64().unwrap_or(1) as usize;
    let window = Duration::from_secs_f64(sc["duration_s"].as_f64().unwrap_or(0.1));
    let warmup = Duration::from_secs_f64(sc["warmup_s"].as_f64().unwrap_or(0.0));
    let min_calls = sc["min_calls"].as_u64().unwrap_or(1);
    let repeats = sc["repeats"].as_u64().unwrap_or(3);
    let method = if kind == "oneway" { "oneway" } else { "echo" };
    let latency = kind == "echo" && inflight == 1;
    let pool = start_pool(lang, 1, inflight.max(1) as u32, frame_size(sc)).await?;
    let body = if ZERO_COPY.load(std::sync::atomic::Ordering::Relaxed) {
        let mut buf = pool.body_buf(payload);
        buf.extend_from_slice(&payload_bytes(payload));
        buf.freeze()
    } else {
        Bytes::from(payload_bytes(payload))
    };
    let load = EchoLoad {
        method,
        body,
        inflight,
        expect: payload,
    };
    echo_window(&pool, &load, warmup, 1, false).await?;
    let (mut rates, mut mbs, mut p50s, mut p99s) = (vec![], vec![], vec![], vec![]);
    for _ in 0..repeats {
        let (calls, secs, mut lat) = echo_window(&pool, &load, window, min_calls, latency).await?;
        rates.push(calls as f64 / secs);
        let dirs = if kind == "echo_large" { 2.0 } else { 1.0 };
        mbs.push(calls as f64 * payload as f64 * dirs / secs / 1e6);
        if !lat.is_empty() {
            lat.sort_unstable();
            p50s.push(percentile_us(&lat, 50.0));
            p99s.push(percentile_us(&lat, 99.0));
        }
    }
    let children = children_peak_kib(&pool);
    pool.shutdown().await;
    let figs = if kind == "oneway" || kind == "echo_large" {
        vec![figure("mb_per_s", "MB/s", &mbs, "higher")]
    } else {
        let mut f = vec![figure("calls_per_s", "calls/s", &rates, "higher")];
        if !p50s.is_empty() {
            f.push(figure("p50_us", "us", &p50s, "lower"));
            f.push(figure("p99_us", "us", &p99s, "lower"));
        }
        f
    };
    let notes = format!(
        "call_raw, raw codec, {} KiB frames; {}",
        frame_size(sc) >> 10,
        if inflight > 1 {
            format!("{inflight} tasks each keeping one call outstanding")
        } else {
            "one call at a time".into()
        }
    );
    Ok((figs, children, notes))
}

/// W7: one Arrow IPC stream of `rows` rows per call from the worker (`arrow_batch`), read
/// with `decode_batches_shared` (a view of the worker's region when the lane is on: the arrays
/// point into it). MB/s of the stream's bytes and rows/s, one call at a time.
async fn run_arrow(
    sc: &Value,
    lang: WorkerLang,
) -> wirepool::Result<(Vec<Value>, Option<u64>, String)> {
    let rows = sc["rows"].as_u64().unwrap_or(1 << 20) as usize;
    let window = Duration::from_secs_f64(sc["duration_s"].as_f64().unwrap_or(0.1));
    let min_calls = sc["min_calls"].as_u64().unwrap_or(1);
    let repeats = sc["repeats"].as_u64().unwrap_or(3);
    let zero_copy = ZERO_COPY.load(std::sync::atomic::Ordering::Relaxed);
    let pool = start_pool(lang, 1, 1, MAX_FRAME).await?;
    let req = Bytes::from(if zero_copy {
        format!("{rows} zc")
    } else {
        rows.to_string()
    });
    let call = || async {
        let body = pool.call_raw("arrow_batch", req.clone()).await?;
        let len = body.len();
        let batches = wirepool_codec::arrow::decode_batches_shared(body)
            .unwrap_or_else(|e| panic!("the worker's Arrow stream: {e}"));
        let got: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(got, rows, "rows in the worker's batch");
        Ok::<usize, wirepool::Error>(len)
    };
    let stream_len = call().await?;
    let (mut mbs, mut rates) = (vec![], vec![]);
    for _ in 0..repeats {
        let start = Instant::now();
        let mut calls = 0u64;
        while calls < min_calls || start.elapsed() < window {
            call().await?;
            calls += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        mbs.push(calls as f64 * stream_len as f64 / secs / 1e6);
        rates.push(calls as f64 * rows as f64 / secs);
    }
    let children = children_peak_kib(&pool);
    pool.shutdown().await;
    let figs = vec![
        figure("mb_per_s", "MB/s", &mbs, "higher"),
        figure("rows_per_s", "rows/s", &rates, "higher"),
    ];
    let notes = format!(
        "one {rows}-row batch ({stream_len} IPC bytes) per call_raw, decoded with \
         wirepool_codec::arrow::decode_batches_shared (zero-copy arrays); worker {}",
        if zero_copy {
            "writes the stream into Context::body_buf"
        } else {
            "writes the stream into a Vec"
        }
    );
    Ok((figs, children, notes))
}

/// Reads one stream of `n` rows in `codec`, decoded into `Row`; pauses `pause` after every
/// `every` rows.
async fn read_rows<Row: serde::de::DeserializeOwned + 'static>(
    pool: &Pool,
    req: &RowsReq,
    codec: Codec,
    every: u64,
    pause: Duration,
    index: impl Fn(&Row) -> u64,
) -> wirepool::Result<u64> {
    let opts = CallOptions {
        codec: Some(codec),
        ..Default::default()
    };
    let mut rows = pool.stream_with::<_, Row>("rows", req, opts).await?;
    let mut count = 0u64;
    while let Some(row) = rows.next().await {
        let row = row?;
        if index(&row) != count {
            panic!("row {count} carried index {}", index(&row));
        }
        count += 1;
        if every > 0 && count % every == 0 {
            // A blocking sleep, like the floor's nanosleep: tokio's timer has a 1 ms resolution
            // and rounds up, so `tokio::time::sleep(1 ms)` pauses 1-2 ms and would charge the
            // SDK for the timer. Blocking the current-thread runtime also stops the reader, as
            // a busy consumer would.
            std::thread::sleep(pause);
        }
    }
    Ok(count)
}

/// The raw rows of `raw_rows` (the small or large row's JSON text as bytes), walked a frame at a
/// time.
async fn read_raw_rows(pool: &Pool, n: u64, large: bool) -> wirepool::Result<u64> {
    let opts = CallOptions {
        codec: Some(Codec::Raw),
        ..Default::default()
    };
    let req = Bytes::from(if large {
        format!("{n} large")
    } else {
        n.to_string()
    });
    let mut rows = pool.stream_with::<_, Bytes>("raw_rows", &req, opts).await?;
    let (mut count, mut bytes) = (0u64, 0usize);
    while let Some(frame) = rows.next_frame().await {
        for row in frame?.iter() {
            count += 1;
            bytes += row.len();
        }
    }
    let least = if large { 4096 + 30 } else { 30 };
    assert!(bytes >= count as usize * least, "raw rows too short");
    Ok(count)
}

/// The scenario's row codec (`None`: raw rows, not decoded).
fn row_codec(sc: &Value) -> Result<Option<Codec>, String> {
    match sc["codec"].as_str().unwrap_or("json") {
        "json" => Ok(Some(Codec::Json)),
        "msgpack" => Ok(Some(Codec::MsgPack)),
        "cbor" => Ok(Some(Codec::Cbor)),
        "raw" if sc["kind"] == "rows" => Ok(None),
        "raw" => Err("raw rows exist for scenarios of kind rows only".into()),
        other => Err(format!(
            "codec {other:?} is not one of json, msgpack, cbor, raw"
        )),
    }
}

async fn run_rows(
    sc: &Value,
    lang: WorkerLang,
    codec: Option<Codec>,
) -> wirepool::Result<(Vec<Value>, Option<u64>, String)> {
    let shape = sc["shape"].as_str().unwrap_or("small_rows").to_string();
    let n = sc["n"].as_u64().unwrap_or(0);
    let repeats = sc["repeats"].as_u64().unwrap_or(3);
    let every = sc["every"].as_u64().unwrap_or(0);
    let pause = Duration::from_secs_f64(sc["pause_ms"].as_f64().unwrap_or(0.0) / 1000.0);
    let pool = start_pool(lang, 1, 4, frame_size(sc)).await?;
    let req = RowsReq {
        shape: shape.clone(),
        n,
    };
    let mut rates = Vec::new();
    for _ in 0..repeats {
        let t = Instant::now();
        let got = if codec.is_none() {
            read_raw_rows(&pool, n, shape == "large_rows").await?
        } else if shape == "large_rows" {
            let codec = codec.unwrap_or(Codec::Json);
            read_rows::<LargeRow>(&pool, &req, codec, every, pause, |r| {
                debug_assert!(r.blob.len() == 4096 && r.kind == "theorem" && !r.name.is_empty());
                r.i
            })
            .await?
        } else {
            let codec = codec.unwrap_or(Codec::Json);
            read_rows::<SmallRow>(&pool, &req, codec, every, pause, |r| {
                debug_assert!(r.kind == "theorem" && !r.name.is_empty());
                r.i
            })
            .await?
        };
        assert_eq!(got, n, "row count");
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    let figs = vec![figure("rows_per_s", "rows/s", &rates, "higher")];
    let notes =
        match codec {
            None => format!(
                "raw codec: the {} row's JSON text as bytes, walked a ROWS frame at a time \
                 (next_frame), not decoded",
                if shape == "large_rows" {
                    "large"
                } else {
                    "small"
                }
            ),
            Some(c) => format!(
            "pool.stream_with::<_, {}> ({c:?} codec, serde into typed structs, one row per next())",
            if shape == "large_rows" { "LargeRow" } else { "SmallRow" }
        ),
        };
    let children = children_peak_kib(&pool);
    pool.shutdown().await;
    Ok((figs, children, notes))
}

async fn run_pool(
    sc: &Value,
    lang: WorkerLang,
) -> wirepool::Result<(Vec<Value>, Option<u64>, String)> {
    let workers = sc["workers"].as_u64().unwrap_or(1) as usize;
    let task_us = sc["task_us"].as_u64().unwrap_or(50);
    let tasks = sc["tasks"].as_u64().unwrap_or(100);
    let repeats = sc["repeats"].as_u64().unwrap_or(3);
    let pool = start_pool(lang, workers, 2, frame_size(sc)).await?;
    // Warm every worker (and its first call) outside the measurement.
    let warm: Vec<_> = (0..workers * 2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.call::<_, u64>("spin", &1u64).await })
        })
        .collect();
    for w in warm {
        w.await.expect("warm-up task")?;
    }
    let mut rates = Vec::new();
    for _ in 0..repeats {
        let next = Arc::new(AtomicU64::new(0));
        let t = Instant::now();
        let drivers: Vec<_> = (0..workers * 2)
            .map(|_| {
                let (pool, next) = (pool.clone(), next.clone());
                tokio::spawn(async move {
                    while next.fetch_add(1, Relaxed) < tasks {
                        let us: u64 = pool.call("spin", &task_us).await?;
                        assert_eq!(us, task_us);
                    }
                    Ok::<_, wirepool::Error>(())
                })
            })
            .collect();
        for d in drivers {
            d.await.expect("driver task")?;
        }
        rates.push(tasks as f64 / t.elapsed().as_secs_f64());
    }
    let children = children_peak_kib(&pool);
    pool.shutdown().await;
    Ok((vec![figure("tasks_per_s", "tasks/s", &rates, "higher")], children,
        "pool.call(\"spin\") from 2 x workers tasks, max_in_flight 2 per worker; the worker spins on thread CPU time, one task at a time".into()))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let lang = match args
        .iter()
        .position(|a| a == "--worker")
        .and_then(|i| args.get(i + 1))
    {
        Some(l) if l == "python" => WorkerLang::Python,
        Some(l) if l == "node" => WorkerLang::Node,
        Some(l) if l == "go" => WorkerLang::Go,
        _ => WorkerLang::Rust,
    };
    let socket_only = args.iter().any(|a| a == "--no-shm");
    SOCKET_ONLY.store(socket_only, std::sync::atomic::Ordering::Relaxed);
    let zero_copy = args.iter().any(|a| a == "--zero-copy");
    ZERO_COPY.store(zero_copy, std::sync::atomic::Ordering::Relaxed);
    FILL.store(
        zero_copy && args.iter().any(|a| a == "--fill"),
        std::sync::atomic::Ordering::Relaxed,
    );
    let runner = match lang {
        WorkerLang::Rust if socket_only => "wirepool_rust_socket",
        WorkerLang::Rust => "wirepool_rust",
        WorkerLang::Python => "wirepool_rust_pyworker",
        WorkerLang::Node => "wirepool_rust_nodeworker",
        WorkerLang::Go => "wirepool_rust_goworker",
    };
    // `--runner NAME`: the name printed (the zero-copy and W7 entries of the registry).
    let named = args
        .iter()
        .position(|a| a == "--runner")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let runner: &str = named.as_deref().unwrap_or(runner);
    let sc = load_scenario();
    let id = sc["id"].clone();
    let kind = sc["kind"].as_str().unwrap_or("").to_string();
    let w3 = matches!(kind.as_str(), "oneway" | "echo_large");
    let arrow_runner = named
        .as_deref()
        .is_some_and(|n| n.starts_with("wirepool_arrow_"));
    if (zero_copy && !(kind == "oneway" || kind == "arrow")) || (kind == "arrow") != arrow_runner {
        println!(
            "{}",
            json!({"runner": runner, "scenario": id, "status": "unsupported",
                   "reason": "the zero-copy body: W3 one-way; W7 (Arrow): its own runners only"})
        );
        return;
    }
    if socket_only && !(w3 || kind == "arrow") {
        println!(
            "{}",
            json!({"runner": runner, "scenario": id, "status": "unsupported",
                   "reason": "the socket path beside the shm lane: W3 only"})
        );
        return;
    }
    if kind == "frames" {
        println!(
            "{}",
            json!({"runner": runner, "scenario": id, "status": "unsupported", "reason": "floor-only scenario"})
        );
        return;
    }
    let codec = match row_codec(&sc) {
        Ok(c) => c,
        Err(reason) => {
            println!(
                "{}",
                json!({"runner": runner, "scenario": id, "status": "unsupported", "reason": reason})
            );
            return;
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let outcome = rt.block_on(async {
        match kind.as_str() {
            "echo" | "oneway" | "echo_large" => run_echo(&sc, lang).await,
            "rows" | "slow_rows" => run_rows(&sc, lang, codec).await,
            "pool" => run_pool(&sc, lang).await,
            "arrow" => run_arrow(&sc, lang).await,
            other => panic!("unknown scenario kind {other}"),
        }
    });
    match outcome {
        Ok((figs, children, notes)) => println!(
            "{}",
            json!({"runner": runner, "scenario": id, "status": "ok", "figures": figs,
                   "rss_kib": {"parent": peak_rss_kib(0), "children": children}, "notes": notes})
        ),
        Err(e) => {
            eprintln!("wirepool-bench: {e}");
            std::process::exit(1);
        }
    }
}
