/* Random DeepSeek-V4 weights for benchmarks and tests (deepseek_v4_random.h). Buffer 0: bf16 values of
 * the largest matrix; 1: E4M3 bytes (exponents kept small, no NaN codes); 2: UE8M0 block scales; 3: E2M1
 * bytes (any nibble is a value); 4: MXFP4 E8M0 scales; 5: f32 ones; 6: f32 zeros; 7: the mHC f32
 * matrix; 8: the hash layers' tid2eid. */
#include "arch/deepseek_v4_random.h"
#include "util/numeric.h"
#include <stdlib.h>
#include <string.h>

static uint64_t next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 24;
}

static di_weight view(const di_v4_random_model *m, int64_t rows, int64_t cols, di_dtype dt) {
  di_weight x;
  memset(&x, 0, sizeof x);
  x.name = "random";
  x.dtype = dt;
  x.rows = rows;
  x.cols = cols;
  if (dt == DI_DT_BF16) x.data = m->buf[0];
  else if (dt == DI_DT_F8E4M3) {
    x.data = m->buf[1];
    x.scale_e8m0 = (const uint8_t *)m->buf[2];
    x.block_rows = x.block_cols = 128;
    x.scale_cols = (cols + 127) / 128;
  } else if (dt == DI_DT_F4E2M1) {
    x.data = m->buf[3];
    x.scale_e8m0 = (const uint8_t *)m->buf[4];
    x.block_rows = 1;
    x.block_cols = 32;
    x.scale_cols = (cols + 31) / 32;
  } else
    x.data = m->buf[7];
  return x;
}

di_status di_v4_random_model_init(di_v4_random_model *m, const di_v4_config *c, int native, uint64_t seed) {
  memset(m, 0, sizeof *m);
  m->c = *c;
  c = &m->c;
  const int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc, E = c->n_routed_experts, NL = c->n_layers;
  size_t big = (size_t)c->vocab_size * D; /* the largest matrix (embedding / head) */
  const size_t others[] = {(size_t)c->n_heads * c->head_dim * c->q_lora_rank, (size_t)c->moe_inter * D,
                           (size_t)c->o_groups * c->o_lora_rank * D, (size_t)mix * hc * D};
  for (int i = 0; i < 4; i++) big = others[i] > big ? others[i] : big;
  m->buf[0] = malloc(2 * big);
  m->buf[1] = malloc(big);
  m->buf[2] = malloc(big / (128 * 128) + 1024);
  m->buf[3] = malloc(big / 2 + 16);
  m->buf[4] = malloc(big / 32 + 1024);
  m->buf[5] = malloc(sizeof(float) * 65536);
  m->buf[6] = calloc(1 << 20, sizeof(float));
  m->buf[7] = malloc(sizeof(float) * (size_t)mix * hc * D);
  m->buf[8] = malloc(sizeof(int32_t) * (size_t)c->vocab_size * c->top_k + 16);
  m->layers = calloc((size_t)(NL > 0 ? NL : 1), sizeof *m->layers);
  m->experts = calloc((size_t)3 * (E > 0 ? E : 1), sizeof *m->experts);
  for (int i = 0; i < 9; i++)
    if (!m->buf[i]) break;
    else if (i == 8 && m->layers && m->experts) goto ok;
  di_v4_random_model_free(m);
  return di_error_set(DI_ERR_OOM, "random V4 model: out of memory");
ok:;
  uint64_t s = seed | 1;
  uint16_t *bf = m->buf[0];
  uint8_t *f8 = m->buf[1], *f8s = m->buf[2], *f4 = m->buf[3], *f4s = m->buf[4];
  for (size_t i = 0; i < big; i++) bf[i] = di_f32_to_bf16((float)((double)(next(&s) & 0xffffff) / 16777216.0 - 0.5) * 0.04f);
  for (size_t i = 0; i < big; i++) f8[i] = (uint8_t)((next(&s) & 0x87) | 0x30); /* +-(1 + m/8) / 2: exponent 6 of 15 */
  for (size_t i = 0; i < big / (128 * 128) + 1024; i++) f8s[i] = (uint8_t)(121 + next(&s) % 3); /* 2^-6 .. 2^-4 */
  for (size_t i = 0; i < big / 2 + 16; i++) f4[i] = (uint8_t)next(&s);
  for (size_t i = 0; i < big / 32 + 1024; i++) f4s[i] = (uint8_t)(120 + next(&s) % 3); /* 2^-7 .. 2^-5 */
  float *ones = m->buf[5], *zeros = m->buf[6], *hcfn = m->buf[7];
  for (int i = 0; i < 65536; i++) ones[i] = 1;
  for (size_t i = 0; i < (size_t)mix * hc * D; i++) hcfn[i] = ((float)(i % 7) - 3) * 1e-3f;
  const di_dtype fp8 = native ? DI_DT_F8E4M3 : DI_DT_BF16, fp4 = native ? DI_DT_F4E2M1 : DI_DT_BF16;
  di_v4_weights *w = &m->w;
  di_weight hfn = view(m, mix, (int64_t)hc * D, DI_DT_F32);
  w->embed = view(m, c->vocab_size, D, DI_DT_BF16);
  w->head = view(m, c->vocab_size, D, DI_DT_BF16);
  w->final_norm = ones;
  w->hc_head_fn = view(m, hc, (int64_t)hc * D, DI_DT_F32);
  w->hc_head_base = zeros;
  w->hc_head_scale = ones;
  w->n_layers = NL;
  w->layers = m->layers;
  int32_t *tid = m->buf[8];
  for (size_t i = 0; i < (size_t)c->vocab_size * c->top_k; i++) tid[i] = (int32_t)((i * 2654435761u) % (unsigned)E);
  di_weight *e1 = m->experts, *e2 = e1 + E, *e3 = e2 + E;
  for (int e = 0; e < E; e++) {
    e1[e] = e3[e] = view(m, c->moe_inter, D, fp4);
    e2[e] = view(m, D, c->moe_inter, fp4);
  }
  for (int l = 0; l < NL; l++) {
    di_v4_layer *y = &m->layers[l];
    y->attn_norm = y->ffn_norm = ones;
    y->hc_attn_fn = y->hc_ffn_fn = hfn;
    y->hc_attn_base = y->hc_ffn_base = zeros;
    y->hc_attn_scale = y->hc_ffn_scale = ones;
    y->wq_a = view(m, c->q_lora_rank, D, fp8);
    y->q_norm = ones;
    y->wq_b = view(m, (int64_t)c->n_heads * c->head_dim, c->q_lora_rank, fp8);
    y->wkv = view(m, c->head_dim, D, fp8);
    y->kv_norm = ones;
    y->wo_a = view(m, (int64_t)c->o_groups * c->o_lora_rank, (int64_t)c->n_heads * c->head_dim / c->o_groups, fp8);
    y->wo_b = view(m, D, (int64_t)c->o_groups * c->o_lora_rank, fp8);
    y->sink = zeros;
    if (c->attn_kind[l] != DI_V4_ATTN_SLIDING) {
      const int csa = c->attn_kind[l] == DI_V4_ATTN_CSA, wd = csa ? 2 * c->head_dim : c->head_dim;
      y->comp = (di_v4_compressor){c->head_dim, wd, view(m, wd, D, DI_DT_BF16), view(m, wd, D, DI_DT_BF16), zeros, ones};
      if (csa) {
        y->icomp = (di_v4_compressor){c->index_head_dim, 2 * c->index_head_dim, view(m, 2 * c->index_head_dim, D, DI_DT_BF16),
                                      view(m, 2 * c->index_head_dim, D, DI_DT_BF16), zeros, ones};
        y->idx_wq_b = view(m, (int64_t)c->index_n_heads * c->index_head_dim, c->q_lora_rank, DI_DT_BF16);
        y->idx_weights = view(m, c->index_n_heads, D, DI_DT_BF16);
      }
    }
    y->router = view(m, E, D, DI_DT_BF16);
    y->router_bias = zeros;
    y->tid2eid = c->ffn_kind[l] == DI_V4_FFN_HASH_MOE ? tid : NULL;
    y->exp_w1 = e1;
    y->exp_w2 = e2;
    y->exp_w3 = e3;
    y->sh_w1 = y->sh_w3 = view(m, c->moe_inter, D, fp8);
    y->sh_w2 = view(m, D, c->moe_inter, fp8);
  }
  return DI_OK;
}

