/* The CUDA backend's runner of the op test table (backend/op_table.h): each case computed with the
 * kernels the forward pass launches, its weights brought to the device by the backend's own upload
 * (cuda_upload.cu: every format dequantized to bf16 rows at load, for now), activations rounded to bf16
 * where the forward rounds them. Synchronous; device memory per call (a test path, not the decode one).
 * Rows: GEMM (skinny / cuBLASLt), RMSNorm, SiLU-mul, RoPE (through the MLA preparation), the router,
 * the grouped expert GEMM / GEMV, the MLA attention kernel, the embedding gather, greedy sampling. */
#include "cuda_backend_impl.cuh"
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "backend/op_table.h"
}

namespace {
struct dev_bufs { /* freed together */
  void *p[12] = {};
  int n = 0;
  void *get(size_t bytes) {
    void *q = NULL;
    if (n < 12 && cudaMalloc(&q, bytes ? bytes : 16) == cudaSuccess) p[n++] = q;
    return q;
  }
  ~dev_bufs() {
    for (int i = 0; i < n; i++) cudaFree(p[i]);
  }
};
}

static di_status to_bf16_dev(const float *x, size_t n, void *dst) {
  uint16_t *h = (uint16_t *)malloc(n * 2);
  if (!h) return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
  for (size_t i = 0; i < n; i++) h[i] = di_f32_to_bf16(x[i]);
  cudaError_t e = cudaMemcpy(dst, h, n * 2, cudaMemcpyHostToDevice);
  free(h);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda ops: copy: %s", cudaGetErrorString(e));
  return DI_OK;
}

static di_status bf16_dev_to_f32(const void *src, size_t n, float *out) {
  uint16_t *h = (uint16_t *)malloc(n * 2);
  if (!h) return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
  cudaError_t e = cudaMemcpy(h, src, n * 2, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n && e == cudaSuccess; i++) out[i] = di_bf16_to_f32(h[i]);
  free(h);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda ops: copy: %s", cudaGetErrorString(e));
  return DI_OK;
}

static di_status to_dev(void *dst, const void *src, size_t bytes) {
  DI_CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return DI_OK;
}
#define DEV(ptr) \
  if (!(ptr)) return di_error_set(DI_ERR_OOM, "cuda ops: out of device memory")

/* RoPE through the MLA preparation (the kernel that ropes q_pe and k_pe; the forward has no other):
 * one head of no nope part, the case's rows as q_pe, an 8-wide zero latent; Qa's rope columns read back. */
static di_status run_rope(const di_op_data *d, float *out) {
  const di_op_case *c = d->c;
  const int T = c->m, P = c->n, R = 8, D = DI_CUK_MLA_D;
  dev_bufs m;
  void *dkva = m.get((size_t)T * (R + P) * 2), *dq = m.get((size_t)T * P * 2), *dpos = m.get((size_t)T * 4),
       *dslot = m.get((size_t)T * 4), *dnorm = m.get(R * 4), *dinv = m.get((size_t)P / 2 * 4), *dQa = m.get((size_t)T * D * 2),
       *dcache = m.get((size_t)T * D * 2);
  DEV(dkva && dq && dpos && dslot && dnorm && dinv && dQa && dcache);
  float *kva = (float *)calloc((size_t)T * (R + P), sizeof(float));
  int32_t *slot = (int32_t *)malloc((size_t)T * 4);
  if (!kva || !slot) {
    free(kva);
    free(slot);
    return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
  }
  for (int t = 0; t < T; t++) {
    memcpy(kva + (size_t)t * (R + P) + R, d->x + (size_t)t * P, (size_t)P * 4);
    slot[t] = t;
  }
  const float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  di_status st = to_bf16_dev(kva, (size_t)T * (R + P), dkva);
  if (st == DI_OK) st = to_bf16_dev(d->x, (size_t)T * P, dq);
  if (st == DI_OK) st = to_dev(dslot, slot, (size_t)T * 4);
  free(kva);
  free(slot);
  DI_TRY(st);
  DI_TRY(to_dev(dpos, d->ids, (size_t)T * 4));
  DI_TRY(to_dev(dnorm, ones, sizeof ones));
  DI_TRY(to_dev(dinv, d->inv_freq, (size_t)P / 2 * 4));
  di_cuk_rope rope = {(const float *)dinv, d->cfg.rope_attention_factor, d->cfg.rope_interleave};
  DI_TRY(di_cuk_mla_prep((const uint16_t *)dkva, R + P, (const uint16_t *)dq, P, (const int32_t *)dpos,
                         (const int32_t *)dslot, T, 1, 0, P, R, (const float *)dnorm, 1e-6f, rope, (uint16_t *)dQa,
                         dcache, 0, NULL));
  DI_CU(cudaDeviceSynchronize());
  float *qa = (float *)malloc((size_t)T * D * 4);
  if (!qa) return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
  st = bf16_dev_to_f32(dQa, (size_t)T * D, qa);
  for (int t = 0; t < T && st == DI_OK; t++) memcpy(out + (size_t)t * P, qa + (size_t)t * D + DI_CUK_MLA_R, (size_t)P * 4);
  free(qa);
  return st;
}

