/* The DeepSeek-V4 MXFP4 routed experts on the tensor cores (backend/cuda/cuda_v4_mxtc.h, W4A16) against a
 * float64 reference on fresh random inputs: E2M1 codes (every byte value), E8M0 scales, float32 tokens routed to
 * random experts (slot 0 the shared expert, skipped; some slots unused), at V4-Flash's shape (hidden 4096, experts
 * 2048 wide) with few and many slots an expert, and at partial shapes (K % 128 != 0, rows not a multiple of the
 * CTA's). Bounds, stated:
 * - up (act, bf16): rel L2 < 3e-3 against float64 sums of the exact dequantized weights times the bf16-rounded
 *   activations, clamp and SwiGLU in double (the bf16 output rounding, 2^-9 relative at most, dominates);
 * - down (y, float): rel L2 < 1e-5 against float64 sums over the kernel's own bf16 act (fp32 accumulation);
 * - against the CUDA-core kernels (float32 activations, di_v4k_expert_up_mx / _down_mx): rel L2 < 2e-2 at the
 *   checkpoints' scale range (2^-9 .. 2^-5; measured 2.9e-3: what rounding the activations to bf16 costs), < 1e-1
 *   with scales 2^-27 .. 2^8 (gate / up values of ~1e4 then move by ~|g| 2^-9 under the rounding, and the few
 *   within that of the clamp's range change act by O(1): measured 3.7e-2, while against float64 on the same
 *   rounded inputs the form stays at 9e-5);
 * - each form (di_v4k_mx_tc_form 1, the default; 0: another sum order) so, and printed how far apart they are;
 * - bit for bit: each tile size (8, 16, 32, 64 slots) gives the same act and y, and the last token's slots alone
 *   (a step of one token) the same as inside the batch (batch-invariant); the shared expert's and unused slots'
 *   rows stay untouched.
 * - the whole backend (cuda_deepseek_v4.cu's moe() hook) on a random V4-Flash-shaped model, 4 layers, 4 experts
 *   top-2, native weights, prompts of 70 and 9 tokens in one step: logits with DEEPINFER_CUDA_V4_MX_TC=2 against
 *   the CUDA-core experts (=0) within rel L2 2e-2 (test_cuda_v4_kernels' bound for native vs bf16) and not equal
 *   (the form was taken); the 70th token's logits after 69 + 1 tokens bit-equal to 70 in one step with =0 and =1
 *   (the tensor-core form at every step keeps a token independent of its step; =2 does not at one token); the switch
 *   unset: the default mode as =DI_V4_MX_TC_DEFAULT, the batch-invariant mode as =0 (=2 there as 0, =1 as 1), bit for bit.
 * `--time`: the kernels at V4-Flash's 256 experts (and the benchmark model's 32) top-6, hidden 4096 x 2048, against
 * the CUDA-core MXFP4 kernels, with the MXFP4 and bf16 rooflines (4.8 TB/s, 989 TFLOP/s dense bf16).
 * Built only with nvcc; run on the device. */
#define CUT_RNG_SEED 0x5eed18f4a11ull
#include "cuda_test_rand.h"
#include "arch/deepseek_v4_random.h"
#include "arch/deepseek_v4_shapes.h"
#include "backend/cuda/cuda_v4_backend.h"
#include "backend/cuda/cuda_v4_kernels.h"
#include "backend/cuda/cuda_v4_mxtc.h"
#include "model/weights.h"
#include "test_util.h"
#include "v4_one_seq.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

/* An MXFP4 stack [E][R][C] on the host (codes, scales [E][R][lds] with lds = C/32 rounded up to 4), its float
 * dequantization as the CPU reads it (di_weight_rows_f32) with one more zero expert (the shared id E), and a
 * device copy with 16-byte code rows. Scales 2^(smin-127) .. 2^(smax-127). */
