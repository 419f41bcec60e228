/* microtrain core: the int8 convolution kernels every int8 conv op runs (mt_conv_q8.c, the
 * streamed ops of mt_cdp_q8.c and mt_pwdw_q8.c), each written once:
 *
 *   mt_q8_pw   a 1x1 convolution over n pixels of channel-major rows
 *   mt_q8_dw   one output row of one channel of a depthwise convolution
 *
 * Two paths compute the same integers (int32 sums are exact, so the order of the products does
 * not matter): on a core with the DSP extension (Cortex-M4/M7/M33: __ARM_FEATURE_DSP) the Arm C
 * Language Extensions' 16-bit multiply-accumulates, which take two int8 values widened to int16
 * halves of a register (__sxtab16, which also subtracts the zero point) and multiply halves
 * (__smlabb.. one product each, __smlad two at once); elsewhere (the host, the unix port,
 * Cortex-M0+/M3) plain C with the same blocking, so the sums stay in registers.
 *
 * Blocking, as in Arm's CMSIS-NN and MIT's TinyEngine (read there, written here): the 1x1 kernel
 * keeps 2 output channels x 4 pixels of sums in registers and reads each input byte once per two
 * outputs; the depthwise kernel slides its window over two outputs at a time, each input byte
 * read for both. Zero points are subtracted as the bytes are widened, so a padded tap (outside
 * the input) is simply not summed, as CONV2D_Q8's definition says.
 */
#include <string.h>
#include "mt_q8.h"

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#define MT_DSP 1
#else
#define MT_DSP 0
#endif

/* v rotated right by 8 bits (one ROR, or folded into the __sxtab16 that reads it) */
MT_INLINE uint32_t ror8(uint32_t v) {
    return (v >> 8) | (v << 24);
}

