/* The batch-invariant mode's promises, held exactly (issue 19), through the backend's own interface on
 * $DEEPINFER_ACCELERATOR (default cuda; `cpu` runs the same checks on the CPU backend, which is
 * batch-invariant by construction), models loaded with batch_invariant = 1, on a V2 and a V3 fixture:
 * - chunked prefill equals the whole-prompt pass bit for bit (chunks of 64, of 37, one token at a
 *   time, and verify-sized blocks of 4), the prompt (300 tokens: more than one attention split of
 *   DI_CUK_ATTN_FIXED_SPLIT keys and five cache blocks) in other physical blocks each time;
 * - a decode row equals the same row inside a verify block and inside a prefill chunk (the same rows
 *   of the runs above);
 * - the prompt placed in 100 random batch compositions (other sequences decoding, verifying or
 *   prefilling chunks of their own, the prompt whole or as a decode row, a verify block or a chunk of
 *   it, at a random place in the step) gives logits bit-identical to the whole-prompt pass.
 * The attention form is the backend's: the fixed-split kernels of k_mla_fixed.cu in this mode, the
 * strided cluster form with DEEPINFER_CUDA_ATTN_FIXED=0; scripts/device_tests.sh runs it with both.
 * --kv8: the same, models loaded with --kv-cache-dtype fp8 (the FP8 latent cache: every attention form
 * reads the stored values, the current chunk's included, so the equalities hold as with bf16).
 * Built only with nvcc. */
#include "api/model_internal.h"
#include "backend/cuda/cuda_kernels.h"
#include "test_util.h"
#include <stdlib.h>
#include <string.h>

#define NP 300      /* prompt tokens */
#define NB 5        /* cache blocks per sequence (320 positions) */
#define NOTHER 6    /* other sequences of the random compositions */
#define NCOMP 100

/* --control: the default mode (batch_invariant = 0), differences printed, not held: shows the checks
 * can fail (the default mode's kernels depend on the batch) */
static int g_control;
static int g_kv8; /* --kv8 */
#define HOLD(c, ...) do { if (!g_control) CHECKF(c, __VA_ARGS__); } while (0)

static uint64_t rs = 12345;
static uint32_t rnd(void) {
  rs = rs * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rs >> 33);
}

typedef struct ctx {
  di_backend *be;
  int V;
  int32_t prompt[NP];
  float *ref; /* [NP][V]: the whole-prompt pass */
  int next_block;
} ctx;

static void take_blocks(ctx *c, int32_t *table) {
  for (int j = 0; j < NB; j++) table[j] = c->next_block++;
}

/* the prompt's tokens [s, s + n) as one step of one sequence (block table `table`), every row an output */
static di_status run_chunk(ctx *c, const int32_t *table, int s, int n, float *logits) {
  int32_t pos[NP], seq[NP], rows[NP];
  for (int i = 0; i < n; i++) { pos[i] = s + i; seq[i] = 0; rows[i] = i; }
  di_batch_seq bs = {.block_table = table, .n_blocks = NB};
  di_batch b = {.n_tokens = n, .tokens = c->prompt + s, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = &bs,
                .n_outputs = n, .output_rows = rows};
  DI_TRY(c->be->ops->submit(c->be, &b));
  return c->be->ops->wait(c->be, logits, NULL);
}

static int rows_differ(const ctx *c, const float *got, int s, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++)
    bad += memcmp(got + (size_t)i * c->V, c->ref + (size_t)(s + i) * c->V, sizeof(float) * (size_t)c->V) != 0;
  return bad;
}

/* the prompt in steps of `step` tokens (the last shorter) from position `from` on, after a whole pass
 * of [0, from) (nothing when from = 0), in fresh blocks: rows that differ from the whole pass */
static int chunked(ctx *c, int from, int step, float *buf) {
  int32_t table[NB];
  take_blocks(c, table);
  int bad = 0;
  if (from > 0 && run_chunk(c, table, 0, from, buf) != DI_OK) return -1;
  if (from > 0) bad += rows_differ(c, buf, 0, from);
  for (int s = from; s < NP; s += step) {
    int n = s + step <= NP ? step : NP - s;
    if (run_chunk(c, table, s, n, buf) != DI_OK) return -1;
    bad += rows_differ(c, buf, s, n);
  }
  return bad;
}

typedef struct other {
  int32_t table[NB];
  int written;
} other;

