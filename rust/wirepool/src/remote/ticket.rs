//! Join tickets (PROTOCOL.md 21.2) and the JOIN block a worker sends before its HELLO (21.3).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// The ticket's text form starts with this.
pub(crate) const TICKET_PREFIX: &str = "wirepool-ticket-1.";
/// The longest text form accepted (21.2).
pub(crate) const TICKET_MAX_CHARS: usize = 4096;
/// The JOIN block (21.3).
pub(crate) const JOIN_SIZE: usize = 64;
pub(crate) const JOIN_MAGIC: &[u8; 8] = b"WIREJOIN";
pub(crate) const JOIN_VERSION: u16 = 1;

/// A ticket that cannot be used: malformed, of another version, or unsafe (a plain-TCP ticket
/// for an address that is not loopback).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketError(pub(crate) String);

impl fmt::Display for TicketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TicketError {}

/// A join ticket (PROTOCOL.md 21.2): where a worker connects, whose certificate it pins, and
/// the secret it proves itself with. Issued by the pool's [`Listener`](super::Listener).
///
/// Its text form ([`encode`](Ticket::encode)) is what a worker reads from `WIREPOOL_TICKET` (or
/// the file named by `WIREPOOL_TICKET_FILE`); every wirepool worker SDK joins with it unchanged.
/// A ticket is a secret: its `Debug` form names it by its id and never shows the secret.
///
/// ```
/// use wirepool::remote::Ticket;
/// let text = "wirepool-ticket-1.eyJ2IjoxLCJob3N0IjoiMTI3LjAuMC4xIiwicG9ydCI6NzcwMCwidGxzIjpmYWxzZSwiaWQiOiIwMDAxMDIwMzA0MDUwNjA3MDgwOTBhMGIwYzBkMGUwZiIsInNlY3JldCI6IjAwMDEwMjAzMDQwNTA2MDcwODA5MGEwYjBjMGQwZTBmMTAxMTEyMTMxNDE1MTYxNzE4MTkxYTFiMWMxZDFlMWYiLCJleHBpcmVzIjoyMDAwMDAwMDAwfQ";
/// let ticket = Ticket::parse(text).unwrap();
/// assert_eq!((ticket.host(), ticket.port(), ticket.tls()), ("127.0.0.1", 7700, false));
/// assert_eq!(ticket.id(), "000102030405060708090a0b0c0d0e0f");
/// assert_eq!(Ticket::parse(&ticket.encode()).unwrap(), ticket);
/// assert!(!format!("{ticket:?}").contains("1f"), "the secret is never shown");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Ticket {
    host: String,
    port: u16,
    tls: bool,
    fingerprint: Option<[u8; 32]>,
    id: [u8; 16],
    secret: [u8; 32],
    expires: i64,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("id", &self.id())
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// A fresh ticket: random id and secret, valid for `ttl` from now.
    pub(crate) fn issue(
        host: &str,
        port: u16,
        fingerprint: Option<[u8; 32]>,
        ttl: Duration,
    ) -> Result<Ticket, TicketError> {
        let rng = ring::rand::SystemRandom::new();
        let mut id = [0u8; 16];
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&rng, &mut id)
            .and_then(|()| ring::rand::SecureRandom::fill(&rng, &mut secret))
            .map_err(|_| TicketError("the system's random number generator failed".into()))?;
        let expires = unix_now().saturating_add(ttl.as_secs().min(i64::MAX as u64 / 2) as i64);
        Ticket::new(host, port, fingerprint, id, secret, expires)
    }

    fn new(
        host: &str,
        port: u16,
        fingerprint: Option<[u8; 32]>,
        id: [u8; 16],
        secret: [u8; 32],
        expires: i64,
    ) -> Result<Ticket, TicketError> {
        if host.is_empty() || host.len() > 253 {
            return Err(TicketError("ticket host must be 1-253 bytes".into()));
        }
        if port == 0 {
            return Err(TicketError("ticket port must be 1-65535".into()));
        }
        if fingerprint.is_none() && !is_loopback(host) {
            return Err(TicketError(format!(
                "plain TCP (tls false) is allowed on loopback only, not {host:?}"
            )));
        }
        Ok(Ticket {
            host: host.to_owned(),
            port,
            tls: fingerprint.is_some(),
            fingerprint,
            id,
            secret,
            expires,
        })
    }

    /// Reads a ticket's text form (surrounding whitespace ignored); the error says what is
    /// wrong with it. Unknown fields are ignored (PROTOCOL.md 21.2).
    pub fn parse(text: &str) -> Result<Ticket, TicketError> {
        let bad = |why: &str| TicketError(why.to_owned());
        let text = text.trim();
        if text.len() > TICKET_MAX_CHARS {
            return Err(TicketError(format!(
                "a ticket is at most {TICKET_MAX_CHARS} characters"
            )));
        }
        let body = text.strip_prefix(TICKET_PREFIX).ok_or_else(|| {
            TicketError(format!(
                "not a wirepool ticket (it must start with {TICKET_PREFIX:?})"
            ))
        })?;
        let raw =
            base64url_decode(body).ok_or_else(|| bad("the ticket's body is not base64url JSON"))?;
        let doc: Value = serde_json::from_slice(&raw)
            .map_err(|_| bad("the ticket's body is not base64url JSON"))?;
        let doc = doc
            .as_object()
            .ok_or_else(|| bad("the ticket's body is not a JSON object"))?;
        let int = |field: &str| doc.get(field).and_then(Value::as_i64);
        if int("v") != Some(1) {
            let v = doc.get("v").map_or("null".to_owned(), Value::to_string);
            return Err(TicketError(format!(
                "ticket version {v} is not supported (1)"
            )));
        }
        let host = doc
            .get("host")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("ticket field 'host' must be a string"))?;
        let port = int("port").ok_or_else(|| bad("ticket field 'port' must be an integer"))?;
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| bad("ticket port must be 1-65535"))?;
        let tls = doc
            .get("tls")
            .and_then(Value::as_bool)
            .ok_or_else(|| bad("ticket field 'tls' must be true or false"))?;
        let expires = int("expires")
            .ok_or_else(|| bad("ticket field 'expires' must be an integer (Unix seconds)"))?;
        let fingerprint = if tls {
            let fp = doc
                .get("fingerprint")
                .and_then(Value::as_str)
                .and_then(|s| s.strip_prefix("sha256:"))
                .ok_or_else(|| {
                    bad("ticket field 'fingerprint' must be 'sha256:' and 64 hex digits")
                })?;
            Some(from_hex::<32>(Some(fp), "fingerprint")?)
        } else {
            None
        };
        let text_field = |field: &str| doc.get(field).and_then(Value::as_str);
        Ticket::new(
            host,
            port,
            fingerprint,
            from_hex::<16>(text_field("id"), "id")?,
            from_hex::<32>(text_field("secret"), "secret")?,
            expires,
        )
    }

    /// The text form for `WIREPOOL_TICKET`: `wirepool-ticket-1.` and the base64url of its JSON.
    /// It holds the secret: pass it in an environment variable or a file only the worker reads.
    pub fn encode(&self) -> String {
        let mut doc = json!({
            "v": 1,
            "host": self.host,
            "port": self.port,
            "tls": self.tls,
            "id": to_hex(&self.id),
            "secret": to_hex(&self.secret),
            "expires": self.expires,
        });
        if let Some(fp) = &self.fingerprint {
            doc["fingerprint"] = Value::String(format!("sha256:{}", to_hex(fp)));
        }
        let mut text = String::from(TICKET_PREFIX);
        base64url_encode(doc.to_string().as_bytes(), &mut text);
        text
    }

    /// The ticket's id in hex: how logs and errors name it (never by its secret).
    pub fn id(&self) -> String {
        to_hex(&self.id)
    }

    /// The listener's host name or address, as workers are to reach it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The listener's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// False only for a plain-TCP ticket on loopback.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The pinned certificate's fingerprint, `sha256:` and 64 hex digits (TLS tickets).
    pub fn fingerprint(&self) -> Option<String> {
        self.fingerprint
            .as_ref()
            .map(|fp| format!("sha256:{}", to_hex(fp)))
    }

    /// Unix time in seconds after which the listener refuses the ticket.
    pub fn expires(&self) -> i64 {
        self.expires
    }

    /// The same ticket pointing at another address: for a worker that reaches the listener
    /// through a proxy or a translated address. The listener does not care which address a
    /// worker used; a plain-TCP ticket stays on loopback.
    pub fn with_address(&self, host: &str, port: u16) -> Result<Ticket, TicketError> {
        Ticket::new(
            host,
            port,
            self.fingerprint,
            self.id,
            self.secret,
            self.expires,
        )
    }

    /// The same ticket with another expiry (Unix seconds): for tests of expiry.
    #[doc(hidden)]
    pub fn with_expires(&self, expires: i64) -> Ticket {
        Ticket {
            expires,
            ..self.clone()
        }
    }

    /// The same ticket with another secret: for tests of a wrong secret.
    #[doc(hidden)]
    pub fn with_secret(&self, secret: [u8; 32]) -> Ticket {
        Ticket {
            secret,
            ..self.clone()
        }
    }

    /// The same ticket pinning another certificate: for tests of a wrong fingerprint.
    #[doc(hidden)]
    pub fn with_fingerprint(&self, fingerprint: [u8; 32]) -> Ticket {
        Ticket {
            fingerprint: Some(fingerprint),
            tls: true,
            ..self.clone()
        }
    }

    /// The 64 bytes a worker with this ticket sends before its HELLO (21.3).
    pub fn join_block(&self) -> [u8; JOIN_SIZE] {
        let mut block = [0u8; JOIN_SIZE];
        block[..8].copy_from_slice(JOIN_MAGIC);
        block[8..10].copy_from_slice(&JOIN_VERSION.to_le_bytes());
        block[16..32].copy_from_slice(&self.id);
        block[32..].copy_from_slice(&self.secret);
        block
    }

    pub(crate) fn id_bytes(&self) -> [u8; 16] {
        self.id
    }

    /// The secret compared in constant time (21.3).
    pub(crate) fn secret_matches(&self, secret: &[u8]) -> bool {
        secret.len() == 32
            && self
                .secret
                .iter()
                .zip(secret)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    pub(crate) fn expired(&self) -> bool {
        unix_now() > self.expires
    }
}

