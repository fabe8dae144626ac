//! HELLO and WELCOME (PROTOCOL.md section 4) and the parent's negotiation helpers.

use crate::error::{err, ErrorCode, ProtocolError};
use crate::frame::{HANDSHAKE_MAX_FRAME_SIZE, MAX_MAX_FRAME_SIZE};
use crate::shm::{parse_extensions, ShmAccept, ShmOffer, TAG_SHM};
use crate::wire::Reader;

/// The 8 magic bytes that open every HELLO payload.
pub const HELLO_MAGIC: [u8; 8] = *b"WIREPOOL";
pub use crate::constants::{MAX_CODECS_PER_METHOD, MAX_METHODS};

/// Whether a method answers once or streams rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MethodKind {
    /// One RESULT (wire value 1).
    Unary,
    /// ROWS then one END (wire value 2).
    Stream,
}

impl MethodKind {
    /// The wire byte.
    pub const fn to_u8(self) -> u8 {
        match self {
            MethodKind::Unary => 1,
            MethodKind::Stream => 2,
        }
    }

    /// The kind for a wire byte, or `None`.
    pub const fn from_u8(byte: u8) -> Option<MethodKind> {
        match byte {
            1 => Some(MethodKind::Unary),
            2 => Some(MethodKind::Stream),
            _ => None,
        }
    }
}

/// One entry of the HELLO method list; its index is the `method` of a REQUEST.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MethodInfo {
    /// 1-255 bytes, unique in the list.
    pub name: String,
    /// Unary or stream.
    pub kind: MethodKind,
    /// 1-16 distinct codec ids the method accepts.
    pub codecs: Vec<u8>,
}

/// The worker's handshake offer.
///
/// ```
/// use wirepool_proto::{Hello, MethodInfo, MethodKind};
/// let hello = Hello {
///     pid: 4242,
///     methods: vec![MethodInfo { name: "rows".into(), kind: MethodKind::Stream, codecs: vec![2] }],
///     ..Hello::new("wirepool-rust", "0.1.0")
/// };
/// assert!(hello.validate().is_ok());
/// assert_eq!(hello.method_index("rows"), Some(0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Lowest protocol version the worker speaks (>= 1).
    pub min_version: u16,
    /// Highest protocol version the worker speaks (>= min_version).
    pub max_version: u16,
    /// The worker's process id.
    pub pid: u32,
    /// Requests it will run at once (>= 1).
    pub max_concurrency: u32,
    /// Largest payload it accepts (65,536 - 16,777,216).
    pub max_frame_size: u32,
    /// 1-64 bytes.
    pub sdk_name: String,
    /// 0-64 bytes.
    pub sdk_version: String,
    /// At most 4,096 methods.
    pub methods: Vec<MethodInfo>,
    /// The extensions the worker offers (PROTOCOL.md 20.1): the trailing bytes of the payload.
    /// None by default, which encodes exactly a version 1 HELLO.
    pub extensions: HelloExtensions,
}

/// The extension block of a HELLO (PROTOCOL.md 20.1-20.2): what the worker offers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct HelloExtensions {
    /// The shared-memory lane (tag 1): the bytes of the parent's regions the worker accepts.
    pub shm: Option<ShmOffer>,
}

impl HelloExtensions {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(offer) = self.shm {
            offer.encode(&mut out);
        }
        out
    }

    /// Reads the known entries of trailing bytes; never an error (20.1).
    fn parse(trailing: &[u8]) -> HelloExtensions {
        let entries = parse_extensions(trailing);
        HelloExtensions {
            shm: entries
                .iter()
                .find(|e| e.tag == TAG_SHM)
                .and_then(|e| ShmOffer::decode(e.data)),
        }
    }
}

/// The extension block of a WELCOME (PROTOCOL.md 20.1-20.2): what the parent accepts. An
/// extension is on for the connection exactly when its entry is here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct WelcomeExtensions {
    /// The shared-memory lane (tag 1): the window of each direction.
    pub shm: Option<ShmAccept>,
}

impl WelcomeExtensions {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(accept) = self.shm {
            accept.encode(&mut out);
        }
        out
    }

    fn parse(trailing: &[u8]) -> WelcomeExtensions {
        let entries = parse_extensions(trailing);
        WelcomeExtensions {
            shm: entries
                .iter()
                .find(|e| e.tag == TAG_SHM)
                .and_then(|e| ShmAccept::decode(e.data)),
        }
    }
}

