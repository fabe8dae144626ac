//! Frames waiting for the socket.
//!
//! Producers (the reader answering PING, handler threads ending requests, row sinks) append
//! under the core lock; the one writer task takes everything queued and writes it with one
//! vectored syscall. Frames are encoded into a tail buffer that is sealed into a chunk each
//! time the writer takes it, so producers never wait for the socket.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

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

    /// Up to [`MAX_IOV`] slices, in order.
    pub(crate) fn slices<'a>(&'a self, out: &mut Vec<IoSlice<'a>>) {
        out.clear();
        out.extend(self.chunks.iter().take(MAX_IOV).map(|c| IoSlice::new(c)));
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