typedef struct mxstack {
  int E, R, C, lds;
  uint8_t *q, *s;
  float *deq;
  di_cuk_mxfp4w d;
} mxstack;
static void mx_make(mxstack *m, int E, int R, int C, int smin, int smax) {
  const int cb = C / 2, ns = C / 32, lds = (ns + 3) / 4 * 4, ldq = (cb + 15) / 16 * 16;
  m->E = E, m->R = R, m->C = C, m->lds = lds;
  m->q = calloc((size_t)E * R, ldq);
  m->s = calloc((size_t)E * R, lds);
  m->deq = calloc((size_t)(E + 1) * R * C, sizeof(float));
  uint8_t *tight_s = malloc((size_t)R * ns);
  for (int e = 0; e < E; e++) {
    uint8_t *qe = m->q + (size_t)e * R * ldq;
    for (int r = 0; r < R; r++)
      for (int b = 0; b < cb; b++) qe[(size_t)r * ldq + b] = (uint8_t)(urand() * 256);
    for (int r = 0; r < R; r++)
      for (int j = 0; j < ns; j++) {
        const uint8_t v = (uint8_t)(smin + (int)(urand() * (smax - smin + 1)));
        m->s[((size_t)e * R + r) * lds + j] = v;
        tight_s[(size_t)r * ns + j] = v;
      }
    uint8_t *tight_q = malloc((size_t)R * cb);
    for (int r = 0; r < R; r++) memcpy(tight_q + (size_t)r * cb, qe + (size_t)r * ldq, cb);
    di_weight w;
    memset(&w, 0, sizeof w);
    w.dtype = DI_DT_F4E2M1;
    w.rows = R;
    w.cols = C;
    w.data = tight_q;
    w.scale_e8m0 = tight_s;
    w.block_rows = 1;
    w.block_cols = 32;
    w.scale_cols = ns;
    di_weight_rows_f32(&w, 0, R, m->deq + (size_t)e * R * C);
    free(tight_q);
  }
  free(tight_s);
  m->d.q = dup_dev(m->q, (size_t)E * R * ldq);
  m->d.scale = dup_dev(m->s, (size_t)E * R * lds);
  m->d.ldq = ldq;
  m->d.lds = lds;
}
static void mx_free(mxstack *m) {
  free(m->q); free(m->s); free(m->deq);
  di_cut_free((void *)m->d.q); di_cut_free((void *)m->d.scale);
}
static void *zeros_dev(size_t bytes) {
  void *h = calloc(1, bytes ? bytes : 16), *d = dup_dev(h, bytes ? bytes : 16);
  free(h);
  return d;
}
static void *from_dev(const void *d, size_t bytes) {
  void *h = malloc(bytes ? bytes : 16);
  di_cut_d2h(h, d, bytes);
  return h;
}
/* slot 0 the shared expert (id E), slots 1..k distinct random experts; token 0's slot 2 unused (-1) */
static int32_t *route(int T, int ns, int E) {
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)T * ns);
  for (int t = 0; t < T; t++) {
    ids[(size_t)t * ns] = E;
    for (int k = 1; k < ns; k++) {
      int e, dup;
      do {
        e = (int)(urand() * E);
        dup = 0;
        for (int j = 1; j < k; j++) dup |= ids[(size_t)t * ns + j] == e;
      } while (dup && ns - 1 <= E);
      ids[(size_t)t * ns + k] = e;
    }
    if (t == 0 && ns > 2) ids[2] = -1;
  }
  return ids;
}

/* one step through the pieces (tile size bt; 0: the form's pick) or the combined entry (combined = 1):
 * act (bf16, T * ns * I, back in natural order) and y (T * ns * D) back on the host */