/* four int8 at p (any alignment) as one word */
MT_INLINE uint32_t read4(const int8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* v * 2^-32 rounded down: the high word of the product (one SMMUL) */
MT_INLINE int32_t mul_hi(int32_t v, int32_t m) {
    return (int32_t)(((int64_t)v * m) >> 32);
}

/* y[0] (and y[1] when two) = the int8 outputs of sums a and c of one channel: out8's arithmetic
 * with the channel's constants worked out once, for the usual shift (< -1: mt_q8_requant's high
 * word plus a half, >> k) */
MT_INLINE void out8_pair(int8_t *y, int32_t a, int32_t c, uint32_t two, int32_t mult, int32_t shift, int32_t zp,
    int32_t lo, int32_t hi) {
    if (shift < -1 && shift >= MT_Q8_SHIFT_MIN) {
        const int32_t k = -1 - shift, half = 1 << (k - 1);
        y[0] = mt_q8_clamp(((mul_hi(a, mult) + half) >> k) + zp, lo, hi);
        if (two) {
            y[1] = mt_q8_clamp(((mul_hi(c, mult) + half) >> k) + zp, lo, hi);
        }
        return;
    }
    y[0] = mt_q8_out(mt_q8_requant(a, mult, shift), zp, lo, hi);
    if (two) {
        y[1] = mt_q8_out(mt_q8_requant(c, mult, shift), zp, lo, hi);
    }
}

/* One output channel's requantization in the usual case (fast_rq): mt_q8_requant's high word
 * plus a half, >> k, then the zero point and the clamp, with the constants worked out once. */
typedef struct {
    int32_t mult, k, half, zp, lo, hi;
} rq_t;

/* the channel's rq_t, when its shift is the usual kind (-31 <= shift < -1), else 0 */
MT_INLINE int fast_rq(int32_t mult, int32_t shift, int32_t zp, int32_t lo, int32_t hi, rq_t *q) {
    if (shift < -1 && shift >= MT_Q8_SHIFT_MIN) {
        q->mult = mult, q->k = -1 - shift, q->half = 1 << (-2 - shift), q->zp = zp, q->lo = lo, q->hi = hi;
        return 1;
    }
    return 0;
}

MT_INLINE int8_t rq8(int32_t sum, const rq_t *q) {
    return mt_q8_clamp(((mul_hi(sum, q->mult) + q->half) >> q->k) + q->zp, q->lo, q->hi);
}

/* y = the int8 output of the sum: mt_q8_out(mt_q8_requant(...)), whose clamp to +-256 the usual
 * case (shift < 0: |requantized| < 2^30) does not need before the zero point is added */
MT_INLINE int8_t out8(int32_t sum, int32_t mult, int32_t shift, int32_t zp, int32_t lo, int32_t hi) {
    if (shift < 0 && shift >= MT_Q8_SHIFT_MIN) {
        return mt_q8_clamp(mt_q8_requant(sum, mult, shift) + zp, lo, hi);
    }
    return mt_q8_out(mt_q8_requant(sum, mult, shift), zp, lo, hi);
}

/* ---- 1x1 ---- */

/* Output channels o0 and o0+1 for pixels j .. j+3 (all four inside): 8 sums. */
MT_INLINE void pw_2x4(const int8_t *x, size_t xs, uint32_t C, int32_t xzp, const int8_t *w0, const int8_t *w1,
    int32_t b0, int32_t b1, int32_t *s) {
    int32_t a00 = b0, a01 = b0, a02 = b0, a03 = b0, a10 = b1, a11 = b1, a12 = b1, a13 = b1;
#if MT_DSP
    const uint32_t off = (uint32_t)(uint16_t)(int16_t)-xzp * 0x10001u;
    for (uint32_t c = 0; c < C; c++, x += xs) {
        const uint32_t v = read4(x);
        const int32_t x02 = (int32_t)__sxtab16(off, v), x13 = (int32_t)__sxtab16(off, ror8(v));
        const int32_t wp = (int32_t)((uint32_t)(uint16_t)w0[c] | ((uint32_t)(uint16_t)w1[c] << 16));
        a00 = __smlabb(x02, wp, a00);
        a02 = __smlatb(x02, wp, a02);
        a10 = __smlabt(x02, wp, a10);
        a12 = __smlatt(x02, wp, a12);
        a01 = __smlabb(x13, wp, a01);
        a03 = __smlatb(x13, wp, a03);
        a11 = __smlabt(x13, wp, a11);
        a13 = __smlatt(x13, wp, a13);
    }
#else
    for (uint32_t c = 0; c < C; c++, x += xs) {
        const int32_t x0 = x[0] - xzp, x1 = x[1] - xzp, x2 = x[2] - xzp, x3 = x[3] - xzp;
        const int32_t u = w0[c], v = w1[c];
        a00 += x0 * u;
        a01 += x1 * u;
        a02 += x2 * u;
        a03 += x3 * u;
        a10 += x0 * v;
        a11 += x1 * v;
        a12 += x2 * v;
        a13 += x3 * v;
    }
#endif
    s[0] = a00, s[1] = a01, s[2] = a02, s[3] = a03, s[4] = a10, s[5] = a11, s[6] = a12, s[7] = a13;
}

/* Output channel o for pixels j .. j+3: 4 sums. A last odd output's own kernel: through pw_2x4 with
 * its row twice, MCUNet-5fps's int8 step took 12M more instructions (143.4M against 131.5M). */
MT_INLINE void pw_1x4(const int8_t *x, size_t xs, uint32_t C, int32_t xzp, const int8_t *w, int32_t b, int32_t *s) {
    int32_t a0 = b, a1 = b, a2 = b, a3 = b;
#if MT_DSP
    const uint32_t off = (uint32_t)(uint16_t)(int16_t)-xzp * 0x10001u;
    for (uint32_t c = 0; c < C; c++, x += xs) {
        const uint32_t v = read4(x);
        const int32_t x02 = (int32_t)__sxtab16(off, v), x13 = (int32_t)__sxtab16(off, ror8(v)), wc = w[c];
        a0 = __smlabb(x02, wc, a0);
        a2 = __smlatb(x02, wc, a2);
        a1 = __smlabb(x13, wc, a1);
        a3 = __smlatb(x13, wc, a3);
    }
#else
    for (uint32_t c = 0; c < C; c++, x += xs) {
        const int32_t wc = w[c];
        a0 += (x[0] - xzp) * wc;
        a1 += (x[1] - xzp) * wc;
        a2 += (x[2] - xzp) * wc;
        a3 += (x[3] - xzp) * wc;
    }
#endif
    s[0] = a0, s[1] = a1, s[2] = a2, s[3] = a3;
}

/* Output channel o for one pixel: the dot product of its weights with the pixel's column. */
MT_INLINE int32_t pw_1x1(const int8_t *x, size_t xs, uint32_t C, int32_t xzp, const int8_t *w, int32_t b) {
    int32_t a = b;
    for (uint32_t c = 0; c < C; c++, x += xs) {
        a += ((int32_t)*x - xzp) * w[c];
    }
    return a;
}

#if MT_DSP
/* bytes 1 and 3 of v widened to int16 halves: one instruction (__sxtb16 of a rotated word, which
 * GCC does not fold into the rotating form itself) */
MT_INLINE int32_t sxtb16_ror8(uint32_t v) {
    int32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v));
    return r;
}

