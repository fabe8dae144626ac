// The shared-memory lane's native part (node/native/) and its data path (src/shm/lane.ts),
// against the Python SDK's own lane primitives in another process (test/fixtures/shm_peer.py):
// a Python region received, viewed zero-copy and released when the view is collected; a Node
// region checked and read by Python (its seals, tmpfs, size); a hostile peer's bad offsets,
// unsealed file and nine descriptors in one write, each a typed ProtocolError with every
// descriptor closed. Without the addon (WIREPOOL_SHM_NATIVE=0) shmNative() is null and says why.
import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { setImmediate as tick } from "node:timers/promises";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

import { decodeShmFrame, HEADER_SIZE, ProtocolError, ShmFrameType, type ShmFrame } from "../src/proto/index.js";
import { ShmReceiver, ShmSender } from "../src/shm/lane.js";
import { shmNative } from "../src/shm/native.js";
import { REPO } from "./vectors.js";

const native = shmNative();
const VENV = join(REPO, ".venv", "bin", "python");
const PYTHON = existsSync(VENV) ? VENV : "python3";
const PEER = join(REPO, "node", "test", "fixtures", "shm_peer.py");
const T = { timeout: 30_000 };
const skip = native === null ? "the addon is not built (npm run build:native)" : false;

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

function pattern(n: number): Buffer {
  const b = Buffer.alloc(n);
  for (let i = 0; i < n; i++) b[i] = ((i % 256) * 7 + 3) & 0xff;
  return b;
}

const openFds = () => readdirSync("/proc/self/fd").length;

/** A Python peer on a socketpair whose end here is read with recvmsg (never by libuv). */
class Peer {
  readonly child: ChildProcess;
  readonly fd: number;
  private readonly watch: unknown;
  private buf = Buffer.alloc(1 << 16);
  private have = 0;
  private readonly out = new Int32Array(10);
  stdout = "";
  stderr = "";
  eof = false;
  error: unknown = null;
  readonly exited: Promise<number | null>;

  constructor(
    mode: string,
    private readonly onFds: (fds: number[], truncated: boolean) => void,
    private readonly onFrame: (type: number, id: number, payload: Buffer) => void,
    env: Record<string, string> = {},
  ) {
    const [a, b] = native!.socketpair();
    this.fd = a;
    this.child = spawn(PYTHON, [PEER, mode], {
      stdio: ["ignore", "pipe", "pipe", b],
      env: { ...process.env, PYTHONPATH: join(REPO, "python"), ...env },
    });
    native!.closeFd(b);
    this.child.stdout!.on("data", (d: Buffer) => (this.stdout += d));
    this.child.stderr!.on("data", (d: Buffer) => (this.stderr += d));
    // "close": exited and its stdout and stderr closed (so the descriptor count is back).
    this.exited = new Promise((r) => this.child.once("close", (code) => r(code)));
    this.watch = native!.watch(a, () => this.pump());
  }

  private pump(): void {
    if (this.eof || this.error) return;
    for (;;) {
      const n = native!.recvmsg(this.fd, this.buf.subarray(this.have), this.out);
      if (n === -11) return;
      if (n <= 0) {
        this.eof = true;
        return;
      }
      try {
        const fds = Array.from(this.out.subarray(1, 1 + this.out[0]));
        if (fds.length > 0 || this.out[9]) this.onFds(fds, this.out[9] === 1);
        this.have += n;
        let at = 0;
        while (this.have - at >= HEADER_SIZE) {
          const len = this.buf.readUInt32LE(at);
          if (this.have - at < HEADER_SIZE + len) break;
          this.onFrame(this.buf[at + 4], Number(this.buf.readBigUInt64LE(at + 8)), Buffer.from(this.buf.subarray(at + HEADER_SIZE, at + HEADER_SIZE + len)));
          at += HEADER_SIZE + len;
        }
        this.buf.copy(this.buf, 0, at, this.have);
        this.have -= at;
      } catch (e) {
        this.error = e;
        return;
      }
    }
  }

  write(frame: Buffer, fds: number[] = []): void {
    const n = native!.sendmsg(this.fd, frame, fds);
    assert.equal(n, frame.length, `sendmsg: ${n}`);
  }

  /** Ends the link: the peer sees end of file; resolves with its exit code. */
  async close(): Promise<number | null> {
    native!.unwatch(this.watch);
    native!.closeFd(this.fd);
    await tick(); // the watch's duplicate descriptor is closed in the loop's close phase
    await tick();
    const code = await Promise.race([this.exited, new Promise<null>((r) => setTimeout(() => r(null), 10_000).unref())]);
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill("SIGKILL");
    return code;
  }
}

/** Waits (bounded, no sleep: one event-loop turn at a time) until `cond` holds. */
async function until(cond: () => boolean, what: string, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 1));
  }
}

