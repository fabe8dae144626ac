//! Remote workers (PROTOCOL.md 21): the join ticket, the connection back to the parent (TCP, TLS
//! 1.3 with the parent's certificate pinned, the JOIN block before HELLO) and the worker's watch
//! on a parent that may go silent (21.5). From HELLO on the driver is the one of the socketpair.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use wirepool_proto::constants;

use crate::state::Shared;
use crate::transport::Transport;

/// The environment variable holding a join ticket's text (PROTOCOL.md 21.2), read when
/// `WIREPOOL_FD` is absent.
pub const TICKET_ENV: &str = "WIREPOOL_TICKET";
/// The environment variable naming a file that holds the ticket (when `WIREPOOL_TICKET` is unset).
pub const TICKET_FILE_ENV: &str = "WIREPOOL_TICKET_FILE";

const TICKET_PREFIX: &str = "wirepool-ticket-1.";
const TICKET_MAX_CHARS: usize = 4096;
const JOIN_MAGIC: &[u8; 8] = b"WIREJOIN";
const JOIN_VERSION: u16 = 1;
/// The JOIN block's size (21.3).
pub(crate) const JOIN_SIZE: usize = 64;
/// The ALPN protocol a worker offers (21.1).
#[cfg_attr(not(feature = "remote"), allow(dead_code))]
pub(crate) const ALPN: &[u8] = constants::REMOTE_ALPN.as_bytes();
/// TCP connect, then the TLS handshake: each bounded by the parent's `join_timeout` default, so
/// a worker pointed at a dead address says so instead of hanging.
pub(crate) const CONNECT_TIMEOUT: Duration =
    Duration::from_millis(constants::REMOTE_DEFAULT_JOIN_TIMEOUT_MS);
/// No WELCOME this long after the TCP connect: the worker gives up (21.5).
const WELCOME_TIMEOUT: Duration =
    Duration::from_millis(constants::REMOTE_DEFAULT_WELCOME_TIMEOUT_MS);
/// The ping period when the WELCOME says 0 (a remote connection always has a heartbeat).
const DEFAULT_HEARTBEAT_MS: u32 = constants::DEFAULT_HEARTBEAT_MS;
/// The parent is gone once the oldest unanswered PING is this many periods old.
const HEARTBEAT_MISSES: u32 = constants::HEARTBEAT_MISSES;

/// A join ticket (PROTOCOL.md 21.2): where to connect, whom to trust, what to prove.
pub(crate) struct Ticket {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) tls: bool,
    /// SHA-256 of the parent certificate's DER; present exactly when `tls`.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    pub(crate) fingerprint: Option<[u8; 32]>,
    pub(crate) id: [u8; 16],
    secret: [u8; 32],
    pub(crate) expires: i64,
}

impl fmt::Debug for Ticket {
    // Named by its id, never its secret (21.2).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("id", &self.name())
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// Reads a ticket's text form; the error says what is wrong with it.
    pub(crate) fn parse(text: &str) -> Result<Ticket, String> {
        let text = text.trim();
        if text.len() > TICKET_MAX_CHARS {
            return Err(format!("a ticket is at most {TICKET_MAX_CHARS} characters"));
        }
        let body = text.strip_prefix(TICKET_PREFIX).ok_or_else(|| {
            format!("not a wirepool ticket (it must start with {TICKET_PREFIX:?})")
        })?;
        let raw = base64url_decode(body)
            .ok_or_else(|| "the ticket's body is not base64url JSON".to_owned())?;
        let doc: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|_| "the ticket's body is not base64url JSON".to_owned())?;
        let doc = doc
            .as_object()
            .ok_or_else(|| "the ticket's body is not a JSON object".to_owned())?;
        let int = |field: &str| doc.get(field).and_then(|v| v.as_i64());
        if int("v") != Some(1) {
            let v = doc.get("v").map_or("null".to_owned(), |v| v.to_string());
            return Err(format!("ticket version {v} is not supported (1)"));
        }
        let host = doc
            .get("host")
            .and_then(|v| v.as_str())
            .ok_or_else(|| "ticket field 'host' must be a string".to_owned())?;
        if host.is_empty() || host.len() > 253 {
            return Err("ticket host must be 1-253 bytes".to_owned());
        }
        let port =
            int("port").ok_or_else(|| "ticket field 'port' must be an integer".to_owned())?;
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| "ticket port must be 1-65535".to_owned())?;
        let tls = doc
            .get("tls")
            .and_then(|v| v.as_bool())
            .ok_or_else(|| "ticket field 'tls' must be true or false".to_owned())?;
        let expires = int("expires")
            .ok_or_else(|| "ticket field 'expires' must be an integer (Unix seconds)".to_owned())?;
        let fingerprint = if tls {
            let fp = doc
                .get("fingerprint")
                .and_then(|v| v.as_str())
                .and_then(|s| s.strip_prefix("sha256:"))
                .ok_or_else(|| {
                    "ticket field 'fingerprint' must be 'sha256:' and 64 hex digits".to_owned()
                })?;
            Some(hex_field::<32>(Some(fp), "fingerprint")?)
        } else {
            if !is_loopback(host) {
                return Err(format!(
                    "plain TCP (tls false) is allowed on loopback only, not {host:?}"
                ));
            }
            None
        };
        let str_field = |field: &str| doc.get(field).and_then(|v| v.as_str());
        Ok(Ticket {
            host: host.to_owned(),
            port,
            tls,
            fingerprint,
            id: hex_field::<16>(str_field("id"), "id")?,
            secret: hex_field::<32>(str_field("secret"), "secret")?,
            expires,
        })
    }

    /// The ticket's id in hex: how messages name it.
    pub(crate) fn name(&self) -> String {
        to_hex(&self.id)
    }

    /// The 64 bytes a worker sends before its HELLO (21.3).
    pub(crate) fn join_block(&self) -> [u8; JOIN_SIZE] {
        let mut block = [0u8; JOIN_SIZE];
        block[..8].copy_from_slice(JOIN_MAGIC);
        block[8..10].copy_from_slice(&JOIN_VERSION.to_le_bytes());
        block[16..32].copy_from_slice(&self.id);
        block[32..].copy_from_slice(&self.secret);
        block
    }

    fn expired(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        i128::from(now) > i128::from(self.expires)
    }
}

