//! A remote worker (PROTOCOL.md 21) against a fake parent on loopback: the `echo_worker` example,
//! started with `WIREPOOL_TICKET` instead of `WIREPOOL_FD`, joins a blocking rustls server with a
//! fixed test certificate. The fake parent checks the bytes the spec fixes (the TLS version and
//! ALPN, the JOIN block, a HELLO without the shm lane, the worker's PINGs) and plays the parts a
//! real parent would not: it stays silent, or presents a certificate the ticket does not pin.
//! (The Python parent's listener with the Rust worker: python/tests/test_remote_rust_worker.py.)

#![cfg(feature = "remote")]

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use wirepool_proto::{encode_message, Frame, FrameBody, FrameDecoder, MessageHead, Welcome};

use common::STEP_TIMEOUT;

/// A self-signed ECDSA P-256 certificate and its PKCS#8 key (DER, one hex line each), made for
/// these tests only.
const CERT_HEX: &str = include_str!("remote_cert.hex");

const ID: [u8; 16] = *b"ticket-id-16byte";
const SECRET: [u8; 32] = *b"the-secret-of-this-test-ticket!!";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn cert_and_key() -> (Vec<u8>, Vec<u8>) {
    let mut lines = CERT_HEX.lines();
    (unhex(lines.next().unwrap()), unhex(lines.next().unwrap()))
}

