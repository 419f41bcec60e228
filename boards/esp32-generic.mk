# microtrain target: MicroPython esp32 port, board ESP32_GENERIC. NOT YET BUILT: numbers are from the port's sources only.
# Format: KEY = value, one per line, no quotes, no '#' in values; see boards/README.md.
MT_BOARD_NAME = esp32-generic
MT_BOARD_STATUS = not-yet-built
MT_BOARD_PORT = esp32
MT_BOARD_BOARD = ESP32_GENERIC
MT_BOARD_CPU = ESP32 dual Xtensa LX6 240 MHz, single-precision FPU
MT_BOARD_FLOAT_IMPL = float
MT_BOARD_SRAM_BYTES = 532480
MT_BOARD_HEAP_BYTES = 57344
MT_BOARD_HEAP_USABLE_BYTES =
MT_BOARD_HEAP_FREE_AFTER_IMPORT_BYTES =
MT_BOARD_HEAP_SOURCE = not measured. ports/esp32/mpconfigport.h MICROPY_GC_INITIAL_HEAP_SIZE = 56 KiB for the ESP32; the heap then grows in new areas taken from the ESP-IDF heap on demand (MICROPY_GC_SPLIT_HEAP_AUTO), so the real limit depends on what ESP-IDF, WiFi etc. leave free of the 520 KB SRAM
MT_BOARD_FIRMWARE =
MT_BOARD_MAKE_TARGET =
MT_BOARD_RUN =
