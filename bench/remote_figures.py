"""Records the remote figures of issue 14 in bench/remote/figures.md, which the bench report
includes (bench/harness/report.py, section "Remote workers").

    .venv/bin/python bench/remote_figures.py [--only tls_rust,tls_rust_parent,tls_python,
                                                     ray_w5,listener] [--repeats 5]

Runs, one after the other, each in its own process, and keeps each one's table as it printed it:

- ``tls_rust``: ``bench/remote_tls.py --worker rust`` (W2, W3, W4 over TLS and plain TCP beside
  the socketpair path, with and without the shared-memory lane; Python parent, the release Rust
  bench worker, built by ``bench/runners/wirepool_rust.sh --prepare``);
- ``tls_rust_parent``: ``remote_tls`` of ``wirepool-bench`` (the same table with the Rust
  parent: ``cargo build --release -p wirepool-bench`` first; ``CARGO_TARGET_DIR`` is honoured);
- ``tls_python``: ``bench/remote_tls.py`` with the Python bench worker;
- ``ray_w5``: ``bench/ray_pool.py`` (W5 CPU-bound tasks on a Ray-launched pool, a local pool and
  ``ray.util.multiprocessing.Pool``; needs Ray in the venv: ``make test-ray`` installs it);
- ``listener``: ``bench/remote_listener.py`` (the listener's bad-input figures).

Each section says when and at which commit it was measured and the load average around it: the
figures are ratios within one script's run (alternated repeats), and the absolute numbers of a
shared 2-vCPU machine move from one run to the next. ``--only`` re-measures some sections and
keeps the others' last recording.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
FIGURES = BENCH / "remote" / "figures.md"

SECTIONS: dict[str, tuple[str, list[str]]] = {
    "tls_rust": ("W2, W3, W4 over TLS: Python parent, Rust worker",
                 ["bench/remote_tls.py", "--worker", "rust"]),
    "tls_rust_parent": ("W2, W3, W4 over TLS: Rust parent, Rust worker",
                        ["{cargo_target}/release/remote_tls"]),
    "tls_python": ("W2, W3, W4 over TLS: Python parent, Python worker",
                   ["bench/remote_tls.py", "--worker", "python"]),
    "ray_w5": ("W5 on a Ray-launched pool beside a local pool and Ray's own pool",
               ["bench/ray_pool.py"]),
    "listener": ("The listener under a hostile crowd (PROTOCOL.md 21.4)",
                 ["bench/remote_listener.py"]),
}
REPEATABLE = {"tls_rust", "tls_rust_parent", "tls_python", "ray_w5"}
MARK = "<!-- section: {} -->"


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True,
                              text=True).stdout.strip()
    dirty = " (dirty tree)" if git("status", "--porcelain", "--untracked-files=no") else ""
    return git("rev-parse", "--short", "HEAD") + dirty


def measure(key: str, repeats: int) -> str:
    title, argv = SECTIONS[key]
    argv = [*argv, *(["--repeats", str(repeats)] if key in REPEATABLE else [])]
    if argv[0].startswith("{cargo_target}"):  # a binary of the Rust workspace
        target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "rust" / "target"))
        full = [argv[0].replace("{cargo_target}", target), *argv[1:]]
        command = " ".join([argv[0].replace("{cargo_target}", "$CARGO_TARGET_DIR"), *argv[1:]])
    else:
        full = [sys.executable, *argv]
        command = " ".join([".venv/bin/python", *argv])
    started, before = dt.datetime.now(dt.timezone.utc), _load()
    try:
        done = subprocess.run(full, cwd=REPO, capture_output=True, text=True)
    except OSError as e:  # not built
        done = subprocess.CompletedProcess(full, 127, "", str(e))
    after = _load()
    lines = [f"### {title}", "",
             f"`{command}`, {started:%Y-%m-%d %H:%M} UTC, commit {_commit()}, load average "
             f"{before} before, {after} after"
             + ("" if done.returncode == 0 else f"; **exit status {done.returncode}**"), "",
             "```", done.stdout.rstrip()]
    if done.returncode != 0:
        lines.append(done.stderr.rstrip()[-2000:])
    lines.append("```")
    return "\n".join(lines)


def parse(text: str) -> dict[str, str]:
    """The sections of a figures file, by key (each without its marker line)."""
    return {m.group(1): m.group(2).rstrip("\n") for m in re.finditer(
        r"<!-- section: (\w+) -->\n(.*?)(?=<!-- section: |\Z)", text, re.S)}


def compose(sections: dict[str, str]) -> str:
    """The figures file: its title, then the sections in SECTIONS' order."""
    body = ["# Remote workers: recorded figures (issue 14)", "",
            "Written by `bench/remote_figures.py`; the bench report includes this file. Each "
            "section is one script's run; compare figures within a section only.", ""]
    for key in SECTIONS:
        if key in sections:
            body += [MARK.format(key), sections[key], ""]
    return "\n".join(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    keys = [k for k in args.only.split(",") if k]
    unknown = sorted(set(keys) - set(SECTIONS))
    if unknown:
        sys.exit(f"unknown sections {unknown}: {sorted(SECTIONS)}")
    sections = parse(FIGURES.read_text(encoding="utf-8")) if FIGURES.exists() else {}
    for key in keys:
        print(f"measuring {key} ...", file=sys.stderr, flush=True)
        sections[key] = measure(key, args.repeats)
    FIGURES.parent.mkdir(exist_ok=True)
    FIGURES.write_text(compose(sections), encoding="utf-8")
    print(FIGURES)


if __name__ == "__main__":
    main()
