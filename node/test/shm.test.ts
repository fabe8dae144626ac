// The shared-memory extension's sans-IO part (PROTOCOL.md section 20) against every case of
// spec/vectors/shm.json: extension blocks, the worker's check of a WELCOME, the four frames'
// payloads (decoded, and re-encoded to the same bytes), and the receiver's checks of 20.5.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import {
  Borrower,
  CodecId,
  Connection,
  type ConnectionEvent,
  encodeFrames,
  FrameDecoder,
  FrameType,
  MethodKind,
  decodeShmFrame,
  encodeExtension,
  encodeShmFrame,
  errorName,
  HEADER_SIZE,
  Lender,
  parseExtensions,
  ProtocolError,
  Shm,
  ShmAccept,
  ShmErrorCode,
  ShmFrameType,
  ShmOffer,
} from "../src/proto/index.js";
import { loadVectors, REPO, type Json } from "./vectors.js";

/** shm.json with every integer beyond 2^53 kept exact (as a bigint). */
function loadExact(): Json[] {
  const text = readFileSync(join(REPO, "spec", "vectors", "shm.json"), "utf8");
  // Integers of 16 digits or more become strings tagged "#big:", then bigints.
  const tagged = text.replace(/([:\[,]\s*)(\d{16,})(?=\s*[,\]}])/g, '$1"#big:$2"');
  return JSON.parse(tagged, (_k, v) => (typeof v === "string" && v.startsWith("#big:") ? BigInt(v.slice(5)) : v)).cases;
}
const CASES = loadExact();
const big = (v: number | bigint) => BigInt(v);
const TYPE = ShmFrameType as Record<string, number>;

function expectError(fn: () => unknown, error: Json | null, name: string): void {
  if (error === null) {
    fn();
    return;
  }
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ProtocolError, `${name}: ${String(e)}`);
    assert.equal(e.code, error.code, `${name}: ${e.message}`);
    assert.equal(e.name, error.name, name);
    return true;
  });
}

describe("shm vectors (spec/vectors/shm.json)", () => {
  it("has cases of every kind", () => {
    const kinds = new Set(CASES.map((c) => c.kind));
    assert.deepEqual([...kinds].sort(), ["block", "borrower", "frame", "welcome_check"]);
  });

  for (const c of CASES.filter((c) => c.kind === "block")) {
    it(`block ${c.name}`, () => {
      const bytes = Buffer.from(c.hex, "hex");
      const entries = parseExtensions(bytes).map((e) => ({ tag: e.tag, data: e.data.toString("hex") }));
      assert.deepEqual(entries, c.entries);
      if (c.side === "hello") {
        const o = ShmOffer.fromTrailing(bytes);
        assert.deepEqual(o === null ? null : { window: Number(o.window) }, c.shm);
        if (o) assert.equal(ShmOffer.fromTrailing(o.encode())!.window, o.window);
      } else {
        const a = ShmAccept.fromTrailing(bytes);
        assert.deepEqual(a === null ? null : { to_worker_window: Number(a.toWorkerWindow), to_parent_window: Number(a.toParentWindow) }, c.shm);
      }
      // Re-encoding the entries gives the block back (when it was one).
      if (c.entries.length > 0)
        assert.equal(Buffer.concat(c.entries.map((e: Json) => encodeExtension(e.tag, Buffer.from(e.data, "hex")))).toString("hex"), c.hex);
    });
  }

  for (const c of CASES.filter((c) => c.kind === "welcome_check")) {
    it(`welcome_check ${c.name}`, () => {
      const offer = c.hello === null ? null : new ShmOffer(big(c.hello.window));
      const accept = c.welcome === null ? null : new ShmAccept(big(c.welcome.to_worker_window), big(c.welcome.to_parent_window));
      // Through the bytes, as a worker reads them.
      const welcome = accept === null ? null : ShmAccept.fromTrailing(accept.encode());
      expectError(() => welcome?.check(offer), c.error, c.name);
    });
  }

  for (const c of CASES.filter((c) => c.kind === "frame")) {
    it(`frame ${c.name}`, () => {
      const bytes = Buffer.from(c.hex, "hex");
      const type = bytes.readUInt8(4);
      const id = Number(bytes.readBigUInt64LE(8));
      const payload = bytes.subarray(HEADER_SIZE);
      assert.equal(bytes.readUInt32LE(0), payload.length);
      if (c.error !== null) {
        expectError(() => decodeShmFrame(type, id, payload), c.error, c.name);
        return;
      }
      const f = decodeShmFrame(type, id, payload);
      const want = c.frame;
      assert.equal(f.type, TYPE[want.type]);
      assert.equal(f.id, Number(want.id));
      assert.equal(f.region, Number(want.region));
      if ("size" in want) assert.equal(f.size, big(want.size));
      if ("offset" in want) assert.equal(f.offset, big(want.offset));
      if ("length" in want) assert.equal(f.length, big(want.length));
      assert.equal(encodeShmFrame(f).toString("hex"), c.hex);
    });
  }

  for (const c of CASES.filter((c) => c.kind === "borrower")) {
    it(`borrower ${c.name}`, () => {
      const b = new Borrower(big(c.window));
      const steps: Json[] = c.steps;
      const run = (s: Json) => {
        switch (s.op) {
          case "descriptors":
            return b.descriptorsReceived(s.n);
          case "region":
            return b.region(Number(s.region), big(s.size));
          case "body":
            return b.body(1, Number(s.region), big(s.offset), big(s.length));
          case "release":
            return b.release({ region: Number(s.region), offset: Number(s.offset), length: Number(s.length) });
          case "retire":
            return b.retire(Number(s.region));
          default:
            throw new Error(`unknown op ${s.op}`);
        }
      };
      for (const s of steps.slice(0, -1)) run(s);
      expectError(() => run(steps[steps.length - 1]), c.error, c.name);
    });
  }
});

