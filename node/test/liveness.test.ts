// The liveness judge of the core (PROTOCOL.md 8.5, 14.5): both clocks and the starvation guard,
// on a clock of numbers; then the parent driver with a blocked event loop (no false WORKER_HUNG).
import assert from "node:assert/strict";
import { describe, it, test } from "node:test";

import { Connection, type Hung, Liveness, Timing } from "../src/proto/index.js";
import { Pool } from "../src/index.js";

const HB = 100;
const TICK = 10;

const nonceOf = (b: Buffer) => b.readUInt32LE(0) + b.readUInt32LE(4) * 2 ** 32;

/**
 * Ticks every 10 ms from `from` to `to`, answering every PING at once if `answer`, with the
 * reader's view `frame(now)` ([incomplete bytes, bytes in]); the first verdict, or null.
 */
function run(l: Liveness, from: number, to: number, answer: boolean, frame: (now: number) => [number, number] = () => [0, 0]): { at: number; hung: Hung } | null {
  for (let now = from; now <= to; now += TICK) {
    const [incompleteFrame, bytesIn] = frame(now);
    const t = l.tick(now, { incompleteFrame, bytesIn });
    if (t.hung !== null) return { at: now, hung: t.hung };
    if (t.ping !== null && answer) l.pong(t.ping);
  }
  return null;
}

describe("the liveness judge (8.5)", () => {
  it("uses the spec's heartbeat_misses", () => {
    assert.equal(Timing.heartbeatMisses, 3);
    assert.equal(new Liveness(HB, TICK, 0).limitMs, 3 * HB);
  });

  it("answered PINGs keep a peer alive", () => {
    const l = new Liveness(HB, TICK, 0);
    let pings = 0;
    for (let now = 10; now <= 5000; now += TICK) {
      const t = l.tick(now);
      assert.equal(t.hung, null);
      if (t.ping !== null) {
        pings++;
        l.pong(t.ping);
      }
    }
    assert.ok(pings >= 40, `a PING every heartbeat: ${pings}`);
  });

  it("a real hang: WORKER_HUNG within 3 x heartbeat_ms of the unanswered PING (plus one tick), whatever else arrives", () => {
    const l = new Liveness(HB, TICK, 0);
    // Whole frames keep arriving (bytes in grows, never an incomplete frame): no PONG.
    const v = run(l, 10, 5000, false, (now) => [0, now * 7]);
    // The first PING left at 100 ms; hung once it is more than 300 ms old.
    assert.deepEqual(v, { at: 410, hung: { clock: "pong", ms: 310 } });
  });

  it("a PONG answers its PING and every earlier one; unknown nonces are ignored", () => {
    const l = new Liveness(HB, TICK, 0);
    const pings: Buffer[] = [];
    for (let now = 10; now <= 350; now += TICK) {
      const t = l.tick(now);
      assert.equal(t.hung, null);
      if (t.ping !== null) pings.push(t.ping);
    }
    assert.deepEqual(pings.map(nonceOf), [1, 2, 3]);
    l.pong(Buffer.alloc(8, 0xff)); // never sent
    l.pong(Buffer.alloc(4)); // not a nonce
    assert.equal(l.unansweredCount, 3);
    l.pong(pings[1]); // answers 1 and 2: the clock runs from PING 3 (300)
    for (let now = 360; now <= 600; now += TICK) assert.equal(l.tick(now).hung, null, `at ${now}`);
    assert.deepEqual(l.tick(610).hung, { clock: "pong", ms: 310 });
  });

  it("the frame clock fires on a trickled frame even with PONGs answered", () => {
    const l = new Liveness(HB, TICK, 0);
    const frame = (now: number): [number, number] => (now < 1000 ? [0, 500] : [1 + (now - 1000) / TICK, 501 + (now - 1000) / TICK]);
    assert.deepEqual(run(l, 10, 5000, true, frame), { at: 1310, hung: { clock: "frame", ms: 310 } });
  });

  it("frames that complete do not run the frame clock", () => {
    const l = new Liveness(HB, TICK, 0);
    // Every tick ends inside a frame, a different one each time: 1 KiB read per tick.
    assert.equal(run(l, 10, 5000, true, (now) => [100, (now / TICK) * 1024]), null);
  });

  it("a parent that ran late does not blame the worker; a worker that stays silent is judged a heartbeat later", () => {
    let l = new Liveness(HB, TICK, 0);
    const p = l.tick(100).ping;
    assert.ok(p !== null);
    // The parent's event loop was blocked for 2 s: PONG 1 may be waiting unread in the socket.
    assert.equal(l.tick(2100).hung, null, "judged on a tick that ran late");
    l.pong(p); // the reader catches up
    assert.equal(l.tick(2110).hung, null);
    assert.equal(l.tick(2200).hung, null);
    assert.equal(l.tick(2210).hung, null);
    // Whereas a worker that stays silent is judged once a heartbeat has passed.
    l = new Liveness(HB, TICK, 0);
    l.tick(100);
    assert.equal(l.tick(2100).hung, null);
    assert.equal(l.tick(2150).hung, null);
    assert.equal(l.tick(2210).hung?.clock, "pong");
  });

  it("late by less than a heartbeat is no excuse", () => {
    const l = new Liveness(HB, TICK, 0);
    l.tick(100);
    for (let now = 180; now <= 340; now += 80) assert.equal(l.tick(now).hung, null);
    assert.deepEqual(l.tick(420).hung, { clock: "pong", ms: 320 });
  });

  it("unanswered PINGs are bounded; none is asked for while the connection cannot send", () => {
    const l = new Liveness(HB, TICK, 0);
    let now = 0;
    for (let i = 0; i < 100; i++) {
      now += 1000; // every tick late: never judged
      assert.equal(l.tick(now).hung, null);
    }
    assert.equal(l.unansweredCount, 8);
    const q = new Liveness(HB, TICK, 0);
    for (let t = 10; t <= 1000; t += TICK) assert.equal(q.tick(t, undefined, false).ping, null);
  });

  it("refuses a heartbeat of 0 (no judge then)", () => {
    assert.throws(() => new Liveness(0, TICK, 0), RangeError);
  });
});

