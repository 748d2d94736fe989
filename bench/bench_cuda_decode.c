/* GPU throughput benchmark of the CUDA backend on a model shape given by a config.json (default
 * bench/configs/v2-lite.json: DeepSeek-V2-Lite, 27 layers, hidden 2048, 64 experts top-6): decode
 * tokens/s at several batch sizes (each sequence: a prompt of --prompt tokens, then --gen greedy
 * tokens sampled on the GPU, one step per token, CUDA graphs on) and prefill tokens/s of one
 * sequence of each --prefill length. Weights are random bf16 ("dummy"): every tensor is a view into
 * one 256 MB random pool at a random offset, which is uploaded like a real checkpoint; the numbers
 * do not depend on the values, only the routing does, and that comes from the random router.
 * usage: bench_cuda_decode [config.json] [--batches 1,4,16,64,256] [--prompt 512] [--gen 128]
 *                          [--prefill 512,4096] [--quantization fp8] [--kv-cache-dtype fp8] [--skip-sweep qkv,prep,absorb,attn,vo,gate,experts,combine,lmhead]
 * --skip-sweep: batch-1 decode time with each listed phase left out (its marginal cost in the graph).
 * --feedback: decode steps queued with device token feedback (sample_async; each step's tokens are
 * the previous step's samples, named -1 - row; the host fetches them while the next step runs), as the
 * engine's async mode does; without it each step waits, samples and copies its tokens first.
 * --quantization fp8: the linear layers --quantization fp8 quantizes (arch/deepseek_quantize.c) are
 * FP8 E4M3 with 128 x 128 F32 block scales instead, views into a random byte pool (quantizing the
 * bf16 pool at load would take a minute on the host); with DEEPINFER_CUDA_FP8=1 they stay FP8 on the
 * device, else the backend dequantizes them to bf16 at upload.
 * --attn-fixed 0,256,64 [--reps 3]: the decode and prefill runs repeated for each listed fixed-split
 * attention setting (0: the backend's usual attention; N: k_mla_fixed.cu with N-key splits), in turn,
 * --reps times (alternating runs in one process: the weights are uploaded once), then the median of the
 * reps per setting.
 * --modes default,invariant: the same runs for each listed mode in turn (di_backend_cuda_set_invariant: the
 * batch-invariant mode switched on and off in one process), inside each rep, with --attn-fixed settings
 * within each mode; the medians then give invariant / default per column. A mode "invariant-tc" is the
 * invariant mode with DEEPINFER_CUDA_MLA_FIXED_TC=1 (its fixed-split attention on tensor cores, the same
 * bits); when it is listed, "invariant" runs with that switch at 0. "invariant-dec" likewise: the invariant mode
 * with DEEPINFER_CUDA_MLA_FIXED_DEC=1 (the fixed split's decode form, the same bits), "invariant" then at 0;
 * "invariant-decm" that form merging its own partials (DEEPINFER_CUDA_MLA_FIXED_DEC_MERGE=1). "invariant-dc": the
 * invariant mode with its MoE combine in the down GEMM (DEEPINFER_CUDA_INV_DOWN_COMBINE=256, the same bits),
 * the other modes then at 0; "invariant-pa" likewise with its MLA prep in the absorption's launch
 * (DEEPINFER_CUDA_INV_PREP_ABSORB=1), "invariant-dcpa" both.
 * Modes fp8kv and invariant-fp8kv:
 * the default / invariant mode with --kv-cache-dtype fp8's latent cache (di_backend_cuda_set_kv_fp8; the
 * pool reallocated at each switch), so `--modes default,fp8kv --reps 3` is the FP8 cache beside bf16.
 * --kv-cache-dtype fp8: the FP8 cache for every run (with no --modes).
 * --profile: after the runs, per mode, the per-phase device time (DEEPINFER_CUDA_PROFILE's marks, eager
 * steps) of 8 decode steps at each --batches size and of one prefill of each --prefill length, to stderr.
 * Each decode row also prints the bytes-read roofline of its step (weights read once a step: the
 * expected number of distinct experts E (1 - (1 - k/E)^B) of B uniformly routed tokens, plus each
 * sequence's KV of prompt + gen/2 keys, at 4.8 TB/s), each prefill row the FLOP roofline (2 x the
 * weights a token multiplies + the causal MHA-form attention, at 989 TFLOP/s bf16 / 1,979 FP8 dense).
 * bench/configs/v3-layer.json is one DeepSeek-V3-shaped MoE layer (hidden 7168, 256 experts top-8,
 * 2048 wide, one shared expert; vocab cut to 4096 so the step is the layer, not the 129k-row lm_head).
 * --skip-sweep with --modes: the sweep once per mode.
 * --prefill-mha 0,1: the runs repeated for each DEEPINFER_CUDA_PREFILL_MHA setting (0 off; 1: steps of >= 512
 * tokens; N: >= N) inside each mode (default mode only: the invariant mode ignores it).
 * --skinny-rows 0,16384: the runs repeated for each listed DEEPINFER_CUDA_SKINNY_ROWS value (di_backend_cuda_set_skinny_rows;
 * the same bits, so a same-process A/B of its speed), inside each rep (one mode, one --attn-fixed and --prefill-mha
 * setting only). */
