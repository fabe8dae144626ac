/**
 * The shared-memory lane's data path (PROTOCOL.md 20.4, 20.5, 20.7) over the native addon: the
 * receiver and the owner of one direction of one connection, with no socket of their own (the
 * driver reads with `recvmsg`, hands them the descriptors and frames, and writes what they give
 * back). The protocol's bookkeeping and checks are `Borrower` and `Lender` (`wirepool/proto`).
 *
 * - `ShmReceiver`: descriptors queue in order; each SHM_REGION takes the oldest, which is
 *   checked (seals, tmpfs, size) before anything is mapped; a SHM_BODY becomes a zero-copy
 *   Buffer, a private mapping of its range (a write by the application copies a page for itself,
 *   never reaches the owner and never faults), released (SHM_RELEASE queued, `onRelease` called)
 *   when the Buffer is collected, or copied out and released at once with `copy: true`.
 * - `ShmSender`: bodies are copied into warm regions (one per body in flight, reused once
 *   released, the smallest that fits), new regions announced within the window, regions idle for
 *   `idleRetireMs` retired; `place` answers null when the window cannot take the body (the
 *   driver sends it through the socket).
 * @module
 */
import { readSync } from "node:fs";

import { Shm, ShmErrorCode, ShmFrameType } from "../proto/constants.js";
import { ProtocolError } from "../proto/errors.js";
import { Borrower, encodeShmFrame, Lender, type ShmFrame, type ShmRange } from "../proto/shm.js";
import type { ShmNative } from "./native.js";

const MiB = 1 << 20;

/** The receiver of one direction: the peer's regions, their descriptors and the ranges held. */
export class ShmReceiver {
  private readonly borrower: Borrower;
  private readonly queued: number[] = [];
  private readonly fds = new Map<number, number>();
  private readonly releases: Buffer[] = [];
  private closed = false;
  private readonly registry = new FinalizationRegistry<ShmRange>((r) => this.release(r));

  constructor(
    private readonly native: ShmNative,
    window: bigint,
    /** Called when a release is queued (a view was collected): the driver writes `takeReleases()`. */
    private readonly onRelease: () => void = () => {},
  ) {
    this.borrower = new Borrower(window);
  }

  /** The descriptors of one read, in order; `MSG_CTRUNC` or more than 8 waiting is `SHM_BAD_DESCRIPTOR` (they are closed). */
  descriptors(fds: readonly number[], truncated = false): void {
    try {
      if (truncated) throw new ProtocolError(ShmErrorCode.SHM_BAD_DESCRIPTOR, `more than ${Shm.maxDescriptorsPerWrite} descriptors in one read (MSG_CTRUNC)`);
      if (this.closed) throw new ProtocolError(ShmErrorCode.SHM_BAD_DESCRIPTOR, "a descriptor on a closed lane");
      this.borrower.descriptorsReceived(fds.length);
    } catch (e) {
      for (const fd of fds) this.native.closeFd(fd);
      throw e;
    }
    this.queued.push(...fds);
  }

  /** A SHM_REGION: the checks of 20.5 in order, then its descriptor's (closed when refused). */
  region(f: ShmFrame): void {
    this.borrower.region(f.region, f.size);
    const fd = this.queued.shift()!;
    const why = this.native.checkRegion(fd, Number(f.size));
    if (why !== null) {
      this.native.closeFd(fd);
      throw new ProtocolError(ShmErrorCode.SHM_BAD_DESCRIPTOR, `region ${f.region}: ${why}`);
    }
    this.fds.set(f.region, fd);
  }

  /**
   * A SHM_BODY of request `id`: `SHM_BOUNDS` unless it is a range of a live region within the
   * window; then the body, a view of the range (released when collected) or, with `copy`, a
   * copy (released at once).
   */
  body(id: number, f: ShmFrame, copy = false): Buffer {
    const r = this.borrower.body(id, f.region, f.offset, f.length);
    const fd = this.fds.get(r.region)!;
    if (copy) {
      const out = Buffer.allocUnsafe(r.length);
      try {
        for (let at = 0; at < r.length; ) {
          const n = readSync(fd, out, at, r.length - at, r.offset + at);
          if (n === 0) throw new ProtocolError(ShmErrorCode.SHM_BOUNDS, `region ${r.region} ended inside bytes ${r.offset} + ${r.length}`);
          at += n;
        }
      } finally {
        this.release(r);
      }
      return out;
    }
    let ab: ArrayBuffer;
    try {
      ab = this.native.mapView(fd, r.offset, r.length);
    } catch (e) {
      this.release(r);
      throw new ProtocolError(ShmErrorCode.SHM_BAD_DESCRIPTOR, `region ${r.region}: ${(e as Error).message}`);
    }
    this.registry.register(ab, r);
    return Buffer.from(ab);
  }

  /** A SHM_RETIRE: `SHM_BAD_RELEASE` for a region not live or still held; its descriptor is closed (views keep their mappings). */
  retire(f: ShmFrame): void {
    this.borrower.retire(f.region);
    const fd = this.fds.get(f.region);
    this.fds.delete(f.region);
    if (fd !== undefined) this.native.closeFd(fd);
  }

  private release(r: ShmRange): void {
    if (this.closed) return;
    this.borrower.release(r);
    this.releases.push(encodeShmFrame({ type: ShmFrameType.SHM_RELEASE, region: r.region, offset: r.offset, length: r.length }));
    this.onRelease();
  }

