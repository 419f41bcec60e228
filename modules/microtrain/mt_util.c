/* microtrain core: byte readers, CRC-32, finiteness tests and error text. */
#include <string.h>
#include "mt_core.h"

uint32_t mt_rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint16_t mt_rd_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

void mt_wr_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

float mt_f32_from_bits(int32_t bits) {
    float f;
    uint32_t u = (uint32_t)bits;
    memcpy(&f, &u, sizeof f);
    return f;
}

int mt_f32_finite(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x7F800000u) != 0x7F800000u;
}

/* A positive, finite, normal float32, decided on its bits: a subnormal is refused because
 * boards whose float library flushes subnormals to zero (RP2040's) would see 0 where the
 * host sees a positive number, and a plan must be valid everywhere or nowhere. */
int mt_f32_positive_normal(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u >= 0x00800000u && u < 0x7F800000u;
}

/* p may be unaligned: read bytewise. */
int mt_all_finite(const float *p, uint32_t n) {
    const uint8_t *b = (const uint8_t *)p;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, b + 4 * i, sizeof u);
        if ((u & 0x7F800000u) == 0x7F800000u) {
            return 0;
        }
    }
    return 1;
}

/* CRC-32 (IEEE 802.3, as zlib.crc32), four bits at a time: a 64-byte table
 * instead of 1 KB, which matters more than speed since it runs once per load. */
uint32_t mt_crc32(const uint8_t *p, size_t n) {
    return mt_crc32_more(0, p, n);
}

/* crc (a finished CRC-32, 0 for none yet) carried on over n more bytes: zlib.crc32(p, crc) */
uint32_t mt_crc32_more(uint32_t crc, const uint8_t *p, size_t n) {
    static const uint32_t nibble[16] = {
        0x00000000, 0x1DB71064, 0x3B6E20C8, 0x26D930AC, 0x76DC4190, 0x6B6B51F4, 0x4DB26158, 0x5005713C,
        0xEDB88320, 0xF00F9344, 0xD6D6A3E8, 0xCB61B38C, 0x9B64C2B0, 0x86D3D2D4, 0xA00AE278, 0xBDBDF21C,
    };
    crc ^= 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ nibble[crc & 15];
        crc = (crc >> 4) ^ nibble[crc & 15];
    }
    return crc ^ 0xFFFFFFFFu;
}

/* The product of the 32x32 GF(2) matrix m (one column per word) and the vector v. */
static uint32_t gf2_times(const uint32_t *m, uint32_t v) {
    uint32_t sum = 0;
    for (; v != 0; v >>= 1, m++) {
        if (v & 1u) {
            sum ^= *m;
        }
    }
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *m) {
    for (int k = 0; k < 32; k++) {
        sq[k] = gf2_times(m, m[k]);
    }
}

/* The CRC-32 of A then B from crc_a, crc_b and B's length (zlib's crc32_combine): crc_a is carried
 * over len_b zero bytes by the matrix of one zero bit squared up to each set bit of len_b, then
 * crc_b added. A plan streamed from its file checks its head this way against the file's CRC
 * without reading the stream section (mt_plan.c). */
uint32_t mt_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint32_t len_b) {
    uint32_t even[32], odd[32];
    if (len_b == 0) {
        return crc_a;
    }
    odd[0] = 0xEDB88320u;   /* one zero bit: the reflected polynomial, then shifts */
    for (int k = 1; k < 32; k++) {
        odd[k] = 1u << (k - 1);
    }
    gf2_square(even, odd);   /* two zero bits */
    gf2_square(odd, even);   /* four */
    for (;;) {   /* a zero byte, two, four... applied where len_b has a bit */
        gf2_square(even, odd);
        if (len_b & 1u) {
            crc_a = gf2_times(even, crc_a);
        }
        len_b >>= 1;
        if (len_b == 0) {
            break;
        }
        gf2_square(odd, even);
        if (len_b & 1u) {
            crc_a = gf2_times(odd, crc_a);
        }
        len_b >>= 1;
        if (len_b == 0) {
            break;
        }
    }
    return crc_a ^ crc_b;
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

/* The name at offset name_off of the names section, and its length, never
 * reading past the section: the bytes may have changed since they were checked. */
const char *mt_name_of(const mt_ctx_t *ctx, uint32_t name_off, uint32_t *len) {
    *len = 0;
    if (ctx->names == NULL || name_off >= ctx->names_bytes) {
        return "";
    }
    const char *s = (const char *)ctx->names + name_off;
    uint32_t max = ctx->names_bytes - name_off;
    while (*len < max && s[*len] != '\0') {
        (*len)++;
    }
    return s;
}

/* ---- error text: the one place that builds it, for every binding ---- */

typedef struct {
    char *buf;
    size_t n, len;   /* capacity, characters written (excluding the NUL) */
} text_t;

static void put_str(text_t *t, const char *s, size_t len) {
    for (size_t i = 0; i < len && s[i] != '\0'; i++) {
        if (t->len + 1 < t->n) {
            char c = s[i];
            t->buf[t->len++] = (c >= ' ' && c < 127) ? c : '?';   /* names are bytes from the plan */
        }
    }
}

static void put_uint(text_t *t, uint32_t v) {
    char digits[10];
    int k = 0;
    do {
        digits[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (k > 0) {
        put_str(t, &digits[--k], 1);
    }
}

size_t mt_error_text(const mt_ctx_t *ctx, int code, char *buf, size_t n) {
    text_t t = {buf, n, 0};
    if (code == MT_E_VERSION && ctx != NULL) {
        put_str(&t, "plan format version ", 40);
        put_uint(&t, ctx->plan_version);
        put_str(&t, ", this runtime reads ", 40);
        put_uint(&t, MT_VERSION);
        put_str(&t, ": recompile the model with this microtrain", 60);
    } else {
        put_str(&t, mt_strerror(code), 200);
    }
    int have_op = ctx != NULL && ctx->err_op >= 0;
    int have_tensor = ctx != NULL && ctx->err_tensor >= 0;
    if (have_op || have_tensor) {
        put_str(&t, " (", 2);
        if (have_op) {
            put_str(&t, "op ", 3);
            put_uint(&t, (uint32_t)ctx->err_op);
        }
        if (have_tensor) {
            put_str(&t, have_op ? ", tensor " : "tensor ", 9);
            put_uint(&t, (uint32_t)ctx->err_tensor);
            /* names only from a plan that loaded: a refused plan's names are not to be trusted */
            if (ctx->plan != NULL && (uint32_t)ctx->err_tensor < ctx->n_tensors) {
                uint32_t len;
                const uint8_t *r = ctx->tensors + (uint32_t)ctx->err_tensor * MT_TENSOR_BYTES;
                const char *name = mt_name_of(ctx, mt_rd_u32(r + MT_T_NAME), &len);
                if (len > 0) {
                    put_str(&t, " '", 2);
                    put_str(&t, name, len < 60 ? len : 60);
                    put_str(&t, "'", 1);
                }
            }
        }
        put_str(&t, ")", 1);
    }
    if (n > 0) {
        buf[t.len] = '\0';
    }
    return t.len;
}
