//! The shared-memory lane's primitives (PROTOCOL.md section 20), Linux only: sealed memory files
//! (`memfd_create`), their descriptors passed over the connection (`SCM_RIGHTS`), and zero-copy
//! views of a received region.
//!
//! The owner of a region creates it with [`OwnedRegion::create`] (sealed against shrinking and
//! growing before anyone else sees it), writes payloads into it and sends its descriptor once
//! with [`send_with_fds`]. The receiver takes the descriptor from [`recv_with_fds`], checks and
//! maps it with [`Region::map_received`], and hands out [`Region::lend`] views: `Bytes` that keep
//! the mapping alive and run a release callback (the driver's SHM_RELEASE) when the last clone or
//! slice of them is dropped. The mapping is unmapped when the region and every view are gone.
//!
//! ```
//! use wirepool_io::shm::{OwnedRegion, Region};
//! use std::os::fd::AsFd;
//!
//! let mut owned = OwnedRegion::create(4096).unwrap();
//! owned.as_mut_slice()[..5].copy_from_slice(b"hello");
//! // In a real connection the descriptor travels with `send_with_fds`; here it is duplicated.
//! let fd = owned.as_fd().try_clone_to_owned().unwrap();
//! let region = Region::map_received(fd, 4096).unwrap();
//! let released = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
//! let flag = released.clone();
//! let view = region
//!     .lend(0, 5, move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
//!     .unwrap();
//! drop(region); // the view keeps the mapping
//! assert_eq!(&view[..], b"hello");
//! drop(view);
//! assert!(released.load(std::sync::atomic::Ordering::SeqCst));
//! ```

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use bytes::Bytes;
use wirepool_proto::{ErrorCode, ProtocolError};

/// The seals a received region must carry (PROTOCOL.md 20.5): without `F_SEAL_SHRINK` its owner
/// could truncate it later and every read of a view past the new end would raise SIGBUS.
pub const REQUIRED_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Descriptors a sender attaches to one `sendmsg`, and a receiver makes room for in one
/// `recvmsg` (PROTOCOL.md 20.5).
pub const MAX_FDS_PER_WRITE: usize = 8;

/// The [`ProtocolError`] inside an `io::Error` returned by [`recv_with_fds`], if it is one
/// (`SHM_BAD_DESCRIPTOR` for a read that carried too many descriptors).
pub fn protocol_error(e: &io::Error) -> Option<&ProtocolError> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<ProtocolError>())
}

fn shm_error(code: ErrorCode, message: impl Into<String>) -> ProtocolError {
    ProtocolError::new(code, 0, message)
}

/// One `mmap`ed range, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; shared access is read-only (a
// writable mapping is only reachable through `&mut OwnedRegion`).
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of `len` bytes of a descriptor we hold; the kernel
        // chooses the address. The caller checked that the file is at least `len` long and
        // cannot shrink, so no page of it can fault with SIGBUS.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap never returns null on success"),
            len,
        })
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` mapped, readable bytes that live as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range was returned by mmap and nothing refers to it any more (every view
        // holds an `Arc` of this mapping).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A region this process owns: a sealed memory file mapped read-write, whose descriptor is sent
/// to the peer once (PROTOCOL.md 20.4). Dropping it closes the descriptor and unmaps it; the
/// peer's mapping stays valid (the file lives until its last descriptor or mapping is gone).
pub struct OwnedRegion {
    fd: OwnedFd,
    map: Mapping,
}

impl OwnedRegion {
    /// Creates a memory file of `size` bytes (`size` >= 1), sealed against shrinking, growing
    /// and further seals, and maps it read-write.
    pub fn create(size: usize) -> io::Result<OwnedRegion> {
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
        // SAFETY: ftruncate and fcntl on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let seals = REQUIRED_SEALS | libc::F_SEAL_SEAL;
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping::new(fd.as_fd(), size, true)?;
        Ok(OwnedRegion { fd, map })
    }

    /// The region's size in bytes.
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// Always false: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// The region's bytes, to read.
    pub fn as_slice(&self) -> &[u8] {
        self.map.as_slice()
    }

    /// The region's bytes, to write a payload in place. The owner must not write into a range
    /// it has lent and not had back (PROTOCOL.md 20.4): the peer may be reading it.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` mapped, writable bytes; `&mut self` makes this the only reference in
        // this process.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr.as_ptr(), self.map.len) }
    }
}

