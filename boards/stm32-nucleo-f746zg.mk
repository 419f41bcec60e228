# microtrain target: MicroPython stm32 port, board NUCLEO_F746ZG. NOT YET BUILT: numbers are from the datasheet and linker script only.
# Format: KEY = value, one per line, no quotes, no '#' in values; see boards/README.md.
MT_BOARD_NAME = stm32-nucleo-f746zg
MT_BOARD_STATUS = not-yet-built
MT_BOARD_PORT = stm32
MT_BOARD_BOARD = NUCLEO_F746ZG
MT_BOARD_CPU = STM32F746ZG Cortex-M7 216 MHz, single-precision FPU
MT_BOARD_FLOAT_IMPL = float
MT_BOARD_SRAM_BYTES = 327680
MT_BOARD_HEAP_BYTES =
MT_BOARD_HEAP_USABLE_BYTES =
MT_BOARD_HEAP_FREE_AFTER_IMPORT_BYTES =
MT_BOARD_HEAP_SOURCE = not measured. 320 KB SRAM = 64K DTCM (flash-filesystem cache) + 240K SRAM1 + 16K SRAM2; ports/stm32/boards/stm32f746.ld gives MicroPython a 256K RAM region, heap = _ebss to _sstack (256K minus 16K stack minus .data/.bss), so under 245760 bytes
MT_BOARD_FIRMWARE =
MT_BOARD_MAKE_TARGET =
MT_BOARD_RUN =
