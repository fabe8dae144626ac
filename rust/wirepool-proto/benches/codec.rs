//! Micro benchmarks of the hot paths, each printed beside a baseline.
//!
//! - ROWS decode: a 1 MiB frame of 97-byte rows, decoded and every row touched (target: at
//!   least 50 M rows/s). Measured without the copy into the receive buffer (which the socket
//!   read does anyway) and, separately, with it.
//! - 1 MiB RESULT decode against a 1 MiB memcpy (target: well under one memcpy).
//! - ROWS encode through `RowsBuilder`.
//!
//! `cargo bench -p wirepool-proto --bench codec` runs criterion, then prints a summary with
//! min / median / max of 31 samples and the ratios.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BatchSize, Criterion, Throughput};
use wirepool_proto::{encode_message, FrameBody, FrameDecoder, MessageHead, RowsBuilder};

const ROW_LEN: usize = 97;
const MIB: usize = 1 << 20;

fn row(i: usize) -> [u8; ROW_LEN] {
    let mut r = [b'x'; ROW_LEN];
    r[..8].copy_from_slice(&(i as u64).to_le_bytes());
    r
}

/// One ROWS frame of 97-byte rows, as full as a 1 MiB frame allows.
fn rows_frame() -> (Vec<u8>, usize) {
    let mut wire = Vec::with_capacity(MIB + 16);
    let mut builder = RowsBuilder::new(&mut wire, 1, MIB as u32);
    let mut i = 0;
    while builder.append(&row(i)).unwrap() {
        i += 1;
    }
    let written = builder.finish().unwrap();
    (wire, written.count as usize)
}

fn result_frame() -> Vec<u8> {
    let mut wire = Vec::with_capacity(MIB + 16);
    encode_message(
        &mut wire,
        1,
        MessageHead::Result,
        &vec![0xab; MIB],
        MIB as u32,
    )
    .unwrap();
    wire
}

fn loaded_decoder(wire: &[u8]) -> FrameDecoder {
    let mut dec = FrameDecoder::new(MIB as u32);
    dec.read_buffer().extend_from_slice(wire);
    dec
}

/// Decode the next frame and touch every row (first byte and length): the consumer's minimum.
#[inline]
fn decode_rows(dec: &mut FrameDecoder) -> u64 {
    let frame = dec.next_frame().unwrap().unwrap();
    let FrameBody::Rows(rows) = frame.body else {
        unreachable!()
    };
    let mut acc = 0u64;
    for r in rows.iter() {
        acc = acc
            .wrapping_add(u64::from(r[0]))
            .wrapping_add(r.len() as u64);
    }
    acc
}

fn decode_result(dec: &mut FrameDecoder) -> usize {
    let frame = dec.next_frame().unwrap().unwrap();
    let FrameBody::Result { body } = frame.body else {
        unreachable!()
    };
    // Touch both ends so the decode cannot be elided.
    usize::from(body[0]) + usize::from(body[body.len() - 1]) + body.len()
}

fn encode_rows(out: &mut Vec<u8>, rows: &[[u8; ROW_LEN]]) -> usize {
    out.clear();
    let mut builder = RowsBuilder::new(out, 1, MIB as u32);
    for r in rows {
        if !builder.append(r).unwrap() {
            break;
        }
    }
    builder.finish().unwrap().count as usize
}