impl AsFd for OwnedRegion {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A region received from the peer, checked and mapped read-only (PROTOCOL.md 20.5). Clones
/// share the mapping; it is unmapped when the last clone and the last view are dropped.
#[derive(Clone)]
pub struct Region {
    map: Arc<Mapping>,
}

impl Region {
    /// Checks the descriptor of a SHM_REGION announcing `size` bytes and maps it read-only;
    /// the descriptor is closed either way (a mapped region costs no descriptor).
    ///
    /// Refused with `SHM_BAD_DESCRIPTOR` ([`ErrorCode::ShmBadDescriptor`]): a file that is not a sealable memory file,
    /// lacks [`REQUIRED_SEALS`], is not on tmpfs (a hugetlbfs file can SIGBUS when its pool runs
    /// dry), or whose size is not `size`, or a mapping that fails. The seals are checked before
    /// the mapping exists, so a hostile owner can never truncate the file under it.
    pub fn map_received(fd: OwnedFd, size: u64) -> Result<Region, ProtocolError> {
        let bad = |m: String| shm_error(ErrorCode::ShmBadDescriptor, m);
        if size == 0 || size > isize::MAX as u64 {
            return Err(shm_error(
                ErrorCode::ShmBadRegion,
                format!("a region of {size} bytes"),
            ));
        }
        // SAFETY: fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            let e = io::Error::last_os_error();
            return Err(bad(format!(
                "not a sealable memory file (F_GET_SEALS: {e})"
            )));
        }
        if seals & REQUIRED_SEALS != REQUIRED_SEALS {
            return Err(bad(format!(
                "the memory file is not sealed against shrinking and growing (seals {seals:#x})"
            )));
        }
        let mut fs = MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: fstatfs fills the struct on success.
        if unsafe { libc::fstatfs(fd.as_raw_fd(), fs.as_mut_ptr()) } < 0 {
            return Err(bad(format!("fstatfs: {}", io::Error::last_os_error())));
        }
        // SAFETY: initialised by the successful call.
        let f_type = unsafe { fs.assume_init() }.f_type;
        #[allow(clippy::unnecessary_cast)] // f_type's type differs between C libraries
        if f_type as i64 != libc::TMPFS_MAGIC as i64 {
            return Err(bad(format!(
                "the memory file is not on tmpfs (filesystem {f_type:#x})"
            )));
        }
        let mut st = MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat fills the struct on success.
        if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } < 0 {
            return Err(bad(format!("fstat: {}", io::Error::last_os_error())));
        }
        // SAFETY: initialised by the successful call.
        let actual = unsafe { st.assume_init() }.st_size;
        if actual < 0 || actual as u64 != size {
            return Err(bad(format!(
                "the memory file has {actual} bytes, its SHM_REGION announced {size}"
            )));
        }
        let map = Mapping::new(fd.as_fd(), size as usize, false)
            .map_err(|e| bad(format!("mmap of {size} bytes: {e}")))?;
        Ok(Region { map: Arc::new(map) })
    }

    /// The region's size in bytes.
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// Always false: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// A zero-copy view of `length` bytes at `offset`, holding the mapping; `on_release` runs
    /// once, when the last clone or slice of the view is dropped (the driver sends SHM_RELEASE
    /// then). A range that is empty or runs past the region is `SHM_BOUNDS`, and
    /// `on_release` is dropped without running.
    pub fn lend(
        &self,
        offset: u64,
        length: u64,
        on_release: impl FnOnce() + Send + 'static,
    ) -> Result<Bytes, ProtocolError> {
        let (offset, length) = self.check_range(offset, length)?;
        Ok(Bytes::from_owner(View {
            map: self.map.clone(),
            offset,
            length,
            on_release: Some(Box::new(on_release)),
        }))
    }

    /// [`lend`](Self::lend) without a release callback.
    pub fn view(&self, offset: u64, length: u64) -> Result<Bytes, ProtocolError> {
        let (offset, length) = self.check_range(offset, length)?;
        Ok(Bytes::from_owner(View {
            map: self.map.clone(),
            offset,
            length,
            on_release: None,
        }))
    }

    fn check_range(&self, offset: u64, length: u64) -> Result<(usize, usize), ProtocolError> {
        let size = self.map.len as u64;
        match offset.checked_add(length) {
            Some(end) if length > 0 && end <= size => Ok((offset as usize, length as usize)),
            _ => Err(shm_error(
                ErrorCode::ShmBounds,
                format!("bytes {offset} + {length} of a region of {size} bytes"),
            )),
        }
    }
}

