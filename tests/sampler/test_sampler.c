/* Sampler: greedy and its tie rule, the support of top-k / top-p / min-p, empirical frequencies
 * against the exact distribution, penalties, logit bias, bans, masks and padding ids, logprobs,
 * determinism of the counter-based generator, and stop-string search with hold-back. */
#include "test_util.h"
#include "sampler/sampler.h"
#include "sampler/rng.h"
#include "sampler/stop_strings.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 50

static di_sampling base(void) {
  return (di_sampling){.temperature = 1, .top_p = 1, .repetition_penalty = 1, .logprobs = -1, .seed = 11};
}

static void logits(float *l) {
  for (int i = 0; i < V; i++) l[i] = (float)((i * 37) % V) / 10.0f; /* a permutation of 0..4.9 */
}

static int32_t draw(di_sampler *s, const di_sampling *sp, uint64_t counter, int limit, const uint32_t *mask) {
  float l[V];
  logits(l);
  di_sample_result r;
  if (di_sampler_sample(s, l, limit, sp, NULL, 0, 0, mask, counter, &r) != DI_OK) return -1;
  return r.token;
}

static int rank_of(int id) { /* 0 = largest logit */
  float l[V];
  logits(l);
  int r = 0;
  for (int i = 0; i < V; i++) r += l[i] > l[id];
  return r;
}

static void test_truncation(di_sampler *s) {
  di_sampling sp = base();
  sp.temperature = 0;
  int32_t best = draw(s, &sp, 0, V, NULL);
  CHECK(rank_of(best) == 0);
  /* ties: the lowest id */
  float l[V];
  for (int i = 0; i < V; i++) l[i] = 1;
  di_sample_result r;
  CHECK(di_sampler_sample(s, l, V, &sp, NULL, 0, 0, NULL, 0, &r) == DI_OK && r.token == 0);
  sp = base();
  sp.top_k = 1;
  CHECK(draw(s, &sp, 5, V, NULL) == best);
  int ok_k = 1, ok_p = 1, ok_m = 1, ok_lim = 1, seen_k[V] = {0};
  for (uint64_t c = 0; c < 3000; c++) {
    sp = base();
    sp.top_k = 5;
    int t = draw(s, &sp, c, V, NULL);
    ok_k &= rank_of(t) < 5;
    seen_k[t] = 1;
    /* top_p 0.5 at temperature 1: logits 4.9, 4.8, ... the nucleus is the smallest prefix reaching 0.5 */
    sp = base();
    sp.top_p = 0.5f;
    t = draw(s, &sp, c, V, NULL);
    ok_p &= rank_of(t) < 7;
    sp = base();
    sp.min_p = 0.5f; /* p >= 0.5 pmax <=> logit >= 4.9 - ln 2 = 4.207: ranks 0..6 */
    t = draw(s, &sp, c, V, NULL);
    ok_m &= rank_of(t) <= 6;
    sp = base();
    t = draw(s, &sp, c, 20, NULL);
    ok_lim &= t >= 0 && t < 20;
  }
  int n_seen = 0;
  for (int i = 0; i < V; i++) n_seen += seen_k[i];
  CHECK(ok_k && n_seen == 5);
  CHECK(ok_p);
  CHECK(ok_m);
  CHECK(ok_lim);
  /* exact nucleus size: probabilities p_i ∝ exp(4.9 - 0.1 i) over 50 tokens */
  double z = 0, acc = 0;
  for (int i = 0; i < V; i++) z += exp(-0.1 * i);
  int nucleus = 0;
  while (acc < 0.5 * z) acc += exp(-0.1 * nucleus++);
  int max_rank = 0;
  for (uint64_t c = 0; c < 3000; c++) {
    sp = base();
    sp.top_p = 0.5f;
    int rk = rank_of(draw(s, &sp, c, V, NULL));
    if (rk > max_rank) max_rank = rk;
  }
  CHECKF(max_rank == nucleus - 1, "top_p 0.5: max rank %d, nucleus %d", max_rank, nucleus);
}

