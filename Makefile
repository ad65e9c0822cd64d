# The two commands a newcomer runs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SHARED ?= ../shared

.PHONY: run test scenarios install bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

# Real Apache Cassandra, Apache Kafka, Spark's Kafka connector, Kafka Connect with Debezium's JDBC sink and
# Apicurio's AvroConverter, a PostgreSQL server, Apache Hadoop HDFS, an S3 API server and Hadoop's S3A file system
# for the real-system tests: each pinned runtime classpath
# (jvm/*/pom.xml) copied by Maven into its own directory under .jvm/lib/; and a schema registry (Apicurio,
# jvm/registry), which Maven builds into .jvm/lib/registry/, and the converter's ServiceLoader manifest jar
# (jvm/apicurio-converter). Fetched once: the stamp is newer than the poms, so a re-run fetches nothing.
JVM_LIB := .jvm/lib
JVM_POMS := $(wildcard jvm/pom.xml jvm/*/pom.xml)
JVM_SOURCES := $(shell find jvm/registry/src jvm/apicurio-converter/src -type f)

# The PostgreSQL server of jvm/postgres is a .txz inside its jar: unpacked once, into
# .jvm/lib/postgres/server.
define UNPACK_POSTGRES
import io, sys, tarfile, zipfile
jar = zipfile.ZipFile(sys.argv[1])
archive = next(name for name in jar.namelist() if name.endswith(".txz"))
tarfile.open(fileobj=io.BytesIO(jar.read(archive))).extractall(sys.argv[2], filter="tar")
endef
export UNPACK_POSTGRES

.jvm/.installed: $(JVM_POMS) $(JVM_SOURCES)
	@command -v mvn >/dev/null || { echo "make install: fetching the JVM artifacts of jvm/*/pom.xml" \
	    "needs Maven 3.8+ (mvn) and Java 17+" >&2; exit 2; }
	rm -rf $(JVM_LIB)
	mvn -q -B -Dstyle.color=never -f jvm/pom.xml dependency:copy-dependencies
	mvn -q -B -Dstyle.color=never -f jvm/pom.xml -pl registry,apicurio-converter package
	$(PYTHON) -c "$$UNPACK_POSTGRES" $(JVM_LIB)/postgres/embedded-postgres-binaries-*.jar \
	    $(JVM_LIB)/postgres/server
	touch $@

# A class data sharing archive of the Spark driver's classes (src/cassandra_cdc/pipeline/class_archive.py):
# the local Spark sessions of `make run` and `make test` start in half the time. Written again when the
# Python environment (PySpark's jars with it) or the workload changes; the workload's output is kept in a
# log beside it.
SPARK_CLASS_ARCHIVE := .jvm/spark-classes.jsa
$(SPARK_CLASS_ARCHIVE): $(VENV)/.installed src/cassandra_cdc/pipeline/class_archive.py
	@mkdir -p $(@D)
	@$(BIN)/python -m cassandra_cdc.pipeline.class_archive $@ > $@.log 2>&1 || { cat $@.log; exit 1; }
	@tail -n 1 $@.log
USE_SPARK_CLASS_ARCHIVE := CASSANDRA_CDC_SPARK_CLASS_ARCHIVE=$(CURDIR)/$(SPARK_CLASS_ARCHIVE)

install: $(VENV)/.installed .jvm/.installed $(SPARK_CLASS_ARCHIVE)

# The whole system live on the real thing: a 3-node Apache Cassandra 5.0 cluster (RF=3) and an Apache
# Kafka broker started from .jvm/lib, a CQL workload through cassandra-driver, 3 agents on the nodes'
# cdc_raw, the Spark pipeline, a live view; it ends with the check that every table's events replayed
# equal SELECT * at CONSISTENCY ALL (exit 1 if not). It writes for DURATION seconds, after starting the
# nodes, the broker and Spark, and before catching up, checking and stopping (README: measured times);
# `make run DURATION=` runs until Ctrl-C. Everything it starts is stopped, and ./demo-data removed,
# when it ends. Without Java and the JVM artifacts: `cassandra-cdc demo --simulated`. ARGS go to
# `cassandra-cdc demo`: `make run ARGS=--chaos` kills and restarts its processes while it writes.
DURATION ?= 60
ARGS ?=
run: install
	$(USE_SPARK_CLASS_ARCHIVE) $(BIN)/cassandra-cdc demo $(if $(DURATION),--duration $(DURATION)) $(ARGS)

# CASSANDRA_CDC_REQUIRE_JVM: tests needing the fetched JVM artifacts fail instead of skipping without them.
# The long scenarios (tests marked `scenario`: a rolling upgrade, Kafka failing over, nodes joining and
# leaving, two data centers) are not in it, to keep it within its time: `make scenarios` runs them (benchmarks/scenarios.py).
# TEST_WORKERS pytest-xdist workers; a worker that runs out of tests takes the other's (worksteal).
# SPARK_SUBMIT_OPTS (added to yours): the tests' Spark drivers run for seconds, too short for C2's
# compilations to pay back what they cost (a pipeline that runs for long wants C2: docs/pipeline.md).
TEST_WORKERS ?= 2
test: install
	$(USE_SPARK_CLASS_ARCHIVE) CASSANDRA_CDC_REQUIRE_JVM=1 SPARK_SUBMIT_OPTS="$$SPARK_SUBMIT_OPTS -XX:TieredStopAtLevel=1" \
	    $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not scenario"

scenarios: install
	$(USE_SPARK_CLASS_ARCHIVE) $(BIN)/python benchmarks/scenarios.py

bench: install
	$(BIN)/python benchmarks/commitlog_decode.py

clean:
	rm -rf $(VENV) build src/*.egg-info .jvm
