/**
 * The connection core (PROTOCOL.md sections 5, 6, 11.2, 12 and 14): the state machine of one
 * connection, for either role, with no socket, clock or handler.
 * @module
 */

import { isAscii } from "node:buffer";
import {
  ErrorCode,
  FLAG_MORE,
  FrameType,
  HEADER_SIZE,
  AdaptiveCredit,
  Limits,
  MethodKind,
  PROTOCOL_VERSION,
  ShmFrameType,
} from "./constants.js";
import { decodePayload, FrameDecoder } from "./decoder.js";
import { errorName, ProtocolError } from "./errors.js";
import { IdTable } from "./idtable.js";
import { fitErrorBytes, grant, streamWindow } from "./policies.js";
import { encodeShmFrame, ShmAccept, ShmOffer } from "./shm.js";
import {
  COPY_LIMIT,
  encodeFrame,
  type CancelFrame,
  type CreditFrame,
  type DrainFrame,
  type EndFrame,
  type ErrorFrame,
  type Frame,
  type FrameInit,
  FrameWriter,
  type GoodbyeFrame,
  type HelloFrame,
  MAX_ID,
  type NotificationFrame,
  payloadLength,
  type PingFrame,
  type PongFrame,
  type RequestFrame,
  type ResultFrame,
  type RowsFrame,
  type WelcomeFrame,
} from "./frames.js";

/** Which side of the connection a core is. */
export type Role = "parent" | "worker";

/** Codes of the two events that are not frames (they live above the u8 frame type range). */
export const EventType = {
  /** A frame for a request that has ended: ignored (the normal race with CANCEL). */
  LATE: 0x100,
  /** Worker: a request refused without running it; answer it with `sendError(id, code)`. */
  REJECT: 0x101,
} as const;

/** A frame for a finished request (section 8), reported and otherwise ignored. */
export interface LateEvent {
  readonly type: typeof EventType.LATE;
  readonly id: number;
  /** The late frame's type. */
  readonly frame: FrameType;
}

/**
 * Worker: a complete REQUEST the core refused (DRAINING, UNKNOWN_METHOD, CODEC_UNSUPPORTED,
 * OVERLOADED, in that order), or a half-received one abandoned by CANCEL (CANCELLED). The
 * request counts as ended; the driver answers with `sendError(id, code, message)`.
 */
export interface RejectEvent {
  readonly type: typeof EventType.REJECT;
  readonly id: number;
  readonly code: number;
  readonly name: string;
}

/**
 * What a core reports (section 14.2): the received frames (continued messages reassembled into
 * one, CONTINUATION never reported; `more` is always false), plus {@link LateEvent} and
 * {@link RejectEvent}. The parent core reports HELLO, RESULT, ERROR, ROWS, END, EVENT (a
 * Notification), PING, PONG, GOODBYE and LATE; the worker core WELCOME, REQUEST (accepted only),
 * REJECT, CANCEL, CREDIT, ERROR (id 0), PING, PONG, DRAIN and LATE.
 */
export type ConnectionEvent =
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
  | LateEvent
  | RejectEvent;

/** HELLO's fields, for {@link Connection.sendHello}. */
export type HelloInit = Omit<HelloFrame, "type" | "id" | "more">;
/** WELCOME's fields, for {@link Connection.sendWelcome}. */
export type WelcomeInit = Omit<WelcomeFrame, "type" | "id" | "more">;

const HALF_U32 = 0x1_0000_0000;

/**
 * The shm extension in a WELCOME against its HELLO (20.1, 20.2): an acceptance of a lane the
 * HELLO did not offer, or a `to_worker_window` above the offer, is `BAD_HANDSHAKE` (a worker
 * refuses such a WELCOME; a parent's core refuses to send it).
 */
function checkShmAccept(w: WelcomeFrame, h: HelloFrame): void {
  const accept = w.extensions ? ShmAccept.fromTrailing(w.extensions) : null;
  if (accept !== null) accept.check(h.extensions ? ShmOffer.fromTrailing(h.extensions) : null);
}

/** One request in flight, as this side counts it. */
class InFlight {
  /** Parent: rows received; worker: rows sent. */
  rows = 0;
  /** Parent: bytes of ROWS payload consumed since the last grant. */
  consumed = 0;
  /** Parent: the adaptive window (section 6), initialCredit at first. */
  window: number;
  /** Parent: the driver's clock at the last grant, microseconds (-1: nothing read yet). */
  clock = -1;
  constructor(
    readonly kind: MethodKind,
    /** Stream credit in bytes (section 6); 0 and unused for unary requests. */
    public credit: number,
  ) {
    this.window = credit;
  }
}

/**
 * Every unary request shares this one record: only streams keep counters, and every counter
 * update checks the kind first. One allocation less per call.
 */
const UNARY = new InFlight(MethodKind.UNARY, 0);

/** An inbound continued message being reassembled (section 5). */
interface Inbound {
  readonly first: RequestFrame | ResultFrame | EndFrame;
  /**
   * The body or summary so far: full blocks, then `last[0..lastLen)`. Blocks (64 KiB, then as
   * large as the message so far) are filled in place and never regrown: a message refused at
   * max_message_size holds about that much, not a doubled buffer plus the one it outgrew; many
   * tiny frames share a block.
   */
  blocks: Buffer[];
  last: Buffer;
  lastLen: number;
  /** A CONTINUATION of it arrived (then no SHM_BODY may end it, 20.3). */
  continued?: boolean;
  len: number;
  /** Sum of the payload lengths received, prefix included: what max_message_size bounds. */
  size: number;
}

/** An outbound continued message being written (section 5). */
interface Outbound {
  readonly type: number;
  /** The body still to send (typed operations), or null (frames given one by one to `send`). */
  readonly body: Uint8Array | null;
  offset: number;
  /** What the message counts against max_message_size: its whole size, or what was sent so far. */
  size: number;
}

/**
 * A message being written one frame at a time ({@link Connection.beginRequest},
 * {@link Connection.beginResult}, {@link Connection.beginEnd}): pass it to
 * {@link Connection.sendNextFrame} until that returns true.
 */
export class MessageCursor {
  /** @internal */
  constructor(
    /** The request id the message belongs to. */
    readonly id: number,
    /** The message's frame type (REQUEST, RESULT or END). */
    readonly type: number,
  ) {}
}

function refuse(name: keyof typeof ErrorCode, message: string): never {
  throw ProtocolError.of(name, message);
}

function utf8Len(s: string): number {
  return Buffer.byteLength(s, "utf8");
}

/**
 * The sans-IO connection core, one per connection: bytes in, events out; sends checked against
 * the protocol and encoded into an output the driver writes. It owns everything the protocol
 * decides (section 14.1): framing, the check order, ids, per-request state, credit and its grant
 * policy, continuation, limits. The driver owns the socket, clocks, handlers and codecs.
 *
 * Receiving: `receive(bytes)` then `nextEvent()` until null; `endOfInput()` at EOF. A protocol
 * violation is thrown as a {@link ProtocolError} and fails the core for good; the driver then
 * calls `sendFatal(error)`, writes the output and closes.
 *
 * Sending: every `send*` operation checks, records the state change and appends the encoded
 * frames to the output; `takeOutput()` hands them over for one write. A refused send throws a
 * ProtocolError, writes nothing and changes nothing (section 14.3). PING and PONG jump the queue
 * (8.5): they are taken ahead of the frames already waiting; a driver hands a large output over
 * a few whole frames at a time with `takeOutput(max)`, so a PING or PONG is never behind a whole
 * message.
 *
 * @example A parent's read loop and a call:
 * ```ts
 * const conn = new Connection("parent");
 * socket.on("data", (chunk) => {
 *   conn.receive(chunk);
 *   for (let ev; (ev = conn.nextEvent()); ) {
 *     switch (ev.type) {
 *       case FrameType.HELLO: conn.sendWelcome({ version: 1, workerId: 1, maxFrameSize: 4 << 20,
 *         initialCredit: 1 << 20, heartbeatMs: 1000, maxInFlight: 64, maxMessageSize: 1 << 30 }); break;
 *       case FrameType.RESULT: resolve(ev.id, ev.body); break;
 *       case FrameType.PING: conn.sendPong(ev.nonce); break;
 *     }
 *   }
 *   socket.write(Buffer.concat(conn.takeOutput()));
 * });
 * const id = conn.sendRequest(0, CodecId.JSON, 0, Buffer.from('{"n":1}'));
 * ```
 */
export class Connection {
  private readonly _role: Role;
  private readonly decoder = new FrameDecoder(Limits.handshakeMaxFrameSize);
  private readonly out = new FrameWriter();
  /** PING and PONG, ahead of everything in `out` (PROTOCOL.md 8.5); made on first use. */
  private urgent: FrameWriter | null = null;
  private urgentBytes = 0;
  private _hello: HelloFrame | null = null;
  private _welcome: WelcomeFrame | null = null;
  private open = false;
  /** The highest REQUEST id sent (parent) or received (worker). */
  private highest = 0;
  private readonly requests = new IdTable<InFlight>();
  /** Parent: the smallest PING round trip the driver observed, microseconds (0: none). */
  private minRttUs = 0;
  /** Parent: section 6's caps on the adaptive windows. */
  private maxStreamWindow: number = AdaptiveCredit.maxStreamWindow;
  private maxConnectionWindow: number = AdaptiveCredit.maxConnectionWindow;
  /** Worker: ids refused with REJECT whose ERROR answer has not been sent yet. */
  private readonly rejected = new Set<number>();
  private readonly inbound = new Map<number, Inbound>();
  private inboundSize = 0;
  private readonly outbound = new Map<number, Outbound>();
  private outboundSize = 0;
  private draining = false;
  /** Parent: GOODBYE received; worker: GOODBYE sent. */
  private goodbye = false;
  /** An ERROR with id 0 was sent: nothing may follow it. */
  private fatalSent = false;
  private _failure: ProtocolError | null = null;
  private readonly scratch = new FrameWriter(4096);

