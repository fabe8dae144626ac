//! Stable error codes (PROTOCOL.md section 3) and the typed error of this crate.

use std::fmt;

pub use crate::constants::ErrorCode;

/// Defines [`ErrorCode`] from the generated table (`generated.rs`, the `constants` module).
macro_rules! error_codes {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal => $name:literal, )*) => {
        /// The stable error codes of PROTOCOL.md section 3, shared by every SDK.
        ///
        /// The numbers and names never change. A receiver must still accept codes it does not
        /// know (a later version or an application code): keep those as a raw `u32` and classify
        /// them with [`ErrorClass::of`](crate::ErrorClass::of).
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

// The table itself (variants, codes, names, docs) is `generated.rs`, generated from
// `spec/constants.json`: the `constants` module invokes this macro.

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
