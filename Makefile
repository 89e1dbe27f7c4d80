# The two commands a fresh machine needs: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTHON ?= python3
BASE_STAMP := $(VENV)/.installed-base
DEV_STAMP := $(VENV)/.installed-dev
OUT ?= build

.PHONY: demo test test-fast lab bench install dev chromium clean lint docs cli-docs

install: $(BASE_STAMP)
dev: $(DEV_STAMP)

# Quiet installs: one line says what happens. pip -qq drops warnings (setuptools' "Editable installation" banner is
# one, forwarded from the build backend under a single -q) and keeps errors, which still stop make.
PIP_QUIET := -qq --disable-pip-version-check

$(BASE_STAMP): pyproject.toml
	@echo "installing promptcache_nb and its dependencies into $(VENV) (once)"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) install $(PIP_QUIET) --upgrade pip
	@$(PIP) install $(PIP_QUIET) -e .
	@touch $@

$(DEV_STAMP): $(BASE_STAMP) pyproject.toml
	@echo "installing the test and notebook tools into $(VENV) (once)"
	@$(PIP) install $(PIP_QUIET) -e '.[dev]'
	@touch $@

## make demo: replay the embedded reference scenario under every strategy (offline, no API key)
demo: $(BASE_STAMP)
	$(VENV)/bin/promptcache-nb demo --out $(OUT)/demo

## make test: unit tests, notebooks under nbval, the real-browser test and the docs site (mkdocs --strict)
# CI artifacts: $(OUT)/browser/ (every notebook after Run All at 1280x720 with the file browser open, as PNG,
# with problems.json and timings.json, written by tests/test_browser_notebooks.py); kept until `make clean`.
# Bytecode is cached even where the environment says PYTHONDONTWRITEBYTECODE: every pytest worker, kernel and
# child process would otherwise compile the package and the tests again (~25 s of a run; __pycache__ is ignored).
test: export PYTHONDONTWRITEBYTECODE =
test: $(DEV_STAMP) chromium
	$(VENV)/bin/ruff check promptcache_nb tests benchmarks scripts
	$(VENV)/bin/mypy --strict  # [tool.mypy]'s packages, under every strict check (one run: strict includes the rest)
	PCNB_BROWSER_OUT=$(abspath $(OUT))/browser PYTHONHASHSEED=0 $(PY) -m pytest -q -p no:cacheprovider -n 2 tests
	@echo "browser screenshots (CI artifacts): $(OUT)/browser/"
	# notebooks: strict nbval for the deterministic quickstart, lax (+ NBVAL_CHECK_OUTPUT cells) for the rest
	PYTHONHASHSEED=0 MPLBACKEND=Agg $(PY) -m pytest -q -p no:cacheprovider --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/sanitize.cfg notebooks/01_quickstart.ipynb
	# both cores, a notebook per worker (--dist loadfile keeps each notebook's cells in order in one kernel)
	PYTHONHASHSEED=0 MPLBACKEND=Agg $(PY) -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env \
		--nbval-sanitize-with notebooks/sanitize.cfg --ignore=notebooks/01_quickstart.ipynb -n 2 --dist loadfile notebooks
	# the manual as a site: a broken link, a page left out of the nav or a docstring mkdocstrings cannot read fails
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d $(OUT)/site  # not -q: it would hide the warning that failed

## make test-fast: the inner loop: unit tests without the browser, the reliability trials (kills, locks, load,
## fuzzing) or the slow ones (other processes, long sessions); no notebooks, no lint. `make test` runs everything.
test-fast: export PYTHONDONTWRITEBYTECODE =
test-fast: $(DEV_STAMP)
	PYTHONHASHSEED=0 $(PY) -m pytest -q -p no:cacheprovider -n 2 -m "not slow and not browser and not reliability" tests

# Debian's chromium for the browser test (never a downloaded browser build).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian chromium for the browser test"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

## make lab: open the notebooks in JupyterLab
lab: $(DEV_STAMP)
	$(VENV)/bin/jupyter lab notebooks/

## make bench: speed and size figures (not part of make test)
bench: $(BASE_STAMP)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

## make docs: the manual (docs/, mkdocs-material + mkdocstrings) as a site in build/site
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -d $(OUT)/site  # not -q: it would hide the warning that failed

## make cli-docs: regenerate docs/cli.md from the parser's --help (tests/test_cli_docs.py fails when it drifts)
cli-docs: $(DEV_STAMP)
	$(PY) scripts/gen_cli_docs.py

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check promptcache_nb tests benchmarks scripts
	$(VENV)/bin/mypy --strict  # [tool.mypy]'s packages, under every strict check (one run: strict includes the rest)

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
