/**
 * The stateless frame decoder (PROTOCOL.md sections 2, 10 and 11.1): bytes in, frames out.
 * @module
 */

import { isUtf8 } from "node:buffer";

import {
  FLAG_MORE,
  FLAGS_RESERVED_MASK,
  FrameType,
  HEADER_SIZE,
  Limits,
  MethodKind,
} from "./constants.js";
import { ProtocolError } from "./errors.js";
import { DecodedRows, MAX_ID, type Frame, type MethodInfo, toBuffer } from "./frames.js";

const TWO32 = 0x1_0000_0000;
/** ids above this high word are not exact JavaScript numbers (see frames.ts, MAX_ID). */
const MAX_ID_HIGH = Math.floor(MAX_ID / TWO32);

/** Per frame type (by code): 0 unknown, 1 id must be 0, 2 id must not be 0, 3 either. */
const ID_RULE = new Uint8Array(256);
/** Per frame type: 1 when MORE is allowed. */
const MORE_OK = new Uint8Array(256);
for (const t of [FrameType.HELLO, FrameType.WELCOME, FrameType.PING, FrameType.PONG, FrameType.DRAIN, FrameType.GOODBYE]) ID_RULE[t] = 1;
for (const t of [FrameType.REQUEST, FrameType.CANCEL, FrameType.RESULT, FrameType.ROWS, FrameType.END, FrameType.CREDIT, FrameType.CONTINUATION]) ID_RULE[t] = 2;
for (const t of [FrameType.ERROR, FrameType.EVENT]) ID_RULE[t] = 3;
for (const t of [FrameType.REQUEST, FrameType.RESULT, FrameType.END, FrameType.CONTINUATION]) MORE_OK[t] = 1;

/** The smallest chunk the decoder allocates to gather bytes into. */
const ARENA = 64 * 1024;
/** Chunks below this size are copied into the current chunk rather than adopted. */
const ADOPT_MIN = 4096;
const EMPTY = Buffer.alloc(0);
const MAGIC_BYTES = Buffer.from("WIREPOOL", "ascii");

function fail(name: Parameters<typeof ProtocolError.of>[0], message: string): never {
  throw ProtocolError.of(name, message);
}

/**
 * An incremental frame decoder: push bytes as they arrive, pull frames.
 *
 * It checks a header as soon as its 16 bytes are in (section 11.1 order), so a too-large or
 * malformed header fails before its payload is awaited or any room is made for it. Byte fields
 * of the frames it returns (bodies, rows, nonces) are views of the received bytes, never copies:
 * the decoder never writes over bytes it has returned, it moves on to fresh memory instead.
 * After an error the decoder is failed and every later call throws the same error.
 *
 * @example
 * ```ts
 * const dec = new FrameDecoder(65536);
 * socket.on("data", (chunk) => {
 *   dec.push(chunk);
 *   for (let f; (f = dec.next()); ) console.log(f.type, f.id);
 * });
 * socket.on("end", () => dec.end()); // throws TRUNCATED inside a frame
 * ```
 */
export class FrameDecoder {
  /** The receive limit on `length` (section 2); the connection core raises it after the handshake. */
  maxFrameSize: number;
  /** The payload length of the frame {@link FrameDecoder.next} returned last. */
  lastPayloadLength = 0;

  private buf: Buffer = EMPTY;
  private start = 0;
  private tail = 0;
  /** The header at `start` has passed its checks; its fields follow. */
  private checked = false;
  private hLength = 0;
  private hType = 0;
  private hFlags = 0;
  private hId = 0;
  private failed: ProtocolError | null = null;

  constructor(maxFrameSize: number = Limits.handshakeMaxFrameSize) {
    this.maxFrameSize = maxFrameSize;
  }

  /** Bytes received and not yet returned as frames. */
  get buffered(): number {
    return this.tail - this.start;
  }

  /** Bytes of a frame that has started but not finished (0 between frames). */
  incompleteFrameLen(): number {
    return this.tail - this.start;
  }

  /** The error this decoder failed with, if any. */
  get failure(): ProtocolError | null {
    return this.failed;
  }

