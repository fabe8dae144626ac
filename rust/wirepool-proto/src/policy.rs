//! The policies of PROTOCOL.md 14.5: every number a driver would otherwise derive from the
//! handshake or a stream's state, as pure functions, the same rule in every SDK
//! (`spec/vectors/policies.json` pins them). A driver calls these and uses their answers.

use std::borrow::Cow;
use std::fmt;

use crate::constants::{
    DEFAULT_HEARTBEAT_MS, ERROR_MESSAGE_MAX_BYTES, GROW_WITHIN_RTTS, MAX_COUNT, MAX_CREDIT,
    MAX_MAX_FRAME_SIZE, MAX_SIZE, MAX_TIMEOUT_MS, MIN_MAX_FRAME_SIZE, PROTOCOL_VERSION,
    SHRINK_AFTER_RTTS,
};
use crate::error::{err, ErrorCode, ProtocolError};
use crate::handshake::{choose_version, Hello, Welcome, WelcomeExtensions};

/// What the parent offers a worker in [`negotiate`]: its configured limits (22.2's ranges are
/// checked by [`negotiate`], so the fields are wide enough to hold any value a caller gave).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offer {
    /// The parent's `max_frame_size` (65,536 - 16,777,216).
    pub max_frame_size: i64,
    /// The stream window, `initial_credit` (1 - 2^31 - 1).
    pub initial_credit: i64,
    /// The PING period in milliseconds (0 - `max_timeout_ms`; 0 turns heartbeats off locally).
    pub heartbeat_ms: i64,
    /// The most requests in flight (1 - 2^32 - 1).
    pub max_in_flight: i64,
    /// The largest message (`max_frame_size` - 2^53 - 1).
    pub max_message_size: i64,
    /// The parent's name for this worker.
    pub worker_id: u32,
    /// Whether the connection is remote (section 21: it always has a heartbeat).
    pub remote: bool,
}

/// Why [`negotiate`] refused: the error and, for `INVALID_ARGUMENT`, the first offer field out of
/// its range (its name as in [`Offer`] and `spec/vectors/policies.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiateError {
    /// `INVALID_ARGUMENT` (a bad offer) or `VERSION_MISMATCH`.
    pub error: ProtocolError,
    /// The offer field out of range, for `INVALID_ARGUMENT`.
    pub field: Option<&'static str>,
}

impl fmt::Display for NegotiateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for NegotiateError {}

impl From<NegotiateError> for ProtocolError {
    fn from(e: NegotiateError) -> ProtocolError {
        e.error
    }
}

/// The WELCOME for `hello` given the parent's `offer` (PROTOCOL.md 14.5), and whether
/// `max_in_flight` was clamped to the worker's `max_concurrency` (the driver logs that once per
/// pool). Extensions are the driver's to add.
///
/// Each offer field is checked first, in the order of [`Offer`], against its range:
/// `INVALID_ARGUMENT` naming the field. Then `VERSION_MISMATCH` when the worker does not speak
/// version 1.
///
/// ```
/// use wirepool_proto::{negotiate, Hello, Offer};
/// let hello = Hello { max_concurrency: 8, ..Hello::new("sdk", "1") };
/// let offer = Offer {
///     max_frame_size: 4_194_304,
///     initial_credit: 1_048_576,
///     heartbeat_ms: 1_000,
///     max_in_flight: 100,
///     max_message_size: 1 << 30,
///     worker_id: 1,
///     remote: false,
/// };
/// let (welcome, clamped) = negotiate(&hello, &offer).unwrap();
/// assert_eq!((welcome.max_in_flight, clamped), (8, true));
/// ```
pub fn negotiate(hello: &Hello, offer: &Offer) -> Result<(Welcome, bool), NegotiateError> {
    let checks: [(&str, i64, i64, i64); 5] = [
        (
            "max_frame_size",
            offer.max_frame_size,
            i64::from(MIN_MAX_FRAME_SIZE),
            i64::from(MAX_MAX_FRAME_SIZE),
        ),
        ("initial_credit", offer.initial_credit, 1, MAX_CREDIT),
        (
            "heartbeat_ms",
            offer.heartbeat_ms,
            0,
            i64::from(MAX_TIMEOUT_MS),
        ),
        (
            "max_in_flight",
            offer.max_in_flight,
            1,
            i64::from(MAX_COUNT),
        ),
        (
            "max_message_size",
            offer.max_message_size,
            offer.max_frame_size,
            MAX_SIZE as i64,
        ),
    ];
    for (field, value, low, high) in checks {
        if !(low..=high).contains(&value) {
            return Err(NegotiateError {
                error: err(
                    ErrorCode::InvalidArgument,
                    0,
                    format!("{field} must be {low} - {high}, got {value}"),
                ),
                field: Some(field),
            });
        }
    }
    let version = choose_version(hello, PROTOCOL_VERSION, PROTOCOL_VERSION)
        .map_err(|error| NegotiateError { error, field: None })?;
    // In range: every conversion below is exact.
    let heartbeat_ms = match (offer.heartbeat_ms, offer.remote) {
        (0, true) => DEFAULT_HEARTBEAT_MS,
        (ms, _) => ms as u32,
    };
    let wanted = offer.max_in_flight as u32;
    let max_in_flight = wanted.min(hello.max_concurrency);
    let welcome = Welcome {
        version,
        worker_id: offer.worker_id,
        max_frame_size: (offer.max_frame_size as u32).min(hello.max_frame_size),
        initial_credit: offer.initial_credit as u32,
        heartbeat_ms,
        max_in_flight,
        max_message_size: offer.max_message_size as u64,
        extensions: WelcomeExtensions::default(),
    };
    Ok((welcome, max_in_flight < wanted))
}

