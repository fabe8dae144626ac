//! Quick throughput check of the worker side alone: spawns `echo_worker` (build it first, same
//! profile) and plays a minimal parent that only decodes frames, counts rows and grants credit.
//! Not the end-to-end benchmark (that lives in `bench/` and uses the real parent).
//!
//! ```text
//! cargo build --release --examples -p wirepool-worker
//! target/release/examples/worker_throughput [json|raw|unary|big]
//! MAX_FRAME=16777216 target/release/examples/worker_throughput big   # no continuation
//! ```

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Instant;

use wirepool_proto::{encode_message, Frame, FrameBody, FrameDecoder, Hello, MessageHead, Welcome};

struct Parent {
    sock: UnixStream,
    decoder: FrameDecoder,
    hello: Hello,
    buf: Vec<u8>,
    next_id: u64,
}

impl Parent {
    fn next_frame(&mut self) -> Frame {
        loop {
            if let Some(f) = self.decoder.next_frame().expect("bad frame") {
                return f;
            }
            let rb = self.decoder.read_buffer();
            let n = {
                let spare = rb.spare_capacity_mut();
                // SAFETY: read() only writes into the spare capacity; we then commit n bytes.
                let slice = unsafe {
                    std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), spare.len())
                };
                self.sock.read(slice).expect("read")
            };
            assert!(n > 0, "worker closed the socket");
            // SAFETY: n bytes were just written into the spare capacity.
            unsafe { rb.set_len(rb.len() + n) };
        }
    }

    fn request(&mut self, method: &str, codec: u8, body: &[u8], out: &mut Vec<u8>) -> u64 {
        self.next_id += 1;
        let m = self.hello.method_index(method).unwrap();
        encode_message(
            out,
            self.next_id,
            MessageHead::Request {
                method: m,
                codec,
                timeout_us: 0,
            },
            body,
            self.decoder.max_frame_size(),
        )
        .unwrap();
        self.next_id
    }

    fn flush(&mut self, out: &mut Vec<u8>) {
        self.sock.write_all(out).unwrap();
        out.clear();
    }
}

fn start(initial_credit: u32) -> (Parent, std::process::Child) {
    let exe = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("echo_worker");
    let (ours, theirs) = UnixStream::pair().unwrap();
    let fd = theirs.as_raw_fd();
    // SAFETY: plain fcntl on a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    let child = Command::new(exe)
        .args(["--max-concurrency", "256"])
        .env("WIREPOOL_FD", fd.to_string())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn echo_worker");
    drop(theirs);
    let mut p = Parent {
        sock: ours,
        decoder: FrameDecoder::new(65_536),
        hello: Hello::new("x", ""),
        buf: Vec::new(),
        next_id: 0,
    };
    let FrameBody::Hello(hello) = p.next_frame().body else {
        panic!("no HELLO")
    };
    let max_frame_size = std::env::var("MAX_FRAME")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(wirepool_proto::DEFAULT_MAX_FRAME_SIZE);
    let welcome = Welcome {
        initial_credit,
        heartbeat_ms: 0,
        max_frame_size,
        ..Welcome::for_hello(&hello, 1).unwrap()
    };
    let mut out = Vec::new();
    Frame::new(0, FrameBody::Welcome(welcome))
        .encode(&mut out)
        .unwrap();
    p.sock.write_all(&out).unwrap();
    p.decoder.set_max_frame_size(welcome.max_frame_size);
    p.hello = *hello;
    let _ = &p.buf;
    (p, child)
}

