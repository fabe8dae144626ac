#!/usr/bin/env bash
# wirepool-gateway against gunicorn + uvicorn workers on the same Python `add` function, same
# number of processes, same machine, same run, with wrk (keep-alive): requests/s and latency.
#
#   bash bench/gateway/run.sh                 # 2 processes, 64 connections, 10 s each
#   PROCS=4 CONNS=256 DURATION=10s bash bench/gateway/run.sh
#
# Needs wrk (apt-get install wrk), cargo, python3 with venv, and the repository's .venv (the
# wirepool Python package the worker imports). gunicorn and uvicorn go into a temporary venv,
# removed at the end with everything this script started.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
PROCS="${PROCS:-2}"; CONNS="${CONNS:-64}"; DURATION="${DURATION:-10s}"; THREADS="${THREADS:-2}"
GW_PORT="${GW_PORT:-18080}"; GU_PORT="${GU_PORT:-18081}"
py="$root/.venv/bin/python"
command -v wrk >/dev/null || { echo "wrk missing: apt-get install wrk" >&2; exit 2; }
[ -x "$py" ] || { echo "$py missing (the repository's venv with the wirepool package)" >&2; exit 2; }

tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

wait_up() { # url: until it answers, 30 s at most
  for _ in $(seq 300); do
    curl -fs -o /dev/null -X POST -H 'content-type: application/json' -d '{"a":1,"b":2}' "$1" && return 0
    sleep 0.1
  done
  echo "not up: $1" >&2; cat "$tmp"/*.log >&2; exit 1
}

python3 -m venv "$tmp/venv" >/dev/null
"$tmp/venv/bin/pip" install -q gunicorn uvicorn >/dev/null
(cd "$root/rust" && cargo build -q --release -p wirepool-gateway)
gw="$root/rust/target/release/wirepool-gateway"

"$gw" --listen "127.0.0.1:$GW_PORT" --workers "$PROCS" --method add -- "$py" "$here/worker.py" \
  2>"$tmp/gw.log" & pids+=($!)
(cd "$here" && exec "$tmp/venv/bin/gunicorn" --log-level warning -w "$PROCS" -k uvicorn.workers.UvicornWorker \
  -b "127.0.0.1:$GU_PORT" app:app 2>"$tmp/gu.log") & pids+=($!)
wait_up "http://127.0.0.1:$GW_PORT/v1/call/add"
wait_up "http://127.0.0.1:$GU_PORT/add"

bench() { # name url
  local out; out="$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$here/post.lua" "$2")"
  local rps p50 p99 non2xx
  rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
  p50="$(awk '$1=="50%" {print $2}' <<<"$out")"
  p99="$(awk '$1=="99%" {print $2}' <<<"$out")"
  non2xx="$(awk '/Non-2xx/ {print $NF}' <<<"$out")"
  printf '%-22s %12s req/s   p50 %-9s p99 %-9s non-2xx %s\n' "$1" "$rps" "$p50" "$p99" "${non2xx:-0}"
  echo "$rps" >"$tmp/$1.rps"
}
echo "processes $PROCS, connections $CONNS, $DURATION each, wrk -t$THREADS, $(nproc) CPUs"
bench gateway "http://127.0.0.1:$GW_PORT/v1/call/add"
bench gunicorn-uvicorn "http://127.0.0.1:$GU_PORT/add"
python3 -c "import sys; g, u = (float(open(f).read()) for f in sys.argv[1:]); print(f'ratio gateway / gunicorn-uvicorn: {g / u:.2f}x')" \
  "$tmp/gateway.rps" "$tmp/gunicorn-uvicorn.rps"
