// Raspberry Pi Pico (RP2040, 2 MB flash) with a ROMFS partition for microtrain plans, whose
// constants the core reads in place through XIP. MicroPython's RPI_PICO board, flash split as:
//
//     0x10000000  512 KB  firmware (RPI_PICO with microtrain is about 350 KB)
//     0x10080000 1280 KB  ROMFS: MICROPY_HW_ROMFS_BYTES, mounted at /rom (rp2_flash.c puts it
//                         right below the filesystem)
//     0x101C0000  256 KB  littlefs filesystem: MICROPY_HW_FLASH_STORAGE_BYTES (stock: 1408 KB)
//
// firmware/pico_romfs.py reads these numbers (keep them `(N * 1024)`) and checks that the
// firmware ends below the ROMFS partition: the linker script does not.
#define MICROPY_HW_BOARD_NAME                   "Raspberry Pi Pico"
#define MICROTRAIN_FLASH_BYTES                  (2048 * 1024)   // pico-sdk's board "pico": PICO_FLASH_SIZE_BYTES
#define MICROPY_HW_FLASH_STORAGE_BYTES          (256 * 1024)
#define MICROPY_HW_ROMFS_BYTES                  (1280 * 1024)
