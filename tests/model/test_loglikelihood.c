/* di_model_loglikelihood against a log-softmax computed here in double from di_model_score's logits
 * (fixture dsv3-tiny): the sum over the continuation (relative error < 1e-6 in one forward call,
 * < 1e-5 when forced through several chunks), the greedy flag on a greedy and a non-greedy
 * continuation, di_model_loglikelihood_batch equal to one call per sequence however it groups them,
 * and the named errors; the score and batch checks again on DeepSeek-V4 (dsv4-tiny). */
#include "api/model_loglik.h"
#include "api/model_internal.h"
#include "test_util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The reference: sum of log-softmax(logits[t-1])[ids[t]] for t in [start, n), and greedy-ness. */
static double ref_loglik(const float *logits, int V, const int32_t *ids, int n, int start, int *greedy) {
  double sum = 0;
  *greedy = 1;
  for (int t = start; t < n; t++) {
    const float *l = logits + (size_t)(t - 1) * V;
    int best = 0;
    for (int v = 1; v < V; v++)
      if (l[v] > l[best])
        best = v;
    double z = 0;
    for (int v = 0; v < V; v++)
      z += exp((double)l[v] - (double)l[best]);
    sum += (double)l[ids[t]] - (double)l[best] - log(z);
    if (best != ids[t])
      *greedy = 0;
  }
  return sum;
}

static double rel(double got, double ref) { return fabs(got - ref) / (fabs(ref) > 1e-30 ? fabs(ref) : 1.0); }

static void check_against_score(di_model *m, const int32_t *ids, int n) {
  const int V = di_model_vocab_size(m);
  float *lg = malloc(sizeof(float) * (size_t)n * (size_t)V);
  di_status st = di_model_score(m, ids, n, lg);
  CHECKF(st == DI_OK, "%s", di_last_error());
  const int starts[] = {1, 2, n / 3, n - 5, n - 1};
  for (size_t k = 0; k < sizeof starts / sizeof *starts; k++) {
    const int start = starts[k];
    int rg, g = -1;
    const double ref = ref_loglik(lg, V, ids, n, start, &rg);
    float lp = 0;
    st = di_model_loglikelihood(m, ids, n, start, &lp, &g);
    CHECKF(st == DI_OK, "%s", di_last_error());
    CHECKF(rel(lp, ref) < 1e-6, "n=%d start=%d: %.9g vs reference %.9g (rel %.2e)", n, start, (double)lp, ref, rel(lp, ref));
    CHECKF(g == rg, "n=%d start=%d: greedy %d, reference %d", n, start, g, rg);
    /* several forward calls (chunked prefill through the cache) give the same sum */
    const int chunks[] = {1, 3, 64};
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
      float lp2 = 0;
      int g2 = -1;
      st = di_model_loglikelihood_chunked(m, ids, n, start, chunks[c], &lp2, &g2);
      CHECKF(st == DI_OK, "%s", di_last_error());
      CHECKF(rel(lp2, ref) < 1e-5 && g2 == rg, "n=%d start=%d rows=%d: %.9g vs %.9g, greedy %d vs %d", n, start, chunks[c],
             (double)lp2, ref, g2, rg);
    }
  }
  printf("n=%d: whole-continuation logprob %.4f\n", n, ref_loglik(lg, V, ids, n, 1, &(int){0}));
  free(lg);
}

/* A continuation made of the model's own greedy choices is greedy; changing its last token is not. */
static void check_greedy(di_model *m) {
  const int V = di_model_vocab_size(m), n0 = 6, n = 12;
  int32_t ids[12] = {0, 17, 300, 41, 999, 5};
  float *lg = malloc(sizeof(float) * (size_t)n * (size_t)V);
  for (int t = n0; t < n; t++) { /* extend by the argmax of the last row (lowest id on ties) */
    di_status st = di_model_score(m, ids, t, lg);
    CHECK(st == DI_OK);
    const float *l = lg + (size_t)(t - 1) * V;
    int best = 0;
    for (int v = 1; v < V; v++)
      if (l[v] > l[best])
        best = v;
    ids[t] = best;
  }
  float lp;
  int g = -1;
  CHECK(di_model_loglikelihood(m, ids, n, n0, &lp, &g) == DI_OK);
  CHECKF(g == 1 && lp <= 0, "greedy continuation: greedy %d, logprob %g", g, (double)lp);
  ids[n - 1] = (ids[n - 1] + 1) % V;
  float lp2;
  CHECK(di_model_loglikelihood(m, ids, n, n0, &lp2, &g) == DI_OK);
  CHECKF(g == 0 && lp2 < lp, "changed last token: greedy %d, logprob %g (greedy one %g)", g, (double)lp2, (double)lp);
  CHECK(di_model_loglikelihood(m, ids, n, n0, &lp2, NULL) == DI_OK); /* is_greedy may be NULL */
  free(lg);
}

/* The batch call equals one call per sequence (the CPU backend is batch-invariant), whether the
 * sequences share forward calls in one group, several groups, or run alone in chunks. */
