# One command each, on a fresh machine with python3 (3.11+) and Java 17+ on PATH.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Re-install only when pyproject.toml changes.
SIG    := $(shell cksum < pyproject.toml | cut -d' ' -f1)
# The set-up's parts are independent (Python packages, RocketMQ's jars, the two Maven
# builds) and mostly wait on downloads: make builds them side by side.
MAKEFLAGS += --jobs=3

.PHONY: setup demo test test-quick flake-hunt lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv

# The installer is uv (astral-sh/uv, installed into the venv by its pip): it downloads,
# unpacks and compiles in parallel, where pip does one package after another (a fresh
# clone's venv and full install: 67 s against pip's 85 s on a 2-core host; a clean machine's
# whole `make setup`, Maven's part beside it: 96 s against 132 s one after the other).
# uv reads its own variables, so the pip ones a machine may set (a mirror, a wheel folder)
# are passed on. --compile-bytecode: where PYTHONDONTWRITEBYTECODE is set, nothing installed
# is ever compiled to disk otherwise, and every process would compile pyspark again.
UV_FLAGS := -q --python $(BIN)/python --compile-bytecode \
  $(if $(PIP_INDEX_URL),--index-url $(PIP_INDEX_URL)) \
  $(foreach l,$(PIP_FIND_LINKS),$(if $(or $(findstring ://,$(l)),$(wildcard $(l))),--find-links $(l)))
INSTALL := $(BIN)/uv pip install $(UV_FLAGS)

# An editable install compiles nothing of the project itself, and where the environment sets
# PYTHONDONTWRITEBYTECODE no process writes the bytecode it compiles: every broker, name
# server and test subprocess would compile the package again (~0.15 CPU s each; a cluster
# of three processes starts with 28 % less CPU from compiled files). Compiled here once;
# a changed source is recompiled on import as usual.
COMPILE := $(BIN)/python -m compileall -q -j 0 src benchmarks tests tools examples

$(VENV)/.core-$(SIG): | $(BIN)/python
	$(INSTALL) -e '.[server]'
	@$(COMPILE) >/dev/null
	@touch $@

$(VENV)/.full-$(SIG): | $(BIN)/python
	$(INSTALL) -e '.[server,dev,spark,bench,otel]'
	@$(COMPILE) >/dev/null
	@touch $@ $(VENV)/.core-$(SIG)

## setup: install the project with every extra into .venv
setup: $(VENV)/.full-$(SIG)

## demo: the main job on an embedded cluster
demo: $(VENV)/.core-$(SIG)
	$(BIN)/qclient demo

## test: the whole suite (what CI runs), RocketMQ's fault tests and Spark included, on three
## workers: most tests wait on real delays, timeouts and processes, not on the CPU. Every
## test that starts a JVM (RocketMQ, its Java client, Spark) is in one xdist group, so one
## worker runs them one after another: at most one RocketMQ cluster and one Spark deployment
## at a time, and the run fails if the sampler sees more (tests/_budget.py, docs/TESTING.md).
## A crashed worker is not replaced: pytest-xdist 3.8's loadgroup scheduler can wait
## forever for a replacement's work (pytest-dev/pytest-xdist#1323, #1378), so a crash
## must end the run as a failure naming the test, not hang it. The JUnit report feeds
## `make flake-hunt HEAVIEST=K`.
PYTEST_SUITE := -q -n 3 --dist loadgroup --max-worker-restart=0
test: setup
	$(BIN)/python -m pytest $(PYTEST_SUITE) --junitxml=build/test-report.xml

## test-quick: the inner loop: every test that starts no JVM (no Java needed) and no script
## smoke run (marked slow), ~3 min; never instead of `make test`
test-quick: $(VENV)/.full-$(SIG)
	$(BIN)/python -m pytest $(PYTEST_SUITE) -m "not jvm and not slow"

## flake-hunt: repeat test modules N times beside a busy core and print failures per test:
## make flake-hunt N=10 HEAVIEST=10 (the ten heaviest modules of the last make test), or
## make flake-hunt N=5 TESTS="tests/consumer/test_groups.py"
N ?= 10
HEAVIEST ?= 0
TESTS ?=
flake-hunt: setup
	$(BIN)/python tools/flake_hunt.py --repeat $(N) --heaviest $(HEAVIEST) $(TESTS)

lint: setup
	$(BIN)/ruff check src tests benchmarks examples tools
	$(BIN)/ruff format --check src tests benchmarks examples tools
	$(BIN)/mypy

## bench: the benchmark suite, peers included, and its report (benchmarks/results/)
bench: setup
	PYTHON=$(BIN)/python bash benchmarks/setup_peers.sh
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

## java-peer: the Java peer jar (tools/rocketmq/java: Apache RocketMQ's own Java client, run
## by benchmarks/_rocketmq_java.py). The jar is its own stamp: rebuilt when the pom or a
## source is newer. Offline first (every plugin and jar cached after one build), else online.
## Without mvn or java: a one-line notice, the embedded engine needs neither.
JAVA_PEER_DIR := tools/rocketmq/java
JAVA_PEER_JAR := $(JAVA_PEER_DIR)/target/qclient-java-peer.jar
.PHONY: java-peer
java-peer: $(JAVA_PEER_JAR)

$(JAVA_PEER_JAR): $(JAVA_PEER_DIR)/pom.xml $(shell find $(JAVA_PEER_DIR)/src -type f 2>/dev/null)
	@if command -v mvn >/dev/null && command -v java >/dev/null; then \
	  (cd $(JAVA_PEER_DIR) && { mvn -q -B -o package || mvn -q -B package; }) && touch $@; \
	else echo "make: no mvn or java on PATH, skipping the Java peer (tests/engines/rocketmq need it)"; fi

# make setup (and so make test, what CI runs) builds the peer too: tests/engines/rocketmq runs it.
setup: java-peer

## rocketmq-jars: the Apache RocketMQ jars RocketMQCluster runs (tools/rocketmq/pom.xml,
## copied by Maven into tools/rocketmq/lib), fetched again only when the pom changes (the
## stamp names its checksum); an unchanged set leaves the jars alone, so running JVMs keep
## theirs. Without mvn or java: a one-line notice, the embedded engine needs neither.
RMQ_DIR   := tools/rocketmq
RMQ_STAMP := .pom-$(shell cksum < $(RMQ_DIR)/pom.xml | cut -d' ' -f1)
.PHONY: rocketmq-jars
rocketmq-jars: $(RMQ_DIR)/lib/$(RMQ_STAMP)

$(RMQ_DIR)/lib/$(RMQ_STAMP):
	@if command -v mvn >/dev/null && command -v java >/dev/null; then \
	  cd $(RMQ_DIR) && rm -rf lib/.fetch \
	  && { mvn -q -B -o dependency:copy-dependencies -DoutputDirectory=lib/.fetch >/dev/null 2>&1 \
	       || mvn -q -B dependency:copy-dependencies -DoutputDirectory=lib/.fetch; } \
	  && if ! diff -rq -x '.*' lib/.fetch lib >/dev/null 2>&1; then \
	       rm -f lib/*.jar && mv lib/.fetch/*.jar lib/; fi \
	  && rm -rf lib/.fetch && touch lib/$(RMQ_STAMP); \
	else echo "make: no mvn or java on PATH, skipping the RocketMQ jars (RocketMQCluster needs them)"; fi

setup: rocketmq-jars

## rocketmq-ha-loopback: the jar that has each RocketMQ broker's HA acceptor listen on its
## brokerIP2 (127.0.0.1) rather than every interface (tools/rocketmq/ha-loopback, put on the
## brokers' classpath by RocketMQCluster). Compiled against tools/rocketmq/lib, so rebuilt when
## those jars are fetched again, or when its pom or a source is newer (the jar is its own
## stamp). Without mvn or java: a one-line notice; RocketMQCluster then warns and runs without.
RMQ_HA_DIR := $(RMQ_DIR)/ha-loopback
RMQ_HA_JAR := $(RMQ_HA_DIR)/target/qclient-rocketmq-ha-loopback.jar
.PHONY: rocketmq-ha-loopback
rocketmq-ha-loopback: $(RMQ_HA_JAR)

$(RMQ_HA_JAR): $(RMQ_DIR)/lib/$(RMQ_STAMP) $(RMQ_HA_DIR)/pom.xml $(shell find $(RMQ_HA_DIR)/src -type f 2>/dev/null)
	@if command -v mvn >/dev/null && command -v java >/dev/null; then \
	  (cd $(RMQ_HA_DIR) && { mvn -q -B -o package || mvn -q -B package; }) && touch $@; \
	else echo "make: no mvn or java on PATH, skipping the RocketMQ HA loopback jar"; fi

setup: rocketmq-ha-loopback
