//! The main demo: a pool of Rust workers streams 10 M typed rows to the parent, with a live
//! progress bar, then a summary. `make demo`, or
//! `cargo run --release -p wirepool --example demo -- [--rows N] [--workers W]`.
//!
//! The binary is its own worker (see `shared/mod.rs`): the pool starts it again with
//! `WIREPOOL_FD` set, and that copy serves the `decls` stream.

mod shared;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use shared::Decl;
use wirepool::{peak_rss_bytes, MethodKind, Pool};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.replace('_', "").parse().expect("a number"))
        .unwrap_or(default)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// A rate rounded for a progress bar: "2.35 M rows/s", "812 k rows/s", "95 rows/s".
fn rows_per_sec(rate: f64) -> String {
    if !rate.is_finite() || rate < 0.0 {
        return "- rows/s".to_string();
    }
    let (value, unit) = if rate >= 1e6 {
        (rate / 1e6, " M")
    } else if rate >= 1e3 {
        (rate / 1e3, " k")
    } else {
        (rate, "")
    };
    let decimals = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.decimals$}{unit} rows/s")
}

fn main() -> wirepool::Result<()> {
    shared::serve_if_worker();
    let total = arg("--rows", 10_000_000);
    let workers = arg("--workers", 2) as usize;
    // One runtime thread decodes rows while the workers produce them on the other vCPUs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(total, workers))
}

async fn run(total: u64, workers: usize) -> wirepool::Result<()> {
    let pool = Pool::builder(shared::this_binary())
        .workers(workers)
        .require_method("decls", MethodKind::Stream)
        .start()
        .await?;
    println!("wirepool demo: {workers} Rust workers stream {total} rows of {{i, name, kind}} (JSON) to this process");

    let bar = ProgressBar::new(total);
    // `{per_sec}` prints four decimals ("2,345,678.1234/s"): three significant digits say it.
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} rows  {rate}  eta {eta}",
        )
        .expect("template")
        .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = w.write_str(&rows_per_sec(s.per_sec()));
        }),
    );
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();

    // Two streams per worker keep every worker busy while the parent reads the other stream.
    let streams = workers as u64 * 2;
    let tasks: Vec<_> = (0..streams)
        .map(|s| {
            let pool = pool.clone();
            let done = done.clone();
            let n = total / streams + u64::from(s < total % streams);
            tokio::spawn(async move {
                let mut rows = pool.stream::<_, Decl>("decls", &n).await?;
                let mut local = 0u64;
                let mut check = 0u64;
                while let Some(row) = rows.next().await {
                    check = check.wrapping_add(row?.i);
                    local += 1;
                    if local % 8192 == 0 {
                        done.fetch_add(8192, Relaxed);
                    }
                }
                done.fetch_add(local % 8192, Relaxed);
                assert_eq!(rows.summary::<u64>()?, Some(n));
                assert_eq!(
                    check,
                    n * n.saturating_sub(1) / 2,
                    "every row arrived once, in order"
                );
                Ok::<u64, wirepool::Error>(local)
            })
        })
        .collect();
    let ticker = {
        let bar = bar.clone();
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                bar.set_position(done.load(Relaxed));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut rows = 0;
    for t in tasks {
        rows += t.await.expect("stream task")?;
    }
    let elapsed = started.elapsed();
    ticker.abort();
    bar.set_position(rows);
    bar.finish();

    let m = pool.metrics();
    let worker_peak: u64 = pool
        .worker_pids()
        .iter()
        .filter_map(|&p| peak_rss_bytes(p))
        .max()
        .unwrap_or(0);
    let bytes: u64 = m.workers.iter().map(|w| w.bytes_in).sum();
    pool.shutdown().await;

    let secs = elapsed.as_secs_f64();
    println!();
    println!("rows            {rows}");
    println!("time            {secs:.2} s");
    println!("rows/s          {:.2} M", rows as f64 / secs / 1e6);
    println!(
        "wire MB/s       {:.0} MiB/s ({:.0} MiB received)",
        mib(bytes) / secs,
        mib(bytes)
    );
    println!(
        "parent peak RSS {:.1} MiB",
        mib(peak_rss_bytes(0).unwrap_or(0))
    );
    println!(
        "worker peak RSS {:.1} MiB (largest of {workers})",
        mib(worker_peak)
    );
    println!("restarts        {}", m.total_restarts());
    Ok(())
}