fn fingerprint(der: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    digest.as_ref().try_into().unwrap()
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let mut acc = 0u32;
        for (i, &b) in chunk.iter().enumerate() {
            acc |= u32::from(b) << (16 - 8 * i);
        }
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((acc >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn ticket(port: u16, pin: Option<[u8; 32]>) -> String {
    let expires = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let tls = match pin {
        Some(pin) => format!(r#""tls":true,"fingerprint":"sha256:{}""#, hex(&pin)),
        None => r#""tls":false"#.to_owned(),
    };
    let json = format!(
        r#"{{"v":1,"host":"127.0.0.1","port":{port},{tls},"id":"{}","secret":"{}","expires":{expires}}}"#,
        hex(&ID),
        hex(&SECRET)
    );
    format!("wirepool-ticket-1.{}", base64url(json.as_bytes()))
}

fn join_block() -> Vec<u8> {
    let mut block = b"WIREJOIN\x01\x00\0\0\0\0\0\0".to_vec();
    block.extend_from_slice(&ID);
    block.extend_from_slice(&SECRET);
    block
}

/// The worker process, started with a ticket; killed on drop.
struct Worker(Child);

impl Worker {
    fn start(ticket: &str) -> Worker {
        let child = Command::new(common::worker_binary())
            .env_remove("WIREPOOL_FD")
            .env_remove("WIREPOOL_TICKET_FILE")
            .env("WIREPOOL_TICKET", ticket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn echo_worker");
        Worker(child)
    }

    /// Exit status and stderr, within [`STEP_TIMEOUT`].
    fn wait(&mut self) -> (i32, String) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let status = loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the worker did not exit");
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut err = String::new();
        self.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status.code().unwrap_or(-1), err)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn accept(listener: &TcpListener) -> TcpStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        match listener.accept() {
            Ok((tcp, _)) => {
                tcp.set_nonblocking(false).unwrap();
                tcp.set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                return tcp;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the worker did not connect");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn server_config() -> Arc<rustls::ServerConfig> {
    let (cert, key) = cert_and_key();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert)],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key)),
    )
    .unwrap();
    config.alpn_protocols = vec![b"wirepool/1".to_vec()];
    Arc::new(config)
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// The TLS handshake, bounded; the error is the server's view of a failed one.
fn tls_accept(
    tcp: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ServerConnection, TcpStream>, String> {
    let mut conn = rustls::ServerConnection::new(server_config()).unwrap();
    let mut tcp = tcp;
    let deadline = Instant::now() + STEP_TIMEOUT;
    while conn.is_handshaking() {
        assert!(
            Instant::now() < deadline,
            "the TLS handshake did not finish"
        );
        match conn.complete_io(&mut tcp) {
            Ok(_) => {}
            Err(e) if timed_out(&e) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(rustls::StreamOwned::new(conn, tcp))
}

/// The parent's end of a joined connection: frames in and out, every read bounded.
struct FakeParent<S: Read + Write> {
    stream: S,
    decoder: FrameDecoder,
}

impl<S: Read + Write> FakeParent<S> {
    fn new(stream: S) -> Self {
        FakeParent {
            stream,
            decoder: FrameDecoder::new(wirepool_proto::HANDSHAKE_MAX_FRAME_SIZE),
        }
    }

    fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        let mut got = 0;
        let deadline = Instant::now() + STEP_TIMEOUT;
        while got < n {
            assert!(Instant::now() < deadline, "{got} of {n} bytes");
            match self.stream.read(&mut out[got..]) {
                Ok(0) => panic!("end of file after {got} of {n} bytes"),
                Ok(k) => got += k,
                Err(e) if timed_out(&e) => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        out
    }

    /// The next frame, or `None` at end of file.
    fn next_frame(&mut self) -> Option<Frame> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(frame) = self.decoder.next_frame().expect("a bad frame") {
                return Some(frame);
            }
            assert!(
                Instant::now() < deadline,
                "no frame within {STEP_TIMEOUT:?}"
            );
            let mut buf = [0u8; 65536];
            match self.stream.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.decoder.receive(&buf[..n]),
                Err(e) if timed_out(&e) => {}
                // The worker's TLS close without close_notify, or a reset: its end.
                Err(_) => return None,
            }
        }
    }

    fn send(&mut self, frame: &Frame) {
        let mut out = Vec::new();
        frame.encode(&mut out).unwrap();
        self.stream.write_all(&out).unwrap();
        self.stream.flush().unwrap();
    }

    /// JOIN block, HELLO (no shm lane on a remote connection), WELCOME with `heartbeat_ms`.
    fn handshake(&mut self, heartbeat_ms: u32) -> wirepool_proto::Hello {
        assert_eq!(self.read_exact(64), join_block());
        let hello = match self.next_frame().expect("HELLO").body {
            FrameBody::Hello(hello) => *hello,
            other => panic!("expected HELLO, got {other:?}"),
        };
        assert!(hello.extensions.shm.is_none(), "{hello:?}");
        let welcome = Welcome {
            heartbeat_ms,
            max_frame_size: 1 << 20,
            ..Welcome::for_hello(&hello, 1).unwrap()
        };
        self.send(&Frame::new(0, FrameBody::Welcome(welcome)));
        self.decoder.set_max_frame_size(welcome.max_frame_size);
        hello
    }
}

#[test]
fn a_worker_joins_over_tls_pings_its_parent_and_serves() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (cert, _) = cert_and_key();
    let mut worker = Worker::start(&ticket(port, Some(fingerprint(&cert))));
    let stream = tls_accept(accept(&listener)).expect("TLS handshake");
    assert_eq!(
        stream.conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(stream.conn.alpn_protocol(), Some(&b"wirepool/1"[..]));
    let mut parent = FakeParent::new(stream);
    // Long enough for this single-threaded parent's blocking write of the request below, during
    // which it answers no PING.
    let hello = parent.handshake(1000);
    assert_eq!(hello.pid, worker.0.id());
    let echo = hello.method_index("echo").unwrap();
    // A message larger than a TLS record and than one frame: CONTINUATIONs both ways.
    let body: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
    let mut out = Vec::new();
    let head = MessageHead::Request {
        method: echo,
        codec: 0,
        timeout_us: 0,
    };
    encode_message(&mut out, 7, head, &body, 1 << 20).unwrap();
    if let Err(e) = parent.stream.write_all(&out) {
        panic!("write: {e}; the worker: {:?}", worker.wait());
    }
    // The answer, and the worker's PINGs (counter nonces, little-endian), answered.
    let mut answer = Vec::new();
    let mut pings = Vec::new();
    while answer.len() < body.len() || pings.len() < 2 {
        let frame = parent.next_frame().expect("the worker left");
        match frame.body {
            FrameBody::Ping { nonce } => {
                pings.push(u64::from_le_bytes(nonce));
                parent.send(&Frame::new(0, FrameBody::Pong { nonce }));
            }
            FrameBody::Result { body } | FrameBody::Continuation { chunk: body } => {
                assert_eq!(frame.id, 7);
                answer.extend_from_slice(&body);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(answer == body, "the echo differs");
    assert_eq!(pings[..2], [1, 2]);
    // DRAIN: GOODBYE, then the worker's close_notify (a clean end of file) and status 0.
    parent.send(&Frame::new(0, FrameBody::Drain { grace_ms: 1000 }));
    loop {
        match parent.next_frame().map(|f| f.body) {
            Some(FrameBody::Goodbye { .. }) => break,
            Some(FrameBody::Ping { .. }) => {}
            other => panic!("expected GOODBYE, got {other:?}"),
        }
    }
    assert!(parent.next_frame().is_none());
    let (status, err) = worker.wait();
    assert_eq!(status, 0, "{err}");
}

#[test]
fn a_silent_parent_is_left_after_three_heartbeats() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (cert, _) = cert_and_key();
    let mut worker = Worker::start(&ticket(port, Some(fingerprint(&cert))));
    let mut parent = FakeParent::new(tls_accept(accept(&listener)).expect("TLS handshake"));
    parent.handshake(100);
    // No PONG from here on; the connection stays open.
    let first = loop {
        if let FrameBody::Ping { .. } = parent.next_frame().expect("PING").body {
            break Instant::now();
        }
    };
    let (status, err) = worker.wait();
    let elapsed = first.elapsed();
    assert_eq!(status, 0, "{err}");
    assert!(err.contains("the parent is gone: no PONG"), "{err}");
    assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
    assert!(
        elapsed < Duration::from_millis(300 + 25) + Duration::from_secs(5),
        "{elapsed:?}"
    );
}

#[test]
fn a_certificate_the_ticket_does_not_pin_gets_no_secret() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut worker = Worker::start(&ticket(port, Some([7; 32])));
    let refused = tls_accept(accept(&listener));
    assert!(refused.is_err(), "the worker finished the handshake");
    let (cert, _) = cert_and_key();
    let (status, err) = worker.wait();
    assert_eq!(status, 1, "{err}");
    assert!(
        err.contains(&format!(
            "fingerprint sha256:{}, not the ticket's sha256:{}",
            hex(&fingerprint(&cert)),
            hex(&[7; 32])
        )),
        "{err}"
    );
}

#[test]
fn the_parents_refusal_ends_the_worker_with_status_1() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (cert, _) = cert_and_key();
    let mut worker = Worker::start(&ticket(port, Some(fingerprint(&cert))));
    let mut parent = FakeParent::new(tls_accept(accept(&listener)).expect("TLS handshake"));
    assert_eq!(parent.read_exact(64), join_block());
    parent.send(&Frame::new(
        0,
        FrameBody::Error {
            code: wirepool_proto::ErrorCode::BadHandshake.code(),
            message: "join refused".into(),
            details: String::new(),
        },
    ));
    let (status, err) = worker.wait();
    assert_eq!(status, 1, "{err}");
    assert!(err.contains("join refused"), "{err}");
}

#[test]
fn a_plain_loopback_ticket_joins_without_tls() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut worker = Worker::start(&ticket(port, None));
    let mut parent = FakeParent::new(accept(&listener));
    let hello = parent.handshake(0); // 0: the worker pings every 1,000 ms all the same
    let add = hello.method_index("add").unwrap();
    let mut out = Vec::new();
    let head = MessageHead::Request {
        method: add,
        codec: wirepool_codec::Codec::Json.id(),
        timeout_us: 0,
    };
    encode_message(&mut out, 1, head, br#"{"a":2,"b":3}"#, 1 << 20).unwrap();
    parent.stream.write_all(&out).unwrap();
    let frame = loop {
        let frame = parent.next_frame().expect("RESULT");
        if !matches!(frame.body, FrameBody::Ping { .. }) {
            break frame;
        }
    };
    assert!(
        matches!(&frame.body, FrameBody::Result { body } if &body[..] == br#"{"sum":5}"#),
        "{frame:?}"
    );
    drop(parent); // end of file: the worker exits 0
    let (status, err) = worker.wait();
    assert_eq!(status, 0, "{err}");
}
