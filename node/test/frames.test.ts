// spec/vectors/frames.json: every case decoded whole, split in two at every position and one
// byte at a time (PROTOCOL.md section 16), every valid case re-encoded byte for byte.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { encodeFrames } from "../src/proto/index.js";
import { chunkings, decodeAll, frameFromJson, loadVectors } from "./vectors.js";

const CASES = loadVectors("frames.json");

describe("frames.json", () => {
  it("has cases", () => assert.ok(CASES.length >= 100, `${CASES.length} cases`));
  for (const c of CASES) {
    it(c.name, () => {
      const data = Buffer.from(c.hex, "hex");
      let runs = 0;
      for (const [label, chunks] of chunkings(data)) {
        const { frames, error } = decodeAll(chunks, c.max_frame_size);
        assert.deepEqual(frames, c.frames, `${label}: frames`);
        if (c.error === null) {
          assert.equal(error, null, `${label}: unexpected ${error?.name}: ${error?.message}`);
        } else {
          assert.ok(error !== null, `${label}: expected ${c.error.name}, got no error`);
          assert.deepEqual([error.code, error.name], [c.error.code, c.error.name], `${label}: ${error.message}`);
        }
        runs++;
      }
      assert.ok(runs >= 1);
      if (c.error === null && !c.decode_only) {
        const encoded = encodeFrames(c.frames.map(frameFromJson));
        assert.equal(encoded.toString("hex"), c.hex, "re-encoded");
      }
    });
  }
});
