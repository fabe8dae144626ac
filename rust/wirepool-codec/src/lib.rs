//! Codecs of the wirepool protocol, shared by workers and parents.
//!
//! The protocol carries a codec id (PROTOCOL.md section 7) and opaque bytes; this crate turns
//! typed values into those bytes and back. Every codec encodes **into the caller's buffer**, so a
//! worker serialises a row straight into the `ROWS` frame it is building, and decodes from a
//! borrowed `&[u8]` (or from a [`Bytes`] without copying, for the opaque codecs).
//!
//! | [`Codec`] | id | values | cargo feature |
//! |---|---:|---|---|
//! | [`Codec::Raw`] | 0 | byte-like values, carried verbatim | always |
//! | [`Codec::Json`] | 1 | any serde type | `json` (default); `json-sonic`: long strings escaped by sonic-rs |
//! | [`Codec::MsgPack`] | 2 | any serde type (structs as maps) | `msgpack` (default) |
//! | [`Codec::Cbor`] | 3 | any serde type | `cbor` (default) |
//! | [`Codec::ArrowIpc`] | 4 | byte-like values holding an Arrow IPC stream; see the `arrow` module | `arrow` for the helpers |
//! | [`Codec::Protobuf`] | 5 | byte-like values holding an encoded message | always (opaque) |
//! | [`Codec::Private`] | 128-255 | byte-like values, by agreement | always (opaque) |
//!
//! "Byte-like" means a type that serialises through serde's bytes or string model:
//! [`bytes::Bytes`], `serde_bytes::ByteBuf`, `&[u8]`, `Vec<u8>`, `String`, `&str`, `()`.
//! Decoding a [`Bytes`] from a [`Bytes`] body with [`Codec::decode_bytes`] shares the buffer
//! (no copy).
//!
//! ```
//! # #[cfg(feature = "json")] {
//! use wirepool_codec::Codec;
//! #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! struct Decl { i: u64, name: String }
//!
//! let mut frame = Vec::new();
//! Codec::Json.encode(&Decl { i: 7, name: "decl_7".into() }, &mut frame).unwrap();
//! assert_eq!(frame, br#"{"i":7,"name":"decl_7"}"#);
//! let back: Decl = Codec::Json.decode(&frame).unwrap();
//! assert_eq!(back, Decl { i: 7, name: "decl_7".into() });
//!
//! let body = bytes::Bytes::from_static(b"\x00\x01payload");
//! let same: bytes::Bytes = Codec::Raw.decode_bytes(body.clone()).unwrap();
//! assert_eq!(same.as_ptr(), body.as_ptr()); // zero-copy
//! # }
//! ```

#![warn(missing_docs)]

use std::fmt;

use bytes::{BufMut, Bytes};
use serde::de::DeserializeOwned;
use serde::Serialize;

#[cfg(feature = "json-sonic")]
mod json_sonic;
#[cfg(feature = "msgpack")]
mod msgpack;
#[cfg(feature = "msgpack")]
mod no_big_ints;
mod raw;

#[cfg(feature = "arrow")]
pub mod arrow;

/// A codec of the protocol, identified on the wire by its [`id`](Codec::id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Id 0: the value's bytes, verbatim.
    Raw,
    /// Id 1: JSON text (UTF-8).
    Json,
    /// Id 2: MessagePack; structs are written as maps so every language reads field names.
    MsgPack,
    /// Id 3: CBOR.
    Cbor,
    /// Id 4: an Arrow IPC stream, carried opaquely (see the [`arrow`](crate#arrow) helpers).
    ArrowIpc,
    /// Id 5: an encoded Protocol Buffers message, carried opaquely.
    Protobuf,
    /// Ids 128-255: private codecs agreed between a parent and its workers, carried opaquely.
    Private(u8),
}

impl Codec {
    /// Every codec this build can encode and decode with serde types, in id order.
    pub fn available() -> Vec<Codec> {
        [
            Codec::Raw,
            Codec::Json,
            Codec::MsgPack,
            Codec::Cbor,
            Codec::ArrowIpc,
            Codec::Protobuf,
        ]
        .into_iter()
        .filter(|c| c.is_available())
        .collect()
    }

