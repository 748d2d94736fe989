/* The DeepSeek-V4 cached forward (src/backend/cpu/cpu_deepseek_v4_cache.c) against the reference forward
 * on tests/data/models/dsv4-tiny: every chunking tried (1-token steps, 7+128+165, one chunk, odd chunk
 * sizes, random chunkings, all 64 chunkings of p1's positions 34..40 around its
 * top-k tie at 37) then 1-token decode gives the
 * logits of ONE whole-sequence reference call bit for bit (the indexer's fixed tie rule) on the
 * fixture's prompts and on random 600-token sequences. transformers' own cached run chunk by chunk
 * (tests/data/v4_cached) is matched by the reference in torch's tie order, and by the cached path up to
 * the first position where the fixed rule decided a top-k tie; prefill logits and greedy continuations
 * against transformers' golden ones likewise; interleaved states; state sizes; named errors. */
#include "arch/deepseek_v4.h"
#include "backend/cpu/cpu_deepseek_v4.h"
#include "backend/cpu/cpu_deepseek_v4_cache.h"
#include "model/safetensors.h"
#include "util/json.h"
#include "test_util.h"
#include "v4_golden.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FIXTURE "tests/data/models/dsv4-tiny"

static di_v4_config cfg;
static di_v4_weights wts;
static int V;
static double worst_rel; /* the largest per-position rel L2 seen against the reference */
static int quiet;        /* check_chunking prints nothing (many chunkings in a row) */


static void random_tokens(int32_t *tok, int n, unsigned seed) {
  for (int t = 0; t < n; t++) {
    seed = seed * 1103515245u + 12345u;
    tok[t] = (int32_t)((seed >> 8) % (unsigned)V);
  }
}

/* The largest per-position rel L2 of got vs ref over positions [0, n). */
static double max_rel(const float *got, const float *ref, int n) {
  double worst = 0;
  for (int t = 0; t < n; t++) {
    double e = test_rel_l2(got + (size_t)t * V, ref + (size_t)t * V, (size_t)V);
    worst = e > worst ? e : worst;
  }
  return worst;
}

/* Runs tok[0..n) through a fresh state in chunks of the given sizes (the last one repeated until n
 * is reached; sizes of 1 are decode steps), logits into lg [n][V], and fills chunk_end. */
static di_status run_cached(const int32_t *tok, int n, const int *sizes, int n_sizes, float *lg, int *chunk_end) {
  di_v4_seq_state *s;
  DI_TRY(di_v4_seq_state_create(&cfg, &s));
  di_status st = DI_OK;
  for (int at = 0, i = 0; at < n && st == DI_OK; i++) {
    int k = sizes[i < n_sizes ? i : n_sizes - 1];
    if (k > n - at)
      k = n - at;
    st = di_cpu_v4_forward_step(&cfg, &wts, s, tok + at, k, lg + (size_t)at * V);
    for (int t = at; t < at + k; t++)
      chunk_end[t] = at + k;
    at += k;
  }
  if (st == DI_OK && di_v4_seq_state_positions(s) != n)
    st = di_error_set(DI_ERR_INTERNAL, "state holds %lld positions, expected %d", (long long)di_v4_seq_state_positions(s), n);
  di_v4_seq_state_free(s);
  return st;
}

/* One sequence under one chunking: the cached logits must equal the whole-sequence reference call
 * (`full`) bit for bit. Returns the number of positions that differ (0 when it passes). */
static int check_chunking(const char *name, const int32_t *tok, int n, const int *sizes, int n_sizes, const float *full) {
  float *lg = malloc(sizeof(float) * (size_t)n * V);
  int *ce = malloc(sizeof(int) * (size_t)n), differ = 0;
  di_status st = run_cached(tok, n, sizes, n_sizes, lg, ce);
  CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
  if (st == DI_OK) {
    double e = max_rel(lg, full, n);
    worst_rel = e > worst_rel ? e : worst_rel;
    for (int t = 0; t < n; t++)
      differ += memcmp(lg + (size_t)t * V, full + (size_t)t * V, sizeof(float) * (size_t)V) != 0;
    CHECKF(differ == 0, "%s: %d positions differ from one whole-sequence call (worst rel L2 %.3e)", name, differ, e);
    if (!quiet)
      printf("%-34s T=%3d: bit-identical to one whole call (%d positions differ)\n", name, n, differ);
  }
  free(lg);
  free(ce);
  return differ;
}

