/**
 * Frames as values (PROTOCOL.md sections 2 and 10) and their encoder.
 *
 * Numbers: ids are JavaScript numbers, exact up to 2^53 - 1 (the decoder refuses larger ids,
 * see {@link MAX_ID}). `timeoutUs`, `rowCount` and `maxMessageSize` are u64 on the wire and
 * numbers here: exact up to 2^53 - 1; a larger wire value decodes to the nearest double (for
 * `timeoutUs` that is no deadline in practice, section 2) and the encoder writes any number
 * at or above 2^64 as 2^64 - 1, so the largest budget round-trips byte for byte.
 * @module
 */

import {
  FLAG_MORE,
  FrameType,
  HEADER_SIZE,
  MAGIC,
  type MethodKind,
} from "./constants.js";
import { ProtocolError } from "./errors.js";

/** The largest id this SDK represents exactly (2^53 - 1); a parent core never gets near it. */
export const MAX_ID = Number.MAX_SAFE_INTEGER;

/** A method a worker offers in HELLO (section 4.1). */
export interface MethodInfo {
  /** 1-255 bytes of UTF-8, unique in the list. */
  readonly name: string;
  /** `MethodKind.UNARY` (1) or `MethodKind.STREAM` (2). */
  readonly kind: MethodKind;
  /** 1-16 distinct codec ids. */
  readonly codecs: readonly number[];
}

/** Fields every frame has: its request id (0 on connection-level frames) and the MORE flag. */
export interface FrameBase {
  readonly id: number;
  /** MORE: continuation frames of this message follow (section 5). */
  readonly more: boolean;
}

/** HELLO (0x01), worker -> parent: the worker's offer (section 4.1). */
export interface HelloFrame extends FrameBase {
  readonly type: typeof FrameType.HELLO;
  readonly minVersion: number;
  readonly maxVersion: number;
  readonly pid: number;
  readonly maxConcurrency: number;
  readonly maxFrameSize: number;
  readonly sdkName: string;
  readonly sdkVersion: string;
  readonly methods: readonly MethodInfo[];
  /**
   * The bytes after the method list: the extension block (PROTOCOL.md 20.1; `parseExtensions`,
   * `ShmOffer.fromTrailing`), absent when there are none. A v1 reader ignores them.
   */
  readonly extensions?: Uint8Array;
}

/** WELCOME (0x02), parent -> worker: the parent's answer and the connection's limits (section 4.2). */
export interface WelcomeFrame extends FrameBase {
  readonly type: typeof FrameType.WELCOME;
  readonly version: number;
  readonly workerId: number;
  readonly maxFrameSize: number;
  readonly initialCredit: number;
  readonly heartbeatMs: number;
  readonly maxInFlight: number;
  readonly maxMessageSize: number;
  /** The bytes from offset 32: the extension block (20.1; `ShmAccept.fromTrailing`), absent when there are none. */
  readonly extensions?: Uint8Array;
}

/** REQUEST (0x10), parent -> worker. */
export interface RequestFrame extends FrameBase {
  readonly type: typeof FrameType.REQUEST;
  /** Index into the HELLO method list. */
  readonly method: number;
  readonly codec: number;
  /** Time budget in microseconds, 0 = none. */
  readonly timeoutUs: number;
  /** The body (the first chunk when `more`); a view of the received bytes, not a copy. */
  readonly body: Buffer;
}

/** CANCEL (0x11), parent -> worker: empty payload. */
export interface CancelFrame extends FrameBase {
  readonly type: typeof FrameType.CANCEL;
}

/** RESULT (0x12), worker -> parent: a unary request's value. */
export interface ResultFrame extends FrameBase {
  readonly type: typeof FrameType.RESULT;
  readonly body: Buffer;
}

/** ERROR (0x13), both directions: `details` is JSON text or empty, never parsed by the core. */
export interface ErrorFrame extends FrameBase {
  readonly type: typeof FrameType.ERROR;
  readonly code: number;
  readonly message: string;
  readonly details: string;
}

/**
 * Rows without a Buffer object each (a decoded ROWS frame is one): row `i` is the bytes
 * `data[bounds[2 * i], bounds[2 * i + 1])`. What a codec's `decodeRows` reads.
 */
export interface RowSpans {
  /** The bytes holding the rows (for a decoded frame, its payload: a view of the received bytes). */
  readonly data: Buffer;
  /** Each row's start and end offsets in `data`, in row order (two entries per row). */
  readonly bounds: Uint32Array;
  /** The number of rows (`bounds.length / 2`). */
  readonly count: number;
}