    /// The codec's protocol id (PROTOCOL.md section 7).
    pub const fn id(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Json => 1,
            Codec::MsgPack => 2,
            Codec::Cbor => 3,
            Codec::ArrowIpc => 4,
            Codec::Protobuf => 5,
            Codec::Private(id) => id,
        }
    }

    /// The codec with protocol id `id`; `None` for ids reserved for later versions (6-127).
    pub const fn from_id(id: u8) -> Option<Codec> {
        Some(match id {
            0 => Codec::Raw,
            1 => Codec::Json,
            2 => Codec::MsgPack,
            3 => Codec::Cbor,
            4 => Codec::ArrowIpc,
            5 => Codec::Protobuf,
            128..=255 => Codec::Private(id),
            _ => return None,
        })
    }

    /// The codec's name as used in docs and logs (`raw`, `json`, `msgpack`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Json => "json",
            Codec::MsgPack => "msgpack",
            Codec::Cbor => "cbor",
            Codec::ArrowIpc => "arrow",
            Codec::Protobuf => "protobuf",
            Codec::Private(_) => "private",
        }
    }

    /// Whether this build carries the codec (its cargo feature is on; opaque codecs always are).
    pub const fn is_available(self) -> bool {
        match self {
            Codec::Json => cfg!(feature = "json"),
            Codec::MsgPack => cfg!(feature = "msgpack"),
            Codec::Cbor => cfg!(feature = "cbor"),
            Codec::Raw | Codec::ArrowIpc | Codec::Protobuf | Codec::Private(_) => true,
        }
    }

    /// Whether values travel as their own bytes (raw, Arrow IPC, protobuf, private ids).
    pub const fn is_opaque(self) -> bool {
        matches!(
            self,
            Codec::Raw | Codec::ArrowIpc | Codec::Protobuf | Codec::Private(_)
        )
    }

    /// Appends the encoding of `value` to `out`.
    ///
    /// On error `out` may hold a partial encoding past its original length; callers that build a
    /// frame truncate back to where they started.
    pub fn encode<T, B>(self, value: &T, out: &mut B) -> Result<(), CodecError>
    where
        T: Serialize + ?Sized,
        B: BufMut,
    {
        match self {
            Codec::Raw | Codec::ArrowIpc | Codec::Protobuf | Codec::Private(_) => {
                raw::encode(value, out).map_err(|e| CodecError::encode(self, e))
            }
            #[cfg(feature = "json")]
            Codec::Json => {
                let mut ser = serde_json::Serializer::with_formatter(SmallWrites(out), NoBigInts);
                // `json-sonic`: long strings escaped by sonic-rs (the `json_sonic` module).
                #[cfg(feature = "json-sonic")]
                let done = value.serialize(json_sonic::Fast::new(&mut ser));
                #[cfg(not(feature = "json-sonic"))]
                let done = value.serialize(&mut ser);
                done.map_err(|e| CodecError::encode(self, e))
            }
            #[cfg(feature = "msgpack")]
            Codec::MsgPack => {
                // Named struct fields (as `write_named`), through the wrapper that refuses
                // integers outside the 64-bit range (rmp_serde would write them as binary).
                let mut ser = rmp_serde::Serializer::new(SmallWrites(out)).with_struct_map();
                value
                    .serialize(no_big_ints::NoBigInts(&mut ser))
                    .map_err(|e| CodecError::encode(self, e))
            }
            #[cfg(feature = "cbor")]
            Codec::Cbor => ciborium::into_writer(value, SmallWrites(out))
                .map_err(|e| CodecError::encode(self, e)),
            #[allow(unreachable_patterns)]
            _ => Err(CodecError::unavailable(self)),
        }
    }

    /// Encodes `value` into a new vector.
    pub fn to_vec<T: Serialize + ?Sized>(self, value: &T) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::new();
        self.encode(value, &mut out)?;
        Ok(out)
    }

    /// Encodes `value` into a shared buffer. For the opaque codecs, when `T` is [`Bytes`] the
    /// value itself is returned without copying (a large result goes to the socket as is); an
    /// [`Encoded`] is returned as is for every codec.
    pub fn encode_bytes<T: Serialize + 'static>(self, value: T) -> Result<Bytes, CodecError> {
        let mut slot = Some(value);
        if let Some(encoded) =
            (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<Encoded>>()
        {
            return Ok(encoded.take().expect("slot was just filled").0);
        }
        if self.is_opaque() {
            if let Some(bytes) =
                (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<Bytes>>()
            {
                return Ok(bytes.take().expect("slot was just filled"));
            }
        }
        let mut out = bytes::BytesMut::new();
        self.encode(slot.as_ref().expect("slot was just filled"), &mut out)?;
        Ok(out.freeze())
    }

    /// Decodes a value from `body`. The whole body must be consumed.
    pub fn decode<T: DeserializeOwned>(self, body: &[u8]) -> Result<T, CodecError> {
        match self {
            Codec::Raw | Codec::ArrowIpc | Codec::Protobuf | Codec::Private(_) => {
                raw::decode(body).map_err(|e| CodecError::decode(self, e))
            }
            #[cfg(feature = "json")]
            Codec::Json => {
                // JSON text is UTF-8 (RFC 8259): checked once for the whole value, then parsed
                // with serde_json's `str` reader, which skips the check of every string and key
                // that `from_slice` makes (a call per string: a fifth of a small row's decode).
                let text = std::str::from_utf8(body).map_err(|e| CodecError::decode(self, e))?;
                serde_json::from_str(text).map_err(|e| CodecError::decode(self, e))
            }
            #[cfg(feature = "msgpack")]
            Codec::MsgPack => {
                // The values rows are made of decode in place (the `msgpack` module: the same
                // visitor calls as rmp_serde); anything else, and every error, is rmp_serde's.
                if let Some(value) = msgpack::decode(body) {
                    return Ok(value);
                }
                // Straight from the slice: strings and byte strings are read in place. (The
                // `io::Read` deserializer allocates a scratch buffer per value and copies every
                // string through `read_to_end`: more than half the time of a small row.)
                let mut de = rmp_serde::Deserializer::from_read_ref(body);
                let value = T::deserialize(&mut de).map_err(|e| CodecError::decode(self, e))?;
                // The slice reader does not tell where it stopped: the whole body was the value
                // only if no further marker can be read.
                match <serde::de::IgnoredAny as serde::Deserialize>::deserialize(&mut de) {
                    Err(rmp_serde::decode::Error::InvalidMarkerRead(e))
                        if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        Ok(value)
                    }
                    _ => Err(CodecError::decode(self, "bytes left after the value")),
                }
            }
            #[cfg(feature = "cbor")]
            Codec::Cbor => {
                let mut reader = body;
                let value: T =
                    ciborium::from_reader(&mut reader).map_err(|e| CodecError::decode(self, e))?;
                if !reader.is_empty() {
                    return Err(CodecError::decode(
                        self,
                        format!("{} bytes left after the value", reader.len()),
                    ));
                }
                Ok(value)
            }
            #[allow(unreachable_patterns)]
            _ => Err(CodecError::unavailable(self)),
        }
    }

    /// Decodes a value from a shared buffer. For the opaque codecs, when `T` is [`Bytes`] the
    /// result shares `body` without copying; an [`Encoded`] takes the body as is for every
    /// codec; otherwise this is [`decode`](Codec::decode).
    pub fn decode_bytes<T: DeserializeOwned + 'static>(self, body: Bytes) -> Result<T, CodecError> {
        let mut encoded = Some(Encoded(body));
        if let Some(same) = (&mut encoded as &mut dyn std::any::Any).downcast_mut::<Option<T>>() {
            return Ok(same.take().expect("slot was just filled"));
        }
        let body = encoded.take().expect("slot was just filled").0;
        if self.is_opaque() {
            let mut slot = Some(body);
            if let Some(same) = (&mut slot as &mut dyn std::any::Any).downcast_mut::<Option<T>>() {
                return Ok(same.take().expect("slot was just filled"));
            }
            return self.decode(slot.as_deref().unwrap_or_default());
        }
        self.decode(&body)
    }
}

