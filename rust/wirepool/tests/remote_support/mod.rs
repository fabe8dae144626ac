//! What the remote tests share: a TCP proxy that can cut or blackhole the connections it relays,
//! and raw clients that speak to the listener byte by byte (TLS or not, any JOIN block).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

type Pairs = Arc<Mutex<Vec<(Arc<TcpStream>, Arc<TcpStream>)>>>;

/// A TCP relay between workers and the pool's listener: `cut()` resets every relayed connection
/// (both ends); `blackhole()` stops relaying bytes but keeps every connection open.
pub struct Proxy {
    pub port: u16,
    holes: Arc<AtomicBool>,
    pairs: Pairs,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let holes = Arc::new(AtomicBool::new(false));
        let pairs: Pairs = Arc::default();
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = {
            let (holes, pairs, tasks) = (holes.clone(), pairs.clone(), tasks.clone());
            tokio::spawn(async move {
                while let Ok((a, _)) = listener.accept().await {
                    let Ok(b) = TcpStream::connect(target).await else {
                        continue;
                    };
                    let (a, b) = (Arc::new(a), Arc::new(b));
                    pairs.lock().unwrap().push((a.clone(), b.clone()));
                    for (from, to) in [(a.clone(), b.clone()), (b, a)] {
                        let holes = holes.clone();
                        tasks
                            .lock()
                            .unwrap()
                            .push(tokio::spawn(pump(from, to, holes)));
                    }
                }
            })
        };
        Proxy {
            port,
            holes,
            pairs,
            tasks,
            accept,
        }
    }

    /// Resets every relayed connection, both ends.
    pub fn cut(&self) {
        for (a, b) in self.pairs.lock().unwrap().drain(..) {
            for s in [a, b] {
                reset(&s);
            }
        }
    }

    /// Stops relaying: bytes are read and dropped, and no end of file is passed on.
    pub fn blackhole(&self) {
        self.holes.store(true, SeqCst);
    }

    pub fn close(&self) {
        self.accept.abort();
        self.cut();
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.close();
    }
}

/// SO_LINGER 0 and shutdown: the peer sees a reset; the descriptor closes with its last handle.
fn reset(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: plain socket calls on a descriptor `s` owns.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
        libc::shutdown(s.as_raw_fd(), libc::SHUT_RDWR);
    }
}

async fn pump(from: Arc<TcpStream>, to: Arc<TcpStream>, holes: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if from.readable().await.is_err() {
            break;
        }
        let n = match from.try_read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => break,
        };
        if holes.load(SeqCst) {
            continue;
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            if to.writable().await.is_err() {
                return;
            }
            match to.try_write(rest) {
                Ok(m) => rest = &rest[m..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    }
    if holes.load(SeqCst) {
        // A blackhole passes no end of file on: the other side must find out by itself.
        std::future::pending::<()>().await;
    }
    // SAFETY: shutdown on a descriptor `to` owns.
    unsafe {
        libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&*to), libc::SHUT_WR);
    }
}

/// Accepts any certificate (the raw clients test the listener, not the pin).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS 1.3 client configuration offering ALPN `wirepool/1` (or none).
pub fn client_config(alpn: bool) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    if alpn {
        config.alpn_protocols = vec![b"wirepool/1".to_vec()];
    }
    Arc::new(config)
}

/// Reads until the peer closes (or resets); at most 64 KiB kept.
pub async fn until_closed(mut r: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = r.read(&mut buf).await {
        if out.len() < 65536 {
            out.extend_from_slice(&buf[..n]);
        }
    }
    out
}

/// Connects, completes TLS (when `tls`), writes `bytes`, and reads until the listener closes:
/// what it answered. `None` when TLS could not be set up (the listener closed first).
pub async fn raw_join(addr: SocketAddr, tls: bool, bytes: &[u8]) -> Option<Vec<u8>> {
    let tcp = TcpStream::connect(addr).await.ok()?;
    if !tls {
        return Some(send_then_read(tcp, bytes).await);
    }
    let connector = tokio_rustls::TlsConnector::from(client_config(true));
    let name = ServerName::try_from("localhost").unwrap();
    let s = connector.connect(name, tcp).await.ok()?;
    Some(send_then_read(s, bytes).await)
}

async fn send_then_read(mut s: impl AsyncRead + AsyncWrite + Unpin, bytes: &[u8]) -> Vec<u8> {
    let _ = s.write_all(bytes).await;
    let _ = s.flush().await;
    until_closed(s).await
}

/// The ERROR frame's message in what a listener answered, if it answered one.
pub fn error_message(answer: &[u8]) -> Option<(u32, String)> {
    let mut decoder = wirepool_proto::FrameDecoder::new(1 << 20);
    decoder.receive(answer);
    match decoder.next_frame() {
        Ok(Some(frame)) => match frame.body {
            wirepool_proto::FrameBody::Error { code, message, .. } => Some((code, message)),
            _ => None,
        },
        _ => None,
    }
}

/// Runs `f` and says how long it took.
pub async fn timed<F: std::future::Future>(f: F) -> (Duration, F::Output) {
    let started = Instant::now();
    let out = f.await;
    (started.elapsed(), out)
}