static void check_batch(di_model *m, const int32_t *base, int n_base) {
  enum { K = 12 };
  const int lens[K] = {9, 2, 30, 150, 64, 65, 3, 100, 12, 129, 40, 7};
  const int starts[K] = {4, 1, 29, 1, 60, 2, 1, 50, 11, 128, 1, 6};
  const int32_t *ids[K];
  int n[K], starts_[K];
  float single[K], got[K];
  int gs[K], gg[K];
  for (int i = 0; i < K; i++) {
    ids[i] = base + (i * 7) % (n_base - lens[i] + 1);
    n[i] = lens[i];
    starts_[i] = starts[i];
    CHECK(di_model_loglikelihood(m, ids[i], n[i], starts_[i], &single[i], &gs[i]) == DI_OK);
  }
  const int rows[] = {0, 1, 5, 64, 200};
  for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
    di_status st = di_model_loglikelihood_batch_rows(m, K, ids, n, starts_, rows[r], got, gg);
    CHECKF(st == DI_OK, "%s", di_last_error());
    int same = 1;
    for (int i = 0; i < K; i++)
      same &= got[i] == single[i] && gg[i] == gs[i];
    CHECKF(same, "batch with %d rows per call differs from one call per sequence", rows[r]);
  }
  CHECK(di_model_loglikelihood_batch(m, K, ids, n, starts_, got, NULL) == DI_OK); /* is_greedy may be NULL */
  CHECK(di_model_loglikelihood_batch(m, 0, NULL, NULL, NULL, NULL, NULL) == DI_OK);
  /* errors name the sequence; outputs untouched */
  float keep[K];
  for (int i = 0; i < K; i++)
    keep[i] = got[i] = -1.0f;
  starts_[5] = n[5];
  CHECK_ERR(di_model_loglikelihood_batch(m, K, ids, n, starts_, got, gg), "sequence 5: start 65 out of range [1, 64]");
  starts_[5] = 2;
  n[3] = di_model_max_context(m) + 1;
  CHECK_ERR(di_model_loglikelihood_batch(m, K, ids, n, starts_, got, gg), "sequence 3: sequence of 4097 tokens");
  CHECK(memcmp(keep, got, sizeof got) == 0);
  CHECK_ERR(di_model_loglikelihood_batch(m, -1, ids, n, starts_, got, gg), "negative count");
  CHECK_ERR(di_model_loglikelihood_batch(m, K, NULL, n, starts_, got, gg), "NULL argument");
  const int32_t *holes[2] = {base, NULL};
  int n2[2] = {5, 5}, s2[2] = {1, 1};
  CHECK_ERR(di_model_loglikelihood_batch(m, 2, holes, n2, s2, got, gg), "sequence 1: NULL argument");
}

static void check_errors(di_model *m) {
  int32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  float lp = 123.0f;
  int g = 7;
  CHECK_ERR(di_model_loglikelihood(m, ids, 8, 0, &lp, &g), "start 0 out of range [1, 7]");
  CHECK_ERR(di_model_loglikelihood(m, ids, 8, 8, &lp, &g), "start 8 out of range [1, 7]");
  CHECK_ERR(di_model_loglikelihood(m, ids, 8, -3, &lp, &g), "out of range");
  CHECK_ERR(di_model_loglikelihood(m, ids, 1, 1, &lp, &g), "sequence of 1 tokens");
  CHECK_ERR(di_model_loglikelihood(m, ids, 0, 1, &lp, &g), "sequence of 0 tokens");
  CHECK_ERR(di_model_loglikelihood(NULL, ids, 8, 1, &lp, &g), "NULL argument");
  CHECK_ERR(di_model_loglikelihood(m, NULL, 8, 1, &lp, &g), "NULL argument");
  CHECK_ERR(di_model_loglikelihood(m, ids, 8, 1, NULL, &g), "NULL argument");
  ids[5] = di_model_vocab_size(m);
  CHECK_ERR(di_model_loglikelihood(m, ids, 8, 1, &lp, &g), "token 1024 at position 5 is outside the vocabulary [0, 1024)");
  ids[5] = -1;
  CHECK_ERR(di_model_loglikelihood(m, ids, 8, 1, &lp, &g), "token -1 at position 5");
  const int big = di_model_max_context(m) + 1;
  int32_t *many = calloc((size_t)big, sizeof(int32_t));
  di_status st = di_model_loglikelihood(m, many, big, 1, &lp, &g);
  CHECK(st == DI_ERR_CONTEXT_OVERFLOW);
  CHECK_ERR(st, "sequence of 4097 tokens is longer than the context (4096)");
  free(many);
  CHECK(lp == 123.0f && g == 7); /* outputs untouched on failure */
}

int main(void) {
  di_model_options opt;
  di_model_options_default(&opt);
  opt.quiet = 1;
  opt.threads = 2;
  opt.accelerator = "cpu";
  di_model *m = NULL;
  di_status st = di_model_load(test_path("tests/data/models/dsv3-tiny"), &opt, &m);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK)
    return test_finish("test_loglikelihood");
  /* a pseudo-random sequence crossing two KV blocks (64 tokens each) */
  int32_t ids[150];
  uint32_t x = 12345;
  for (int i = 0; i < 150; i++) {
    x = x * 1664525u + 1013904223u;
    ids[i] = (int32_t)((x >> 8) % 1024u);
  }
  ids[0] = 0; /* BOS */
  check_against_score(m, ids, 150);
  check_against_score(m, ids, 9);
  check_greedy(m);
  check_batch(m, ids, 150);
  check_errors(m);
  di_model_free(m);
  /* DeepSeek-V4 (dsv4-tiny, vocabulary 512): its backend keeps per-sequence state beside the blocks,
   * keyed per packed sequence and restarted at position 0; the same checks against di_model_score */
  st = di_model_load(test_path("tests/data/models/dsv4-tiny"), &opt, &m);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st == DI_OK) {
    for (int i = 1; i < 150; i++)
      ids[i] %= 512;
    check_against_score(m, ids, 150);
    check_against_score(m, ids, 9);
    check_batch(m, ids, 150);
    float lp = 0;
    CHECK(di_model_loglikelihood(m, ids, 40, 20, &lp, NULL) == DI_OK); /* again after the batch: keys reused */
    float lp2 = 0;
    CHECK(di_model_loglikelihood(m, ids, 40, 20, &lp2, NULL) == DI_OK && lp2 == lp);
    di_model_free(m);
  }
  return test_finish("test_loglikelihood");
}