static void test_frequencies(di_sampler *s) {
  /* 4 tokens with probabilities 0.1 0.2 0.3 0.4: frequencies over 40,000 draws within 1.5% */
  float base_l[4] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f)};
  int cnt[4] = {0}, cnt_t[4] = {0};
  di_sampler *s4;
  CHECK(di_sampler_create(4, &s4) == DI_OK);
  for (uint64_t c = 0; c < 40000; c++) {
    float l[4];
    memcpy(l, base_l, sizeof l);
    di_sampling sp = base();
    di_sample_result r;
    di_sampler_sample(s4, l, 4, &sp, NULL, 0, 0, NULL, c, &r);
    cnt[r.token]++;
    /* temperature 0.5 squares the probabilities: 1, 4, 9, 16 over 30; top_k=3 path (sorted walk) */
    memcpy(l, base_l, sizeof l);
    sp.temperature = 0.5f;
    sp.top_k = 3;
    di_sampler_sample(s4, l, 4, &sp, NULL, 0, 0, NULL, c, &r);
    cnt_t[r.token]++;
  }
  for (int i = 0; i < 4; i++) CHECKF(fabs(cnt[i] / 40000.0 - 0.1 * (i + 1)) < 0.015, "token %d: %d", i, cnt[i]);
  CHECK(cnt_t[0] == 0);
  for (int i = 1; i < 4; i++) {
    double want = (double)((i + 1) * (i + 1)) / 29.0;
    CHECKF(fabs(cnt_t[i] / 40000.0 - want) < 0.015, "T=0.5 top_k 3 token %d: %d (want %.3f)", i, cnt_t[i], want);
  }
  di_sampler_free(s4);
  (void)s;
}

static void test_penalties_bias_masks(di_sampler *s) {
  di_sampling sp = base();
  sp.temperature = 0;
  int32_t best = draw(s, &sp, 0, V, NULL);
  /* a large repetition penalty on the best token (in the prompt) moves greedy elsewhere */
  float l[V];
  logits(l);
  int32_t hist[3] = {best, 3, best};
  sp.repetition_penalty = 100;
  di_sample_result r;
  CHECK(di_sampler_sample(s, l, V, &sp, hist, 3, 3, NULL, 0, &r) == DI_OK && r.token != best);
  float lr[V];
  logits(lr);
  CHECK(fabsf(l[best] - lr[best] / 100) < 1e-6f);
  /* presence/frequency count output tokens only (after n_prompt) */
  sp = base();
  sp.temperature = 0;
  sp.frequency_penalty = 1;
  logits(l);
  di_sampler_sample(s, l, V, &sp, hist, 1, 3, NULL, 0, &r);
  CHECK(fabsf(l[best] - (lr[best] - 1)) < 1e-6f); /* one output occurrence (index 2) */
  sp.frequency_penalty = 0;
  sp.presence_penalty = 0.5f;
  logits(l);
  di_sampler_sample(s, l, V, &sp, hist, 0, 3, NULL, 0, &r);
  CHECK(fabsf(l[best] - (lr[best] - 0.5f)) < 1e-6f && fabsf(l[3] - (lr[3] - 0.5f)) < 1e-6f);
  /* logit bias */
  sp = base();
  sp.temperature = 0;
  int32_t bid = 7;
  float bv = 100;
  sp.bias_ids = &bid;
  sp.bias_values = &bv;
  sp.n_bias = 1;
  CHECK(draw(s, &sp, 0, V, NULL) == 7);
  CHECK(di_sampling_validate(&sp, V) == DI_OK);
  bid = V;
  CHECK_ERR(di_sampling_validate(&sp, V), "outside the vocabulary");
  /* bans and masks */
  sp = base();
  sp.temperature = 0;
  sp.ban_ids = &best;
  sp.n_ban = 1;
  CHECK(draw(s, &sp, 0, V, NULL) != best);
  uint32_t mask[2] = {0, 0};
  mask[9 >> 5] |= 1u << 9;
  mask[40 >> 5] |= 1u << 8; /* id 40 */
  sp = base();
  int ok = 1;
  for (uint64_t c = 0; c < 200; c++) {
    int t = draw(s, &sp, c, V, mask);
    ok &= t == 9 || t == 40;
  }
  CHECK(ok);
  CHECK(draw(s, &sp, 0, 30, mask) == 9); /* 40 is padding here */
  uint32_t none[2] = {0, 0};
  logits(l);
  CHECK_ERR(di_sampler_sample(s, l, V, &sp, NULL, 0, 0, none, 0, &r), "no token is allowed");
  /* validation */
  sp = base();
  sp.top_p = 1.5f;
  CHECK_ERR(di_sampling_validate(&sp, V), "top_p");
  sp = base();
  sp.min_p = -1;
  CHECK_ERR(di_sampling_validate(&sp, V), "min_p");
  sp = base();
  sp.logprobs = 100;
  CHECK_ERR(di_sampling_validate(&sp, V), "logprobs");
}