/* n_rand random chunkings of tok[0..n) (chunk sizes 1..max_chunk, seeded), each against `full`. */
static void check_random_chunkings(const char *name, const int32_t *tok, int n, const float *full, int n_rand, int max_chunk,
                                   unsigned seed) {
  int *sizes = malloc(sizeof(int) * (size_t)n);
  int bad = 0;
  for (int r = 0; r < n_rand; r++) {
    int k = 0;
    for (int at = 0; at < n; k++) {
      seed = seed * 1103515245u + 12345u;
      sizes[k] = 1 + (int)((seed >> 8) % (unsigned)max_chunk);
      at += sizes[k];
    }
    quiet = 1;
    bad += check_chunking(name, tok, n, sizes, k, full) != 0;
    quiet = 0;
  }
  printf("%-34s T=%3d: %d random chunkings (chunks of 1..%d), %d not bit-identical to one whole call\n", name, n, n_rand,
         max_chunk, bad);
  free(sizes);
}

/* transformers' own cached run, chunk by chunk (tests/data/v4_cached/transformers_cached.safetensors,
 * made by tests/data/tools/v4_cached_golden.py): the reference in torch's tie order with those chunk
 * ends reproduces it at every kept position; the cached path (fixed tie rule) up to the first
 * position where the rule decided a top-k tie, and not necessarily after (torch's pick among tied
 * entries depends on how many entries existed when the chunk ran). */
static void check_transformers_cached(void) {
  di_st_file g;
  di_status st = di_st_open(test_path("tests/data/v4_cached/transformers_cached.safetensors"), &g);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK)
    return;
  for (int c = 0; c < 3; c++) {
    char k[4][32];
    snprintf(k[0], 32, "c%d.ids", c);
    snprintf(k[1], 32, "c%d.chunks", c);
    snprintf(k[2], 32, "c%d.pos", c);
    snprintf(k[3], 32, "c%d.logits", c);
    const di_st_tensor *tid = di_st_file_find(&g, k[0]), *tch = di_st_file_find(&g, k[1]), *tpo = di_st_file_find(&g, k[2]),
                       *tlg = di_st_file_find(&g, k[3]);
    CHECK(tid && tch && tpo && tlg);
    if (!tid || !tch || !tpo || !tlg)
      continue;
    const int n = (int)tid->shape[0], nch = (int)tch->shape[0], np = (int)tpo->shape[0];
    const int32_t *pos = tpo->data;
    float *lg = malloc(sizeof(float) * (size_t)n * V), *torch = malloc(sizeof(float) * (size_t)n * V);
    int *ce = malloc(sizeof(int) * (size_t)n);
    st = run_cached(tid->data, n, tch->data, nch, lg, ce);
    CHECKF(st == DI_OK, "%s", di_last_error());
    di_v4_ref_options tt = {.torch_ties = 1, .chunk_end = ce}, fixed = {0};
    if (st == DI_OK)
      st = di_cpu_v4_forward_with(&cfg, &wts, tid->data, n, &tt, torch);
    if (st == DI_OK) /* only for its tie report: the same logits as lg (check_chunking) */
      st = di_cpu_v4_forward_with(&cfg, &wts, tid->data, n, &fixed, NULL);
    CHECKF(st == DI_OK, "%s", di_last_error());
    double worst_torch = 0, before = 0, after = 0;
    int n_after = 0;
    for (int i = 0; st == DI_OK && i < np; i++) {
      const float *want = (const float *)tlg->data + (size_t)i * V;
      double e = test_rel_l2(lg + (size_t)pos[i] * V, want, (size_t)V);
      double f = test_rel_l2(torch + (size_t)pos[i] * V, want, (size_t)V);
      worst_torch = f > worst_torch ? f : worst_torch;
      if (fixed.first_tie_pos < 0 || pos[i] < fixed.first_tie_pos)
        before = e > before ? e : before;
      else {
        after = e > after ? e : after;
        n_after++;
      }
    }
    CHECKF(worst_torch < 1e-5, "case %d: reference in torch's tie order vs transformers' cached run, rel L2 %.3e", c, worst_torch);
    CHECKF(before < 1e-5, "case %d: cached path before the first decided tie (%d) vs transformers, rel L2 %.3e", c,
           fixed.first_tie_pos, before);
    printf("transformers cached case %d (T=%d, %d chunks): torch tie order worst rel L2 %.2e; fixed rule %.2e before the "
           "first decided tie (position %d), %.2e over the %d kept positions after it\n",
           c, n, nch, worst_torch, before, fixed.first_tie_pos, after, n_after);
    free(lg);
    free(torch);
    free(ce);
  }
  di_st_file_close(&g);
}

