//! The issue-3 memory check: a consumer that sleeps 1 ms every 1,000 rows reads a 10 M-row
//! stream of small JSON rows (decoded into typed structs); the parent's resident set must stay
//! within 64 MiB of where it started.
//!
//! ```sh
//! cargo run --release -p wirepool-bench --bin slow_consumer [-- ROWS [EVERY [PAUSE_MS [python]]]]
//! ```
//! Prints one JSON line: rows, seconds, the parent's RSS at the start (pool started, before the
//! stream), its highest RSS sampled every 10,000 rows, VmHWM at the end, the growth, and the
//! worker's peak. Exits 1 when the growth is above 64 MiB.

use std::time::{Duration, Instant};

use wirepool::{Pool, WorkerCommand};
use wirepool_bench::{peak_rss_kib, rss_kib, RowsReq, SmallRow};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = args
        .first()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let every: u64 = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1000);
    let pause_ms: f64 = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1.0);
    let python = args.get(3).is_some_and(|v| v == "python");
    let exe = std::env::current_exe().expect("own path");
    let cmd = if python {
        let root = exe.ancestors().nth(4).expect("repo root").to_path_buf();
        WorkerCommand::new(
            std::env::var("WIREPOOL_BENCH_PYTHON").unwrap_or_else(|_| "python3".into()),
        )
        .arg(root.join("bench/runners/wirepool_python_worker.py"))
        .env("PYTHONPATH", root.join("python"))
    } else {
        WorkerCommand::new(exe.with_file_name("wirepool-bench-worker"))
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let pool = Pool::builder(cmd)
            .workers(1)
            .max_frame_size(16 << 20)
            .start()
            .await
            .expect("pool");
        let start_kib = rss_kib(0).unwrap_or(0);
        let pause = Duration::from_secs_f64(pause_ms / 1000.0);
        let t = Instant::now();
        let req = RowsReq {
            shape: "small_rows".into(),
            n,
        };
        let mut rows = pool
            .stream::<_, SmallRow>("rows", &req)
            .await
            .expect("stream");
        let (mut count, mut max_kib) = (0u64, start_kib);
        while let Some(row) = rows.next().await {
            let row = row.expect("row");
            assert_eq!(row.i, count, "row order");
            count += 1;
            if count % every == 0 {
                tokio::time::sleep(pause).await;
            }
            if count % 10_000 == 0 {
                max_kib = max_kib.max(rss_kib(0).unwrap_or(0));
            }
        }
        assert_eq!(count, n, "row count");
        let worker_kib = pool
            .worker_pids()
            .into_iter()
            .filter_map(peak_rss_kib)
            .max();
        pool.shutdown().await;
        let hwm = peak_rss_kib(0).unwrap_or(0);
        let growth_kib = max_kib.max(hwm) as i64 - start_kib as i64;
        println!(
            "{}",
            serde_json::json!({"rows": count, "seconds": t.elapsed().as_secs_f64(),
                "worker": if python { "python" } else { "rust" },
                "parent_rss_start_kib": start_kib, "parent_rss_max_sampled_kib": max_kib,
                "parent_vmhwm_end_kib": hwm, "growth_kib": growth_kib,
                "worker_peak_kib": worker_kib, "limit_kib": 64 * 1024})
        );
        if growth_kib > 64 * 1024 {
            std::process::exit(1);
        }
    });
}
