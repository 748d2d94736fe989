/* DeepSeek-V4 prefix caching on the CPU (docs/PERFORMANCE.md, "DeepSeek-V4 prefix caching"):
 *  1. a shared-system-prompt workload (R requests = S shared tokens + Q own tokens, G greedy tokens
 *     each) through the engine with prefix caching off / exact / SWA bounded replay: wall time,
 *     cached tokens, greedy agreement with the uncached run;
 *  2. the bytes a cached prefix of L tokens holds in the engine's blocks, per cache group, exact
 *     against bounded replay;
 *  3. bounded replay's accuracy: a sequence resumed at a hit at P with the window replayed, its logits
 *     at positions P.. against one whole-sequence call (rel L2, argmax agreement), for several P.
 *   bench_v4_prefix [model_dir (tests/data/models/dsv4-tiny)] [S (1024)] [R (8)] [threads (2)] */
#include "deepinfer.h"
#include "api/model_internal.h"
#include "backend/cpu/cpu_deepseek_v4.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { Q = 32, G = 16, MAXR = 64 };

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double rel_l2(const float *x, const float *y, int n) {
  double d = 0, r = 0;
  for (int i = 0; i < n; i++) {
    d += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    r += (double)y[i] * y[i];
  }
  return sqrt(d / (r > 0 ? r : 1));
}

static int argmax(const float *x, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (x[i] > x[b])
      b = i;
  return b;
}

static unsigned rng = 2024;
static int32_t rnd(int V) {
  rng = rng * 1103515245u + 12345u;
  return (int32_t)((rng >> 8) % (unsigned)V);
}

/* Runs the R prompts; outputs into out[R][G]; returns seconds, cached tokens summed into *cached. */
static double run(di_model *m, int32_t **prompts, int n_prompt, int R, int caching, int bounded, int32_t out[][G],
                  long long *cached) {
  di_engine_options o;
  di_engine_options_default(&o);
  o.max_num_seqs = R;
  o.kv_cache_memory_bytes = (int64_t)256 << 20;
  o.enable_prefix_caching = caching;
  o.swa_bounded_replay = bounded;
  di_engine *e;
  if (di_engine_create(m, &o, &e) != DI_OK) {
    fprintf(stderr, "engine: %s\n", di_last_error());
    exit(1);
  }
  uint64_t ids[MAXR];
  const double t0 = now();
  for (int r = 0; r < R; r++) {
    di_request_params p;
    di_request_params_default(&p);
    p.prompt_ids = prompts[r];
    p.n_prompt_ids = n_prompt;
    p.max_tokens = G;
    p.temperature = 0;
    p.ignore_eos = 1;
    if (di_engine_add_request(e, &p, &ids[r]) != DI_OK) {
      fprintf(stderr, "add: %s\n", di_last_error());
      exit(1);
    }
  }
  int n_out[MAXR] = {0};
  *cached = 0;
  while (di_engine_has_unfinished(e)) {
    di_step_output *so;
    if (di_engine_step(e, &so) != DI_OK) {
      fprintf(stderr, "step: %s\n", di_last_error());
      exit(1);
    }
    for (int i = 0; i < so->n; i++)
      for (int r = 0; r < R; r++)
        if (so->seqs[i].req_id == ids[r]) {
          for (int k = 0; k < so->seqs[i].n_new_tokens && n_out[r] < G; k++)
            out[r][n_out[r]++] = so->seqs[i].new_tokens[k];
          if (so->seqs[i].finish_reason)
            *cached += so->seqs[i].n_cached_tokens;
        }
  }
  const double dt = now() - t0;
  di_engine_free(e);
  return dt;
}

/* Bounded replay at a hit at P: key 1 writes the prefix's blocks, key 2 resumes at P replaying W-1
 * positions, its rows P..N-1 against the whole-sequence reference. */