/// Stream `n` rows and count them, granting credit back as the rows are read (half-window rule).
fn stream_rows(p: &mut Parent, method: &str, codec: u8, body: &[u8], credit: u32) -> (u64, f64) {
    let mut out = Vec::new();
    let id = p.request(method, codec, body, &mut out);
    p.flush(&mut out);
    let t = Instant::now();
    let (mut rows, mut consumed) = (0u64, 0u64);
    loop {
        let f = p.next_frame();
        match f.body {
            FrameBody::Rows(r) => {
                // Touch every row as a consumer would (length only; decoding is the parent's cost).
                std::hint::black_box(r.iter().map(<[u8]>::len).sum::<usize>());
                rows += u64::from(r.count());
                consumed += r.payload().len() as u64;
                if let Some(grant) = wirepool_proto::grant_due(credit, consumed) {
                    Frame::new(id, FrameBody::Credit { bytes: grant })
                        .encode(&mut out)
                        .unwrap();
                    p.flush(&mut out);
                    consumed -= u64::from(grant);
                }
            }
            FrameBody::End { row_count, .. } => {
                assert_eq!(row_count, rows);
                return (rows, t.elapsed().as_secs_f64());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn unary_echo(p: &mut Parent, method: &str, size: usize, calls: u64, window: u64) -> f64 {
    let body = vec![7u8; size];
    let mut out = Vec::new();
    let t = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < calls {
        // Top the window up with one write, like a pipelining parent would.
        while sent < calls && sent - done < window {
            p.request(method, 0, &body, &mut out);
            sent += 1;
        }
        p.flush(&mut out);
        // Take every frame of the next read before writing again.
        let mut f = Some(p.next_frame());
        while let Some(frame) = f {
            match frame.body {
                FrameBody::Result { .. } | FrameBody::Continuation { .. } => {
                    if !frame.more {
                        done += 1;
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
            f = p.decoder.next_frame().expect("bad frame");
        }
    }
    t.elapsed().as_secs_f64()
}

/// Drain the worker, wait for it, and return the CPU seconds (user + system) it used: on a
/// shared machine the worker's CPU per operation is steadier than wall-clock rates.
fn finish(mut p: Parent, child: std::process::Child) -> f64 {
    let mut out = Vec::new();
    Frame::new(0, FrameBody::Drain { grace_ms: 0 })
        .encode(&mut out)
        .unwrap();
    p.flush(&mut out);
    while !matches!(p.next_frame().body, FrameBody::Goodbye { .. }) {}
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn report(what: &str, ops: u64, unit: &str, wall: f64, cpu: f64) {
    println!(
        "{what:<44} {:>8.2} M {unit}/s wall   {:>8.1} ns of worker CPU per {unit} ({:.2} M {unit}/s per worker CPU second)",
        ops as f64 / wall / 1e6,
        cpu * 1e9 / ops as f64,
        ops as f64 / cpu / 1e6
    );
}

fn main() {
    let only = std::env::args().nth(1).unwrap_or_default();
    let credit = 4 << 20;
    let want = |name: &str| only.is_empty() || only == name;
    if want("json") {
        for method in ["decls", "decls_blocking"] {
            let (mut p, child) = start(credit);
            let n = 2_000_000u64;
            let (rows, wall) = stream_rows(
                &mut p,
                method,
                1,
                format!("{{\"n\":{n}}}").as_bytes(),
                credit,
            );
            report(
                &format!("{method} JSON rows"),
                rows,
                "rows",
                wall,
                finish(p, child),
            );
        }
    }
    if want("raw") {
        let (mut p, child) = start(credit);
        let n = 10_000_000u64;
        let (rows, wall) = stream_rows(&mut p, "raw_rows", 0, format!("{n} 16").as_bytes(), credit);
        report(
            "raw_rows 16-byte rows",
            rows,
            "rows",
            wall,
            finish(p, child),
        );
    }
    if want("unary") {
        for method in ["echo", "echo_async"] {
            let (mut p, child) = start(credit);
            let calls = 500_000;
            let wall = unary_echo(&mut p, method, 64, calls, 256);
            report(
                &format!("unary {method} 64 B raw, 256 in flight"),
                calls,
                "calls",
                wall,
                finish(p, child),
            );
        }
    }
    if want("big") {
        let (mut p, child) = start(credit);
        let calls = 2_000;
        let wall = unary_echo(&mut p, "echo", 1 << 20, calls, 4);
        let cpu = finish(p, child);
        println!(
            "unary echo 1 MiB raw, 4 in flight           {:>8.0} MiB/s each way wall   {:>8.1} us of worker CPU per MiB",
            calls as f64 / wall,
            cpu * 1e6 / calls as f64
        );
    }
}
