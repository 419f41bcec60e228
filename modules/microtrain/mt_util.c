/* microtrain core: byte readers, CRC-32 and error strings. */
#include <string.h>
#include "mt.h"

uint32_t mt_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint16_t mt_rd_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

float mt_f32_from_bits(int32_t bits) {
    float f;
    uint32_t u = (uint32_t)bits;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* CRC-32 (IEEE 802.3, as zlib.crc32), four bits at a time: a 64-byte table
 * instead of 1 KB, which matters more than speed since it runs once per load. */
uint32_t mt_crc32(const uint8_t *p, size_t n) {
    static const uint32_t nibble[16] = {
        0x00000000, 0x1DB71064, 0x3B6E20C8, 0x26D930AC, 0x76DC4190, 0x6B6B51F4, 0x4DB26158, 0x5005713C,
        0xEDB88320, 0xF00F9344, 0xD6D6A3E8, 0xCB61B38C, 0x9B64C2B0, 0x86D3D2D4, 0xA00AE278, 0xBDBDF21C,
    };
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ nibble[crc & 15];
        crc = (crc >> 4) ^ nibble[crc & 15];
    }
    return crc ^ 0xFFFFFFFFu;
}

const char *mt_strerror(int code) {
    static const char messages[] = MT_ERROR_MESSAGES;
    if (code < 0 || code >= MT_E_COUNT) {
        return "unknown error";
    }
    const char *p = messages;
    while (code-- > 0) {
        p += strlen(p) + 1;
    }
    return p;
}
