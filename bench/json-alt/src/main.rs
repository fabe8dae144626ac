//! sonic-rs and simd-json against serde_json on the founding rows (issue 26): every row of a
//! shape encoded into a reused buffer, then decoded back into the same typed struct
//! (`founding::SmallRow` / `LargeRow`, serde derive), one row at a time; each library's
//! encode and decode timed apart, RUNS runs of at least 0.2 s each, min / median / max printed.
//!
//! ```sh
//! cargo build --release --manifest-path bench/json-alt/Cargo.toml --target-dir bench/.build/json-alt
//! bench/.build/json-alt/release/json-alt [RUNS]
//! ```
//! serde_json decodes with `from_str` after one UTF-8 check per row (as `wirepool_codec` does);
//! simd-json parses in place, so its decode includes copying each row into a scratch buffer it
//! may overwrite (what a caller holding a shared frame must do).

use std::time::Instant;

#[path = "../../../rust/wirepool-bench/src/founding.rs"]
#[allow(dead_code)]
mod founding;

use founding::{FoundingRow, LargeRow, SmallRow};

type Enc<R> = fn(&R, &mut Vec<u8>);
type Dec<R> = fn(&[u8], &mut Vec<u8>) -> R;

fn libs<R: FoundingRow>() -> Vec<(&'static str, Enc<R>, Dec<R>)> {
    vec![
        (
            "serde_json",
            |r, out| serde_json::to_writer(out, r).expect("encode"),
            |b, _| serde_json::from_str(std::str::from_utf8(b).expect("utf-8")).expect("decode"),
        ),
        (
            "sonic-rs",
            |r, out| sonic_rs::to_writer(out, r).expect("encode"),
            |b, _| sonic_rs::from_slice(b).expect("decode"),
        ),
        (
            "simd-json",
            |r, out| simd_json::serde::to_writer(out, r).expect("encode"),
            |b, scratch| {
                scratch.clear();
                scratch.extend_from_slice(b);
                simd_json::serde::from_slice(scratch).expect("decode")
            },
        ),
    ]
}

fn rate(rows: usize, f: &mut dyn FnMut()) -> f64 {
    let (start, mut passes) = (Instant::now(), 0u64);
    while passes == 0 || start.elapsed().as_secs_f64() < 0.2 {
        f();
        passes += 1;
    }
    (passes * rows as u64) as f64 / start.elapsed().as_secs_f64()
}

fn stats(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let m = |x: f64| format!("{:.3}M", x / 1e6);
    format!(
        "min {} median {} max {}",
        m(v[0]),
        m(v[v.len() / 2]),
        m(v[v.len() - 1])
    )
}

fn shape<R: FoundingRow + PartialEq + std::fmt::Debug>(n: u64, runs: usize) {
    let gen = R::gen();
    let rows: Vec<R> = (0..n).map(|i| R::make(&gen, i)).collect();
    let reference: Vec<Vec<u8>> = rows
        .iter()
        .map(|r| serde_json::to_vec(r).unwrap())
        .collect();
    for (name, enc, dec) in libs::<R>() {
        // Correctness first: the same bytes as serde_json, and the same rows back.
        let mut buf = Vec::new();
        let mut scratch = Vec::new();
        for (row, want) in rows.iter().zip(&reference) {
            buf.clear();
            enc(row, &mut buf);
            assert_eq!(&buf, want, "{name} encodes {} differently", R::SHAPE);
            assert_eq!(
                &dec(want, &mut scratch),
                row,
                "{name} decodes {} differently",
                R::SHAPE
            );
        }
        let (mut e, mut d) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            e.push(rate(rows.len(), &mut || {
                for row in &rows {
                    buf.clear();
                    enc(row, &mut buf);
                    std::hint::black_box(&buf);
                }
            }));
            d.push(rate(rows.len(), &mut || {
                for (row, bytes) in rows.iter().zip(&reference) {
                    let back = dec(bytes, &mut scratch);
                    assert_eq!(back.index(), row.index());
                    std::hint::black_box(&back);
                }
            }));
        }
        println!("{} {name:<10} encode rows/s {}", R::SHAPE, stats(e));
        println!("{} {name:<10} decode rows/s {}", R::SHAPE, stats(d));
    }
}

fn main() {
    let runs = std::env::args()
        .nth(1)
        .map_or(5, |v| v.parse().expect("RUNS"));
    shape::<SmallRow>(8192, runs);
    shape::<LargeRow>(512, runs);
}