/* Where channel c of a gathered column goes: in each group of 4, the order (0, 2, 1, 3), which
 * is how __sxtb16 widens 4 weight bytes into two words (bytes 0, 2 and bytes 1, 3), so a word of
 * the column and a word of widened weights hold matching pairs for __smlad. */
MT_INLINE uint32_t col_at(uint32_t c) {
    return (c & ~3u) | ((c & 1u) << 1) | ((c & 2u) >> 1);
}

#define MT_Q8_PW_COL 1024   /* int16 column entries on the stack (2 KB): two pixels of up to 512 channels */

/* What every output of a 1x1 conv needs besides its sums (mt_q8_pw's arguments). */
typedef struct {
    const int8_t *w;
    const int32_t *b, *mult, *shift;
    uint32_t C, O;
    int8_t *y;
    size_t ys;
    int32_t yzp, lo, hi;
} pw_args_t;

/* Every output of two gathered columns c0, c1 (pixels j and, when two, j + 1): each pair of
 * output rows w0, w1 dotted with both columns, groups of 4 channels at 8 __smlad (16 products), the
 * rest one by one, then requantized and stored. Out of line and with its constants in *a, so that
 * the compiler keeps the inner loop's 13 values in registers. */
static __attribute__((noinline)) void pw_columns(const int16_t *c0, const int16_t *c1, const pw_args_t *a, uint32_t j,
    uint32_t two) {
    const uint32_t C = a->C, C4 = C & ~3u;
    for (uint32_t o = 0; o < a->O; o += 2) {
        const uint32_t o1 = o + 1 < a->O ? o + 1 : o;   /* a last odd output: computed twice, kept once */
        const int8_t *w0 = a->w + (size_t)o * C, *w1 = a->w + (size_t)o1 * C;
        int32_t a00 = a->b != NULL ? a->b[o] : 0, a10 = a->b != NULL ? a->b[o1] : 0, a01 = a00, a11 = a10;
        const int16_t *x0 = c0, *x1 = c1;
        const int8_t *u0 = w0, *u1 = w1, *const end = w0 + C4;
        while (u0 != end) {
            const uint32_t u = read4(u0), v = read4(u1);
            u0 += 4;
            u1 += 4;
            const int32_t ue = (int32_t)__sxtb16(u), uo = sxtb16_ror8(u);
            const int32_t ve = (int32_t)__sxtb16(v), vo = sxtb16_ror8(v);
            int32_t b0, b1;
            memcpy(&b0, x0, 4);
            memcpy(&b1, x1, 4);
            a00 = __smlad(ue, b0, a00);
            a01 = __smlad(ue, b1, a01);
            a10 = __smlad(ve, b0, a10);
            a11 = __smlad(ve, b1, a11);
            memcpy(&b0, x0 + 2, 4);
            memcpy(&b1, x1 + 2, 4);
            x0 += 4;
            x1 += 4;
            a00 = __smlad(uo, b0, a00);
            a01 = __smlad(uo, b1, a01);
            a10 = __smlad(vo, b0, a10);
            a11 = __smlad(vo, b1, a11);
        }
        for (uint32_t c = C4; c < C; c++) {
            const int32_t p = c0[col_at(c)], q = c1[col_at(c)];
            a00 += p * w0[c];
            a01 += q * w0[c];
            a10 += p * w1[c];
            a11 += q * w1[c];
        }
        int8_t *yo = a->y + (size_t)o * a->ys + j;
        out8_pair(yo, a00, a01, two, a->mult[o], a->shift[o], a->yzp, a->lo, a->hi);
        if (o1 != o) {
            out8_pair(yo + a->ys, a10, a11, two, a->mult[o1], a->shift[o1], a->yzp, a->lo, a->hi);
        }
    }
}

/* The 1x1 conv through gathered columns: two pixels at a time, each pixel's C values (zero point
 * taken off) in a column in the order col_at gives, which every output then reads (pw_columns). A
 * last odd pixel is its own pair (its column twice, one result kept). */
