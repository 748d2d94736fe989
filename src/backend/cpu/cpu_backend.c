/* CPU backend setup, KV pool and the backend vtable (see cpu_backend.h). The CPU runs a step
 * synchronously inside wait(); submit() only records the batch. */
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_gemm.h"
#include <stdlib.h>
#include <string.h>

static void free_scratch(di_cpu_backend *b) {
  float **fs[] = {&b->s_x, &b->s_h, &b->s_o, &b->s_q, &b->s_qa, &b->s_kv, &b->s_attn, &b->s_g, &b->s_u,
                  &b->s_router, &b->s_topk_w, &b->s_exp_in, &b->s_exp_out, &b->s_shared,
                  &b->s_mtp_cat, &b->s_rope, &b->attn_scratch, &b->s_kv_tmp};
  for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
    free(*fs[i]);
    *fs[i] = NULL;
  }
  free(b->s_jobs);
  b->s_jobs = NULL;
  int32_t **is[] = {&b->s_topk_ids, &b->s_exp_count, &b->s_exp_start, &b->s_exp_rows, &b->s_exp_fill, &b->s_exp_where};
  for (size_t i = 0; i < sizeof is / sizeof is[0]; i++) {
    free(*is[i]);
    *is[i] = NULL;
  }
}

/* Scratch for steps of up to T tokens at positions below max_pos (grows, never shrinks). */
static di_status reserve_scratch(di_cpu_backend *b, int T, int max_pos) {
  if (T <= b->cap_tokens && max_pos <= b->cap_positions)
    return DI_OK;
  const di_model_config *c = b->cfg;
  int newT = T > b->cap_tokens ? T : b->cap_tokens;
  int newP = max_pos > b->cap_positions ? max_pos : b->cap_positions;
  if (newP < DI_KV_BLOCK_SIZE)
    newP = DI_KV_BLOCK_SIZE;
  free_scratch(b);
  const size_t Tn = (size_t)newT, H = (size_t)c->hidden_size, NH = (size_t)c->num_attention_heads;
  const size_t dqk = (size_t)di_cfg_qk_head_dim(c), R = (size_t)c->kv_lora_rank, dr = (size_t)c->qk_rope_head_dim;
  size_t I = (size_t)c->intermediate_size;
  size_t SI = (size_t)c->moe_intermediate_size * (size_t)(c->n_shared_experts > 0 ? c->n_shared_experts : 1);
  if ((size_t)c->moe_intermediate_size > I)
    I = (size_t)c->moe_intermediate_size;
  if (SI > I)
    I = SI;
  const size_t E = (size_t)(c->n_routed_experts > 0 ? c->n_routed_experts : 1);
  const size_t K = (size_t)(c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1);
  size_t rows_out = Tn; /* output rows <= tokens */
  int ok = 1;
#define A(ptr, n)                                      \
  do {                                                 \
    size_t n_ = (n);                                   \
    (ptr) = malloc(sizeof(*(ptr)) * (n_ ? n_ : 1));    \
    ok &= (ptr) != NULL;                               \
  } while (0)
  A(b->s_x, Tn * H);
  A(b->s_h, (Tn > rows_out ? Tn : rows_out) * H);
  A(b->s_o, Tn * H);
  A(b->s_q, Tn * NH * dqk);
  A(b->s_qa, Tn * (size_t)(c->q_lora_rank > 0 ? c->q_lora_rank : 1));
  A(b->s_kv, Tn * (R + dr));
  A(b->s_attn, Tn * NH * (size_t)c->v_head_dim);
  A(b->s_g, Tn * K * I + Tn * SI);
  A(b->s_u, Tn * K * I + Tn * SI);
  A(b->s_jobs, 2 * E + 4);
  A(b->s_router, Tn * E);
  A(b->s_topk_w, Tn * K);
  A(b->s_topk_ids, Tn * K);
  A(b->s_exp_count, E);
  A(b->s_exp_start, E);
  A(b->s_exp_fill, E);
  A(b->s_exp_rows, Tn * K);
  A(b->s_exp_in, Tn * K * H);
  A(b->s_exp_out, Tn * K * H);
  A(b->s_exp_where, Tn * K);
  A(b->s_shared, Tn * H);
  A(b->s_mtp_cat, Tn * 2 * H);
  A(b->s_rope, Tn * dr);
  b->attn_scratch_per_thread = (2 * R + dr + (size_t)newP + 16) * DI_CPU_ATTN_GROUP; /* per head, x group */
  A(b->attn_scratch, b->attn_scratch_per_thread * (size_t)di_threadpool_size(b->tp));
  A(b->s_kv_tmp, (size_t)4 * b->kv_dim * (size_t)di_threadpool_size(b->tp)); /* fp8 cache: 4 decoded keys per thread */
#undef A
  if (!ok) {
    free_scratch(b);
    b->cap_tokens = b->cap_positions = 0;
    return di_error_set(DI_ERR_OOM, "CPU backend: out of memory for a step of %d tokens", T);
  }
  b->cap_tokens = newT;
  b->cap_positions = newP;
  return DI_OK;
}

