//! Frames waiting for the socket.
//!
//! Producers (the reader answering PING, handler threads ending requests, row sinks) append
//! under the core lock; the one writer task takes everything queued and writes it with one
//! vectored syscall. Frames are encoded into a tail buffer that is sealed into a chunk each
//! time the writer takes it, so producers never wait for the socket.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use wirepool_proto::FrameBuf;

/// Slices of a message body at least this large are queued by reference instead of copied.
const COPY_LIMIT: usize = 16 * 1024;

/// Most slices handed to one `writev` (Linux IOV_MAX is 1024; fewer keeps the array on the stack
/// cheap and still amortises the syscall over hundreds of frames).
const MAX_IOV: usize = 64;

#[derive(Default)]
pub(crate) struct Outbox {
    chunks: VecDeque<Bytes>,
    tail: BytesMut,
    queued: usize,
}

impl Outbox {
    /// The buffer small frames are encoded into, in order after every queued chunk.
    pub(crate) fn tail(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// Queue a buffer by reference, after everything before it.
    fn push(&mut self, bytes: Bytes) {
        self.seal();
        self.queued += bytes.len();
        self.chunks.push_back(bytes);
    }

    /// A frame buffer for one RESULT or END whose body is `body`: the core encodes headers into
    /// the tail as usual, and large slices of `body` are queued by reference, not copied.
    pub(crate) fn message_writer<'a>(&'a mut self, body: &'a Bytes) -> MessageWriter<'a> {
        MessageWriter { out: self, body }
    }

    fn seal(&mut self) {
        if !self.tail.is_empty() {
            let sealed = self.tail.split().freeze();
            self.queued += sealed.len();
            self.chunks.push_back(sealed);
        }
    }

    /// Bytes waiting, for back-pressure on the reader.
    pub(crate) fn len(&self) -> usize {
        self.queued + self.tail.len()
    }

    /// Move everything queued to `into` (which the writer owns while it writes).
    pub(crate) fn take_into(&mut self, into: &mut WriteQueue) {
        self.seal();
        into.chunks.append(&mut self.chunks);
        self.queued = 0;
    }
}

/// What the writer is writing: chunks taken from the [`Outbox`].
#[derive(Default)]
pub(crate) struct WriteQueue {
    chunks: VecDeque<Bytes>,
}

impl WriteQueue {
    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Calls `write` with up to [`MAX_IOV`] slices, in order (an array on the stack).
    pub(crate) fn with_slices<R>(&self, write: impl FnOnce(&[IoSlice<'_>]) -> R) -> R {
        let mut slices = [IoSlice::new(&[]); MAX_IOV];
        let mut n = 0;
        for (slot, chunk) in slices.iter_mut().zip(&self.chunks) {
            *slot = IoSlice::new(chunk);
            n += 1;
        }
        write(&slices[..n])
    }

    /// Drop `n` written bytes from the front.
    pub(crate) fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let front = self.chunks.front_mut().expect("advance past the queued bytes");
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
/// it is used with the core's message encoders (`send_result`, `send_end`), which only append;
/// ROWS frames, which are patched in place, go through the plain tail.
pub(crate) struct MessageWriter<'a> {
    out: &'a mut Outbox,
    body: &'a Bytes,
}

impl MessageWriter<'_> {
    fn slice_of_body(&self, src: &[u8]) -> Option<Bytes> {
        let start = self.body.as_ptr() as usize;
        let at = src.as_ptr() as usize;
        let inside = at >= start && at + src.len() <= start + self.body.len();
        (src.len() >= COPY_LIMIT && inside).then(|| self.body.slice_ref(src))
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
        match self.slice_of_body(src) {
            Some(shared) => self.out.push(shared),
            None => self.out.tail.put_slice(src),
        }
    }
}

impl FrameBuf for MessageWriter<'_> {
    fn written(&self) -> usize {
        self.out.len()
    }

    fn truncate_to(&mut self, len: usize) {
        // Message encoders never truncate; keep the contract for the tail part anyway.
        let sealed = self.out.queued;
        if len >= sealed {
            self.out.tail.truncate(len - sealed);
        }
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
