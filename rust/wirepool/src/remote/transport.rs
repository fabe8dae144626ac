//! The connection beneath the parent's worker driver: a plain stream socket (the inherited
//! socketpair, or TCP to a loopback worker without TLS) or TLS over TCP for a remote worker
//! (PROTOCOL.md 21). The driver is the same for all: it reads into the core's buffer and writes
//! the outbox's slices; only this enum knows which one it has.

use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use std::task::{Context, Poll};

use bytes::BytesMut;
use wirepool_io::Socket;

pub(crate) enum Transport {
    /// A stream socket and its descriptor number.
    Socket(Socket, RawFd),
    #[cfg(feature = "remote")]
    Tls(Box<super::tls::TlsSocket>),
}

impl Transport {
    /// A connected stream socket (set non-blocking here).
    pub(crate) fn socket(fd: std::os::fd::OwnedFd) -> io::Result<Transport> {
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        Ok(Transport::Socket(Socket::new(fd)?, raw))
    }

    /// Reads once into the spare capacity of `buf`; `Ok(0)` is end of file.
    #[inline]
    pub(crate) fn poll_read_buf(
        &self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        match self {
            Transport::Socket(s, _) => s.poll_read_buf(cx, buf),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.poll_read_buf(cx, buf),
        }
    }

    /// The shared-memory lane's read (`recvmsg` with descriptors): a socketpair only, as the
    /// lane is never accepted on a remote connection (21.1).
    #[cfg(target_os = "linux")]
    #[inline]
    pub(crate) fn poll_read_buf_fds(
        &self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
        fds: &mut Vec<std::os::fd::OwnedFd>,
    ) -> Poll<io::Result<usize>> {
        match self {
            Transport::Socket(s, _) => s.poll_read_buf_fds(cx, buf, fds),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.poll_read_buf(cx, buf),
        }
    }

    /// Registers `cx` for read readiness without reading: `Ready` when input (or end of file)
    /// waits.
    #[inline]
    pub(crate) fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Transport::Socket(s, _) => s.poll_readable(cx),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.poll_readable(cx),
        }
    }

    /// Writes what the connection takes now; `WouldBlock` when it takes nothing.
    #[inline]
    pub(crate) fn try_write_vectored(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Transport::Socket(s, _) => s.try_write_vectored(slices),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.try_write_vectored(slices),
        }
    }

    /// [`try_write_vectored`](Self::try_write_vectored) with one slice.
    #[inline]
    pub(crate) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Socket(s, _) => s.try_write(bytes),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.try_write_vectored(&[IoSlice::new(bytes)]),
        }
    }

    /// Writes with descriptors attached (the shared-memory lane: a socketpair only).
    #[cfg(target_os = "linux")]
    pub(crate) fn try_write_vectored_fds(
        &self,
        slices: &[IoSlice<'_>],
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> io::Result<usize> {
        match self {
            Transport::Socket(s, _) => s.try_write_vectored_fds(slices, fds),
            #[cfg(feature = "remote")]
            Transport::Tls(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "descriptors cannot travel over TCP",
            )),
        }
    }

    /// Whether bytes accepted by a write still wait to reach the socket (TLS records the
    /// socket did not take): the writer sends them before it sleeps.
    #[inline]
    pub(crate) fn has_pending_output(&self) -> bool {
        match self {
            Transport::Socket(..) => false,
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.has_pending_output(),
        }
    }

    /// Sends what [`has_pending_output`](Self::has_pending_output) reports; `WouldBlock` when
    /// the socket fills first.
    pub(crate) fn flush_pending(&self) -> io::Result<()> {
        match self {
            Transport::Socket(..) => Ok(()),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.flush_pending(),
        }
    }

    /// Waits until the socket has write space.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        match self {
            Transport::Socket(s, _) => s.writable().await,
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.writable().await,
        }
    }

    /// Writes all of `bytes` and what waits behind them (the handshake's frames).
    pub(crate) async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        loop {
            if bytes.is_empty() && !self.has_pending_output() {
                return Ok(());
            }
            let wrote = if bytes.is_empty() {
                self.flush_pending().map(|()| 0)
            } else {
                self.try_write(bytes)
            };
            match wrote {
                Ok(0) if !bytes.is_empty() => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Ends the connection both ways now (a remote worker the pool lets go, or kills: the
    /// parent cannot signal its process, PROTOCOL.md 21.6). The reader then meets end of file;
    /// the descriptor itself is closed when the last handle goes.
    pub(crate) fn shut_down(&self) {
        let fd = match self {
            Transport::Socket(_, fd) => *fd,
            #[cfg(feature = "remote")]
            Transport::Tls(t) => {
                t.close_notify();
                t.raw_fd()
            }
        };
        // SAFETY: shutdown on the descriptor this transport owns, open while `self` lives.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
    }

    /// Asks the transport to call `wake` when a read leaves output for the writer (TLS).
    pub(crate) fn set_output_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        match self {
            Transport::Socket(..) => drop(wake),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.set_output_waker(wake),
        }
    }
}
