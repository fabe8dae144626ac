#!/usr/bin/env bash
# The wirepool runner with the Rust parent (rust/wirepool-bench). Rust workers by default;
# wirepool_rust_pyworker.sh runs the same binary against Python workers.
#   wirepool_rust.sh --prepare                       # cargo build --release -p wirepool-bench
#   wirepool_rust.sh [--worker rust|python] '<scenario json>'
# The founding workload's scenarios ("founding": true) run wirepool-bench's founding-parent with
# the same arguments; `wirepool_rust.sh --founding-codec '<scenario>'` runs its founding-codec
# (the registry's codec_rust: the codec alone on the same rows).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/rust/target}"
if [[ "${1:-}" == "--prepare" ]]; then
    cd "$repo/rust"
    if cargo build --release --quiet -p wirepool-bench >&2; then
        exit 0
    fi
    # The SDK crates are edited in place by their owners: a tree that does not compile this
    # minute should not void the run when an earlier build exists. Said loudly on stderr.
    if [[ -x "$target/release/wirepool-bench" && -x "$target/release/wirepool-bench-worker" ]]; then
        echo "wirepool_rust: build failed; measuring the previous build of $(date -r "$target/release/wirepool-bench" -u +%H:%M:%SZ)" >&2
        exit 0
    fi
    exit 1
fi
if [[ -x "$repo/bench/.venv/bin/python" ]]; then
    export WIREPOOL_BENCH_PYTHON="$repo/bench/.venv/bin/python"
fi
export WIREPOOL_REPO="$repo"
if [[ "${1:-}" == "--founding-codec" ]]; then
    shift
    exec "$target/release/founding-codec" "$@"
fi
founding_re='"founding": ?true'
if [[ "${*: -1}" =~ $founding_re ]]; then
    exec "$target/release/founding-parent" "$@"
fi
exec "$target/release/wirepool-bench" "$@"
