//! Frame types, the 16-byte header, and decoded frames (PROTOCOL.md section 2).

use bytes::Bytes;

use crate::constants;
use crate::error::{err, ErrorCode, ProtocolError};
use crate::handshake::{Hello, Welcome};

/// Size of every frame header in bytes ([`constants::HEADER_SIZE`]).
pub const HEADER_LEN: usize = constants::HEADER_SIZE;
pub use crate::constants::{
    DEFAULT_HEARTBEAT_MS, DEFAULT_INITIAL_CREDIT, DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_MESSAGE_SIZE,
    FLAG_MORE, HANDSHAKE_MAX_FRAME_SIZE, MAX_CREDIT, MAX_MAX_FRAME_SIZE, PROTOCOL_VERSION,
};

/// Who sends a frame type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Only the worker sends it.
    WorkerToParent,
    /// Only the parent sends it.
    ParentToWorker,
    /// Either side sends it.
    Both,
}

/// What the header `id` of a frame type must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdRule {
    /// Connection-level: always 0.
    Zero,
    /// Request-level: never 0.
    NonZero,
    /// ERROR and EVENT: 0 for the connection, or a request id.
    Any,
}

macro_rules! frame_types {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, $name:literal, $dir:ident, $id:ident, $more:literal, $prefix:literal; )*) => {
        /// The frame types of protocol v1.
        ///
        /// ```
        /// use wirepool_proto::FrameType;
        /// assert_eq!(FrameType::from_u8(0x20), Some(FrameType::Rows));
        /// assert_eq!(FrameType::Rows.name(), "ROWS");
        /// assert!(FrameType::Result.can_continue());
        /// assert!(!FrameType::Rows.can_continue());
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum FrameType {
            $( $(#[$doc])* $variant = $code, )*
        }

        impl FrameType {
            /// Every frame type, in numeric order.
            pub const ALL: &'static [FrameType] = &[$(FrameType::$variant,)*];

            /// The type with this header byte, or `None` (`UNKNOWN_FRAME_TYPE`).
            pub const fn from_u8(byte: u8) -> Option<FrameType> {
                match byte { $( $code => Some(FrameType::$variant), )* _ => None }
            }

            /// The type with this name as written in PROTOCOL.md (`"CONTINUATION"`).
            pub fn from_name(name: &str) -> Option<FrameType> {
                match name { $( $name => Some(FrameType::$variant), )* _ => None }
            }

            /// The name as written in PROTOCOL.md.
            pub const fn name(self) -> &'static str {
                match self { $( FrameType::$variant => $name, )* }
            }

            /// Who may send this type.
            pub const fn direction(self) -> Direction {
                match self { $( FrameType::$variant => Direction::$dir, )* }
            }

            /// What the header id must be.
            pub const fn id_rule(self) -> IdRule {
                match self { $( FrameType::$variant => IdRule::$id, )* }
            }

            /// True if `MORE` is allowed on this type (REQUEST, RESULT, END, CONTINUATION).
            pub const fn can_continue(self) -> bool {
                match self { $( FrameType::$variant => $more, )* }
            }

            /// Bytes of fixed fields a first frame with `MORE` must hold (section 5).
            pub const fn fixed_prefix_len(self) -> usize {
                match self { $( FrameType::$variant => $prefix, )* }
            }
        }
    };
}