/// A value already in its wire form, whatever the codec: [`Codec::decode_bytes`] and
/// [`Codec::encode_bytes`] pass it through untouched (no parse, no copy). For proxies, caches
/// and echo servers that forward what they receive.
///
/// ```
/// # #[cfg(feature = "json")] {
/// use wirepool_codec::{Codec, Encoded};
/// let body = bytes::Bytes::from_static(br#"{"any":"json"}"#);
/// let value: Encoded = Codec::Json.decode_bytes(body.clone()).unwrap();
/// assert_eq!(Codec::Json.encode_bytes(value).unwrap(), body);
/// # }
/// ```
///
/// Through serde (e.g. nested inside another type) it is a byte string.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Encoded(pub Bytes);

/// serde_json's compact format, except that an integer outside the 64-bit range (a `u128` or
/// `i128` value above `u64::MAX` or below `i64::MIN`) is an error: the other SDKs' JSON cannot
/// hold it (PROTOCOL.md 22.4, `BAD_REQUEST`), so it is refused, never sent.
#[cfg(feature = "json")]
struct NoBigInts;

#[cfg(feature = "json")]
impl serde_json::ser::Formatter for NoBigInts {
    fn write_i128<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        v: i128,
    ) -> std::io::Result<()> {
        match i64::try_from(v) {
            Ok(v) => self.write_i64(w, v),
            Err(_) => Err(too_big(v)),
        }
    }
    fn write_u128<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        v: u128,
    ) -> std::io::Result<()> {
        match u64::try_from(v) {
            Ok(v) => self.write_u64(w, v),
            Err(_) => Err(too_big(v)),
        }
    }
}

