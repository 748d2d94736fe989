/* --quantization fp8: a BF16 / F16 / F32 weight matrix quantized in place of its view to FP8 E4M3 with
 * F32 block scales, in DeepSeek-V3's checkpoint format (w ~= q * scale_inv per block_rows x
 * block_cols block, scale_inv = amax / 448, the edge blocks partial), so every backend then runs it as
 * it runs a shipped FP8 checkpoint. Values round to nearest even and saturate (di_f32_to_fp8e4m3). */
#include "model/weights.h"
#include "util/numeric.h"
#include "util/owned.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Row r of w as floats (the three dtypes this takes, read directly: di_weight_get per element is
 * too slow for a whole model). */
static void row_f32(const di_weight *w, int64_t r, float *out) {
  const int64_t C = w->cols;
  if (w->dtype == DI_DT_BF16) {
    const uint16_t *p = (const uint16_t *)w->data + r * C;
    for (int64_t c = 0; c < C; c++) out[c] = di_bf16_to_f32(p[c]);
  } else if (w->dtype == DI_DT_F16) {
    const uint16_t *p = (const uint16_t *)w->data + r * C;
    for (int64_t c = 0; c < C; c++) out[c] = di_f16_to_f32(p[c]);
  } else {
    memcpy(out, (const float *)w->data + r * C, sizeof(float) * (size_t)C);
  }
}

int di_weight_quantize_fp8(di_weight *w, int block_rows, int block_cols, void **owned) {
  if (w->dtype != DI_DT_BF16 && w->dtype != DI_DT_F16 && w->dtype != DI_DT_F32)
    return 0; /* already quantized (or not a float matrix): left as stored */
  if (!w->data || w->rows <= 0 || w->cols <= 0 || block_rows <= 0 || block_cols <= 0)
    return 0;
  const int64_t R = w->rows, C = w->cols, sr = (R + block_rows - 1) / block_rows, sc = (C + block_cols - 1) / block_cols;
  uint8_t *q = di_owned_alloc(owned, (size_t)(R * C));
  float *scale = di_owned_alloc(owned, sizeof(float) * (size_t)(sr * sc));
  float *buf = malloc(sizeof(float) * (size_t)(block_rows * C));
  float *amax = malloc(sizeof(float) * (size_t)sc);
  if (!q || !scale || !buf || !amax) {
    free(buf);
    free(amax);
    return -1;
  }
  for (int64_t br = 0; br < sr; br++) {
    const int64_t r0 = br * block_rows, n = R - r0 < block_rows ? R - r0 : block_rows;
    for (int64_t i = 0; i < n; i++) row_f32(w, r0 + i, buf + i * C);
    for (int64_t j = 0; j < sc; j++) amax[j] = 0.f;
    for (int64_t i = 0; i < n; i++)
      for (int64_t c = 0; c < C; c++) {
        const float a = fabsf(buf[i * C + c]);
        if (a > amax[c / block_cols]) amax[c / block_cols] = a;
      }
    for (int64_t j = 0; j < sc; j++) scale[br * sc + j] = amax[j] > 0.f ? amax[j] / 448.f : 1.f;
    for (int64_t i = 0; i < n; i++)
      for (int64_t c = 0; c < C; c++)
        q[(r0 + i) * C + c] = di_f32_to_fp8e4m3(buf[i * C + c] / scale[br * sc + c / block_cols]);
  }
  free(buf);
  free(amax);
  w->dtype = DI_DT_F8E4M3;
  w->data = q;
  w->scale_inv = scale;
  w->scale_e8m0 = NULL;
  w->block_rows = block_rows;
  w->block_cols = block_cols;
  w->scale_cols = sc;
  return 0;
}