impl Hello {
    /// A HELLO for protocol v1 with no methods, concurrency 1, `max_frame_size` 16 MiB and pid 0;
    /// override fields with struct update syntax.
    pub fn new(sdk_name: impl Into<String>, sdk_version: impl Into<String>) -> Hello {
        Hello {
            min_version: crate::PROTOCOL_VERSION,
            max_version: crate::PROTOCOL_VERSION,
            pid: 0,
            max_concurrency: 1,
            max_frame_size: MAX_MAX_FRAME_SIZE,
            sdk_name: sdk_name.into(),
            sdk_version: sdk_version.into(),
            methods: Vec::new(),
            extensions: HelloExtensions::default(),
        }
    }

    /// The index of the method with this name.
    pub fn method_index(&self, name: &str) -> Option<u16> {
        self.methods
            .iter()
            .position(|m| m.name == name)
            .map(|i| i as u16)
    }

    /// Check every range rule of section 4.1 (`BAD_HANDSHAKE`).
    pub fn validate(&self) -> Result<(), ProtocolError> {
        let bad = |what: String| Err(err(ErrorCode::BadHandshake, 0, what));
        if self.min_version < 1 || self.min_version > self.max_version {
            return bad(format!(
                "HELLO versions {}..={} are not a valid range",
                self.min_version, self.max_version
            ));
        }
        if self.max_concurrency < 1 {
            return bad("HELLO max_concurrency is 0".into());
        }
        if !(HANDSHAKE_MAX_FRAME_SIZE..=MAX_MAX_FRAME_SIZE).contains(&self.max_frame_size) {
            return bad(format!(
                "HELLO max_frame_size {} out of range",
                self.max_frame_size
            ));
        }
        if !(1..=64).contains(&self.sdk_name.len()) {
            return bad(format!(
                "HELLO sdk_name is {} bytes, not 1-64",
                self.sdk_name.len()
            ));
        }
        if self.sdk_version.len() > 64 {
            return bad(format!(
                "HELLO sdk_version is {} bytes, over 64",
                self.sdk_version.len()
            ));
        }
        if self.methods.len() > MAX_METHODS {
            return bad(format!(
                "HELLO lists {} methods, over 4096",
                self.methods.len()
            ));
        }
        let mut names: Vec<&str> = Vec::with_capacity(self.methods.len());
        for m in &self.methods {
            if !(1..=MAX_CODECS_PER_METHOD).contains(&m.codecs.len()) {
                return bad(format!(
                    "method {:?} has {} codecs, not 1-16",
                    m.name,
                    m.codecs.len()
                ));
            }
            let mut seen = [false; 256];
            for &c in &m.codecs {
                if std::mem::replace(&mut seen[c as usize], true) {
                    return bad(format!("method {:?} lists codec {c} twice", m.name));
                }
            }
            if !(1..=255).contains(&m.name.len()) {
                return bad(format!("method name is {} bytes, not 1-255", m.name.len()));
            }
            names.push(&m.name);
        }
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("method name {:?} listed twice", w[0]));
        }
        Ok(())
    }

    /// Encode the payload (no header). Validates first.
    pub(crate) fn encode_payload(&self, out: &mut impl bytes::BufMut) -> Result<(), ProtocolError> {
        self.validate()?;
        out.put_slice(&HELLO_MAGIC);
        out.put_u16_le(self.min_version);
        out.put_u16_le(self.max_version);
        out.put_u32_le(self.pid);
        out.put_u32_le(self.max_concurrency);
        out.put_u32_le(self.max_frame_size);
        put_str16(out, &self.sdk_name);
        put_str16(out, &self.sdk_version);
        out.put_u16_le(self.methods.len() as u16);
        for m in &self.methods {
            out.put_u8(m.kind.to_u8());
            out.put_u8(m.codecs.len() as u8);
            out.put_slice(&m.codecs);
            put_str16(out, &m.name);
        }
        out.put_slice(&self.extensions.encode());
        Ok(())
    }

    /// Size of the encoded payload.
    pub(crate) fn payload_len(&self) -> usize {
        24 + 2
            + self.sdk_name.len()
            + 2
            + self.sdk_version.len()
            + 2
            + self
                .methods
                .iter()
                .map(|m| 2 + m.codecs.len() + 2 + m.name.len())
                .sum::<usize>()
            + self.extensions.encode().len()
    }

    /// Parse and check a HELLO payload; trailing bytes are read as an extension block, never
    /// refused (20.1: a version 1 reader ignores them).
    /// Checks run in wire order, so the first bad field decides the code.
    pub(crate) fn parse(payload: &[u8]) -> Result<Hello, ProtocolError> {
        // A HELLO shorter than the magic does not start with it either.
        if payload.get(..8) != Some(&HELLO_MAGIC[..]) {
            return Err(err(
                ErrorCode::BadMagic,
                0,
                "HELLO does not start with WIREPOOL",
            ));
        }
        let mut r = Reader::new(&payload[8..], ErrorCode::BadPayload);
        let bad = |what: String| err(ErrorCode::BadHandshake, 0, what);
        let min_version = r.u16()?;
        let max_version = r.u16()?;
        let pid = r.u32()?;
        let max_concurrency = r.u32()?;
        let max_frame_size = r.u32()?;
        if min_version < 1 || min_version > max_version {
            return Err(bad(format!(
                "HELLO versions {min_version}..={max_version} are not a valid range"
            )));
        }
        if max_concurrency < 1 {
            return Err(bad("HELLO max_concurrency is 0".into()));
        }
        if !(HANDSHAKE_MAX_FRAME_SIZE..=MAX_MAX_FRAME_SIZE).contains(&max_frame_size) {
            return Err(bad(format!(
                "HELLO max_frame_size {max_frame_size} out of range"
            )));
        }
        let sdk_name = r
            .str16_in(1, 64, ErrorCode::BadHandshake, "sdk_name")?
            .to_owned();
        let sdk_version = r
            .str16_in(0, 64, ErrorCode::BadHandshake, "sdk_version")?
            .to_owned();
        let method_count = r.u16()? as usize;
        if method_count > MAX_METHODS {
            return Err(bad(format!(
                "HELLO lists {method_count} methods, over 4096"
            )));
        }
        // Each entry takes at least 5 bytes: never reserve more than the payload can hold.
        let mut methods: Vec<MethodInfo> = Vec::with_capacity(method_count.min(r.remaining() / 5));
        for _ in 0..method_count {
            let kind_byte = r.u8()?;
            let kind = MethodKind::from_u8(kind_byte)
                .ok_or_else(|| bad(format!("method kind {kind_byte} is not 1 or 2")))?;
            let codec_count = r.u8()? as usize;
            if !(1..=MAX_CODECS_PER_METHOD).contains(&codec_count) {
                return Err(bad(format!("method has {codec_count} codecs, not 1-16")));
            }
            let codecs = r.bytes(codec_count)?.to_vec();
            let mut seen = [false; 256];
            for &c in &codecs {
                if std::mem::replace(&mut seen[c as usize], true) {
                    return Err(bad(format!("a method lists codec {c} twice")));
                }
            }
            let name = r.str16_in(1, 255, ErrorCode::BadHandshake, "method name")?;
            // Linear scan: at most 4,096 names, checked once per connection.
            if methods.iter().any(|m| m.name == name) {
                return Err(bad(format!("method name {name:?} listed twice")));
            }
            methods.push(MethodInfo {
                name: name.to_owned(),
                kind,
                codecs,
            });
        }
        Ok(Hello {
            min_version,
            max_version,
            pid,
            max_concurrency,
            max_frame_size,
            sdk_name,
            sdk_version,
            methods,
            extensions: HelloExtensions::parse(r.rest()),
        })
    }
}

