/* The weight formats of the DeepSeek family as di_weight holds them (model/weights.h), read by the CPU
 * backend in place: FP8 E4M3 with F32 or UE8M0 block scales of several block shapes (128 x 128, 1 x 32,
 * 64 x 16, an odd 3 x 5 that takes the scalar path) with partial blocks at the right and bottom edges,
 * MXFP4 (E2M1 pairs, E8M0 scale per 32 values, a partial last block), and I64 / I32 tables. Fresh
 * random codes; the reference is a float64 dequantization written here from the formats' definitions
 * (not the library's tables). Element access must be exact (the float64 value rounded once to float32,
 * which for power-of-two scales is no rounding at all); di_cpu_gemm (1, 3 and 11 activation rows:
 * the one-row, tile and panel paths, 2 threads) within 1e-5 relative L2 of the float64 product. And an
 * FP8 tensor with F8_E8M0 block scales in a safetensors file is bound with its scales as stored, under
 * transformers' scale name (`w_scale_inv`) and DeepSeek's (`<stem>.scale`), and an MXFP4 one as V4
 * checkpoints store it (I8 / U8 pairs, `<stem>.scale` E8M0), each wrong form refused with a message. */
#include "backend/cpu/cpu_gemm.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "util/threadpool.h"
#include "test_util.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t g_s = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  g_s ^= g_s << 13; g_s ^= g_s >> 7; g_s ^= g_s << 17;
  return (uint32_t)(g_s >> 32);
}

/* the formats, from their definitions */
static double ref_e4m3(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  double f = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
  return s ? -f : f;
}
static double ref_e8m0(uint8_t e) { return ldexp(1.0, (int)e - 127); }
static double ref_e2m1(uint8_t v) {
  const int s = (v >> 3) & 1, e = (v >> 1) & 3, m = v & 1;
  double f = e == 0 ? m * 0.5 : ldexp(1.0 + m / 2.0, e - 1);
  return s ? -f : f;
}

typedef struct {
  di_weight w;
  void *data, *scales;
  double *deq; /* [rows][cols] float64 dequantization */
} fmt_weight;

/* An FP8 weight (e8m0: UE8M0 scales, else F32) or, with mxfp4, an MXFP4 one (block 1 x 32). */
static fmt_weight make(int64_t R, int64_t C, int br, int bc, int e8m0, int mxfp4) {
  fmt_weight t;
  memset(&t, 0, sizeof t);
  t.w.name = "fmt";
  t.w.dtype = mxfp4 ? DI_DT_F4E2M1 : DI_DT_F8E4M3;
  t.w.rows = R;
  t.w.cols = C;
  t.w.block_rows = br;
  t.w.block_cols = bc;
  t.w.scale_cols = (C + bc - 1) / bc;
  const int64_t SR = (R + br - 1) / br, SC = t.w.scale_cols;
  double *sd = malloc(sizeof(double) * (size_t)(SR * SC));
  if (e8m0) {
    uint8_t *s = malloc((size_t)(SR * SC));
    for (int64_t i = 0; i < SR * SC; i++) {
      s[i] = (uint8_t)(127 - 12 + rnd() % 16); /* 2^-12 .. 2^3 */
      sd[i] = ref_e8m0(s[i]);
    }
    t.scales = s;
    t.w.scale_e8m0 = s;
  } else {
    float *s = malloc(sizeof(float) * (size_t)(SR * SC));
    for (int64_t i = 0; i < SR * SC; i++) {
      s[i] = (float)((rnd() % 1000 + 1) * 1e-5);
      sd[i] = s[i];
    }
    t.scales = s;
    t.w.scale_inv = s;
  }
  t.deq = malloc(sizeof(double) * (size_t)(R * C));
  if (mxfp4) {
    uint8_t *q = malloc((size_t)(R * C / 2));
    for (int64_t i = 0; i < R * C / 2; i++) q[i] = (uint8_t)rnd();
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) {
        uint8_t byte = q[r * (C / 2) + c / 2];
        t.deq[r * C + c] = ref_e2m1((c & 1) ? byte >> 4 : byte & 15) * sd[(r / br) * SC + c / bc];
      }
    t.data = q;
  } else {
    uint8_t *q = malloc((size_t)(R * C));
    for (int64_t i = 0; i < R * C; i++) {
      uint8_t v;
      do v = (uint8_t)rnd(); while ((v & 0x7f) == 0x7f); /* no NaN codes */
      q[i] = v;
    }
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) t.deq[r * C + c] = ref_e4m3(q[r * C + c]) * sd[(r / br) * SC + c / bc];
    t.data = q;
  }
  t.w.data = t.data;
  free(sd);
  return t;
}

