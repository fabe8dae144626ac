//! The shared-memory extension's protocol state (PROTOCOL.md section 20), sans-IO: the extension
//! block of HELLO/WELCOME, the payloads of its four frames, and the bookkeeping of each side of
//! one direction: the [`Lender`] (the owner of regions: what it announced and lent) and the
//! [`Borrower`] (the receiver: the regions it may map, what it holds, the descriptors waiting).
//! Every check of 20.5 is here, in the spec's order, with its typed code. Memory files,
//! descriptors and mappings are the driver's (`wirepool_io::shm`).
//!
//! ```
//! use wirepool_proto::shm::{Borrower, Lender, ShmRange};
//!
//! let mut owner = Lender::new(1 << 30);
//! let mut receiver = Borrower::new(1 << 30);
//! let region = owner.announce(1 << 20).unwrap(); // the driver sends SHM_REGION + descriptor
//! receiver.descriptors_received(1).unwrap();       // recvmsg returned it
//! receiver.region(region, 1 << 20).unwrap();       // the SHM_REGION frame arrived: map it
//! let range = ShmRange { region, offset: 0, length: 4096 };
//! owner.lend(range).unwrap();                       // the driver sends SHM_BODY
//! receiver.body(5, range).unwrap();                 // request 5's body: a view of it
//! receiver.release(range).unwrap();                 // the view was dropped: send SHM_RELEASE
//! owner.released(range).unwrap();                   // ... and the owner may write there again
//! assert_eq!(owner.lent_bytes(), 0);
//! ```

use std::collections::BTreeMap;

use crate::error::{err, ErrorCode, ProtocolError};

/// The extension tag of the shared-memory lane in HELLO and WELCOME ([`SHM_TAG`]).
///
/// [`SHM_TAG`]: crate::constants::SHM_TAG
pub const TAG_SHM: u16 = crate::constants::SHM_TAG;
/// Live regions one direction may hold at once ([`SHM_MAX_LIVE_REGIONS`]).
///
/// [`SHM_MAX_LIVE_REGIONS`]: crate::constants::SHM_MAX_LIVE_REGIONS
pub const MAX_LIVE_REGIONS: usize = crate::constants::SHM_MAX_LIVE_REGIONS;
/// Descriptors received and not yet taken by a SHM_REGION; also the most one write carries
/// ([`SHM_MAX_QUEUED_DESCRIPTORS`]).
///
/// [`SHM_MAX_QUEUED_DESCRIPTORS`]: crate::constants::SHM_MAX_QUEUED_DESCRIPTORS
pub const MAX_QUEUED_DESCRIPTORS: usize = crate::constants::SHM_MAX_QUEUED_DESCRIPTORS;

/// Frame type bytes of the extension (they exist only on a connection that accepted it).
pub mod frame_type {
    /// Announces a region; one descriptor travels with it.
    pub const SHM_REGION: u8 = 0x50;
    /// Gives a lent range back.
    pub const SHM_RELEASE: u8 = 0x51;
    /// Withdraws a region.
    pub const SHM_RETIRE: u8 = 0x52;
    /// The last part of a message whose body is in a region.
    pub const SHM_BODY: u8 = 0x7E;
}

/// One entry of an extension block: a tag and its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extension<'a> {
    /// The extension's tag (`1` shm; `0x8000`-`0xFFFF` private use).
    pub tag: u16,
    /// The entry's data.
    pub data: &'a [u8],
}

/// The entries of the trailing bytes of a HELLO or WELCOME read as an extension block (20.1).
/// Never an error: a reader that knows extensions stays a version 1 reader, so bytes that are
/// not an extension block (an entry running past the end, a tag twice) give no entries.
pub fn parse_extensions(trailing: &[u8]) -> Vec<Extension<'_>> {
    let mut out: Vec<Extension<'_>> = Vec::new();
    let mut rest = trailing;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Vec::new();
        }
        let tag = u16::from_le_bytes([rest[0], rest[1]]);
        let len = u16::from_le_bytes([rest[2], rest[3]]) as usize;
        let Some(data) = rest.get(4..4 + len) else {
            return Vec::new();
        };
        if out.iter().any(|e| e.tag == tag) {
            return Vec::new();
        }
        out.push(Extension { tag, data });
        rest = &rest[4 + len..];
    }
    out
}

