//! Encoders into caller-provided buffers: any frame, continued messages, and ROWS row by row.

use bytes::{BufMut, BytesMut};

use crate::connection::StreamSendState;
use crate::error::{err, ErrorCode, ProtocolError};
use crate::frame::{Frame, FrameBody, FrameType, Header, IdRule, HEADER_LEN};

/// An output buffer frames are encoded into: `Vec<u8>` or [`BytesMut`]. Encoders append; the
/// ROWS builder also patches its header in place, hence the extra methods.
pub trait FrameBuf: BufMut {
    /// Bytes written so far.
    fn written(&self) -> usize;
    /// Drop everything after the first `len` bytes.
    fn truncate_to(&mut self, len: usize);
    /// The written bytes, mutable.
    fn written_mut(&mut self) -> &mut [u8];
    /// Make room for `additional` more bytes (a hint: one allocation for a large message).
    fn reserve_more(&mut self, additional: usize);
    /// Append the whole of `bytes` and leave it empty. The default copies; a buffer that
    /// queues chunks may take the allocation itself instead (then `bytes` gets a fresh one of
    /// the same capacity): how a [`RowsFrame`] goes out without a copy.
    fn append_vec(&mut self, bytes: &mut Vec<u8>) {
        self.put_slice(bytes);
        bytes.clear();
    }
}

