//! Stable error codes (PROTOCOL.md section 3) and the typed error of this crate.

use std::fmt;

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal => $name:literal, )*) => {
        /// The stable error codes of PROTOCOL.md section 3, shared by every SDK.
        ///
        /// The numbers and names never change. A receiver must still accept codes it does not
        /// know (a later version or an application code): keep those as a raw `u32` and classify
        /// them with [`ErrorClass::of`].
        ///
        /// ```
        /// use wirepool_proto::ErrorCode;
        /// assert_eq!(ErrorCode::from_code(121), Some(ErrorCode::RowCountMismatch));
        /// assert_eq!(ErrorCode::RowCountMismatch.name(), "ROW_COUNT_MISMATCH");
        /// assert!(ErrorCode::RowCountMismatch.is_fatal());
        /// assert_eq!(ErrorCode::from_code(1000), None); // application codes are not listed
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant = $code, )*
        }

        impl ErrorCode {
            /// Every code, in numeric order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The numeric code sent on the wire.
            pub const fn code(self) -> u32 {
                self as u32
            }

            /// The stable upper-case name (`"FRAME_TOO_LARGE"`), identical in every SDK.
            pub const fn name(self) -> &'static str {
                match self { $( ErrorCode::$variant => $name, )* }
            }

            /// The code with this number, or `None` for a code this version does not define.
            pub const fn from_code(code: u32) -> Option<ErrorCode> {
                match code { $( $code => Some(ErrorCode::$variant), )* _ => None }
            }

            /// The code with this stable name, or `None`.
            pub fn from_name(name: &str) -> Option<ErrorCode> {
                match name { $( $name => Some(ErrorCode::$variant), )* _ => None }
            }
        }
    };
}

error_codes! {
    /// A protocol violation not covered by a more precise code.
    Protocol = 100 => "PROTOCOL",
    /// End of stream inside a frame.
    Truncated = 101 => "TRUNCATED",
    /// `length` above the current `max_frame_size`.
    FrameTooLarge = 102 => "FRAME_TOO_LARGE",
    /// `type` not in the frame table.
    UnknownFrameType = 103 => "UNKNOWN_FRAME_TYPE",
    /// A reserved flag bit set, or `MORE` on a type that cannot continue.
    BadFlags = 104 => "BAD_FLAGS",
    /// A reserved header or payload field is not zero.
    ReservedNonzero = 105 => "RESERVED_NONZERO",
    /// Payload size or layout wrong for its type.
    BadPayload = 106 => "BAD_PAYLOAD",
    /// A text field is not valid UTF-8.
    BadUtf8 = 107 => "BAD_UTF8",
    /// ROWS count is 0, a row runs past the payload, or bytes are left over.
    RowBounds = 108 => "ROW_BOUNDS",
    /// Wrong direction, a frame before the handshake, a second HELLO/WELCOME.
    UnexpectedFrame = 109 => "UNEXPECTED_FRAME",
    /// Id 0 on a request-level frame, or a non-zero id on a connection-level frame.
    BadId = 110 => "BAD_ID",
    /// REQUEST id not greater than every earlier request id.
    DuplicateId = 111 => "DUPLICATE_ID",
    /// A frame for an id greater than any request sent.
    UnknownId = 112 => "UNKNOWN_ID",
    /// A grant would make a stream's credit exceed 2^31 - 1.
    CreditOverflow = 113 => "CREDIT_OVERFLOW",
    /// ROWS sent while the stream's credit was not positive.
    FlowControl = 114 => "FLOW_CONTROL",
    /// A continued message grew past `max_message_size`.
    MessageTooLarge = 115 => "MESSAGE_TOO_LARGE",
    /// CONTINUATION with no message in progress, or another frame for an id mid-message.
    Continuation = 116 => "CONTINUATION",
    /// HELLO does not start with `WIREPOOL`.
    BadMagic = 117 => "BAD_MAGIC",
    /// No common protocol version.
    VersionMismatch = 118 => "VERSION_MISMATCH",
    /// A HELLO or WELCOME field out of range.
    BadHandshake = 119 => "BAD_HANDSHAKE",
    /// The worker lacks a method or codec the parent requires.
    CodecMismatch = 120 => "CODEC_MISMATCH",
    /// END `row_count` differs from the rows received.
    RowCountMismatch = 121 => "ROW_COUNT_MISMATCH",
    /// ROWS/END/CREDIT on a unary request, RESULT on a stream.
    KindMismatch = 122 => "KIND_MISMATCH",
    /// SHM_REGION breaks a rule: id order, size 0, too many live regions, above the window
    /// (the shared-memory extension, PROTOCOL.md 20.6).
    ShmBadRegion = 123 => "SHM_BAD_REGION",
    /// A region's descriptor is missing, unexpected, truncated, unsealed, not tmpfs, of another
    /// size, or cannot be mapped.
    ShmBadDescriptor = 124 => "SHM_BAD_DESCRIPTOR",
    /// SHM_BODY names a region not live, a range past its end or empty, or bytes above the
    /// window.
    ShmBounds = 125 => "SHM_BOUNDS",
    /// SHM_RELEASE of a range not lent, SHM_RETIRE of a region not live or still lent.
    ShmBadRelease = 126 => "SHM_BAD_RELEASE",
    /// Method index not in the HELLO list.
    UnknownMethod = 200 => "UNKNOWN_METHOD",
    /// The method does not accept this codec.
    CodecUnsupported = 201 => "CODEC_UNSUPPORTED",
    /// The request body could not be decoded.
    BadRequest = 202 => "BAD_REQUEST",
    /// The handler returned or raised an error.
    HandlerError = 203 => "HANDLER_ERROR",
    /// The handler panicked or crashed in a way the SDK caught.
    HandlerPanic = 204 => "HANDLER_PANIC",
    /// The parent cancelled the request.
    Cancelled = 205 => "CANCELLED",
    /// The request's time budget ran out.
    DeadlineExceeded = 206 => "DEADLINE_EXCEEDED",
    /// More requests in flight than `max_in_flight`.
    Overloaded = 207 => "OVERLOADED",
    /// A request arrived after DRAIN.
    Draining = 208 => "DRAINING",
    /// A row does not fit in one frame.
    RowTooLarge = 209 => "ROW_TOO_LARGE",
    /// The worker died or closed the connection.
    WorkerExited = 300 => "WORKER_EXITED",
    /// The worker missed heartbeats and was killed.
    WorkerHung = 301 => "WORKER_HUNG",
    /// No valid HELLO in time.
    StartupTimeout = 302 => "STARTUP_TIMEOUT",
    /// The program could not be started.
    SpawnFailed = 303 => "SPAWN_FAILED",
    /// The pool is shut down.
    PoolClosed = 304 => "POOL_CLOSED",
    /// The leased worker is gone.
    LeaseLost = 305 => "LEASE_LOST",
    /// The parent could not decode a result, row or summary.
    DecodeFailed = 306 => "DECODE_FAILED",
    /// The connection broke with a 1xx code (carried in details).
    ProtocolViolation = 307 => "PROTOCOL_VIOLATION",
    /// A caller's option or argument is out of range, of the wrong type, NaN or infinite;
    /// raised at once, nothing sent (PROTOCOL.md 22.2).
    InvalidArgument = 308 => "INVALID_ARGUMENT",
}

