// The shared-memory lane's data path measured against the socket's, one body of N bytes from a
// Node parent to a Node child per round, the child answering one byte once it holds the whole
// body in a Buffer of its own (what a receiver that copies out has; PROTOCOL.md 20.4):
//
//   socket  N bytes through the socketpair, read straight into the body (onread into it: the
//           SDK's best case, one copy out of the kernel, no reassembly copy)
//   pread   the lane, pure JavaScript on the data: the parent pwrite()s into a warm sealed memory
//           file whose descriptor went once over SCM_RIGHTS (the addon), the child pread()s it out
//   copy    the lane, memcpy both sides: into the parent's mapping, out of the child's (the addon)
//   view    the lane, memcpy into the parent's mapping, the child's body a view of a private
//           mapping of the range (zero-copy receive: its pages are faulted in as it is read)
// The receiver reads one byte of every page of the body in every mode.
//
// Run: cd node && npm run build:native && npm run build:test && node build/bench/shm-lane.js [--sizes 64,256] [--rounds 5]
import { spawn } from "node:child_process";
import { readSync, writeSync } from "node:fs";
import net from "node:net";
import { fileURLToPath } from "node:url";

import { shmNative, shmNativeMissing } from "../src/shm/native.js";

const MiB = 1 << 20;
const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : dflt;
};

type Mode = "socket" | "pread" | "copy" | "view";
const MODE_CODE: Record<Mode, number> = { socket: 1, pread: 2, copy: 3, view: 4 };

function fdOf(s: net.Socket): number {
  const fd = (s as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (typeof fd !== "number" || fd < 0) throw new Error("no descriptor behind the socket");
  return fd;
}

/** What the receiver does with a body: reads a byte of every page (so a lazy mapping pays its faults) and checks them. */
function use(b: Buffer): void {
  let sum = 0;
  for (let i = 0; i < b.length; i += 4096) sum += b[i];
  if (sum !== 7 * Math.ceil(b.length / 4096) || b[b.length - 1] !== 7) throw new Error("bad body");
}

async function child(): Promise<void> {
  const native = shmNative();
  // The raw descriptor: libuv must not read it (it would drop the descriptors that come with it).
  const fd = 3;
  // Commands come as 16 bytes: mode (1 socket, 2 pread, 3 mmap), 0, 0, 0, size u32, 8 bytes 0.
  const cmd = Buffer.alloc(16);
  let have = 0;
  let region = -1;
  let mapping: unknown = null;
  let body: Buffer | null = null;
  let bodyAt = 0;
  const out = new Int32Array(10);
  const ack = Buffer.from([1]);
  const onCmd = () => {
    const mode = cmd[0];
    const size = cmd.readUInt32LE(4);
    if (mode === 9) {
      // setup: the region's descriptor came with the command
      return;
    }
    if (mode === 1) {
      body = Buffer.allocUnsafe(size);
      bodyAt = 0;
      return;
    }
    let b: Buffer;
    if (mode === 4) b = Buffer.from(native!.mapView(region, 0, size));
    else {
      b = Buffer.allocUnsafe(size);
      if (mode === 2) for (let at = 0; at < size; ) at += readSync(region, b, at, size - at, at);
      else {
        if (mapping === null) mapping = native!.mapRead(region, size);
        native!.copyOut(mapping, 0, b);
      }
    }
    use(b);
    native!.sendmsg(fd, ack, []);
  };
  if (!native) throw new Error(shmNativeMissing());
  native.watch(fd, () => {
    for (;;) {
      const target = body ? body.subarray(bodyAt) : cmd.subarray(have);
      const n = native.recvmsg(fd, target, out);
      if (n === -11) return;
      if (n <= 0) process.exit(0);
      if (out[0] > 0) {
        if (region >= 0) native.closeFd(region);
        region = out[1];
        if (mapping !== null) native.unmap(mapping);
        mapping = null;
      }
      if (body) {
        bodyAt += n;
        if (bodyAt === body.length) {
          use(body);
          body = null;
          native.sendmsg(fd, ack, []);
        }
        continue;
      }
      have += n;
      if (have === 16) {
        have = 0;
        onCmd();
      }
    }
  });
}

async function parent(): Promise<void> {
  const native = shmNative();
  if (!native) throw new Error(shmNativeMissing());
  const sizes = arg("--sizes", "64,256").split(",").map((s) => Number(s) * MiB);
  const rounds = Number(arg("--rounds", "5"));
  const modes = arg("--modes", "socket,pread,copy,view").split(",") as Mode[];
  const here = fileURLToPath(import.meta.url);
  const c = spawn(process.execPath, [here, "child"], { stdio: ["ignore", "inherit", "inherit", "pipe"] });
  const sock = c.stdio[3] as net.Socket;
  const fd = fdOf(sock);
  let waiting: (() => void) | null = null;
  sock.on("data", () => {
    const w = waiting;
    waiting = null;
    w?.();
  });
  const acked = () => new Promise<void>((r) => (waiting = r));
  const command = (mode: number, size: number) => {
    const b = Buffer.alloc(16);
    b[0] = mode;
    b.writeUInt32LE(size, 4);
    return b;
  };
  const results: { size: number; mode: Mode; ms: number[] }[] = [];
  for (const size of sizes) {
    const body = Buffer.alloc(size, 7);
    const region = native.memfd(size);
    // The region goes once (a warm region is reused, as the SDKs reuse theirs).
    await new Promise<void>((r) => (sock.writableLength === 0 ? r() : sock.once("drain", () => r())));
    if (native.sendmsg(fd, command(9, size), [region]) !== 16) throw new Error("setup write");
    const owner = native.mapWrite(region, size);
    native.copyIn(owner, 0, body); // first touch of the region's pages, outside the timing
    for (const mode of modes) {
      const ms: number[] = [];
      for (let i = 0; i <= rounds; i++) {
        const t0 = process.hrtime.bigint();
        const done = acked();
        if (mode === "socket") {
          sock.write(command(1, size));
          sock.write(body);
        } else {
          if (mode === "pread") for (let at = 0; at < size; ) at += writeSync(region, body, at, size - at, at);
          else native.copyIn(owner, 0, body);
          sock.write(command(MODE_CODE[mode], size));
        }
        await done;
        const dt = Number(process.hrtime.bigint() - t0) / 1e6;
        if (i > 0) ms.push(dt); // round 0 warms up
      }
      results.push({ size, mode, ms });
    }
    native.unmap(owner);
    native.closeFd(region);
  }
  sock.end();
  await new Promise((r) => c.once("exit", r));
  const stat = (ms: number[]) => {
    const s = [...ms].sort((a, b) => a - b);
    return { min: s[0], med: s[Math.floor(s.length / 2)], max: s[s.length - 1] };
  };
  console.log(`node ${process.version}, ${rounds} rounds after one warm-up; ms per body (MiB/s at the median)`);
  for (const r of results) {
    const s = stat(r.ms);
    const mibs = r.size / MiB / (s.med / 1000);
    const base = results.find((x) => x.size === r.size && x.mode === "socket");
    const ratio = base && r.mode !== "socket" ? `  ${(stat(base.ms).med / s.med).toFixed(2)}x the socket` : "";
    console.log(`${String(r.size / MiB).padStart(4)} MiB ${r.mode.padEnd(6)} min ${s.min.toFixed(1)} med ${s.med.toFixed(1)} max ${s.max.toFixed(1)}  ${mibs.toFixed(0)} MiB/s${ratio}`);
  }
}

if (process.argv[2] === "child") child();
else parent();
