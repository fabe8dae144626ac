//! The codec alone on the founding rows (the "microbenchmark" beside the end-to-end figures):
//! per repeat, every row of the scenario encoded into a reused buffer and decoded back into its
//! typed struct with `wirepool_codec::Codec` (the SDK's own encode and decode paths: serde_json
//! with one UTF-8 check per value, rmp-serde with named fields, ciborium), one row at a time, in
//! one process. Passes over the rows repeat until the scenario's window has passed.
//!
//! ```sh
//! founding-codec '<scenario json>'          # the runner contract: codec_rust
//! founding-codec --lines SHAPE N            # rows 0..N as compact JSON lines (the digest test)
//! ```

use std::time::Instant;

use serde_json::json;
use wirepool_bench::founding::{json_lines, FoundingRow, LargeRow, SmallRow};
use wirepool_bench::{figure, load_scenario, peak_rss_kib};
use wirepool_codec::Codec;

/// (encode + decode, encode alone, decode alone) rows/s of one repeat.
fn measure<R: FoundingRow>(rows: &[R], codec: Codec, window: f64) -> (f64, f64, f64) {
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    // Decode alone reads these, encoded once before the clock starts.
    let encoded: Vec<Vec<u8>> = rows
        .iter()
        .map(|r| codec.to_vec(r).expect("encode"))
        .collect();
    let (mut both, mut enc, mut dec) = (0.0, 0.0, 0.0);
    let (mut n_both, mut n_enc, mut n_dec) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < window || n_both == 0 {
        let t = Instant::now();
        for row in rows {
            buf.clear();
            codec.encode(row, &mut buf).expect("encode");
            let back: R = codec.decode(&buf).expect("decode");
            assert_eq!(back.index(), row.index());
            std::hint::black_box(&back);
        }
        both += t.elapsed().as_secs_f64();
        n_both += rows.len() as u64;
        // Encode alone, into the reused buffer.
        let t = Instant::now();
        for row in rows {
            buf.clear();
            codec.encode(row, &mut buf).expect("encode");
            std::hint::black_box(&buf);
        }
        enc += t.elapsed().as_secs_f64();
        n_enc += rows.len() as u64;
        let t = Instant::now();
        for (row, bytes) in rows.iter().zip(&encoded) {
            let back: R = codec.decode(bytes).expect("decode");
            assert_eq!(back.index(), row.index());
            std::hint::black_box(&back);
        }
        dec += t.elapsed().as_secs_f64();
        n_dec += rows.len() as u64;
    }
    (n_both as f64 / both, n_enc as f64 / enc, n_dec as f64 / dec)
}

fn run<R: FoundingRow>(sc: &serde_json::Value, codec: Codec) -> [Vec<f64>; 3] {
    let n = sc["n"].as_u64().unwrap_or(0);
    let repeats = sc["repeats"].as_u64().unwrap_or(3);
    let window = sc["duration_s"].as_f64().unwrap_or(0.1);
    let gen = R::gen();
    let rows: Vec<R> = (0..n).map(|i| R::make(&gen, i)).collect();
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..repeats {
        let (b, e, d) = measure(&rows, codec, window);
        out[0].push(b);
        out[1].push(e);
        out[2].push(d);
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--lines") {
        let n: u64 = args[3].parse().expect("N");
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        match args[2].as_str() {
            SmallRow::SHAPE => json_lines::<SmallRow>(n, &mut out),
            LargeRow::SHAPE => json_lines::<LargeRow>(n, &mut out),
            other => panic!("unknown shape {other}"),
        }
        .expect("stdout");
        return;
    }
    let sc = load_scenario();
    let id = sc["id"].clone();
    let codec = match sc["codec"].as_str().unwrap_or("json") {
        "json" => Codec::Json,
        "msgpack" => Codec::MsgPack,
        "cbor" => Codec::Cbor,
        other => {
            println!(
                "{}",
                json!({"runner": "codec_rust", "scenario": id, "status": "unsupported",
                                  "reason": format!("codec {other:?}")})
            );
            return;
        }
    };
    let figs = match sc["shape"].as_str().unwrap_or("") {
        SmallRow::SHAPE => run::<SmallRow>(&sc, codec),
        LargeRow::SHAPE => run::<LargeRow>(&sc, codec),
        other => {
            println!(
                "{}",
                json!({"runner": "codec_rust", "scenario": id, "status": "unsupported",
                                  "reason": format!("not a founding shape: {other:?}")})
            );
            return;
        }
    };
    println!(
        "{}",
        json!({"runner": "codec_rust", "scenario": id, "status": "ok",
               "figures": [figure("rows_per_s", "rows/s", &figs[0], "higher"),
                           figure("encode_rows_per_s", "rows/s", &figs[1], "higher"),
                           figure("decode_rows_per_s", "rows/s", &figs[2], "higher")],
               "rss_kib": {"parent": peak_rss_kib(0), "children": null},
               "notes": format!("wirepool_codec::Codec::{codec:?} encode into a reused Vec + decode into the typed struct, one row at a time, one process (rows_per_s: both; encode/decode alone beside)")})
    );
}