/// The ticket of a worker started without `WIREPOOL_FD`: `WIREPOOL_TICKET`, else the file named
/// by `WIREPOOL_TICKET_FILE`; `None` when neither is set. Both variables are removed, so the
/// worker's own children never inherit the secret.
pub(crate) fn ticket_from_env() -> io::Result<Option<Ticket>> {
    let text = std::env::var_os(TICKET_ENV);
    let path = std::env::var_os(TICKET_FILE_ENV);
    std::env::remove_var(TICKET_ENV);
    std::env::remove_var(TICKET_FILE_ENV);
    let text = match (text, path) {
        (Some(text), _) => text
            .into_string()
            .map_err(|_| unusable(format!("{TICKET_ENV} is not UTF-8: not a wirepool ticket")))?,
        (None, Some(path)) => {
            use std::io::Read as _;
            let mut text = String::new();
            std::fs::File::open(&path)
                .and_then(|f| {
                    f.take((TICKET_MAX_CHARS + 64) as u64)
                        .read_to_string(&mut text)
                })
                .map_err(|e| unusable(format!("cannot read {TICKET_FILE_ENV} {path:?}: {e}")))?;
            text
        }
        (None, None) => return Ok(None),
    };
    Ticket::parse(&text).map(Some).map_err(unusable)
}

fn unusable(why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("wirepool worker: {why}"),
    )
}

/// True for `localhost` and loopback IP literals (127.0.0.0/8, ::1).
fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn hex_field<const N: usize>(value: Option<&str>, field: &str) -> Result<[u8; N], String> {
    let bad = || {
        format!(
            "ticket field {field:?} must be {} lowercase hex digits",
            2 * N
        )
    };
    let value = value.ok_or_else(bad)?.as_bytes();
    if value.len() != 2 * N {
        return Err(bad());
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in value.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0]).ok_or_else(bad)? << 4) | digit(pair[1]).ok_or_else(bad)?;
    }
    Ok(out)
}

pub(crate) fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        use std::fmt::Write as _;
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// RFC 4648 section 5, without padding (a padded text is accepted too).
fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=').as_bytes();
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        } as u32)
    };
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// Connects to the parent named by `ticket` and joins: TCP, TLS 1.3 with the parent's
/// certificate pinned (or plain TCP for a loopback ticket that says so), then the JOIN block.
/// Returns the connection, ready for the HELLO, and when the TCP connection was made (the
/// WELCOME clock starts there). The secret is sent only after the pin matched.
pub(crate) async fn connect(ticket: &Ticket) -> io::Result<(Transport, Instant)> {
    let failed = |why: String| {
        io::Error::new(
            io::ErrorKind::ConnectionRefused,
            format!("wirepool worker: {why}"),
        )
    };
    if ticket.expired() {
        return Err(failed(format!(
            "ticket {} expired at {} (Unix time)",
            ticket.name(),
            ticket.expires
        )));
    }
    let host = ticket.host.trim_start_matches('[').trim_end_matches(']');
    let address = format!("{}:{}", ticket.host, ticket.port);
    let tcp = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host, ticket.port)),
    )
    .await
    {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => return Err(failed(format!("could not connect to {address}: {e}"))),
        Err(_) => {
            return Err(failed(format!(
                "could not connect to {address} within {}s",
                CONNECT_TIMEOUT.as_secs()
            )))
        }
    };
    let connected_at = Instant::now();
    // Small frames (PONGs, results) go out at once.
    tcp.set_nodelay(true)?;
    let transport = if ticket.tls {
        tls_transport(tcp, ticket, &address)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("wirepool worker: {e}")))?
    } else {
        Transport::socket(tcp.into_std()?.into())?
    };
    transport.write_all(&ticket.join_block()).await?;
    Ok((transport, connected_at))
}