/// Appends one extension entry (`tag u16, length u16, data`).
pub fn encode_extension(out: &mut Vec<u8>, tag: u16, data: &[u8]) {
    let len = u16::try_from(data.len()).expect("an extension's data fits in 65,535 bytes");
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(data);
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(b)
}

fn u32_at(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

/// The worker's offer in HELLO (tag 1): the bytes of the parent's regions it accepts at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShmOffer {
    /// 0: it takes none, but can send.
    pub window: u64,
}

impl ShmOffer {
    /// Reads the entry's data: `None` when shorter than 8 bytes (the entry is ignored, 20.1);
    /// bytes after the fields are ignored.
    pub fn decode(data: &[u8]) -> Option<ShmOffer> {
        (data.len() >= 8).then(|| ShmOffer {
            window: u64_at(data, 0),
        })
    }

    /// Appends the whole entry (tag, length, data).
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode_extension(out, TAG_SHM, &self.window.to_le_bytes());
    }
}

/// The parent's acceptance in WELCOME (tag 1): the window of each direction (0: off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ShmAccept {
    /// Bytes of the parent's regions at the worker, at most the worker's offer.
    pub to_worker_window: u64,
    /// Bytes of the worker's regions at the parent, the parent's choice.
    pub to_parent_window: u64,
}

impl ShmAccept {
    /// Reads the entry's data: `None` when shorter than 16 bytes (the entry is ignored, 20.1);
    /// bytes after the fields are ignored.
    pub fn decode(data: &[u8]) -> Option<ShmAccept> {
        (data.len() >= 16).then(|| ShmAccept {
            to_worker_window: u64_at(data, 0),
            to_parent_window: u64_at(data, 8),
        })
    }

    /// The worker's check of the WELCOME against its HELLO: an entry it did not offer, or a
    /// window above its offer, is `BAD_HANDSHAKE`.
    pub fn check(&self, offer: Option<ShmOffer>) -> Result<(), ProtocolError> {
        match offer {
            None => Err(err(
                ErrorCode::BadHandshake,
                0,
                "WELCOME accepts shm, which the HELLO did not offer",
            )),
            Some(o) if self.to_worker_window > o.window => Err(err(
                ErrorCode::BadHandshake,
                0,
                format!(
                    "WELCOME's to_worker_window {} is above the HELLO's window {}",
                    self.to_worker_window, o.window
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Appends the whole entry (tag, length, data).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut data = [0u8; 16];
        data[..8].copy_from_slice(&self.to_worker_window.to_le_bytes());
        data[8..].copy_from_slice(&self.to_parent_window.to_le_bytes());
        encode_extension(out, TAG_SHM, &data);
    }
}

/// A range of a region: what SHM_BODY lends and SHM_RELEASE gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShmRange {
    /// The owner's region id.
    pub region: u32,
    /// First byte.
    pub offset: u64,
    /// Bytes, at least 1.
    pub length: u64,
}

/// A decoded extension frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmFrame {
    /// SHM_REGION (id 0): a region of `size` bytes; its descriptor travels with it.
    Region {
        /// The owner's id for it, strictly increasing per direction.
        region: u32,
        /// Its size in bytes.
        size: u64,
    },
    /// SHM_RELEASE (id 0): a lent range given back.
    Release(ShmRange),
    /// SHM_RETIRE (id 0): the owner withdraws a region.
    Retire {
        /// The region withdrawn.
        region: u32,
    },
    /// SHM_BODY (request id): the body of the message in progress for the frame's id.
    Body(ShmRange),
}

impl ShmFrame {
    /// The frame type byte.
    pub const fn type_byte(&self) -> u8 {
        match self {
            ShmFrame::Region { .. } => frame_type::SHM_REGION,
            ShmFrame::Release(_) => frame_type::SHM_RELEASE,
            ShmFrame::Retire { .. } => frame_type::SHM_RETIRE,
            ShmFrame::Body(_) => frame_type::SHM_BODY,
        }
    }

    /// The payload size of a type (`None` for a type that is not the extension's).
    pub const fn payload_len(type_byte: u8) -> Option<usize> {
        match type_byte {
            frame_type::SHM_REGION => Some(16),
            frame_type::SHM_RELEASE | frame_type::SHM_BODY => Some(24),
            frame_type::SHM_RETIRE => Some(8),
            _ => None,
        }
    }

    /// Decodes the payload of an extension frame whose header was checked (type, flags, id):
    /// a payload of another size is `BAD_PAYLOAD`, a reserved field not 0 `RESERVED_NONZERO`.
    pub fn decode(type_byte: u8, id: u64, payload: &[u8]) -> Result<ShmFrame, ProtocolError> {
        let Some(want) = ShmFrame::payload_len(type_byte) else {
            return Err(err(
                ErrorCode::UnknownFrameType,
                id,
                format!("frame type {type_byte:#04x}"),
            ));
        };
        if payload.len() != want {
            return Err(err(
                ErrorCode::BadPayload,
                id,
                format!(
                    "frame type {type_byte:#04x} needs exactly {want} payload bytes, got {}",
                    payload.len()
                ),
            ));
        }
        if u32_at(payload, 4) != 0 {
            return Err(err(
                ErrorCode::ReservedNonzero,
                id,
                "the reserved field of an shm frame is not 0",
            ));
        }
        let region = u32_at(payload, 0);
        let range = || ShmRange {
            region,
            offset: u64_at(payload, 8),
            length: u64_at(payload, 16),
        };
        Ok(match type_byte {
            frame_type::SHM_REGION => ShmFrame::Region {
                region,
                size: u64_at(payload, 8),
            },
            frame_type::SHM_RELEASE => ShmFrame::Release(range()),
            frame_type::SHM_RETIRE => ShmFrame::Retire { region },
            _ => ShmFrame::Body(range()),
        })
    }

    /// Appends the whole frame (header and payload) with request id `id` (0 except for a body).
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        let len = ShmFrame::payload_len(self.type_byte()).expect("an shm frame type");
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&[self.type_byte(), 0, 0, 0]);
        out.extend_from_slice(&id.to_le_bytes());
        let start = out.len();
        match *self {
            ShmFrame::Region { region, size } => {
                out.extend_from_slice(&region.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&size.to_le_bytes());
            }
            ShmFrame::Retire { region } => {
                out.extend_from_slice(&region.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
            }
            ShmFrame::Release(r) | ShmFrame::Body(r) => {
                out.extend_from_slice(&r.region.to_le_bytes());
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&r.offset.to_le_bytes());
                out.extend_from_slice(&r.length.to_le_bytes());
            }
        }
        debug_assert_eq!(out.len() - start, len);
    }
}

