#!/usr/bin/env bash
# The wirepool runner with the Rust parent (rust/wirepool-bench). Rust workers by default;
# wirepool_rust_pyworker.sh runs the same binary against Python workers.
#   wirepool_rust.sh --prepare                       # cargo build --release -p wirepool-bench
#   wirepool_rust.sh [--worker rust|python] '<scenario json>'
# The founding workload's scenarios ("founding": true) run bench/founding-rs's founding-parent
# (its own crate, built here too, into bench/.build/founding) with the same arguments.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/rust/target}"
founding="$repo/bench/.build/founding/release"
if [[ "${1:-}" == "--prepare" ]]; then
    cargo build --release --quiet --manifest-path "$repo/bench/founding-rs/Cargo.toml" \
        --target-dir "$repo/bench/.build/founding" >&2 ||
        echo "wirepool_rust: the founding crate (bench/founding-rs) did not build" >&2
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
founding_re='"founding": ?true'
if [[ "${*: -1}" =~ $founding_re ]]; then
    exec "$founding/founding-parent" "$@"
fi
exec "$target/release/wirepool-bench" "$@"
