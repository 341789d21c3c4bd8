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

# The training demo once it is in this build, else the codec benchmark.
demo: $(STAMP)
	@if $(BIN)/zipccl demo --help >/dev/null 2>&1; then $(BIN)/zipccl demo; \
	else $(BIN)/zipccl bench codec; fi

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra tests

bench: $(STAMP)
	$(BIN)/zipccl bench codec

clean:
	rm -rf $(VENV) build *.egg-info
