/**
 * Feeding output to a socket (PROTOCOL.md 8.5, the handed-ahead bound), for the parent's and the
 * worker's drivers alike: whole frames of the core's output, and only while the socket holds fewer
 * than {@link MAX_HANDED_AHEAD_BYTES} bytes it has not written (counting all it already holds,
 * whatever the messages), the rest on 'drain'. The socket then only ever holds whole frames, so a
 * PING or PONG taken meanwhile (`takeOutput(0)`) is written at once behind at most that many bytes
 * and one frame, not behind the rest of a large message nor behind a pile of small ones.
 */

import type { Writable } from "node:stream";
import type { Connection } from "./proto/connection.js";
import { Driver } from "./proto/constants.js";

/** The handed-ahead bound: `driver.max_handed_ahead_bytes` of spec/constants.json (4,194,304). */
export const MAX_HANDED_AHEAD_BYTES: number = Driver.maxHandedAheadBytes;

/**
 * The bound for `sock`: the handed-ahead bound, or its high-water mark when that is larger (the
 * SDK's sockets keep Node's default, 16-64 KiB): a write past it returns false, so 'drain' comes.
 */
function limitOf(sock: Writable): number {
  return Math.max(MAX_HANDED_AHEAD_BYTES, sock.writableHighWaterMark);
}

/**
 * Whether `queued` more bytes must be fed rather than written at once: with what `sock` holds
 * already they pass the bound. (Output that fits under it goes in one write.)
 */
export function mustFeed(queued: number, sock: Writable | null): boolean {
  return sock !== null && queued + sock.writableLength > limitOf(sock);
}

/**
 * Hands `sock` whole frames of `conn`'s output through `write` while it holds fewer than the
 * bound (the frame that reaches it is handed whole). True when frames remain: a write returned
 * false, so 'drain' comes; feed again then. (Frames sent meanwhile wait in the core, in order.)
 */
export function feedOutput(conn: Connection, sock: Writable, write: (parts: Buffer[]) => void): boolean {
  const limit = limitOf(sock);
  while (conn.outputLength() > 0 && sock.writableLength < limit) {
    write(conn.takeOutput(limit - sock.writableLength));
  }
  return conn.outputLength() > 0;
}