  /**
   * A fatal error (from this decoder or from the connection above it): the decoder is dead and
   * lets go of its buffer, so a peer that failed mid-way through a huge frame does not keep it
   * alive through the core the driver still holds.
   */
  fail(e: ProtocolError): void {
    if (this.failed === null) this.failed = e;
    this.buf = EMPTY;
    this.start = this.tail = 0;
    this.checked = false;
  }

  /**
   * Appends received bytes. A large chunk is kept as it is (not copied) when nothing is pending,
   * so the caller must not modify it afterwards: Node's socket chunks are never reused.
   */
  push(chunk: Uint8Array): void {
    const n = chunk.length;
    if (n === 0) return;
    const pending = this.tail - this.start;
    if (pending === 0 && (n >= ADOPT_MIN || this.buf.length - this.tail < n)) {
      this.buf = toBuffer(chunk);
      this.start = 0;
      this.tail = n;
      return;
    }
    if (this.buf.length - this.tail < n) this.grow(pending + n);
    this.buf.set(chunk, this.tail);
    this.tail += n;
  }

  /**
   * Zero-copy receive: room to read into, at least `min` bytes (and the rest of the current
   * frame, once its header is checked). Call {@link FrameDecoder.received} with the count read.
   */
  readBuffer(min: number = ARENA): Buffer {
    const pending = this.tail - this.start;
    let want = min;
    if (this.checked) want = Math.max(want, HEADER_SIZE + this.hLength - pending);
    if (this.buf.length - this.tail < want) this.grow(pending + want);
    return this.buf.subarray(this.tail);
  }

  /** Records `n` bytes read into the space {@link FrameDecoder.readBuffer} returned. */
  received(n: number): void {
    if (n < 0 || this.tail + n > this.buf.length) throw new RangeError(`received(${n}): more than the read buffer holds`);
    this.tail += n;
  }

  /**
   * Moves the pending bytes to a fresh chunk of at least `need` bytes. The old chunk is left as
   * it is: frames already returned may still be viewing it.
   */
  private grow(need: number): void {
    let size = Math.max(ARENA, need);
    // The frame in progress has a checked length: make room for all of it at once, so a large
    // frame arriving in many reads is copied once, not once per read.
    if (this.checked) size = Math.max(size, HEADER_SIZE + this.hLength);
    const next = Buffer.allocUnsafe(size);
    const pending = this.tail - this.start;
    if (pending > 0) this.buf.copy(next, 0, this.start, this.tail);
    this.buf = next;
    this.start = 0;
    this.tail = pending;
  }

  /**
   * The next complete frame, or null when more bytes are needed.
   * @throws ProtocolError on the first rule the input breaks (section 11.1); the decoder is then failed.
   */
  next(): Frame | null {
    if (this.failed !== null) throw this.failed;
    const avail = this.tail - this.start;
    if (!this.checked) {
      if (avail < HEADER_SIZE) return null;
      try {
        this.checkHeader();
      } catch (e) {
        this.failed = e as ProtocolError;
        throw e;
      }
    }
    const length = this.hLength;
    if (avail < HEADER_SIZE + length) return null;
    const p = this.start + HEADER_SIZE;
    let frame: Frame;
    try {
      frame = decodePayload(this.buf, p, p + length, this.hType, this.hId, (this.hFlags & FLAG_MORE) !== 0);
    } catch (e) {
      this.failed = e as ProtocolError;
      throw e;
    }
    this.start = p + length;
    this.checked = false;
    this.lastPayloadLength = length;
    if (this.start === this.tail && this.buf.length - this.tail < HEADER_SIZE) {
      // Nothing pending and no room left: drop the reference so the chunk can be collected
      // as soon as the frames viewing it are.
      this.buf = EMPTY;
      this.start = this.tail = 0;
    }
    return frame;
  }

