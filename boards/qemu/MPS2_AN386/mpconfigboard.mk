# MicroPython qemu port board definition for the ARM MPS2 AN386 FPGA image (Cortex-M4 with
# the single-precision FPU), emulated by qemu-system-arm -machine mps2-an386. MicroPython
# v1.28.0 has MPS2_AN385 (Cortex-M3) and MPS2_AN500 (Cortex-M7) but not this one; it uses
# the same memory map and UART as AN385, so only the CPU flags differ. Used through
#     make -C ports/qemu BOARD=MPS2_AN386 BOARD_DIR=<this directory>
QEMU_ARCH = arm
QEMU_MACHINE = mps2-an386

CFLAGS += -mthumb -mcpu=cortex-m4 -mfloat-abi=hard -mfpu=fpv4-sp-d16
CFLAGS += -DQEMU_SOC_MPS2
CFLAGS += -DMICROPY_HW_MCU_NAME='"Cortex-M4F"'

LDSCRIPT = mcu/arm/mps2.ld

SRC_BOARD_O = shared/runtime/gchelper_native.o shared/runtime/gchelper_thumb2.o

MPY_CROSS_FLAGS += -march=armv7emsp

# float32 in hardware (MicroPython's float type is single precision here)
MICROPY_FLOAT_IMPL = float
SUPPORTS_HARDWARE_FP_SINGLE = 1
