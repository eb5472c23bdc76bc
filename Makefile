# privpipe: every target bootstraps .venv itself, so a fresh clone needs only `make run` / `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
DEVSTAMP := $(VENV)/.installed-dev-$(shell cat pyproject.toml | sha256sum | cut -c1-16)
OUT    ?= demo-out
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: run test lint bench e2e venv dev clean pyc

## The bootstrap installs with uv, from PyPI into .venv, byte-compiling what it installs as pip
## does (where PYTHONDONTWRITEBYTECODE is set nothing else would: every import of Beam would
## compile it again): `make dev` on a clean clone ~53 s, against ~95 s with pip (RESULTS.md,
## thirty-second round). Where uv cannot be had or fails, pip installs the same requirements.
UV := $(VENV)/bin/uv
install = { [ -x $(UV) ] && $(UV) pip install --quiet --compile-bytecode --python $(PY) $(1); } \
	|| $(PY) -m pip install --quiet $(1)

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; privpipe needs Python 3.11 (set PYTHON=/path/to/python3.11)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv || echo "note: uv not installed; pip installs privpipe"

$(STAMP): pyproject.toml | $(PY)
	$(call install,-e .)
	@rm -f $(VENV)/.installed-*[!v]-* ; touch $@

$(DEVSTAMP): pyproject.toml | $(PY)
	$(call install,-e '.[dev]')
	@touch $(STAMP) $@

venv: $(STAMP)
	@$(MAKE) --no-print-directory pyc
dev: $(DEVSTAMP)
	@$(MAKE) --no-print-directory pyc

## make pyc: byte-compile the project's packages. Where PYTHONDONTWRITEBYTECODE is set (as on
## this machine) Python never caches them itself and every `privpipe` start compiled ~80
## modules again (~0.45 s CPU of each run); stale files are simply recompiled in memory.
PACKAGES := anonymity attacks dp pipelines privpipe reports transforms
pyc: | $(PY)
	@$(PY) -m compileall -q -j0 $(PACKAGES)

## numpy without transparent huge pages in the tests and in-process benchmarks too, as the
## privpipe command itself runs (pipelines/cli.py: no_huge_page_stalls); a set value is kept
export NUMPY_MADVISE_HUGEPAGE ?= 0

## make run: set up .venv and run the demo (generated microdata through configs/demo.yaml)
run: $(STAMP) pyc
	$(VENV)/bin/privpipe demo --output $(OUT)

## make test: set up .venv with dev extras, lint, run the whole test suite. mypy (~40 s of one
## core from a cold cache, as in CI) runs beside the tests instead of before them, and its
## output follows theirs; the target fails if either fails.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=12
test: $(DEVSTAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@echo "$(VENV)/bin/mypy -p privpipe  (beside the tests)"; echo "$(PYTEST)"
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	$(VENV)/bin/mypy -p privpipe >"$$log" 2>&1 & typing=$$!; \
	$(PYTEST); tests=$$?; \
	wait $$typing; typed=$$?; \
	echo "--- mypy -p privpipe:"; cat "$$log"; \
	if [ $$typed -ne 0 ]; then echo "make test: mypy failed (exit $$typed)"; exit $$typed; fi; \
	exit $$tests

lint: $(DEVSTAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -p privpipe

## make bench: run the benchmarks (prints JSON; record results in benchmarks/RESULTS.md), then
## compare the whole demo config's stage timings with benchmarks/recorded.jsonl (exit 1 if a
## stage got slower; BENCH_LARGE=1 for 10M rows)
BENCH_LOG ?= $(or $(TMPDIR),/tmp)/privpipe-bench/last.jsonl
bench: $(DEVSTAMP) pyc
	$(PY) benchmarks/run_all.py --save $(BENCH_LOG)
	$(PY) benchmarks/regress.py $(BENCH_LOG)

## make e2e: render the demo's report.html in headless Chromium (installs Debian's chromium
## if missing), fail on browser console errors, save demo-out/internal/report.png
e2e: $(STAMP)
	$(PY) tests/e2e/render_report.py

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .mypy_cache .ruff_cache
