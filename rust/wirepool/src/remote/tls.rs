//! The parent's side of TLS 1.3 (PROTOCOL.md 21.1): the pool's self-signed certificate, the
//! server configuration, and an established connection driven by hand like the socketpair.
//!
//! The handshake and the JOIN block are tokio-rustls's (bounded by the listener). After them the
//! connection is the driver's: one reader (the reader task, or a unary caller reading its own
//! answer) and one writer (the writer task, or a caller writing alone) share the rustls state
//! behind a short lock and make plain non-blocking socket calls through [`Socket`], which keeps
//! the socketpair's read-readiness-only registration.

use std::io::{self, BufRead as _, IoSlice, Write as _};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};

use bytes::{Buf as _, BytesMut};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, ServerConnection};
use wirepool_io::Socket;

use super::ALPN;

/// Free space offered to one `recv` of ciphertext.
const TLS_READ: usize = 256 * 1024;
/// Free space offered to the plaintext when the caller reserved none.
const MIN_READ: usize = 64 * 1024;
/// Plaintext rustls takes into its send buffer per write (its default is 64 KiB): fewer, larger
/// socket writes for large bodies.
const SEND_BUFFER: usize = 256 * 1024;

/// The pool's certificate: self-signed, made per listener, pinned by workers through the
/// SHA-256 of its DER (the ticket's fingerprint).
pub(crate) struct PoolCertificate {
    pub(crate) fingerprint: [u8; 32],
    pub(crate) config: Arc<ServerConfig>,
}

impl PoolCertificate {
    /// A fresh ECDSA P-256 certificate naming `hosts` (informative only: trust is the pin).
    pub(crate) fn generate(hosts: &[String]) -> io::Result<PoolCertificate> {
        let names: Vec<String> = hosts
            .iter()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
            .chain(["localhost".to_owned()])
            .collect();
        let certified = rcgen::generate_simple_self_signed(names)
            .or_else(|_| rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]))
            .map_err(io::Error::other)?;
        let der: CertificateDer<'static> = certified.cert.der().clone();
        let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
        let mut fingerprint = [0u8; 32];
        fingerprint.copy_from_slice(digest.as_ref());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            certified.signing_key.serialize_der(),
        ));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(io::Error::other)?
            .with_no_client_auth()
            .with_single_cert(vec![der], key)
            .map_err(io::Error::other)?;
        // A client offering ALPN without ours is refused by rustls; one offering none is refused
        // by the listener (21.1).
        config.alpn_protocols = vec![ALPN.to_vec()];
        // One connection per worker process: nothing to resume, no tickets to send.
        config.send_tls13_tickets = 0;
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.max_early_data_size = 0;
        Ok(PoolCertificate {
            fingerprint,
            config: Arc::new(config),
        })
    }
}

/// An established TLS connection: reads decrypt into the caller's buffer, writes encrypt and go
/// to the socket as far as it takes them; what it does not take waits in rustls for
/// [`flush_pending`](TlsSocket::flush_pending).
pub(crate) struct TlsSocket {
    raw: Socket,
    fd: RawFd,
    inner: Mutex<Inner>,
    /// Called when a read left TLS output the socket did not take (the writer sends it).
    on_output: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

struct Inner {
    conn: ServerConnection,
    /// Ciphertext received and not yet handed to rustls.
    tls_in: BytesMut,
    /// The socket reached end of file.
    eof: bool,
    /// No more plaintext will come: close_notify, or end of file after the last record.
    closed: bool,
}

/// The socket as rustls's `io::Write`: non-blocking sends.
struct SendTo<'a>(&'a Socket);

impl io::Write for SendTo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sends what rustls holds; `WouldBlock` when the socket is full before it is all out.
fn flush(conn: &mut ServerConnection, raw: &Socket) -> io::Result<()> {
    while conn.wants_write() {
        conn.write_tls(&mut SendTo(raw))?;
    }
    Ok(())
}

fn tls_error(e: rustls::Error) -> io::Error {
    // A TLS error ends the connection like a reset (PROTOCOL.md 21.6).
    io::Error::new(io::ErrorKind::ConnectionReset, format!("TLS error: {e}"))
}

