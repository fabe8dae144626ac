#!/usr/bin/env bash
# The Rust parent and Rust workers with the shared-memory lane off (wirepool-bench --no-shm):
# the socket path measured beside wirepool_rust, whose W3 payloads take the lane. W3 only.
#   wirepool_rust_socket.sh --prepare     # as wirepool_rust.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "--prepare" ]]; then
    exec bash "$here/wirepool_rust.sh" --prepare
fi
exec bash "$here/wirepool_rust.sh" --no-shm "$@"