/// The parent's handshake answer; it fixes the limits of the connection.
///
/// ```
/// use wirepool_proto::{Hello, Welcome};
/// let hello = Hello::new("sdk", "1");
/// let welcome = Welcome::for_hello(&hello, 7).unwrap();
/// assert_eq!(welcome.version, 1);
/// assert_eq!(welcome.max_frame_size, 4_194_304);
/// assert!(welcome.check_against(&hello).is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Welcome {
    /// The chosen protocol version.
    pub version: u16,
    /// The parent's name for this worker.
    pub worker_id: u32,
    /// 65,536 - 16,777,216, and at most the worker's.
    pub max_frame_size: u32,
    /// Stream credit in bytes each stream starts with (>= 1).
    pub initial_credit: u32,
    /// Ping period; 0 = no heartbeat.
    pub heartbeat_ms: u32,
    /// At most the worker's `max_concurrency`, at least 1.
    pub max_in_flight: u32,
    /// Largest reassembled message, at least `max_frame_size`.
    pub max_message_size: u64,
    /// The extensions the parent accepts (PROTOCOL.md 20.1), from offset 32 of the payload.
    /// None by default, which encodes exactly a version 1 WELCOME.
    pub extensions: WelcomeExtensions,
}

impl Welcome {
    /// The default WELCOME for this HELLO: highest common version, the spec's default limits
    /// clamped to what the worker offers, `max_in_flight = max_concurrency`.
    /// Fails with `VERSION_MISMATCH` when the worker does not speak v1.
    pub fn for_hello(hello: &Hello, worker_id: u32) -> Result<Welcome, ProtocolError> {
        let version = choose_version(hello, crate::PROTOCOL_VERSION, crate::PROTOCOL_VERSION)?;
        Ok(Welcome {
            version,
            worker_id,
            max_frame_size: crate::DEFAULT_MAX_FRAME_SIZE.min(hello.max_frame_size),
            initial_credit: crate::DEFAULT_INITIAL_CREDIT,
            heartbeat_ms: crate::DEFAULT_HEARTBEAT_MS,
            max_in_flight: hello.max_concurrency.max(1),
            max_message_size: crate::DEFAULT_MAX_MESSAGE_SIZE,
            extensions: WelcomeExtensions::default(),
        })
    }

