#!/usr/bin/env bash
# The same `add` function behind four HTTP servers, same number of processes, same machine, same
# run, loaded by wrk with keep-alive (post.lua): requests/s, p50, p99.
#   (a) wirepool-gateway + Python wirepool workers (worker.py)
#   (b) wirepool-gateway + Rust wirepool workers (rust/wirepool/examples/readme_worker.rs)
#   (c) gunicorn + uvicorn workers running it as a plain ASGI app (app.py)
#   (c0) for information: the same with plain uvicorn (no httptools, no uvloop)
#   (d) nginx answering a static body (the same bytes) from a generated nginx.conf: the ceiling
# plus a stream of STREAM_ROWS small rows as NDJSON through the gateway (stream.lua), from the Rust
# worker and from the Python worker, and from (c) for comparison: rows/s. Rounds alternate (each round runs every contender,
# starting one further along each round); summarize.py prints min/median/max and the ratios of
# each round, with issue 30's targets met or missed.
#
#   bash bench/gateway/run.sh                       # 2 processes, 64 and 256 connections, 10 s, 3 rounds
#   QUICK=1 bash bench/gateway/run.sh               # 2 s, 1 round (CI)
#   PROCS=4 CONNS="64" DURATION=10s ROUNDS=5 bash bench/gateway/run.sh
#   OUT=/tmp/gw bash bench/gateway/run.sh           # keep results.tsv, summary.md, the logs and
#                                                   # github-action-benchmark-{bigger,smaller}.json there
#
# Tools: wrk and nginx are installed with apt-get when missing and the script runs as root (else a
# missing wrk skips the bench, a missing nginx skips (d)); gunicorn + uvicorn[standard] go into a
# temporary venv (a failed install skips (c)); cargo builds the gateway and the Rust worker (a
# failed build skips (a), (b) and the streams). Every step is bounded with `timeout`; every
# process the script starts is stopped at the end and the temporary directory removed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
QUICK="${QUICK:-}"
PROCS="${PROCS:-2}"; CONNS="${CONNS:-64 256}"; THREADS="${THREADS:-2}"
if [ -n "$QUICK" ]; then DURATION="${DURATION:-2s}"; ROUNDS="${ROUNDS:-1}"
else DURATION="${DURATION:-10s}"; ROUNDS="${ROUNDS:-3}"; fi
export STREAM_ROWS="${STREAM_ROWS:-10000}"; STREAM_CONNS="${STREAM_CONNS:-1 64}"
BASE_PORT="${BASE_PORT:-18080}"
PA=$BASE_PORT; PB=$((BASE_PORT + 1)); PC=$((BASE_PORT + 2)); PD=$((BASE_PORT + 3)); PC0=$((BASE_PORT + 4))
py="$root/.venv/bin/python"
dur_s="${DURATION%s}"

tmp="$(mktemp -d)"
out="${OUT:-$tmp}"; mkdir -p "$out"; out="$(cd "$out" && pwd)"  # absolute: nginx and gunicorn run elsewhere
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
declare -A skip=()  # contender -> why
t0=$SECONDS
phase() { echo "[$((SECONDS - t0)) s] $*"; }

apt_install() { # package: only as root with apt-get, bounded
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
  timeout 300 apt-get install -y -q "$1" >"$tmp/apt-$1.log" 2>&1 && return 0
  timeout 300 apt-get update -q >/dev/null 2>&1 && timeout 300 apt-get install -y -q "$1" >>"$tmp/apt-$1.log" 2>&1
}
# NGINX=/path/to/nginx picks one (and installs none: NGINX=/nonexistent checks the skip path)
nginx_bin() {
  if [ -n "${NGINX:-}" ]; then [ -x "$NGINX" ] && echo "$NGINX"; return 0; fi
  command -v nginx || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; }
}

command -v wrk >/dev/null || apt_install wrk
if ! command -v wrk >/dev/null; then
  echo "skipped: wrk not found and not installable (apt-get install wrk as root)"; exit 0
fi
[ -n "$(nginx_bin)" ] || [ -n "${NGINX:-}" ] || apt_install nginx
[ -n "$(nginx_bin)" ] || skip[d]="nginx not found and not installable"

phase "tools checked; building the gateway and the Rust worker"
# (a), (b): the gateway and the Rust worker, built as the gateway's README runs them; copied so
# that another build of the shared target directory cannot change them mid-run.
if [ ! -x "$py" ]; then
  skip[a]="$py missing (the repository's venv: make venv)"
