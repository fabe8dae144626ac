/**
 * Takes the shared-memory lane's frames out of a received byte stream (PROTOCOL.md 20.3), so
 * the connection core sees every other frame as before and the driver handles the lane's four:
 * bytes in, segments out, in order (runs of other frames' bytes as views of the input, and
 * decoded shm frames). Only while the lane is on: off, everything passes, and the core refuses
 * the types as `UNKNOWN_FRAME_TYPE`. A shm frame's header is checked as soon as its 16 bytes
 * are in (MORE or other flags `BAD_FLAGS`, the reserved field `RESERVED_NONZERO`, a length other
 * than its payload's `BAD_PAYLOAD`, the id rule `BAD_ID`), so at most 24 bytes are ever held.
 * @module
 */
import { FLAG_MORE, HEADER_SIZE, SHM_PAYLOAD_SIZE, ShmFrameType, ErrorCode } from "../proto/constants.js";
import { ProtocolError } from "../proto/errors.js";
import { decodeShmFrame, type ShmFrame } from "../proto/shm.js";

/** A run of other frames' bytes (a view of the input), or a decoded shm frame. */
export type Segment = Buffer | ShmFrame;

export class ShmSplitter {
  private readonly hdr = Buffer.alloc(HEADER_SIZE);
  private hdrLen = 0;
  private passRemaining = 0;
  private shm: { type: number; id: number; buf: Buffer; have: number } | null = null;

  constructor(public on: boolean) {}

  /** Splits `chunk` (kept: views of it are handed out) and appends its segments to `out`. */
  push(chunk: Buffer, out: Segment[]): void {
    if (!this.on && this.hdrLen === 0 && this.shm === null) {
      out.push(chunk);
      return;
    }
    const len = chunk.length;
    let at = 0;
    let run = -1;
    const flush = () => {
      if (run >= 0 && at > run) out.push(chunk.subarray(run, at));
      run = -1;
    };
    while (at < len) {
      if (this.passRemaining > 0) {
        if (run < 0) run = at;
        const n = Math.min(this.passRemaining, len - at);
        at += n;
        this.passRemaining -= n;
        continue;
      }
      const s = this.shm;
      if (s !== null) {
        const n = Math.min(s.buf.length - s.have, len - at);
        chunk.copy(s.buf, s.have, at, at + n);
        s.have += n;
        at += n;
        if (s.have === s.buf.length) {
          this.shm = null;
          out.push(decodeShmFrame(s.type, s.id, s.buf));
        }
        continue;
      }
      if (this.hdrLen === 0 && len - at >= HEADER_SIZE) {
        const type = chunk[at + 4];
        if (this.on && SHM_PAYLOAD_SIZE.has(type)) {
          flush();
          this.startShm(chunk, at);
          at += HEADER_SIZE;
        } else {
          if (run < 0) run = at;
          this.passRemaining = chunk.readUInt32LE(at);
          at += HEADER_SIZE;
        }
        continue;
      }
      // A header split across reads: gathered (16 bytes at most).
      flush();
      const n = Math.min(HEADER_SIZE - this.hdrLen, len - at);
      chunk.copy(this.hdr, this.hdrLen, at, at + n);
      this.hdrLen += n;
      at += n;
      if (this.hdrLen === HEADER_SIZE) {
        this.hdrLen = 0;
        if (this.on && SHM_PAYLOAD_SIZE.has(this.hdr[4])) this.startShm(this.hdr, 0);
        else {
          out.push(Buffer.from(this.hdr));
          this.passRemaining = this.hdr.readUInt32LE(0);
        }
      }
    }
    flush();
  }

  private startShm(b: Buffer, at: number): void {
    const type = b[at + 4];
    const flags = b[at + 5];
    const name = `0x${type.toString(16)}`;
    if (flags & FLAG_MORE) throw new ProtocolError(ErrorCode.BAD_FLAGS, `shm frame ${name} with MORE`);
    if (flags !== 0) throw new ProtocolError(ErrorCode.BAD_FLAGS, `shm frame ${name} with flags 0x${flags.toString(16)}`);
    if (b.readUInt16LE(at + 6) !== 0) throw new ProtocolError(ErrorCode.RESERVED_NONZERO, "the header's reserved field is not 0");
    const length = b.readUInt32LE(at);
    const want = SHM_PAYLOAD_SIZE.get(type)!;
    if (length !== want) throw new ProtocolError(ErrorCode.BAD_PAYLOAD, `shm frame ${name} needs exactly ${want} payload bytes, its header says ${length}`);
    const id = b.readBigUInt64LE(at + 8);
    if (type === ShmFrameType.SHM_BODY ? id === 0n : id !== 0n) throw new ProtocolError(ErrorCode.BAD_ID, `shm frame ${name} with id ${id}`);
    if (id > BigInt(Number.MAX_SAFE_INTEGER)) throw new ProtocolError(ErrorCode.PROTOCOL, `id ${id} beyond 2^53 - 1`);
    this.shm = { type, id: Number(id), buf: Buffer.alloc(want), have: 0 };
  }
}
