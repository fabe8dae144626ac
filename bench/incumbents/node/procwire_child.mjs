// Child of the procwire baseline, written as @procwire/client's README shows.
import { Client } from "@procwire/client";
import { msgpackCodec, rawCodec } from "@procwire/codecs";
import { rowBatch, spinCpu } from "./common.mjs";
import { isFounding, rowFactory } from "./founding.mjs";

const lengthReply = (n) => {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32LE(n);
  return b;
};

const client = new Client()
  .handle("echo", async (data, ctx) => { await ctx.respond(data); }, { codec: rawCodec })
  .handle("oneway", async (data, ctx) => { await ctx.respond(lengthReply(data.length)); },
          { codec: rawCodec })
  .handle("spin", async (data, ctx) => { spinCpu(data.us); await ctx.respond({ ok: true }); },
          { codec: msgpackCodec })
  .handle("rows", async (data, ctx) => {
    if (isFounding(data.shape)) {
      // The founding workload: one row made at a time, a chunk every `batch` rows (1: the row).
      const make = rowFactory(data.shape);
      let rows = [];
      for (let i = 0; i < data.n; i++) {
        if (data.batch === 1) {
          await ctx.chunk(make(i));
          continue;
        }
        rows.push(make(i));
        if (rows.length === data.batch || i === data.n - 1) {
          await ctx.chunk(rows);
          rows = [];
        }
      }
      await ctx.end();
      return;
    }
    for (let base = 0; base < data.n; base += 256) await ctx.chunk(rowBatch(data.shape, base, data.n));
    await ctx.end();
  }, { codec: msgpackCodec, response: "stream" });

await client.start();
