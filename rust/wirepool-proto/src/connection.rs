//! The connection state machine (PROTOCOL.md sections 4-8) for either side.

use std::collections::HashSet;

use bytes::{Buf, Bytes, BytesMut};

use crate::constants::{MAX_CONNECTION_WINDOW, MAX_STREAM_WINDOW};
use crate::decode::{Decoded, FrameDecoder};
use crate::encode::{
    encode_error, encode_event, encode_message, put_header, FrameBuf, MessageHead, RowsBuilder,
    RowsFrame, RowsWritten,
};
use crate::error::{err, ErrorCode, ProtocolError};
use crate::frame::{
    Direction, Frame, FrameBody, FrameType, Header, RowsPayload, HANDSHAKE_MAX_FRAME_SIZE,
    MAX_CREDIT, PROTOCOL_VERSION,
};
// Maps keyed by request id. Ids only enter the core when increasing (a worker refuses a
// repeated or lower id) and their number is bounded by `max_in_flight`, so a multiplicative
// hash is enough; SipHash cost several lookups' worth on every small call, on both sides.
use crate::handshake::{choose_version, Hello, MethodKind, Welcome};
use crate::ids::{IdBuildHasher, IdMap};
use crate::shm::{
    Borrower, Lane, Lender, ReleaseQueue, ShmAccept, ShmFrame, ShmMapper, ShmRange,
    MAX_QUEUED_DESCRIPTORS,
};

mod credit;
mod receive;
mod shm;
#[cfg(test)]
mod tests;

/// Which side of the connection this core runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The supervising process: receives HELLO, sends WELCOME and REQUESTs.
    Parent,
    /// The child process: sends HELLO, receives WELCOME and REQUESTs.
    Worker,
}

impl Role {
    fn receives(self, ty: FrameType) -> bool {
        matches!(
            (self, ty.direction()),
            (_, Direction::Both)
                | (Role::Parent, Direction::WorkerToParent)
                | (Role::Worker, Direction::ParentToWorker)
        )
    }
}

/// What the core reports up to its driver: the EVENT objects of `spec/vectors/README.md`.
///
/// Continued messages arrive as one event with the whole body; CONTINUATION frames never
/// appear. Byte fields share the receive buffer ([`Bytes`]), so events can move between tasks
/// without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Parent: the worker's offer. Answer with [`Connection::send_welcome`] or [`Connection::refuse`].
    Hello(Box<Hello>),
    /// Worker: the handshake is complete; limits are in force.
    Welcome(Welcome),
    /// Worker: an accepted request; it is in flight until the worker sends its terminal.
    Request {
        /// Request id.
        id: u64,
        /// Index into the worker's HELLO method list (checked).
        method: u16,
        /// Codec id (checked against the method).
        codec: u8,
        /// Time budget in microseconds, 0 for none.
        timeout_us: u64,
        /// The whole (reassembled) body.
        body: Bytes,
    },
    /// Worker: the parent cancels a running request; set the handler's flag. The request stays
    /// in flight until its terminal (ERROR CANCELLED, or the normal one if it finished first).
    Cancel {
        /// Request id.
        id: u64,
    },
    /// Parent: the unary terminal.
    Result {
        /// Request id.
        id: u64,
        /// The whole (reassembled) body.
        body: Bytes,
    },
    /// An ERROR frame. With `id > 0` (parent side) it is a request's terminal; with `id == 0`
    /// it is the peer's refusal or fatal report (the peer closes next).
    Error {
        /// Request id, or 0.
        id: u64,
        /// Numeric code, possibly unknown: classify with [`crate::ErrorClass::of`].
        code: u32,
        /// Human-readable text.
        message: String,
        /// JSON text, or empty.
        details: String,
    },
    /// Parent: a batch of rows. When the consumer is done with it, report
    /// `rows.payload().len()` to [`Connection::consumed`] so credit flows back.
    Rows {
        /// Request id.
        id: u64,
        /// The checked rows.
        rows: RowsPayload,
    },
    /// Parent: the stream terminal; `row_count` was checked against the rows received.
    End {
        /// Request id.
        id: u64,
        /// Rows in the stream.
        row_count: u64,
        /// The whole (reassembled) summary.
        summary: Bytes,
    },
    /// Worker: more stream credit; wake a stream waiting in [`Connection::can_send_rows`].
    Credit {
        /// Request id.
        id: u64,
        /// Bytes granted.
        bytes: u32,
    },
    /// Parent: an EVENT frame (progress report or notification), for a request or id 0.
    Notification {
        /// Request id, or 0.
        id: u64,
        /// 1-255 bytes.
        topic: String,
        /// JSON text, may be empty.
        data: String,
    },
    /// A heartbeat probe: answer at once with [`Connection::send_pong`] and the same nonce.
    Ping {
        /// Copy into the PONG.
        nonce: [u8; 8],
    },
    /// A heartbeat answer (also unsolicited ones): the peer is alive.
    Pong {
        /// The nonce.
        nonce: [u8; 8],
    },
    /// Worker: the parent drains; new requests are refused (REJECT DRAINING) from now on.
    Drain {
        /// Grace for in-flight requests.
        grace_ms: u32,
    },
    /// Parent: the worker's last frame. In-flight requests end with `WORKER_EXITED`.
    Goodbye {
        /// 0 drained, 1 parent gone, 2 leaving by itself, 3 fatal error; others accepted.
        reason: u32,
    },
    /// A frame for a request that already ended: ignored (the normal race with CANCEL).
    Late {
        /// Request id.
        id: u64,
        /// The frame's type.
        frame: FrameType,
    },
    /// Worker: a request refused without running it (UNKNOWN_METHOD, CODEC_UNSUPPORTED,
    /// OVERLOADED, DRAINING, or CANCELLED while it was still arriving). It counts as ended;
    /// answer with [`Connection::send_error`] and this code.
    Reject {
        /// Request id.
        id: u64,
        /// Why.
        code: ErrorCode,
    },
}

/// A message being sent frame by frame; see [`Connection::begin_request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageCursor {
    id: u64,
    head: MessageHead,
    body_len: usize,
    /// Body bytes written so far.
    sent: usize,
}

