//! Socket plumbing shared by wirepool's tokio drivers (the parent in `wirepool`, the worker in
//! `wirepool-worker`); the protocol itself lives in the sans-IO `wirepool-proto`.
//!
//! The connection's socket, registered with the runtime for read readiness only.
//!
//! A Unix socket signals write space (EPOLLOUT) every time the peer reads from it. With write
//! interest registered for the socket's lifetime (what `tokio::net::UnixStream` does), each
//! message the worker reads wakes this process for nothing: one extra wake-up per message on
//! each side, measured as most of the latency above a raw blocking socketpair. Writes here are
//! plain non-blocking `sendmsg` calls; only when one would block is a duplicate descriptor
//! registered for write readiness, and dropped again once the socket is writable.

#![warn(missing_docs)]

pub mod outbox;
#[cfg(target_os = "linux")]
pub mod shm;

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd};
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Free space offered to one `recv` when the caller reserved none.
const MIN_READ: usize = 64 * 1024;

/// A connected stream socket: read readiness from the runtime, writes by plain `sendmsg`.
pub struct Socket {
    fd: AsyncFd<OwnedFd>,
}

impl Socket {
    /// Takes a connected stream socket (set non-blocking here).
    pub fn new(fd: OwnedFd) -> io::Result<Socket> {
        set_nonblocking(&fd)?;
        Ok(Socket {
            fd: register(fd, Interest::READABLE)?,
        })
    }