di_status di_cpu_backend_reserve(di_cpu_backend *b, int T, const di_batch *batch) {
  int max_pos = 0;
  for (int t = 0; t < T; t++)
    if (batch->positions[t] + 1 > max_pos)
      max_pos = batch->positions[t] + 1;
  return reserve_scratch(b, T, max_pos);
}

/* The cache layout and rope frequencies of cfg: one place for the full backend and the attention-only
 * one below. */
static di_status init_attention_fields(di_cpu_backend *b, const di_model_config *cfg, int n_cache_layers) {
  b->cfg = cfg;
  b->n_cache_layers = n_cache_layers;
  b->kv_dim = cfg->kv_lora_rank + cfg->qk_rope_head_dim;
  b->kv_stride = b->kv_dim; /* f32 rows; di_backend_cpu_set_kv_fp8 changes it before the pool exists */
  if (cfg->qk_rope_head_dim / 2 > 256)
    return di_error_set(DI_ERR_UNSUPPORTED, "qk_rope_head_dim %d > 512 is not supported", cfg->qk_rope_head_dim);
  double inv[256];
  di_rope_inv_freq(cfg, inv);
  for (int i = 0; i < cfg->qk_rope_head_dim / 2; i++)
    b->inv_freq[i] = (float)inv[i];
  return DI_OK;
}

static int cpu_kv_groups(di_backend *base, di_kv_group_info *g, int cap) {
  di_cpu_backend *b = (di_cpu_backend *)base; /* rows of kv_stride 4-byte words (f32, or the fp8 layout), every MTP layer cached */
  return di_ds_kv_groups(b->cfg, b->n_cache_layers - b->cfg->num_hidden_layers, (int)sizeof(float), b->kv_stride, g, cap);
}

static di_status cpu_kv_alloc(di_backend *base, int64_t n_blocks) {
  di_cpu_backend *b = (di_cpu_backend *)base;
  size_t bytes = (size_t)n_blocks * (size_t)b->n_cache_layers * DI_KV_BLOCK_SIZE * (size_t)b->kv_stride * sizeof(float);
  float *p = n_blocks > 0 ? malloc(bytes) : NULL;
  if (n_blocks > 0 && !p)
    return di_error_set(DI_ERR_OOM, "CPU backend: cannot allocate a KV pool of %lld blocks (%zu bytes)", (long long)n_blocks, bytes);
  free(b->kv_pool);
  b->kv_pool = p;
  b->n_blocks = n_blocks;
  return DI_OK;
}

