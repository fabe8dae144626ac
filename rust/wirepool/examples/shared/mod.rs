//! What the examples share: each example binary is also its own worker. Started by the pool
//! (with `WIREPOOL_FD` set) it serves the methods below; started by you, it runs the parent.
//! So `cargo run --example NAME` needs nothing else built.

#![allow(dead_code)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use wirepool::WorkerCommand;
use wirepool_worker::{BlockingRowSink, Codec, Context, HandlerError, Worker};

/// One row of the `decls` stream.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub struct Decl {
    pub i: u64,
    pub name: String,
    pub kind: String,
}

static SESSION: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// If this process was started by a pool, serve as a worker and exit; otherwise return.
pub fn serve_if_worker() {
    if std::env::var_os("WIREPOOL_FD").is_none() {
        return;
    }
    let serde_codecs = [Codec::Json, Codec::MsgPack];
    let result = Worker::new("wirepool-example")
        .unary("add", |(a, b): (i64, i64), _: &Context| Ok(a + b))
        .codecs(&serde_codecs)
        .unary("remember", |item: String, _: &Context| {
            let mut s = SESSION.lock().unwrap();
            s.push(item);
            Ok(s.len())
        })
        .unary("recall", |_: (), _: &Context| {
            Ok(SESSION.lock().unwrap().clone())
        })
        .unary("pid", |_: (), _: &Context| Ok(std::process::id()))
        .unary("sleep_ms", |ms: u64, ctx: &Context| {
            let end = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < end {
                if ctx.is_cancelled() {
                    eprintln!("sleep_ms: cancelled, stopping early");
                    return Err(HandlerError::new("cancelled"));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(ms)
        })
        .unary("crash", |_: (), _: &Context| -> Result<(), HandlerError> {
            eprintln!("crash: exiting with status 42 on purpose");
            std::process::exit(42)
        })
        .stream_blocking(
            "decls",
            |n: u64, ctx: &Context, rows: &BlockingRowSink<Decl>| {
                for i in 0..n {
                    if i % 1024 == 0 && ctx.is_cancelled() {
                        break;
                    }
                    rows.send(Decl {
                        i,
                        name: format!("decl_{i}"),
                        kind: "theorem".into(),
                    })?;
                }
                Ok(Some(n))
            },
        )
        .codecs(&serde_codecs)
        .max_concurrency(256)
        .run();
    std::process::exit(if result.is_ok() { 0 } else { 1 });
}

/// The command that starts this same binary as a worker.
pub fn this_binary() -> WorkerCommand {
    WorkerCommand::new(std::env::current_exe().expect("own path"))
}
