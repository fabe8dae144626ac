"""Child of the JSON-lines baseline: one JSON object per line on stdin, one per line on stdout.

Usage: jsonl_child.py json|orjson
"""

import sys

from common import make_row, spin_cpu

if sys.argv[1] == "orjson":
    import orjson

    loads = orjson.loads
    dumps = orjson.dumps
else:
    import json

    loads = json.loads

    def dumps(obj):
        return json.dumps(obj).encode()


def main() -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        msg = loads(line)
        op = msg["op"]
        if op == "echo":
            out.write(dumps(msg) + b"\n")
        elif op == "oneway":
            out.write(dumps({"id": msg["id"], "n": len(msg["p"])}) + b"\n")
        elif op == "rows":
            shape = msg["shape"]
            for i in range(msg["n"]):
                out.write(dumps(make_row(i, shape)) + b"\n")
            out.write(b'{"end":true}\n')
        elif op == "spin":
            spin_cpu(msg["us"])
            out.write(dumps({"id": msg["id"]}) + b"\n")
        elif op == "exit":
            return
        out.flush()


if __name__ == "__main__":
    main()
