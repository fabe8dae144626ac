#!/usr/bin/env python3
"""Writes the Rust, Python and Go SDKs' constant tables from spec/constants.json (section 18), as
node/scripts/gen-constants.mjs writes Node's, so that no SDK copies a number by hand.

    python3 spec/generate_constants.py          # rewrite the generated files
    python3 spec/generate_constants.py --check  # exit 1 if one is stale (make test-spec)

Outputs (never edited by hand):
- rust/wirepool-proto/src/generated.rs: scalar constants and the `error_codes!` table whose
  doc comments are section 3's "meaning" column;
- python/wirepool/_constants.py: the same constants and the ErrorCode enum;
- go/proto/constants_gen.go: the same constants in Go style (MaxCredit, DefaultMaxFrameSize),
  the ErrorCode constants, the frame-type rules, error classes and codes with their fates, and
  the core_api names as Go methods (next_event -> NextEvent), plus the table of JSON paths that
  go/proto's constants test walks.

Names are the file's keys in upper case, prefixed by their section where a bare key would be
ambiguous: limits and timing as they are (MAX_CREDIT, HEARTBEAT_MISSES), protocol defaults
DEFAULT_*, the SDK defaults of section 17 PARENT_DEFAULT_* / WORKER_DEFAULT_* (durations with
_MS), caller input (section 22) and section 6's adaptive window (adaptive_credit) as they
are (MAX_TIMEOUT_MS, MAX_STREAM_WINDOW), remote REMOTE_* and shm
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
GO_OUT = REPO / "go" / "proto" / "constants_gen.go"
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
    for key, value in c["adaptive_credit"].items():  # section 6's window rule, bare names
        if key not in ("about", "reasons"):
            out.append((key.upper(), value, "u32"))
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


GO_INITIALISMS = {"id": "ID", "ids": "IDs", "alpn": "ALPN", "sdk": "SDK", "utf8": "UTF8", "json": "JSON",
                  "cbor": "CBOR", "ipc": "IPC"}


def _go_name(snake: str) -> str:
    """next_event -> NextEvent, in_flight_ids -> InFlightIDs, REMOTE_ALPN -> RemoteALPN."""
    return "".join(GO_INITIALISMS.get(p, p.capitalize()) for p in snake.lower().split("_"))


def _go_paths() -> list[str]:
    """The JSON path of every scalar of scalars("go"), in the same order."""
    c = CONSTANTS
    out = ["protocol_version", "header.size", "flags.MORE", "flags.reserved_mask"]
    for key, value in c["limits"].items():
        out += [f"limits.{key}[0]", f"limits.{key}[1]"] if isinstance(value, list) \
            else [f"limits.{key}"]
    out += [f"timing.{k}" for k in c["timing"]]
    out += [f"protocol_defaults.{k}" for k in c["protocol_defaults"]]
    out += [f"sdk_defaults.{d['side']}.{d['name']}.{d['language']}" for d in c["sdk_defaults"]
            if d["language"] in ("all", "go") and d["value"] is not None]
    out += [f"caller_input.{k}" for k in c["caller_input"] if k != "about"]
    out += [f"remote.{k}" for k in ("ticket_prefix", "ticket_max_chars", "alpn", "join_magic",
                                    "join_version", "join_bytes")]
    out += [f"remote.sdk_defaults.{k}" for k in c["remote"]["sdk_defaults"]]
    out += [f"adaptive_credit.{k}" for k in c["adaptive_credit"] if k not in ("about", "reasons")]
    out += ["extensions.shm.tag"]
    out += [f"extensions.shm.limits.{k}" for k in c["extensions"]["shm"]["limits"]]
    return out


def _go_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return f"{value:_}"


def _go_rule(t: dict) -> str:
    direction = {"worker_to_parent": "WorkerToParent", "parent_to_worker": "ParentToWorker",
                 "both": "BothDirections"}[t["direction"]]
    ids = {"zero": "IDZero", "request": "IDRequest", "any": "IDAny"}[t["id"]]
    return (f"{{Type: 0x{t['code']:02x}, Name: {json.dumps(t['name'])}, Direction: {direction}, "
            f"ID: {ids}, MoreAllowed: {'true' if t['more_allowed'] else 'false'}, "
            f"ContinuedPrefix: {t.get('continued_prefix', -1)}, "
            f"PayloadSize: {t.get('payload_size', -1)}}},")


def go() -> str:
    c = CONSTANTS
    lines = ["// Code generated by spec/generate_constants.py from spec/constants.json; DO NOT EDIT.",
             "// `python3 spec/generate_constants.py` rewrites it; `--check` fails when it is stale.",
             "", "package proto", "",
             "// Scalar constants (spec/constants.json, PROTOCOL.md section 18). Untyped, so that",
             "// they convert to whatever integer type a field has.", "const ("]
    scalar = scalars("go")
    paths = _go_paths()
    assert len(paths) == len(scalar), (len(paths), len(scalar))
    for i, ((name, value, _), path) in enumerate(zip(scalar, paths)):
        if i:
            lines.append("")
        lines.append(f"\t// {_go_name(name)} is spec/constants.json {path}.")
        lines.append(f"\t{_go_name(name)} = {_go_value(value)}")
    lines += [")", "", "// Magic is the ASCII text every HELLO starts with (4.1).",
              f"const Magic = {json.dumps(c['magic'])}", "",
              "// The frame types of version 1 (section 2).", "const ("]
    for i, t in enumerate(c["frame_types"]):
        if i:
            lines.append("")
        lines.append(f"\t// Type{_go_name(t['name'])} is frame type 0x{t['code']:02x}.")
        lines.append(f"\tType{_go_name(t['name'])} FrameType = 0x{t['code']:02x}")
    lines += [")", "", "// The frame types of the shm extension (section 20): unknown on a connection that did",
              "// not accept it.", "const ("]
    for i, t in enumerate(c["extensions"]["shm"]["frame_types"]):
        if i:
            lines.append("")
        lines.append(f"\t// Type{_go_name(t['name'])} is frame type 0x{t['code']:02x}.")
        lines.append(f"\tType{_go_name(t['name'])} FrameType = 0x{t['code']:02x}")
    lines += [")", "", "// frameRules are the rules of every version 1 frame type, in code order.",
              "var frameRules = []FrameRule{"]
    lines += [f"\t{_go_rule(t)}" for t in c["frame_types"]]
    lines += ["}", "", "// shmFrameRules are the shm extension's frame types (section 20.3).",
              "var shmFrameRules = []FrameRule{"]
    lines += [f"\t{_go_rule(t)}" for t in c["extensions"]["shm"]["frame_types"]]
    lines += ["}", "", "// The stable error codes of section 3 (and 20.6, the shm extension's).", "const ("]
    for i, (code, name, meaning) in enumerate(error_codes()):
        if i:
            lines.append("")
        lines.append(f"\t// Code{_go_name(name)}: {meaning}.")
        lines.append(f"\tCode{_go_name(name)} ErrorCode = {code}")
    fates = {"connection_closed": "FateConnectionClosed", "request_ends": "FateRequestEnds",
             "local_only": "FateLocalOnly"}
    lines += [")", "", "// errorInfos are the error codes with their names, classes and fates.",
              "var errorInfos = []ErrorInfo{"]
    shm_names = {e["name"] for e in c["extensions"]["shm"]["error_codes"]}
    for e in sorted(c["error_codes"] + c["extensions"]["shm"]["error_codes"],
                    key=lambda e: e["code"]):
        lines.append(f"\t{{Code: {e['code']}, Name: {json.dumps(e['name'])}, "
                     f"Class: {json.dumps(e['class'])}, Fate: {fates[e['fate']]}, "
                     f"Shm: {'true' if e['name'] in shm_names else 'false'}}},")
    lines += ["}", "", "// errorClasses classify every code by range (section 3).",
              "var errorClasses = []ErrorClass{"]
    for e in c["error_classes"]:
        lines.append(f"\t{{Class: {json.dumps(e['class'])}, From: {e['from']}, To: {e['to']}, "
                     f"Sent: {'true' if e['sent'] else 'false'}, Fate: {fates[e['fate']]}}},")
    lines.append("}")
    codecs = {codec["name"]: codec["id"] for codec in c["codecs"]}
    for title, prefix, what, kind, values in (
            ("The codec ids of section 7.", "Codec", "codec id", "", codecs),
            ("The method kinds of HELLO (4.1).", "Kind", "method kind", " MethodKind",
             c["method_kinds"]),
            ("The GOODBYE reasons of section 2.", "Goodbye", "GOODBYE reason", "",
             c["goodbye_reasons"])):
        lines += ["", f"// {title}", "const ("]
        for i, (name, value) in enumerate(values.items()):
            if i:
                lines.append("")
            lines.append(f"\t// {prefix}{_go_name(name)} is {what} {value}.")
            lines.append(f"\t{prefix}{_go_name(name)}{kind} = {value}")
        lines.append(")")
    lines += ["", "// CoreAPI is section 14's operations by list, as Go names (core_api).",
              "var CoreAPI = []struct {", "\tList  string", "\tNames []string", "}{"]
    for key, names in c["core_api"].items():
        if key == "about":
            continue
        joined = ", ".join(json.dumps(_go_name(n)) for n in names)
        lines.append(f"\t{{{json.dumps(key)}, []string{{{joined}}}}},")
    lines += ["}", "", "// constantPaths ties every scalar constant to its spec/constants.json path, for the",
              "// constants test.", "var constantPaths = []struct {", "\tPath  string",
              "\tValue any", "}{"]
    for (name, _, _), path in zip(scalar, paths):
        lines.append(f"\t{{{json.dumps(path)}, {_go_name(name)}}},")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for path, text in ((RUST_OUT, rust()), (PYTHON_OUT, python()), (GO_OUT, go())):
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(REPO)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale generated constants (run python3 spec/generate_constants.py): {stale}",
              file=sys.stderr)
        return 1
    print("ok" if check else f"wrote {RUST_OUT.relative_to(REPO)}, {PYTHON_OUT.relative_to(REPO)}, "
          f"{GO_OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
