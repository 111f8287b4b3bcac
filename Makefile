# Two commands do everything on a fresh machine with python3 and make:
#   make demo   - install into .venv and run the live demo
#   make test   - install into .venv (with the test and benchmark extras), lint (ruff), check the
#                 format (ruff format) and the types (mypy), then run the whole test suite, which
#                 includes one quick run of the benchmark suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test clean

demo: $(VENV)/.installed
	$(BIN)/rsnet demo

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
