# Everyday verbs. `make demo` and `make test` are the two README commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test venv system-deps prometheus3 lint typecheck unit bench bench-quick clean

$(BIN)/dcgm-enricher: pyproject.toml enricher/proto/api.proto
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/dcgm-enricher

## demo: run the enricher on the built-in simulated node (no GPU, no cluster needed)
demo: venv
	$(BIN)/dcgm-enricher demo

## system-deps: Debian packages the tests use (promtool/prometheus, kubectl, gcc)
system-deps:
	./.ci/system-deps

## prometheus3: Prometheus 3.5 LTS from Debian's unstable suite, unpacked into .cache (not installed)
prometheus3:
	./.ci/prometheus3

## test: lint, type-check and run the whole suite (on Prometheus 2.42 and 3.5)
test: system-deps prometheus3 venv lint typecheck unit

LINT_PATHS := enricher tests $(wildcard bench)

lint:
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/pytest

## bench: the scrape-path benchmark (a few minutes): prints the table, writes bench/results/latest.json
bench: system-deps venv
	$(BIN)/python -m bench

## bench-quick: every part of the benchmark, briefly (tests/test_bench.py runs it as a smoke test)
bench-quick: system-deps venv
	$(BIN)/python -m bench --quick --out bench/results/quick.json

clean:
	rm -rf $(VENV) .cache build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
