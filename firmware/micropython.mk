# MicroPython firmware with the microtrain module built in, driven by the board profiles.
#
# Included by the top-level Makefile. Targets:
#     micropython              get MicroPython v1.28.0 into MICROPY_DIR (firmware/fetch-sources.sh)
#     firmware BOARD=NAME      build/firmware/NAME/: MicroPython for the board in boards/NAME.json,
#                              with the C module _microtrain and the frozen package microtrain
#     firmware-NAME            the same (e.g. firmware-rpi_pico)
#     firmware                 (no BOARD) what the device tests run on: FIRMWARE_TEST_BOARDS,
#                              the native modules NATMOD_TEST_ARCHS and CircuitPython's unix port
#     firmware-test            what `make test` runs on: FIRMWARE_FAST_BOARDS (unix, MPS2_AN500)
#     firmware-all             every board that builds here (FIRMWARE_ALL_BOARDS)
#     natmod ARCH=ARCH         build/natmod/ARCH/_microtrain.mpy (or NATMOD_ARCH=); `natmods`: every architecture
#     dist                     build/dist/mip/: each .mpy built here with the device package, as mip
#                              package indexes (firmware/dist.py)
#     firmware-stock-NAME      build/firmware-stock/NAME/: MicroPython for the board without microtrain
#     firmware-circuitpython   build/firmware/circuitpython-unix/micropython (CircuitPython 10.2.1)
#     firmware-check           the MicroPython checkout and its version
#     firmware-clean
# Every board builds through one pattern rule; what differs between boards is data in
# boards/*.json (port, BOARD, build system, submodules, extra make arguments, base manifest),
# read through `host/microtrain/boards.py --make`. See firmware/README.md.

# Including this file does not change the including Makefile's default goal.
MICROTRAIN_SAVED_DEFAULT_GOAL := $(.DEFAULT_GOAL)

# The repository root: this file lives in <root>/firmware/.
MICROTRAIN_ROOT := $(patsubst %/,%,$(dir $(abspath $(dir $(lastword $(MAKEFILE_LIST))))))
MICROTRAIN_FIRMWARE_MK := $(abspath $(lastword $(MAKEFILE_LIST)))
MICROTRAIN_CACHE ?= $(HOME)/.cache/microtrain

MICROPY_DIR ?= $(MICROTRAIN_CACHE)/micropython
MICROPY_TAG := v1.28.0
MICROPY_VERSION_WANT := $(patsubst v%,%,$(MICROPY_TAG))
# A MicroPython source tarball to unpack when MICROPY_DIR is empty (else git clone, else the
# vendored one); passed to firmware/fetch-sources.sh through the environment.
MICROPY_TARBALL ?=
export MICROPY_TARBALL
CIRCUITPY_DIR ?= $(MICROTRAIN_CACHE)/circuitpython-10.2.1
# picotool (pico-sdk makes UF2 images with it), built once from the vendored source
PICOTOOL_PREFIX ?= $(MICROTRAIN_CACHE)/picotool-282a3ca0

MICROTRAIN_BUILD ?= $(MICROTRAIN_ROOT)/build
FIRMWARE_BUILD ?= $(MICROTRAIN_BUILD)/firmware
NATMOD_BUILD ?= $(MICROTRAIN_BUILD)/natmod
MICROTRAIN_USER_C_MODULES ?= $(MICROTRAIN_ROOT)/modules
FETCH := $(MICROTRAIN_ROOT)/firmware/fetch-sources.sh

FIRMWARE_TEST_BOARDS ?= unix mps2_an385 mps2_an386 mps2_an500 rpi_pico virt_rv32
FIRMWARE_FAST_BOARDS ?= unix mps2_an500
FIRMWARE_ALL_BOARDS ?= $(FIRMWARE_TEST_BOARDS) pybv11 nucleo_f746zg
# MicroPython as released for these boards, without microtrain (firmware-stock-NAME): what the
# native module and `mpremote mip install` are tested on; rpi_pico's, the armv6m .mpy streaming a
# plan from the Pico's flash filesystem (tests/device/test_pico_stock.py)
FIRMWARE_STOCK_BOARDS ?= virt_rv32 mps2_an500 rpi_pico
NATMOD_TEST_ARCHS ?= x64 armv7m armv7emsp armv7emdp armv6m rv32imc
NATMOD_ALL_ARCHS ?= $(NATMOD_TEST_ARCHS) xtensawin
# `make natmod ARCH=rv32imc` as well as NATMOD_ARCH=rv32imc (ARCH only from the command line:
# some environments export an ARCH of their own)
NATMOD_ARCH ?= $(if $(filter command line,$(origin ARCH)),$(ARCH),x64)

