# The stock RPI_PICO board (pico-sdk board "pico", RP2040, its pins), with this directory's
# mpconfigboard.h: a ROMFS partition (firmware/micropython.mk, `make firmware-pico-romfs`).
include(${MICROPY_PORT_DIR}/boards/RPI_PICO/mpconfigboard.cmake)
set(MICROPY_BOARD_PINS ${MICROPY_PORT_DIR}/boards/RPI_PICO/pins.csv)
