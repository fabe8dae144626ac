// The Node parent receiving a Python worker's large results through the shared-memory lane
// (PROTOCOL.md 20; experimental: WIREPOOL_SHM_LANE=1, with the native addon): the bytes are
// the worker's, the socket carries only the frames around them, the ranges are released, small
// results still take the socket; a worker killed with its regions viewed leaves the views whole.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { setImmediate as tick } from "node:timers/promises";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

import { ErrorCode, Pool, ProtocolViolationError } from "../src/index.js";
import { readdirSync, readFileSync } from "node:fs";
import { shmNative } from "../src/shm/native.js";
import { REPO } from "./vectors.js";

const VENV = join(REPO, ".venv", "bin", "python");
const PYTHON = existsSync(VENV) ? VENV : "python3";
const WORKER = join(REPO, "node", "test", "fixtures", "shm_worker.py");
const HOSTILE = join(REPO, "node", "test", "fixtures", "shm_hostile_worker.py");
const skip = shmNative() === null ? "the addon is not built (npm run build:native)" : false;
const T = { timeout: 60_000 };
setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

function pattern(n: number): Buffer {
  const b = Buffer.alloc(n);
  for (let i = 0; i < n; i++) b[i] = ((i % 256) * 7 + 3) & 0xff;
  return b;
}

/** Bytes the pool read from its workers' sockets (the exporter's view). */
function received(pool: Pool): number {
  return pool.exportView().slots.reduce((n, s) => n + s.receivedBytes, 0);
}

/** Bytes the pool wrote to its workers' sockets. */
function sent(pool: Pool): number {
  return pool.exportView().slots.reduce((n, s) => n + s.sentBytes, 0);
}

