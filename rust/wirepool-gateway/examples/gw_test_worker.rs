//! The gateway tests' worker: echo in every codec, an application error, a cooperative sleep
//! that counts the cancellations it saw, and streams.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use bytes::Bytes;
use wirepool_worker::{BlockingRowSink, Codec, Context, HandlerError, Worker};

/// Requests that ended because the worker saw their CANCEL.
static CANCELS: AtomicU64 = AtomicU64::new(0);
/// `sleep` handlers started: a test disconnects once the handler runs (a CANCEL that arrives
/// earlier ends the request before any handler could count it).
static SLEEPS: AtomicU64 = AtomicU64::new(0);

fn main() -> std::io::Result<()> {
    Worker::new("gateway-test-worker")
        .unary("echo", |v: serde_json::Value, _: &Context| Ok(v))
        .codecs(&[Codec::Json, Codec::MsgPack, Codec::Cbor])
        .unary("echo_raw", |b: Bytes, _: &Context| Ok(b))
        .codecs(&[Codec::Raw])
        .unary(
            "fail",
            |_: serde_json::Value, _: &Context| -> Result<(), HandlerError> {
                Err(HandlerError::new("the handler refused").with_code(1001))
            },
        )
        // Sleeps `ms`, returning early (and counting it) when cancelled.
        .unary("sleep", |ms: u64, ctx: &Context| {
            SLEEPS.fetch_add(1, SeqCst);
            let end = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < end {
                if ctx.is_cancelled() {
                    CANCELS.fetch_add(1, SeqCst);
                    return Err(HandlerError::new("cancelled").with_code(1002));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(ms)
        })
        .unary("cancels", |_: serde_json::Value, _: &Context| {
            Ok(CANCELS.load(SeqCst))
        })
        .unary("sleeps", |_: serde_json::Value, _: &Context| {
            Ok(SLEEPS.load(SeqCst))
        })
        // `n` rows {"i": i}, then the summary n (none for n = 0: an empty END summary).
        .stream_blocking(
            "count",
            |n: u64, _: &Context, rows: &BlockingRowSink<serde_json::Value>| {
                for i in 0..n {
                    rows.send(serde_json::json!({ "i": i }))?;
                }
                Ok((n > 0).then_some(n))
            },
        )
        .codecs(&[Codec::Json, Codec::MsgPack, Codec::Cbor])
        // Rows of `size` bytes until cancelled (counted), at most 10 M.
        .stream_blocking(
            "forever",
            |size: usize, ctx: &Context, rows: &BlockingRowSink<String>| {
                let row = "x".repeat(size);
                for _ in 0..10_000_000u64 {
                    if ctx.is_cancelled() {
                        CANCELS.fetch_add(1, SeqCst);
                        break;
                    }
                    if rows.send(row.clone()).is_err() {
                        CANCELS.fetch_add(1, SeqCst);
                        break;
                    }
                }
                Ok::<_, HandlerError>(None::<u64>)
            },
        )
        .run()
}
