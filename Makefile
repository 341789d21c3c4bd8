# The two commands of the README: `make demo` and `make test`. Both create the
# virtual environment if it is missing and install the package into it.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP     := $(BIN)/python -m pip

.PHONY: demo test install bench clean test-triton-newest

# The kernel tests also run under the newest triton tested (pyproject.toml
# states the range): that wheel alone, installed into a folder of the venv
# and put first on PYTHONPATH, over the venv's torch.
TRITON_NEWEST ?= 3.9.0
TRITON_NEWEST_DIR := $(VENV)/triton-$(TRITON_NEWEST)
KERNEL_TESTS := tests/test_triton_codec.py tests/test_triton_dense.py

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install -q -c constraints.txt -e '.[dev,titan]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/zipccl demo

$(TRITON_NEWEST_DIR)/.installed: | $(STAMP)
	$(PIP) install -q --no-deps --upgrade --target $(TRITON_NEWEST_DIR) triton==$(TRITON_NEWEST)
	touch $@

test: $(STAMP) test-triton-newest
	$(BIN)/python -m pytest -q -ra tests

test-triton-newest: $(TRITON_NEWEST_DIR)/.installed
	PYTHONPATH=$(TRITON_NEWEST_DIR) $(BIN)/python -c \
	  "import triton; assert triton.__version__ == '$(TRITON_NEWEST)', triton.__version__"
	PYTHONPATH=$(TRITON_NEWEST_DIR) $(BIN)/python -m pytest -q -ra $(KERNEL_TESTS)

bench: $(STAMP)
	$(BIN)/zipccl bench codec

clean:
	rm -rf $(VENV) build *.egg-info
