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

.PHONY: all demo test test-slow test-all test-host test-sanitize venv venv-firmware native header clean distclean bench rp2040js \
	boards-table serial-demo fuzz fleet-demo docs

all: native

# the native modules' and CircuitPython's builds need requirements-firmware.txt (venv-firmware)
MICROTRAIN_FIRMWARE_PY_DEPS := $(VENV)/.installed-firmware
include firmware/micropython.mk

# the host package with its own dependencies (host/pyproject.toml: numpy, onnx, cffi, tqdm) and
# what builds its C core (requirements-build.txt): all that `make demo` installs
HOST_STAMP := $(VENV)/.installed-host
$(HOST_STAMP): requirements-build.txt host/pyproject.toml host/setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-build.txt
	$(PY) -m pip install -q --no-build-isolation -e host
	touch $@

# the test stack on top (PyTorch, onnxruntime, scikit-learn, onnxscript, Flower, pytest...):
# `make test` and the other targets that run the suite, the boards or the benchmarks
$(STAMP): $(HOST_STAMP) requirements.txt requirements-test.txt requirements-fleet.txt requirements-docs.txt
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

venv: $(STAMP)

# what builds native modules and CircuitPython (MicroPython's mpy_ld.py, CircuitPython's
# translations): installed by the firmware targets that need it, not by `make test`
FIRMWARE_STAMP := $(MICROTRAIN_FIRMWARE_PY_DEPS)
$(FIRMWARE_STAMP): requirements-firmware.txt $(STAMP)
	$(PY) -m pip install -q -r requirements-firmware.txt
	touch $@
venv-firmware: $(FIRMWARE_STAMP)

# the host runs the device's C core through cffi; rebuild it when the C changes
$(NATIVE_STAMP): $(HOST_STAMP) $(CORE_FILES) host/microtrain/_build_native.py
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

# The docs site (mkdocs.yml; docs/development/docs.md) into build/site, with mkdocs-material and
# mkdocstrings from requirements-docs.txt (in the venv through requirements-test.txt). strict: a
# warning, a broken link or anchor fails it. tools/docs_hooks.py generates the CLI reference from
# the parser; the API pages come from the docstrings.
DOCS_SITE := build/site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir $(DOCS_SITE)

# The on-board workflow of docs/guide/boards.md ("On a board, over serial") against the emulated
# board: the qemu MPS2_AN500 firmware on a pseudo-terminal, as a USB serial port would be.
SERIAL_DEMO := build/serial-demo
# SERIAL_DEMO_BOARD=pico: the RPI_PICO firmware in rp2040js over its USB CDC instead of qemu's UART;
# SERIAL_DEMO_BOARD=virt: the VIRT_RV32 firmware (32-bit RISC-V) in qemu-system-riscv32
SERIAL_DEMO_BOARD ?= qemu
SERIAL_DEMO_PROFILE = $(or $(filter rpi_pico virt_rv32,$(SERIAL_DEMO_BOARD:pico=rpi_pico) $(SERIAL_DEMO_BOARD:virt=virt_rv32)),mps2_an500)
SERIAL_DEMO_FIRMWARE = $(FIRMWARE_BUILD)/$(SERIAL_DEMO_PROFILE)/$(if $(filter rpi_pico,$(SERIAL_DEMO_PROFILE)),firmware.uf2,firmware.elf)
serial-demo: venv native firmware-$(SERIAL_DEMO_PROFILE) $(if $(filter pico,$(SERIAL_DEMO_BOARD)),rp2040js)
	@mkdir -p $(SERIAL_DEMO)
	$(PY) -m microtrain compile examples/digits_cnn.onnx -o $(SERIAL_DEMO)/digits.mtp --update last-layer --lr 0.05 --momentum 0.9
	$(PY) -m microtrain.device.emulated $(SERIAL_DEMO_BOARD) $(SERIAL_DEMO_FIRMWARE) -- sh -c '\
	    $(PY) -m microtrain deploy $(SERIAL_DEMO)/digits.mtp --port $$PORT && \
	    $(PY) -m microtrain eval --port $$PORT --data examples/digits_user.npz && \
	    $(PY) -m microtrain train --port $$PORT --data examples/digits_user.npz --epochs 3 --checkpoint-every 100 && \
	    $(PY) -m microtrain eval --port $$PORT --data examples/digits_user.npz && \
	    $(PY) -m microtrain pull --port $$PORT --onnx examples/digits_cnn.onnx -o $(SERIAL_DEMO)/digits_trained.onnx'

# A fleet learning together (docs/fleet.md): 4 emulated boards (3 unix-port boards and the qemu
# MPS2_AN500 on a serial pty), each with a label-skewed share of the digits adaptation data in its
# own sample store, train the digits CNN's last layer in Flower's simulation engine; per-round
# global accuracy on the held-out set, then each board alone on its share for comparison.
FLEET_DEMO := build/fleet-demo
FLEET_DEMO_ROUNDS ?= 5
fleet-demo: venv native firmware-test
	@mkdir -p $(FLEET_DEMO)
	$(PY) -m microtrain compile examples/digits_cnn.onnx -o $(FLEET_DEMO)/digits.mtp --update last-layer --lr 0.05 --momentum 0.9
	$(PY) -m microtrain fleet simulate $(FLEET_DEMO)/digits.mtp --data examples/digits_user.npz --boards unix,unix,unix,qemu \
	    --rounds $(FLEET_DEMO_ROUNDS) --onnx examples/digits_cnn.onnx -o $(FLEET_DEMO)

