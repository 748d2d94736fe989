/* Element access for di_weight (see weights.h): the slow, obviously-correct path used by
 * references, tests and one-time conversions at load. */
#include "model/weights.h"
#include "util/numeric.h"
#include "util/owned.h"
#include <string.h>

int di_weight_align_scales(di_weight *w, void **owned) { /* (E8M0 scales are bytes: never misaligned) */
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
  case DI_DT_F4E2M1: return 1;
  case DI_DT_E8M0: return 1;
  default: return 0;
  }
}

const char *di_dtype_name(di_dtype t) {
  static const char *names[] = {"F32", "BF16", "F16", "F8_E4M3", "I32", "I64", "F4_E2M1", "F8_E8M0"};
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

float di_weight_scale(const di_weight *w, int64_t r, int64_t c) {
  if (w->dtype != DI_DT_F8E4M3 && w->dtype != DI_DT_F4E2M1) return 1.0f;
  const int64_t s = (r / w->block_rows) * w->scale_cols + c / w->block_cols;
  return w->scale_e8m0 ? di_e8m0_to_f32(w->scale_e8m0[s]) : ld_f32(w->scale_inv, s);
}

int64_t di_weight_get_i64(const di_weight *w, int64_t r, int64_t c) {
  int64_t i = r * w->cols + c;
  if (w->dtype == DI_DT_I64) {
    int64_t v;
    memcpy(&v, (const char *)w->data + 8 * i, 8);
    return v;
  }
  if (w->dtype == DI_DT_I32) {
    int32_t v;
    memcpy(&v, (const char *)w->data + 4 * i, 4);
    return v;
  }
  return 0;
}

float di_weight_get(const di_weight *w, int64_t r, int64_t c) {
  int64_t i = r * w->cols + c;
  switch (w->dtype) {
  case DI_DT_F32: return ld_f32(w->data, i);
  case DI_DT_BF16: return di_bf16_to_f32(ld_u16(w->data, i));
  case DI_DT_F16: return di_f16_to_f32(ld_u16(w->data, i));
  case DI_DT_F8E4M3: return di_fp8e4m3_to_f32(((const uint8_t *)w->data)[i]) * di_weight_scale(w, r, c);
  case DI_DT_F4E2M1: {
    const uint8_t byte = ((const uint8_t *)w->data)[r * (w->cols / 2) + c / 2];
    return di_e2m1_table[(c & 1) ? byte >> 4 : byte & 15] * di_weight_scale(w, r, c);
  }
  case DI_DT_I32:
  case DI_DT_I64: return (float)di_weight_get_i64(w, r, c);
  default: return 0.0f;
  }
}

size_t di_weight_bytes(const di_weight *w) {
  if (w->dtype == DI_DT_F4E2M1) return (size_t)w->rows * (size_t)(w->cols / 2);
  return (size_t)w->rows * (size_t)w->cols * di_dtype_size(w->dtype);
}

int di_weight_check_format(const di_weight *w, const char **why) {
  const char *r = NULL;
  if (w->rows < 0 || w->cols < 0 || (unsigned)w->dtype >= DI_DT_COUNT || w->dtype == DI_DT_E8M0)
    r = "bad shape or dtype";
  else if (w->dtype == DI_DT_F8E4M3 || w->dtype == DI_DT_F4E2M1) {
    if (w->block_rows <= 0 || w->block_cols <= 0)
      r = "block shape missing";
    else if (w->scale_cols != (w->cols + w->block_cols - 1) / w->block_cols)
      r = "scale_cols is not ceil(cols / block_cols)";
    else if (!w->scale_inv == !w->scale_e8m0)
      r = "needs exactly one of F32 and E8M0 scales";
    else if (w->dtype == DI_DT_F4E2M1 && (w->cols % 2 || w->block_rows != 1 || w->block_cols != 32 || !w->scale_e8m0))
      r = "MXFP4 needs an even column count and E8M0 scales per 1 x 32 block";
  } else if (w->scale_inv || w->scale_e8m0)
    r = "scales on an unscaled type";
  if (why) *why = r;
  return r ? -1 : 0;
}

void di_weight_rows_f32(const di_weight *w, int64_t r0, int64_t r1, float *out) {
  for (int64_t r = r0; r < r1; r++)
    for (int64_t c = 0; c < w->cols; c++)
      *out++ = di_weight_get(w, r, c);
}
