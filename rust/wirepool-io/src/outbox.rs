//! Frames waiting for the socket, with large message bodies queued by reference; shared by the
//! parent's and the worker's drivers.
//!
//! Producers encode under their core's lock; the one writer task takes everything queued and
//! writes it with vectored writes, so producers never wait for the socket. Small frames land in
//! a tail buffer, sealed into a chunk each time the writer takes it; a slice of a message body
//! (a REQUEST's on the parent, a RESULT's or END's on the worker) of at least [`COPY_LIMIT`]
//! bytes is queued as a `Bytes` slice of that body instead of being copied (a 1 MiB message
//! costs no user-space copy on the way out).

use std::collections::VecDeque;
use std::io::IoSlice;

use std::os::fd::{BorrowedFd, OwnedFd};

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use wirepool_proto::FrameBuf;

/// Body slices at least this large are queued by reference instead of copied.
pub const COPY_LIMIT: usize = 16 * 1024;

/// Most slices handed to one `writev` (Linux IOV_MAX is 1024; fewer keeps the array on the stack
/// cheap and still amortises the syscall over hundreds of frames).
const MAX_IOV: usize = 64;

/// Most descriptors one write carries (PROTOCOL.md 20.5).
const MAX_FDS_PER_WRITE: usize = 8;

/// Encoded frames waiting for the writer. Small frames are encoded straight into it (it is a
/// [`FrameBuf`], or use [`tail`](Outbox::tail)); messages with a large body go through
/// [`message_writer`](Outbox::message_writer).
#[derive(Default)]
pub struct Outbox {
    chunks: VecDeque<Bytes>,
    tail: BytesMut,
    queued: usize,
    /// Descriptors to send with the byte at each position (from the outbox's front): a
    /// SHM_REGION's, attached to the write holding the frame's first byte (PROTOCOL.md 20.5).
    fds: Vec<(usize, OwnedFd)>,
}

impl Outbox {
    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.tail.is_empty()
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
        self.queued + self.tail.len()
    }

    /// The buffer small frames are encoded into, in order after every queued chunk.
    pub fn tail(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// Only small frames wait (no chunk queued by reference): the tail holds everything, and a
    /// caller may write it directly.
    /// A descriptor waiting to go with the bytes makes it `None`: only the writer attaches it.
    pub fn tail_only(&mut self) -> Option<&mut BytesMut> {
        (self.chunks.is_empty() && self.fds.is_empty()).then_some(&mut self.tail)
    }

    /// A frame buffer for one message whose body is `body`: headers go into the tail, large
    /// slices of `body` are queued by reference.
    pub fn message_writer<'a>(&'a mut self, body: &'a Bytes) -> MessageWriter<'a> {
        MessageWriter { out: self, body }
    }

    fn push(&mut self, bytes: Bytes) {
        self.seal();
        self.queued += bytes.len();
        self.chunks.push_back(bytes);
    }

    fn seal(&mut self) {
        if !self.tail.is_empty() {
            let sealed = self.tail.split().freeze();
            self.queued += sealed.len();
            self.chunks.push_back(sealed);
        }
    }

    /// Move everything queued to `into` (which the writer owns while it writes).
    pub fn take_into(&mut self, into: &mut WriteQueue) {
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
        self.push(Bytes::from(std::mem::replace(bytes, fresh)));
    }
}

/// What the writer is writing: chunks taken from the [`Outbox`].
#[derive(Default)]
pub struct WriteQueue {
    chunks: VecDeque<Bytes>,
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
        self.chunks.iter().map(Bytes::len).sum()
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
        for chunk in self.chunks.iter().take(MAX_IOV) {
            let mut bytes: &[u8] = chunk;
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
            if bytes.len() < chunk.len() {
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
        for (slot, chunk) in slices.iter_mut().zip(&self.chunks) {
            *slot = IoSlice::new(chunk);
            n += 1;
        }
        write(&slices[..n])
    }

    /// Drop `n` written bytes from the front.
    pub fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                debug_assert!(false, "advance past the queued bytes");
                return;
            };
            if n >= front.len() {
                n -= front.len();
                self.chunks.pop_front();
            } else {
                front.advance(n);
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
                return self.out.push(shared);
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
            out.chunks.back().map(|c| c.as_ptr()),
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
        assert!(out
            .chunks
            .iter()
            .any(|c| c.as_ptr() >= body.as_ptr()
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
