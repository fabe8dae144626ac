// Child of the child_process.fork baseline. Answers {op, id, ...} messages on the IPC channel.
import { rowBatch, spinCpu } from "./common.mjs";
import { rowFactory } from "./founding.mjs";

// process.send returns false when the channel's backlog is too large; Node's docs say to use the
// callback for flow control, so the row producer waits for it before sending more.
function sendWithBackpressure(msg) {
  let accepted = true;
  const sent = new Promise((resolve) => {
    accepted = process.send(msg, (err) => resolve(err));
  });
  return accepted ? null : sent;
}

process.on("message", async (m) => {
  switch (m.op) {
    case "echo":
      process.send(m);
      break;
    case "oneway":
      process.send({ id: m.id, n: m.p.length });
      break;
    case "spin":
      spinCpu(m.us);
      process.send({ id: m.id });
      break;
    case "rows": {
      for (let base = 0; base < m.n; base += 256) {
        const wait = sendWithBackpressure(rowBatch(m.shape, base, m.n));
        if (wait) await wait;
      }
      process.send({ id: m.id, end: true });
      break;
    }
    case "founding_rows": {
      // The founding workload: one row made at a time, sent every `batch` rows (1: a message
      // per row, as a one-row array so it cannot be mistaken for a reply).
      const make = rowFactory(m.shape);
      let rows = [];
      for (let i = 0; i < m.n; i++) {
        rows.push(make(i));
        if (rows.length === m.batch || i === m.n - 1) {
          const wait = sendWithBackpressure(rows);
          rows = [];
          if (wait) await wait;
        }
      }
      process.send({ id: m.id, end: true });
      break;
    }
    default:
      process.exit(3);
  }
});