/// Descriptors that arrived with `recvmsg`, oldest first, each waiting for its SHM_REGION.
pub type DescriptorQueue = Arc<std::sync::Mutex<std::collections::VecDeque<OwnedFd>>>;

/// The core's mapper for a driver that reads with `recvmsg` (PROTOCOL.md 20.7): each
/// SHM_REGION takes the oldest received descriptor and maps it with
/// [`Region::map_received`]; none waiting is `SHM_BAD_DESCRIPTOR`.
pub fn descriptor_mapper(queue: DescriptorQueue) -> wirepool_proto::shm::ShmMapper {
    Box::new(move |region, size| {
        let fd = queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front()
            .ok_or_else(|| {
                ProtocolError::new(
                    ErrorCode::ShmBadDescriptor,
                    0,
                    format!("no descriptor for SHM_REGION {region}"),
                )
            })?;
        let mapped = Region::map_received(fd, size)?;
        Ok(Arc::new(mapped) as Arc<dyn wirepool_proto::shm::ShmMapping>)
    })
}

/// The core asks a mapped region for the view of each SHM_BODY (PROTOCOL.md 20.7).
impl wirepool_proto::shm::ShmMapping for Region {
    fn lend(
        &self,
        offset: u64,
        length: u64,
        on_release: Box<dyn FnOnce() + Send>,
    ) -> Result<Bytes, ProtocolError> {
        Region::lend(self, offset, length, on_release)
    }
}

type ReleaseFn = Box<dyn FnOnce() + Send>;

/// The owner of a lent view's bytes: the mapping and the release to run when it goes.
struct View {
    map: Arc<Mapping>,
    offset: usize,
    length: usize,
    on_release: Option<ReleaseFn>,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        &self.map.as_slice()[self.offset..self.offset + self.length]
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if let Some(release) = self.on_release.take() {
            release();
        }
    }
}

/// Region sizes are rounded up to this, so bodies of similar sizes reuse one region.
const REGION_GRAIN: usize = 2 << 20;

mod body;
use body::SharedRegion;
pub use body::{is_shared_body, BodyBuf};

/// How long an owner keeps a region that no body used before it retires it (PROTOCOL.md 20.4,
/// `shm_idle_retire`): a connection that stops sending large bodies holds no shared memory on
/// either side a second later, while back-to-back calls keep reusing warm pages.
pub const IDLE_RETIRE: std::time::Duration = std::time::Duration::from_millis(1000);

/// One region this side announced on the connection, and when it was last seen in use (a
/// body placed in it, or a range of it lent).
struct Kept {
    id: u32,
    region: Arc<SharedRegion>,
    last_used: std::time::Instant,
}

/// A body placed in a region of this side, ready to lend: send it with `send_*_shm(range)`,
/// then give `keep` to [`Connection::shm_hold`](wirepool_proto::Connection::shm_hold) so the
/// region is not written again until the peer releases the range.
pub struct Placed {
    /// The range to lend.
    pub range: wirepool_proto::shm::ShmRange,
    /// A view of the lent bytes, to hold until the release.
    pub keep: Bytes,
}

/// The regions this side lends from on one connection (the owner's half of PROTOCOL.md 20.4).
/// A body frozen from a shared [`BodyBuf`] is lent where it is (its region announced on the
/// connection first if it was not: no copy); any other body is copied into a free region of
/// the connection (reused, so its pages are already there), else into a new one. A new
/// announcement first retires free regions of the connection that are too small or, when the
/// window is full, the least recently used free ones, so live memory stays within the window
/// (and 64 regions). A region no body used for [`IDLE_RETIRE`] is retired by
/// [`retire_idle`](Self::retire_idle), which the driver calls from its housekeeping. When
/// nothing fits, the caller sends the body over the socket.
#[derive(Default)]
pub struct Regions {
    regions: Vec<Kept>,
}

