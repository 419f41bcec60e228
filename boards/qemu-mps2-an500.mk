# microtrain target: MicroPython qemu port, board MPS2_AN500 (Cortex-M7 in qemu). Built and tested.
# Format: KEY = value, one per line, no quotes, no '#' in values; see boards/README.md.
MT_BOARD_NAME = qemu-mps2-an500
MT_BOARD_STATUS = built-and-tested
MT_BOARD_PORT = qemu
MT_BOARD_BOARD = MPS2_AN500
MT_BOARD_CPU = Cortex-M7 (armv7e-m, fpv5-d16 double-precision FPU), emulated by qemu-system-arm -machine mps2-an500
MT_BOARD_FLOAT_IMPL = double
MT_BOARD_SRAM_BYTES = 4194304
MT_BOARD_HEAP_BYTES = 143360
MT_BOARD_HEAP_USABLE_BYTES = 140032
MT_BOARD_HEAP_FREE_AFTER_IMPORT_BYTES = 139440
MT_BOARD_HEAP_SOURCE = ports/qemu/Makefile MICROPY_HEAP_SIZE ?= 143360 for QEMU_ARCH=arm (a static array; the linker RAM region is 4M); usable and free measured with gc.mem_free()+gc.mem_alloc() on v1.28.0
MT_BOARD_FIRMWARE = build/micropython-qemu/firmware.elf
MT_BOARD_MAKE_TARGET = firmware-qemu
MT_BOARD_RUN = qemu-system-arm -machine mps2-an500 -nographic -monitor null -semihosting -serial pty -kernel build/micropython-qemu/firmware.elf
