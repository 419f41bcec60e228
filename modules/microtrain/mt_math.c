/* microtrain core: exp and log for the softmax, in float.
 *
 * Our own, so the core links no libm: native .mpy modules cannot link one,
 * ports built with double floats (qemu MPS2_AN500) carry no float versions,
 * and every platform computes the same bits. Both are within 1 ulp (tests/core/test_core_math.py).
 */
#include <string.h>
#include "mt.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float mt_expf(float x) {
    if (x != x) {
        return x;
    }
    if (x > 88.7228f) {
        return from_bits(0x7F800000u);
    }
    if (x < -103.9721f) {
        return 0.0f;
    }
    /* x = k ln2 + r, |r| <= ln2/2. ln2_hi has 15 significant bits, so k*ln2_hi and x - k*ln2_hi
     * are exact; r = r_hi + r_lo keeps the rounding error of the second subtraction, which alone
     * would cost up to half an ulp of the result. */
    const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860676533018e-06f;
    float kf = x * 1.44269504088896f;
    int32_t k = (int32_t)(kf + (kf >= 0.0f ? 0.5f : -0.5f));
    float t = x - (float)k * ln2_hi;
    float c = (float)k * ln2_lo;
    float r = t - c;
    float r_lo = (t - r) - c;
    /* exp(r) = 1 + r + r^2 (1/2 + r/6 + ... + r^5/5040): Taylor to r^7, truncation below 1e-8
     * relative on |r| <= 0.347; the small terms first, 1 + ... last */
    float q = 0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))));
    float p = 1.0f + (r + (r_lo + r * r * q));
    /* times 2^k, in two steps so that k down to -150 and up to 128 stay representable */
    int32_t k1 = k / 2, k2 = k - k1;
    return p * from_bits((uint32_t)(k1 + 127) << 23) * from_bits((uint32_t)(k2 + 127) << 23);
}

float mt_logf(float x) {
    uint32_t u = to_bits(x);
    if (x != x || (u >> 31) != 0) {
        return x == 0.0f ? from_bits(0xFF800000u) : from_bits(0x7FC00000u);   /* -0 -> -inf, < 0 -> NaN */
    }
    if (u == 0) {
        return from_bits(0xFF800000u);
    }
    if (u >= 0x7F800000u) {
        return x;   /* +inf */
    }
    int32_t e = 0;
    if (u < 0x00800000u) {   /* subnormal: scale into the normal range */
        x *= 16777216.0f;
        u = to_bits(x);
        e = -24;
    }
    e += (int32_t)(u >> 23) - 127;
    float m = from_bits((u & 0x007FFFFFu) | 0x3F800000u);   /* [1, 2) */
    if (m > 1.41421356f) {
        m *= 0.5f;
        e += 1;
    }
    /* log(m) = log(1 + f), f = m - 1 exact, |f| < 0.415. With s = f / (2 + f),
     * log(1 + f) = 2 atanh(s) = 2s + s R, R = 2/3 s^2 + 2/5 s^4 + ... (Taylor, |s| <= 0.1716,
     * truncation below 1e-9 relative), and 2s = f - s f, written as
     * f - (f^2/2 - s (f^2/2 + R)): the exact f plus a correction at most half its size, so
     * the rounding of the correction hardly shows (the method of fdlibm's logf). */
    float f = m - 1.0f;
    float s = f / (2.0f + f), z = s * s;
    float R = z * (2.0f / 3 + z * (2.0f / 5 + z * (2.0f / 7 + z * (2.0f / 9))));
    float hfsq = 0.5f * f * f;
    const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860676533018e-06f;
    float ef = (float)e;
    return ef * ln2_hi - ((hfsq - (s * (hfsq + R) + ef * ln2_lo)) - f);
}
