# MicroPython firmware with the microtrain module built in.
#
# Include this from the top-level Makefile:
#     include firmware/micropython.mk
# Targets:
#     firmware-unix    build/micropython-unix/micropython   (host executable)
#     firmware-qemu    build/micropython-qemu/firmware.elf  (Cortex-M7, qemu mps2-an500)
#     firmware         both
#     firmware-natmod  build/natmod-$(NATMOD_ARCH)/_microtrain.mpy (native module, NATMOD_ARCH=x64 by default)
#     firmware-check   report the MicroPython checkout and its version
#     micropython      get MicroPython v1.28.0 into MICROPY_DIR (firmware/fetch-sources.sh)
#     firmware-clean   remove both build directories
# Every path and flag below is overridable on the command line, e.g.
#     make firmware-unix MICROPY_DIR=~/src/micropython
# See firmware/README.md.

# Including this file does not change the including Makefile's default goal.
MICROTRAIN_SAVED_DEFAULT_GOAL := $(.DEFAULT_GOAL)

# The repository root: this file lives in <root>/firmware/.
MICROTRAIN_ROOT := $(patsubst %/,%,$(dir $(abspath $(dir $(lastword $(MAKEFILE_LIST))))))

MICROPY_DIR ?= $(HOME)/.cache/microtrain/micropython
MICROPY_TAG := v1.28.0
MICROPY_VERSION_WANT := $(patsubst v%,%,$(MICROPY_TAG))
# A MicroPython source tarball to unpack when MICROPY_DIR is empty (else git clone, else the
# vendored one); passed to firmware/fetch-sources.sh through the environment.
MICROPY_TARBALL ?=
export MICROPY_TARBALL

MICROTRAIN_BUILD ?= $(MICROTRAIN_ROOT)/build
MICROTRAIN_USER_C_MODULES ?= $(MICROTRAIN_ROOT)/modules

FIRMWARE_UNIX_BUILD ?= $(MICROTRAIN_BUILD)/micropython-unix
FIRMWARE_UNIX_VARIANT ?= standard
# The frozen Python: the device package microtrain (modules/microtrain/manifest.py), nothing else.
MICROTRAIN_MANIFEST ?= $(MICROTRAIN_ROOT)/modules/microtrain/manifest.py
FIRMWARE_UNIX_ARGS ?= FROZEN_MANIFEST=$(MICROTRAIN_MANIFEST) MICROPY_PY_BTREE=0 MICROPY_PY_SSL=0 MICROPY_SSL_AXTLS=0 MICROPY_PY_FFI=0

FIRMWARE_QEMU_BUILD ?= $(MICROTRAIN_BUILD)/micropython-qemu
FIRMWARE_QEMU_BOARD ?= MPS2_AN500
# littlefs (VfsLfs2): microtrain.ramdisk gives the board a filesystem in its PSRAM for
# the serial server's plan and checkpoints. The qemu port has no clock, which littlefs
# reads for file times: it gets the milliseconds since boot.
FIRMWARE_QEMU_ARGS ?= FROZEN_MANIFEST=$(MICROTRAIN_MANIFEST) MICROPY_VFS_LFS2=1 CFLAGS_EXTRA=-Dmp_hal_time_ns=mp_hal_ticks_ms

NATMOD_ARCH ?= x64
FIRMWARE_NATMOD_BUILD ?= $(MICROTRAIN_BUILD)/natmod-$(NATMOD_ARCH)

# The Python that runs MicroPython's tools (mpy_ld.py needs pyelftools): the project's
# venv when there is one (the top-level Makefile's PY).
MICROTRAIN_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)

# Extra arguments for MicroPython's make (e.g. V=1 or COPT=-O0).
FIRMWARE_MAKE_ARGS ?=

FIRMWARE_UNIX = $(FIRMWARE_UNIX_BUILD)/micropython
FIRMWARE_QEMU = $(FIRMWARE_QEMU_BUILD)/firmware.elf
MICROTRAIN_MPY_CROSS = $(MICROPY_DIR)/mpy-cross/build/mpy-cross

# Absolute forms for the recipes: MicroPython's make runs in its own directory.
MICROTRAIN_MPY_ABS = $(abspath $(MICROPY_DIR))
MICROTRAIN_MODULES_ABS = $(abspath $(MICROTRAIN_USER_C_MODULES))

# The module's sources: a change here rebuilds; a change in the set of files
# (or in the settings below) starts from a clean build directory, since
# MicroPython's generated headers do not follow a changing module set.
MICROTRAIN_MODULE_FILES = $(sort $(wildcard $(MICROTRAIN_USER_C_MODULES)/*/*.c $(MICROTRAIN_USER_C_MODULES)/*/*.h \
	$(MICROTRAIN_USER_C_MODULES)/*/micropython.mk $(MICROTRAIN_USER_C_MODULES)/*/manifest.py \
	$(MICROTRAIN_USER_C_MODULES)/*/python/*/*.py))
