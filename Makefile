# tenantnet — `make demo` and `make test` work on a fresh Debian 12 machine as root.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# Debian's interpreter when there is one (what a fresh Debian 12 has; it also starts faster
# than a self-built one), else the first python3 on PATH.
PYTHON  ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
SHELL   := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: all deps venv demo test unit integration lint bench clean

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
	@$(PY) -c 'import pathlib, tenantnet.ops.runtime as i; i.write_venv_launchers(pathlib.Path("$(VENV)/bin").absolute(), pathlib.Path(".").absolute())'
	@touch $(STAMP)

venv: $(STAMP)

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
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/unit tests/integration tests/e2e

bench: deps venv
	$(PY) bench/bench_ovs.py --out docs/benchmarks.md
	$(PY) bench/bench_sriov.py --out docs/benchmarks.md
	$(PY) bench/bench_ipam.py | $(PY) -m bench.common bench_ipam docs/benchmarks.md
	$(PY) bench/bench_cluster.py | $(PY) -m bench.common bench_cluster docs/benchmarks.md
	$(PY) bench/bench_agent.py --out docs/benchmarks.md
	$(PY) bench/bench_rails.py --out docs/benchmarks.md

clean:
	rm -rf $(VENV) $(LINT_VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info
