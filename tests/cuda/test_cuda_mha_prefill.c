/* The MHA-form MLA prefill attention (k_mha_prefill.cu, issue 19) at V2-Lite (16 heads, 192 / 128 head
 * dims), V3 (128 heads) and the tiny fixtures' dims (48 / 32): against a float64 reference (relative L2
 * error of the bf16 output < 1e-2), and bit-identical rows however the prompt is cut: the last T tokens
 * as rows of one whole-prompt pass (items of 64 tokens from token 0), as a chunk attending to the
 * earlier tokens' keys (items of 64 from the chunk's first token), and each token alone. The keys sit
 * at an offset (kbase) in the key buffers. `--bench`: its time on whole prompts of 512 / 4,096 / 16,384
 * tokens at 16 heads (and 4,096 at 128), TFLOP/s counted as 2 x rows x keys/2 x (192 + 128). */
#include "backend/cuda/k_mha_prefill.h"
#include "test_util.h"
#include "util/numeric.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define D DI_CUK_MLA_D

#define CUT_RNG_SEED 0x2545f4914f6cdd1dull
#include "cuda_test_rand.h" /* urand, nrand, rand_bf16, dup_dev */

typedef struct problem {
  int H, N, P, DV, ctx, kbase; /* one sequence of ctx tokens at positions 0 .. ctx - 1 */
  uint16_t *q, *qa, *g, *kv;   /* host copies */
  int32_t *pos;
  void *dq, *dqa, *dg, *dkv, *dpos;
  int ldq, ldkv;
} problem;

static void problem_make(problem *p, int H, int N, int P, int DV, int ctx) {
  memset(p, 0, sizeof *p);
  p->H = H; p->N = N; p->P = P; p->DV = DV; p->ctx = ctx; p->kbase = 5;
  p->ldq = H * (N + P) + 8; /* a padded row, as the q/kv projection leaves it */
  p->ldkv = H * (N + DV);
  const int nk = ctx + p->kbase;
  p->q = rand_bf16((size_t)ctx * p->ldq, 1.f);
  p->qa = rand_bf16((size_t)ctx * H * D, 1.f);
  p->g = rand_bf16((size_t)nk * D, 1.f);
  p->kv = rand_bf16((size_t)nk * p->ldkv, 1.f);
  p->pos = malloc(sizeof(int32_t) * (size_t)ctx);
  for (int t = 0; t < ctx; t++) p->pos[t] = t;
  p->dq = dup_dev(p->q, (size_t)ctx * p->ldq * 2);
  p->dqa = dup_dev(p->qa, (size_t)ctx * H * D * 2);
  p->dg = dup_dev(p->g, (size_t)nk * D * 2);
  p->dkv = dup_dev(p->kv, (size_t)nk * p->ldkv * 2);
  p->dpos = dup_dev(p->pos, sizeof(int32_t) * (size_t)ctx);
}
static void problem_free(problem *p) {
  di_cut_free(p->dq); di_cut_free(p->dqa); di_cut_free(p->dg); di_cut_free(p->dkv); di_cut_free(p->dpos);
  free(p->q); free(p->qa); free(p->g); free(p->kv); free(p->pos);
}

/* tokens t_lo .. ctx - 1 in items of `per` tokens from t_lo; returns out [ctx][H*DV] (rows below t_lo
 * untouched: zero) or NULL */
static uint16_t *run(const problem *p, int t_lo, int per, double *ms) {
  const int n = (p->ctx - t_lo + per - 1) / per;
  di_cuk_mha_item *items = malloc(sizeof *items * (size_t)n);
  for (int i = 0; i < n; i++) {
    const int t0 = t_lo + i * per, t1 = t0 + per < p->ctx ? t0 + per : p->ctx;
    items[i] = (di_cuk_mha_item){t0, t1, p->kbase, t1}; /* keys 0 .. t1 - 1 available */
  }
  void *dit = dup_dev(items, sizeof *items * (size_t)n);
  const int ldo = p->H * p->DV;
  const size_t nout = (size_t)p->ctx * ldo;
  void *dout = di_cut_malloc(nout * 2);
  uint16_t *zero = calloc(nout, 2);
  di_cut_h2d(dout, zero, nout * 2);
  di_cut_sync();
  double t0 = di_cut_time_ms();
  di_status st = di_cuk_mha_prefill(p->dq, p->ldq, p->N + p->P, p->dqa, p->dkv, p->ldkv, p->dg, p->dpos, dit, n, p->H,
                                    p->N, p->P, p->DV, 0.0721f, dout, ldo, NULL);
  int sync = di_cut_sync();
  if (ms) *ms = di_cut_time_ms() - t0;
  uint16_t *out = NULL;
  CHECKF(st == DI_OK && sync == 0, "mha_prefill: %s", di_last_error());
  if (st == DI_OK && sync == 0) {
    out = zero;
    di_cut_d2h(out, dout, nout * 2);
  } else {
    free(zero);
  }
  di_cut_free(dit); di_cut_free(dout);
  free(items);
  return out;
}