/* one random composition: returns the target rows that differ, -1 on a backend error */
static int composition(ctx *c, const int32_t *ttable, other *ot, int whole, float *buf) {
  static int32_t tok[NP + NOTHER * 40], pos[NP + NOTHER * 40], seq[NP + NOTHER * 40], rows[NP + NOTHER * 40];
  di_batch_seq bs[NOTHER + 1];
  int order[NOTHER + 1], n_seq = 1 + (int)(rnd() % (NOTHER + 1));
  for (int i = 0; i < n_seq; i++) order[i] = i;
  for (int i = n_seq - 1; i > 0; i--) { int j = (int)(rnd() % (uint32_t)(i + 1)), t = order[i]; order[i] = order[j]; order[j] = t; }
  /* the target (sequence index 0): whole, or a decode row, a verify block or a chunk of the prompt */
  int ts = 0, tn = NP;
  if (!whole) {
    int kind = (int)(rnd() % 3);
    ts = (int)(rnd() % NP);
    tn = kind == 0 ? 1 : kind == 1 ? 2 + (int)(rnd() % 4) : 6 + (int)(rnd() % 120);
    if (ts + tn > NP) tn = NP - ts;
  }
  int T = 0, n_out = 0, t_row0 = -1;
  for (int k = 0; k < n_seq; k++) {
    const int sq = order[k];
    if (sq == 0) {
      bs[0] = (di_batch_seq){.block_table = (int32_t *)ttable, .n_blocks = NB};
      t_row0 = n_out;
      for (int i = 0; i < tn; i++, T++) {
        tok[T] = c->prompt[ts + i]; pos[T] = ts + i; seq[T] = 0; rows[n_out++] = T;
      }
      continue;
    }
    other *o = &ot[sq - 1];
    int kind = (int)(rnd() % 3), n = kind == 0 ? 1 : kind == 1 ? 2 + (int)(rnd() % 4) : 6 + (int)(rnd() % 35);
    if (o->written + n > NB * 64) o->written = 0;
    bs[sq] = (di_batch_seq){.block_table = o->table, .n_blocks = NB};
    for (int i = 0; i < n; i++, T++) {
      tok[T] = 2 + (int32_t)(rnd() % (uint32_t)(c->V - 2)); pos[T] = o->written + i; seq[T] = sq;
    }
    rows[n_out++] = T - 1;
    o->written += n;
  }
  /* (order is a permutation of 0 .. n_seq - 1: the sequences present are 0 .. n_seq - 1) */
  di_batch b = {.n_tokens = T, .tokens = tok, .positions = pos, .seq_of = seq, .n_seqs = n_seq, .seqs = bs,
                .n_outputs = n_out, .output_rows = rows};
  if (c->be->ops->submit(c->be, &b) != DI_OK || c->be->ops->wait(c->be, buf, NULL) != DI_OK) return -1;
  return rows_differ(c, buf + (size_t)t_row0 * c->V, ts, tn);
}

static void check_model(const char *name) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  mo.batch_invariant = !g_control;
  mo.kv_cache_dtype = g_kv8 ? "fp8" : NULL;
  di_model *m = NULL;
  di_status st = di_model_load(test_path(name), &mo, &m);
  CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
  if (st != DI_OK) return;
  ctx c = {.be = m->backend, .V = m->cfg.vocab_size};
  st = c.be->ops->kv_alloc(c.be, 96);
  CHECKF(st == DI_OK, "%s: kv_alloc: %s", name, di_last_error());
  for (int i = 0; i < NP; i++) c.prompt[i] = 2 + (int32_t)(rnd() % (uint32_t)(c.V - 2));
  c.ref = malloc(sizeof(float) * (size_t)NP * c.V);
  float *buf = malloc(sizeof(float) * (size_t)(NP + NOTHER) * c.V);
  int32_t ttable[NB];
  take_blocks(&c, ttable);
  st = run_chunk(&c, ttable, 0, NP, c.ref);
  CHECKF(st == DI_OK, "%s: whole prompt: %s", name, di_last_error());
  if (st == DI_OK) {
    /* chunked prefill; decode rows (step 1) and verify blocks (step 4) against the same rows */
    const int steps[][2] = {{0, 64}, {0, 37}, {0, 256}, {280, 1}, {200, 4}, {250, 5}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
      int bad = chunked(&c, steps[i][0], steps[i][1], buf);
      HOLD(bad == 0, "%s: prompt from %d in steps of %d: %d of %d rows differ from the whole pass", name,
             steps[i][0], steps[i][1], bad, NP);
      printf("%s: whole pass of %d, then steps of %-3d from %3d: %s\n", name, steps[i][0], steps[i][1], steps[i][0],
             bad == 0 ? "bit-identical" : "DIFFERENT");
    }
    /* 100 random compositions (the first with the whole prompt, which also rewrites its cache) */
    other ot[NOTHER];
    for (int i = 0; i < NOTHER; i++) { take_blocks(&c, ot[i].table); ot[i].written = 0; }
    int bad_comp = 0, errors = 0;
    for (int k = 0; k < NCOMP; k++) {
      int bad = composition(&c, ttable, ot, k == 0 || k == NCOMP / 2, buf);
      if (bad < 0) { errors++; break; }
      bad_comp += bad > 0;
    }
    CHECKF(errors == 0, "%s: compositions: %s", name, di_last_error());
    HOLD(bad_comp == 0, "%s: %d of %d batch compositions changed the prompt's logits", name, bad_comp, NCOMP);
    printf("%s: %d random batch compositions: %d changed the prompt's logits\n", name, NCOMP, bad_comp);
  }
  free(c.ref);
  free(buf);
  di_model_free(m);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  for (int i = 1; i < argc; i++) {
    g_control |= !strcmp(argv[i], "--control");
    g_kv8 |= !strcmp(argv[i], "--kv8");
  }
  if (g_kv8) printf("--kv8: models loaded with --kv-cache-dtype fp8\n");
  if (g_control) printf("--control: the default mode, differences printed, not held\n");
  const char *acc = getenv("DEEPINFER_ACCELERATOR");
  if (!acc || !*acc) setenv("DEEPINFER_ACCELERATOR", "cuda", 1), acc = "cuda";
  if (strcmp(acc, "cpu") != 0 && !di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  check_model("tests/data/models/dsv2-lite-tiny");
  check_model("tests/data/models/dsv3-tiny");
  check_model("models/default"); /* trained weights */
  return test_finish("test_cuda_invariance");
}