typedef struct step_out { uint16_t *act; float *y; } step_out;
static step_out run_tc(const float *x, const int32_t *ids, int T, int ns, int E, const mxstack *m1, const mxstack *m3,
                       const mxstack *m2, float lim, int bt, int combined) {
  const int D = m1->C, I = m1->R, E1 = E + 1;
  step_out o = {NULL, NULL};
  float *dx = dup_dev(x, 4 * (size_t)T * D);
  int32_t *dids = dup_dev(ids, sizeof(int32_t) * (size_t)T * ns);
  const int mt8 = di_v4k_expert_max_tiles(T, ns, E1);
  int32_t *t8 = zeros_dev(4 * (1 + 3 * (size_t)mt8 + (size_t)T * ns));
  uint16_t *dact = zeros_dev(2 * (size_t)T * ns * I);
  float *dy = zeros_dev(4 * (size_t)T * ns * D);
  CHECK(di_v4k_expert_tiles(dids, T, ns, E1, t8, NULL) == DI_OK);
  di_v4k_mx_tc_tile(bt);
  if (combined) {
    void *ws = zeros_dev(di_v4k_mx_tc_ws_bytes(T, ns, D, I, E1));
    CHECKF(di_v4k_experts_mx_tc(dx, dids, t8, E1, m1->d, m3->d, m2->d, T, ns, D, I, lim, ws, dy, NULL) == DI_OK, "%s",
           di_last_error());
    di_cut_free(ws);
  } else {
    const int b = di_v4k_mx_tc_pick_tile(T, ns, E1), mt = di_v4k_mx_tc_max_tiles(T, ns, E1, b);
    uint16_t *xb = zeros_dev(2 * (size_t)T * D);
    int32_t *tl = zeros_dev(4 * (1 + 3 * (size_t)mt));
    const int32_t *perm = t8 + 1 + 3 * (size_t)mt8;
    CHECK(di_v4k_mx_tc_acts(dx, T * D, xb, NULL) == DI_OK);
    CHECK(di_v4k_mx_tc_tiles(t8, T, ns, E1, E, b, tl, NULL) == DI_OK);
    CHECKF(di_v4k_mx_tc_up(xb, perm, tl, mt, b, m1->d, m3->d, T, ns, D, I, lim, dact, NULL) == DI_OK, "%s", di_last_error());
    CHECKF(di_v4k_mx_tc_down(dact, perm, tl, mt, b, m2->d, T, ns, D, I, dy, NULL) == DI_OK, "%s", di_last_error());
    di_cut_free(xb);
    di_cut_free(tl);
  }
  di_v4k_mx_tc_tile(0);
  CHECK(di_cut_sync() == 0);
  o.act = from_dev(dact, 2 * (size_t)T * ns * I);
  if (di_v4k_mx_tc_get_form() == 1) { /* stored as 0 4 1 5 2 6 3 7 in each 8 */
    uint16_t *nat = malloc(2 * (size_t)T * ns * I);
    for (size_t r = 0; r < (size_t)T * ns; r++)
      for (int i = 0; i < I; i++) nat[r * I + i] = o.act[r * I + ((i & ~7) | (i & 3) << 1 | (i >> 2 & 1))];
    free(o.act);
    o.act = nat;
  }
  o.y = from_dev(dy, 4 * (size_t)T * ns * D);
  di_cut_free(dx); di_cut_free(dids); di_cut_free(t8); di_cut_free(dact); di_cut_free(dy);
  return o;
}

static double swiglu_d(double g, double u, double lim) {
  const double gv = g > lim ? lim : g, uv = u > lim ? lim : u < -lim ? -lim : u;
  return gv / (1 + exp(-gv)) * uv;
}

/* form's outputs against float64 (up: on the weights and bf16-rounded x; down: on the form's own act), every
 * `every`-th routed slot; skipped slots' rows must stay zero */
typedef struct errs { double ea, ey; int checked, untouched; } errs;
static errs ref_errors(const step_out *o, const float *x, const int32_t *ids, int T, int ns, int E, const mxstack *m1,
                       const mxstack *m3, const mxstack *m2, float lim, int every) {
  const int D = m1->C, I = m1->R;
  double ea_n = 0, ea_d = 0, ey_n = 0, ey_d = 0;
  errs r = {0, 0, 0, 1};
  float *xr = malloc(4 * (size_t)D), *ar = malloc(4 * (size_t)I);
  int routed = 0;
  for (int ts = 0; ts < T * ns; ts++) {
    const int e = ids[ts];
    if (e < 0 || e == E) {
      for (int d = 0; d < D; d++) r.untouched &= o->y[(size_t)ts * D + d] == 0;
      for (int i = 0; i < I; i++) r.untouched &= o->act[(size_t)ts * I + i] == 0;
      continue;
    }
    if (routed++ % every) continue;
    r.checked++;
    const float *xt = x + (size_t)(ts / ns) * D;
    for (int k = 0; k < D; k++) xr[k] = di_bf16_to_f32(di_f32_to_bf16(xt[k]));
    for (int i = 0; i < I; i++) {
      const float *g = m1->deq + ((size_t)e * I + i) * D, *u = m3->deq + ((size_t)e * I + i) * D;
      double sg = 0, su = 0;
      for (int k = 0; k < D; k++) sg += (double)g[k] * xr[k], su += (double)u[k] * xr[k];
      const double ref = swiglu_d(sg, su, lim), got = di_bf16_to_f32(o->act[(size_t)ts * I + i]);
      ea_n += (got - ref) * (got - ref);
      ea_d += ref * ref;
    }
    for (int i = 0; i < I; i++) ar[i] = di_bf16_to_f32(o->act[(size_t)ts * I + i]);
    for (int d = 0; d < D; d++) {
      const float *w = m2->deq + ((size_t)e * D + d) * I;
      double sum = 0;
      for (int i = 0; i < I; i++) sum += (double)w[i] * ar[i];
      const double got = o->y[(size_t)ts * D + d];
      ey_n += (got - sum) * (got - sum);
      ey_d += sum * sum;
    }
  }
  r.ea = sqrt(ea_n / (ea_d > 0 ? ea_d : 1));
  r.ey = sqrt(ey_n / (ey_d > 0 ? ey_d : 1));
  free(xr);
  free(ar);
  return r;
}

