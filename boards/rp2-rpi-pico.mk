# microtrain target: MicroPython rp2 port, board RPI_PICO. NOT YET BUILT: numbers are from the datasheet and linker script only.
# Format: KEY = value, one per line, no quotes, no '#' in values; see boards/README.md.
MT_BOARD_NAME = rp2-rpi-pico
MT_BOARD_STATUS = not-yet-built
MT_BOARD_PORT = rp2
MT_BOARD_BOARD = RPI_PICO
MT_BOARD_CPU = RP2040 dual Cortex-M0+ 125 MHz, no FPU (float in software)
MT_BOARD_FLOAT_IMPL = float
MT_BOARD_SRAM_BYTES = 270336
MT_BOARD_HEAP_BYTES =
MT_BOARD_HEAP_USABLE_BYTES =
MT_BOARD_HEAP_FREE_AFTER_IMPORT_BYTES =
MT_BOARD_HEAP_SOURCE = not measured. 264 KB SRAM; ports/rp2/memmap_mp_rp2040.ld has a 256k RAM region and the GC heap runs from __StackLimit (after .data/.bss and the C heap) to its end, so under 262144 bytes
MT_BOARD_FIRMWARE =
MT_BOARD_MAKE_TARGET =
MT_BOARD_RUN =
