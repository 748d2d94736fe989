/* Decode (and one prefill) timing of the DeepSeek-V4 CUDA backend on a V4-Flash-shaped model of a
 * fixed 8 layers with random bf16 weights (the shape and layer order of arch/deepseek_v4_shapes.h, which
 * the kernel tests use too) with E routed experts (default 32, argument 2).
 * With fewer experts than V4-Flash's 256 the bytes read per token at batch 1 are the same (6 + 1 experts
 * per layer), at larger batches fewer distinct experts exist to be read.
 * Sequences start at position CTX (argument 1, default 4096) as prefix hits on zeroed cache blocks
 * (the timing of attention over CTX positions does not depend on the values), then decode.
 *   bench_cuda_v4 [CTX[,CTX...]] [EXPERTS] [STEPS] [BATCHES]   one line per context and batch size
 *   (BATCHES: a comma list of 1..256, default 1,16,64). PREFILL (argument 5, default 0: none): then one
 *   sequence's first PREFILL tokens in one step, and the same again in steps of 512 tokens, timed. */
#include <stdio.h>
#ifndef DI_HAVE_CUDA
int main(void) {
  printf("bench_cuda_v4: built without CUDA\n");
  return 0;
}
#else
#include "arch/deepseek_v4_shapes.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_v4_backend.h"
#include "util/numeric.h"
#include <stdlib.h>
#include <string.h>

#define NL 8
static di_v4_config c;
static di_v4_weights w;
static di_v4_layer L[NL];

static uint16_t *rbuf;   /* one random bf16 buffer every matrix views */
static float *ones, *zeros, *hcfn;

static di_weight mat(int64_t rows, int64_t cols) {
  di_weight x;
  memset(&x, 0, sizeof x);
  x.name = "random";
  x.dtype = DI_DT_BF16;
  x.rows = rows;
  x.cols = cols;
  x.data = rbuf;
  return x;
}

static void build(int E) {
  di_v4_flash_shape(&c, NL, E);
  const size_t big = (size_t)c.vocab_size * c.hidden_size;
  rbuf = malloc(2 * big);
  uint64_t s = 1;
  for (size_t i = 0; i < big; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    rbuf[i] = di_f32_to_bf16((float)((double)(s >> 40) / 16777216.0 - 0.5) * 0.04f);
  }
  const int D = c.hidden_size, hc = c.hc_mult, mix = (2 + hc) * hc;
  ones = malloc(sizeof(float) * 65536);
  zeros = calloc(1 << 20, sizeof(float));
  for (int i = 0; i < 65536; i++) ones[i] = 1;
  hcfn = malloc(sizeof(float) * (size_t)mix * hc * D);
  for (size_t i = 0; i < (size_t)mix * hc * D; i++) hcfn[i] = ((float)(i % 7) - 3) * 1e-3f;
  di_weight hfn = mat(mix, (int64_t)hc * D);
  hfn.dtype = DI_DT_F32;
  hfn.data = hcfn;
  w.embed = mat(c.vocab_size, D);
  w.head = mat(c.vocab_size, D);
  w.final_norm = ones;
  w.hc_head_fn = mat(hc, (int64_t)hc * D);
  w.hc_head_fn.dtype = DI_DT_F32;
  w.hc_head_fn.data = hcfn;
  w.hc_head_base = zeros;
  w.hc_head_scale = ones;
  w.n_layers = NL;
  w.layers = L;
  int32_t *tid = malloc(sizeof(int32_t) * (size_t)c.vocab_size * c.top_k);
  for (size_t i = 0; i < (size_t)c.vocab_size * c.top_k; i++) tid[i] = (int32_t)((i * 2654435761u) % (unsigned)E);
  static di_weight e1[1024], e2[1024], e3[1024];
  for (int e = 0; e < E; e++) {
    e1[e] = e3[e] = mat(c.moe_inter, D);
    e2[e] = mat(D, c.moe_inter);
  }
  for (int l = 0; l < NL; l++) {
    di_v4_layer *y = &L[l];
    memset(y, 0, sizeof *y);
    y->attn_norm = y->ffn_norm = ones;
    y->hc_attn_fn = y->hc_ffn_fn = hfn;
    y->hc_attn_base = y->hc_ffn_base = zeros;
    y->hc_attn_scale = y->hc_ffn_scale = ones;
    y->wq_a = mat(c.q_lora_rank, D);
    y->q_norm = ones;
    y->wq_b = mat((int64_t)c.n_heads * c.head_dim, c.q_lora_rank);
    y->wkv = mat(c.head_dim, D);
    y->kv_norm = ones;
    y->wo_a = mat((int64_t)c.o_groups * c.o_lora_rank, (int64_t)c.n_heads * c.head_dim / c.o_groups);
    y->wo_b = mat(D, (int64_t)c.o_groups * c.o_lora_rank);
    y->sink = zeros;
    if (c.attn_kind[l] != DI_V4_ATTN_SLIDING) {
      const int csa = c.attn_kind[l] == DI_V4_ATTN_CSA;
      y->comp = (di_v4_compressor){c.head_dim, csa ? 2 * c.head_dim : c.head_dim, mat(csa ? 2 * c.head_dim : c.head_dim, D),
                                   mat(csa ? 2 * c.head_dim : c.head_dim, D), zeros, ones};
      if (csa) {
        y->icomp = (di_v4_compressor){c.index_head_dim, 2 * c.index_head_dim, mat(2 * c.index_head_dim, D),
                                      mat(2 * c.index_head_dim, D), zeros, ones};
        y->idx_wq_b = mat((int64_t)c.index_n_heads * c.index_head_dim, c.q_lora_rank);
        y->idx_weights = mat(c.index_n_heads, D);
      }
    }
    y->router = mat(E, D);
    y->router_bias = zeros;
    y->tid2eid = c.ffn_kind[l] == DI_V4_FFN_HASH_MOE ? tid : NULL;
    y->exp_w1 = e1;
    y->exp_w2 = e2;
    y->exp_w3 = e3;
    y->sh_w1 = y->sh_w3 = mat(c.moe_inter, D);
    y->sh_w2 = mat(D, c.moe_inter);
  }
}

