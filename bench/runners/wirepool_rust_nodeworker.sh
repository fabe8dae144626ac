#!/usr/bin/env bash
# The Rust parent (rust/wirepool-bench) driving Node workers (wirepool_node_worker.mjs on node/dist).
#   wirepool_rust_nodeworker.sh --prepare     # the Rust bench in release, then node/dist (tsc)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "--prepare" ]]; then
    bash "$here/wirepool_rust.sh" --prepare
    exec node "$here/wirepool_node.mjs" --prepare
fi
exec bash "$here/wirepool_rust.sh" --worker node "$@"
