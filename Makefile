# The two commands (see README): `make demo` and `make test`. Both create the virtualenv
# and install memstream into it on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint test-faults bench browser stack-up stack-down clean lock docs

# pyproject.toml holds the ranges, constraints.txt the exact versions (the lock): see docs/operations.md, "Install"
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,bench]'
	touch $(STAMP)

# rewrite the lock from the virtualenv (after an upgrade in it: docs/development.md, "Upgrading a pin")
lock: $(STAMP)
	{ echo "# The lock: exact versions of every dependency, runtime and test (make lock writes it from"; \
	  echo "# the virtualenv). Installs use it as pip constraints; pyproject.toml holds the ranges."; \
	  $(PY) -m pip freeze --all --exclude-editable --exclude pip; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/memstream demo

# lint first: a finding fails `make test` (and so CI) before the suite starts. The suite runs in
# PYTEST_WORKERS parallel processes, each with a Kafka stack of its own (tests/conftest.py), handed
# one test at a time; PYTEST_WORKERS=0 runs it in this process alone.
PYTEST_WORKERS ?= 4
test: $(STAMP) lint browser
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

# ruff (rules in pyproject.toml), mypy (files and strictness in pyproject.toml), then no import
# circle between modules or packages (scripts/import_graph.py --check); the
# mechanical fixes ruff asks for (import order, pyupgrade, absolute imports): scripts/lint-fix.sh
# mypy's cache lives beside `dev up`'s downloads (MEMSTREAM_CACHE_DIR), not in the checkout: mypy checks
# each cached module against its source's hash, so a fresh clone reuses it (13 s cold, under 1 s so)
MYPY_CACHE_DIR ?= $(or $(MEMSTREAM_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/memstream)/mypy
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	MYPY_CACHE_DIR="$(MYPY_CACHE_DIR)" $(VENV)/bin/mypy
	$(PY) scripts/import_graph.py --check

# the fault suite alone (`make test` runs it too; MEMSTREAM_FAULT_SUITE=0 skips it there)
test-faults: $(STAMP)
	MEMSTREAM_FAULT_SUITE=1 $(PY) -m pytest tests/system/test_faults_kafka.py $(PYTEST_ARGS)

browser:
	bash scripts/install-browser.sh

# the documentation (docs/, mkdocs.yml) as a static site in .memstream/site; --strict: a broken
# link or anchor, or a page missing from the nav, fails the build (tests/test_docs_site.py too)
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --config-file mkdocs.yml
	@echo "open .memstream/site/index.html"

bench: $(STAMP)
	$(PY) bench/run_all.py $(BENCH_ARGS)

stack-up: $(STAMP)
	$(VENV)/bin/memstream dev up

stack-down: $(STAMP)
	$(VENV)/bin/memstream dev down

clean:
	rm -rf $(VENV) .memstream var .pytest_cache .mypy_cache .ruff_cache