static void check(di_threadpool *tp, fmt_weight *t, const char *label) {
  const di_weight *w = &t->w;
  const char *why = NULL;
  CHECKF(di_weight_check_format(w, &why) == 0, "%s: %s", label, why ? why : "");
  int64_t bad = 0;
  for (int64_t r = 0; r < w->rows; r++)
    for (int64_t c = 0; c < w->cols; c++)
      if (di_weight_get(w, r, c) != (float)t->deq[r * w->cols + c]) bad++; /* one rounding (none: E8M0) */
  CHECKF(bad == 0, "%s: %lld elements differ from the float64 dequantization", label, (long long)bad);
  static const int Ms[] = {1, 3, 11};
  for (int mi = 0; mi < 3; mi++) {
    const int64_t M = Ms[mi], N = w->rows, K = w->cols;
    float *x = malloc(sizeof(float) * (size_t)(M * K)), *y = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * K; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 1000.f;
    di_cpu_gemm(tp, x, M, K, w, 0, N, y, N);
    double num = 0, den = 0;
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double a = 0;
        for (int64_t k = 0; k < K; k++) a += (double)x[m * K + k] * t->deq[n * K + k];
        num += (a - y[m * N + n]) * (a - y[m * N + n]);
        den += a * a;
      }
    const double err = sqrt(num / (den > 0 ? den : 1));
    CHECKF(err < 1e-5, "%s: gemm M=%lld rel err %.3e", label, (long long)M, err);
    free(x);
    free(y);
  }
  free(t->data);
  free(t->scales);
  free(t->deq);
}

/* A safetensors file holding w (F8_E4M3 [R][C]) and w_scale_inv (F8_E8M0) of t, bound back through
 * di_tensor_source_weight: the same elements, scales not copied. */
/* A one-file checkpoint in a fresh folder: the tensors `names` with safetensors dtypes `dtypes`, 2-D
 * shapes `shapes` and bytes `data`. Returns the folder (free it with drop_dir). */
static char *write_checkpoint(int n, const char *const *names, const char *const *dtypes, const int64_t (*shapes)[2],
                              const void *const *data, const size_t *bytes) {
  char *dir = strdup("/tmp/di_wfmt_XXXXXX");
  CHECK(dir && mkdtemp(dir) != NULL);
  char header[2048], path[600];
  int len = snprintf(header, sizeof header, "{");
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    len += snprintf(header + len, sizeof header - (size_t)len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                    i ? "," : "", names[i], dtypes[i], (long long)shapes[i][0], (long long)shapes[i][1], off, off + bytes[i]);
    off += bytes[i];
  }
  snprintf(header + len, sizeof header - (size_t)len, "}");
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (f) {
    const uint64_t hl = strlen(header);
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hl >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(header, 1, hl, f);
    for (int i = 0; i < n; i++) fwrite(data[i], 1, bytes[i], f);
    fclose(f);
  }
  return dir;
}

static void drop_dir(char *dir) {
  char path[600];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  unlink(path);
  rmdir(dir);
  free(dir);
}

/* Binds `name` from a checkpoint of the given tensors and compares every element with t's float64
 * dequantization; with `expect_err`, expects that error instead. */
