//! Shared pieces of the wirepool benchmark runners: the row shapes of `bench/README.md` (W4), the
//! requests of the bench worker's methods, and small process helpers.
//!
//! Binaries: `wirepool-bench` (the runner of the harness contract, a Rust parent driving Rust or
//! Python workers), `wirepool-bench-worker` (the Rust worker it drives) and `slow_consumer` (the
//! issue-3 memory check: a 10 M-row stream read by a consumer that pauses).

use serde::{Deserialize, Serialize};

pub mod founding;

/// The `rows` method's request: which shape, how many rows.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct RowsReq {
    pub shape: String,
    pub n: u64,
}

/// `{"i": i, "name": "decl_<i>", "kind": "theorem"}`, as the parent decodes it (owned strings).
#[derive(Deserialize, Debug)]
pub struct SmallRow {
    pub i: u64,
    pub name: String,
    pub kind: String,
}

/// A small row plus a 4 KiB `blob`: 8 digits of `i`, then 4088 `x` (distinct in every row).
#[derive(Deserialize, Debug)]
pub struct LargeRow {
    pub i: u64,
    pub name: String,
    pub kind: String,
    pub blob: String,
}

/// The 4,088 `x` that follow the 8 digits of a large row's blob.
pub const LARGE_TAIL: usize = 4088;

/// VmHWM (peak resident set) of a process in KiB, `pid` 0 for this one.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_field_kib(pid, "VmHWM:")
}

/// VmRSS (current resident set) of a process in KiB, `pid` 0 for this one.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_field_kib(pid, "VmRSS:")
}

fn status_field_kib(pid: u32, field: &str) -> Option<u64> {
    let path = if pid == 0 {
        "/proc/self/status".to_string()
    } else {
        format!("/proc/{pid}/status")
    };
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// CPU time of the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `b"wirepool"` repeated to `size` bytes (never all zeros, so nothing can shortcut a page).
pub fn payload_bytes(size: usize) -> Vec<u8> {
    b"wirepool".iter().copied().cycle().take(size).collect()
}

/// The W7 record batch of `n` rows, the same in every runner (bench/runners/arrow_py.py
/// builds it with pyarrow): `i` int64 `0..n`, `x` float64 `i / 2`, `name` utf8 `decl_%07d`
/// (12 bytes). Its IPC stream is about 32 bytes a row.
pub fn arrow_batch(n: usize) -> arrow_array::RecordBatch {
    use arrow_array::{Float64Array, Int64Array, StringArray};
    use std::sync::Arc;
    let i = Int64Array::from_iter_values(0..n as i64);
    let x = Float64Array::from_iter_values((0..n).map(|i| i as f64 / 2.0));
    let name = StringArray::from_iter_values((0..n).map(|i| format!("decl_{i:07}")));
    // Nullable fields, as pyarrow makes them.
    arrow_array::RecordBatch::try_from_iter_with_nullable([
        ("i", Arc::new(i) as arrow_array::ArrayRef, true),
        ("x", Arc::new(x) as _, true),
        ("name", Arc::new(name) as _, true),
    ])
    .expect("a valid batch")
}

/// The scenario JSON of the runner contract: the last argument that is neither a flag nor a
/// worker language, if it is an object, else stdin.
pub fn load_scenario() -> serde_json::Value {
    let last = std::env::args()
        .skip(1)
        .rfind(|a| !a.starts_with("--") && !["rust", "python", "node", "go"].contains(&a.as_str()));
    let text = match last {
        Some(a) if a.trim_start().starts_with('{') => a,
        _ => std::io::read_to_string(std::io::stdin()).expect("scenario on stdin"),
    };
    serde_json::from_str(&text).expect("scenario JSON")
}

/// One figure of the runner contract; `better` is `higher` or `lower`.
pub fn figure(name: &str, unit: &str, values: &[f64], better: &str) -> serde_json::Value {
    serde_json::json!({"name": name, "unit": unit, "better": better, "values": values})
}
