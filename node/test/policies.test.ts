// spec/vectors/policies.json: every case of the core's policies (PROTOCOL.md 14.5) through the
// exported pure functions, and the connection operations that use them (consumed, sendError).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import {
  CodecId,
  Connection,
  type ConnectionEvent,
  ErrorCode,
  FrameType,
  fitError,
  grant,
  MethodKind,
  negotiate,
  ProtocolError,
  rowsBatchBytes,
  streamWindow,
} from "../src/proto/index.js";
import { type Json, REPO } from "./vectors.js";

const DOC: Json = JSON.parse(readFileSync(join(REPO, "spec", "vectors", "policies.json"), "utf8"));
const C: Json = JSON.parse(readFileSync(join(REPO, "spec", "constants.json"), "utf8"));

const camel = (s: string) => s.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
const camelKeys = (o: Record<string, unknown>) => Object.fromEntries(Object.entries(o).map(([k, v]) => [camel(k), v]));
const snakeKeys = (o: object) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`), v]));
const runs = (parts: [string, number][]) => parts.map(([t, n]) => t.repeat(n)).join("");

describe("policies.json (PROTOCOL.md 14.5)", () => {
  it("the core exports every policy of core_api.policies", () => {
    const exported: Record<string, unknown> = { negotiate, rowsBatchBytes, grant, fitError, streamWindow };
    for (const name of C.core_api.policies as string[]) assert.equal(typeof exported[camel(name)], "function", name);
    assert.deepEqual(Object.keys(DOC).filter((k) => k !== "protocol_version").sort(), [...C.core_api.policies].sort());
  });

  describe("negotiate", () => {
    it("has cases", () => assert.ok(DOC.negotiate.length >= 20));
    for (const c of DOC.negotiate) {
      it(c.name, () => {
        const hello = camelKeys(c.hello) as never;
        const offer = camelKeys(c.offer) as never;
        if ("error" in c.expect) {
          let err: unknown = null;
          try {
            negotiate(hello, offer);
          } catch (e) {
            err = e;
          }
          assert.ok(err instanceof ProtocolError, `${c.doc}: expected ${c.expect.error.name}, got ${String(err)}`);
          const got: Record<string, unknown> = { code: err.code, name: err.name };
          if (err.field !== undefined) got.field = err.field;
          assert.deepEqual(got, c.expect.error, err.message);
          if (c.expect.error.field !== undefined) assert.ok(err.message.includes(c.expect.error.field), err.message);
          return;
        }
        const { welcome, clamped } = negotiate(hello, offer);
        assert.deepEqual({ welcome: snakeKeys(welcome), clamped }, c.expect, c.doc);
      });
    }
  });

  describe("rows_batch_bytes", () => {
    for (const c of DOC.rows_batch_bytes) {
      it(c.name, () => assert.equal(rowsBatchBytes(c.preferred, c.initial_credit, c.max_frame_size), c.expect));
    }
  });

  describe("grant", () => {
    for (const c of DOC.grant) {
      it(c.name, () => assert.equal(grant(c.initial_credit, c.credit, c.consumed), c.expect));
    }
  });

  describe("stream_window", () => {
    for (const c of DOC.stream_window) {
      it(c.name, () =>
        assert.equal(streamWindow(c.window, c.initial_credit, c.drained_us, c.rtt_us, c.max_stream_window, c.connection_room), c.expect),
      );
    }
  });

  describe("fit_error", () => {
    for (const c of DOC.fit_error) {
      it(c.name, () => {
        const message = runs(c.message);
        const details = runs(c.details);
        const fitted = fitError(message, details, c.max_frame_size);
        const kept = Buffer.from(message, "utf8").subarray(0, c.expect.message_bytes).toString("utf8");
        assert.equal(Buffer.byteLength(fitted.message, "utf8"), c.expect.message_bytes);
        assert.equal(fitted.message, kept);
        assert.equal(fitted.details, c.expect.details ?? details);
      });
    }
  });
});

// ---------------------------------------------------------------------------------------------
// The connection operations use them

function pair(maxFrameSize: number, initialCredit: number) {
  const parent = new Connection("parent");
  const worker = new Connection("worker");
  worker.sendHello({
    minVersion: 1, maxVersion: 1, pid: 7, maxConcurrency: 8, maxFrameSize: 16_777_216, sdkName: "test", sdkVersion: "1",
    methods: [
      { name: "echo", kind: MethodKind.UNARY, codecs: [CodecId.RAW] },
      { name: "count", kind: MethodKind.STREAM, codecs: [CodecId.RAW] },
    ],
  });
  pass(worker, parent);
  const offer = { maxFrameSize, initialCredit, heartbeatMs: 0, maxInFlight: 8, maxMessageSize: 1 << 26, workerId: 1, remote: false };
  parent.sendWelcome(negotiate(parent.hello()!, offer).welcome);
  pass(parent, worker);
  return { parent, worker };
}

function pass(from: Connection, to: Connection): ConnectionEvent[] {
  for (const b of from.takeOutput()) to.receive(b);
  const out: ConnectionEvent[] = [];
  to.nextEvents(out);
  return out;
}

describe("the core's operations follow the policies", () => {
  it("consumed: bytes read while the stream's REQUEST is still being sent are counted, granted once it is sent", () => {
    const { parent, worker } = pair(65_536, 1000);
    const cursor = parent.beginRequest(1, CodecId.RAW, 0, Buffer.alloc(200_000));
    const id = cursor.id;
    pass(parent, worker);
    assert.equal(parent.consumed(id, 300), 0, "no CREDIT inside a REQUEST being sent");
    assert.equal(parent.consumed(id, 300), 0);
    assert.equal(parent.outputLength(), 0, "nothing written");
    while (!parent.sendNextFrame(cursor));
    assert.equal(parent.consumed(id, 0), 600, "the 600 bytes counted while it was sent");
    assert.equal(parent.credit(id), 1600);
    const evs = pass(parent, worker);
    const credit = evs.find((e) => e.type === FrameType.CREDIT);
    assert.ok(credit !== undefined && "bytes" in credit && credit.bytes === 600);
  });

  it("consumed: the grant rule of grant(), and its remainder waits", () => {
    const { parent } = pair(65_536, 1000);
    const id = parent.sendRequest(1, CodecId.RAW, 0, Buffer.alloc(0));
    assert.equal(parent.consumed(id, 499), grant(1000, 1000, 499));
    assert.equal(parent.consumed(id, 1), 500);
    assert.equal(parent.credit(id), 1500);
  });

  it("sendError fits the message and details as fitError says (details under half the room kept whole)", () => {
    for (const c of DOC.fit_error) {
      const { parent, worker } = pair(c.max_frame_size, 1000);
      const id = parent.sendRequest(0, CodecId.RAW, 0, Buffer.alloc(0));
      pass(parent, worker);
      const message = runs(c.message);
      const details = runs(c.details);
      worker.sendError(id, 1000, message, details);
      const evs = pass(worker, parent);
      const e = evs.find((x) => x.type === FrameType.ERROR) as { message: string; details: string; code: number } | undefined;
      assert.ok(e !== undefined, c.name);
      const f = fitError(message, details, c.max_frame_size);
      assert.equal(e.code, 1000);
      assert.equal(e.message, f.message, c.name);
      assert.equal(e.details, f.details, c.name);
    }
  });

  it("negotiate refuses a bad offer with INVALID_ARGUMENT before anything is sent", () => {
    const hello = { minVersion: 1, maxVersion: 1, maxConcurrency: 8, maxFrameSize: 65_536 };
    assert.throws(
      () => negotiate(hello, { maxFrameSize: 65_536, initialCredit: -1, heartbeatMs: 0, maxInFlight: 8, maxMessageSize: 65_536, workerId: 1, remote: false }),
      (e: unknown) => e instanceof ProtocolError && e.code === ErrorCode.INVALID_ARGUMENT && e.field === "initial_credit",
    );
  });
});

describe("the adaptive window on a live core (section 6)", () => {
  const MIB = 1 << 20;
  const stream = () => {
    const { parent } = pair(65_536, MIB);
    const id = parent.sendRequest(1, CodecId.RAW, 0, Buffer.alloc(0));
    return { parent, id };
  };

  it("consumedAt grows a window-limited stream to the cap and shrinks it back for a slow consumer", () => {
    const { parent, id } = stream();
    for (const rtt of [150_000, 100_000, 400_000]) parent.observeRtt(rtt); // the smallest counts
    assert.equal(parent.consumedAt(id, 0, 1_000), 0, "the first read starts the clock");
    let now = 1_000;
    const windows: number[] = [];
    for (let i = 0; i < 8; i++) {
      const half = parent.window(id) / 2;
      assert.equal(parent.consumedAt(id, half - 1, now), 0, "not due yet");
      now += 50_000;
      const old = parent.window(id);
      const granted = parent.consumedAt(id, 1, now);
      assert.equal(granted, half + parent.window(id) - old);
      windows.push(parent.window(id) / MIB);
    }
    assert.deepEqual(windows, [2, 4, 8, 16, 16, 16, 16, 16]);
    const shrinking: number[] = [];
    while (parent.window(id) > MIB) {
      now += 10_000_000; // 10 s for half a window: more than 8 round trips
      const old = parent.window(id);
      const granted = parent.consumedAt(id, old / 2, now);
      assert.equal(granted, old / 2 + parent.window(id) - old);
      shrinking.push(parent.window(id) / MIB);
    }
    assert.deepEqual(shrinking, [8, 4, 2, 1]);
    parent.consumedAt(id, MIB / 2, now + 10_000_000);
    assert.equal(parent.window(id), MIB, "never below initialCredit");
  });

  it("consumedAt without a round trip, and consumed, never adapt", () => {
    const { parent, id } = stream();
    assert.equal(parent.consumedAt(id, 0, 0), 0);
    assert.equal(parent.consumedAt(id, MIB / 2, 10), MIB / 2);
    assert.equal(parent.window(id), MIB);
    parent.observeRtt(100_000);
    assert.equal(parent.consumed(id, MIB / 2), MIB / 2);
    assert.equal(parent.window(id), MIB);
    assert.equal(parent.window(id + 1), 0);
  });

  it("the connection cap bounds the sum of the windows", () => {
    const { parent } = pair(65_536, MIB);
    const a = parent.sendRequest(1, CodecId.RAW, 0, Buffer.alloc(0));
    const b = parent.sendRequest(1, CodecId.RAW, 0, Buffer.alloc(0));
    parent.setWindowCaps(16 * MIB, 3 * MIB);
    parent.observeRtt(100_000);
    for (const id of [a, b]) parent.consumedAt(id, 0, 0);
    for (let now = 1; now < 6; now++) {
      for (const id of [a, b]) parent.consumedAt(id, parent.window(id) / 2, now * 1_000);
      assert.ok(parent.window(a) + parent.window(b) <= 3 * MIB);
    }
    assert.deepEqual([parent.window(a), parent.window(b)], [2 * MIB, MIB]);
  });
});
