//! The gateway over TLS: HTTP/2 by ALPN `h2`, HTTP/1.1 by ALPN `http/1.1`, a plain-text client
//! closed in bounded time, PEM files refused with a message naming them.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use wirepool_gateway::{GatewayError, TlsConfig};

/// Standard base64 with padding (PEM bodies), so the test needs no encoder crate.
fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn pem(label: &str, der: &[u8]) -> String {
    let body = base64(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// A self-signed certificate for `localhost` written as PEM files in a directory of its own
/// (removed on drop); the certificate's DER for the clients' trust store.
struct Certs {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    der: CertificateDer<'static>,
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn certs(tag: &str) -> Certs {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let dir = std::env::temp_dir().join(format!("wirepool-gw-tls-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, pem("CERTIFICATE", cert.der())).unwrap();
    std::fs::write(&key_path, pem("PRIVATE KEY", &key.serialize_der())).unwrap();
    Certs {
        dir,
        cert: cert_path,
        key: key_path,
        der: cert.der().clone(),
    }
}

async fn tls_connect(
    addr: std::net::SocketAddr,
    trust: &CertificateDer<'static>,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trust.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake")
}

#[tokio::test]
async fn h2_and_http1_over_tls_by_alpn_and_plain_text_is_closed() {
    bounded(30, async {
        let c = certs("serve");
        let tls = TlsConfig::from_pem_files(&c.cert, &c.key).expect("PEM files");
        let gw = start(1, |b| b.tls(tls).header_timeout(Duration::from_millis(500))).await;

        // HTTP/2 by ALPN h2: several requests on one connection.
        let stream = tls_connect(gw.addr, &c.der, &[b"h2", b"http/1.1"]).await;
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        for i in 0..3 {
            let resp = send
                .send_request(request(
                    "POST",
                    "https://localhost/v1/call/echo",
                    &[],
                    i.to_string(),
                ))
                .await
                .unwrap();
            assert_eq!(resp.version(), http::Version::HTTP_2);
            let (s, _, body) = read(resp).await;
            assert_eq!((s, json(&body)), (200, serde_json::json!(i)));
        }

        // HTTP/1.1 by ALPN http/1.1, keep-alive.
        let stream = tls_connect(gw.addr, &c.der, &[b"http/1.1"]).await;
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        for i in 0..2 {
            send.ready().await.unwrap();
            let resp = send
                .send_request(request("POST", "/v1/call/echo", &[], i.to_string()))
                .await
                .unwrap();
            assert_eq!(resp.version(), http::Version::HTTP_11);
            let (s, _, body) = read(resp).await;
            assert_eq!((s, json(&body)), (200, serde_json::json!(i)));
        }

        // A stream over TLS.
        let stream = tls_connect(gw.addr, &c.der, &[b"h2"]).await;
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let resp = send
            .send_request(request(
                "POST",
                "https://localhost/v1/stream/count",
                &[],
                "2",
            ))
            .await
            .unwrap();
        let (s, _, body) = read(resp).await;
        assert_eq!(
            (s, &body[..]),
            (200, &b"{\"i\":0}\n{\"i\":1}\n{\"summary\":2}\n"[..])
        );

        // Plain-text HTTP to the TLS port: no HTTP answer, the connection closed at once (not
        // at the header timeout: the handshake fails on the first bytes).
        let started = Instant::now();
        let mut raw = TcpStream::connect(gw.addr).await.unwrap();
        raw.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = raw.read_to_end(&mut out).await;
        assert!(
            !out.starts_with(b"HTTP/"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        assert!(
            out.len() < 64,
            "{} bytes for a plain-text client",
            out.len()
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // A client that connects and says nothing (no ClientHello): closed at the header timeout.
        let started = Instant::now();
        let mut raw = TcpStream::connect(gw.addr).await.unwrap();
        let mut out = Vec::new();
        let _ = raw.read_to_end(&mut out).await;
        let took = started.elapsed();
        assert!(out.is_empty(), "{out:?}");
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(5),
            "{took:?}"
        );
        // The gateway still serves over TLS.
        let stream = tls_connect(gw.addr, &c.der, &[b"h2"]).await;
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        gw.stop().await;
    })
    .await;
}

#[test]
fn bad_pem_files_are_refused_naming_the_file() {
    let c = certs("bad");
    let err = |r: Result<TlsConfig, GatewayError>| match r {
        Err(GatewayError::InvalidArgument(m)) => m,
        other => panic!("not refused: {other:?}"),
    };
    let missing = c.dir.join("missing.pem");
    let m = err(TlsConfig::from_pem_files(&missing, &c.key));
    assert!(m.contains("missing.pem"), "{m}");
    // The key file as the certificate: no CERTIFICATE in it.
    let m = err(TlsConfig::from_pem_files(&c.key, &c.key));
    assert!(m.contains("certificate") && m.contains("key.pem"), "{m}");
    // The certificate as the key: no key in it.
    let m = err(TlsConfig::from_pem_files(&c.cert, &c.cert));
    assert!(m.contains("key") && m.contains("cert.pem"), "{m}");
    // Another certificate's key.
    let other = certs("other");
    let m = err(TlsConfig::from_pem_files(&c.cert, &other.key));
    assert!(m.starts_with("TLS"), "{m}");
    assert!(TlsConfig::from_pem_files(&c.cert, &c.key).is_ok());
}

#[tokio::test]
async fn binary_serves_https_with_tls_flags() {
    bounded(60, async {
        let c = certs("binary");
        let worker = worker().display().to_string();
        let (child, scheme, addr) = spawn_binary(&[
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--tls-cert",
            c.cert.to_str().unwrap(),
            "--tls-key",
            c.key.to_str().unwrap(),
            "--",
            &worker,
        ])
        .await;
        assert_eq!(scheme, "https");
        let stream = tls_connect(addr, &c.der, &[b"h2", b"http/1.1"]).await;
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let resp = send
            .send_request(request(
                "POST",
                "https://localhost/v1/call/echo",
                &[],
                "[7]",
            ))
            .await
            .unwrap();
        let (s, _, body) = read(resp).await;
        assert_eq!((s, json(&body)), (200, serde_json::json!([7])));
        let status = terminate(child).await;
        assert!(status.success(), "{status:?}");
        // A certificate without its key, and a key that is not a PEM key: status 2.
        for args in [
            vec!["--tls-cert", c.cert.to_str().unwrap()],
            vec![
                "--tls-cert",
                c.cert.to_str().unwrap(),
                "--tls-key",
                c.cert.to_str().unwrap(),
            ],
        ] {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_wirepool-gateway"))
                .args(&args)
                .args(["--", &worker])
                .output()
                .await
                .unwrap();
            assert_eq!(out.status.code(), Some(2), "{args:?}");
            assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
        }
    })
    .await;
}

/// Trickles on `conn`: `head` at once, then a byte every 100 ms (30 s at most); the time from
/// `connected` (taken before the TCP connect) to the gateway's close.
async fn trickle(
    conn: impl tokio::io::AsyncRead + tokio::io::AsyncWrite,
    head: Vec<u8>,
    connected: Instant,
) -> Duration {
    let (mut rd, mut wr) = tokio::io::split(conn);
    let writes = async move {
        let _ = wr.write_all(&head).await;
        let _ = wr.flush().await;
        let mut ticks = tokio::time::interval(Duration::from_millis(100));
        for _ in 0..300 {
            ticks.tick().await;
            if wr.write_all(b"a").await.is_err() || wr.flush().await.is_err() {
                break;
            }
        }
    };
    let closed = async move {
        let mut out = Vec::new();
        let _ = rd.read_to_end(&mut out).await;
        connected.elapsed()
    };
    tokio::pin!(writes);
    tokio::pin!(closed);
    tokio::select! {
        t = &mut closed => t,
        () = &mut writes => closed.await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_slowloris_crowd_is_closed_at_the_header_timeout() {
    bounded(60, async {
        let c = certs("slowloris");
        let tls = TlsConfig::from_pem_files(&c.cert, &c.key).unwrap();
        let header_timeout = Duration::from_millis(500);
        let gw = start(1, |b| b.tls(tls).header_timeout(header_timeout)).await;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..200 {
            if i % 2 == 0 {
                // A ClientHello that never ends: a handshake record header announcing 512
                // bytes, then a byte every 100 ms.
                let connected = Instant::now();
                let tcp = TcpStream::connect(gw.addr).await.unwrap();
                let head = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01];
                tasks.spawn(trickle(tcp, head, connected));
            } else {
                // A finished handshake, then a request head that never ends.
                // The header timeout counts from the accept, the handshake included.
                let connected = Instant::now();
                let tls = tls_connect(gw.addr, &c.der, &[b"http/1.1"]).await;
                let head = b"POST /v1/call/echo HTTP/1.1\r\nx-slow: ".to_vec();
                tasks.spawn(trickle(tls, head, connected));
            }
        }
        let mut closes = Vec::new();
        while let Some(t) = tasks.join_next().await {
            closes.push(t.unwrap());
        }
        closes.sort();
        let (median, last) = (closes[closes.len() / 2], closes[closes.len() - 1]);
        eprintln!(
            "200 TLS trickles closed: first {:?}, median {median:?}, last {last:?}",
            closes[0]
        );
        assert!(median >= header_timeout.mul_f64(0.9), "median {median:?}");
        assert!(
            last < header_timeout + Duration::from_secs(4),
            "last {last:?}"
        );
        // The gateway still serves over TLS.
        let stream = tls_connect(gw.addr, &c.der, &[b"h2"]).await;
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let resp = send
            .send_request(request("GET", "https://localhost/healthz", &[], ""))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        gw.stop().await;
    })
    .await;
}
