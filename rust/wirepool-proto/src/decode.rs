//! The stateless frame decoder: bytes in (any chunking), checked [`Frame`]s out.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::{err, ErrorCode, ProtocolError};
use crate::frame::{Frame, FrameBody, FrameType, Header, RowsPayload, HEADER_LEN};
use crate::handshake::{Hello, Welcome};
use crate::shm::ShmFrame;
use crate::wire::{utf8, Reader};

/// What the decoder yields inside the crate: a version 1 frame, or a frame of the shared-memory
/// lane (only when [`FrameDecoder::set_shm`] turned its types on).
#[derive(Debug)]
pub(crate) enum Decoded {
    Frame(Frame),
    Shm { id: u64, frame: ShmFrame },
}

/// Smallest free space [`FrameDecoder::read_buffer`] offers, so small frames arrive in few reads.
const MIN_READ_SPACE: usize = 64 * 1024;

/// Splits a byte stream into checked frames.
///
/// It checks everything decidable from one frame (PROTOCOL.md section 2 and section 4 ranges);
/// direction, ids, credit and continuation are [`crate::Connection`]'s job. The frame length is
/// checked against `max_frame_size` as soon as the 16 header bytes are in, before anything is
/// reserved for the payload. Errors are sticky: after one, every call returns it again.
///
/// Two ways to feed it: [`receive`](FrameDecoder::receive) copies a slice in; [`read_buffer`](FrameDecoder::read_buffer)
/// hands out the internal buffer so a socket read lands in it directly (the only copy a frame
/// ever gets: payloads are then sliced out as [`Bytes`] without copying).
///
/// ```
/// use wirepool_proto::{ErrorCode, Frame, FrameBody, FrameDecoder};
/// let mut wire = Vec::new();
/// Frame::new(0, FrameBody::Ping { nonce: *b"12345678" }).encode(&mut wire).unwrap();
///
/// let mut dec = FrameDecoder::new(65_536);
/// dec.receive(&wire[..5]); // any chunking
/// assert!(dec.next_frame().unwrap().is_none());
/// dec.receive(&wire[5..]);
/// let frame = dec.next_frame().unwrap().unwrap();
/// assert_eq!(frame.body, FrameBody::Ping { nonce: *b"12345678" });
/// assert!(dec.end_of_input().is_ok());
///
/// dec.receive(&wire[..3]);
/// assert_eq!(dec.end_of_input().unwrap_err().code, ErrorCode::Truncated);
/// ```
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    max_frame_size: u32,
    /// Header of the frame whose payload is still arriving (already checked and consumed).
    pending: Option<Header>,
    /// The payload of a pending large frame (at least [`OWN_BUFFER_MIN`] bytes): a buffer of
    /// exactly its length, so reads land in it directly and never run into the next frame,
    /// and `buf` stays small (no large moves when a frame ends mid-buffer).
    large: Option<BytesMut>,
    /// `large` was lent by the caller (the rest of a continued message's own buffer): when it
    /// is full, the frame comes out with an empty payload and the buffer goes to `returned`.
    lent: bool,
    returned: Option<BytesMut>,
    /// The allocation of the last large payload, reclaimed for the next one once nothing
    /// refers to that payload any more (no fresh pages per frame). At most one frame's size.
    spare: BytesMut,
    /// The shared-memory lane is on (PROTOCOL.md 20.1): its four frame types exist.
    shm: bool,
    failed: Option<ProtocolError>,
}

/// Payloads at least this large get a buffer of their own (see [`FrameDecoder`]'s `large`).
/// What the first read brought of the payload (up to 64 KiB) is copied into it: at 2 MiB and
/// above that is under 3% of the payload; a 1 MiB payload stays in the receive buffer (the
/// instruction-count gate's 1 MiB echo measured +5.9% with its own buffer).
const OWN_BUFFER_MIN: usize = 2 << 20;

impl FrameDecoder {
    /// A decoder accepting payloads up to `max_frame_size` bytes.
    pub fn new(max_frame_size: u32) -> FrameDecoder {
        FrameDecoder {
            buf: BytesMut::new(),
            max_frame_size,
            pending: None,
            large: None,
            lent: false,
            returned: None,
            spare: BytesMut::new(),
            shm: false,
            failed: None,
        }
    }

