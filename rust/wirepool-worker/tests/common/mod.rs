//! A fake parent: spawns the `echo_worker` example on a socketpair and speaks the protocol with
//! the proto crate's stateless decoder and encoders, so tests can also send what a real parent
//! never would. Every read has a timeout; the child is killed on drop.

#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wirepool_proto::{encode_message, Frame, FrameBody, FrameDecoder, Hello, MessageHead, Welcome};

/// Upper bound for any single wait in these tests; far above what a healthy run needs.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);

pub fn worker_binary() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // `cargo test --tests` does not build examples: build it (a no-op when up to date) so
        // the tests never run a stale worker. Same profile as this test binary.
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args([
            "build",
            "-q",
            "-p",
            "wirepool-worker",
            "--example",
            "echo_worker",
        ]);
        if !cfg!(debug_assertions) {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("run cargo build");
        assert!(status.success(), "building the echo_worker example failed");
        // target/<profile>/deps/<test>-<hash> -> target/<profile>/examples/echo_worker
        let exe = std::env::current_exe().expect("test binary path");
        exe.parent()
            .and_then(|deps| deps.parent())
            .expect("target dir")
            .join("examples/echo_worker")
    })
    .clone()
}

pub struct Parent {
    pub sock: UnixStream,
    pub child: Child,
    pub hello: Hello,
    pub welcome: Welcome,
    decoder: FrameDecoder,
    next_id: u64,
}

pub struct Options {
    pub initial_credit: u32,
    pub max_in_flight: u32,
    pub max_frame_size: u32,
    pub worker_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            initial_credit: 1 << 20,
            max_in_flight: 64,
            max_frame_size: 1 << 20,
            worker_args: Vec::new(),
        }
    }
}

impl Parent {
    pub fn start() -> Parent {
        Parent::start_with(Options::default())
    }

    pub fn start_with(opts: Options) -> Parent {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        // std creates both ends close-on-exec; the child's end must survive exec.
        let fd = theirs.as_raw_fd();
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
        }
        let child = Command::new(worker_binary())
            .args(&opts.worker_args)
            .env("WIREPOOL_FD", fd.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("WIREPOOL_TEST_STDERR").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("spawn echo_worker");
        drop(theirs);
        ours.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut parent = Parent {
            sock: ours,
            child,
            hello: Hello::new("x", ""),
            welcome: Welcome::for_hello(&Hello::new("x", ""), 0).unwrap(),
            decoder: FrameDecoder::new(wirepool_proto::HANDSHAKE_MAX_FRAME_SIZE),
            next_id: 0,
        };
        let hello = match parent.next_frame().body {
            FrameBody::Hello(h) => *h,
            other => panic!("expected HELLO, got {other:?}"),
        };
        let welcome = Welcome {
            max_frame_size: opts.max_frame_size,
            initial_credit: opts.initial_credit,
            heartbeat_ms: 0,
            max_in_flight: opts.max_in_flight,
            ..Welcome::for_hello(&hello, 1).unwrap()
        };
        parent.send(&Frame::new(0, FrameBody::Welcome(welcome)));
        parent.decoder.set_max_frame_size(welcome.max_frame_size);
        parent.hello = hello;
        parent.welcome = welcome;
        parent
    }

    pub fn method(&self, name: &str) -> u16 {
        self.hello
            .method_index(name)
            .unwrap_or_else(|| panic!("worker has no method {name}"))
    }

    pub fn send(&mut self, frame: &Frame) {
        let mut out = Vec::new();
        frame.encode(&mut out).expect("encode");
        self.send_bytes(&out);
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("write to worker");
    }