  /** A core for `role`; before the handshake its receive limit is 65,536 bytes. */
  constructor(role: Role) {
    if (role !== "parent" && role !== "worker") throw new TypeError(`role must be "parent" or "worker", not ${String(role)}`);
    this._role = role;
  }

  // ---------------------------------------------------------------------------------------------
  // Receiving (section 14.2)

  /**
   * Appends received bytes. The core keeps a large chunk as it is rather than copying it, so the
   * caller must not modify `bytes` afterwards (Node's socket chunks are never reused).
   */
  receive(bytes: Uint8Array): void {
    this.decoder.push(bytes);
  }

  /**
   * Zero-copy receive: room to read the socket into (at least `min` bytes, and room for the rest
   * of the current frame); then call {@link Connection.received} with the count read.
   */
  readBuffer(min?: number): Buffer {
    return this.decoder.readBuffer(min);
  }

  /** Records `n` bytes read into {@link Connection.readBuffer}'s space. */
  received(n: number): void {
    this.decoder.received(n);
  }

  /**
   * The next event, or null when more bytes are needed. Call it until null after each receive.
   * @throws ProtocolError on a protocol violation; the core is failed from then on and every
   * later call throws the same error.
   */
  nextEvent(): ConnectionEvent | null {
    if (this._failure !== null) throw this._failure;
    try {
      for (;;) {
        const frame = this.decoder.next();
        if (frame === null) return null;
        const ev = this.onFrame(frame, this.decoder.lastPayloadLength);
        if (ev !== null) return ev;
      }
    } catch (e) {
      if (e instanceof ProtocolError) this.failWith(e);
      throw e;
    }
  }

  /**
   * A SHM_BODY of request `id` (PROTOCOL.md 20.3), which the driver took out of the byte stream
   * after handing the core every byte before it and taking every event: the last part of the
   * message whose first frame (REQUEST, RESULT or END with MORE and exactly its prefix) is in
   * progress. In the order of 20.5: the continuation rule (`BAD_ID` for id 0, `CONTINUATION` with
   * no such message or after a body byte or CONTINUATION of it), then `body()` (the driver's
   * bounds check and view, `SHM_BOUNDS`), then `max_message_size` (the prefix plus `length`;
   * `length` does not count toward the sum of messages in progress, section 5). Returns the
   * complete message's event; a violation fails the core, as in `nextEvent`.
   */
  receiveShmBody(id: number, length: bigint, body: () => Buffer): ConnectionEvent {
    if (this._failure !== null) throw this._failure;
    try {
      if (!this.open || this._welcome === null) refuse("UNEXPECTED_FRAME", "SHM_BODY before WELCOME");
      if (id === 0) refuse("BAD_ID", "SHM_BODY with id 0");
      const p = this.inbound.size === 0 ? undefined : this.inbound.get(id);
      if (p === undefined) refuse("CONTINUATION", `SHM_BODY for id ${id} with no message in progress`);
      if (p.len !== 0 || p.continued) refuse("CONTINUATION", `SHM_BODY for id ${id} after a body byte or CONTINUATION of it`);
      const view = body();
      const limit = this._welcome.maxMessageSize;
      if (BigInt(p.size) + length > BigInt(limit)) {
        refuse("MESSAGE_TOO_LARGE", `a message of ${BigInt(p.size) + length} bytes through the lane, above max_message_size ${limit}`);
      }
      this.dropInbound(id, p);
      const f = p.first;
      if (f.type === FrameType.REQUEST) return this.accept({ ...f, more: false, body: view });
      this.requests.delete(id);
      if (f.type === FrameType.RESULT) return { ...f, more: false, body: view };
      return { ...f, more: false, summary: view };
    } catch (e) {
      if (e instanceof ProtocolError) this.failWith(e);
      throw e;
    }
  }

  /** The core is failed from now on; the messages in progress and the decoder's buffer go. */
  private failWith(e: ProtocolError): void {
    this._failure = e;
    this.inbound.clear();
    this.inboundSize = 0;
    this.decoder.fail(e);
  }

  /** Appends every event available now to `out`; returns how many (a batch fast path, 14.4). */
  nextEvents(out: ConnectionEvent[]): number {
    let n = 0;
    for (let ev = this.nextEvent(); ev !== null; ev = this.nextEvent()) {
      out.push(ev);
      n++;
    }
    return n;
  }

  /**
   * Parent: takes every complete single-frame RESULT of a unary request in flight at the front of
   * the received bytes, appending its id to `ids` and its body (a view) to `bodies`; stops at
   * anything else, which {@link Connection.nextEvent} then reports. The same checks and state
   * changes as `nextEvent`, without an event object per result (a batch fast path, 14.4).
   * @returns how many results were taken.
   */
  takeResults(ids: number[], bodies: Buffer[]): number {
    if (this._failure !== null) throw this._failure;
    if (this._role !== "parent" || !this.open || this.goodbye) return 0;
    const dec = this.decoder;
    let n = 0;
    while (dec.peekType() === FrameType.RESULT) {
      const id = dec.peekId();
      // Anything the general path would report differently (UNKNOWN_ID, CONTINUATION, LATE,
      // KIND_MISMATCH) is left to it.
      if (id > this.highest || (this.inbound.size !== 0 && this.inbound.has(id))) break;
      const req = this.requests.get(id);
      if (req === undefined || req.kind !== MethodKind.UNARY) break;
      this.requests.delete(id);
      ids.push(id);
      bodies.push(dec.takePayload());
      n++;
    }
    return n;
  }

  /**
   * The peer closed the stream. Between frames that is fine, even with messages in progress
   * (the driver ends what is in flight: {@link Connection.inFlightIds}).
   * @throws ProtocolError `TRUNCATED` inside a frame.
   */
  endOfInput(): void {
    if (this._failure !== null) throw this._failure;
    try {
      this.decoder.end();
    } catch (e) {
      if (e instanceof ProtocolError) this.failWith(e);
      throw e;
    }
  }

  /** Bytes of a frame that has started but not finished: the driver's frame clock reads it (8.5). */
  incompleteFrameLen(): number {
    return this.decoder.incompleteFrameLen();
  }

