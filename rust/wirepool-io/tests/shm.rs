//! Fault tests of the shared-memory primitives (PROTOCOL.md section 20): no descriptor or mapping
//! leaks over many cycles, hostile descriptors refused with a typed error (never SIGBUS), and a
//! peer SIGKILLed while it holds or owns a region leaves this process's descriptors and mappings
//! flat. Counts are of this crate's memory files only (`/memfd:wirepool-shm` in `/proc`), so
//! nothing else the process does can move them.
//!
//! Its own `main` (harness = false): the tests run one after another, and the binary re-runs
//! itself as the child of the kill tests (`WIREPOOL_SHM_CHILD`).

#[cfg(target_os = "linux")]
fn main() {
    linux::main();
}

#[cfg(not(target_os = "linux"))]
fn main() {}

#[cfg(target_os = "linux")]
mod linux {
    use std::io::{IoSlice, Read, Write};
    use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use wirepool_io::shm::{protocol_error, recv_with_fds, send_with_fds, OwnedRegion, Region};
    use wirepool_proto::{ErrorCode, ProtocolError};

    const NAME: &str = "/memfd:wirepool-shm";
    const CHILD_SOCK: i32 = 3;
    const TIMEOUT: Duration = Duration::from_secs(20);

    pub fn main() {
        if let Ok(role) = std::env::var("WIREPOOL_SHM_CHILD") {
            return child(&role);
        }
        let tests: [(&str, fn()); 7] = [
            (
                "a_read_that_took_descriptors_keeps_readiness",
                a_read_that_took_descriptors_keeps_readiness,
            ),
            (
                "cycles_leave_no_descriptor_or_mapping",
                cycles_leave_no_descriptor_or_mapping,
            ),
            (
                "hostile_descriptors_are_refused",
                hostile_descriptors_are_refused,
            ),
            (
                "too_many_descriptors_are_closed",
                too_many_descriptors_are_closed,
            ),
            (
                "receiver_killed_while_holding",
                receiver_killed_while_holding,
            ),
            ("owner_killed_while_lent", owner_killed_while_lent),
            ("kill_cycles_stay_flat", kill_cycles_stay_flat),
        ];
        for (name, test) in tests {
            test();
            println!("test {name} ... ok");
        }
    }

