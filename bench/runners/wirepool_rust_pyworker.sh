#!/usr/bin/env bash
# The Rust parent (rust/wirepool-bench) driving Python workers (wirepool_python_worker.py).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "--prepare" ]]; then
    exec bash "$here/wirepool_rust.sh" --prepare
fi
exec bash "$here/wirepool_rust.sh" --worker python "$@"