impl MessageCursor {
    /// The request id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// True once every frame is written.
    pub fn is_done(&self) -> bool {
        self.sent == self.body_len
    }

    /// Body bytes not yet written.
    pub fn remaining(&self) -> usize {
        self.body_len - self.sent
    }
}

/// Per-request state of a request in flight (on either side).
#[derive(Debug, Clone)]
pub(crate) struct StreamSendState {
    kind: MethodKind,
    /// Stream credit in bytes of ROWS payload; may go negative (section 6).
    credit: i64,
    /// Rows sent (worker) or received (parent).
    rows: u64,
    /// Parent: ROWS payload bytes the consumer has read but not yet granted back.
    consumed: u64,
    /// Parent: the adaptive window (section 6), `initial_credit` at first.
    window: u32,
    /// Parent: the driver's clock at the last grant (`None`: nothing read yet).
    clock: Option<u64>,
    /// A message of this type is being sent in pieces (generic [`Connection::send`] only).
    sending: Option<FrameType>,
}

impl StreamSendState {
    fn new(kind: MethodKind, initial_credit: u32) -> Self {
        let credit = if kind == MethodKind::Stream {
            i64::from(initial_credit)
        } else {
            0
        };
        StreamSendState {
            kind,
            credit,
            rows: 0,
            consumed: 0,
            window: initial_credit,
            clock: None,
            sending: None,
        }
    }

    pub(crate) fn charge_rows(&mut self, count: u32, payload_len: usize) {
        self.credit -= payload_len as i64;
        self.rows += u64::from(count);
    }
}

/// An inbound message being reassembled from CONTINUATION frames.
#[derive(Debug)]
struct Partial {
    /// The first frame, its body/summary emptied: the chunk it carried is in `body`.
    first: Frame,
    /// The body so far, first chunk included: one buffer the whole message ends up in, so a
    /// message is copied out of the receive buffer once and never concatenated.
    body: BytesMut,
    /// Payload bytes so far, fixed prefix included (bounded by `max_message_size`).
    size: u64,
    /// A CONTINUATION arrived for it: no SHM_BODY may complete it any more (20.3).
    continued: bool,
}

/// The sans-IO protocol core of one connection, for a parent or a worker.
///
/// Feed it received bytes ([`receive`](Connection::receive) or [`read_buffer`](Connection::read_buffer)),
/// pull [`Event`]s with [`next_event`](Connection::next_event), and send through its methods,
/// which check the state, record it, and encode into your buffer. It decides every size, id,
/// credit and state rule; a driver only moves bytes, runs handlers, and keeps time (heartbeats,
/// deadlines). Any `Err` from a receive method is fatal: send it with
/// [`send_fatal`](Connection::send_fatal) and close. An `Err` from a send method is a
/// refused send (nothing was written, the state is unchanged) and is fatal only if
/// [`ProtocolError::is_fatal`] and you cannot avoid it.
///
/// A parent and a worker talking through memory:
///
/// ```
/// use wirepool_proto::{Connection, Event, Hello, MethodInfo, MethodKind, Welcome};
///
/// let mut worker = Connection::new_worker();
/// let mut parent = Connection::new_parent();
/// let (mut to_parent, mut to_worker) = (Vec::new(), Vec::new());
///
/// let hello = Hello {
///     methods: vec![MethodInfo { name: "count".into(), kind: MethodKind::Stream, codecs: vec![0] }],
///     ..Hello::new("doc-sdk", "1")
/// };
/// worker.send_hello(&hello, &mut to_parent).unwrap();
/// parent.receive(&to_parent);
/// to_parent.clear();
/// let Some(Event::Hello(hello)) = parent.next_event().unwrap() else { panic!() };
/// parent.send_welcome(&Welcome::for_hello(&hello, 1).unwrap(), &mut to_worker).unwrap();
/// let id = parent.send_request(0, 0, 0, b"3", &mut to_worker).unwrap();
///
/// worker.receive(&to_worker);
/// assert!(matches!(worker.next_event().unwrap(), Some(Event::Welcome(_))));
/// let Some(Event::Request { id: got, body, .. }) = worker.next_event().unwrap() else { panic!() };
/// assert_eq!((got, &body[..]), (id, &b"3"[..]));
///
/// let mut rows = worker.rows(id, &mut to_parent).unwrap();
/// for row in [&b"a"[..], b"b", b"c"] {
///     assert!(rows.append(row).unwrap());
/// }
/// rows.finish().unwrap();
/// worker.send_end(id, b"", &mut to_parent).unwrap();
///
/// parent.receive(&to_parent);
/// let Some(Event::Rows { rows, .. }) = parent.next_event().unwrap() else { panic!() };
/// assert_eq!(rows.count(), 3);
/// assert!(matches!(parent.next_event().unwrap(), Some(Event::End { row_count: 3, .. })));
/// assert_eq!(parent.in_flight(), 0);
/// ```
#[derive(Debug)]
pub struct Connection {
    role: Role,
    decoder: FrameDecoder,
    versions: (u16, u16),
    /// Parent: the HELLO received. Worker: the HELLO sent.
    hello: Option<Hello>,
    welcome: Option<Welcome>,
    /// Highest request id sent (parent) or received (worker).
    highest_id: u64,
    requests: IdMap<StreamSendState>,
    partials: IdMap<Partial>,
    /// Bytes held by every message in progress: bounded per connection, not only per message.
    partial_bytes: u64,
    /// The buffer of the last reassembled message, handed out again for the next one once its
    /// reader has dropped the message (`try_reclaim`): large messages then land in memory that
    /// is already mapped instead of faulting in fresh pages each time. Its capacity never
    /// exceeds `max_message_size` (see [`grow_body`]).
    spare: BytesMut,
    /// Length of the last reassembled message: the first guess for the next one's buffer (the
    /// wire does not announce a continued message's total size).
    last_message_len: usize,
    /// The message buffer the decoder filled with the frame it just returned (see
    /// [`lend_to_message`](Connection::lend_to_message)).
    lent_back: Option<BytesMut>,
    /// Worker: rejected requests whose ERROR the driver has not sent yet. It holds only what
    /// the driver owes, so it stays as small as the driver's backlog.
    unanswered_rejects: HashSet<u64, IdBuildHasher>,
    /// Worker: DRAIN received. Parent: DRAIN sent.
    draining: bool,
    /// Parent: GOODBYE received. Worker: GOODBYE sent.
    goodbye: bool,
    /// This side sent a fatal ERROR (id 0) or GOODBYE: it sends nothing more.
    send_closed: bool,
    /// The shared-memory lane, once a WELCOME with its entry opened the connection (20).
    lane: Option<Lane>,
    /// The driver's way to check and map a received region (see [`Connection::set_shm_mapper`]).
    shm_mapper: MapperSlot,
    /// Descriptors received before the WELCOME decided whether the lane is on.
    early_descriptors: usize,
    /// A descriptor violation noticed outside `next_event`, reported by the next call to it.
    descriptor_error: Option<ProtocolError>,
    /// Ranges whose views were dropped, waiting for their SHM_RELEASE.
    shm_releases: std::sync::Arc<ReleaseQueue>,
    failed: Option<ProtocolError>,
    /// Parent: the smallest PING round trip the driver observed, microseconds (0: none).
    min_rtt_us: u64,
    /// Parent: section 6's caps on the adaptive windows.
    window_caps: (u32, u32),
}