    /// Check the ranges decidable from the WELCOME alone (`BAD_HANDSHAKE`).
    pub fn validate(&self) -> Result<(), ProtocolError> {
        let bad = |what: String| Err(err(ErrorCode::BadHandshake, 0, what));
        if self.version < 1 {
            return bad("WELCOME version is 0".into());
        }
        if !(HANDSHAKE_MAX_FRAME_SIZE..=MAX_MAX_FRAME_SIZE).contains(&self.max_frame_size) {
            return bad(format!(
                "WELCOME max_frame_size {} out of range",
                self.max_frame_size
            ));
        }
        if self.initial_credit < 1 || i64::from(self.initial_credit) > crate::MAX_CREDIT {
            return bad(format!(
                "WELCOME initial_credit {} not in 1..=2^31-1",
                self.initial_credit
            ));
        }
        if self.max_in_flight < 1 {
            return bad("WELCOME max_in_flight is 0".into());
        }
        if self.max_message_size < u64::from(self.max_frame_size) {
            return bad(format!(
                "WELCOME max_message_size {} below max_frame_size {}",
                self.max_message_size, self.max_frame_size
            ));
        }
        Ok(())
    }

    /// Check this WELCOME against the HELLO it answers: the version in the worker's range
    /// (`VERSION_MISMATCH`), `max_frame_size` and `max_in_flight` within the worker's offer
    /// (`BAD_HANDSHAKE`). The worker side runs this on receipt; a parent may run it before
    /// sending.
    pub fn check_against(&self, hello: &Hello) -> Result<(), ProtocolError> {
        self.validate()?;
        if self.version < hello.min_version || self.version > hello.max_version {
            return Err(err(
                ErrorCode::VersionMismatch,
                0,
                format!(
                    "WELCOME version {} outside the worker's {}..={}",
                    self.version, hello.min_version, hello.max_version
                ),
            ));
        }
        if self.max_frame_size > hello.max_frame_size {
            return Err(err(
                ErrorCode::BadHandshake,
                0,
                format!(
                    "WELCOME max_frame_size {} above the worker's {}",
                    self.max_frame_size, hello.max_frame_size
                ),
            ));
        }
        if self.max_in_flight > hello.max_concurrency {
            return Err(err(
                ErrorCode::BadHandshake,
                0,
                format!(
                    "WELCOME max_in_flight {} above the worker's max_concurrency {}",
                    self.max_in_flight, hello.max_concurrency
                ),
            ));
        }
        if let Some(accept) = self.extensions.shm {
            accept.check(hello.extensions.shm)?;
        }
        Ok(())
    }

    /// Bytes of the fixed fields; the extension block follows.
    pub(crate) const PAYLOAD_LEN: usize = 32;

    /// Size of the encoded payload.
    pub(crate) fn payload_len(&self) -> usize {
        Welcome::PAYLOAD_LEN + self.extensions.encode().len()
    }

    pub(crate) fn encode_payload(&self, out: &mut impl bytes::BufMut) -> Result<(), ProtocolError> {
        self.validate()?;
        out.put_u16_le(self.version);
        out.put_u16_le(0);
        out.put_u32_le(self.worker_id);
        out.put_u32_le(self.max_frame_size);
        out.put_u32_le(self.initial_credit);
        out.put_u32_le(self.heartbeat_ms);
        out.put_u32_le(self.max_in_flight);
        out.put_u64_le(self.max_message_size);
        out.put_slice(&self.extensions.encode());
        Ok(())
    }