static void pw_gathered(const int8_t *x, size_t xs, uint32_t C, int32_t xzp, const int8_t *w, const int32_t *b,
    const int32_t *mult, const int32_t *shift, uint32_t O, int8_t *y, size_t ys, uint32_t n, int32_t yzp, int32_t lo,
    int32_t hi) {
    int16_t col[MT_Q8_PW_COL];
    const uint32_t C4 = C & ~3u, Cq = (C + 3u) & ~3u;
    int16_t *const c0 = col, *const c1 = col + Cq;
    const pw_args_t a = {w, b, mult, shift, C, O, y, ys, yzp, lo, hi};
    for (uint32_t j = 0; j < n; j += 2) {
        const uint32_t two = j + 1 < n;
        const int8_t *xc = x + j;
        const size_t d1 = two ? 1 : 0;   /* a last odd pixel: its column twice */
        uint32_t c = 0;
        for (; c < C4; c += 4, xc += 4 * xs) {   /* channels c..c+3 to the column's places 0, 2, 1, 3 */
            c0[c] = (int16_t)(xc[0] - xzp), c1[c] = (int16_t)(xc[d1] - xzp);
            c0[c + 2] = (int16_t)(xc[xs] - xzp), c1[c + 2] = (int16_t)(xc[xs + d1] - xzp);
            c0[c + 1] = (int16_t)(xc[2 * xs] - xzp), c1[c + 1] = (int16_t)(xc[2 * xs + d1] - xzp);
            c0[c + 3] = (int16_t)(xc[3 * xs] - xzp), c1[c + 3] = (int16_t)(xc[3 * xs + d1] - xzp);
        }
        for (; c < C; c++, xc += xs) {
            c0[col_at(c)] = (int16_t)(xc[0] - xzp), c1[col_at(c)] = (int16_t)(xc[d1] - xzp);
        }
        pw_columns(c0, c1, &a, j, two);
    }
}
#endif

void mt_q8_pw(const int8_t *x, size_t xs, uint32_t C, int32_t xzp, const int8_t *w, const int32_t *b,
    const int32_t *mult, const int32_t *shift, uint32_t O, int8_t *y, size_t ys, uint32_t n, int32_t yzp, int32_t lo,
    int32_t hi) {
#if MT_DSP
    if (O >= 2 && 2 * ((C + 3u) & ~3u) <= MT_Q8_PW_COL) {
        pw_gathered(x, xs, C, xzp, w, b, mult, shift, O, y, ys, n, yzp, lo, hi);
        return;
    }
#endif
    uint32_t o = 0;
    for (; o + 2 <= O; o += 2) {
        const int8_t *w0 = w + (size_t)o * C, *w1 = w0 + C;
        const int32_t b0 = b != NULL ? b[o] : 0, b1 = b != NULL ? b[o + 1] : 0;
        int8_t *y0 = y + (size_t)o * ys, *y1 = y0 + ys;
        uint32_t j = 0;
        for (; j + 4 <= n; j += 4) {
            int32_t s[8];
            pw_2x4(x + j, xs, C, xzp, w0, w1, b0, b1, s);
            for (int k = 0; k < 4; k++) {
                y0[j + k] = out8(s[k], mult[o], shift[o], yzp, lo, hi);
                y1[j + k] = out8(s[4 + k], mult[o + 1], shift[o + 1], yzp, lo, hi);
            }
        }
        for (; j < n; j++) {
            y0[j] = out8(pw_1x1(x + j, xs, C, xzp, w0, b0), mult[o], shift[o], yzp, lo, hi);
            y1[j] = out8(pw_1x1(x + j, xs, C, xzp, w1, b1), mult[o + 1], shift[o + 1], yzp, lo, hi);
        }
    }
    for (; o < O; o++) {
        const int8_t *wo = w + (size_t)o * C;
        const int32_t bo = b != NULL ? b[o] : 0;
        int8_t *yo = y + (size_t)o * ys;
        uint32_t j = 0;
        for (; j + 4 <= n; j += 4) {
            int32_t s[4];
            pw_1x4(x + j, xs, C, xzp, wo, bo, s);
            for (int k = 0; k < 4; k++) {
                yo[j + k] = out8(s[k], mult[o], shift[o], yzp, lo, hi);
            }
        }
        for (; j < n; j++) {
            yo[j] = out8(pw_1x1(x + j, xs, C, xzp, wo, bo), mult[o], shift[o], yzp, lo, hi);
        }
    }
}