# The Python that runs MicroPython's tools (mpy_ld.py needs pyelftools): the project's
# venv when there is one (the top-level Makefile's PY), which MICROTRAIN_FIRMWARE_PY_DEPS
# (the top-level Makefile's stamp of requirements-firmware.txt) equips.
MICROTRAIN_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
MICROTRAIN_FIRMWARE_PY_DEPS ?=

# Extra arguments for MicroPython's make (e.g. V=1 or COPT=-O0).
FIRMWARE_MAKE_ARGS ?=
# Files a build also depends on (a board definition of ours given in FIRMWARE_MAKE_ARGS).
FIRMWARE_EXTRA_DEPS ?=

MICROTRAIN_MPY_CROSS = $(MICROPY_DIR)/mpy-cross/build/mpy-cross
MICROTRAIN_MPY_ABS = $(abspath $(MICROPY_DIR))
MICROTRAIN_MODULES_ABS = $(abspath $(MICROTRAIN_USER_C_MODULES))

# The module's sources and the frozen package: a change here rebuilds; a change in the set
# of files (or in a board's settings) starts from a clean build directory, since
# MicroPython's generated headers do not follow a changing module set.
MICROTRAIN_MODULE_FILES = $(sort $(wildcard $(MICROTRAIN_USER_C_MODULES)/*/*.c $(MICROTRAIN_USER_C_MODULES)/*/*.h \
	$(MICROTRAIN_USER_C_MODULES)/*/micropython.mk $(MICROTRAIN_USER_C_MODULES)/*/micropython.cmake \
	$(MICROTRAIN_USER_C_MODULES)/*/manifest.py $(MICROTRAIN_USER_C_MODULES)/*/python/*/*.py))

# The profiles as make variables: MT_BOARDS, MT_<FIELD>_<name> (boards.py --make).
MICROTRAIN_PROFILES_MK := $(MICROTRAIN_BUILD)/boards.mk
$(MICROTRAIN_PROFILES_MK): $(wildcard $(MICROTRAIN_ROOT)/boards/*.json) $(MICROTRAIN_ROOT)/host/microtrain/boards.py
	@mkdir -p $(@D)
	python3 $(MICROTRAIN_ROOT)/host/microtrain/boards.py --make > $@.tmp && mv $@.tmp $@
include $(MICROTRAIN_PROFILES_MK)

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

# Vendored sources (firmware/fetch-sources.sh vendor): with them a fresh machine gets
# MicroPython without the network, so the firmware targets fetch it themselves.
MICROTRAIN_VENDOR_FOUND := $(shell $(FETCH) vendor 2>/dev/null)

# BOARD=RPI_PICO or rpi_pico names boards/rpi_pico.json
BOARD ?=
MT_BOARD_NAME = $(shell echo '$(BOARD)' | tr 'A-Z-' 'a-z_')

MICROTRAIN_FW_TARGETS := firmware firmware-test firmware-all firmware-check natmod natmods dist firmware-circuitpython \
	$(addprefix firmware-,$(MT_BOARDS)) $(addprefix firmware-stock-,$(MT_BOARDS)) firmware-qemu firmware-natmod natmods-test \
	firmware-pico-romfs

.PHONY: micropython $(MICROTRAIN_FW_TARGETS) firmware-clean microtrain-firmware-force

micropython:
	@$(FETCH) micropython "$(MICROPY_DIR)"

firmware-clean:
	rm -rf "$(FIRMWARE_BUILD)" "$(NATMOD_BUILD)" "$(FIRMWARE_STOCK_BUILD)" "$(MICROTRAIN_BUILD)/micropython-unix" "$(MICROTRAIN_BUILD)/micropython-qemu"

ifeq ($(wildcard $(MICROPY_DIR)/py/mpconfig.h),)
ifneq ($(MICROPY_TARBALL)$(MICROTRAIN_VENDOR_FOUND),)

# No checkout, but sources at hand: get them, then build.
$(MICROTRAIN_FW_TARGETS): micropython
	+@$(MICROTRAIN_SUBMAKE) -f $(firstword $(MAKEFILE_LIST)) $@ MICROPY_DIR="$(MICROPY_DIR)" $(if $(BOARD),BOARD=$(BOARD))

else

# No checkout: say so once and succeed, so `make` works without MicroPython.
$(MICROTRAIN_FW_TARGETS):
	@echo "microtrain: no MicroPython checkout at $(MICROPY_DIR); run \`make micropython\` or set MICROPY_DIR (see firmware/README.md); skipping $@"

endif
else

# `make firmware` (no BOARD) leaves out, with a message, the boards whose toolchain is not
# installed, so `make test` still runs everything else (and the tests say what is missing).
# A board's compiler is its profile's `toolchain` (riscv64-unknown-elf-gcc for VIRT_RV32), else
# arm-none-eabi-gcc for every port but unix.
MT_HAVE_ARM := $(shell command -v arm-none-eabi-gcc)
MT_HAVE_CMAKE := $(shell command -v cmake)
mt_cc = $(or $(MT_TOOLCHAIN_$(1)),$(if $(filter-out unix,$(MT_PORT_$(1))),arm-none-eabi-gcc))
mt_toolchain_missing = $(if $(call mt_cc,$(1)),$(if $(shell command -v $(call mt_cc,$(1))),,$(call mt_cc,$(1))))$(if \
	$(filter cmake,$(MT_BUILD_$(1))),$(if $(MT_HAVE_CMAKE),, cmake))
FIRMWARE_TEST_HERE := $(foreach b,$(FIRMWARE_TEST_BOARDS),$(if $(call mt_toolchain_missing,$(b)),,$(b)))
FIRMWARE_TEST_NOT_HERE := $(filter-out $(FIRMWARE_TEST_HERE),$(FIRMWARE_TEST_BOARDS))
FIRMWARE_STOCK_HERE := $(foreach b,$(FIRMWARE_STOCK_BOARDS),$(if $(call mt_toolchain_missing,$(b)),,$(b)))

ifeq ($(BOARD),)
firmware: $(addprefix firmware-,$(FIRMWARE_TEST_HERE)) natmods-test \
		firmware-circuitpython
	@$(foreach b,$(FIRMWARE_TEST_NOT_HERE),echo "microtrain: skipping firmware $(b): no $(call mt_toolchain_missing,$(b)) (see firmware/README.md)";)
firmware: microtrain-v0-links $(if $(MT_HAVE_ARM),firmware-natmod-tests $(if $(MT_HAVE_CMAKE),firmware-pico-romfs)) \
	$(addprefix firmware-stock-,$(FIRMWARE_STOCK_HERE)) dist
else ifeq ($(filter $(MT_BOARD_NAME),$(MT_BOARDS)),)
firmware:
	@echo "microtrain: no board profile boards/$(MT_BOARD_NAME).json; the boards are: $(MT_BOARDS)"; exit 2
else
firmware: firmware-$(MT_BOARD_NAME)
endif
firmware-all: $(addprefix firmware-,$(FIRMWARE_ALL_BOARDS)) natmods firmware-circuitpython

FIRMWARE_FAST_HERE := $(filter $(FIRMWARE_FAST_BOARDS),$(FIRMWARE_TEST_HERE))
firmware-test: $(addprefix firmware-,$(FIRMWARE_FAST_HERE)) microtrain-v0-links
	@$(foreach b,$(filter-out $(FIRMWARE_FAST_HERE),$(FIRMWARE_FAST_BOARDS)),echo "microtrain: skipping firmware $(b): no $(call mt_toolchain_missing,$(b)) (see firmware/README.md)";)

# The native-module device tests (tests/support/mptargets.py, *-natmod) load the .mpy into the
# heap (its code runs from RAM), beside which the 140 KB heap of the qemu boards' firmware does
# not hold every test (train_kws on the Cortex-M3); they run on the same boards' firmware built
# with a 1 MB heap, in a tree of its own.
NATMOD_TEST_BOARDS ?= mps2_an385 mps2_an386 mps2_an500
NATMOD_TEST_HEAP ?= 1048576
NATMOD_FIRMWARE_BUILD ?= $(MICROTRAIN_BUILD)/firmware-natmod-tests
# after the boards' own builds: they build mpy-cross, which two makes must not build at once (-j2)
firmware-natmod-tests: $(addprefix firmware-,$(NATMOD_TEST_BOARDS))
	+$(MICROTRAIN_SUBMAKE) -f $(firstword $(MAKEFILE_LIST)) $(addprefix firmware-,$(NATMOD_TEST_BOARDS)) \
	    MICROPY_DIR="$(MICROPY_DIR)" FIRMWARE_BUILD="$(NATMOD_FIRMWARE_BUILD)" \
	    FIRMWARE_MAKE_ARGS="$(FIRMWARE_MAKE_ARGS) MICROPY_HEAP_SIZE=$(NATMOD_TEST_HEAP)"
.PHONY: firmware-natmod-tests

# RPI_PICO with a ROMFS partition (1280 KB at 0x10080000, filesystem shrunk to 256 KB): the
# board definition firmware/rp2/RPI_PICO_ROMFS (BOARD_DIR) in a tree of its own,
# build/firmware-pico-romfs/RPI_PICO_ROMFS/rpi_pico/firmware.uf2; firmware/pico_romfs.py checks
# that the firmware ends below the partition. tests/device/test_pico_romfs.py and
# benchmarks/pico_romfs.py run it in rp2040js with a ROMFS image in the emulated flash.
# PICO_ROMFS_BOARD=RP2040_4MB_ROMFS: the same on an RP2040 with 4 MB of flash (3328 KB of ROMFS).
PICO_ROMFS_BOARD ?= RPI_PICO_ROMFS
PICO_ROMFS_BOARD_DIR = $(MICROTRAIN_ROOT)/firmware/rp2/$(PICO_ROMFS_BOARD)
PICO_ROMFS_BUILD ?= $(MICROTRAIN_BUILD)/firmware-pico-romfs/$(PICO_ROMFS_BOARD)
# after the stock build: both would build mpy-cross otherwise (-j2)
firmware-pico-romfs: firmware-rpi_pico
	@test -f "$(PICO_ROMFS_BOARD_DIR)/mpconfigboard.h" || { echo "microtrain: no board $(PICO_ROMFS_BOARD_DIR)"; exit 2; }
	+$(MICROTRAIN_SUBMAKE) -f $(firstword $(MAKEFILE_LIST)) firmware-rpi_pico \
	    MICROPY_DIR="$(MICROPY_DIR)" FIRMWARE_BUILD="$(PICO_ROMFS_BUILD)" FIRMWARE_EXTRA_DEPS="$(wildcard $(PICO_ROMFS_BOARD_DIR)/*)" \
	    FIRMWARE_MAKE_ARGS="$(FIRMWARE_MAKE_ARGS) BOARD_DIR=$(PICO_ROMFS_BOARD_DIR)"
	python3 $(MICROTRAIN_ROOT)/firmware/pico_romfs.py --board $(PICO_ROMFS_BOARD) --check "$(PICO_ROMFS_BUILD)/rpi_pico/firmware.bin"
.PHONY: firmware-pico-romfs
# v0's paths (build/micropython-unix, build/micropython-qemu), which benchmarks and
# tests/bench/test_bench.py use, as links to the boards' build directories
microtrain-v0-links: $(addprefix firmware-,$(filter unix mps2_an500,$(FIRMWARE_TEST_HERE)))
	@$(if $(filter unix,$(FIRMWARE_TEST_HERE)),$(call mt_link,firmware/unix,$(MICROTRAIN_BUILD)/micropython-unix))
	@$(if $(filter mps2_an500,$(FIRMWARE_TEST_HERE)),$(call mt_link,firmware/mps2_an500,$(MICROTRAIN_BUILD)/micropython-qemu))
# $(call mt_link,target,link): a link in place of whatever is there (v0 left directories)
mt_link = { [ -L "$(2)" ] || rm -rf "$(2)"; ln -sfn "$(1)" "$(2)"; }
.PHONY: microtrain-v0-links

# v0's qemu target, kept for `make bench`: the qemu BOARD FIRMWARE_QEMU_BOARD, built by the
# pattern rule; with FIRMWARE_QEMU_BUILD, in a tree of its own (<dir>.d, for other make
# arguments such as a bigger heap) that <dir> links to.
FIRMWARE_QEMU_BOARD ?= MPS2_AN500
FIRMWARE_QEMU_BUILD ?=
firmware-qemu:
	+$(MICROTRAIN_SUBMAKE) -f $(firstword $(MAKEFILE_LIST)) firmware BOARD=$(FIRMWARE_QEMU_BOARD) MICROPY_DIR="$(MICROPY_DIR)" \
	    FIRMWARE_MAKE_ARGS="$(FIRMWARE_MAKE_ARGS)" $(if $(FIRMWARE_QEMU_BUILD),FIRMWARE_BUILD="$(abspath $(FIRMWARE_QEMU_BUILD)).d")
	@$(if $(FIRMWARE_QEMU_BUILD),$(call mt_link,$(notdir $(FIRMWARE_QEMU_BUILD)).d/$(shell echo '$(FIRMWARE_QEMU_BOARD)' | tr 'A-Z-' 'a-z_'),$(FIRMWARE_QEMU_BUILD)))

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

$(MICROTRAIN_MPY_CROSS):
	@echo "microtrain: building mpy-cross in $(MICROPY_DIR)/mpy-cross"
	+@$(MICROTRAIN_SUBMAKE) -C "$(MICROTRAIN_MPY_ABS)/mpy-cross" $(FIRMWARE_MAKE_ARGS)

# ---- the board firmware: one pattern rule for every profile ---------------------------------

# MicroPython's make arguments for board $*: make ports take the directory holding
# microtrain/, CMake ports the module's micropython.cmake; a board definition of ours
# (boards/qemu/MPS2_AN386) comes in as BOARD_DIR. The frozen manifest is generated next to the
# build: the board's own manifest (MT_BASE_MANIFEST_*) plus modules/microtrain/manifest.py.
mt_user_c_modules = $(if $(filter cmake,$(MT_BUILD_$*)),$(MICROTRAIN_MODULES_ABS)/microtrain/micropython.cmake,$(MICROTRAIN_MODULES_ABS))
mt_port_args = BUILD="$(abspath $(@D))" \
	$(if $(MT_BOARD_$*),BOARD=$(MT_BOARD_$*)) $(if $(MT_VARIANT_$*),VARIANT=$(MT_VARIANT_$*)) \
	$(if $(MT_BOARD_DIR_$*),BOARD_DIR="$(MICROTRAIN_ROOT)/$(MT_BOARD_DIR_$*)") \
	USER_C_MODULES="$(mt_user_c_modules)" FROZEN_MANIFEST="$(abspath $(@D))/manifest.py" \
	$(MT_MAKE_ARGS_$*) $(FIRMWARE_MAKE_ARGS)
# rp2: pico-sdk finds our picotool instead of trying to clone and build its own
mt_port_env = $(if $(filter rp2,$(MT_PORT_$*)),picotool_DIR="$(PICOTOOL_PREFIX)/lib/cmake/picotool")
mt_config = '$(MICROTRAIN_MPY_ABS)' '$(MICROPY_VERSION_FOUND)' '$(mt_port_args)' $(MICROTRAIN_MODULE_FILES)

.PRECIOUS: $(FIRMWARE_BUILD)/%/microtrain.config
$(FIRMWARE_BUILD)/%/microtrain.config: microtrain-firmware-force
	@$(call microtrain_config,$(@D),$(mt_config))

$(addprefix firmware-,$(MT_BOARDS)): firmware-%: $(FIRMWARE_BUILD)/%/.built

.SECONDEXPANSION:
$(FIRMWARE_BUILD)/%/.built: $(MICROTRAIN_ROOT)/boards/%.json $(MICROTRAIN_MODULE_FILES) $(MICROTRAIN_FIRMWARE_MK) $(FIRMWARE_EXTRA_DEPS) \
		$$(if $$(MT_BOARD_DIR_$$*),$$(wildcard $(MICROTRAIN_ROOT)/$$(MT_BOARD_DIR_$$*)/*)) $(FIRMWARE_BUILD)/%/microtrain.config | $(MICROTRAIN_MPY_CROSS)
	@$(microtrain_check_version)
	@$(FETCH) submodules "$(MICROPY_DIR)" $(MT_SUBMODULES_$*)
	@$(if $(filter rp2,$(MT_PORT_$*)),$(FETCH) picotool "$(PICOTOOL_PREFIX)" "$(MICROTRAIN_MPY_ABS)/lib/pico-sdk")
	@printf '%s\n' '# generated by firmware/micropython.mk: what firmware $* freezes' \
	    $(if $(MT_BASE_MANIFEST_$*),'include("$(MT_BASE_MANIFEST_$*)")') \
	    'include("$(MICROTRAIN_MODULES_ABS)/microtrain/manifest.py")' > "$(@D)/manifest.py"
	+$(mt_port_env) $(MICROTRAIN_SUBMAKE) -C "$(MICROTRAIN_MPY_ABS)/ports/$(MT_PORT_$*)" $(mt_port_args)
	@test -f "$(@D)/$(MT_IMAGE_$*)" || { echo "microtrain: the build left no $(@D)/$(MT_IMAGE_$*)"; exit 1; }
	@touch "$@"
	@echo "microtrain: built $(@D)/$(MT_IMAGE_$*)"

# ---- stock firmware: MicroPython without microtrain ------------------------------------------

# build/firmware-stock/NAME/: MicroPython v1.28.0 for board NAME as released (the port's own
# frozen manifest, no user C module), with what a real board has and the qemu port lacks: a
# littlefs driver for a filesystem (the profile's make_args), and a heap of STOCK_HEAP bytes,
# since a native module's code is loaded into the heap (103 KB for rv32imc; the ESP32s load it
# into their executable RAM instead). The rv32imc .mpy's device tests run on the VIRT_RV32 one
# (tests/support/mptargets.py), tests/device/test_mip.py installs the packages of `make dist`
# with mpremote mip into both. Make ports, and rp2, whose Makefile runs its CMake build: RPI_PICO as
# released (its heap is the RAM the firmware leaves, STOCK_HEAP does not apply), which mounts the
# littlefs filesystem in its flash at / and has /lib on sys.path.
FIRMWARE_STOCK_BUILD ?= $(MICROTRAIN_BUILD)/firmware-stock
STOCK_HEAP ?= $(NATMOD_TEST_HEAP)
mt_stock_args = BUILD="$(abspath $(@D))" \
	$(if $(MT_BOARD_$*),BOARD=$(MT_BOARD_$*)) $(if $(MT_VARIANT_$*),VARIANT=$(MT_VARIANT_$*)) \
	$(if $(MT_BOARD_DIR_$*),BOARD_DIR="$(MICROTRAIN_ROOT)/$(MT_BOARD_DIR_$*)") \
	$(MT_MAKE_ARGS_$*) $(if $(filter rp2,$(MT_PORT_$*)),,MICROPY_HEAP_SIZE=$(STOCK_HEAP)) $(FIRMWARE_MAKE_ARGS)

.PRECIOUS: $(FIRMWARE_STOCK_BUILD)/%/microtrain.config
$(FIRMWARE_STOCK_BUILD)/%/microtrain.config: microtrain-firmware-force
	@$(call microtrain_config,$(@D),'$(MICROTRAIN_MPY_ABS)' '$(MICROPY_VERSION_FOUND)' '$(mt_stock_args)')

$(addprefix firmware-stock-,$(MT_BOARDS)): firmware-stock-%: $(FIRMWARE_STOCK_BUILD)/%/.built

$(FIRMWARE_STOCK_BUILD)/%/.built: $(MICROTRAIN_ROOT)/boards/%.json $(MICROTRAIN_FIRMWARE_MK) \
		$(FIRMWARE_STOCK_BUILD)/%/microtrain.config | $(MICROTRAIN_MPY_CROSS)
	@$(if $(filter make,$(MT_BUILD_$*))$(filter rp2,$(MT_PORT_$*)),,echo "microtrain: firmware-stock-$* : stock builds are for make ports and rp2; $* builds with $(MT_BUILD_$*)" >&2; exit 2)
	@$(microtrain_check_version)
	@$(FETCH) submodules "$(MICROPY_DIR)" $(MT_SUBMODULES_$*)
	@$(if $(filter rp2,$(MT_PORT_$*)),$(FETCH) picotool "$(PICOTOOL_PREFIX)" "$(MICROTRAIN_MPY_ABS)/lib/pico-sdk")
	+$(mt_port_env) $(MICROTRAIN_SUBMAKE) -C "$(MICROTRAIN_MPY_ABS)/ports/$(MT_PORT_$*)" $(mt_stock_args)
	@test -f "$(@D)/$(MT_IMAGE_$*)" || { echo "microtrain: the build left no $(@D)/$(MT_IMAGE_$*)"; exit 1; }
	@touch "$@"
	@echo "microtrain: built $(@D)/$(MT_IMAGE_$*) (stock: no microtrain)"

# ---- native modules ---------------------------------------------------------------------

# $(NATMOD_BUILD)/ARCH/_microtrain.mpy; firmware/natmod.mk says how. Each architecture's cross
# compiler (dynruntime.mk's CROSS) and where it comes from: a build without it stops on one line
# saying so; `natmods` leaves out, with a message, the architectures whose compiler is missing.
MT_NATMOD_CC_x64 := gcc
MT_NATMOD_CC_x86 := gcc
MT_NATMOD_CC_armv6m := arm-none-eabi-gcc
MT_NATMOD_CC_armv7m := arm-none-eabi-gcc
MT_NATMOD_CC_armv7emsp := arm-none-eabi-gcc
MT_NATMOD_CC_armv7emdp := arm-none-eabi-gcc
MT_NATMOD_CC_rv32imc := riscv64-unknown-elf-gcc
MT_NATMOD_CC_xtensawin := xtensa-esp32-elf-gcc
MT_NATMOD_WHERE_arm-none-eabi-gcc := Debian/Ubuntu: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi
MT_NATMOD_WHERE_riscv64-unknown-elf-gcc := Debian/Ubuntu: apt-get install gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf
MT_NATMOD_WHERE_xtensa-esp32-elf-gcc := ESP-IDF's installer (its install.sh, then . export.sh; docs/boards.md)
MT_NATMOD_WHERE_gcc := your system's gcc
mt_natmod_cc = $(MT_NATMOD_CC_$(1))
mt_natmod_have = $(if $(call mt_natmod_cc,$(1)),$(shell command -v $(call mt_natmod_cc,$(1))))
NATMOD_TEST_HERE = $(foreach a,$(NATMOD_TEST_ARCHS),$(if $(call mt_natmod_have,$(a)),$(a)))
natmod: $(NATMOD_BUILD)/$(NATMOD_ARCH)/_microtrain.mpy
firmware-natmod: natmod
natmods-test: $(foreach a,$(NATMOD_TEST_HERE),$(NATMOD_BUILD)/$(a)/_microtrain.mpy)
	@$(foreach a,$(filter-out $(NATMOD_TEST_HERE),$(NATMOD_TEST_ARCHS)),echo "microtrain: skipping the $(a) .mpy: no $(call mt_natmod_cc,$(a)) ($(MT_NATMOD_WHERE_$(call mt_natmod_cc,$(a))))";)
natmods: natmods-test $(if $(call mt_natmod_have,xtensawin),$(NATMOD_BUILD)/xtensawin/_microtrain.mpy,natmod-xtensawin-missing)
natmod-xtensawin-missing:
	@echo "microtrain: no xtensa-esp32-elf-gcc (ESP-IDF's toolchain) here; skipping the xtensawin .mpy (docs/boards.md)"
.PHONY: natmod-xtensawin-missing

# `make dist`: every architecture whose compiler is here (xtensawin with ESP-IDF's), each .mpy
# with the device package, as mip package indexes in DIST_DIR (firmware/dist.py; docs/boards.md,
# "Install on a stock board"); tests/device/test_mip.py serves it over http to mpremote.
DIST_DIR ?= $(MICROTRAIN_BUILD)/dist/mip
# The real boards' firmware images go in too (build/dist/firmware/, with build/dist/manifest.json
# listing every file's board, versions and sha256): those whose toolchain is here are built first.
DIST_PICO_ROMFS = $(MICROTRAIN_BUILD)/firmware-pico-romfs/RPI_PICO_ROMFS/rpi_pico/firmware.uf2
DIST_FIRMWARE = $(foreach b,rpi_pico pybv11,$(if $(call mt_toolchain_missing,$(b)),,firmware-$(b))) \
	$(if $(MT_HAVE_ARM),$(if $(MT_HAVE_CMAKE),firmware-pico-romfs))
DIST_ARCHS = $(NATMOD_TEST_HERE) $(if $(call mt_natmod_have,xtensawin),xtensawin)
dist: $(foreach a,$(DIST_ARCHS),$(NATMOD_BUILD)/$(a)/_microtrain.mpy) $(MICROTRAIN_ROOT)/firmware/dist.py \
		$(DIST_FIRMWARE) | $(MICROTRAIN_MPY_CROSS)
	python3 $(MICROTRAIN_ROOT)/firmware/dist.py --natmod "$(NATMOD_BUILD)" --archs $(DIST_ARCHS) \
	    --mpy-cross "$(MICROTRAIN_MPY_CROSS)" --out "$(DIST_DIR)" --micropython $(MICROPY_TAG) \
	    --firmware "$(FIRMWARE_BUILD)" --firmware-out "$(dir $(DIST_DIR))firmware" --manifest "$(dir $(DIST_DIR))manifest.json" \
	    $$(test -f "$(DIST_PICO_ROMFS)" && echo --image "rpi_pico-romfs=$(DIST_PICO_ROMFS)")

$(NATMOD_BUILD)/%/_microtrain.mpy: $(MICROTRAIN_MODULE_FILES) $(MICROTRAIN_ROOT)/firmware/natmod.mk $(wildcard $(MICROTRAIN_ROOT)/firmware/natmod/*) \
		$(MICROTRAIN_FIRMWARE_PY_DEPS)
	@$(if $(call mt_natmod_cc,$*),,echo "microtrain: no native-module architecture '$*'; the architectures: $(NATMOD_ALL_ARCHS)" >&2; exit 2)
	@$(if $(call mt_natmod_have,$*),,echo "microtrain: the $* .mpy needs $(call mt_natmod_cc,$*), which is not on PATH; get it from $(MT_NATMOD_WHERE_$(call mt_natmod_cc,$*))" >&2; exit 2)
	@$(MICROTRAIN_PYTHON) -c "import elftools" 2>/dev/null || { \
	    echo "microtrain: the native module needs pyelftools for MicroPython's mpy_ld.py (make venv-firmware, or pip install -r requirements-firmware.txt)"; exit 1; }
	@mkdir -p "$(@D)"
	@echo 'include $(MICROTRAIN_ROOT)/firmware/natmod.mk' > "$(@D)/Makefile"
	+$(MICROTRAIN_SUBMAKE) -C "$(@D)" MPY_DIR="$(MICROTRAIN_MPY_ABS)" ARCH="$*" PYTHON="$(MICROTRAIN_PYTHON)" $(FIRMWARE_MAKE_ARGS)
	@# for `mpremote mip install $(@D)/package.json`: this .mpy and the device package
	@printf '{\n  "urls": [["_microtrain.mpy", "_microtrain.mpy"]],\n  "deps": [["%s", null]],\n  "version": "0.1.0"\n}\n' \
	    "$(MICROTRAIN_ROOT)/package.json" > "$(@D)/package.json"
	@echo "microtrain: built $@"

# ---- CircuitPython ------------------------------------------------------------------------

include $(MICROTRAIN_ROOT)/firmware/circuitpython.mk

endif

.DEFAULT_GOAL := $(MICROTRAIN_SAVED_DEFAULT_GOAL)
