//! The shared-memory lane's transport, measured (bench/runners/shm_lane.py runs it for W3): a
//! parent and a child process (this binary again) on a socketpair, Rust x Rust, moving payloads
//! as PROTOCOL.md section 20 does: each side owns one sealed region announced once (SHM_REGION
//! with its descriptor), a message is its first frame plus SHM_BODY, and each lent range comes
//! back with SHM_RELEASE; the lane's bookkeeping is wirepool-proto's `Lender`/`Borrower`. What it
//! is not (yet): the pool, its core and its drivers.
//!
//! The sender copies its payload into its region (it exists in its own memory first: one copy,
//! where a socket makes two); the receiver gets a zero-copy view. Echo: the child copies the view
//! into its own region and lends that back.
//!
//!     shm_lane <oneway|echo> <payload bytes> <duration_s> <min_calls> <repeats>
//!
//! Prints one JSON line: `{"mb_per_s": [...], "memcpy_mb_per_s": [...], "rss_parent_kib": N,
//! "rss_child_kib": N}`; `memcpy_mb_per_s` is the sender's copy alone (the lane's ceiling).

#[cfg(target_os = "linux")]
fn main() {
    lane::main();
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("shm_lane: Linux only");
    std::process::exit(2);
}

#[cfg(target_os = "linux")]
mod lane {
    use std::io::{IoSlice, Read, Write};
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt;
    use std::process::Command;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use wirepool_io::shm::{recv_with_fds, send_with_fds, OwnedRegion, Region};
    use wirepool_proto::shm::{Borrower, Lender, ShmFrame, ShmRange};

    const CHILD_SOCK: i32 = 3;
    const HEADER: usize = 16;
    const REQUEST: u8 = 0x10;
    const RESULT: u8 = 0x12;
    const WINDOW: u64 = 1 << 40;

    type Released = Arc<Mutex<Vec<ShmRange>>>;

    /// One side of the connection: its own region (lent to the peer) and the peer's (mapped).
    struct Side {
        sock: UnixStream,
        own: OwnedRegion,
        lender: Lender,
        own_id: u32,
        peer: Option<Region>,
        borrower: Borrower,
        released: Released,
        /// Descriptors received and not yet taken by a SHM_REGION.
        fds: Vec<OwnedFd>,
        out: Vec<u8>,
    }

    impl Side {
        fn new(sock: UnixStream, size: usize) -> Side {
            let own = OwnedRegion::create(size).expect("a region");
            let mut lender = Lender::new(WINDOW);
            let own_id = lender.announce(size as u64).unwrap();
            let mut announce = Vec::new();
            ShmFrame::Region {
                region: own_id,
                size: size as u64,
            }
            .encode(0, &mut announce);
            let n = send_with_fds(sock.as_fd(), &[IoSlice::new(&announce)], &[own.as_fd()])
                .expect("send SHM_REGION");
            (&sock).write_all(&announce[n..]).unwrap();
            Side {
                sock,
                own,
                lender,
                own_id,
                peer: None,
                borrower: Borrower::new(WINDOW),
                released: Arc::new(Mutex::new(Vec::new())),
                fds: Vec::new(),
                out: Vec::new(),
            }
        }

        /// Reads one frame (blocking); the peer's SHM_REGION is mapped here, its releases
        /// applied; returns the other frames' (type, id, payload).
        fn read_frame(&mut self) -> (u8, u64, Vec<u8>) {
            loop {
                let mut header = [0u8; HEADER];
                self.read_exact_with_fds(&mut header);
                let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
                let id = u64::from_le_bytes(header[8..].try_into().unwrap());
                let mut payload = vec![0u8; len];
                (&self.sock).read_exact(&mut payload).unwrap();
                match header[4] {
                    0x50 => {
                        let Ok(ShmFrame::Region { region, size }) =
                            ShmFrame::decode(header[4], id, &payload)
                        else {
                            panic!("bad SHM_REGION")
                        };
                        self.borrower.region(region, size).unwrap();
                        let fd = self.fds.pop().expect("its descriptor");
                        self.peer = Some(Region::map_received(fd, size).unwrap());
                    }
                    0x51 => {
                        let Ok(ShmFrame::Release(r)) = ShmFrame::decode(header[4], 0, &payload)
                        else {
                            panic!("bad SHM_RELEASE")
                        };
                        self.lender.released(r).unwrap();
                    }
                    t => return (t, id, payload),
                }
            }
        }

