# Everything a fresh machine needs is installed by these targets (Python >= 3.10; Java 17 for Spark).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

$(STAMP): pyproject.toml setup.py cec/_native.c
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test,bench,spark]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/cec demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=20 -n 2 --dist loadfile

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_recovery.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
