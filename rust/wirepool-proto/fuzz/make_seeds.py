#!/usr/bin/env python3
"""Build the fuzz seed corpus from spec/vectors (run after the vectors change).

seeds/decoder/<case>:    config byte (bit 7: 64 KiB limit; bits 0-6: chunk - 1) + the case's bytes
seeds/connection/<case>: config byte (bit 0: role, 1 = worker; bits 1-7: chunk - 1) + every recv
                         step of the session, concatenated
Inputs over 16 KiB are skipped to keep the committed corpus small.
Two hand-built sessions turn the shared-memory lane on (PROTOCOL.md 20), one per role.
"""
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent
VECTORS = HERE.parents[2] / "spec" / "vectors"
LIMIT = 16 * 1024


def write(target: str, name: str, data: bytes) -> None:
    if len(data) <= LIMIT:
        path = HERE / "seeds" / target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def frame(ty: int, ident: int, payload: bytes, more: bool = False) -> bytes:
    return struct.pack("<IBBHQ", len(payload), ty, 1 if more else 0, 0, ident) + payload


def shm(ty: int, ident: int, region: int, *rest: int) -> bytes:
    return frame(ty, ident, struct.pack("<II", region, 0) + b"".join(struct.pack("<Q", v) for v in rest))


def str16(text: bytes) -> bytes:
    return struct.pack("<H", len(text)) + text


WINDOW = 1 << 20
SHM_OFFER = struct.pack("<HHQ", 1, 8, WINDOW)
SHM_ACCEPT = struct.pack("<HHQQ", 1, 16, WINDOW, WINDOW)


def shm_sessions() -> dict[str, bytes]:
    """The connection target's own driver answers: the worker offers the lane, the parent
    accepts it, and each side reports one descriptor (see fuzz_targets/connection.rs)."""
    welcome = struct.pack("<HHIIIIIQ", 1, 0, 1, 65536, 64, 0, 4, 1 << 30) + SHM_ACCEPT
    worker = (frame(0x02, 0, welcome)
              + shm(0x50, 0, 1, 4096)                                     # SHM_REGION 1
              + frame(0x10, 1, struct.pack("<HBBQ", 0, 1, 0, 0), more=True)  # REQUEST prefix
              + shm(0x7E, 1, 1, 0, 100)                                   # SHM_BODY
              + shm(0x51, 0, 1, 0, 64)                                    # release its result
              + shm(0x52, 0, 1))                                          # SHM_RETIRE 1
    entry = b"\x01\x01\x01" + str16(b"echo")
    hello = (b"WIREPOOL" + struct.pack("<HHIII", 1, 1, 7, 4, 65536) + str16(b"x") + str16(b"")
             + struct.pack("<H", 1) + entry + SHM_OFFER)
    parent = (frame(0x01, 0, hello)
              + shm(0x50, 0, 1, 64)                                       # SHM_REGION 1
              + frame(0x12, 1, b"", more=True)                            # RESULT prefix
              + shm(0x7E, 1, 1, 0, 64)                                    # SHM_BODY
              + shm(0x51, 0, 1, 10, 100))                                 # release the request
    return {"shm_worker_lane": bytes([1 | (4 << 1)]) + worker,
            "shm_parent_lane": bytes([0 | (4 << 1)]) + parent}


def main() -> None:
    for target in ("decoder", "connection"):
        for old in (HERE / "seeds" / target).glob("*"):
            old.unlink()
    frames = json.loads((VECTORS / "frames.json").read_text())
    for case in frames["cases"]:
        small_limit = case.get("max_frame_size", 1 << 20) == 65536
        config = (0x80 if small_limit else 0) | 6  # chunks of 7 bytes
        write("decoder", case["name"], bytes([config]) + bytes.fromhex(case["hex"]))
    sessions = json.loads((VECTORS / "sessions.json").read_text())
    for case in sessions["cases"]:
        data = b"".join(bytes.fromhex(s["recv"]) for s in case["steps"] if "recv" in s)
        config = (1 if case["role"] == "worker" else 0) | (4 << 1)  # chunks of 5 bytes
        write("connection", case["name"], bytes([config]) + data)
    for name, data in shm_sessions().items():
        write("connection", name, data)


if __name__ == "__main__":
    main()