static di_status check_batch(const di_cpu_backend *b, const di_batch *batch) {
  for (int t = 0; t < batch->n_tokens; t++) {
    int s = batch->seq_of[t], p = batch->positions[t];
    if (s < 0 || s >= batch->n_seqs || p < 0)
      return di_error_set(DI_ERR_INVALID_ARG, "batch row %d: bad sequence index or position", t);
    const di_batch_seq *q = &batch->seqs[s];
    if (p / DI_KV_BLOCK_SIZE >= q->n_blocks)
      return di_error_set(DI_ERR_INVALID_ARG, "batch row %d: position %d beyond the %d blocks of its table", t, p, q->n_blocks);
    for (int k = 0; k <= p / DI_KV_BLOCK_SIZE; k++)
      if (q->block_table[k] < 0 || q->block_table[k] >= b->n_blocks)
        return di_error_set(DI_ERR_INVALID_ARG, "batch row %d: block id %d outside the pool of %lld", t, q->block_table[k],
                            (long long)b->n_blocks);
  }
  for (int i = 0; i < batch->n_outputs; i++)
    if (batch->output_rows[i] < 0 || batch->output_rows[i] >= batch->n_tokens)
      return di_error_set(DI_ERR_INVALID_ARG, "output row %d out of range", batch->output_rows[i]);
  return DI_OK;
}

static di_status cpu_submit(di_backend *base, const di_batch *batch) {
  di_cpu_backend *b = (di_cpu_backend *)base;
  DI_TRY(check_batch(b, batch));
  b->pending = batch;
  return DI_OK;
}

static di_status cpu_wait(di_backend *base, float *logits, float *hidden) {
  di_cpu_backend *b = (di_cpu_backend *)base;
  const di_batch *batch = b->pending;
  if (!batch)
    return di_error_set(DI_ERR_INVALID_ARG, "wait() without submit()");
  b->pending = NULL;
  return di_cpu_deepseek_forward(b, batch, logits, hidden);
}

static void cpu_destroy(di_backend *base) {
  di_cpu_backend *b = (di_cpu_backend *)base;
  if (!b)
    return;
  free_scratch(b);
  for (int l = 0; l < b->n_cache_layers; l++) { /* either array may be missing (its calloc failed) */
    if (b->w_uk) free(b->w_uk[l]);
    if (b->w_uv) free(b->w_uv[l]);
  }
  free(b->w_uk);
  free(b->w_uv);
  free(b->kv_pool);
  di_threadpool_free(b->tp);
  free(b);
}

di_status di_cpu_backend_set_capture(di_backend *base, const int *layer_ids, int n) {
  di_cpu_backend *b = (di_cpu_backend *)base;
  if (!b || strcmp(base->ops->name, "cpu") != 0)
    return di_error_set(DI_ERR_UNSUPPORTED, "hidden-state capture for a drafter needs the CPU backend");
  if (n < 0 || n > 16)
    return di_error_set(DI_ERR_INVALID_ARG, "capture of %d layers (at most 16)", n);
  for (int i = 0; i < n; i++)
    if (layer_ids[i] < -1 || layer_ids[i] >= b->w->n_layers || (i > 0 && layer_ids[i] <= layer_ids[i - 1]))
      return di_error_set(DI_ERR_INVALID_ARG, "capture layer id %d is not an increasing id in [-1, %d)", layer_ids[i],
                          b->w->n_layers);
  for (int i = 0; i < n; i++)
    b->capture[i] = layer_ids[i];
  b->n_capture = n;
  return DI_OK;
}

/* the first MTP module (DeepSeek-V3 ships one) */
static di_status cpu_mtp(di_backend *b, const di_batch *batch, const float *prev_hidden, float *logits, float *hidden_out) {
  return di_cpu_deepseek_mtp_forward((di_cpu_backend *)b, 0, batch, prev_hidden, logits, hidden_out);
}

static const di_backend_ops CPU_OPS = {
    .name = "cpu",
    .kv_groups = cpu_kv_groups,
    .kv_alloc = cpu_kv_alloc,
    .submit = cpu_submit,
    .wait = cpu_wait,
    .sample = NULL,
    .mtp = cpu_mtp,
    .destroy = cpu_destroy,
    .set_kv_fp8 = di_backend_cpu_set_kv_fp8,
};

di_status di_backend_cpu_set_kv_fp8(di_backend *be) {
  di_cpu_backend *b = (di_cpu_backend *)be;
  const int R = b->cfg->kv_lora_rank, dr = b->cfg->qk_rope_head_dim;
  if (b->kv_pool)
    return di_error_set(DI_ERR_INTERNAL, "--kv-cache-dtype fp8: set after the KV pool was allocated");
  if (R % 4)
    return di_error_set(DI_ERR_UNSUPPORTED, "--kv-cache-dtype fp8: kv_lora_rank %d is not a multiple of 4", R);
  b->kv_fp8 = 1;
  b->kv_stride = (R + 127) / 128 + R / 4 + (dr + 1) / 2; /* scales, E4M3 bytes, bf16 pairs: in 4-byte words */
  return DI_OK;
}

