//! Typed errors with the stable codes of PROTOCOL.md section 3.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Stable numeric error codes (PROTOCOL.md section 3), the same in every SDK: the numbers of
/// [`wirepool_proto::ErrorCode`], as `u32` constants to match [`Error::code`] against.
pub mod codes {
    use wirepool_proto::ErrorCode;

    /// A protocol violation not covered by a more precise code.
    pub const PROTOCOL: u32 = ErrorCode::Protocol.code();
    /// The worker lacks a method or codec the parent requires.
    pub const CODEC_MISMATCH: u32 = ErrorCode::CodecMismatch.code();
    /// Method index not in the worker's HELLO list.
    pub const UNKNOWN_METHOD: u32 = ErrorCode::UnknownMethod.code();
    /// The method does not accept this codec.
    pub const CODEC_UNSUPPORTED: u32 = ErrorCode::CodecUnsupported.code();
    /// The request body could not be decoded by the worker.
    pub const BAD_REQUEST: u32 = ErrorCode::BadRequest.code();
    /// The handler returned or raised an error.
    pub const HANDLER_ERROR: u32 = ErrorCode::HandlerError.code();
    /// The handler panicked.
    pub const HANDLER_PANIC: u32 = ErrorCode::HandlerPanic.code();
    /// The request was cancelled.
    pub const CANCELLED: u32 = ErrorCode::Cancelled.code();
    /// The request's time budget ran out.
    pub const DEADLINE_EXCEEDED: u32 = ErrorCode::DeadlineExceeded.code();
    /// More requests in flight than the worker accepts.
    pub const OVERLOADED: u32 = ErrorCode::Overloaded.code();
    /// A request arrived after DRAIN.
    pub const DRAINING: u32 = ErrorCode::Draining.code();
    /// A row does not fit in one frame.
    pub const ROW_TOO_LARGE: u32 = ErrorCode::RowTooLarge.code();
    /// The worker died or closed the connection.
    pub const WORKER_EXITED: u32 = ErrorCode::WorkerExited.code();
    /// The worker missed heartbeats and was killed.
    pub const WORKER_HUNG: u32 = ErrorCode::WorkerHung.code();
    /// No valid HELLO in time.
    pub const STARTUP_TIMEOUT: u32 = ErrorCode::StartupTimeout.code();
    /// The program could not be started.
    pub const SPAWN_FAILED: u32 = ErrorCode::SpawnFailed.code();
    /// The pool is shut down (or gave up restarting workers).
    pub const POOL_CLOSED: u32 = ErrorCode::PoolClosed.code();
    /// The leased worker is gone.
    pub const LEASE_LOST: u32 = ErrorCode::LeaseLost.code();
    /// The parent could not decode a result, row or summary.
    pub const DECODE_FAILED: u32 = ErrorCode::DecodeFailed.code();
    /// The connection broke with a 1xx code.
    pub const PROTOCOL_VIOLATION: u32 = ErrorCode::ProtocolViolation.code();
    /// A message above `max_message_size` (a request refused locally, PROTOCOL.md 22.4).
    pub const MESSAGE_TOO_LARGE: u32 = ErrorCode::MessageTooLarge.code();
    /// A caller's option or argument is out of range (PROTOCOL.md 22.2); nothing was sent.
    pub const INVALID_ARGUMENT: u32 = ErrorCode::InvalidArgument.code();
}

/// A caller's string as error messages quote it (PROTOCOL.md 22.4): at most
/// `quoted_max_chars` (200) characters, and the original length when it was cut.
pub(crate) fn quote(s: &str) -> String {
    match s.char_indices().nth(crate::validate::QUOTED_MAX_CHARS) {
        None => format!("{s:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &s[..end], s.len()),
    }
}

/// A message that may carry a caller's value (a codec's error), cut as [`quote`] cuts.
pub(crate) fn cut(s: &str) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(crate::validate::QUOTED_MAX_CHARS) {
        None => s.into(),
        Some((end, _)) => format!("{}... ({} bytes)", &s[..end], s.len()).into(),
    }
}

/// Why a worker process ended, as seen by the parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExitCause {
    /// It exited or crashed on its own.
    Crashed,
    /// It missed heartbeats and was killed.
    Hung,
    /// It broke the protocol and was disconnected.
    ProtocolViolation,
    /// It did not finish a cancelled request within the grace period and was killed.
    CancelTimeout,
    /// It was drained and replaced after serving its request quota.
    RecycledRequests,
    /// It was drained and replaced because its RSS went above the ceiling.
    RecycledRss,
    /// It was drained and replaced after being idle.
    RecycledIdle,
    /// It left by itself (GOODBYE reason 2).
    LeftByItself,
    /// The pool shut down.
    Shutdown,
}

