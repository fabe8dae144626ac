//! The connection beneath the driver: a plain stream socket (the inherited socketpair, or TCP
//! to a loopback parent without TLS) or TLS over TCP for a remote worker (PROTOCOL.md 21). The
//! driver is the same for all: it reads into the core's buffer and writes the outbox's slices.

use std::io::{self, IoSlice};
use std::task::{Context, Poll};

use bytes::BytesMut;
use wirepool_io::Socket;

pub(crate) enum Transport {
    /// The socket and its descriptor number.
    Socket(Socket, std::os::fd::RawFd),
    #[cfg(feature = "remote")]
    Tls(Box<crate::tls::TlsSocket>),
}

impl Transport {
    /// A connected stream socket (set non-blocking here).
    pub(crate) fn socket(fd: std::os::fd::OwnedFd) -> io::Result<Transport> {
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        Ok(Transport::Socket(Socket::new(fd)?, raw))
    }

    /// Reads once into the spare capacity of `buf`; `Ok(0)` is end of file.
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

    /// The shared-memory lane's read (`recvmsg` with descriptors): a plain socket only, as the
    /// lane is never offered on a remote connection (21.1).
    #[cfg(target_os = "linux")]
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

    /// Writes what the connection takes now; `WouldBlock` when it takes nothing.
    pub(crate) fn try_write_vectored(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Transport::Socket(s, _) => s.try_write_vectored(slices),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.try_write_vectored(slices),
        }
    }

    /// [`try_write_vectored`](Self::try_write_vectored) with one slice.
    pub(crate) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        self.try_write_vectored(&[IoSlice::new(bytes)])
    }

    /// Writes with descriptors attached (the shared-memory lane: a plain socket only).
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

    /// Writes all of `bytes` and what waits behind them (the JOIN block).
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
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// The socket's descriptor (the I/O thread's look for input before it sleeps).
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Transport::Socket(_, fd) => *fd,
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.as_raw_fd(),
        }
    }

    /// End of file for the parent after what was written (for TLS, after a close_notify).
    pub(crate) fn shutdown_write(&self) -> io::Result<()> {
        match self {
            Transport::Socket(s, _) => s.shutdown_write(),
            #[cfg(feature = "remote")]
            Transport::Tls(t) => t.shutdown_write(),
        }
    }
}