  private checkHeader(): void {
    const b = this.buf;
    const s = this.start;
    const length = b.readUInt32LE(s);
    const type = b[s + 4];
    const flags = b[s + 5];
    const reserved = b[s + 6] | (b[s + 7] << 8);
    const lo = b.readUInt32LE(s + 8);
    const hi = b.readUInt32LE(s + 12);
    if (length > this.maxFrameSize) fail("FRAME_TOO_LARGE", `length ${length} above max_frame_size ${this.maxFrameSize}`);
    const rule = ID_RULE[type];
    if (rule === 0) fail("UNKNOWN_FRAME_TYPE", `frame type 0x${type.toString(16).padStart(2, "0")}`);
    if ((flags & FLAGS_RESERVED_MASK) !== 0 || ((flags & FLAG_MORE) !== 0 && MORE_OK[type] === 0)) {
      fail("BAD_FLAGS", `flags 0x${flags.toString(16).padStart(2, "0")} on frame type 0x${type.toString(16)}`);
    }
    if (reserved !== 0) fail("RESERVED_NONZERO", `header reserved field ${reserved}`);
    const zero = lo === 0 && hi === 0;
    if (rule === 1 && !zero) fail("BAD_ID", `a connection-level frame (type 0x${type.toString(16)}) with a non-zero id`);
    if (rule === 2 && zero) fail("BAD_ID", `a request-level frame (type 0x${type.toString(16)}) with id 0`);
    if (hi > MAX_ID_HIGH) fail("PROTOCOL", `id ${BigInt(hi) * 4294967296n + BigInt(lo)} above 2^53 - 1, the largest this SDK represents`);
    this.hLength = length;
    this.hType = type;
    this.hFlags = flags;
    // Small ids stay small integers (no heap number per frame).
    this.hId = hi === 0 ? lo : hi * TWO32 + lo;
    this.checked = true;
  }

  /**
   * @internal For the core's batch fast paths: the type of the next frame when its header has
   * passed its checks, its payload is all in and it is not continued; otherwise -1 (and a bad
   * header fails the decoder, so that the next {@link FrameDecoder.next} throws).
   */
  peekType(): number {
    if (this.failed !== null) return -1;
    const avail = this.tail - this.start;
    if (!this.checked) {
      if (avail < HEADER_SIZE) return -1;
      try {
        this.checkHeader();
      } catch (e) {
        this.failed = e as ProtocolError;
        return -1;
      }
    }
    if (avail < HEADER_SIZE + this.hLength || (this.hFlags & FLAG_MORE) !== 0) return -1;
    return this.hType;
  }

  /** @internal The id of the frame {@link FrameDecoder.peekType} looked at. */
  peekId(): number {
    return this.hId;
  }

  /** @internal Consumes the peeked frame and returns its payload (a view). */
  takePayload(): Buffer {
    const p = this.start + HEADER_SIZE;
    const payload = this.buf.subarray(p, p + this.hLength);
    this.start = p + this.hLength;
    this.checked = false;
    this.lastPayloadLength = this.hLength;
    if (this.start === this.tail && this.buf.length - this.tail < HEADER_SIZE) {
      this.buf = EMPTY;
      this.start = this.tail = 0;
    }
    return payload;
  }

  /**
   * The peer closed the stream.
   * @throws ProtocolError `TRUNCATED` when it ended inside a frame (or the decoder already failed).
   */
  end(): void {
    if (this.failed !== null) throw this.failed;
    if (this.tail > this.start) {
      this.failed = ProtocolError.of("TRUNCATED", `end of input inside a frame (${this.tail - this.start} bytes of it received)`);
      throw this.failed;
    }
  }
}

/** Reads a UTF-8 field; invalid UTF-8 is BAD_UTF8. ASCII, the common case, skips the validator. */
function utf8(b: Buffer, s: number, e: number, what: string): string {
  if (s === e) return "";
  let i = s;
  while (i < e && b[i] < 0x80) i++;
  if (i === e) return b.toString("latin1", s, e);
  const view = b.subarray(s, e);
  if (!isUtf8(view)) fail("BAD_UTF8", `${what} is not valid UTF-8`);
  return b.toString("utf8", s, e);
}

function u64(b: Buffer, p: number): number {
  return b.readUInt32LE(p + 4) * TWO32 + b.readUInt32LE(p);
}