#[cfg(feature = "remote")]
async fn tls_transport(
    tcp: tokio::net::TcpStream,
    ticket: &Ticket,
    address: &str,
) -> io::Result<Transport> {
    crate::tls::handshake(tcp, ticket, address)
        .await
        .map(|tls| Transport::Tls(Box::new(tls)))
}

#[cfg(not(feature = "remote"))]
async fn tls_transport(
    _tcp: tokio::net::TcpStream,
    ticket: &Ticket,
    _address: &str,
) -> io::Result<Transport> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "ticket {} asks for TLS, and this worker was built without the `remote` feature of \
             wirepool-worker",
            ticket.name()
        ),
    ))
}

/// A remote worker's watch on its parent (21.5): the WELCOME must come within 15 s of the TCP
/// connect; then a PING every `heartbeat_ms` of the WELCOME (1,000 when it says 0), and once the
/// oldest unanswered PING is three periods old the parent is gone.
pub(crate) struct ParentWatch {
    connected_at: Instant,
    state: Mutex<WatchState>,
    welcomed: Notify,
    gone: Notify,
}

#[derive(Default)]
struct WatchState {
    period: Option<Duration>,
    /// PINGs sent and not answered yet: (nonce, when), oldest first.
    unanswered: VecDeque<(u64, Instant)>,
    last_nonce: u64,
    reason: Option<String>,
}

