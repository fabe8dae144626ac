# One entry point per job. Every target installs what it needs (a fresh machine has only the
# toolchains: cargo, python3, node, cc), so `make test` on a new clone is the same as CI.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CARGO ?= cargo
FUZZ_SECONDS ?= 60

.PHONY: help demo test test-spec test-rust test-python test-ray test-node test-go test-bench test-conformance test-shm-crash-cycles fuzz bench bench-gateway bench-full bench-check bench-baseline lint docs package venv clean

help:
	@echo "make demo    run the main job: a pool of Rust workers streaming 10 M rows"
	@echo "make test    every test of every language"
	@echo "make bench   end-to-end benchmarks (quick mode) and the instruction-count gate; bench-full for the full matrix"
	@echo "make fuzz    the Rust, Python, Node and Go fuzz targets, FUZZ_SECONDS per language"
	@echo "make docs    the API reference: rust/target/doc (cargo doc), build/docs/python (pdoc), build/docs/node (typedoc)"
	@echo "make package the release checks: Python sdist+wheel (twine check), cargo publish --dry-run, npm pack"

# The build is shown (a fresh clone compiles for a few minutes before the demo starts).
demo:
	@echo "building the demo in release mode (the first build takes a few minutes)..."
	cd rust && $(CARGO) build --release -p wirepool --example demo
	cd rust && $(CARGO) run --release -q -p wirepool --example demo

# A venv of our own, so a green run never depends on packages installed by hand.
$(VPY): python/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e "./python[test,lint]"
	touch $(VPY)

venv: $(VPY)

# Each stage with a banner and its duration, then the table of all of them (a failed stage stops
# the run, and the table so far says which and how long each took).
TEST_STAGES := test-spec test-rust test-python test-ray test-node test-go test-conformance test-bench
test:
	@start=$$(date +%s); table=""; \
	for stage in $(TEST_STAGES); do \
	  echo; echo "=== make $$stage ($$(( $$(date +%s) - start )) s into make test)"; \
	  t0=$$(date +%s); result=ok; \
	  $(MAKE) --no-print-directory $$stage || result=FAILED; \
	  table="$$table$$(printf '  %-18s %-7s %5d s' $$stage $$result $$(( $$(date +%s) - t0 )))\n"; \
	  if [[ $$result == FAILED ]]; then \
	    printf '\n=== make test: %s failed\n%b' $$stage "$$table"; exit 1; \
	  fi; \
	done; \
	printf '\n=== make test: every stage passed in %d s\n%b' $$(( $$(date +%s) - start )) "$$table"

test-spec: $(VPY)
	$(VPY) spec/vectors/generate.py --check
	$(VPY) spec/generate_constants.py --check
	$(VPY) -m pytest -q spec/tests

# Plain `cargo test` builds the examples as real binaries, which the integration tests spawn as
# workers (`--all-targets` would build them as test harnesses instead); doc tests run too.
test-rust:
	cd rust && $(CARGO) test --workspace -q
	cd rust && $(CARGO) test --workspace --benches -q

# Two pytest workers (pytest-xdist): the tests wait on worker processes about half the time, so
# two keep both CPUs busy (131 s in a fresh-clone run, against ~330 s one after another). Tests
# marked serial (timing bounds another test's load can break) run after, alone.
PYTEST_WORKERS ?= 2
test-python: $(VPY)
	$(VPY) -m pytest -q -n $(PYTEST_WORKERS) -m "not serial" python/tests examples/python --ignore=python/tests/test_ray_launcher.py
	$(VPY) -m pytest -q -m serial python/tests --ignore=python/tests/test_ray_launcher.py

# The Ray launcher against a local Ray cluster (PROTOCOL.md 21.8). Ray is the optional extra
# `ray` (a ~70 MB wheel), installed here rather than in every venv; the import check makes a
# failed install fail the target instead of skipping its test.
test-ray: $(VPY)
	$(VPY) -m pip install -q "ray>=2.9"
	$(VPY) -c "import ray"
	$(VPY) -m pytest -q python/tests/test_ray_launcher.py

# The Node SDK (node/): npm ci from its lock file, tsc, then node --test over the compiled tests;
# then examples/node (its one dependency is a link to node/, so npm install fetches nothing). The venv:
# test/readme.test.ts runs the README's Python workers with it.
test-node: $(VPY)
	cd node && npm ci --no-audit --no-fund --loglevel=error && npm test
	cd examples/node && npm install --no-audit --no-fund --loglevel=error && npm test

# The Go SDK (go/, one module): so far its sans-IO core (go/proto) against spec/vectors; gofmt and
# go vet fail the target, and the tests run with the race detector (goleak checks every package).
test-go:
	cd go && test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt: files above are not formatted"; exit 1; }
	cd go && go vet ./... && go test -race -count=1 ./...

test-conformance: $(VPY)
	$(VPY) -m pytest -q conformance

test-bench: $(VPY)
	$(VPY) -m pytest -q bench/tests

# rustfmt, clippy with warnings denied, and mypy over the Python package (its settings:
# python/pyproject.toml).
lint: $(VPY)
	cd rust && $(CARGO) fmt --all -- --check
	cd rust && $(CARGO) clippy --workspace --all-targets -q -- -D warnings
	cd python && ../$(VPY) -m mypy