test("a parent whose event loop was blocked for 4 x heartbeat_ms with a PING outstanding: no WORKER_HUNG, the next call succeeds", { timeout: 60_000 }, async () => {
  const fixture = new URL("./parent-fixture.js", import.meta.url).pathname;
  const hb = 100;
  // ref(): the test waits for heartbeats of an idle pool, which by default holds no process alive.
  const pool = (await Pool.start({ command: [process.execPath, fixture], workers: 1, heartbeatMs: hb })).ref();
  const exits: unknown[] = [];
  pool.on("exit", (e) => exits.push(e));
  const original = Connection.prototype.sendPing;
  let pings = 0;
  let blocked: () => void = () => {};
  const wasBlocked = new Promise<void>((resolve) => (blocked = resolve));
  try {
    assert.equal(await pool.call("echo", 1), 1);
    let armed = true;
    let afterBlock: () => void = () => {};
    let pingsAfter = 0;
    const threeMore = new Promise<void>((resolve) => (afterBlock = resolve));
    Connection.prototype.sendPing = function (this: Connection, nonce: Uint8Array) {
      original.call(this, nonce);
      pings++;
      if (!armed) {
        if (++pingsAfter >= 3) afterBlock();
        return;
      }
      armed = false;
      // The driver's flush (a microtask) writes the PING; the block comes in the check phase
      // right after, before its PONG can be read: when the loop resumes, the timers (the
      // judge's tick) run before the socket is read again. (Without the starvation guard this
      // ends WORKER_HUNG in most runs: "no PONG for 402 ms".)
      setImmediate(() => {
        const until = performance.now() + 4 * hb;
        while (performance.now() < until) {
          // busy: the parent's event loop is blocked
        }
        blocked();
      });
    };
    await wasBlocked;
    assert.equal(await pool.call("echo", 2), 2, "the next call");
    await threeMore; // the heartbeat goes on past the guard's window
    assert.equal(await pool.call("echo", 3), 3);
    assert.deepEqual(exits, [], "no worker was judged hung");
    assert.equal(pool.metrics().restarts, 0);
    assert.ok(pings >= 4);
  } finally {
    Connection.prototype.sendPing = original;
    await pool.close({ graceMs: 0 });
  }
});
