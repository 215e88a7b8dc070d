# Every target installs what it needs into .venv first; a stamp keyed on pyproject.toml keeps it quick.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install run test bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,ray]'
	touch $(STAMP)

# A real workload against the built-in simulator, then the report.
run: install
	$(BIN)/loadgen report "$$($(BIN)/loadgen run workloads/quickstart.toml --out results/quickstart)"

# Lint first (ruff), then the suite. pytest exits 5 when it collects nothing: make treats any
# non-zero exit as failure.
test: install
	$(BIN)/ruff check loadgen tests
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m tests.bench

lint: install
	$(BIN)/ruff check loadgen tests

clean:
	rm -rf $(VENV) .pytest_cache
