//! Frames waiting for the socket, with large message bodies queued by reference; shared by the
//! parent's and the worker's drivers.
//!
//! Producers encode under their core's lock; the one writer task takes everything queued and
//! writes it with vectored writes, so producers never wait for the socket. Small frames land in
//! a tail buffer, sealed into a chunk each time the writer takes it; a slice of a message body
//! (a REQUEST's on the parent, a RESULT's or END's on the worker) of at least [`COPY_LIMIT`]
//! bytes is queued as a `Bytes` slice of that body instead of being copied (a 1 MiB message
//! costs no user-space copy on the way out).
//!
//! PING and PONG go through an urgent lane ([`Outbox::urgent`]): the writer splices them into
//! what it is writing at the next frame boundary, ahead of the frames still queued, so a large
//! message never holds a PONG back by more than one frame (PROTOCOL.md 8.5). The writer knows
//! where frames end: every chunk is either a run of whole frames (a frame's header and the
//! first bytes of its payload may end it) or the body slice that ends one frame.

use std::collections::VecDeque;
use std::io::IoSlice;

use std::os::fd::{BorrowedFd, OwnedFd};

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};
use wirepool_proto::{FrameBuf, HEADER_LEN};

/// Body slices at least this large are queued by reference instead of copied.
pub const COPY_LIMIT: usize = 16 * 1024;

/// Most slices handed to one `writev` (Linux IOV_MAX is 1024; fewer keeps the array on the stack
/// cheap and still amortises the syscall over hundreds of frames).
const MAX_IOV: usize = 64;

/// Most descriptors one write carries (PROTOCOL.md 20.5).
const MAX_FDS_PER_WRITE: usize = 8;

/// What a queued chunk holds: the body slice that ends a frame whose header is in the chunk
/// before (it starts inside that frame), ...
const BODY: u8 = 0;
/// ... whole frames from its first byte (the last one's payload may go on in a `BODY`), ...
const FRAMES: u8 = 1;
/// ... or urgent frames spliced in (whole frames too).
const URGENT: u8 = 2;

/// Encoded frames waiting for the writer. Small frames are encoded straight into it (it is a
/// [`FrameBuf`], or use [`tail`](Outbox::tail)); messages with a large body go through
/// [`message_writer`](Outbox::message_writer).
#[derive(Default)]
pub struct Outbox {
    /// Each with what it holds (`BODY` or `FRAMES`).
    chunks: VecDeque<(Bytes, u8)>,
    tail: BytesMut,
    /// PING and PONG frames, written at the next frame boundary ahead of everything else.
    urgent: BytesMut,
    queued: usize,
    /// Descriptors to send with the byte at each position (from the outbox's front): a
    /// SHM_REGION's, attached to the write holding the frame's first byte (PROTOCOL.md 20.5).
    fds: Vec<(usize, OwnedFd)>,
}