/// Lent ranges, counted (the same range may be lent twice).
#[derive(Debug, Default, Clone)]
struct LentRanges {
    ranges: BTreeMap<ShmRange, u32>,
    bytes: u64,
}

impl LentRanges {
    fn add(&mut self, r: ShmRange) {
        *self.ranges.entry(r).or_insert(0) += 1;
        self.bytes += r.length;
    }

    fn remove(&mut self, r: ShmRange) -> bool {
        match self.ranges.get_mut(&r) {
            None => false,
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.ranges.remove(&r);
                }
                self.bytes -= r.length;
                true
            }
        }
    }

    fn any_in(&self, region: u32) -> bool {
        let from = ShmRange {
            region,
            offset: 0,
            length: 0,
        };
        self.ranges
            .range(from..)
            .next()
            .is_some_and(|(r, _)| r.region == region)
    }
}

/// Region sizes by id, with their sum.
#[derive(Debug, Default, Clone)]
struct LiveRegions {
    sizes: BTreeMap<u32, u64>,
    bytes: u64,
}

/// The owner's side of one direction: the regions it announced and the ranges it lent, within
/// the direction's window. Its refusals are local (the driver must not send what it refuses).
#[derive(Debug, Clone)]
pub struct Lender {
    window: u64,
    last_region: u32,
    live: LiveRegions,
    lent: LentRanges,
    /// What keeps the memory of lent ranges alive until their release (see [`hold`](Self::hold)).
    keeps: BTreeMap<ShmRange, Vec<bytes::Bytes>>,
}

impl Lender {
    /// A lender for a direction whose window (from the WELCOME) is `window` bytes.
    pub fn new(window: u64) -> Lender {
        Lender {
            window,
            last_region: 0,
            live: LiveRegions::default(),
            lent: LentRanges::default(),
            keeps: BTreeMap::new(),
        }
    }