    /// Reads once into the spare capacity of `buf`; `Ok(0)` is end of file.
    pub fn poll_read_buf(
        &self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        if buf.capacity() == buf.len() {
            buf.reserve(MIN_READ);
        }
        let room = buf.capacity() - buf.len();
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            match guard.try_io(|fd| recv_into(fd.get_ref(), buf)) {
                Ok(Ok(n)) if n > 0 && n < room => {
                    // A short read emptied the socket: forget the readiness now instead of
                    // learning it from an EAGAIN read next time (one syscall per message).
                    // Readiness that arrived meanwhile is kept (tokio compares event ticks).
                    guard.clear_ready();
                    return Poll::Ready(Ok(n));
                }
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    /// [`poll_read_buf`](Self::poll_read_buf) with `recvmsg`: the descriptors that arrived
    /// with the bytes (`SCM_RIGHTS`, PROTOCOL.md 20.5) are appended to `fds`. A read that
    /// carried more than 8 is an `InvalidData` error holding `SHM_BAD_DESCRIPTOR`
    /// (see [`shm::protocol_error`]).
    #[cfg(target_os = "linux")]
    pub fn poll_read_buf_fds(
        &self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
        fds: &mut Vec<OwnedFd>,
    ) -> Poll<io::Result<usize>> {
        if buf.capacity() == buf.len() {
            buf.reserve(MIN_READ);
        }
        let room = buf.capacity() - buf.len();
        let had = fds.len();
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let read = guard.try_io(|fd| {
                let spare = buf.spare_capacity_mut();
                // SAFETY: the kernel writes at most `spare.len()` bytes into the spare capacity
                // and we only mark as initialised what it reports written.
                let spare: &mut [u8] = unsafe {
                    std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), spare.len())
                };
                let n = shm::recv_with_fds(std::os::fd::AsFd::as_fd(fd.get_ref()), spare, fds)?;
                // SAFETY: `n` bytes of the spare capacity were written by recvmsg.
                unsafe { buf.set_len(buf.len() + n) };
                Ok(n)
            });
            match read {
                // A short read proves the socket empty only if it took no descriptor: the kernel
                // ends a read after the message that carried them, whatever waits behind it, and
                // forgetting that readiness would leave those bytes unread until more arrive.
                Ok(Ok(n)) if n > 0 && n < room && fds.len() == had => {
                    guard.clear_ready();
                    return Poll::Ready(Ok(n));
                }
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes what the socket takes now with `descriptors` attached to this write (at most 8;
    /// PROTOCOL.md 20.5); `WouldBlock` when it takes nothing. The descriptors travel with the
    /// first byte written, even when the write is partial.
    #[cfg(target_os = "linux")]
    pub fn try_write_vectored_fds(
        &self,
        slices: &[IoSlice<'_>],
        descriptors: &[std::os::fd::BorrowedFd<'_>],
    ) -> io::Result<usize> {
        shm::send_with_fds(
            std::os::fd::AsFd::as_fd(self.fd.get_ref()),
            slices,
            descriptors,
        )
    }

    /// Registers `cx` for read readiness without reading: `Ready` when input (or end of file)
    /// waits. Like [`poll_read_buf`](Self::poll_read_buf), it replaces the waker registered by
    /// the previous poll: one reader at a time.
    pub fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.fd.poll_read_ready(cx).map_ok(|_ready_kept| ())
    }

    /// Writes what the socket takes now; `WouldBlock` when it takes nothing.
    pub fn try_write_vectored(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: msghdr is plain data; an all-zero value is valid (no name, no control).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = slices.len() as _;
        loop {
            // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the slices outlive the call.
            // MSG_NOSIGNAL: a closed peer is an error here, not a SIGPIPE for the process.
            let n = unsafe {
                libc::sendmsg(
                    self.fd.get_ref().as_raw_fd(),
                    &msg,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// [`try_write_vectored`](Self::try_write_vectored) with one slice.
    pub fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        self.try_write_vectored(&[IoSlice::new(bytes)])
    }

    /// End of file for the parent after what was written (`shutdown(SHUT_WR)`).
    pub fn shutdown_write(&self) -> io::Result<()> {
        // SAFETY: shutdown on a descriptor we own.
        if unsafe { libc::shutdown(self.fd.get_ref().as_raw_fd(), libc::SHUT_WR) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits until the socket has write space, with a write registration that lives only for
    /// this wait (see the module note).
    pub async fn writable(&self) -> io::Result<()> {
        let dup = self.fd.get_ref().try_clone()?;
        let waiter = register(dup, Interest::WRITABLE)?;
        let _ready = waiter.writable().await?;
        Ok(())
    }

    /// Waits for write space, then writes everything (e.g. the handshake).
    pub async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            match self.try_write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Polls `fd` for input without sleeping for up to `budget` (see the worker's park hook).
pub fn spin_until_readable(fd: std::os::fd::RawFd, budget: std::time::Duration) {
    let start = std::time::Instant::now();
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        if unsafe { libc::poll(&mut pfd, 1, 0) } != 0 || start.elapsed() >= budget {
            return;
        }
        std::hint::spin_loop();
    }
}

fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the `OwnedFd`, which keeps the descriptor open and the same
    // until the `AsyncFd` is dropped.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

fn recv_into(fd: &OwnedFd, buf: &mut BytesMut) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    loop {
        // SAFETY: `spare` is writable memory of `spare.len()` bytes owned by `buf`.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            let n = n as usize;
            // SAFETY: the kernel initialised the first `n` bytes of the spare capacity.
            unsafe { buf.set_len(buf.len() + n) };
            return Ok(n);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn reads_what_was_written_and_waits_for_space_when_full() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = Socket::new(a.into()).unwrap();
        let b = Socket::new(b.into()).unwrap();
        // Fill a's send buffer until the kernel refuses more.
        let chunk = vec![7u8; 64 * 1024];
        let mut sent = 0usize;
        loop {
            match a.try_write(&chunk) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(sent > 0);
        // Drain from the other side while `a` waits for write space; then it can write again.
        let reader = async {
            let mut buf = BytesMut::new();
            let mut got = 0;
            while got < sent + 1 {
                buf.clear();
                got += std::future::poll_fn(|cx| b.poll_read_buf(cx, &mut buf))
                    .await
                    .unwrap();
            }
            got
        };
        let writer = async {
            a.writable().await.unwrap();
            a.write_all(b"x").await.unwrap();
        };
        let bounded = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            tokio::join!(reader, writer).0
        });
        assert_eq!(bounded.await.unwrap(), sent + 1);
        drop(a);
        let mut buf = BytesMut::new();
        let eof = std::future::poll_fn(|cx| b.poll_read_buf(cx, &mut buf))
            .await
            .unwrap();
        assert_eq!(eof, 0);
    }
}
