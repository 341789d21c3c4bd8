# The two commands of the README: `make demo` and `make test`. Both create the
# virtual environment if it is missing and install the package into it
# (Python 3.11 or newer: PY=python3.12 make test picks another interpreter).
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP     := $(BIN)/python -m pip

.PHONY: demo test install bench clean test-triton-newest check-triton-newest

# The kernel tests also run under the newest triton tested (pyproject.toml
# states the range): that wheel alone, installed into a folder of the venv
# and put first on PYTHONPATH, over the venv's torch.
TRITON_NEWEST ?= 3.9.0
TRITON_NEWEST_DIR := $(VENV)/triton-$(TRITON_NEWEST)
KERNEL_TESTS := tests/test_triton_codec.py tests/test_triton_dense.py

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# triton follows torch: a CUDA build of torch requires the triton it was built
# with, and pip installs that one. A CPU build (the dev and CI machines')
# requires none; then the oldest triton the kernels support is installed
# (what the GPU machine ships beside torch 2.11), so that the kernel tests run
# under both ends of pyproject.toml's range, this one and TRITON_NEWEST.
TRITON_OLDEST ?= 3.6.0
TRITON_PIN := $(VENV)/triton-pin.txt
define TRITON_PIN_PY
import importlib.metadata as m
wants = any(r.replace(" ", "").startswith("triton") for r in m.requires("torch") or [])
print("" if wants else "triton==$(TRITON_OLDEST)")
endef
export TRITON_PIN_PY

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP) install -q -c constraints.txt torch
	$(BIN)/python -c "$$TRITON_PIN_PY" > $(TRITON_PIN)
	$(PIP) install -q -c constraints.txt -c $(TRITON_PIN) -e '.[dev,titan]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/zipccl demo

$(TRITON_NEWEST_DIR)/.installed: | $(STAMP)
	$(PIP) install -q --no-deps --upgrade --target $(TRITON_NEWEST_DIR) triton==$(TRITON_NEWEST)
	touch $@

# The kernel tests (triton's interpreter, one core busy) run beside the rest
# of the suite, whose multi-rank tests leave cores idle waiting on each
# other: under the venv's triton, then under the newest. Their output goes to
# logs (each run under its own pytest temporary folder), printed when the
# suite ends; any of the three runs failing fails the target.
KERNEL_LOG := $(VENV)/kernel-tests-triton
KERNEL_PYTEST = $(BIN)/python -m pytest -q -ra -p no:cacheprovider $(KERNEL_TESTS)
NEWEST_PYTEST = PYTHONPATH=$(TRITON_NEWEST_DIR) $(KERNEL_PYTEST) \
	--basetemp=$(VENV)/pytest-triton-$(TRITON_NEWEST)

test: $(STAMP) $(TRITON_NEWEST_DIR)/.installed
	@$(MAKE) --no-print-directory check-triton-newest
	@echo "make test: the suite, and beside it the kernel tests under the venv's triton," \
	  "then under triton $(TRITON_NEWEST) (logs: $(KERNEL_LOG)-*.log); about 20 minutes on 2 cores"
	@( $(KERNEL_PYTEST) --basetemp=$(VENV)/pytest-triton-venv > $(KERNEL_LOG)-venv.log 2>&1; \
	   echo $$? > $(KERNEL_LOG)-venv.rc; \
	   $(NEWEST_PYTEST) > $(KERNEL_LOG)-$(TRITON_NEWEST).log 2>&1; \
	   echo $$? > $(KERNEL_LOG)-$(TRITON_NEWEST).rc ) & \
	$(BIN)/python -m pytest -q -ra tests $(KERNEL_TESTS:%=--ignore=%); suite=$$?; wait; \
	for v in venv $(TRITON_NEWEST); do \
	  echo "== kernel tests under triton $$v =="; tail -n 25 $(KERNEL_LOG)-$$v.log; done; \
	venv=$$(cat $(KERNEL_LOG)-venv.rc); newest=$$(cat $(KERNEL_LOG)-$(TRITON_NEWEST).rc); \
	echo "make test: suite exit $$suite, kernel tests exit $$venv (venv's triton)" \
	  "and $$newest (triton $(TRITON_NEWEST))"; \
	test $$suite -eq 0 && test $$venv -eq 0 && test $$newest -eq 0

check-triton-newest: $(TRITON_NEWEST_DIR)/.installed
	PYTHONPATH=$(TRITON_NEWEST_DIR) $(BIN)/python -c \
	  "import triton; assert triton.__version__ == '$(TRITON_NEWEST)', triton.__version__"

test-triton-newest: check-triton-newest
	$(NEWEST_PYTEST)

bench: $(STAMP)
	$(BIN)/zipccl bench codec

clean:
	rm -rf $(VENV) build *.egg-info
