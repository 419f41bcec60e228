# microtrain target: MicroPython unix port (host executable). Built and tested.
# Format: KEY = value, one per line, no quotes, no '#' in values; see boards/README.md.
MT_BOARD_NAME = unix
MT_BOARD_STATUS = built-and-tested
MT_BOARD_PORT = unix
MT_BOARD_BOARD = standard
MT_BOARD_CPU = x86_64 host (any 64-bit Linux machine)
MT_BOARD_FLOAT_IMPL = double
MT_BOARD_SRAM_BYTES =
MT_BOARD_HEAP_BYTES = 2097152
MT_BOARD_HEAP_USABLE_BYTES = 2072832
MT_BOARD_HEAP_FREE_AFTER_IMPORT_BYTES = 2071840
MT_BOARD_HEAP_SOURCE = ports/unix/main.c heap_size = 1 MiB * sizeof(mp_uint_t)/4 (2 MiB on 64-bit, change with -X heapsize=); usable and free measured with gc.mem_free()+gc.mem_alloc() on v1.28.0
MT_BOARD_FIRMWARE = build/micropython-unix/micropython
MT_BOARD_MAKE_TARGET = firmware-unix
MT_BOARD_RUN = build/micropython-unix/micropython