static di_status run_router(const di_op_data *d, float *out) {
  const di_op_case *c = d->c;
  const int T = c->m, E = c->n, K = c->p[0];
  dev_bufs m;
  void *dl = m.get((size_t)T * E * 4), *db = m.get((size_t)E * 4), *di = m.get((size_t)T * K * 4), *dw = m.get((size_t)T * K * 4);
  DEV(dl && db && di && dw);
  DI_TRY(to_dev(dl, d->x, (size_t)T * E * 4));
  DI_TRY(to_dev(db, d->bias, (size_t)E * 4));
  const di_model_config *g = &d->cfg;
  di_cuk_router r;
  memset(&r, 0, sizeof r);
  r.E = E;
  r.k = K;
  r.n_group = g->n_group;
  r.topk_group = g->topk_group;
  r.sigmoid = g->scoring_func == DI_SCORE_SIGMOID;
  r.method = g->topk_method == DI_TOPK_GREEDY ? 0 : g->topk_method == DI_TOPK_GROUP_LIMITED_GREEDY ? 1 : 2;
  r.norm_topk = g->norm_topk_prob;
  r.scale_after_norm = g->scale_after_renorm;
  r.routed_scale = g->routed_scaling_factor;
  DI_TRY(di_cuk_moe_route((const float *)dl, g->topk_method == DI_TOPK_NOAUX_TC ? (const float *)db : NULL, T, r,
                          (int32_t *)di, (float *)dw, NULL, NULL));
  DI_CU(cudaDeviceSynchronize());
  int32_t *ids = (int32_t *)malloc((size_t)T * K * 4);
  if (!ids) return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
  cudaError_t e = cudaMemcpy(ids, di, (size_t)T * K * 4, cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < (int64_t)T * K && e == cudaSuccess; i++) out[i] = (float)ids[i];
  free(ids);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda ops: copy: %s", cudaGetErrorString(e));
  DI_CU(cudaMemcpy(out + d->n_exact, dw, (size_t)T * K * 4, cudaMemcpyDeviceToHost));
  return DI_OK;
}

/* The forward's expert path: the assignments sorted by di_cuk_moe_permute (one expert per row), then
 * the grouped GEMM over 16-row tiles (or, for decode-sized steps, the grouped GEMV), rows scattered back
 * through inv. */