/* ---- the fixture's prompts and their golden continuations ----------------------------------------- */

static void check_golden(void) {
  di_st_file g;
  di_status st = di_st_open(test_path(FIXTURE "/golden.safetensors"), &g);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK)
    return;
  for (int p = 0; p < 3; p++) {
    const di_st_tensor *tid, *tlg, *tgr, *tmg;
    if (!v4_golden_prompt(&g, p, &tid, &tlg, &tgr, &tmg))
      continue;
    const int T = (int)tid->shape[0], G = (int)tgr->shape[0];
    const int32_t *ids = tid->data, *gold = tgr->data;
    const float *margin = tmg->data;
    /* the prompt plus the golden continuation, as one sequence under several chunkings */
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(T + G));
    memcpy(seq, ids, sizeof(int32_t) * (size_t)T);
    memcpy(seq + T, gold, sizeof(int32_t) * (size_t)G);
    const int N = T + G;
    float *full = malloc(sizeof(float) * (size_t)N * V);
    st = di_cpu_v4_forward_full(&cfg, &wts, seq, N, full);
    CHECKF(st == DI_OK, "%s", di_last_error());
    char name[64];
    const int one[] = {1}, whole_then_decode[] = {T, 1}, split[] = {7, 128, 165, 1};
    snprintf(name, sizeof name, "p%d 1-token steps", p);
    check_chunking(name, seq, N, one, 1, full);
    snprintf(name, sizeof name, "p%d prompt chunk + decode", p);
    check_chunking(name, seq, N, whole_then_decode, 2, full);
    if (T >= 300) {
      snprintf(name, sizeof name, "p%d 7+128+165 + decode", p);
      check_chunking(name, seq, N, split, 4, full);
    }
    snprintf(name, sizeof name, "p%d random chunkings", p);
    check_random_chunkings(name, seq, N, full, T >= 300 ? 4 : 10, T >= 300 ? 70 : 9, 31u + (unsigned)p);
    if (p == 1) { /* p1 meets a top-k tie at position 37: every chunking of positions 34..40 around it */
      int sizes[16], bad = 0;
      for (unsigned mask = 0; mask < 64u; mask++) {
        int k = 0, len = 1;
        sizes[k++] = 34;
        for (int gap = 0; gap < 6; gap++, len++)
          if (mask & (1u << gap)) {
            sizes[k++] = len;
            len = 0;
          }
        sizes[k++] = len;
        sizes[k++] = 1;
        quiet = 1;
        bad += check_chunking("p1 every chunking of 34..40", seq, N, sizes, k, full) != 0;
        quiet = 0;
      }
      printf("p1: all 64 chunkings of positions 34..40 (a top-k tie at 37) + decode: %d not bit-identical to one call\n", bad);
    }
    free(full);

    /* greedy decoding through the cached path: prompt in one chunk, then one token per step */
    di_v4_seq_state *s;
    st = di_v4_seq_state_create(&cfg, &s);
    CHECKF(st == DI_OK, "%s", di_last_error());
    if (st == DI_OK) {
      float *lg = malloc(sizeof(float) * (size_t)T * V);
      st = di_cpu_v4_forward_step(&cfg, &wts, s, ids, T, lg);
      CHECKF(st == DI_OK, "%s", di_last_error());
      di_v4_ref_options rep = {0};
      st = di_cpu_v4_forward_with(&cfg, &wts, ids, T, &rep, NULL);
      CHECKF(st == DI_OK, "%s", di_last_error());
      snprintf(name, sizeof name, "p%d cached prefill", p);
      double err = v4_check_golden_until_tie(name, lg, tlg->data, T, V, rep.first_tie_pos);
      int ok = 1, tok = test_argmax(lg + (size_t)(T - 1) * V, V);
      for (int i = 0; i < G && st == DI_OK; i++) {
        if (margin[i] > 1e-3f) {
          CHECKF(tok == gold[i], "p%d greedy step %d: got %d, golden %d", p, i, tok, gold[i]);
          ok &= tok == gold[i];
        }
        int32_t next = gold[i]; /* follow the golden path */
        st = di_cpu_v4_forward_step(&cfg, &wts, s, &next, 1, lg);
        CHECKF(st == DI_OK, "%s", di_last_error());
        tok = test_argmax(lg, V);
      }
      printf("p%d: cached prefill vs transformers rel L2 %.2e before the first tie; greedy %d steps %s\n", p, err, G,
             ok ? "equal" : "DIFFER");
      free(lg);
      di_v4_seq_state_free(s);
    }
    free(seq);
  }
  di_st_file_close(&g);
}

