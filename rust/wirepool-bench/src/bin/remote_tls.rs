//! W2, W3 and W4 with the Rust parent over the remote transport on loopback (PROTOCOL.md 21),
//! beside the socketpair path, in the same run: the Rust counterpart of `bench/remote_tls.py`.
//!
//! ```sh
//! cargo build --release -p wirepool-bench
//! target/release/remote_tls [--repeats 5] [--window 0.5] [--only W3.oneway.1MiB,...] [--worker PATH]
//!     [--transports socketpair,tls]   (ratios are to the first transport named)
//! ```
//!
//! One `wirepool::Pool` of one `wirepool-bench-worker` (release, next to this binary unless
//! `--worker`), 16 MiB frames, on a current-thread runtime as the bench runner uses it, per
//! transport: `socketpair` (the local default, shared-memory lane off so the socket path is
//! measured), `socketpair+shm` (the local default as it is, lane on), `tls` (children that join
//! the pool's listener over TCP + TLS 1.3 on 127.0.0.1 with a ticket: `Launcher::subprocess`)
//! and `tcp` (the same join over plain loopback TCP). Each repeat runs every transport once, in
//! turn, so drift hits them alike; the report gives min / median / max and the ratio of each
//! median to socketpair's, the min / median / max of the per-repeat ratios, and the min / median
//! / max CPU time the parent and the worker spent per call, MB or row (user + system, /proc): on a
//! loaded machine the wall clock follows the CPU share, the CPU time per unit much less.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wirepool::remote::{Launcher, ListenerOptions};
use wirepool::{CallOptions, Codec, Pool, WorkerCommand, WorkerOutput};
use wirepool_bench::{RowsReq, SmallRow};

const TRANSPORTS: [&str; 4] = ["socketpair", "socketpair+shm", "tls", "tcp"];
const MAX_FRAME: u32 = 16 << 20;

struct Scenario {
    name: &'static str,
    unit: &'static str,
    in_flight: u32,
}

const SCENARIOS: [Scenario; 5] = [
    Scenario {
        name: "W2.echo.64B.x64",
        unit: "calls/s",
        in_flight: 64,
    },
    Scenario {
        name: "W2.echo.64B.x256",
        unit: "calls/s",
        in_flight: 256,
    },
    Scenario {
        name: "W3.oneway.1MiB",
        unit: "MB/s",
        in_flight: 1,
    },
    Scenario {
        name: "W3.echo.16MiB",
        unit: "MB/s",
        in_flight: 1,
    },
    Scenario {
        name: "W4.small_rows.65536",
        unit: "rows/s",
        in_flight: 4,
    },
];

fn payload(size: usize) -> Bytes {
    b"wirepool"
        .iter()
        .copied()
        .cycle()
        .take(size)
        .collect::<Vec<u8>>()
        .into()
}

async fn pool(worker: &str, transport: &str, in_flight: u32) -> wirepool::Result<Pool> {
    let builder = Pool::builder(WorkerCommand::new(worker))
        .workers(1)
        .max_in_flight(in_flight)
        .max_frame_size(MAX_FRAME)
        .worker_output(WorkerOutput::Discard);
    let builder = match transport {
        "socketpair" => builder.shm_lane(None),
        "socketpair+shm" => builder,
        "tls" => builder.launcher(Launcher::subprocess()),
        "tcp" => builder
            .launcher(Launcher::subprocess())
            .listen(ListenerOptions::default().plain_tcp()),
        other => panic!("unknown transport {other}"),
    };
    let pool = builder.start().await?;
    pool.wait_ready(Duration::from_secs(10)).await;
    Ok(pool)
}