    /// Whether a region of `size` bytes can be announced now (window and region count).
    pub fn can_announce(&self, size: u64) -> bool {
        size > 0
            && self.live.sizes.len() < MAX_LIVE_REGIONS
            && self.live.bytes.saturating_add(size) <= self.window
            && self.last_region < u32::MAX
    }

    /// Records a new region of `size` bytes and returns its id (the driver then sends
    /// SHM_REGION with its descriptor); `SHM_BAD_REGION` when it would not fit.
    pub fn announce(&mut self, size: u64) -> Result<u32, ProtocolError> {
        if !self.can_announce(size) {
            return Err(err(
                ErrorCode::ShmBadRegion,
                0,
                format!(
                    "a region of {size} bytes does not fit: {} live regions of {} bytes, window {}",
                    self.live.sizes.len(),
                    self.live.bytes,
                    self.window
                ),
            ));
        }
        self.last_region += 1;
        self.live.sizes.insert(self.last_region, size);
        self.live.bytes += size;
        Ok(self.last_region)
    }

    /// Records a range lent by SHM_BODY; `SHM_BOUNDS` for a region not live, an empty range,
    /// one past the region, or lent bytes above the window.
    pub fn lend(&mut self, r: ShmRange) -> Result<(), ProtocolError> {
        check_range(&self.live, &self.lent, self.window, r, 0)?;
        self.lent.add(r);
        Ok(())
    }

    /// A SHM_RELEASE arrived: `SHM_BAD_RELEASE` unless it names a lent range exactly.
    pub fn released(&mut self, r: ShmRange) -> Result<(), ProtocolError> {
        if self.lent.remove(r) {
            self.drop_keep(r);
            Ok(())
        } else {
            Err(err(
                ErrorCode::ShmBadRelease,
                0,
                format!("SHM_RELEASE of {r:?}, which is not lent"),
            ))
        }
    }

    /// Keeps `keep` (typically a `Bytes` view of the owner's own region holding the lent bytes)
    /// until `r` is released, or until the lane's bookkeeping is dropped (the peer is gone):
    /// the driver's way to know the memory of a range stays untouched while the peer may read
    /// it (20.4), without asking. `Err(keep)` when `r` is not lent.
    pub fn hold(&mut self, r: ShmRange, keep: bytes::Bytes) -> Result<(), bytes::Bytes> {
        let lent = self.lent.ranges.get(&r).copied().unwrap_or(0) as usize;
        let held = self.keeps.entry(r).or_default();
        if held.len() >= lent {
            if held.is_empty() {
                self.keeps.remove(&r);
            }
            return Err(keep);
        }
        held.push(keep);
        Ok(())
    }

    fn drop_keep(&mut self, r: ShmRange) {
        if let Some(held) = self.keeps.get_mut(&r) {
            held.pop();
            if held.is_empty() {
                self.keeps.remove(&r);
            }
        }
    }

    /// Drops what [`hold`](Self::hold) kept: the peer is gone, so nothing it was lent is read
    /// any more (20.4, "either side dies").
    pub fn drop_holds(&mut self) {
        self.keeps.clear();
    }

    /// Withdraws a region (the driver then sends SHM_RETIRE and may drop it); refused
    /// (`SHM_BAD_RELEASE`, nothing changes) while a range of it is lent or if it is not live.
    pub fn retire(&mut self, region: u32) -> Result<u64, ProtocolError> {
        if self.lent.any_in(region) {
            return Err(err(
                ErrorCode::ShmBadRelease,
                0,
                format!("region {region} still has lent ranges"),
            ));
        }
        let size = self.live.sizes.remove(&region).ok_or_else(|| {
            err(
                ErrorCode::ShmBadRelease,
                0,
                format!("region {region} is not live"),
            )
        })?;
        self.live.bytes -= size;
        Ok(size)
    }

    /// Whether any range of `region` is lent.
    pub fn is_lent(&self, region: u32) -> bool {
        self.lent.any_in(region)
    }

    /// Bytes lent and not yet released.
    pub fn lent_bytes(&self) -> u64 {
        self.lent.bytes
    }

    /// Bytes of live regions.
    pub fn live_bytes(&self) -> u64 {
        self.live.bytes
    }

    /// The direction's window.
    pub fn window(&self) -> u64 {
        self.window
    }
}

