//! The Rust worker of the wirepool benchmark runners (started by a wirepool parent with
//! `WIREPOOL_FD`). Its methods are the scenarios of `bench/README.md`:
//!
//! | method | kind | codec | request -> answer |
//! |---|---|---|---|
//! | `echo` | unary (async, served on the I/O thread) | raw | bytes -> the same bytes (no copy) |
//! | `oneway` | unary (async) | raw | bytes -> their length, 8 bytes little-endian |
//! | `rows` | stream | json, msgpack, cbor | `{"shape": "small_rows"\|"large_rows", "n": N}` -> rows `0..N`, in the request's codec |
//! | `raw_rows` | stream | raw | `"N"` -> N rows whose bytes are the small row's JSON text; `"N large"`: the large row's (4,096-byte blob) |
//! | `spin` | unary (async) | json | `us` -> burns `us` of this thread's CPU time, returns `us` |
//! | `arrow_batch` | unary (blocking) | raw | `"<rows>"` or `"<rows> zc"` -> the W7 Arrow IPC stream of that many rows (`wirepool_bench::arrow_batch`); `zc`: written into `Context::body_buf` (no copy into the lane) |
//! | `mark` | unary (async) | raw | empty -> empty, calling `getpgrp()`: a phase boundary of the instruction-count gate (`bench/harness/icount.py`) |
//!
//! `spin` computes on the I/O thread on purpose: a worker then runs one task at a time on one
//! core, like every baseline's child (the floor's forked child, a Python process under its GIL),
//! while the next request already waits in its socket. A blocking handler would let one worker
//! use both cores of this machine and make the W5 efficiency figures incomparable.

use std::fmt::Write as _;

use bytes::Bytes;
use serde::Serialize;
use serde_bytes::ByteBuf;
use wirepool_bench::{thread_cpu_ns, RowsReq, LARGE_TAIL};
use wirepool_worker::{Codec, Context, HandlerError, RowSink, Worker};

#[derive(Serialize)]
struct Row {
    i: u64,
    name: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    blob: Option<String>,
}

async fn rows(req: RowsReq, sink: RowSink<Row>) -> Result<(), HandlerError> {
    let large = match req.shape.as_str() {
        "small_rows" => false,
        "large_rows" => true,
        other => return Err(HandlerError::new(format!("unknown shape {other:?}"))),
    };
    // One row rewritten in place per index: no allocation per row.
    let mut row = Row {
        i: 0,
        name: String::with_capacity(32),
        kind: "theorem",
        blob: large.then(|| format!("{:08}{}", 0, "x".repeat(LARGE_TAIL))),
    };
    let mut digits = String::with_capacity(16);
    for i in 0..req.n {
        row.i = i;
        row.name.clear();
        let _ = write!(row.name, "decl_{i}");
        if let Some(blob) = row.blob.as_mut() {
            digits.clear();
            let _ = write!(digits, "{i:08}");
            blob.replace_range(..8, &digits[digits.len() - 8..]);
        }
        sink.send_ref(&row).await?;
    }
    Ok(())
}

async fn raw_rows(req: Bytes, rows: RowSink<ByteBuf>) -> Result<(), HandlerError> {
    let text = std::str::from_utf8(&req)?;
    let mut words = text.split_whitespace();
    let n: u64 = words.next().unwrap_or("0").parse()?;
    if words.next() == Some("large") {
        return raw_large_rows(n, rows).await;
    }
    // Formatted by hand like the floor's child (fixed pieces copied to fixed places, the digits
    // byte by byte), then handed over as one buffer: the figure is about moving rows.
    const HEAD: &[u8; 5] = b"{\"i\":";
    const NAME: &[u8; 14] = b",\"name\":\"decl_";
    const TAIL: &[u8; 19] = b"\",\"kind\":\"theorem\"}";
    let mut row = ByteBuf::with_capacity(64);
    let mut digits = itoa::Buffer::new();
    let mut text = [0u8; 64];
    for i in 0..n {
        let i = digits.format(i).as_bytes();
        let d = i.len();
        text[..5].copy_from_slice(HEAD);
        for (k, &b) in i.iter().enumerate() {
            text[5 + k] = b;
            text[5 + d + 14 + k] = b;
        }
        text[5 + d..5 + d + 14].copy_from_slice(NAME);
        text[5 + 2 * d + 14..5 + 2 * d + 33].copy_from_slice(TAIL);
        row.clear();
        row.extend_from_slice(&text[..2 * d + 38]);
        rows.send_ref(&row).await?;
    }
    Ok(())
}

