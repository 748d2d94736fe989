/* Element access for di_weight (see weights.h): the slow, obviously-correct path used by
 * references, tests and one-time conversions at load. */
#include "model/weights.h"
#include "util/numeric.h"
#include "util/owned.h"
#include <string.h>

int di_weight_align_scales(di_weight *w, void **owned) {
  if (!w->scale_inv || !((uintptr_t)w->scale_inv & 3))
    return 0;
  size_t n = (size_t)((w->rows + w->block_rows - 1) / w->block_rows) * (size_t)w->scale_cols;
  float *copy = di_owned_alloc(owned, n * sizeof(float));
  if (!copy)
    return -1;
  memcpy(copy, w->scale_inv, n * sizeof(float));
  w->scale_inv = copy;
  return 0;
}

size_t di_dtype_size(di_dtype t) {
  switch (t) {
  case DI_DT_F32: return 4;
  case DI_DT_BF16: return 2;
  case DI_DT_F16: return 2;
  case DI_DT_F8E4M3: return 1;
  case DI_DT_I32: return 4;
  case DI_DT_I64: return 8;
  default: return 0;
  }
}

const char *di_dtype_name(di_dtype t) {
  static const char *names[] = {"F32", "BF16", "F16", "F8_E4M3", "I32", "I64"};
  return (unsigned)t < DI_DT_COUNT ? names[t] : "?";
}

/* Checkpoint data need not be aligned (safetensors headers are not always padded): load through
 * memcpy, which compiles to a plain load. */
static inline float ld_f32(const void *p, int64_t i) {
  float v;
  memcpy(&v, (const char *)p + 4 * i, 4);
  return v;
}
static inline uint16_t ld_u16(const void *p, int64_t i) {
  uint16_t v;
  memcpy(&v, (const char *)p + 2 * i, 2);
  return v;
}

float di_weight_get(const di_weight *w, int64_t r, int64_t c) {
  int64_t i = r * w->cols + c;
  switch (w->dtype) {
  case DI_DT_F32: return ld_f32(w->data, i);
  case DI_DT_BF16: return di_bf16_to_f32(ld_u16(w->data, i));
  case DI_DT_F16: return di_f16_to_f32(ld_u16(w->data, i));
  case DI_DT_F8E4M3:
    return di_fp8e4m3_to_f32(((const uint8_t *)w->data)[i]) *
           w->scale_inv[(r / w->block_rows) * w->scale_cols + c / w->block_cols];
  default: return 0.0f;
  }
}

void di_weight_rows_f32(const di_weight *w, int64_t r0, int64_t r1, float *out) {
  for (int64_t r = r0; r < r1; r++)
    for (int64_t c = 0; c < w->cols; c++)
      *out++ = di_weight_get(w, r, c);
}