/* ---- windows: depthwise rows, and one input channel of any other conv ---- */

/* The sum of the taps of the window at `base` that lie in the rows (taps kx in [k0, k1)). */
MT_INLINE int32_t win_one(const int8_t *const *rows, const int8_t *const *wrows, int32_t nrows, int32_t base,
    int32_t k0, int32_t k1, int32_t dil, int32_t zp) {
    int32_t s = 0;
    for (int32_t r = 0; r < nrows; r++) {
        for (int32_t kx = k0; kx < k1; kx++) {
            s += ((int32_t)rows[r][base + kx * dil] - zp) * wrows[r][kx];
        }
    }
    return s;
}

/* acc[j] += sum_kx w[kx] * (x[j*sw + kx*dil] - zp), j < n: one kernel row over n outputs whose
 * taps all lie in the row (x: output 0's first tap). */
static void corr_row(int32_t *acc, const int8_t *x, int32_t n, const int8_t *w, int32_t KW, int32_t sw, int32_t dil,
    int32_t zp) {
    int32_t j = 0;
#if MT_DSP
    /* Two outputs at a time for the common kernels, dilation 1: the words at x + j*sw widened by
     * __sxtab16 (zero point off) give the bytes (0, 2) and (1, 3) of each word, the taps are paired
     * the same way, and __smlad adds two products of one output; a tap left over goes in with a
     * halfword multiply (__smlabb/__smlatb). Only full words inside the row are read: the last
     * outputs, whose words would reach past it, are summed below. */
    const uint32_t off = (uint32_t)(uint16_t)(int16_t)-zp * 0x10001u;
    if (dil == 1 && KW == 3 && sw == 1) {
        const int32_t w02 = (int32_t)((uint32_t)(uint16_t)w[0] | ((uint32_t)(uint16_t)w[2] << 16)), w1 = w[1];
        for (; j + 2 <= n; j += 2) {   /* reads x[j .. j+3]: output j+1's last tap is x[j+3] */
            const uint32_t v = read4(x + j);
            const int32_t e = (int32_t)__sxtab16(off, v), o = (int32_t)__sxtab16(off, ror8(v));
            acc[j] = __smlabb(o, w1, __smlad(e, w02, acc[j]));
            acc[j + 1] = __smlatb(e, w1, __smlad(o, w02, acc[j + 1]));
        }
    } else if (dil == 1 && KW == 3 && sw == 2) {
        const int32_t w02 = (int32_t)((uint32_t)(uint16_t)w[0] | ((uint32_t)(uint16_t)w[2] << 16)), w1 = w[1];
        for (; j + 2 <= n && 2 * j + 8 <= 2 * n + 1; j += 2) {   /* reads x[2j .. 2j+7]; needs x[2j .. 2j+4] */
            const uint32_t v = read4(x + 2 * j), u = read4(x + 2 * j + 4);
            const int32_t e = (int32_t)__sxtab16(off, v), o = (int32_t)__sxtab16(off, ror8(v));
            const int32_t f = (int32_t)__sxtab16(off, u);
            const int32_t m = (int32_t)(((uint32_t)e >> 16) | ((uint32_t)f << 16));   /* (x2, x4) */
            acc[j] = __smlabb(o, w1, __smlad(e, w02, acc[j]));
            acc[j + 1] = __smlatb(o, w1, __smlad(m, w02, acc[j + 1]));
        }
    } else if (dil == 1 && (KW == 5 || KW == 7) && sw == 1) {
        /* taps (0,2) (1,3) (4,6), and 5 on its own; a 5-tap row has w5 = w6 = 0 */
        const int32_t w02 = (int32_t)((uint32_t)(uint16_t)w[0] | ((uint32_t)(uint16_t)w[2] << 16));
        const int32_t w13 = (int32_t)((uint32_t)(uint16_t)w[1] | ((uint32_t)(uint16_t)w[3] << 16));
        const int32_t w46 = (int32_t)((uint32_t)(uint16_t)w[4] | (KW == 7 ? (uint32_t)(uint16_t)w[6] << 16 : 0u));
        const int32_t w5 = KW == 7 ? w[5] : 0;
        for (; j + 2 <= n && j + 8 <= n + KW - 1; j += 2) {   /* reads x[j .. j+7] */
            const uint32_t v = read4(x + j), u = read4(x + j + 4);
            const int32_t e = (int32_t)__sxtab16(off, v), o = (int32_t)__sxtab16(off, ror8(v));
            const int32_t f = (int32_t)__sxtab16(off, u), g = (int32_t)__sxtab16(off, ror8(u));
            const int32_t m = (int32_t)(((uint32_t)e >> 16) | ((uint32_t)f << 16));   /* (x2, x4) */
            /* output j: x0..x6 */
            int32_t a = __smlad(e, w02, acc[j]);
            a = __smlad(o, w13, a);
            a = __smlad(f, w46, a);
            acc[j] = __smlabb(g, w5, a);
            /* output j+1: x1..x7: (x1,x3)(w0,w2) (x2,x4)(w1,w3) (x5,x7)(w4,w6) x6 w5 */
            int32_t c = __smlad(o, w02, acc[j + 1]);
            c = __smlad(m, w13, c);
            c = __smlad(g, w46, c);
            acc[j + 1] = __smlatb(f, w5, c);
        }
    }
#endif
    for (; j + 2 <= n; j += 2) {   /* two outputs at a time: each weight read once for both */
        const int8_t *in = x + j * sw;
        int32_t a = acc[j], c = acc[j + 1];
        for (int32_t kx = 0; kx < KW; kx++) {
            const int32_t wv = w[kx];
            a += ((int32_t)in[kx * dil] - zp) * wv;
            c += ((int32_t)in[kx * dil + sw] - zp) * wv;
        }
        acc[j] = a;
        acc[j + 1] = c;
    }
    for (; j < n; j++) {
        const int8_t *in = x + j * sw;
        int32_t a = acc[j];
        for (int32_t kx = 0; kx < KW; kx++) {
            a += ((int32_t)in[kx * dil] - zp) * w[kx];
        }
        acc[j] = a;
    }
}