# The API reference of the published crates (a broken intra-doc link or a malformed doc comment
# fails the build; every feature, as docs.rs builds them) and of the Python package (pdoc, from
# the `docs` extra) and of the Node SDK (typedoc, warnings as errors: node/scripts/typedoc/).
DOC_CRATES := -p wirepool-proto -p wirepool-io -p wirepool-codec -p wirepool-worker -p wirepool
docs: $(VPY)
	cd rust && RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --all-features $(DOC_CRATES)
	$(VPY) -m pip install -q -e "./python[docs]"
	rm -rf build/docs/python
	$(VPY) -W error -m pdoc -o build/docs/python wirepool wirepool.prometheus wirepool.otel wirepool.cli wirepool.remote wirepool.launchers
	cd node && npm ci --no-audit --no-fund --loglevel=error
	cd node/scripts/typedoc && npm ci --no-audit --no-fund --loglevel=error && rm -rf ../../../build/docs/node \
	  && node_modules/.bin/typedoc --options typedoc.json --logLevel Warn
	@echo "API reference: rust/target/doc/wirepool/index.html, build/docs/python/index.html, build/docs/node/index.html"

# What a release uploads, checked as its registry would: the Python sdist and wheel built in an
# isolated environment (build/dist), `twine check --strict`, the wheel installed into a scratch
# venv with its console script run; every publishable crate (`publish = false` ones are skipped)
# packaged from what git has committed and compiled from its tarball, path dependencies resolved
# as the registry would (cargo >= 1.90 for --workspace). PACKAGE_CARGO_FLAGS=--allow-dirty checks
# uncommitted changes too. The npm package: `npm pack` (dist/ rebuilt from scratch), its file list
# against the manifest, installed into an empty folder where the README's Node example runs and
# its types check (node/scripts/pack-check.mjs, about 20 s).
PACKAGE_CARGO_FLAGS ?=
package: $(VPY)
	$(VPY) -m pip install -q -e "./python[packaging]"
	rm -rf build/dist
	$(VPY) -m build -q -o build/dist python
	$(VPY) -m twine check --strict build/dist/*
	scratch=$$(mktemp -d); rc=0; \
	  { $(VPY) -m venv "$$scratch" && "$$scratch/bin/pip" install -q build/dist/*.whl \
	    && "$$scratch/bin/wirepool" --help >/dev/null \
	    && "$$scratch/bin/python" -c "import wirepool, orjson"; } || rc=$$?; \
	  rm -rf "$$scratch"; exit $$rc
	# cargo unpacks each crate of its local overlay registry (rust/target/package/tmp-registry)
	# into CARGO_HOME/registry/src/<hash of that path>/ and reuses an unpacked copy of the same
	# name and version without checking it: a clone at a path used before would verify against an
	# older commit's sources (seen: wirepool-io checked against a wirepool-proto without shm.rs).
	# Our own crates are never fetched from crates.io, so their unpacked copies can go.
	rm -rf "$${CARGO_HOME:-$$HOME/.cargo}"/registry/src/*/wirepool-*-[0-9]*
	cd rust && $(CARGO) publish --dry-run --workspace $(PACKAGE_CARGO_FLAGS)
	cd node && npm ci --no-audit --no-fund --loglevel=error && timeout 300 node scripts/pack-check.mjs

# The shared-memory lane's 1,000 crash cycles with large payloads in flight (issue 13; ~2.5 min on
# a loaded 2-vCPU VM, so `make test` runs 100 of them): CI runs it in its fuzz stage.
test-shm-crash-cycles:
	cd rust && WIREPOOL_SHM_CRASH_CYCLES=1000 $(CARGO) test -q -p wirepool --test shm_crash_cycles

# New inputs go to a scratch corpus: the committed corpora only grow by a deliberate commit.
fuzz: $(VPY)
	bash rust/wirepool-proto/fuzz/run.sh $(FUZZ_SECONDS)
	$(VPY) -m pip install -q atheris
	scratch=$$(mktemp -d); cp -r python/fuzz/corpus/. "$$scratch"; rc=0; \
	  $(VPY) python/fuzz/fuzz_proto.py "$$scratch" -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	    -print_final_stats=1 || rc=$$?; \
	  rm -rf "$$scratch"; exit $$rc
	HOSTILE_FUZZ_SECONDS=$(FUZZ_SECONDS) $(VPY) -m pytest -q conformance/test_hostile.py -k test_fuzz
	cd node && npm ci --no-audit --no-fund --loglevel=error && npm run fuzz -- --seconds $(FUZZ_SECONDS)
	cd go && go test ./proto -run '^$$' -fuzz FuzzReceive -fuzztime $(FUZZ_SECONDS)s -parallel 1

# The wall-clock report (quick), then the gate: instructions per operation under valgrind against
# bench/icount/baseline.json (fails on growth beyond its threshold), then the wall-clock history.
bench:
	$(PYTHON) bench/run.py --quick
	$(PYTHON) bench/run.py gate
	$(PYTHON) bench/run.py check
	$(MAKE) bench-gateway

# The gateway against gunicorn + uvicorn and nginx's static ceiling (issue 30), quick: one round of
# 2 s per contender; the parity ratios and github-action-benchmark files go to bench/results/.
# A tool that cannot be installed skips its contender (bench/gateway/README.md).
bench-gateway:
	QUICK=1 OUT=bench/results/$$(date -u +%Y%m%dT%H%M%SZ)-gateway bash bench/gateway/run.sh

# Lowering (or accepting) the gate's counts is a deliberate commit of the rewritten file.
bench-baseline:
	$(PYTHON) bench/run.py gate --rebaseline
	@echo "now: git add bench/icount/baseline.json && git commit -m 'bench: new instruction-count baseline (why)'"

bench-full:
	$(PYTHON) bench/run.py --full

bench-check:
	$(PYTHON) bench/run.py check

clean:
	rm -rf $(VENV) rust/target bench/results