impl ExitCause {
    /// A short stable name, used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitCause::Crashed => "crashed",
            ExitCause::Hung => "hung",
            ExitCause::ProtocolViolation => "protocol_violation",
            ExitCause::CancelTimeout => "cancel_timeout",
            ExitCause::RecycledRequests => "recycled_requests",
            ExitCause::RecycledRss => "recycled_rss",
            ExitCause::RecycledIdle => "recycled_idle",
            ExitCause::LeftByItself => "left_by_itself",
            ExitCause::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for ExitCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a worker process ended: exit status or signal, and the last lines of its stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    /// The pool's name for the worker (its slot's incarnation id).
    pub worker_id: u32,
    /// The worker's process id.
    pub pid: u32,
    /// The exit code, if it exited normally.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// Why the parent thinks it ended.
    pub cause: ExitCause,
    /// The last lines the worker wrote to stderr, oldest first.
    pub stderr_tail: Vec<String>,
    /// Where a remote worker ran: the peer address the pool saw (PROTOCOL.md 21.6); `None` for
    /// a local worker. `pid` is then its process id on that machine, from its HELLO.
    pub host: Option<String>,
    /// A remote worker's connection dropped before its GOODBYE: its exit status and signal are
    /// unknown (PROTOCOL.md 21.6).
    pub connection_lost: bool,
    /// How many times the failed request was sent: 1, or more when the pool's retry policy
    /// sent it again after its worker died (PROTOCOL.md 21.7); this record is then the last
    /// attempt's worker. A worker's own record (a lease's, a start failure's) says 1.
    pub attempts: u32,
}

impl fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Some(host) => write!(f, "worker {} at {host} (pid {}) ", self.worker_id, self.pid)?,
            None => write!(f, "worker {} (pid {}) ", self.worker_id, self.pid)?,
        }
        match (self.code, self.signal) {
            (Some(c), _) => write!(f, "exited with status {c}")?,
            (None, Some(s)) => write!(f, "killed by signal {s}")?,
            (None, None) if self.connection_lost => write!(f, "lost its connection")?,
            (None, None) => write!(f, "ended")?,
        }
        write!(f, " [{}]", self.cause)?;
        if self.attempts > 1 {
            write!(f, " after {} attempts", self.attempts)?;
        }
        match self.stderr_tail.last() {
            Some(last) => write!(f, "; last stderr line: {last:?}")?,
            // Status 0, silent, no GOODBYE: a program that ended without serving (issue 28).
            None if self.code == Some(0) && self.cause == ExitCause::Crashed => write!(
                f,
                " (did the worker program call its SDK's serve, or return from it?)"
            )?,
            None => {}
        }
        Ok(())
    }
}

/// Every way a call, a stream or the pool itself can fail.
///
/// Each variant has a stable numeric [`code`](Error::code) from PROTOCOL.md section 3, so a
/// program can match on either.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The worker ended the request with an error (codes 200-299, or an application code >= 1000).
    #[error("worker error {code}: {message}")]
    Remote {
        /// The stable code the worker sent.
        code: u32,
        /// Human-readable message.
        message: String,
        /// JSON details, or empty.
        details: String,
    },
    /// The parent's own deadline for the call passed (the worker was told to stop).
    #[error("deadline of {0:?} exceeded")]
    DeadlineExceeded(Duration),
    /// The worker serving the request died or closed the connection (code 300).
    #[error("{0}")]
    WorkerExited(Arc<ExitInfo>),
    /// The worker missed heartbeats and was killed (code 301).
    #[error("hung: {0}")]
    WorkerHung(Arc<ExitInfo>),
    /// A worker did not complete its handshake in time (code 302).
    #[error("no valid HELLO within {after:?}; stderr tail: {stderr_tail:?}")]
    StartupTimeout {
        /// The start-up timeout.
        after: Duration,
        /// The last lines the worker wrote to stderr.
        stderr_tail: Vec<String>,
    },
    /// The program could not be started (code 303).
    #[error("cannot start {program:?}: {source}")]
    SpawnFailed {
        /// The program that failed to start.
        program: String,
        /// The operating system's error.
        source: Arc<std::io::Error>,
    },
    /// The pool is shut down, or gave up restarting workers (code 304).
    #[error("pool closed: {0}")]
    PoolClosed(&'static str),
    /// The leased worker is gone (code 305); `None` when it was retired by the pool.
    #[error("lease lost: {}", .0.as_ref().map(|e| e.to_string()).unwrap_or_else(|| "worker retired".into()))]
    LeaseLost(Option<Arc<ExitInfo>>),
    /// The parent could not decode a result, row or summary (code 306).
    #[error("cannot decode {what}: {message}")]
    Decode {
        /// What was being decoded: `result`, `row`, `summary`, `error details`.
        what: &'static str,
        /// The codec's message.
        message: String,
    },
    /// The connection broke with a protocol error (code 307; the 1xx code is in `code`).
    #[error("protocol violation {code} on worker {worker_id}: {message}")]
    ProtocolViolation {
        /// The 1xx code.
        code: u32,
        /// What went wrong.
        message: String,
        /// The worker concerned.
        worker_id: u32,
        /// How the worker ended, once it was disconnected and reaped (`None` for a request the
        /// local core refused to send).
        exit: Option<Arc<ExitInfo>>,
    },
    /// The worker lacks a method or codec the pool is configured to call (code 120, at start-up).
    #[error("codec mismatch: {}", cut(.0))]
    CodecMismatch(String),
    /// The called method is not offered by the workers, or has the other kind (code 200).
    #[error("unknown method {}", quote(.0))]
    UnknownMethod(String),
    /// The request could not be encoded with the chosen codec (code 202).
    #[error("cannot encode request: {}", cut(.0))]
    Encode(String),
    /// A request above the pool's `max_message_size`, refused locally before anything was sent
    /// (code 115, PROTOCOL.md 22.4): the connection and the worker live on.
    #[error("request too large: {0}")]
    MessageTooLarge(String),
    /// A caller's option or argument is out of its range (code 308, PROTOCOL.md 22.2): raised
    /// by [`PoolBuilder::start`](crate::PoolBuilder::start) before any worker is spawned, or by
    /// the call before anything is sent.
    #[error("invalid argument {option}: {message}")]
    InvalidArgument {
        /// The option or argument, by its name in PROTOCOL.md 22.2.
        option: &'static str,
        /// Its range, and the value given (quoted as in 22.4).
        message: String,
    },
}