static void check(int D, int I, int E, int topk, int T, int every, int smin, int smax, double cc_bound, const char *what) {
  const int ns = topk + 1, E1 = E + 1;
  const float lim = 10;
  mxstack m1, m3, m2;
  mx_make(&m1, E, I, D, smin, smax);
  mx_make(&m3, E, I, D, smin, smax);
  mx_make(&m2, E, D, I, smin, smax);
  float *x = malloc(4 * (size_t)T * D);
  for (size_t i = 0; i < (size_t)T * D; i++) x[i] = nrand() * 0.5f;
  int32_t *ids = route(T, ns, E);
  CHECKF(di_v4k_mx_tc_ok(m1.d, m3.d, m2.d, D, I), "%s: the form refuses D %d I %d", what, D, I);

  /* the CUDA-core kernels on the same step (float32 activations) */
  float *yc;
  {
    float *dx = dup_dev(x, 4 * (size_t)T * D), *da = zeros_dev(4 * (size_t)T * ns * I), *dy = zeros_dev(4 * (size_t)T * ns * D);
    int32_t *dids = dup_dev(ids, sizeof(int32_t) * (size_t)T * ns);
    int32_t *t8 = zeros_dev(4 * (1 + 3 * (size_t)di_v4k_expert_max_tiles(T, ns, E1) + (size_t)T * ns));
    CHECK(di_v4k_expert_tiles(dids, T, ns, E1, t8, NULL) == DI_OK);
    CHECK(di_v4k_expert_up_mx(dx, dids, t8, E1, m1.d, m3.d, T, ns, D, I, lim, da, NULL) == DI_OK);
    CHECK(di_v4k_expert_down_mx(da, dids, t8, E1, m2.d, T, ns, D, I, dy, NULL) == DI_OK);
    CHECK(di_cut_sync() == 0);
    yc = from_dev(dy, 4 * (size_t)T * ns * D);
    di_cut_free(dx); di_cut_free(da); di_cut_free(dy); di_cut_free(dids); di_cut_free(t8);
  }
  step_out of[2];
  for (int form = 1; form >= 0; form--) {
    di_v4k_mx_tc_form(form);
    step_out o = run_tc(x, ids, T, ns, E, &m1, &m3, &m2, lim, 0, 0);
    const errs r = ref_errors(&o, x, ids, T, ns, E, &m1, &m3, &m2, lim, every);
    const double ecc = test_rel_l2(o.y, yc, (size_t)T * ns * D);
    /* bit for bit: every tile size, the combined entry, and the last token alone */
    int tiles_same = 1;
    static const int bts[5] = {8, 16, 32, 64, -1};
    for (int v = 0; v < 5; v++) {
      step_out p = run_tc(x, ids, T, ns, E, &m1, &m3, &m2, lim, bts[v] > 0 ? bts[v] : 0, bts[v] < 0);
      const int same = memcmp(p.y, o.y, 4 * (size_t)T * ns * D) == 0 &&
                       (bts[v] < 0 || memcmp(p.act, o.act, 2 * (size_t)T * ns * I) == 0);
      if (!same) printf("  %s form %d: tile %d differs\n", what, form, bts[v]);
      tiles_same &= same;
      free(p.act); free(p.y);
    }
    step_out one = run_tc(x + (size_t)(T - 1) * D, ids + (size_t)(T - 1) * ns, 1, ns, E, &m1, &m3, &m2, lim, 0, 0);
    const int alone_same = memcmp(one.y, o.y + (size_t)(T - 1) * ns * D, 4 * (size_t)ns * D) == 0 &&
                           memcmp(one.act, o.act + (size_t)(T - 1) * ns * I, 2 * (size_t)ns * I) == 0;
    free(one.act); free(one.y);
    printf("mx tc form %d %-20s D %4d I %4d E %3d top-%d T %4d (tile %2d, %d slots checked): up rel L2 %.2e, down %.2e, vs "
           "CUDA-core f32 %.2e; tiles 8..64 + combined %s, last token alone %s, skipped slots untouched %s\n",
           form, what, D, I, E, topk, T, di_v4k_mx_tc_pick_tile(T, ns, E1), r.checked, r.ea, r.ey, ecc,
           tiles_same ? "bit-identical" : "DIFFER", alone_same ? "bit-identical" : "DIFFERS", r.untouched ? "yes" : "NO");
    CHECKF(r.checked > 0 && r.ea < 3e-3, "%s form %d: up rel L2 %.3e", what, form, r.ea);
    CHECKF(r.ey < 1e-5, "%s form %d: down rel L2 %.3e", what, form, r.ey);
    CHECKF(ecc < cc_bound, "%s form %d: vs the CUDA-core kernels rel L2 %.3e", what, form, ecc);
    CHECKF(tiles_same && alone_same && r.untouched, "%s form %d: tiles %d alone %d untouched %d", what, form, tiles_same,
           alone_same, r.untouched);
    of[form] = o;
  }
  printf("  form 0 vs 1: y rel L2 %.2e apart (the sum order)\n", test_rel_l2(of[0].y, of[1].y, (size_t)T * ns * D));
  di_v4k_mx_tc_form(1);
  for (int f = 0; f < 2; f++) free(of[f].act), free(of[f].y);
  free(yc); free(x); free(ids);
  mx_free(&m1); mx_free(&m3); mx_free(&m2);
}

