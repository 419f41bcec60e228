// An RP2040 with 4 MB of flash (pico-sdk's board waveshare_rp2040_plus_4mb: the Pico's chip,
// 264 KB of SRAM, a W25Q32), with a ROMFS partition twice the Pico's whole flash less the rest:
//
//     0x10000000  512 KB  firmware (the same MicroPython RPI_PICO build with microtrain)
//     0x10080000 3328 KB  ROMFS: MICROPY_HW_ROMFS_BYTES, mounted at /rom
//     0x103C0000  256 KB  littlefs filesystem: MICROPY_HW_FLASH_STORAGE_BYTES
//
// For plans over the Pico's 1280 KB partition (`make firmware-pico-romfs PICO_ROMFS_BOARD=RP2040_4MB_ROMFS`,
// benchmarks/pico_romfs.py --board RP2040_4MB_ROMFS): the RAM a plan needs is the Pico's either way.
#define MICROPY_HW_BOARD_NAME                   "RP2040 4MB"
#define MICROTRAIN_FLASH_BYTES                  (4096 * 1024)   // the board header's PICO_FLASH_SIZE_BYTES
#define MICROPY_HW_FLASH_STORAGE_BYTES          (256 * 1024)
#define MICROPY_HW_ROMFS_BYTES                  (3328 * 1024)