MICROTRAIN_FIRMWARE_MK := $(abspath $(lastword $(MAKEFILE_LIST)))

# MicroPython's make gets only our explicit arguments and the parent's jobserver:
# variables set on the parent's command line (`make test CFLAGS=...`) are taken
# out of both MAKEFLAGS and the environment, or they would override or prefix
# MicroPython's own CFLAGS, CC, BUILD... Pass MicroPython arguments with
# FIRMWARE_MAKE_ARGS instead.
MICROTRAIN_CMDLINE_VARS = $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v)))
MICROTRAIN_SUBMAKE = env $(addprefix -u ,$(MICROTRAIN_CMDLINE_VARS)) \
	MAKEFLAGS='$(filter -j% --jobserver-auth=% --jobserver-fds=%,$(MAKEFLAGS))' $(MAKE)

# 1.28.0 from py/mpconfig.h, empty if there is no checkout.
MICROPY_VERSION_FOUND := $(shell awk '/^\#define MICROPY_VERSION_(MAJOR|MINOR|MICRO) /{v = v (v == "" ? "" : ".") $$3} END {print v}' "$(MICROPY_DIR)/py/mpconfig.h" 2>/dev/null)

.PHONY: firmware firmware-unix firmware-qemu firmware-natmod firmware-check firmware-clean microtrain-firmware-force micropython

# MicroPython v1.28.0 and micropython-lib (which frozen manifests need) into MICROPY_DIR.
micropython:
	@$(MICROTRAIN_ROOT)/firmware/fetch-sources.sh micropython "$(MICROPY_DIR)"

# Vendored sources (firmware/fetch-sources.sh vendor): with them a fresh machine gets
# MicroPython without the network, so the firmware targets fetch it themselves.
MICROTRAIN_VENDOR_FOUND := $(shell $(MICROTRAIN_ROOT)/firmware/fetch-sources.sh vendor 2>/dev/null)

firmware-clean:
	rm -rf "$(FIRMWARE_UNIX_BUILD)" "$(FIRMWARE_QEMU_BUILD)" "$(MICROTRAIN_BUILD)"/natmod-*

ifeq ($(wildcard $(MICROPY_DIR)/py/mpconfig.h),)
ifneq ($(MICROPY_TARBALL)$(MICROTRAIN_VENDOR_FOUND),)

# No checkout, but sources at hand: get them, then build.
firmware firmware-unix firmware-qemu firmware-natmod firmware-check: micropython
	+@$(MICROTRAIN_SUBMAKE) -f $(firstword $(MAKEFILE_LIST)) $@ MICROPY_DIR="$(MICROPY_DIR)"

else

# No checkout: say so once and succeed, so `make` works without MicroPython.
firmware firmware-unix firmware-qemu firmware-natmod firmware-check:
	@echo "microtrain: no MicroPython checkout at $(MICROPY_DIR); run \`make micropython\` or set MICROPY_DIR (see firmware/README.md); skipping $@"

endif

else

firmware: firmware-unix firmware-qemu
firmware-unix: $(FIRMWARE_UNIX)
firmware-qemu: $(FIRMWARE_QEMU)

firmware-check:
	@echo "microtrain: MicroPython $(MICROPY_VERSION_FOUND) at $(MICROPY_DIR) (want $(MICROPY_TAG))"
	@$(microtrain_check_version)

microtrain_check_version = \
	if [ "$(MICROPY_VERSION_FOUND)" != "$(MICROPY_VERSION_WANT)" ]; then \
	    echo "microtrain: warning: MicroPython at $(MICROPY_DIR) is $(or $(MICROPY_VERSION_FOUND),of unknown version); microtrain is built and tested with $(MICROPY_TAG)"; \
	fi

# $(call microtrain_config,build dir,settings): (re)write <build dir>/microtrain.config
# only when the settings differ from the last build's. A directory that holds an
# older stamp was made by this file, and is emptied first; one without a stamp
# is never emptied. The stamp is remade on every run but keeps its timestamp when
# nothing changed, so the firmware is rebuilt only when something it depends on did.
microtrain_config = \
	mkdir -p "$(1)"; \
	printf '%s\n' $(2) > "$(1)/microtrain.config.new"; \
	if cmp -s "$(1)/microtrain.config.new" "$(1)/microtrain.config"; then \
	    rm -f "$(1)/microtrain.config.new"; \
	else \
	    if [ -f "$(1)/microtrain.config" ]; then \
	        echo "microtrain: settings or module file set changed; starting $(1) afresh"; \
	        find "$(1)" -mindepth 1 -maxdepth 1 ! -name microtrain.config.new -exec rm -rf {} +; \
	    fi; \
	    mv "$(1)/microtrain.config.new" "$(1)/microtrain.config"; \
	fi

