# tenantnet — `make demo` and `make test` work on a fresh Debian 12 machine as root.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Debian's interpreter when there is one (what a fresh Debian 12 has; it also starts faster
# than a self-built one), else the first python3 on PATH.
PYTHON  ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
SHELL   := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: all deps venv trampoline demo test unit integration lint bench clean

all: test

deps:
	@bash scripts/install-deps.sh

LINT_VENV  := .venv-lint
LINT_STAMP := $(LINT_VENV)/.installed

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) with tenantnet and its Python dependencies"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check --config-settings editable_mode=compat -e '.[test]' >$(VENV)/pip.log 2>&1 \
		|| { cat $(VENV)/pip.log; exit 1; }
	@touch $(STAMP)

# The plugin executables. With a C compiler: the compiled trampoline (trampoline/trampoline.c,
# docs/agent.md) as .venv/bin/tenantnet and tenantnet-ipam, in front of the Python launchers
# (tenantnet/ops/runtime.py) as tenantnet-shim and tenantnet-ipam-shim. Without one: the
# Python launchers under the plain names too. Static when the C library's archive is there
# (a static binary starts faster).
LAUNCHERS   = $(PY) -c 'import pathlib, tenantnet.ops.runtime as i; i.write_venv_launchers(pathlib.Path("$(VENV)/bin").absolute(), pathlib.Path(".").absolute(), suffix="$(1)")'
CC         ?= cc
TRAMPOLINE_CFLAGS := -std=c11 -O2 -Wall -Wextra -Werror -D_GNU_SOURCE
PLUGINS_STAMP := $(VENV)/.plugins

# Whether there is a compiler is decided when the recipe runs, not when make reads this
# file: on a fresh machine `make test` installs gcc (deps) after reading it.
$(PLUGINS_STAMP): $(STAMP) trampoline/trampoline.c
	@$(call LAUNCHERS,-shim)
	@if command -v $(CC) >/dev/null 2>&1; then \
		static=$$(test -f "$$($(CC) -print-file-name=libc.a)" && echo -static || true); \
		echo "==> building the trampoline ($(CC) $$static)"; \
		$(CC) $(TRAMPOLINE_CFLAGS) $$static -o $(VENV)/tenantnet-trampoline.tmp trampoline/trampoline.c; \
		mv -f $(VENV)/tenantnet-trampoline.tmp $(VENV)/tenantnet-trampoline; \
		for c in tenantnet tenantnet-ipam; do \
			cp -f $(VENV)/tenantnet-trampoline $(VENV)/bin/.$$c.tmp && mv -f $(VENV)/bin/.$$c.tmp $(VENV)/bin/$$c; \
		done; \
	else \
		echo "==> no C compiler ($(CC)): tenantnet and tenantnet-ipam are the Python launchers"; \
		$(call LAUNCHERS,); \
	fi
	@touch $@

trampoline: $(PLUGINS_STAMP)

venv: $(STAMP) $(PLUGINS_STAMP)

$(LINT_STAMP): pyproject.toml
	@echo "==> creating $(LINT_VENV) with the type and layer checkers"
	@test -x $(LINT_VENV)/bin/python || $(PYTHON) -m venv $(LINT_VENV)
	@$(LINT_VENV)/bin/pip install -q --disable-pip-version-check --config-settings editable_mode=compat -e '.[lint]' \
		>$(LINT_VENV)/pip.log 2>&1 || { cat $(LINT_VENV)/pip.log; exit 1; }
	@touch $(LINT_STAMP)

demo: deps venv
	@bash scripts/demo.sh

# ruff; the layer rules (import-linter contracts in pyproject.toml); strict typing of the
# protocol, the address store and the plugin wing.
lint: venv $(LINT_STAMP)
	$(VENV)/bin/ruff check cni hostfiles ipam tenantnet tests bench packaging
	$(LINT_VENV)/bin/lint-imports --no-cache
	$(LINT_VENV)/bin/mypy cni hostfiles ipam tenantnet/plugin

unit: venv
	$(VENV)/bin/pytest -q tests/unit

integration: deps venv
	$(VENV)/bin/pytest -q tests/integration

# pytest exits 5 when it ran no test: that is a failure here too (no `|| true`).
test: deps venv lint
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=25 tests/unit tests/integration tests/e2e

bench: deps venv
	$(PY) bench/bench_ovs.py --out docs/benchmarks.md
	$(PY) bench/bench_sriov.py --out docs/benchmarks.md
	$(PY) bench/bench_ipam.py | $(PY) -m bench.common bench_ipam docs/benchmarks.md
	$(PY) bench/bench_cluster.py | $(PY) -m bench.common bench_cluster docs/benchmarks.md
	$(PY) bench/bench_agent.py --out docs/benchmarks.md
	$(PY) bench/bench_rails.py --out docs/benchmarks.md
	$(PY) bench/bench_prewarm.py --out docs/benchmarks.md
	$(PY) bench/bench_metrics.py --out docs/benchmarks.md
	$(PY) bench/bench_batching.py --out docs/benchmarks.md
	$(PY) bench/bench_kube.py --out docs/benchmarks.md

clean:
	rm -rf $(VENV) $(LINT_VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