/// What a JOIN block says, once its layout is checked (the ticket is checked by the listener).
pub(crate) enum JoinBlock<'a> {
    /// Not a wirepool worker: closed without a word.
    BadMagic,
    /// Another JOIN version: `VERSION_MISMATCH`.
    Version(u16),
    /// Reserved bytes not zero.
    Reserved,
    Ticket {
        id: [u8; 16],
        secret: &'a [u8],
    },
}

impl JoinBlock<'_> {
    pub(crate) fn read(block: &[u8; JOIN_SIZE]) -> JoinBlock<'_> {
        if &block[..8] != JOIN_MAGIC {
            return JoinBlock::BadMagic;
        }
        let version = u16::from_le_bytes([block[8], block[9]]);
        if version != JOIN_VERSION {
            return JoinBlock::Version(version);
        }
        if block[10..16] != [0; 6] {
            return JoinBlock::Reserved;
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&block[16..32]);
        JoinBlock::Ticket {
            id,
            secret: &block[32..],
        }
    }
}

pub(crate) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// True for `localhost` and loopback IP literals (127.0.0.0/8, ::1).
pub(crate) fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn from_hex<const N: usize>(value: Option<&str>, field: &str) -> Result<[u8; N], TicketError> {
    let bad = || {
        TicketError(format!(
            "ticket field {field:?} must be {} lowercase hex digits",
            2 * N
        ))
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
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// RFC 4648 section 5, without padding.
fn base64url_encode(bytes: &[u8], out: &mut String) {
    for chunk in bytes.chunks(3) {
        let mut acc = 0u32;
        for (i, &b) in chunk.iter().enumerate() {
            acc |= u32::from(b) << (16 - 8 * i);
        }
        for i in 0..=chunk.len() {
            out.push(BASE64URL[((acc >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
}

/// RFC 4648 section 5; padding is accepted and not required.
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
        out.extend_from_slice(&acc.to_be_bytes()[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_ticket_round_trips_and_follows_the_spec_table() {
        let t = Ticket::issue("10.0.0.7", 7700, Some([0xab; 32]), Duration::from_secs(60)).unwrap();
        let text = t.encode();
        assert!(text.starts_with(TICKET_PREFIX) && !text.contains('='));
        assert_eq!(Ticket::parse(&format!(" {text}\n")).unwrap(), t);
        let body = base64url_decode(&text[TICKET_PREFIX.len()..]).unwrap();
        let doc: Value = serde_json::from_slice(&body).unwrap();
        let keys: std::collections::BTreeSet<&str> = doc
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let spec: Value = serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../spec/constants.json"
            ))
            .unwrap(),
        )
        .unwrap();
        let want: std::collections::BTreeSet<&str> = spec["remote"]["ticket_fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(keys, want);
        assert_eq!(spec["remote"]["ticket_prefix"], TICKET_PREFIX);
        assert_eq!(spec["remote"]["join_bytes"], JOIN_SIZE);
        assert_eq!(doc["fingerprint"], format!("sha256:{}", "ab".repeat(32)));
        assert_eq!(doc["id"].as_str().unwrap().len(), 32);
        assert_eq!(doc["secret"].as_str().unwrap().len(), 64);
        let now = unix_now();
        assert!((now + 59..=now + 61).contains(&t.expires()));
        // Named by its id only.
        let shown = format!("{t:?}");
        assert!(shown.contains(&t.id()) && !shown.contains(doc["secret"].as_str().unwrap()));
        // Every field is checked; no two tickets share an id or a secret.
        let u = Ticket::issue("10.0.0.7", 7700, Some([0xab; 32]), Duration::from_secs(60)).unwrap();
        assert!(u.id != t.id && u.secret != t.secret);
    }

    #[test]
    fn a_join_block_is_read_as_the_spec_lays_it_out() {
        let t = Ticket::issue("127.0.0.1", 1, None, Duration::from_secs(1)).unwrap();
        let block = t.join_block();
        assert_eq!(&block[..8], b"WIREJOIN");
        assert_eq!(&block[8..16], &[1, 0, 0, 0, 0, 0, 0, 0]);
        match JoinBlock::read(&block) {
            JoinBlock::Ticket { id, secret } => {
                assert_eq!(id, t.id);
                assert!(t.secret_matches(secret));
                let mut wrong = secret.to_vec();
                wrong[31] ^= 1;
                assert!(!t.secret_matches(&wrong));
            }
            _ => panic!("a good block"),
        }
        let mut b = block;
        b[0] = b'X';
        assert!(matches!(JoinBlock::read(&b), JoinBlock::BadMagic));
        let mut b = block;
        b[8] = 2;
        assert!(matches!(JoinBlock::read(&b), JoinBlock::Version(2)));
        let mut b = block;
        b[12] = 1;
        assert!(matches!(JoinBlock::read(&b), JoinBlock::Reserved));
    }

    #[test]
    fn unusable_tickets_say_why() {
        let good = Ticket::issue("127.0.0.1", 4000, Some([1; 32]), Duration::from_secs(9)).unwrap();
        let doc = |f: &dyn Fn(&mut Value)| {
            let text = good.encode();
            let raw = base64url_decode(&text[TICKET_PREFIX.len()..]).unwrap();
            let mut v: Value = serde_json::from_slice(&raw).unwrap();
            f(&mut v);
            let mut out = String::from(TICKET_PREFIX);
            base64url_encode(v.to_string().as_bytes(), &mut out);
            out
        };
        let cases: Vec<(String, &str)> = vec![
            ("nope".into(), "not a wirepool ticket"),
            (format!("{TICKET_PREFIX}!!"), "not base64url JSON"),
            (doc(&|v| *v = json!([1])), "not a JSON object"),
            (doc(&|v| v["v"] = json!(2)), "version 2"),
            (doc(&|v| v["port"] = json!(0)), "port must be 1-65535"),
            (doc(&|v| v["port"] = json!(70000)), "port must be 1-65535"),
            (
                doc(&|v| v["fingerprint"] = json!("md5:00")),
                "'fingerprint'",
            ),
            (doc(&|v| v["id"] = json!("AB")), "\"id\""),
            (doc(&|v| v["secret"] = json!(7)), "\"secret\""),
            (doc(&|v| v["tls"] = json!(1)), "'tls'"),
            (doc(&|v| v["expires"] = json!("soon")), "'expires'"),
            (
                doc(&|v| {
                    v["tls"] = json!(false);
                    v["host"] = json!("10.0.0.7");
                }),
                "loopback only",
            ),
            (
                format!("{TICKET_PREFIX}{}", "A".repeat(TICKET_MAX_CHARS)),
                "at most 4096",
            ),
        ];
        for (text, why) in cases {
            let e = Ticket::parse(&text).unwrap_err();
            assert!(e.0.contains(why), "{text:?}: {e} should say {why:?}");
        }
        // Unknown fields are room for later versions.
        assert!(Ticket::parse(&doc(&|v| v["later"] = json!({"x": 1}))).is_ok());
    }

    #[test]
    fn base64url_round_trips_every_length() {
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 250) as u8).collect();
            let mut text = String::new();
            base64url_encode(&bytes, &mut text);
            assert_eq!(base64url_decode(&text).unwrap(), bytes);
        }
        assert!(base64url_decode("A").is_none());
        assert!(base64url_decode("AB+/").is_none());
    }
}