/* ---- the backend's hook ---- */
static int run_prompt(di_backend *be, int T, float *logits) {
  di_status st = v4_run_prompt(be, T, logits);
  CHECKF(st == DI_OK, "random V4-Flash model step: %s", di_last_error());
  return st == DI_OK;
}
/* the last token's logits when the prompt's first `split` tokens go in one step and the rest in a second */
static int run_split(di_backend *be, int T, int split, float *last) {
  int32_t tok[128], table[4] = {0, 1, 2, 3};
  for (int t = 0; t < T; t++) tok[t] = (t * 7919) % 4096;
  float *tmp = malloc(sizeof(float) * (size_t)be->vocab_size);
  v4_one_seq a, c;
  di_status st = v4_one_seq_init(&a, tok, split, 0, 1, table, 4, 0, NULL, NULL, 0) ? DI_OK : DI_ERR_OOM;
  if (st == DI_OK) st = be->ops->kv_alloc(be, 8);
  if (st == DI_OK) st = be->ops->submit(be, &a.b);
  if (st == DI_OK) st = be->ops->wait(be, tmp, NULL);
  if (st == DI_OK) st = v4_one_seq_init(&c, tok + split, T - split, split, 1, table, 4, 0, NULL, NULL, 0) ? DI_OK : DI_ERR_OOM;
  if (st == DI_OK) {
    st = be->ops->submit(be, &c.b);
    if (st == DI_OK) st = be->ops->wait(be, last, NULL);
    v4_one_seq_free(&c);
  }
  CHECKF(st == DI_OK, "random V4-Flash model, split step: %s", di_last_error());
  be->ops->release(be, 1);
  v4_one_seq_free(&a);
  free(tmp);
  return st == DI_OK;
}
/* The switch unset: the default mode as DEEPINFER_CUDA_V4_MX_TC=DI_V4_MX_TC_DEFAULT (a 70-token step's logits and its
 * 69 + 1 tokens' last row bit-equal to that setting's), the
 * batch-invariant mode (create_mode's flag, or DEEPINFER_BATCH_INVARIANT=1) never (70 tokens bit-equal to =0's, 69 + 1
 * == 70), and there an explicit 2 means 0 and 1 stays 1 (69 + 1 == 70 in both). */