describe("the Node parent and a Python worker's shm lane", { skip }, () => {
  let saved: string | undefined;
  before(() => {
    saved = process.env.WIREPOOL_SHM_LANE;
    process.env.WIREPOOL_SHM_LANE = "1";
  });
  after(() => {
    if (saved === undefined) delete process.env.WIREPOOL_SHM_LANE;
    else process.env.WIREPOOL_SHM_LANE = saved;
  });

  it("large results come through the lane, small ones through the socket; every range is released", T, async () => {
    const pool = await Pool.start({ command: [PYTHON, WORKER], workers: 1, env: { ...process.env, PYTHONPATH: join(REPO, "python") } });
    try {
      const small = (await pool.call("blob", Buffer.from("1000"), { codec: "raw" })) as Buffer;
      assert.ok(small.equals(pattern(1000)));
      const in0 = received(pool);
      const sizes = [1 << 20, 8 << 20, 3 << 20, 8 << 20];
      for (const n of sizes) {
        const r = (await pool.call("blob", Buffer.from(String(n)), { codec: "raw" })) as Buffer;
        assert.equal(r.length, n);
        assert.ok(r.equals(pattern(n)), `the ${n} bytes`);
      }
      const socketBytes = received(pool) - in0;
      assert.ok(socketBytes < 64 * 1024, `${socketBytes} bytes came through the socket for ${sizes.length} large results`);
      // Collected views are released; the worker reuses its regions and keeps serving.
      for (let i = 0; i < 50; i++) {
        gc();
        await tick();
      }
      for (let i = 0; i < 10; i++) {
        const r = (await pool.call("blob", Buffer.from(String(2 << 20)), { codec: "raw" })) as Buffer;
        assert.equal(r.length, 2 << 20);
      }
    } finally {
      await pool.close();
    }
  });
  it("large requests go to a Python worker through the parent's regions, reused once released; the echo comes back through the worker's", T, async () => {
    const pool = await Pool.start({ command: [PYTHON, WORKER], workers: 1, env: { ...process.env, PYTHONPATH: join(REPO, "python") } });
    try {
      for (const n of [1 << 20, 8 << 20, 8 << 20, 3 << 20, 8 << 20]) {
        const body = pattern(n);
        const out0 = sent(pool);
        const in0 = received(pool);
        const r = (await pool.call("echo", body, { codec: "raw" })) as Buffer;
        assert.ok(r.equals(body), `the echo of ${n} bytes`);
        assert.ok(sent(pool) - out0 < 64 * 1024, `${sent(pool) - out0} bytes went through the socket for a ${n}-byte request`);
        assert.ok(received(pool) - in0 < 64 * 1024, `${received(pool) - in0} bytes came through the socket`);
      }
      const small = (await pool.call("echo", Buffer.from("hi"), { codec: "raw" })) as Buffer;
      assert.equal(small.toString(), "hi");
    } finally {
      await pool.close();
    }
  });

  const RUST = join(REPO, "rust", "target", "debug", "conformance_worker");
  it("a Rust worker's echo of 8 MiB: the request through the parent's lane, the result through the worker's", { ...T, skip: existsSync(RUST) ? false : "the Rust conformance worker is not built" }, async () => {
    const pool = await Pool.start({ command: [RUST], workers: 1 });
    try {
      const body = pattern(8 << 20);
      for (let i = 0; i < 3; i++) {
        const in0 = received(pool);
        const out0 = sent(pool);
        const r = (await pool.call("echo", body, { codec: "raw" })) as Buffer;
        assert.ok(r.equals(body), "the echo's bytes");
        const socketBytes = received(pool) - in0;
        assert.ok(socketBytes < 64 * 1024, `${socketBytes} bytes came through the socket for an 8 MiB result`);
        assert.ok(sent(pool) - out0 < 64 * 1024, `${sent(pool) - out0} bytes went through the socket for an 8 MiB request`);
      }
    } finally {
      await pool.close();
    }
  });

  // The other lanes' crash cycles (make test-shm-crash-cycles), at the Node parent: a worker
  // SIGKILLed with a large result of its own in flight, while the parent holds a view of an
  // earlier one. WIREPOOL_SHM_CRASH_CYCLES sets the count (default 5).
  const CYCLES = Number(process.env.WIREPOOL_SHM_CRASH_CYCLES ?? 5);
  it(`crash cycles (${CYCLES}): one outcome per call, views of a dead worker's regions whole, nothing left after`, { timeout: 60_000 + CYCLES * 5_000 }, async () => {
    const fds = () => readdirSync("/proc/self/fd").length;
    const memfds = () => readFileSync("/proc/self/maps", "utf8").split("\n").filter((l) => l.includes("memfd:wirepool")).length;
    const before = fds();
    // In a function of its own: once it returns, no frame of it keeps a view alive.
    const cycles = async () => {
      // Every cycle kills one: the restart intensity must not close the pool.
      const pool = await Pool.start({ command: [PYTHON, WORKER], workers: 2, maxRestarts: CYCLES + 10, env: { ...process.env, PYTHONPATH: join(REPO, "python") } });
      const want = pattern(4 << 20);
      const held: Buffer[] = [];
      let outcomes = 0;
      try {
        for (let i = 0; i < CYCLES; i++) {
          const view = (await pool.call("blob", Buffer.from(String(4 << 20)), { codec: "raw" })) as Buffer;
          held.push(view);
          const pid = pool.exportView().slots.find((x) => x.state === "ready")?.pid;
          assert.ok(typeof pid === "number");
          const calls = [0, 1, 2, 3].map(() => pool.call("blob", Buffer.from(String(4 << 20)), { codec: "raw" }));
          process.kill(pid, "SIGKILL");
          const settled = await Promise.allSettled(calls);
          for (const r of settled) {
            outcomes++;
            if (r.status === "fulfilled") assert.ok((r.value as Buffer).equals(want), "an answer equals the body");
            else assert.equal((r.reason as { codeName?: string }).codeName, "WORKER_EXITED", String(r.reason));
          }
          for (const v of held) assert.ok(v.equals(want), "a view of a dead worker's region reads whole");
          // The pool is back to two workers that serve.
          const again = await Promise.all([0, 1].map(() => pool.call("blob", Buffer.from(String(2 << 20)), { codec: "raw" })));
          for (const r of again) assert.equal((r as Buffer).length, 2 << 20);
        }
      } finally {
        await pool.close();
      }
      return outcomes;
    };
    assert.equal(await cycles(), CYCLES * 4);
    for (let i = 0; i < 50 && memfds() > 0; i++) {
      gc();
      await tick();
    }
    assert.equal(memfds(), 0, "no mapping of a worker's memory file once the views are collected");
    for (let i = 0; i < 3; i++) await tick();
    assert.ok(fds() <= before, `descriptors: ${fds()} open, ${before} before (a descriptor of an earlier test may close meanwhile, none may stay)`);
  });

  for (const [mode, code, name] of [
    ["bounds", 125, "SHM_BOUNDS"],
    ["overflow", 125, "SHM_BOUNDS"],
    ["no_descriptor", 124, "SHM_BAD_DESCRIPTOR"],
    ["unsealed", 124, "SHM_BAD_DESCRIPTOR"],
    ["region_zero", 123, "SHM_BAD_REGION"],
    ["body_without_message", 116, "CONTINUATION"],
    ["above_message_size", 115, "MESSAGE_TOO_LARGE"],
    ["release_not_lent", 126, "SHM_BAD_RELEASE"],
    ["retire_unknown", 126, "SHM_BAD_RELEASE"],
    ["bad_flags", 104, "BAD_FLAGS"],
  ] as const) {
    it(`a hostile worker (${mode}): the call ends PROTOCOL_VIOLATION ${name}, the parent unharmed, no descriptor left`, T, async () => {
      const fds = () => readdirSync("/proc/self/fd").length;
      const before = fds();
      const pool = await Pool.start({
        command: [PYTHON, HOSTILE, mode],
        workers: 1,
        maxFrameSize: 65536,
        maxMessageSize: 256 * 1024,
        env: { ...process.env, WIREPOOL_PYTHON: join(REPO, "python") },
      });
      try {
        await assert.rejects(pool.call("blob", Buffer.from("1"), { codec: "raw" }), (e: unknown) => {
          assert.ok(e instanceof ProtocolViolationError, String(e));
          assert.equal(e.code, ErrorCode.PROTOCOL_VIOLATION, e.message);
          assert.equal(e.protocolCode, code, e.message);
          assert.match(e.message, new RegExp(name));
          return true;
        });
      } finally {
        await pool.close();
      }
      for (let i = 0; i < 3; i++) await tick(); // the watch's duplicate closes in the loop's close phase
      assert.ok(fds() <= before, `descriptors: ${fds()} open, ${before} before (a descriptor of an earlier test may close meanwhile, none may stay)`);
    });
  }
});
