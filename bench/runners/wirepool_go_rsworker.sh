#!/usr/bin/env bash
# The Go parent (go/pool) driving the Rust bench workers (wirepool-bench-worker, founding-worker).
#   wirepool_go_rsworker.sh --prepare     # the Rust bench in release, then the Go programs
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "--prepare" ]]; then
    bash "$here/wirepool_rust.sh" --prepare
    exec bash "$here/wirepool_go.sh" --prepare
fi
exec bash "$here/wirepool_go.sh" --worker rust "$@"
