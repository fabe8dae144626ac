"""Every implementation the harness measures. Adding one is one entry here.

argv placeholders: {python} the bench venv's interpreter, {node} node, {bench} the bench/ folder,
{floor} the compiled floor binary, {jsonl_rust_child} the Rust JSON-lines child. The scenario JSON is appended as the last argument.

An entry with `discover` instead of `argv` is looked up as bench/runners/<discover>.<ext>
(.py -> {python}, .mjs/.js -> {node}, .sh -> bash, anything else executed directly) and called
once with `--prepare` before the run (build it there; exit 0 when nothing to do). A registered
runner whose file or setup is missing is reported as "not available", never skipped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Runner:
    name: str
    # "floor" (the physical floor), "incumbent" (a baseline), "wirepool" (ours), "codec" (the
    # founding workload's codec alone, one process: the microbenchmark beside the end to end)
    kind: str
    label: str
    argv: tuple[str, ...] = ()
    discover: str | None = None
    needs: tuple[str, ...] = field(default=())  # setup: "venv", "npm", "floor", "cargo"


RUNNERS: list[Runner] = [
    Runner("floor_c", "floor", "C floor: fork + socketpair, u32 length",
           ("{python}", "{bench}/runners/floor_c.py", "{floor}"), needs=("floor",)),
    Runner("jsonl_py", "incumbent", "JSON lines over stdio (Python json)",
           ("{python}", "{bench}/runners/jsonl_py.py", "json")),
    Runner("jsonl_orjson", "incumbent", "JSON lines over stdio (Python orjson)",
           ("{python}", "{bench}/runners/jsonl_py.py", "orjson"), needs=("venv",)),
    Runner("jsonl_rust_child", "incumbent",
           "JSON lines over stdio, Python parent (orjson) + Rust child (serde_json)",
           ("{python}", "{bench}/runners/jsonl_py.py", "orjson", "--child", "{jsonl_rust_child}"),
           needs=("venv", "cargo")),
    Runner("node_fork_json", "incumbent", "Node child_process.fork, 'json'",
           ("{node}", "{bench}/incumbents/node/fork_parent.mjs", "json")),
    Runner("node_fork_advanced", "incumbent", "Node child_process.fork, 'advanced'",
           ("{node}", "{bench}/incumbents/node/fork_parent.mjs", "advanced")),
    Runner("mp_pool", "incumbent", "Python multiprocessing.Pool",
           ("{python}", "{bench}/runners/mp_py.py", "pool")),
    Runner("process_pool_executor", "incumbent", "Python ProcessPoolExecutor",
           ("{python}", "{bench}/runners/mp_py.py", "ppe")),
    Runner("mp_pipe", "incumbent", "Python multiprocessing Process + Pipe",
           ("{python}", "{bench}/runners/mp_py.py", "pipe")),
    Runner("procwire", "incumbent", "procwire 1.5 (npm), Node parent + child",
           ("{node}", "{bench}/incumbents/node/procwire_parent.mjs"), needs=("npm",)),
    # ipc-channel (Rust, serde + bincode), the incumbent of the Rust x Rust rows (issue 17), W4
    # only: rows batched by hand 256 per message (its --prepare builds the program), and one row
    # per message (uses that build).
    Runner("ipc_channel", "incumbent", "ipc-channel (Rust), rows batched by hand, 256 per message",
           discover="ipc_channel"),
    Runner("ipc_channel_unbatched", "incumbent", "ipc-channel (Rust), one row per message",
           ("{python}", "{bench}/runners/ipc_channel.py", "--batch", "1")),
    # The founding workload's incumbents one row per message (bench/shapes/founding.json only),
    # beside the hand-batched variants above (256 rows per message).
    Runner("mp_pipe_unbatched", "incumbent", "Python multiprocessing Process + Pipe, one row per message",
           ("{python}", "{bench}/runners/mp_py.py", "pipe1")),
    Runner("node_fork_json_unbatched", "incumbent", "Node child_process.fork, 'json', one row per message",
           ("{node}", "{bench}/incumbents/node/fork_parent.mjs", "json", "--batch", "1")),
    Runner("node_fork_advanced_unbatched", "incumbent",
           "Node child_process.fork, 'advanced', one row per message",
           ("{node}", "{bench}/incumbents/node/fork_parent.mjs", "advanced", "--batch", "1")),
    Runner("procwire_unbatched", "incumbent", "procwire 1.5 (npm), one row per stream chunk",
           ("{node}", "{bench}/incumbents/node/procwire_parent.mjs", "--batch", "1"), needs=("npm",)),
    # The founding workload's codec alone, per language (encode + decode in one process, the
    # SDK's own codec functions): the Rust one is wirepool-bench's founding-codec, built by
    # wirepool_rust's --prepare.
    Runner("codec_rust", "codec", "codec alone, Rust (wirepool_codec into serde structs)",
           ("bash", "{bench}/runners/wirepool_rust.sh", "--founding-codec")),
    Runner("codec_python", "codec", "codec alone, Python (wirepool.codecs into dicts)",
           ("{python}", "{bench}/runners/codec_py.py"), needs=("venv",)),
    Runner("codec_node", "codec", "codec alone, Node (node/dist codecs into objects)",
           ("{node}", "{bench}/runners/codec_node.mjs")),
    Runner("wirepool_rust", "wirepool", "wirepool, Rust parent + Rust worker",
           discover="wirepool_rust"),
    Runner("wirepool_rust_pyworker", "wirepool", "wirepool, Rust parent + Python worker",
           discover="wirepool_rust_pyworker", needs=("venv",)),
    Runner("wirepool_python", "wirepool", "wirepool, Python parent + Python worker",
           discover="wirepool_python", needs=("venv",)),
    # The blocking Pool.call, one call at a time (W1 only; "unsupported" elsewhere).
    Runner("wirepool_python_sync", "wirepool", "wirepool, Python parent (blocking Pool.call) + Python worker",
           ("{python}", "{bench}/runners/wirepool_python.py", "--sync"), needs=("venv",)),
    # The Rust worker binary is built by wirepool_rust's --prepare (run before any scenario);
    # without it this runner answers "unsupported" with the reason.
    Runner("wirepool_python_rsworker", "wirepool", "wirepool, Python parent + Rust worker",
           ("{python}", "{bench}/runners/wirepool_python.py", "--worker", "rust"), needs=("venv",)),
    # A Node parent (node/'s Pool): --prepare builds node/dist; the Rust worker as above.
    Runner("wirepool_node", "wirepool", "wirepool, Node parent + Node worker",
           discover="wirepool_node"),
    Runner("wirepool_node_rsworker", "wirepool", "wirepool, Node parent + Rust worker",
           ("{node}", "{bench}/runners/wirepool_node.mjs", "--worker", "rust")),
    # Node workers under the other parents: the first --prepare builds the Rust bench and
    # node/dist; the Python parent's runner answers "unsupported" when node/dist is missing.
    Runner("wirepool_rust_nodeworker", "wirepool", "wirepool, Rust parent + Node worker",
           discover="wirepool_rust_nodeworker"),
    Runner("wirepool_python_nodeworker", "wirepool", "wirepool, Python parent + Node worker",
           ("{python}", "{bench}/runners/wirepool_python.py", "--worker", "node"), needs=("venv",)),
    # The Go SDK (issue 27): the Go parent (go/pool) with Go workers and with the Rust bench
    # workers, and the Rust parent with Go workers. wirepool_go's --prepare builds
    # bench/runners/go (its own module, the SDK by a replace) into bench/.build/go; the other two
    # build the Rust bench first. No shared-memory lane in the Go SDK yet: W3 goes over the socket.
    Runner("wirepool_go", "wirepool", "wirepool, Go parent + Go worker", discover="wirepool_go"),
    Runner("wirepool_go_rsworker", "wirepool", "wirepool, Go parent + Rust worker",
           discover="wirepool_go_rsworker"),
    Runner("wirepool_rust_goworker", "wirepool", "wirepool, Rust parent + Go worker",
           discover="wirepool_rust_goworker"),
    # Go's incumbent: HashiCorp go-plugin (bench/incumbents/go-plugin, its own module), one
    # plugin process per client, over gRPC (hand-written ServiceDesc, wrapperspb messages) and
    # over net/rpc; rows batched by hand, 256 per message (gRPC stream) or per call (net/rpc).
    Runner("go_plugin_grpc", "incumbent", "HashiCorp go-plugin 1.8 over gRPC, Go host + Go plugin",
           discover="go_plugin"),
    Runner("go_plugin_netrpc", "incumbent", "HashiCorp go-plugin 1.8 over net/rpc, Go host + Go plugin",
           ("bash", "{bench}/runners/go_plugin.sh", "--proto", "netrpc")),
    # wirepool_rust's W3 payloads take the shared-memory lane (PROTOCOL.md 20, on by default);
    # this is the same pool over the socket, W3 only, so both are measured in one run.
    Runner("wirepool_rust_socket", "wirepool",
           "wirepool, Rust parent + Rust worker, shm lane off (socket path)",
           discover="wirepool_rust_socket"),
    # The shared-memory lane's transport alone (the wirepool-io example), W3 only.
    Runner("wirepool_shm_lane", "wirepool",
           "wirepool shared-memory lane transport, Rust x Rust (the example, not the pool)",
           discover="shm_lane"),
    # The zero-copy send (issue 13): W3 one-way bodies written once into Pool::body_buf and lent
    # to the worker on every call, never copied (built by wirepool_rust's --prepare).
    Runner("wirepool_rust_zerocopy", "wirepool",
           "wirepool, Rust parent + Rust worker, zero-copy body (Pool::body_buf), W3 one-way",
           ("bash", "{bench}/runners/wirepool_rust.sh", "--runner", "wirepool_rust_zerocopy",
            "--zero-copy")),
    # The same, each call writing its body anew into a fresh Pool::body_buf (a memset: the least
    # a producer pays) instead of re-sending one body.
    Runner("wirepool_rust_zerocopy_fill", "wirepool",
           "wirepool, Rust parent + Rust worker, zero-copy body written every call, W3 one-way",
           ("bash", "{bench}/runners/wirepool_rust.sh", "--runner", "wirepool_rust_zerocopy_fill",
            "--zero-copy", "--fill")),
    # W7: a 1 M-row Arrow batch per call, worker -> parent, read zero-copy; each pair through the
    # shm lane and over the socket (the Rust worker writes into Context::body_buf).
    *[Runner(f"wirepool_arrow_rs_{w}worker{sfx}", "wirepool",
             f"wirepool W7 Arrow, Rust parent + {lang} worker, "
             + ("socket" if sfx else "shm lane"),
             ("bash", "{bench}/runners/wirepool_rust.sh", "--worker", lang.lower(), "--runner",
              f"wirepool_arrow_rs_{w}worker{sfx}", "--zero-copy", *(("--no-shm",) if sfx else ())),
             needs=("venv",) if w == "py" else ())
      for w, lang in (("rs", "Rust"), ("py", "Python")) for sfx in ("", "_socket")],
    *[Runner(f"wirepool_arrow_py_{w}worker{sfx}", "wirepool",
             f"wirepool W7 Arrow, Python parent + {lang} worker, "
             + ("socket" if sfx else "shm lane"),
             ("{python}", "{bench}/runners/arrow_py.py", "--worker", lang.lower(),
              *(("--socket",) if sfx else ())), needs=("venv",))
      for w, lang in (("rs", "Rust"), ("py", "Python")) for sfx in ("", "_socket")],
    # The same with a Python parent (its Rust worker is built by shm_lane's --prepare).
    Runner("wirepool_shm_lane_pyparent", "wirepool",
           "wirepool shared-memory lane transport, Python parent + Rust worker (not yet the pool)",
           ("{python}", "{bench}/runners/shm_lane_py.py"), needs=("venv",)),
]


# The founding workload's report: each runner's parent and worker language (a codec-alone runner
# and an incumbent have one), which picks its codec-alone reference and its incumbents.
LANGS: dict[str, tuple[str, str]] = {
    "wirepool_rust": ("rust", "rust"), "wirepool_rust_pyworker": ("rust", "python"),
    "wirepool_rust_nodeworker": ("rust", "node"), "wirepool_python": ("python", "python"),
    "wirepool_python_rsworker": ("python", "rust"), "wirepool_python_nodeworker": ("python", "node"),
    "wirepool_node": ("node", "node"), "wirepool_node_rsworker": ("node", "rust"),
    "codec_rust": ("rust", "rust"), "codec_python": ("python", "python"),
    "codec_node": ("node", "node"),
    "ipc_channel": ("rust", "rust"), "ipc_channel_unbatched": ("rust", "rust"),
    "mp_pipe": ("python", "python"), "mp_pipe_unbatched": ("python", "python"),
    **{f"node_fork_{s}{b}": ("node", "node") for s in ("json", "advanced")
       for b in ("", "_unbatched")},
    "procwire": ("node", "node"), "procwire_unbatched": ("node", "node"),
    "wirepool_go": ("go", "go"), "wirepool_go_rsworker": ("go", "rust"),
    "wirepool_rust_goworker": ("rust", "go"),
    "go_plugin_grpc": ("go", "go"), "go_plugin_netrpc": ("go", "go"),
}


def by_name() -> dict[str, Runner]:
    return {r.name: r for r in RUNNERS}