impl FrameBuf for Vec<u8> {
    fn written(&self) -> usize {
        self.len()
    }
    fn truncate_to(&mut self, len: usize) {
        self.truncate(len);
    }
    fn written_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
    fn reserve_more(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

impl FrameBuf for BytesMut {
    fn written(&self) -> usize {
        self.len()
    }
    fn truncate_to(&mut self, len: usize) {
        self.truncate(len);
    }
    fn written_mut(&mut self) -> &mut [u8] {
        self.as_mut()
    }
    fn reserve_more(&mut self, additional: usize) {
        self.reserve(additional);
    }
}

pub(crate) fn put_header(
    out: &mut impl FrameBuf,
    frame_type: FrameType,
    more: bool,
    id: u64,
    payload_len: usize,
) -> Result<(), ProtocolError> {
    let length = u32::try_from(payload_len).map_err(|_| {
        err(
            ErrorCode::FrameTooLarge,
            id,
            format!("payload of {payload_len} bytes does not fit a frame"),
        )
    })?;
    out.put_slice(
        &Header {
            length,
            frame_type,
            more,
            id,
        }
        .to_bytes(),
    );
    Ok(())
}

fn check_header_rules(frame_type: FrameType, more: bool, id: u64) -> Result<(), ProtocolError> {
    if more && !frame_type.can_continue() {
        return Err(err(
            ErrorCode::BadFlags,
            id,
            format!("{} cannot carry MORE", frame_type.name()),
        ));
    }
    match (frame_type.id_rule(), id) {
        (IdRule::Zero, 0) | (IdRule::Any, _) => Ok(()),
        (IdRule::NonZero, id) if id != 0 => Ok(()),
        _ => Err(err(
            ErrorCode::BadId,
            id,
            format!("id {id} not allowed on {}", frame_type.name()),
        )),
    }
}

impl Frame {
    /// Append this frame to `out`, checking every rule the decoder checks except
    /// `max_frame_size` (a [`crate::Connection`] checks that; here only the `u32` length is).
    /// On error nothing is written.
    ///
    /// ```
    /// use wirepool_proto::{Frame, FrameBody};
    /// let mut out = Vec::new();
    /// Frame::new(0, FrameBody::Goodbye { reason: 0 }).encode(&mut out).unwrap();
    /// assert_eq!(out, [4, 0, 0, 0, 0x41, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    /// ```
    pub fn encode(&self, out: &mut impl FrameBuf) -> Result<(), ProtocolError> {
        let ty = self.frame_type();
        check_header_rules(ty, self.more, self.id)?;
        let id = self.id;
        match &self.body {
            FrameBody::Hello(hello) => {
                hello.validate()?;
                put_header(out, ty, false, id, hello.payload_len())?;
                hello.encode_payload(out)?;
            }
            FrameBody::Welcome(welcome) => {
                welcome.validate()?;
                put_header(out, ty, false, id, welcome.payload_len())?;
                welcome.encode_payload(out)?;
            }
            FrameBody::Request {
                method,
                codec,
                timeout_us,
                body,
            } => {
                let head = MessageHead::Request {
                    method: *method,
                    codec: *codec,
                    timeout_us: *timeout_us,
                };
                put_header(out, ty, self.more, id, head.prefix_len() + body.len())?;
                head.put_prefix(out);
                out.put_slice(body);
            }
            FrameBody::Cancel => put_header(out, ty, false, id, 0)?,
            FrameBody::Result { body } => {
                put_header(out, ty, self.more, id, body.len())?;
                out.put_slice(body);
            }
            FrameBody::Error {
                code,
                message,
                details,
            } => {
                encode_error(out, id, *code, message, details)?;
            }
            FrameBody::Rows(rows) => {
                put_header(out, ty, false, id, rows.payload().len())?;
                out.put_slice(rows.payload());
            }
            FrameBody::End { row_count, summary } => {
                put_header(out, ty, self.more, id, 8 + summary.len())?;
                out.put_u64_le(*row_count);
                out.put_slice(summary);
            }
            FrameBody::Credit { bytes } => {
                if *bytes == 0 {
                    return Err(err(ErrorCode::BadPayload, id, "CREDIT of 0 bytes"));
                }
                put_header(out, ty, false, id, 4)?;
                out.put_u32_le(*bytes);
            }
            FrameBody::Event { topic, data } => {
                encode_event(out, id, topic, data)?;
            }
            FrameBody::Ping { nonce } | FrameBody::Pong { nonce } => {
                put_header(out, ty, false, id, 8)?;
                out.put_slice(nonce);
            }
            FrameBody::Drain { grace_ms } => {
                put_header(out, ty, false, id, 4)?;
                out.put_u32_le(*grace_ms);
            }
            FrameBody::Goodbye { reason } => {
                put_header(out, ty, false, id, 4)?;
                out.put_u32_le(*reason);
            }
            FrameBody::Continuation { chunk } => {
                put_header(out, ty, self.more, id, chunk.len())?;
                out.put_slice(chunk);
            }
        }
        Ok(())
    }

    /// Bytes [`Frame::encode`] writes, header included.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + match &self.body {
                FrameBody::Hello(h) => h.payload_len(),
                FrameBody::Welcome(w) => w.payload_len(),
                FrameBody::Request { body, .. } => 12 + body.len(),
                FrameBody::Cancel => 0,
                FrameBody::Result { body } => body.len(),
                FrameBody::Error {
                    message, details, ..
                } => 6 + message.len() + details.len(),
                FrameBody::Rows(rows) => rows.payload().len(),
                FrameBody::End { summary, .. } => 8 + summary.len(),
                FrameBody::Credit { .. } | FrameBody::Drain { .. } | FrameBody::Goodbye { .. } => 4,
                FrameBody::Event { topic, data } => 2 + topic.len() + data.len(),
                FrameBody::Ping { .. } | FrameBody::Pong { .. } => 8,
                FrameBody::Continuation { chunk } => chunk.len(),
            }
    }
}

/// Append an ERROR frame (`message` at most 65,535 bytes).
pub(crate) fn encode_error(
    out: &mut impl FrameBuf,
    id: u64,
    code: u32,
    message: &str,
    details: &str,
) -> Result<(), ProtocolError> {
    if message.len() > u16::MAX as usize {
        return Err(err(
            ErrorCode::BadPayload,
            id,
            "ERROR message over 65,535 bytes",
        ));
    }
    put_header(
        out,
        FrameType::Error,
        false,
        id,
        6 + message.len() + details.len(),
    )?;
    out.put_u32_le(code);
    out.put_u16_le(message.len() as u16);
    out.put_slice(message.as_bytes());
    out.put_slice(details.as_bytes());
    Ok(())
}

