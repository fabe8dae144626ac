/**
 * The shared-memory extension's protocol state (PROTOCOL.md section 20), sans-IO: no memory
 * files, descriptors or mappings (the driver's, `wirepool/shm` natively), only bytes and
 * bookkeeping. The Node twin of `wirepool_proto::shm` and Python's `wirepool._shm_proto`:
 *
 * - the extension block of HELLO/WELCOME (`parseExtensions`, `encodeExtension`) and the shm
 *   entries in it (`ShmOffer`, `ShmAccept`, with the worker's check of an acceptance);
 * - the payloads of the four frames (`decodeShmFrame`, `encodeShmFrame`);
 * - the bookkeeping of each side of one direction: the `Lender` (the owner of regions: what it
 *   announced and lent) and the `Borrower` (the receiver: the regions it may map, the ranges it
 *   holds, the descriptors waiting), with every check of 20.5 in the spec's order and its typed
 *   code.
 *
 * Every u64 of the wire is a `bigint` here until it is checked: a hostile peer's offset of
 * 2^64 - 1 is refused exactly (`SHM_BOUNDS`), never rounded into range. A checked `ShmRange`
 * holds numbers (a range inside a region the receiver could map is below 2^53).
 *
 * @example
 * ```ts
 * import { Lender, Borrower } from "wirepool/proto";
 * const owner = new Lender(1n << 30n), receiver = new Borrower(1n << 30n);
 * const region = owner.announce(1n << 20n);       // the driver sends SHM_REGION + its descriptor
 * receiver.descriptorsReceived(1);                // recvmsg returned the descriptor
 * receiver.region(region, 1n << 20n);             // the SHM_REGION arrived: map it
 * owner.lend({ region, offset: 0, length: 4096 }); // the driver sends SHM_BODY
 * const r = receiver.body(5, region, 0n, 4096n);  // request 5's body: bytes 0..4096 of it
 * receiver.release(r);                            // copied out: send SHM_RELEASE
 * owner.released(r);                              // the owner may write there again
 * ```
 * @module
 */

import { HEADER_SIZE, SHM_PAYLOAD_SIZE, Shm, ShmErrorCode, ShmFrameType, ErrorCode } from "./constants.js";
import { ProtocolError } from "./errors.js";

const U64_MAX = (1n << 64n) - 1n;
const U32_MAX = 0xffff_ffff;

function fail(code: number, message: string): ProtocolError {
  return new ProtocolError(code, message);
}

/** One entry of an extension block: `tag u16, length u16, data`. */
export interface ExtensionEntry {
  readonly tag: number;
  /** A view of the block's bytes. */
  readonly data: Buffer;
}

function view(b: Uint8Array): Buffer {
  return Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.byteLength);
}

/**
 * The entries of the trailing bytes of a HELLO or WELCOME (20.1), in order.
 *
 * Never an error: a reader that knows extensions stays a version 1 reader, so bytes that are
 * not an extension block (an entry running past the end, a tag twice) give no entries.
 */
export function parseExtensions(trailing: Uint8Array): ExtensionEntry[] {
  const b = view(trailing);
  const out: ExtensionEntry[] = [];
  let at = 0;
  while (at < b.length) {
    if (b.length - at < 4) return [];
    const tag = b.readUInt16LE(at);
    const length = b.readUInt16LE(at + 2);
    if (at + 4 + length > b.length || out.some((e) => e.tag === tag)) return [];
    out.push({ tag, data: b.subarray(at + 4, at + 4 + length) });
    at += 4 + length;
  }
  return out;
}

/** One extension entry's bytes: `tag u16, length u16, data` (data at most 65,535 bytes). */
export function encodeExtension(tag: number, data: Uint8Array): Buffer {
  if (!Number.isInteger(tag) || tag < 0 || tag > 0xffff) throw new RangeError(`extension tag ${tag}`);
  if (data.length > 0xffff) throw new RangeError(`an extension entry of ${data.length} bytes`);
  const out = Buffer.allocUnsafe(4 + data.length);
  out.writeUInt16LE(tag, 0);
  out.writeUInt16LE(data.length, 2);
  out.set(data, 4);
  return out;
}