FIRMWARE_UNIX_CONFIG = '$(MICROTRAIN_MPY_ABS)' '$(MICROPY_VERSION_FOUND)' '$(FIRMWARE_UNIX_VARIANT)' '$(FIRMWARE_UNIX_ARGS)' '$(FIRMWARE_MAKE_ARGS)' $(MICROTRAIN_MODULE_FILES)
FIRMWARE_QEMU_CONFIG = '$(MICROTRAIN_MPY_ABS)' '$(MICROPY_VERSION_FOUND)' '$(FIRMWARE_QEMU_BOARD)' '$(FIRMWARE_QEMU_ARGS)' '$(FIRMWARE_MAKE_ARGS)' $(MICROTRAIN_MODULE_FILES)

$(FIRMWARE_UNIX_BUILD)/microtrain.config: microtrain-firmware-force
	@$(call microtrain_config,$(FIRMWARE_UNIX_BUILD),$(FIRMWARE_UNIX_CONFIG))

$(FIRMWARE_QEMU_BUILD)/microtrain.config: microtrain-firmware-force
	@$(call microtrain_config,$(FIRMWARE_QEMU_BUILD),$(FIRMWARE_QEMU_CONFIG))

$(MICROTRAIN_MPY_CROSS):
	@echo "microtrain: building mpy-cross in $(MICROPY_DIR)/mpy-cross"
	+@$(MICROTRAIN_SUBMAKE) -C "$(MICROTRAIN_MPY_ABS)/mpy-cross" $(FIRMWARE_MAKE_ARGS)

# MicroPython's make is itself incremental; the touch keeps this rule from
# rerunning it when nothing relinked.
$(FIRMWARE_UNIX): $(MICROTRAIN_MODULE_FILES) $(MICROTRAIN_FIRMWARE_MK) $(FIRMWARE_UNIX_BUILD)/microtrain.config | $(MICROTRAIN_MPY_CROSS)
	@$(microtrain_check_version)
	@$(MICROTRAIN_ROOT)/firmware/fetch-sources.sh submodules "$(MICROPY_DIR)" micropython-lib
	+$(MICROTRAIN_SUBMAKE) -C "$(MICROTRAIN_MPY_ABS)/ports/unix" BUILD="$(abspath $(FIRMWARE_UNIX_BUILD))" VARIANT="$(FIRMWARE_UNIX_VARIANT)" \
	    USER_C_MODULES="$(MICROTRAIN_MODULES_ABS)" $(FIRMWARE_UNIX_ARGS) $(FIRMWARE_MAKE_ARGS)
	@touch "$@"
	@echo "microtrain: built $@"

$(FIRMWARE_QEMU): $(MICROTRAIN_MODULE_FILES) $(MICROTRAIN_FIRMWARE_MK) $(FIRMWARE_QEMU_BUILD)/microtrain.config | $(MICROTRAIN_MPY_CROSS)
	@$(microtrain_check_version)
	@$(MICROTRAIN_ROOT)/firmware/fetch-sources.sh submodules "$(MICROPY_DIR)" micropython-lib
	+$(MICROTRAIN_SUBMAKE) -C "$(MICROTRAIN_MPY_ABS)/ports/qemu" BOARD="$(FIRMWARE_QEMU_BOARD)" BUILD="$(abspath $(FIRMWARE_QEMU_BUILD))" \
	    USER_C_MODULES="$(MICROTRAIN_MODULES_ABS)" $(FIRMWARE_QEMU_ARGS) $(FIRMWARE_MAKE_ARGS)
	@touch "$@"
	@echo "microtrain: built $@"

# A native .mpy for firmware built without the module; see firmware/natmod.mk.
firmware-natmod:
	@if ! $(MICROTRAIN_PYTHON) -c "import elftools" 2>/dev/null; then \
	    echo "microtrain: firmware-natmod needs pyelftools for MicroPython's mpy_ld.py (make venv, or pip install pyelftools); skipping"; \
	    exit 0; \
	fi; \
	mkdir -p "$(FIRMWARE_NATMOD_BUILD)"; \
	echo 'include $(MICROTRAIN_ROOT)/firmware/natmod.mk' > "$(FIRMWARE_NATMOD_BUILD)/Makefile"; \
	$(MICROTRAIN_SUBMAKE) -C "$(FIRMWARE_NATMOD_BUILD)" \
	    MPY_DIR="$(MICROTRAIN_MPY_ABS)" ARCH="$(NATMOD_ARCH)" PYTHON="$(MICROTRAIN_PYTHON)" $(FIRMWARE_MAKE_ARGS) \
	    && echo "microtrain: built $(FIRMWARE_NATMOD_BUILD)/_microtrain.mpy"

endif

.DEFAULT_GOAL := $(MICROTRAIN_SAVED_DEFAULT_GOAL)
