/* The op test table (see op_table.h): its rows, their random inputs, and the float64 references. */
#include "backend/op_table.h"
#include "util/numeric.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The rows, one builder per op: each names what varies in that op's rows and fills the rest (fields
 * an op does not read are 0; tolerances are relative L2 bounds, f32 arithmetic / bf16 operands). */
/* x [m][k] times W [n][k] of type wt; FP8 / MXFP4: scale blocks br x bc, e8m0 = UE8M0 scales */
#define GEMM(label, m, n, k, wt, br, bc, e8m0) {DI_OP_GEMM, label, m, n, k, wt, br, bc, e8m0, 1e-5, 1e-2, {0}}
#define GEMM_BF16(label, m, n, k) GEMM(label, m, n, k, DI_DT_BF16, 0, 0, 0)
#define GROUPED_GEMM(label, m, n, k, experts) {DI_OP_GROUPED_GEMM, label, m, n, k, DI_DT_BF16, 0, 0, 0, 1e-5, 1e-2, {experts}}
/* m ids gathered from a bf16 table of vocab x n, compared exactly */
#define EMBED(label, m, n, vocab) {DI_OP_EMBED, label, m, n, 0, DI_DT_BF16, 0, 0, 0, 0, 0, {vocab}}
/* an op on m rows of n floats, its parameters p[] as the op reads them (see op_table.h) */
#define ROWS(op, label, m, n, k, tol_f32, tol_bf16, ...) {op, label, m, n, k, DI_DT_F32, 0, 0, 0, tol_f32, tol_bf16, {__VA_ARGS__}}
#define RMSNORM(label, m, n) ROWS(DI_OP_RMSNORM, label, m, n, 0, 1e-6, 1e-5, 0)
#define SILU_MUL(label, m, n) ROWS(DI_OP_SILU_MUL, label, m, n, 0, 1e-6, 1e-2, 0)
#define ROPE(label, m, dim, tol_f32, interleaved, yarn, max_pos) \
  ROWS(DI_OP_ROPE, label, m, dim, 0, tol_f32, 1e-2, interleaved, yarn, max_pos, 0)
/* scoring: 0 sigmoid noaux_tc, 1 softmax greedy, 2 softmax group-limited */
#define ROUTER(label, m, experts, topk, groups, kept, scoring) \
  ROWS(DI_OP_ROUTER, label, m, experts, 0, 1e-5, 1e-4, topk, groups, kept, scoring)
#define MLA(label, queries, heads, kv_rows, rank, rope, nope, seqs) \
  ROWS(DI_OP_MLA_ATTN, label, queries, heads, kv_rows, 1e-5, 2e-2, rank, rope, nope, seqs)
#define EXACT(op, label, m, n, ...) ROWS(op, label, m, n, 0, 0, 0, __VA_ARGS__) /* compared exactly */

const di_op_case di_op_cases[] = {
    GEMM_BF16("gemm bf16 decode row", 1, 200, 96),
    GEMM_BF16("gemm bf16 odd", 5, 77, 131),
    GEMM_BF16("gemm bf16 panel rows", 33, 64, 256),
    GEMM("gemm f32", 3, 50, 72, DI_DT_F32, 0, 0, 0),
    GEMM("gemm fp8 128x128 f32 scales, partial blocks", 4, 300, 260, DI_DT_F8E4M3, 128, 128, 0),
    GEMM("gemm fp8 128x128 ue8m0 scales", 9, 160, 384, DI_DT_F8E4M3, 128, 128, 1),
    GEMM("gemm fp8 3x5 blocks (scalar path)", 2, 17, 23, DI_DT_F8E4M3, 3, 5, 1),
    GEMM("gemm mxfp4", 3, 64, 512, DI_DT_F4E2M1, 1, 32, 1),
    GEMM("gemm mxfp4 partial block", 1, 37, 72, DI_DT_F4E2M1, 1, 32, 1),
    RMSNORM("rmsnorm hidden 2048", 3, 2048),
    RMSNORM("rmsnorm odd width", 5, 72),
    SILU_MUL("silu_mul 1408", 2, 1408),
    SILU_MUL("silu_mul odd", 3, 37),
    ROPE("rope 64 interleaved", 7, 64, 2e-4, 1, 0, 4096),
    ROPE("rope 64 half-split", 5, 64, 2e-4, 0, 0, 4096),
    ROPE("rope 64 yarn interleaved (V2/V3)", 9, 64, 2e-4, 1, 1, 4096),
    ROPE("rope 64 yarn, positions to 160k", 6, 64, 3e-3, 1, 1, 163840),
    ROPE("rope 32 yarn half-split", 4, 32, 2e-4, 0, 1, 4096),
    ROUTER("router sigmoid noaux_tc 256 top 8 of 4/8 groups (V3)", 5, 256, 8, 8, 4, 0),
    ROUTER("router sigmoid noaux_tc 64 top 6 of 3/8 groups", 6, 64, 6, 8, 3, 0),
    ROUTER("router softmax greedy 64 top 6 (V2-Lite)", 6, 64, 6, 1, 1, 1),
    ROUTER("router softmax group-limited 160 top 6 of 3/8 (V2)", 3, 160, 6, 8, 3, 2),
    GROUPED_GEMM("grouped gemm bf16 8 experts, skewed rows", 40, 256, 128, 8),
    GROUPED_GEMM("grouped gemm bf16 64 experts, decode-sized", 6, 128, 192, 64),
    EMBED("embedding gather", 9, 96, 1000),
    /* argmax: p = rows with a planted tie */
    EXACT(DI_OP_ARGMAX, "argmax 129280 vocabulary, ties", 3, 129280, 2),
    EXACT(DI_OP_ARGMAX, "argmax odd vocabulary", 4, 37, 1),
    /* sequences: 1 = one prefill chunk, m = m decoding sequences */
    MLA("mla prefill 24 queries over 150 rows, 16 heads", 24, 16, 150, 512, 64, 128, 1),
    MLA("mla decode 3 sequences to 200 rows, 16 heads", 3, 16, 200, 512, 64, 128, 3),
    MLA("mla prefill odd shapes (rank 40, 3 heads)", 5, 3, 70, 40, 16, 24, 1),
    /* p: hc streams, Sinkhorn iterations */
    ROWS(DI_OP_V4_HC, "v4 mHC weights, 4 streams, Sinkhorn 20", 5, 64, 0, 1e-6, 1e-2, 4, 20),
    /* p: top-k, hash routing */
    ROWS(DI_OP_V4_ROUTE, "v4 router sqrtsoftplus 64 experts top 6", 6, 64, 0, 1e-6, 1e-3, 6, 0),
    ROWS(DI_OP_V4_ROUTE, "v4 router hash routing (a repeated expert)", 4, 64, 0, 1e-6, 1e-3, 6, 1),
    /* p: k */
    EXACT(DI_OP_V4_TOPK, "v4 indexer top-8 of 300, ties", 4, 300, 8),
    EXACT(DI_OP_V4_TOPK, "v4 indexer top-64 of 70, ties", 3, 70, 64),
};
const int di_n_op_cases = (int)(sizeof di_op_cases / sizeof di_op_cases[0]);