impl Outbox {
    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.tail.is_empty() && self.urgent.is_empty()
    }

    /// Sends `fd` with the next byte encoded (the first byte of the SHM_REGION frame about to
    /// be written): the write that carries that byte carries the descriptor.
    pub fn attach_fd(&mut self, fd: OwnedFd) {
        let at = self.queued + self.tail.len();
        self.fds.push((at, fd));
    }

    /// Forgets the descriptor attached last (its frame was not written after all).
    pub fn detach_last_fd(&mut self) {
        self.fds.pop();
    }

    /// Bytes waiting (for back-pressure).
    pub fn len(&self) -> usize {
        self.queued + self.tail.len() + self.urgent.len()
    }

    /// The buffer PING and PONG frames are encoded into (whole small frames only): the writer
    /// writes them at the next frame boundary of its output, ahead of every frame queued
    /// before them (PROTOCOL.md 8.5); among themselves they keep their order.
    pub fn urgent(&mut self) -> &mut BytesMut {
        &mut self.urgent
    }

    /// Moves the urgent frames waiting to the next frame boundary of `into` (which the writer
    /// is writing): call it between writes of a long output. Nothing to do costs one test.
    pub fn take_urgent_into(&mut self, into: &mut WriteQueue) {
        if !self.urgent.is_empty() {
            into.splice_urgent(self.urgent.split().freeze());
        }
    }

    /// The buffer small frames are encoded into, in order after every queued chunk.
    pub fn tail(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// Only small frames wait (no chunk queued by reference): the tail holds everything, and a
    /// caller may write it directly (urgent frames are moved to its end: nothing large is
    /// ahead of them). Call it only while the writer is idle: urgent frames moved to the tail
    /// no longer jump the queue of a writer at work.
    /// A descriptor waiting to go with the bytes makes it `None`: only the writer attaches it.
    pub fn tail_only(&mut self) -> Option<&mut BytesMut> {
        if !(self.chunks.is_empty() && self.fds.is_empty()) {
            return None;
        }
        if !self.urgent.is_empty() {
            self.tail.extend_from_slice(&self.urgent);
            self.urgent.clear();
        }
        Some(&mut self.tail)
    }

    /// A frame buffer for one message whose body is `body`: headers go into the tail, large
    /// slices of `body` are queued by reference.
    pub fn message_writer<'a>(&'a mut self, body: &'a Bytes) -> MessageWriter<'a> {
        MessageWriter { out: self, body }
    }

    /// Queues `bytes` after the tail: a whole frame (`FRAMES`) or the body slice ending one.
    fn push(&mut self, bytes: Bytes, kind: u8) {
        self.seal();
        self.queued += bytes.len();
        self.chunks.push_back((bytes, kind));
    }

    fn seal(&mut self) {
        if !self.tail.is_empty() {
            let sealed = self.tail.split().freeze();
            self.queued += sealed.len();
            // The tail starts where the chunk before ended: at a frame boundary.
            self.chunks.push_back((sealed, FRAMES));
        }
    }

    /// Move everything queued to `into` (which the writer owns while it writes); urgent frames
    /// go to its next frame boundary.
    pub fn take_into(&mut self, into: &mut WriteQueue) {
        self.take_urgent_into(into);
        self.seal();
        let base = into.len();
        into.fds
            .extend(self.fds.drain(..).map(|(at, fd)| (base + at, fd)));
        into.chunks.append(&mut self.chunks);
        self.queued = 0;
    }
}

// SAFETY: every method delegates to the tail `BytesMut`, whose contract holds.
unsafe impl BufMut for Outbox {
    fn remaining_mut(&self) -> usize {
        self.tail.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: forwarded unchanged; the caller initialised `cnt` bytes of `chunk_mut`.
        unsafe { self.tail.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.tail.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        self.tail.put_slice(src)
    }
}

/// Small frames (credit, cancel, pong, drain, fatal errors): encoded into the tail.
impl FrameBuf for Outbox {
    fn written(&self) -> usize {
        self.queued + self.tail.len()
    }

    fn truncate_to(&mut self, len: usize) {
        if len >= self.queued {
            self.tail.truncate(len - self.queued);
        }
    }

    fn written_mut(&mut self) -> &mut [u8] {
        self.tail.as_mut()
    }

    fn reserve_more(&mut self, additional: usize) {
        self.tail.reserve(additional);
    }

    /// A whole frame built elsewhere (a worker's ROWS frame): queued as it is when large,
    /// instead of copied into the tail; `bytes` gets a fresh buffer of the same capacity.
    fn append_vec(&mut self, bytes: &mut Vec<u8>) {
        if bytes.len() < COPY_LIMIT {
            self.tail.put_slice(bytes);
            bytes.clear();
            return;
        }
        let fresh = Vec::with_capacity(bytes.capacity());
        self.push(Bytes::from(std::mem::replace(bytes, fresh)), FRAMES);
    }
}

/// What the writer is writing: chunks taken from the [`Outbox`].
#[derive(Default)]
pub struct WriteQueue {
    /// As the [`Outbox`]'s, each with what it holds (`BODY`, `FRAMES` or `URGENT`).
    chunks: VecDeque<(Bytes, u8)>,
    /// Bytes of the front chunk already written (kept, so that the frames of a chunk written
    /// in part can still be walked from its start).
    front_off: usize,
    /// Descriptors and the position (from the queue's front) of the byte they travel with.
    fds: VecDeque<(usize, OwnedFd)>,
}

impl WriteQueue {
    /// Everything was written.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Bytes waiting.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(|(c, _)| c.len()).sum::<usize>() - self.front_off
    }