#include <stdio.h>
#ifndef DI_HAVE_CUDA
int main(void) {
  printf("bench_cuda_decode: built without CUDA\n");
  return 0;
}
#else
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "util/numeric.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define POOL_ELEMS ((size_t)128 << 20) /* 256 MB of bf16 */

static uint16_t *g_pool;
static float *g_fpool;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
  return g_rng;
}
static di_weight view(int64_t rows, int64_t cols) {
  di_weight w;
  memset(&w, 0, sizeof w);
  w.name = "dummy";
  w.dtype = DI_DT_BF16;
  w.rows = rows;
  w.cols = cols;
  size_t n = (size_t)(rows * cols);
  size_t off = n >= POOL_ELEMS ? 0 : (size_t)(rnd() % (POOL_ELEMS - n));
  if (n > POOL_ELEMS) { /* larger than the pool (never for V2-Lite): its own buffer */
    uint16_t *d = malloc(n * 2);
    for (size_t i = 0; i < n; i++) d[i] = g_pool[i % POOL_ELEMS];
    w.data = d;
    return w;
  }
  w.data = g_pool + off;
  return w;
}
static float *fvec(int64_t n) { return g_fpool + (size_t)(rnd() % 4096); }

/* --quantization fp8: E4M3 bytes of |v| <= 2 (exponent field <= 7) times block scales ~0.015 */
static int g_fp8;
static uint8_t *g_pool8;
static di_weight qview(int64_t rows, int64_t cols) {
  if (!g_fp8) return view(rows, cols);
  di_weight w;
  memset(&w, 0, sizeof w);
  w.name = "dummy-fp8";
  w.dtype = DI_DT_F8E4M3;
  w.rows = rows;
  w.cols = cols;
  size_t n = (size_t)(rows * cols), pool = POOL_ELEMS * 2;
  if (n > pool) { /* never for V2-Lite */
    uint8_t *d = malloc(n);
    for (size_t i = 0; i < n; i++) d[i] = g_pool8[i % pool];
    w.data = d;
  } else {
    w.data = g_pool8 + (size_t)(rnd() % (pool - n + 1)) / 16 * 16;
  }
  w.block_rows = w.block_cols = 128;
  w.scale_cols = (cols + 127) / 128;
  w.scale_inv = g_fpool + (1u << 19) + (size_t)(rnd() % 4096); /* 2^19 floats of scales, more than any matrix needs */
  return w;
}

static int make_weights(const di_model_config *c, di_ds_weights *w) {
  memset(w, 0, sizeof *w);
  g_pool = malloc(POOL_ELEMS * 2);
  g_fpool = malloc(sizeof(float) * 1 << 20);
  if (!g_pool || !g_fpool) return -1;
  for (size_t i = 0; i < POOL_ELEMS; i++) {
    float u = (float)((rnd() >> 40) & 0xffffff) / 16777216.0f * 2.f - 1.f;
    g_pool[i] = di_f32_to_bf16(u * 0.03f); /* ~ 1/sqrt(hidden) scale */
  }
  for (size_t i = 0; i < (1u << 20); i++) g_fpool[i] = 1.f + 0.1f * ((float)((rnd() >> 40) & 0xffff) / 65536.f - 0.5f);
  if (g_fp8) {
    g_pool8 = malloc(POOL_ELEMS * 2);
    if (!g_pool8) return -1;
    for (size_t i = 0; i < POOL_ELEMS * 2; i++) {
      const uint64_t r = rnd() >> 40;
      g_pool8[i] = (uint8_t)((r & 0x80) | ((r >> 8) % 8) << 3 | ((r >> 16) & 7));
    }
    for (size_t i = 1u << 19; i < (1u << 20); i++) g_fpool[i] = 0.015f * (0.75f + 0.5f * (float)((rnd() >> 40) & 0xffff) / 65536.f);
  }
  const int H = c->hidden_size, NH = c->num_attention_heads, dqk = c->qk_nope_head_dim + c->qk_rope_head_dim;
  w->embed = view(c->vocab_size, H);
  w->lm_head = view(c->vocab_size, H);
  w->final_norm = fvec(H);
  w->n_layers = c->num_hidden_layers;
  w->layers = calloc((size_t)w->n_layers, sizeof(di_ds_layer));
  for (int l = 0; l < w->n_layers; l++) {
    di_ds_layer *L = &w->layers[l];
    L->attn_norm = fvec(H);
    L->ffn_norm = fvec(H);
    if (c->q_lora_rank > 0) {
      L->q_a = qview(c->q_lora_rank, H);
      L->q_a_norm = fvec(c->q_lora_rank);
      L->q_b = qview((int64_t)NH * dqk, c->q_lora_rank);
    } else {
      L->q_proj = qview((int64_t)NH * dqk, H);
    }
    L->kv_a = qview(c->kv_lora_rank + c->qk_rope_head_dim, H);
    L->kv_a_norm = fvec(c->kv_lora_rank);
    L->kv_b = view((int64_t)NH * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank);
    L->o_proj = qview(H, (int64_t)NH * c->v_head_dim);
    L->is_moe = di_cfg_is_moe_layer(c, l);
    if (!L->is_moe) {
      L->gate = qview(c->intermediate_size, H);
      L->up = qview(c->intermediate_size, H);
      L->down = qview(H, c->intermediate_size);
      continue;
    }
    const int E = c->n_routed_experts, I = c->moe_intermediate_size;
    L->router = view(E, H);
    L->router_bias = c->topk_method == DI_TOPK_NOAUX_TC ? fvec(E) : NULL;
    L->exp_gate = calloc((size_t)E, sizeof(di_weight));
    L->exp_up = calloc((size_t)E, sizeof(di_weight));
    L->exp_down = calloc((size_t)E, sizeof(di_weight));
    for (int e = 0; e < E; e++) {
      L->exp_gate[e] = qview(I, H);
      L->exp_up[e] = qview(I, H);
      L->exp_down[e] = qview(H, I);
    }
    L->has_shared = c->n_shared_experts > 0;
    if (L->has_shared) {
      const int Is = I * c->n_shared_experts;
      L->sh_gate = qview(Is, H);
      L->sh_up = qview(Is, H);
      L->sh_down = qview(H, Is);
    }
  }
  return 0;
}