describe("shm sans-IO beyond the vectors", () => {
  it("names the extension's codes", () => {
    for (const [name, code] of Object.entries(ShmErrorCode)) assert.equal(errorName(code), name);
  });

  it("constants match spec/constants.json", () => {
    const C = JSON.parse(readFileSync(join(REPO, "spec", "constants.json"), "utf8")).extensions.shm;
    assert.equal(Shm.tag, C.tag);
    assert.equal(Shm.maxLiveRegions, C.limits.max_live_regions);
    assert.equal(Shm.maxQueuedDescriptors, C.limits.max_queued_descriptors);
    assert.equal(Shm.maxDescriptorsPerWrite, C.limits.max_descriptors_per_write);
    assert.equal(Shm.shmThreshold, C.sdk_defaults.shm_threshold);
    for (const t of C.frame_types) assert.equal(TYPE[t.name], t.code);
  });

  it("a lender announces within the window and 64 regions, lends, takes releases, retires", () => {
    const l = new Lender(1000n);
    assert.equal(l.canAnnounce(0), false);
    const r1 = l.announce(600);
    assert.equal(r1, 1);
    assert.equal(l.canAnnounce(401), false);
    expectError(() => l.announce(401), { code: 123, name: "SHM_BAD_REGION" }, "above the window");
    const r = l.lend({ region: r1, offset: 0, length: 600 });
    expectError(() => l.lend({ region: r1, offset: 0, length: 600 }), { code: 125, name: "SHM_BOUNDS" }, "window");
    expectError(() => l.retire(r1), { code: 126, name: "SHM_BAD_RELEASE" }, "lent");
    expectError(() => l.released({ region: r1, offset: 1, length: 599 }), { code: 126, name: "SHM_BAD_RELEASE" }, "not lent");
    l.released(r);
    assert.equal(l.lentBytes, 0n);
    l.retire(r1);
    assert.equal(l.liveBytes, 0n);
    const many = new Lender(1n << 40n);
    for (let i = 0; i < Shm.maxLiveRegions; i++) many.announce(1);
    assert.equal(many.canAnnounce(1), false);
  });

  it("a hostile offset at the top of the u64 range is SHM_BOUNDS, exactly", () => {
    const b = new Borrower(1n << 30n);
    b.descriptorsReceived(1);
    b.region(1, 4096n);
    for (const [off, len] of [[(1n << 64n) - 1n, 1n], [(1n << 53n) + 1n, 1n], [4095n, 2n], [0n, 4097n], [2n ** 63n, 2n ** 63n]])
      expectError(() => b.body(3, 1, off, len), { code: 125, name: "SHM_BOUNDS" }, `${off}+${len}`);
    const r = b.body(3, 1, 4095n, 1n);
    assert.deepEqual(r, { region: 1, offset: 4095, length: 1 });
  });
});