/// The payload size at which a worker sends a ROWS batch (PROTOCOL.md 14.5):
/// min(max(4,096, min(`preferred`, `initial_credit` / 4)), `max_frame_size` - 8). A quarter of
/// the window keeps grants flowing; 4,096 keeps frames from shrinking to a few rows; 8 bytes
/// leave room for the count and one row's length.
///
/// ```
/// assert_eq!(wirepool_proto::rows_batch_bytes(262_144, 100_000, 4_194_304), 25_000);
/// ```
pub fn rows_batch_bytes(preferred: usize, initial_credit: u32, max_frame_size: u32) -> usize {
    let quarter = (initial_credit / 4) as usize;
    (preferred.min(quarter).max(4_096)).min((max_frame_size as usize).saturating_sub(8))
}

/// The bytes a stream may be granted now (PROTOCOL.md 14.5), 0 for none: nothing until
/// 2 x `consumed` >= `initial_credit`, then min(`consumed`, 2^31 - 1 - `credit`), `credit`
/// being the stream's credit now (negative after a large frame).
///
/// ```
/// use wirepool_proto::grant;
/// assert_eq!(grant(1_048_576, 0, 524_287), 0);
/// assert_eq!(grant(1_048_576, 0, 524_288), 524_288);
/// assert_eq!(grant(5, 0, 2), 0); // half of an odd window rounds up
/// ```
pub fn grant(initial_credit: u32, credit: i64, consumed: u64) -> u32 {
    if consumed.saturating_mul(2) < u64::from(initial_credit) {
        return 0;
    }
    let room = u64::try_from(MAX_CREDIT.saturating_sub(credit)).unwrap_or(0);
    u32::try_from(consumed.min(room)).unwrap_or(u32::MAX)
}

/// A stream's adaptive window at a grant (PROTOCOL.md 6 and 14.5), the credit the parent keeps
/// outstanding: `window` now, `drained_us` the time its last half window took to drain,
/// `rtt_us` the connection's smallest PING round trip (0: none measured, the window stays),
/// `connection_room` what the connection's cap leaves above the sum of its streams' windows.
///
/// Drained within 2 round trips (the window, not the consumer, limits the stream): doubled, to
/// at most max(`initial_credit`, `max_stream_window`), `window` + `connection_room` and
/// 2^31 - 1. Drained in more than 8: halved, never below `initial_credit`. Otherwise unchanged.
///
/// ```
/// use wirepool_proto::stream_window;
/// const MIB: u32 = 1 << 20;
/// // 100 ms round trip, half a window in 50 ms: the window limits the stream.
/// assert_eq!(stream_window(MIB, MIB, 50_000, 100_000, 16 * MIB, 63 << 20), 2 * MIB);
/// // a slow consumer: back towards initial_credit.
/// assert_eq!(stream_window(4 * MIB, MIB, 900_000, 100_000, 16 * MIB, 60 << 20), 2 * MIB);
/// ```
pub fn stream_window(
    window: u32,
    initial_credit: u32,
    drained_us: u64,
    rtt_us: u64,
    max_stream_window: u32,
    connection_room: u64,
) -> u32 {
    if rtt_us == 0 {
        return window;
    }
    if drained_us <= rtt_us.saturating_mul(u64::from(GROW_WITHIN_RTTS)) {
        let top = (2 * u64::from(window))
            .min(u64::from(initial_credit.max(max_stream_window)))
            .min(u64::from(window).saturating_add(connection_room))
            .min(MAX_CREDIT as u64);
        return window.max(top as u32);
    }
    if drained_us > rtt_us.saturating_mul(u64::from(SHRINK_AFTER_RTTS)) {
        return (window / 2).max(initial_credit);
    }
    window
}

/// What `send_error` sends (PROTOCOL.md 14.5; ERROR cannot be continued): the message cut to
/// 65,535 bytes; then, when the code, the message and the details exceed `max_frame_size`,
/// details longer than half of `max_frame_size` - 6 become the note
/// `{"truncated": true, "details_bytes": N}` (never dropped silently), shorter ones are kept,
/// and the message is cut to the bytes left. Every cut is at a character boundary.
///
/// ```
/// let details = format!("\"{}\"", "x".repeat(70_000));
/// let (message, details) = wirepool_proto::fit_error("failed", &details, 65_536);
/// assert_eq!(message, "failed");
/// assert_eq!(details, r#"{"truncated": true, "details_bytes": 70002}"#);
/// ```
pub fn fit_error<'a>(
    message: &'a str,
    details: &'a str,
    max_frame_size: u32,
) -> (&'a str, Cow<'a, str>) {
    const PREFIX: usize = 6; // code u32, message length u16
    let message = utf8_prefix(message, ERROR_MESSAGE_MAX_BYTES);
    let room = (max_frame_size as usize).saturating_sub(PREFIX);
    if message.len() + details.len() <= room {
        return (message, Cow::Borrowed(details));
    }
    let details = if details.len() > room / 2 {
        Cow::Owned(format!(
            "{{\"truncated\": true, \"details_bytes\": {}}}",
            details.len()
        ))
    } else {
        Cow::Borrowed(details)
    };
    (
        utf8_prefix(message, room.saturating_sub(details.len())),
        details,
    )
}

/// The longest prefix of `s` of at most `limit` bytes ending at a character boundary.
fn utf8_prefix(s: &str, limit: usize) -> &str {
    if s.len() <= limit {
        return s;
    }
    let mut cut = limit;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}