    /// Bytes from the front to the next frame boundary (0: the front is one).
    fn next_boundary(&self) -> usize {
        let Some((first, kind)) = self.chunks.front() else {
            return 0;
        };
        if *kind != BODY {
            // Walk the frames of the chunk from its start (headers are never split between
            // chunks); the boundary may lie past the chunk, at the end of the body slice that
            // finishes its last frame.
            let mut at = 0usize;
            while at < self.front_off {
                let Some(len) = first.get(at..at + 4) else {
                    break;
                };
                let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                at += HEADER_LEN + len;
            }
            if at >= self.front_off {
                return at - self.front_off;
            }
            debug_assert!(false, "a frame header split between chunks");
        }
        // A body slice ends its frame (and so does any chunk before one that starts a frame).
        let mut at = first.len() - self.front_off;
        for (chunk, kind) in self.chunks.iter().skip(1) {
            if *kind != BODY {
                break;
            }
            at += chunk.len();
        }
        at
    }

    /// Writes `urgent` (whole frames) at the next frame boundary: ahead of every frame not yet
    /// begun, never inside one. Descriptors keep travelling with their frame's first byte.
    pub fn splice_urgent(&mut self, urgent: Bytes) {
        if urgent.is_empty() {
            return;
        }
        let at = self.next_boundary();
        for (pos, _) in self.fds.iter_mut() {
            if *pos >= at {
                *pos += urgent.len();
            }
        }
        // The chunk holding position `at` (counted from the front chunk's start).
        let mut off = at + self.front_off;
        let mut i = 0;
        while i < self.chunks.len() && off >= self.chunks[i].0.len() {
            off -= self.chunks[i].0.len();
            i += 1;
        }
        // After the urgent frames already waiting there: they keep their order.
        while i < self.chunks.len() && self.chunks[i].1 == URGENT {
            off = 0;
            i += 1;
        }
        if i == 0 && off == self.front_off && off > 0 {
            // The front chunk was written exactly to a boundary inside it: drop what was sent.
            let rest = self.chunks[0].0.split_off(off);
            self.chunks[0] = (rest, FRAMES);
            self.front_off = 0;
        } else if off > 0 {
            // Split the chunk at the boundary (no copy: both halves share its buffer).
            // (Only a run of frames has a boundary inside: a body slice's is its end.)
            let rest = self.chunks[i].0.split_off(off);
            self.chunks.insert(i + 1, (rest, FRAMES));
            i += 1;
        }
        self.chunks.insert(i, (urgent, URGENT));
    }

    /// Calls `write` with up to 64 slices and the descriptors due with them: those whose byte
    /// is in these slices, at most 8 (PROTOCOL.md 20.5). A write that carries descriptors stops
    /// before the byte of the next descriptor not carried, so that one starts a later write.
    /// After a successful write of `n` bytes call [`advance_fds`](Self::advance_fds) with the
    /// number of descriptors passed.
    pub fn with_slices_and_fds<R>(
        &self,
        write: impl FnOnce(&[IoSlice<'_>], &[BorrowedFd<'_>]) -> R,
    ) -> R {
        use std::os::fd::AsFd;
        let mut slices = [IoSlice::new(&[]); MAX_IOV];
        let mut n = 0;
        let mut end = 0usize;
        let mut due: Vec<BorrowedFd<'_>> = Vec::new();
        let mut next_fd = self.fds.iter().peekable();
        for (i, (chunk, _)) in self.chunks.iter().take(MAX_IOV).enumerate() {
            let full: &[u8] = if i == 0 {
                &chunk[self.front_off..]
            } else {
                chunk
            };
            let mut bytes = full;
            // Take the descriptors whose byte lies in this chunk; stop before a 9th.
            while let Some((at, fd)) = next_fd.peek() {
                if *at >= end + bytes.len() {
                    break;
                }
                if due.len() == MAX_FDS_PER_WRITE {
                    bytes = &bytes[..at - end];
                    break;
                }
                due.push(fd.as_fd());
                next_fd.next();
            }
            slices[n] = IoSlice::new(bytes);
            n += 1;
            end += bytes.len();
            if bytes.len() < full.len() {
                break;
            }
        }
        write(&slices[..n], &due)
    }

    /// Drop `n` written bytes from the front and the `fds` descriptors sent with them.
    pub fn advance_fds(&mut self, n: usize, fds: usize) {
        self.fds.drain(..fds.min(self.fds.len()));
        for (at, _) in self.fds.iter_mut() {
            *at = at.saturating_sub(n);
        }
        self.advance(n);
    }

    /// Whether a descriptor waits to be sent.
    pub fn has_fds(&self) -> bool {
        !self.fds.is_empty()
    }