static uint64_t next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}
static float uni(uint64_t *s) { return (float)((next(s) >> 40) * (1.0 / 8388608.0)) - 1.0f; } /* [-1, 1) */

/* d->w: R x C in the row's weight format, random */
static di_status make_weight(const di_op_case *c, int64_t R, int64_t C, uint64_t *s, di_op_data *d) {
  di_weight *w = &d->w;
  w->name = c->label;
  w->dtype = c->wtype;
  w->rows = R;
  w->cols = C;
  if (c->wtype == DI_DT_BF16 || c->wtype == DI_DT_F32) {
    const size_t esz = c->wtype == DI_DT_BF16 ? 2 : 4;
    d->wdata = malloc((size_t)(R * C) * esz);
    if (!d->wdata) return di_error_set(DI_ERR_OOM, "op table: out of memory");
    for (int64_t i = 0; i < R * C; i++) {
      const float v = uni(s) * 0.1f;
      if (esz == 2) ((uint16_t *)d->wdata)[i] = di_f32_to_bf16(v);
      else ((float *)d->wdata)[i] = v;
    }
    w->data = d->wdata;
    return DI_OK;
  }
  if (c->wtype != DI_DT_F8E4M3 && c->wtype != DI_DT_F4E2M1)
    return di_error_set(DI_ERR_INVALID_ARG, "op table: %s: weight type %s", c->label, di_dtype_name(c->wtype));
  w->block_rows = c->block_rows;
  w->block_cols = c->block_cols;
  w->scale_cols = (C + c->block_cols - 1) / c->block_cols;
  const int64_t ns = (R + c->block_rows - 1) / c->block_rows * w->scale_cols;
  const size_t bytes = c->wtype == DI_DT_F4E2M1 ? (size_t)(R * (C / 2)) : (size_t)(R * C);
  d->wdata = malloc(bytes);
  d->wscales = malloc((size_t)ns * (c->e8m0 ? 1 : 4));
  if (!d->wdata || !d->wscales) return di_error_set(DI_ERR_OOM, "op table: out of memory");
  for (size_t i = 0; i < bytes; i++) {
    uint8_t v = (uint8_t)(next(s) >> 32);
    if (c->wtype == DI_DT_F8E4M3 && (v & 0x7f) == 0x7f) v = 0x3f; /* no NaN codes */
    ((uint8_t *)d->wdata)[i] = v;
  }
  for (int64_t i = 0; i < ns; i++) {
    if (c->e8m0) ((uint8_t *)d->wscales)[i] = (uint8_t)(127 - 10 + (next(s) >> 32) % 6); /* 2^-10 .. 2^-5 */
    else ((float *)d->wscales)[i] = (float)(((next(s) >> 32) % 1000 + 1) * 2e-6);
  }
  w->data = d->wdata;
  if (c->e8m0) w->scale_e8m0 = d->wscales;
  else w->scale_inv = d->wscales;
  const char *why = NULL;
  if (di_weight_check_format(w, &why))
    return di_error_set(DI_ERR_INVALID_ARG, "op table: %s: %s", c->label, why);
  return DI_OK;
}