#define MAXSEQ 256
static int ng;
static int64_t nblocks[DI_KV_MAX_GROUPS];
static int32_t *tabs[MAXSEQ][DI_KV_MAX_GROUPS];

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const char *ctxs = argc > 1 ? argv[1] : "4096";
  const int E = argc > 2 ? atoi(argv[2]) : 32, steps = argc > 3 ? atoi(argv[3]) : 8;
  const int prefill = argc > 5 ? atoi(argv[5]) : 0;
  int batches[8], n_batches = 0;
  for (const char *bp = argc > 4 ? argv[4] : "1,16,64"; *bp && n_batches < 8;) {
    const int v = atoi(bp);
    if (v >= 1 && v <= MAXSEQ) batches[n_batches++] = v;
    while (*bp && *bp != ',') bp++;
    if (*bp == ',') bp++;
  }
  int maxB = 1; /* cache blocks for this many sequences only */
  for (int i = 0; i < n_batches; i++) maxB = batches[i] > maxB ? batches[i] : maxB;
  if (!di_cut_device_ok()) {
    printf("no CUDA device\n");
    return 0;
  }
  double t0 = di_cut_time_ms();
  build(E);
  di_model_config mc;
  memset(&mc, 0, sizeof mc);
  di_backend *be = NULL;
  if (di_backend_cuda_v4_create(&mc, &c, &w, &be) != DI_OK) {
    printf("create: %s\n", di_last_error());
    return 1;
  }
  printf("V4-Flash-shaped 8 layers, %d experts: weights built and uploaded in %.1f s\n", E, (di_cut_time_ms() - t0) / 1e3);
  float *logits = malloc(sizeof(float) * (size_t)MAXSEQ * c.vocab_size);
  int round = 0;
  for (const char *cp = ctxs; *cp; round++) {
    const int ctx = atoi(cp);
    while (*cp && *cp != ',') cp++;
    if (*cp == ',') cp++;
    if (ctx < 64 || ctx % 64) {
      printf("context %d: must be a positive multiple of 64\n", ctx);
      continue;
    }
    di_kv_group_info g[DI_KV_MAX_GROUPS];
    ng = be->ops->kv_groups(be, g, DI_KV_MAX_GROUPS);
    const int nb = (ctx + steps + 64) / 64 + 1; /* table entries per sequence */
    /* distinct blocks per sequence: all of the entry groups' (they are read), the last 4 of window and state */
    for (int i = 0; i < ng; i++) {
      const int sparse = g[i].kind == DI_KV_SLIDING || g[i].kind == DI_KV_STATE;
      nblocks[i] = (int64_t)maxB * (sparse ? 4 : nb) + 1;
      for (int s = 0; s < maxB; s++) {
        free(tabs[s][i]);
        tabs[s][i] = malloc(sizeof(int32_t) * nb);
        for (int k = 0; k < nb; k++)
          tabs[s][i][k] = sparse ? (k >= nb - 4 ? 1 + s * 4 + (k - (nb - 4)) : 0) : 1 + s * nb + k;
      }
    }
    if (be->ops->kv_alloc_groups(be, nblocks, ng) != DI_OK) {
      printf("kv_alloc_groups at context %d: %s\n", ctx, di_last_error());
      break;
    }
    for (int bi = 0; bi < n_batches; bi++) {
      const int B = batches[bi];
      int32_t tok[MAXSEQ], pos[MAXSEQ], so[MAXSEQ], rows[MAXSEQ], gb[MAXSEQ * DI_KV_MAX_GROUPS];
      const int32_t *gt[MAXSEQ * DI_KV_MAX_GROUPS];
      di_batch_seq bs[MAXSEQ];
      double best = 1e30, sum = 0;
      int ok = 1;
      for (int st = 0; st <= steps && ok; st++) {
        for (int s = 0; s < B; s++) {
          tok[s] = (s * 7919 + st * 131) % c.vocab_size;
          pos[s] = ctx + st;
          so[s] = s;
          rows[s] = s;
          bs[s].block_table = tabs[s][0];
          bs[s].n_blocks = nb;
          bs[s].key = (uint64_t)(100000 * round + 1000 * bi + s + 1);
          for (int i = 0; i < ng; i++) {
            gt[s * ng + i] = tabs[s][i];
            gb[s * ng + i] = nb;
          }
        }
        di_batch b;
        memset(&b, 0, sizeof b);
        b.n_tokens = B;
        b.tokens = tok;
        b.positions = pos;
        b.seq_of = so;
        b.n_seqs = B;
        b.seqs = bs;
        b.n_outputs = B;
        b.output_rows = rows;
        b.n_groups = ng;
        b.group_tables = gt;
        b.group_blocks = gb;
        const double a = di_cut_time_ms();
        di_status r = be->ops->submit(be, &b);
        if (r == DI_OK) r = be->ops->wait(be, logits, NULL);
        const double ms = di_cut_time_ms() - a;
        if (r != DI_OK) {
          printf("batch %d step %d: %s\n", B, st, di_last_error());
          ok = 0;
        }
        if (st > 0) { /* the first step resumes the sequences (state restore, scratch growth) */
          sum += ms;
          best = ms < best ? ms : best;
        }
      }
      for (int s = 0; s < B; s++) be->ops->release(be, (uint64_t)(100000 * round + 1000 * bi + s + 1));
      if (ok)
        printf("decode batch %2d at context %d: %.2f ms/step mean (best %.2f) over %d steps, %.1f tok/s, %.2f ms per layer\n", B,
               ctx, sum / steps, best, steps, B * 1e3 / (sum / steps), sum / steps / NL);
    }
  }
  if (prefill > 0) { /* one sequence from position 0: the whole prompt in one step, then in chunks of 512 */
    const int nb = (prefill + 64) / 64 + 1;
    di_kv_group_info g[DI_KV_MAX_GROUPS];
    ng = be->ops->kv_groups(be, g, DI_KV_MAX_GROUPS);
    for (int i = 0; i < ng; i++) {
      nblocks[i] = nb + 1;
      free(tabs[0][i]);
      tabs[0][i] = malloc(sizeof(int32_t) * nb);
      for (int k = 0; k < nb; k++) tabs[0][i][k] = 1 + k;
    }
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)prefill), *pos = malloc(sizeof(int32_t) * (size_t)prefill),
            *so = calloc((size_t)prefill, sizeof(int32_t));
    for (int i = 0; i < prefill; i++) tok[i] = (i * 7919) % c.vocab_size, pos[i] = i;
    for (int chunk = prefill; chunk >= 512; chunk = chunk == 512 ? 0 : 512) {
      if (be->ops->kv_alloc_groups(be, nblocks, ng) != DI_OK) {
        printf("kv_alloc_groups for prefill: %s\n", di_last_error());
        break;
      }
      for (int rep = 1; rep < 2; rep++) { /* one timed run (scratch growth, ms, included) */
        const uint64_t key = 900000 + (uint64_t)(2 * chunk + rep);
        const double a = di_cut_time_ms();
        di_status r = DI_OK;
        for (int t0 = 0; t0 < prefill && r == DI_OK; t0 += chunk) {
          const int n = prefill - t0 < chunk ? prefill - t0 : chunk;
          int32_t row = n - 1;
          di_batch_seq bs;
          memset(&bs, 0, sizeof bs);
          bs.block_table = tabs[0][0];
          bs.n_blocks = nb;
          bs.key = key;
          const int32_t *gt[DI_KV_MAX_GROUPS];
          int32_t gb[DI_KV_MAX_GROUPS];
          for (int i = 0; i < ng; i++) gt[i] = tabs[0][i], gb[i] = nb;
          di_batch b;
          memset(&b, 0, sizeof b);
          b.n_tokens = n;
          b.tokens = tok + t0;
          b.positions = pos + t0;
          b.seq_of = so;
          b.n_seqs = 1;
          b.seqs = &bs;
          b.n_outputs = 1;
          b.output_rows = &row;
          b.n_groups = ng;
          b.group_tables = gt;
          b.group_blocks = gb;
          r = be->ops->submit(be, &b);
          if (r == DI_OK) r = be->ops->wait(be, logits, NULL);
        }
        const double ms = di_cut_time_ms() - a;
        be->ops->release(be, key);
        if (r != DI_OK) {
          printf("prefill: %s\n", di_last_error());
          break;
        }
        if (rep == 1)
          printf("prefill of %d tokens in steps of %d: %.1f ms, %.0f tok/s\n", prefill, chunk, ms, prefill * 1e3 / ms);
      }
    }
    free(tok); free(pos); free(so);
  }
  be->ops->destroy(be);
  return 0;
}
#endif