fi
if (cd "$root/rust" && timeout 1200 cargo build -q --release -p wirepool-gateway \
      && timeout 1200 cargo build -q --release -p wirepool --example readme_worker) >"$tmp/build.log" 2>&1; then
  cp "$root/rust/target/release/wirepool-gateway" "$root/rust/target/release/examples/readme_worker" "$tmp/"
else
  why="cargo build failed: $(tail -1 "$tmp/build.log")"
  skip[a]="$why"; skip[b]="$why"
fi

phase "built; installing gunicorn + uvicorn"
# (c): gunicorn + uvicorn with its standard extras (httptools, uvloop), as uvicorn's docs install it
if ! { timeout 120 python3 -m venv "$tmp/venv" && timeout 300 "$tmp/venv/bin/pip" install -q gunicorn 'uvicorn[standard]'; } >"$tmp/pip.log" 2>&1; then
  skip[c]="gunicorn/uvicorn install failed: $(tail -1 "$tmp/pip.log")"
fi
# (c0), for information: the same with plain `pip install uvicorn` (h11 and asyncio's loop), as the
# 2026-12-02 run measured it
if ! { timeout 120 python3 -m venv "$tmp/venv0" && timeout 300 "$tmp/venv0/bin/pip" install -q gunicorn uvicorn; } >"$tmp/pip0.log" 2>&1; then
  skip[c0]="gunicorn/uvicorn install failed: $(tail -1 "$tmp/pip0.log")"
fi

phase "installed; starting the servers"
if [ -z "${skip[a]:-}" ]; then
  "$tmp/wirepool-gateway" --listen "127.0.0.1:$PA" --workers "$PROCS" --method add --method decls:stream \
    -- "$py" "$here/worker.py" 2>"$out/a-gateway-python.log" & pids+=($!); echo $! >"$tmp/a.pid"
fi
if [ -z "${skip[b]:-}" ]; then
  "$tmp/wirepool-gateway" --listen "127.0.0.1:$PB" --workers "$PROCS" --method add --method decls:stream \
    -- "$tmp/readme_worker" 2>"$out/b-gateway-rust.log" & pids+=($!); echo $! >"$tmp/b.pid"
fi
if [ -z "${skip[c]:-}" ]; then
  (cd "$here" && exec "$tmp/venv/bin/gunicorn" --log-level warning -w "$PROCS" -k uvicorn.workers.UvicornWorker \
    -b "127.0.0.1:$PC" app:app 2>"$out/c-gunicorn.log") & pids+=($!)
fi
if [ -z "${skip[c0]:-}" ]; then
  (cd "$here" && exec "$tmp/venv0/bin/gunicorn" --log-level warning -w "$PROCS" -k uvicorn.workers.UvicornWorker \
    -b "127.0.0.1:$PC0" app:app 2>"$out/c0-gunicorn-plain.log") & pids+=($!)
fi
if [ -z "${skip[d]:-}" ]; then
  # The founding document's parity method: nginx on the same machine, a static body, as many
  # worker processes as the others have; no access log; keep-alive without a request limit (the
  # others have none; nginx's default closes a connection after 1,000 requests).
  mkdir -p "$tmp/nginx"
  cat >"$tmp/nginx/nginx.conf" <<EOF
worker_processes $PROCS;
daemon off;
pid $tmp/nginx/nginx.pid;
error_log $out/d-nginx.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/nginx/body;
  proxy_temp_path $tmp/nginx/proxy;
  fastcgi_temp_path $tmp/nginx/fastcgi;
  uwsgi_temp_path $tmp/nginx/uwsgi;
  scgi_temp_path $tmp/nginx/scgi;
  keepalive_requests 100000000;
  keepalive_timeout 75s;
  server {
    listen 127.0.0.1:$PD;
    default_type application/json;
    location / { return 200 '{"sum":5}'; }
  }
}
EOF
  "$(nginx_bin)" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" 2>>"$out/d-nginx.log" & pids+=($!)
fi

wait_up() { # contender url: until it answers {"sum":5}, 60 s at most, else the contender is skipped
  for _ in $(seq 600); do
    if [ "$(curl -fs -m 2 -X POST -H 'content-type: application/json' -d '{"a":2,"b":3}' "$2" 2>/dev/null | tr -d ' ')" = '{"sum":5}' ]; then
      return 0
    fi
    sleep 0.1
  done
  skip[$1]="not up after 60 s (see its log)"
}
url_a="http://127.0.0.1:$PA/v1/call/add"; url_b="http://127.0.0.1:$PB/v1/call/add"
url_c="http://127.0.0.1:$PC/add"; url_c0="http://127.0.0.1:$PC0/add"; url_d="http://127.0.0.1:$PD/add"
for k in a b c c0 d; do
  [ -z "${skip[$k]:-}" ] || continue
  u="url_$k"; wait_up "$k" "${!u}"
