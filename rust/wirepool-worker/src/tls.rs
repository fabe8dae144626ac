//! TLS 1.3 over TCP for a remote worker (PROTOCOL.md 21.1).
//!
//! The handshake is tokio-rustls's, with the parent's certificate pinned by the SHA-256 of its
//! DER (no CA, no host name) and the handshake signature checked against that certificate's key.
//! After it the connection is driven by hand, like the socketpair: one reader (the I/O loop) and
//! one writer (the writer task, or the I/O loop when the writer is idle) share the rustls state
//! behind a short lock and make plain non-blocking socket calls, so neither waits for the other.

use std::io::{self, BufRead as _, IoSlice, Write as _};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock, Weak};
use std::task::{ready, Context, Poll};

use bytes::{Buf as _, BytesMut};
use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct};
use tokio::net::TcpStream;

use crate::remote::{to_hex, Ticket, ALPN, CONNECT_TIMEOUT};
use crate::state::Shared;

/// Free space offered to one `recv` of ciphertext.
const TLS_READ: usize = 64 * 1024;
/// Free space offered to the plaintext when the caller reserved none.
const MIN_READ: usize = 64 * 1024;

/// Accepts exactly the certificate whose DER hashes to the ticket's fingerprint.
#[derive(Debug)]
struct Pinned {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
    /// The fingerprint the parent presented, for the message when it is not the pin.
    seen: std::sync::Mutex<Option<[u8; 32]>>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let digest = ring::digest::digest(&ring::digest::SHA256, end_entity.as_ref());
        let mut seen = [0u8; 32];
        seen.copy_from_slice(digest.as_ref());
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(seen);
        // Not secret, but compared without an early exit all the same.
        let differs = seen
            .iter()
            .zip(self.pin.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differs == 0 {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Never called: only TLS 1.3 is offered.
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // The proof that the parent holds the pinned certificate's private key.
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Runs the TLS handshake on a connected `tcp` and checks the pin; the secret has not been sent.
pub(crate) async fn handshake(
    tcp: TcpStream,
    ticket: &Ticket,
    address: &str,
) -> io::Result<TlsSocket> {
    let pin = ticket.fingerprint.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a TLS ticket needs a fingerprint",
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(Pinned {
        pin,
        provider: Arc::clone(&provider),
        seen: std::sync::Mutex::new(None),
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::clone(&verifier) as Arc<dyn ServerCertVerifier>)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN.to_vec()];
    // One connection per process: nothing to resume.
    config.resumption = rustls::client::Resumption::disabled();
    // The name is only sent (SNI) and never checked: trust is the pin.
    let host = ticket.host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned())
        .or_else(|_| ServerName::try_from("wirepool.invalid"))
        .map_err(io::Error::other)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            let seen = *verifier.seen.lock().unwrap_or_else(|p| p.into_inner());
            return Err(match seen.filter(|seen| *seen != pin) {
                Some(seen) => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the parent at {address} presented a certificate with fingerprint \
                         sha256:{}, not the ticket's sha256:{}: not joining",
                        to_hex(&seen),
                        to_hex(&pin)
                    ),
                ),
                None => io::Error::new(
                    e.kind(),
                    format!("the TLS handshake with {address} failed: {e}"),
                ),
            });
        }
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the TLS handshake with {address} did not complete within {}s",
                    CONNECT_TIMEOUT.as_secs()
                ),
            ))
        }
    };
    let (tcp, conn) = stream.into_inner();
    Ok(TlsSocket {
        tcp,
        inner: Mutex::new(Inner {
            conn,
            tls_in: BytesMut::new(),
            eof: false,
            closed: false,
        }),
        writer: OnceLock::new(),
    })
}

/// An established TLS connection: reads decrypt into the caller's buffer, writes encrypt and
/// go to the socket as far as it takes them; what it does not take waits in rustls for
/// [`flush_pending`](TlsSocket::flush_pending).
pub(crate) struct TlsSocket {
    tcp: TcpStream,
    inner: Mutex<Inner>,
    /// Woken when reading produced TLS output of its own (an alert, a key update's answer).
    writer: OnceLock<Weak<Shared>>,
}

