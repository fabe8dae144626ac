//! The wirepool runner of the founding workload with a Rust parent (`rust/wirepool`).
//!
//! ```sh
//! founding-parent [--worker rust|python|node|go] '<scenario json>'   # one JSON result line
//! ```
//! One pool of one worker; per repeat whole `rows` streams for the scenario's window, each of the scenario's shape and `n`, in its
//! codec, read with `pool.stream_with::<_, SmallRow|LargeRow>` one typed struct per `next()`
//! (serde, owned strings), every index checked. The workers: `founding-worker` (next to this
//! binary), `bench/runners/wirepool_python_worker.py`, `bench/runners/wirepool_node_worker.mjs`,
//! `bench/.build/go/wirepool-go-worker` (built by `bench/runners/wirepool_go.sh --prepare`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
use wirepool::{CallOptions, Codec, Pool, WorkerCommand};
use wirepool_bench::founding::{FoundingRow, LargeRow, RowsReq, SmallRow};
use wirepool_bench::{figure, load_scenario, peak_rss_kib};

fn repo_root() -> PathBuf {
    std::env::var_os("WIREPOOL_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

fn worker_command(lang: &str) -> WorkerCommand {
    let root = repo_root();
    match lang {
        "python" => {
            let python =
                std::env::var("WIREPOOL_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
            WorkerCommand::new(python)
                .arg(root.join("bench/runners/wirepool_python_worker.py"))
                .env("PYTHONPATH", root.join("python"))
        }
        "node" => {
            let node = std::env::var("WIREPOOL_BENCH_NODE").unwrap_or_else(|_| "node".into());
            WorkerCommand::new(node).arg(root.join("bench/runners/wirepool_node_worker.mjs"))
        }
        "go" => WorkerCommand::new(root.join("bench/.build/go/wirepool-go-worker"))
            .env("WIREPOOL_REPO", &root),
        _ => {
            let exe = std::env::current_exe().expect("own path");
            WorkerCommand::new(exe.with_file_name("founding-worker"))
        }
    }
}

async fn read<R: FoundingRow>(pool: &Pool, req: &RowsReq, codec: Codec) -> wirepool::Result<u64> {
    let opts = CallOptions {
        codec: Some(codec),
        ..Default::default()
    };
    let mut rows = pool.stream_with::<_, R>("rows", req, opts).await?;
    let mut count = 0u64;
    while let Some(row) = rows.next().await {
        let row = row?;
        assert_eq!(row.index(), count, "row index");
        count += 1;
    }
    Ok(count)
}

async fn run(
    sc: &serde_json::Value,
    lang: &str,
    codec: Codec,
) -> wirepool::Result<(Vec<f64>, Option<u64>)> {
    let shape = sc["shape"].as_str().unwrap_or("").to_string();
    let n = sc["n"].as_u64().unwrap_or(0);
    let repeats = sc["repeats"].as_u64().unwrap_or(3);
    let pool = Pool::builder(worker_command(lang))
        .workers(1)
        .max_in_flight(4)
        .max_frame_size(16 << 20)
        .startup_timeout(Duration::from_secs(20))
        .start()
        .await?;
    let req = RowsReq {
        shape: shape.clone(),
        n,
    };
    // One untimed stream first: the worker's first call pays for its imports and JIT.
    let warm = RowsReq {
        shape: shape.clone(),
        n: n.min(256),
    };
    let large = shape == LargeRow::SHAPE;
    if large {
        read::<LargeRow>(&pool, &warm, codec).await?;
    } else {
        read::<SmallRow>(&pool, &warm, codec).await?;
    }
    // A repeat is as many whole streams as fit in the scenario's window (at least one).
    let window = sc["duration_s"].as_f64().unwrap_or(0.25);
    let mut rates = Vec::new();
    for _ in 0..repeats {
        let t = Instant::now();
        let mut rows = 0u64;
        while rows == 0 || t.elapsed().as_secs_f64() < window {
            let got = if large {
                read::<LargeRow>(&pool, &req, codec).await?
            } else {
                read::<SmallRow>(&pool, &req, codec).await?
            };
            assert_eq!(got, n, "row count");
            rows += got;
        }
        rates.push(rows as f64 / t.elapsed().as_secs_f64());
    }
    let children = pool
        .worker_pids()
        .into_iter()
        .filter_map(peak_rss_kib)
        .max();
    pool.shutdown().await;
    Ok((rates, children))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let lang = args
        .iter()
        .position(|a| a == "--worker")
        .and_then(|i| args.get(i + 1))
        .map_or("rust", |s| s.as_str())
        .to_string();
    let runner = match lang.as_str() {
        "python" => "wirepool_rust_pyworker",
        "node" => "wirepool_rust_nodeworker",
        "go" => "wirepool_rust_goworker",
        _ => "wirepool_rust",
    };
    let sc = load_scenario();
    let id = sc["id"].clone();
    let codec = match sc["codec"].as_str().unwrap_or("json") {
        "json" => Codec::Json,
        "msgpack" => Codec::MsgPack,
        "cbor" => Codec::Cbor,
        other => {
            println!(
                "{}",
                json!({"runner": runner, "scenario": id, "status": "unsupported",
                                  "reason": format!("codec {other:?}: json, msgpack, cbor only")})
            );
            return;
        }
    };
    let shape = sc["shape"].as_str().unwrap_or("");
    if shape != SmallRow::SHAPE && shape != LargeRow::SHAPE {
        println!(
            "{}",
            json!({"runner": runner, "scenario": id, "status": "unsupported",
                              "reason": format!("founding-parent knows the founding shapes only, not {shape:?}")})
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match rt.block_on(run(&sc, &lang, codec)) {
        Ok((rates, children)) => println!(
            "{}",
            json!({"runner": runner, "scenario": id, "status": "ok",
                   "figures": [figure("rows_per_s", "rows/s", &rates, "higher")],
                   "rss_kib": {"parent": peak_rss_kib(0), "children": children},
                   "notes": format!("pool.stream_with::<_, {}> ({codec:?}, serde into typed structs, one row per next()); {lang} worker yielding one row at a time",
                                    if shape == LargeRow::SHAPE { "LargeRow" } else { "SmallRow" })})
        ),
        Err(e) => {
            eprintln!("founding-parent: {e}");
            std::process::exit(1);
        }
    }
}