di_status di_backend_cpu_create(const di_model_config *cfg, const di_ds_weights *w, int threads, di_backend **out) {
  di_cpu_backend *b = calloc(1, sizeof *b);
  if (!b)
    return di_error_set(DI_ERR_OOM, "out of memory");
  b->base.ops = &CPU_OPS;
  b->base.cfg = cfg;
  b->base.vocab_size = cfg->vocab_size;
  b->base.hidden_size = cfg->hidden_size;
  b->base.n_mtp_layers = w->n_mtp;
  b->w = w;
  di_status st = di_threadpool_create(threads, &b->tp);
  if (st != DI_OK) {
    free(b);
    return st;
  }
  if ((st = init_attention_fields(b, cfg, w->n_layers + w->n_mtp)) != DI_OK) {
    b->n_cache_layers = 0; /* no absorbed matrices yet */
    cpu_destroy(&b->base);
    return st;
  }
  /* absorbed attention matrices from kv_b_proj, float32 */
  const int NH = cfg->num_attention_heads, dn = cfg->qk_nope_head_dim, dv = cfg->v_head_dim, R = cfg->kv_lora_rank;
  b->w_uk = calloc((size_t)b->n_cache_layers, sizeof(float *));
  b->w_uv = calloc((size_t)b->n_cache_layers, sizeof(float *));
  if (!b->w_uk || !b->w_uv) {
    cpu_destroy(&b->base);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  float *row = malloc(sizeof(float) * (size_t)R);
  for (int l = 0; l < b->n_cache_layers; l++) {
    const di_weight *kvb = &w->layers[l].kv_b;
    b->w_uk[l] = malloc(sizeof(float) * (size_t)NH * R * (dn > 0 ? dn : 1));
    b->w_uv[l] = malloc(sizeof(float) * (size_t)NH * dv * R);
    if (!row || !b->w_uk[l] || !b->w_uv[l]) {
      free(row);
      cpu_destroy(&b->base);
      return di_error_set(DI_ERR_OOM, "out of memory for the absorbed attention matrices");
    }
    for (int h = 0; h < NH; h++) {
      for (int d = 0; d < dn; d++) {
        di_weight_rows_f32(kvb, (int64_t)h * (dn + dv) + d, (int64_t)h * (dn + dv) + d + 1, row);
        for (int r = 0; r < R; r++)
          b->w_uk[l][((size_t)h * R + r) * dn + d] = row[r];
      }
      for (int e = 0; e < dv; e++)
        di_weight_rows_f32(kvb, (int64_t)h * (dn + dv) + dn + e, (int64_t)h * (dn + dv) + dn + e + 1,
                           b->w_uv[l] + ((size_t)h * dv + e) * R);
    }
  }
  free(row);
  *out = &b->base;
  return DI_OK;
}

di_status di_cpu_attention_backend_init(di_cpu_backend *b, const di_model_config *cfg, di_threadpool *tp, float **w_uk,
                                        float **w_uv, int64_t n_blocks, int n_tokens, int n_positions) {
  memset(b, 0, sizeof *b);
  b->base.ops = &CPU_OPS;
  b->tp = tp;
  b->w_uk = w_uk;
  b->w_uv = w_uv;
  di_status st = init_attention_fields(b, cfg, 1);
  if (st == DI_OK)
    st = cpu_kv_alloc(&b->base, n_blocks);
  if (st == DI_OK)
    st = reserve_scratch(b, n_tokens, n_positions);
  if (st != DI_OK)
    di_cpu_attention_backend_free(b);
  return st;
}

void di_cpu_attention_backend_free(di_cpu_backend *b) {
  free_scratch(b);
  free(b->kv_pool);
  b->kv_pool = NULL;
}