static di_status run_grouped_gemm(const di_op_data *d, float *out) {
  const di_op_case *c = d->c;
  const int M = c->m, N = c->n, K = c->k, E = c->p[0], bm = 16, max_tiles = (M + bm - 1) / bm + E;
  if (N % 128 || K % 64) return di_error_set(DI_ERR_UNSUPPORTED, "cuda ops: grouped GEMM wants N %% 128, K %% 64");
  dev_bufs m;
  void *dx = m.get((size_t)M * K * 2), *dw = m.get((size_t)E * N * K * 2), *dids = m.get((size_t)M * 4),
       *dperm = m.get((size_t)M * 4), *dinv = m.get((size_t)M * 4), *doff = m.get((size_t)(E + 1) * 4),
       *dtiles = m.get((size_t)max_tiles * 4), *dnt = m.get(4), *dy = m.get((size_t)M * N * 4);
  DEV(dx && dw && dids && dperm && dinv && doff && dtiles && dnt && dy);
  DI_TRY(to_bf16_dev(d->x, (size_t)M * K, dx));
  DI_TRY(up_rows(&d->w, 0, (int64_t)E * N, (bf16 *)dw, K));
  DI_TRY(to_dev(dids, d->ids, (size_t)M * 4));
  DI_TRY(di_cuk_moe_permute((const int32_t *)dids, M, 1, E, bm, (int32_t *)dperm, (int32_t *)dinv, (int32_t *)doff,
                            (int32_t *)dtiles, (int32_t *)dnt, NULL));
  if (M <= 8)
    DI_TRY(di_cuk_grouped_gemv((const uint16_t *)dx, K, (const int32_t *)dperm, (const uint16_t *)dw, N, K,
                               (const int32_t *)doff, (const int32_t *)dtiles, (const int32_t *)dnt, max_tiles, bm, 4, dy, N,
                               1, 0, -1, 0, NULL));
  else
    DI_TRY(di_cuk_grouped_gemm((const uint16_t *)dx, K, (const int32_t *)dperm, (const uint16_t *)dw, N, K,
                               (const int32_t *)doff, (const int32_t *)dtiles, (const int32_t *)dnt, max_tiles, bm, dy, N, 1,
                               0, NULL));
  DI_CU(cudaDeviceSynchronize());
  float *y = (float *)malloc((size_t)M * N * 4);
  int32_t *inv = (int32_t *)malloc((size_t)M * 4);
  cudaError_t e = y && inv ? cudaMemcpy(y, dy, (size_t)M * N * 4, cudaMemcpyDeviceToHost) : cudaErrorMemoryAllocation;
  if (e == cudaSuccess) e = cudaMemcpy(inv, dinv, (size_t)M * 4, cudaMemcpyDeviceToHost);
  for (int i = 0; i < M && e == cudaSuccess; i++) memcpy(out + (size_t)i * N, y + (size_t)inv[i] * N, (size_t)N * 4);
  free(y);
  free(inv);
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda ops: grouped GEMM copies: %s", cudaGetErrorString(e));
  return DI_OK;
}

/* MLA attention (k_mla_attn.cu) over the case's cache in bf16 (576-wide rows, blocks in reverse as on
 * the CPU), items of at most 64 rows of one sequence over its keys. The absorbed query (W_UK^T q_nope,
 * roped q_pe) and W_UV after it are formed on the host in float64 (the forward does them with
 * di_cuk_mla_prep and batched GEMMs, tested by their own rows and test_cuda_kernels): this row checks
 * the attention kernel. */
