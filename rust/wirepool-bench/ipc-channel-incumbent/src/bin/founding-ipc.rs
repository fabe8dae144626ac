//! The ipc-channel incumbent on the founding rows: a child process produces the rows one at a
//! time, sent through an `IpcSender` (serde + bincode) `BATCH` rows per message (`Vec<Row>`,
//! batched by hand as a user of ipc-channel writes a stream; `BATCH` 1 is one row per message);
//! the parent decodes each message into typed structs and checks every index.
//!
//! ```sh
//! founding-ipc SHAPE N BATCH REPEATS [WINDOW_S]    # small_rows_8192 | large_rows_512
//! ```
//! A repeat is as many whole streams of N rows as fit in WINDOW_S seconds (default 0.25).
//! ```text
//! ```
//! Prints `rows_per_s R` per repeat and `rss_kib parent P child C` (read by
//! `bench/runners/ipc_channel.py`).

use std::time::Instant;

// The founding rows and their generator: wirepool-bench's module, compiled in (this crate stays
// out of the workspace, so it does not depend on wirepool-bench).
#[path = "../../../src/founding.rs"]
#[allow(dead_code)]
mod founding;

use founding::{FoundingRow, LargeRow, SmallRow};
use ipc_channel::ipc::{IpcOneShotServer, IpcReceiver, IpcSender};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
enum Msg<R> {
    /// The child's request channel: the parent sends `n` per repeat, 0 to stop.
    Hello(IpcSender<u64>),
    Rows(Vec<R>),
    End,
}

fn child<R: FoundingRow>(server: String, batch: usize) {
    let tx: IpcSender<Msg<R>> = IpcSender::connect(server).expect("connect");
    let (req_tx, req_rx): (IpcSender<u64>, IpcReceiver<u64>) = ipc_channel::ipc::channel().unwrap();
    tx.send(Msg::Hello(req_tx)).unwrap();
    let gen = R::gen();
    while let Ok(n) = req_rx.recv() {
        if n == 0 {
            return;
        }
        // One row made at a time, like a handler yielding rows; sent every `batch` rows.
        let mut rows: Vec<R> = Vec::with_capacity(batch);
        for i in 0..n {
            rows.push(R::make(&gen, i));
            if rows.len() == batch {
                tx.send(Msg::Rows(std::mem::replace(
                    &mut rows,
                    Vec::with_capacity(batch),
                )))
                .unwrap();
            }
        }
        if !rows.is_empty() {
            tx.send(Msg::Rows(rows)).unwrap();
        }
        tx.send(Msg::End).unwrap();
    }
}

fn parent<R: FoundingRow>(n: u64, batch: usize, repeats: usize, window: f64) {
    let (server, name) = IpcOneShotServer::<Msg<R>>::new().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(["--child", R::SHAPE, &batch.to_string(), &name])
        .spawn()
        .unwrap();
    let (rx, hello) = server.accept().unwrap();
    let Msg::Hello(req) = hello else {
        panic!("no hello")
    };
    let read = |n: u64| {
        req.send(n).unwrap();
        let mut count = 0u64;
        loop {
            match rx.recv().unwrap() {
                Msg::Rows(rows) => {
                    for row in rows {
                        assert_eq!(row.index(), count, "row index");
                        count += 1;
                    }
                }
                Msg::End => break,
                Msg::Hello(_) => panic!("second hello"),
            }
        }
        assert_eq!(count, n);
    };
    read(n.min(256));
    for _ in 0..repeats {
        let t = Instant::now();
        let mut rows = 0u64;
        while rows == 0 || t.elapsed().as_secs_f64() < window {
            read(n);
            rows += n;
        }
        println!("rows_per_s {:.0}", rows as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "rss_kib parent {} child {}",
        peak_rss_kib(0).unwrap_or(0),
        peak_rss_kib(child.id()).unwrap_or(0)
    );
    req.send(0).unwrap();
    child.wait().unwrap();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let batch = args[2].parse().unwrap();
        match args[1].as_str() {
            SmallRow::SHAPE => child::<SmallRow>(args[3].clone(), batch),
            _ => child::<LargeRow>(args[3].clone(), batch),
        }
        return;
    }
    let n = args.get(1).map_or(8192, |v| v.parse().unwrap());
    let batch = args.get(2).map_or(256, |v| v.parse().unwrap());
    let repeats = args.get(3).map_or(3, |v| v.parse().unwrap());
    let window = args.get(4).map_or(0.25, |v| v.parse().unwrap());
    match args.first().map(String::as_str) {
        Some(SmallRow::SHAPE) => parent::<SmallRow>(n, batch, repeats, window),
        Some(LargeRow::SHAPE) => parent::<LargeRow>(n, batch, repeats, window),
        other => panic!("shape {other:?}: small_rows_8192 or large_rows_512"),
    }
}

/// VmHWM (peak resident set) of a process in KiB, `pid` 0 for this one.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let path = if pid == 0 {
        "/proc/self/status".to_string()
    } else {
        format!("/proc/{pid}/status")
    };
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}