static void test_logprobs(di_sampler *s) {
  di_sampling sp = base();
  sp.logprobs = 3;
  sp.temperature = 0.3f; /* logprobs are of the distribution before temperature */
  float l[V];
  logits(l);
  di_sample_result r;
  CHECK(di_sampler_sample(s, l, V, &sp, NULL, 0, 0, NULL, 4, &r) == DI_OK);
  double z = 0;
  for (int i = 0; i < V; i++) z += exp(l[i]);
  CHECK(fabs(r.logprob - (l[r.token] - log(z))) < 1e-5);
  CHECK(r.n_top == 3 && rank_of(r.top_ids[0]) == 0 && rank_of(r.top_ids[1]) == 1 && rank_of(r.top_ids[2]) == 2);
  CHECK(r.top_logprobs[0] >= r.top_logprobs[1] && r.top_logprobs[1] >= r.top_logprobs[2]);
  CHECK(fabs(r.top_logprobs[0] - (4.9 - log(z))) < 1e-5);
}

static void test_rng(void) {
  CHECK(di_rng_u64(1, 2, 3) == di_rng_u64(1, 2, 3));
  CHECK(di_rng_u64(1, 2, 3) != di_rng_u64(1, 2, 4));
  CHECK(di_rng_u64(1, 2, 3) != di_rng_u64(1, 3, 3));
  CHECK(di_rng_u64(1, 2, 3) != di_rng_u64(2, 2, 3));
  double m = 0;
  int bits[64] = {0}, in_range = 1;
  for (uint64_t c = 0; c < 100000; c++) {
    double u = di_rng_uniform(9, 0, c);
    in_range &= u >= 0 && u < 1;
    m += u;
    uint64_t x = di_rng_u64(c, 0, 0);
    for (int b = 0; b < 64; b++) bits[b] += (int)(x >> b & 1);
  }
  CHECK(in_range);
  m /= 100000;
  CHECKF(fabs(m - 0.5) < 0.005, "mean %f", m);
  int bits_ok = 1;
  for (int b = 0; b < 64; b++) bits_ok &= abs(bits[b] - 50000) < 1000;
  CHECK(bits_ok);
  uint64_t st = 5, a = di_rng_draw_seed(&st), b = di_rng_draw_seed(&st);
  CHECK(a != b);
}

static void test_stop_strings(void) {
  di_stop_set ss;
  const char *strs[3] = {"END", "\n\n", "abcabd"};
  CHECK(di_stop_set_init(&ss, strs, 3) == DI_OK);
  int which = -1;
  const char *t = "hello EN";
  CHECK(di_stop_find(&ss, t, strlen(t), 0, &which) == -1);
  CHECK(di_stop_holdback(&ss, t, strlen(t)) == 2);
  t = "hello END more END";
  CHECK(di_stop_find(&ss, t, strlen(t), 7, &which) == 6 && which == 0); /* spans the 7-byte mark */
  CHECK(di_stop_find(&ss, t, strlen(t), 9, &which) == 15);              /* the first ended before 9 */
  t = "xx abcab";
  CHECK(di_stop_holdback(&ss, t, strlen(t)) == 5);
  t = "xx abcabd\n\n";
  CHECK(di_stop_find(&ss, t, strlen(t), 0, &which) == 3 && which == 2);
  CHECK(di_stop_holdback(&ss, "", 0) == 0);
  di_stop_set_destroy(&ss);
  const char *bad[1] = {""};
  CHECK_ERR(di_stop_set_init(&ss, bad, 1), "empty");
}

int main(void) {
  di_sampler *s;
  CHECK(di_sampler_create(V, &s) == DI_OK);
  test_truncation(s);
  test_frequencies(s);
  test_penalties_bias_masks(s);
  test_logprobs(s);
  test_rng();
  test_stop_strings();
  di_sampler_free(s);
  return test_finish("test_sampler");
}
