/* What the CUDA kernel tests share for their random inputs: one xorshift64 stream per test file
 * (the file defines CUT_RNG_SEED before including this, so its inputs stay the ones it always drew),
 * uniform and roughly normal draws, bf16 arrays of them, and a device copy of a host array.
 * Header-only (static inline): each test is its own executable. */
#ifndef DI_CUDA_TEST_RAND_H
#define DI_CUDA_TEST_RAND_H
#include <stdint.h>
#include <stdlib.h>
#include "backend/cuda/cuda_kernels.h"
#include "util/numeric.h"

static uint64_t rng_s = CUT_RNG_SEED;
static inline double urand(void) { /* [0, 1) */
  rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
  return (double)(rng_s >> 11) / 9007199254740992.0;
}
/* the sum of three uniforms, centred and scaled: in (-3, 3), bell-shaped */
static inline float nrand(void) { return (float)((urand() + urand() + urand() - 1.5) * 2.0); }
static inline uint16_t *rand_bf16(size_t n, float scale) {
  uint16_t *v = malloc(n * 2);
  for (size_t i = 0; i < n; i++) v[i] = di_f32_to_bf16(nrand() * scale);
  return v;
}
/* a device copy of h (bytes long; h NULL: uninitialised) */
static inline void *dup_dev(const void *h, size_t bytes) {
  void *d = di_cut_malloc(bytes);
  if (d && h) di_cut_h2d(d, h, bytes);
  return d;
}
#endif
