//! Bodies written in place: the zero-copy send side of the shared-memory lane.
//!
//! A [`BodyBuf`] is a growable byte buffer that lives in a memory file of this process (a
//! *shared region*) instead of the heap. Its owner writes a large message body into it (with
//! [`std::io::Write`], [`bytes::BufMut`], or as a `&mut [u8]`), then [`freeze`](BodyBuf::freeze)s
//! it into a [`Bytes`]. When that `Bytes` is sent as a request or result body on a connection
//! whose lane is on, the driver lends the peer the very bytes it points at (one SHM_BODY frame):
//! nothing is copied, not even once into a region as the ordinary lane does. On a connection
//! without the lane, or when the peer's window cannot take the region, the same `Bytes` is
//! written to the socket like any other body.
//!
//! Shared regions are kept in one table per process, by address, holding no region alive: a
//! region lives while a [`BodyBuf`], a `Bytes` view of it, or a connection that announced it
//! holds it, and is unmapped and closed when the last of them goes. A region is *claimed* (can
//! be written) by at most one [`BodyBuf`], and only while no view of its bytes exists: a range
//! lent to a peer is held (its view kept by the connection) until the peer's SHM_RELEASE, so
//! the owner never writes into a lent range (PROTOCOL.md 20.4).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};

use super::REGION_GRAIN;

/// A memory file of this process that bodies are written into, mapped read-write. Unsealed
/// (and so growable) until the first body written into it is frozen; sealed against shrinking
/// and growing from then on, before its descriptor can be sent.
pub(crate) struct SharedRegion {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
    sealed: bool,
    /// A [`BodyBuf`] or a frozen body's views use it: nobody else may write into it.
    claimed: AtomicBool,
}

