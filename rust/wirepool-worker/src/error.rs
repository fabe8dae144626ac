//! The error a handler ends its request with.

use std::fmt;

use wirepool_proto::ErrorCode;

/// Why a handler failed: becomes an `ERROR` frame for that request only (the worker and its
/// other requests carry on).
///
/// Any `std::error::Error` converts into it with `?` (code `HANDLER_ERROR`, 203). Use
/// [`HandlerError::with_code`] for an application code (>= 1000) and
/// [`HandlerError::with_details`] for structured JSON the parent receives as `details`.
///
/// ```
/// use wirepool_worker::HandlerError;
/// let err = HandlerError::new("no such declaration")
///     .with_code(1404)
///     .with_details(&serde_json::json!({"name": "decl_9"}));
/// assert_eq!(err.code(), 1404);
/// assert_eq!(err.details(), r#"{"name":"decl_9"}"#);
///
/// fn parse(s: &str) -> Result<u64, HandlerError> {
///     Ok(s.parse::<u64>()?) // ParseIntError -> HANDLER_ERROR
/// }
/// assert_eq!(parse("x").unwrap_err().code(), 203);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    code: u32,
    message: String,
    details: String,
}

impl HandlerError {
    /// A `HANDLER_ERROR` (203) with this message.
    pub fn new(message: impl Into<String>) -> HandlerError {
        HandlerError {
            code: ErrorCode::HandlerError.code(),
            message: message.into(),
            details: String::new(),
        }
    }

    /// Use an application error code instead of `HANDLER_ERROR`.
    ///
    /// # Panics
    /// If `code` is below 1000: codes under 1000 belong to the protocol.
    pub fn with_code(mut self, code: u32) -> HandlerError {
        assert!(
            code >= 1000,
            "application error codes start at 1000, got {code}"
        );
        self.code = code;
        self
    }

    /// Attach structured details, sent as JSON text whatever the request's codec.
    pub fn with_details<T: serde::Serialize + ?Sized>(mut self, details: &T) -> HandlerError {
        self.details = serde_json::to_string(details)
            .unwrap_or_else(|e| serde_json::json!({ "details_error": e.to_string() }).to_string());
        self
    }

    /// The numeric code sent to the parent.
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The details as JSON text (empty if none).
    pub fn details(&self) -> &str {
        &self.details
    }

    pub(crate) fn protocol(code: ErrorCode, message: impl Into<String>) -> HandlerError {
        HandlerError {
            code: code.code(),
            message: message.into(),
            details: String::new(),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error {}: {}", self.code, self.message)
    }
}

// Deliberately not `std::error::Error`: that is what allows the blanket conversion below
// (the same trick as `anyhow::Error`).
impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(e: E) -> HandlerError {
        HandlerError::new(e.to_string())
    }
}

/// A row sink refused a row: the stream is over for this handler. Returning it (with `?`)
/// is the normal way to stop; the SDK has already decided the request's terminal (`CANCELLED`,
/// `DEADLINE_EXCEEDED`, `ROW_TOO_LARGE`, ...), so what the handler returns afterwards is ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamClosed {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
}

impl StreamClosed {
    /// Why the stream ended (`CANCELLED`, `DEADLINE_EXCEEDED`, `ROW_TOO_LARGE`, `HANDLER_ERROR`
    /// for a row that could not be encoded, ...).
    pub fn code(&self) -> ErrorCode {
        self.code
    }
}

impl fmt::Display for StreamClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream closed ({}): {}", self.code.name(), self.message)
    }
}

impl std::error::Error for StreamClosed {}