impl Connection {
    /// A core for `role`, speaking protocol version 1.
    pub fn new(role: Role) -> Connection {
        Connection {
            role,
            decoder: FrameDecoder::new(HANDSHAKE_MAX_FRAME_SIZE),
            versions: (PROTOCOL_VERSION, PROTOCOL_VERSION),
            hello: None,
            welcome: None,
            highest_id: 0,
            requests: IdMap::default(),
            partials: IdMap::default(),
            partial_bytes: 0,
            spare: BytesMut::new(),
            last_message_len: 0,
            lent_back: None,
            unanswered_rejects: HashSet::default(),
            draining: false,
            goodbye: false,
            send_closed: false,
            lane: None,
            shm_mapper: MapperSlot(None),
            early_descriptors: 0,
            descriptor_error: None,
            shm_releases: std::sync::Arc::default(),
            failed: None,
            min_rtt_us: 0,
            window_caps: (MAX_STREAM_WINDOW, MAX_CONNECTION_WINDOW),
        }
    }

    /// `Connection::new(Role::Parent)`.
    pub fn new_parent() -> Connection {
        Connection::new(Role::Parent)
    }

    /// `Connection::new(Role::Worker)`.
    pub fn new_worker() -> Connection {
        Connection::new(Role::Worker)
    }

    // ----------------------------------------------------------------------------------------
    // State queries

    /// The side this core runs.
    pub fn role(&self) -> Role {
        self.role
    }

    /// True once the handshake is complete (WELCOME sent or received).
    pub fn is_open(&self) -> bool {
        self.welcome.is_some()
    }

    /// Parent: the HELLO received. Worker: the HELLO sent.
    pub fn hello(&self) -> Option<&Hello> {
        self.hello.as_ref()
    }

    /// The WELCOME in force, once the handshake is complete.
    pub fn welcome(&self) -> Option<&Welcome> {
        self.welcome.as_ref()
    }

    /// The frame payload limit in force for both directions (65,536 before the handshake).
    pub fn max_frame_size(&self) -> u32 {
        self.welcome
            .map_or(HANDSHAKE_MAX_FRAME_SIZE, |w| w.max_frame_size)
    }

    /// Requests in flight (sent and not ended on the parent; accepted and not answered on the
    /// worker).
    pub fn in_flight(&self) -> usize {
        self.requests.len()
    }

