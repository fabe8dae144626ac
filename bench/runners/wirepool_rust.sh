#!/usr/bin/env bash
# The wirepool runner with the Rust parent (rust/wirepool-bench). Rust workers by default;
# wirepool_rust_pyworker.sh runs the same binary against Python workers.
#   wirepool_rust.sh --prepare                       # cargo build --release -p wirepool-bench
#   wirepool_rust.sh [--worker rust|python] '<scenario json>'
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/rust/target}"
if [[ "${1:-}" == "--prepare" ]]; then
    cd "$repo/rust"
    exec cargo build --release --quiet -p wirepool-bench >&2
fi
if [[ -x "$repo/bench/.venv/bin/python" ]]; then
    export WIREPOOL_BENCH_PYTHON="$repo/bench/.venv/bin/python"
fi
export WIREPOOL_REPO="$repo"
exec "$target/release/wirepool-bench" "$@"