impl ParentWatch {
    pub(crate) fn new(connected_at: Instant) -> Arc<ParentWatch> {
        Arc::new(ParentWatch {
            connected_at,
            state: Mutex::default(),
            welcomed: Notify::new(),
            gone: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The WELCOME arrived: start pinging.
    pub(crate) fn welcome(&self, heartbeat_ms: u32) {
        let ms = if heartbeat_ms == 0 {
            DEFAULT_HEARTBEAT_MS
        } else {
            heartbeat_ms
        };
        self.lock().period = Some(Duration::from_millis(ms.into()));
        self.welcomed.notify_one();
    }

    /// A PONG answers its PING and every earlier one (a peer answers in order, 8.5).
    pub(crate) fn pong(&self, nonce: [u8; 8]) {
        let n = u64::from_le_bytes(nonce);
        let mut state = self.lock();
        if n <= state.last_nonce {
            while state.unanswered.front().is_some_and(|&(sent, _)| sent <= n) {
                state.unanswered.pop_front();
            }
        }
    }

    /// Resolves once the parent is judged gone, with the reason.
    pub(crate) async fn gone(&self) -> String {
        self.gone.notified().await;
        self.lock().reason.clone().unwrap_or_default()
    }

    fn fire(&self, reason: String) {
        self.lock().reason = Some(reason);
        self.gone.notify_one();
    }

    /// The clock task: runs until it fires or the runtime ends with the connection.
    pub(crate) async fn run(self: Arc<Self>, shared: Arc<Shared>) {
        let deadline = self.connected_at + WELCOME_TIMEOUT;
        let period = loop {
            if let Some(period) = self.lock().period {
                break period;
            }
            tokio::select! {
                _ = self.welcomed.notified() => {}
                _ = tokio::time::sleep_until(deadline.into()) => {
                    if self.lock().period.is_none() {
                        self.fire(format!(
                            "no WELCOME within {}s of connecting",
                            WELCOME_TIMEOUT.as_secs()
                        ));
                        return;
                    }
                }
            }
        };
        let limit = period * HEARTBEAT_MISSES;
        let mut next_ping = Instant::now();
        loop {
            let now = Instant::now();
            let oldest = self.lock().unanswered.front().map(|&(_, at)| at);
            if let Some(at) = oldest.filter(|at| now.duration_since(*at) > limit) {
                self.fire(format!(
                    "no PONG from the parent for {:.1}s (heartbeat {} ms)",
                    now.duration_since(at).as_secs_f64(),
                    period.as_millis()
                ));
                return;
            }
            if now >= next_ping {
                if !self.ping(&shared, now) {
                    return; // closed: the driver is ending the connection
                }
                next_ping = now + period;
            }
            tokio::time::sleep(period / 4).await;
        }
    }

    fn ping(&self, shared: &Shared, now: Instant) -> bool {
        let nonce = {
            let mut state = self.lock();
            state.last_nonce += 1;
            state.last_nonce
        };
        let mut guard = shared.lock();
        let state = &mut *guard;
        if state.closed {
            return false;
        }
        let wake = state.writer_needs_wake();
        if state
            .conn
            .send_ping(nonce.to_le_bytes(), state.out.urgent())
            .is_err()
        {
            return false;
        }
        drop(guard);
        self.lock().unanswered.push_back((nonce, now));
        if wake {
            shared.wake_writer.notify_one();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(json: &str) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::from(TICKET_PREFIX);
        for chunk in json.as_bytes().chunks(3) {
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

    const ID: &str = "000102030405060708090a0b0c0d0e0f";
    const SECRET: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn good(extra: &str) -> String {
        format!(
            r#"{{"v":1,"host":"127.0.0.1","port":4000,"tls":true,"fingerprint":"sha256:{}","id":"{ID}","secret":"{SECRET}","expires":2000000000{extra}}}"#,
            "ab".repeat(32)
        )
    }

    #[test]
    fn a_ticket_parses_and_its_join_block_follows_the_spec() {
        let t = Ticket::parse(&format!("  {}\n", encode(&good(r#","later":[1]"#)))).unwrap();
        assert_eq!((t.host.as_str(), t.port, t.tls), ("127.0.0.1", 4000, true));
        assert_eq!(t.fingerprint, Some([0xab; 32]));
        assert_eq!(t.name(), ID);
        assert_eq!(t.expires, 2_000_000_000);
        let block = t.join_block();
        assert_eq!(&block[..8], b"WIREJOIN");
        assert_eq!(&block[8..16], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(to_hex(&block[16..32]), ID);
        assert_eq!(to_hex(&block[32..]), SECRET);
        // Named by its id, never its secret.
        let shown = format!("{t:?}");
        assert!(shown.contains(ID) && !shown.contains(SECRET), "{shown}");
    }

    #[test]
    fn unusable_tickets_say_why() {
        let cases = [
            ("not a ticket".to_owned(), "not a wirepool ticket"),
            (format!("{TICKET_PREFIX}!!!"), "not base64url JSON"),
            (encode("[1]"), "not a JSON object"),
            (encode(&good("").replace("\"v\":1", "\"v\":2")), "version 2"),
            (
                encode(&good("").replace("4000", "0")),
                "port must be 1-65535",
            ),
            (
                encode(&good("").replace("4000", "70000")),
                "port must be 1-65535",
            ),
            (
                encode(&good("").replace("sha256:", "md5:")),
                "'fingerprint'",
            ),
            (encode(&good("").replace(ID, &ID.to_uppercase())), "\"id\""),
            (encode(&good("").replace(SECRET, "00")), "\"secret\""),
            (encode(&good("").replace("true", "1")), "'tls'"),
            (
                encode(&good("").replace("2000000000", "\"soon\"")),
                "'expires'",
            ),
            (
                encode(
                    &good("")
                        .replace("127.0.0.1", "10.0.0.7")
                        .replace("true", "false"),
                ),
                "loopback only",
            ),
            (
                format!("{TICKET_PREFIX}{}", "A".repeat(TICKET_MAX_CHARS)),
                "at most 4096",
            ),
        ];
        for (text, why) in cases {
            let e = Ticket::parse(&text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e:?} should say {why:?}");
        }
    }

    #[test]
    fn a_plain_ticket_on_loopback_needs_no_fingerprint() {
        let doc = format!(
            r#"{{"v":1,"host":"::1","port":9,"tls":false,"id":"{ID}","secret":"{SECRET}","expires":1}}"#
        );
        let t = Ticket::parse(&encode(&doc)).unwrap();
        assert!(!t.tls && t.fingerprint.is_none() && t.expired());
        for host in ["localhost", "127.0.0.2", "[::1]"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["10.0.0.1", "example.com", "::2"] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn base64url_round_trips_every_length() {
        for len in 0..40 {
            let json = format!(
                "\"{}\"",
                "xé?>".repeat(len).chars().take(len).collect::<String>()
            );
            let text = encode(&json);
            let body = text.strip_prefix(TICKET_PREFIX).unwrap();
            assert_eq!(base64url_decode(body).unwrap(), json.as_bytes());
        }
        assert!(base64url_decode("A").is_none());
        assert!(base64url_decode("AB+/").is_none());
    }
}
