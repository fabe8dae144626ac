// The in-flight id table against a Map, under random adds and removes (clustered and sparse ids).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import fc from "fast-check";

import { IdTable } from "../src/proto/idtable.js";

describe("IdTable", () => {
  it("behaves as a Map of ids", () => {
    const id = fc.oneof(fc.integer({ min: 1, max: 40 }), fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }), fc.constant(2 ** 32), fc.constant(2 ** 32 + 16));
    const op = fc.tuple(fc.constantFrom("set", "delete", "get"), id);
    fc.assert(
      fc.property(fc.array(op, { maxLength: 400 }), (ops) => {
        const t = new IdTable<number>();
        const m = new Map<number, number>();
        ops.forEach(([o, k], n) => {
          if (o === "set") {
            t.set(k, n);
            m.set(k, n);
          } else if (o === "delete") {
            assert.equal(t.delete(k), m.delete(k));
          }
          assert.equal(t.get(k), m.get(k));
          assert.equal(t.has(k), m.has(k));
          assert.equal(t.size, m.size);
        });
        assert.deepEqual(t.ids(), [...m.keys()].sort((a, b) => a - b));
        for (const [k, v] of m) assert.equal(t.get(k), v);
      }),
      { numRuns: 300 },
    );
  });
});
