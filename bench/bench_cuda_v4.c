/* Decode (and one prefill) timing of the DeepSeek-V4 CUDA backend on a V4-Flash-shaped model of a
 * fixed 8 layers with random weights (the shape and layer order of arch/deepseek_v4_shapes.h, the
 * builder of arch/deepseek_v4_random.h, both shared with the kernel tests) with E routed experts
 * (default 32, argument 2): bf16, or with DEEPINFER_CUDA_V4_NATIVE=1 V4's own formats (FP8 attention
 * and shared expert, MXFP4 routed experts), kept so on the device. Prints the device bytes of the
 * weights and, per batch-1 line, the weight-read roofline (bytes read per step / 4.8 TB/s).
 * With fewer experts than V4-Flash's 256 the bytes read per token at batch 1 are the same (6 + 1 experts
 * per layer), at larger batches fewer distinct experts exist to be read.
 * Sequences start at position CTX (argument 1, default 4096) as prefix hits on zeroed cache blocks
 * (the timing of attention over CTX positions does not depend on the values), then decode.
 *   bench_cuda_v4 [CTX[,CTX...]] [EXPERTS] [STEPS] [BATCHES] [PREFILL] [PROFILE]   one line per context and batch size
 *   (BATCHES: a comma list of 1..256, default 1,16,64; a batch whose B x CTX passes 64 x 128K is skipped). PREFILL (argument 5, default 0: none): then one
 *   sequence's first PREFILL tokens in one step, and the same again in steps of 512 tokens, timed (with PROFILE > 0 the
 *   one-step prefill runs twice more: timed with its scratch grown, then with the phase profile on).
 * PROFILE (argument 6, default 0): after each batch's timed steps, PROFILE more steps with the backend's phase
 * profile on (eager, an event at each phase's start: di_backend_cuda_v4_profile), printed per layer type
 * (sliding / CSA / HCA, mean per layer) and phase (hyper-connections, q/kv, compressor, indexer, attention,
 * output, router, experts; embedding and head), with each phase's batch-1 weight bytes, their read rate and
 * their share of the 4.8 TB/s roofline (at batch B the experts read up to min(E, B x top-k) + 1 experts: the
 * rate shown is of the batch-1 bytes).
 * Each decode line ends with an FNV-1a hash of the last step's logits (the same binary inputs give the same
 * logits: two builds' hashes equal = bit-identical forwards). BENCH_V4_MX_FORM=0 runs the MXFP4 experts on
 * the lane kernels (di_v4k_mx_form; 1, the default, the staged ones), BENCH_V4_INDEX_FORM=1 the indexer on its
 * register-tiled score kernel (di_v4k_index_form; 4, the default, the widen-once one; 0 the per-product one), BENCH_V4_FUSE=1 the
 * q / kv norms and ropes in one launch each (di_v4k_fuse), BENCH_V4_LIN_FORM=1 one token's bf16 linears on the
 * barrier-free GEMV (di_v4k_lin_form), BENCH_V4_FP8_FORM=1 / 2 one row's FP8 GEMVs with rows a warp and chunks by K
 * (di_cuk_fp8_gemv1_form), BENCH_V4_FP8_F32X=1 one token's FP8 products from the f32 activations (di_cuk_fp8_f32x),
 * BENCH_V4_HC_FORM=1 the mHC / head collapses with grouped loads (di_v4k_hc_form),
 * BENCH_V4_STATE_CTAS=N the compressor state writes over N CTAs each (di_v4k_state_ctas), BENCH_V4_ROUTE_FORM=1 the
 * routing with a warp per token (di_v4k_route_form), BENCH_V4_ATT_FORM=1 the attention with two keys a warp in
 * flight (di_v4k_attend_form; 3: the split kernels, each key row widened once per 8 / 4 heads; 4, the default: 1 for
 * one token over <= 256 keys, else 3), for A/B runs (BENCH_V4_MX_FORM=4 / 5: the MXFP4 kernels with the byte-permute
 * decode; BENCH_V4_INDEX_FORM=3: the indexer's widen-once score kernel and, past 4,096 entries, a 1,024-thread top-k;
 * 4, the default: with 4 entries a lane past 8,192).
 * The backend's switches are read at its creation: since session 16 DEEPINFER_CUDA_V4_MX_TC unset means the default mode's
 * 2 (the MXFP4 tensor-core experts in steps of >= 2 tokens: batch lines above 1 and the prefill; =0 gives the CUDA-core
 * kernels at every step, the hashes of earlier sessions), DEEPINFER_BATCH_INVARIANT=1 the invariant mode (CUDA-core at
 * every step), DEEPINFER_CUDA_V4_FORK the streams of the mHC Sinkhorn / compressor / indexer, BENCH_V4_MX_FORM=6 / 7
 * the MXFP4 one-token kernel with 2 / 4 row groups a warp.
 * Each batch's first two steps are not timed (the first resumes the sequences and grows the scratch; with
 * DEEPINFER_CUDA_V4_GRAPHS=1 the second captures the bucket's graph); the graphs captured and replayed are
 * printed at the end. */
