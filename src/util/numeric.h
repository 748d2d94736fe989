/* Scalar conversions of the storage formats to float32: bf16, IEEE half, and FP8 E4M3 (the OCP
 * "fn" variant DeepSeek checkpoints use: no infinities, 0x7f/0xff are NaN, max 448). */
#ifndef DI_UTIL_NUMERIC_H
#define DI_UTIL_NUMERIC_H
#include <stdint.h>
#include <string.h>

static inline float di_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round-to-nearest-even float32 -> bf16 (NaN stays NaN). */
static inline uint16_t di_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

float di_f16_to_f32(uint16_t h);
uint16_t di_f32_to_f16(float f);
/* FP8 E4M3 (fn) lookup table, 256 entries. */
extern const float *di_fp8e4m3_table;
static inline float di_fp8e4m3_to_f32(uint8_t v) { return di_fp8e4m3_table[v]; }
/* E8M0 scale byte: 2^(e - 127); 255 is NaN. */
static inline float di_e8m0_to_f32(uint8_t e) {
  if (e == 255) return __builtin_nanf("");
  if (e == 0) return 0x1p-127f; /* the one subnormal */
  uint32_t u = (uint32_t)e << 23;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* FP4 E2M1 values of the 16 codes (sign in bit 3): 0, 0.5, 1, 1.5, 2, 3, 4, 6. */
extern const float di_e2m1_table[16];
/* Nearest E4M3 value to f, ties to even, saturating at +-448 (NaN: 0x7f): the GPU's
 * cvt.rn.satfinite; --quantization fp8, dummy FP8 weights, tests. */
uint8_t di_f32_to_fp8e4m3(float f);
/* --kv-cache-dtype fp8's rule for one token's latent x[0..R): per group g of 128 channels (the last one
 * possibly shorter), scales[g] = amax / 448 (1 for an all-zero group) and codes[c] =
 * di_f32_to_fp8e4m3(x[c] / scales[c / 128]). The CPU cache (cpu_deepseek.c) and the CUDA one
 * (k_kv8.cuh, tested against this function) follow it. */
void di_kv_fp8_quantize(const float *x, int R, float *scales, uint8_t *codes);
#endif