function exact(len: number, want: number, name: string): void {
  if (len !== want) fail("BAD_PAYLOAD", `${name} payload of ${len} bytes (must be ${want})`);
}

/**
 * Decodes and checks one payload `b[s..e)` of a frame whose header passed (section 11.1 step 3).
 * Exposed for the connection core and tests; most callers want {@link FrameDecoder}.
 */
export function decodePayload(b: Buffer, s: number, e: number, type: number, id: number, more: boolean): Frame {
  const len = e - s;
  switch (type) {
    case FrameType.REQUEST: {
      if (len < 12) fail("BAD_PAYLOAD", `REQUEST payload of ${len} bytes (its prefix is 12)`);
      if (b[s + 3] !== 0) fail("RESERVED_NONZERO", "REQUEST reserved byte");
      return {
        type: FrameType.REQUEST,
        id,
        more,
        method: b[s] | (b[s + 1] << 8),
        codec: b[s + 2],
        timeoutUs: u64(b, s + 4),
        body: b.subarray(s + 12, e),
      };
    }
    case FrameType.RESULT:
      return { type: FrameType.RESULT, id, more, body: b.subarray(s, e) };
    case FrameType.CONTINUATION:
      return { type: FrameType.CONTINUATION, id, more, body: b.subarray(s, e) };
    case FrameType.ROWS:
      return decodeRows(b, s, e, id, more);
    case FrameType.CREDIT: {
      exact(len, 4, "CREDIT");
      const bytes = b.readUInt32LE(s);
      if (bytes === 0) fail("BAD_PAYLOAD", "CREDIT of 0 bytes");
      return { type: FrameType.CREDIT, id, more, bytes };
    }
    case FrameType.CANCEL:
      exact(len, 0, "CANCEL");
      return { type: FrameType.CANCEL, id, more };
    case FrameType.END:
      if (len < 8) fail("BAD_PAYLOAD", `END payload of ${len} bytes (its prefix is 8)`);
      return { type: FrameType.END, id, more, rowCount: u64(b, s), summary: b.subarray(s + 8, e) };
    case FrameType.ERROR: {
      if (len < 6) fail("BAD_PAYLOAD", `ERROR payload of ${len} bytes (at least 6)`);
      const code = b.readUInt32LE(s);
      const n = b[s + 4] | (b[s + 5] << 8);
      if (6 + n > len) fail("BAD_PAYLOAD", "ERROR message runs past the payload");
      const message = utf8(b, s + 6, s + 6 + n, "ERROR message");
      const details = utf8(b, s + 6 + n, e, "ERROR details");
      return { type: FrameType.ERROR, id, more, code, message, details };
    }
    case FrameType.EVENT: {
      if (len < 2) fail("BAD_PAYLOAD", "EVENT payload too short for its topic length");
      const n = b[s] | (b[s + 1] << 8);
      if (2 + n > len) fail("BAD_PAYLOAD", "EVENT topic runs past the payload");
      if (n < 1 || n > 255) fail("BAD_PAYLOAD", `EVENT topic of ${n} bytes (1-255)`);
      const topic = utf8(b, s + 2, s + 2 + n, "EVENT topic");
      const data = utf8(b, s + 2 + n, e, "EVENT data");
      return { type: FrameType.EVENT, id, more, topic, data };
    }
    case FrameType.PING:
      exact(len, 8, "PING");
      return { type: FrameType.PING, id, more, nonce: b.subarray(s, e) };
    case FrameType.PONG:
      exact(len, 8, "PONG");
      return { type: FrameType.PONG, id, more, nonce: b.subarray(s, e) };
    case FrameType.DRAIN:
      exact(len, 4, "DRAIN");
      return { type: FrameType.DRAIN, id, more, graceMs: b.readUInt32LE(s) };
    case FrameType.GOODBYE:
      exact(len, 4, "GOODBYE");
      return { type: FrameType.GOODBYE, id, more, reason: b.readUInt32LE(s) };
    case FrameType.HELLO:
      return decodeHello(b, s, e, id, more);
    case FrameType.WELCOME: {
      if (len < 32) fail("BAD_PAYLOAD", `WELCOME payload of ${len} bytes (at least 32)`);
      const reserved = b[s + 2] | (b[s + 3] << 8);
      if (reserved !== 0) fail("RESERVED_NONZERO", "WELCOME reserved field");
      const maxFrameSize = b.readUInt32LE(s + 8);
      const initialCredit = b.readUInt32LE(s + 12);
      const maxInFlight = b.readUInt32LE(s + 20);
      const maxMessageSize = u64(b, s + 24);
      if (maxFrameSize < Limits.minMaxFrameSize || maxFrameSize > Limits.maxMaxFrameSize) {
        fail("BAD_HANDSHAKE", `WELCOME max_frame_size ${maxFrameSize} outside ${Limits.minMaxFrameSize}-${Limits.maxMaxFrameSize}`);
      }
      if (initialCredit < 1 || initialCredit > Limits.maxCredit) fail("BAD_HANDSHAKE", `WELCOME initial_credit ${initialCredit} outside 1-${Limits.maxCredit}`);
      if (maxInFlight < 1) fail("BAD_HANDSHAKE", "WELCOME max_in_flight 0");
      if (maxMessageSize < maxFrameSize) fail("BAD_HANDSHAKE", `WELCOME max_message_size ${maxMessageSize} below max_frame_size ${maxFrameSize}`);
      const welcome = {
        type: FrameType.WELCOME,
        id,
        more,
        version: b[s] | (b[s + 1] << 8),
        workerId: b.readUInt32LE(s + 4),
        maxFrameSize,
        initialCredit,
        heartbeatMs: b.readUInt32LE(s + 16),
        maxInFlight,
        maxMessageSize,
      } as const;
      // Bytes from offset 32: the extension block (20.1), kept for a reader that knows it.
      return len > 32 ? { ...welcome, extensions: b.subarray(s + 32, e) } : welcome;
    }
  }
  // The header check admits only the types above.
  throw fail("UNKNOWN_FRAME_TYPE", `frame type ${type}`);
}