/// Append an EVENT frame (`topic` 1-255 bytes).
pub(crate) fn encode_event(
    out: &mut impl FrameBuf,
    id: u64,
    topic: &str,
    data: &str,
) -> Result<(), ProtocolError> {
    if topic.is_empty() || topic.len() > 255 {
        return Err(err(
            ErrorCode::BadPayload,
            id,
            format!("EVENT topic is {} bytes, not 1-255", topic.len()),
        ));
    }
    put_header(
        out,
        FrameType::Event,
        false,
        id,
        2 + topic.len() + data.len(),
    )?;
    out.put_u16_le(topic.len() as u16);
    out.put_slice(topic.as_bytes());
    out.put_slice(data.as_bytes());
    Ok(())
}

/// The fixed fields of a message that may be split into CONTINUATION frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageHead {
    /// REQUEST: method index, codec id, time budget.
    Request {
        /// Index into the HELLO method list.
        method: u16,
        /// Codec id.
        codec: u8,
        /// Microseconds, 0 for none.
        timeout_us: u64,
    },
    /// RESULT: no fixed fields.
    Result,
    /// END: the stream's total row count.
    End {
        /// Rows sent in total.
        row_count: u64,
    },
}

impl MessageHead {
    /// The frame type of the first frame.
    pub fn frame_type(&self) -> FrameType {
        match self {
            MessageHead::Request { .. } => FrameType::Request,
            MessageHead::Result => FrameType::Result,
            MessageHead::End { .. } => FrameType::End,
        }
    }

    /// Bytes of fixed fields before the body.
    pub fn prefix_len(&self) -> usize {
        self.frame_type().fixed_prefix_len()
    }

    pub(crate) fn put_prefix(&self, out: &mut impl BufMut) {
        match *self {
            MessageHead::Request {
                method,
                codec,
                timeout_us,
            } => {
                out.put_u16_le(method);
                out.put_u8(codec);
                out.put_u8(0);
                out.put_u64_le(timeout_us);
            }
            MessageHead::Result => {}
            MessageHead::End { row_count } => out.put_u64_le(row_count),
        }
    }

    /// Total message size (fixed prefix plus body), the figure `max_message_size` bounds.
    pub fn message_len(&self, body_len: usize) -> u64 {
        (self.prefix_len() + body_len) as u64
    }
}

/// Append one whole message: a single frame if it fits `max_frame_size`, otherwise a first
/// frame with `MORE` holding the fixed prefix and as much body as fits, then CONTINUATION
/// frames, `MORE` on all but the last. Returns the number of frames written.
///
/// ```
/// use wirepool_proto::{decode_frame, encode_message, MessageHead};
/// let body = vec![7u8; 100_000];
/// let mut out = Vec::new();
/// let frames = encode_message(&mut out, 5, MessageHead::Result, &body, 65_536).unwrap();
/// assert_eq!(frames, 2);
/// assert_eq!(out.len(), 2 * 16 + 100_000);
/// ```
pub fn encode_message(
    out: &mut impl FrameBuf,
    id: u64,
    head: MessageHead,
    body: &[u8],
    max_frame_size: u32,
) -> Result<usize, ProtocolError> {
    let max = max_frame_size as usize;
    let prefix = head.prefix_len();
    if id == 0 {
        return Err(err(
            ErrorCode::BadId,
            0,
            "a request-level message needs a non-zero id",
        ));
    }
    if max <= prefix {
        return Err(err(
            ErrorCode::FrameTooLarge,
            id,
            "max_frame_size below the message's fixed prefix",
        ));
    }
    let first = body.len().min(max - prefix);
    let (first_chunk, mut rest) = body.split_at(first);
    out.reserve_more(HEADER_LEN + prefix + body.len() + HEADER_LEN * rest.len().div_ceil(max));
    put_header(
        out,
        head.frame_type(),
        !rest.is_empty(),
        id,
        prefix + first_chunk.len(),
    )?;
    head.put_prefix(out);
    out.put_slice(first_chunk);
    let mut frames = 1;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(max));
        put_header(
            out,
            FrameType::Continuation,
            !tail.is_empty(),
            id,
            chunk.len(),
        )?;
        out.put_slice(chunk);
        rest = tail;
        frames += 1;
    }
    Ok(frames)
}

