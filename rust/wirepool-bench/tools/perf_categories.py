"""Where the time goes: `perf report` of a founding-parent run, its self time per symbol grouped
into categories (copies, allocation, UTF-8 validation, escaping scans, the rest of the codec,
the wirepool runtime, the kernel's socket and scheduling work), per process.

    perf record -e cpu-clock -F 2000 -g -o perf.data \\
        rust/target/release/founding-parent '<scenario with "repeats": 1500>'
    python3 rust/wirepool-bench/tools/perf_categories.py perf.data [TOP]
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict

CATEGORIES = [
    ("escaping scan (JSON strings)", r"serialize_str|skip_to_escape|format_escaped|parse_str|ignore_str"),
    ("UTF-8 validation", r"from_utf8|validate_utf8|run_utf8_validation"),
    ("copies (memcpy, socket copy in/out)", r"memmove|memcpy|_copy_to_iter|_copy_from_iter|copy_user|copy_page|_copy_from_user|_copy_to_user"),
    ("allocation and page faults", r"malloc|_int_free|\bfree\b|cfree|realloc|unlink_chunk|page_fault|clear_page|alloc_pages|do_anonymous|unmap_page|free_pages|page_counter|memcg|__munmap|mmap|zap_|folio|lru"),
    ("codec (rest)", r"serde|rmp|msgpack|Decoder|deserialize|serialize|itoa|ryu"),
    ("wirepool runtime (frames, rows, credit, tokio)", r"wirepool|tokio|founding|mio|poll_row|SendRow|RowSink"),
    ("kernel: syscalls, sockets, scheduling", r"\[k\]"),
]


def main() -> None:
    data = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "comm,sym",
                          "--stdio", "-g", "none"], capture_output=True, text=True,
                         check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(\[.\])\s+(.*)", line)
        if m:
            rows.append((float(m[1]), m[2], f"{m[3]} {m[4].strip()}"))
    cats: dict[tuple[str, str], float] = defaultdict(float)
    for pct, comm, sym in rows:
        name = next((c for c, rx in CATEGORIES if re.search(rx, sym)), "other")
        cats[(comm, name)] += pct
    for comm in sorted({c for c, _ in cats}):
        total = sum(v for (c, _), v in cats.items() if c == comm)
        print(f"{comm}: {total:.1f}% of all samples")
        for (c, name), v in sorted(cats.items(), key=lambda kv: -kv[1]):
            if c == comm:
                print(f"  {v:5.1f}%  {name}")
    print(f"top {top} symbols (self time, % of all samples):")
    for pct, comm, sym in rows[:top]:
        print(f"  {pct:5.1f}%  {comm}  {sym[:110]}")


if __name__ == "__main__":
    main()