  private onFrame(f: Frame, size: number): ConnectionEvent | null {
    const t = f.type;
    const id = f.id;
    // 1. ERROR with id 0: a refusal or a fatal report, in any state.
    if (t === FrameType.ERROR && id === 0) return f;
    // 2-3. Handshake phase and direction.
    if (this._role === "parent") {
      if (this._hello === null) {
        if (t !== FrameType.HELLO) refuse("UNEXPECTED_FRAME", `${typeName(t)} before HELLO`);
        if (f.minVersion > PROTOCOL_VERSION || f.maxVersion < PROTOCOL_VERSION) {
          refuse("VERSION_MISMATCH", `the worker speaks versions ${f.minVersion}-${f.maxVersion}, this parent ${PROTOCOL_VERSION}`);
        }
        this._hello = f;
        return f;
      }
      if (!this.open) refuse("UNEXPECTED_FRAME", `${typeName(t)} before WELCOME was sent`);
      if (this.goodbye) refuse("UNEXPECTED_FRAME", `${typeName(t)} after GOODBYE`);
      if (!PARENT_RECEIVES[t]) refuse("UNEXPECTED_FRAME", `${typeName(t)} sent to the parent`);
    } else {
      if (this._welcome === null) {
        if (this._hello === null || t !== FrameType.WELCOME) refuse("UNEXPECTED_FRAME", `${typeName(t)} before WELCOME`);
        const h = this._hello;
        if (f.version < h.minVersion || f.version > h.maxVersion) {
          refuse("VERSION_MISMATCH", `WELCOME version ${f.version} outside this worker's ${h.minVersion}-${h.maxVersion}`);
        }
        if (f.maxFrameSize > h.maxFrameSize) refuse("BAD_HANDSHAKE", `WELCOME max_frame_size ${f.maxFrameSize} above the HELLO's ${h.maxFrameSize}`);
        if (f.maxInFlight > h.maxConcurrency) refuse("BAD_HANDSHAKE", `WELCOME max_in_flight ${f.maxInFlight} above the HELLO's max_concurrency ${h.maxConcurrency}`);
        checkShmAccept(f, h);
        this._welcome = f;
        this.open = true;
        this.decoder.maxFrameSize = f.maxFrameSize;
        return f;
      }
      if (!WORKER_RECEIVES[t]) {
        refuse("UNEXPECTED_FRAME", t === FrameType.ERROR ? "ERROR from the parent with a request id" : `${typeName(t)} sent to the worker`);
      }
    }
    // 4. Connection-level frames.
    if (id === 0) {
      if (t === FrameType.DRAIN) this.draining = true;
      else if (t === FrameType.GOODBYE) this.goodbye = true;
      return f as ConnectionEvent; // never a CONTINUATION: that carries a request id
    }
    // 5. Id.
    if (t === FrameType.REQUEST) {
      if (id <= this.highest) refuse("DUPLICATE_ID", `REQUEST id ${id} not above ${this.highest}`);
      this.highest = id;
      if (f.more) {
        this.startInbound(f, size);
        return null;
      }
      return this.accept(f);
    }
    if (id > this.highest) refuse("UNKNOWN_ID", `${typeName(t)} for id ${id}, above every request (${this.highest})`);
    // 6. Continuation.
    const partial = this.inbound.size === 0 ? undefined : this.inbound.get(id);
    if (partial !== undefined) {
      if (t === FrameType.CONTINUATION) return this.continueInbound(partial, f.body, f.more, size);
      if (this._role === "worker" && t === FrameType.CANCEL) {
        this.dropInbound(id, partial);
        return this.reject(id, ErrorCode.CANCELLED);
      }
      if (this._role === "parent" && t === FrameType.ERROR) {
        this.dropInbound(id, partial);
        this.requests.delete(id);
        return f;
      }
      refuse("CONTINUATION", `${typeName(t)} for id ${id} while its message is in progress`);
    }
    if (t === FrameType.CONTINUATION) refuse("CONTINUATION", `CONTINUATION for id ${id} with no message in progress`);
    // 7. Late.
    const req = this.requests.get(id);
    if (req === undefined) return { type: EventType.LATE, id, frame: t };
    // 8-9. Kind and counters.
    if (this._role === "worker") {
      if (t === FrameType.CREDIT) {
        if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `CREDIT for unary request ${id}`);
        if (req.credit + f.bytes > Limits.maxCredit) refuse("CREDIT_OVERFLOW", `credit ${req.credit} + ${f.bytes} above ${Limits.maxCredit}`);
        req.credit += f.bytes;
      }
      return f; // CANCEL or CREDIT
    }
    switch (t) {
      case FrameType.ROWS:
        if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `ROWS for unary request ${id}`);
        if (req.credit <= 0) refuse("FLOW_CONTROL", `ROWS for request ${id} while its credit is ${req.credit}`);
        req.credit -= size;
        req.rows += f.count;
        return f;
      case FrameType.END:
        if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `END for unary request ${id}`);
        if (f.rowCount !== req.rows) refuse("ROW_COUNT_MISMATCH", `END says ${f.rowCount} rows, ${req.rows} arrived`);
        if (f.more) {
          this.startInbound(f, size);
          return null;
        }
        this.requests.delete(id);
        return f;
      case FrameType.RESULT:
        if (req.kind !== MethodKind.UNARY) refuse("KIND_MISMATCH", `RESULT for stream ${id}`);
        if (f.more) {
          this.startInbound(f, size);
          return null;
        }
        this.requests.delete(id);
        return f;
      case FrameType.ERROR:
        this.requests.delete(id);
        return f;
      default:
        return f; // EVENT with a request id
    }
  }

  private startInbound(first: RequestFrame | ResultFrame | EndFrame, size: number): void {
    const chunk = first.type === FrameType.END ? first.summary : first.body;
    const p: Inbound = { first, blocks: [], last: EMPTY, lastLen: 0, len: 0, size };
    appendInbound(p, chunk);
    this.inbound.set(first.id, p);
    this.inboundSize += size;
    this.checkInboundSum();
  }

  private checkInboundSum(): void {
    // Memory held for the peer is bounded per connection (section 5), not only per message.
    const limit = this._welcome!.maxMessageSize;
    if (this.inboundSize > limit) refuse("MESSAGE_TOO_LARGE", `messages in progress hold ${this.inboundSize} bytes, above max_message_size ${limit}`);
  }

  private dropInbound(id: number, p: Inbound): void {
    this.inbound.delete(id);
    this.inboundSize -= p.size;
  }

  private continueInbound(p: Inbound, chunk: Buffer, more: boolean, size: number): ConnectionEvent | null {
    p.continued = true;
    const limit = this._welcome!.maxMessageSize;
    p.size += size;
    this.inboundSize += size;
    if (p.size > limit) refuse("MESSAGE_TOO_LARGE", `a continued message of ${p.size} bytes, above max_message_size ${limit}`);
    this.checkInboundSum();
    appendInbound(p, chunk);
    if (more) return null;
    const id = p.first.id;
    this.dropInbound(id, p);
    const tail = p.last.subarray(0, p.lastLen);
    // One piece (a large frame then empty continuations) is the message as it is: no copy.
    const whole = p.blocks.length === 0 ? tail : p.blocks.length === 1 && p.lastLen === 0 ? p.blocks[0] : Buffer.concat([...p.blocks, tail], p.len);
    const f = p.first;
    if (f.type === FrameType.REQUEST) return this.accept({ ...f, more: false, body: whole });
    this.requests.delete(id);
    if (f.type === FrameType.RESULT) return { ...f, more: false, body: whole };
    return { ...f, more: false, summary: whole };
  }

  /** Worker: the checks of 11.2 step 10 on a complete REQUEST. */
  private accept(f: RequestFrame): ConnectionEvent {
    const methods = this._hello!.methods;
    if (this.draining) return this.reject(f.id, ErrorCode.DRAINING);
    if (f.method >= methods.length) return this.reject(f.id, ErrorCode.UNKNOWN_METHOD);
    const m = methods[f.method];
    if (!m.codecs.includes(f.codec)) return this.reject(f.id, ErrorCode.CODEC_UNSUPPORTED);
    if (this.requests.size >= this._welcome!.maxInFlight) return this.reject(f.id, ErrorCode.OVERLOADED);
    this.requests.set(f.id, m.kind === MethodKind.STREAM ? new InFlight(MethodKind.STREAM, this._welcome!.initialCredit) : UNARY);
    return f;
  }

  private reject(id: number, code: number): RejectEvent {
    this.rejected.add(id);
    return { type: EventType.REJECT, id, code, name: errorName(code) };
  }

  // ---------------------------------------------------------------------------------------------
  // Sending (section 14.3)

  /**
   * The output for one write: whole frames, in order, except that PING and PONG jump the queue
   * (PROTOCOL.md 8.5): they come first, ahead of every other frame not yet taken, in the order
   * they were sent. The output always starts at a frame boundary, so that is never inside one.
   *
   * Without `max`: everything. With `max` (a large output handed over as the transport drains):
   * the PINGs and PONGs waiting, then whole frames while fewer than `max` bytes of them are taken
   * (the frame that reaches `max` is taken whole; none when `max` <= 0, so `takeOutput(0)` takes
   * only the PINGs and PONGs). A driver that writes only what this returns holds whole frames,
   * so what it takes later may be written at once, behind them.
   */
  takeOutput(max?: number): Buffer[] {
    if (this.urgentBytes === 0) return max === undefined ? this.out.take() : this.out.takeFrames(max);
    const parts = this.urgent!.take();
    this.urgentBytes = 0;
    for (const p of max === undefined ? this.out.take() : this.out.takeFrames(max)) parts.push(p);
    return parts;
  }

  /** Bytes written by sends and not yet taken. */
  outputLength(): number {
    return this.out.length + this.urgentBytes;
  }

  /** The largest payload this side may send now: 65,536 until the handshake, then the negotiated size. */
  private sendLimit(): number {
    return this.open ? this._welcome!.maxFrameSize : Limits.handshakeMaxFrameSize;
  }

  /** The checks every send shares: closed, handshake phase, direction (code 109). */
  private checkSend(t: number, id: number): void {
    if (this.fatalSent) refuse("UNEXPECTED_FRAME", "nothing can be sent after a fatal ERROR");
    if (this._failure !== null) refuse("UNEXPECTED_FRAME", `the connection failed (${this._failure.name}): only sendFatal is allowed`);
    const parent = this._role === "parent";
    if (this.goodbye) refuse("UNEXPECTED_FRAME", parent ? "the worker said GOODBYE" : "nothing can be sent after GOODBYE");
    if (!(parent ? PARENT_SENDS : WORKER_SENDS)[t]) refuse("UNEXPECTED_FRAME", `the ${this._role} cannot send ${typeName(t)}`);
    if (t === FrameType.ERROR && id === 0) return;
    if (parent && t === FrameType.ERROR) refuse("UNEXPECTED_FRAME", "the parent sends ERROR with id 0 only (a request is stopped with CANCEL)");
    if (!this.open) {
      if (parent && t === FrameType.WELCOME && this._hello !== null) return;
      if (!parent && t === FrameType.HELLO && this._hello === null) return;
      refuse("UNEXPECTED_FRAME", `${typeName(t)} before the handshake`);
    }
    if (t === FrameType.HELLO || t === FrameType.WELCOME) refuse("UNEXPECTED_FRAME", `a second ${typeName(t)}`);
  }

  /** A request-level send: the id is in flight, and not mid-message (except for `abandons`). */
  private inFlightFor(t: number, id: number): InFlight {
    const req = this.requests.get(id);
    if (req === undefined) refuse("UNKNOWN_ID", `${typeName(t)} for id ${id}, not in flight`);
    if (this.outbound.size !== 0 && this.outbound.has(id)) refuse("CONTINUATION", `${typeName(t)} for id ${id} while its message is being sent`);
    return req;
  }

  /** Validates a handshake frame by decoding what it encodes to (every 11.1 rule), then writes it. */
  private writeChecked(frame: FrameInit): void {
    const length = payloadLength(frame);
    const limit = this.sendLimit();
    if (length > limit) refuse("FRAME_TOO_LARGE", `${typeName(frame.type)} payload of ${length} bytes above max_frame_size ${limit}`);
    encodeFrame(this.scratch, frame);
    const bytes = this.scratch.takeOne();
    const probe = new FrameDecoder(limit);
    probe.push(bytes);
    probe.next(); // throws the spec's code for anything malformed
    this.out.bytes(bytes);
  }

  /**
   * Worker: sends HELLO, the worker's offer (section 4.1). Its fields are checked as a parent
   * would check them (BAD_HANDSHAKE, BAD_UTF8, ...).
   */
  sendHello(hello: HelloInit): void {
    this.checkSend(FrameType.HELLO, 0);
    const frame: HelloFrame = { type: FrameType.HELLO, id: 0, more: false, ...hello };
    this.writeChecked(frame);
    this._hello = frame;
  }

  /**
   * Parent: answers HELLO with WELCOME (section 4.2), checked against the HELLO; the connection is
   * then open with WELCOME's limits in both directions.
   */
  sendWelcome(welcome: WelcomeInit): void {
    this.checkSend(FrameType.WELCOME, 0);
    const h = this._hello!;
    const w: WelcomeFrame = { type: FrameType.WELCOME, id: 0, more: false, ...welcome };
    if (w.version !== PROTOCOL_VERSION || w.version < h.minVersion || w.version > h.maxVersion) {
      refuse("VERSION_MISMATCH", `version ${w.version}: this parent speaks ${PROTOCOL_VERSION}, the worker ${h.minVersion}-${h.maxVersion}`);
    }
    if (w.maxFrameSize > h.maxFrameSize) refuse("BAD_HANDSHAKE", `max_frame_size ${w.maxFrameSize} above the worker's ${h.maxFrameSize}`);
    if (w.maxInFlight > h.maxConcurrency) refuse("BAD_HANDSHAKE", `max_in_flight ${w.maxInFlight} above the worker's max_concurrency ${h.maxConcurrency}`);
    checkShmAccept(w, h);
    this.writeChecked(w);
    this._welcome = w;
    this.open = true;
    this.decoder.maxFrameSize = w.maxFrameSize;
  }

  /** Parent: refuses the HELLO (ERROR id 0, e.g. `CODEC_MISMATCH`); then close. */
  refuse(code: number, message: string): void {
    this.sendError(0, code, message);
  }

  /** Reports a fatal error (ERROR id 0 with its code); nothing can be sent after it. */
  sendFatal(error: { readonly code: number; readonly message: string }): void {
    this.sendError(0, error.code, error.message);
  }

  /**
   * Parent: sends a request and returns the id the core allocated (1, 2, 3, ...). A body larger
   * than one frame is split into CONTINUATION frames, written back to back.
   * @throws ProtocolError DRAINING, UNKNOWN_METHOD, OVERLOADED (see {@link Connection.canSendRequest}),
   * MESSAGE_TOO_LARGE, or UNEXPECTED_FRAME before the handshake.
   */
  sendRequest(method: number, codec: number, timeoutUs: number, body: Uint8Array): number {
    const id = this.startRequest(method, codec, timeoutUs, body);
    if (this.outbound.size !== 0 && this.outbound.has(id)) {
      const cursor = new MessageCursor(id, FrameType.REQUEST);
      while (!this.sendNextFrame(cursor));
    }
    return id;
  }

  /** Parent: one REQUEST per body, ids consecutive; returns the first id (a batch fast path, 14.4). */
  sendRequests(method: number, codec: number, bodies: readonly Uint8Array[], timeoutUs = 0): number {
    // Checked for the whole batch first, so that a refusal writes nothing.
    if (this.open && this._role === "parent") {
      const w = this._welcome!;
      if (this.requests.size + bodies.length > w.maxInFlight) {
        refuse("OVERLOADED", `${bodies.length} requests with ${this.requests.size} of ${w.maxInFlight} already in flight`);
      }
      for (const b of bodies) this.checkMessageSize("request body", 12 + b.length);
    }
    const first = this.highest + 1;
    for (const b of bodies) this.sendRequest(method, codec, timeoutUs, b);
    return first;
  }

  /**
   * Parent: starts a request whose frames the driver writes one at a time with
   * {@link Connection.sendNextFrame} (so other frames can go between the parts of a large one).
   * The first frame is written now; the request is in flight from here.
   */
  beginRequest(method: number, codec: number, timeoutUs: number, body: Uint8Array): MessageCursor {
    return new MessageCursor(this.startRequest(method, codec, timeoutUs, body), FrameType.REQUEST);
  }

  /** beginRequest without the cursor: writes the first frame, returns the id. */
  private startRequest(method: number, codec: number, timeoutUs: number, body: Uint8Array): number {
    this.checkSend(FrameType.REQUEST, 1);
    if (this.draining) refuse("DRAINING", "no REQUEST can be sent after DRAIN");
    const methods = this._hello!.methods;
    if (!(method >= 0 && method < methods.length)) refuse("UNKNOWN_METHOD", `method index ${method} not in the worker's HELLO (${methods.length} methods)`);
    if (!(codec >= 0 && codec <= 255 && Number.isInteger(codec))) refuse("BAD_PAYLOAD", `codec ${codec} is not a u8`);
    if (!(timeoutUs >= 0)) refuse("BAD_PAYLOAD", `timeout_us ${timeoutUs} is negative`);
    const w = this._welcome!;
    if (this.requests.size >= w.maxInFlight) refuse("OVERLOADED", `${this.requests.size} requests already in flight (max_in_flight ${w.maxInFlight})`);
    const total = 12 + body.length;
    this.checkMessageSize("request body", total);
    if (this.highest >= MAX_ID) refuse("PROTOCOL", "request ids exhausted");
    const id = this.highest + 1;
    const kind = methods[method].kind;
    this.highest = id;
    this.requests.set(id, kind === MethodKind.STREAM ? new InFlight(MethodKind.STREAM, w.initialCredit) : UNARY);
    const chunk = Math.min(body.length, w.maxFrameSize - 12);
    const more = chunk < body.length;
    this.out.header(FrameType.REQUEST, more ? FLAG_MORE : 0, id, 12 + chunk);
    const b = this.out.room(12);
    const p = this.out.pos;
    b.writeUInt16LE(method, p);
    b[p + 2] = codec;
    b[p + 3] = 0;
    this.out.pos = p + 4;
    this.out.u64(timeoutUs);
    this.out.bytes(more ? body.subarray(0, chunk) : body);
    if (more) this.startOutbound(id, FrameType.REQUEST, body, chunk, total);
    return id;
  }

  /**
   * Parent: sends a REQUEST whose body is a range the driver lent from one of its regions
   * (PROTOCOL.md 20.3): the first frame with MORE and its 12-byte prefix only, then SHM_BODY. The
   * same checks and state changes as `sendRequest` for a body of `range.length` bytes; the
   * window is the driver's (`ShmSender`). Returns the id.
   */
  sendRequestShm(method: number, codec: number, timeoutUs: number, range: { readonly region: number; readonly offset: number; readonly length: number }): number {
    this.checkSend(FrameType.REQUEST, 1);
    if (this.draining) refuse("DRAINING", "no REQUEST can be sent after DRAIN");
    const methods = this._hello!.methods;
    if (!(method >= 0 && method < methods.length)) refuse("UNKNOWN_METHOD", `method index ${method} not in the worker's HELLO (${methods.length} methods)`);
    if (!(codec >= 0 && codec <= 255 && Number.isInteger(codec))) refuse("BAD_PAYLOAD", `codec ${codec} is not a u8`);
    if (!(timeoutUs >= 0)) refuse("BAD_PAYLOAD", `timeout_us ${timeoutUs} is negative`);
    if (!(range.length >= 1)) refuse("BAD_PAYLOAD", "a body through the lane has at least 1 byte");
    const w = this._welcome!;
    if (this.requests.size >= w.maxInFlight) refuse("OVERLOADED", `${this.requests.size} requests already in flight (max_in_flight ${w.maxInFlight})`);
    this.checkMessageSize("request body", 12 + range.length);
    if (this.highest >= MAX_ID) refuse("PROTOCOL", "request ids exhausted");
    const id = this.highest + 1;
    this.highest = id;
    this.requests.set(id, methods[method].kind === MethodKind.STREAM ? new InFlight(MethodKind.STREAM, w.initialCredit) : UNARY);
    this.out.header(FrameType.REQUEST, FLAG_MORE, id, 12);
    const b = this.out.room(12);
    const p = this.out.pos;
    b.writeUInt16LE(method, p);
    b[p + 2] = codec;
    b[p + 3] = 0;
    this.out.pos = p + 4;
    this.out.u64(timeoutUs);
    this.out.bytes(encodeShmFrame({ type: ShmFrameType.SHM_BODY, id, region: range.region, offset: range.offset, length: range.length }));
    return id;
  }

  /** A message above max_message_size cannot be sent (8.1): nor can one past the in-progress sum. */
  private checkMessageSize(what: string, total: number): void {
    const limit = this.open ? this._welcome!.maxMessageSize : Limits.handshakeMaxFrameSize;
    if (total > limit) refuse("MESSAGE_TOO_LARGE", `the ${what} of ${total} bytes is above max_message_size ${limit}`);
  }

  private startOutbound(id: number, type: number, body: Uint8Array, offset: number, total: number): void {
    this.outbound.set(id, { type, body, offset, size: total });
    this.outboundSize += total;
  }

  /**
   * Writes the next frame of a message begun with `beginRequest`, `beginResult` or `beginEnd`.
   * @returns true when the message is complete (also when it was complete after its first frame).
   * @throws ProtocolError CONTINUATION when the message was abandoned (CANCEL, ERROR) or is done.
   */
  sendNextFrame(cursor: MessageCursor): boolean {
    const o = this.outbound.get(cursor.id);
    if (o === undefined) {
      // Complete after its first frame, or already finished: nothing more to write.
      return true;
    }
    if (o.type !== cursor.type || o.body === null) refuse("CONTINUATION", `no ${typeName(cursor.type)} of id ${cursor.id} is being sent`);
    this.checkSend(FrameType.CONTINUATION, cursor.id);
    const body = o.body;
    const n = Math.min(body.length - o.offset, this._welcome!.maxFrameSize);
    const end = o.offset + n;
    const more = end < body.length;
    this.out.header(FrameType.CONTINUATION, more ? FLAG_MORE : 0, cursor.id, n);
    this.out.bytes(body.subarray(o.offset, end));
    o.offset = end;
    if (more) return false;
    this.finishOutbound(cursor.id, o);
    return true;
  }

  private finishOutbound(id: number, o: Outbound): void {
    this.outbound.delete(id);
    this.outboundSize -= o.size;
    if (o.type !== FrameType.REQUEST) this.requests.delete(id); // a worker's terminal, sent whole
  }

  /** Parent: asks the worker to stop request `id`; it stays in flight until its terminal arrives. */
  sendCancel(id: number): void {
    this.checkSend(FrameType.CANCEL, id);
    if (!this.requests.has(id)) refuse("UNKNOWN_ID", `CANCEL for id ${id}, not in flight`);
    const o = this.outbound.get(id);
    if (o !== undefined) {
      // CANCEL abandons a request still being sent (section 5).
      this.outbound.delete(id);
      this.outboundSize -= o.size;
    }
    this.out.header(FrameType.CANCEL, 0, id, 0);
  }

  /**
   * Parent: the consumer has read (or dropped) `bytes` of stream `id`'s ROWS payload (use each
   * ROWS event's `payloadLength`). The core grants credit back once half the window is consumed
   * (sections 6 and 12.4) and writes the CREDIT.
   * The rule is {@link grant} (14.5). The bytes are counted even while the stream's REQUEST
   * is still being sent; nothing is granted until it is sent.
   * @returns the bytes granted now: 0 when no grant is due yet, or the stream has ended.
   */
  consumed(id: number, bytes: number): number {
    const req = this.requests.get(id);
    if (req === undefined || req.kind !== MethodKind.STREAM) return 0;
    if (this.fatalSent || this.goodbye || this._failure !== null) return 0;
    req.consumed += bytes;
    if (this.outbound.has(id)) return 0; // no CREDIT inside a REQUEST still being sent (14.3)
    const g = grant(req.window, req.credit, req.consumed);
    if (g <= 0) return 0;
    req.credit += g;
    req.consumed -= g;
    this.out.header(FrameType.CREDIT, 0, id, 4);
    this.out.u32(g);
    return g;
  }

  /**
   * Parent: the driver measured a PING's round trip (its send to its PONG, microseconds; 0
   * counts as 1). {@link Connection.consumedAt} adapts windows to the smallest seen: a PONG that
   * waited behind queued rows measures the queue, not the link.
   */
  observeRtt(rttUs: number): void {
    const rtt = Math.max(1, Math.floor(rttUs));
    if (this.minRttUs === 0 || rtt < this.minRttUs) this.minRttUs = rtt;
  }

  /** Parent: the caps of section 6 on the adaptive windows (defaults {@link AdaptiveCredit}); a window above a lowered cap stays until it shrinks. */
  setWindowCaps(maxStreamWindow: number, maxConnectionWindow: number): void {
    this.maxStreamWindow = maxStreamWindow;
    this.maxConnectionWindow = maxConnectionWindow;
  }

  /**
   * Parent: {@link Connection.consumed} with the driver's monotonic clock `nowUs`, adapting the
   * stream's window at each grant ({@link streamWindow}, section 6) from the time since its
   * previous grant (the first call starts its clock) and the round trip of
   * {@link Connection.observeRtt}: the grant is the consumed bytes plus the new window minus the
   * old (a capped rest waits). Without a round trip observed the window stays initialCredit.
   * @returns the bytes granted now (0: none due, or the stream has ended).
   */
  consumedAt(id: number, bytes: number, nowUs: number): number {
    const req = this.requests.get(id);
    if (req === undefined || req.kind !== MethodKind.STREAM) return 0;
    if (this.fatalSent || this.goodbye || this._failure !== null) return 0;
    req.consumed += bytes;
    if (req.clock < 0) req.clock = nowUs; // the first read starts the stream's clock
    if (this.outbound.has(id)) return 0;
    const old = req.window;
    if (grant(old, req.credit, req.consumed) <= 0) return 0;
    let total = 0;
    for (const other of this.requests.ids()) {
      const r = this.requests.get(other);
      if (r !== undefined && r.kind === MethodKind.STREAM) total += r.window;
    }
    // Rows the consumer has not read yet (window - credit - consumed): a consumer behind on what
    // arrived drains a backlog, which says nothing of the window; it never grows then.
    const behind = old - req.credit - req.consumed >= Math.floor(old / 4);
    const grown = streamWindow(old, this._welcome!.initialCredit, nowUs - req.clock, this.minRttUs, this.maxStreamWindow, Math.max(0, this.maxConnectionWindow - total));
    const fresh = behind ? Math.min(grown, old) : grown;
    const want = req.consumed + fresh - old; // >= 0: a halving takes at most the half consumed
    const g = Math.max(0, Math.min(want, Limits.maxCredit - req.credit));
    req.clock = nowUs;
    req.window = fresh;
    req.consumed = want - g; // a capped rest waits for the next call
    if (g <= 0) return 0;
    req.credit += g;
    this.out.header(FrameType.CREDIT, 0, id, 4);
    this.out.u32(g);
    return g;
  }

  /** Parent: an explicit grant of `bytes` of credit to stream `id` (prefer {@link Connection.consumed}). */
  sendCredit(id: number, bytes: number): void {
    this.checkSend(FrameType.CREDIT, id);
    const req = this.inFlightFor(FrameType.CREDIT, id);
    if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `CREDIT for unary request ${id}`);
    if (!(Number.isInteger(bytes) && bytes >= 1 && bytes < HALF_U32)) refuse("BAD_PAYLOAD", `CREDIT of ${bytes} bytes (1 to 2^32 - 1)`);
    if (req.credit + bytes > Limits.maxCredit) refuse("CREDIT_OVERFLOW", `credit ${req.credit} + ${bytes} above ${Limits.maxCredit}`);
    req.credit += bytes;
    this.out.header(FrameType.CREDIT, 0, id, 4);
    this.out.u32(bytes);
  }

  /** Parent: asks the worker to drain within `graceMs`; no REQUEST can be sent after it. */
  sendDrain(graceMs: number): void {
    this.checkSend(FrameType.DRAIN, 0);
    checkU32(graceMs, "grace_ms");
    this.draining = true;
    this.out.header(FrameType.DRAIN, 0, 0, 4);
    this.out.u32(graceMs);
  }

  /** Worker: ends unary request `id` with its result (split into frames when large). */
  sendResult(id: number, body: Uint8Array): void {
    if (this.startResult(id, body)) {
      const cursor = new MessageCursor(id, FrameType.RESULT);
      while (!this.sendNextFrame(cursor));
    }
  }

  /** Worker: one RESULT per `[id, body]` (a batch fast path, 14.4). */
  sendResults(pairs: Iterable<readonly [number, Uint8Array]>): void {
    for (const [id, body] of pairs) this.sendResult(id, body);
  }

  /** Worker: starts a result written one frame at a time (see {@link Connection.sendNextFrame}). */
  beginResult(id: number, body: Uint8Array): MessageCursor {
    this.startResult(id, body);
    return new MessageCursor(id, FrameType.RESULT);
  }

  /** beginResult without the cursor: true when frames remain to be sent. */
  private startResult(id: number, body: Uint8Array): boolean {
    this.checkSend(FrameType.RESULT, id);
    const req = this.inFlightFor(FrameType.RESULT, id);
    if (req.kind !== MethodKind.UNARY) refuse("KIND_MISMATCH", `RESULT for stream ${id}`);
    this.checkMessageSize("result", body.length);
    const chunk = Math.min(body.length, this._welcome!.maxFrameSize);
    const more = chunk < body.length;
    this.out.header(FrameType.RESULT, more ? FLAG_MORE : 0, id, chunk);
    this.out.bytes(more ? body.subarray(0, chunk) : body);
    if (more) this.startOutbound(id, FrameType.RESULT, body, chunk, body.length);
    else this.requests.delete(id);
    return more;
  }

  /** Worker: ends stream `id` with END; the core fills `row_count` with the rows it counted. */
  sendEnd(id: number, summary: Uint8Array = EMPTY): void {
    const c = this.beginEnd(id, summary);
    while (!this.sendNextFrame(c));
  }

  /** Worker: starts an END whose summary is written one frame at a time. */
  beginEnd(id: number, summary: Uint8Array = EMPTY): MessageCursor {
    this.checkSend(FrameType.END, id);
    const req = this.inFlightFor(FrameType.END, id);
    if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `END for unary request ${id}`);
    const total = 8 + summary.length;
    this.checkMessageSize("summary", total);
    const chunk = Math.min(summary.length, this._welcome!.maxFrameSize - 8);
    const more = chunk < summary.length;
    this.out.header(FrameType.END, more ? FLAG_MORE : 0, id, 8 + chunk);
    this.out.u64(req.rows);
    this.out.bytes(more ? summary.subarray(0, chunk) : summary);
    if (more) this.startOutbound(id, FrameType.END, summary, chunk, total);
    else this.requests.delete(id);
    return new MessageCursor(id, FrameType.END);
  }

  /**
   * Worker: a builder for ROWS frames of stream `id` (keep it for the stream's life: it reuses
   * its buffer). Append rows, then `finish()`: that writes the frame, charges the stream's credit
   * and counts the rows.
   * @throws ProtocolError UNKNOWN_ID, KIND_MISMATCH, UNEXPECTED_FRAME, as a ROWS send would.
   */
  rows(id: number): RowsBuilder {
    // Checked now for early feedback, and again by finish (the stream may end meanwhile).
    this.checkSend(FrameType.ROWS, id);
    const req = this.inFlightFor(FrameType.ROWS, id);
    if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `ROWS for unary request ${id}`);
    return new RowsBuilder(this, id, this.sendLimit());
  }

  /** @internal The builder's finish: every check of a ROWS send, then the frame is written. */
  finishRows(b: RowsBuilder, frame: Buffer, count: number): void {
    const id = b.id;
    this.checkSend(FrameType.ROWS, id);
    const req = this.inFlightFor(FrameType.ROWS, id);
    if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `ROWS for unary request ${id}`);
    if (count === 0) refuse("ROW_BOUNDS", "a ROWS frame needs at least one row");
    if (req.credit <= 0) refuse("FLOW_CONTROL", `ROWS for stream ${id} while its credit is ${req.credit}`);
    const length = frame.length - HEADER_SIZE;
    if (length > this.sendLimit()) refuse("FRAME_TOO_LARGE", `ROWS payload of ${length} bytes above max_frame_size ${this.sendLimit()}`);
    frame.writeUInt32LE(length, 0);
    frame[4] = FrameType.ROWS;
    frame[5] = 0;
    frame[6] = 0;
    frame[7] = 0;
    frame.writeUInt32LE(id % HALF_U32, 8);
    frame.writeUInt32LE(Math.floor(id / HALF_U32), 12);
    frame.writeUInt32LE(count, 16);
    this.out.bytes(frame);
    req.credit -= length;
    req.rows += count;
  }

  /**
   * Worker: ends request `id` with ERROR (its terminal, or the answer to a {@link RejectEvent});
   * id 0 is a fatal report, after which nothing can be sent. Parent: id 0 only. An error too
   * large for one frame keeps its code and is fitted by {@link fitError} (14.5): large details
   * become a short note, then the message is cut at a character boundary.
   */
  sendError(id: number, code: number, message = "", details = ""): void {
    if (id === 0) {
      if (this.fatalSent) refuse("UNEXPECTED_FRAME", "nothing can be sent after a fatal ERROR");
      if (this._role === "worker" && this.goodbye) refuse("UNEXPECTED_FRAME", "nothing can be sent after GOODBYE");
    } else {
      this.checkSend(FrameType.ERROR, id);
      if (!this.rejected.has(id) && !this.requests.has(id)) refuse("UNKNOWN_ID", `ERROR for id ${id}, not in flight`);
    }
    checkU32(code, "code");
    // The message and details that fit one frame (14.5's fit_error).
    const fitted = fitErrorBytes(message, details, this.sendLimit());
    const msg = fitted.message;
    const det = fitted.details;
    // State changes only now that nothing can refuse.
    if (id === 0) {
      this.fatalSent = true;
    } else {
      this.rejected.delete(id);
      const o = this.outbound.get(id);
      if (o !== undefined) {
        // ERROR abandons a result or summary still being sent (section 5).
        this.outbound.delete(id);
        this.outboundSize -= o.size;
      }
      this.requests.delete(id);
    }
    this.out.header(FrameType.ERROR, 0, id, 6 + msg.length + det.length);
    this.out.u32(code);
    this.out.u16(msg.length);
    this.out.bytes(msg);
    this.out.bytes(det);
  }

  /** Worker: a progress event (`id` 0 for the connection); coalesce them, about one per 10 ms. */
  sendEvent(id: number, topic: string, data = ""): void {
    this.checkSend(FrameType.EVENT, id);
    if (id !== 0) this.inFlightFor(FrameType.EVENT, id);
    const tl = utf8Len(topic);
    if (tl < Limits.eventTopicBytes[0] || tl > Limits.eventTopicBytes[1]) refuse("BAD_PAYLOAD", `EVENT topic of ${tl} bytes (1-255)`);
    const dl = utf8Len(data);
    const length = 2 + tl + dl;
    if (length > this.sendLimit()) refuse("FRAME_TOO_LARGE", `EVENT payload of ${length} bytes above max_frame_size ${this.sendLimit()}`);
    this.out.header(FrameType.EVENT, 0, id, length);
    this.out.u16(tl);
    this.out.utf8(topic, tl);
    this.out.utf8(data, dl);
  }

  /** Worker: GOODBYE, the last frame (reason: 0 drained, 2 leaving, 3 fatal). */
  sendGoodbye(reason: number): void {
    this.checkSend(FrameType.GOODBYE, 0);
    checkU32(reason, "reason");
    this.goodbye = true;
    this.out.header(FrameType.GOODBYE, 0, 0, 4);
    this.out.u32(reason);
  }

  /** Sends PING with an 8-byte nonce. */
  sendPing(nonce: Uint8Array): void {
    this.sendNonce(FrameType.PING, nonce);
  }

  /** Answers a PING with its nonce. */
  sendPong(nonce: Uint8Array): void {
    this.sendNonce(FrameType.PONG, nonce);
  }

  private sendNonce(t: number, nonce: Uint8Array): void {
    this.checkSend(t, 0);
    if (nonce.length !== Limits.nonceBytes) refuse("BAD_PAYLOAD", `a nonce of ${nonce.length} bytes (must be 8)`);
    const u = this.urgentOut();
    u.header(t, 0, 0, 8);
    u.bytes(nonce);
    this.urgentBytes += HEADER_SIZE + 8;
  }

  /** Where PING and PONG are written: ahead of the rest of the output (see takeOutput). */
  private urgentOut(): FrameWriter {
    return (this.urgent ??= new FrameWriter(256));
  }

  /**
   * Sends any single frame with every check of the typed operations, plus those only a frame
   * given whole can break (an explicit REQUEST id, END's row_count, a frame above
   * max_frame_size, MORE and CONTINUATION by hand). For tests, fuzzing and the vectors; drivers
   * use the typed operations.
   */
  send(frame: FrameInit): void {
    const t = frame.type;
    const id = frame.id;
    if (t === FrameType.HELLO) {
      const { type: _t, id: _i, more: _m, ...init } = frame;
      if (id !== 0 || frame.more) this.writeCheckedOnly(frame);
      return this.sendHello(init);
    }
    if (t === FrameType.WELCOME) {
      const { type: _t, id: _i, more: _m, ...init } = frame;
      if (id !== 0 || frame.more) this.writeCheckedOnly(frame);
      return this.sendWelcome(init);
    }
    this.checkSend(t, id);
    const length = payloadLength(frame);
    const limit = this.sendLimit();
    if (length > limit) refuse("FRAME_TOO_LARGE", `${typeName(t)} payload of ${length} bytes above max_frame_size ${limit}`);
    // Every 11.1 rule, by decoding what the frame encodes to.
    encodeFrame(this.scratch, frame);
    const bytes = this.scratch.takeOne();
    this.probe(bytes);
    const more = frame.more;
    let commit: () => void = () => {};
    switch (t) {
      case FrameType.REQUEST: {
        if (id <= this.highest) refuse("DUPLICATE_ID", `REQUEST id ${id} not above ${this.highest}`);
        if (this.draining) refuse("DRAINING", "no REQUEST can be sent after DRAIN");
        const methods = this._hello!.methods;
        if (frame.method >= methods.length) refuse("UNKNOWN_METHOD", `method index ${frame.method} not in the worker's HELLO`);
        const w = this._welcome!;
        if (this.requests.size >= w.maxInFlight) refuse("OVERLOADED", `${this.requests.size} requests already in flight`);
        if (more) this.checkOutboundStart(length);
        const kind = methods[frame.method].kind;
        commit = () => {
          this.highest = id;
          this.requests.set(id, kind === MethodKind.STREAM ? new InFlight(MethodKind.STREAM, w.initialCredit) : UNARY);
          if (more) this.startManualOutbound(id, t, length);
        };
        break;
      }
      case FrameType.CANCEL:
        if (!this.requests.has(id)) refuse("UNKNOWN_ID", `CANCEL for id ${id}, not in flight`);
        commit = () => {
          const o = this.outbound.get(id);
          if (o !== undefined) {
            this.outbound.delete(id);
            this.outboundSize -= o.size;
          }
        };
        break;
      case FrameType.CREDIT: {
        const req = this.inFlightFor(t, id);
        const n = (frame as CreditFrame).bytes;
        if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `CREDIT for unary request ${id}`);
        if (req.credit + n > Limits.maxCredit) refuse("CREDIT_OVERFLOW", `credit ${req.credit} + ${n} above ${Limits.maxCredit}`);
        commit = () => {
          req.credit += n;
        };
        break;
      }
      case FrameType.DRAIN:
        commit = () => {
          this.draining = true;
        };
        break;
      case FrameType.GOODBYE:
        commit = () => {
          this.goodbye = true;
        };
        break;
      case FrameType.CONTINUATION: {
        const o = this.outbound.get(id);
        if (o === undefined || o.body !== null) refuse("CONTINUATION", `CONTINUATION for id ${id} with no message of it being sent by frames`);
        const limitMsg = this._welcome!.maxMessageSize;
        if (o.size + length > limitMsg) refuse("MESSAGE_TOO_LARGE", `a continued message of ${o.size + length} bytes above max_message_size ${limitMsg}`);
        if (this.outboundSize + length > limitMsg) refuse("MESSAGE_TOO_LARGE", "messages in progress above max_message_size");
        commit = () => {
          o.size += length;
          this.outboundSize += length;
          if (!more) this.finishOutbound(id, o);
        };
        break;
      }
      case FrameType.RESULT: {
        const req = this.inFlightFor(t, id);
        if (req.kind !== MethodKind.UNARY) refuse("KIND_MISMATCH", `RESULT for stream ${id}`);
        if (more) this.checkOutboundStart(length);
        commit = () => {
          if (more) this.startManualOutbound(id, t, length);
          else this.requests.delete(id);
        };
        break;
      }
      case FrameType.END: {
        const req = this.inFlightFor(t, id);
        const f = frame as EndFrame;
        if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `END for unary request ${id}`);
        if (f.rowCount !== req.rows) refuse("ROW_COUNT_MISMATCH", `END says ${f.rowCount} rows, ${req.rows} were sent`);
        if (more) this.checkOutboundStart(length);
        commit = () => {
          if (more) this.startManualOutbound(id, t, length);
          else this.requests.delete(id);
        };
        break;
      }
      case FrameType.ROWS: {
        const req = this.inFlightFor(t, id);
        if (req.kind !== MethodKind.STREAM) refuse("KIND_MISMATCH", `ROWS for unary request ${id}`);
        if (req.credit <= 0) refuse("FLOW_CONTROL", `ROWS for stream ${id} while its credit is ${req.credit}`);
        const count = frame.rows.length;
        commit = () => {
          req.credit -= length;
          req.rows += count;
        };
        break;
      }
      case FrameType.ERROR: {
        const f = frame as ErrorFrame;
        return this.sendError(id, f.code, f.message, f.details);
      }
      case FrameType.EVENT:
        if (id !== 0) this.inFlightFor(t, id);
        break;
      default:
        break; // PING, PONG
    }
    commit();
    if (t === FrameType.PING || t === FrameType.PONG) {
      this.urgentOut().bytes(bytes);
      this.urgentBytes += bytes.length;
    } else {
      this.out.bytes(bytes);
    }
  }

  /** `send` of a HELLO/WELCOME with a wrong id or MORE: the decoder's own code for it. */
  private writeCheckedOnly(frame: FrameInit): void {
    encodeFrame(this.scratch, frame);
    this.probe(this.scratch.takeOne());
  }

  private probe(bytes: Buffer): void {
    const dec = new FrameDecoder(0xffffffff);
    dec.push(bytes);
    dec.next();
  }

  private checkOutboundStart(length: number): void {
    const limit = this._welcome!.maxMessageSize;
    if (this.outboundSize + length > limit) refuse("MESSAGE_TOO_LARGE", "messages in progress above max_message_size");
  }

  private startManualOutbound(id: number, type: number, length: number): void {
    this.outbound.set(id, { type, body: null, offset: 0, size: length });
    this.outboundSize += length;
  }

  // ---------------------------------------------------------------------------------------------
  // Queries (section 14.3)

  /** `parent` or `worker`. */
  role(): Role {
    return this._role;
  }

  /** The handshake is done and the connection has not failed, sent a fatal error or said GOODBYE. */
  isOpen(): boolean {
    return this.open && this._failure === null && !this.fatalSent && !this.goodbye;
  }

  /** The HELLO (received by a parent, sent by a worker), or null before it. */
  hello(): HelloFrame | null {
    return this._hello;
  }

  /** The WELCOME (sent by a parent, received by a worker), or null before it. */
  welcome(): WelcomeFrame | null {
    return this._welcome;
  }

  /** The current frame size limit, both directions: 65,536 until the handshake. */
  maxFrameSize(): number {
    return this.sendLimit();
  }

  /** Requests in flight (section 11.2, "Counting"). */
  inFlight(): number {
    return this.requests.size;
  }

  /** The ids of the requests in flight, in the order they started. */
  inFlightIds(): number[] {
    return this.requests.ids();
  }

  /** Whether request `id` is in flight. */
  isInFlight(id: number): boolean {
    return this.requests.has(id);
  }

  /** Parent: a REQUEST can be sent now (open, not draining, below max_in_flight). */
  canSendRequest(): boolean {
    return this._role === "parent" && this.isOpen() && !this.draining && this.requests.size < this._welcome!.maxInFlight;
  }

  /** Stream `id`'s credit as this side counts it, or 0 if it is not an open stream. */
  credit(id: number): number {
    const req = this.requests.get(id);
    return req !== undefined && req.kind === MethodKind.STREAM ? req.credit : 0;
  }

  /** Parent: stream `id`'s window, the credit kept outstanding for it (initialCredit unless {@link Connection.consumedAt} adapted it, section 6), or 0 if it is not an open stream. */
  window(id: number): number {
    const req = this.requests.get(id);
    return req !== undefined && req.kind === MethodKind.STREAM ? req.window : 0;
  }

  /** Worker: a ROWS frame can be sent for stream `id` now (its credit is positive). */
  canSendRows(id: number): boolean {
    const req = this.requests.get(id);
    return this._role === "worker" && this.isOpen() && req !== undefined && req.kind === MethodKind.STREAM && req.credit > 0 && !this.outbound.has(id);
  }

  /** Parent: DRAIN was sent; worker: DRAIN was received. */
  isDraining(): boolean {
    return this.draining;
  }

  /** Parent: GOODBYE was received; worker: GOODBYE was sent. */
  isGoodbye(): boolean {
    return this.goodbye;
  }

  /** The protocol error that failed the core, or null. */
  failure(): ProtocolError | null {
    return this._failure;
  }
}