function u64(v: bigint, what: string): bigint {
  if (typeof v !== "bigint" || v < 0n || v > U64_MAX) throw new RangeError(`${what} ${String(v)} is not a u64`);
  return v;
}

/** The worker's offer in HELLO (20.2): bytes of the parent's regions it accepts at once (0: none, it can still send). */
export class ShmOffer {
  constructor(readonly window: bigint) {
    u64(window, "window");
  }

  /** The offer in an entry's data; null when shorter than 8 bytes (the entry is ignored, 20.1). */
  static decode(data: Uint8Array): ShmOffer | null {
    return data.length >= 8 ? new ShmOffer(view(data).readBigUInt64LE(0)) : null;
  }

  /** The shm offer of a HELLO's trailing bytes, or null (not offered). */
  static fromTrailing(trailing: Uint8Array): ShmOffer | null {
    const e = parseExtensions(trailing).find((x) => x.tag === Shm.tag);
    return e ? ShmOffer.decode(e.data) : null;
  }

  /** The whole entry (tag, length, data). */
  encode(): Buffer {
    const d = Buffer.allocUnsafe(8);
    d.writeBigUInt64LE(this.window, 0);
    return encodeExtension(Shm.tag, d);
  }
}

/** The parent's acceptance in WELCOME (20.2): the window of each direction (0: that direction is off). */
export class ShmAccept {
  constructor(
    readonly toWorkerWindow: bigint,
    readonly toParentWindow: bigint,
  ) {
    u64(toWorkerWindow, "to_worker_window");
    u64(toParentWindow, "to_parent_window");
  }

  /** The acceptance in an entry's data; null when shorter than 16 bytes (the entry is ignored, 20.1). */
  static decode(data: Uint8Array): ShmAccept | null {
    if (data.length < 16) return null;
    const b = view(data);
    return new ShmAccept(b.readBigUInt64LE(0), b.readBigUInt64LE(8));
  }

  /** The shm acceptance of a WELCOME's trailing bytes (from offset 32), or null (the lane is off). */
  static fromTrailing(trailing: Uint8Array): ShmAccept | null {
    const e = parseExtensions(trailing).find((x) => x.tag === Shm.tag);
    return e ? ShmAccept.decode(e.data) : null;
  }

  /**
   * The worker's check against its HELLO's offer: an acceptance of a lane it did not offer, or a
   * `toWorkerWindow` above its window, is `BAD_HANDSHAKE` (119).
   */
  check(offer: ShmOffer | null): void {
    if (offer === null) throw fail(ErrorCode.BAD_HANDSHAKE, "WELCOME accepts shm, which the HELLO did not offer");
    if (this.toWorkerWindow > offer.window)
      throw fail(
        ErrorCode.BAD_HANDSHAKE,
        `WELCOME's to_worker_window ${this.toWorkerWindow} is above the HELLO's window ${offer.window}`,
      );
  }

  /** The whole entry (tag, length, data). */
  encode(): Buffer {
    const d = Buffer.allocUnsafe(16);
    d.writeBigUInt64LE(this.toWorkerWindow, 0);
    d.writeBigUInt64LE(this.toParentWindow, 8);
    return encodeExtension(Shm.tag, d);
  }
}

/** A decoded shm frame (20.3): `size` for SHM_REGION, `offset`/`length` for SHM_RELEASE and SHM_BODY, else 0n. */
export interface ShmFrame {
  readonly type: ShmFrameType;
  readonly id: number;
  readonly region: number;
  readonly size: bigint;
  readonly offset: bigint;
  readonly length: bigint;
}

/** Is `type` one of the extension's frame types? */
export function isShmFrameType(type: number): type is ShmFrameType {
  return SHM_PAYLOAD_SIZE.has(type);
}

/**
 * Decodes the payload of an shm frame whose header was checked (the id rule, no MORE): another
 * size is `BAD_PAYLOAD`, the reserved field not 0 `RESERVED_NONZERO`. Bounds are state, not
 * layout: `Borrower` and `Lender` check them.
 */