done

phase "servers up"
# The streams: check once that the answer is STREAM_ROWS rows then the summary line.
check_stream() { # contender url
  local n; n="$(curl -fsN -m 60 -X POST -H 'content-type: application/json' -d "{\"n\": $STREAM_ROWS}" "$2" | grep -c '"kind":"theorem"')"
  [ "$n" = "$STREAM_ROWS" ] || skip[$1]="stream answered $n rows, not $STREAM_ROWS"
}
surl_ra="http://127.0.0.1:$PB/v1/stream/decls"; surl_py="http://127.0.0.1:$PA/v1/stream/decls"
if [ -z "${skip[b]:-}" ]; then check_stream stream_rust "$surl_ra"; else skip[stream_rust]="${skip[b]}"; fi
if [ -z "${skip[a]:-}" ]; then check_stream stream_python "$surl_py"; else skip[stream_python]="${skip[a]}"; fi
surl_gu="http://127.0.0.1:$PC/stream/decls"
if [ -z "${skip[c]:-}" ]; then check_stream stream_gunicorn "$surl_gu"; else skip[stream_gunicorn]="${skip[c]}"; fi

results="$out/results.tsv"
printf 'round\tcontender\tconns\trps\tp50\tp99\tnon2xx\tsocket_errors\n' >"$results"
run_wrk() { # round contender conns url script
  local t=$THREADS; [ "$3" -lt "$t" ] && t=$3
  local o
  o="$(timeout $((dur_s + 60)) wrk -t"$t" -c"$3" -d"$DURATION" --timeout 10s --latency -s "$5" "$4" 2>&1)"
  echo "$o" >>"$out/wrk.log"
  local rps p50 p99 non2xx serr
  rps="$(awk '/Requests\/sec/ {print $2}' <<<"$o")"
  p50="$(awk '$1=="50%" {print $2}' <<<"$o")"
  p99="$(awk '$1=="99%" {print $2}' <<<"$o")"
  non2xx="$(awk '/Non-2xx/ {print $NF}' <<<"$o")"
  serr="$(awk -F'Socket errors: ' '/Socket errors/ {print $2}' <<<"$o" | tr -d ' ')"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${rps:-0}" "${p50:--}" "${p99:--}" "${non2xx:-0}" "${serr:-none}" >>"$results"
  printf '  round %s %-14s c=%-4s %12s req/s  p50 %-9s p99 %-9s non-2xx %s  socket errors %s\n' \
    "$1" "$2" "$3" "${rps:-0}" "${p50:--}" "${p99:--}" "${non2xx:-0}" "${serr:-none}"
}

echo "processes $PROCS, connections $CONNS, $DURATION each, $ROUNDS rounds, wrk -t$THREADS, $(nproc) CPUs"
echo "commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- rust || echo ' (rust/ has uncommitted changes)')"
echo "load before: $(uptime)"
for k in "${!skip[@]}"; do echo "$k skipped: ${skip[$k]}"; done
order=(a b c c0 d stream_rust stream_python stream_gunicorn)
for r in $(seq "$ROUNDS"); do
  for i in $(seq 0 $((${#order[@]} - 1))); do
    k="${order[$(( (i + r - 1) % ${#order[@]} ))]}"
    [ -z "${skip[$k]:-}" ] || continue
    case "$k" in
      stream_rust) for c in $STREAM_CONNS; do run_wrk "$r" "$k" "$c" "$surl_ra" "$here/stream.lua"; done ;;
      stream_python) for c in $STREAM_CONNS; do run_wrk "$r" "$k" "$c" "$surl_py" "$here/stream.lua"; done ;;
      stream_gunicorn) for c in $STREAM_CONNS; do run_wrk "$r" "$k" "$c" "$surl_gu" "$here/stream.lua"; done ;;
      *) u="url_$k"; for c in $CONNS; do run_wrk "$r" "$k" "$c" "${!u}" "$here/post.lua"; done ;;
    esac
  done
done
echo "load after: $(uptime)"
phase "measured"
: >"$out/skipped.tsv"
for k in "${!skip[@]}"; do printf '%s\t%s\n' "$k" "${skip[$k]}" >>"$out/skipped.tsv"; done
python3 "$here/summarize.py" "$results" "$out/skipped.tsv" --json "$out/github-action-benchmark" | tee "$out/summary.md"
