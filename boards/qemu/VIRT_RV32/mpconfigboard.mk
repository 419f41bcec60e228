# MicroPython's own VIRT_RV32 board (qemu-system-riscv32 -machine virt), as it is, plus one
# toolchain fix. Used through
#     make -C ports/qemu BOARD=VIRT_RV32 BOARD_DIR=<this directory>
# The port compiles for -march=rv32imac_zicsr. Some toolchains' multilib tables (Debian 12's
# gcc-riscv64-unknown-elf, GCC 12.2) have rv32imac/ilp32 but no entry for the _zicsr name, so
# the link takes the default 64-bit libgcc and C library and fails ("ELFCLASS64 incompatible").
# With such a toolchain this compiles for rv32imac under the 2.2 ISA spec (where the CSR
# instructions belong to I, as zicsr does now): the same instructions, the rv32imac/ilp32
# libraries.
include $(TOP)/ports/qemu/boards/VIRT_RV32/mpconfigboard.mk

MICROTRAIN_RV_CC := $(CROSS_COMPILE)gcc
ifeq ($(CROSS_COMPILE),)
MICROTRAIN_RV_CC := riscv64-unknown-elf-gcc
endif
ifeq ($(shell $(MICROTRAIN_RV_CC) -march=rv32imac_zicsr -mabi=ilp32 -print-multi-directory 2>/dev/null),.)
ifneq ($(shell $(MICROTRAIN_RV_CC) -march=rv32imac -mabi=ilp32 -print-multi-directory 2>/dev/null),.)
RV32_ARCH = rv32imac
AFLAGS += -misa-spec=2.2
endif
endif