/* the configuration a ROPE row reads (the model's fields; YaRN as DeepSeek-V2/V3 ship it) */
static void rope_config(const di_op_case *c, di_model_config *cfg) {
  cfg->qk_rope_head_dim = c->n;
  cfg->rope_interleave = c->p[0];
  cfg->rope_yarn = c->p[1];
  cfg->rope_theta = 10000.0;
  cfg->yarn_factor = 40;
  cfg->yarn_beta_fast = 32;
  cfg->yarn_beta_slow = 1;
  cfg->yarn_original_max_pos = 4096;
  cfg->rope_attention_factor = c->p[1] ? (float)(0.1 * log(40.0) + 1.0) : 1.0f;
}

static void router_config(const di_op_case *c, di_model_config *cfg) {
  static const di_topk_method method[3] = {DI_TOPK_NOAUX_TC, DI_TOPK_GREEDY, DI_TOPK_GROUP_LIMITED_GREEDY};
  static const float scale[3] = {2.5f, 1.0f, 16.0f};
  cfg->n_routed_experts = c->n;
  cfg->num_experts_per_tok = c->p[0];
  cfg->n_group = c->p[1];
  cfg->topk_group = c->p[2];
  cfg->topk_method = method[c->p[3]];
  cfg->scoring_func = c->p[3] == 0 ? DI_SCORE_SIGMOID : DI_SCORE_SOFTMAX;
  cfg->norm_topk_prob = c->p[3] == 0;
  cfg->routed_scaling_factor = scale[c->p[3]];
  cfg->scale_after_renorm = c->p[3] == 0;
}

static di_status make_router(const di_op_case *c, uint64_t *s, di_op_data *d) {
  const int E = c->n, K = c->p[0];
  router_config(c, &d->cfg);
  d->bias = malloc(sizeof(float) * (size_t)E);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)K);
  double *w = malloc(sizeof(double) * (size_t)K);
  if (!d->bias || !ids || !w) {
    free(ids);
    free(w);
    return di_error_set(DI_ERR_OOM, "op table: out of memory");
  }
  for (int e = 0; e < E; e++) d->bias[e] = c->p[3] == 0 ? uni(s) * 0.25f : 0.0f;
  d->n_out = 2 * (int64_t)c->m * K;
  d->n_exact = (int64_t)c->m * K;
  for (int t = 0; t < c->m; t++) {
    float *lg = d->x + (int64_t)t * E;
    for (int tries = 0;; tries++) { /* redraw until no decision is a near tie */
      for (int e = 0; e < E; e++) lg[e] = uni(s) * 4.0f;
      if (di_op_ref_route(lg, d->bias, &d->cfg, ids, w) >= 1e-4) break;
      if (tries == 200) {
        free(ids);
        free(w);
        return di_error_set(DI_ERR_INTERNAL, "op table: %s: no inputs without near ties", c->label);
      }
    }
    for (int k = 0; k < K; k++) {
      d->ref[(int64_t)t * K + k] = ids[k];
      d->ref[d->n_exact + (int64_t)t * K + k] = w[k];
    }
  }
  free(ids);
  free(w);
  return DI_OK;
}

void di_op_mla_query(const di_op_case *c, int i, int *seq, int *pos) {
  *seq = c->p[3] == 1 ? 0 : i;
  *pos = c->p[3] == 1 ? c->k - c->m + i : c->k - 37 * i - 1;
}

static di_status make_mla(const di_op_case *c, uint64_t *s, di_op_data *d) {
  const int R = c->p[0], dr = c->p[1], dn = c->p[2], NH = c->n;
  if (dr > DI_OP_MAX_ROPE || dr % 2 || (c->p[3] != 1 && c->p[3] != c->m) || c->k - 37 * (c->p[3] - 1) < 1)
    return di_error_set(DI_ERR_INVALID_ARG, "op table: %s: bad MLA shape", c->label);
  d->n_seqs = c->p[3];
  d->cfg.num_attention_heads = NH;
  d->cfg.kv_lora_rank = R;
  d->cfg.qk_rope_head_dim = dr;
  d->cfg.qk_nope_head_dim = d->cfg.v_head_dim = dn;
  d->cfg.softmax_scale = (float)(1.0 / sqrt((double)(dn + dr)));
  d->cfg.rope_theta = 10000.0;
  d->cfg.rope_interleave = 1;
  d->cfg.rope_attention_factor = 1.0f;
  const size_t nkv = (size_t)d->n_seqs * c->k * (R + dr), nuk = (size_t)NH * R * dn;
  d->kv = malloc(sizeof(float) * nkv);
  d->w_uk = malloc(sizeof(float) * nuk);
  d->w_uv = malloc(sizeof(float) * nuk);
  d->inv_freq = malloc(sizeof(float) * (size_t)(dr / 2));
  if (!d->kv || !d->w_uk || !d->w_uv || !d->inv_freq) return di_error_set(DI_ERR_OOM, "op table: out of memory");
  for (size_t i = 0; i < nkv; i++) d->kv[i] = uni(s);
  for (size_t i = 0; i < nuk; i++) d->w_uk[i] = uni(s) * 0.1f;
  for (size_t i = 0; i < nuk; i++) d->w_uv[i] = uni(s) * 0.1f;
  double inv[DI_OP_MAX_ROPE / 2];
  di_rope_inv_freq(&d->cfg, inv);
  for (int i = 0; i < dr / 2; i++) d->inv_freq[i] = (float)inv[i];
  for (int i = 0; i < c->m; i++) {
    int sq;
    di_op_mla_query(c, i, &sq, &d->ids[i]);
  }
  di_op_ref_mla_attn(d, d->ref);
  return DI_OK;
}