fn check_range(
    live: &LiveRegions,
    lent: &LentRanges,
    window: u64,
    r: ShmRange,
    id: u64,
) -> Result<(), ProtocolError> {
    let Some(&size) = live.sizes.get(&r.region) else {
        return Err(err(
            ErrorCode::ShmBounds,
            id,
            format!("region {} is not live", r.region),
        ));
    };
    let past_end = match r.offset.checked_add(r.length) {
        Some(end) => end > size,
        None => true,
    };
    if r.length == 0 || past_end {
        return Err(err(
            ErrorCode::ShmBounds,
            id,
            format!(
                "bytes {} + {} of region {} of {size} bytes",
                r.offset, r.length, r.region
            ),
        ));
    }
    if lent.bytes.saturating_add(r.length) > window {
        return Err(err(
            ErrorCode::ShmBounds,
            id,
            format!(
                "{} bytes lent plus {} above the window {window}",
                lent.bytes, r.length
            ),
        ));
    }
    Ok(())
}

/// The receiver's side of one direction: the regions the peer announced (which the driver maps),
/// the ranges it holds, and the descriptors received and not yet taken. Its errors are the
/// peer's violations (fatal, 20.5).
#[derive(Debug, Clone)]
pub struct Borrower {
    window: u64,
    last_region: u32,
    live: LiveRegions,
    lent: LentRanges,
    queued_descriptors: usize,
}

impl Borrower {
    /// A borrower for a direction whose window (from the WELCOME) is `window` bytes.
    pub fn new(window: u64) -> Borrower {
        Borrower {
            window,
            last_region: 0,
            live: LiveRegions::default(),
            lent: LentRanges::default(),
            queued_descriptors: 0,
        }
    }

    /// `n` descriptors arrived with the bytes of one read; more than
    /// [`MAX_QUEUED_DESCRIPTORS`] waiting is `SHM_BAD_DESCRIPTOR`.
    pub fn descriptors_received(&mut self, n: usize) -> Result<(), ProtocolError> {
        if self.queued_descriptors + n > MAX_QUEUED_DESCRIPTORS {
            return Err(err(
                ErrorCode::ShmBadDescriptor,
                0,
                format!(
                    "{} descriptors waiting for a SHM_REGION (at most {MAX_QUEUED_DESCRIPTORS})",
                    self.queued_descriptors + n
                ),
            ));
        }
        self.queued_descriptors += n;
        Ok(())
    }

    /// Descriptors received and not yet taken by a SHM_REGION.
    pub fn queued_descriptors(&self) -> usize {
        self.queued_descriptors
    }

    /// A SHM_REGION arrived; on `Ok` the driver takes the oldest queued descriptor and checks
    /// and maps it (`SHM_BAD_DESCRIPTOR` there is its failure too). In order: id not above
    /// every earlier one, size 0, [`MAX_LIVE_REGIONS`] live, or live sizes above the window ->
    /// `SHM_BAD_REGION`; no descriptor queued -> `SHM_BAD_DESCRIPTOR`.
    pub fn region(&mut self, region: u32, size: u64) -> Result<(), ProtocolError> {
        let bad = |m: String| Err(err(ErrorCode::ShmBadRegion, 0, m));
        if region <= self.last_region {
            return bad(format!(
                "region id {region} is not above the last, {}",
                self.last_region
            ));
        }
        if size == 0 {
            return bad(format!("region {region} has size 0"));
        }
        if self.live.sizes.len() >= MAX_LIVE_REGIONS {
            return bad(format!("{MAX_LIVE_REGIONS} regions are already live"));
        }
        if self.live.bytes.saturating_add(size) > self.window {
            return bad(format!(
                "region {region} of {size} bytes: live regions would exceed the window {}",
                self.window
            ));
        }
        if self.queued_descriptors == 0 {
            return Err(err(
                ErrorCode::ShmBadDescriptor,
                0,
                format!("no descriptor arrived with SHM_REGION {region}"),
            ));
        }
        self.queued_descriptors -= 1;
        self.last_region = region;
        self.live.sizes.insert(region, size);
        self.live.bytes += size;
        Ok(())
    }

    /// A SHM_BODY for request `id` arrived (after the continuation rule): `SHM_BOUNDS` for a
    /// region not live, an empty range, one past the region, or held bytes above the window.
    /// On `Ok` the driver lends the application a view of it and calls
    /// [`release`](Self::release) when the view is dropped.
    pub fn body(&mut self, id: u64, r: ShmRange) -> Result<(), ProtocolError> {
        check_range(&self.live, &self.lent, self.window, r, id)?;
        self.lent.add(r);
        Ok(())
    }

