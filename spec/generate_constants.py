#!/usr/bin/env python3
"""Writes the Rust and Python SDKs' constant tables from spec/constants.json (section 18), as
node/scripts/gen-constants.mjs writes Node's, so that no SDK copies a number by hand.

    python3 spec/generate_constants.py          # rewrite the generated files
    python3 spec/generate_constants.py --check  # exit 1 if one is stale (make test-spec)

Outputs (never edited by hand):
- rust/wirepool-proto/src/generated.rs: scalar constants and the `error_codes!` table whose
  doc comments are section 3's "meaning" column;
- python/wirepool/_constants.py: the same constants and the ErrorCode enum.

Names are the file's keys in upper case, prefixed by their section where a bare key would be
ambiguous: limits and timing as they are (MAX_CREDIT, HEARTBEAT_MISSES), protocol defaults
DEFAULT_*, the SDK defaults of section 17 PARENT_DEFAULT_* / WORKER_DEFAULT_* (with the unit:
_MS, _BYTES), caller input (section 22) as it is (MAX_TIMEOUT_MS), remote REMOTE_* and shm
SHM_*. A [lo, hi] range becomes *_MIN and *_MAX.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SPEC = Path(__file__).resolve().parent
REPO = SPEC.parent
CONSTANTS = json.loads((SPEC / "constants.json").read_text(encoding="utf-8"))
RUST_OUT = REPO / "rust" / "wirepool-proto" / "src" / "generated.rs"
PYTHON_OUT = REPO / "python" / "wirepool" / "_constants.py"
UNITS = {"ms": "_MS", "bytes": "", "count": "", "cpus": ""}


def scalars(language: str) -> list[tuple[str, object, str]]:
    """(NAME, value, rust type) for every scalar constant, in file order."""
    c = CONSTANTS
    out: list[tuple[str, object, str]] = [("PROTOCOL_VERSION", c["protocol_version"], "u16"),
                                          ("HEADER_SIZE", c["header"]["size"], "usize"),
                                          ("FLAG_MORE", c["flags"]["MORE"], "u8"),
                                          ("FLAGS_RESERVED_MASK", c["flags"]["reserved_mask"],
                                           "u8")]
    sizes = {"max_credit": "i64", "max_methods": "usize", "max_codecs_per_method": "usize",
             "error_message_max_bytes": "usize", "nonce_bytes": "usize",
             "hello_fixed_bytes": "usize", "welcome_bytes": "usize",
             "request_prefix_bytes": "usize"}
    for key, value in c["limits"].items():
        if isinstance(value, list):
            out += [(f"{key.upper()}_MIN", value[0], "usize"),
                    (f"{key.upper()}_MAX", value[1], "usize")]
        else:
            out.append((key.upper(), value, sizes.get(key, "u32")))
    for key, value in c["timing"].items():
        out.append((key.upper(), value, "u32"))
    for key, value in c["protocol_defaults"].items():
        out.append((f"DEFAULT_{key.upper()}", value, "u64" if "message" in key else "u32"))
    for d in c["sdk_defaults"]:
        if d["language"] not in ("all", language) or d["value"] is None:
            continue
        name = d["name"].upper()
        suffix = UNITS[d["unit"]]
        if suffix and name.endswith(suffix):
            suffix = ""
        rust = "u64" if d["unit"] == "ms" else ("u64" if "message" in d["name"] else "u32")
        out.append((f"{d['side'].upper()}_DEFAULT_{name}{suffix}", d["value"], rust))
    for key, value in c["caller_input"].items():
        if key != "about":
            out.append((key.upper(), value, "u64" if value > 2**32 else "u32"))
    remote = c["remote"]
    out += [("REMOTE_TICKET_PREFIX", remote["ticket_prefix"], "&str"),
            ("REMOTE_TICKET_MAX_CHARS", remote["ticket_max_chars"], "usize"),
            ("REMOTE_ALPN", remote["alpn"], "&str"),
            ("REMOTE_JOIN_MAGIC", remote["join_magic"], "&str"),
            ("REMOTE_JOIN_VERSION", remote["join_version"], "u16"),
            ("REMOTE_JOIN_BYTES", remote["join_bytes"], "usize")]
    for key, value in remote["sdk_defaults"].items():
        out.append((f"REMOTE_DEFAULT_{key.upper()}", value, "u64"))
    shm = c["extensions"]["shm"]
    out.append(("SHM_TAG", shm["tag"], "u16"))
    for key, value in shm["limits"].items():
        out.append((f"SHM_{key.upper()}", value, "usize"))
    names = [n for n, _, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, f"two constants named {dup}"
    return out


def error_codes() -> list[tuple[int, str, str]]:
    """(code, NAME, meaning) of section 3 and section 20.6, in code order."""
    doc = (SPEC / "PROTOCOL.md").read_text(encoding="utf-8")
    meaning = {m.group(2): m.group(3).strip()
               for m in re.finditer(r"^\| (\d{3}) \| ([A-Z0-9_]+) \| (.*?) \|$", doc, re.M)}
    codes = CONSTANTS["error_codes"] + CONSTANTS["extensions"]["shm"]["error_codes"]
    missing = [e["name"] for e in codes if e["name"] not in meaning]
    assert not missing, f"no meaning in PROTOCOL.md for {missing}"
    return sorted((e["code"], e["name"], meaning[e["name"]]) for e in codes)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _rust_doc(text: str) -> str:
    text = text[0].upper() + text[1:]
    return text if text.endswith(".") else text + "."


def rust() -> str:
    lines = ["// GENERATED by spec/generate_constants.py from spec/constants.json: do not edit by",
             "// hand. `python3 spec/generate_constants.py` rewrites it; `--check` (make test-spec)",
             "// fails when it is stale.", ""]
    for name, value, kind in scalars("rust"):
        lines.append(f"/// `spec/constants.json`: {name.lower()}.")
        if kind == "&str":
            lines.append(f"pub const {name}: &str = {json.dumps(value)};")
        else:
            lines.append(f"pub const {name}: {kind} = {value:_};")
    lines += ["", "error_codes! {"]
    for code, name, meaning in error_codes():
        lines.append(f"    /// {_rust_doc(meaning)}")
        lines.append(f"    {_camel(name)} = {code} => \"{name}\",")
    lines.append("}")
    return "\n".join(_wrap(lines)) + "\n"


def python() -> str:
    lines = ['"""GENERATED by spec/generate_constants.py from spec/constants.json: do not edit by',
             'hand. ``python3 spec/generate_constants.py`` rewrites it; ``--check`` (make',
             'test-spec) fails when it is stale."""', "", "from __future__ import annotations",
             "", "import enum", ""]
    for name, value, _ in scalars("python"):
        lines.append(f"{name} = {json.dumps(value) if isinstance(value, str) else f'{value:_}'}")
    lines += ["", "", "class ErrorCode(enum.IntEnum):",
              '    """The stable codes of PROTOCOL.md section 3 (and 20.6: the shm extension\'s)."""',
              ""]
    for code, name, meaning in error_codes():
        lines.append(f"    {name} = {code}  # {meaning}")
    return "\n".join(_wrap(lines, "    #")) + "\n"


def _wrap(lines: list[str], _comment: str = "") -> list[str]:
    """Lines stay within 100 characters (rustfmt's and the Python linters' width): a long
    trailing comment or doc line is cut at a word."""
    out: list[str] = []
    for line in lines:
        while len(line) > 100:
            lead = re.match(r"\s*(///|#)?\s*", line)
            assert lead is not None
            prefix = lead.group(0) if lead.group(1) else ""
            cut = line.rfind(" ", 0, 100)
            if "  # " in line and not prefix:
                head, comment = line.split("  # ", 1)
                indent = re.match(r"\s*", head).group(0)  # type: ignore[union-attr]
                out.append(f"{indent}# {comment}")
                line = head
                continue
            if not prefix or cut <= len(prefix):
                break
            out.append(line[:cut])
            line = prefix + line[cut + 1:]
        out.append(line)
    return out


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for path, text in ((RUST_OUT, rust()), (PYTHON_OUT, python())):
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(REPO)))
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale generated constants (run python3 spec/generate_constants.py): {stale}",
              file=sys.stderr)
        return 1
    print("ok" if check else f"wrote {RUST_OUT.relative_to(REPO)}, {PYTHON_OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