void mt_q8_win(const int8_t *const *rows, const int8_t *const *wrows, int32_t nrows, const mt_conv_geom_t *g,
    int32_t zp, int32_t ja, int32_t jb, int32_t *acc) {
    const int32_t W = (int32_t)g->W, KW = g->KW, sw = g->sw, dil = g->dw, pl = g->pl;
    /* outputs [i0, i1) have every tap inside the row; the others are summed with their taps clipped */
    int32_t i0, i1;
    mt_window_range(-pl, sw, (int32_t)g->OW, W - (KW - 1) * dil, &i0, &i1);
    if (W - (KW - 1) * dil < 1 || i1 <= i0) {
        i0 = i1 = jb;
    }
    i0 = i0 < ja ? ja : (i0 > jb ? jb : i0);
    i1 = i1 < i0 ? i0 : (i1 > jb ? jb : i1);
    for (int32_t j = ja; j < jb; j++) {
        if (j == i0) {
            j = i1;
            if (j >= jb) {
                break;
            }
        }
        const int32_t base = j * sw - pl;
        int32_t k0, k1;
        mt_window_range(base, dil, KW, W, &k0, &k1);
        acc[j - ja] += win_one(rows, wrows, nrows, base, k0, k1, dil, zp);
    }
    for (int32_t r = 0; r < nrows && i1 > i0; r++) {
        corr_row(acc + (i0 - ja), rows[r] + i0 * sw - pl, i1 - i0, wrows[r], KW, sw, dil, zp);
    }
}

#if MT_DSP
/* The taps of one kernel row as halfword pairs for __smlad (a tap past KW is 0): (w0, w2) (w1, w3)
 * (w4, w6), and w5 on its own. */
MT_INLINE void tap_pairs(const int8_t *w, int32_t KW, int32_t *p) {
    int8_t t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    memcpy(t, w, (size_t)KW);
    p[0] = (int32_t)((uint32_t)(uint16_t)t[0] | ((uint32_t)(uint16_t)t[2] << 16));
    p[1] = (int32_t)((uint32_t)(uint16_t)t[1] | ((uint32_t)(uint16_t)t[3] << 16));
    p[2] = (int32_t)((uint32_t)(uint16_t)t[4] | ((uint32_t)(uint16_t)t[6] << 16));
    p[3] = t[5];
}

/* (top of a, bottom of b) as one word */
MT_INLINE int32_t tops_bottoms(int32_t a, int32_t b) {
    return (int32_t)(((uint32_t)a >> 16) | ((uint32_t)b << 16));
}

