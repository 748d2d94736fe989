/* A weight matrix as stored in the checkpoint (no copy): a row-major [rows][cols] view with its
 * element type, and for FP8 the block scales. The CPU kernels read these directly and dequantize in
 * registers; the CUDA backend uploads them. */
#ifndef DI_MODEL_WEIGHTS_H
#define DI_MODEL_WEIGHTS_H
#include <stdint.h>
#include <stddef.h>

typedef enum { DI_DT_F32 = 0, DI_DT_BF16, DI_DT_F16, DI_DT_F8E4M3, DI_DT_I32, DI_DT_I64, DI_DT_COUNT } di_dtype;

size_t di_dtype_size(di_dtype t);
const char *di_dtype_name(di_dtype t);

typedef struct di_weight {
  const char *name;          /* tensor name (owned by the archive or model) */
  di_dtype dtype;
  int64_t rows, cols;        /* 1-D tensors: rows = 1 */
  const void *data;          /* rows*cols elements */
  /* FP8 block scaling: w[r][c] = q[r][c] * scale_inv[r / block_rows][c / block_cols] */
  const float *scale_inv;    /* NULL unless dtype == DI_DT_F8E4M3 */
  int block_rows, block_cols;
  int64_t scale_cols;        /* ceil(cols / block_cols) */
} di_weight;

/* Element (r, c) as float (slow path, for references and small conversions). */
float di_weight_get(const di_weight *w, int64_t r, int64_t c);
/* Copies rows [r0, r1) to float32 `out` ([r1-r0][cols]). */
void di_weight_rows_f32(const di_weight *w, int64_t r0, int64_t r1, float *out);
/* FP8 block scales are read as floats by the kernels: when the checkpoint's are not 4-byte aligned
 * (safetensors does not align tensors), points w at an aligned copy kept in the block chain *owned
 * (util/owned.h), released with it. Returns 0, or -1 when out of memory. */
int di_weight_align_scales(di_weight *w, void **owned);
#endif