/// What a finished ROWS frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsWritten {
    /// Rows in the frame (0: nothing was written).
    pub count: u32,
    /// Payload bytes: the stream credit the frame costs.
    pub payload_len: usize,
}

/// Builds one ROWS frame in place: appends length-prefixed rows to the output buffer and
/// patches the header and count on [`finish`](RowsBuilder::finish). No allocation per row, one
/// copy of each row (into the buffer that goes to the socket).
///
/// Built standalone with [`RowsBuilder::new`], or from a worker [`crate::Connection`] with
/// [`crate::Connection::rows`], which also checks and charges the stream's credit. Dropping a
/// builder without finishing removes what it wrote.
///
/// ```
/// use wirepool_proto::{decode_frame, FrameBody, RowsBuilder};
/// let mut out = Vec::new();
/// let mut rows = RowsBuilder::new(&mut out, 9, 65_536);
/// assert!(rows.append(b"first").unwrap());
/// assert!(rows.append_with(|buf| buf.extend_from_slice(b"second")).unwrap());
/// let written = rows.finish().unwrap();
/// assert_eq!(written.count, 2);
///
/// let frame = decode_frame(&out, 65_536).unwrap();
/// let FrameBody::Rows(rows) = frame.body else { panic!() };
/// assert_eq!(rows.iter().collect::<Vec<_>>(), vec![&b"first"[..], b"second"]);
/// ```
pub struct RowsBuilder<'a, B: FrameBuf> {
    out: &'a mut B,
    start: usize,
    id: u64,
    count: u32,
    max_payload: usize,
    stream: Option<&'a mut StreamSendState>,
    done: bool,
}

impl<'a, B: FrameBuf> RowsBuilder<'a, B> {
    /// Start a ROWS frame for request `id` whose payload may not exceed `max_frame_size`.
    pub fn new(out: &'a mut B, id: u64, max_frame_size: u32) -> RowsBuilder<'a, B> {
        RowsBuilder::start(out, id, max_frame_size, None)
    }

    pub(crate) fn start(
        out: &'a mut B,
        id: u64,
        max_frame_size: u32,
        stream: Option<&'a mut StreamSendState>,
    ) -> RowsBuilder<'a, B> {
        let start = out.written();
        // Header and count are placeholders until `finish`.
        out.put_bytes(0, HEADER_LEN + 4);
        RowsBuilder {
            out,
            start,
            id,
            count: 0,
            max_payload: max_frame_size as usize,
            stream,
            done: false,
        }
    }

    /// Rows appended so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Payload bytes so far (count field included): the credit this frame will cost.
    pub fn payload_len(&self) -> usize {
        self.out.written() - self.start - HEADER_LEN
    }

    /// Bytes of row data that still fit (after a row's 4-byte length); when 0, even an empty
    /// row may not fit.
    pub fn room(&self) -> usize {
        self.max_payload.saturating_sub(self.payload_len() + 4)
    }

    fn row_too_large(&self, len: usize) -> ProtocolError {
        err(
            ErrorCode::RowTooLarge,
            self.id,
            format!(
                "a row of {len} bytes cannot fit a frame of {} bytes",
                self.max_payload
            ),
        )
    }

    /// Append a row. `Ok(false)`: it does not fit this frame; finish and append it to a new
    /// builder. `ROW_TOO_LARGE`: it can never fit one frame.
    #[inline]
    pub fn append(&mut self, row: &[u8]) -> Result<bool, ProtocolError> {
        if self.payload_len() + 4 + row.len() > self.max_payload {
            return if 8 + row.len() > self.max_payload {
                Err(self.row_too_large(row.len()))
            } else {
                Ok(false)
            };
        }
        self.out.put_u32_le(row.len() as u32);
        self.out.put_slice(row);
        self.count += 1;
        Ok(true)
    }