/// Calls per second with `in_flight` calls outstanding, over at least `window`.
async fn echo_rate(
    pool: &Pool,
    method: &'static str,
    body: Bytes,
    in_flight: u32,
    window: Duration,
) -> f64 {
    let calls = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + window;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..in_flight {
        let (pool, body, calls, stop) = (pool.clone(), body.clone(), calls.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let reply = pool.call_raw(method, body.clone()).await.expect("call");
                let expect = if method == "oneway" { 8 } else { body.len() };
                assert_eq!(reply.len(), expect);
                if calls.fetch_add(1, Relaxed) % 16 == 0 && Instant::now() >= deadline {
                    stop.store(true, Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("echo task");
    }
    calls.load(Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Rows per second of one stream of `n` small rows, decoded (JSON) into `SmallRow`.
async fn rows_rate(pool: &Pool, n: u64) -> f64 {
    let start = Instant::now();
    let req = RowsReq {
        shape: "small_rows".into(),
        n,
    };
    let opts = CallOptions {
        codec: Some(Codec::Json),
        ..Default::default()
    };
    let mut rows = pool
        .stream_with::<_, SmallRow>("rows", &req, opts)
        .await
        .expect("stream");
    let mut got = 0;
    while let Some(row) = rows.next().await {
        assert_eq!(row.expect("row").i, got);
        got += 1;
    }
    assert_eq!(got, n);
    n as f64 / start.elapsed().as_secs_f64()
}

async fn measure_once(name: &str, pool: &Pool, window: Duration) -> f64 {
    match name {
        "W2.echo.64B.x64" => echo_rate(pool, "echo", payload(64), 64, window).await,
        "W2.echo.64B.x256" => echo_rate(pool, "echo", payload(64), 256, window).await,
        "W3.oneway.1MiB" => {
            echo_rate(pool, "oneway", payload(1 << 20), 1, window).await * (1 << 20) as f64 / 1e6
        }
        "W3.echo.16MiB" => {
            echo_rate(pool, "echo", payload(16 << 20), 1, window).await * (32 << 20) as f64 / 1e6
        }
        "W4.small_rows.65536" => {
            // As many streams as fit the window (at least one).
            let deadline = Instant::now() + window;
            let mut rates = Vec::new();
            while rates.is_empty() || Instant::now() < deadline {
                rates.push(rows_rate(pool, 65_536).await);
            }
            median(&mut rates)
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// CPU time (user + system) of a process so far, in seconds: 0 for this one.
fn cpu_seconds(pid: u32) -> f64 {
    let path = if pid == 0 {
        "/proc/self/stat".to_owned()
    } else {
        format!("/proc/{pid}/stat")
    };
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    // After the command: state is field 3, utime 14 and stime 15 (1-based, as proc(5) counts).
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(14) + ticks(15)) / hz
}

/// The scenario's rate, and the CPU seconds the parent and the worker spent per unit of it
/// (per call, per MB or per row) over the measured window: what the transport costs, whatever
/// the machine's load does to the wall clock.
async fn measure(
    worker: &str,
    sc: &Scenario,
    transport: &str,
    window: Duration,
) -> (f64, f64, f64) {
    let pool = pool(worker, transport, sc.in_flight)
        .await
        .expect("pool start");
    measure_once(sc.name, &pool, window / 4).await; // warm-up: buffers, the first records
    let pid = pool.worker_pids().first().copied().expect("a worker");
    assert!(pid > 0 && pid != std::process::id());
    let (p0, w0, t0) = (cpu_seconds(0), cpu_seconds(pid), Instant::now());
    let value = measure_once(sc.name, &pool, window).await;
    let units = value * t0.elapsed().as_secs_f64();
    let (p1, w1) = (cpu_seconds(0), cpu_seconds(pid));
    pool.shutdown().await;
    (value, (p1 - p0) / units, (w1 - w0) / units)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut repeats = 5;
    let mut window = Duration::from_millis(500);
    let mut only: Vec<String> = Vec::new();
    let mut transports: Vec<String> = TRANSPORTS.iter().map(|t| t.to_string()).collect();
    let mut worker = std::env::current_exe()
        .expect("own path")
        .with_file_name("wirepool-bench-worker")
        .to_string_lossy()
        .into_owned();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the option");
        match arg.as_str() {
            "--repeats" => repeats = value().parse().expect("--repeats N"),
            "--window" => window = Duration::from_secs_f64(value().parse().expect("--window S")),
            "--only" => only = value().split(',').map(str::to_owned).collect(),
            "--worker" => worker = value(),
            // Ratios are to the first one named (socketpair by default).
            "--transports" => transports = value().split(',').map(str::to_owned).collect(),
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(
        std::path::Path::new(&worker).exists(),
        "{worker} is not built (cargo build --release -p wirepool-bench)"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "# Rust parent x Rust bench worker ({worker}), {repeats} repeats, {:.2} s windows, transports alternated",
        window.as_secs_f64()
    );
    println!(
        "{:22} {:>15} {:>12} {:>12} {:>12} {:>7} {:>22}",
        "scenario", "transport", "min", "median", "max", "ratio", "per-repeat ratio"
    );
    rt.block_on(async {
        for sc in SCENARIOS.iter().filter(|s| only.is_empty() || only.iter().any(|o| o == s.name)) {
            let mut results: Vec<Vec<f64>> = vec![Vec::new(); transports.len()];
            let mut cpu: Vec<(Vec<f64>, Vec<f64>)> = vec![Default::default(); transports.len()];
            for _ in 0..repeats {
                for (i, t) in transports.iter().enumerate() {
                    let (value, parent, worker_cpu) = measure(&worker, sc, t, window).await;
                    results[i].push(value);
                    cpu[i].0.push(parent);
                    cpu[i].1.push(worker_cpu);
                }
            }
            let base_runs = results[0].clone();
            let base = median(&mut results[0].clone());
            for (i, t) in transports.iter().enumerate() {
                let mut ratios: Vec<f64> =
                    results[i].iter().zip(&base_runs).map(|(v, b)| v / b).collect();
                let mut v = results[i].clone();
                let med = median(&mut v);
                let r_med = median(&mut ratios);
                let per = sc.unit.trim_end_matches("/s");
                // min / median / max in microseconds.
                let spread = |v: &mut Vec<f64>| {
                    let med = median(v);
                    format!("{:.1}/{:.1}/{:.1}", v[0] * 1e6, med * 1e6, v[v.len() - 1] * 1e6)
                };
                println!(
                    "{:22} {:>15} {:>12.0} {:>12.0} {:>12.0} {:>6.2}x {:>6.2}/{:.2}/{:.2}x  {}  cpu/{per} (us, min/median/max): parent {}, worker {}",
                    sc.name,
                    t,
                    v[0],
                    med,
                    v[v.len() - 1],
                    med / base,
                    ratios[0],
                    r_med,
                    ratios[ratios.len() - 1],
                    sc.unit,
                    spread(&mut cpu[i].0),
                    spread(&mut cpu[i].1),
                );
            }
        }
    });
}
