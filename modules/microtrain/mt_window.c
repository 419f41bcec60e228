/* microtrain core: sliding-window geometry, shared by convolution and pooling.
 * Windows are clipped to the input with these ranges, so padding is never read
 * and no inner loop tests a bound. */
#include "mt_core.h"

int64_t mt_out_extent(int64_t in, int64_t pad0, int64_t pad1, int64_t k, int64_t dil, int64_t stride, int ceil) {
    int64_t eff = dil * (k - 1) + 1;
    int64_t span = in + pad0 + pad1 - eff;
    if (span < (ceil ? 1 - stride : 0)) {   /* ceil_mode keeps a window hanging past the padded input */
        return -1;
    }
    return (ceil ? (span + stride - 1) / stride : span / stride) + 1;
}