    /// This process's descriptors and mappings of wirepool memory files.
    fn counts(pid: &str) -> (usize, usize) {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with(NAME))
            .count();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .filter(|l| l.contains(NAME))
            .count();
        (fds, maps)
    }

    fn own_counts() -> (usize, usize) {
        counts("self")
    }

    /// Waits (bounded) until `sock` has input: `recv_with_fds` never blocks.
    fn wait_readable(sock: &UnixStream) {
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, TIMEOUT.as_millis() as i32) };
        assert_eq!(n, 1, "no input within {TIMEOUT:?}");
    }

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(TIMEOUT)).unwrap();
        }
        (a, b)
    }

    /// Sends `fds` with one byte and receives them on the other end.
    fn pass(
        from: &UnixStream,
        to: &UnixStream,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Vec<OwnedFd> {
        assert_eq!(
            send_with_fds(from.as_fd(), &[IoSlice::new(b"r")], fds).unwrap(),
            1
        );
        let mut got = Vec::new();
        let mut buf = [0u8; 16];
        assert_eq!(recv_with_fds(to.as_fd(), &mut buf, &mut got).unwrap(), 1);
        got
    }

    fn cycles_leave_no_descriptor_or_mapping() {
        let base = own_counts();
        let (a, b) = pair();
        let released = Arc::new(AtomicUsize::new(0));
        for cycle in 0..300u64 {
            let size = 4096 * (1 + cycle as usize % 16);
            let mut owned = OwnedRegion::create(size).unwrap();
            owned.as_mut_slice()[size - 8..].copy_from_slice(&cycle.to_le_bytes());
            let fd = pass(&a, &b, &[owned.as_fd()]).pop().unwrap();
            let region = Region::map_received(fd, size as u64).unwrap();
            if cycle == 0 {
                // The counts see what they count: the owner's descriptor and both mappings.
                assert_eq!(own_counts(), (base.0 + 1, base.1 + 2));
            }
            let r = released.clone();
            let view = region
                .lend(size as u64 - 8, 8, move || {
                    r.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            let slice = view.slice(0..4);
            let clone = view.clone();
            // Drop in an order that varies: the region first, or the owner first.
            if cycle % 2 == 0 {
                drop(region);
                drop(owned);
            } else {
                drop(owned);
                drop(region);
            }
            drop(view);
            assert_eq!(
                released.load(Ordering::SeqCst),
                cycle as usize,
                "released early"
            );
            assert_eq!(u64::from_le_bytes(clone[..].try_into().unwrap()), cycle);
            drop(clone);
            assert_eq!(&slice[..], &cycle.to_le_bytes()[..4]);
            drop(slice);
            assert_eq!(
                released.load(Ordering::SeqCst),
                cycle as usize + 1,
                "not released once"
            );
        }
        assert_eq!(own_counts(), base, "descriptors or mappings leaked");
    }

    fn raw_memfd(flags: libc::c_uint, size: i64, seals: i32) -> OwnedFd {
        // SAFETY: plain syscalls on a descriptor this test owns.
        unsafe {
            let fd = libc::memfd_create(c"wirepool-shm".as_ptr(), flags);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, size), 0);
            if seals != 0 {
                assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, seals), 0);
            }
            OwnedFd::from_raw_fd(fd)
        }
    }

    fn refused(fd: OwnedFd, size: u64) -> ProtocolError {
        match Region::map_received(fd, size) {
            Ok(_) => panic!("a hostile descriptor was mapped"),
            Err(e) => e,
        }
    }

    /// The kernel ends a `recvmsg` after the message that carried descriptors even when more
    /// bytes wait: that short read must not clear the socket's readiness, or the bytes behind it
    /// (a SHM_BODY after its SHM_REGION) stay unread until the peer writes again (a hostile
    /// worker's bounds violation went unnoticed for 30 s).
    fn a_read_that_took_descriptors_keeps_readiness() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            let (a, b) = pair();
            b.set_nonblocking(true).unwrap();
            let sock = wirepool_io::Socket::new(b.into()).unwrap();
            let owned = OwnedRegion::create(4096).unwrap();
            // Both messages wait before the first read.
            send_with_fds(a.as_fd(), &[IoSlice::new(b"region")], &[owned.as_fd()]).unwrap();
            send_with_fds(a.as_fd(), &[IoSlice::new(b"body")], &[]).unwrap();
            let mut buf = bytes::BytesMut::with_capacity(1024);
            let mut fds = Vec::new();
            let n = std::future::poll_fn(|cx| sock.poll_read_buf_fds(cx, &mut buf, &mut fds))
                .await
                .unwrap();
            assert_eq!(
                (n, fds.len()),
                (6, 1),
                "the read ends with the descriptors' message"
            );
            // The rest is read at once, not when the peer next writes (it never does here).
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            let rest = sock.poll_read_buf_fds(&mut cx, &mut buf, &mut fds);
            assert!(
                matches!(rest, std::task::Poll::Ready(Ok(4))),
                "the bytes behind the descriptors' message: {rest:?}"
            );
            assert_eq!(&buf[..], b"regionbody");
        });
    }

    fn hostile_descriptors_are_refused() {
        let base = own_counts();
        let sealable = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        let both = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        let bad = ErrorCode::ShmBadDescriptor;
        // Unsealed: its owner could truncate it under the mapping (SIGBUS on the next read).
        let e = refused(raw_memfd(sealable, 4096, 0), 4096);
        assert_eq!(e.code, bad);
        assert!(e.message.contains("not sealed"), "{e}");
        // Half sealed.
        assert_eq!(
            refused(raw_memfd(sealable, 4096, libc::F_SEAL_SHRINK), 4096).code,
            bad
        );
        assert_eq!(
            refused(raw_memfd(sealable, 4096, libc::F_SEAL_GROW), 4096).code,
            bad
        );
        // Sealing not allowed at all (its seals are F_SEAL_SEAL only).
        assert_eq!(
            refused(raw_memfd(libc::MFD_CLOEXEC, 4096, 0), 4096).code,
            bad
        );
        // Sealed, but smaller or larger than its SHM_REGION says.
        let e = refused(raw_memfd(sealable, 4096, both), 8192);
        assert_eq!(e.code, bad);
        assert!(e.message.contains("4096 bytes"), "{e}");
        assert_eq!(refused(raw_memfd(sealable, 8192, both), 4096).code, bad);
        // Not a memory file: a pipe, a socket.
        let mut p = [0i32; 2];
        // SAFETY: pipe fills two new descriptors.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both are new and owned here.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        assert_eq!(refused(r, 4096).code, bad);
        drop(w);
        let (s, _t) = UnixStream::pair().unwrap();
        assert_eq!(refused(s.into(), 4096).code, bad);
        // A size of 0 is the announcement's fault.
        let e = refused(raw_memfd(sealable, 4096, both), 0);
        assert_eq!(e.code, ErrorCode::ShmBadRegion);
        // Every refused descriptor was closed.
        assert_eq!(own_counts(), base);
        // And a properly sealed one is taken.
        let ok = Region::map_received(raw_memfd(sealable, 4096, both), 4096).unwrap();
        assert_eq!(ok.view(0, 4096).unwrap()[..], [0u8; 4096][..]);
    }

    fn too_many_descriptors_are_closed() {
        let base = own_counts();
        let (a, b) = pair();
        let files: Vec<OwnedFd> = (0..12)
            .map(|_| raw_memfd(libc::MFD_CLOEXEC, 4096, 0))
            .collect();
        // send_with_fds refuses more than 8; a hostile peer sends 12 in one sendmsg.
        let borrowed: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
        assert!(send_with_fds(a.as_fd(), &[IoSlice::new(b"x")], &borrowed).is_err());
        raw_send_fds(&a, &files);
        drop(files);
        let mut got = Vec::new();
        let mut buf = [0u8; 4];
        let e = recv_with_fds(b.as_fd(), &mut buf, &mut got).unwrap_err();
        let shm = protocol_error(&e).expect("a typed error");
        assert_eq!(shm.code, ErrorCode::ShmBadDescriptor);
        assert!(got.is_empty());
        assert_eq!(own_counts(), base, "the truncated descriptors leaked");
    }

    fn raw_send_fds(sock: &UnixStream, fds: &[OwnedFd]) {
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let payload = std::mem::size_of_val(&raw[..]) as u32;
        let mut control = vec![0u64; 32];
        let mut iov = libc::iovec {
            iov_base: b"x".as_ptr() as *mut _,
            iov_len: 1,
        };
        // SAFETY: a well-formed msghdr with one SCM_RIGHTS message in an aligned buffer.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(payload) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                payload as usize,
            );
            assert_eq!(libc::sendmsg(sock.as_raw_fd(), &msg, 0), 1);
        }
    }

    /// A child process running this binary as `role`, its socket on fd 3; killed on drop.
    struct Peer {
        child: Child,
        sock: UnixStream,
    }

    impl Peer {
        fn spawn(role: &str) -> Peer {
            let (sock, theirs) = pair();
            let theirs_fd = theirs.as_raw_fd();
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.env("WIREPOOL_SHM_CHILD", role);
            // SAFETY: dup2 is async-signal-safe; the new fd 3 is not close-on-exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(theirs_fd, CHILD_SOCK) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = cmd.spawn().unwrap();
            drop(theirs);
            Peer { child, sock }
        }

        fn pid(&self) -> String {
            self.child.id().to_string()
        }

        fn kill(&mut self) {
            self.child.kill().unwrap();
            let status = self.child.wait().unwrap();
            assert!(!status.success());
        }
    }

    impl Drop for Peer {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn child(role: &str) {
        // SAFETY: the parent put our socket on fd 3.
        let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(CHILD_SOCK) });
        let mut buf = [0u8; 16];
        match role {
            "holder" => {
                let mut fds = Vec::new();
                wait_readable(&sock);
                recv_with_fds(sock.as_fd(), &mut buf, &mut fds).unwrap();
                let fd = fds.pop().expect("a region's descriptor");
                let region = Region::map_received(fd, 1 << 20).unwrap();
                let view = region.view(0, 1 << 20).unwrap();
                assert_eq!(view[12345], 7);
                (&sock).write_all(b"m").unwrap();
                let _ = (&sock).read(&mut buf); // until killed (or the parent's end closes)
                drop(view);
            }
            "owner" => {
                let mut owned = OwnedRegion::create(1 << 20).unwrap();
                owned.as_mut_slice().fill(9);
                send_with_fds(sock.as_fd(), &[IoSlice::new(b"o")], &[owned.as_fd()]).unwrap();
                let _ = (&sock).read(&mut buf);
                drop(owned);
            }
            _ => panic!("unknown role {role}"),
        }
    }

    fn receiver_killed_while_holding() {
        let base = own_counts();
        let mut owned = OwnedRegion::create(1 << 20).unwrap();
        owned.as_mut_slice().fill(7);
        let mut peer = Peer::spawn("holder");
        send_with_fds(peer.sock.as_fd(), &[IoSlice::new(b"r")], &[owned.as_fd()]).unwrap();
        let mut ready = [0u8; 1];
        (&peer.sock).read_exact(&mut ready).unwrap();
        // The child maps it (its descriptor was closed once mapped).
        assert_eq!(counts(&peer.pid()), (0, 1));
        peer.kill();
        // The owner's region is still whole and writable; then it goes, and nothing is left.
        owned.as_mut_slice()[0] = 1;
        assert_eq!(own_counts(), (base.0 + 1, base.1 + 1));
        drop(owned);
        assert_eq!(own_counts(), base);
    }

    fn owner_killed_while_lent() {
        let base = own_counts();
        let mut peer = Peer::spawn("owner");
        let mut fds = Vec::new();
        let mut buf = [0u8; 4];
        wait_readable(&peer.sock);
        let n = recv_with_fds(peer.sock.as_fd(), &mut buf, &mut fds).unwrap();
        assert_eq!((n, fds.len()), (1, 1));
        let region = Region::map_received(fds.pop().unwrap(), 1 << 20).unwrap();
        let view = region.lend(4096, 65536, || {}).unwrap();
        drop(region);
        peer.kill();
        // The dead owner's pages outlive it, and nothing can shrink them: no SIGBUS.
        assert!(view.iter().all(|&b| b == 9));
        assert_eq!(own_counts(), (base.0, base.1 + 1));
        drop(view);
        assert_eq!(own_counts(), base);
    }

    fn kill_cycles_stay_flat() {
        let base = own_counts();
        for cycle in 0..20 {
            let role = if cycle % 2 == 0 { "holder" } else { "owner" };
            let mut peer = Peer::spawn(role);
            let mut kept = None;
            if role == "holder" {
                let mut owned = OwnedRegion::create(1 << 20).unwrap();
                owned.as_mut_slice().fill(7);
                send_with_fds(peer.sock.as_fd(), &[IoSlice::new(b"r")], &[owned.as_fd()]).unwrap();
                let mut ready = [0u8; 1];
                (&peer.sock).read_exact(&mut ready).unwrap();
                kept = Some(owned);
            } else {
                let mut fds = Vec::new();
                let mut buf = [0u8; 4];
                wait_readable(&peer.sock);
                recv_with_fds(peer.sock.as_fd(), &mut buf, &mut fds).unwrap();
                let region = Region::map_received(fds.pop().unwrap(), 1 << 20).unwrap();
                let view = region.view(0, 1 << 20).unwrap();
                peer.kill();
                assert_eq!(view[1 << 19], 9);
            }
            drop(peer);
            drop(kept);
            assert_eq!(own_counts(), base, "cycle {cycle}");
        }
    }
}
