/**
 * The optional native part of the shared-memory lane (`node/native/`, a Node-API addon in C):
 * what JavaScript cannot do, namely sealed memory files, descriptors over `SCM_RIGHTS` and a
 * readiness watch for reading with `recvmsg`. Absent (not built, not Linux, or
 * `WIREPOOL_SHM_NATIVE=0`), `shmNative()` is null and the SDK offers no lane: every body goes
 * through the socket, as a peer without the extension does.
 * @module
 */
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The addon's functions (`node/native/wirepool_shm.c`). Negative numbers are -errno. */
export interface ShmNative {
  /** A sealed memory file of `size` bytes (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL), close-on-exec. */
  memfd(size: number): number;
  /** The receiver's checks of a region's descriptor (20.5): null, or why it is refused. */
  checkRegion(fd: number, size: number): string | null;
  /** One non-blocking read: bytes (0: end of file) or -errno; `out` = [count, fd x 8, ctrunc]. */
  recvmsg(fd: number, buf: Uint8Array, out: Int32Array): number;
  /** One non-blocking write with descriptors attached to its first byte: bytes or -errno. */
  sendmsg(fd: number, buf: Uint8Array, fds: readonly number[]): number;
  /** Calls `cb` on each readiness of `fd` (a duplicate of it is watched) until `unwatch`; `ref` false: it does not keep the event loop alive. */
  watch(fd: number, cb: (events: number) => void, ref?: boolean): unknown;
  unwatch(handle: unknown): void;
  /** A read-only mapping, only reached through `copyOut` (JavaScript never holds a view of it). */
  mapRead(fd: number, size: number): unknown;
  copyOut(handle: unknown, offset: number, target: Uint8Array): void;
  /** A writable shared mapping of an owned region, only reached through `copyIn`. */
  mapWrite(fd: number, size: number): unknown;
  copyIn(handle: unknown, offset: number, source: Uint8Array): void;
  /** Unmaps a `mapRead`/`mapWrite` handle now (later copies throw). */
  unmap(handle: unknown): void;
  /** A zero-copy view of a range: a private read-write mapping, unmapped when collected. */
  mapView(fd: number, offset: number, length: number): ArrayBuffer;
  /** A Unix stream socketpair, close-on-exec: [a, b]. */
  socketpair(): [number, number];
  closeFd(fd: number): number;
}

let loaded: ShmNative | null | undefined;
let why = "";

/** The addon, or null when it is absent (`shmNativeMissing()` says why). */
export function shmNative(): ShmNative | null {
  if (loaded !== undefined) return loaded;
  loaded = null;
  if (process.platform !== "linux") {
    why = "the shared-memory lane is Linux only";
    return null;
  }
  if (process.env.WIREPOOL_SHM_NATIVE === "0") {
    why = "WIREPOOL_SHM_NATIVE=0";
    return null;
  }
  const require = createRequire(import.meta.url);
  const here = dirname(fileURLToPath(import.meta.url));
  // The optional package when installed, else a clone's build (npm run build:native), from
  // dist/shm/ and from build/src/shm/ (the tests' build).
  const candidates = [
    "wirepool-shm",
    join(here, "..", "..", "native", "build", "Release", "wirepool_shm.node"),
    join(here, "..", "..", "..", "native", "build", "Release", "wirepool_shm.node"),
  ];
  const errors: string[] = [];
  for (const c of candidates) {
    try {
      loaded = require(c) as ShmNative;
      return loaded;
    } catch (e) {
      errors.push(`${c}: ${(e as Error).message.split("\n")[0]}`);
    }
  }
  why = `the native addon is not built (npm run build:native): ${errors.join("; ")}`;
  return null;
}

/** Why `shmNative()` is null ("" when it is not). */
export function shmNativeMissing(): string {
  shmNative();
  return why;
}
