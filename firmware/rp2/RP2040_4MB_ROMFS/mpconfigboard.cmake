# MicroPython's RPI_PICO board on pico-sdk's waveshare_rp2040_plus_4mb (an RP2040 with 4 MB of
# flash, the Pico's pinout), with this directory's mpconfigboard.h: a 3328 KB ROMFS partition.
include(${MICROPY_PORT_DIR}/boards/RPI_PICO/mpconfigboard.cmake)
set(PICO_BOARD "waveshare_rp2040_plus_4mb")
set(MICROPY_BOARD_PINS ${MICROPY_PORT_DIR}/boards/RPI_PICO/pins.csv)
