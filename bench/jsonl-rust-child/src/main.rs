//! Child of the JSON-lines baseline: one JSON object per line on stdin, one per line on stdout,
//! decoded into typed structs and encoded back with serde_json, as a Rust tool would.

use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, BufWriter, Write};

#[derive(Deserialize)]
struct Request {
    op: String,
    #[serde(default)]
    id: u64,
    #[serde(default)]
    p: Option<String>,
    #[serde(default)]
    shape: Option<String>,
    #[serde(default)]
    n: u64,
    #[serde(default)]
    us: u64,
}

#[derive(Serialize)]
struct Echo<'a> {
    op: &'a str,
    id: u64,
    p: &'a str,
}

#[derive(Serialize)]
struct Length {
    id: u64,
    n: usize,
}

#[derive(Serialize)]
struct Done {
    id: u64,
}

#[derive(Serialize)]
struct SmallRow<'a> {
    i: u64,
    name: &'a str,
    kind: &'a str,
}

#[derive(Serialize)]
struct LargeRow<'a> {
    i: u64,
    name: &'a str,
    kind: &'a str,
    blob: &'a str,
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Burns `us` of this thread's CPU time, like the other runners' tasks.
fn spin_cpu(us: u64) -> u64 {
    let end = thread_cpu_ns() + us * 1000;
    let mut spins = 0u64;
    while thread_cpu_ns() < end {
        spins += 1;
    }
    spins
}

fn main() -> io::Result<()> {
    let stdin = io::stdin().lock();
    let mut out = BufWriter::with_capacity(1 << 16, io::stdout().lock());
    let tail = "x".repeat(4088);
    let mut name = String::new();
    let mut blob = String::with_capacity(4096);
    for line in stdin.lines() {
        let req: Request = serde_json::from_str(&line?).map_err(io::Error::other)?;
        match req.op.as_str() {
            "echo" => {
                let p = req.p.unwrap_or_default();
                serde_json::to_writer(&mut out, &Echo { op: "echo", id: req.id, p: &p })?;
            }
            "oneway" => {
                let n = req.p.map_or(0, |p| p.len());
                serde_json::to_writer(&mut out, &Length { id: req.id, n })?;
            }
            "rows" => {
                let large = req.shape.as_deref() == Some("large_rows");
                for i in 0..req.n {
                    name.clear();
                    name.push_str("decl_");
                    name.push_str(&i.to_string());
                    if large {
                        blob.clear();
                        blob.push_str(&format!("{i:08}"));
                        blob.push_str(&tail);
                        let row = LargeRow { i, name: &name, kind: "theorem", blob: &blob };
                        serde_json::to_writer(&mut out, &row)?;
                    } else {
                        let row = SmallRow { i, name: &name, kind: "theorem" };
                        serde_json::to_writer(&mut out, &row)?;
                    }
                    out.write_all(b"\n")?;
                }
                out.write_all(b"{\"end\":true}")?;
            }
            "spin" => {
                spin_cpu(req.us);
                serde_json::to_writer(&mut out, &Done { id: req.id })?;
            }
            "exit" => return out.flush(),
            other => return Err(io::Error::other(format!("unknown op {other}"))),
        }
        out.write_all(b"\n")?;
        out.flush()?;
    }
    out.flush()
}