/**
 * One ROWS frame being filled (section 10.8), from {@link Connection.rows}. Rows are copied into
 * the frame as they are appended; the header and count are written by `finish`.
 *
 * @example
 * ```ts
 * const b = conn.rows(id);
 * for (const row of rows) if (!b.append(row)) { b.finish(); b.append(row); }
 * if (b.count > 0) b.finish();
 * socket.write(Buffer.concat(conn.takeOutput()));
 * ```
 */
export class RowsBuilder {
  private buf: Buffer;
  private pos = HEADER_SIZE + 4;
  private n = 0;

  /** @internal */
  constructor(
    private readonly conn: Connection,
    /** The stream's request id. */
    readonly id: number,
    /** The largest payload a frame may carry. */
    readonly maxPayload: number,
  ) {
    this.buf = Buffer.allocUnsafe(4096);
  }

  /** Rows appended since the last finish. */
  get count(): number {
    return this.n;
  }

  /** The payload size so far: what the frame will charge against the stream's credit. */
  get payloadLength(): number {
    return this.pos - HEADER_SIZE;
  }

  /**
   * Appends a row.
   * @returns false, appending nothing, when the row does not fit in this frame: finish it and
   * append the row to the next one.
   * @throws ProtocolError ROW_TOO_LARGE when the row cannot fit in any ROWS frame.
   */
  append(row: Uint8Array): boolean {
    const need = 4 + row.length;
    if (4 + need > this.maxPayload) refuse("ROW_TOO_LARGE", `a row of ${row.length} bytes cannot fit in a ROWS frame of at most ${this.maxPayload} bytes`);
    if (this.pos - HEADER_SIZE + need > this.maxPayload) return false;
    if (this.pos + need > this.buf.length) {
      const next = Buffer.allocUnsafe(Math.min(HEADER_SIZE + this.maxPayload, Math.max(this.buf.length * 2, this.pos + need)));
      this.buf.copy(next, 0, 0, this.pos);
      this.buf = next;
    }
    this.buf.writeUInt32LE(row.length, this.pos);
    this.buf.set(row, this.pos + 4);
    this.pos += need;
    this.n++;
    return true;
  }