/* float64 reference of token t, head h: out[DV] */
static void reference(const problem *p, int t, int h, double *out) {
  const int N = p->N, P = p->P, DV = p->DV, nkeys = p->pos[t] + 1;
  double *sc = malloc(sizeof(double) * (size_t)nkeys), mx = -INFINITY, sum = 0;
  const uint16_t *qn = p->q + (size_t)t * p->ldq + (size_t)h * (N + P), *qp = p->qa + ((size_t)t * p->H + h) * D + 512;
  for (int k = 0; k < nkeys; k++) {
    const uint16_t *kv = p->kv + (size_t)(p->kbase + k) * p->ldkv + (size_t)h * (N + DV);
    const uint16_t *kp = p->g + (size_t)(p->kbase + k) * D + 512;
    double s = 0;
    for (int d = 0; d < N; d++) s += (double)di_bf16_to_f32(qn[d]) * di_bf16_to_f32(kv[d]);
    for (int d = 0; d < P; d++) s += (double)di_bf16_to_f32(qp[d]) * di_bf16_to_f32(kp[d]);
    sc[k] = s * 0.0721f;
    if (sc[k] > mx) mx = sc[k];
  }
  for (int c = 0; c < DV; c++) out[c] = 0;
  for (int k = 0; k < nkeys; k++) {
    const double w = exp(sc[k] - mx);
    sum += w;
    const uint16_t *v = p->kv + (size_t)(p->kbase + k) * p->ldkv + (size_t)h * (N + DV) + N;
    for (int c = 0; c < DV; c++) out[c] += w * di_bf16_to_f32(v[c]);
  }
  for (int c = 0; c < DV; c++) out[c] /= sum;
  free(sc);
}

static void check_shape(int H, int N, int P, int DV, int ctx, int T, const char *label) {
  problem p;
  problem_make(&p, H, N, P, DV, ctx);
  const int t_lo = ctx - T, ldo = H * DV;
  uint16_t *whole = run(&p, 0, 64, NULL), *chunk = run(&p, t_lo, 64, NULL), *alone = run(&p, t_lo, 1, NULL);
  if (!whole || !chunk || !alone) {
    free(whole); free(chunk); free(alone);
    problem_free(&p);
    return;
  }
  /* float64 on a sample of the chunk's rows (every row at small shapes) */
  double num = 0, den = 0, *ref = malloc(sizeof(double) * (size_t)DV);
  const int tstep = T > 64 ? T / 29 : 1;
  for (int t = t_lo; t < ctx; t += tstep)
    for (int h = 0; h < H; h += (H > 16 ? 7 : 1)) {
      reference(&p, t, h, ref);
      for (int c = 0; c < DV; c++) {
        const double e = di_bf16_to_f32(chunk[(size_t)t * ldo + h * DV + c]) - ref[c];
        num += e * e;
        den += ref[c] * ref[c];
      }
    }
  const double err = sqrt(num / (den > 0 ? den : 1));
  CHECKF(err < 1e-2, "mha_prefill %s: rel L2 %.3e vs float64", label, err);
  const size_t off = (size_t)t_lo * ldo, n = (size_t)T * ldo;
  const int same_wc = memcmp(whole + off, chunk + off, n * 2) == 0, same_ca = memcmp(chunk + off, alone + off, n * 2) == 0;
  CHECKF(same_wc, "mha_prefill %s: the chunk's rows differ from the whole-prompt pass", label);
  CHECKF(same_ca, "mha_prefill %s: a token alone differs from the chunk", label);
  printf("mha_prefill %-30s H=%3d dims %d+%d/%d ctx %5d chunk %4d: rel L2 %.2e; whole == chunk %s, chunk == alone %s\n",
         label, H, N, P, DV, ctx, T, err, same_wc ? "yes" : "NO", same_ca ? "yes" : "NO");
  free(ref); free(whole); free(chunk); free(alone);
  problem_free(&p);
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void bench_prompt(int H, int T) {
  problem p;
  problem_make(&p, H, 128, 64, 128, T);
  double t[5];
  for (int rep = 0; rep < 6; rep++) {
    double ms;
    uint16_t *o = run(&p, 0, 64, &ms);
    free(o);
    if (rep) t[rep - 1] = ms;
  }
  qsort(t, 5, sizeof t[0], cmp_dbl);
  const double flop = 2.0 * (double)T * H * (T / 2.0) * (192 + 128);
  printf("bench mha_prefill H=%3d prompt %5d: %.3f ms (%.0f TFLOP/s; incl. launch and the item upload)\n", H, T, t[2],
         flop / t[2] / 1e9);
  problem_free(&p);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  if (argc > 1 && !strcmp(argv[1], "--bench")) {
    const int T[] = {512, 4096, 16384};
    for (int i = 0; i < 3; i++) bench_prompt(16, T[i]);
    bench_prompt(128, 4096);
    return test_finish("test_cuda_mha_prefill --bench");
  }
  check_shape(16, 128, 64, 128, 300, 300 - 37, "V2-Lite, chunk after 37");
  check_shape(16, 128, 64, 128, 1000, 100, "V2-Lite, chunk of 100");
  check_shape(128, 128, 64, 128, 700, 70, "V3, chunk of 70");
  check_shape(4, 32, 16, 32, 150, 77, "tiny dims, chunk of 77");
  return test_finish("test_cuda_mha_prefill");
}