impl TlsSocket {
    /// Takes over a connection whose handshake (and JOIN block) tokio-rustls completed; what
    /// rustls already holds (the start of the HELLO) is read first.
    pub(crate) fn new(fd: OwnedFd, mut conn: ServerConnection) -> io::Result<TlsSocket> {
        let raw_fd = fd.as_raw_fd();
        conn.set_buffer_limit(Some(SEND_BUFFER));
        Ok(TlsSocket {
            raw: Socket::new(fd)?,
            fd: raw_fd,
            inner: Mutex::new(Inner {
                conn,
                tls_in: BytesMut::new(),
                eof: false,
                closed: false,
            }),
            on_output: OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whom to call when a read leaves TLS output the socket did not take at once.
    pub(crate) fn set_output_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_output.set(wake);
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd
    }

    /// Reads once: decrypted bytes are appended to `buf` (within its spare capacity); `Ok(0)`
    /// is end of file (close_notify or the socket's).
    pub(crate) fn poll_read_buf(
        &self,
        cx: &mut Context<'_>,
        buf: &mut BytesMut,
    ) -> Poll<io::Result<usize>> {
        if buf.capacity() == buf.len() {
            buf.reserve(MIN_READ);
        }
        let start = buf.len();
        loop {
            let mut guard = self.lock();
            let inner = &mut *guard;
            inner.decrypt_into(buf)?;
            if inner.conn.wants_write() {
                match flush(&mut inner.conn, &self.raw) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if let Some(wake) = self.on_output.get() {
                            wake();
                        }
                    }
                    // A broken socket shows in the next read.
                    _ => {}
                }
            }
            if buf.len() > start {
                return Poll::Ready(Ok(buf.len() - start));
            }
            if inner.closed {
                return Poll::Ready(Ok(0));
            }
            if inner.tls_in.capacity() - inner.tls_in.len() < TLS_READ / 4 {
                inner.tls_in.reserve(TLS_READ);
            }
            match ready!(self.raw.poll_read_buf(cx, &mut inner.tls_in)) {
                Ok(0) => inner.eof = true,
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// `Ready` when plaintext, unprocessed ciphertext or the end of the connection waits;
    /// otherwise `cx` is registered for the socket's read readiness.
    pub(crate) fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        {
            let mut inner = self.lock();
            if inner.closed || !inner.tls_in.is_empty() {
                return Poll::Ready(Ok(()));
            }
            match inner.conn.reader().fill_buf() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                _ => return Poll::Ready(Ok(())),
            }
        }
        self.raw.poll_readable(cx)
    }

    /// Encrypts what rustls takes of `slices` (up to its send buffer) and sends what the
    /// socket takes; `WouldBlock` when earlier output still waits for the socket. Bytes
    /// accepted and not yet sent are flushed by [`flush_pending`](Self::flush_pending).
    pub(crate) fn try_write_vectored(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut inner = self.lock();
        let conn = &mut inner.conn;
        flush(conn, &self.raw)?;
        let n = conn.writer().write_vectored(slices)?;
        match flush(conn, &self.raw) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Taken, encrypted, not all sent: the writer task sends the rest. A caller that
                // wrote by itself (a lone request) leaves nothing queued that would wake it.
                drop(inner);
                if let Some(wake) = self.on_output.get() {
                    wake();
                }
            }
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        Ok(n)
    }

    /// Whether encrypted output waits for the socket.
    pub(crate) fn has_pending_output(&self) -> bool {
        self.lock().conn.wants_write()
    }

    /// Sends the encrypted output that waits; `WouldBlock` when the socket is full first.
    pub(crate) fn flush_pending(&self) -> io::Result<()> {
        flush(&mut self.lock().conn, &self.raw)
    }

    /// Waits until the socket has write space.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        self.raw.writable().await
    }

    /// close_notify, as much of it as the socket takes now.
    pub(crate) fn close_notify(&self) {
        let mut inner = self.lock();
        inner.conn.send_close_notify();
        let _ = flush(&mut inner.conn, &self.raw);
    }
}

impl Inner {
    /// Hands received ciphertext to rustls and moves the plaintext into `buf`, until either
    /// runs out (or `buf`'s spare capacity does: it is the core's buffer, never grown here).
    fn decrypt_into(&mut self, buf: &mut BytesMut) -> io::Result<()> {
        loop {
            loop {
                let room = buf.capacity() - buf.len();
                if room == 0 {
                    return Ok(());
                }
                let mut reader = self.conn.reader();
                match reader.fill_buf() {
                    Ok([]) => {
                        self.closed = true; // close_notify
                        return Ok(());
                    }
                    Ok(chunk) => {
                        let n = room.min(chunk.len());
                        buf.extend_from_slice(&chunk[..n]);
                        reader.consume(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // End of file without close_notify: as end of file (21.6).
                    Err(_) => {
                        self.closed = true;
                        return Ok(());
                    }
                }
            }
            if self.tls_in.is_empty() {
                // Every record received is decrypted and its plaintext taken: after the
                // socket's end of file nothing more comes (a truncated record is dropped).
                self.closed = self.eof;
                return Ok(());
            }
            let n = self.conn.read_tls(&mut &self.tls_in[..])?;
            self.tls_in.advance(n);
            if self.tls_in.is_empty() {
                self.tls_in.clear(); // reuse the buffer from its start
            }
            self.conn.process_new_packets().map_err(tls_error)?;
        }
    }
}
