//! wirepool error codes to HTTP statuses, and the JSON error body.

use bytes::Bytes;
use http::StatusCode;
use wirepool::codes;

/// 499: the client closed the request (nginx's convention), for `CANCELLED` (205).
pub const CLIENT_CLOSED_REQUEST: u16 = 499;

/// The HTTP status of a wirepool error code (PROTOCOL.md section 3); the table of the README.
///
/// ```
/// use wirepool_gateway::status_of_code;
/// assert_eq!(status_of_code(200), 404); // UNKNOWN_METHOD
/// assert_eq!(status_of_code(206), 504); // DEADLINE_EXCEEDED
/// assert_eq!(status_of_code(1001), 422); // the application's own code
/// ```
pub fn status_of_code(code: u32) -> u16 {
    match code {
        codes::UNKNOWN_METHOD => 404,
        codes::CODEC_UNSUPPORTED => 415,
        codes::BAD_REQUEST | codes::INVALID_ARGUMENT => 400,
        codes::HANDLER_ERROR | codes::HANDLER_PANIC => 500,
        codes::CANCELLED => CLIENT_CLOSED_REQUEST,
        codes::DEADLINE_EXCEEDED => 504,
        codes::OVERLOADED
        | codes::DRAINING
        | codes::POOL_CLOSED
        | codes::STARTUP_TIMEOUT
        | codes::SPAWN_FAILED => 503,
        codes::MESSAGE_TOO_LARGE => 413,
        1000.. => 422,
        // Every other code: the worker or the wire failed (ROW_TOO_LARGE, WORKER_EXITED,
        // WORKER_HUNG, LEASE_LOST, DECODE_FAILED, PROTOCOL_VIOLATION, the 1xx codes).
        _ => 502,
    }
}

/// The stable name of a code: the protocol's (`"DEADLINE_EXCEEDED"`), `"APPLICATION"` for the
/// codes >= 1000, `"UNKNOWN"` otherwise.
pub fn name_of_code(code: u32) -> &'static str {
    match wirepool_proto::ErrorCode::from_code(code) {
        Some(c) => c.name(),
        None if code >= 1000 => "APPLICATION",
        None => "UNKNOWN",
    }
}

/// Longest message put in an error body, in bytes (cut on a character boundary).
pub const MAX_MESSAGE_BYTES: usize = 512;

pub(crate) fn cut(text: &str) -> &str {
    if text.len() <= MAX_MESSAGE_BYTES {
        return text;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `{"code":..,"name":..,"message":..}`, the message bounded.
pub(crate) fn error_json(code: u32, name: &str, message: &str) -> Bytes {
    let body = serde_json::json!({ "code": code, "name": name, "message": cut(message) });
    Bytes::from(body.to_string())
}

/// The error body of a wirepool error: its code, name and (bounded) message.
pub(crate) fn pool_error_json(err: &wirepool::Error) -> Bytes {
    let code = err.code();
    let message = match err {
        // The handler's own message, not the Display text around it.
        wirepool::Error::Remote { message, .. } => message.clone(),
        other => other.to_string(),
    };
    error_json(code, name_of_code(code), &message)
}

/// A gateway-level refusal (not a worker's): its status, stable name and message.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub status: StatusCode,
    pub name: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, name: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            status,
            name,
            message: message.into(),
        }
    }

    /// Gateway refusals have code 0 in their body: they never reached the pool.
    pub fn body(&self) -> Bytes {
        error_json(0, self.name, &self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_code_has_one_status() {
        for c in wirepool_proto::ErrorCode::ALL {
            let s = status_of_code(c.code());
            assert!((400..600).contains(&s), "{c}: {s}");
        }
        assert_eq!(status_of_code(codes::WORKER_EXITED), 502);
        assert_eq!(status_of_code(codes::PROTOCOL_VIOLATION), 502);
        assert_eq!(status_of_code(codes::CANCELLED), 499);
        assert_eq!(name_of_code(1500), "APPLICATION");
        assert_eq!(name_of_code(206), "DEADLINE_EXCEEDED");
    }

    #[test]
    fn messages_are_cut_on_a_char_boundary() {
        let long = "\u{e9}".repeat(1000);
        let c = cut(&long);
        assert!(c.len() <= MAX_MESSAGE_BYTES && c.chars().all(|ch| ch == '\u{e9}'));
    }
}