impl Error {
    /// The stable numeric code of PROTOCOL.md section 3.
    pub fn code(&self) -> u32 {
        match self {
            Error::Remote { code, .. } => *code,
            Error::DeadlineExceeded(_) => codes::DEADLINE_EXCEEDED,
            Error::WorkerExited(_) => codes::WORKER_EXITED,
            Error::WorkerHung(_) => codes::WORKER_HUNG,
            Error::StartupTimeout { .. } => codes::STARTUP_TIMEOUT,
            Error::SpawnFailed { .. } => codes::SPAWN_FAILED,
            Error::PoolClosed(_) => codes::POOL_CLOSED,
            Error::LeaseLost(_) => codes::LEASE_LOST,
            Error::Decode { .. } => codes::DECODE_FAILED,
            Error::ProtocolViolation { .. } => codes::PROTOCOL_VIOLATION,
            Error::CodecMismatch(_) => codes::CODEC_MISMATCH,
            Error::UnknownMethod(_) => codes::UNKNOWN_METHOD,
            Error::Encode(_) => codes::BAD_REQUEST,
            Error::InvalidArgument { .. } => codes::INVALID_ARGUMENT,
            Error::MessageTooLarge(_) => codes::MESSAGE_TOO_LARGE,
        }
    }

    /// A worker's death that a retry policy may send again after (PROTOCOL.md 21.7).
    pub(crate) fn is_worker_death(&self) -> bool {
        matches!(self, Error::WorkerExited(_) | Error::WorkerHung(_))
    }

    /// The outcome of the last of `attempts` tries (PROTOCOL.md 21.7: the number of attempts in
    /// its details): a worker's death says it in its [`ExitInfo::attempts`], a worker's error
    /// as `"attempts"` in its JSON details (an object, or none before). Unchanged for one try.
    pub(crate) fn with_attempts(self, attempts: u32) -> Self {
        if attempts <= 1 {
            return self;
        }
        let counted = |info: Arc<ExitInfo>| {
            let mut info = Arc::unwrap_or_clone(info);
            info.attempts = attempts;
            Arc::new(info)
        };
        match self {
            Error::WorkerExited(info) => Error::WorkerExited(counted(info)),
            Error::WorkerHung(info) => Error::WorkerHung(counted(info)),
            Error::Remote {
                code,
                message,
                details,
            } => {
                let details = match serde_json::from_str::<serde_json::Value>(&details) {
                    _ if details.trim().is_empty() => {
                        serde_json::json!({ "attempts": attempts }).to_string()
                    }
                    Ok(serde_json::Value::Object(mut map)) => {
                        map.insert("attempts".into(), attempts.into());
                        serde_json::Value::Object(map).to_string()
                    }
                    // Not an object: the worker's details stay as they were.
                    _ => details,
                };
                Error::Remote {
                    code,
                    message,
                    details,
                }
            }
            other => other,
        }
    }

    /// How the worker ended, for errors caused by a worker's death.
    pub fn exit_info(&self) -> Option<&ExitInfo> {
        match self {
            Error::WorkerExited(e) | Error::WorkerHung(e) => Some(e),
            Error::LeaseLost(Some(e)) => Some(e),
            Error::ProtocolViolation { exit: Some(e), .. } => Some(e),
            _ => None,
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