frame_types! {
    /// Handshake offer, worker to parent.
    Hello = 0x01, "HELLO", WorkerToParent, Zero, false, 0;
    /// Handshake answer, parent to worker.
    Welcome = 0x02, "WELCOME", ParentToWorker, Zero, false, 0;
    /// A call: method, codec, timeout, body.
    Request = 0x10, "REQUEST", ParentToWorker, NonZero, true, 12;
    /// The parent gives up on a request.
    Cancel = 0x11, "CANCEL", ParentToWorker, NonZero, false, 0;
    /// The unary terminal: the result body.
    Result = 0x12, "RESULT", WorkerToParent, NonZero, true, 0;
    /// An error: terminal for a request (id > 0) or fatal for the connection (id 0).
    Error = 0x13, "ERROR", Both, Any, false, 0;
    /// A batch of length-prefixed rows of a stream.
    Rows = 0x20, "ROWS", WorkerToParent, NonZero, false, 0;
    /// The stream terminal: total row count and summary.
    End = 0x21, "END", WorkerToParent, NonZero, true, 8;
    /// The parent grants stream credit, in bytes.
    Credit = 0x22, "CREDIT", ParentToWorker, NonZero, false, 0;
    /// A progress report or notification.
    Event = 0x30, "EVENT", WorkerToParent, Any, false, 0;
    /// Heartbeat probe.
    Ping = 0x31, "PING", Both, Zero, false, 0;
    /// Heartbeat answer.
    Pong = 0x32, "PONG", Both, Zero, false, 0;
    /// The parent asks the worker to finish and leave.
    Drain = 0x40, "DRAIN", ParentToWorker, Zero, false, 0;
    /// The worker's last frame.
    Goodbye = 0x41, "GOODBYE", WorkerToParent, Zero, false, 0;
    /// The next chunk of a continued message.
    Continuation = 0x7F, "CONTINUATION", Both, NonZero, true, 0;
}

/// A parsed and checked frame header.
///
/// ```
/// use wirepool_proto::{FrameType, Header};
/// let h = Header { length: 0, frame_type: FrameType::Cancel, more: false, id: 7 };
/// let bytes = h.to_bytes();
/// assert_eq!(Header::parse(&bytes, 65_536).unwrap(), h);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload bytes after the header.
    pub length: u32,
    /// The frame type.
    pub frame_type: FrameType,
    /// The `MORE` flag.
    pub more: bool,
    /// The request id, or 0.
    pub id: u64,
}

impl Header {
    /// Parse and check the 16 header bytes: type, flags, reserved, `length <= max_frame_size`,
    /// and the id rule of the type. Everything else needs the payload.
    pub fn parse(bytes: &[u8; HEADER_LEN], max_frame_size: u32) -> Result<Header, ProtocolError> {
        let length = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let id = u64::from_le_bytes([
            bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15],
        ]);
        // The length is checked first: the spec asks for it "as soon as the 16 header bytes are
        // in", and it is the check that protects memory.
        if length > max_frame_size {
            return Err(err(
                ErrorCode::FrameTooLarge,
                id,
                format!("frame length {length} above max_frame_size {max_frame_size}"),
            ));
        }
        let frame_type = FrameType::from_u8(bytes[4]).ok_or_else(|| {
            err(
                ErrorCode::UnknownFrameType,
                id,
                format!("unknown frame type 0x{:02x}", bytes[4]),
            )
        })?;
        let flags = bytes[5];
        if flags & !FLAG_MORE != 0 {
            return Err(err(
                ErrorCode::BadFlags,
                id,
                format!("reserved flag bits set: 0x{flags:02x}"),
            ));
        }
        let more = flags & FLAG_MORE != 0;
        if more && !frame_type.can_continue() {
            return Err(err(
                ErrorCode::BadFlags,
                id,
                format!("MORE set on {}, which cannot continue", frame_type.name()),
            ));
        }
        if bytes[6] != 0 || bytes[7] != 0 {
            return Err(err(
                ErrorCode::ReservedNonzero,
                id,
                "reserved header field is not zero",
            ));
        }
        match (frame_type.id_rule(), id) {
            (IdRule::Zero, 0) | (IdRule::Any, _) => {}
            (IdRule::NonZero, id) if id != 0 => {}
            (IdRule::Zero, _) => {
                return Err(err(
                    ErrorCode::BadId,
                    id,
                    format!("{} is connection-level, id must be 0", frame_type.name()),
                ))
            }
            (IdRule::NonZero, _) => {
                return Err(err(
                    ErrorCode::BadId,
                    0,
                    format!("{} is request-level, id must not be 0", frame_type.name()),
                ))
            }
        }
        Ok(Header {
            length,
            frame_type,
            more,
            id,
        })
    }

    /// The 16 wire bytes of this header.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&self.length.to_le_bytes());
        out[4] = self.frame_type as u8;
        out[5] = if self.more { FLAG_MORE } else { 0 };
        out[8..16].copy_from_slice(&self.id.to_le_bytes());
        out
    }
}