void di_v4_random_model_free(di_v4_random_model *m) {
  for (int i = 0; i < 9; i++) free(m->buf[i]);
  free(m->layers);
  free(m->experts);
  memset(m, 0, sizeof *m);
}

/* device bytes of one matrix as the CUDA backend lays it out (native: formats kept; else bf16) */
static double dev_bytes(const di_weight *x, int native) {
  const double n = (double)x->rows * (double)x->cols;
  if (native && x->dtype == DI_DT_F8E4M3) return n + 4.0 * (double)x->rows * (double)((x->cols + 127) / 128);
  if (native && x->dtype == DI_DT_F4E2M1) return n / 2 + n / 32;
  if (x->dtype == DI_DT_F32) return 4 * n;
  return 2 * n;
}

double di_v4_random_model_step_bytes(const di_v4_random_model *m, int native) {
  const di_v4_config *c = &m->c;
  double b = dev_bytes(&m->w.head, native) + 4.0 * (double)m->w.hc_head_fn.rows * (double)m->w.hc_head_fn.cols;
  for (int l = 0; l < c->n_layers; l++) {
    const di_v4_layer *y = &m->layers[l];
    const di_weight *mats[] = {&y->hc_attn_fn, &y->hc_ffn_fn, &y->wq_a, &y->wq_b, &y->wkv, &y->wo_a, &y->wo_b, &y->comp.wkv,
                               &y->comp.wgate, &y->icomp.wkv, &y->icomp.wgate, &y->idx_wq_b, &y->idx_weights, &y->sh_w1,
                               &y->sh_w2, &y->sh_w3};
    for (size_t i = 0; i < sizeof mats / sizeof *mats; i++)
      if (mats[i]->data) b += dev_bytes(mats[i], native);
    b += 4.0 * (double)y->router.rows * (double)y->router.cols; /* the router is uploaded as f32 */
    b += c->top_k * (dev_bytes(&y->exp_w1[0], native) + dev_bytes(&y->exp_w2[0], native) + dev_bytes(&y->exp_w3[0], native));
  }
  return b;
}