    /// Turns the shared-memory lane's frame types on (`UNKNOWN_FRAME_TYPE` otherwise, as in
    /// version 1). They apply to headers not yet parsed.
    pub(crate) fn set_shm(&mut self, on: bool) {
        self.shm = on;
    }

    /// The current payload limit.
    pub fn max_frame_size(&self) -> u32 {
        self.max_frame_size
    }

    /// Change the payload limit (after the handshake). It applies to headers not yet parsed.
    pub fn set_max_frame_size(&mut self, max_frame_size: u32) {
        self.max_frame_size = max_frame_size;
    }

    /// Append received bytes (copies them).
    pub fn receive(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The receive buffer, with free capacity for at least the rest of the current frame (the
    /// checked length) or 64 KiB: read from the socket straight into it (for example with
    /// tokio's `AsyncReadExt::read_buf`), then call [`next_frame`](FrameDecoder::next_frame).
    pub fn read_buffer(&mut self) -> &mut BytesMut {
        if let Some(large) = self.large.as_mut() {
            // Its spare capacity is exactly the missing part of the payload.
            return large;
        }
        let need = match self.pending {
            Some(h) => (h.length as usize).saturating_sub(self.buf.len()),
            None => HEADER_LEN.saturating_sub(self.buf.len()),
        };
        self.buf.reserve(need.max(MIN_READ_SPACE));
        &mut self.buf
    }

    /// Bytes received but not yet returned as frames (header of a pending frame excluded).
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.large.as_ref().map_or(0, BytesMut::len)
    }

    /// Bytes of the frame still arriving, its header included (0 between frames), once
    /// [`next_frame`](FrameDecoder::next_frame) returned `Ok(None)`.
    pub(crate) fn incomplete_frame_len(&self) -> usize {
        let large = self.large.as_ref().map_or(0, BytesMut::len);
        self.buf.len()
            + large
            + if self.pending.is_some() {
                HEADER_LEN
            } else {
                0
            }
    }

    /// The header of a pending large frame that has its own buffer, not a lent one.
    pub(crate) fn pending_large(&self) -> Option<Header> {
        self.pending.filter(|_| self.large.is_some() && !self.lent)
    }

    /// Receive the pending large frame's payload into `target` (empty, with a capacity of
    /// exactly the payload's length) instead of the decoder's own buffer; what has arrived
    /// already moves there (at most a read's worth). [`take_returned`](Self::take_returned)
    /// gives it back, full, with the frame, which carries only its fixed prefix (a copy of the
    /// buffer's first bytes, see [`prefix_len`]): a CONTINUATION's chunk, or a first frame's
    /// body, is empty.
    pub(crate) fn lend(&mut self, mut target: BytesMut) {
        if let Some(own) = self.large.take() {
            target.extend_from_slice(&own);
        }
        self.large = Some(target);
        self.lent = true;
    }

    /// The lent buffer, filled with the payload of the frame just returned.
    pub(crate) fn take_returned(&mut self) -> Option<BytesMut> {
        self.returned.take()
    }

    /// A buffer of exactly `len` bytes' capacity for a large payload: the spare allocation when
    /// nothing refers to it any more, else a new one.
    fn large_buffer(&mut self, len: usize) -> BytesMut {
        let mut spare = std::mem::take(&mut self.spare);
        if !spare.try_reclaim(len) {
            spare = BytesMut::with_capacity(len);
        }
        // Keep the rest of the allocation as the handle that reclaims it next time; the
        // payload's view ends at `len`, so a read cannot run past the frame.
        self.spare = spare.split_off(len);
        spare
    }

    /// True if the stream is between frames: nothing buffered, no payload pending.
    pub fn is_idle(&self) -> bool {
        self.pending.is_none() && self.buf.is_empty()
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the first error.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        match self.next_decoded()? {
            None => Ok(None),
            Some(Decoded::Frame(frame)) => Ok(Some(frame)),
            // `set_shm` is the crate's: a public decoder never turns the lane on.
            Some(Decoded::Shm { id, frame }) => Err(err(
                ErrorCode::UnknownFrameType,
                id,
                format!("frame type {:#04x} outside a connection", frame.type_byte()),
            )),
        }
    }

    /// [`next_frame`](Self::next_frame) with the shared-memory lane's frames.
    pub(crate) fn next_decoded(&mut self) -> Result<Option<Decoded>, ProtocolError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.next_inner() {
            Ok(frame) => Ok(frame),
            Err(e) => {
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// An shm frame at the front of the buffer (the lane is on and byte 4 is one of its
    /// types): the header checks of 11.1 in order, the payload's exact size (`BAD_PAYLOAD`, known
    /// from the header), then the payload once its at most 24 bytes are in.
    fn next_shm(
        &mut self,
        raw: [u8; HEADER_LEN],
        want: usize,
    ) -> Result<Option<Decoded>, ProtocolError> {
        let length = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
        let id = u64::from_le_bytes([
            raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15],
        ]);
        let ty = raw[4];
        if length > self.max_frame_size {
            return Err(err(
                ErrorCode::FrameTooLarge,
                id,
                format!(
                    "frame length {length} above max_frame_size {}",
                    self.max_frame_size
                ),
            ));
        }
        if raw[5] != 0 {
            return Err(err(
                ErrorCode::BadFlags,
                id,
                format!(
                    "flags 0x{:02x} on shm frame type {ty:#04x}, which takes none",
                    raw[5]
                ),
            ));
        }
        if raw[6] != 0 || raw[7] != 0 {
            return Err(err(
                ErrorCode::ReservedNonzero,
                id,
                "reserved header field is not zero",
            ));
        }
        let body = ty == crate::shm::frame_type::SHM_BODY;
        if body == (id == 0) {
            let rule = if body {
                "request-level, id must not be 0"
            } else {
                "connection-level, id must be 0"
            };
            return Err(err(
                ErrorCode::BadId,
                if body { 0 } else { id },
                format!("shm frame type {ty:#04x} is {rule}"),
            ));
        }
        if length as usize != want {
            return Err(err(
                ErrorCode::BadPayload,
                id,
                format!(
                    "shm frame type {ty:#04x} needs exactly {want} payload bytes, not {length}"
                ),
            ));
        }
        if self.buf.len() < HEADER_LEN + want {
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(want);
        let frame = ShmFrame::decode(ty, id, &payload)?;
        Ok(Some(Decoded::Shm { id, frame }))
    }

    fn next_inner(&mut self) -> Result<Option<Decoded>, ProtocolError> {
        let header = match self.pending {
            Some(h) => h,
            None => {
                let Some(raw) = self.buf.first_chunk::<HEADER_LEN>() else {
                    return Ok(None);
                };
                if self.shm {
                    if let Some(want) = ShmFrame::payload_len(raw[4]) {
                        return self.next_shm(*raw, want);
                    }
                }
                let h = Header::parse(raw, self.max_frame_size)?;
                self.buf.advance(HEADER_LEN);
                let len = h.length as usize;
                if len >= OWN_BUFFER_MIN && self.buf.len() < len {
                    // The length is checked: its own buffer, sized once.
                    self.large = Some(self.large_buffer(len));
                } else {
                    self.buf.reserve(len.saturating_sub(self.buf.len()));
                }
                self.pending = Some(h);
                h
            }
        };
        let len = header.length as usize;
        let payload = if let Some(large) = self.large.as_mut() {
            // Bytes already buffered (or pushed) belong to it first.
            let take = self.buf.len().min(len - large.len());
            if take > 0 {
                large.extend_from_slice(&self.buf[..take]);
                self.buf.advance(take);
            }
            if large.len() < len {
                return Ok(None);
            }
            self.pending = None;
            let large = self.large.take().unwrap_or_default();
            if std::mem::take(&mut self.lent) {
                // The frame comes out with only its fixed prefix (a CONTINUATION has none, a
                // first frame with MORE at most 12 bytes, copied); the payload, prefix
                // included, stays in the lent buffer.
                let prefix = Bytes::copy_from_slice(
                    &large[..prefix_len(header.frame_type).min(large.len())],
                );
                self.returned = Some(large);
                prefix
            } else {
                large.freeze()
            }
        } else {
            if self.buf.len() < len {
                return Ok(None);
            }
            self.pending = None;
            self.buf.split_to(len).freeze()
        };
        let body = parse_body(header.frame_type, payload).map_err(|mut e| {
            e.id = header.id;
            e
        })?;
        Ok(Some(Decoded::Frame(Frame {
            id: header.id,
            more: header.more,
            body,
        })))
    }

    /// The peer closed the stream: `TRUNCATED` if it stopped inside a frame, else `Ok`.
    pub fn end_of_input(&self) -> Result<(), ProtocolError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.is_idle() {
            Ok(())
        } else {
            let id = self.pending.map_or(0, |h| h.id);
            Err(err(
                ErrorCode::Truncated,
                id,
                format!(
                    "end of stream inside a frame ({} bytes buffered)",
                    self.buf.len()
                ),
            ))
        }
    }
}

/// The fixed prefix of a type that may start a continued message (section 5): what the
/// decoder parses itself when the payload was read into a lent buffer.
pub(crate) fn prefix_len(ty: FrameType) -> usize {
    match ty {
        FrameType::Request => 12,
        FrameType::End => 8,
        _ => 0,
    }
}

/// Decode one complete frame from `bytes` (which must hold exactly one frame).
///
/// ```
/// use wirepool_proto::{decode_frame, Frame, FrameBody};
/// let mut wire = Vec::new();
/// Frame::new(0, FrameBody::Drain { grace_ms: 500 }).encode(&mut wire).unwrap();
/// assert_eq!(decode_frame(&wire, 65_536).unwrap().body, FrameBody::Drain { grace_ms: 500 });
/// ```
pub fn decode_frame(bytes: &[u8], max_frame_size: u32) -> Result<Frame, ProtocolError> {
    let mut dec = FrameDecoder::new(max_frame_size);
    dec.receive(bytes);
    let frame = dec.next_frame()?;
    dec.end_of_input()?;
    frame.ok_or_else(|| err(ErrorCode::Truncated, 0, "no complete frame"))
}

/// Parse the payload of one frame of a known type. A first frame with MORE has the same layout
/// (its fixed prefix is required), so the flag plays no part here.
pub(crate) fn parse_body(ty: FrameType, payload: Bytes) -> Result<FrameBody, ProtocolError> {
    let mut r = Reader::new(&payload, ErrorCode::BadPayload);
    let body = match ty {
        FrameType::Hello => FrameBody::Hello(Box::new(Hello::parse(&payload)?)),
        FrameType::Welcome => FrameBody::Welcome(Welcome::parse(&payload)?),
        FrameType::Request => {
            let method = r.u16()?;
            let codec = r.u8()?;
            if r.u8()? != 0 {
                return Err(err(
                    ErrorCode::ReservedNonzero,
                    0,
                    "REQUEST reserved byte is not zero",
                ));
            }
            let timeout_us = r.u64()?;
            FrameBody::Request {
                method,
                codec,
                timeout_us,
                body: payload.slice(12..),
            }
        }
        FrameType::Cancel => {
            r.finish("CANCEL")?;
            FrameBody::Cancel
        }
        FrameType::Result => FrameBody::Result { body: payload },
        FrameType::Error => {
            let code = r.u32()?;
            let message = r.str16()?.to_owned();
            let details = utf8(r.rest(), "ERROR details")?;
            FrameBody::Error {
                code,
                message,
                details,
            }
        }
        FrameType::Rows => FrameBody::Rows(RowsPayload::parse(payload)?),
        FrameType::End => {
            let row_count = r.u64()?;
            FrameBody::End {
                row_count,
                summary: payload.slice(8..),
            }
        }
        FrameType::Credit => {
            let bytes = r.u32()?;
            r.finish("CREDIT")?;
            if bytes == 0 {
                return Err(err(ErrorCode::BadPayload, 0, "CREDIT of 0 bytes"));
            }
            FrameBody::Credit { bytes }
        }
        FrameType::Event => {
            let topic = r
                .str16_in(1, 255, ErrorCode::BadPayload, "EVENT topic")?
                .to_owned();
            let data = utf8(r.rest(), "EVENT data")?;
            FrameBody::Event { topic, data }
        }
        FrameType::Ping | FrameType::Pong => {
            let nonce = r.nonce()?;
            r.finish(ty.name())?;
            if ty == FrameType::Ping {
                FrameBody::Ping { nonce }
            } else {
                FrameBody::Pong { nonce }
            }
        }
        FrameType::Drain => {
            let grace_ms = r.u32()?;
            r.finish("DRAIN")?;
            FrameBody::Drain { grace_ms }
        }
        FrameType::Goodbye => {
            let reason = r.u32()?;
            r.finish("GOODBYE")?;
            FrameBody::Goodbye { reason }
        }
        FrameType::Continuation => FrameBody::Continuation { chunk: payload },
    };
    Ok(body)
}