// SAFETY: the mapping is plain memory owned by this value. Its bytes are written only through
// the one claim (a `BodyBuf`, `&mut` access) and read through views that exist only after the
// writer froze them; the claim is released when the last view goes.
unsafe impl Send for SharedRegion {}
// SAFETY: as above.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// A fresh, unsealed memory file of `size` bytes (a multiple of the grain), mapped
    /// read-write and already claimed by its creator.
    fn create(size: usize) -> io::Result<SharedRegion> {
        if size == 0 || size as u64 > i64::MAX as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a region of {size} bytes"),
            ));
        }
        // SAFETY: a NUL-terminated name and valid flags.
        let raw = unsafe {
            libc::memfd_create(
                c"wirepool-shm".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of `size` bytes of a file of that size that only this
        // process can resize (its descriptor was never shared).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedRegion {
            fd,
            ptr: NonNull::new(ptr.cast()).expect("mmap never returns null on success"),
            len: size,
            sealed: false,
            claimed: AtomicBool::new(true),
        })
    }

    /// The region's size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of its first byte (its key in the process's table).
    fn base(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Grows an unsealed region that nothing else refers to (the file, then the mapping, which
    /// may move: nothing points into it).
    fn grow(&mut self, size: usize) -> io::Result<()> {
        debug_assert!(!self.sealed && size > self.len);
        // SAFETY: ftruncate on a descriptor we own; the file is not sealed.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), size as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ptr`/`len` are our own mapping, which no reference points into (`&mut self`,
        // and the region is in no table yet); the file now has `size` bytes.
        let ptr = unsafe {
            libc::mremap(
                self.ptr.as_ptr().cast(),
                self.len,
                size,
                libc::MREMAP_MAYMOVE,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        self.ptr = NonNull::new(ptr.cast()).expect("mremap never returns null on success");
        self.len = size;
        Ok(())
    }

    /// Seals the file against shrinking, growing and further seals (before its descriptor is
    /// sent, PROTOCOL.md 20.5).
    fn seal(&mut self) -> io::Result<()> {
        if !self.sealed {
            let seals = super::REQUIRED_SEALS | libc::F_SEAL_SEAL;
            // SAFETY: fcntl on a descriptor we own.
            if unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
                return Err(io::Error::last_os_error());
            }
            self.sealed = true;
        }
        Ok(())
    }

    fn try_claim(&self) -> bool {
        self.claimed
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Bytes `..len` (the caller holds the claim or a view).
    fn slice(&self, len: usize) -> &[u8] {
        debug_assert!(len <= self.len);
        // SAFETY: `len` mapped bytes that live as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len) }
    }

    /// The whole region to write (the caller holds the claim, so no view of it exists).
    #[allow(clippy::mut_from_ref)]
    fn slice_mut_claimed(&self) -> &mut [u8] {
        // SAFETY: `len` mapped, writable bytes; the claim makes the caller the only one to
        // reach them (no view exists while a region is claimed by a writer).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsFd for SharedRegion {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: our own mapping; nothing refers to it any more (every user holds an `Arc`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The process's sealed shared regions by address, none held alive by the table.
static TABLE: Mutex<BTreeMap<usize, Weak<SharedRegion>>> = Mutex::new(BTreeMap::new());

fn table() -> std::sync::MutexGuard<'static, BTreeMap<usize, Weak<SharedRegion>>> {
    // Nothing panics while holding it; dropping a region never takes it (no re-entry).
    TABLE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The shared region holding all of `bytes` and its offset there, if `bytes` is a body frozen
/// from a [`BodyBuf`] of this process (or a slice of one).
pub(crate) fn find_region(bytes: &[u8]) -> Option<(Arc<SharedRegion>, usize)> {
    if bytes.is_empty() {
        return None;
    }
    let at = bytes.as_ptr() as usize;
    let t = table();
    let (&base, weak) = t.range(..=at).next_back()?;
    let region = weak.upgrade()?;
    let end = at.checked_add(bytes.len())?;
    (end <= base + region.len).then(|| (region, at - base))
}

/// Claims the smallest free shared region of at least `size` bytes, dropping the table's
/// entries of regions that are gone.
fn claim_free(size: usize) -> Option<Arc<SharedRegion>> {
    let mut t = table();
    t.retain(|_, w| w.strong_count() > 0);
    let mut best: Option<Arc<SharedRegion>> = None;
    for w in t.values() {
        let Some(r) = w.upgrade() else { continue };
        if r.len < size || best.as_ref().is_some_and(|b| b.len <= r.len) {
            continue;
        }
        if r.claimed.load(Ordering::Relaxed) {
            continue;
        }
        best = Some(r);
    }
    // Claimed after the scan: only the chosen one (another thread may have taken it meanwhile:
    // then a fresh region is made).
    best.filter(|r| r.try_claim())
}

/// The write access to a claimed region: released when dropped.
struct Claim(Arc<SharedRegion>);

impl Drop for Claim {
    fn drop(&mut self) {
        self.0.claimed.store(false, Ordering::Release);
    }
}

/// The owner of a frozen body's bytes: its claim (the region stays unwritable while any view
/// of the body lives).
struct Frozen {
    claim: Claim,
    len: usize,
}

impl AsRef<[u8]> for Frozen {
    fn as_ref(&self) -> &[u8] {
        self.claim.0.slice(self.len)
    }
}

enum Inner {
    Shared { claim: Claim, len: usize },
    Heap(BytesMut),
}

/// A buffer to build a large message body in, in shared memory when the lane can carry it:
/// [`freeze`](BodyBuf::freeze) it and send the `Bytes` (a worker's result, a parent's request
/// body), and the peer reads the very bytes written here (PROTOCOL.md 20, the zero-copy send).
///
/// Get one from the SDK (`Context::body_buf` in a worker handler, `Pool::body_buf` in the
/// parent): it is a shared region when the lane is on and `capacity` reaches the lane's
/// threshold, an ordinary heap buffer otherwise (and then the `Bytes` is sent as usual). It
/// grows like a `Vec` when written past its capacity: a fresh region grows in place (the file
/// and its mapping, no copy); a reused region, whose size is sealed, moves to a larger one
/// (one copy of what was written): ask for the capacity you need up front when you know it.
///
/// The bytes of a reused region are what the last body there left: [`resize`](Self::resize)
/// fills, [`unfilled`](Self::unfilled) does not (for a caller that overwrites every byte).
///
/// ```
/// use std::io::Write;
/// use wirepool_io::shm::BodyBuf;
///
/// let mut body = BodyBuf::shared(4 << 20).unwrap();
/// assert!(body.is_shared());
/// body.write_all(b"header:").unwrap();
/// body.unfilled(1 << 20).fill(7); // a megabyte written in place
/// let bytes = body.freeze();      // send this: no copy on a connection whose lane is on
/// assert_eq!(bytes.len(), 7 + (1 << 20));
/// assert!(wirepool_io::shm::is_shared_body(&bytes));
/// ```
pub struct BodyBuf {
    inner: Inner,
}

impl BodyBuf {
    /// A buffer in a shared region of at least `capacity` bytes (a free one of this process,
    /// reused so its pages are already there, or a new one). Fails only when a memory file
    /// cannot be created or mapped (out of memory, too many descriptors).
    pub fn shared(capacity: usize) -> io::Result<BodyBuf> {
        let want = capacity.max(1);
        let region = match claim_free(want) {
            Some(r) => r,
            None => Arc::new(SharedRegion::create(
                want.div_ceil(REGION_GRAIN) * REGION_GRAIN,
            )?),
        };
        Ok(BodyBuf {
            inner: Inner::Shared {
                claim: Claim(region),
                len: 0,
            },
        })
    }

    /// An ordinary heap buffer (the fallback where the lane cannot carry the body).
    pub fn heap(capacity: usize) -> BodyBuf {
        BodyBuf {
            inner: Inner::Heap(BytesMut::with_capacity(capacity)),
        }
    }

    /// Whether the bytes are in a shared region (sent without a copy where the lane is on).
    pub fn is_shared(&self) -> bool {
        matches!(self.inner, Inner::Shared { .. })
    }

    /// Bytes written.
    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Shared { len, .. } => *len,
            Inner::Heap(b) => b.len(),
        }
    }

    /// Nothing written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes that can be written before the buffer grows.
    pub fn capacity(&self) -> usize {
        match &self.inner {
            Inner::Shared { claim, .. } => claim.0.len,
            Inner::Heap(b) => b.capacity(),
        }
    }

    /// Makes room for `additional` more bytes.
    ///
    /// # Panics
    /// When a shared region cannot grow or be replaced (the system is out of memory or
    /// descriptors), as a `Vec` panics when it cannot allocate.
    pub fn reserve(&mut self, additional: usize) {
        let len = self.len();
        let need = len.checked_add(additional).expect("capacity overflow");
        if need <= self.capacity() {
            return;
        }
        match &mut self.inner {
            Inner::Heap(b) => b.reserve(additional),
            Inner::Shared { claim, len } => {
                let size = need
                    .max(2 * claim.0.len)
                    .div_ceil(REGION_GRAIN)
                    .saturating_mul(REGION_GRAIN);
                // A fresh region only this buffer knows grows in place.
                if let Some(region) = Arc::get_mut(&mut claim.0).filter(|r| !r.sealed) {
                    region
                        .grow(size)
                        .unwrap_or_else(|e| panic!("growing a shared region to {size} bytes: {e}"));
                    return;
                }
                let bigger = SharedRegion::create(size)
                    .unwrap_or_else(|e| panic!("a shared region of {size} bytes: {e}"));
                bigger.slice_mut_claimed()[..*len].copy_from_slice(claim.0.slice(*len));
                *claim = Claim(Arc::new(bigger));
            }
        }
    }

    /// Appends `data`.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        self.unfilled(data.len()).copy_from_slice(data);
    }

    /// Appends `n` bytes and returns them to be written: their contents are unspecified (zero
    /// in fresh memory, what an earlier body left in a reused region); overwrite all of them.
    pub fn unfilled(&mut self, n: usize) -> &mut [u8] {
        self.reserve(n);
        match &mut self.inner {
            Inner::Heap(b) => {
                let start = b.len();
                b.resize(start + n, 0);
                &mut b[start..]
            }
            Inner::Shared { claim, len } => {
                let start = *len;
                *len += n;
                &mut claim.0.slice_mut_claimed()[start..start + n]
            }
        }
    }

    /// Sets the length to `new_len`, filling new bytes with `value` (like `Vec::resize`).
    pub fn resize(&mut self, new_len: usize, value: u8) {
        let len = self.len();
        if new_len <= len {
            self.truncate(new_len);
        } else {
            self.unfilled(new_len - len).fill(value);
        }
    }

    /// Keeps the first `len` bytes (no effect when it holds fewer).
    pub fn truncate(&mut self, new_len: usize) {
        match &mut self.inner {
            Inner::Heap(b) => b.truncate(new_len),
            Inner::Shared { len, .. } => *len = (*len).min(new_len),
        }
    }

    /// Empties it, keeping its capacity.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// The body, ready to send: a `Bytes` whose views hold the region (it is not written
    /// again until the last of them, and the peer's loan of it, are gone). An empty shared
    /// buffer gives an empty `Bytes` and frees its region at once.
    pub fn freeze(self) -> Bytes {
        match self.inner {
            Inner::Heap(b) => b.freeze(),
            Inner::Shared { len: 0, .. } => Bytes::new(),
            Inner::Shared { mut claim, len } => {
                if let Some(region) = Arc::get_mut(&mut claim.0) {
                    if !region.sealed {
                        if region.seal().is_err() {
                            // Cannot happen for a memory file we created with sealing allowed;
                            // a body that cannot be lent still goes over the socket.
                            return Bytes::copy_from_slice(region.slice(len));
                        }
                        let base = region.base();
                        let weak = Arc::downgrade(&claim.0);
                        table().insert(base, weak);
                    }
                }
                Bytes::from_owner(Frozen { claim, len })
            }
        }
    }
}

impl std::ops::Deref for BodyBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.inner {
            Inner::Heap(b) => b,
            Inner::Shared { claim, len } => claim.0.slice(*len),
        }
    }
}

