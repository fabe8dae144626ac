#!/usr/bin/env bash
# Run every fuzz target of wirepool-proto for a bounded time.
#
#   rust/wirepool-proto/fuzz/run.sh SECONDS     # SECONDS of fuzzing in total (default 60),
#                                               # split evenly between the targets
#
# Installs cargo-fuzz if missing. Uses the nightly toolchain if rustup has one, otherwise the
# default (stable) toolchain with RUSTC_BOOTSTRAP=1, which cargo-fuzz's -Z flags need.
# Seeds (committed, built from spec/vectors by make_seeds.py) are read from seeds/TARGET; new
# inputs go to corpus/TARGET (ignored by git); a crash leaves its input in artifacts/TARGET
# and makes this script fail.
set -euo pipefail

total="${1:-60}"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "run.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

toolchain=()
if [[ "${WIREPOOL_FUZZ_STABLE:-0}" != 1 ]] && rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
    echo "run.sh: using the nightly toolchain" >&2
else
    export RUSTC_BOOTSTRAP=1
    echo "run.sh: using $(rustc --version) with RUSTC_BOOTSTRAP=1" >&2
fi

targets=(decoder connection shm)
per=$(( total / ${#targets[@]} ))
(( per >= 1 )) || per=1

for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    echo "run.sh: fuzzing $target for ${per}s" >&2
    cargo "${toolchain[@]}" fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$per" -max_len=70000 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