static int parse_list(const char *s, int *out, int cap) {
  int n = 0;
  while (*s && n < cap) {
    out[n++] = atoi(s);
    const char *c = strchr(s, ',');
    if (!c) break;
    s = c + 1;
  }
  return n;
}

/* bytes of one weight as stored on the host side of the bench (FP8: codes + f32 block scales) */
static double wb(const di_weight *w) {
  if (!w->data) return 0;
  if (w->dtype == DI_DT_F8E4M3)
    return (double)w->rows * w->cols + 4.0 * (double)((w->rows + 127) / 128) * (double)w->scale_cols;
  return 2.0 * (double)w->rows * w->cols;
}
static double welems(const di_weight *w) { return w->data ? (double)w->rows * w->cols : 0; }

/* the bytes a decode step of B tokens reads at least: every weight once, routed experts touched by B
 * uniformly routed tokens (expected count), each sequence's KV (ctx keys of the latent row) */
static double step_bytes(const di_model_config *c, const di_ds_weights *w, int B, double ctx) {
  double b = wb(&w->lm_head) + (double)B * 2 * c->hidden_size; /* + the embedding rows */
  const double E = c->n_routed_experts, k = c->num_experts_per_tok;
  for (int l = 0; l < w->n_layers; l++) {
    const di_ds_layer *L = &w->layers[l];
    b += wb(&L->q_a) + wb(&L->q_b) + wb(&L->q_proj) + wb(&L->kv_a) + wb(&L->kv_b) + wb(&L->o_proj);
    b += (double)B * ctx * (c->kv_lora_rank + c->qk_rope_head_dim) * 2;
    if (!L->is_moe) { b += wb(&L->gate) + wb(&L->up) + wb(&L->down); continue; }
    b += wb(&L->router) + wb(&L->sh_gate) + wb(&L->sh_up) + wb(&L->sh_down);
    b += (wb(&L->exp_gate[0]) + wb(&L->exp_up[0]) + wb(&L->exp_down[0])) * E * (1 - pow(1 - k / E, B));
  }
  return b;
}

/* FLOPs a prefill token costs: its weight products (all but the output head, which one row takes) and
 * the causal attention of a T-token prompt in the MHA form (keys expanded by kv_b: a weight product);
 * *fp8_part: the share of the weight products on FP8 weights */
static double prefill_flops(const di_model_config *c, const di_ds_weights *w, int T, double *fp8_flops) {
  double f = 0, f8 = 0;
  for (int l = 0; l < w->n_layers; l++) {
    const di_ds_layer *L = &w->layers[l];
    const di_weight *m[9] = {&L->q_a, &L->q_b, &L->q_proj, &L->kv_a, &L->kv_b, &L->o_proj, &L->sh_gate, &L->sh_up,
                             &L->sh_down};
    for (int i = 0; i < 9; i++) {
      f += 2 * welems(m[i]);
      if (m[i]->data && m[i]->dtype == DI_DT_F8E4M3) f8 += 2 * welems(m[i]);
    }
    const int dqk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    f += (double)c->num_attention_heads * (dqk + c->v_head_dim) * T; /* 2 x (dqk + dv) x T/2 keys */
    if (!L->is_moe) {
      const double d = 2 * (welems(&L->gate) + welems(&L->up) + welems(&L->down));
      f += d;
      if (L->gate.dtype == DI_DT_F8E4M3) f8 += d;
      continue;
    }
    const double e = 2 * c->num_experts_per_tok * (welems(&L->exp_gate[0]) + welems(&L->exp_up[0]) + welems(&L->exp_down[0]));
    f += e + 2 * welems(&L->router);
    if (L->exp_gate[0].dtype == DI_DT_F8E4M3) f8 += e;
  }
  *fp8_flops = f8;
  return f;
}

#define FAIL(st) do { fprintf(stderr, "bench: %s\n", di_last_error()); return 1; } while (0)