  /**
   * Appends a row given as text, written as UTF-8 straight into the frame (no Buffer per row):
   * the same as `append(Buffer.from(text, "utf8"))`.
   * @returns false, appending nothing, when the row does not fit in this frame.
   * @throws ProtocolError ROW_TOO_LARGE when the row cannot fit in any ROWS frame.
   */
  appendText(text: string): boolean {
    // At most 3 bytes per UTF-16 unit: when that surely fits, write first and measure after.
    const room = 4 + 3 * text.length;
    const pos = this.pos;
    if (pos + room > this.buf.length || pos - HEADER_SIZE + room > this.maxPayload) return this.append(Buffer.from(text, "utf8"));
    const n = utf8Write(this.buf, text, pos + 4);
    this.buf.writeUInt32LE(n, pos);
    this.pos = pos + 4 + n;
    this.n++;
    return true;
  }

  /**
   * Appends a row that `write` encodes straight into the frame (no intermediate Buffer): it gets
   * the frame's buffer and the offset where the row's bytes go, with at least `room` bytes free
   * there, and returns the offset where the row ends; or, when it wrote the row elsewhere (too
   * large for the room it had), the row's bytes, which are copied in as {@link append} would.
   * The length field is written after. A `write` that throws leaves nothing appended.
   *
   * @example
   * ```ts
   * b.appendWith((buf, start) => start + buf.write(text, start)); // at most `room` bytes
   * ```
   * @returns false, appending nothing, when the row does not fit in this frame: finish it and
   * write the row again into the next one.
   * @throws ProtocolError ROW_TOO_LARGE when the row cannot fit in any ROWS frame.
   */
  appendWith(write: (buf: Buffer, start: number) => number | Uint8Array, room = 0): boolean {
    const start = this.pos + 4;
    this.reserve(start + room);
    const end = write(this.buf, start);
    if (typeof end !== "number") return this.append(end);
    const n = end - start;
    if (!(Number.isInteger(end) && n >= 0 && end <= this.buf.length)) throw new RangeError(`appendWith: the row's end ${end} is outside ${start}..${this.buf.length}`);
    if (8 + n > this.maxPayload) refuse("ROW_TOO_LARGE", `a row of ${n} bytes cannot fit in a ROWS frame of at most ${this.maxPayload} bytes`);
    if (this.pos - HEADER_SIZE + 4 + n > this.maxPayload) return false;
    const buf = this.buf;
    const p = this.pos;
    buf[p] = n;
    buf[p + 1] = n >>> 8;
    buf[p + 2] = n >>> 16;
    buf[p + 3] = n >>> 24;
    this.pos = end;
    this.n++;
    return true;
  }