fn criterion_benches(c: &mut Criterion) {
    let (rows_wire, row_count) = rows_frame();
    let result_wire = result_frame();
    let src = vec![0xabu8; MIB];
    let rows: Vec<[u8; ROW_LEN]> = (0..row_count).map(row).collect();

    let mut g = c.benchmark_group("rows_97B");
    g.throughput(Throughput::Elements(row_count as u64));
    g.bench_function("decode_and_touch", |b| {
        b.iter_batched(
            || loaded_decoder(&rows_wire),
            |mut dec| decode_rows(&mut dec),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("copy_in_decode_and_touch", |b| {
        let mut dec = FrameDecoder::new(MIB as u32);
        b.iter(|| {
            dec.receive(&rows_wire);
            decode_rows(&mut dec)
        })
    });
    g.bench_function("encode_rows_builder", |b| {
        let mut out = Vec::with_capacity(MIB + 16);
        b.iter(|| encode_rows(&mut out, &rows))
    });
    g.finish();

    let mut g = c.benchmark_group("payload_1MiB");
    g.throughput(Throughput::Bytes(MIB as u64));
    g.bench_function("decode_result", |b| {
        b.iter_batched(
            || loaded_decoder(&result_wire),
            |mut dec| decode_result(&mut dec),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("memcpy_baseline", |b| {
        let mut dst = vec![0u8; MIB];
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(dst[MIB - 1])
        })
    });
    g.finish();
}

/// Nanoseconds per call over `samples` samples of `iters` calls each; `setup` runs untimed.
fn sample<S, F: FnMut(&mut S) -> u64>(
    samples: usize,
    iters: usize,
    mut setup: impl FnMut() -> S,
    mut f: F,
) -> Vec<f64> {
    let mut out: Vec<f64> = (0..samples)
        .map(|_| {
            let mut states: Vec<S> = (0..iters).map(|_| setup()).collect();
            let start = Instant::now();
            for s in &mut states {
                black_box(f(s));
            }
            start.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

fn stats(ns: &[f64]) -> (f64, f64, f64) {
    (ns[0], ns[ns.len() / 2], ns[ns.len() - 1])
}

fn summary() {
    let (rows_wire, row_count) = rows_frame();
    let result_wire = result_frame();
    let src = vec![0xabu8; MIB];
    let rows: Vec<[u8; ROW_LEN]> = (0..row_count).map(row).collect();
    const SAMPLES: usize = 31;

    println!(
        "\n== wirepool-proto codec summary ({SAMPLES} samples each; shared, noisy machine) =="
    );
    println!(
        "ROWS frame: {row_count} rows of {ROW_LEN} bytes, {} bytes on the wire",
        rows_wire.len()
    );

    let decode = sample(SAMPLES, 8, || loaded_decoder(&rows_wire), decode_rows);
    // One decoder reused, as a connection does: its buffer is recycled once frames are dropped.
    let mut reused = FrameDecoder::new(MIB as u32);
    let copy_decode = sample(
        SAMPLES,
        8,
        || (),
        |_| {
            reused.receive(&rows_wire);
            decode_rows(&mut reused)
        },
    );
    let mut out = Vec::with_capacity(MIB + 16);
    let encode = sample(SAMPLES, 8, || (), |_| encode_rows(&mut out, &rows) as u64);
    for (name, ns) in [
        ("rows decode + touch", &decode),
        ("rows copy-in + decode + touch", &copy_decode),
        ("rows encode (RowsBuilder)", &encode),
    ] {
        let (lo, med, hi) = stats(ns);
        let mrows = |t: f64| row_count as f64 / t * 1e3;
        println!(
            "{name:32} M rows/s  min {:7.1}  median {:7.1}  max {:7.1}   (ns/frame median {med:.0})",
            mrows(hi),
            mrows(med),
            mrows(lo)
        );
    }

    let dec1 = sample(
        SAMPLES,
        8,
        || loaded_decoder(&result_wire),
        |dec| decode_result(dec) as u64,
    );
    let mut dst = vec![0u8; MIB];
    let memcpy = sample(
        SAMPLES,
        8,
        || (),
        |_| {
            dst.copy_from_slice(black_box(&src));
            u64::from(dst[MIB - 1])
        },
    );
    let (d_lo, d_med, d_hi) = stats(&dec1);
    let (m_lo, m_med, m_hi) = stats(&memcpy);
    println!(
        "1 MiB RESULT decode                ns  min {d_lo:9.0}  median {d_med:9.0}  max {d_hi:9.0}"
    );
    println!(
        "1 MiB memcpy (baseline)            ns  min {m_lo:9.0}  median {m_med:9.0}  max {m_hi:9.0}"
    );
    println!("ratio decode / memcpy (medians): {:.4}", d_med / m_med);
}

fn main() {
    // WIREPOOL_BENCH_SUMMARY_ONLY=1 skips criterion and prints only the summary.
    if std::env::var_os("WIREPOOL_BENCH_SUMMARY_ONLY").is_none() {
        let mut c = Criterion::default().configure_from_args();
        criterion_benches(&mut c);
        c.final_summary();
    }
    // `cargo test --all-targets` runs this binary without `--bench`: criterion then only checks
    // each benchmark runs once, and the timed summary is skipped.
    if std::env::args().any(|a| a == "--bench") {
        summary();
    }
}