impl ErrorCode {
    /// The class of this code (by its numeric range).
    pub const fn class(self) -> ErrorClass {
        ErrorClass::of(self.code())
    }

    /// True for 1xx codes: the connection must be closed.
    pub const fn is_fatal(self) -> bool {
        matches!(self.class(), ErrorClass::Protocol)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// What a numeric error code means by its range; works for codes this version does not know.
///
/// ```
/// use wirepool_proto::ErrorClass;
/// assert_eq!(ErrorClass::of(150), ErrorClass::Protocol); // unknown 1xx: still fatal
/// assert_eq!(ErrorClass::of(4242), ErrorClass::Application);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// 100-199: protocol violation; the connection is closed.
    Protocol,
    /// 200-299: the request failed; the connection survives.
    Request,
    /// 300-399: a local outcome raised by an SDK, never sent.
    Local,
    /// 1000 and above: a handler's own code.
    Application,
    /// Anything else (0-99, 400-999): treat like a request error.
    Unassigned,
}

impl ErrorClass {
    /// Classify any numeric code.
    pub const fn of(code: u32) -> ErrorClass {
        match code {
            100..=199 => ErrorClass::Protocol,
            200..=299 => ErrorClass::Request,
            300..=399 => ErrorClass::Local,
            1000.. => ErrorClass::Application,
            _ => ErrorClass::Unassigned,
        }
    }
}

/// A typed failure of this crate: a stable [`ErrorCode`], a human message, and the request id it
/// concerns (0 for the connection).
///
/// Every decode or state error is one of these. A 1xx code is fatal to the connection: the
/// driver should send it to the peer ([`crate::Connection::send_fatal`]) and close.
///
/// ```
/// use wirepool_proto::{ErrorCode, ProtocolError};
/// let e = ProtocolError::new(ErrorCode::UnknownId, 9, "frame for id 9, highest request is 4");
/// assert_eq!(e.code, ErrorCode::UnknownId);
/// assert_eq!(e.to_string(), "UNKNOWN_ID (112) on id 9: frame for id 9, highest request is 4");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    /// The stable code.
    pub code: ErrorCode,
    /// What went wrong, for people; never parsed.
    pub message: String,
    /// The request id concerned, or 0 for the connection.
    pub id: u64,
}

impl ProtocolError {
    /// Build an error.
    pub fn new(code: ErrorCode, id: u64, message: impl Into<String>) -> Self {
        ProtocolError {
            code,
            message: message.into(),
            id,
        }
    }

    /// True if the connection must be closed (a 1xx code).
    pub fn is_fatal(&self) -> bool {
        self.code.is_fatal()
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.id == 0 {
            write!(f, "{}: {}", self.code, self.message)
        } else {
            write!(f, "{} on id {}: {}", self.code, self.id, self.message)
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Shorthand used throughout the crate.
pub(crate) fn err(code: ErrorCode, id: u64, message: impl Into<String>) -> ProtocolError {
    ProtocolError::new(code, id, message)
}