  /**
   * Appends rows given as text, `texts[start..]` in order, while the payload stays within
   * `target` bytes (and always within `maxPayload`): the batch form of {@link appendText}
   * (spec 14.4's builder `extend`). The rows are joined and written as UTF-8 in one write;
   * when every character is ASCII each row's length is its string length, otherwise each
   * row's byte length is measured. An empty frame always takes its first row if it fits
   * `maxPayload`, whatever `target`.
   * @returns how many rows were appended (0: the next row does not fit this frame: finish it
   * and extend the next one).
   * @throws ProtocolError ROW_TOO_LARGE when the first row cannot fit in any ROWS frame.
   */
  extendText(texts: readonly string[], start = 0, target = this.maxPayload): number {
    const total = texts.length;
    if (start >= total) return 0;
    const limit = Math.min(target, this.maxPayload);
    const base = this.pos;
    const room = limit - (base - HEADER_SIZE);
    // The rows that fit when every character is one byte (a lower bound on their bytes).
    let k = start;
    let chars = 0;
    while (k < total) {
      const need = 4 + texts[k].length;
      if (chars + need > room) break;
      chars += need;
      k++;
    }
    if (k === start) {
      // Not one row within the target: an empty frame still takes one (up to maxPayload).
      if (this.n > 0) return 0;
      return this.appendText(texts[start]) ? 1 : 0;
    }
    const joined = k - start === total ? texts.join(SEPARATOR) : texts.slice(start, k).join(SEPARATOR);
    // One write of the joined rows after the first length field; the separators (4 ASCII
    // bytes each) are where the later rows' length fields go.
    this.reserve(base + chars);
    const written = utf8Write(this.buf, joined, base + 4);
    const buf = this.buf;
    let p = base;
    // All ASCII (then the write was whole too): each row's length is its string length.
    if (written === joined.length && isAscii(buf.subarray(base + 4, base + 4 + written))) {
      for (let i = start; i < k; i++) {
        const n = texts[i].length;
        buf[p] = n;
        buf[p + 1] = n >>> 8;
        buf[p + 2] = n >>> 16;
        buf[p + 3] = n >>> 24;
        p += 4 + n;
      }
      this.pos = p;
      this.n += k - start;
      return k - start;
    }
    return this.placeUtf8(texts, start, k, room, written);
  }

