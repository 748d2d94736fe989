/* libFuzzer target: binding low-precision weights from a safetensors image, as the loaders do. Input:
 * two bytes (the FP8 block shape the config would give: rows, cols; 0 = none), then the image.
 *   - FP8 (and every other dtype): each 1-D / 2-D tensor through di_tensor_source_weight with its own
 *     shape, the loaders' binder (dtype, shape, the `_scale_inv` tensor's dtype and shape for the
 *     block size). A weight it binds must pass di_weight_check_format, and every element of it (up to
 *     4,096, then the corners) is read through di_weight_get: a scale or value pointer bound outside
 *     the input is an ASan report, since libFuzzer's buffer is exactly the input.
 *   - MXFP4 as the loader binds it (V4 checkpoints): each 2-D I8 / U8 tensor [rows][n] also through
 *     di_tensor_source_weight as a weight of rows x 2n values, which takes it as packed E2M1 pairs with
 *     the F8_E8M0 scales `NAME_scale_inv` or `STEM.scale` [rows][ceil(2n / 32)]; a bound one is checked
 *     and read as above (dequantization of the nibbles and the scales).
 *   - MXFP4 as the kernels' layout (the target's own pairing, kept for its seeds): a U8 tensor
 *     NAME_blocks [rows][cols / 2] with NAME_scales U8 [rows][ceil(cols / 32)] becomes an F4E2M1
 *     weight with E8M0 scales per 1 x 32 block; di_weight_check_format decides, and an accepted one is
 *     read whole.
 * Replayed by tests/model/test_weights_fuzz_corpus.c. */
#include "model/safetensors.h"
#include "model/weights.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* what the last input bound (read by the replay test, which checks the seeds it knows) */
static int fuzz_weights_fp8, fuzz_weights_mxfp4, fuzz_weights_mxfp4_loader;

/* reads w: every element when small, else its four corners; the sum keeps the reads alive */
static float read_weight(const di_weight *w) {
  float acc = 0;
  if (w->rows * w->cols <= 4096) {
    for (int64_t r = 0; r < w->rows; r++)
      for (int64_t c = 0; c < w->cols; c++) acc += di_weight_get(w, r, c);
  } else if (w->rows > 0 && w->cols > 0) {
    acc = di_weight_get(w, 0, 0) + di_weight_get(w, w->rows - 1, w->cols - 1) + di_weight_get(w, 0, w->cols - 1) +
          di_weight_get(w, w->rows - 1, 0);
  }
  return acc;
}

/* Binds tensor t as a rows x cols weight the way the loaders do; a bound weight must be well-formed,
 * inside t's bytes (and its E8M0 scales inside theirs), and is read. Returns 1 when it bound. */
static int bind_one(const di_st_file *f, const di_tensor_source *src, const di_st_tensor *t, int64_t rows, int64_t cols, const int block[2],
                    volatile float *sink) {
  di_weight w;
  if (di_tensor_source_weight(src, t->name, rows, cols, block, &w) != DI_OK) return 0;
  const char *why = NULL;
  if (di_weight_check_format(&w, &why) != 0) {
    fprintf(stderr, "bound weight '%s' is ill-formed: %s\n", t->name, why);
    __builtin_trap();
  }
  if (di_weight_bytes(&w) > t->nbytes) __builtin_trap(); /* values past the tensor's bytes */
  if (w.scale_inv || w.scale_e8m0) { /* the scales lie inside one tensor of the image */
    const uint8_t *sp = w.scale_e8m0 ? w.scale_e8m0 : (const uint8_t *)w.scale_inv;
    const size_t need = (size_t)((w.rows + w.block_rows - 1) / w.block_rows) * (size_t)w.scale_cols *
                        (w.scale_e8m0 ? 1 : sizeof(float));
    int inside = 0;
    for (int k = 0; k < f->n_tensors && !inside; k++) {
      const uint8_t *d = f->tensors[k].data;
      inside = sp >= d && need <= f->tensors[k].nbytes && (size_t)(sp - d) <= f->tensors[k].nbytes - need;
    }
    if (!inside) __builtin_trap();
  }
  fuzz_weights_fp8 += w.dtype == DI_DT_F8E4M3;
  fuzz_weights_mxfp4_loader += w.dtype == DI_DT_F4E2M1;
  *sink += read_weight(&w);
  return 1;
}

static void bind_all(const di_st_file *f, const di_tensor_source *src, const int block[2], volatile float *sink) {
  for (int i = 0; i < f->n_tensors; i++) {
    const di_st_tensor *t = &f->tensors[i];
    if (t->ndim < 1 || t->ndim > 2) continue;
    const int64_t rows = t->ndim == 2 ? t->shape[0] : 0, cols = t->shape[t->ndim - 1];
    bind_one(f, src, t, rows, cols, block, sink);
    /* packed bytes: also as the MXFP4 weight of twice the columns a V4 config would name */
    if (t->ndim == 2 && (strcmp(t->dtype_name, "U8") == 0 || strcmp(t->dtype_name, "I8") == 0) && cols <= INT64_MAX / 2)
      bind_one(f, src, t, rows, cols * 2, block, sink);
  }
}

static void mxfp4_pairs(const di_st_file *f, const di_tensor_source *src, volatile float *sink) {
  for (int i = 0; i < f->n_tensors; i++) {
    const di_st_tensor *b = &f->tensors[i];
    const size_t n = strlen(b->name);
    if (n < 8 || strcmp(b->name + n - 7, "_blocks") != 0 || b->ndim != 2 || strcmp(b->dtype_name, "U8") != 0) continue;
    char sname[1024];
    snprintf(sname, sizeof sname, "%.*s_scales", (int)(n - 7), b->name);
    const di_st_tensor *s = di_tensor_source_find(src, sname);
    if (!s || s->ndim != 2 || strcmp(s->dtype_name, "U8") != 0 || s->shape[0] != b->shape[0]) continue;
    if (b->shape[1] > INT64_MAX / 2) continue;
    di_weight w = {.name = b->name, .dtype = DI_DT_F4E2M1, .rows = b->shape[0], .cols = b->shape[1] * 2,
                   .data = b->data, .scale_e8m0 = s->data, .block_rows = 1, .block_cols = 32, .scale_cols = s->shape[1]};
    const char *why = NULL;
    if (di_weight_check_format(&w, &why) != 0) continue;
    /* the format check accepted the shape: the scale tensor holds one byte per 1 x 32 block */
    if ((size_t)w.rows * (size_t)w.scale_cols > s->nbytes || di_weight_bytes(&w) > b->nbytes) __builtin_trap();
    fuzz_weights_mxfp4++;
    *sink += read_weight(&w);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_weights_fp8 = fuzz_weights_mxfp4 = fuzz_weights_mxfp4_loader = 0;
  if (size < 2) return 0;
  const int block[2] = {data[0], data[1]};
  di_tensor_source *src = NULL;
  if (di_tensor_source_from_memory(data + 2, size - 2, "fuzz", &src) != DI_OK) return 0;
  di_st_file f; /* the same image parsed again for the list of names (the source keeps its own) */
  if (di_st_parse(data + 2, size - 2, "fuzz", &f) != DI_OK) __builtin_trap(); /* the source parsed it */
  volatile float sink = 0;
  bind_all(&f, src, block, &sink);
  mxfp4_pairs(&f, src, &sink);
  di_st_file_close(&f);
  di_tensor_source_free(src);
  return 0;
}
