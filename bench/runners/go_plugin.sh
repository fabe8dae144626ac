#!/usr/bin/env bash
# The HashiCorp go-plugin incumbent (bench/incumbents/go-plugin, its own Go module: go-plugin
# v1.8.0, grpc v1.85.0), a Go host and a Go plugin running the bench workers' functions:
#   go_plugin.sh --prepare                       # go mod download (bounded) + go build into bench/.build/go
#   go_plugin.sh [--proto grpc|netrpc] '<scenario json>'
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/bench/.build/go"
if [[ "${1:-}" == "--prepare" ]]; then
    go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
    [[ -x "$go" ]] || { echo "go_plugin: no Go toolchain (go on PATH or /usr/local/go/bin/go)" >&2; exit 1; }
    mkdir -p "$out"
    cd "$repo/bench/incumbents/go-plugin"
    # go-plugin, grpc, protobuf and their requirements (go.sum) from the module cache or the
    # proxy, bounded in time.
    timeout 300 "$go" mod download >&2
    timeout 600 "$go" build -trimpath -o "$out/goplugin-bench" . >&2 || [[ -x "$out/goplugin-bench" ]]
    exit $?
fi
export WIREPOOL_REPO="$repo"
proto=grpc
if [[ "${1:-}" == "--proto" ]]; then
    proto="$2"
    shift 2
fi
if [[ ! -x "$out/goplugin-bench" ]]; then
    id="$(printf '%s' "${*: -1}" | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p')"
    printf '{"runner": "go_plugin_%s", "scenario": "%s", "status": "unsupported", "reason": "bench/.build/go/goplugin-bench is not built (bench/runners/go_plugin.sh --prepare)"}\n' "$proto" "$id"
    exit 0
fi
exec "$out/goplugin-bench" --proto "$proto" "$@"