  /**
   * extendText's non-ASCII case: the joined rows were written at pos + 4, `written` bytes of
   * them (cut short at the buffer's end). Each row's UTF-8 length is measured, the rows that
   * fit `room` are kept (written again if the first write did not reach their end), and their
   * length fields written.
   */
  private placeUtf8(texts: readonly string[], start: number, end: number, room: number, written: number): number {
    const base = this.pos;
    const lens: number[] = [];
    let bytes = 0;
    for (let i = start; i < end; i++) {
      const n = Buffer.byteLength(texts[i], "utf8");
      if (bytes + 4 + n > room) break;
      lens.push(n);
      bytes += 4 + n;
    }
    const k = lens.length;
    if (k === 0) {
      if (this.n > 0) return 0;
      return this.appendText(texts[start]) ? 1 : 0;
    }
    if (written < bytes - 4) {
      this.reserve(base + bytes);
      utf8Write(this.buf, texts.slice(start, start + k).join(SEPARATOR), base + 4);
    }
    let p = base;
    for (let i = 0; i < k; i++) {
      this.buf.writeUInt32LE(lens[i], p);
      p += 4 + lens[i];
    }
    this.pos = p;
    this.n += k;
    return k;
  }

  /** Room in the buffer up to `end`, the rows so far kept. */
  private reserve(end: number): void {
    if (end <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, end));
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
  }

  /**
   * Writes the frame to the connection's output, charges the stream's credit and counts the
   * rows; the builder is then empty and can be filled again.
   * @throws ProtocolError FLOW_CONTROL (no credit: see {@link Connection.canSendRows}),
   * UNKNOWN_ID, KIND_MISMATCH, ROW_BOUNDS (no rows); nothing is written and the rows stay.
   */
  finish(): void {
    const frame = this.buf.subarray(0, this.pos);
    this.conn.finishRows(this, frame, this.n);
    // A large frame was handed to the output as it is: it is the socket's now.
    if (this.pos >= COPY_LIMIT) this.buf = Buffer.allocUnsafe(this.buf.length);
    this.pos = HEADER_SIZE + 4;
    this.n = 0;
  }
}