/**
 * ROWS (0x20), worker -> parent: one or more rows. `data`, `bounds` and `count` locate them in
 * the received bytes with no per-row object; `rows` makes a Buffer view per row on first use.
 */
export interface RowsFrame extends FrameBase, RowSpans {
  readonly type: typeof FrameType.ROWS;
  /** Each row as a view of the received bytes (made when first read; a codec reads `data` and `bounds`). */
  readonly rows: readonly Buffer[];
  /**
   * The payload's size in bytes: what this frame charged against the stream's credit. A parent
   * driver passes it to `Connection.consumed` once the rows are read (or dropped).
   */
  readonly payloadLength: number;
}

/** END (0x21), worker -> parent: a stream's terminal. */
export interface EndFrame extends FrameBase {
  readonly type: typeof FrameType.END;
  readonly rowCount: number;
  readonly summary: Buffer;
}

/** CREDIT (0x22), parent -> worker: more bytes of ROWS payload the stream may send. */
export interface CreditFrame extends FrameBase {
  readonly type: typeof FrameType.CREDIT;
  readonly bytes: number;
}

/** EVENT (0x30), worker -> parent: a progress report (the core reports it as a Notification). */
export interface NotificationFrame extends FrameBase {
  readonly type: typeof FrameType.EVENT;
  readonly topic: string;
  readonly data: string;
}

/** PING (0x31): 8 opaque bytes to be echoed. */
export interface PingFrame extends FrameBase {
  readonly type: typeof FrameType.PING;
  readonly nonce: Buffer;
}

/** PONG (0x32): the nonce of the PING it answers. */
export interface PongFrame extends FrameBase {
  readonly type: typeof FrameType.PONG;
  readonly nonce: Buffer;
}

/** DRAIN (0x40), parent -> worker. */
export interface DrainFrame extends FrameBase {
  readonly type: typeof FrameType.DRAIN;
  readonly graceMs: number;
}

/** GOODBYE (0x41), worker -> parent: its last frame. */
export interface GoodbyeFrame extends FrameBase {
  readonly type: typeof FrameType.GOODBYE;
  readonly reason: number;
}

/** CONTINUATION (0x7F): the next chunk of a continued message. */
export interface ContinuationFrame extends FrameBase {
  readonly type: typeof FrameType.CONTINUATION;
  readonly body: Buffer;
}

/** Any frame. Switch on `type` to narrow it. */
export type Frame =
  | HelloFrame
  | WelcomeFrame
  | RequestFrame
  | CancelFrame
  | ResultFrame
  | ErrorFrame
  | RowsFrame
  | EndFrame
  | CreditFrame
  | NotificationFrame
  | PingFrame
  | PongFrame
  | DrainFrame
  | GoodbyeFrame
  | ContinuationFrame;

/**
 * A frame to encode: like {@link Frame}, but byte fields take any `Uint8Array` and a ROWS frame
 * needs no `payloadLength`.
 */
export type FrameInit =
  | Exclude<Frame, RequestFrame | ResultFrame | RowsFrame | EndFrame | PingFrame | PongFrame | ContinuationFrame>
  | (Omit<RequestFrame, "body"> & { readonly body: Uint8Array })
  | (Omit<ResultFrame, "body"> & { readonly body: Uint8Array })
  | (Omit<RowsFrame, "rows" | "payloadLength" | keyof RowSpans> & { readonly rows: readonly Uint8Array[] })
  | (Omit<EndFrame, "summary"> & { readonly summary: Uint8Array })
  | (Omit<PingFrame, "nonce"> & { readonly nonce: Uint8Array })
  | (Omit<PongFrame, "nonce"> & { readonly nonce: Uint8Array })
  | (Omit<ContinuationFrame, "body"> & { readonly body: Uint8Array });

/**
 * A decoded ROWS frame: the rows' offsets are read once by the decoder; a Buffer per row is made
 * only if `rows` is read.
 * @internal
 */
export class DecodedRows implements RowsFrame {
  readonly type = FrameType.ROWS;
  private views: Buffer[] | null = null;

  constructor(
    readonly id: number,
    readonly more: boolean,
    readonly data: Buffer,
    readonly bounds: Uint32Array,
    readonly count: number,
    readonly payloadLength: number,
  ) {}

  get rows(): readonly Buffer[] {
    if (this.views === null) this.views = spansToViews(this, 0);
    return this.views;
  }
}

