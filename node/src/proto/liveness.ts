/**
 * The heartbeat's two clocks (PROTOCOL.md 8.5, 14.5), sans-IO: a driver feeds the judge its
 * clock at each housekeeping tick and what its reader saw, sends the PINGs it asks for and
 * kills (or leaves) the peer it finds hung. The model is `rust/wirepool/src/liveness.rs`.
 *
 * Liveness means progress, not bytes: a peer is hung when the oldest PING it has not answered
 * is older than `heartbeat_misses` (3) x `heartbeat_ms` (the PONG clock), or when one frame has
 * been arriving for longer than that (the frame clock). Bytes of other frames reset neither.
 *
 * **The starvation guard.** A tick that comes more than `heartbeat_ms` after the previous one
 * means the driver itself ran late (its event loop was blocked): its reader was starved too and
 * may not have read what the peer sent, so nobody is judged until a heartbeat has passed since.
 *
 * The frame clock costs the reader nothing: at each tick the judge compares the bytes of the
 * incomplete frame the decoder holds with the bytes read since it first saw a frame incomplete.
 * A frame still arriving holds more than was read since; a frame that started later holds at
 * most that. So the clock is late by at most one tick.
 * @module
 */

import { Limits, Timing } from "./constants.js";

/** PINGs in flight at most: a peer this far behind is judged by the first of them anyway. */
const MAX_UNANSWERED = 8;

/** Why a peer was found hung: which clock, and how long it has run (ms). */
export interface Hung {
  readonly clock: "pong" | "frame";
  readonly ms: number;
}

/** What the driver's reader has seen, for the frame clock (zeros: the PONG clock only). */
export interface LivenessSeen {
  /** Bytes of the incomplete frame the decoder holds (`incompleteFrameLen()`, 0 between frames). */
  readonly incompleteFrame: number;
  /** Bytes read from the peer so far. */
  readonly bytesIn: number;
}

/** What one tick asks of the driver. */
export interface LivenessTick {
  /** Send a PING with this nonce (8 bytes), or nothing now. */
  readonly ping: Buffer | null;
  /** The peer made no progress within 3 x heartbeat_ms: end it (WORKER_HUNG at a parent). */
  readonly hung: Hung | null;
}

const NOTHING: LivenessTick = Object.freeze({ ping: null, hung: null });
const NO_FRAME: LivenessSeen = Object.freeze({ incompleteFrame: 0, bytesIn: 0 });

/**
 * Both clocks of one connection, in ms on the driver's clock (e.g. `performance.now()`).
 *
 * @example
 * ```ts
 * const judge = new Liveness(welcome.heartbeatMs, tickMs, performance.now());
 * setInterval(() => {
 *   const t = judge.tick(performance.now(), { incompleteFrame: conn.incompleteFrameLen(), bytesIn });
 *   if (t.hung !== null) return kill(t.hung);
 *   if (t.ping !== null) conn.sendPing(t.ping);
 * }, tickMs);
 * // on each PONG event: judge.pong(ev.nonce)
 * ```
 */
export class Liveness {
  /** The limit of both clocks: heartbeat_misses x heartbeat_ms. */
  readonly limitMs: number;
  /** A tick later than this after the previous one means the driver itself ran late. */
  private readonly lateGapMs: number;
  /** PINGs sent and not answered, oldest first. */
  private readonly unanswered: { nonce: number; at: number }[] = [];
  private lastNonce = 0;
  private nextPingMs: number;
  /** A frame seen incomplete: since when, and the bytes read by then (since < 0: none). */
  private frameSince = -1;
  private frameBytesIn = 0;
  private lastTickMs: number;
  /** No verdict before this: the driver ran late, so its reader may not have read yet. */
  private judgeAfterMs = -Infinity;

