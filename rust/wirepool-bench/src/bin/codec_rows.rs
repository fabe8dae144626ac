//! "The codec's speed" of issue 17: the W4 rows encoded and decoded by the codec alone, on the
//! same bytes the bench worker sends, with no protocol, no process and no I/O. What a row costs
//! in a wirepool stream beyond these figures is the SDK's own cost.
//!
//! ```sh
//! cd rust && cargo run --release -p wirepool-bench --bin codec_rows [N] [REPEATS] [FILTER]
//! ```
//!
//! `FILTER` (e.g. `small MsgPack decode`) runs only the lines that contain it: for instruction
//! counts under callgrind, one operation at a time.
//!
//! For each shape (small, large) and codec (json, msgpack): rows/s (min / median / max of the
//! repeats) per wall second and per CPU second of the thread (the one to compare on a loaded
//! machine, with the CPU time per row of each process of a stream, e.g. from `perf record`) of
//! - `encode`: `Codec::encode` of the worker's row into one growing buffer, with its length
//!   prefix (what a worker's sink does per row);
//! - `decode serde`: `serde_json::from_slice` / `rmp_serde::from_slice` of each row into the
//!   parent's typed struct, walking the prefixes (the codec crate itself, best path);
//! - `decode serde str` (JSON): `std::str::from_utf8` of the row, then `serde_json::from_str`;
//! - `decode Codec`: `wirepool_codec::Codec::decode` of each row (the SDK's codec layer).

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::Instant;

use serde::Serialize;
use wirepool::Codec;
use wirepool_bench::{thread_cpu_ns, LargeRow, SmallRow, LARGE_TAIL};

/// The bench worker's row (`wirepool-bench-worker`).
#[derive(Serialize)]
struct Row {
    i: u64,
    name: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    blob: Option<String>,
}

fn row(i: u64, large: bool) -> Row {
    let mut name = String::new();
    let _ = write!(name, "decl_{i}");
    Row {
        i,
        name,
        kind: "theorem",
        blob: large.then(|| format!("{:08}{}", i % 100_000_000, "x".repeat(LARGE_TAIL))),
    }
}

/// `[len u32][row]...` as in a ROWS payload.
fn encode_all(codec: Codec, rows: &[Row], out: &mut Vec<u8>) {
    out.clear();
    for r in rows {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        codec.encode(r, out).unwrap();
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }
}

fn each_row(buf: &[u8], mut f: impl FnMut(&[u8])) {
    let mut rest = buf;
    while let Some((len, tail)) = rest.split_first_chunk::<4>() {
        let (row, tail) = tail.split_at(u32::from_le_bytes(*len) as usize);
        f(row);
        rest = tail;
    }
}

fn serde_decode<T: serde::de::DeserializeOwned>(codec: Codec, row: &[u8]) -> T {
    match codec {
        Codec::Json => serde_json::from_slice(row).unwrap(),
        _ => rmp_serde::from_slice(row).unwrap(),
    }
}

fn stats(mut rates: Vec<f64>) -> String {
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    format!(
        "{:>7.2} / {:>7.2} / {:>7.2} M rows/s",
        rates[0] / 1e6,
        rates[rates.len() / 2] / 1e6,
        rates[rates.len() - 1] / 1e6
    )
}

fn measure(label: &str, n: usize, repeats: usize, mut run: impl FnMut()) {
    let filter = std::env::args().nth(3).unwrap_or_default();
    if !label.contains(&filter) {
        return;
    }
    run(); // warm
    let (mut wall, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let (t, c) = (Instant::now(), thread_cpu_ns());
        run();
        wall.push(n as f64 / t.elapsed().as_secs_f64());
        cpu.push(n as f64 * 1e9 / (thread_cpu_ns() - c).max(1) as f64);
    }
    println!(
        "{label:<28} {}   per CPU second: {}",
        stats(wall),
        stats(cpu)
    );
}

fn shape<T: serde::de::DeserializeOwned>(
    large: bool,
    n: usize,
    repeats: usize,
    index: fn(&T) -> u64,
) {
    let rows: Vec<Row> = (0..n as u64).map(|i| row(i, large)).collect();
    for codec in [Codec::Json, Codec::MsgPack] {
        let label = format!("{} {:?}", if large { "large" } else { "small" }, codec);
        let mut buf = Vec::with_capacity(n * if large { 4200 } else { 64 });
        encode_all(codec, &rows, &mut buf);
        measure(&format!("{label} encode"), n, repeats, || {
            encode_all(codec, black_box(&rows), &mut buf)
        });
        measure(&format!("{label} decode serde"), n, repeats, || {
            let mut i = 0;
            each_row(&buf, |r| {
                let row: T = serde_decode(codec, r);
                assert_eq!(index(&row), i);
                i += 1;
            });
        });
        if codec == Codec::Json {
            measure(&format!("{label} decode serde str"), n, repeats, || {
                let mut i = 0;
                each_row(&buf, |r| {
                    let row: T = serde_json::from_str(std::str::from_utf8(r).unwrap()).unwrap();
                    assert_eq!(index(&row), i);
                    i += 1;
                });
            });
        }
        measure(&format!("{label} decode Codec"), n, repeats, || {
            let mut i = 0;
            each_row(&buf, |r| {
                let row: T = codec.decode(r).unwrap();
                assert_eq!(index(&row), i);
                i += 1;
            });
        });
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .take(2)
        .map(|a| a.parse().unwrap())
        .collect();
    let n = args.first().copied().unwrap_or(1_000_000);
    let repeats = args.get(1).copied().unwrap_or(5);
    println!("{n} rows, {repeats} repeats: min / median / max");
    shape::<SmallRow>(false, n, repeats, |r| r.i);
    shape::<LargeRow>(true, n / 16, repeats, |r| r.i);
}
