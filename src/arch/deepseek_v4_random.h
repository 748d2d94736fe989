/* A DeepSeek-V4 model of random weights at a given configuration (the V4-Flash shape of
 * deepseek_v4_shapes.h in practice), for the CUDA benchmark (bench/bench_cuda_v4.c) and the kernel tests
 * (tests/cuda/test_cuda_v4_kernels.c: the backend's native formats against its bf16 upload at V4-Flash
 * shapes). Every matrix views one shared random buffer of its format (no per-matrix memory, so a 43 GB
 * model's worth of views costs the size of the largest matrix):
 *   bf16 (native 0): every matrix bf16;
 *   native 1: V4's checkpoint formats: FP8 E4M3 with 128 x 128 UE8M0 block scales for the attention
 *     projections (wq_a, wq_b, wkv, wo_a, wo_b) and the shared expert, MXFP4 (E2M1, 1 x 32 E8M0) for
 *     the routed experts, bf16 for the rest (embedding, head, compressors, indexer), f32 router and mHC.
 * The FP8 and MXFP4 values with power-of-two scales are exactly representable in bf16, so the backend's
 * bf16 upload of a native model holds the same weights. */
#ifndef DI_ARCH_DEEPSEEK_V4_RANDOM_H
#define DI_ARCH_DEEPSEEK_V4_RANDOM_H
#include "arch/deepseek_v4.h"
#include "util/status.h"

typedef struct di_v4_random_model {
  di_v4_config c;
  di_v4_weights w;
  di_v4_layer *layers;
  di_weight *experts; /* [3][E]: w1, w2, w3 */
  void *buf[9];       /* the shared buffers */
} di_v4_random_model;

/* c: the configuration (copied); seed: the random buffers' seed. */
di_status di_v4_random_model_init(di_v4_random_model *m, const di_v4_config *c, int native, uint64_t seed);
void di_v4_random_model_free(di_v4_random_model *m);
/* Bytes of weights one token's decode step reads at batch 1 in the device layout the CUDA backend gives
 * this model (native formats: FP8 1 byte + a 4-byte scale per row per 128 columns, MXFP4 half a byte + a
 * scale byte per 32): every layer's attention, compressors, indexer, router and mHC, top_k routed + 1
 * shared expert, the head (one row of the embedding). The weight-read roofline is this over HBM bandwidth. */
double di_v4_random_model_step_bytes(const di_v4_random_model *m, int native);
#endif
