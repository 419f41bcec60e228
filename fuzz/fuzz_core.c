/* microtrain fuzzing: libFuzzer's entry point. The input is a plan; if the core
 * loads it, the harness attaches exactly the RAM it asks for (a heap block of
 * that size, so AddressSanitizer sees any access past it; the runtime context read from
 * the plan or, for half the plans, decoded into RAM), then uses every entry
 * point a binding can call: a few training steps, predict, single ops,
 * parameters, checkpoints, reset, error texts and introspection. The plan
 * bytes must come out unchanged: the core only reads them.
 *
 * Built by fuzz/run.py with clang -fsanitize=fuzzer,address,undefined; with
 * -DMT_FUZZ_MAIN it is a plain program that runs the files named on its
 * command line (the regression runner for environments without libFuzzer).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mt.h"

/* plans that need more RAM than this load and are refused at attach by the
 * harness: their kernels would run for minutes, which finds nothing */
#ifndef FUZZ_RAM_CAP
#define FUZZ_RAM_CAP (256u * 1024u)
#endif

static void text(const mt_ctx_t *ctx, int err) {
    char buf[96];
    size_t n = mt_error_text(ctx, err, buf, sizeof buf);
    if (n >= sizeof buf || buf[n] != '\0') {
        abort();
    }
}

static float *floats(uint32_t n, uint32_t seed) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (uint32_t i = 0; i < n; i++) {
        x[i] = (float)((i * 7u + seed) % 11u) / 11.0f - 0.5f;
    }
    return x;
}

static void exercise(mt_ctx_t *ctx) {
    uint32_t n_in = mt_input_len(ctx), n_out = mt_output_len(ctx), n_t = mt_target_len(ctx);
    float *x = floats(n_in, 3), *t = floats(n_t, 5), *out = floats(n_out, 0), loss;
    mt_info_t info;
    for (uint32_t s = 0; s < 3; s++) {
        int err = ctx->loss_kind == MT_LOSS_MSE ? mt_step_target(ctx, x, n_in, t, n_t, &loss)
                                                : mt_step_label(ctx, x, n_in, (int32_t)(s % (n_out ? n_out : 1)), &loss);
        text(ctx, err);
    }
    text(ctx, mt_predict(ctx, x, n_in, out, n_out));
    text(ctx, mt_set_input(ctx, x, n_in));
    for (uint32_t i = 0; i < ctx->n_ops; i++) {
        text(ctx, mt_run_op(ctx, i));
    }
    mt_info(ctx, &info);
    for (uint32_t k = 0; k < mt_param_count(ctx); k++) {
        mt_tensor_info_t ti;
        if (mt_param_info(ctx, k, &ti) == MT_OK) {
            float *copy = malloc(ti.n * sizeof(float));   /* an int8 parameter reads as floats too */
            text(ctx, mt_get_param(ctx, k, copy, ti.n));
            text(ctx, mt_set_param(ctx, k, copy, ti.n));
            free(copy);
        }
    }
    uint32_t n_state = mt_state_size(ctx);
    uint8_t *blob = malloc(n_state ? n_state : 1);
    if (mt_save_state(ctx, blob, n_state) == MT_OK) {
        text(ctx, mt_load_state(ctx, blob, n_state));
    }
    free(blob);
    text(ctx, mt_set_lr(ctx, 0.5f));
    text(ctx, mt_reset(ctx));
    text(ctx, mt_predict(ctx, x, n_in, out, n_out));
    free(x);
    free(t);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *plan = malloc(size ? size : 1);   /* malloc: aligned for the core, bounded for ASan */
    memcpy(plan, data, size);
    mt_ctx_t ctx;
    int err = mt_load(&ctx, plan, size);
    text(&ctx, err);
    if (err == MT_OK) {
        mt_info_t info;
        mt_info(&ctx, &info);
        for (uint32_t i = 0; i < ctx.n_tensors; i++) {
            mt_tensor_info_t ti;
            text(&ctx, mt_tensor_info(&ctx, i, &ti));
        }
        if (ctx.plan_crc & 1u) {   /* half the plans with a context section: decoded into RAM instead */
            text(&ctx, mt_context_in_ram(&ctx));
        }
        uint32_t ram_bytes = mt_ram_bytes(&ctx);
        if (ram_bytes <= FUZZ_RAM_CAP) {
            uint8_t *ram = malloc(ram_bytes ? ram_bytes : 1);
            err = mt_attach(&ctx, ram, ram_bytes);
            text(&ctx, err);
            if (err == MT_OK) {
                exercise(&ctx);
            }
            free(ram);
        }
    }
    if (memcmp(plan, data, size) != 0) {
        abort();   /* the core wrote into the plan */
    }
    free(plan);
    return 0;
}

#ifdef MT_FUZZ_MAIN
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (f == NULL) {
            perror(argv[i]);
            return 2;
        }
        static uint8_t buf[1 << 22];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
    }
    return 0;
}
#endif