    /// The last view of a held range was dropped: the driver sends SHM_RELEASE for it. A range
    /// not held is the driver's bug (`SHM_BAD_RELEASE`, nothing changes).
    pub fn release(&mut self, r: ShmRange) -> Result<(), ProtocolError> {
        if self.lent.remove(r) {
            Ok(())
        } else {
            Err(err(
                ErrorCode::ShmBadRelease,
                0,
                format!("{r:?} is not held"),
            ))
        }
    }

    /// A SHM_RETIRE arrived: `SHM_BAD_RELEASE` for a region not live or still held here; on
    /// `Ok` the driver drops its mapping of the region.
    pub fn retire(&mut self, region: u32) -> Result<(), ProtocolError> {
        if self.lent.any_in(region) {
            return Err(err(
                ErrorCode::ShmBadRelease,
                0,
                format!("SHM_RETIRE of region {region}, a range of which is still held"),
            ));
        }
        let Some(size) = self.live.sizes.remove(&region) else {
            return Err(err(
                ErrorCode::ShmBadRelease,
                0,
                format!("SHM_RETIRE of region {region}, which is not live"),
            ));
        };
        self.live.bytes -= size;
        Ok(())
    }

    /// Bytes held (lent to this side and not yet released).
    pub fn held_bytes(&self) -> u64 {
        self.lent.bytes
    }

    /// Bytes of live regions.
    pub fn live_bytes(&self) -> u64 {
        self.live.bytes
    }
}

/// A region of the peer mapped by the driver (PROTOCOL.md 20.4): the core asks it for a view
/// of each range a SHM_BODY lends. `wirepool_io::shm::Region` implements it.
pub trait ShmMapping: Send + Sync {
    /// A view of `length` bytes at `offset` (the core checked the range against the region's
    /// announced size) that runs `on_release` once, when its last clone or slice is dropped.
    fn lend(
        &self,
        offset: u64,
        length: u64,
        on_release: Box<dyn FnOnce() + Send>,
    ) -> Result<bytes::Bytes, ProtocolError>;
}

/// The driver's half of a SHM_REGION (20.5), called by the core once the frame's own checks
/// passed: take the oldest descriptor received, check it (seals, tmpfs, size) and map it.
/// Its error (`SHM_BAD_DESCRIPTOR`) fails the connection.
pub type ShmMapper =
    Box<dyn FnMut(u32, u64) -> Result<std::sync::Arc<dyn ShmMapping>, ProtocolError> + Send + Sync>;

/// Ranges whose last view was dropped, waiting for the driver to send their SHM_RELEASE (with
/// [`crate::Connection::send_shm_releases`]); shared by the views, which may drop on any thread.
#[derive(Default)]
pub(crate) struct ReleaseQueue {
    ranges: std::sync::Mutex<Vec<ShmRange>>,
    waker: std::sync::Mutex<Option<std::sync::Arc<dyn Fn() + Send + Sync>>>,
}

impl std::fmt::Debug for ReleaseQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseQueue").finish_non_exhaustive()
    }
}

impl ReleaseQueue {
    pub(crate) fn push(&self, r: ShmRange) {
        self.ranges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(r);
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(wake) = waker {
            wake();
        }
    }

    pub(crate) fn take(&self) -> Vec<ShmRange> {
        std::mem::take(
            &mut *self
                .ranges
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ranges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }

    pub(crate) fn set_waker(&self, wake: std::sync::Arc<dyn Fn() + Send + Sync>) {
        *self
            .waker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(wake);
    }
}

/// The lane of one connection once the WELCOME turned it on: this side's regions (lender) and
/// the peer's (borrower), the peer's mapped regions and the releases waiting to be sent.
pub(crate) struct Lane {
    pub(crate) accept: ShmAccept,
    pub(crate) lender: Lender,
    pub(crate) borrower: Borrower,
    pub(crate) mapped: BTreeMap<u32, std::sync::Arc<dyn ShmMapping>>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("accept", &self.accept)
            .field("lender", &self.lender)
            .field("borrower", &self.borrower)
            .field("mapped", &self.mapped.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}
