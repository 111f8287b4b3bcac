# Two commands do everything on a fresh machine with python3 and make:
#   make demo   - install into .venv and run the live demo
#   make test   - install into .venv (with the test and benchmark extras) and Java 17 if it is
#                 missing (as root, through apt); lint (ruff), check the format (ruff format) and
#                 the types (mypy); then run the whole test suite, which includes one quick run
#                 of the benchmark suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test clean java

demo: $(VENV)/.installed
	$(BIN)/rsnet demo

test: $(VENV)/.installed java
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The Spark connector's tests start a real local Spark, which needs Java 17.
java:
	@if command -v java >/dev/null 2>&1 || { [ -n "$$JAVA_HOME" ] && [ -x "$$JAVA_HOME/bin/java" ]; }; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Java 17 for the Spark tests (apt-get install openjdk-17-jre-headless)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless; \
	else \
		echo "make test: the Spark tests need Java 17 and none was found; install it, e.g." >&2; \
		echo "  sudo apt-get install -y openjdk-17-jre-headless   (or set JAVA_HOME)" >&2; \
		exit 1; \
	fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
