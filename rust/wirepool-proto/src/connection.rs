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

    // ----------------------------------------------------------------------------------------
    // Receiving

    /// Append received bytes (copies them; see [`read_buffer`](Connection::read_buffer)).
    pub fn receive(&mut self, bytes: &[u8]) {
        self.decoder.receive(bytes);
    }

    /// The receive buffer, with room for the rest of the current frame: read the socket
    /// straight into it, then call [`next_event`](Connection::next_event) until `Ok(None)`.
    pub fn read_buffer(&mut self) -> &mut BytesMut {
        self.decoder.read_buffer()
    }

    /// The next event, `Ok(None)` when more bytes are needed, or a fatal error.
    ///
    /// Call it until `Ok(None)` after each read: one read may hold many frames.
    pub fn next_event(&mut self) -> Result<Option<Event>, ProtocolError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if let Some(e) = self.descriptor_error.take() {
            return Err(self.fail(e));
        }
        loop {
            let frame = match self.decoder.next_decoded() {
                Ok(Some(Decoded::Frame(frame))) => frame,
                Ok(Some(Decoded::Shm { id, frame })) => match self.on_shm(id, frame) {
                    Ok(Some(event)) => return Ok(Some(event)),
                    Ok(None) => continue,
                    Err(e) => return Err(self.fail(e)),
                },
                Ok(None) => {
                    if self.lend_to_message() {
                        continue;
                    }
                    return Ok(None);
                }
                Err(e) => return Err(self.fail(e)),
            };
            self.lent_back = self.decoder.take_returned();
            let handled = self.on_frame(frame);
            // Not taken (the frame was late, or failed): its buffer is not held any longer.
            self.lent_back = None;
            match handled {
                Ok(Some(event)) => return Ok(Some(event)),
                Ok(None) => continue,
                Err(e) => return Err(self.fail(e)),
            }
        }
    }

    /// Batch form of [`next_event`](Connection::next_event) (PROTOCOL.md 14.4): appends every
    /// event available now to `out` and returns how many. On a protocol violation the events
    /// before it are in `out` (act on them, then send the error with
    /// [`send_fatal`](Connection::send_fatal)) and the error is returned; the core is failed.
    ///
    /// ```
    /// use wirepool_proto::{Connection, Event, Hello};
    /// let mut worker = Connection::new_worker();
    /// let mut wire = Vec::new();
    /// worker.send_hello(&Hello::new("doc", "1"), &mut wire).unwrap();
    /// worker.send_ping([7; 8], &mut wire).unwrap_err(); // refused: before WELCOME
    /// let mut parent = Connection::new_parent();
    /// parent.receive(&wire);
    /// let mut events = Vec::new();
    /// assert_eq!(parent.next_events(&mut events).unwrap(), 1);
    /// assert!(matches!(events[..], [Event::Hello(_)]));
    /// ```
    pub fn next_events(&mut self, out: &mut Vec<Event>) -> Result<usize, ProtocolError> {
        let before = out.len();
        while let Some(event) = self.next_event()? {
            out.push(event);
        }
        Ok(out.len() - before)
    }

    /// The peer closed the stream. `TRUNCATED` if it stopped inside a frame; otherwise `Ok`
    /// and the driver ends what is still in flight ([`in_flight_ids`](Connection::in_flight_ids)).
    pub fn end_of_input(&mut self) -> Result<(), ProtocolError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let ended = self.decoder.end_of_input().map_err(|e| self.fail(e));
        self.drop_peer_regions();
        ended
    }

    /// The connection is over (end of input, or failed): the peer's regions leave the table
    /// (PROTOCOL.md 20.4); each stays mapped while views of it exist.
    fn drop_peer_regions(&mut self) {
        if let Some(lane) = self.lane.as_mut() {
            lane.mapped.clear();
            lane.lender.drop_holds();
        }
    }

    /// A large first frame with MORE is arriving: see [`lend_to_first`](Self::lend_to_first).
    /// A large CONTINUATION of a message in progress is arriving: lend the decoder the rest of
    /// the message's own buffer, so the payload is read straight into its final place instead
    /// of being copied there afterwards. Only when the frame will pass the size checks (else it
    /// takes the ordinary way and fails there), and within the connection's bound.
    fn lend_to_message(&mut self) -> bool {
        let Some(h) = self.decoder.pending_large() else {
            return false;
        };
        if h.more
            && matches!(
                h.frame_type,
                FrameType::Request | FrameType::Result | FrameType::End
            )
        {
            return self.lend_to_first(h);
        }
        if h.frame_type != FrameType::Continuation {
            return false;
        }
        let limit = self.welcome.map_or(u64::MAX, |w| w.max_message_size);
        let Some(partial) = self.partials.get_mut(&h.id) else {
            return false;
        };
        let len = u64::from(h.length);
        if partial.size + len > limit || self.partial_bytes + len > limit {
            return false;
        }
        let others = self.partial_bytes - partial.size;
        let budget = usize::try_from(limit - others).unwrap_or(usize::MAX);
        grow_body(&mut partial.body, h.length as usize, budget);
        // The view after the body, cut to exactly this payload: contiguous with the body, so
        // taking it back (`unsplit`) copies nothing.
        let mut tail = partial.body.split_off(partial.body.len());
        drop(tail.split_off(h.length as usize));
        self.decoder.lend(tail);
        true
    }

    /// The large first frame of a continued message is arriving: read it straight into the
    /// buffer the message will be reassembled in, so it is not copied there afterwards (issue
    /// 13). The buffer is the spare one when the reader has dropped the last message and it is
    /// large enough for a message as large as the last one, else a new one of that size (or
    /// twice this frame), within what the connection may still hold (`receive_budget`). Only on
    /// an open connection, for a type this side receives, and when the frame will pass the
    /// size checks of 11.2 step 6 (else it takes the ordinary way and fails there, in order):
    /// the wire does not announce a continued message's total, so nothing is reserved from a
    /// peer's claim, only from checked lengths.
    fn lend_to_first(&mut self, h: Header) -> bool {
        let Some(welcome) = self.welcome else {
            return false;
        };
        if !self.role.receives(h.frame_type) || self.failed.is_some() {
            return false;
        }
        let limit = welcome.max_message_size;
        let len = u64::from(h.length);
        if len > limit || self.partial_bytes + len > limit {
            return false;
        }
        let len = h.length as usize;
        let prefix = crate::decode::prefix_len(h.frame_type);
        let want = (self.last_message_len + prefix)
            .max(len.saturating_mul(2))
            .min(self.receive_budget())
            .max(len);
        let mut body = std::mem::take(&mut self.spare);
        if !body.try_reclaim(want) {
            body = BytesMut::with_capacity(want);
        }
        // The payload's view is the start of the buffer cut to exactly its length (a read
        // cannot run past the frame); the rest stays as `spare` until `start_partial` takes it
        // back (contiguous: `unsplit` copies nothing).
        self.spare = body.split_off(len);
        self.decoder.lend(body);
        true
    }

    fn fail(&mut self, e: ProtocolError) -> ProtocolError {
        self.failed = Some(e.clone());
        self.drop_peer_regions();
        e
    }

    fn on_frame(&mut self, frame: Frame) -> Result<Option<Event>, ProtocolError> {
        let ty = frame.frame_type();
        let id = frame.id;
        let unexpected = |why: &str| {
            err(
                ErrorCode::UnexpectedFrame,
                id,
                format!("{} {why}", ty.name()),
            )
        };

        // 1. Handshake phase and direction. ERROR id 0 (a refusal or a fatal report) is
        //    allowed at any time.
        if ty == FrameType::Error && id == 0 {
            return Ok(Some(event_from_frame(frame)));
        }
        match self.role {
            Role::Parent => {
                if self.hello.is_none() {
                    let FrameBody::Hello(hello) = frame.body else {
                        return Err(unexpected("before HELLO"));
                    };
                    choose_version(&hello, self.versions.0, self.versions.1)?;
                    self.hello = Some((*hello).clone());
                    return Ok(Some(Event::Hello(hello)));
                }
                if !self.is_open() {
                    return Err(unexpected("before WELCOME was sent"));
                }
                if !self.role.receives(ty) {
                    return Err(unexpected("is never sent by a worker"));
                }
                if ty == FrameType::Hello {
                    return Err(unexpected("a second time"));
                }
                if self.goodbye {
                    return Err(unexpected("after GOODBYE"));
                }
            }
            Role::Worker => {
                if self.welcome.is_none() {
                    let (Some(hello), FrameBody::Welcome(welcome)) = (&self.hello, &frame.body)
                    else {
                        return Err(unexpected(if self.hello.is_none() {
                            "before the worker's HELLO"
                        } else {
                            "before WELCOME"
                        }));
                    };
                    welcome.check_against(hello)?;
                    let welcome = *welcome;
                    self.open_with(welcome);
                    return Ok(Some(Event::Welcome(welcome)));
                }
                if !self.role.receives(ty) {
                    return Err(unexpected("is never sent by a parent"));
                }
                if ty == FrameType::Welcome {
                    return Err(unexpected("a second time"));
                }
                if ty == FrameType::Error {
                    return Err(unexpected(
                        "with a request id: a parent stops a request with CANCEL",
                    ));
                }
            }
        }

        // Connection-level frames.
        if ty.id_rule() == crate::frame::IdRule::Zero || (ty == FrameType::Event && id == 0) {
            match ty {
                FrameType::Drain => self.draining = true,
                FrameType::Goodbye => self.goodbye = true,
                _ => {}
            }
            return Ok(Some(event_from_frame(frame)));
        }

        // 2. Ids.
        if ty == FrameType::Request {
            if id <= self.highest_id {
                return Err(err(
                    ErrorCode::DuplicateId,
                    id,
                    format!(
                        "REQUEST id {id} is not above the previous {}",
                        self.highest_id
                    ),
                ));
            }
            self.highest_id = id;
            if frame.more {
                let size = frame_payload_len(&frame);
                self.start_partial(frame, size)?;
                return Ok(None);
            }
            return Ok(Some(self.accept(frame)));
        }
        if id > self.highest_id {
            return Err(err(
                ErrorCode::UnknownId,
                id,
                format!(
                    "{} for id {id}, above every request id ({})",
                    ty.name(),
                    self.highest_id
                ),
            ));
        }

        // 3. Continuation.
        if self.partials.contains_key(&id) {
            return self.on_frame_mid_message(frame);
        }
        if ty == FrameType::Continuation {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "CONTINUATION with no message in progress",
            ));
        }

        // 4. Late frames: ids at or below the highest that are not in flight.
        let Some(req) = self.requests.get_mut(&id) else {
            return Ok(Some(Event::Late { id, frame: ty }));
        };

        // 5. Kind, 6. counters.
        let kind_mismatch = |what: &str| {
            err(
                ErrorCode::KindMismatch,
                id,
                format!("{} for a {what} request", ty.name()),
            )
        };
        match (self.role, &frame.body) {
            (Role::Worker, FrameBody::Cancel) => Ok(Some(Event::Cancel { id })),
            (Role::Worker, FrameBody::Credit { bytes }) => {
                if req.kind != MethodKind::Stream {
                    return Err(kind_mismatch("unary"));
                }
                let credit = req.credit + i64::from(*bytes);
                if credit > MAX_CREDIT {
                    return Err(err(
                        ErrorCode::CreditOverflow,
                        id,
                        format!("credit {} + grant {bytes} exceeds 2^31 - 1", req.credit),
                    ));
                }
                req.credit = credit;
                Ok(Some(Event::Credit { id, bytes: *bytes }))
            }
            (Role::Parent, FrameBody::Rows(rows)) => {
                if req.kind != MethodKind::Stream {
                    return Err(kind_mismatch("unary"));
                }
                if req.credit <= 0 {
                    return Err(err(
                        ErrorCode::FlowControl,
                        id,
                        format!("ROWS while the stream's credit is {}", req.credit),
                    ));
                }
                req.charge_rows(rows.count(), rows.payload().len());
                Ok(Some(event_from_frame(frame)))
            }
            (Role::Parent, FrameBody::End { row_count, .. }) => {
                if req.kind != MethodKind::Stream {
                    return Err(kind_mismatch("unary"));
                }
                if *row_count != req.rows {
                    return Err(err(
                        ErrorCode::RowCountMismatch,
                        id,
                        format!("END says {row_count} rows, {} were received", req.rows),
                    ));
                }
                self.finish_or_start(frame)
            }
            (Role::Parent, FrameBody::Result { .. }) => {
                if req.kind != MethodKind::Unary {
                    return Err(kind_mismatch("stream"));
                }
                self.finish_or_start(frame)
            }
            (Role::Parent, FrameBody::Error { .. }) => {
                self.requests.remove(&id);
                Ok(Some(event_from_frame(frame)))
            }
            // EVENT for a request in flight.
            _ => Ok(Some(event_from_frame(frame))),
        }
    }

    /// Parent: a terminal RESULT/END, complete or the first frame of a continued one.
    fn finish_or_start(&mut self, frame: Frame) -> Result<Option<Event>, ProtocolError> {
        if frame.more {
            let size = frame_payload_len(&frame);
            self.start_partial(frame, size)?;
            return Ok(None);
        }
        self.requests.remove(&frame.id);
        Ok(Some(event_from_frame(frame)))
    }

    fn start_partial(&mut self, mut first: Frame, size: u64) -> Result<(), ProtocolError> {
        // A large first frame read into a lent buffer (`lend_to_first`): the frame holds only
        // its prefix, the buffer the whole payload.
        let lent = self.lent_back.take();
        let size = lent.as_ref().map_or(size, |b| b.len() as u64);
        self.check_message_size(first.id, size)?;
        self.check_partial_bytes(first.id, self.partial_bytes + size)?;
        self.partial_bytes += size;
        if let Some(mut body) = lent {
            body.unsplit(std::mem::take(&mut self.spare));
            body.advance(crate::decode::prefix_len(first.frame_type()));
            self.insert_partial(first, body, size);
            return Ok(());
        }
        let chunk = match &mut first.body {
            FrameBody::Request { body, .. }
            | FrameBody::Result { body }
            | FrameBody::End { summary: body, .. } => std::mem::take(body),
            _ => Bytes::new(),
        };
        // Sized for the message as large as the last one (or twice this chunk), within what
        // this connection may still hold: checked sizes only, never a peer's claim.
        let budget = self.receive_budget();
        if chunk.is_empty() && self.lane.is_some() {
            // Likely a body in shared memory (a first frame of only its prefix, 20.3): reserve
            // nothing; a CONTINUATION that follows instead grows the buffer as it arrives.
            self.insert_partial(first, BytesMut::new(), size);
            return Ok(());
        }
        let mut body = std::mem::take(&mut self.spare);
        if !body.try_reclaim(chunk.len()) {
            let guess = self.last_message_len.max(chunk.len() * 2);
            body = BytesMut::with_capacity(guess.min(budget).max(chunk.len()));
        }
        body.extend_from_slice(&chunk);
        self.insert_partial(first, body, size);
        Ok(())
    }

    /// A message in progress from its first frame (already checked and counted).
    fn insert_partial(&mut self, first: Frame, body: BytesMut, size: u64) {
        let partial = Partial {
            first,
            body,
            size,
            continued: false,
        };
        self.partials.insert(partial.first.id, partial);
    }

    /// The most a buffer of a message in progress may reserve: `max_message_size` less what
    /// the other messages in progress hold (section 5's per-connection bound, applied to
    /// capacity too, so reserving ahead never holds more than the wire could fill).
    fn receive_budget(&self) -> usize {
        let limit = self.welcome.map_or(u64::MAX, |w| w.max_message_size);
        usize::try_from(limit.saturating_sub(self.partial_bytes)).unwrap_or(usize::MAX)
    }

    fn check_message_size(&self, id: u64, size: u64) -> Result<(), ProtocolError> {
        let limit = self.welcome.map_or(u64::MAX, |w| w.max_message_size);
        if size > limit {
            return Err(err(
                ErrorCode::MessageTooLarge,
                id,
                format!("message reached {size} bytes, above max_message_size {limit}"),
            ));
        }
        Ok(())
    }

    /// Section 5: the sum over all messages in progress is bounded by `max_message_size` too.
    fn check_partial_bytes(&self, id: u64, total: u64) -> Result<(), ProtocolError> {
        let limit = self.welcome.map_or(u64::MAX, |w| w.max_message_size);
        if total > limit {
            return Err(err(
                ErrorCode::MessageTooLarge,
                id,
                format!(
                    "messages in progress reached {total} bytes, above max_message_size \
                     {limit} for the whole connection"
                ),
            ));
        }
        Ok(())
    }

    fn remove_partial(&mut self, id: u64) -> Option<Partial> {
        let partial = self.partials.remove(&id)?;
        self.partial_bytes -= partial.size;
        Some(partial)
    }

    fn on_frame_mid_message(&mut self, frame: Frame) -> Result<Option<Event>, ProtocolError> {
        let id = frame.id;
        match (self.role, frame.body) {
            (_, FrameBody::Continuation { chunk }) => {
                // The payload is in the message's buffer already (lent), or it is `chunk`.
                let lent = self.lent_back.take();
                let len = lent.as_ref().map_or(chunk.len(), BytesMut::len) as u64;
                let size = self.partials.get(&id).map_or(0, |p| p.size) + len;
                self.check_message_size(id, size)?;
                let total = self.partial_bytes + len;
                self.check_partial_bytes(id, total)?;
                let Some(partial) = self.partials.get_mut(&id) else {
                    return Ok(None);
                };
                // This message's own bytes count once in the budget, not twice.
                let budget = usize::try_from(
                    self.welcome
                        .map_or(u64::MAX, |w| w.max_message_size)
                        .saturating_sub(total - size),
                )
                .unwrap_or(usize::MAX);
                self.partial_bytes = total;
                partial.size = size;
                partial.continued = true;
                if let Some(lent) = lent {
                    partial.body.unsplit(lent);
                } else {
                    grow_body(&mut partial.body, chunk.len(), budget);
                    partial.body.extend_from_slice(&chunk);
                }
                drop(chunk);
                if frame.more {
                    return Ok(None);
                }
                let Some(Partial {
                    mut first,
                    body: mut whole,
                    ..
                }) = self.remove_partial(id)
                else {
                    return Ok(None);
                };
                first.more = false;
                let message = whole.split().freeze();
                self.last_message_len = message.len();
                // What is left is an empty view of the same allocation: reclaimed for the next
                // message once the reader drops this one.
                self.spare = whole;
                Ok(Some(self.complete(first, message)))
            }
            // CANCEL abandons a request still arriving; it still needs a terminal.
            (Role::Worker, FrameBody::Cancel) => {
                self.remove_partial(id);
                Ok(Some(self.reject(id, ErrorCode::Cancelled)))
            }
            // ERROR abandons a result or summary still arriving; it is the terminal.
            (Role::Parent, body @ FrameBody::Error { .. }) => {
                self.remove_partial(id);
                self.requests.remove(&id);
                Ok(Some(event_from_frame(Frame::new(id, body))))
            }
            (_, body) => Err(err(
                ErrorCode::Continuation,
                id,
                format!(
                    "{} for id {id} while a continued message is in progress",
                    body.frame_type().name()
                ),
            )),
        }
    }

    /// A continued message is whole: `message` is its body (or summary).
    fn complete(&mut self, mut first: Frame, message: Bytes) -> Event {
        first.more = false;
        match &mut first.body {
            FrameBody::Request { body, .. }
            | FrameBody::Result { body }
            | FrameBody::End { summary: body, .. } => *body = message,
            _ => {}
        }
        if first.frame_type() == FrameType::Request {
            self.accept(first)
        } else {
            self.requests.remove(&first.id);
            event_from_frame(first)
        }
    }

    /// A frame of the shared-memory lane (its types exist only while the lane is on, and the
    /// connection is open: the decoder turned them on with the WELCOME).
    fn on_shm(&mut self, id: u64, frame: ShmFrame) -> Result<Option<Event>, ProtocolError> {
        if self.role == Role::Parent && self.goodbye {
            return Err(err(
                ErrorCode::UnexpectedFrame,
                id,
                format!("shm frame {:#04x} after GOODBYE", frame.type_byte()),
            ));
        }
        let Some(lane) = self.lane.as_mut() else {
            return Err(err(
                ErrorCode::UnknownFrameType,
                id,
                format!("frame type {:#04x}", frame.type_byte()),
            ));
        };
        match frame {
            ShmFrame::Region { region, size } => {
                lane.borrower.region(region, size)?;
                let Some(map) = self.shm_mapper.0.as_mut() else {
                    return Err(err(
                        ErrorCode::ShmBadDescriptor,
                        0,
                        format!("SHM_REGION {region}: this side cannot map regions"),
                    ));
                };
                let mapping = map(region, size)?;
                lane.mapped.insert(region, mapping);
                Ok(None)
            }
            ShmFrame::Release(r) => {
                lane.lender.released(r)?;
                Ok(None)
            }
            ShmFrame::Retire { region } => {
                lane.borrower.retire(region)?;
                // Views of it keep the mapping alive until they are dropped.
                lane.mapped.remove(&region);
                Ok(None)
            }
            ShmFrame::Body(r) => self.on_shm_body(id, r),
        }
    }

    /// SHM_BODY: the last part of the message in progress for `id` (20.3, checks of 20.5).
    fn on_shm_body(&mut self, id: u64, r: ShmRange) -> Result<Option<Event>, ProtocolError> {
        if id > self.highest_id {
            return Err(err(
                ErrorCode::UnknownId,
                id,
                format!(
                    "SHM_BODY for id {id}, above every request id ({})",
                    self.highest_id
                ),
            ));
        }
        let Some(partial) = self.partials.get(&id) else {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "SHM_BODY with no message in progress",
            ));
        };
        if partial.continued || !partial.body.is_empty() {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "SHM_BODY after a body byte or CONTINUATION of its message",
            ));
        }
        let size = partial.size.saturating_add(r.length);
        let Some(lane) = self.lane.as_mut() else {
            return Ok(None);
        };
        lane.borrower.body(id, r)?;
        let mapping = lane.mapped.get(&r.region).cloned();
        self.check_message_size(id, size)?;
        let Some(mapping) = mapping else {
            return Err(err(
                ErrorCode::ShmBounds,
                id,
                format!("region {} is not mapped", r.region),
            ));
        };
        let queue = self.shm_releases.clone();
        let view = mapping.lend(r.offset, r.length, Box::new(move || queue.push(r)))?;
        let Some(Partial { first, .. }) = self.remove_partial(id) else {
            return Ok(None);
        };
        Ok(Some(self.complete(first, view)))
    }

    /// Worker: accept a complete REQUEST or reject it.
    fn accept(&mut self, frame: Frame) -> Event {
        let id = frame.id;
        let FrameBody::Request {
            method,
            codec,
            timeout_us,
            body,
        } = frame.body
        else {
            return Event::Late {
                id,
                frame: frame.body.frame_type(),
            };
        };
        let (kind, initial_credit) = match self.check_accept(method, codec) {
            Ok(accepted) => accepted,
            Err(code) => return self.reject(id, code),
        };
        self.requests
            .insert(id, StreamSendState::new(kind, initial_credit));
        Event::Request {
            id,
            method,
            codec,
            timeout_us,
            body,
        }
    }

    /// Section 11.2 step 10, in order: the method's kind and the initial credit, or why the
    /// request is refused.
    fn check_accept(&self, method: u16, codec: u8) -> Result<(MethodKind, u32), ErrorCode> {
        if self.draining {
            return Err(ErrorCode::Draining);
        }
        let info = self
            .hello
            .as_ref()
            .and_then(|h| h.methods.get(method as usize))
            .ok_or(ErrorCode::UnknownMethod)?;
        if !info.codecs.contains(&codec) {
            return Err(ErrorCode::CodecUnsupported);
        }
        let welcome = self.welcome.ok_or(ErrorCode::Overloaded)?;
        if self.requests.len() >= welcome.max_in_flight as usize {
            return Err(ErrorCode::Overloaded);
        }
        Ok((info.kind, welcome.initial_credit))
    }

    /// Worker: refuse request `id`; the driver owes it one ERROR (see `unanswered_rejects`).
    fn reject(&mut self, id: u64, code: ErrorCode) -> Event {
        self.unanswered_rejects.insert(id);
        Event::Reject { id, code }
    }

    fn open_with(&mut self, welcome: Welcome) {
        self.welcome = Some(welcome);
        self.decoder.set_max_frame_size(welcome.max_frame_size);
        let early = std::mem::take(&mut self.early_descriptors);
        if let Some(accept) = welcome.extensions.shm {
            let (out, inn) = match self.role {
                Role::Parent => (accept.to_worker_window, accept.to_parent_window),
                Role::Worker => (accept.to_parent_window, accept.to_worker_window),
            };
            let mut borrower = Borrower::new(inn);
            if let Err(e) = borrower.descriptors_received(early) {
                self.descriptor_error.get_or_insert(e);
            }
            self.lane = Some(Lane {
                accept,
                lender: Lender::new(out),
                borrower,
                mapped: Default::default(),
            });
            self.decoder.set_shm(true);
        } else if early > 0 {
            self.descriptor_error
                .get_or_insert(lane_off_descriptors(early));
        }
    }

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

    /// Parent: grant `bytes` of credit to stream `id` (`CREDIT_OVERFLOW` if it would exceed
    /// 2^31 - 1). Prefer [`consumed`](Connection::consumed), which applies the grant policy.
    pub fn send_credit(
        &mut self,
        id: u64,
        bytes: u32,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send(FrameType::Credit, id)?;
        let req = self.in_flight_state(id, FrameType::Credit)?;
        if req.kind != MethodKind::Stream {
            return Err(err(
                ErrorCode::KindMismatch,
                id,
                "CREDIT for a unary request",
            ));
        }
        // The worker fails a connection that sends another frame for an id whose REQUEST is
        // still arriving (section 5).
        if req.sending.is_some() {
            return Err(err(
                ErrorCode::Continuation,
                id,
                "CREDIT for a request still being sent",
            ));
        }
        if bytes == 0 {
            return Err(err(ErrorCode::BadPayload, id, "CREDIT of 0 bytes"));
        }
        let credit = req.credit + i64::from(bytes);
        if credit > MAX_CREDIT {
            return Err(err(
                ErrorCode::CreditOverflow,
                id,
                format!("credit {} + {bytes} exceeds 2^31 - 1", req.credit),
            ));
        }
        req.credit = credit;
        req.consumed = req.consumed.saturating_sub(u64::from(bytes));
        put_header(out, FrameType::Credit, false, id, 4)?;
        out.put_u32_le(bytes);
        Ok(())
    }

    /// Parent: the consumer has read `bytes` of ROWS payload of stream `id`
    /// (`rows.payload().len()` of each [`Event::Rows`]). The bytes add to the stream's consumed
    /// count; the grant is [`grant`](crate::grant)'s (PROTOCOL.md 14.5): once half the window is
    /// consumed, a CREDIT for it is encoded into `out`. Returns the bytes granted: 0 (nothing
    /// written, never an error) below half the window, while the stream's request is still
    /// being sent (the bytes stay counted), after the request ended, and once the connection
    /// failed or said GOODBYE.
    pub fn consumed(
        &mut self,
        id: u64,
        bytes: usize,
        out: &mut impl FrameBuf,
    ) -> Result<u32, ProtocolError> {
        let closed = self.goodbye || self.send_closed || self.failed.is_some();
        let Some(req) = self.requests.get_mut(&id) else {
            return Ok(0);
        };
        if req.kind != MethodKind::Stream {
            return Ok(0);
        }
        req.consumed = req.consumed.saturating_add(bytes as u64);
        if closed || req.sending.is_some() {
            return Ok(0);
        }
        let granted = crate::policy::grant(req.window, req.credit, req.consumed);
        if granted == 0 {
            return Ok(0);
        }
        self.send_credit(id, granted, out)?;
        Ok(granted)
    }

    /// Parent: the driver measured a PING's round trip (its send to its PONG, microseconds; 0
    /// counts as 1). [`consumed_at`](Connection::consumed_at) adapts windows to the smallest
    /// seen: a PONG that waited behind queued rows measures the queue, not the link.
    pub fn observe_rtt(&mut self, rtt_us: u64) {
        let rtt = rtt_us.max(1);
        if self.min_rtt_us == 0 || rtt < self.min_rtt_us {
            self.min_rtt_us = rtt;
        }
    }

    /// Parent: the caps of PROTOCOL.md 6 on the adaptive windows (defaults
    /// [`MAX_STREAM_WINDOW`], [`MAX_CONNECTION_WINDOW`]); a window above a lowered cap stays
    /// until it shrinks.
    pub fn set_window_caps(&mut self, max_stream_window: u32, max_connection_window: u32) {
        self.window_caps = (max_stream_window, max_connection_window);
    }

    /// Parent: [`consumed`](Connection::consumed) with the driver's monotonic clock `now_us`,
    /// adapting the stream's window at each grant ([`stream_window`](crate::stream_window),
    /// PROTOCOL.md 6) from the time since its previous grant (the first call starts its clock)
    /// and the round trip of [`observe_rtt`](Connection::observe_rtt): the grant is the
    /// consumed bytes plus the new window minus the old (a capped rest waits). Without a round
    /// trip observed the window stays `initial_credit`.
    pub fn consumed_at(
        &mut self,
        id: u64,
        bytes: usize,
        now_us: u64,
        out: &mut impl FrameBuf,
    ) -> Result<u32, ProtocolError> {
        let initial = self.welcome.map_or(0, |w| w.initial_credit);
        let closed = self.goodbye || self.send_closed || self.failed.is_some();
        let (max_stream, max_connection) = self.window_caps;
        let total: u64 = self
            .requests
            .values()
            .filter(|r| r.kind == MethodKind::Stream)
            .map(|r| u64::from(r.window))
            .sum();
        let rtt = self.min_rtt_us;
        let Some(req) = self.requests.get_mut(&id) else {
            return Ok(0);
        };
        if req.kind != MethodKind::Stream || closed {
            return Ok(0);
        }
        req.consumed = req.consumed.saturating_add(bytes as u64);
        let since = *req.clock.get_or_insert(now_us);
        if req.sending.is_some() {
            return Ok(0);
        }
        let old = req.window;
        if crate::policy::grant(old, req.credit, req.consumed) == 0 {
            return Ok(0);
        }
        let room = u64::from(max_connection).saturating_sub(total);
        // Rows the consumer has not read yet (window - credit - consumed): a consumer behind on
        // what arrived drains a backlog, which says nothing of the window; it never grows then.
        let unread = i64::from(old) - req.credit - req.consumed as i64;
        let behind = unread >= i64::from(old / 4);
        let grown = crate::policy::stream_window(
            old,
            initial,
            now_us.saturating_sub(since),
            rtt,
            max_stream,
            room,
        );
        let new = if behind { grown.min(old) } else { grown };
        // >= 0: a halving takes at most half the window, and half of it was consumed.
        let want = (req.consumed + u64::from(new)).saturating_sub(u64::from(old));
        let room = u64::try_from(MAX_CREDIT.saturating_sub(req.credit)).unwrap_or(0);
        let granted = want.min(room) as u32;
        if granted > 0 {
            self.send_credit(id, granted, out)?;
        }
        if let Some(req) = self.requests.get_mut(&id) {
            req.clock = Some(now_us);
            req.window = new;
            req.consumed = want - u64::from(granted);
        }
        Ok(granted)
    }

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
    // The shared-memory lane (PROTOCOL.md 20)

    /// The lane's windows when the WELCOME turned it on (`None`: off, its frames do not exist).
    pub fn shm(&self) -> Option<ShmAccept> {
        self.lane.as_ref().map(|l| l.accept)
    }

    /// This side's regions and lent ranges (what it may still announce and lend), when the
    /// lane is on.
    pub fn shm_lender(&self) -> Option<&Lender> {
        self.lane.as_ref().map(|l| &l.lender)
    }

    /// Keeps `keep` until the peer releases the lent range `r` (or the connection ends): call
    /// it right after `send_*_shm(.., r, ..)` with a `Bytes` view of the bytes lent, so the
    /// region cannot be written again meanwhile (see [`Lender::hold`]). `Err(keep)` when `r`
    /// is not lent (the lane is off, or the send failed).
    pub fn shm_hold(&mut self, r: ShmRange, keep: bytes::Bytes) -> Result<(), bytes::Bytes> {
        match self.lane.as_mut() {
            Some(lane) => lane.lender.hold(r, keep),
            None => Err(keep),
        }
    }

    /// The driver's mapper for the peer's regions: called for each SHM_REGION whose frame
    /// checks passed, it takes the oldest descriptor received and checks and maps it (20.5).
    /// Without one, a SHM_REGION is `SHM_BAD_DESCRIPTOR`.
    pub fn set_shm_mapper(&mut self, mapper: ShmMapper) {
        self.shm_mapper = MapperSlot(Some(mapper));
    }

    /// Called (on any thread) when a view of a received body is dropped and its SHM_RELEASE
    /// waits: wake the driver, which sends it with [`send_shm_releases`](Self::send_shm_releases).
    pub fn set_shm_release_waker(&mut self, wake: std::sync::Arc<dyn Fn() + Send + Sync>) {
        self.shm_releases.set_waker(wake);
    }

    /// `n` descriptors arrived with the bytes of a read (`SCM_RIGHTS`), queued by the driver
    /// for its mapper. More than 8 waiting, or any where the lane is off, fails the connection
    /// (`SHM_BAD_DESCRIPTOR`) at the next [`next_event`](Self::next_event); the driver closes
    /// the descriptors then.
    pub fn shm_descriptors_received(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        // The worker that offered the lane reads with recvmsg from its HELLO on: a region may
        // arrive in the same read as the WELCOME that turns the lane on.
        let before_welcome = self.role == Role::Worker
            && !self.is_open()
            && self
                .hello
                .as_ref()
                .is_some_and(|h| h.extensions.shm.is_some());
        let result = match self.lane.as_mut() {
            Some(lane) => lane.borrower.descriptors_received(n),
            None if before_welcome => {
                self.early_descriptors += n;
                if self.early_descriptors > MAX_QUEUED_DESCRIPTORS {
                    Err(err(
                        ErrorCode::ShmBadDescriptor,
                        0,
                        format!(
                            "{} descriptors waiting for a SHM_REGION",
                            self.early_descriptors
                        ),
                    ))
                } else {
                    Ok(())
                }
            }
            None => Err(lane_off_descriptors(n)),
        };
        if let Err(e) = result {
            self.descriptor_error.get_or_insert(e);
        }
    }

    fn check_can_send_shm(&self, what: &str) -> Result<(), ProtocolError> {
        let refuse = |why: &str| {
            Err(err(
                ErrorCode::UnexpectedFrame,
                0,
                format!("cannot send {what}: {why}"),
            ))
        };
        if self.send_closed {
            return refuse("this side already sent GOODBYE or a fatal ERROR");
        }
        if !self.is_open() {
            return refuse("the handshake is not complete");
        }
        if self.lane.is_none() {
            return refuse("the shm lane is off");
        }
        if self.role == Role::Parent && self.goodbye {
            return refuse("the worker said GOODBYE");
        }
        Ok(())
    }

    /// Announce a region of `size` bytes: records it and writes its SHM_REGION; returns its id.
    /// The driver sends the region's descriptor with the write holding this frame's first byte
    /// (20.5). Refused: lane off or connection closed (`UNEXPECTED_FRAME`), or the region does
    /// not fit the window or the 64 live regions (`SHM_BAD_REGION`).
    pub fn send_shm_region(
        &mut self,
        size: u64,
        out: &mut impl FrameBuf,
    ) -> Result<u32, ProtocolError> {
        self.check_can_send_shm("SHM_REGION")?;
        let lane = self.lane.as_mut().expect("checked: the lane is on");
        let region = lane.lender.announce(size)?;
        let mut frame = Vec::with_capacity(32);
        ShmFrame::Region { region, size }.encode(0, &mut frame);
        out.put_slice(&frame);
        Ok(region)
    }

    /// Withdraw region `region` (none of it lent): writes SHM_RETIRE; the driver may then drop
    /// it. Refused with `SHM_BAD_RELEASE` while a range of it is lent or if it is not live.
    pub fn send_shm_retire(
        &mut self,
        region: u32,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send_shm("SHM_RETIRE")?;
        let lane = self.lane.as_mut().expect("checked: the lane is on");
        lane.lender.retire(region)?;
        let mut frame = Vec::with_capacity(24);
        ShmFrame::Retire { region }.encode(0, &mut frame);
        out.put_slice(&frame);
        Ok(())
    }

    /// Whether views of received bodies were dropped and their SHM_RELEASEs wait.
    pub fn has_shm_releases(&self) -> bool {
        !self.shm_releases.is_empty()
    }

    /// Write a SHM_RELEASE for every range whose last view was dropped; returns how many. When
    /// the connection can send nothing more they are dropped (the peer is gone or going).
    pub fn send_shm_releases(&mut self, out: &mut impl FrameBuf) -> usize {
        let ranges = self.shm_releases.take();
        if self.check_can_send_shm("SHM_RELEASE").is_err() {
            return 0;
        }
        let lane = self.lane.as_mut().expect("checked: the lane is on");
        let mut frame = Vec::with_capacity(40);
        let mut sent = 0;
        for r in ranges {
            // A range not held is impossible (each view releases once); skip it rather than
            // send the peer a release it would refuse.
            if lane.borrower.release(r).is_ok() {
                frame.clear();
                ShmFrame::Release(r).encode(0, &mut frame);
                out.put_slice(&frame);
                sent += 1;
            }
        }
        sent
    }

    /// Parent: [`send_request`](Self::send_request) with the body in shared memory: range `r`
    /// of one of this side's regions, which the driver has written. Writes the REQUEST (`MORE`,
    /// its prefix only) and the SHM_BODY that lends `r` (20.3); returns the id. Refused as
    /// `send_request` is, and with `SHM_BOUNDS` for a range not in a live region or above the
    /// window (nothing written, nothing lent).
    pub fn send_request_shm(
        &mut self,
        method: u16,
        codec: u8,
        timeout_us: u64,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<u64, ProtocolError> {
        self.check_can_send_shm("SHM_BODY")?;
        let id = self.highest_id + 1;
        let head = MessageHead::Request {
            method,
            codec,
            timeout_us,
        };
        let kind = self.check_request(id, method, shm_message_len(head, r))?;
        self.write_shm_message(id, head, r, out)?;
        self.record_request(id, kind);
        Ok(id)
    }

    /// Worker: [`send_result`](Self::send_result) with the body in range `r` of one of this
    /// side's regions (see [`send_request_shm`](Self::send_request_shm)). Ends the request.
    pub fn send_result_shm(
        &mut self,
        id: u64,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.send_terminal_shm(id, MessageHead::Result, r, out)
    }

    /// Worker: [`send_end`](Self::send_end) with the summary in range `r` of one of this
    /// side's regions. Ends the request.
    pub fn send_end_shm(
        &mut self,
        id: u64,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        let row_count = self.requests.get(&id).map_or(0, |q| q.rows);
        self.send_terminal_shm(id, MessageHead::End { row_count }, r, out)
    }

    fn send_terminal_shm(
        &mut self,
        id: u64,
        head: MessageHead,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        self.check_can_send_shm("SHM_BODY")?;
        let ty = head.frame_type();
        self.check_can_send(ty, id)?;
        self.check_message_size(id, shm_message_len(head, r))?;
        self.terminal_state(id, ty)?;
        self.write_shm_message(id, head, r, out)?;
        self.requests.remove(&id);
        Ok(())
    }

    /// Lends `r` (the last check) and writes the first frame (`MORE`, prefix only) and the
    /// SHM_BODY.
    fn write_shm_message(
        &mut self,
        id: u64,
        head: MessageHead,
        r: ShmRange,
        out: &mut impl FrameBuf,
    ) -> Result<(), ProtocolError> {
        let lane = self.lane.as_mut().expect("checked: the lane is on");
        lane.lender.lend(r).map_err(|mut e| {
            e.id = id;
            e
        })?;
        let mut frames = Vec::with_capacity(2 * crate::HEADER_LEN + 24 + head.prefix_len());
        put_header(&mut frames, head.frame_type(), true, id, head.prefix_len())?;
        head.put_prefix(&mut frames);
        ShmFrame::Body(r).encode(id, &mut frames);
        out.put_slice(&frames);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::{MethodInfo, MethodKind};

    /// A worker core past the handshake with these limits.
    fn open_worker(max_frame_size: u32, max_message_size: u64) -> Connection {
        let hello = Hello {
            methods: vec![MethodInfo {
                name: "echo".into(),
                kind: MethodKind::Unary,
                codecs: vec![0],
            }],
            ..Hello::new("test", "1")
        };
        let mut worker = Connection::new_worker();
        worker.send_hello(&hello, &mut Vec::new()).unwrap();
        let welcome = Welcome {
            max_frame_size,
            max_message_size,
            ..Welcome::for_hello(&hello, 1).unwrap()
        };
        let mut wire = Vec::new();
        Frame::new(0, FrameBody::Welcome(welcome))
            .encode(&mut wire)
            .unwrap();
        worker.receive(&wire);
        assert!(matches!(worker.next_event(), Ok(Some(Event::Welcome(_)))));
        worker
    }

    fn request(id: u64, more: bool, body: Vec<u8>) -> Vec<u8> {
        let mut frame = Frame::new(
            id,
            FrameBody::Request {
                method: 0,
                codec: 0,
                timeout_us: 0,
                body: body.into(),
            },
        );
        frame.more = more;
        let mut wire = Vec::new();
        frame.encode(&mut wire).unwrap();
        wire
    }

    fn continuation(id: u64, more: bool, chunk: Vec<u8>) -> Vec<u8> {
        let mut frame = Frame::new(
            id,
            FrameBody::Continuation {
                chunk: chunk.into(),
            },
        );
        frame.more = more;
        let mut wire = Vec::new();
        frame.encode(&mut wire).unwrap();
        wire
    }

    /// Every byte reserved for messages in progress or kept for the next one.
    fn reserved(conn: &Connection) -> usize {
        conn.spare.capacity()
            + conn
                .partials
                .values()
                .map(|p| p.body.capacity())
                .sum::<usize>()
    }

    #[test]
    fn reassembly_never_reserves_past_the_connection_bound() {
        const LIMIT: u64 = 300_000;
        const PREFIX: u64 = 12;
        let mut worker = open_worker(65_536, LIMIT);
        // A 250,000-byte message: the guess for the next one's buffer.
        worker.receive(&request(1, true, vec![1; 60_000]));
        for more in [true, true, true, false] {
            worker.receive(&continuation(1, more, vec![1; 47_500]));
        }
        let Ok(Some(Event::Request { body, .. })) = worker.next_event() else {
            panic!("no request")
        };
        assert_eq!(body.len(), 60_000 + 4 * 47_500);
        drop(body);
        assert!(reserved(&worker) as u64 <= LIMIT);

        // Two messages in progress at once: the second's buffer is sized within what the
        // connection may still hold, not from the previous message's size.
        worker.receive(&request(2, true, vec![2; 60_000]));
        worker.receive(&request(3, true, vec![3; 60_000]));
        assert!(matches!(worker.next_event(), Ok(None)));
        assert_eq!(worker.partial_bytes, 2 * (PREFIX + 60_000));
        assert!(worker.partials[&3].body.capacity() as u64 <= LIMIT - (PREFIX + 60_000));
        // Growing them stays within the bound too, until the sum passes it: the typed error,
        // raised before anything is reserved for the offending chunk.
        worker.receive(&continuation(2, true, vec![2; 60_000]));
        worker.receive(&continuation(3, true, vec![3; 60_000]));
        assert!(matches!(worker.next_event(), Ok(None)));
        assert!(worker
            .partials
            .values()
            .all(|p| p.body.capacity() as u64 <= LIMIT));
        let before = reserved(&worker);
        worker.receive(&continuation(2, true, vec![2; 60_001]));
        let e = worker.next_event().unwrap_err();
        assert_eq!(e.code, ErrorCode::MessageTooLarge);
        assert_eq!(reserved(&worker), before);
    }

    /// Feeds `wire` as a driver reading a socket would: into `read_buffer`, never past its
    /// spare capacity (a lent buffer's is exactly the rest of its frame), collecting events.
    fn feed(conn: &mut Connection, mut wire: &[u8], events: &mut Vec<Event>) {
        while !wire.is_empty() {
            let rb = conn.read_buffer();
            let n = (rb.capacity() - rb.len()).min(wire.len()).min(1 << 20);
            rb.extend_from_slice(&wire[..n]);
            wire = &wire[n..];
            conn.next_events(events).unwrap();
        }
    }

    /// Where the next payload byte read through `read_buffer` lands.
    fn read_at(conn: &mut Connection) -> usize {
        let rb = conn.read_buffer();
        rb.as_ptr() as usize + rb.len()
    }

    #[test]
    fn a_large_first_frame_is_read_into_the_message_buffer_and_that_buffer_is_reused() {
        const FIRST: usize = 3 << 20; // above the decoder's OWN_BUFFER_MIN
        let mut worker = open_worker(4 << 20, 64 << 20);
        let mut start = 0;
        for (id, fill) in [(1, 1u8), (2, 2)] {
            let first = request(id, true, vec![fill; FIRST]);
            let mut events = Vec::new();
            // Header and prefix, then one byte of the body: the frame is pending, lent.
            feed(&mut worker, &first[..16 + 12 + 1], &mut events);
            let at = read_at(&mut worker) - 12 - 1;
            feed(&mut worker, &first[16 + 12 + 1..], &mut events);
            feed(
                &mut worker,
                &continuation(id, false, vec![9; 1024]),
                &mut events,
            );
            let [Event::Request { id: got, body, .. }] = &events[..] else {
                panic!("{events:?}")
            };
            assert_eq!(*got, id);
            assert_eq!(body.len(), FIRST + 1024);
            assert!(body[..FIRST].iter().all(|&b| b == fill));
            assert!(body[FIRST..].iter().all(|&b| b == 9));
            // The body starts where the first frame's bytes were read, after its prefix: not
            // copied into a reassembly buffer.
            assert_eq!(body.as_ptr() as usize, at + 12);
            if id == 1 {
                start = at;
            } else {
                // The reader dropped the first message: its buffer took the second one.
                assert_eq!(at, start);
            }
            assert_eq!(worker.partial_bytes, 0);
            worker.send_result(id, b"", &mut Vec::new()).unwrap();
        }
        assert!(reserved(&worker) <= 64 << 20);
    }

    #[test]
    fn a_large_first_frame_past_the_limits_fails_in_order_without_a_lent_buffer() {
        // One frame above max_message_size itself: MESSAGE_TOO_LARGE, as without the lending.
        let mut worker = open_worker(4 << 20, 4 << 20);
        let mut events = Vec::new();
        worker.receive(&request(1, true, vec![1; 3 << 20]));
        worker.next_events(&mut events).unwrap();
        worker.receive(&request(2, true, vec![1; (3 << 20) - 16]));
        assert_eq!(
            worker.next_events(&mut events).unwrap_err().code,
            ErrorCode::MessageTooLarge
        );
        assert!(events.is_empty());
        // A duplicate id comes before the size: DUPLICATE_ID, lent or not.
        let mut worker = open_worker(4 << 20, 64 << 20);
        worker.receive(&request(5, false, vec![1; 10]));
        assert_eq!(worker.next_events(&mut events).unwrap(), 1);
        let dup = request(5, true, vec![1; 3 << 20]);
        feed_err(&mut worker, &dup, ErrorCode::DuplicateId);
    }

    fn feed_err(conn: &mut Connection, mut wire: &[u8], code: ErrorCode) {
        while !wire.is_empty() {
            let rb = conn.read_buffer();
            let n = (rb.capacity() - rb.len()).min(wire.len());
            rb.extend_from_slice(&wire[..n]);
            wire = &wire[n..];
            match conn.next_event() {
                Ok(None) => {}
                Ok(Some(e)) => panic!("{e:?}"),
                Err(e) => {
                    assert_eq!(e.code, code);
                    assert!(wire.is_empty());
                    return;
                }
            }
        }
        panic!("no error");
    }

    #[test]
    fn one_message_past_max_message_size_is_refused_before_its_buffer_grows() {
        let mut worker = open_worker(65_536, 100_000);
        worker.receive(&request(1, true, vec![1; 60_000]));
        assert!(matches!(worker.next_event(), Ok(None)));
        let before = reserved(&worker);
        worker.receive(&continuation(1, false, vec![1; 40_001]));
        let e = worker.next_event().unwrap_err();
        assert_eq!(e.code, ErrorCode::MessageTooLarge);
        assert_eq!(reserved(&worker), before);
        assert!(before <= 100_000);
    }
}
