# The two commands of the README: `make demo` and `make test`. Both create the
# virtual environment if it is missing and install the package into it.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP     := $(BIN)/python -m pip

.PHONY: demo test install bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install -q -c constraints.txt -e '.[dev,titan]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/zipccl demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests

bench: $(STAMP)
	$(BIN)/zipccl bench codec

clean:
	rm -rf $(VENV) build *.egg-info
