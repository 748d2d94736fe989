/* A weight matrix as stored in the checkpoint (no copy): a row-major [rows][cols] view with its
 * element type and, for the quantized types, its scales, in every format the DeepSeek family ships:
 *   BF16 / F16 / F32;
 *   FP8 E4M3 with block scales of any block shape [block_rows x block_cols], the blocks at the right
 *     and bottom edges partial, the scales F32 (scale_inv, V3's "_scale_inv") or UE8M0 (scale_e8m0,
 *     one byte 2^(e-127) each, V3.2 / V4's "scale");
 *   MXFP4: E2M1 values two per byte (column 2i in the low nibble, 2i+1 in the high; cols even, a row
 *     cols/2 bytes) with an E8M0 scale per 32 values of a row (block 1 x 32, scale_e8m0);
 *   I32 / I64 tables (V4's tid2eid hash routing), read with di_weight_get_i64.
 * The backend decides how to hold it: the CPU kernels read every format in place and dequantize in
 * registers; the CUDA backend dequantizes to bf16 at load for now (cuda_upload.cu). */
#ifndef DI_MODEL_WEIGHTS_H
#define DI_MODEL_WEIGHTS_H
#include <stdint.h>
#include <stddef.h>

typedef enum {
  DI_DT_F32 = 0, DI_DT_BF16, DI_DT_F16, DI_DT_F8E4M3, DI_DT_I32, DI_DT_I64,
  DI_DT_F4E2M1, /* MXFP4 values, packed two per byte */
  DI_DT_E8M0,   /* scale bytes 2^(e-127) (a scale tensor's type, not a weight's) */
  DI_DT_COUNT
} di_dtype;

/* Bytes per element (F4E2M1: 1, its packed pair; see di_weight_bytes). */
size_t di_dtype_size(di_dtype t);
const char *di_dtype_name(di_dtype t);

typedef struct di_weight {
  const char *name;          /* tensor name (owned by the archive or model) */
  di_dtype dtype;
  int64_t rows, cols;        /* 1-D tensors: rows = 1 */
  const void *data;          /* rows*cols elements */
  /* block scaling (FP8, MXFP4): w[r][c] = q[r][c] * scale[r / block_rows][c / block_cols], the scales
   * [ceil(rows / block_rows)][scale_cols] in one of two forms (exactly one set for FP8; MXFP4: E8M0) */
  const float *scale_inv;    /* F32 scales */
  const uint8_t *scale_e8m0; /* E8M0 scales: 2^(byte - 127) (255: NaN) */
  int block_rows, block_cols;
  int64_t scale_cols;        /* ceil(cols / block_cols) */
} di_weight;

/* Element (r, c) as float (slow path, for references and small conversions; integer tables as their
 * nearest float). */
float di_weight_get(const di_weight *w, int64_t r, int64_t c);
/* Element (r, c) of an I32 / I64 table, exactly (0 for other types). */
int64_t di_weight_get_i64(const di_weight *w, int64_t r, int64_t c);
/* The block scale of element (r, c) of an FP8 / MXFP4 weight (1 for the other types). */
float di_weight_scale(const di_weight *w, int64_t r, int64_t c);
/* Bytes of the stored values (without the scales). */
size_t di_weight_bytes(const di_weight *w);
/* Checks a weight's fields against its format (shape, packing, block shape, scales present); returns
 * 0, or -1 with a reason in *why. */
int di_weight_check_format(const di_weight *w, const char **why);
/* Copies rows [r0, r1) to float32 `out` ([r1-r0][cols]). */
void di_weight_rows_f32(const di_weight *w, int64_t r0, int64_t r1, float *out);
/* FP8 block scales are read as floats by the kernels: when the checkpoint's are not 4-byte aligned
 * (safetensors does not align tensors), points w at an aligned copy kept in the block chain *owned
 * (util/owned.h), released with it. Returns 0, or -1 when out of memory. */
int di_weight_align_scales(di_weight *w, void **owned);
/* --quantization fp8: a BF16 / F16 / F32 matrix becomes FP8 E4M3 with F32 block scales
 * (scale_inv = amax / 448 per block_rows x block_cols block: DeepSeek-V3's format), its data and scales
 * in the chain *owned; other dtypes are left as they are. Returns 0, or -1 when out of memory. */
int di_weight_quantize_fp8(di_weight *w, int block_rows, int block_cols, void **owned);
#endif