static void mode_run(di_v4_random_model *rm, const char *sw, int inv, const char *env_inv, int T, float *whole, float *last,
                     int *mx) {
  di_model_config cfg0;
  memset(&cfg0, 0, sizeof cfg0);
  if (sw) setenv("DEEPINFER_CUDA_V4_MX_TC", sw, 1);
  else unsetenv("DEEPINFER_CUDA_V4_MX_TC");
  if (env_inv) setenv("DEEPINFER_BATCH_INVARIANT", env_inv, 1);
  di_backend *be = NULL;
  di_status st = di_backend_cuda_v4_create_mode(&cfg0, &rm->c, &rm->w, inv, &be);
  CHECKF(st == DI_OK, "random V4-Flash model (mx tc %s, invariant %d): %s", sw ? sw : "unset", inv, di_last_error());
  *mx = be ? di_backend_cuda_v4_mx_tc(be) : -2;
  if (st == DI_OK) {
    if (whole) CHECK(run_prompt(be, T, whole));
    if (last) CHECK(run_split(be, T, T - 1, last));
  }
  if (be) be->ops->destroy(be);
  unsetenv("DEEPINFER_CUDA_V4_MX_TC");
  unsetenv("DEEPINFER_BATCH_INVARIANT");
}
static void check_modes(di_v4_random_model *rm, int V) {
  const int T = 70;
  const size_t n = (size_t)T * V, rb = sizeof(float) * (size_t)V;
  float *w0 = calloc(n, 4), *w2 = calloc(n, 4), *wa = calloc(n, 4), *wi = calloc(n, 4), *we = calloc(n, 4);
  float *la = calloc((size_t)V, 4), *li = calloc((size_t)V, 4), *li2 = calloc((size_t)V, 4),
        *li1 = calloc((size_t)V, 4), *w1 = calloc(n, 4), *l2 = calloc((size_t)V, 4);
  int mx[7];
  mode_run(rm, "0", 0, NULL, T, w0, NULL, &mx[0]);
  char defs[16];
  snprintf(defs, sizeof defs, "%d", DI_V4_MX_TC_DEFAULT);
  mode_run(rm, defs, 0, NULL, T, w2, l2, &mx[1]);
  mode_run(rm, NULL, 0, NULL, T, wa, la, &mx[2]);
  mode_run(rm, NULL, 1, NULL, T, wi, li, &mx[3]);
  mode_run(rm, NULL, 0, "1", T, we, NULL, &mx[4]);
  mode_run(rm, "2", 1, NULL, T, NULL, li2, &mx[5]);
  mode_run(rm, "1", 1, NULL, T, w1, li1, &mx[6]);
  CHECKF(mx[0] == 0 && mx[1] == DI_V4_MX_TC_DEFAULT && mx[2] == DI_V4_MX_TC_DEFAULT && mx[3] == 0 && mx[4] == 0 && mx[5] == 0 && mx[6] == 1,
         "the backend's MX_TC choice: =0 %d, =default %d, unset %d, auto invariant %d, auto DEEPINFER_BATCH_INVARIANT=1 %d, "
         "=2 invariant %d, =1 invariant %d", mx[0], mx[1], mx[2], mx[3], mx[4], mx[5], mx[6]);
  const int auto_eq2 = memcmp(wa, w2, n * 4) == 0, auto_last_eq2 = memcmp(la, l2, rb) == 0;
  const int inv_eq0 = memcmp(wi, w0, n * 4) == 0, env_eq0 = memcmp(we, w0, n * 4) == 0;
  const int inv_split = memcmp(li, wi + (size_t)(T - 1) * V, rb) == 0, inv2_split = memcmp(li2, w0 + (size_t)(T - 1) * V, rb) == 0;
  const int inv1_split = memcmp(li1, w1 + (size_t)(T - 1) * V, rb) == 0;
  printf("model: MX_TC unset, default mode: 70 tokens %s =%d's, 69 + 1 %s its 69 + 1; invariant mode: 70 "
         "tokens %s =0's (DEEPINFER_BATCH_INVARIANT=1: %s), 69 + 1 %s 70 (=2 there: %s =0's 70; =1: 69 + 1 %s 70)\n",
         auto_eq2 ? "==" : "!=", DI_V4_MX_TC_DEFAULT, auto_last_eq2 ? "==" : "!=", inv_eq0 ? "==" : "!=", env_eq0 ? "==" : "!=",
         inv_split ? "==" : "!=", inv2_split ? "==" : "!=", inv1_split ? "==" : "!=");
  CHECKF(auto_eq2 && auto_last_eq2, "MX_TC unset in the default mode: 70 tokens == =%d %d, 69 + 1 == its %d",
         DI_V4_MX_TC_DEFAULT, auto_eq2, auto_last_eq2);
  CHECKF(inv_eq0 && env_eq0 && inv_split && inv2_split && inv1_split,
         "the invariant mode's experts: 70 == =0 %d (env %d), 69 + 1 == 70 %d, =2 as 0 %d, =1 69 + 1 == 70 %d", inv_eq0,
         env_eq0, inv_split, inv2_split, inv1_split);
  free(w0); free(w2); free(wa); free(wi); free(we); free(w1);
  free(l2); free(la); free(li); free(li2); free(li1);
}