/** Buffer views of `spans`' rows from `start` on. */
export function spansToViews(spans: RowSpans, start: number): Buffer[] {
  const { data, bounds, count } = spans;
  const out = new Array<Buffer>(Math.max(0, count - start));
  for (let i = start; i < count; i++) out[i - start] = data.subarray(bounds[2 * i], bounds[2 * i + 1]);
  return out;
}

/**
 * `rows` as {@link RowSpans}: copied after one another into one buffer, each preceded by 4
 * bytes (as in a ROWS payload), for a codec's `decodeRows` outside a received frame.
 *
 * @example
 * ```ts
 * const out: unknown[] = [];
 * json.decodeRows!(rowSpans([Buffer.from("1"), Buffer.from("[2]")]), 0, out); // out: [1, [2]]
 * ```
 */
export function rowSpans(rows: readonly Uint8Array[]): RowSpans {
  let size = 0;
  for (const r of rows) size += 4 + r.length;
  const data = Buffer.allocUnsafe(size);
  const bounds = new Uint32Array(rows.length * 2);
  let p = 0;
  for (let i = 0; i < rows.length; i++) {
    const r = rows[i];
    data.writeUInt32LE(r.length, p);
    data.set(r, p + 4);
    bounds[2 * i] = p + 4;
    bounds[2 * i + 1] = p += 4 + r.length;
  }
  return { data, bounds, count: rows.length };
}

const TWO32 = 0x1_0000_0000;
const U64_MAX_AS_NUMBER = 2 ** 64;

/** Bodies from this size up are written as their own piece of output, never copied. */
export const COPY_LIMIT = 16 * 1024;
/** Bytes in one output chunk of a {@link FrameWriter}. */
const WRITER_CHUNK = 64 * 1024;

/**
 * Encodes frames into output pieces for one write (writev or `socket.cork`).
 *
 * Headers and small payloads are written into a chunk the writer reuses until it is full; a
 * large body (from {@link COPY_LIMIT} bytes) is not copied but handed out as its own piece. Bytes
 * handed out by {@link FrameWriter.take} are never written again (the socket may still hold
 * them), so the writer moves on in the same chunk and starts a new one only when it is full.
 *
 * @example
 * ```ts
 * const w = new FrameWriter();
 * encodeFrame(w, { type: FrameType.PING, id: 0, more: false, nonce: Buffer.alloc(8) });
 * socket.write(w.takeOne());
 * ```
 */
export class FrameWriter {
  private buf: Buffer;
  /** Start of the bytes not yet handed out. */
  private mark = 0;
  /** Next byte to write in the buffer {@link FrameWriter.room} returned (callers writing in place advance it). */
  pos = 0;
  private pieces: Buffer[] = [];
  private piecesBytes = 0;

  constructor(private readonly chunkSize = WRITER_CHUNK) {
    this.buf = Buffer.allocUnsafe(chunkSize);
  }

  /** Bytes written and not yet taken. */
  get length(): number {
    return this.piecesBytes + (this.pos - this.mark);
  }

  /** Ensures `n` bytes of room at `pos` and returns the buffer to write them into. */
  room(n: number): Buffer {
    if (this.buf.length - this.pos < n) {
      this.cut();
      this.buf = Buffer.allocUnsafe(Math.max(this.chunkSize, n));
      this.mark = this.pos = 0;
    }
    return this.buf;
  }

  private cut(): void {
    if (this.pos > this.mark) {
      this.pieces.push(this.buf.subarray(this.mark, this.pos));
      this.piecesBytes += this.pos - this.mark;
      this.mark = this.pos;
    }
  }

  /** Writes a 16-byte header. `id` must be a safe integer. */
  header(type: number, flags: number, id: number, length: number): void {
    const b = this.room(HEADER_SIZE);
    const p = this.pos;
    b.writeUInt32LE(length, p);
    b[p + 4] = type;
    b[p + 5] = flags;
    b[p + 6] = 0;
    b[p + 7] = 0;
    b.writeUInt32LE(id % TWO32, p + 8);
    b.writeUInt32LE(Math.floor(id / TWO32), p + 12);
    this.pos = p + HEADER_SIZE;
  }

  /** Writes one byte. */
  u8(v: number): void {
    const b = this.room(1);
    b[this.pos++] = v;
  }

  /** Writes a little-endian u16. */
  u16(v: number): void {
    const b = this.room(2);
    b.writeUInt16LE(v, this.pos);
    this.pos += 2;
  }

