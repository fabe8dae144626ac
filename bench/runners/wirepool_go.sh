#!/usr/bin/env bash
# The wirepool runners with the Go parent (go/pool), bench/runners/go/cmd/wirepool-go-bench:
#   wirepool_go.sh --prepare                  # go mod download (bounded) + go build into bench/.build/go
#   wirepool_go.sh [--worker go|rust] '<scenario json>'
# Go workers by default (wirepool-go-worker, built beside it); `--worker rust` drives the Rust
# bench workers that wirepool_rust.sh --prepare builds (runner wirepool_go_rsworker). The Go
# toolchain: $GO, else `go` on PATH, else /usr/local/go/bin/go.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$repo/bench/.build/go"
if [[ "${1:-}" == "--prepare" ]]; then
    go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
    [[ -x "$go" ]] || { echo "wirepool_go: no Go toolchain (go on PATH or /usr/local/go/bin/go)" >&2; exit 1; }
    mkdir -p "$out"
    cd "$here/go"
    # The SDK's modules (go/go.sum) from the module cache or the proxy, bounded in time.
    timeout 300 "$go" mod download >&2
    if timeout 600 "$go" build -trimpath -o "$out/" ./cmd/wirepool-go-bench ./cmd/wirepool-go-worker >&2; then
        exit 0
    fi
    # The SDK is edited in place by its owners: a tree that does not compile this minute should
    # not void the run when an earlier build exists. Said loudly on stderr.
    if [[ -x "$out/wirepool-go-bench" && -x "$out/wirepool-go-worker" ]]; then
        echo "wirepool_go: build failed; measuring the previous build of $(date -r "$out/wirepool-go-bench" -u +%H:%M:%SZ)" >&2
        exit 0
    fi
    exit 1
fi
export WIREPOOL_REPO="$repo"
if [[ ! -x "$out/wirepool-go-bench" ]]; then
    # The result line of an unbuilt runner, so the report says why.
    id="$(printf '%s' "${*: -1}" | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p')"
    name=wirepool_go; [[ " $* " == *" --worker rust "* ]] && name=wirepool_go_rsworker
    printf '{"runner": "%s", "scenario": "%s", "status": "unsupported", "reason": "bench/.build/go/wirepool-go-bench is not built (bench/runners/wirepool_go.sh --prepare)"}\n' "$name" "$id"
    exit 0
fi
exec "$out/wirepool-go-bench" "$@"
