// Child of the child_process.fork baseline. Answers {op, id, ...} messages on the IPC channel.
import { rowBatch, spinCpu } from "./common.mjs";

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
    default:
      process.exit(3);
  }
});