export function decodeShmFrame(type: number, id: number, payload: Uint8Array): ShmFrame {
  const want = SHM_PAYLOAD_SIZE.get(type);
  if (want === undefined) throw fail(ErrorCode.UNKNOWN_FRAME_TYPE, `frame type 0x${type.toString(16)}`);
  if (payload.length !== want)
    throw fail(ErrorCode.BAD_PAYLOAD, `frame type 0x${type.toString(16)} needs exactly ${want} payload bytes, got ${payload.length}`);
  const b = view(payload);
  const region = b.readUInt32LE(0);
  if (b.readUInt32LE(4) !== 0) throw fail(ErrorCode.RESERVED_NONZERO, "the reserved field of an shm frame is not 0");
  const t = type as ShmFrameType;
  if (t === ShmFrameType.SHM_REGION) return { type: t, id, region, size: b.readBigUInt64LE(8), offset: 0n, length: 0n };
  if (t === ShmFrameType.SHM_RETIRE) return { type: t, id, region, size: 0n, offset: 0n, length: 0n };
  return { type: t, id, region, size: 0n, offset: b.readBigUInt64LE(8), length: b.readBigUInt64LE(16) };
}

/** The whole frame, header and payload, of an shm frame (ids 0 but SHM_BODY's; never MORE). */
export function encodeShmFrame(f: {
  readonly type: ShmFrameType;
  readonly id?: number;
  readonly region: number;
  readonly size?: bigint | number;
  readonly offset?: bigint | number;
  readonly length?: bigint | number;
}): Buffer {
  const n = SHM_PAYLOAD_SIZE.get(f.type);
  if (n === undefined) throw new RangeError(`not an shm frame type: ${f.type}`);
  if (!Number.isInteger(f.region) || f.region < 0 || f.region > U32_MAX) throw new RangeError(`region ${f.region}`);
  const id = f.id ?? 0;
  const out = Buffer.alloc(HEADER_SIZE + n);
  out.writeUInt32LE(n, 0);
  out.writeUInt8(f.type, 4);
  out.writeBigUInt64LE(BigInt(id), 8);
  out.writeUInt32LE(f.region, HEADER_SIZE);
  if (f.type === ShmFrameType.SHM_REGION) out.writeBigUInt64LE(u64(BigInt(f.size ?? 0), "size"), HEADER_SIZE + 8);
  else if (f.type !== ShmFrameType.SHM_RETIRE) {
    out.writeBigUInt64LE(u64(BigInt(f.offset ?? 0), "offset"), HEADER_SIZE + 8);
    out.writeBigUInt64LE(u64(BigInt(f.length ?? 0), "length"), HEADER_SIZE + 16);
  }
  return out;
}

/** A checked range of a region: what SHM_BODY lends and SHM_RELEASE gives back. */
export interface ShmRange {
  readonly region: number;
  readonly offset: number;
  readonly length: number;
}

const key = (region: number, offset: bigint, length: bigint) => `${region}:${offset}:${length}`;

/** Live regions and lent ranges of one direction, with their byte sums (20.4). */
class Ledger {
  lastRegion = 0;
  readonly sizes = new Map<number, bigint>();
  liveBytes = 0n;
  /** Lent ranges by key, with how many times each is lent (the same range may be lent twice). */
  readonly lent = new Map<string, { range: ShmRange; count: number }>();
  /** Lent ranges per region. */
  readonly lentPerRegion = new Map<number, number>();
  lentBytes = 0n;

  constructor(readonly window: bigint) {}

  checkRange(region: number, offset: bigint, length: bigint, id: number): ShmRange {
    const size = this.sizes.get(region);
    if (size === undefined) throw fail(ShmErrorCode.SHM_BOUNDS, `region ${region} is not live (request ${id})`);
    if (length === 0n || offset + length > size)
      throw fail(ShmErrorCode.SHM_BOUNDS, `bytes ${offset} + ${length} of region ${region} of ${size} bytes (request ${id})`);
    if (this.lentBytes + length > this.window)
      throw fail(ShmErrorCode.SHM_BOUNDS, `${this.lentBytes} bytes lent plus ${length} above the window ${this.window} (request ${id})`);
    if (offset + length > BigInt(Number.MAX_SAFE_INTEGER))
      throw fail(ShmErrorCode.SHM_BOUNDS, `bytes ${offset} + ${length} are beyond what this SDK maps`);
    const k = key(region, offset, length);
    const had = this.lent.get(k);
    const range = had?.range ?? { region, offset: Number(offset), length: Number(length) };
    if (had) had.count++;
    else this.lent.set(k, { range, count: 1 });
    this.lentPerRegion.set(region, (this.lentPerRegion.get(region) ?? 0) + 1);
    this.lentBytes += length;
    return range;
  }