static void bind_and_compare(fmt_weight *t, const char *label, int n, const char *const *names, const char *const *dtypes,
                             const int64_t (*shapes)[2], const void *const *data, const size_t *bytes, const char *expect_err) {
  char *dir = write_checkpoint(n, names, dtypes, shapes, data, bytes);
  di_tensor_source *src = NULL;
  di_status st = di_tensor_source_open(dir, &src);
  CHECKF(st == DI_OK, "%s: %s", label, di_last_error());
  if (st == DI_OK) {
    const int block[2] = {t->w.block_rows, t->w.block_cols};
    di_weight w;
    st = di_tensor_source_weight(src, names[0], t->w.rows, t->w.cols, block, &w);
    if (expect_err) {
      CHECKF(st != DI_OK && strstr(di_last_error(), expect_err), "%s: expected an error with \"%s\", got \"%s\"", label,
             expect_err, st == DI_OK ? "(none)" : di_last_error());
    } else {
      CHECKF(st == DI_OK, "%s: %s", label, di_last_error());
      CHECK(st != DI_OK || (w.scale_e8m0 && !w.scale_inv && w.dtype == t->w.dtype && w.scale_cols == t->w.scale_cols));
      int64_t bad = 0;
      for (int64_t r = 0; st == DI_OK && r < t->w.rows; r++)
        for (int64_t c = 0; c < t->w.cols; c++)
          if ((double)di_weight_get(&w, r, c) != t->deq[r * t->w.cols + c]) bad++;
      CHECKF(bad == 0, "%s: %lld elements differ", label, (long long)bad);
    }
    di_tensor_source_free(src);
  }
  drop_dir(dir);
}

/* FP8 + E8M0 scales under both scale namings: transformers' `w_scale_inv` and DeepSeek's `<stem>.scale`. */
static void check_file_binding(fmt_weight *t) {
  const int64_t R = t->w.rows, C = t->w.cols, SR = (R + t->w.block_rows - 1) / t->w.block_rows, SC = t->w.scale_cols;
  const int64_t shapes[2][2] = {{R, C}, {SR, SC}};
  const void *data[2] = {t->data, t->scales};
  const size_t bytes[2] = {(size_t)(R * C), (size_t)(SR * SC)};
  const char *dtypes[2] = {"F8_E4M3", "F8_E8M0"};
  const char *hf[2] = {"w", "w_scale_inv"}, *ds[2] = {"attn.wq_a.weight", "attn.wq_a.scale"};
  bind_and_compare(t, "file-bound FP8 + E8M0 (w_scale_inv)", 2, hf, dtypes, shapes, data, bytes, NULL);
  bind_and_compare(t, "file-bound FP8 + E8M0 (.scale)", 2, ds, dtypes, shapes, data, bytes, NULL);
  bind_and_compare(t, "FP8 without scales", 1, ds, dtypes, shapes, data, bytes,
                   "missing tensor 'attn.wq_a.weight_scale_inv' or 'attn.wq_a.scale' (block scales of the FP8 tensor");
}

