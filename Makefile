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

install: $(VENV)/.installed

# The whole system live: a simulated 3-node cluster, 3 agents, the Spark pipeline, an embedded broker.
# Writes for DURATION seconds (then ~30-60 s to catch up, check and stop); `make run DURATION=` runs
# until Ctrl-C. Everything it starts is stopped, and ./demo-data removed, when it ends.
DURATION ?= 120
run: install
	$(BIN)/cassandra-cdc demo $(if $(DURATION),--duration $(DURATION))

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python benchmarks/commitlog_decode.py

clean:
	rm -rf $(VENV) build src/*.egg-info