/* The sums of outputs j and j+1 (*s0, *s1 added to) over the KH rows of a depthwise window of K
 * taps at stride S (K <= 7, S 1 or 2; compile-time constants where this is inlined): each row's
 * bytes widened in words by __sxtab16 (zero point off), pairs of taps per __smlad. Reads the
 * words at x + j*S + {0, 4, 8}: output j+1's last tap, and up to 7 bytes more for K > 3. */
MT_INLINE void dw_pair(const int8_t *const *rows, const int32_t (*wp)[4], int32_t KH, int32_t K, int32_t S,
    int32_t at, uint32_t off, int32_t *s0, int32_t *s1) {
    int32_t a = *s0, c = *s1;
#pragma GCC unroll 7
    for (int32_t r = 0; r < KH; r++) {
        const int8_t *x = rows[r] + at;
        const uint32_t v = read4(x);
        const int32_t e = (int32_t)__sxtab16(off, v), o = (int32_t)__sxtab16(off, ror8(v));
        if (K == 3 && S == 1) {   /* x0..x3 */
            a = __smlabb(o, wp[r][1], __smlad(e, wp[r][0], a));
            c = __smlatb(e, wp[r][1], __smlad(o, wp[r][0], c));
        } else if (S == 1) {      /* x0..x7: output j x0..x6, output j+1 x1..x7 */
            const uint32_t u = read4(x + 4);
            const int32_t f = (int32_t)__sxtab16(off, u), g = (int32_t)__sxtab16(off, ror8(u));
            a = __smlad(e, wp[r][0], a);
            a = __smlad(o, wp[r][1], a);
            a = __smlad(f, wp[r][2], a);
            a = __smlabb(g, wp[r][3], a);
            c = __smlad(o, wp[r][0], c);
            c = __smlad(tops_bottoms(e, f), wp[r][1], c);
            c = __smlad(g, wp[r][2], c);
            c = __smlatb(f, wp[r][3], c);
        } else if (K == 3) {      /* stride 2, x0..x7: output j x0..x2, output j+1 x2..x4 */
            const int32_t f = (int32_t)__sxtab16(off, read4(x + 4));
            a = __smlabb(o, wp[r][1], __smlad(e, wp[r][0], a));
            c = __smlatb(o, wp[r][1], __smlad(tops_bottoms(e, f), wp[r][0], c));
        } else {                  /* stride 2, x0..x11: output j x0..x6, output j+1 x2..x8 */
            const uint32_t u = read4(x + 4);
            const int32_t f = (int32_t)__sxtab16(off, u), g = (int32_t)__sxtab16(off, ror8(u));
            const int32_t h = (int32_t)__sxtab16(off, read4(x + 8));
            a = __smlad(e, wp[r][0], a);
            a = __smlad(o, wp[r][1], a);
            a = __smlad(f, wp[r][2], a);
            a = __smlabb(g, wp[r][3], a);
            c = __smlad(tops_bottoms(e, f), wp[r][0], c);
            c = __smlad(tops_bottoms(o, g), wp[r][1], c);
            c = __smlad(tops_bottoms(f, h), wp[r][2], c);
            c = __smlatb(g, wp[r][3], c);
        }
    }
    *s0 = a;
    *s1 = c;
}

/* bias + the sum of one output's taps that lie in the rows (kernel columns from the window's start
 * `base`, dilation 1): an output at the row's ends, whose window the pairs do not take. */
static int32_t dw_edge(const int8_t *const *rows, const int8_t *const *wrows, int32_t nrows, int32_t KW, int32_t base,
    int32_t W, int32_t zp, int32_t bias) {
    const int32_t k0 = base < 0 ? -base : 0, k1 = W - base < KW ? W - base : KW;
    return bias + win_one(rows, wrows, nrows, base, k0, k1, 1, zp);
}

/* What a depthwise row's outputs need besides their sums. */
typedef struct {
    int32_t pl, W, bias;
    uint32_t off;
    rq_t q;
    int8_t *y;
} dw_args_t;

/* Outputs [j, j1) of a depthwise row of a K x K kernel at stride S with its whole window in the
 * input, two at a time (dw_pair); returns the first output left (the last pairs, whose words
 * would reach past the row). K and S are constants in each instance below, so the row loop is
 * unrolled, and each instance is out of line so that the compiler keeps its loop in registers. */