static int64_t x_count(const di_op_case *c) {
  switch (c->op) {
  case DI_OP_GEMM:
  case DI_OP_GROUPED_GEMM: return (int64_t)c->m * c->k;
  case DI_OP_SILU_MUL: return 2 * (int64_t)c->m * c->n;
  case DI_OP_EMBED: return 1;
  case DI_OP_MLA_ATTN: return (int64_t)c->m * c->n * (c->p[2] + c->p[1]);
  case DI_OP_V4_HC: return (int64_t)c->m * c->p[0] * c->n;
  default: return (int64_t)c->m * c->n;
  }
}

di_status di_op_data_make(const di_op_case *c, uint64_t seed, di_op_data *d) {
  memset(d, 0, sizeof *d);
  d->c = c;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)(c - di_op_cases) + 1;
  const int64_t xn = x_count(c);
  d->n_out = c->op == DI_OP_ARGMAX ? c->m : c->op == DI_OP_ROUTER ? 2 * (int64_t)c->m * c->p[0]
            : c->op == DI_OP_MLA_ATTN ? (int64_t)c->m * c->n * c->p[2]
            : c->op == DI_OP_V4_HC    ? (int64_t)c->m * (2 + c->p[0]) * c->p[0]
                                      : (int64_t)c->m * c->n;
  d->x = malloc(sizeof(float) * (size_t)xn);
  d->ref = malloc(sizeof(double) * (size_t)d->n_out);
  d->ids = malloc(sizeof(int32_t) * (size_t)c->m);
  if (!d->x || !d->ref || !d->ids) return di_error_set(DI_ERR_OOM, "op table: out of memory");
  for (int64_t i = 0; i < xn; i++) d->x[i] = uni(&s) * (c->op == DI_OP_SILU_MUL ? 4.f : 1.f);
  d->eps = 1e-6f;
  switch (c->op) {
  case DI_OP_GEMM:
    DI_TRY(make_weight(c, c->n, c->k, &s, d));
    di_op_ref_gemm(d->x, c->m, c->k, &d->w, d->ref);
    break;
  case DI_OP_ROPE: {
    rope_config(c, &d->cfg);
    double inv[DI_OP_MAX_ROPE / 2];
    if (c->n > DI_OP_MAX_ROPE || c->n % 2) return di_error_set(DI_ERR_INVALID_ARG, "op table: %s: rope dim %d", c->label, c->n);
    d->inv_freq = malloc(sizeof(float) * (size_t)(c->n / 2));
    if (!d->inv_freq) return di_error_set(DI_ERR_OOM, "op table: out of memory");
    di_rope_inv_freq(&d->cfg, inv);
    for (int i = 0; i < c->n / 2; i++) d->inv_freq[i] = (float)inv[i];
    for (int t = 0; t < c->m; t++) d->ids[t] = (int32_t)(next(&s) % (uint64_t)c->p[2]);
    d->ids[0] = c->p[2] - 1; /* the longest position */
    di_op_ref_rope(d->x, c->m, c->n, d->ids, &d->cfg, d->ref);
    break;
  }
  case DI_OP_ROUTER: DI_TRY(make_router(c, &s, d)); break;
  case DI_OP_GROUPED_GEMM: {
    const int E = c->p[0];
    DI_TRY(make_weight(c, (int64_t)E * c->n, c->k, &s, d));
    /* skewed: half the rows to expert 1, experts 0 and E-1 none, the rest random */
    for (int i = 0; i < c->m; i++)
      d->ids[i] = i % 2 == 0 || E < 4 ? 1 % E : 1 + (int32_t)(next(&s) % (uint64_t)(E - 2));
    di_op_ref_grouped_gemm(d->x, c->m, c->k, d->ids, &d->w, c->n, d->ref);
    break;
  }
  case DI_OP_EMBED:
    DI_TRY(make_weight(c, c->p[0], c->n, &s, d));
    for (int i = 0; i < c->m; i++) d->ids[i] = (int32_t)(next(&s) % (uint64_t)c->p[0]);
    d->ids[c->m - 1] = c->p[0] - 1; /* the last row of the table */
    for (int i = 0; i < c->m; i++)
      for (int j = 0; j < c->n; j++) d->ref[(int64_t)i * c->n + j] = di_weight_get(&d->w, d->ids[i], j);
    d->n_exact = d->n_out;
    break;
  case DI_OP_MLA_ATTN: DI_TRY(make_mla(c, &s, d)); break;
  case DI_OP_V4_HC: {
    const int hc = c->p[0], mix = (2 + hc) * hc;
    const int64_t nf = (int64_t)mix * hc * c->n;
    d->v4.hc_mult = hc;
    d->v4.hidden_size = c->n;
    d->v4.hc_sinkhorn_iters = c->p[1];
    d->v4.rms_eps = 1e-6;
    d->v4.hc_eps = 1e-6;
    d->aux = malloc(sizeof(float) * (size_t)(nf + mix + 3));
    if (!d->aux) return di_error_set(DI_ERR_OOM, "op table: out of memory");
    for (int64_t i = 0; i < nf; i++) d->aux[i] = uni(&s) * 0.1f;
    for (int i = 0; i < mix; i++) d->aux[nf + i] = uni(&s);
    for (int i = 0; i < 3; i++) d->aux[nf + mix + i] = 0.5f + 0.5f * uni(&s);
    di_op_ref_v4_hc(d, d->ref);
    break;
  }
  case DI_OP_V4_ROUTE: {
    const int E = c->n, K = c->p[0];
    d->v4.n_routed_experts = E;
    d->v4.top_k = K;
    d->v4.scoring = DI_V4_SCORE_SQRTSOFTPLUS;
    d->v4.routed_scaling = 1.5;
    d->bias = malloc(sizeof(float) * (size_t)E);
    d->hash_ids = malloc(sizeof(int32_t) * (size_t)c->m * K);
    if (!d->bias || !d->hash_ids) return di_error_set(DI_ERR_OOM, "op table: out of memory");
    for (int e = 0; e < E; e++) d->bias[e] = uni(&s) * 0.1f;
    for (int i = 0; i < c->m * K; i++) d->hash_ids[i] = (int32_t)(next(&s) % (uint64_t)E);
    for (int t = 0; t < c->m; t++) {
      d->hash_ids[t * K + K - 1] = d->hash_ids[t * K]; /* index_add counts a repeated expert twice */
      float *lg = d->x + (int64_t)t * E;
      for (int tries = 0;; tries++) {
        for (int e = 0; e < E; e++) lg[e] = uni(&s) * 4.0f;
        if (di_op_ref_v4_route(&d->v4, lg, d->bias, c->p[1] ? d->hash_ids + t * K : NULL, d->ref + (int64_t)t * E) >= 1e-4)
          break;
        if (tries == 200) return di_error_set(DI_ERR_INTERNAL, "op table: %s: no inputs without near ties", c->label);
      }
    }
    break;
  }
  case DI_OP_V4_TOPK:
    for (int64_t i = 0; i < (int64_t)c->m * c->n; i++) d->x[i] = (float)(int)(next(&s) % 16) * 0.25f - 2.0f;
    di_op_ref_v4_topk(d->x, c->m, c->n, c->p[0], d->ref);
    d->n_exact = d->n_out;
    break;
  case DI_OP_ARGMAX:
    for (int i = 0; i < c->m && i < c->p[0]; i++) { /* a tie at the maximum: the lower index wins */
      float *row = d->x + (int64_t)i * c->n;
      const int64_t a = (int64_t)(next(&s) % (uint64_t)c->n), b = (int64_t)(next(&s) % (uint64_t)c->n);
      row[a] = row[b] = 2.0f;
    }
    di_op_ref_argmax(d->x, c->m, c->n, d->ref);
    d->n_exact = d->n_out;
    break;
  case DI_OP_RMSNORM:
    d->nw = malloc(sizeof(float) * (size_t)c->n);
    if (!d->nw) return di_error_set(DI_ERR_OOM, "op table: out of memory");
    for (int i = 0; i < c->n; i++) d->nw[i] = 1.0f + 0.5f * uni(&s);
    di_op_ref_rmsnorm(d->x, c->m, c->n, d->nw, d->eps, d->ref);
    break;
  case DI_OP_SILU_MUL: di_op_ref_silu_mul(d->x, c->m, c->n, d->ref); break;
  default: return di_error_set(DI_ERR_INVALID_ARG, "op table: unknown op %d", (int)c->op);
  }
  return DI_OK;
}