#include <stdio.h>
#ifndef DI_HAVE_CUDA
int main(void) {
  printf("bench_cuda_v4: built without CUDA\n");
  return 0;
}
#else
#include "arch/deepseek_v4.h"
#include "arch/deepseek_v4_random.h"
#include "arch/deepseek_v4_shapes.h"
#include "backend/cuda/cuda_fp8.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_v4_backend.h"
#include "backend/cuda/cuda_v4_kernels.h"
#include <stdlib.h>
#include <string.h>

#define NL 8
#define KV_MAX_TOKENS (64 * 131072) /* ~17 GB of float32 V4-Flash cache rows: batch 64 at 128K */
#define HBM_TBS 4.8 /* H200 HBM3e bandwidth, TB/s: the weight-read roofline's denominator */
static di_v4_config c;
static di_v4_random_model rm;

#define MAXSEQ 256
static int ng;
static int64_t nblocks[DI_KV_MAX_GROUPS];
static int32_t *tabs[MAXSEQ][DI_KV_MAX_GROUPS];

/* The phase profile of the last profiled steps: per layer type the mean per layer and step, us; per phase
 * its batch-1 weight bytes, their rate, the share of the roofline (bytes / 4.8 TB/s over the time). */
static void print_profile(const di_backend *be, const char *what) {
  static const char *pn[DI_V4_PROF_N] = {"hyper-conn", "q/kv", "compressor", "indexer", "attention", "output",
                                         "router", "experts", "embedding", "head"};
  static const char *kn[3] = {"sliding", "CSA", "HCA"};
  int64_t steps = 0;
  di_backend_cuda_v4_profile_read(be, 0, 0, NULL, &steps, NULL);
  if (steps <= 0) return;
  double total = 0;
  printf("  phase profile, %s (%lld eager steps; us per layer and step; MB of batch-1 weights; GB/s of them; %% of "
         "the %.1f TB/s roofline):\n", what, (long long)steps, HBM_TBS);
  for (int k = 0; k < 3; k++) {
    int nl = 0;
    for (int l = 0; l < NL; l++) nl += c.attn_kind[l] == k;
    if (!nl) continue;
    double lay_us = 0, lay_b = 0;
    for (int p = 0; p < DI_V4_PROF_EMBED; p++) {
      double ms = 0, by = 0;
      for (int l = 0; l < NL; l++) {
        if (c.attn_kind[l] != k) continue;
        double m1 = 0, b1 = 0;
        di_backend_cuda_v4_profile_read(be, l, p, &m1, NULL, &b1);
        ms += m1, by += b1;
      }
      const double us = ms * 1e3 / steps / nl, mb = by / nl / 1e6;
      lay_us += us, lay_b += by / nl;
      total += ms / steps;
      if (us <= 0 && mb <= 0) continue;
      printf("    %-7s x%d %-10s %8.1f us %8.2f MB %7.0f GB/s %5.1f%%\n", kn[k], nl, pn[p], us, mb, us > 0 ? mb * 1e3 / us : 0,
             us > 0 ? 100 * (mb * 1e6 / (HBM_TBS * 1e12)) / (us * 1e-6) : 0);
    }
    printf("    %-7s x%d %-10s %8.1f us %8.2f MB %7.0f GB/s %5.1f%%\n", kn[k], nl, "LAYER", lay_us, lay_b / 1e6,
           lay_us > 0 ? lay_b / 1e3 / lay_us : 0, lay_us > 0 ? 100 * (lay_b / (HBM_TBS * 1e12)) / (lay_us * 1e-6) : 0);
  }
  for (int p = DI_V4_PROF_EMBED; p < DI_V4_PROF_N; p++) {
    double ms = 0, by = 0;
    di_backend_cuda_v4_profile_read(be, NL, p, &ms, NULL, &by);
    const double us = ms * 1e3 / steps, mb = by / 1e6;
    total += ms / steps;
    printf("    %-10s %-10s %8.1f us %8.2f MB %7.0f GB/s %5.1f%%\n", "model", pn[p], us, mb, us > 0 ? mb * 1e3 / us : 0,
           us > 0 ? 100 * (mb * 1e6 / (HBM_TBS * 1e12)) / (us * 1e-6) : 0);
  }
  printf("  phase sum %.3f ms per step (device, between the step's first and last event)\n", total);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const char *ctxs = argc > 1 ? argv[1] : "4096";
  const int E = argc > 2 ? atoi(argv[2]) : 32, steps = argc > 3 ? atoi(argv[3]) : 8;
  const int prefill = argc > 5 ? atoi(argv[5]) : 0, pfs = argc > 6 ? atoi(argv[6]) : 0;
  int batches[8], n_batches = 0;
  for (const char *bp = argc > 4 ? argv[4] : "1,16,64"; *bp && n_batches < 8;) {
    const int v = atoi(bp);
    if (v >= 1 && v <= MAXSEQ) batches[n_batches++] = v;
    while (*bp && *bp != ',') bp++;
    if (*bp == ',') bp++;
  }
  int maxB = 1; /* cache blocks for this many sequences only (per context, below) */
  if (!di_cut_device_ok()) {
    printf("no CUDA device\n");
    return 0;
  }
  const double t_build = di_cut_time_ms();
  const char *mxf = getenv("BENCH_V4_MX_FORM");
  if (mxf) di_v4k_mx_form(atoi(mxf));
  const char *ixf = getenv("BENCH_V4_INDEX_FORM");
  if (ixf) di_v4k_index_form(atoi(ixf));
  const char *fus = getenv("BENCH_V4_FUSE");
  if (fus) di_v4k_fuse(atoi(fus));
  const char *lnf = getenv("BENCH_V4_LIN_FORM");
  if (lnf) di_v4k_lin_form(atoi(lnf));
  const char *f8f = getenv("BENCH_V4_FP8_FORM");
  if (f8f) di_cuk_fp8_gemv1_form(atoi(f8f));
  const char *f8x = getenv("BENCH_V4_FP8_F32X");
  if (f8x) di_cuk_fp8_f32x(atoi(f8x));
  const char *hcf = getenv("BENCH_V4_HC_FORM");
  if (hcf) di_v4k_hc_form(atoi(hcf));
  const char *stc = getenv("BENCH_V4_STATE_CTAS");
  if (stc) di_v4k_state_ctas(atoi(stc));
  const char *rtf = getenv("BENCH_V4_ROUTE_FORM");
  if (rtf) di_v4k_route_form(atoi(rtf));
  const char *atf = getenv("BENCH_V4_ATT_FORM");
  if (atf) di_v4k_attend_form(atoi(atf));
  const char *nat = getenv("DEEPINFER_CUDA_V4_NATIVE");
  const int native = nat && strcmp(nat, "1") == 0;
  di_v4_flash_shape(&c, NL, E);
  if (di_v4_random_model_init(&rm, &c, native, 1) != DI_OK) {
    printf("build: %s\n", di_last_error());
    return 1;
  }
  di_model_config mc;
  memset(&mc, 0, sizeof mc);
  di_backend *be = NULL;
  size_t fr0 = 0, fr1 = 0, tot = 0;
  di_cut_mem_info(&fr0, &tot);
  if (di_backend_cuda_v4_create(&mc, &c, &rm.w, &be) != DI_OK) {
    printf("create: %s\n", di_last_error());
    return 1;
  }
  di_cut_mem_info(&fr1, &tot);
  const double step_bytes = di_v4_random_model_step_bytes(&rm, native), roof_ms = step_bytes / (HBM_TBS * 1e9);
  printf("V4-Flash-shaped 8 layers, %d experts, %s weights: built and uploaded in %.1f s; device weights %.2f GB (device memory "
         "+%.2f GB); batch-1 step reads %.3f GB of weights: roofline %.3f ms at %.1f TB/s\n", E,
         native ? "native (FP8 attention + shared, MXFP4 routed)" : "bf16", (di_cut_time_ms() - t_build) / 1e3,
         di_backend_cuda_v4_weight_bytes(be) / 1e9, ((double)fr0 - (double)fr1) / 1e9, step_bytes / 1e9, roof_ms, HBM_TBS);
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
    const int nb = (ctx + steps + pfs + 1 + 64) / 64 + 1; /* table entries per sequence */
    /* the cache blocks for the largest batch whose B * ctx fits the device budget (KV_MAX_TOKENS) */
    maxB = 1;
    for (int i = 0; i < n_batches; i++)
      if ((int64_t)batches[i] * ctx <= KV_MAX_TOKENS && batches[i] > maxB) maxB = batches[i];
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
      if (B > maxB) {
        printf("decode batch %2d at context %d: skipped (%lld cached tokens, over the bench's %d)\n", B, ctx, (long long)B * ctx,
               KV_MAX_TOKENS);
        continue;
      }
      int32_t tok[MAXSEQ], pos[MAXSEQ], so[MAXSEQ], rows[MAXSEQ], gb[MAXSEQ * DI_KV_MAX_GROUPS];
      const int32_t *gt[MAXSEQ * DI_KV_MAX_GROUPS];
      di_batch_seq bs[MAXSEQ];
      double best = 1e30, sum = 0;
      int ok = 1;
      for (int st = 0; st <= steps + 1 + pfs && ok; st++) {
        if (st == steps + 2) di_backend_cuda_v4_profile(be, 1); /* the profiled steps after the timed ones */
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
        if (st > 1 && st < steps + 2) { /* not the first two (resume, scratch growth; the graph's capture) */
          sum += ms;
          best = ms < best ? ms : best;
        }
      }
      if (pfs > 0) {
        di_backend_cuda_v4_profile(be, 0);
        if (ok) {
          char what[64];
          snprintf(what, sizeof what, "batch %d at context %d", B, ctx);
          print_profile(be, what);
        }
      }
      for (int s = 0; s < B; s++) be->ops->release(be, (uint64_t)(100000 * round + 1000 * bi + s + 1));
      if (ok) {
        uint64_t h = 1469598103934665603ull; /* FNV-1a of the last step's logits */
        const unsigned char *p = (const unsigned char *)logits;
        for (size_t i = 0; i < sizeof(float) * (size_t)B * c.vocab_size; i++) h = (h ^ p[i]) * 1099511628211ull;
        printf("decode batch %2d at context %d: %.2f ms/step mean (best %.2f) over %d steps, %.1f tok/s, %.2f ms per layer, "
               "logits %016llx\n", B, ctx, sum / steps, best, steps, B * 1e3 / (sum / steps), sum / steps / NL,
               (unsigned long long)h);
      }
      if (ok && B == 1)
        printf("  batch 1 at context %d: %.1f%% of the weight-read roofline (%.3f ms)\n", ctx, 100 * roof_ms / (sum / steps), roof_ms);
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
      /* rep 1: timed (scratch growth included); whole-prompt steps with PROFILE > 0: rep 2 timed again (grown), rep 3
       * with the phase profile on */
      const int reps = chunk == prefill && pfs > 0 ? 4 : 2;
      for (int rep = 1; rep < reps; rep++) {
        if (rep == 3) di_backend_cuda_v4_profile(be, 1);
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
        if (rep == 2)
          printf("prefill of %d tokens in steps of %d again (scratch grown): %.1f ms, %.0f tok/s\n", prefill, chunk, ms,
                 prefill * 1e3 / ms);
        if (rep == 3) {
          di_backend_cuda_v4_profile(be, 0);
          char what[64];
          snprintf(what, sizeof what, "prefill of %d tokens in one step", prefill);
          print_profile(be, what);
        }
      }
    }
    free(tok); free(pos); free(so);
  }
  int64_t caps = 0, reps = 0;
  const int graphs = di_backend_cuda_v4_graph_stats(be, &caps, &reps);
  printf("CUDA graphs %s: %lld captured, %lld replays\n", graphs == 1 ? "on" : "off", (long long)caps, (long long)reps);
  be->ops->destroy(be);
  di_v4_random_model_free(&rm);
  return 0;
}
#endif