    /// Ids of the requests in flight, in no particular order: on EOF, GOODBYE or a fatal
    /// error the driver ends each with one local error (`WORKER_EXITED` /
    /// `PROTOCOL_VIOLATION`).
    pub fn in_flight_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.requests.keys().copied()
    }

    /// Parent: true if a REQUEST may be sent now (open, no GOODBYE, not draining, fewer than
    /// `max_in_flight` requests in flight).
    pub fn can_send_request(&self) -> bool {
        self.role == Role::Parent
            && self
                .welcome
                .is_some_and(|w| self.requests.len() < w.max_in_flight as usize)
            && !self.draining
            && !self.goodbye
            && !self.send_closed
    }

    /// True if `id` is in flight.
    pub fn is_in_flight(&self, id: u64) -> bool {
        self.requests.contains_key(&id)
    }

    /// Worker: DRAIN received. Parent: DRAIN sent.
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Parent: GOODBYE received. Worker: GOODBYE sent.
    pub fn is_goodbye(&self) -> bool {
        self.goodbye
    }

    /// The first fatal receive error, if any (then every receive call returns it).
    pub fn failure(&self) -> Option<&ProtocolError> {
        self.failed.as_ref()
    }

    /// A stream's credit in bytes (may be negative), or `None` if `id` is not a stream in
    /// flight.
    pub fn credit(&self, id: u64) -> Option<i64> {
        self.requests
            .get(&id)
            .filter(|r| r.kind == MethodKind::Stream)
            .map(|r| r.credit)
    }

    /// Parent: a stream's window, the credit kept outstanding for it: `initial_credit` unless
    /// [`consumed_at`](Connection::consumed_at) adapted it (PROTOCOL.md 6); `None` if `id` is
    /// not a stream in flight.
    pub fn window(&self, id: u64) -> Option<u32> {
        self.requests
            .get(&id)
            .filter(|r| r.kind == MethodKind::Stream)
            .map(|r| r.window)
    }

    /// Worker: true if stream `id` may send a ROWS frame now (credit positive). When false,
    /// wait for an [`Event::Credit`] (or a CANCEL) for it.
    pub fn can_send_rows(&self, id: u64) -> bool {
        self.credit(id).is_some_and(|c| c > 0)
    }

    /// Bytes of an incomplete frame buffered (its header included) once
    /// [`next_event`](Connection::next_event) returned `Ok(None)`; 0 between frames. A parent's
    /// frame clock (PROTOCOL.md 8.5) runs while one frame keeps this above zero: after `n` more
    /// bytes were read, a value above `n` is still the same frame.
    ///
    /// ```
    /// use wirepool_proto::Connection;
    /// let mut parent = Connection::new_parent();
    /// // The header of a 40-byte HELLO (type 0x01), then 2 of its payload bytes.
    /// let mut wire = vec![40, 0, 0, 0, 0x01, 0, 0, 0];
    /// wire.extend_from_slice(&[0; 8]);
    /// parent.receive(&wire[..5]);
    /// assert!(parent.next_event().unwrap().is_none());
    /// assert_eq!(parent.incomplete_frame_len(), 5);
    /// parent.receive(&wire[5..]);
    /// parent.receive(b"WI");
    /// assert!(parent.next_event().unwrap().is_none());
    /// assert_eq!(parent.incomplete_frame_len(), 18);
    /// ```
    pub fn incomplete_frame_len(&self) -> usize {
        self.decoder.incomplete_frame_len()
    }

    // Receiving: connection/receive.rs. The shared-memory lane: connection/shm.rs.

    // ----------------------------------------------------------------------------------------
    // Sending: checks common to every frame

    fn check_can_send(&self, ty: FrameType, id: u64) -> Result<(), ProtocolError> {
        let refuse = |why: &str| {
            Err(err(
                ErrorCode::UnexpectedFrame,
                id,
                format!("cannot send {}: {why}", ty.name()),
            ))
        };
        if self.send_closed {
            return refuse("this side already sent GOODBYE or a fatal ERROR");
        }
        let peer = match self.role {
            Role::Parent => Role::Worker,
            Role::Worker => Role::Parent,
        };
        if !peer.receives(ty) {
            return refuse("wrong direction");
        }
        if ty == FrameType::Error && id == 0 {
            return Ok(());
        }
        match self.role {
            Role::Worker if ty == FrameType::Hello => {
                return if self.hello.is_some() {
                    refuse("HELLO was already sent")
                } else {
                    Ok(())
                };
            }
            Role::Worker if !self.is_open() => return refuse("the handshake is not complete"),
            Role::Parent if ty == FrameType::Welcome => {
                return if self.hello.is_none() || self.is_open() {
                    refuse("WELCOME answers one HELLO, once")
                } else {
                    Ok(())
                };
            }
            Role::Parent if !self.is_open() => return refuse("the handshake is not complete"),
            Role::Parent if ty == FrameType::Error => {
                return refuse("a parent sends ERROR with id 0 only")
            }
            _ => {}
        }
        if self.role == Role::Parent && self.goodbye && ty != FrameType::Error {
            return refuse("the worker said GOODBYE");
        }
        Ok(())
    }

    fn check_frame_size(&self, id: u64, payload_len: usize) -> Result<(), ProtocolError> {
        if payload_len > self.max_frame_size() as usize {
            return Err(err(
                ErrorCode::FrameTooLarge,
                id,
                format!(
                    "payload of {payload_len} bytes above max_frame_size {}",
                    self.max_frame_size()
                ),
            ));
        }
        Ok(())
    }

    fn in_flight_state(
        &mut self,
        id: u64,
        ty: FrameType,
    ) -> Result<&mut StreamSendState, ProtocolError> {
        self.requests.get_mut(&id).ok_or_else(|| {
            err(
                ErrorCode::UnknownId,
                id,
                format!("cannot send {}: request {id} is not in flight", ty.name()),
            )
        })
    }

    // ----------------------------------------------------------------------------------------
    // Sending: handshake

    /// Worker: send the HELLO (first frame of the connection; it must fit 65,536 bytes).
    pub fn send_hello(
        &mut self,
        hello: &Hello,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Hello, 0)?;
        hello.validate()?;
        self.check_frame_size(0, hello.payload_len())?;
        Frame::new(0, FrameBody::Hello(Box::new(hello.clone()))).encode(out)?;
        self.hello = Some(hello.clone());
        Ok(())
    }

    /// Parent: answer the HELLO and open the connection; the WELCOME's limits apply from now
    /// on. Checked against the HELLO first ([`Welcome::check_against`]).
    pub fn send_welcome(
        &mut self,
        welcome: &Welcome,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Welcome, 0)?;
        if let Some(hello) = &self.hello {
            welcome.check_against(hello)?;
        }
        Frame::new(0, FrameBody::Welcome(*welcome)).encode(out)?;
        self.open_with(*welcome);
        Ok(())
    }

    /// Parent: refuse the HELLO (ERROR id 0 with `code`, for example `CODEC_MISMATCH` from
    /// [`crate::check_methods`]); then close the connection.
    pub fn refuse(
        &mut self,
        code: ErrorCode,
        message: &str,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.send_error(0, code.code(), message, "", out)
    }

    /// Either side: report a fatal error to the peer (ERROR id 0 with its code and message);
    /// then close the connection. Nothing can be sent after it.
    pub fn send_fatal(
        &mut self,
        error: &ProtocolError,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        let message = truncate_utf8(&error.message, 1024);
        self.send_error(0, error.code.code(), message, "", out)
    }

    // ----------------------------------------------------------------------------------------
    // Sending: parent

    /// Parent: start a call. The core picks the id (the next after every earlier one), checks
    /// the method against the HELLO (the codec is the worker's to refuse), `max_in_flight`,
    /// drain state and
    /// `max_message_size`, and splits a large body into CONTINUATION frames.
    /// Returns the request id.
    ///
    /// Refusals: `UNKNOWN_METHOD`, `OVERLOADED` (wait for a terminal; see
    /// [`can_send_request`](Connection::can_send_request)),
    /// `DRAINING`, `MESSAGE_TOO_LARGE`, `UNEXPECTED_FRAME` (not open, or GOODBYE received).
    pub fn send_request(
        &mut self,
        method: u16,
        codec: u8,
        timeout_us: u64,
        body: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<u64, ProtocolError> {
        let id = self.highest_id + 1;
        let head = MessageHead::Request {
            method,
            codec,
            timeout_us,
        };
        let kind = self.check_request(id, method, head.message_len(body.len()))?;
        encode_message(out, id, head, body, self.max_frame_size())?;
        self.record_request(id, kind);
        Ok(id)
    }

    fn check_request(&self, id: u64, method: u16, size: u64) -> Result<MethodKind, ProtocolError> {
        self.check_can_send(FrameType::Request, id)?;
        if id <= self.highest_id {
            return Err(err(
                ErrorCode::DuplicateId,
                id,
                format!("request id {id} is not above {}", self.highest_id),
            ));
        }
        if self.draining {
            return Err(err(
                ErrorCode::Draining,
                id,
                "DRAIN was sent: no new requests",
            ));
        }
        let info = self
            .hello
            .as_ref()
            .and_then(|h| h.methods.get(method as usize))
            .ok_or_else(|| {
                err(
                    ErrorCode::UnknownMethod,
                    id,
                    format!("method {method} is not in the worker's HELLO"),
                )
            })?;
        // The codec is not checked: an unaccepted codec is the worker's CODEC_UNSUPPORTED
        // answer (section 7); the parent's start-up check is `check_methods`.
        self.check_message_size(id, size)?;
        // The worker would answer OVERLOADED; refusing here keeps that round trip off the wire
        // and gives a pool its capacity signal.
        if self.requests.len() >= self.welcome.map_or(0, |w| w.max_in_flight as usize) {
            return Err(err(
                ErrorCode::Overloaded,
                id,
                "max_in_flight requests are already in flight",
            ));
        }
        Ok(info.kind)
    }

    fn record_request(&mut self, id: u64, kind: MethodKind) {
        self.highest_id = id;
        let initial = self.welcome.map_or(0, |w| w.initial_credit);
        self.requests
            .insert(id, StreamSendState::new(kind, initial));
    }

    /// Parent: cancel a request in flight. It stays in flight until its terminal arrives.
    pub fn send_cancel(&mut self, id: u64, out: &mut impl FrameBuf) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Cancel, id)?;
        let req = self.in_flight_state(id, FrameType::Cancel)?;
        // CANCEL abandons a request still being sent.
        req.sending = None;
        put_header(out, FrameType::Cancel, false, id, 0)
    }

    // Credit (send_credit, consumed, consumed_at, the adaptive window): connection/credit.rs.

    /// Parent: stop giving work; the worker finishes, says GOODBYE and closes. No REQUEST can
    /// be sent after it.
    pub fn send_drain(
        &mut self,
        grace_ms: u32,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Drain, 0)?;
        put_header(out, FrameType::Drain, false, 0, 4)?;
        out.put_u32_le(grace_ms);
        self.draining = true;
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // Sending: worker

    /// Worker: the unary terminal. Large bodies are split into CONTINUATION frames.
    /// Ends the request.
    pub fn send_result(
        &mut self,
        id: u64,
        body: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.send_terminal(id, MessageHead::Result, body, out)
    }

    /// Worker: the stream terminal, with the row count the core has counted and an optional
    /// summary (split if large). Ends the request.
    pub fn send_end(
        &mut self,
        id: u64,
        summary: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        let row_count = self.requests.get(&id).map_or(0, |r| r.rows);
        self.send_terminal(id, MessageHead::End { row_count }, summary, out)
    }

    fn send_terminal(
        &mut self,
        id: u64,
        head: MessageHead,
        body: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_terminal(id, head, body.len())?;
        encode_message(out, id, head, body, self.max_frame_size())?;
        self.requests.remove(&id);
        Ok(())
    }

    fn check_terminal(
        &mut self,
        id: u64,
        head: MessageHead,
        body_len: usize,
    ) -> Result<(), ProtocolError> {
        let ty = head.frame_type();
        self.check_can_send(ty, id)?;
        self.check_message_size(id, head.message_len(body_len))?;
        self.terminal_state(id, ty)?;
        Ok(())
    }

    /// The state of request `id` if a terminal of type `ty` may end it now: in flight, of the
    /// terminal's kind (RESULT for unary, END for stream), and no message of it being sent.
    fn terminal_state(
        &mut self,
        id: u64,
        ty: FrameType,
    ) -> Result<&mut StreamSendState, ProtocolError> {
        let req = self.in_flight_state(id, ty)?;
        check_kind_for_send(req, ty, id)?;
        if req.sending.is_some() {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "a message for this id is already being sent",
            ));
        }
        Ok(req)
    }

    // ----------------------------------------------------------------------------------------
    // Sending: a large message frame by frame

    /// Parent: like [`send_request`](Connection::send_request), but writes only the first
    /// frame; continue with [`send_next_frame`](Connection::send_next_frame) so frames of
    /// other requests can go in between (section 5).
    ///
    /// ```
    /// # use wirepool_proto::{Connection, Event, Hello, MethodInfo, MethodKind, Welcome};
    /// # let mut worker = Connection::new_worker();
    /// # let mut parent = Connection::new_parent();
    /// # let mut wire = Vec::new();
    /// # let hello = Hello { max_concurrency: 2, methods: vec![MethodInfo { name: "m".into(), kind: MethodKind::Unary, codecs: vec![0] }], ..Hello::new("doc", "1") };
    /// # worker.send_hello(&hello, &mut wire).unwrap();
    /// # parent.receive(&wire); wire.clear(); parent.next_event().unwrap();
    /// # parent.send_welcome(&Welcome { max_frame_size: 65_536, ..Welcome::for_hello(&hello, 1).unwrap() }, &mut wire).unwrap();
    /// let big = vec![1u8; 200_000];
    /// let mut cursor = parent.begin_request(0, 0, 0, &big, &mut wire).unwrap();
    /// let small = parent.send_request(0, 0, 0, b"small", &mut wire).unwrap(); // not blocked
    /// while !parent.send_next_frame(&mut cursor, &big, &mut wire).unwrap() {}
    ///
    /// worker.receive(&wire);
    /// assert!(matches!(worker.next_event().unwrap(), Some(Event::Welcome(_))));
    /// let first = worker.next_event().unwrap().unwrap();
    /// assert!(matches!(first, Event::Request { id, .. } if id == small));
    /// let Some(Event::Request { body, .. }) = worker.next_event().unwrap() else { panic!() };
    /// assert_eq!(body.len(), 200_000);
    /// ```
    pub fn begin_request(
        &mut self,
        method: u16,
        codec: u8,
        timeout_us: u64,
        body: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<MessageCursor, ProtocolError> {
        let id = self.highest_id + 1;
        let head = MessageHead::Request {
            method,
            codec,
            timeout_us,
        };
        let kind = self.check_request(id, method, head.message_len(body.len()))?;
        let cursor = self.write_first_frame(id, head, body, out)?;
        self.record_request(id, kind);
        if !cursor.is_done() {
            if let Some(req) = self.requests.get_mut(&id) {
                req.sending = Some(FrameType::Request);
            }
        }
        Ok(cursor)
    }

    /// Worker: like [`send_result`](Connection::send_result), one frame at a time; continue
    /// with [`send_next_frame`](Connection::send_next_frame). The request ends with the last
    /// frame; an ERROR sent meanwhile abandons the result.
    pub fn begin_result(
        &mut self,
        id: u64,
        body: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<MessageCursor, ProtocolError> {
        self.begin_terminal(id, MessageHead::Result, body, out)
    }

    /// Worker: like [`send_end`](Connection::send_end), one frame at a time; continue with
    /// [`send_next_frame`](Connection::send_next_frame).
    pub fn begin_end(
        &mut self,
        id: u64,
        summary: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<MessageCursor, ProtocolError> {
        let row_count = self.requests.get(&id).map_or(0, |r| r.rows);
        self.begin_terminal(id, MessageHead::End { row_count }, summary, out)
    }

    fn begin_terminal(
        &mut self,
        id: u64,
        head: MessageHead,
        body: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<MessageCursor, ProtocolError> {
        self.check_terminal(id, head, body.len())?;
        let cursor = self.write_first_frame(id, head, body, out)?;
        if cursor.is_done() {
            self.requests.remove(&id);
        } else if let Some(req) = self.requests.get_mut(&id) {
            req.sending = Some(head.frame_type());
        }
        Ok(cursor)
    }

    fn write_first_frame(
        &self,
        id: u64,
        head: MessageHead,
        body: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<MessageCursor, ProtocolError> {
        let room = (self.max_frame_size() as usize).saturating_sub(head.prefix_len());
        let first = body.len().min(room);
        put_header(
            out,
            head.frame_type(),
            first < body.len(),
            id,
            head.prefix_len() + first,
        )?;
        head.put_prefix(out);
        out.put_slice(&body[..first]);
        Ok(MessageCursor {
            id,
            head,
            body_len: body.len(),
            sent: first,
        })
    }

    /// Write the next CONTINUATION of a message started with `begin_*`; `body` must be the same
    /// bytes. Returns `true` once the last frame is written (then the call is a no-op). Fails
    /// with `CONTINUATION` if the message was abandoned meanwhile (CANCEL sent by the parent,
    /// ERROR sent by the worker).
    pub fn send_next_frame(
        &mut self,
        cursor: &mut MessageCursor,
        body: &[u8],
        out: &mut impl FrameBuf,
    ) -> Result<bool, ProtocolError> {
        if cursor.is_done() {
            return Ok(true);
        }
        let id = cursor.id;
        if body.len() != cursor.body_len {
            return Err(err(
                ErrorCode::Protocol,
                id,
                format!(
                    "body is {} bytes, the message began with {}",
                    body.len(),
                    cursor.body_len
                ),
            ));
        }
        self.check_can_send(FrameType::Continuation, id)?;
        let max = self.max_frame_size() as usize;
        let ty = cursor.head.frame_type();
        let req = self
            .requests
            .get_mut(&id)
            .filter(|r| r.sending == Some(ty))
            .ok_or_else(|| {
                err(
                    ErrorCode::Continuation,
                    id,
                    format!("the {} for id {id} was abandoned", ty.name()),
                )
            })?;
        let end = cursor.sent + (body.len() - cursor.sent).min(max);
        let more = end < body.len();
        put_header(out, FrameType::Continuation, more, id, end - cursor.sent)?;
        out.put_slice(&body[cursor.sent..end]);
        cursor.sent = end;
        if !more {
            req.sending = None;
            if ty != FrameType::Request {
                self.requests.remove(&id);
            }
        }
        Ok(!more)
    }

    /// Worker: start a ROWS frame for stream `id`: checks that the stream is in flight and its
    /// credit positive (`FLOW_CONTROL` otherwise: wait for [`Event::Credit`]). The frame may
    /// hold up to `max_frame_size` bytes; [`RowsBuilder::finish`] charges its credit.
    pub fn rows<'a, B: FrameBuf>(
        &'a mut self,
        id: u64,
        out: &'a mut B,
    ) -> Result<RowsBuilder<'a, B>, ProtocolError> {
        let max_frame_size = self.max_frame_size();
        let req = self.rows_state(id)?;
        Ok(RowsBuilder::start(out, id, max_frame_size, Some(req)))
    }

    /// Worker: send a ROWS frame filled away from the core (a [`RowsFrame`], for example on a
    /// handler thread): the checks of [`rows`](Connection::rows) and the frame's size against
    /// `max_frame_size` (`FRAME_TOO_LARGE`), then, like [`RowsBuilder::finish`], the stream is
    /// charged the payload and its row counter advances; the frame is written to `out` whole
    /// (one copy, or none when `out` takes the buffer: [`FrameBuf::append_vec`]) and `frame` is
    /// emptied for the next rows. An empty frame writes nothing.
    /// A refusal leaves `frame` as it was.
    ///
    /// ```
    /// # use wirepool_proto::{Connection, Event, Hello, MethodInfo, MethodKind, RowsFrame, Welcome};
    /// # let mut worker = Connection::new_worker();
    /// # let mut parent = Connection::new_parent();
    /// # let mut wire = Vec::new();
    /// # let hello = Hello { methods: vec![MethodInfo { name: "s".into(), kind: MethodKind::Stream, codecs: vec![0] }], ..Hello::new("doc", "1") };
    /// # worker.send_hello(&hello, &mut wire).unwrap();
    /// # parent.receive(&wire); wire.clear(); parent.next_event().unwrap();
    /// # parent.send_welcome(&Welcome::for_hello(&hello, 1).unwrap(), &mut wire).unwrap();
    /// # let id = parent.send_request(0, 0, 0, b"", &mut wire).unwrap();
    /// # worker.receive(&wire); wire.clear(); worker.next_event().unwrap(); worker.next_event().unwrap();
    /// // On the handler's thread, no core needed:
    /// let mut frame = RowsFrame::new(id, worker.max_frame_size());
    /// for row in [&b"a"[..], b"b"] {
    ///     assert!(frame.append(row).unwrap());
    /// }
    /// // On the thread that owns the core:
    /// let written = worker.send_rows(&mut frame, &mut wire).unwrap();
    /// assert_eq!((written.count, frame.count()), (2, 0));
    /// parent.receive(&wire);
    /// let Some(Event::Rows { rows, .. }) = parent.next_event().unwrap() else { panic!() };
    /// assert_eq!(rows.count(), 2);
    /// ```
    pub fn send_rows(
        &mut self,
        frame: &mut RowsFrame,
        out: &mut impl FrameBuf,
    ) -> Result<RowsWritten, ProtocolError> {
        if frame.is_empty() {
            return Ok(RowsWritten {
                count: 0,
                payload_len: 0,
            });
        }
        let id = frame.id();
        let payload_len = frame.payload_len();
        self.check_frame_size(id, payload_len)?;
        let req = self.rows_state(id)?;
        req.charge_rows(frame.count(), payload_len);
        let written = RowsWritten {
            count: frame.count(),
            payload_len,
        };
        frame.write_to(out);
        Ok(written)
    }

    /// The state of stream `id` if a ROWS frame may be sent for it now.
    fn rows_state(&mut self, id: u64) -> Result<&mut StreamSendState, ProtocolError> {
        self.check_can_send(FrameType::Rows, id)?;
        let req = self.in_flight_state(id, FrameType::Rows)?;
        check_kind_for_send(req, FrameType::Rows, id)?;
        if req.sending.is_some() {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "END is being sent for this stream",
            ));
        }
        if req.credit <= 0 {
            return Err(err(
                ErrorCode::FlowControl,
                id,
                format!("stream credit is {}: wait for CREDIT", req.credit),
            ));
        }
        Ok(req)
    }

    /// Worker: end request `id` with an error (a terminal; abandons a result being sent). Also
    /// the answer to [`Event::Reject`], whose request is no longer in flight. A second terminal
    /// for a request is refused (`UNKNOWN_ID`), for example an ERROR after its RESULT.
    /// With `id == 0` it is a fatal report: nothing can be sent after it.
    pub fn send_error(
        &mut self,
        id: u64,
        code: u32,
        message: &str,
        details: &str,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Error, id)?;
        if id != 0 && !self.requests.contains_key(&id) && !self.unanswered_rejects.contains(&id) {
            return Err(err(
                ErrorCode::UnknownId,
                id,
                format!(
                    "request {id} is not in flight and owes no REJECT answer: a second terminal"
                ),
            ));
        }
        // ERROR cannot be continued: the message and details are fitted to one frame (14.5).
        let (message, details) = crate::policy::fit_error(message, details, self.max_frame_size());
        encode_error(out, id, code, message, &details)?;
        if id == 0 {
            self.send_closed = true;
        } else {
            self.requests.remove(&id);
            self.unanswered_rejects.remove(&id);
        }
        Ok(())
    }

    /// Worker: a progress report or notification for request `id` (in flight) or the
    /// connection (`id == 0`). Not flow controlled: coalesce them (about one per 10 ms).
    pub fn send_event(
        &mut self,
        id: u64,
        topic: &str,
        data: &str,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Event, id)?;
        if id != 0 {
            let req = self.in_flight_state(id, FrameType::Event)?;
            if req.sending.is_some() {
                return Err(err(
                    ErrorCode::Continuation,
                    id,
                    "a message for this id is being sent",
                ));
            }
        }
        self.check_frame_size(id, 2 + topic.len() + data.len())?;
        encode_event(out, id, topic, data)
    }

    /// Worker: the last frame; nothing can be sent after it.
    pub fn send_goodbye(
        &mut self,
        reason: u32,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Goodbye, 0)?;
        put_header(out, FrameType::Goodbye, false, 0, 4)?;
        out.put_u32_le(reason);
        self.goodbye = true;
        self.send_closed = true;
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // Sending: both

    /// Send a heartbeat probe.
    pub fn send_ping(
        &mut self,
        nonce: [u8; 8],
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Ping, 0)?;
        put_header(out, FrameType::Ping, false, 0, 8)?;
        out.put_slice(&nonce);
        Ok(())
    }

    /// Answer a [`Event::Ping`] with its nonce.
    pub fn send_pong(
        &mut self,
        nonce: [u8; 8],
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Pong, 0)?;
        put_header(out, FrameType::Pong, false, 0, 8)?;
        out.put_slice(&nonce);
        Ok(())
    }

    /// Send any single frame, with every check and state change of the typed methods; for
    /// tests, fuzzing, and drivers that interleave continued messages frame by frame. The
    /// typed methods are the fast, simple path.
    pub fn send(&mut self, frame: &Frame, out: &mut impl FrameBuf) -> Result<(), ProtocolError> {
        let id = frame.id;
        let ty = frame.frame_type();
        let payload_len = frame.encoded_len() - crate::frame::HEADER_LEN;
        match &frame.body {
            FrameBody::Hello(hello) => return self.send_hello(hello, out),
            FrameBody::Welcome(welcome) => return self.send_welcome(welcome, out),
            FrameBody::Cancel => return self.send_cancel(id, out),
            FrameBody::Credit { bytes } => return self.send_credit(id, *bytes, out),
            FrameBody::Drain { grace_ms } => return self.send_drain(*grace_ms, out),
            FrameBody::Goodbye { reason } => return self.send_goodbye(*reason, out),
            FrameBody::Ping { nonce } => return self.send_ping(*nonce, out),
            FrameBody::Pong { nonce } => return self.send_pong(*nonce, out),
            FrameBody::Error {
                code,
                message,
                details,
            } => return self.send_error(id, *code, message, details, out),
            FrameBody::Event { topic, data } => return self.send_event(id, topic, data, out),
            FrameBody::Rows(rows) => {
                let mut builder = self.rows(id, out)?;
                for row in rows {
                    if !builder.append(row)? {
                        return Err(err(
                            ErrorCode::FrameTooLarge,
                            id,
                            "ROWS payload above max_frame_size",
                        ));
                    }
                }
                builder.finish()?;
                return Ok(());
            }
            FrameBody::Request { .. }
            | FrameBody::Result { .. }
            | FrameBody::End { .. }
            | FrameBody::Continuation { .. } => {}
        }
        self.check_can_send(ty, id)?;
        self.check_frame_size(id, payload_len)?;
        match &frame.body {
            FrameBody::Request { method, .. } => {
                let kind = self.check_request(id, *method, payload_len as u64)?;
                frame.encode(out)?;
                self.record_request(id, kind);
                if frame.more {
                    if let Some(req) = self.requests.get_mut(&id) {
                        req.sending = Some(FrameType::Request);
                    }
                }
            }
            FrameBody::Result { .. } | FrameBody::End { .. } => {
                let req = self.terminal_state(id, ty)?;
                if let FrameBody::End { row_count, .. } = &frame.body {
                    if *row_count != req.rows {
                        return Err(err(
                            ErrorCode::RowCountMismatch,
                            id,
                            format!("END says {row_count} rows, {} were sent", req.rows),
                        ));
                    }
                }
                frame.encode(out)?;
                if frame.more {
                    req.sending = Some(ty);
                } else {
                    self.requests.remove(&id);
                }
            }
            _ => {
                let req = self.in_flight_state(id, ty)?;
                let Some(message) = req.sending else {
                    return Err(err(
                        ErrorCode::Continuation,
                        id,
                        "CONTINUATION with no message being sent",
                    ));
                };
                frame.encode(out)?;
                if !frame.more {
                    req.sending = None;
                    if message != FrameType::Request {
                        self.requests.remove(&id);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The grant policy of section 6 for a stream whose credit is 0: [`grant`](crate::grant)
/// (PROTOCOL.md 14.5) as an option. Grants what the consumer has read once it reaches half the
/// window, so the worker never idles and never holds more than `initial_credit +
/// max_frame_size` unread bytes.
///
/// ```
/// use wirepool_proto::grant_due;
/// assert_eq!(grant_due(1_048_576, 100_000), None);
/// assert_eq!(grant_due(1_048_576, 600_000), Some(600_000));
/// ```
pub fn grant_due(initial_credit: u32, consumed_not_granted: u64) -> Option<u32> {
    match crate::policy::grant(initial_credit, 0, consumed_not_granted) {
        0 => None,
        granted => Some(granted),
    }
}

fn check_kind_for_send(req: &StreamSendState, ty: FrameType, id: u64) -> Result<(), ProtocolError> {
    let wanted = match ty {
        FrameType::Result => MethodKind::Unary,
        _ => MethodKind::Stream,
    };
    if req.kind != wanted {
        return Err(err(
            ErrorCode::KindMismatch,
            id,
            format!("cannot send {} for a {:?} request", ty.name(), req.kind),
        ));
    }
    Ok(())
}

fn frame_payload_len(frame: &Frame) -> u64 {
    (frame.encoded_len() - crate::frame::HEADER_LEN) as u64
}

/// Makes room for `more` bytes in a message's buffer: doubling (so appending frame after frame
/// costs amortised linear copies), but never reserving more than `budget` bytes in all unless
/// the bytes themselves need it (they were checked against the limits before this call).
fn grow_body(body: &mut BytesMut, more: usize, budget: usize) {
    let needed = body.len() + more;
    if body.capacity() >= needed || body.try_reclaim(more) {
        return;
    }
    let want = needed
        .max(body.len().saturating_mul(2))
        .min(budget.max(needed));
    let mut grown = BytesMut::with_capacity(want);
    grown.extend_from_slice(body);
    *body = grown;
}

fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn event_from_frame(frame: Frame) -> Event {
    let id = frame.id;
    match frame.body {
        FrameBody::Hello(hello) => Event::Hello(hello),
        FrameBody::Welcome(welcome) => Event::Welcome(welcome),
        FrameBody::Request {
            method,
            codec,
            timeout_us,
            body,
        } => Event::Request {
            id,
            method,
            codec,
            timeout_us,
            body,
        },
        FrameBody::Cancel => Event::Cancel { id },
        FrameBody::Result { body } => Event::Result { id, body },
        FrameBody::Error {
            code,
            message,
            details,
        } => Event::Error {
            id,
            code,
            message,
            details,
        },
        FrameBody::Rows(rows) => Event::Rows { id, rows },
        FrameBody::End { row_count, summary } => Event::End {
            id,
            row_count,
            summary,
        },
        FrameBody::Credit { bytes } => Event::Credit { id, bytes },
        FrameBody::Event { topic, data } => Event::Notification { id, topic, data },
        FrameBody::Ping { nonce } => Event::Ping { nonce },
        FrameBody::Pong { nonce } => Event::Pong { nonce },
        FrameBody::Drain { grace_ms } => Event::Drain { grace_ms },
        FrameBody::Goodbye { reason } => Event::Goodbye { reason },
        // Never reached: continuation frames are folded into their message.
        FrameBody::Continuation { .. } => Event::Late {
            id,
            frame: FrameType::Continuation,
        },
    }
}

/// The refusal of descriptors that arrived where the lane is off (20.5).
fn lane_off_descriptors(n: usize) -> ProtocolError {
    err(
        ErrorCode::ShmBadDescriptor,
        0,
        format!("{n} descriptors received where the shm lane is off"),
    )
}

/// A message's size for `max_message_size` when its body is range `r` (20.3: prefix + length).
fn shm_message_len(head: MessageHead, r: ShmRange) -> u64 {
    (head.prefix_len() as u64).saturating_add(r.length)
}

/// The driver's region mapper, if any (a closure: shown only as present or not).
struct MapperSlot(Option<ShmMapper>);

impl std::fmt::Debug for MapperSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Some(mapper)"
        } else {
            "None"
        })
    }
}