function decodeRows(b: Buffer, s: number, e: number, id: number, more: boolean): Frame {
  const len = e - s;
  if (len < 4) fail("BAD_PAYLOAD", `ROWS payload of ${len} bytes (at least 4)`);
  const count = b.readUInt32LE(s);
  // Bound the count by the payload before reserving anything per row.
  if (count === 0 || count > (len - 4) >>> 2) fail("ROW_BOUNDS", `ROWS count ${count} in a payload of ${len} bytes`);
  // Offsets, not a Buffer per row: relative to the payload, so they fit a u32.
  const bounds = new Uint32Array(count * 2);
  let p = 4;
  for (let i = 0; i < count; i++) {
    if (p + 4 > len) fail("ROW_BOUNDS", `ROWS row ${i}'s length runs past the payload`);
    const q = s + p;
    const n = (b[q] | (b[q + 1] << 8) | (b[q + 2] << 16)) + b[q + 3] * 0x1000000;
    p += 4;
    if (n > len - p) fail("ROW_BOUNDS", `ROWS row ${i} of ${n} bytes runs past the payload`);
    bounds[2 * i] = p;
    bounds[2 * i + 1] = p += n;
  }
  if (p !== len) fail("ROW_BOUNDS", `${len - p} bytes left over after ${count} rows`);
  return new DecodedRows(id, more, b.subarray(s, e), bounds, count, len);
}