    /// Append a row that `write` serializes straight into the buffer (no intermediate copy).
    /// `Ok(false)`: it did not fit; it was removed, finish and write it again into a new
    /// builder. `ROW_TOO_LARGE`: it can never fit one frame.
    pub fn append_with(&mut self, write: impl FnOnce(&mut B)) -> Result<bool, ProtocolError> {
        let row_start = self.out.written();
        self.out.put_u32_le(0);
        write(self.out);
        let row_len = self.out.written() - row_start - 4;
        if self.payload_len() > self.max_payload {
            self.out.truncate_to(row_start);
            return if 8 + row_len > self.max_payload {
                Err(self.row_too_large(row_len))
            } else {
                Ok(false)
            };
        }
        self.out.written_mut()[row_start..row_start + 4]
            .copy_from_slice(&(row_len as u32).to_le_bytes());
        self.count += 1;
        Ok(true)
    }

    /// Patch header and count. With no rows nothing is left in the buffer (a ROWS frame must
    /// hold at least one). From a [`crate::Connection`], the stream is charged the payload
    /// length and its row counter advances.
    pub fn finish(mut self) -> Result<RowsWritten, ProtocolError> {
        self.done = true;
        if self.count == 0 {
            self.out.truncate_to(self.start);
            return Ok(RowsWritten {
                count: 0,
                payload_len: 0,
            });
        }
        let payload_len = self.payload_len();
        let header = Header {
            length: payload_len as u32,
            frame_type: FrameType::Rows,
            more: false,
            id: self.id,
        };
        let start = self.start;
        let bytes = self.out.written_mut();
        bytes[start..start + HEADER_LEN].copy_from_slice(&header.to_bytes());
        bytes[start + HEADER_LEN..start + HEADER_LEN + 4]
            .copy_from_slice(&self.count.to_le_bytes());
        if let Some(stream) = self.stream.as_deref_mut() {
            stream.charge_rows(self.count, payload_len);
        }
        Ok(RowsWritten {
            count: self.count,
            payload_len,
        })
    }
}

impl<B: FrameBuf> Drop for RowsBuilder<'_, B> {
    fn drop(&mut self) {
        if !self.done {
            self.out.truncate_to(self.start);
        }
    }
}

/// One ROWS frame filled away from the core (PROTOCOL.md 14.3: "a builder may be filled away
/// from the core, for example in a handler thread, and finished on the thread that owns the
/// core"): rows are appended with their length prefixes into its own buffer, where the frame's
/// header and count wait as placeholders; [`crate::Connection::send_rows`] then checks the
/// stream, charges its credit, counts the rows, patches the header and writes the whole frame
/// with one copy. No lock, no core and no allocation per row.
///
/// A row whose writer fails or panics leaves nothing behind: bytes past the last complete row
/// are never part of the frame.
///
/// ```
/// use wirepool_proto::{decode_frame, FrameBody, RowsFrame};
/// let mut frame = RowsFrame::new(9, 65_536);
/// assert!(frame.append(b"first").unwrap());
/// let second = frame.append_with(|buf| {
///     buf.extend_from_slice(b"sec");
///     buf.extend_from_slice(b"ond");
///     Ok::<(), std::convert::Infallible>(())
/// });
/// assert!(matches!(second, Ok(true)));
/// assert_eq!((frame.id(), frame.count()), (9, 2));
/// // A worker core sends it with `conn.send_rows(&mut frame, &mut out)`; standalone:
/// let wire = frame.finish_standalone().unwrap();
/// let FrameBody::Rows(rows) = decode_frame(&wire, 65_536).unwrap().body else { panic!() };
/// assert_eq!(rows.iter().collect::<Vec<_>>(), vec![&b"first"[..], b"second"]);
/// ```
#[derive(Debug, Clone)]
pub struct RowsFrame {
    /// Header and count placeholders, then `[len u32][row]...`; bytes past `end` are the
    /// remains of an interrupted row.
    buf: Vec<u8>,
    end: usize,
    id: u64,
    count: u32,
    max_payload: usize,
}

/// Why [`RowsFrame::append_with`] did not append a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendError<E> {
    /// The row's writer failed; nothing of the row stays in the frame.
    Write(E),
    /// The row can never fit one frame (`ROW_TOO_LARGE`).
    Refused(ProtocolError),
}