  /**
   * Clocks for `heartbeatMs` > 0, ticked about every `tickMs`, starting at `nowMs`; the first
   * PING is due at `firstPingMs` (default: a heartbeat later).
   */
  constructor(
    readonly heartbeatMs: number,
    tickMs: number,
    nowMs: number,
    firstPingMs: number = nowMs + heartbeatMs,
  ) {
    if (!(heartbeatMs > 0)) throw new RangeError(`a liveness judge needs heartbeat_ms > 0, not ${heartbeatMs}`);
    this.limitMs = Timing.heartbeatMisses * heartbeatMs;
    this.lateGapMs = Math.max(heartbeatMs, 2 * tickMs, 1);
    this.nextPingMs = firstPingMs;
    this.lastTickMs = nowMs;
  }

  /** PINGs sent and not answered yet. */
  get unansweredCount(): number {
    return this.unanswered.length;
  }

  /**
   * A PONG arrived: it answers its PING and every earlier one (8.5). A nonce this judge did not
   * send (unsolicited, or of another length) is ignored.
   */
  pong(nonce: Uint8Array): void {
    if (nonce.length !== Limits.nonceBytes) return;
    const b = Buffer.from(nonce.buffer, nonce.byteOffset, nonce.length);
    const n = b.readUInt32LE(0) + b.readUInt32LE(4) * 0x1_0000_0000;
    if (n < 1 || n > this.lastNonce) return;
    const u = this.unanswered;
    let k = 0;
    while (k < u.length && u[k].nonce <= n) k++;
    if (k > 0) u.splice(0, k);
  }

  /**
   * One housekeeping tick at `nowMs`, with what the reader has seen. `mayPing` false: the
   * connection cannot send a PING now (closing), so none is asked for (the clocks still run).
   */
  tick(nowMs: number, seen: LivenessSeen = NO_FRAME, mayPing = true): LivenessTick {
    // A tick that itself ran late: the reader was starved too (the starvation guard).
    if (nowMs - this.lastTickMs > this.lateGapMs) this.judgeAfterMs = nowMs + this.heartbeatMs;
    this.lastTickMs = nowMs;
    if (seen.incompleteFrame === 0) {
      this.frameSince = -1;
    } else if (this.frameSince < 0 || seen.incompleteFrame <= seen.bytesIn - this.frameBytesIn) {
      // A frame that started since the last look (what it holds was all read since then).
      this.frameSince = nowMs;
      this.frameBytesIn = seen.bytesIn;
    }
    let hung: Hung | null = null;
    if (nowMs >= this.judgeAfterMs) {
      const pongMs = this.unanswered.length > 0 ? nowMs - this.unanswered[0].at : -1;
      const frameMs = this.frameSince >= 0 ? nowMs - this.frameSince : -1;
      if (pongMs > this.limitMs) hung = { clock: "pong", ms: pongMs };
      else if (frameMs > this.limitMs) hung = { clock: "frame", ms: frameMs };
    }
    if (hung !== null) return { ping: null, hung };
    if (!mayPing || nowMs < this.nextPingMs) return NOTHING;
    this.nextPingMs = nowMs + this.heartbeatMs;
    if (this.unanswered.length >= MAX_UNANSWERED) return NOTHING;
    const nonce = ++this.lastNonce;
    this.unanswered.push({ nonce, at: nowMs });
    const ping = Buffer.alloc(Limits.nonceBytes);
    ping.writeUInt32LE(nonce % 0x1_0000_0000, 0);
    ping.writeUInt32LE(Math.floor(nonce / 0x1_0000_0000), 4);
    return { ping, hung: null };
  }

  /** Why `hung` is a verdict, in words for the error message. */
  static describe(hung: Hung, heartbeatMs: number): string {
    const ms = Math.round(hung.ms);
    return hung.clock === "pong"
      ? `no PONG for ${ms} ms (${Timing.heartbeatMisses} x heartbeat ${heartbeatMs} ms)`
      : `a frame started ${ms} ms ago is still incomplete (${Timing.heartbeatMisses} x heartbeat ${heartbeatMs} ms)`;
  }
}
