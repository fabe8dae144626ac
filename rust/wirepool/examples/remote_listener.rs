//! The Rust pool's listener under a hostile crowd (PROTOCOL.md 21.4): its bad-input figures, as
//! `bench/remote_listener.py` gives them for the Python listener.
//!
//! ```sh
//! cargo run --release -p wirepool --example remote_listener -- [--connections 1000] [--at-once 100] [--rounds 3]
//! ```
//!
//! Opens `--connections` connections to one TLS listener (join timeout 1 s), `--at-once` at a
//! time, in equal parts: garbage before TLS, a stalled TLS record (slow handshake), TLS then a
//! partial JOIN block, forged tickets, silent peers. Reports how long each kind took to be
//! refused (from connect to the listener's close: median and max), the listener's peak of
//! pending connections, and this process's descriptors and resident memory before and after
//! each round (the crowd runs in this process; its own sockets are closed before "after").

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use wirepool::remote::{Listener, ListenerOptions};

const KINDS: [&str; 5] = [
    "garbage before TLS",
    "slow TLS handshake",
    "TLS, partial JOIN",
    "forged ticket",
    "silent",
];

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
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

async fn until_closed(mut r: impl AsyncRead + Unpin) {
    let mut buf = [0u8; 4096];
    while let Ok(1..) = r.read(&mut buf).await {}
}

async fn hostile(addr: SocketAddr, kind: &str, tls: Arc<ClientConfig>) -> Duration {
    let started = Instant::now();
    let Ok(mut tcp) = TcpStream::connect(addr).await else {
        return started.elapsed();
    };
    match kind {
        "garbage before TLS" => {
            let _ = tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
            until_closed(tcp).await;
        }
        "slow TLS handshake" => {
            let _ = tcp
                .write_all(&[0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00])
                .await;
            until_closed(tcp).await;
        }
        "silent" => until_closed(tcp).await,
        _ => {
            let connector = tokio_rustls::TlsConnector::from(tls);
            let name = ServerName::try_from("localhost").expect("a name");
            if let Ok(mut s) = connector.connect(name, tcp).await {
                let mut block = [0x5au8; 64];
                block[..8].copy_from_slice(b"WIREJOIN");
                block[8..16].copy_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
                let n = if kind == "forged ticket" { 64 } else { 20 };
                let _ = s.write_all(&block[..n]).await;
                let _ = s.flush().await;
                until_closed(s).await;
            }
        }
    }
    started.elapsed()
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}

fn main() {
    let (mut n, mut at_once, mut rounds) = (1000usize, 100usize, 3usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v: usize = args.next().and_then(|v| v.parse().ok()).expect("a number");
        match a.as_str() {
            "--connections" => n = v,
            "--at-once" => at_once = v,
            "--rounds" => rounds = v,
            other => panic!("unknown argument {other}"),
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"wirepool/1".to_vec()];
    let tls = Arc::new(tls);
    let join_timeout = Duration::from_secs(1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let listener = Listener::start(ListenerOptions::default().join_timeout(join_timeout))
            .await
            .expect("listener");
        let addr = listener.local_addr();
        for kind in KINDS {
            hostile(addr, kind, tls.clone()).await; // warm-up
        }
        let settle = || async {
            while listener.stats().pending > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        settle().await;
        let (fds0, rss0) = (fds(), rss_kib());
        let gate = Arc::new(Semaphore::new(at_once));
        let mut times: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
        let mut walls = Vec::new();
        let mut after = Vec::new();
        for _ in 0..rounds {
            let started = Instant::now();
            let tasks: Vec<_> = (0..n)
                .map(|i| {
                    let kind = KINDS[i % KINDS.len()];
                    let (gate, tls) = (gate.clone(), tls.clone());
                    tokio::spawn(async move {
                        let _permit = gate.acquire().await.expect("gate");
                        (kind, hostile(addr, kind, tls).await)
                    })
                })
                .collect();
            for t in tasks {
                let (kind, d) = t.await.expect("task");
                times.entry(kind).or_default().push(d);
            }
            walls.push(started.elapsed());
            settle().await;
            after.push((fds(), rss_kib()));
        }
        let stats = listener.stats();
        println!(
            "# {rounds} x {n} hostile connections, {at_once} at once, join_timeout {:?}: {walls:.1?}",
            join_timeout
        );
        println!("{:22} {:>6} {:>9} {:>7}", "kind", "count", "median s", "max s");
        for (kind, mut v) in times {
            v.sort();
            println!(
                "{kind:22} {:6} {:9.3} {:7.3}",
                v.len(),
                v[v.len() / 2].as_secs_f64(),
                v[v.len() - 1].as_secs_f64()
            );
        }
        println!(
            "accepted {}, refused {}, joined {}, peak pending {} (max_pending_joins 64); fds before {fds0}, after each round {:?}; RSS before {rss0} KiB, after each round {:?} KiB",
            stats.accepted,
            stats.refused,
            stats.joined,
            stats.peak_pending,
            after.iter().map(|a| a.0).collect::<Vec<_>>(),
            after.iter().map(|a| a.1).collect::<Vec<_>>()
        );
        println!("refusals by cause: {:?}", stats.refused_by_cause);
    });
}
