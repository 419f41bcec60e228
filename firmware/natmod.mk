# microtrain as a native .mpy module (MicroPython "natmod"), for firmware that
# was built without the microtrain user C module. Used by `make natmods` / `make natmod
# NATMOD_ARCH=...` (firmware/micropython.mk), which writes build/natmod/ARCH/Makefile as
#     include <repo>/firmware/natmod.mk
# (MicroPython's dynruntime.mk wants a Makefile in the working directory) and runs
#     make -C build/natmod/ARCH MPY_DIR=... ARCH=armv7emdp
# which leaves _microtrain.mpy there, with a package.json for mpremote mip install.
# Needs pyelftools and ar (requirements.txt) for MicroPython's tools/mpy_ld.py.
# ARCH: x64, x86, armv6m, armv7m, armv7emsp, armv7emdp, xtensa, xtensawin, rv32imc...
# The .mpy version must match the firmware's (same MicroPython release, v1.28.0).

MICROTRAIN_NATMOD_ROOT := $(patsubst %/,%,$(dir $(abspath $(dir $(lastword $(MAKEFILE_LIST))))))
MICROTRAIN_MOD_SRC := $(MICROTRAIN_NATMOD_ROOT)/modules/microtrain

MPY_DIR ?= $(HOME)/.cache/microtrain/micropython
MOD = _microtrain
ARCH ?= x64

# The native-module glue (which includes the binding, modmicrotrain.c) and the core
# (which has its own exp and log: a native module links no libm).
SRC = $(MICROTRAIN_NATMOD_ROOT)/firmware/natmod/microtrain_natmod.c $(sort $(wildcard $(MICROTRAIN_MOD_SRC)/mt_*.c))

# -fno-tree-loop-distribute-patterns: keep gcc from turning plain loops into
# strlen/memcpy calls that a native module cannot resolve.
CFLAGS_EXTRA = -I$(MICROTRAIN_MOD_SRC) -fno-tree-loop-distribute-patterns

# The core computes in float32. dynruntime.mk builds rv32imc modules without float by
# default (modmicrotrain.c then stops at its #error); the ESP32-C3/C6 and the qemu VIRT_RV32
# firmware have single-precision float (MICROPY_FLOAT_IMPL_FLOAT), in software: soft float
# from libgcc, as on armv6m.
ifeq ($(ARCH),rv32imc)
MICROPY_FLOAT_IMPL ?= float
endif

include $(MPY_DIR)/py/dynruntime.mk

# The int8 kernels at -O2, as in the firmware (modules/microtrain/micropython.mk says why), but on
# armv6m: the RP2040 (the one armv6m board) runs a native module's code from its heap, where -O2
# takes 5.6 KB against 3.2 KB at -Os, and MIT's 49kb MCUNet streamed on the stock Pico fits beside
# the module by less than that (tests/device/test_pico_stock.py).
ifneq ($(ARCH),armv6m)
$(filter %/mt_q8_kernels.o,$(SRC_O)): CFLAGS += -O2
endif

# modmicrotrain.c is compiled through the glue's #include, not as a source of its own;
# mpy_ld.py finds qstrs by reading the files its rule is given, so give it this one too.
$(CONFIG_H): $(MICROTRAIN_MOD_SRC)/modmicrotrain.c

# Soft-float and 64-bit integer helpers from libgcc (__aeabi_* on ARM, __divsf3, __floatundidf,
# __divdi3... on RISC-V and Xtensa), for every cross architecture; x64 and x86 need none. Not
# LINK_RUNTIME=1: that would also pull in the C library (newlib, picolibc) and libm.
ifneq ($(CROSS),)
MPY_LD_FLAGS += -l$(realpath $(shell $(CROSS)gcc $(CFLAGS) --print-libgcc-file-name))
endif