void di_op_data_free(di_op_data *d) {
  free(d->aux);
  free(d->hash_ids);
  free(d->kv);
  free(d->w_uk);
  free(d->w_uv);
  free(d->ids);
  free(d->bias);
  free(d->inv_freq);
  free(d->x);
  free(d->nw);
  free(d->wdata);
  free(d->wscales);
  free(d->ref);
  memset(d, 0, sizeof *d);
}

/* ---- float64 references ---------------------------------------------------------------------- */

/* element (r, c): the stored code's value times its block scale, in float64 (no rounding) */
static double weight_f64(const di_weight *w, int64_t r, int64_t c) {
  if (w->dtype == DI_DT_F8E4M3)
    return (double)di_fp8e4m3_to_f32(((const uint8_t *)w->data)[r * w->cols + c]) * di_weight_scale(w, r, c);
  if (w->dtype == DI_DT_F4E2M1) {
    const uint8_t b = ((const uint8_t *)w->data)[r * (w->cols / 2) + c / 2];
    return (double)di_e2m1_table[(c & 1) ? b >> 4 : b & 15] * di_weight_scale(w, r, c);
  }
  return di_weight_get(w, r, c);
}

void di_op_ref_gemm(const float *x, int m, int k, const di_weight *w, double *y) {
  double *row = malloc(sizeof(double) * (size_t)k);
  for (int64_t n = 0; n < w->rows; n++) {
    /* one weight row dequantized in float64 (the value times its block scale, both exact) */
    for (int kk = 0; kk < k; kk++) row[kk] = weight_f64(w, n, kk);
    for (int i = 0; i < m; i++) {
      double a = 0;
      for (int kk = 0; kk < k; kk++) a += (double)x[(int64_t)i * k + kk] * row[kk];
      y[(int64_t)i * w->rows + n] = a;
    }
  }
  free(row);
}

