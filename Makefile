# The two commands a newcomer runs: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
SHARED ?= ../shared

.PHONY: run test install bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: install
	$(BIN)/cassandra-cdc dump $(SHARED)/cassandra-commitlogs/4.0.11-encrypted/*.log \
	    --schema tests/data/system_schemas/cassandra-4.0.11.cql \
	    --schema tests/data/legacy_commitlog_tables/4.0.11.cql

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python benchmarks/commitlog_decode.py

clean:
	rm -rf $(VENV) build src/*.egg-info