  /** Writes a little-endian u32. */
  u32(v: number): void {
    const b = this.room(4);
    b.writeUInt32LE(v, this.pos);
    this.pos += 4;
  }

  /** A u64 from a non-negative number; at or above 2^64 it writes 2^64 - 1. */
  u64(v: number): void {
    const b = this.room(8);
    if (v >= U64_MAX_AS_NUMBER) {
      b.writeUInt32LE(0xffffffff, this.pos);
      b.writeUInt32LE(0xffffffff, this.pos + 4);
    } else {
      b.writeUInt32LE(v % TWO32, this.pos);
      b.writeUInt32LE(Math.floor(v / TWO32), this.pos + 4);
    }
    this.pos += 8;
  }

  /** Writes bytes: copied when small, handed out as their own piece when large. */
  bytes(data: Uint8Array): void {
    const n = data.length;
    if (n >= COPY_LIMIT) {
      this.cut();
      this.pieces.push(toBuffer(data));
      this.piecesBytes += n;
      return;
    }
    if (n === 0) return;
    const b = this.room(n);
    b.set(data, this.pos);
    this.pos += n;
  }

  /** Writes a string's UTF-8 bytes (`byteLength` of them, measured by the caller). */
  utf8(s: string, byteLength: number): void {
    if (byteLength === 0) return;
    const b = this.room(byteLength);
    b.write(s, this.pos, byteLength, "utf8");
    this.pos += byteLength;
  }

  /** Takes everything written so far, in order, as pieces for one write. */
  take(): Buffer[] {
    this.cut();
    const out = this.pieces;
    this.pieces = [];
    this.piecesBytes = 0;
    return out;
  }

  /**
   * Takes whole frames from the front, in order: while fewer than `max` bytes are taken, the
   * next frame is taken whole (so at least one frame when `max` > 0, and at most one frame past
   * `max`); never part of a frame. What is left starts at a frame boundary. Nothing when `max`
   * <= 0. The writer must hold whole frames only, headers written with {@link FrameWriter.header}
   * or inside whole frames given to {@link FrameWriter.bytes} (a header is never split between
   * pieces, so its length field can be read where the frame starts).
   */
  takeFrames(max: number): Buffer[] {
    if (max <= 0) return [];
    this.cut();
    const pieces = this.pieces;
    let taken = 0; // bytes of the pieces before pieces[i]
    let left = 0; // bytes of the frame under way at the start of pieces[i] (0: a frame starts there)
    for (let i = 0; i < pieces.length; i++) {
      const p = pieces[i];
      const n = p.length;
      let at = left; // the first frame boundary in p, if below n
      while (at < n) {
        if (taken + at >= max) {
          // Cut here: the frames before this boundary go, the rest stays (no copy: a split piece
          // shares its buffer).
          const out = pieces.splice(0, i);
          if (at > 0) {
            out.push(p.subarray(0, at));
            pieces[0] = p.subarray(at);
          }
          this.piecesBytes -= taken + at;
          return out;
        }
        at += HEADER_SIZE + p.readUInt32LE(at);
      }
      left = at - n;
      taken += n;
    }
    return this.take();
  }

  /** Takes everything written so far as one Buffer (copies only when there are several pieces). */
  takeOne(): Buffer {
    const parts = this.take();
    if (parts.length === 1) return parts[0];
    return Buffer.concat(parts);
  }
}

/** A Buffer view of any Uint8Array, without copying. */
export function toBuffer(data: Uint8Array): Buffer {
  return Buffer.isBuffer(data) ? data : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
}

const MAGIC_BYTES = Buffer.from(MAGIC, "ascii");

function flagsOf(f: { more: boolean }): number {
  return f.more ? FLAG_MORE : 0;
}

/**
 * The payload length of `frame` in bytes (what its header's `length` will say). Strings are
 * measured as UTF-8.
 */
