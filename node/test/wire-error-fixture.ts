// A worker for test/wire-error.test.ts, on the bare core: the SDK's Worker never sends a code
// below 1000 for a handler (it becomes HANDLER_ERROR), so this one writes what a foreign worker
// may: method "fail" answers ERROR with the code its JSON body names (any u32, 300 included);
// "echo" answers its body. It serves on WIREPOOL_FD until end of file.

import { Socket } from "node:net";
import { Connection } from "../src/proto/index.js";
import { CodecId, FrameType, MethodKind } from "../src/proto/constants.js";

const fd = Number(process.env.WIREPOOL_FD);
const sock = new Socket({ fd, readable: true, writable: true });
const conn = new Connection("worker");
const methods = ["echo", "fail"];

function flush(): void {
  for (const b of conn.takeOutput()) sock.write(b);
}

conn.sendHello({
  minVersion: 1, maxVersion: 1, pid: process.pid, maxConcurrency: 64, maxFrameSize: 1 << 20,
  sdkName: "wire-error-fixture", sdkVersion: "0",
  methods: methods.map((name) => ({ name, kind: MethodKind.UNARY, codecs: [CodecId.JSON] })),
});
flush();
sock.on("data", (chunk: Buffer) => {
  conn.receive(chunk);
  for (let ev = conn.nextEvent(); ev !== null; ev = conn.nextEvent()) {
    if (ev.type === FrameType.PING) conn.sendPong(ev.nonce);
    else if (ev.type === FrameType.REQUEST) {
      if (methods[ev.method] === "fail") conn.sendError(ev.id, Number(JSON.parse(ev.body.toString())), "sent by the worker");
      else conn.sendResult(ev.id, ev.body);
    } else if (ev.type === FrameType.DRAIN) conn.sendGoodbye(0);
  }
  flush();
});
sock.on("end", () => process.exit(0));
sock.on("error", () => process.exit(0));