        /// The first read of a frame may carry descriptors (SHM_REGION's).
        fn read_exact_with_fds(&mut self, buf: &mut [u8]) {
            let mut got = 0;
            while got < buf.len() {
                wait_readable(&self.sock);
                let mut fds = Vec::new();
                let n = recv_with_fds(self.sock.as_fd(), &mut buf[got..], &mut fds).unwrap();
                assert!(n > 0, "the peer closed");
                self.borrower.descriptors_received(fds.len()).unwrap();
                self.fds.extend(fds);
                got += n;
            }
        }

        /// A message whose body is `len` bytes at the start of this side's region.
        fn send_body(&mut self, frame_type: u8, prefix: &[u8], id: u64, len: usize) {
            let range = ShmRange {
                region: self.own_id,
                offset: 0,
                length: len as u64,
            };
            self.lender.lend(range).unwrap();
            self.out
                .extend_from_slice(&(prefix.len() as u32).to_le_bytes());
            self.out.extend_from_slice(&[frame_type, 1, 0, 0]); // MORE
            self.out.extend_from_slice(&id.to_le_bytes());
            self.out.extend_from_slice(prefix);
            ShmFrame::Body(range).encode(id, &mut self.out);
            self.flush();
        }

        /// The lent view of a SHM_BODY; its release is queued when the view is dropped.
        fn take_body(&mut self, id: u64, payload: &[u8]) -> bytes::Bytes {
            let Ok(ShmFrame::Body(r)) = ShmFrame::decode(0x7E, id, payload) else {
                panic!("expected SHM_BODY")
            };
            self.borrower.body(id, r).unwrap();
            let released = self.released.clone();
            let region = self.peer.as_ref().expect("the peer's region");
            region
                .lend(r.offset, r.length, move || released.lock().unwrap().push(r))
                .unwrap()
        }

        /// Queues SHM_RELEASE for every view dropped since the last call.
        fn queue_releases(&mut self) {
            for r in self.released.lock().unwrap().drain(..) {
                self.borrower.release(r).unwrap();
                ShmFrame::Release(r).encode(0, &mut self.out);
            }
        }

        fn flush(&mut self) {
            (&self.sock).write_all(&self.out).unwrap();
            self.out.clear();
        }
    }

    fn wait_readable(sock: &UnixStream) {
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; bounded at 60 s (the harness bounds the whole run too).
        unsafe { libc::poll(&mut pfd, 1, 60_000) };
    }