MT_INLINE int32_t dw_pairs(const int8_t *const *rows, const int32_t (*wp)[4], int32_t K, int32_t S, int32_t j,
    int32_t j1, const dw_args_t *d) {
    const int32_t reach = K == 3 && S == 1 ? 4 : (K == 3 || S == 1 ? 8 : 12);   /* bytes read from a pair's start */
    const int32_t pl = d->pl, W = d->W, bias = d->bias;
    const rq_t q = d->q;
    int8_t *const y = d->y;
    for (; j + 2 <= j1 && j * S - pl + reach <= W; j += 2) {
        int32_t a = bias, c = bias;
        dw_pair(rows, wp, K, K, S, j * S - pl, d->off, &a, &c);
        y[j] = rq8(a, &q);
        y[j + 1] = rq8(c, &q);
    }
    return j;
}

#define MT_DW_PAIRS(K, S) \
    static __attribute__((noinline)) int32_t dw_pairs_##K##_##S(const int8_t *const *rows, const int32_t (*wp)[4], \
        int32_t j, int32_t j1, const dw_args_t *d) { \
        return dw_pairs(rows, wp, K, S, j, j1, d); \
    }
MT_DW_PAIRS(3, 1)
MT_DW_PAIRS(3, 2)
MT_DW_PAIRS(5, 1)
MT_DW_PAIRS(5, 2)
MT_DW_PAIRS(7, 1)
MT_DW_PAIRS(7, 2)
#endif

void mt_q8_dw(const int8_t *const *rows, const int8_t *const *wrows, int32_t nrows, const mt_conv_geom_t *g,
    int32_t zp, int32_t bias, int32_t mult, int32_t shift, int32_t yzp, int32_t lo, int32_t hi, int8_t *y) {
#if MT_DSP
    /* a whole window (every kernel row in the input) of 3 to 7 taps, dilation 1, stride 1 or 2:
     * the outputs whose taps lie in the row two at a time with their sums in registers, requantized
     * as they come; the others (the edges, the last pairs whose words would reach past the row) one
     * by one (dw_edge) */
    const int32_t KW = g->KW, sw = g->sw, W = (int32_t)g->W, OW = (int32_t)g->OW, pl = g->pl;
    rq_t q;
    if (nrows == g->KH && nrows == KW && (KW == 3 || KW == 5 || KW == 7) && g->dw == 1 && (sw == 1 || sw == 2)
        && fast_rq(mult, shift, yzp, lo, hi, &q)) {
        int32_t wp[7][4];
        for (int32_t r = 0; r < nrows; r++) {
            tap_pairs(wrows[r], KW, wp[r]);
        }
        int32_t i0, i1;
        mt_window_range(-pl, sw, OW, W - (KW - 1), &i0, &i1);
        if (W - (KW - 1) < 1 || i1 <= i0) {
            i0 = i1 = 0;
        }
        const dw_args_t d = {pl, W, bias, (uint32_t)(uint16_t)(int16_t)-zp * 0x10001u, q, y};
        const int32_t(*w4)[4] = (const int32_t(*)[4])wp;
        const int32_t j = KW == 3 ? (sw == 1 ? dw_pairs_3_1(rows, w4, i0, i1, &d) : dw_pairs_3_2(rows, w4, i0, i1, &d))
                        : KW == 5 ? (sw == 1 ? dw_pairs_5_1(rows, w4, i0, i1, &d) : dw_pairs_5_2(rows, w4, i0, i1, &d))
                                  : (sw == 1 ? dw_pairs_7_1(rows, w4, i0, i1, &d) : dw_pairs_7_2(rows, w4, i0, i1, &d));
        /* the rest: outputs [0, i0) and [j, OW), a handful at the row's ends, one by one */
        for (int32_t k = 0; k < i0; k++) {
            y[k] = rq8(dw_edge(rows, wrows, nrows, KW, k * sw - pl, W, zp, bias), &q);
        }
        for (int32_t k = j; k < OW; k++) {
            y[k] = rq8(dw_edge(rows, wrows, nrows, KW, k * sw - pl, W, zp, bias), &q);
        }
        return;
    }
#endif
    int32_t acc[MT_Q8_ROW];
    for (int32_t x0 = 0; x0 < (int32_t)g->OW; x0 += MT_Q8_ROW) {
        const int32_t n = mt_q8_chunk(acc, x0, (int32_t)g->OW, bias);
        mt_q8_win(rows, wrows, nrows, g, zp, x0, x0 + n, acc);
        mt_q8_store_row(y + x0, acc, n, mult, shift, yzp, lo, hi);
    }
}
