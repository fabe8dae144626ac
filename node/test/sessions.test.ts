// spec/vectors/sessions.json: every case through the connection core, each received step fed
// whole, split in two at every position, and one byte at a time (PROTOCOL.md section 16).
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Connection, encodeFrames, ProtocolError, type Role } from "../src/proto/index.js";
import { chunkings, frameFromJson, loadVectors, toJson, type Json } from "./vectors.js";

const CASES = loadVectors("sessions.json");

type Feed = (data: Buffer, step: number) => Buffer[];

export function runSession(c: Json, feed: Feed, where = ""): void {
  const conn = new Connection(c.role as Role);
  const steps: Json[] = c.steps;
  steps.forEach((step, n) => {
    const at = `${where} step ${n}`;
    if (step.send !== undefined) {
      const frame = frameFromJson(step.send);
      conn.send(frame);
      const wire = Buffer.concat(conn.takeOutput());
      assert.equal(wire.toString("hex"), encodeFrames([frame]).toString("hex"), `${at}: sent bytes`);
      return;
    }
    const events: Json[] = [];
    let error: ProtocolError | null = null;
    try {
      if (step.eof) {
        conn.endOfInput();
      } else {
        for (const chunk of feed(Buffer.from(step.recv, "hex"), n)) {
          conn.receive(chunk);
          for (let ev = conn.nextEvent(); ev !== null; ev = conn.nextEvent()) events.push(toJson(ev, false));
        }
      }
    } catch (e) {
      if (!(e instanceof ProtocolError)) throw e;
      error = e;
    }
    assert.deepEqual(events, step.events, `${at}: events`);
    if (step.error == null) {
      assert.equal(error, null, `${at}: unexpected ${error?.name}: ${error?.message}`);
    } else {
      assert.ok(error !== null, `${at}: expected ${step.error.name}, got no error`);
      assert.deepEqual([error.code, error.name], [step.error.code, step.error.name], `${at}: ${error.message}`);
      assert.equal(n, steps.length - 1, "no step may follow an error");
      assert.equal(conn.failure(), error, "the core stays failed");
    }
  });
}

describe("sessions.json", () => {
  it("has cases", () => assert.ok(CASES.length >= 80, `${CASES.length} cases`));
  for (const c of CASES) {
    it(c.name, () => {
      runSession(c, (b) => [b], "whole");
      // Each received step under the split rule, the other steps whole.
      c.steps.forEach((step: Json, n: number) => {
        if (step.recv === undefined) return;
        const data = Buffer.from(step.recv, "hex");
        for (const [label, chunks] of chunkings(data)) {
          if (label === "whole") continue;
          runSession(c, (b, m) => (m === n ? chunks : [b]), `step ${n} ${label}`);
        }
      });
    });
  }
});
