/* See numeric.h. The FP8 table is built once at load time by a constructor. */
#include "util/numeric.h"
#include <math.h>

float di_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = ldexpf((float)man, -24);
    if (sign)
      f = -f;
    return f;
  }
  if (exp == 31) {
    uint32_t u = sign | 0x7f800000u | (man << 13);
    memcpy(&f, &u, 4);
    return f;
  }
  uint32_t u = sign | ((exp + 112) << 23) | (man << 13);
  memcpy(&f, &u, 4);
  return f;
}

uint16_t di_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  float a = fabsf(f);
  if (isnan(f))
    return 0x7e00;
  if (a >= 65520.0f)
    return sign | 0x7c00;
  if (a < 6.103515625e-05f) { /* subnormal: multiples of 2^-24 */
    return sign | (uint16_t)lrintf(a * 16777216.0f);
  }
  int e;
  float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5,1) */
  uint32_t mant = (uint32_t)lrintf((m * 2.0f - 1.0f) * 1024.0f);
  int exp = e - 1 + 15;
  if (mant == 1024) {
    mant = 0;
    exp++;
  }
  return sign | (uint16_t)(exp << 10) | (uint16_t)mant;
}

const float di_e2m1_table[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f,
                                   -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

static float g_fp8[256];
const float *di_fp8e4m3_table = g_fp8;

__attribute__((constructor)) static void build_fp8_table(void) {
  for (int v = 0; v < 256; v++) {
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float f;
    if (e == 15 && m == 7)
      f = NAN;
    else if (e == 0)
      f = ldexpf((float)m, -9); /* subnormal: m/8 * 2^-6 */
    else
      f = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    g_fp8[v] = s ? -f : f;
  }
}

uint8_t di_f32_to_fp8e4m3(float f) {
  /* round to nearest even on the bits (what cvt.rn.satfinite.e4m3 does on the GPU) */
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u)
    return 0x7f; /* NaN */
  if (u >= 0x43e00000u)
    return sign | 0x7e; /* >= 448: saturate */
  if (u < 0x3c800000u) /* below 2^-6: subnormals, steps of 2^-9 (8 steps: 0x08 is 2^-6 itself) */
    return sign | (uint8_t)nearbyintf(fabsf(f) * 512.0f);
  int e = (int)(u >> 23) - 127;
  uint32_t keep = (u >> 20) & 7, rem = u & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (keep & 1)))
    keep++;
  if (keep == 8) {
    keep = 0;
    e++;
  }
  return sign | (uint8_t)((e + 7) << 3 | keep);
}

void di_kv_fp8_quantize(const float *x, int R, float *scales, uint8_t *codes) {
  for (int g = 0; g * 128 < R; g++) {
    const int c1 = g * 128 + 128 < R ? g * 128 + 128 : R;
    float amax = 0.f;
    for (int c = g * 128; c < c1; c++) amax = fmaxf(amax, fabsf(x[c]));
    const float s = amax > 0.f ? amax / 448.f : 1.f;
    scales[g] = s;
    for (int c = g * 128; c < c1; c++) codes[c] = di_f32_to_fp8e4m3(x[c] / s);
  }
}