impl RowsFrame {
    /// An empty ROWS frame for request `id` whose payload may not exceed `max_frame_size`.
    pub fn new(id: u64, max_frame_size: u32) -> RowsFrame {
        RowsFrame {
            buf: vec![0; HEADER_LEN + 4],
            end: HEADER_LEN + 4,
            id,
            count: 0,
            max_payload: max_frame_size as usize,
        }
    }

    /// The request id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Rows appended so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// True when it holds no row (a ROWS frame needs one).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Payload bytes so far (count field included): the credit this frame will cost.
    pub fn payload_len(&self) -> usize {
        self.end - HEADER_LEN
    }

    /// The frame limit it was started with.
    pub fn max_frame_size(&self) -> u32 {
        self.max_payload as u32
    }

    /// Reserve room for `additional` more bytes of rows.
    pub fn reserve(&mut self, additional: usize) {
        self.buf.reserve(additional);
    }

    /// Empty it for the next frame of the same request, keeping its buffer.
    pub fn clear(&mut self) {
        self.buf.truncate(HEADER_LEN + 4);
        self.buf.resize(HEADER_LEN + 4, 0);
        self.end = HEADER_LEN + 4;
        self.count = 0;
    }

    fn row_too_large(&self, len: usize) -> ProtocolError {
        err(
            ErrorCode::RowTooLarge,
            self.id,
            format!(
                "a row of {len} bytes cannot fit a frame of {} bytes",
                self.max_payload
            ),
        )
    }

    /// Append a row. `Ok(false)`: it does not fit this frame (send it, then append the row
    /// again). `ROW_TOO_LARGE`: it can never fit one frame.
    #[inline]
    pub fn append(&mut self, row: &[u8]) -> Result<bool, ProtocolError> {
        match self.append_with(|buf| {
            buf.extend_from_slice(row);
            Ok::<(), std::convert::Infallible>(())
        }) {
            Ok(fits) => Ok(fits),
            Err(AppendError::Refused(e)) => Err(e),
            Err(AppendError::Write(never)) => match never {},
        }
    }

    /// Append a row that `write` serializes straight into the frame (no intermediate copy).
    /// `Ok(false)`: it did not fit; it was removed (send the frame, then write the row again).
    /// A failing `write` leaves nothing of the row ([`AppendError::Write`]).
    #[inline]
    pub fn append_with<E>(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<bool, AppendError<E>> {
        let start = self.end;
        // What an interrupted row (a panicking writer) left behind goes now.
        self.buf.truncate(start);
        self.buf.extend_from_slice(&[0; 4]);
        if let Err(e) = write(&mut self.buf) {
            self.buf.truncate(start);
            return Err(AppendError::Write(e));
        }
        let row_len = self.buf.len() - start - 4;
        if self.buf.len() - HEADER_LEN > self.max_payload {
            self.buf.truncate(start);
            return if 8 + row_len > self.max_payload {
                Err(AppendError::Refused(self.row_too_large(row_len)))
            } else {
                Ok(false)
            };
        }
        self.buf[start..start + 4].copy_from_slice(&(row_len as u32).to_le_bytes());
        self.end = self.buf.len();
        self.count += 1;
        Ok(true)
    }

    /// The frame with its header and count: for a frame that no core checks (tests, tools).
    /// `None` when it holds no row.
    pub fn finish_standalone(&mut self) -> Option<Vec<u8>> {
        (self.count > 0).then(|| self.patched().to_vec())
    }

    /// Patches header and count, then hands the whole frame to `out` (see
    /// [`FrameBuf::append_vec`]) and empties this one.
    pub(crate) fn write_to(&mut self, out: &mut impl FrameBuf) {
        self.patched();
        self.buf.truncate(self.end);
        out.append_vec(&mut self.buf);
        self.clear();
    }

    /// Patches header and count; the whole frame.
    fn patched(&mut self) -> &[u8] {
        let header = Header {
            length: self.payload_len() as u32,
            frame_type: FrameType::Rows,
            more: false,
            id: self.id,
        };
        self.buf[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        self.buf[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&self.count.to_le_bytes());
        &self.buf[..self.end]
    }
}