static void replay_accuracy(di_model *m, int P, int N) {
  di_backend *be = m->backend;
  const int V = m->v4cfg.vocab_size, W = m->v4cfg.sliding_window, NB = (N + 63) / 64;
  di_kv_group_info gi[DI_KV_MAX_GROUPS];
  const int ng = be->ops->kv_groups(be, gi, DI_KV_MAX_GROUPS);
  int64_t nb[DI_KV_MAX_GROUPS];
  for (int g = 0; g < ng; g++)
    nb[g] = 2 * NB; /* key 2 gets its own blocks from NB on where it writes */
  if (be->ops->kv_alloc_groups(be, nb, ng) != DI_OK) {
    fprintf(stderr, "%s\n", di_last_error());
    return;
  }
  int32_t *tok = malloc(sizeof(int32_t) * N), *pos = malloc(sizeof(int32_t) * N), *sq = calloc((size_t)N, sizeof(int32_t));
  int32_t *rows = malloc(sizeof(int32_t) * N), *ta = malloc(sizeof(int32_t) * NB), *tb = malloc(sizeof(int32_t) * NB);
  for (int i = 0; i < N; i++) {
    tok[i] = rnd(V);
    pos[i] = i;
  }
  for (int i = 0; i < NB; i++) { /* key 2 shares the blocks before P, its own after (and its window blocks) */
    ta[i] = i;
    tb[i] = i < P / 64 ? i : NB + i;
  }
  const int32_t *gta[DI_KV_MAX_GROUPS], *gtb[DI_KV_MAX_GROUPS];
  int gb[DI_KV_MAX_GROUPS];
  for (int g = 0; g < ng; g++) {
    gta[g] = ta;
    gb[g] = NB;
    /* window (and state) groups: key 2's own blocks everywhere: bounded replay rebuilds them */
    int32_t *own = malloc(sizeof(int32_t) * NB);
    for (int i = 0; i < NB; i++)
      own[i] = gi[g].kind == DI_KV_SLIDING || gi[g].kind == DI_KV_STATE ? NB + i : tb[i];
    gtb[g] = own;
  }
  di_batch_seq a = {.block_table = ta, .n_blocks = NB, .key = 1}, b = {.block_table = gtb[0], .n_blocks = NB, .key = 2};
  di_batch bt = {.n_tokens = P, .tokens = tok, .positions = pos, .seq_of = sq, .n_seqs = 1, .seqs = &a, .n_groups = ng,
                 .group_tables = gta, .group_blocks = gb};
  float *lg = malloc(sizeof(float) * (size_t)(N - P) * V), *full = malloc(sizeof(float) * (size_t)N * V);
  int32_t replay[1] = {W - 1};
  di_status st = be->ops->submit(be, &bt);
  if (st == DI_OK)
    st = be->ops->wait(be, NULL, NULL);
  for (int i = 0; i < N - P; i++)
    rows[i] = (W - 1) + i;
  di_batch bt2 = {.n_tokens = N - P + W - 1, .tokens = tok + P - (W - 1), .positions = pos + P - (W - 1), .seq_of = sq,
                  .n_seqs = 1, .seqs = &b, .n_outputs = N - P, .output_rows = rows, .n_groups = ng, .group_tables = gtb,
                  .group_blocks = gb, .seq_replay = replay};
  if (st == DI_OK)
    st = be->ops->submit(be, &bt2);
  if (st == DI_OK)
    st = be->ops->wait(be, lg, NULL);
  if (st == DI_OK)
    st = di_cpu_v4_forward_full(&m->v4cfg, &m->v4w, tok, N, full);
  if (st != DI_OK) {
    fprintf(stderr, "replay accuracy: %s\n", di_last_error());
  } else {
    double worst = 0, sum = 0;
    int agree = 0;
    for (int i = 0; i < N - P; i++) {
      const float *x = lg + (size_t)i * V, *y = full + (size_t)(P + i) * V;
      const double e = rel_l2(x, y, V);
      worst = e > worst ? e : worst;
      sum += e;
      agree += argmax(x, V) == argmax(y, V);
    }
    printf("bounded replay, hit at %5d, %4d positions after it: logits rel L2 mean %.3e max %.3e; argmax equal %d of %d\n", P,
           N - P, sum / (N - P), worst, agree, N - P);
  }
  be->ops->release(be, 1);
  be->ops->release(be, 2);
  for (int g = 0; g < ng; g++)
    free((void *)gtb[g]);
  free(tok), free(pos), free(sq), free(rows), free(ta), free(tb), free(lg), free(full);
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "tests/data/models/dsv4-tiny";
  const int S = argc > 2 ? atoi(argv[2]) : 1024, R = argc > 3 ? atoi(argv[3]) : 8, th = argc > 4 ? atoi(argv[4]) : 2;
  if (S < 64 || R < 1 || R > MAXR) {
    fprintf(stderr, "usage: %s [model_dir] [shared tokens >= 64] [requests 1..%d] [threads]\n", argv[0], MAXR);
    return 2;
  }
  di_model_options mo;
  di_model_options_default(&mo);
  mo.quiet = 1;
  mo.threads = th;
  di_model *m;
  if (di_model_load(dir, &mo, &m) != DI_OK) {
    fprintf(stderr, "load: %s\n", di_last_error());
    return 1;
  }
  const int V = di_model_vocab_size(m), n_prompt = S + Q;
  int32_t *shared = malloc(sizeof(int32_t) * S), **prompts = malloc(sizeof *prompts * R);
  for (int i = 0; i < S; i++)
    shared[i] = rnd(V);
  for (int r = 0; r < R; r++) {
    prompts[r] = malloc(sizeof(int32_t) * n_prompt);
    memcpy(prompts[r], shared, sizeof(int32_t) * S);
    for (int i = S; i < n_prompt; i++)
      prompts[r][i] = rnd(V);
  }
  static int32_t ref[MAXR][G], got[MAXR][G];
  long long cached;
  printf("workload: %d requests x (%d shared + %d own prompt tokens), %d greedy tokens each; %d threads\n", R, S, Q, G, th);
  const double t_off = run(m, prompts, n_prompt, R, 0, 0, ref, &cached);
  printf("  prefix caching off:     %.3f s (cached tokens %lld)\n", t_off, cached);
  for (int mode = 1; mode <= 2; mode++) {
    const double t = run(m, prompts, n_prompt, R, 1, mode == 2, got, &cached);
    int agree = 0;
    for (int r = 0; r < R; r++)
      for (int k = 0; k < G; k++)
        agree += got[r][k] == ref[r][k];
    printf("  prefix caching %s %.3f s (%.2fx; cached tokens %lld; greedy tokens equal to uncached %d of %d)\n",
           mode == 1 ? "exact:  " : "bounded:", t, t_off / t, cached, agree, R * G);
  }
  /* the blocks a cached prefix of L tokens leaves registered, per group */
  di_kv_group_info gi[DI_KV_MAX_GROUPS];
  const int ng = m->backend->ops->kv_groups(m->backend, gi, DI_KV_MAX_GROUPS);
  static const char *const kind[] = {"full", "sliding", "compressed", "indexer", "state"};
  const int L = S;
  long long exact = 0, bounded = 0, exact_min = 0;
  printf("a cached prefix of %d tokens (%d blocks of 64 positions per group):\n", L, L / 64);
  for (int g = 0; g < ng; g++) {
    const long long blk = gi[g].bytes_per_token * 64, all = blk * (L / 64);
    const int keep_window = gi[g].kind == DI_KV_SLIDING || gi[g].kind == DI_KV_STATE;
    const long long need = gi[g].window > 0 ? blk * ((gi[g].window + 63) / 64) : all; /* what a hit at L reads */
    printf("  group %d %-10s ratio %3d: %7lld B per block; exact %9lld B (a hit at %d reads %lld), bounded %9lld B\n", g,
           kind[gi[g].kind], gi[g].tokens_per_entry, blk, all, L, need, keep_window ? 0 : all);
    exact += all;
    exact_min += need;
    bounded += keep_window ? 0 : all;
  }
  printf("  total: exact %lld B (%.0f B/token; of it a hit at %d reads %lld), bounded replay %lld B (%.0f B/token): %.1fx less\n",
         exact, (double)exact / L, L, exact_min, bounded, (double)bounded / L, (double)exact / (double)(bounded > 0 ? bounded : 1));
  const int Ps[] = {256, 512, 1024, 2048};
  for (int i = 0; i < 4; i++)
    if (Ps[i] + 256 <= di_model_max_context(m))
      replay_accuracy(m, Ps[i], Ps[i] + 256);
  for (int r = 0; r < R; r++)
    free(prompts[r]);
  free(prompts);
  free(shared);
  di_model_free(m);
  return 0;
}