/* ---- long random sequences ------------------------------------------------------------------------- */

static void check_random(void) {
  const int N = 600;
  int32_t *tok = malloc(sizeof(int32_t) * N);
  float *full = malloc(sizeof(float) * (size_t)N * V);
  for (int r = 0; r < 2; r++) {
    random_tokens(tok, N, 1000u + (unsigned)r);
    di_status st = di_cpu_v4_forward_full(&cfg, &wts, tok, N, full);
    CHECKF(st == DI_OK, "%s", di_last_error());
    if (st != DI_OK)
      break;
    const int one[] = {1}, whole[] = {N}, split[] = {7, 128, 165, 1}, odd[] = {3, 61, 130, 1, 1, 2, 255, 4, 1},
              big[] = {200, 1, 129, 1};
    char name[64];
    if (r == 0) { /* the second sequence: one more chunking only (the sanitizer build's time) */
      snprintf(name, sizeof name, "random%d 1-token steps", r);
      check_chunking(name, tok, N, one, 1, full);
      snprintf(name, sizeof name, "random%d one chunk", r);
      CHECK(check_chunking(name, tok, N, whole, 1, full) == 0); /* one chunk is the plain reference */
      snprintf(name, sizeof name, "random%d 7+128+165 + decode", r);
      check_chunking(name, tok, N, split, 4, full);
      snprintf(name, sizeof name, "random%d odd chunks + decode", r);
      check_chunking(name, tok, N, odd, 9, full);
      snprintf(name, sizeof name, "random%d random chunkings", r);
      check_random_chunkings(name, tok, N, full, 10, 150, 99u);
    } else {
      snprintf(name, sizeof name, "random%d 200,1,129 + decode", r);
      check_chunking(name, tok, N, big, 4, full);
    }
  }
  free(tok);
  free(full);
}

/* ---- two sequences interleaved ------------------------------------------------------------------ */

