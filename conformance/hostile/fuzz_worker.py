"""A fuzzing wirepool worker: raw bytes, no SDK (stdlib only).

It sends a correct HELLO, waits for the parent's first requests (up to ``FUZZ_REQUESTS`` within
a second), then answers them with a randomly mutated frame sequence: the correct answers (RESULT
for ``echo``, ROWS then END for ``decls``) mixed with worker-to-parent frames taken from the
valid and invalid sessions of ``spec/vectors/sessions.json`` (their ids moved onto the live
requests), then bytes flipped, frames dropped, duplicated, reordered, ids, lengths, counts and
flags bent, and the whole sent in pieces split at random points. Afterwards it behaves (answers
PINGs and new requests), so whatever the parent decided, it must end every request in one
outcome, keep its memory bounded and go on serving.

``FUZZ_SEED`` (an integer) decides everything (``FUZZ_DUMP``, a file path, records the requests
and the bytes sent, to study a failing seed); ``HOSTILE_STATE`` (a per-scenario directory) lets
only the first process of a scenario fuzz, so its replacement serves. The HELLO itself is never
mutated: start-up faults are the scripted scenarios' business (``scenarios.json``).
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import time
from pathlib import Path

from hostile_worker import (CONTINUATION, END, METHODS, MORE, RESULT, ROWS, Conn,
                            die_with_parent, end_payload, frame, incarnation, rows_payload)

VECTORS = Path(__file__).resolve().parents[2] / "spec" / "vectors" / "sessions.json"
ID_OFFSET = 8  # the id field in a frame header


def split_frames(data: bytes) -> list[bytes]:
    """Whole frames of a byte string (a trailing partial frame is dropped)."""
    out, at = [], 0
    while at + 16 <= len(data):
        length = struct.unpack_from("<I", data, at)[0]
        if at + 16 + length > len(data):
            break
        out.append(data[at:at + 16 + length])
        at += 16 + length
    return out


def corpus() -> list[bytes]:
    """Worker-to-parent frames of every parent-side session vector, HELLOs left out."""
    frames: list[bytes] = []
    for case in json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]:
        if case.get("role") != "parent":
            continue
        for step in case["steps"]:
            if "recv" in step:
                frames += [f for f in split_frames(bytes.fromhex(step["recv"])) if f[4] != 0x01]
    return frames


def with_id(f: bytes, fid: int) -> bytes:
    return f[:ID_OFFSET] + struct.pack("<Q", fid) + f[16:]


def answers(requests: list[tuple[int, int, int, bytes]], mfs: int) -> list[bytes]:
    """The correct answer of each request, as frames."""
    out = []
    for rid, method, codec, body in requests:
        name = METHODS[method][0] if method < len(METHODS) else ""
        if name == "decls":
            try:
                n = min(int(json.loads(body).get("n", 0)), 1000)
            except (ValueError, AttributeError, TypeError):
                n = 0
            rows = [json.dumps({"i": i, "name": f"decl_{i}", "kind": "theorem"}).encode()
                    for i in range(n)]
            if rows:
                out.append(frame(ROWS, rid, rows_payload(rows)))
            out.append(frame(END, rid, end_payload(n, json.dumps({"rows": n}).encode())))
        elif len(body) > mfs:  # continued, so continuation gets fuzzed too
            out.append(frame(RESULT, rid, body[:mfs], MORE))
            out.append(frame(CONTINUATION, rid, body[mfs:]))
        else:
            out.append(frame(RESULT, rid, body))
    return out


def mutate(rng: random.Random, frames: list[bytes], ids: list[int]) -> list[bytes]:
    frames = list(frames)
    for _ in range(rng.randint(1, 4)):
        if not frames:
            break
        i = rng.randrange(len(frames))
        f = bytearray(frames[i])
        op = rng.choice(["flip", "flip", "drop", "dup", "swap", "length", "count", "more",
                         "id", "truncate", "type"])
        if op == "flip":
            for _ in range(rng.randint(1, 3)):
                f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        elif op == "drop":
            del frames[i]
            continue
        elif op == "dup":
            frames.insert(i, bytes(f))
        elif op == "swap" and len(frames) > 1:
            j = rng.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
            continue
        elif op == "length":
            length = struct.unpack_from("<I", f)[0]
            bent = rng.choice([length + rng.randint(-4, 4), length * 2, 0xFFFFFFFF,
                               rng.randrange(1 << 32)])
            f[0:4] = struct.pack("<I", max(0, min(bent, 0xFFFFFFFF)))
        elif op == "count" and len(f) >= 24 and f[4] in (ROWS, END):
            if f[4] == ROWS:
                count = struct.unpack_from("<I", f, 16)[0]
                f[16:20] = struct.pack("<I", rng.choice([0, count + 1, count - 1 & 0xFFFFFFFF,
                                                         0xFFFFFFFF]))
            else:
                count = struct.unpack_from("<Q", f, 16)[0]
                f[16:24] = struct.pack("<Q", rng.choice([0, count + 1, 1 << 63]))
        elif op == "more":
            f[5] ^= MORE
        elif op == "id":
            f[8:16] = struct.pack("<Q", rng.choice([0, *ids, max(ids, default=0) + 1, 1 << 62]))
        elif op == "truncate" and len(f) > 16:
            cut = rng.randrange(16, len(f))
            f = f[:cut]
            f[0:4] = struct.pack("<I", cut - 16)
        elif op == "type":
            f[4] = rng.choice([0x12, 0x13, 0x20, 0x21, 0x30, 0x31, 0x32, 0x41, 0x7F,
                               rng.randrange(256)])
        frames[i] = bytes(f)
    return frames


def fuzz(conn: Conn, rng: random.Random) -> None:
    want = int(os.environ.get("FUZZ_REQUESTS", "4"))
    requests: list[tuple[int, int, int, bytes]] = []
    deadline = time.monotonic() + 1.0
    while len(requests) < want and time.monotonic() < deadline:
        requests += conn.requests(max(0.0, deadline - time.monotonic()))
    ids = [r[0] for r in requests]
    frames = answers(requests, conn.mfs)
    pool = corpus()
    for _ in range(rng.randint(0, 4)):
        f = rng.choice(pool)
        fid = struct.unpack_from("<Q", f, ID_OFFSET)[0]
        if fid and ids:
            f = with_id(f, rng.choice(ids))
        frames.insert(rng.randint(0, len(frames)), f)
    data = b"".join(mutate(rng, frames, ids))
    dump = os.environ.get("FUZZ_DUMP")  # for a failing seed: what it answered to what
    if dump:
        with open(dump, "w") as out:
            json.dump({"requests": [[r[0], METHODS[r[1]][0] if r[1] < len(METHODS) else r[1],
                                     r[3].hex()] for r in requests], "sent": data.hex()}, out)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 6))))
    for a, b in zip([0, *cuts], [*cuts, len(data)]):
        conn.send(data[a:b])
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.02)


def main() -> None:
    die_with_parent()
    sock = socket.socket(fileno=int(os.environ.pop("WIREPOOL_FD")))
    sock.set_inheritable(False)
    state = os.environ.get("HOSTILE_STATE")
    conn = Conn(sock)
    conn.hello()
    if state is not None and incarnation(state) == 1:
        fuzz(conn, random.Random(int(os.environ.get("FUZZ_SEED", "0"))))
    conn.serve()


if __name__ == "__main__":
    main()