    /// Calls `write` with up to 64 slices (`MAX_IOV`), in order (an array on the stack).
    pub fn with_slices<R>(&self, write: impl FnOnce(&[IoSlice<'_>]) -> R) -> R {
        let mut slices = [IoSlice::new(&[]); MAX_IOV];
        let mut n = 0;
        for (slot, (chunk, _)) in slices.iter_mut().zip(&self.chunks) {
            *slot = IoSlice::new(chunk);
            n += 1;
        }
        if n > 0 {
            slices[0] = IoSlice::new(&self.chunks[0].0[self.front_off..]);
        }
        write(&slices[..n])
    }

    /// Drop `n` written bytes from the front.
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some((front, _)) = self.chunks.front() else {
                debug_assert!(false, "advance past the queued bytes");
                return;
            };
            let left = front.len() - self.front_off;
            if n >= left {
                n -= left;
                self.chunks.pop_front();
                self.front_off = 0;
            } else {
                self.front_off += n;
                n = 0;
            }
        }
    }
}

/// See [`Outbox::message_writer`]. Only the append operations of [`FrameBuf`] are meaningful:
/// it is used with the core's message encoders (`send_request`, `send_result`, `send_end`),
/// which only append; ROWS frames, which are patched in place, go through the plain tail.
pub struct MessageWriter<'a> {
    out: &'a mut Outbox,
    body: &'a Bytes,
}

impl MessageWriter<'_> {
    fn slice_of_body(&self, src: &[u8]) -> Option<Bytes> {
        let start = self.body.as_ptr() as usize;
        let at = src.as_ptr() as usize;
        let inside = at >= start && at + src.len() <= start + self.body.len();
        inside.then(|| self.body.slice_ref(src))
    }
}

// SAFETY: every method delegates to the tail `BytesMut`, whose contract holds; `put_slice` either
// delegates too or queues a chunk without touching the tail's uninitialised memory.
unsafe impl BufMut for MessageWriter<'_> {
    fn remaining_mut(&self) -> usize {
        self.out.tail.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: forwarded unchanged; the caller initialised `cnt` bytes of `chunk_mut`.
        unsafe { self.out.tail.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.out.tail.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        // Headers and small bodies (most messages) go straight to the tail.
        if src.len() >= COPY_LIMIT {
            if let Some(shared) = self.slice_of_body(src) {
                // Message encoders put a frame's body last: this slice ends the frame.
                return self.out.push(shared, BODY);
            }
        }
        self.out.tail.put_slice(src)
    }

    // A message's fixed fields: straight to the tail, not through `put_slice`'s body check
    // (the default methods would; the profile of small calls showed it).
    fn put_u8(&mut self, n: u8) {
        self.out.tail.put_u8(n)
    }

    fn put_u16_le(&mut self, n: u16) {
        self.out.tail.put_u16_le(n)
    }

    fn put_u32_le(&mut self, n: u32) {
        self.out.tail.put_u32_le(n)
    }

    fn put_u64_le(&mut self, n: u64) {
        self.out.tail.put_u64_le(n)
    }
}