impl std::ops::DerefMut for BodyBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.inner {
            Inner::Heap(b) => b,
            Inner::Shared { claim, len } => &mut claim.0.slice_mut_claimed()[..*len],
        }
    }
}

impl std::fmt::Debug for BodyBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyBuf")
            .field("shared", &self.is_shared())
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl io::Write for BodyBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.extend_from_slice(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// SAFETY: `chunk_mut` returns the spare capacity (mapped, writable bytes past `len`, or the
// heap buffer's own); `advance_mut` moves `len` within the capacity.
unsafe impl BufMut for BodyBuf {
    fn remaining_mut(&self) -> usize {
        isize::MAX as usize - self.len()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        match &mut self.inner {
            // SAFETY: the caller initialised `cnt` bytes of the chunk.
            Inner::Heap(b) => unsafe { b.advance_mut(cnt) },
            Inner::Shared { claim, len } => {
                assert!(*len + cnt <= claim.0.len, "advance past the capacity");
                *len += cnt;
            }
        }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        if self.capacity() == self.len() {
            self.reserve(64 * 1024);
        }
        match &mut self.inner {
            Inner::Heap(b) => b.chunk_mut(),
            Inner::Shared { claim, len } => {
                UninitSlice::new(&mut claim.0.slice_mut_claimed()[*len..])
            }
        }
    }

    fn put_slice(&mut self, src: &[u8]) {
        self.extend_from_slice(src);
    }
}

/// Whether `bytes` is (a slice of) a body frozen from a shared [`BodyBuf`] of this process:
/// what the drivers lend without a copy.
pub fn is_shared_body(bytes: &[u8]) -> bool {
    find_region(bytes).is_some()
}

/// A body the caller has in a [`BodyBuf`]-style region, or copies into one: the region to lend
/// from and a `Bytes` that keeps its bytes unwritable until released.
pub(crate) struct InRegion {
    pub(crate) region: Arc<SharedRegion>,
    pub(crate) offset: usize,
    pub(crate) keep: Bytes,
}

/// `body` as it is when it is already in a shared region (no copy).
pub(crate) fn as_placed(body: &Bytes) -> Option<InRegion> {
    let (region, offset) = find_region(body)?;
    Some(InRegion {
        region,
        offset,
        keep: body.clone(),
    })
}

/// `body` copied into `claimed` (a free region of the caller's, claimed) or into a new region.
pub(crate) fn copy_in(body: &[u8], claimed: Option<Arc<SharedRegion>>) -> Option<InRegion> {
    let mut buf = match claimed {
        Some(region) => BodyBuf {
            inner: Inner::Shared {
                claim: Claim(region),
                len: 0,
            },
        },
        None => BodyBuf::shared(body.len()).ok()?,
    };
    buf.extend_from_slice(body);
    let keep = buf.freeze();
    let (region, offset) = find_region(&keep)?;
    Some(InRegion {
        region,
        offset,
        keep,
    })
}

impl SharedRegion {
    /// Claims this region for a body to be copied in (see [`in_region`]).
    pub(crate) fn claim(self: &Arc<Self>) -> Option<Arc<SharedRegion>> {
        self.try_claim().then(|| self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_fresh_region_grows_in_place_and_its_body_is_found_by_address() {
        let mut body = BodyBuf::shared(1).unwrap();
        assert_eq!(body.capacity(), REGION_GRAIN);
        body.write_all(&[1; 1000]).unwrap();
        body.put_bytes(2, REGION_GRAIN); // past the capacity: the file and mapping grow
        assert!(body.capacity() >= REGION_GRAIN + 1000);
        assert!(body.is_shared());
        assert_eq!(body[999], 1);
        assert_eq!(body[1000], 2);
        let frozen = body.freeze();
        assert_eq!(frozen.len(), REGION_GRAIN + 1000);
        assert!(is_shared_body(&frozen));
        let (region, offset) = find_region(&frozen.slice(10..20)).unwrap();
        assert_eq!(offset, 10);
        assert!(region.sealed);
        assert!(region.claimed.load(Ordering::Relaxed));
        // Bytes that are not a shared body are not found.
        assert!(!is_shared_body(&[0u8; 64]));
        drop(frozen);
        assert!(
            !region.claimed.load(Ordering::Relaxed),
            "the last view released it"
        );
    }

    #[test]
    fn a_released_region_is_reused_and_a_sealed_one_moves_when_it_must_grow() {
        let mut a = BodyBuf::shared(3 * REGION_GRAIN).unwrap();
        a.resize(100, 9);
        let a = a.freeze();
        let (region, _) = find_region(&a).unwrap();
        let base = region.base();
        drop(a);
        // The table holds no region alive; a holder (as a connection's table) keeps it.
        let mut b = BodyBuf::shared(3 * REGION_GRAIN).unwrap();
        // Another test may have taken it meanwhile: then `b` is a new region.
        let reused = b.as_ptr() as usize == base;
        b.extend_from_slice(b"kept");
        b.reserve(4 * REGION_GRAIN); // sealed if reused: moves, copying what was written
        assert_eq!(&b[..], b"kept");
        if reused {
            assert_ne!(b.as_ptr() as usize, base);
            assert!(
                !region.claimed.load(Ordering::Relaxed),
                "the old claim was given back"
            );
        }
        drop(region);
    }

    #[test]
    fn empty_and_heap_buffers_freeze_as_ordinary_bytes() {
        assert!(BodyBuf::shared(10).unwrap().freeze().is_empty());
        let mut heap = BodyBuf::heap(4);
        assert!(!heap.is_shared());
        heap.write_all(b"abcdef").unwrap();
        heap.truncate(3);
        let bytes = heap.freeze();
        assert_eq!(&bytes[..], b"abc");
        assert!(!is_shared_body(&bytes));
    }

    #[test]
    fn a_dropped_writer_unmaps_a_fresh_region() {
        let mut body = BodyBuf::shared(REGION_GRAIN).unwrap();
        body.resize(10, 1);
        let at = body.as_ptr() as usize;
        let mapped = |at: usize| {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .filter_map(|l| {
                    l.split_whitespace()
                        .next()?
                        .split_once('-')
                        .map(|(a, _)| a.to_owned())
                })
                .any(|a| usize::from_str_radix(&a, 16) == Ok(at))
        };
        assert!(mapped(at));
        drop(body);
        assert!(!mapped(at), "unmapped with its writer");
    }
}