void di_op_ref_rmsnorm(const float *x, int m, int n, const float *w, double eps, double *y) {
  for (int i = 0; i < m; i++) {
    const float *xr = x + (int64_t)i * n;
    double ss = 0;
    for (int j = 0; j < n; j++) ss += (double)xr[j] * xr[j];
    const double r = 1.0 / sqrt(ss / n + eps);
    for (int j = 0; j < n; j++) y[(int64_t)i * n + j] = (double)xr[j] * r * w[j];
  }
}

void di_op_ref_silu_mul(const float *x, int m, int n, double *y) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      const double g = x[(int64_t)i * 2 * n + j], u = x[(int64_t)i * 2 * n + n + j];
      y[(int64_t)i * n + j] = g / (1.0 + exp(-g)) * u;
    }
}

void di_op_ref_rope(const float *x, int m, int n, const int32_t *pos, const di_model_config *c, double *y) {
  const int half = n / 2;
  const double base = c->rope_theta, dim = n;
  double af = 1.0;
  if (c->rope_yarn) af = 0.1 * log(c->yarn_factor) + 1.0; /* mscale 1, mscale_all_dim 0 */
  for (int i = 0; i < half; i++) {
    /* inv_freq in float64: extrapolated base^(-2i/d), YaRN's interpolated one blended by its ramp */
    const double extra = pow(base, -2.0 * i / dim);
    double f = extra;
    if (c->rope_yarn) {
      const double omax = c->yarn_original_max_pos;
      double low = floor(dim * log(omax / (c->yarn_beta_fast * 2 * M_PI)) / (2 * log(base)));
      double high = ceil(dim * log(omax / (c->yarn_beta_slow * 2 * M_PI)) / (2 * log(base)));
      low = low < 0 ? 0 : low;
      high = high > dim - 1 ? dim - 1 : high;
      if (low == high) high += 0.001;
      double ramp = (i - low) / (high - low);
      ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
      f = extra / c->yarn_factor * ramp + extra * (1.0 - ramp);
    }
    for (int t = 0; t < m; t++) {
      const double ang = (double)pos[t] * f, cs = cos(ang) * af, sn = sin(ang) * af;
      const int i0 = c->rope_interleave ? 2 * i : i, i1 = c->rope_interleave ? 2 * i + 1 : i + half;
      const double x0 = x[(int64_t)t * n + i0], x1 = x[(int64_t)t * n + i1];
      y[(int64_t)t * n + i0] = x0 * cs - x1 * sn;
      y[(int64_t)t * n + i1] = x1 * cs + x0 * sn;
    }
  }
}

double di_op_ref_route(const float *logits, const float *bias, const di_model_config *c, int32_t *ids, double *w) {
  const int E = c->n_routed_experts, K = c->num_experts_per_tok;
  double *score = malloc(sizeof(double) * 2 * (size_t)E), *choice = score + E, margin = INFINITY;
  if (!score) return -1;
  double mx = -INFINITY, sum = 0;
  for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
  for (int e = 0; e < E; e++) {
    score[e] = c->scoring_func == DI_SCORE_SOFTMAX ? exp(logits[e] - mx) : 1.0 / (1.0 + exp(-(double)logits[e]));
    sum += score[e];
  }
  for (int e = 0; e < E; e++) {
    if (c->scoring_func == DI_SCORE_SOFTMAX) score[e] /= sum;
    choice[e] = score[e] + (c->topk_method == DI_TOPK_NOAUX_TC && bias ? bias[e] : 0.0);
  }
  if (c->topk_method != DI_TOPK_GREEDY && c->n_group > 1) {
    const int G = c->n_group, per = E / G;
    double gs[DI_MAX_EXPERT_GROUPS];
    int kept[DI_MAX_EXPERT_GROUPS] = {0};
    for (int g = 0; g < G; g++) {
      double a = -INFINITY, b = -INFINITY;
      for (int i = 0; i < per; i++) {
        const double v = choice[g * per + i];
        if (v > a) {
          b = a;
          a = v;
        } else if (v > b) {
          b = v;
        }
      }
      gs[g] = c->topk_method == DI_TOPK_NOAUX_TC ? a + b : a;
    }
    for (int k = 0; k <= c->topk_group && k < G; k++) { /* the kept groups, and the best one left out */
      int best = -1;
      for (int g = 0; g < G; g++)
        if (!kept[g] && (best < 0 || gs[g] > gs[best])) best = g;
      if (k > 0 && k <= c->topk_group) {
        double prev = INFINITY;
        for (int g = 0; g < G; g++)
          if (kept[g] && gs[g] < prev) prev = gs[g];
        margin = fmin(margin, prev - gs[best]);
      }
      if (k < c->topk_group) kept[best] = 1;
    }
    for (int g = 0; g < G; g++)
      if (!kept[g])
        for (int i = 0; i < per; i++) choice[g * per + i] = -INFINITY;
  }
  double wsum = 0;
  for (int k = 0; k <= K && k < E; k++) { /* the picks in order, and the best one left out */
    int best = -1;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int j = 0; j < k && j < K; j++) taken |= ids[j] == e;
      if (!taken && (best < 0 || choice[e] > choice[best])) best = e;
    }
    if (k > 0 && choice[best] > -INFINITY) margin = fmin(margin, choice[ids[k - 1]] - choice[best]);
    if (k < K) {
      ids[k] = best;
      w[k] = score[best];
      wsum += w[k];
    }
  }
  const int renorm = K > 1 && c->norm_topk_prob;
  for (int k = 0; k < K; k++) {
    if (renorm) w[k] /= wsum;
    if (c->scale_after_renorm || !renorm) w[k] *= c->routed_scaling_factor;
  }
  free(score);
  return margin;
}

