/**
 * A connection end read with `recvmsg` (the addon), for the shared-memory lane: each read's
 * descriptors are reported before its bytes (PROTOCOL.md 20.5, 20.7), and the bytes are split
 * into the lane's frames and the rest (`ShmSplitter`). libuv never reads this end: a plain
 * `read()` would drop the descriptors.
 * @module
 */
import { ProtocolError } from "../proto/errors.js";
import type { ShmFrame } from "../proto/shm.js";
import type { ShmNative } from "./native.js";
import { ShmSplitter, type Segment } from "./splitter.js";

const EAGAIN = -11;
const READ_BYTES = 256 * 1024;

export interface ShmReaderHandlers {
  /** Descriptors that came with a read (`truncated`: MSG_CTRUNC); before its bytes. */
  fds(fds: number[], truncated: boolean): void;
  /** Bytes of the other frames, in order (a fresh Buffer per read, kept by the receiver). */
  data(chunk: Buffer): void;
  /** A lane frame, in order with the bytes. */
  shm(frame: ShmFrame): void;
  /** End of file or a read error; nothing more is read. */
  end(): void;
  /** A violation found here (a lane frame's header, a descriptor's count): the connection fails. */
  violation(e: ProtocolError): void;
  /** Whether to go on after a handler (false once the connection failed). */
  alive(): boolean;
}

export class ShmReader {
  readonly splitter = new ShmSplitter(false);
  private readonly watch: unknown;
  private readonly out = new Int32Array(10);
  private readonly segments: Segment[] = [];
  private closed = false;

  constructor(
    private readonly native: ShmNative,
    private readonly fd: number,
    private readonly h: ShmReaderHandlers,
  ) {
    this.watch = native.watch(fd, () => this.pump(), false); // the pool holds the loop while there is work
  }

  /** Reads what is there now (also called by the driver to take the rest after a write error). */
  pump(): void {
    const { native, h } = this;
    while (!this.closed) {
      const buf = Buffer.allocUnsafe(READ_BYTES);
      const n = native.recvmsg(this.fd, buf, this.out);
      if (n === EAGAIN) return;
      if (n <= 0) {
        this.close();
        h.end();
        return;
      }
      let failure: unknown = null;
      const segs = this.segments;
      segs.length = 0;
      try {
        if (this.out[0] > 0 || this.out[9] === 1) h.fds(Array.from(this.out.subarray(1, 1 + this.out[0])), this.out[9] === 1);
        // The frames before a bad header are handled first, then the violation.
        this.splitter.push(buf.subarray(0, n), segs);
      } catch (e) {
        failure = e;
      }
      try {
        for (const s of segs) {
          if (!h.alive() || this.closed) return;
          if (Buffer.isBuffer(s)) h.data(s);
          else h.shm(s);
        }
      } catch (e) {
        failure = e;
      }
      if (failure !== null) {
        this.close();
        if (failure instanceof ProtocolError) h.violation(failure);
        else throw failure;
        return;
      }
      if (!h.alive()) return;
    }
  }

  /** Stops reading and closes the watch's duplicate descriptor (the end itself is the socket's). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.native.unwatch(this.watch);
  }
}