  /** The SHM_RELEASE frames queued since the last call. */
  takeReleases(): Buffer[] {
    return this.releases.splice(0);
  }

  get heldBytes(): bigint {
    return this.borrower.heldBytes;
  }
  get liveRegions(): number {
    return this.fds.size;
  }
  get queuedDescriptors(): number {
    return this.queued.length;
  }

  /** The connection ended: every descriptor is closed, views stay valid, nothing more is released. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const fd of this.queued.splice(0)) this.native.closeFd(fd);
    for (const fd of this.fds.values()) this.native.closeFd(fd);
    this.fds.clear();
  }
}

interface OwnedRegion {
  readonly id: number;
  readonly fd: number;
  readonly size: number;
  readonly map: unknown;
  lastUsed: number;
}

/** Where `ShmSender.place` put a body (send `takeRetires()` first, then the region, then the message). */
export interface Placement {
  /** A new region to announce: its SHM_REGION frame, to be written with `fd` attached. */
  readonly region: { readonly frame: Buffer; readonly fd: number } | null;
  readonly range: ShmRange;
}

/** The owner of one direction: its regions, the bodies lent from them, and their retirement. */
export class ShmSender {
  private readonly lender: Lender;
  private readonly regions = new Map<number, OwnedRegion>();
  private readonly retires: Buffer[] = [];
  private closed = false;

  constructor(
    private readonly native: ShmNative,
    window: bigint,
    readonly threshold: number = Shm.shmThreshold,
    readonly idleRetireMs: number = Shm.shmIdleRetireMs,
  ) {
    this.lender = new Lender(window);
  }

  /** Does a body of `length` bytes go through the lane (at least the threshold, the window open)? */
  wants(length: number): boolean {
    return !this.closed && length >= this.threshold && this.lender.window >= BigInt(length);
  }

  /** Is there a live region with nothing lent that a body of `length` bytes fits (no new region needed)? */
  hasWarm(length: number): boolean {
    for (const r of this.regions.values()) if (r.size >= length && !this.lender.isLent(r.id)) return true;
    return false;
  }

  /**
   * Copies `body` into a region with nothing lent (announcing one, retiring unlent ones to make
   * room, when none fits) and lends its range; null when the window cannot take it now.
   */
  place(body: Uint8Array, now: number): Placement | null {
    if (!this.wants(body.length) || !this.lender.canLend(body.length)) return null;
    let best: OwnedRegion | undefined;
    for (const r of this.regions.values())
      if (r.size >= body.length && !this.lender.isLent(r.id) && (!best || r.size < best.size)) best = r;
    let announced: Placement["region"] = null;
    if (!best) {
      const size = Math.ceil(body.length / MiB) * MiB;
      // Make room: retire unlent regions, smallest first, until the new one fits.
      const idle = [...this.regions.values()].filter((r) => !this.lender.isLent(r.id)).sort((a, b) => a.size - b.size);
      while (!this.lender.canAnnounce(size) && idle.length > 0) this.retireRegion(idle.shift()!);
      if (!this.lender.canAnnounce(size)) return null;
      const fd = this.native.memfd(size);
      let map: unknown;
      try {
        map = this.native.mapWrite(fd, size);
      } catch (e) {
        this.native.closeFd(fd);
        throw e;
      }
      const id = this.lender.announce(size);
      best = { id, fd, size, map, lastUsed: now };
      this.regions.set(id, best);
      announced = { frame: encodeShmFrame({ type: ShmFrameType.SHM_REGION, region: id, size }), fd };
    }
    this.native.copyIn(best.map, 0, body);
    best.lastUsed = now;
    const range = this.lender.lend({ region: best.id, offset: 0, length: body.length });
    return { region: announced, range };
  }

  /** A SHM_RELEASE from the receiver: `SHM_BAD_RELEASE` unless it names a lent range exactly. */
  released(f: ShmFrame, now: number): void {
    this.lender.released({ region: f.region, offset: f.offset, length: f.length });
    const r = this.regions.get(f.region);
    if (r) r.lastUsed = now;
  }

  /** Retires the regions with nothing lent and unused for `idleRetireMs` (their SHM_RETIREs go to `takeRetires()`). */
  retireIdle(now: number): void {
    for (const r of [...this.regions.values()]) if (!this.lender.isLent(r.id) && now - r.lastUsed >= this.idleRetireMs) this.retireRegion(r);
  }

  /** The SHM_RETIRE frames of regions retired since the last call, to send before anything else. */
  takeRetires(): Buffer[] {
    return this.retires.splice(0);
  }

  private retireRegion(r: OwnedRegion): void {
    this.lender.retire(r.id);
    this.regions.delete(r.id);
    this.native.unmap(r.map);
    this.native.closeFd(r.fd);
    this.retires.push(encodeShmFrame({ type: ShmFrameType.SHM_RETIRE, region: r.id }));
  }

  get lentBytes(): bigint {
    return this.lender.lentBytes;
  }
  get liveRegions(): number {
    return this.regions.size;
  }

  /** The connection ended: every region is unmapped and closed (the receiver's mappings stay valid). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const r of this.regions.values()) {
      this.native.unmap(r.map);
      this.native.closeFd(r.fd);
    }
    this.regions.clear();
  }
}