impl FrameBuf for MessageWriter<'_> {
    fn written(&self) -> usize {
        self.out.written()
    }

    fn truncate_to(&mut self, len: usize) {
        // Message encoders never truncate; keep the contract for the tail part anyway.
        self.out.truncate_to(len)
    }

    fn written_mut(&mut self) -> &mut [u8] {
        // Message encoders never patch; this exposes only the unsealed tail.
        self.out.tail.as_mut()
    }

    fn reserve_more(&mut self, additional: usize) {
        // The body is queued by reference: only headers and small slices land in the tail.
        self.out.tail.reserve(additional.min(COPY_LIMIT * 2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wirepool_proto::{decode_frame, encode_message, FrameBody, MessageHead};

    fn memfd() -> OwnedFd {
        crate::shm::OwnedRegion::create(1)
            .map(|r| std::os::fd::AsFd::as_fd(&r).try_clone_to_owned().unwrap())
            .unwrap()
    }

    #[test]
    fn a_descriptor_goes_with_the_write_holding_its_byte_and_at_most_eight_per_write() {
        let mut out = Outbox::default();
        out.put_slice(b"before");
        for i in 0..10u8 {
            out.attach_fd(memfd());
            out.put_slice(&[i; 4]);
        }
        assert!(
            out.tail_only().is_none(),
            "the direct write never carries descriptors"
        );
        let mut queue = WriteQueue::default();
        out.take_into(&mut queue);
        // First write: up to the 9th descriptor's byte, with 8 descriptors.
        let (len, fds) = queue.with_slices_and_fds(|slices, fds| {
            (slices.iter().map(|s| s.len()).sum::<usize>(), fds.len())
        });
        assert_eq!((len, fds), (6 + 8 * 4, 8));
        // A partial write still sent all 8; the next write holds the last two's bytes.
        queue.advance_fds(10, fds);
        let (len, fds) = queue.with_slices_and_fds(|slices, fds| {
            (slices.iter().map(|s| s.len()).sum::<usize>(), fds.len())
        });
        assert_eq!((len, fds), (6 + 10 * 4 - 10, 2));
        queue.advance_fds(len, fds);
        assert!(queue.is_empty() && !queue.has_fds());
    }

    fn drain(out: &mut Outbox) -> Vec<u8> {
        let mut q = WriteQueue::default();
        out.take_into(&mut q);
        let mut all = Vec::new();
        while !q.is_empty() {
            let n = q.with_slices(|slices| {
                slices.iter().for_each(|s| all.extend_from_slice(s));
                slices.iter().map(|s| s.len()).sum::<usize>()
            });
            q.advance(n);
        }
        all
    }

    #[test]
    fn a_large_rows_frame_is_queued_without_a_copy_and_in_order() {
        let mut out = Outbox::default();
        let mut expected = Vec::new();
        let mut frames = Vec::new();
        for (i, len) in [10usize, 40_000, 3].into_iter().enumerate() {
            let mut frame = wirepool_proto::RowsFrame::new(1, 1 << 20);
            assert!(frame.append(&vec![i as u8; len]).unwrap());
            let wire = frame.clone().finish_standalone().unwrap();
            expected.extend_from_slice(&wire);
            frames.push(frame);
        }
        out.put_slice(b"ping");
        let mut buf = frames[0].clone().finish_standalone().unwrap();
        out.append_vec(&mut buf);
        assert!(buf.is_empty(), "a small frame is copied into the tail");
        let mut big = frames[1].clone().finish_standalone().unwrap();
        let (ptr, cap) = (big.as_ptr(), big.capacity());
        out.append_vec(&mut big);
        assert!(
            big.is_empty() && big.capacity() == cap,
            "a fresh buffer of the same size"
        );
        assert_eq!(
            out.chunks.back().map(|(c, _)| c.as_ptr()),
            Some(ptr),
            "queued, not copied"
        );
        let mut last = frames[2].clone().finish_standalone().unwrap();
        out.append_vec(&mut last);
        assert_eq!(out.len(), 4 + expected.len());
        let mut all = b"ping".to_vec();
        all.extend_from_slice(&expected);
        assert_eq!(drain(&mut out), all);
    }

    #[test]
    fn large_body_is_queued_by_reference_and_encodes_the_same_bytes() {
        let body = Bytes::from((0..200_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let mut expected = Vec::new();
        let head = MessageHead::Request {
            method: 1,
            codec: 3,
            timeout_us: 9,
        };
        encode_message(&mut expected, 4, head, &body, 65_536).unwrap();

        let mut out = Outbox::default();
        encode_message(&mut out.message_writer(&body), 4, head, &body, 65_536).unwrap();
        assert!(out.chunks.iter().any(|(c, _)| c.as_ptr() >= body.as_ptr()
            && c.as_ptr() < body.as_ptr().wrapping_add(body.len())));
        assert!(
            out.tail.len() < COPY_LIMIT,
            "the body was copied into the tail"
        );
        let wire = drain(&mut out);
        assert_eq!(wire, expected);
        let frame = decode_frame(&wire[..16 + 65_536], 65_536).unwrap();
        assert!(matches!(frame.body, FrameBody::Request { method: 1, .. }));
    }

    /// Frames of a byte stream: (type, id, start, end).
    fn frames_of(wire: &[u8]) -> Vec<(u8, u64, usize, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let len = u32::from_le_bytes(wire[at..at + 4].try_into().unwrap()) as usize;
            let id = u64::from_le_bytes(wire[at + 8..at + 16].try_into().unwrap());
            out.push((wire[at + 4], id, at, at + HEADER_LEN + len));
            at += HEADER_LEN + len;
        }
        assert_eq!(at, wire.len(), "the stream ends at a frame boundary");
        out
    }

    fn pong(nonce: u8) -> Vec<u8> {
        let mut v = Vec::new();
        wirepool_proto::Frame::new(0, FrameBody::Pong { nonce: [nonce; 8] })
            .encode(&mut v)
            .unwrap();
        v
    }

    /// Writes at most `step` bytes per write (a socket that takes little at a time) until the
    /// queue is empty or `stop` bytes went out in all; returns the bytes written.
    fn write_some(q: &mut WriteQueue, step: usize, stop: usize, wire: &mut Vec<u8>) {
        while !q.is_empty() && wire.len() < stop {
            let n = q.with_slices(|slices| {
                let before = wire.len();
                let mut left = step.min(stop - before);
                for s in slices {
                    let take = s.len().min(left);
                    wire.extend_from_slice(&s[..take]);
                    left -= take;
                }
                wire.len() - before
            });
            q.advance(n);
        }
    }

    #[test]
    fn a_pong_leaves_after_at_most_one_frame_of_a_large_message() {
        const FRAME: u32 = 1 << 20;
        let mut body = vec![0u8; 64 << 20];
        for (i, page) in body.chunks_mut(4096).enumerate() {
            page[0] = i as u8; // frames that differ, cheaply in a debug build
        }
        let body = Bytes::from(body);
        let head = MessageHead::Request {
            method: 1,
            codec: 3,
            timeout_us: 9,
        };
        let mut expected = Vec::new();
        encode_message(&mut expected, 7, head, &body, FRAME).unwrap();

        let mut out = Outbox::default();
        out.put_slice(&pong(0)); // small frames before the message: the tail's first chunk
        encode_message(&mut out.message_writer(&body), 7, head, &body, FRAME).unwrap();
        let mut q = WriteQueue::default();
        out.take_into(&mut q);
        let mut wire = Vec::new();
        // PONGs queued while the writer is inside the tail, a header, and body slices (cut
        // anywhere: a socket takes what it takes), each spliced between two writes.
        let mut spliced = Vec::new();
        for (i, stop) in [
            3usize,
            20,
            30,
            40 + (1 << 20),
            5 << 20,
            5 << 20,
            (9 << 20) + 17,
        ]
        .into_iter()
        .enumerate()
        {
            write_some(&mut q, 65_536 + 13, stop, &mut wire);
            out.urgent().extend_from_slice(&pong(i as u8 + 1));
            out.take_urgent_into(&mut q);
            spliced.push(wire.len());
        }
        write_some(&mut q, 1 << 22, usize::MAX, &mut wire);
        assert!(q.is_empty() && out.is_empty());

        let frames = frames_of(&wire);
        let pongs: Vec<_> = frames.iter().filter(|f| f.0 == 0x32).collect();
        assert_eq!(pongs.len(), 1 + spliced.len());
        for (pong, queued_at) in pongs[1..].iter().zip(&spliced) {
            // Only the rest of the frame being written when it was queued went ahead of it.
            assert!(
                pong.2 - queued_at <= HEADER_LEN + FRAME as usize,
                "a PONG queued at byte {queued_at} left at {}",
                pong.2
            );
        }
        // The message's frames are whole and in order: without the PONGs it is what it was.
        let mut message = Vec::with_capacity(expected.len());
        for f in frames.iter().filter(|f| f.0 != 0x32) {
            message.extend_from_slice(&wire[f.2..f.3]);
        }
        assert!(message == expected, "the message arrived changed");
        // Two PONGs queued at the same byte go out together, in order.
        let nonces: Vec<u8> = pongs.iter().map(|p| wire[p.2 + HEADER_LEN]).collect();
        assert_eq!(nonces, (0..=spliced.len() as u8).collect::<Vec<_>>());
    }

    #[test]
    fn a_pong_goes_between_small_frames_of_a_chunk_written_in_part() {
        let mut out = Outbox::default();
        for i in 0..100u8 {
            out.put_slice(&[10, 0, 0, 0, 0x22, 0, 0, 0, i, 0, 0, 0, 0, 0, 0, 0]);
            out.put_slice(&[i; 10]);
        }
        let mut q = WriteQueue::default();
        out.take_into(&mut q);
        let mut wire = Vec::new();
        write_some(&mut q, 7, 26 * 3 + 5, &mut wire);
        out.urgent().extend_from_slice(&pong(9));
        out.take_into(&mut q);
        write_some(&mut q, 1000, usize::MAX, &mut wire);
        let frames = frames_of(&wire);
        assert_eq!(frames.len(), 101);
        assert_eq!(frames[4].0, 0x32, "right after the frame being written");
        // Written exactly to a boundary: the PONG goes next.
        let mut q = WriteQueue::default();
        for i in 0..3u8 {
            out.put_slice(&[0, 0, 0, 0, 0x22, 0, 0, 0, i, 0, 0, 0, 0, 0, 0, 0]);
        }
        out.take_into(&mut q);
        let mut wire = Vec::new();
        write_some(&mut q, 16, 16, &mut wire);
        out.urgent().extend_from_slice(&pong(1));
        out.take_urgent_into(&mut q);
        write_some(&mut q, 1000, usize::MAX, &mut wire);
        let types: Vec<u8> = frames_of(&wire).iter().map(|f| f.0).collect();
        assert_eq!(types, [0x22, 0x32, 0x22, 0x22]);
        // Nothing in flight: the direct write takes the PONG with the tail.
        out.put_slice(&pong(2));
        out.urgent().extend_from_slice(&pong(3));
        assert_eq!(out.tail_only().map(|t| t.len()), Some(2 * pong(0).len()));
        assert!(out.urgent.is_empty());
    }

    /// The queue's bytes, and its descriptors' positions.
    fn queued(q: &WriteQueue) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = Vec::new();
        q.with_slices(|slices| slices.iter().for_each(|s| bytes.extend_from_slice(s)));
        (bytes, q.fds.iter().map(|(at, _)| *at).collect())
    }

    #[test]
    fn a_descriptor_still_goes_with_its_frames_first_byte_when_a_pong_is_spliced_ahead() {
        // A large RESULT, then three 40-byte frames with a descriptor each.
        let body = Bytes::from(vec![1u8; 3 * 65_536]);
        let mut out = Outbox::default();
        encode_message(
            &mut out.message_writer(&body),
            5,
            MessageHead::Result,
            &body,
            65_536,
        )
        .unwrap();
        for i in 0..3u8 {
            out.attach_fd(memfd());
            out.put_slice(&[24, 0, 0, 0, 0x50, 0, 0, 0, i, 0, 0, 0, 0, 0, 0, 0]);
            out.put_slice(&[i; 24]);
        }
        let mut q = WriteQueue::default();
        out.take_into(&mut q);
        // Inside the RESULT's first frame, then inside the second descriptor's frame.
        // (The second write carried the first descriptor: its frame's first byte was in it.)
        for (written, fds_sent) in [(1000usize, 0usize), (196_700 - 1000, 1)] {
            q.advance_fds(written, fds_sent);
            out.urgent().extend_from_slice(&pong(1));
            out.take_urgent_into(&mut q);
            let (bytes, fds) = queued(&q);
            // The front is inside a frame: find the boundary the PONG went to, then walk.
            let pong_at = bytes
                .windows(5)
                .position(|w| w == [8, 0, 0, 0, 0x32])
                .unwrap();
            let starts: Vec<usize> = frames_of(&bytes[pong_at..])
                .iter()
                .filter(|f| f.0 == 0x50)
                .map(|f| f.2 + pong_at)
                .collect();
            assert_eq!(fds, starts, "each descriptor at its frame's first byte");
            assert_eq!(fds.len(), 3 - fds_sent);
        }
        // The remaining descriptor goes out with the write of its frame.
        let mut sent = 0;
        while !q.is_empty() {
            let (n, fds) =
                q.with_slices_and_fds(|s, fds| (s.iter().map(|s| s.len()).sum(), fds.len()));
            sent += fds;
            q.advance_fds(n, fds);
        }
        assert_eq!(sent, 2);
    }

    #[test]
    fn small_frames_keep_their_order_around_a_large_body() {
        let body = Bytes::from(vec![5u8; 40_000]);
        let mut out = Outbox::default();
        out.put_slice(b"aa");
        let mut w = out.message_writer(&body);
        w.put_slice(b"head");
        w.put_slice(&body);
        out.put_slice(b"zz");
        let mut expected = b"aahead".to_vec();
        expected.extend_from_slice(&body);
        expected.extend_from_slice(b"zz");
        assert_eq!(out.written(), expected.len());
        assert_eq!(drain(&mut out), expected);
        assert!(out.is_empty());
    }
}
