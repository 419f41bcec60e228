# microtrain: the two commands a newcomer needs are `make demo` and `make test`.
# Both set up a virtual environment in .venv first (Python 3.9+, gcc).

PYTHON ?= python3
VENV := .venv
PY := $(abspath $(VENV))/bin/python
STAMP := $(VENV)/.installed
CORE := modules/microtrain
CORE_FILES := $(wildcard $(CORE)/mt*.c $(CORE)/mt*.h)
# SANITIZE=1 (make test SANITIZE=1): the cffi core built with -fsanitize=address,undefined and
# every Python process of the suite started with the sanitizer runtimes preloaded
SANITIZE ?=
NATIVE_STAMP := build/native$(if $(filter 1,$(SANITIZE)),-sanitize).stamp
SANITIZE_ENV := $(if $(filter 1,$(SANITIZE)),LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1)
DEMO_PLAN := build/digits.mtp

.PHONY: all demo test venv native header clean distclean bench rp2040js boards-table fuzz

all: native

include firmware/micropython.mk

$(STAMP): requirements.txt requirements-test.txt host/pyproject.toml host/setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-test.txt
	$(PY) -m pip install -q -e host
	touch $@

venv: $(STAMP)

# the host runs the device's C core through cffi; rebuild it when the C changes
$(NATIVE_STAMP): $(STAMP) $(CORE_FILES) host/microtrain/_build_native.py
	@mkdir -p build
	rm -f build/native*.stamp
	MICROTRAIN_SANITIZE=$(SANITIZE) $(PY) -m pip install -q --no-deps --no-build-isolation -e host
	touch $@

native: $(NATIVE_STAMP)

# mt_format.h and the tables in docs/plan-format.md are generated from
# host/microtrain/format.py, the one definition of the plan format
header:
	$(PYTHON) host/microtrain/format.py > $(CORE)/mt_format.h
	$(PYTHON) host/microtrain/format.py --update-doc docs/plan-format.md

demo: native
	$(PY) -m microtrain compile examples/digits_cnn.onnx -o $(DEMO_PLAN) --update last-layer --lr 0.05 --momentum 0.9
	$(PY) -m microtrain report $(DEMO_PLAN) --svg build/digits-arena.svg
	$(PY) -m microtrain simulate $(DEMO_PLAN) --data examples/digits_user.npz --epochs 5

test: native firmware rp2040js
	MICROPY_DIR=$(MICROPY_DIR) $(SANITIZE_ENV) $(PY) -m pytest tests -q -rs

# Speed figures, not part of `make test` (the bench helper's target): exact instruction
# counts per step on qemu for each board in BENCH_BOARDS (two runs, which must agree), host
# simulator vs PyTorch time. Writes bench/results.json and docs/performance.md; see
# benchmarks/bench.py. Each board gets its own build, and a second one with a bigger heap
# for plans that need it (MCUNet).
BENCH_BOARDS ?= MPS2_AN500 MPS2_AN385
BENCH_HEAP ?= 2097152
bench: native
	+for b in $(BENCH_BOARDS); do \
	    $(MAKE) firmware-qemu FIRMWARE_QEMU_BOARD=$$b FIRMWARE_QEMU_BUILD=$(MICROTRAIN_BUILD)/bench-qemu-$$b && \
	    $(MAKE) firmware-qemu FIRMWARE_QEMU_BOARD=$$b FIRMWARE_QEMU_BUILD=$(MICROTRAIN_BUILD)/bench-qemu-$$b-bigheap \
	        FIRMWARE_MAKE_ARGS="$(FIRMWARE_MAKE_ARGS) MICROPY_HEAP_SIZE=$(BENCH_HEAP)" || exit 1; \
	done
	MICROPY_DIR=$(MICROPY_DIR) $(PY) benchmarks/bench.py --runs 2 --boards $(BENCH_BOARDS)
	$(PY) benchmarks/perfdoc.py

# libFuzzer on the C core under ASan and UBSan (clang), seeded with real plans of every op:
# fuzz/run.py prints executions, time, coverage and findings (build/fuzz/artifacts/)
FUZZ_SECONDS ?= 60
fuzz: native
	$(PY) fuzz/run.py --seconds $(FUZZ_SECONDS)

# rp2040js (npm, pinned by tests/rp2040js/package-lock.json) runs the Pico firmware in the tests
RP2040JS_STAMP := tests/rp2040js/node_modules/.installed
$(RP2040JS_STAMP): tests/rp2040js/package.json tests/rp2040js/package-lock.json
	@if command -v npm >/dev/null; then \
	    cd tests/rp2040js && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "microtrain: no npm; the rp2040js device tests will not run (apt-get install nodejs npm)"; fi
rp2040js: $(RP2040JS_STAMP)

# docs/boards.md's table: image sizes of build/firmware/*, free heap measured at boot on every
# board that runs here (unix, qemu, rp2040js), status; --update-profiles writes the measured
# heap into boards/*.json too
boards-table: native
	$(PY) firmware/boards_table.py --update-profiles

clean: firmware-clean
	rm -rf build host/build host/microtrain/_native*.so host/microtrain/_native.c .pytest_cache

distclean: clean
	rm -rf $(VENV) host/*.egg-info