function decodeHello(b: Buffer, s: number, e: number, id: number, more: boolean): Frame {
  const len = e - s;
  // The magic first, against whatever bytes exist (a HELLO shorter than 8 bytes is BAD_MAGIC).
  if (len < 8 || b.compare(MAGIC_BYTES, 0, 8, s, s + 8) !== 0) fail("BAD_MAGIC", "HELLO does not start with WIREPOOL");
  if (len < 24) fail("BAD_PAYLOAD", `HELLO payload of ${len} bytes (its fixed part is 24)`);
  const minVersion = b.readUInt16LE(s + 8);
  const maxVersion = b.readUInt16LE(s + 10);
  const pid = b.readUInt32LE(s + 12);
  const maxConcurrency = b.readUInt32LE(s + 16);
  const maxFrameSize = b.readUInt32LE(s + 20);
  if (minVersion < 1 || minVersion > maxVersion) fail("BAD_HANDSHAKE", `HELLO versions ${minVersion}-${maxVersion}`);
  if (maxConcurrency < 1) fail("BAD_HANDSHAKE", "HELLO max_concurrency 0");
  if (maxFrameSize < Limits.minMaxFrameSize || maxFrameSize > Limits.maxMaxFrameSize) {
    fail("BAD_HANDSHAKE", `HELLO max_frame_size ${maxFrameSize} outside ${Limits.minMaxFrameSize}-${Limits.maxMaxFrameSize}`);
  }
  let p = s + 24;
  const str = (lo: number, hi: number, what: string): string => {
    if (p + 2 > e) fail("BAD_PAYLOAD", `HELLO ${what} length runs past the payload`);
    const n = b[p] | (b[p + 1] << 8);
    p += 2;
    if (n > e - p) fail("BAD_PAYLOAD", `HELLO ${what} runs past the payload`);
    if (n < lo || n > hi) fail("BAD_HANDSHAKE", `HELLO ${what} of ${n} bytes (${lo}-${hi})`);
    const v = utf8(b, p, p + n, `HELLO ${what}`);
    p += n;
    return v;
  };
  const sdkName = str(Limits.sdkNameBytes[0], Limits.sdkNameBytes[1], "sdk_name");
  const sdkVersion = str(Limits.sdkVersionBytes[0], Limits.sdkVersionBytes[1], "sdk_version");
  if (p + 2 > e) fail("BAD_PAYLOAD", "HELLO method_count runs past the payload");
  const count = b[p] | (b[p + 1] << 8);
  p += 2;
  if (count > Limits.maxMethods) fail("BAD_HANDSHAKE", `HELLO method_count ${count} above ${Limits.maxMethods}`);
  const methods: MethodInfo[] = [];
  const names = new Set<string>();
  for (let i = 0; i < count; i++) {
    if (p + 1 > e) fail("BAD_PAYLOAD", `HELLO method ${i} runs past the payload`);
    const kind = b[p++];
    if (kind !== MethodKind.UNARY && kind !== MethodKind.STREAM) fail("BAD_HANDSHAKE", `HELLO method ${i} kind ${kind}`);
    if (p + 1 > e) fail("BAD_PAYLOAD", `HELLO method ${i} runs past the payload`);
    const ncodecs = b[p++];
    if (ncodecs < 1 || ncodecs > Limits.maxCodecsPerMethod) fail("BAD_HANDSHAKE", `HELLO method ${i} with ${ncodecs} codecs (1-${Limits.maxCodecsPerMethod})`);
    if (ncodecs > e - p) fail("BAD_PAYLOAD", `HELLO method ${i} codecs run past the payload`);
    const codecs: number[] = [];
    for (let j = 0; j < ncodecs; j++) {
      const c = b[p + j];
      if (codecs.includes(c)) fail("BAD_HANDSHAKE", `HELLO method ${i} lists codec ${c} twice`);
      codecs.push(c);
    }
    p += ncodecs;
    const name = str(Limits.methodNameBytes[0], Limits.methodNameBytes[1], `method ${i} name`);
    if (names.has(name)) fail("BAD_HANDSHAKE", `HELLO method name ${JSON.stringify(name)} twice`);
    names.add(name);
    methods.push({ name, kind: kind as MethodKind, codecs });
  }
  // Trailing bytes are room for later versions and the extension block (20.1): a v1 reader
  // ignores them; they are kept (a view) for a reader that knows extensions.
  const hello = { type: FrameType.HELLO, id, more, minVersion, maxVersion, pid, maxConcurrency, maxFrameSize, sdkName, sdkVersion, methods } as const;
  return p < e ? { ...hello, extensions: b.subarray(p, e) } : hello;
}
