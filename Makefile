# Entry points: `make demo` (run the default pipeline), `make test` (run the tests), `make bench`
# (run the benchmarks into bench/results.md), `make docs` (build the documentation site into site/).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKSPACE ?= workspace
SITE_DIR ?= site
# pytest-xdist processes for the default and slow tiers
TEST_WORKERS ?= 2

.PHONY: setup demo test test-slow lint bench bench-quick docs

$(STAMP): pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet --no-build-isolation -e '.[deepspeed]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1 \
		$(BIN)/flowpost run --workspace $(WORKSPACE)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow -n $(TEST_WORKERS)

bench: $(STAMP)
	PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1 \
		$(BIN)/python bench/run_all.py --workspace bench-ws

bench-quick: $(STAMP)
	PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1 \
		$(BIN)/python bench/run_all.py --quick --workspace bench-ws

lint: $(STAMP)
	$(BIN)/ruff check flowpost tests

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(SITE_DIR)
