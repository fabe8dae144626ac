#!/usr/bin/env python3
"""Build the fuzz seed corpus from spec/vectors (run after the vectors change).

seeds/decoder/<case>:    config byte (bit 7: 64 KiB limit; bits 0-6: chunk - 1) + the case's bytes
seeds/connection/<case>: config byte (bit 0: role, 1 = worker; bits 1-7: chunk - 1) + every recv
                         step of the session, concatenated
Inputs over 16 KiB are skipped to keep the committed corpus small.
"""
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
VECTORS = HERE.parents[2] / "spec" / "vectors"
LIMIT = 16 * 1024


def write(target: str, name: str, data: bytes) -> None:
    if len(data) <= LIMIT:
        path = HERE / "seeds" / target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


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


if __name__ == "__main__":
    main()