impl Regions {
    /// Places `body` for the lane: where it is when it was frozen from a shared [`BodyBuf`],
    /// else copied into a free region of the connection; `None` when the lane is off or the
    /// window cannot take it. A new region's SHM_REGION goes to `out` with its descriptor
    /// attached.
    pub fn place(
        &mut self,
        conn: &mut wirepool_proto::Connection,
        body: &Bytes,
        out: &mut crate::outbox::Outbox,
    ) -> Option<Placed> {
        let lender = conn.shm_lender()?;
        let len = body.len();
        if len == 0 {
            return None;
        }
        let placed = match body::as_placed(body) {
            Some(placed) => placed,
            None => {
                let free_here = self
                    .regions
                    .iter()
                    .filter(|k| k.region.len() >= len && !lender.is_lent(k.id))
                    .find_map(|k| k.region.claim());
                // A body the window can never take is not copied anywhere.
                if free_here.is_none()
                    && len.div_ceil(REGION_GRAIN) * REGION_GRAIN > lender.window() as usize
                {
                    return None;
                }
                body::copy_in(body, free_here)?
            }
        };
        let id = self.announced(conn, &placed.region, out)?;
        Some(Placed {
            range: wirepool_proto::shm::ShmRange {
                region: id,
                offset: placed.offset as u64,
                length: len as u64,
            },
            keep: placed.keep,
        })
    }

    /// The connection's id of `region`, announcing it first when it is new here.
    fn announced(
        &mut self,
        conn: &mut wirepool_proto::Connection,
        region: &Arc<SharedRegion>,
        out: &mut crate::outbox::Outbox,
    ) -> Option<u32> {
        let now = std::time::Instant::now();
        if let Some(k) = self
            .regions
            .iter_mut()
            .find(|k| Arc::ptr_eq(&k.region, region))
        {
            k.last_used = now;
            return Some(k.id);
        }
        let size = region.len();
        // Free regions too small for this body make room for the one it needs; when the window
        // is still full, the least recently used free ones.
        let lender = conn.shm_lender()?;
        let mut free: Vec<(bool, std::time::Instant, u32)> = self
            .regions
            .iter()
            .filter(|k| !lender.is_lent(k.id))
            .map(|k| (k.region.len() >= size, k.last_used, k.id))
            .collect();
        free.sort();
        for (large_enough, _, id) in free {
            let lender = conn.shm_lender()?;
            if large_enough && lender.can_announce(size as u64) {
                break;
            }
            if conn.send_shm_retire(id, out).is_ok() {
                self.regions.retain(|k| k.id != id);
            }
        }
        if !conn.shm_lender()?.can_announce(size as u64) {
            return None;
        }
        let fd = region.as_fd().try_clone_to_owned().ok()?;
        out.attach_fd(fd);
        let Ok(id) = conn.send_shm_region(size as u64, out) else {
            out.detach_last_fd();
            return None;
        };
        self.regions.push(Kept {
            id,
            region: region.clone(),
            last_used: now,
        });
        Some(id)
    }

    /// Retires (SHM_RETIRE to `out`, then unmaps and closes) every region that had nothing
    /// lent for [`IDLE_RETIRE`] before `now`, as seen by this call and the placements; returns
    /// how many, so the driver knows to write. A region found lent counts as used now, so one
    /// a handler held for long is kept for the next body. The peer unmaps a retired region at
    /// once (PROTOCOL.md 20.3). A region is unmapped and closed once no connection has it
    /// announced and no body of it lives.
    pub fn retire_idle(
        &mut self,
        conn: &mut wirepool_proto::Connection,
        out: &mut crate::outbox::Outbox,
        now: std::time::Instant,
    ) -> usize {
        let Some(lender) = conn.shm_lender() else {
            return 0;
        };
        let mut idle = Vec::new();
        for k in self.regions.iter_mut() {
            if lender.is_lent(k.id) {
                k.last_used = now;
            } else if now.saturating_duration_since(k.last_used) >= IDLE_RETIRE {
                idle.push(k.id);
            }
        }
        let mut retired = 0;
        for id in idle {
            if conn.send_shm_retire(id, out).is_ok() {
                self.regions.retain(|k| k.id != id);
                retired += 1;
            }
        }
        retired
    }