# The tests in tiers (docs/development/tests.md; the markers in tests/conftest.py). pytest-xdist runs
# them on every core; a device target's scripts stay on one worker (one boot: xdist_group), and
# the `long` tests go out first (collection order, not xdist's biggest-group-first).
# `make test`: the host suite, the unix port and MPS2_AN500 (one serial run), ten slowest listed.
# `make test-slow`: the rest of the matrix (every device target, MIT's networks on the boards,
# the serial faults). `make test-all` (what CI runs): both, then the C core's test areas under
# the sanitizers (test-sanitize). PYTEST_ARGS adds pytest options, e.g. PYTEST_ARGS="-k serial";
# TEST_PATHS the folders, e.g. TEST_PATHS=tests/int8.
TEST_PATHS ?= tests
PYTEST := MICROPY_DIR=$(MICROPY_DIR) $(SANITIZE_ENV) $(PY) -m pytest $(TEST_PATHS) -q -rs -n auto --dist loadgroup --no-loadscope-reorder
test: venv native firmware-test
	$(PYTEST) -m "not slow" --durations=10 $(PYTEST_ARGS)

test-slow: venv native firmware rp2040js
	$(PYTEST) -m slow --durations=10 $(PYTEST_ARGS)

test-all:
	+$(MAKE) test
	+$(MAKE) test-slow
	+$(MAKE) test-sanitize
	+$(MAKE) native

# The host suite alone (no firmware, no emulators: not `device`): what `make test-host SANITIZE=1`
# runs under AddressSanitizer and UBSan in CI (docs/reliability.md). Device tests start
# MicroPython, qemu or node, which the preloaded sanitizer runtimes must not reach.
test-host: venv native
	$(PYTEST) -m "not device" $(PYTEST_ARGS)

# The sanitizer run of `make test-all`: the host tests of the areas that drive the C core over
# many shapes and inputs (kernels, plan loading and bad input, int8, sparse, the conformance
# cases, the compiler's own runs). cli/, docs/, fleet/, serial/, bench/ reach the same core
# through the same binding, with minutes of subprocesses and clean venvs around it (about 40 %
# of the host suite's time under the sanitizers); `make test-host SANITIZE=1` runs them too.
SANITIZE_TESTS := tests/core tests/int8 tests/sparse tests/conformance tests/compiler
test-sanitize:
	+$(MAKE) test-host SANITIZE=1 TEST_PATHS="$(SANITIZE_TESTS)"

# Speed figures, not part of `make test` (the bench helper's target): exact instruction
# counts per step on qemu for each board in BENCH_BOARDS (the Cortex-M7 and Cortex-M3 MPS2
# boards, the RISC-V VIRT_RV32; two runs, which must agree), host
# simulator vs PyTorch time. Writes bench/results.json and docs/performance.md; see
# benchmarks/bench.py. Counts run on the boards' test firmware, and plans too big for its
# heap (MCUNet) on a second build of the same board with a bigger heap.
BENCH_BOARDS ?= mps2_an500 mps2_an386 mps2_an385 virt_rv32
BENCH_HEAP ?= 2097152
# VIRT_RV32's linker script (ports/qemu/mcu/rv32/virt.ld) gives .data and .bss, the heap
# among them, 2 MB in all
BENCH_HEAP_virt_rv32 ?= 1572864
BENCH_BIG_BUILD = $(MICROTRAIN_BUILD)/bench-bigheap
bench: venv native
	+$(MAKE) $(addprefix firmware-,$(BENCH_BOARDS))
	+$(foreach b,$(BENCH_BOARDS),$(MAKE) firmware-$(b) FIRMWARE_BUILD=$(BENCH_BIG_BUILD) \
	    FIRMWARE_MAKE_ARGS="$(FIRMWARE_MAKE_ARGS) MICROPY_HEAP_SIZE=$(or $(BENCH_HEAP_$(b)),$(BENCH_HEAP))" && ) true
	MICROPY_DIR=$(MICROPY_DIR) $(PY) benchmarks/bench.py --runs 2 --boards $(BENCH_BOARDS) $(foreach b,$(BENCH_BOARDS),\
	    --firmware $(b)=$(FIRMWARE_BUILD)/$(b)/firmware.elf --big-firmware $(b)=$(BENCH_BIG_BUILD)/$(b)/firmware.elf)
	$(PY) benchmarks/perfdoc.py

# libFuzzer on the C core under ASan and UBSan (clang), seeded with real plans of every op:
# fuzz/run.py prints executions, time, coverage and findings (build/fuzz/artifacts/)
FUZZ_SECONDS ?= 60
fuzz: venv native
	$(PY) fuzz/run.py --seconds $(FUZZ_SECONDS)

# rp2040js (npm, pinned by tests/device/rp2040js/package-lock.json) runs the Pico firmware in the tests
RP2040JS_STAMP := tests/device/rp2040js/node_modules/.installed
$(RP2040JS_STAMP): tests/device/rp2040js/package.json tests/device/rp2040js/package-lock.json
	@if command -v npm >/dev/null; then \
	    cd tests/device/rp2040js && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "microtrain: no npm; the rp2040js device tests will not run (apt-get install nodejs npm)"; fi
rp2040js: $(RP2040JS_STAMP)

# docs/boards.md's table: image sizes of build/firmware/*, free heap measured at boot on every
# board that runs here (unix, qemu, rp2040js), status; --update-profiles writes the measured
# heap into boards/*.json too
boards-table: venv native
	$(PY) firmware/boards_table.py --update-profiles

clean: firmware-clean
	rm -rf build host/build host/microtrain/_native*.so host/microtrain/_native.c .pytest_cache

distclean: clean
	rm -rf $(VENV) host/*.egg-info