/* MXFP4 as V4 checkpoints store it: I8 (or U8) pairs [R][C/2] and `<stem>.scale` F8_E8M0 [R][C/32]. */
static void check_mxfp4_file_binding(fmt_weight *t) {
  const int64_t R = t->w.rows, C = t->w.cols, SC = t->w.scale_cols;
  const int64_t shapes[2][2] = {{R, C / 2}, {R, SC}}, bad_scale[2][2] = {{R, C / 2}, {R, SC + 1}};
  const int64_t bad_pack[2][2] = {{R, C / 2 + 1}, {R, SC}};
  const void *data[2] = {t->data, t->scales};
  const size_t bytes[2] = {(size_t)(R * C / 2), (size_t)(R * SC)}, bytes_plus[2] = {(size_t)(R * C / 2), (size_t)(R * (SC + 1))};
  const char *names[2] = {"ffn.experts.3.w1.weight", "ffn.experts.3.w1.scale"};
  const char *i8[2] = {"I8", "F8_E8M0"}, *u8[2] = {"U8", "F8_E8M0"}, *f32s[2] = {"I8", "F32"};
  bind_and_compare(t, "file-bound MXFP4 (I8)", 2, names, i8, shapes, data, bytes, NULL);
  bind_and_compare(t, "file-bound MXFP4 (U8)", 2, names, u8, shapes, data, bytes, NULL);
  bind_and_compare(t, "MXFP4 without scales", 1, names, i8, shapes, data, bytes,
                   "missing tensor 'ffn.experts.3.w1.scale' (E8M0 scales of the MXFP4 tensor 'ffn.experts.3.w1.weight')");
  void *big = calloc(1, bytes_plus[1]);
  const void *data_plus[2] = {t->data, big};
  bind_and_compare(t, "MXFP4 scales of the wrong shape", 2, names, i8, bad_scale, data_plus, bytes_plus,
                   "tensor 'ffn.experts.3.w1.scale' in");
  bind_and_compare(t, "MXFP4 scales of the wrong shape (message)", 2, names, i8, bad_scale, data_plus, bytes_plus,
                   "must be F8_E8M0");
  const size_t f32_bytes[2] = {(size_t)(R * C / 2), (size_t)(R * SC * 4)};
  void *f32 = calloc(1, f32_bytes[1]);
  const void *data_f32[2] = {t->data, f32};
  bind_and_compare(t, "MXFP4 with F32 scales", 2, names, f32s, shapes, data_f32, f32_bytes, "must be F8_E8M0");
  void *wide = calloc(1, (size_t)(R * (C / 2 + 1)));
  const void *data_wide[2] = {wide, t->scales};
  const size_t bytes_wide[2] = {(size_t)(R * (C / 2 + 1)), (size_t)(R * SC)};
  bind_and_compare(t, "packed bytes of neither shape", 2, names, i8, bad_pack, data_wide, bytes_wide,
                   "(or, as packed MXFP4 bytes, half as many columns)");
  free(big);
  free(f32);
  free(wide);
}

int main(void) {
  di_threadpool *tp = NULL;
  CHECK(di_threadpool_create(2, &tp) == DI_OK);
  fmt_weight t;
  t = make(300, 260, 128, 128, 0, 0); check(tp, &t, "FP8 128x128 F32 scales, partial edges");
  t = make(300, 260, 128, 128, 1, 0); check_file_binding(&t); check(tp, &t, "FP8 128x128 UE8M0 scales, partial edges");
  t = make(45, 200, 1, 32, 1, 0);     check(tp, &t, "FP8 1x32 UE8M0");
  t = make(70, 100, 64, 16, 0, 0);    check(tp, &t, "FP8 64x16 F32");
  t = make(17, 23, 3, 5, 1, 0);       check(tp, &t, "FP8 3x5 UE8M0 (scalar path)");
  t = make(37, 72, 1, 32, 1, 1);      check(tp, &t, "MXFP4, partial last block");
  t = make(64, 2048, 1, 32, 1, 1);    check_mxfp4_file_binding(&t); check(tp, &t, "MXFP4 expert shape");
  /* a format check that must fail: MXFP4 with F32 scales, odd columns */
  fmt_weight bad = make(4, 64, 1, 32, 1, 1);
  bad.w.cols = 63;
  const char *why = NULL;
  CHECK(di_weight_check_format(&bad.w, &why) != 0 && why);
  free(bad.data); free(bad.scales); free(bad.deq);
  /* integer tables, exactly (values beyond 2^24 and 2^53 included) */
  int64_t tab[6] = {0, 1, -7, (int64_t)1 << 40, ((int64_t)1 << 53) + 1, INT64_MIN};
  di_weight ti = {.name = "tid2eid", .dtype = DI_DT_I64, .rows = 2, .cols = 3, .data = tab};
  for (int i = 0; i < 6; i++) CHECK(di_weight_get_i64(&ti, i / 3, i % 3) == tab[i]);
  int32_t tab32[4] = {5, -3, 2147483647, -2147483647 - 1};
  di_weight t32 = {.name = "t32", .dtype = DI_DT_I32, .rows = 1, .cols = 4, .data = tab32};
  for (int i = 0; i < 4; i++) CHECK(di_weight_get_i64(&t32, 0, i) == tab32[i]);
  CHECK(di_weight_check_format(&ti, &why) == 0);
  CHECK(di_weight_bytes(&ti) == 48);
  di_threadpool_free(tp);
  return test_finish("test_weight_formats");
}