static di_status run_mla_attn(const di_op_data *d, float *out) {
  const di_op_case *c = d->c;
  const int T = c->m, NH = c->n, R = c->p[0], dr = c->p[1], dn = c->p[2], D = DI_CUK_MLA_D, S = d->n_seqs;
  const int nb = (c->k + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE, total = nb * S, rows = T * NH;
  const int max_items = (rows + 63) / 64 + S;
  float *q = (float *)calloc((size_t)rows * D, 4), *cache = (float *)calloc((size_t)total * DI_KV_BLOCK_SIZE * D, 4);
  float *olat = (float *)malloc((size_t)rows * DI_CUK_MLA_R * 4);
  int32_t *tables = (int32_t *)malloc((size_t)total * 4), *seq_of = (int32_t *)malloc((size_t)T * 4);
  di_cuk_attn_item *items = (di_cuk_attn_item *)calloc((size_t)max_items, sizeof *items);
  di_status st = DI_OK;
  int n_items = 0;
  dev_bufs m;
  if (!q || !cache || !olat || !tables || !seq_of || !items) {
    st = di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
    goto done;
  }
  for (int sq = 0; sq < S; sq++)
    for (int j = 0; j < c->k; j++) {
      if (j % DI_KV_BLOCK_SIZE == 0) tables[sq * nb + j / DI_KV_BLOCK_SIZE] = total - 1 - (sq * nb + j / DI_KV_BLOCK_SIZE);
      float *e = cache + ((size_t)tables[sq * nb + j / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + j % DI_KV_BLOCK_SIZE) * D;
      const float *src = d->kv + ((size_t)sq * c->k + j) * (R + dr);
      memcpy(e, src, (size_t)R * 4);
      memcpy(e + DI_CUK_MLA_R, src + R, (size_t)dr * 4);
    }
  for (int t = 0; t < T; t++) {
    int pos;
    di_op_mla_query(c, t, &seq_of[t], &pos);
    for (int h = 0; h < NH; h++) {
      const float *qs = d->x + ((size_t)t * NH + h) * (dn + dr);
      float *qa = q + ((size_t)t * NH + h) * D;
      for (int r = 0; r < R; r++) {
        double a = 0;
        for (int e = 0; e < dn; e++) a += (double)d->w_uk[((size_t)h * R + r) * dn + e] * qs[e];
        qa[r] = (float)a;
      }
      for (int j = 0; j < dr / 2; j++) {
        const double ang = (double)pos * d->inv_freq[j], x0 = qs[dn + 2 * j], x1 = qs[dn + 2 * j + 1];
        qa[DI_CUK_MLA_R + 2 * j] = (float)(x0 * cos(ang) - x1 * sin(ang));
        qa[DI_CUK_MLA_R + 2 * j + 1] = (float)(x1 * cos(ang) + x0 * sin(ang));
      }
    }
  }
  /* items: each sequence's rows in runs of at most 64, over the keys of its last token's position */
  for (int t0 = 0; t0 < T;) {
    int t1 = t0;
    while (t1 < T && seq_of[t1] == seq_of[t0]) t1++;
    for (int r0 = t0 * NH; r0 < t1 * NH; r0 += 64) {
      const int r1 = r0 + 64 < t1 * NH ? r0 + 64 : t1 * NH;
      di_cuk_attn_item *it = &items[n_items++];
      it->row0 = r0;
      it->row1 = r1;
      it->seq = seq_of[t0];
      it->k0 = 0;
      it->k1 = d->ids[(r1 - 1) / NH] + 1;
      it->part = -1;
      it->kfresh = d->ids[t0];
    }
    t0 = t1;
  }
  {
    void *dq = m.get((size_t)rows * D * 2), *dc = m.get((size_t)total * DI_KV_BLOCK_SIZE * D * 2), *dt = m.get((size_t)total * 4),
         *dpos = m.get((size_t)T * 4), *dit = m.get((size_t)max_items * sizeof *items), *dn_items = m.get(4),
         *dout = m.get((size_t)rows * DI_CUK_MLA_R * 2), *dpo = m.get((size_t)64 * DI_CUK_MLA_R * 4), *dpl = m.get(64 * 4);
    if (!dq || !dc || !dt || !dpos || !dit || !dn_items || !dout || !dpo || !dpl) {
      st = di_error_set(DI_ERR_OOM, "cuda ops: out of device memory");
      goto done;
    }
    st = to_bf16_dev(q, (size_t)rows * D, dq);
    if (st == DI_OK) st = to_bf16_dev(cache, (size_t)total * DI_KV_BLOCK_SIZE * D, dc);
    if (st == DI_OK) st = to_dev(dt, tables, (size_t)total * 4);
    if (st == DI_OK) st = to_dev(dpos, d->ids, (size_t)T * 4);
    if (st == DI_OK) st = to_dev(dit, items, (size_t)max_items * sizeof *items);
    if (st == DI_OK) st = to_dev(dn_items, &n_items, 4);
    if (st == DI_OK)
      st = di_cuk_mla_attn((const uint16_t *)dq, dc, 0, (const int32_t *)dt, nb, (const int32_t *)dpos, NH,
                           d->cfg.softmax_scale, (const di_cuk_attn_item *)dit, (const int32_t *)dn_items, max_items, 64,
                           (uint16_t *)dout, (float *)dpo, (float *)dpl, NULL);
    if (st == DI_OK && cudaDeviceSynchronize() != cudaSuccess)
      st = di_error_set(DI_ERR_BACKEND, "cuda ops: mla attention: %s", cudaGetErrorString(cudaGetLastError()));
    if (st == DI_OK) st = bf16_dev_to_f32(dout, (size_t)rows * DI_CUK_MLA_R, olat);
  }
  for (int r = 0; r < rows && st == DI_OK; r++) {
    const int h = r % NH;
    for (int e = 0; e < dn; e++) {
      double a = 0;
      for (int k = 0; k < R; k++) a += (double)d->w_uv[((size_t)h * dn + e) * R + k] * olat[(size_t)r * DI_CUK_MLA_R + k];
      out[(size_t)r * dn + e] = (float)a;
    }
  }
done:
  free(q);
  free(cache);
  free(olat);
  free(tables);
  free(seq_of);
  free(items);
  return st;
}

extern "C" di_status di_cuda_op_run(void *ctx, const di_op_data *d, float *out) {
  di_cu_blas *blas = (di_cu_blas *)ctx;
  const di_op_case *c = d->c;
  dev_bufs m;
  const size_t M = (size_t)c->m, N = (size_t)c->n, K = (size_t)c->k;
  switch (c->op) {
  case DI_OP_GEMM: {
    /* K padded with zero columns to a multiple of 8 (the 16-byte rows the GEMMs want; every checkpoint's
     * K is one already): exact zeros added to each dot product */
    const size_t K8 = (K + 7) / 8 * 8;
    void *dx = m.get(M * K8 * 2), *dw = m.get(N * K8 * 2), *dy = m.get(M * N * 4);
    if (!dx || !dw || !dy) return di_error_set(DI_ERR_OOM, "cuda ops: out of device memory");
    float *xp = (float *)calloc(M * K8, sizeof(float));
    if (!xp) return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
    for (size_t i = 0; i < M; i++) memcpy(xp + i * K8, d->x + i * K, K * sizeof(float));
    di_status st = to_bf16_dev(xp, M * K8, dx);
    free(xp);
    DI_TRY(st);
    DI_CU(cudaMemset(dw, 0, N * K8 * 2));
    DI_TRY(up_rows(&d->w, 0, c->n, (bf16 *)dw, (int64_t)K8));
    DI_TRY(di_cu_gemm(blas, c->m, c->n, (int)K8, (const uint16_t *)dx, (int)K8, (const uint16_t *)dw, (int)K8, dy, c->n,
                      1, 0.f, NULL));
    DI_CU(cudaDeviceSynchronize());
    DI_CU(cudaMemcpy(out, dy, M * N * 4, cudaMemcpyDeviceToHost));
    return DI_OK;
  }
  case DI_OP_RMSNORM: {
    void *dx = m.get(M * N * 4), *dw = m.get(N * 4), *db = m.get(M * N * 2), *df = m.get(M * N * 4);
    if (!dx || !dw || !db || !df) return di_error_set(DI_ERR_OOM, "cuda ops: out of device memory");
    DI_CU(cudaMemcpy(dx, d->x, M * N * 4, cudaMemcpyHostToDevice));
    DI_CU(cudaMemcpy(dw, d->nw, N * 4, cudaMemcpyHostToDevice));
    DI_TRY(di_cuk_rmsnorm((const float *)dx, c->n, (const float *)dw, c->m, c->n, d->eps, (uint16_t *)db, c->n,
                          (float *)df, NULL));
    DI_CU(cudaDeviceSynchronize());
    DI_CU(cudaMemcpy(out, df, M * N * 4, cudaMemcpyDeviceToHost));
    return DI_OK;
  }
  case DI_OP_SILU_MUL: {
    void *dx = m.get(M * 2 * N * 2), *dy = m.get(M * N * 2);
    if (!dx || !dy) return di_error_set(DI_ERR_OOM, "cuda ops: out of device memory");
    DI_TRY(to_bf16_dev(d->x, M * 2 * N, dx));
    DI_TRY(di_cuk_silu_mul((const uint16_t *)dx, c->m, c->n, (uint16_t *)dy, NULL));
    DI_CU(cudaDeviceSynchronize());
    return bf16_dev_to_f32(dy, M * N, out);
  }
  case DI_OP_ROPE: return run_rope(d, out);
  case DI_OP_ROUTER: return run_router(d, out);
  case DI_OP_GROUPED_GEMM: return run_grouped_gemm(d, out);
  case DI_OP_MLA_ATTN: return run_mla_attn(d, out);
  case DI_OP_EMBED: {
    void *dt = m.get((size_t)c->p[0] * N * 2), *dtok = m.get(M * 4), *dh = m.get(M * N * 4);
    DEV(dt && dtok && dh);
    DI_TRY(up_rows(&d->w, 0, c->p[0], (bf16 *)dt, c->n));
    DI_TRY(to_dev(dtok, d->ids, M * 4));
    DI_TRY(di_cuk_embed((const uint16_t *)dt, (const int32_t *)dtok, NULL, c->m, c->n, (float *)dh, NULL));
    DI_CU(cudaDeviceSynchronize());
    DI_CU(cudaMemcpy(out, dh, M * N * 4, cudaMemcpyDeviceToHost));
    return DI_OK;
  }
  case DI_OP_ARGMAX: { /* greedy sampling: temperature 0, the first maximal logit */
    void *dl = m.get(M * N * 4), *drows = m.get(M * sizeof(di_cuk_sample_row)), *dtok = m.get(M * 4);
    DEV(dl && drows && dtok);
    di_cuk_sample_row *rows = (di_cuk_sample_row *)calloc(M, sizeof *rows);
    int32_t *tok = (int32_t *)malloc(M * 4);
    if (!rows || !tok) {
      free(rows);
      free(tok);
      return di_error_set(DI_ERR_OOM, "cuda ops: out of host memory");
    }
    for (size_t i = 0; i < M; i++) {
      rows[i].top_p = 1.f;
      rows[i].vocab_limit = c->n;
    }
    di_status st = to_dev(dl, d->x, M * N * 4);
    if (st == DI_OK) st = to_dev(drows, rows, M * sizeof *rows);
    if (st == DI_OK) st = di_cuk_sample((const float *)dl, c->m, c->n, (const di_cuk_sample_row *)drows, (int32_t *)dtok, NULL);
    if (st == DI_OK && cudaMemcpy(tok, dtok, M * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
      st = di_error_set(DI_ERR_BACKEND, "cuda ops: sample copy: %s", cudaGetErrorString(cudaGetLastError()));
    for (size_t i = 0; i < M && st == DI_OK; i++) out[i] = (float)tok[i];
    free(rows);
    free(tok);
    return st;
  }
  default: return di_error_set(DI_ERR_UNSUPPORTED, "cuda ops: op %d", (int)c->op);
  }
}