export function payloadLength(frame: FrameInit): number {
  switch (frame.type) {
    case FrameType.HELLO: {
      let n = 24 + 2 + Buffer.byteLength(frame.sdkName) + 2 + Buffer.byteLength(frame.sdkVersion) + 2;
      for (const m of frame.methods) n += 2 + m.codecs.length + 2 + Buffer.byteLength(m.name);
      return n + (frame.extensions?.length ?? 0);
    }
    case FrameType.WELCOME:
      return 32 + (frame.extensions?.length ?? 0);
    case FrameType.REQUEST:
      return 12 + frame.body.length;
    case FrameType.CANCEL:
      return 0;
    case FrameType.RESULT:
    case FrameType.CONTINUATION:
      return frame.body.length;
    case FrameType.ERROR:
      return 6 + Buffer.byteLength(frame.message) + Buffer.byteLength(frame.details);
    case FrameType.ROWS: {
      let n = 4;
      for (const r of frame.rows) n += 4 + r.length;
      return n;
    }
    case FrameType.END:
      return 8 + frame.summary.length;
    case FrameType.CREDIT:
    case FrameType.DRAIN:
    case FrameType.GOODBYE:
      return 4;
    case FrameType.EVENT:
      return 2 + Buffer.byteLength(frame.topic) + Buffer.byteLength(frame.data);
    case FrameType.PING:
    case FrameType.PONG:
      return frame.nonce.length;
  }
}

/**
 * Writes one frame, header and payload, exactly as given (no protocol checks beyond what makes
 * the bytes well formed: a string longer than its u16 length field is a `BAD_PAYLOAD`
 * ProtocolError). The connection core checks the rules before it calls this.
 */
export function encodeFrame(w: FrameWriter, frame: FrameInit): void {
  const length = payloadLength(frame);
  if (length > 0xffffffff) throw ProtocolError.of("FRAME_TOO_LARGE", `payload of ${length} bytes`);
  w.header(frame.type, flagsOf(frame), frame.id, length);
  switch (frame.type) {
    case FrameType.HELLO: {
      w.bytes(MAGIC_BYTES);
      w.u16(frame.minVersion);
      w.u16(frame.maxVersion);
      w.u32(frame.pid);
      w.u32(frame.maxConcurrency);
      w.u32(frame.maxFrameSize);
      str16(w, frame.sdkName);
      str16(w, frame.sdkVersion);
      w.u16(frame.methods.length);
      for (const m of frame.methods) {
        w.u8(m.kind);
        w.u8(m.codecs.length);
        for (const c of m.codecs) w.u8(c);
        str16(w, m.name);
      }
      if (frame.extensions) w.bytes(frame.extensions);
      return;
    }
    case FrameType.WELCOME:
      w.u16(frame.version);
      w.u16(0);
      w.u32(frame.workerId);
      w.u32(frame.maxFrameSize);
      w.u32(frame.initialCredit);
      w.u32(frame.heartbeatMs);
      w.u32(frame.maxInFlight);
      w.u64(frame.maxMessageSize);
      if (frame.extensions) w.bytes(frame.extensions);
      return;
    case FrameType.REQUEST:
      w.u16(frame.method);
      w.u8(frame.codec);
      w.u8(0);
      w.u64(frame.timeoutUs);
      w.bytes(frame.body);
      return;
    case FrameType.CANCEL:
      return;
    case FrameType.RESULT:
    case FrameType.CONTINUATION:
      w.bytes(frame.body);
      return;
    case FrameType.ERROR:
      w.u32(frame.code);
      str16(w, frame.message);
      w.utf8(frame.details, Buffer.byteLength(frame.details));
      return;
    case FrameType.ROWS:
      w.u32(frame.rows.length);
      for (const r of frame.rows) {
        w.u32(r.length);
        w.bytes(r);
      }
      return;
    case FrameType.END:
      w.u64(frame.rowCount);
      w.bytes(frame.summary);
      return;
    case FrameType.CREDIT:
      w.u32(frame.bytes);
      return;
    case FrameType.EVENT:
      str16(w, frame.topic);
      w.utf8(frame.data, Buffer.byteLength(frame.data));
      return;
    case FrameType.PING:
    case FrameType.PONG:
      w.bytes(frame.nonce);
      return;
    case FrameType.DRAIN:
      w.u32(frame.graceMs);
      return;
    case FrameType.GOODBYE:
      w.u32(frame.reason);
      return;
  }
}

function str16(w: FrameWriter, s: string): void {
  const n = Buffer.byteLength(s);
  if (n > 0xffff) throw ProtocolError.of("BAD_PAYLOAD", `a string of ${n} bytes does not fit its u16 length`);
  w.u16(n);
  w.utf8(s, n);
}

/**
 * Encodes frames, in order, into one Buffer.
 *
 * @example
 * ```ts
 * const bytes = encodeFrames([{ type: FrameType.CANCEL, id: 1, more: false }]);
 * ```
 */
export function encodeFrames(frames: Iterable<FrameInit>): Buffer {
  const w = new FrameWriter();
  for (const f of frames) encodeFrame(w, f);
  return w.takeOne();
}