void di_op_ref_grouped_gemm(const float *x, int m, int k, const int32_t *expert, const di_weight *w, int n, double *y) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double a = 0;
      for (int kk = 0; kk < k; kk++) a += (double)x[(int64_t)i * k + kk] * weight_f64(w, (int64_t)expert[i] * n + j, kk);
      y[(int64_t)i * n + j] = a;
    }
}

void di_op_ref_argmax(const float *x, int m, int n, double *y) {
  for (int i = 0; i < m; i++) {
    int best = 0;
    for (int j = 1; j < n; j++)
      if ((double)x[(int64_t)i * n + j] > (double)x[(int64_t)i * n + best]) best = j;
    y[i] = best;
  }
}

void di_op_ref_mla_attn(const di_op_data *d, double *y) {
  const di_op_case *c = d->c;
  const int R = c->p[0], dr = c->p[1], dn = c->p[2], NH = c->n, dq = dn + dr;
  double *qlat = malloc(sizeof(double) * (size_t)(R + dr + c->k + R)), *qpe = qlat + R, *p = qpe + dr, *olat = p + c->k;
  if (!qlat) return;
  const double scale = 1.0 / sqrt((double)dq);
  for (int i = 0; i < c->m; i++) {
    int sq, pos;
    di_op_mla_query(c, i, &sq, &pos);
    const float *kv = d->kv + (size_t)sq * c->k * (R + dr);
    for (int h = 0; h < NH; h++) {
      const float *q = d->x + ((size_t)i * NH + h) * dq;
      for (int r = 0; r < R; r++) {
        double a = 0;
        for (int e = 0; e < dn; e++) a += (double)d->w_uk[((size_t)h * R + r) * dn + e] * q[e];
        qlat[r] = a;
      }
      for (int j = 0; j < dr / 2; j++) { /* interleaved pairs, the angle in float64 */
        const double ang = (double)pos * d->inv_freq[j], cs = cos(ang), sn = sin(ang);
        const double x0 = q[dn + 2 * j], x1 = q[dn + 2 * j + 1];
        qpe[2 * j] = x0 * cs - x1 * sn;
        qpe[2 * j + 1] = x1 * cs + x0 * sn;
      }
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j <= pos; j++) {
        const float *e = kv + (size_t)j * (R + dr);
        double a = 0;
        for (int r = 0; r < R; r++) a += qlat[r] * e[r];
        for (int r = 0; r < dr; r++) a += qpe[r] * e[R + r];
        p[j] = a * scale;
        mx = p[j] > mx ? p[j] : mx;
      }
      for (int j = 0; j <= pos; j++) sum += (p[j] = exp(p[j] - mx));
      for (int r = 0; r < R; r++) olat[r] = 0;
      for (int j = 0; j <= pos; j++)
        for (int r = 0; r < R; r++) olat[r] += p[j] / sum * kv[(size_t)j * (R + dr) + r];
      for (int e = 0; e < dn; e++) {
        double a = 0;
        for (int r = 0; r < R; r++) a += (double)d->w_uv[((size_t)h * dn + e) * R + r] * olat[r];
        y[((size_t)i * NH + h) * dn + e] = a;
      }
    }
  }
  free(qlat);
}

static double sigmoid64(double v) { return 1.0 / (1.0 + exp(-v)); }

void di_op_ref_v4_hc(const di_op_data *d, double *y) {
  const di_op_case *c = d->c;
  const int hc = c->p[0], n = hc * c->n, mix = (2 + hc) * hc;
  const float *fnw = d->aux, *base = d->aux + (int64_t)mix * n, *scale = base + mix;
  const double eps = d->v4.hc_eps;
  double mixes[64 * 66], cm[64 * 64];
  for (int t = 0; t < c->m; t++) {
    const float *X = d->x + (int64_t)t * n;
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)X[i] * X[i];
    const double r = 1.0 / sqrt(ss / n + d->v4.rms_eps); /* the streams' RMS norm, applied after the product */
    for (int k = 0; k < mix; k++) {
      double a = 0;
      for (int i = 0; i < n; i++) a += (double)fnw[(int64_t)k * n + i] * X[i];
      mixes[k] = a * r;
    }
    double *o = y + (int64_t)t * mix;
    for (int j = 0; j < hc; j++) {
      o[j] = sigmoid64(mixes[j] * scale[0] + base[j]) + eps;
      o[hc + j] = 2.0 * sigmoid64(mixes[hc + j] * scale[1] + base[hc + j]);
    }
    for (int j = 0; j < hc; j++) { /* softmax of each row, + eps */
      double mx = -INFINITY, sum = 0;
      for (int k = 0; k < hc; k++) {
        cm[j * hc + k] = mixes[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
        mx = fmax(mx, cm[j * hc + k]);
      }
      for (int k = 0; k < hc; k++) sum += exp(cm[j * hc + k] - mx);
      for (int k = 0; k < hc; k++) cm[j * hc + k] = exp(cm[j * hc + k] - mx) / sum + eps;
    }
    for (int it = 0; it < d->v4.hc_sinkhorn_iters; it++) { /* columns first; then rows, columns */
      for (int pass = it == 0 ? 1 : 0; pass < 2; pass++)
        for (int a = 0; a < hc; a++) {
          double sum = 0;
          for (int b = 0; b < hc; b++) sum += pass ? cm[b * hc + a] : cm[a * hc + b];
          for (int b = 0; b < hc; b++) *(pass ? &cm[b * hc + a] : &cm[a * hc + b]) /= sum + eps;
        }
    }
    for (int k = 0; k < hc * hc; k++) o[2 * hc + k] = cm[k];
  }
}