    fn rss_kib(pid: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0)
    }

    pub fn main() {
        let args: Vec<String> = std::env::args().collect();
        if let Ok(spec) = std::env::var("WIREPOOL_SHM_LANE_CHILD") {
            return child(&spec);
        }
        let echo = match args.get(1).map(String::as_str) {
            Some("oneway") => false,
            Some("echo") => true,
            _ => {
                eprintln!(
                    "usage: shm_lane <oneway|echo> <payload> <duration_s> <min_calls> <repeats>"
                );
                std::process::exit(2);
            }
        };
        let payload: usize = args[2].parse().unwrap();
        let duration = Duration::from_secs_f64(args[3].parse().unwrap());
        let min_calls: u64 = args[4].parse().unwrap();
        let repeats: usize = args[5].parse().unwrap();

        let (mine, theirs) = UnixStream::pair().unwrap();
        let theirs_fd = theirs.as_raw_fd();
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.env(
            "WIREPOOL_SHM_LANE_CHILD",
            format!("{} {payload}", if echo { "echo" } else { "oneway" }),
        );
        // SAFETY: dup2 is async-signal-safe; the new fd 3 is inherited.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(theirs_fd, CHILD_SOCK) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn the child");
        drop(theirs);

        let source: Vec<u8> = (0..payload).map(|i| (i % 251) as u8).collect();
        let mut side = Side::new(mine, payload);
        let mut values = Vec::new();
        let mut id = 0u64;
        let mut call = |side: &mut Side| {
            id += 1;
            side.own.as_mut_slice()[..payload].copy_from_slice(&source);
            side.queue_releases();
            let prefix = [0u8; 12]; // method 0, codec 0 (raw), no deadline
            side.send_body(REQUEST, &prefix, id, payload);
            let (t, rid, body) = side.read_frame();
            assert_eq!((t, rid), (RESULT, id));
            if echo {
                assert_eq!(body.len(), 0, "a MORE first frame with no body byte");
                let (t, _, r) = side.read_frame();
                assert_eq!(t, 0x7E);
                let view = side.take_body(id, &r);
                assert_eq!(view.len(), payload);
                assert_eq!(view[payload / 2], source[payload / 2]);
            } else {
                assert_eq!(body, (payload as u32).to_le_bytes());
            }
        };
        call(&mut side); // warm up: pages faulted, the child's region mapped
        for _ in 0..repeats {
            let start = Instant::now();
            let mut calls = 0u64;
            while calls < min_calls || start.elapsed() < duration {
                call(&mut side);
                calls += 1;
            }
            let secs = start.elapsed().as_secs_f64();
            let dirs = if echo { 2.0 } else { 1.0 };
            values.push(payload as f64 * calls as f64 * dirs / secs / 1e6);
        }
        // The ceiling of the sender's one copy: the same copy alone, in this process.
        let mut memcpy = Vec::new();
        for _ in 0..repeats {
            let start = Instant::now();
            let mut copies = 0u64;
            while copies < min_calls || start.elapsed() < duration {
                side.own.as_mut_slice()[..payload].copy_from_slice(&source);
                std::hint::black_box(side.own.as_slice());
                copies += 1;
            }
            memcpy.push(payload as f64 * copies as f64 / start.elapsed().as_secs_f64() / 1e6);
        }
        let child_rss = rss_kib(&child.id().to_string());
        drop(side);
        let _ = child.wait();
        println!(
            "{{\"mb_per_s\": {values:?}, \"memcpy_mb_per_s\": {memcpy:?}, \"rss_parent_kib\": {}, \"rss_child_kib\": {child_rss}}}",
            rss_kib("self")
        );
    }

    fn child(spec: &str) {
        let mut parts = spec.split(' ');
        let echo = parts.next() == Some("echo");
        let payload: usize = parts.next().unwrap().parse().unwrap();
        // The parent put our socket on fd 3, or on the one WIREPOOL_SHM_LANE_FD names (a parent
        // in another language: bench/runners/shm_lane_py.py).
        let fd = std::env::var("WIREPOOL_SHM_LANE_FD")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CHILD_SOCK);
        // SAFETY: the parent gave us this descriptor, and nothing else here owns it.
        let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut side = Side::new(sock, payload);
        loop {
            // End of file: the parent is done.
            wait_readable(&side.sock);
            let mut probe = 0u8;
            // SAFETY: a one-byte peek into a local.
            let n = unsafe {
                libc::recv(
                    side.sock.as_raw_fd(),
                    (&mut probe as *mut u8).cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if n == 0 {
                return;
            }
            let (t, id, prefix) = side.read_frame();
            assert_eq!(t, REQUEST);
            assert_eq!(prefix.len(), 12);
            let (t, _, r) = side.read_frame();
            assert_eq!(t, 0x7E);
            let view = side.take_body(id, &r);
            if echo {
                side.own.as_mut_slice()[..payload].copy_from_slice(&view);
                drop(view);
                side.queue_releases();
                side.send_body(RESULT, &[], id, payload);
            } else {
                let len = view.len() as u32;
                drop(view);
                side.queue_releases();
                side.out.extend_from_slice(&4u32.to_le_bytes());
                side.out.extend_from_slice(&[RESULT, 0, 0, 0]);
                side.out.extend_from_slice(&id.to_le_bytes());
                side.out.extend_from_slice(&len.to_le_bytes());
                side.flush();
            }
        }
    }
}
