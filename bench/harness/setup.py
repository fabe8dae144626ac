"""The bench installs its own tools: a venv (bench/.venv), npm packages (bench/incumbents/node), the floor.

Each step is skipped when a stamp file says its inputs have not changed. A failed step is
returned as a reason, so the runners that need it show up as "not available: <reason>".
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
VENV = BENCH / ".venv"
BUILD = BENCH / ".build"
NODE_DIR = BENCH / "incumbents" / "node"


def venv_python() -> Path:
    return VENV / "bin" / "python"


def in_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes() if p.exists() else b"-")
    return h.hexdigest()


def _stamped(stamp: Path, digest: str) -> bool:
    return stamp.exists() and stamp.read_text() == digest


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def ensure_venv(log=print) -> str | None:
    """Create bench/.venv and install bench/requirements.txt. Returns None or a failure reason."""
    req = BENCH / "requirements.txt"
    stamp = VENV / ".requirements.sha256"
    digest = _digest(req)
    if venv_python().exists() and _stamped(stamp, digest):
        return None
    log("bench: creating bench/.venv and installing bench/requirements.txt")
    if not venv_python().exists():
        r = subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            return f"python3 -m venv failed: {_tail(r.stderr)}"
    r = subprocess.run([str(venv_python()), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "-r", str(req)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"pip install failed: {_tail(r.stderr)}"
    stamp.write_text(digest)
    return None


def ensure_npm(log=print) -> str | None:
    npm = shutil.which("npm")
    if npm is None:
        return "npm not found on PATH"
    lock = NODE_DIR / "package-lock.json"
    stamp = NODE_DIR / "node_modules" / ".bench-lock.sha256"
    digest = _digest(NODE_DIR / "package.json", lock)
    if _stamped(stamp, digest):
        return None
    log("bench: installing npm packages into bench/incumbents/node (npm ci)")
    cmd = [npm, "ci" if lock.exists() else "install", "--no-audit", "--no-fund"]
    r = subprocess.run(cmd, cwd=NODE_DIR, capture_output=True, text=True)
    if r.returncode != 0:
        return f"{' '.join(cmd[1:2])} failed: {_tail(r.stderr)}"
    stamp.write_text(digest)
    return None


def ensure_floor(log=print) -> tuple[Path, str | None]:
    src = BENCH / "runners" / "floor.c"
    out = BUILD / "floor"
    stamp = BUILD / "floor.sha256"
    digest = _digest(src)
    if out.exists() and _stamped(stamp, digest):
        return out, None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return out, "no C compiler (cc/gcc) on PATH"
    BUILD.mkdir(exist_ok=True)
    log("bench: building the floor (runners/floor.c)")
    r = subprocess.run([cc, "-O2", "-o", str(out), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        return out, f"cc failed: {_tail(r.stderr)}"
    stamp.write_text(digest)
    return out, None


RUST_CHILD_DIR = BENCH / "jsonl-rust-child"


def rust_child_path() -> Path:
    return BUILD / "cargo" / "release" / "jsonl-rust-child"


def ensure_rust_child(log=print) -> str | None:
    """Build the Rust child of the JSON-lines baseline with cargo (crates from crates.io)."""
    cargo = shutil.which("cargo")
    if cargo is None:
        return "cargo not found on PATH"
    stamp = BUILD / "jsonl-rust-child.sha256"
    digest = _digest(RUST_CHILD_DIR / "Cargo.toml", RUST_CHILD_DIR / "Cargo.lock",
                     RUST_CHILD_DIR / "src" / "main.rs")
    if rust_child_path().exists() and _stamped(stamp, digest):
        return None
    BUILD.mkdir(exist_ok=True)
    log("bench: building the Rust JSON-lines child (cargo build --release)")
    r = subprocess.run([cargo, "build", "--release", "--quiet", "--manifest-path",
                        str(RUST_CHILD_DIR / "Cargo.toml"), "--target-dir", str(BUILD / "cargo")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"cargo build failed: {_tail(r.stderr)}"
    stamp.write_text(_digest(RUST_CHILD_DIR / "Cargo.toml", RUST_CHILD_DIR / "Cargo.lock",
                             RUST_CHILD_DIR / "src" / "main.rs"))
    return None