describe("the shm entries through HELLO and WELCOME (the cores)", () => {
  const HELLO = {
    minVersion: 1, maxVersion: 1, pid: 7, maxConcurrency: 8, maxFrameSize: 1 << 20, sdkName: "test", sdkVersion: "1",
    methods: [{ name: "echo", kind: MethodKind.UNARY, codecs: [CodecId.RAW] }],
  };
  const WELCOME = { version: 1, workerId: 1, maxFrameSize: 65536, initialCredit: 4096, heartbeatMs: 0, maxInFlight: 8, maxMessageSize: 1 << 20 };
  function events(to: Connection, from: Connection): ConnectionEvent[] {
    for (const b of from.takeOutput()) to.receive(b);
    const out: ConnectionEvent[] = [];
    to.nextEvents(out);
    return out;
  }

  it("a worker's offer reaches the parent, the acceptance the worker, which checks it", () => {
    const worker = new Connection("worker");
    const parent = new Connection("parent");
    const private_ = encodeExtension(0x8001, Buffer.from("xyz"));
    worker.sendHello({ ...HELLO, extensions: Buffer.concat([new ShmOffer(1n << 30n).encode(), private_]) });
    const [hello] = events(parent, worker);
    assert.equal(hello.type, FrameType.HELLO);
    const offer = ShmOffer.fromTrailing((hello as { extensions?: Uint8Array }).extensions!);
    assert.equal(offer?.window, 1n << 30n);
    // The parent's core refuses an acceptance above the offer, and writes nothing.
    assert.throws(() => parent.sendWelcome({ ...WELCOME, extensions: new ShmAccept((1n << 30n) + 1n, 0n).encode() }), { name: "BAD_HANDSHAKE" });
    assert.equal(parent.outputLength(), 0);
    parent.sendWelcome({ ...WELCOME, extensions: new ShmAccept(1n << 29n, 1n << 30n).encode() });
    const [welcome] = events(worker, parent);
    assert.equal(welcome.type, FrameType.WELCOME);
    const accept = ShmAccept.fromTrailing((welcome as { extensions?: Uint8Array }).extensions!)!;
    assert.deepEqual([accept.toWorkerWindow, accept.toParentWindow], [1n << 29n, 1n << 30n]);
    assert.equal(worker.isOpen(), true);
  });

  it("a worker refuses a WELCOME accepting a lane it did not offer, or above its window (BAD_HANDSHAKE)", () => {
    for (const [offered, accept] of [[null, new ShmAccept(1n, 1n)], [new ShmOffer(100n), new ShmAccept(101n, 0n)]] as const) {
      const worker = new Connection("worker");
      worker.sendHello(offered ? { ...HELLO, extensions: offered.encode() } : HELLO);
      worker.takeOutput();
      // A WELCOME written by a parent that does not check: the worker's core must.
      const bytes = encodeFrames([{ type: FrameType.WELCOME, id: 0, more: false, ...WELCOME, extensions: accept.encode() }]);
      worker.receive(bytes);
      assert.throws(() => worker.nextEvent(), { name: "BAD_HANDSHAKE", code: 119 });
    }
  });

  it("frames.json's trailing-bytes cases keep their bytes as extensions, which hold no entry", () => {
    for (const name of ["hello_trailing_bytes_ignored", "welcome_trailing_bytes_ignored"]) {
      const c = loadVectors("frames.json").find((x) => x.name === name);
      const d = new FrameDecoder(1 << 20);
      d.push(Buffer.from(c.hex, "hex"));
      const f = d.next() as { extensions?: Uint8Array };
      assert.ok(f.extensions && f.extensions.length > 0, name);
      assert.deepEqual(parseExtensions(f.extensions), [], name);
    }
  });
});