struct Inner {
    conn: ClientConnection,
    /// Ciphertext received and not yet handed to rustls.
    tls_in: BytesMut,
    /// The socket reached end of file (or was reset).
    eof: bool,
    /// No more plaintext will come: close_notify, or end of file after the last record.
    closed: bool,
}

/// The socket as rustls's `io::Write`: non-blocking sends.
struct SendTo<'a>(&'a TcpStream);

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

fn tls_error(e: rustls::Error) -> io::Error {
    // The worker treats a TLS error as end of file (21.6): the connection is gone either way.
    io::Error::new(io::ErrorKind::ConnectionReset, format!("TLS error: {e}"))
}

/// Sends what rustls holds; `WouldBlock` when the socket is full before it is all out.
fn flush(conn: &mut ClientConnection, tcp: &TcpStream) -> io::Result<()> {
    while conn.wants_write() {
        conn.write_tls(&mut SendTo(tcp))?;
    }
    Ok(())
}

impl TlsSocket {
    /// Whom to wake when a read leaves TLS output the socket did not take at once.
    pub(crate) fn set_writer(&self, shared: &Arc<Shared>) {
        let _ = self.writer.set(Arc::downgrade(shared));
    }

    pub(crate) fn as_raw_fd(&self) -> RawFd {
        self.tcp.as_raw_fd()
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
            {
                let mut guard = self.inner.lock();
                let inner = &mut *guard;
                inner.decrypt_into(buf)?;
                if inner.conn.wants_write() {
                    match flush(&mut inner.conn, &self.tcp) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wake_writer(),
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
            }
            ready!(self.tcp.poll_read_ready(cx))?;
            let mut inner = self.inner.lock();
            if inner.tls_in.capacity() - inner.tls_in.len() < TLS_READ / 4 {
                inner.tls_in.reserve(TLS_READ);
            }
            match self.tcp.try_read_buf(&mut inner.tls_in) {
                Ok(0) => inner.eof = true,
                Ok(_) => {}
                // Readiness was stale; tokio cleared it and the next poll registers.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn wake_writer(&self) {
        if let Some(shared) = self.writer.get().and_then(Weak::upgrade) {
            shared.wake_writer.notify_one();
        }
    }

    /// Encrypts what rustls takes of `slices` (up to its 64 KiB buffer) and sends what the
    /// socket takes; `WouldBlock` when earlier output still waits for the socket. Bytes
    /// accepted and not yet sent are flushed by [`flush_pending`](Self::flush_pending).
    pub(crate) fn try_write_vectored(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut inner = self.inner.lock();
        let conn = &mut inner.conn;
        flush(conn, &self.tcp)?;
        let n = conn.writer().write_vectored(slices)?;
        match flush(conn, &self.tcp) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
        Ok(n)
    }

    /// Whether encrypted output waits for the socket.
    pub(crate) fn has_pending_output(&self) -> bool {
        self.inner.lock().conn.wants_write()
    }

    /// Sends the encrypted output that waits; `WouldBlock` when the socket is full first.
    pub(crate) fn flush_pending(&self) -> io::Result<()> {
        flush(&mut self.inner.lock().conn, &self.tcp)
    }

    /// Waits until the socket has write space.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        self.tcp.writable().await
    }

    /// close_notify, as much of it as the socket takes now, then end of file for the parent.
    pub(crate) fn shutdown_write(&self) -> io::Result<()> {
        {
            let mut inner = self.inner.lock();
            inner.conn.send_close_notify();
            let _ = flush(&mut inner.conn, &self.tcp);
        }
        // SAFETY: shutdown on the descriptor the TcpStream owns.
        if unsafe { libc::shutdown(self.tcp.as_raw_fd(), libc::SHUT_WR) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
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