  giveBack(region: number, offset: bigint, length: bigint): boolean {
    const k = key(region, offset, length);
    const had = this.lent.get(k);
    if (!had) return false;
    if (--had.count === 0) this.lent.delete(k);
    const n = this.lentPerRegion.get(region)! - 1;
    if (n === 0) this.lentPerRegion.delete(region);
    else this.lentPerRegion.set(region, n);
    this.lentBytes -= length;
    return true;
  }

  lentIn(region: number): boolean {
    return this.lentPerRegion.has(region);
  }
}

const big = (v: bigint | number) => (typeof v === "bigint" ? v : BigInt(v));

/**
 * The owner's side of one direction: the regions it announced and the ranges it lent, within
 * the window. Its refusals are local: the driver must not send what it refuses.
 */
export class Lender {
  private readonly l: Ledger;

  constructor(window: bigint | number) {
    this.l = new Ledger(u64(big(window), "window"));
  }

  /** Would a region of `size` bytes fit (size above 0, under 64 live, within the window, ids left)? */
  canAnnounce(size: bigint | number): boolean {
    const s = big(size);
    return s > 0n && this.l.sizes.size < Shm.maxLiveRegions && this.l.liveBytes + s <= this.l.window && this.l.lastRegion < U32_MAX;
  }

  /** A new region's id (then send SHM_REGION with its descriptor); `SHM_BAD_REGION` when it would not fit. */
  announce(size: bigint | number): number {
    const s = big(size);
    if (!this.canAnnounce(s))
      throw fail(
        ShmErrorCode.SHM_BAD_REGION,
        `a region of ${s} bytes does not fit: ${this.l.sizes.size} live regions of ${this.l.liveBytes} bytes, window ${this.l.window}`,
      );
    const id = ++this.l.lastRegion;
    this.l.sizes.set(id, s);
    this.l.liveBytes += s;
    return id;
  }

  /** Could `length` more bytes be lent now (the window)? */
  canLend(length: number): boolean {
    return length > 0 && this.l.lentBytes + BigInt(length) <= this.l.window;
  }

  /** Records a range lent by SHM_BODY; `SHM_BOUNDS` when not a range of a live region, or above the window. */
  lend(r: ShmRange): ShmRange {
    return this.l.checkRange(r.region, BigInt(r.offset), BigInt(r.length), 0);
  }

  /** A SHM_RELEASE arrived: `SHM_BAD_RELEASE` unless it names a lent range exactly. */
  released(r: { readonly region: number; readonly offset: bigint | number; readonly length: bigint | number }): void {
    if (!this.l.giveBack(r.region, big(r.offset), big(r.length)))
      throw fail(ShmErrorCode.SHM_BAD_RELEASE, `SHM_RELEASE of region ${r.region} bytes ${r.offset} + ${r.length}, which is not lent`);
  }

  /** Withdraws a region (then send SHM_RETIRE); refused while a range of it is lent. */
  retire(region: number): void {
    if (this.l.lentIn(region)) throw fail(ShmErrorCode.SHM_BAD_RELEASE, `region ${region} still has lent ranges`);
    const size = this.l.sizes.get(region);
    if (size === undefined) throw fail(ShmErrorCode.SHM_BAD_RELEASE, `region ${region} is not live`);
    this.l.sizes.delete(region);
    this.l.liveBytes -= size;
  }

  /** Is a range of `region` lent? */
  isLent(region: number): boolean {
    return this.l.lentIn(region);
  }