    pub(crate) fn parse(payload: &[u8]) -> Result<Welcome, ProtocolError> {
        let mut r = Reader::new(payload, ErrorCode::BadPayload);
        let version = r.u16()?;
        if r.u16()? != 0 {
            return Err(err(
                ErrorCode::ReservedNonzero,
                0,
                "WELCOME reserved field is not zero",
            ));
        }
        let welcome = Welcome {
            version,
            worker_id: r.u32()?,
            max_frame_size: r.u32()?,
            initial_credit: r.u32()?,
            heartbeat_ms: r.u32()?,
            max_in_flight: r.u32()?,
            max_message_size: r.u64()?,
            extensions: WelcomeExtensions::default(),
        };
        let welcome = Welcome {
            extensions: WelcomeExtensions::parse(r.rest()),
            ..welcome
        };
        welcome.validate()?;
        Ok(welcome)
    }
}

/// The highest version in both `hello`'s range and `ours` (`min..=max`), or `VERSION_MISMATCH`.
///
/// ```
/// use wirepool_proto::{choose_version, ErrorCode, Hello};
/// let hello = Hello { min_version: 1, max_version: 3, ..Hello::new("sdk", "1") };
/// assert_eq!(choose_version(&hello, 1, 2).unwrap(), 2);
/// assert_eq!(choose_version(&hello, 4, 5).unwrap_err().code, ErrorCode::VersionMismatch);
/// ```
pub fn choose_version(hello: &Hello, our_min: u16, our_max: u16) -> Result<u16, ProtocolError> {
    let high = hello.max_version.min(our_max);
    let low = hello.min_version.max(our_min);
    if high >= low && high >= 1 {
        Ok(high)
    } else {
        Err(err(
            ErrorCode::VersionMismatch,
            0,
            format!(
                "worker speaks {}..={}, parent speaks {our_min}..={our_max}",
                hello.min_version, hello.max_version
            ),
        ))
    }
}

/// A method the parent was configured to call: the HELLO must list it with this kind and codec.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MethodRequirement {
    /// Method name.
    pub name: String,
    /// Expected kind.
    pub kind: MethodKind,
    /// The codec the parent will use.
    pub codec: u8,
}

/// Check that `hello` offers every required method with the right kind and codec, and return
/// their method indices in the same order; otherwise `CODEC_MISMATCH` naming the first gap.
///
/// ```
/// use wirepool_proto::{check_methods, ErrorCode, Hello, MethodInfo, MethodKind, MethodRequirement};
/// let hello = Hello {
///     methods: vec![MethodInfo { name: "echo".into(), kind: MethodKind::Unary, codecs: vec![0, 1] }],
///     ..Hello::new("sdk", "1")
/// };
/// let need = |codec| MethodRequirement { name: "echo".into(), kind: MethodKind::Unary, codec };
/// assert_eq!(check_methods(&hello, &[need(1)]).unwrap(), vec![0]);
/// assert_eq!(check_methods(&hello, &[need(2)]).unwrap_err().code, ErrorCode::CodecMismatch);
/// ```
pub fn check_methods(
    hello: &Hello,
    required: &[MethodRequirement],
) -> Result<Vec<u16>, ProtocolError> {
    required
        .iter()
        .map(|req| {
            let mismatch = |what: String| err(ErrorCode::CodecMismatch, 0, what);
            let index = hello
                .method_index(&req.name)
                .ok_or_else(|| mismatch(format!("worker has no method {:?}", req.name)))?;
            let method = &hello.methods[index as usize];
            if method.kind != req.kind {
                return Err(mismatch(format!(
                    "method {:?} is {:?} on the worker, {:?} expected",
                    req.name, method.kind, req.kind
                )));
            }
            if !method.codecs.contains(&req.codec) {
                return Err(mismatch(format!(
                    "method {:?} does not accept codec {} (it accepts {:?})",
                    req.name, req.codec, method.codecs
                )));
            }
            Ok(index)
        })
        .collect()
}

fn put_str16(out: &mut impl bytes::BufMut, s: &str) {
    out.put_u16_le(s.len() as u16);
    out.put_slice(s.as_bytes());
}