/// The large row's JSON text per row, built like `raw_rows`' small one: the fixed pieces and
/// the blob's 4,088 `x` copied, the digits written in place.
async fn raw_large_rows(n: u64, rows: RowSink<ByteBuf>) -> Result<(), HandlerError> {
    const HEAD: &[u8] = b"{\"i\":";
    const NAME: &[u8] = b",\"name\":\"decl_";
    const MID: &[u8] = b"\",\"kind\":\"theorem\",\"blob\":\"";
    let tail: Vec<u8> = std::iter::repeat_n(b'x', LARGE_TAIL)
        .chain(*b"\"}")
        .collect();
    let mut row = ByteBuf::with_capacity(LARGE_TAIL + 128);
    let mut digits = itoa::Buffer::new();
    for i in 0..n {
        let i_text = digits.format(i).as_bytes();
        row.clear();
        row.extend_from_slice(HEAD);
        row.extend_from_slice(i_text);
        row.extend_from_slice(NAME);
        row.extend_from_slice(i_text);
        row.extend_from_slice(MID);
        // The blob's first 8 bytes: i's last 8 digits, zero-padded (as the serde rows).
        let pad = 8usize.saturating_sub(i_text.len());
        row.extend_from_slice(&b"00000000"[..pad]);
        row.extend_from_slice(&i_text[i_text.len() - (8 - pad)..]);
        row.extend_from_slice(&tail);
        rows.send_ref(&row).await?;
    }
    Ok(())
}

/// The W7 batches built so far, by row count.
static BATCHES: std::sync::Mutex<Vec<(usize, arrow_array::RecordBatch)>> =
    std::sync::Mutex::new(Vec::new());

fn arrow_result(req: &[u8], ctx: &Context) -> Result<Bytes, HandlerError> {
    let text = std::str::from_utf8(req)?;
    let mut words = text.split_whitespace();
    let n: usize = words.next().unwrap_or("0").parse()?;
    let zero_copy = words.next() == Some("zc");
    let batch = {
        let mut cache = BATCHES.lock().unwrap();
        match cache.iter().find(|(k, _)| *k == n) {
            Some((_, b)) => b.clone(),
            None => {
                let b = wirepool_bench::arrow_batch(n);
                cache.push((n, b.clone()));
                b
            }
        }
    };
    let batches = [batch];
    if zero_copy {
        let mut body = ctx.body_buf(wirepool_codec::arrow::encoded_len_hint(&batches));
        wirepool_codec::arrow::encode_batches(&batches, &mut body)?;
        return Ok(body.freeze());
    }
    let mut body = Vec::new();
    wirepool_codec::arrow::encode_batches(&batches, &mut body)?;
    Ok(Bytes::from(body))
}

fn main() -> std::io::Result<()> {
    Worker::new("wirepool-bench-worker")
        .unary_async("echo", |body: Bytes, _ctx: Context| async move { Ok(body) })
        .codecs(&[Codec::Raw])
        .unary_async("oneway", |body: Bytes, _ctx: Context| async move {
            Ok(Bytes::copy_from_slice(&(body.len() as u64).to_le_bytes()))
        })
        .codecs(&[Codec::Raw])
        .stream("rows", |req: RowsReq, _ctx: Context, sink: RowSink<Row>| {
            rows(req, sink)
        })
        .codecs(&[Codec::Json, Codec::MsgPack, Codec::Cbor])
        .stream(
            "raw_rows",
            |req: Bytes, _ctx: Context, sink: RowSink<ByteBuf>| raw_rows(req, sink),
        )
        .codecs(&[Codec::Raw])
        .unary_async("spin", |us: u64, _ctx: Context| async move {
            let end = thread_cpu_ns() + us * 1000;
            let mut turns = 0u64;
            while thread_cpu_ns() < end {
                turns = std::hint::black_box(turns + 1);
            }
            Ok(us)
        })
        .codecs(&[Codec::Json])
        // W7: the Arrow batch of `"<rows>"` rows (built once per size), its IPC stream written
        // into `Context::body_buf` (in the region the parent maps when the lane is on: no copy
        // after arrow-rs's own encoding) with `"<rows> zc"`, into a heap buffer otherwise.
        .unary("arrow_batch", |req: Bytes, ctx: &Context| {
            arrow_result(&req, ctx)
        })
        .codecs(&[Codec::Raw])
        .unary_async("mark", |_: Bytes, _ctx: Context| async move {
            // SAFETY: getpgrp takes nothing and cannot fail.
            std::hint::black_box(unsafe { libc::getpgrp() });
            Ok(Bytes::new())
        })
        .codecs(&[Codec::Raw])
        .max_concurrency(256)
        .run()
}