    /// Regions held (live on the connection).
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// No region is held.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

/// Writes `data` with `fds` attached as `SCM_RIGHTS` (at most [`MAX_FDS_PER_WRITE`]), without
/// blocking; returns the bytes written (`WouldBlock` when none). The kernel delivers the
/// descriptors with the first byte of this write, so they travel even when the write is
/// partial: the caller writes the rest without them. A closed peer is an error, not SIGPIPE.
pub fn send_with_fds(
    sock: BorrowedFd<'_>,
    data: &[IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    if fds.len() > MAX_FDS_PER_WRITE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} descriptors in one write", fds.len()),
        ));
    }
    let mut control = ControlBuf::new();
    // SAFETY: msghdr is plain data; an all-zero value is valid (no name, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = data.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = data.len() as _;
    if !fds.is_empty() {
        let payload = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE/CMSG_LEN are arithmetic; the buffer holds MAX_FDS_PER_WRITE fds.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(payload as u32) as usize,
                libc::CMSG_LEN(payload as u32) as usize,
            )
        };
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer is aligned for cmsghdr and `space` bytes long, so the
        // first header and its `fds.len()` descriptors fit.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = len as _;
            let out = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                out.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the slices and the control buffer
        // outlive the call.
        let n = unsafe {
            libc::sendmsg(
                sock.as_raw_fd(),
                &msg,
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Reads once into `buf` without blocking, appending the descriptors that arrived with the
/// bytes to `fds` (close-on-exec, in order); `Ok(0)` is end of file. More descriptors than
/// [`MAX_FDS_PER_WRITE`] in one read (`MSG_CTRUNC`) is an `InvalidData` error carrying a
/// [`ProtocolError`] `SHM_BAD_DESCRIPTOR` (see [`protocol_error`]); the descriptors that did arrive are
/// closed, never leaked.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut control = ControlBuf::new();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; an all-zero value is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    // Room for exactly MAX_FDS_PER_WRITE descriptors: more is MSG_CTRUNC, refused below.
    // SAFETY: arithmetic only.
    msg.msg_controllen =
        unsafe { libc::CMSG_SPACE((MAX_FDS_PER_WRITE * std::mem::size_of::<RawFd>()) as u32) } as _;
    let n = loop {
        // SAFETY: the iovec points at `buf`, the control buffer at `control`; both outlive the
        // call.
        let n = unsafe {
            libc::recvmsg(
                sock.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let first_new = fds.len();
    // SAFETY: walking the control messages the kernel wrote, within `msg_controllen`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    // Each received descriptor is new in this process: own it at once.
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        fds.truncate(first_new); // closes what did arrive
        let e = shm_error(
            ErrorCode::ShmBadDescriptor,
            format!("more than {MAX_FDS_PER_WRITE} descriptors in one read (MSG_CTRUNC)"),
        );
        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
    }
    Ok(n)
}

/// Room for one `SCM_RIGHTS` message of [`MAX_FDS_PER_WRITE`] descriptors, aligned for
/// `cmsghdr` (16 header bytes + 8 x 4, with slack).
#[repr(C, align(8))]
struct ControlBuf([u8; 64]);

impl ControlBuf {
    fn new() -> ControlBuf {
        ControlBuf([0; 64])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_buffer_fits_the_largest_write() {
        // SAFETY: arithmetic only.
        let space = unsafe { libc::CMSG_SPACE((MAX_FDS_PER_WRITE * 4) as u32) } as usize;
        assert!(space <= std::mem::size_of::<ControlBuf>(), "{space}");
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        let owned = OwnedRegion::create(100).unwrap();
        let region =
            Region::map_received(owned.as_fd().try_clone_to_owned().unwrap(), 100).unwrap();
        assert_eq!(region.view(0, 100).unwrap().len(), 100);
        assert_eq!(region.view(99, 1).unwrap().len(), 1);
        for (offset, length) in [(0, 0), (0, 101), (100, 1), (u64::MAX, 2), (1, u64::MAX)] {
            let e = region.view(offset, length).unwrap_err();
            assert_eq!(e.code, ErrorCode::ShmBounds, "{offset} + {length}");
        }
    }
}