    /// Send a REQUEST (split into CONTINUATIONs if large) and return its id.
    pub fn request(&mut self, method: &str, codec: u8, timeout_us: u64, body: &[u8]) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.request_with_id(id, self.method(method), codec, timeout_us, body);
        id
    }

    pub fn request_with_id(
        &mut self,
        id: u64,
        method: u16,
        codec: u8,
        timeout_us: u64,
        body: &[u8],
    ) {
        self.next_id = self.next_id.max(id);
        let mut out = Vec::new();
        encode_message(
            &mut out,
            id,
            MessageHead::Request {
                method,
                codec,
                timeout_us,
            },
            body,
            self.welcome.max_frame_size,
        )
        .expect("encode request");
        self.send_bytes(&out);
    }

    /// The next frame from the worker; panics after [`STEP_TIMEOUT`].
    pub fn next_frame(&mut self) -> Frame {
        self.try_next_frame()
            .expect("the worker closed the connection")
    }

    /// The next frame, or `None` at end of file.
    pub fn try_next_frame(&mut self) -> Option<Frame> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("worker sent a bad frame") {
                return Some(frame);
            }
            assert!(
                Instant::now() < deadline,
                "no frame from the worker within {STEP_TIMEOUT:?}"
            );
            let mut buf = [0u8; 65536];
            match self.sock.read(&mut buf) {
                Ok(0) => {
                    self.decoder
                        .end_of_input()
                        .expect("worker closed mid-frame");
                    return None;
                }
                Ok(n) => self.decoder.receive(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => panic!("read from worker: {e}"),
            }
        }
    }

    /// Frames until (and including) the terminal of `id`, reassembling continued messages.
    /// Frames of other requests are returned too, in order.
    pub fn collect_until_terminal(&mut self, id: u64) -> Vec<Frame> {
        let mut frames = Vec::new();
        let mut partial: Option<(Frame, Vec<u8>)> = None;
        loop {
            let frame = self.next_frame();
            if frame.id == id {
                if let Some((first, mut body)) = partial.take() {
                    let FrameBody::Continuation { chunk } = &frame.body else {
                        panic!("expected CONTINUATION, got {frame:?}")
                    };
                    body.extend_from_slice(chunk);
                    if frame.more {
                        partial = Some((first, body));
                        continue;
                    }
                    let mut whole = first;
                    whole.more = false;
                    match &mut whole.body {
                        FrameBody::Result { body: b } | FrameBody::End { summary: b, .. } => {
                            *b = Bytes::from(body)
                        }
                        _ => unreachable!(),
                    }
                    frames.push(whole);
                    return frames;
                }
                if frame.more {
                    let body = match &frame.body {
                        FrameBody::Result { body } | FrameBody::End { summary: body, .. } => {
                            body.to_vec()
                        }
                        other => panic!("MORE on {other:?}"),
                    };
                    partial = Some((frame, body));
                    continue;
                }
                let terminal = matches!(
                    frame.body,
                    FrameBody::Result { .. } | FrameBody::End { .. } | FrameBody::Error { .. }
                );
                frames.push(frame);
                if terminal {
                    return frames;
                }
            } else {
                frames.push(frame);
            }
        }
    }

    /// The terminal frames of `ids`, in the order of `ids`, whatever order they arrive in
    /// (ROWS and EVENTs are skipped).
    pub fn terminals(&mut self, ids: &[u64]) -> Vec<Frame> {
        let mut found: Vec<Option<Frame>> = vec![None; ids.len()];
        while found.iter().any(Option::is_none) {
            let frame = self.next_frame();
            if !matches!(
                frame.body,
                FrameBody::Result { .. } | FrameBody::End { .. } | FrameBody::Error { .. }
            ) {
                continue;
            }
            assert!(
                !frame.more,
                "use collect_until_terminal for continued terminals"
            );
            let slot = ids
                .iter()
                .position(|&id| id == frame.id)
                .unwrap_or_else(|| panic!("unexpected terminal {frame:?}"));
            assert!(found[slot].is_none(), "second terminal for id {}", frame.id);
            found[slot] = Some(frame);
        }
        found.into_iter().map(Option::unwrap).collect()
    }

    /// The terminal frame of `id` (skipping ROWS/EVENTs and frames of other ids).
    pub fn terminal(&mut self, id: u64) -> Frame {
        self.collect_until_terminal(id).pop().unwrap()
    }

    /// Wait for the child to exit (bounded), returning its status.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for worker") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker did not exit within {STEP_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Parent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn error_code(frame: &Frame) -> u32 {
    match &frame.body {
        FrameBody::Error { code, .. } => *code,
        other => panic!("expected ERROR, got {other:?}"),
    }
}

pub fn result_body(frame: &Frame) -> Bytes {
    match &frame.body {
        FrameBody::Result { body } => body.clone(),
        other => panic!("expected RESULT, got {other:?}"),
    }
}
