# The two commands a newcomer runs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SHARED ?= ../shared

.PHONY: run test install bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

# Real Apache Cassandra, Apache Kafka and Spark's Kafka connector for the real-cluster tests: each pinned
# runtime classpath (jvm/*/pom.xml) copied by Maven into its own directory under .jvm/lib/. Fetched once:
# the stamp is newer than the poms, so a re-run fetches nothing.
JVM_LIB := .jvm/lib
JVM_POMS := $(wildcard jvm/pom.xml jvm/*/pom.xml)

.jvm/.installed: $(JVM_POMS)
	rm -rf $(JVM_LIB)
	mvn -q -B -Dstyle.color=never -f jvm/pom.xml dependency:copy-dependencies
	touch $@

install: $(VENV)/.installed .jvm/.installed

# The whole system live: a simulated 3-node cluster, 3 agents, the Spark pipeline, an embedded broker.
# Writes for DURATION seconds (then ~30-60 s to catch up, check and stop); `make run DURATION=` runs
# until Ctrl-C. Everything it starts is stopped, and ./demo-data removed, when it ends.
DURATION ?= 120
run: install
	$(BIN)/cassandra-cdc demo $(if $(DURATION),--duration $(DURATION))

# CASSANDRA_CDC_REQUIRE_JVM: tests needing the fetched JVM artifacts fail instead of skipping without them.
test: install
	CASSANDRA_CDC_REQUIRE_JVM=1 $(BIN)/python -m pytest

bench: install
	$(BIN)/python benchmarks/commitlog_decode.py

clean:
	rm -rf $(VENV) build src/*.egg-info .jvm