/// A decoded, fully checked frame. Cheap to clone and `Send + 'static`: byte fields are
/// [`Bytes`] slices of the receive buffer, so a frame can move to another task without a copy.
///
/// ```
/// use wirepool_proto::{Frame, FrameBody, FrameDecoder};
/// let mut out = Vec::new();
/// Frame::new(3, FrameBody::Cancel).encode(&mut out).unwrap();
/// let mut dec = FrameDecoder::new(65_536);
/// dec.receive(&out);
/// let frame = dec.next_frame().unwrap().unwrap();
/// assert_eq!(frame.id, 3);
/// assert!(matches!(frame.body, FrameBody::Cancel));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The request id, or 0.
    pub id: u64,
    /// The `MORE` flag: a CONTINUATION follows.
    pub more: bool,
    /// The typed payload.
    pub body: FrameBody,
}

impl Frame {
    /// A frame without `MORE`.
    pub fn new(id: u64, body: FrameBody) -> Frame {
        Frame {
            id,
            more: false,
            body,
        }
    }

    /// The frame type of the body.
    pub fn frame_type(&self) -> FrameType {
        self.body.frame_type()
    }
}

/// The typed payload of a frame. For a first frame with `MORE`, `body`/`summary` hold only the
/// first chunk (see [`crate::Connection`] for reassembled messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameBody {
    /// HELLO (boxed: it is large and rare).
    Hello(Box<Hello>),
    /// WELCOME.
    Welcome(Welcome),
    /// REQUEST.
    Request {
        /// Index into the HELLO method list.
        method: u16,
        /// Codec id of body, result, rows and summary.
        codec: u8,
        /// Time budget in microseconds, 0 for none.
        timeout_us: u64,
        /// Encoded arguments.
        body: Bytes,
    },
    /// CANCEL.
    Cancel,
    /// RESULT.
    Result {
        /// Encoded result.
        body: Bytes,
    },
    /// ERROR.
    Error {
        /// Numeric code; may be one this version does not know ([`crate::ErrorClass::of`]).
        code: u32,
        /// Human-readable text.
        message: String,
        /// JSON text, or empty.
        details: String,
    },
    /// ROWS.
    Rows(RowsPayload),
    /// END.
    End {
        /// Rows sent by the stream in total.
        row_count: u64,
        /// Encoded summary, may be empty.
        summary: Bytes,
    },
    /// CREDIT.
    Credit {
        /// Bytes of ROWS payload granted, at least 1.
        bytes: u32,
    },
    /// EVENT.
    Event {
        /// 1-255 bytes of UTF-8.
        topic: String,
        /// JSON text, may be empty.
        data: String,
    },
    /// PING.
    Ping {
        /// Echoed by the PONG.
        nonce: [u8; 8],
    },
    /// PONG.
    Pong {
        /// Copied from the PING.
        nonce: [u8; 8],
    },
    /// DRAIN.
    Drain {
        /// How long in-flight requests may still run.
        grace_ms: u32,
    },
    /// GOODBYE.
    Goodbye {
        /// 0 drained, 1 parent gone, 2 leaving by itself, 3 fatal error; others accepted.
        reason: u32,
    },
    /// CONTINUATION.
    Continuation {
        /// The next chunk of the message.
        chunk: Bytes,
    },
}

impl FrameBody {
    /// The frame type of this payload.
    pub fn frame_type(&self) -> FrameType {
        match self {
            FrameBody::Hello(_) => FrameType::Hello,
            FrameBody::Welcome(_) => FrameType::Welcome,
            FrameBody::Request { .. } => FrameType::Request,
            FrameBody::Cancel => FrameType::Cancel,
            FrameBody::Result { .. } => FrameType::Result,
            FrameBody::Error { .. } => FrameType::Error,
            FrameBody::Rows(_) => FrameType::Rows,
            FrameBody::End { .. } => FrameType::End,
            FrameBody::Credit { .. } => FrameType::Credit,
            FrameBody::Event { .. } => FrameType::Event,
            FrameBody::Ping { .. } => FrameType::Ping,
            FrameBody::Pong { .. } => FrameType::Pong,
            FrameBody::Drain { .. } => FrameType::Drain,
            FrameBody::Goodbye { .. } => FrameType::Goodbye,
            FrameBody::Continuation { .. } => FrameType::Continuation,
        }
    }
}