describe("the shm addon's fallback", () => {
  it("WIREPOOL_SHM_NATIVE=0: shmNative() is null and says why", T, () => {
    const mod = join(REPO, "node", "build", "src", "shm", "native.js");
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", `import { shmNative, shmNativeMissing } from ${JSON.stringify(mod)}; console.log(JSON.stringify([shmNative(), shmNativeMissing()]))`], {
      env: { ...process.env, WIREPOOL_SHM_NATIVE: "0" },
      encoding: "utf8",
      timeout: 20_000,
    });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), [null, "WIREPOOL_SHM_NATIVE=0"]);
  });
});

describe("the shm addon", { skip }, () => {
  it("makes sealed regions and checks descriptors before mapping; bad arguments throw", T, () => {
    const n = native!;
    const fd = n.memfd(8192);
    try {
      assert.equal(n.checkRegion(fd, 8192), null);
      assert.match(n.checkRegion(fd, 4096)!, /has 8192 bytes/);
      assert.match(n.checkRegion(0, 1)!, /not a sealable memory file|not sealed/);
      const w = n.mapWrite(fd, 8192);
      n.copyIn(w, 8190, Buffer.from([1, 2]));
      assert.throws(() => n.copyIn(w, 8191, Buffer.from([1, 2])), RangeError);
      assert.throws(() => n.copyIn(w, -1, Buffer.from([1])), RangeError);
      const r = n.mapRead(fd, 8192);
      const out = Buffer.alloc(2);
      n.copyOut(r, 8190, out);
      assert.deepEqual([...out], [1, 2]);
      assert.throws(() => n.copyOut(r, 8192, out), RangeError);
      n.unmap(r);
      assert.throws(() => n.copyOut(r, 0, out), RangeError);
      const v = Buffer.from(n.mapView(fd, 8190, 2));
      assert.deepEqual([...v], [1, 2]);
      v[0] = 9; // a private mapping: the owner's bytes do not change
      n.copyOut((n.mapRead(fd, 8192)), 8190, out);
      assert.equal(out[0], 1);
      n.unmap(w);
      assert.throws(() => n.memfd(0), RangeError);
      assert.throws(() => n.sendmsg(fd, Buffer.alloc(1), [1, 2, 3, 4, 5, 6, 7, 8, 9]), TypeError);
      assert.throws(() => n.recvmsg(fd, Buffer.alloc(1), new Int32Array(2)), TypeError);
    } finally {
      n.closeFd(fd);
    }
  });

  it("a Python region: received, its body a zero-copy view, released when the view is collected", T, async () => {
    const before = openFds();
    let rx!: ShmReceiver;
    let body: Buffer | null = null;
    let released = 0;
    const peer = new Peer(
      "send",
      (fds, t) => rx.descriptors(fds, t),
      (type, id, payload) => {
        const f = decodeShmFrame(type, id, payload);
        if (f.type === ShmFrameType.SHM_REGION) rx.region(f);
        else if (f.type === ShmFrameType.SHM_BODY) body = rx.body(f.id, f);
      },
    );
    rx = new ShmReceiver(native!, 1n << 30n, () => {
      released++;
      for (const fr of rx.takeReleases()) peer.write(fr);
    });
    try {
      await until(() => body !== null || peer.error !== null || peer.eof, "the body");
      assert.equal(peer.error, null);
      assert.equal(body!.length, 1 << 20);
      assert.ok(body!.equals(pattern(1 << 20)), "the body's bytes");
      assert.equal(rx.heldBytes, 1n << 20n);
      body = null; // the only reference: collected, then released
      for (let i = 0; i < 200 && released === 0; i++) {
        gc();
        await tick();
      }
      assert.equal(released, 1, "the release after the view was collected");
      assert.equal(rx.heldBytes, 0n);
      assert.equal(await peer.exited, 0, peer.stderr);
      assert.match(peer.stdout, /released 1048576/);
    } finally {
      await peer.close();
      rx.close();
    }
    assert.ok(openFds() <= before, "every descriptor closed");
  });

  it("a Node region: Python checks its seals, tmpfs and size, reads the body and releases it", T, async () => {
    const before = openFds();
    const tx = new ShmSender(native!, 1n << 30n);
    const releases: ShmFrame[] = [];
    const peer = new Peer(
      "recv",
      () => assert.fail("no descriptor expected"),
      (type, id, payload) => releases.push(decodeShmFrame(type, id, payload)),
    );
    try {
      const size = 3 << 20;
      const p = tx.place(pattern(size), Date.now());
      assert.ok(p && p.region, "placed in a new region");
      peer.write(p.region.frame, [p.region.fd]);
      peer.write(Buffer.from(encodeBody(5, p.range)));
      await until(() => releases.length > 0 || peer.eof, "the release");
      assert.equal(releases[0].type, ShmFrameType.SHM_RELEASE);
      tx.released(releases[0], Date.now());
      assert.equal(tx.lentBytes, 0n);
      // The warm region is reused; idle, it is retired.
      const again = tx.place(pattern(size), Date.now());
      assert.ok(again && again.region === null && again.range.region === p.range.region);
      assert.throws(() => tx.released({ ...releases[0], length: 1n }, Date.now()), (e: unknown) => e instanceof ProtocolError && e.name === "SHM_BAD_RELEASE");
      tx.released(releases[0], 0);
      tx.retireIdle(Date.now() + 60_000);
      assert.equal(tx.takeRetires().length, 1);
      assert.equal(tx.liveRegions, 0);
      await until(() => peer.stdout.includes("\n"), "Python's check (a whole line)");
      assert.match(peer.stdout, new RegExp(`checked ${size}`));
    } finally {
      assert.equal(await peer.close(), 0, peer.stderr);
      tx.close();
    }
    assert.ok(openFds() <= before, "every descriptor closed");
  });

  for (const [mode, code, name] of [
    ["bounds", 125, "SHM_BOUNDS"],
    ["overflow", 125, "SHM_BOUNDS"],
    ["unsealed", 124, "SHM_BAD_DESCRIPTOR"],
    ["nine", 124, "SHM_BAD_DESCRIPTOR"],
  ] as const) {
    it(`a hostile Python peer (${mode}): ${name}, nothing leaked, the process unharmed`, T, async () => {
      const before = openFds();
      const rx = new ShmReceiver(native!, 1n << 30n);
      const peer = new Peer(
        mode,
        (fds, t) => rx.descriptors(fds, t),
        (type, id, payload) => {
          const f = decodeShmFrame(type, id, payload);
          if (f.type === ShmFrameType.SHM_REGION) rx.region(f);
          else if (f.type === ShmFrameType.SHM_BODY) rx.body(f.id, f);
        },
      );
      try {
        await until(() => peer.error !== null || peer.eof, "the violation");
        const e = peer.error;
        assert.ok(e instanceof ProtocolError, String(e));
        assert.equal(e.code, code);
        assert.equal(e.name, name);
      } finally {
        rx.close();
        await peer.close();
      }
      assert.ok(openFds() <= before, "every descriptor closed");
    });
  }

  // The crash cycles of the other lanes (make test-shm-crash-cycles), on the data path: either
  // side dies mid-loan, again and again. WIREPOOL_SHM_CRASH_CYCLES raises the count (default 5).
  const CYCLES = Number(process.env.WIREPOOL_SHM_CRASH_CYCLES ?? 5);
  it(`crash cycles (${CYCLES}): an owner killed while its body is viewed; a receiver dead holding a Node range`, { timeout: 30_000 + CYCLES * 3_000 }, async () => {
    const before = openFds();
    for (let i = 0; i < CYCLES; i++) {
      // The owner dies (SIGKILL) while the view is held: the view stays readable (a sealed
      // file's pages outlive its creator), and a release after the end is dropped, not written.
      let rx!: ShmReceiver;
      let body: Buffer | null = null;
      const peer = new Peer(
        "send",
        (fds, t) => rx.descriptors(fds, t),
        (type, id, payload) => {
          const f = decodeShmFrame(type, id, payload);
          if (f.type === ShmFrameType.SHM_REGION) rx.region(f);
          else if (f.type === ShmFrameType.SHM_BODY) body = rx.body(f.id, f);
        },
      );
      rx = new ShmReceiver(native!, 1n << 30n, () => assert.fail("no release after the end"));
      await until(() => body !== null || peer.error !== null || peer.eof, "the body");
      peer.child.kill("SIGKILL");
      await peer.exited;
      await until(() => peer.eof, "end of file");
      rx.close();
      assert.ok(body!.equals(pattern(1 << 20)), "the view reads whole after its owner died");
      await peer.close();
      body = null;
      gc();
      await tick();

      // The receiver dies holding a Node range: end of file, the owner closes its regions.
      const tx = new ShmSender(native!, 1n << 30n);
      const dying = new Peer("recv", () => assert.fail("no descriptor expected"), () => assert.fail("no release expected"), { SHM_PEER_DIE: "1" });
      const p = tx.place(pattern(2 << 20), Date.now())!;
      dying.write(p.region!.frame, [p.region!.fd]);
      dying.write(encodeBody(7, p.range));
      assert.equal(await dying.exited, 3, dying.stderr);
      await until(() => dying.eof, "end of file");
      assert.equal(tx.lentBytes, 2n << 20n);
      tx.close();
      await dying.close();
    }
    assert.ok(openFds() <= before, "every descriptor closed after the cycles");
  });
});

function encodeBody(id: number, r: { region: number; offset: number; length: number }): Buffer {
  const b = Buffer.alloc(HEADER_SIZE + 24);
  b.writeUInt32LE(24, 0);
  b[4] = ShmFrameType.SHM_BODY;
  b.writeBigUInt64LE(BigInt(id), 8);
  b.writeUInt32LE(r.region, 16);
  b.writeBigUInt64LE(BigInt(r.offset), 24);
  b.writeBigUInt64LE(BigInt(r.length), 32);
  return b;
}
