/**
 * Feeding a large output to a socket (PROTOCOL.md 8.5), for the parent's and the worker's
 * drivers alike: whole frames of the core's output while the socket holds less than
 * {@link FEED_LIMIT} bytes, the rest on 'drain'. The socket then only ever holds whole frames, so
 * a PING or PONG taken meanwhile (`takeOutput(0)`) is written at once behind at most
 * FEED_LIMIT bytes and one frame, not behind the rest of a large message.
 */

import type { Writable } from "node:stream";
import type { Connection } from "./proto/connection.js";

/** An output larger than this is fed as the socket drains; smaller ones go in one write. */
export const FEED_LIMIT = 4 << 20;

/**
 * Hands `sock` whole frames of `conn`'s output through `write` while it holds less than
 * FEED_LIMIT bytes (or its high-water mark). True when frames remain: a write returned false,
 * so 'drain' comes; feed again then. (Frames sent meanwhile wait in the core, in order.)
 */
export function feedOutput(conn: Connection, sock: Writable, write: (parts: Buffer[]) => void): boolean {
  const limit = Math.max(FEED_LIMIT, sock.writableHighWaterMark);
  while (conn.outputLength() > 0 && sock.writableLength < limit) {
    write(conn.takeOutput(limit - sock.writableLength));
  }
  return conn.outputLength() > 0;
}