/// The payload of a ROWS frame, checked: `count >= 1` rows that fill it exactly. Iterating
/// slices the rows out of the frame; nothing is copied or allocated.
///
/// ```
/// use wirepool_proto::RowsPayload;
/// let mut payload = Vec::new();
/// payload.extend_from_slice(&2u32.to_le_bytes());
/// for row in [&b"ab"[..], b"c"] {
///     payload.extend_from_slice(&(row.len() as u32).to_le_bytes());
///     payload.extend_from_slice(row);
/// }
/// let rows = RowsPayload::parse(payload.into()).unwrap();
/// assert_eq!(rows.count(), 2);
/// assert_eq!(rows.iter().collect::<Vec<_>>(), vec![&b"ab"[..], b"c"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowsPayload {
    count: u32,
    payload: Bytes,
}

impl RowsPayload {
    /// Check a ROWS payload (`ROW_BOUNDS` or `BAD_PAYLOAD` on failure).
    pub fn parse(payload: Bytes) -> Result<RowsPayload, ProtocolError> {
        let count = check_rows(&payload)?;
        Ok(RowsPayload { count, payload })
    }

    /// Number of rows (at least 1).
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The whole payload (`count u32`, then the rows), as on the wire. Its length is what a
    /// ROWS frame costs in stream credit.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// Iterate the rows as borrowed slices.
    pub fn iter(&self) -> RowIter<'_> {
        RowIter {
            rest: &self.payload[4..],
            left: self.count,
        }
    }

    /// Iterate the rows as [`Bytes`] that share the frame's buffer (a reference-count increment
    /// per row; prefer [`RowsPayload::iter`] on hot paths).
    pub fn iter_bytes(&self) -> impl Iterator<Item = Bytes> + '_ {
        self.iter().map(move |row| self.payload.slice_ref(row))
    }
}

impl<'a> IntoIterator for &'a RowsPayload {
    type Item = &'a [u8];
    type IntoIter = RowIter<'a>;
    fn into_iter(self) -> RowIter<'a> {
        self.iter()
    }
}

/// Iterator over the rows of a checked [`RowsPayload`].
#[derive(Debug, Clone)]
pub struct RowIter<'a> {
    rest: &'a [u8],
    left: u32,
}

impl<'a> Iterator for RowIter<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        // The payload was checked by `check_rows`, so the `get`s below cannot fail; they keep
        // the code free of panics and `unsafe` at the cost of a predictable branch.
        if self.left == 0 {
            return None;
        }
        let (len, rest) = self.rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let row = rest.get(..len)?;
        self.rest = &rest[len..];
        self.left -= 1;
        Some(row)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for RowIter<'_> {}

/// Check the ROWS layout and return the row count.
pub(crate) fn check_rows(payload: &[u8]) -> Result<u32, ProtocolError> {
    let Some((count, mut rest)) = payload.split_first_chunk::<4>() else {
        return Err(err(
            ErrorCode::BadPayload,
            0,
            "ROWS payload shorter than its count",
        ));
    };
    let count = u32::from_le_bytes(*count);
    if count == 0 {
        return Err(err(ErrorCode::RowBounds, 0, "ROWS count is 0"));
    }
    // Each row needs at least its 4-byte length: a larger count cannot be honest.
    if count as usize > rest.len() / 4 {
        return Err(err(
            ErrorCode::RowBounds,
            0,
            format!(
                "ROWS count {count} cannot fit in {} payload bytes",
                payload.len()
            ),
        ));
    }
    for index in 0..count {
        let Some((len, after)) = rest.split_first_chunk::<4>() else {
            return Err(err(
                ErrorCode::RowBounds,
                0,
                format!("row {index} length runs past the payload"),
            ));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if len > after.len() {
            return Err(err(
                ErrorCode::RowBounds,
                0,
                format!("row {index} runs past the payload"),
            ));
        }
        rest = &after[len..];
    }
    if !rest.is_empty() {
        return Err(err(
            ErrorCode::RowBounds,
            0,
            format!("{} bytes left over after {count} rows", rest.len()),
        ));
    }
    Ok(count)
}