double di_op_ref_v4_route(const di_v4_config *c, const float *logits, const float *bias, const int32_t *hash_ids, double *y) {
  const int E = c->n_routed_experts, K = c->top_k;
  double sc[1024], ch[1024], margin = INFINITY, sum = 0;
  int idx[64];
  unsigned char taken[1024] = {0};
  for (int e = 0; e < E; e++) {
    const double x = logits[e], sp = x > 20 ? x : log1p(exp(x));
    sc[e] = sqrt(sp);
    ch[e] = sc[e] + bias[e];
    y[e] = 0;
  }
  for (int k = 0; k < K; k++) {
    if (hash_ids) {
      idx[k] = hash_ids[k];
      continue;
    }
    int best = -1;
    for (int e = 0; e < E; e++)
      if (!taken[e] && (best < 0 || ch[e] > ch[best])) best = e;
    taken[best] = 1;
    idx[k] = best;
  }
  if (!hash_ids) { /* the last pick against the best one left out */
    int out = -1;
    for (int e = 0; e < E; e++)
      if (!taken[e] && (out < 0 || ch[e] > ch[out])) out = e;
    if (out >= 0) margin = ch[idx[K - 1]] - ch[out];
  }
  for (int k = 0; k < K; k++) sum += sc[idx[k]];
  for (int k = 0; k < K; k++) y[idx[k]] += sc[idx[k]] / sum * c->routed_scaling;
  return margin;
}

void di_op_ref_v4_topk(const float *x, int m, int n, int k, double *y) {
  for (int i = 0; i < m; i++) {
    const float *v = x + (int64_t)i * n;
    for (int j = 0; j < n; j++) { /* j is chosen when fewer than k entries rank before it */
      int before = 0;
      for (int q = 0; q < n; q++) before += v[q] > v[j] || (v[q] == v[j] && q < j);
      y[(int64_t)i * n + j] = before < k;
    }
  }
}

/* ---- the check --------------------------------------------------------------------------------- */

static double rel_l2(const double *ref, const float *got, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (got[i] != got[i]) return INFINITY;
    num += (ref[i] - got[i]) * (ref[i] - got[i]);
    den += ref[i] * ref[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

di_op_report di_op_check(const char *backend, di_op_runner run, void *ctx, int bf16_operands, uint64_t seed,
                         FILE *log) {
  di_op_report r = {0, 0, 0, 0};
  for (int i = 0; i < di_n_op_cases; i++) {
    const di_op_case *c = &di_op_cases[i];
    di_op_data d;
    float *out = NULL;
    di_status st = di_op_data_make(c, seed, &d);
    if (st == DI_OK) {
      out = malloc(sizeof(float) * (size_t)d.n_out);
      st = out ? run(ctx, &d, out) : di_error_set(DI_ERR_OOM, "op table: out of memory");
    }
    r.run++;
    const double tol = bf16_operands ? c->tol_bf16 : c->tol_f32;
    if (st == DI_ERR_UNSUPPORTED) {
      r.unsupported++;
      if (log) fprintf(log, "%-6s %-46s unsupported: %s\n", backend, c->label, di_last_error());
    } else if (st != DI_OK) {
      r.failed++;
      if (log) fprintf(log, "%-6s %-46s FAILED: %s\n", backend, c->label, di_last_error());
    } else {
      int64_t bad = -1;
      for (int64_t j = 0; j < d.n_exact && bad < 0; j++)
        if ((double)out[j] != d.ref[j]) bad = j;
      const double err = bad >= 0 ? INFINITY : rel_l2(d.ref + d.n_exact, out + d.n_exact, d.n_out - d.n_exact);
      const int ok = err <= tol;
      if (bad >= 0 && log)
        fprintf(log, "%-6s %-46s output %lld is %g, exactly %g expected\n", backend, c->label, (long long)bad, out[bad],
                d.ref[bad]);
      if (ok) r.passed++;
      else r.failed++;
      if (log) fprintf(log, "%-6s %-46s rel err %.2e (bound %.0e) %s\n", backend, c->label, err, tol, ok ? "ok" : "FAILED");
    }
    free(out);
    di_op_data_free(&d);
  }
  return r;
}