int main(int argc, char **argv) {
  const char *cfg_path = "bench/configs/v2-lite.json";
  int batches[16] = {1, 4, 16, 64, 256}, nb = 5, prefills[8] = {512, 4096}, np = 2, prompt = 512, gen = 128;
  const char *skip_sweep = NULL; /* phases to leave out one at a time at batch 1 (their marginal cost) */
  /* modes: -1 the backend's own; else bit 0 the batch-invariant mode, bit 1 the FP8 KV cache, bit 2 the
   * invariant mode's attention on tensor cores (DEEPINFER_CUDA_MLA_FIXED_TC=1) */
  int feedback = 0, attn_fixed[8] = {-1}, n_af = 1, reps = 1, modes[6] = {-1}, n_mode = 1, profile = 0, kv8 = 0;
  static const char *mode_names[98] = {"default", "invariant", "fp8kv", "invariant-fp8kv", NULL, "invariant-tc",
                                       NULL, NULL, NULL, "invariant-dec", [25] = "invariant-decm",
                                       [33] = "invariant-dc", [65] = "invariant-pa", [97] = "invariant-dcpa"};
  int pmha[4] = {-1}, n_pm = 1, ko_rows[8] = {-1}, n_ko = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--batches") && i + 1 < argc) nb = parse_list(argv[++i], batches, 16);
    else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) np = parse_list(argv[++i], prefills, 8);
    else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--gen") && i + 1 < argc) gen = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--skip-sweep") && i + 1 < argc) skip_sweep = argv[++i];
    else if (!strcmp(argv[i], "--feedback")) feedback = 1;
    else if (!strcmp(argv[i], "--attn-fixed") && i + 1 < argc) n_af = parse_list(argv[++i], attn_fixed, 8);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--profile")) profile = 1;
    else if (!strcmp(argv[i], "--prefill-mha") && i + 1 < argc) n_pm = parse_list(argv[++i], pmha, 4);
    else if (!strcmp(argv[i], "--skinny-rows") && i + 1 < argc) n_ko = parse_list(argv[++i], ko_rows, 8);
    else if (!strcmp(argv[i], "--modes") && i + 1 < argc) {
      n_mode = 0;
      for (char *m = strtok(argv[++i], ","); m && n_mode < 6; m = strtok(NULL, ",")) {
        int k = 0;
        while (k < 98 && (!mode_names[k] || strcmp(m, mode_names[k]))) k++;
        if (k == 98) {
          fprintf(stderr, "bench: --modes %s (default, invariant, fp8kv, invariant-fp8kv, invariant-tc, invariant-dec, "
                  "invariant-decm, invariant-dc, invariant-pa, invariant-dcpa)\n", m);
          return 2;
        }
        modes[n_mode++] = k;
      }
      if (!n_mode) { fprintf(stderr, "bench: --modes needs default, invariant, fp8kv or invariant-fp8kv\n"); return 2; }
    }
    else if (!strcmp(argv[i], "--kv-cache-dtype") && i + 1 < argc) {
      if (strcmp(argv[++i], "fp8")) { fprintf(stderr, "bench: --kv-cache-dtype %s (fp8)\n", argv[i]); return 2; }
      kv8 = 1;
    }
    else if (!strcmp(argv[i], "--quantization") && i + 1 < argc) {
      if (strcmp(argv[++i], "fp8")) { fprintf(stderr, "bench: --quantization %s (fp8)\n", argv[i]); return 2; }
      g_fp8 = 1;
    }
    else cfg_path = argv[i];
  }
  FILE *f = fopen(cfg_path, "rb");
  if (!f) { fprintf(stderr, "bench: cannot open %s\n", cfg_path); return 1; }
  char *js = malloc(1 << 20);
  size_t jl = fread(js, 1, (1 << 20) - 1, f);
  fclose(f);
  di_model_config cfg;
  if (di_model_config_parse(js, jl, NULL, 0, &cfg) != DI_OK) FAIL(0);
  di_ds_weights w;
  double t0 = di_cut_time_ms();
  if (make_weights(&cfg, &w)) { fprintf(stderr, "bench: out of memory\n"); return 1; }
  double bytes_tok = di_ds_weights_bytes_per_token(&cfg, &w);
  di_backend *be = NULL;
  if (di_backend_cuda_create(&cfg, &w, 0, &be) != DI_OK) FAIL(0);
  printf("config %s: %d layers, hidden %d, %d experts top-%d, vocab %d; weights uploaded in %.1f s; "
         "%.2f GB of weights read per decoded token (batch 1)\n", cfg_path, cfg.num_hidden_layers, cfg.hidden_size,
         cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size, (di_cut_time_ms() - t0) / 1e3, bytes_tok / 1e9);
  int maxb = 1;
  for (int i = 0; i < nb; i++) if (batches[i] > maxb) maxb = batches[i];
  const int per_seq_blocks = (prompt + gen + 4 + 63) / 64;
  int maxpf = 0;
  for (int i = 0; i < np; i++) if (prefills[i] > maxpf) maxpf = prefills[i];
  int64_t n_blocks = (int64_t)maxb * per_seq_blocks;
  if ((maxpf + 63) / 64 > n_blocks) n_blocks = (maxpf + 63) / 64;
  if (kv8 && be->ops->set_kv_fp8(be) != DI_OK) FAIL(0);
  if (be->ops->kv_alloc(be, n_blocks) != DI_OK) FAIL(0);
  int32_t *tables = malloc(sizeof(int32_t) * (size_t)n_blocks);
  for (int64_t i = 0; i < n_blocks; i++) tables[i] = (int32_t)i;
  const int maxT = 4096; /* prompt tokens per step; the arrays also hold the longest --prefill */
  size_t cap = 2 * (size_t)(maxT > maxb ? maxT : maxb);
  if (cap < (size_t)maxpf) cap = (size_t)maxpf;
  int32_t *tok = malloc(4 * cap), *pos = malloc(4 * cap), *seq = malloc(4 * cap), *rows = malloc(4 * cap);
  di_batch_seq *seqs = malloc(sizeof(di_batch_seq) * (size_t)maxb);
  di_sample_row *srow = calloc((size_t)maxb, sizeof(di_sample_row));
  int32_t *next = malloc(4 * (size_t)maxb);
  double res_dec[16], all_dec[8][16][16], all_pf[8][16][8]; /* [setting][rep][batch / prefill] */
  if (reps < 1 || reps > 16) reps = 1;
  if (n_ko > 1 && (n_mode > 1 || n_af > 1 || n_pm > 1)) {
    fprintf(stderr, "bench: --skinny-rows with one mode, --attn-fixed and --prefill-mha setting only\n");
    return 2;
  }
  const int n_set = n_mode * n_af * n_pm * n_ko;
  int has_tc_mode = 0;
  int has_dec_mode = 0;
  for (int m = 0; m < n_mode; m++) has_tc_mode |= modes[m] >= 0 && (modes[m] >> 2) & 1;
  for (int m = 0; m < n_mode; m++) has_dec_mode |= modes[m] >= 0 && (modes[m] >> 3) & 1;
  int has_dc_mode = 0; /* invariant-dc: DEEPINFER_CUDA_INV_DOWN_COMBINE=256 there, 0 in the other modes */
  for (int m = 0; m < n_mode; m++) has_dc_mode |= modes[m] >= 0 && (modes[m] >> 5) & 1;
  int has_pa_mode = 0; /* invariant-pa: DEEPINFER_CUDA_INV_PREP_ABSORB=1 there, 0 in the other modes */
  for (int m = 0; m < n_mode; m++) has_pa_mode |= modes[m] >= 0 && (modes[m] >> 6) & 1;
  if (n_set > 8) { fprintf(stderr, "bench: more than 8 mode x --attn-fixed x --prefill-mha settings\n"); return 2; }
  for (int rep = 0; rep < reps; rep++)
  for (int si_ = 0; si_ < n_set; si_++) {
  const int si = si_, ki = si_ % n_ko, sj = si_ / n_ko; /* (n_ko > 1: sj == 0) */
  const int mi = sj / (n_af * n_pm), ai = sj / n_pm % n_af, pi_ = sj % n_pm;
  if (modes[mi] > 0 && (modes[mi] & 1) && pi_ > 0) continue; /* the invariant mode ignores --prefill-mha: its first setting only */
  if (ko_rows[ki] >= 0) {
    di_backend_cuda_set_skinny_rows(be, ko_rows[ki]);
    printf("\n--- DEEPINFER_CUDA_SKINNY_ROWS=%d, rep %d\n", ko_rows[ki], rep + 1);
  }
  if (pmha[pi_] >= 0) {
    di_backend_cuda_set_prefill_mha(be, pmha[pi_]);
    printf("\n--- prefill MHA form %d, rep %d\n", pmha[pi_], rep + 1);
  }
  if (modes[mi] >= 0 && ai == 0 && pi_ == 0) {
    if (di_backend_cuda_set_invariant(be, modes[mi] & 1) != DI_OK) FAIL(0);
    if (has_tc_mode) di_backend_cuda_set_fixed_tc(be, (modes[mi] >> 2) & 1);
    if (has_dec_mode) di_backend_cuda_set_fixed_dec(be, ((modes[mi] >> 3) & 1) | (((modes[mi] >> 4) & 1) << 2));
    if (has_dc_mode) di_backend_cuda_set_inv_down_combine(be, (modes[mi] >> 5) & 1 ? 256 : 0);
    if (has_pa_mode) di_backend_cuda_set_inv_prep_absorb(be, (modes[mi] >> 6) & 1);
    if (di_backend_cuda_set_kv_fp8(be, (modes[mi] >> 1) & 1) != DI_OK || be->ops->kv_alloc(be, n_blocks) != DI_OK) FAIL(0);
    printf("\n--- %s mode, rep %d\n", mode_names[modes[mi]], rep + 1);
  }
  if (attn_fixed[ai] >= 0) {
    if (di_backend_cuda_set_attn_fixed(be, attn_fixed[ai]) != DI_OK) FAIL(0);
    printf("\n--- attention fixed split %d, rep %d\n", attn_fixed[ai], rep + 1);
  }
  printf("\n%-8s %12s %14s %12s\n", "batch", "decode tok/s", "ms per step", "prompt fill s");
  for (int bi = 0; bi < nb; bi++) {
    const int B = batches[bi];
    for (int s = 0; s < B; s++) { seqs[s].block_table = tables + (size_t)s * per_seq_blocks; seqs[s].n_blocks = per_seq_blocks; }
    /* prompts: up to 4096 tokens per step */
    double tp = di_cut_time_ms();
    int per_step = maxT / prompt > 0 ? maxT / prompt : 1;
    for (int s0 = 0; s0 < B; s0 += per_step) {
      int ns = B - s0 < per_step ? B - s0 : per_step, T = 0, no = 0;
      for (int s = 0; s < ns; s++) {
        for (int p = 0; p < prompt; p++) {
          tok[T] = (int32_t)((rnd() >> 33) % (uint64_t)cfg.vocab_size);
          pos[T] = p; seq[T] = s0 + s; T++;
        }
        rows[no++] = T - 1;
      }
      di_batch b = {.n_tokens = T, .tokens = tok, .positions = pos, .seq_of = seq, .n_seqs = B, .seqs = seqs,
                    .n_outputs = no, .output_rows = rows};
      if (be->ops->submit(be, &b) != DI_OK || be->ops->wait(be, NULL, NULL) != DI_OK) FAIL(0);
    }
    tp = (di_cut_time_ms() - tp) / 1e3;
    for (int s = 0; s < B; s++) { next[s] = (int32_t)((rnd() >> 33) % (uint64_t)cfg.vocab_size); srow[s].temperature = 0; srow[s].top_p = 1; }
    double tstart = 0;
    const int warm = 3;
    di_cuda_stats cs0;
    for (int step = -warm; step < gen; step++) {
      if (step == 0) {
        tstart = di_cut_time_ms();
        di_backend_cuda_stats(be, &cs0);
      }
      int p = prompt + (step < 0 ? step + warm : step);
      const int fb = feedback && step > -warm; /* the previous step's sampling is queued on the device */
      for (int s = 0; s < B; s++) { tok[s] = fb ? -1 - s : next[s]; pos[s] = p; seq[s] = s; rows[s] = s; }
      di_batch b = {.n_tokens = B, .tokens = tok, .positions = pos, .seq_of = seq, .n_seqs = B, .seqs = seqs,
                    .n_outputs = B, .output_rows = rows, .sample_rows = srow}; /* sampled inside the step */
      if (feedback) {
        if (be->ops->submit(be, &b) != DI_OK) FAIL(0);
        if (fb && be->ops->sample_fetch(be, next) != DI_OK) FAIL(0); /* the previous step's, while this one runs */
        if (be->ops->sample_async(be, srow, B) != DI_OK) FAIL(0);
        continue;
      }
      if (be->ops->submit(be, &b) != DI_OK || be->ops->wait(be, NULL, NULL) != DI_OK) FAIL(0);
      if (be->ops->sample(be, srow, B, next) != DI_OK) FAIL(0);
    }
    if (feedback && be->ops->sample_fetch(be, next) != DI_OK) FAIL(0);
    double sec = (di_cut_time_ms() - tstart) / 1e3;
    res_dec[bi] = (double)B * gen / sec;
    all_dec[si][rep][bi] = res_dec[bi];
    const double sb = step_bytes(&cfg, &w, B, prompt + gen / 2.0);
    printf("%-8d %12.0f %14.3f %12.2f   roofline %.0f tok/s (%.2f GB a step at 4.8 TB/s: %.0f%%)", B, res_dec[bi],
           sec * 1e3 / gen, tp, B * 4.8e12 / sb, sb / 1e9, 100.0 * res_dec[bi] / (B * 4.8e12 / sb));
    di_cuda_stats cs1;
    di_backend_cuda_stats(be, &cs1);
    if (cs1.timed_replays > cs0.timed_replays) { /* DEEPINFER_CUDA_GPU_TIME=1: the graph's device time */
      const double g = (cs1.graph_ms - cs0.graph_ms) / (double)(cs1.timed_replays - cs0.timed_replays);
      printf("   graph %.3f ms/step, between graphs %.1f us", g, (sec * 1e3 / gen - g) * 1e3);
    }
    printf("\n");
    fflush(stdout);
  }
  printf("\n%-8s %14s %10s\n", "prefill", "tokens/s", "ms");
  for (int pi = 0; pi < np; pi++) {
    const int T = prefills[pi];
    if (T <= 0) continue;
    seqs[0].block_table = tables;
    seqs[0].n_blocks = (T + 63) / 64;
    for (int t = 0; t < T; t++) { tok[t] = (int32_t)((rnd() >> 33) % (uint64_t)cfg.vocab_size); pos[t] = t; seq[t] = 0; }
    rows[0] = T - 1;
    di_batch b = {.n_tokens = T, .tokens = tok, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = seqs,
                  .n_outputs = 1, .output_rows = rows};
    double best = 1e30;
    for (int run = 0; run < 4; run++) {
      double ts = di_cut_time_ms();
      if (be->ops->submit(be, &b) != DI_OK || be->ops->wait(be, NULL, NULL) != DI_OK) FAIL(0);
      double ms = di_cut_time_ms() - ts;
      if (run > 0 && ms < best) best = ms; /* run 0 warms up (allocations, GEMM plans) */
    }
    double f8, fl = prefill_flops(&cfg, &w, T, &f8);
    const double roof = 1.0 / ((fl - f8) / 989e12 + f8 / 1979e12);
    printf("%-8d %14.0f %10.2f   roofline %.0f tok/s (%.2f GFLOP a token, %.0f%% on FP8 weights: %.0f%%)\n", T,
           T / (best / 1e3), best, roof, fl / 1e9, 100 * f8 / fl, 100.0 * T / (best / 1e3) / roof);
    all_pf[si][rep][pi] = T / (best / 1e3);
  }
  }
  double med[8][24];
  if (reps > 1 || n_set > 1) { /* the median over the reps of each setting */
    printf("\nmedian of %d alternating runs (decode tok/s at batch", reps);
    for (int bi = 0; bi < nb; bi++) printf(" %d", batches[bi]);
    printf("; prefill tok/s at");
    for (int pi = 0; pi < np; pi++) printf(" %d", prefills[pi]);
    printf(")\n");
    for (int si = 0; si < n_set; si++) {
      const int ki = si % n_ko, sj = si / n_ko;
      const int mi = sj / (n_af * n_pm), ai = sj / n_pm % n_af, pi_ = sj % n_pm;
      if (modes[mi] > 0 && (modes[mi] & 1) && pi_ > 0) continue;
      if (n_ko > 1) printf("skinny_rows %6d:", ko_rows[ki]);
      else printf("%-15s attn fixed %4d mha %4d:", modes[mi] < 0 ? "" : mode_names[modes[mi]], attn_fixed[ai], pmha[pi_]);
      for (int k = 0; k < nb + np; k++) {
        double v[16];
        for (int r = 0; r < reps; r++) v[r] = k < nb ? all_dec[si][r][k] : all_pf[si][r][k - nb];
        for (int i = 1; i < reps; i++) for (int j = i; j > 0 && v[j - 1] > v[j]; j--) { double t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
        med[si][k] = v[reps / 2];
        printf(" %8.0f", v[reps / 2]);
      }
      printf("\n");
    }
    int md = -1; /* the default mode's index */
    for (int m = 0; m < n_mode; m++)
      if (modes[m] == 0 && md < 0) md = m;
    for (int mv = 0; md >= 0 && mv < n_mode; mv++)
      for (int ai = 0; (modes[mv] & 1) && ai < n_af * n_pm; ai++) { /* the cost of invariance per column (against each default setting) */
        const int sd = md * n_af * n_pm + ai, sv = mv * n_af * n_pm + ai - ai % n_pm;
        printf("%s / default (attn fixed %d, mha %d):", mode_names[modes[mv]], attn_fixed[ai / n_pm],
               pmha[ai % n_pm]);
        for (int k = 0; k < nb + np; k++) printf(" %7.1f%%", 100.0 * med[sv][k] / med[sd][k]);
        printf("\n");
      }
    if (n_mode == 2 && modes[0] >= 0 && (modes[0] ^ modes[1]) == 2)
      for (int ai = 0; ai < n_af * n_pm; ai++) { /* the FP8 cache against bf16 per column */
        const int s16 = (modes[0] & 2 ? 1 : 0) * n_af * n_pm + ai, s8 = (modes[0] & 2 ? 0 : 1) * n_af * n_pm + ai;
        printf("fp8 KV / bf16 KV (attn fixed %d, mha %d):", attn_fixed[ai / n_pm], pmha[ai % n_pm]);
        for (int k = 0; k < nb + np; k++) printf(" %7.1f%%", 100.0 * med[s8][k] / med[s16][k]);
        printf("\n");
      }
  }
  if (profile) /* per mode (and MHA setting): the per-phase device time of batch-1 decode steps and of one prefill */
    for (int pk = 0; pk < n_mode * n_pm; pk++) {
      const int mi = pk / n_pm;
      if (modes[mi] > 0 && (modes[mi] & 1) && pk % n_pm > 0) continue;
      if (modes[mi] >= 0 && (di_backend_cuda_set_invariant(be, modes[mi] & 1) != DI_OK ||
                             di_backend_cuda_set_kv_fp8(be, (modes[mi] >> 1) & 1) != DI_OK || be->ops->kv_alloc(be, n_blocks) != DI_OK))
        FAIL(0);
      if (has_tc_mode) di_backend_cuda_set_fixed_tc(be, (modes[mi] >> 2) & 1);
      if (has_dec_mode) di_backend_cuda_set_fixed_dec(be, ((modes[mi] >> 3) & 1) | (((modes[mi] >> 4) & 1) << 2));
      if (has_dc_mode) di_backend_cuda_set_inv_down_combine(be, (modes[mi] >> 5) & 1 ? 256 : 0);
      if (has_pa_mode) di_backend_cuda_set_inv_prep_absorb(be, (modes[mi] >> 6) & 1);
      if (pmha[pk % n_pm] >= 0) di_backend_cuda_set_prefill_mha(be, pmha[pk % n_pm]);
      if (di_backend_cuda_set_profile(be, 1) != DI_OK) FAIL(0);
      char title[96];
      for (int bi = 0; bi < nb; bi++) { /* 8 eager decode steps of each batch size (the sequences' prompts are in the cache) */
        const int B = batches[bi];
        for (int s = 0; s < B; s++) { seqs[s].block_table = tables + (size_t)s * per_seq_blocks; seqs[s].n_blocks = per_seq_blocks; }
        for (int step = 0; step < 8; step++) {
          for (int s = 0; s < B; s++) { tok[s] = 1 + s; pos[s] = prompt + step; seq[s] = s; rows[s] = s; }
          di_batch b = {.n_tokens = B, .tokens = tok, .positions = pos, .seq_of = seq, .n_seqs = B, .seqs = seqs,
                        .n_outputs = B, .output_rows = rows};
          if (be->ops->submit(be, &b) != DI_OK || be->ops->wait(be, NULL, NULL) != DI_OK) FAIL(0);
        }
        fflush(stdout);
        snprintf(title, sizeof title, "(%s mode, prefill MHA %d, decode batch %d)",
                 modes[mi] < 0 ? "the backend's" : mode_names[modes[mi]], pmha[pk % n_pm], B);
        di_backend_cuda_profile_dump(be, title);
      }
      for (int pi = 0; pi < np; pi++) { /* one prefill of each length */
        const int T = prefills[pi];
        if (T <= 0) continue;
        seqs[0].block_table = tables;
        seqs[0].n_blocks = (T + 63) / 64;
        for (int t = 0; t < T; t++) { tok[t] = (int32_t)((rnd() >> 33) % (uint64_t)cfg.vocab_size); pos[t] = t; seq[t] = 0; }
        rows[0] = T - 1;
        di_batch b = {.n_tokens = T, .tokens = tok, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = seqs,
                      .n_outputs = 1, .output_rows = rows};
        if (be->ops->submit(be, &b) != DI_OK || be->ops->wait(be, NULL, NULL) != DI_OK) FAIL(0);
        fflush(stdout);
        snprintf(title, sizeof title, "(%s mode, prefill MHA %d, prefill %d)",
                 modes[mi] < 0 ? "the backend's" : mode_names[modes[mi]], pmha[pk % n_pm], T);
        di_backend_cuda_profile_dump(be, title);
      }
      if (di_backend_cuda_set_profile(be, 0) != DI_OK) FAIL(0);
    }
  for (int mi = 0; skip_sweep && mi < n_mode; mi++) {
    /* batch 1, the first sequence's blocks: ms per decode step with each phase left out */
    if (modes[mi] >= 0 && (di_backend_cuda_set_invariant(be, modes[mi] & 1) != DI_OK ||
                           di_backend_cuda_set_kv_fp8(be, modes[mi] >> 1) != DI_OK || be->ops->kv_alloc(be, n_blocks) != DI_OK))
      FAIL(0);
    char list[256];
    snprintf(list, sizeof list, "none,%s", skip_sweep);
    printf("\nbatch-1 decode step without one phase (garbage outputs; marginal device time in the graph)%s\n",
           modes[mi] < 0 ? "" : modes[mi] == 0 ? ", default mode" : mode_names[modes[mi]]);
    double base = 0;
    for (char *ph = strtok(list, ","); ph; ph = strtok(NULL, ",")) {
      di_backend_cuda_set_skip(be, strcmp(ph, "none") ? ph : "");
      seqs[0].block_table = tables;
      seqs[0].n_blocks = per_seq_blocks;
      double ts = 0;
      const int n = 64, warm = 3;
      int32_t nt = 1;
      for (int step = -warm; step < n; step++) {
        if (step == 0) ts = di_cut_time_ms();
        tok[0] = nt; pos[0] = prompt + (step < 0 ? 0 : step % gen); seq[0] = 0; rows[0] = 0;
        di_batch b = {.n_tokens = 1, .tokens = tok, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = seqs,
                      .n_outputs = 1, .output_rows = rows};
        if (be->ops->submit(be, &b) != DI_OK || be->ops->wait(be, NULL, NULL) != DI_OK) FAIL(0);
        if (be->ops->sample(be, srow, 1, &nt) != DI_OK) FAIL(0);
      }
      double ms = (di_cut_time_ms() - ts) / n;
      if (!strcmp(ph, "none")) base = ms;
      printf("  %-10s %8.3f ms/step   phase costs %7.1f us/step\n", ph, ms, (base - ms) * 1e3);
    }
    di_backend_cuda_set_skip(be, "");
  }
  di_cuda_stats cs;
  di_backend_cuda_stats(be, &cs);
  printf("\nsteps %lld, graphs captured %lld, replays %lld, resampled %lld; batch-1 roofline at 4.3 TB/s: %.0f tok/s "
         "(measured %.0f = %.0f%%)\n", (long long)cs.steps, (long long)cs.graph_captures, (long long)cs.graph_replays,
         (long long)cs.resamples,
         4.3e12 / bytes_tok, res_dec[0], 100.0 * res_dec[0] / (4.3e12 / bytes_tok));
  be->ops->destroy(be);
  return 0;
}
#endif