static void check_interleaved(void) {
  const int N = 300;
  int32_t a[300], b[300];
  random_tokens(a, N, 77u);
  random_tokens(b, N, 78u);
  float *la = malloc(sizeof(float) * (size_t)N * V), *lb = malloc(sizeof(float) * (size_t)N * V);
  float *ia = malloc(sizeof(float) * (size_t)N * V), *ib = malloc(sizeof(float) * (size_t)N * V);
  int *ce = malloc(sizeof(int) * N);
  const int sa[] = {5, 1}, sb[] = {130, 1};
  di_status st = run_cached(a, N, sa, 2, la, ce);
  CHECKF(st == DI_OK, "%s", di_last_error());
  st = run_cached(b, N, sb, 2, lb, ce);
  CHECKF(st == DI_OK, "%s", di_last_error());
  di_v4_seq_state *A, *B;
  CHECK(di_v4_seq_state_create(&cfg, &A) == DI_OK);
  CHECK(di_v4_seq_state_create(&cfg, &B) == DI_OK);
  int pa = 0, pb = 0, i = 0, j = 0;
  while (st == DI_OK && (pa < N || pb < N)) { /* alternate one step of each */
    if (pa < N) {
      int k = i++ ? 1 : sa[0];
      st = di_cpu_v4_forward_step(&cfg, &wts, A, a + pa, k, ia + (size_t)pa * V);
      pa += k;
    }
    if (pb < N && st == DI_OK) {
      int k = j++ ? 1 : sb[0];
      st = di_cpu_v4_forward_step(&cfg, &wts, B, b + pb, k, ib + (size_t)pb * V);
      pb += k;
    }
  }
  CHECKF(st == DI_OK, "%s", di_last_error());
  CHECK(memcmp(la, ia, sizeof(float) * (size_t)N * V) == 0);
  CHECK(memcmp(lb, ib, sizeof(float) * (size_t)N * V) == 0);
  /* a reset state starts over: the first 40 tokens of b again */
  di_v4_seq_state_reset(A);
  CHECK(di_v4_seq_state_positions(A) == 0);
  st = di_cpu_v4_forward_step(&cfg, &wts, A, b, 40, ia);
  CHECKF(st == DI_OK, "%s", di_last_error());
  float *ref = malloc(sizeof(float) * 40 * V);
  CHECK(di_cpu_v4_forward_full(&cfg, &wts, b, 40, ref) == DI_OK);
  CHECK(memcmp(ref, ia, sizeof(float) * 40 * V) == 0);
  printf("two states interleaved (%d tokens each): bit-identical to each alone; reset state reused\n", N);
  free(ref);
  di_v4_seq_state_free(A);
  di_v4_seq_state_free(B);
  free(la);
  free(lb);
  free(ia);
  free(ib);
  free(ce);
}

/* ---- state sizes ------------------------------------------------------------------------------------ */

static void check_sizes(void) {
  di_v4_seq_state *s;
  if (di_v4_seq_state_create(&cfg, &s) != DI_OK) {
    CHECKF(0, "%s", di_last_error());
    return;
  }
  const size_t fixed = di_v4_seq_state_bytes(s);
  /* fixed part: per layer the window ring, plus per compressor its pending (and CSA previous) rows */
  size_t expect = 0, per_csa = 0, per_hca = 0;
  const int hd = cfg.head_dim, ihd = cfg.index_head_dim;
  for (int l = 0; l < cfg.n_layers; l++) {
    expect += 4u * (size_t)(cfg.sliding_window - 1) * hd;
    if (cfg.attn_kind[l] == DI_V4_ATTN_CSA) {
      expect += 4u * cfg.csa_rate * (4u * 2 * hd + 4u * 2 * ihd);
      per_csa += 4u * (size_t)(hd + ihd);
    } else if (cfg.attn_kind[l] == DI_V4_ATTN_HCA) {
      expect += 4u * cfg.hca_rate * 2u * hd;
      per_hca += 4u * (size_t)hd;
    }
  }
  CHECKF(fixed == expect, "fixed state bytes %zu, expected %zu", fixed, expect);
  const int N = 700;
  int32_t tok[700];
  random_tokens(tok, N, 5u);
  float *lg = malloc(sizeof(float) * (size_t)N * V);
  CHECK(di_cpu_v4_forward_step(&cfg, &wts, s, tok, N, lg) == DI_OK);
  const size_t grown = di_v4_seq_state_bytes(s) - fixed;
  const size_t want = (size_t)(N / cfg.csa_rate) * per_csa + (size_t)(N / cfg.hca_rate) * per_hca;
  CHECKF(grown == want, "after %d tokens the state grew by %zu bytes, expected %zu", N, grown, want);
  printf("state: %zu fixed bytes; after %d tokens +%zu (per layer: CSA %d B per %d tokens, HCA %d B per %d)\n", fixed, N,
         grown, 4 * (hd + ihd), cfg.csa_rate, 4 * hd, cfg.hca_rate);
  di_v4_seq_state_reset(s);
  CHECK(di_v4_seq_state_bytes(s) == fixed);
  free(lg);
  di_v4_seq_state_free(s);
}

/* ---- bad arguments -------------------------------------------------------------------------------- */

