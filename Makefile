# Two commands do everything on a fresh machine with python3 and make:
#   make demo   - install rsnet (no extras) into .venv and run the live demo
#   make test   - install into .venv (with the test and benchmark extras), client/js's npm
#                 packages (npm ci), Java 17, Chromium, zsh, fish and nats-server where missing
#                 (as root, through apt);
#                 lint (ruff), check the format (ruff format) and the types (mypy); then run the
#                 whole test suite, which includes one quick run of the benchmark suite and the
#                 JavaScript client's node tests
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test clean java shells nats chromium

# The demo needs rsnet alone: a venv of its own extras-free install (fast on a fresh clone).
# `make test` later adds the test and benchmark extras to the same .venv.
demo: $(VENV)/.demo-installed
	$(BIN)/rsnet demo

test: $(VENV)/.installed java shells nats chromium client/js/node_modules/.package-lock.json
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The Spark connector's tests start a real local Spark, which needs Java 17 or later (the
# java of JAVA_HOME if set, else the one on PATH; "1.8" is Java 8).
JAVA_MAJOR = { if [ -n "$$JAVA_HOME" ]; then "$$JAVA_HOME/bin/java" -version; else java -version; fi; } 2>&1 \
	| sed -n 's/.* version "\(1\.\)\{0,1\}\([0-9]*\).*/\2/p' | head -n 1
java:
	@major=$$($(JAVA_MAJOR)); if [ -n "$$major" ] && [ "$$major" -ge 17 ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing Java 17 for the Spark tests (apt-get install openjdk-17-jre-headless)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless || exit 1; \
		major=$$($(JAVA_MAJOR)); if [ -n "$$major" ] && [ "$$major" -ge 17 ]; then exit 0; fi; \
		echo "make test: Java 17 is installed, but $${JAVA_HOME:-the java on PATH} is $${major:+Java $$major}$${major:-no Java}:" \
			"set JAVA_HOME=$$(ls -d /usr/lib/jvm/java-17-openjdk-* | head -n 1)" >&2; \
		exit 1; \
	else \
		echo "make test: the Spark tests need Java 17 or later, and $${major:+Java $$major was found}$${major:-none was found};" \
			"install it, e.g." >&2; \
		echo "  sudo apt-get install -y openjdk-17-jre-headless   (or set JAVA_HOME)" >&2; \
		exit 1; \
	fi

# zsh and fish, whose completion scripts the CLI tests load in the real shells (through apt, as
# root, where missing; else those tests skip, saying so).
shells:
	@for shell in zsh fish; do \
	  if ! command -v $$shell >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$shell >/dev/null \
	    || (apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$shell >/dev/null) \
	    || echo "could not install $$shell: its completion test will be skipped"; fi; done

# NATS JetStream, which the benchmark suite's scenario 7 measures rsnet's broker against (the
# benchmarks start their own nats-server on 127.0.0.1; the Debian package's own service, where
# systemd starts it, listens on 127.0.0.1:4222 only). Through apt, as root, where missing; else
# those rows report "not available".
nats:
	@if command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing nats-server for the benchmarks' JetStream rows (apt-get install nats-server)"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nats-server >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nats-server >/dev/null) \
		|| echo "could not install nats-server: the benchmarks' JetStream rows will report not available"; \
	else \
		echo "nats-server not found: the benchmarks' JetStream rows will report not available" \
			"(sudo apt-get install nats-server)"; \
	fi

# The JavaScript client's packages, exactly as locked (its tests run inside pytest).
client/js/node_modules/.package-lock.json: client/js/package-lock.json
	@if command -v npm >/dev/null; then cd client/js && npm ci --no-audit --no-fund; \
	else echo "npm not found: the JavaScript client's tests will be skipped"; fi

# Chromium for the browser tests (through apt, as root, where missing; else those tests skip).
chromium:
	@if ! command -v chromium >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get install -y --no-install-recommends chromium >/dev/null \
	  || (apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null) \
	  || echo "could not install chromium: the live view's browser test will be skipped"; fi

$(VENV)/.demo-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