static void check_model(void) {
  di_v4_config mc;
  di_v4_flash_shape(&mc, 4, 4);
  mc.vocab_size = 4096;
  mc.top_k = 2;
  di_v4_random_model rm;
  CHECK(di_v4_random_model_init(&rm, &mc, 1, 7) == DI_OK);
  di_model_config cfg0;
  memset(&cfg0, 0, sizeof cfg0);
  static const int Ts[2] = {70, 9};
  const int V = mc.vocab_size;
  setenv("DEEPINFER_CUDA_V4_NATIVE", "1", 1);
  for (int k = 0; k < 2; k++) {
    const int T = Ts[k];
    float *lg[2];
    int ok = 1;
    for (int on = 0; on < 2; on++) {
      setenv("DEEPINFER_CUDA_V4_MX_TC", on ? "2" : "0", 1);
      di_backend *be = NULL;
      lg[on] = calloc((size_t)T * V, sizeof(float));
      di_status st = di_backend_cuda_v4_create(&cfg0, &rm.c, &rm.w, &be);
      CHECKF(st == DI_OK, "random V4-Flash model (mx tc %d): %s", on, di_last_error());
      ok = ok && st == DI_OK && run_prompt(be, T, lg[on]);
      if (be) be->ops->destroy(be);
    }
    if (ok) {
      const double e = test_rel_l2(lg[1], lg[0], (size_t)T * V);
      int finite = 1, agree = 0;
      for (size_t i = 0; i < (size_t)T * V; i++) finite &= isfinite(lg[1][i]) != 0;
      for (int t = 0; t < T; t++) agree += test_argmax(lg[1] + (size_t)t * V, V) == test_argmax(lg[0] + (size_t)t * V, V);
      printf("model: V4-Flash shapes, 4 layers, native, %d tokens: MXFP4 tensor-core experts vs CUDA-core ones: logits rel "
             "L2 %.2e, top-1 agreement %d / %d\n", T, e, agree, T);
      CHECKF(finite && e < 2e-2 && e > 0, "model, %d tokens: tensor-core vs CUDA-core experts rel L2 %.3e (finite %d)", T, e,
             finite);
    }
    free(lg[0]);
    free(lg[1]);
  }
  /* chunking: 70 tokens in one step against 69 then 1, the last token's logits; bit-equal with the CUDA-core
   * experts (0) and with the tensor-core ones at every step (1); with 2 the one-token step takes the CUDA-core
   * form (printed only) */
  {
    const int T = 70;
    static const char *modes[3] = {"0", "1", "2"};
    for (int k = 0; k < 3; k++) {
      setenv("DEEPINFER_CUDA_V4_MX_TC", modes[k], 1);
      di_backend *be = NULL;
      float *whole = calloc((size_t)T * V, sizeof(float)), *last = calloc((size_t)V, sizeof(float));
      di_status st = di_backend_cuda_v4_create(&cfg0, &rm.c, &rm.w, &be);
      CHECKF(st == DI_OK, "random V4-Flash model (mx tc %s): %s", modes[k], di_last_error());
      if (st == DI_OK && run_prompt(be, T, whole) && run_split(be, T, T - 1, last)) {
        const int same = memcmp(last, whole + (size_t)(T - 1) * V, sizeof(float) * (size_t)V) == 0;
        printf("model: DEEPINFER_CUDA_V4_MX_TC=%s: the 70th token's logits after 69 + 1 tokens vs 70 in one step: %s "
               "(rel L2 %.2e)\n", modes[k], same ? "bit-identical" : "differ",
               test_rel_l2(last, whole + (size_t)(T - 1) * V, (size_t)V));
        if (k < 2) CHECKF(same, "DEEPINFER_CUDA_V4_MX_TC=%s: chunked logits differ from one step", modes[k]);
      }
      if (be) be->ops->destroy(be);
      free(whole);
      free(last);
    }
  }
  unsetenv("DEEPINFER_CUDA_V4_MX_TC");
  check_modes(&rm, V);
  unsetenv("DEEPINFER_CUDA_V4_NATIVE");
  di_v4_random_model_free(&rm);
}