static void check_errors(void) {
  di_v4_seq_state *s = NULL;
  CHECK_ERR(di_v4_seq_state_create(NULL, &s), "NULL config");
  di_v4_config bad = cfg;
  bad.sliding_window = 0;
  CHECK_ERR(di_v4_seq_state_create(&bad, &s), "sliding_window 0");
  CHECK(s == NULL);
  if (di_v4_seq_state_create(&cfg, &s) != DI_OK) {
    CHECKF(0, "%s", di_last_error());
    return;
  }
  float *lg = malloc(sizeof(float) * 8 * V);
  int32_t tok[8] = {3, 4, 5, 6, 7, 8, 9, 10};
  CHECK_ERR(di_cpu_v4_forward_step(&cfg, &wts, NULL, tok, 1, lg), "NULL state");
  CHECK_ERR(di_cpu_v4_forward_step(&cfg, &wts, s, NULL, 1, lg), "NULL tokens");
  CHECK_ERR(di_cpu_v4_forward_step(&cfg, &wts, s, tok, 1, NULL), "NULL logits");
  CHECK_ERR(di_cpu_v4_forward_step(&cfg, &wts, s, tok, 0, lg), "empty token sequence");
  CHECK_ERR(di_cpu_v4_forward_step(&cfg, &wts, s, tok, -3, lg), "empty token sequence");
  tok[5] = V;
  CHECK_ERR(di_cpu_v4_forward_step(&cfg, &wts, s, tok, 8, lg), "token 512 at position 5 is outside the vocabulary");
  tok[5] = -1;
  CHECK_ERR(di_cpu_v4_forward_step(&cfg, &wts, s, tok, 8, lg), "token -1 at position 5");
  tok[5] = 8;
  bad = cfg;
  bad.sliding_window = 64;
  CHECK_ERR(di_cpu_v4_forward_step(&bad, &wts, s, tok, 8, lg), "another configuration");
  bad = cfg;
  bad.attn_kind[1] = DI_V4_ATTN_HCA;
  CHECK_ERR(di_cpu_v4_forward_step(&bad, &wts, s, tok, 8, lg), "another configuration");
  CHECK(di_v4_seq_state_positions(s) == 0); /* refused steps left it alone */
  /* and it still works, from position 0 */
  CHECK(di_cpu_v4_forward_step(&cfg, &wts, s, tok, 8, lg) == DI_OK);
  float *ref = malloc(sizeof(float) * 8 * V);
  CHECK(di_cpu_v4_forward_full(&cfg, &wts, tok, 8, ref) == DI_OK);
  CHECK(memcmp(ref, lg, sizeof(float) * 8 * V) == 0);
  CHECK(di_v4_seq_state_positions(s) == 8);
  int ce[8] = {2, 2, 3, 5, 4, 8, 8, 8};
  di_v4_ref_options tt = {.torch_ties = 1, .chunk_end = ce};
  CHECK_ERR(di_cpu_v4_forward_with(&cfg, &wts, tok, 8, &tt, ref), "chunk_end[4] = 4");
  ce[4] = 5;
  ce[7] = 9;
  CHECK_ERR(di_cpu_v4_forward_with(&cfg, &wts, tok, 8, &tt, ref), "chunk_end[7] = 9");
  free(ref);
  free(lg);
  di_v4_seq_state_free(s);
  di_v4_seq_state_free(NULL);
}

int main(void) {
  char *text = NULL;
  size_t len = 0;
  di_tensor_source *src = NULL;
  di_status st = di_read_file(test_path(FIXTURE "/config.json"), &text, &len);
  if (st == DI_OK)
    st = di_v4_config_parse(text, len, &cfg);
  if (st == DI_OK)
    st = di_tensor_source_open(test_path(FIXTURE), &src);
  if (st == DI_OK)
    st = di_v4_weights_bind(&cfg, src, &wts);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st == DI_OK) {
    V = cfg.vocab_size;
    check_golden();
    check_transformers_cached();
    check_random();
    check_interleaved();
    check_sizes();
    check_errors();
    printf("worst per-position rel L2, cached vs reference: %.3e\n", worst_rel);
    di_v4_weights_free(&wts);
  }
  di_tensor_source_free(src);
  free(text);
  return test_finish("test_v4_cached");
}