#[cfg(feature = "json")]
fn too_big(v: impl fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("the integer {v} is outside the 64-bit range JSON carries between SDKs"),
    )
}

/// An `io::Write` over a `BufMut` for encoders that write many tiny pieces (serde_json writes
/// quotes, commas and colons one byte at a time; MessagePack and CBOR write one-byte markers): single bytes are pushed inline instead of
/// going through a `memcpy` call each (measured: a fifth of a small JSON row's encode time).
#[cfg(any(feature = "json", feature = "msgpack", feature = "cbor"))]
struct SmallWrites<'a, B>(&'a mut B);

#[cfg(any(feature = "json", feature = "msgpack", feature = "cbor"))]
impl<B: BufMut> std::io::Write for SmallWrites<'_, B> {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if let [byte] = buf {
            self.0.put_u8(*byte);
        } else {
            self.0.put_slice(buf);
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::Private(id) => write!(f, "private({id})"),
            other => f.write_str(other.name()),
        }
    }
}

/// Why a value could not be encoded or decoded.
///
/// A worker reports a decode failure of a request body as `BAD_REQUEST` (202); a parent reports
/// a decode failure of a result, row or summary as `DECODE_FAILED` (306).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    codec: Codec,
    kind: CodecErrorKind,
    message: String,
}

/// What went wrong in a [`CodecError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecErrorKind {
    /// The value could not be serialised (e.g. a struct given to the raw codec).
    Encode,
    /// The bytes are not a valid encoding of the expected type.
    Decode,
    /// The codec's cargo feature is off in this build.
    Unavailable,
}

impl CodecError {
    fn encode(codec: Codec, e: impl fmt::Display) -> Self {
        Self {
            codec,
            kind: CodecErrorKind::Encode,
            message: e.to_string(),
        }
    }
    fn decode(codec: Codec, e: impl fmt::Display) -> Self {
        Self {
            codec,
            kind: CodecErrorKind::Decode,
            message: e.to_string(),
        }
    }
    fn unavailable(codec: Codec) -> Self {
        Self {
            codec,
            kind: CodecErrorKind::Unavailable,
            message: "codec not compiled in (enable its cargo feature)".into(),
        }
    }
    /// The codec that failed.
    pub fn codec(&self) -> Codec {
        self.codec
    }
    /// Whether encoding or decoding failed, or the codec is missing.
    pub fn kind(&self) -> CodecErrorKind {
        self.kind
    }
    /// The underlying library's explanation.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            CodecErrorKind::Encode => "encode",
            CodecErrorKind::Decode => "decode",
            CodecErrorKind::Unavailable => "use",
        };
        write!(
            f,
            "cannot {what} with codec {}: {}",
            self.codec, self.message
        )
    }
}

impl std::error::Error for CodecError {}