/* ---- timing ---- */
static void fill_dev(void *d, size_t bytes, int smin, int smax) {
  const size_t chunk = (size_t)64 << 20;
  uint8_t *h = malloc(chunk);
  for (size_t i = 0; i < chunk; i++) h[i] = smin < 0 ? (uint8_t)(urand() * 256) : (uint8_t)(smin + (int)(urand() * (smax - smin + 1)));
  for (size_t off = 0; off < bytes; off += chunk) di_cut_h2d((uint8_t *)d + off, h, bytes - off < chunk ? bytes - off : chunk);
  free(h);
}
static void time_experts(int E, int topk, int D, int I, const int *Ts, int nT) {
  const int ns = topk + 1, E1 = E + 1;
  di_cuk_mxfp4w w[3];
  for (int k = 0; k < 3; k++) {
    const int R = k < 2 ? I : D, C = k < 2 ? D : I;
    w[k].ldq = C / 2;
    w[k].lds = C / 32;
    w[k].q = di_cut_malloc((size_t)E * R * w[k].ldq);
    w[k].scale = di_cut_malloc((size_t)E * R * w[k].lds);
    fill_dev((void *)w[k].q, (size_t)E * R * w[k].ldq, -1, 0);
    fill_dev((void *)w[k].scale, (size_t)E * R * w[k].lds, 118, 122);
  }
  const double expert_bytes = 3.0 * D * I / 2 + 3.0 * D * I / 32;
  for (int it = 0; it < nT; it++) {
    const int T = Ts[it];
    float *x = malloc(4 * (size_t)T * D);
    for (size_t i = 0; i < (size_t)T * D; i++) x[i] = nrand() * 0.5f;
    int32_t *ids = route(T, ns, E);
    int touched = 0, routed = 0;
    char *seen = calloc(E, 1);
    for (int i = 0; i < T * ns; i++)
      if (ids[i] >= 0 && ids[i] < E) routed++, touched += !seen[ids[i]], seen[ids[i]] = 1;
    free(seen);
    float *dx = dup_dev(x, 4 * (size_t)T * D), *da = di_cut_malloc(4 * (size_t)T * ns * I), *dy = di_cut_malloc(4 * (size_t)T * ns * D);
    int32_t *dids = dup_dev(ids, sizeof(int32_t) * (size_t)T * ns);
    int32_t *t8 = di_cut_malloc(4 * (1 + 3 * (size_t)di_v4k_expert_max_tiles(T, ns, E1) + (size_t)T * ns));
    void *ws = di_cut_malloc(di_v4k_mx_tc_ws_bytes(T, ns, D, I, E1));
    double ms[3];
    for (int form = 0; form < 3; form++) { /* 0: CUDA-core, 1: tensor-core form 1, 2: form 0 */
      di_v4k_mx_tc_form(form == 2 ? 0 : 1);
      const int reps = T >= 1024 ? 5 : 20;
      double t0 = 0;
      for (int r = -3; r < reps; r++) {
        if (r == 0) {
          di_cut_sync();
          t0 = di_cut_time_ms();
        }
        di_v4k_expert_tiles(dids, T, ns, E1, t8, NULL);
        if (form == 0) {
          di_v4k_expert_up_mx(dx, dids, t8, E1, w[0], w[1], T, ns, D, I, 10.f, da, NULL);
          di_v4k_expert_down_mx(da, dids, t8, E1, w[2], T, ns, D, I, dy, NULL);
        } else {
          di_v4k_experts_mx_tc(dx, dids, t8, E1, w[0], w[1], w[2], T, ns, D, I, 10.f, ws, dy, NULL);
        }
      }
      CHECK(di_cut_sync() == 0);
      ms[form] = (di_cut_time_ms() - t0) / reps;
    }
    const double flops = 2.0 * 3 * D * I * routed, bytes = touched * expert_bytes;
    const double roof = fmax(bytes / 4.8e9, flops / 989e9), roof16 = fmax(touched * 3.0 * D * I * 2 / 4.8e9, flops / 989e9);
    di_v4k_mx_tc_form(1);
    printf("time mx experts E %3d top-%d T %5d (tile %2d; %3d experts touched): CUDA-core %9.1f us, tensor-core %9.1f us "
           "(%5.2fx; %6.1f TFLOP/s, %5.0f GB/s of MXFP4; form 0 %9.1f us); roofline MXFP4 %8.1f us (tc at %4.0f%%), bf16 %8.1f us\n",
           E, topk, T, di_v4k_mx_tc_pick_tile(T, ns, E1), touched, ms[0] * 1e3, ms[1] * 1e3, ms[0] / ms[1],
           flops / (ms[1] * 1e9), bytes / (ms[1] * 1e6), ms[2] * 1e3, roof * 1e3, 100 * roof / ms[1], roof16 * 1e3);
    free(x); free(ids);
    di_cut_free(dx); di_cut_free(da); di_cut_free(dy); di_cut_free(dids); di_cut_free(t8); di_cut_free(ws);
  }
  for (int k = 0; k < 3; k++) di_cut_free((void *)w[k].q), di_cut_free((void *)w[k].scale);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  int time_only = 0, do_time = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--time")) do_time = 1;
    if (!strcmp(argv[i], "--time-only")) do_time = time_only = 1;
  }
  if (!time_only) {
    check(96, 64, 3, 2, 9, 1, 118, 122, 2e-2, "small, partial K");
    check(4000, 992, 5, 3, 37, 1, 100, 135, 1e-1, "partial K and rows");
    check(4096, 2048, 8, 6, 13, 1, 118, 122, 2e-2, "V4-Flash decode");
    check(4096, 2048, 8, 6, 300, 23, 118, 122, 2e-2, "V4-Flash prefill");
    check_model();
  }
  if (do_time) {
    static const int Ts[] = {1, 16, 64, 256, 4096};
    time_experts(256, 6, 4096, 2048, Ts, 5);
    time_experts(32, 6, 4096, 2048, Ts, 5);
  }
  return test_finish("test_cuda_mx_tc");
}