/**
 * `text` as UTF-8 into `buf` at `offset` (room checked by the caller); the byte count. Node's
 * `Buffer#utf8Write` skips `write`'s argument parsing, a third of the cost for a short row.
 */
const utf8Write: (buf: Buffer, text: string, offset: number) => number =
  typeof (Buffer.prototype as { utf8Write?: unknown }).utf8Write === "function"
    ? (buf, text, offset) => (buf as unknown as { utf8Write(t: string, o: number): number }).utf8Write(text, offset)
    : (buf, text, offset) => buf.write(text, offset, "utf8");

/** Between rows joined for one write: 4 ASCII bytes, where the next row's length field goes. */
const SEPARATOR = "\0\0\0\0";

const EMPTY = Buffer.alloc(0);
const INBOUND_BLOCK = 64 * 1024;
const INBOUND_BLOCK_MAX = 256 * 1024 * 1024;

/**
 * Adds `chunk` to the end of a message being reassembled: a large chunk (a view of the received
 * bytes, which the decoder never overwrites) is kept as a block of its own, uncopied; small
 * ones are copied into blocks filled in place.
 */
function appendInbound(p: Inbound, chunk: Buffer): void {
  const n = chunk.length;
  if (n >= INBOUND_BLOCK) {
    if (p.lastLen > 0) p.blocks.push(p.last.subarray(0, p.lastLen));
    p.blocks.push(chunk);
    p.last = EMPTY;
    p.lastLen = 0;
    p.len += n;
    return;
  }
  let off = 0;
  while (off < n) {
    if (p.lastLen === p.last.length) {
      if (p.lastLen > 0) p.blocks.push(p.last);
      // Each block as large as the message so far (capped): few blocks, and large ones are
      // mapped by the allocator on their own, so their memory goes back when they are freed.
      p.last = Buffer.allocUnsafe(Math.max(INBOUND_BLOCK, n - off, Math.min(p.len + off, INBOUND_BLOCK_MAX)));
      p.lastLen = 0;
    }
    const k = Math.min(n - off, p.last.length - p.lastLen);
    chunk.copy(p.last, p.lastLen, off, off + k);
    p.lastLen += k;
    off += k;
  }
  p.len += n;
}

function checkU32(v: number, what: string): void {
  if (!(Number.isInteger(v) && v >= 0 && v < HALF_U32)) refuse("BAD_PAYLOAD", `${what} ${v} is not a u32`);
}

const NAMES: Record<number, string> = Object.fromEntries(Object.entries(FrameType).map(([n, c]) => [c, n]));

function typeName(t: number): string {
  return NAMES[t] ?? `type 0x${t.toString(16)}`;
}

function table(types: number[]): Uint8Array {
  const a = new Uint8Array(256);
  for (const t of types) a[t] = 1;
  return a;
}

const PARENT_RECEIVES = table([FrameType.RESULT, FrameType.ERROR, FrameType.ROWS, FrameType.END, FrameType.EVENT, FrameType.PING, FrameType.PONG, FrameType.GOODBYE, FrameType.CONTINUATION]);
const WORKER_RECEIVES = table([FrameType.REQUEST, FrameType.CANCEL, FrameType.CREDIT, FrameType.PING, FrameType.PONG, FrameType.DRAIN, FrameType.CONTINUATION]);
const PARENT_SENDS = table([FrameType.WELCOME, FrameType.REQUEST, FrameType.CANCEL, FrameType.CREDIT, FrameType.PING, FrameType.PONG, FrameType.DRAIN, FrameType.CONTINUATION, FrameType.ERROR]);
const WORKER_SENDS = table([FrameType.HELLO, FrameType.RESULT, FrameType.ERROR, FrameType.ROWS, FrameType.END, FrameType.EVENT, FrameType.PING, FrameType.PONG, FrameType.CONTINUATION, FrameType.GOODBYE]);
