#!/usr/bin/env bash
# The Rust parent (rust/wirepool-bench) driving Go workers (bench/.build/go/wirepool-go-worker).
#   wirepool_rust_goworker.sh --prepare     # the Rust bench in release, then the Go programs
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "--prepare" ]]; then
    bash "$here/wirepool_rust.sh" --prepare
    exec bash "$here/wirepool_go.sh" --prepare
fi
exec bash "$here/wirepool_rust.sh" --worker go "$@"
