"""Rows/s of decoding ROWS frames of 97-byte rows with wirepool.proto (pure Python).

    python bench/bench_proto.py
"""

from __future__ import annotations

import time

from wirepool import proto


def main() -> None:
    row = bytes(range(97))
    builder = proto.RowsBuilder(proto.DEFAULT_MAX_FRAME_SIZE)
    while builder.append(row):
        pass
    count = builder.count
    frame = bytes(builder.take(1))
    frames = 200
    data = frame * frames
    dec = proto.FrameDecoder(proto.DEFAULT_MAX_FRAME_SIZE)

    t0 = time.perf_counter()
    dec.receive(data)
    n = 0
    while (f := dec.next_frame()) is not None:
        n += f.count
    t_validate = time.perf_counter() - t0

    dec = proto.FrameDecoder(proto.DEFAULT_MAX_FRAME_SIZE)
    t0 = time.perf_counter()
    dec.receive(data)
    m = 0
    total = 0
    while (f := dec.next_frame()) is not None:
        for r in f:
            total += len(r)
        m += f.count
    t_slices = time.perf_counter() - t0
    assert n == m == count * frames and total == 97 * m

    t0 = time.perf_counter()
    b = proto.RowsBuilder(proto.DEFAULT_MAX_FRAME_SIZE)
    built = 0
    for _ in range(count * 50):
        if not b.append(row):
            b.take(1)
            b.append(row)
        built += 1
    t_build = time.perf_counter() - t0

    print(f"ROWS frames of {count} x 97-byte rows, {frames} frames ({len(data) / 2**20:.0f} MiB)")
    print(f"  decode + validate:            {n / t_validate / 1e6:6.2f} M rows/s")
    print(f"  decode + validate + slices:   {m / t_slices / 1e6:6.2f} M rows/s")
    print(f"  encode (RowsBuilder.append):  {built / t_build / 1e6:6.2f} M rows/s")


if __name__ == "__main__":
    main()