  /** Is `region` live (announced, not retired)? */
  isLive(region: number): boolean {
    return this.l.sizes.has(region);
  }

  get window(): bigint {
    return this.l.window;
  }
  get lentBytes(): bigint {
    return this.l.lentBytes;
  }
  get liveBytes(): bigint {
    return this.l.liveBytes;
  }
  get liveRegions(): number {
    return this.l.sizes.size;
  }
}

/** The receiver's side of one direction. Its errors are the peer's violations (fatal, section 20.6). */
export class Borrower {
  private readonly l: Ledger;
  private queued = 0;

  constructor(window: bigint | number) {
    this.l = new Ledger(u64(big(window), "window"));
  }

  /** `n` descriptors came with one read; more than 8 waiting is `SHM_BAD_DESCRIPTOR`. */
  descriptorsReceived(n: number): void {
    if (this.queued + n > Shm.maxQueuedDescriptors)
      throw fail(ShmErrorCode.SHM_BAD_DESCRIPTOR, `${this.queued + n} descriptors waiting for a SHM_REGION (at most ${Shm.maxQueuedDescriptors})`);
    this.queued += n;
  }

  /**
   * A SHM_REGION arrived; on success the driver takes the oldest descriptor and checks and maps
   * it. In order: id order, size 0, 64 live, the window (`SHM_BAD_REGION`); no descriptor
   * queued (`SHM_BAD_DESCRIPTOR`).
   */
  region(region: number, size: bigint): void {
    const l = this.l;
    if (region <= l.lastRegion) throw fail(ShmErrorCode.SHM_BAD_REGION, `region id ${region} is not above the last, ${l.lastRegion}`);
    if (size === 0n) throw fail(ShmErrorCode.SHM_BAD_REGION, `region ${region} has size 0`);
    if (l.sizes.size >= Shm.maxLiveRegions) throw fail(ShmErrorCode.SHM_BAD_REGION, `${Shm.maxLiveRegions} regions are already live`);
    if (l.liveBytes + size > l.window)
      throw fail(ShmErrorCode.SHM_BAD_REGION, `region ${region} of ${size} bytes: live regions would exceed the window ${l.window}`);
    if (this.queued === 0) throw fail(ShmErrorCode.SHM_BAD_DESCRIPTOR, `no descriptor arrived with SHM_REGION ${region}`);
    this.queued--;
    l.lastRegion = region;
    l.sizes.set(region, size);
    l.liveBytes += size;
  }

  /**
   * A SHM_BODY for request `id`: `SHM_BOUNDS` for a region not live, an empty range, one past
   * the region (no overflow: bigint), or held bytes above the window. Returns the checked range.
   */
  body(id: number, region: number, offset: bigint, length: bigint): ShmRange {
    return this.l.checkRange(region, offset, length, id);
  }

  /** The body was copied out or its last view dropped: send SHM_RELEASE for it. */
  release(r: ShmRange): void {
    if (!this.l.giveBack(r.region, BigInt(r.offset), BigInt(r.length)))
      throw fail(ShmErrorCode.SHM_BAD_RELEASE, `region ${r.region} bytes ${r.offset} + ${r.length} are not held`);
  }

  /** A SHM_RETIRE arrived: `SHM_BAD_RELEASE` for a region not live or still held here. */
  retire(region: number): void {
    if (this.l.lentIn(region)) throw fail(ShmErrorCode.SHM_BAD_RELEASE, `SHM_RETIRE of region ${region}, a range of which is still held`);
    const size = this.l.sizes.get(region);
    if (size === undefined) throw fail(ShmErrorCode.SHM_BAD_RELEASE, `SHM_RETIRE of region ${region}, which is not live`);
    this.l.sizes.delete(region);
    this.l.liveBytes -= size;
  }

  /** The size of a live region, or undefined. */
  sizeOf(region: number): bigint | undefined {
    return this.l.sizes.get(region);
  }

  get queuedDescriptors(): number {
    return this.queued;
  }
  get heldBytes(): bigint {
    return this.l.lentBytes;
  }
  get liveBytes(): bigint {
    return this.l.liveBytes;
  }
  get window(): bigint {
    return this.l.window;
  }
}
