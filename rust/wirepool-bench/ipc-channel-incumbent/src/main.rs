//! The ipc-channel incumbent of issue 17's row figures: a child process produces the W4 rows
//! (`bench/README.md`: small `{"i","name","kind"}`, large with a 4 KiB `blob`), batched by hand
//! `BATCH` rows per message (`Vec<Row>` through an `IpcSender`, serde + bincode, as a user of
//! ipc-channel writes it), and the parent decodes them into typed structs and checks each index.
//!
//! ```sh
//! cd rust/wirepool-bench/ipc-channel-incumbent && cargo build --release
//! target/release/ipc-channel-incumbent small 1000000 256 3   # SHAPE N BATCH REPEATS
//! ```
//!
//! Prints one line per repeat (`rows_per_s`), the peak resident sets (`rss_kib parent P child C`),
//! then `min median max`. `bench/runners/ipc_channel.py` runs it as the harness's `ipc_channel`
//! (256 rows per message) and `ipc_channel_unbatched` (one row per message) runners.

use std::fmt::Write as _;
use std::time::Instant;

use ipc_channel::ipc::{IpcOneShotServer, IpcReceiver, IpcSender};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The 4,088 `x` after the 8 digits of a large row's blob (as `wirepool_bench::LARGE_TAIL`).
const LARGE_TAIL: usize = 4088;

#[derive(Serialize, Deserialize, Debug)]
struct SmallRow {
    i: u64,
    name: String,
    kind: String,
}

#[derive(Serialize, Deserialize, Debug)]
struct LargeRow {
    i: u64,
    name: String,
    kind: String,
    blob: String,
}

trait Row: Serialize + DeserializeOwned + Send + 'static {
    fn new() -> Self;
    fn set(&mut self, i: u64);
    fn index(&self) -> u64;
}

impl Row for SmallRow {
    fn new() -> Self {
        SmallRow {
            i: 0,
            name: String::with_capacity(32),
            kind: "theorem".into(),
        }
    }
    fn set(&mut self, i: u64) {
        self.i = i;
        self.name.clear();
        let _ = write!(self.name, "decl_{i}");
    }
    fn index(&self) -> u64 {
        self.i
    }
}

impl Row for LargeRow {
    fn new() -> Self {
        LargeRow {
            i: 0,
            name: String::with_capacity(32),
            kind: "theorem".into(),
            blob: format!("{:08}{}", 0, "x".repeat(LARGE_TAIL)),
        }
    }
    fn set(&mut self, i: u64) {
        self.i = i;
        self.name.clear();
        let _ = write!(self.name, "decl_{i}");
        let digits = format!("{i:08}");
        self.blob.replace_range(..8, &digits[digits.len() - 8..]);
    }
    fn index(&self) -> u64 {
        self.i
    }
}

#[derive(Serialize, Deserialize)]
enum Msg<R> {
    /// The child's request channel: the parent sends `n` per repeat, 0 to stop.
    Hello(IpcSender<u64>),
    Rows(Vec<R>),
    End,
}

fn child<R: Row>(server: String, batch: usize) {
    let tx: IpcSender<Msg<R>> = IpcSender::connect(server).expect("connect");
    let (req_tx, req_rx): (IpcSender<u64>, IpcReceiver<u64>) = ipc_channel::ipc::channel().unwrap();
    tx.send(Msg::Hello(req_tx)).unwrap();
    while let Ok(n) = req_rx.recv() {
        if n == 0 {
            return;
        }
        // Rows are produced one at a time into the batch, like a handler yielding rows.
        let mut rows: Vec<R> = (0..batch).map(|_| R::new()).collect();
        let mut filled = 0;
        for i in 0..n {
            rows[filled].set(i);
            filled += 1;
            if filled == batch {
                tx.send(Msg::Rows(std::mem::take(&mut rows))).unwrap();
                rows = (0..batch).map(|_| R::new()).collect();
                filled = 0;
            }
        }
        if filled > 0 {
            rows.truncate(filled);
            tx.send(Msg::Rows(rows)).unwrap();
        }
        tx.send(Msg::End).unwrap();
    }
}

fn parent<R: Row>(shape: &str, n: u64, batch: usize, repeats: usize) {
    let (server, name) = IpcOneShotServer::<Msg<R>>::new().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(["--child", shape, &batch.to_string(), &name])
        .spawn()
        .unwrap();
    let (rx, hello) = server.accept().unwrap();
    let Msg::Hello(req) = hello else {
        panic!("no hello")
    };
    let mut rates = Vec::new();
    for _ in 0..repeats {
        let t = Instant::now();
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
        let rate = n as f64 / t.elapsed().as_secs_f64();
        println!("rows_per_s {rate:.0}");
        rates.push(rate);
    }
    // Peak resident sets before the child exits (the harness's W6 figures).
    let child_kib = peak_rss_kib(&format!("/proc/{}/status", child.id()));
    println!(
        "rss_kib parent {} child {}",
        peak_rss_kib("/proc/self/status"),
        child_kib
    );
    req.send(0).unwrap();
    child.wait().unwrap();
    rates.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "ipc-channel {shape} n={n} batch={batch}: min {:.0} median {:.0} max {:.0} rows/s",
        rates[0],
        rates[rates.len() / 2],
        rates[rates.len() - 1]
    );
}

/// VmHWM of a `/proc/<pid>/status` file in KiB (0 when unreadable).
fn peak_rss_kib(status: &str) -> u64 {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let batch = args[2].parse().unwrap();
        match args[1].as_str() {
            "small" => child::<SmallRow>(args[3].clone(), batch),
            _ => child::<LargeRow>(args[3].clone(), batch),
        }
        return;
    }
    let shape = args.first().map_or("small", String::as_str).to_string();
    let n = args.get(1).map_or(1_000_000, |v| v.parse().unwrap());
    let batch = args.get(2).map_or(256, |v| v.parse().unwrap());
    let repeats = args.get(3).map_or(3, |v| v.parse().unwrap());
    match shape.as_str() {
        "small" => parent::<SmallRow>(&shape, n, batch, repeats),
        "large" => parent::<LargeRow>(&shape, n, batch, repeats),
        other => panic!("shape {other}: small or large"),
    }
}
