# microtrain as a MicroPython user C module (make-based ports: unix, qemu, stm32, rp2 via make...).
#   make -C <micropython>/ports/unix USER_C_MODULES=<repo>/modules
# MicroPython includes this file once per build with USERMOD_DIR set to this directory.

MICROTRAIN_MOD_DIR := $(USERMOD_DIR)

# The binding registers the module and is scanned for qstrs.
SRC_USERMOD_C += $(MICROTRAIN_MOD_DIR)/modmicrotrain.c

# The portable core: every mt_*.c here, so new core files are picked up. They
# use no qstrs, so they go in the library list (not scanned).
MICROTRAIN_CORE_SRC := $(sort $(wildcard $(MICROTRAIN_MOD_DIR)/mt_*.c))
SRC_USERMOD_LIB_C += $(MICROTRAIN_CORE_SRC)

CFLAGS_USERMOD += -I$(MICROTRAIN_MOD_DIR)

# The core is C99: compile it with -std=c99 (after the port's -std=gnu99, so it
# wins), keeping the port's warning flags. `private` stops the flag reaching
# prerequisites that make builds on these objects' behalf. Object paths follow
# py/py.mk: $(BUILD)/<path below USER_C_MODULES>.o.
MICROTRAIN_CORE_OBJ := $(addprefix $(BUILD)/,$(patsubst $(USER_C_MODULES)/%.c,%.o,$(MICROTRAIN_CORE_SRC)))
MICROTRAIN_CORE_CFLAGS ?= -std=c99
ifneq ($(MICROTRAIN_CORE_OBJ),)
$(MICROTRAIN_CORE_OBJ): private CFLAGS += $(MICROTRAIN_CORE_CFLAGS)
endif
# The int8 kernels' inner loops at -O2 (after the port's -Os): MCUNet-5fps's int8 last-layer
# step on MPS2_AN500 (Cortex-M7) 167.6M -> 136.0M instructions for 1.5 KB more flash. The
# rest of the core stays at -Os: at -O2 it is 15 KB more and MIT's 49kb step slower.
MICROTRAIN_KERNEL_CFLAGS ?= -O2
MICROTRAIN_KERNEL_OBJ := $(filter %/mt_q8_kernels.o,$(MICROTRAIN_CORE_OBJ))
ifneq ($(MICROTRAIN_KERNEL_OBJ),)
$(MICROTRAIN_KERNEL_OBJ): private CFLAGS += $(MICROTRAIN_KERNEL_CFLAGS)
endif
