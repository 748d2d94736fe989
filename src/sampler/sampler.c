/* One-row sampler (see sampler.h). Truncation avoids sorting the vocabulary: top-k keeps a heap of
 * k entries, top-p first gathers the tokens above a probability threshold that is lowered tenfold
 * until they hold enough mass (the nucleus is always among the most probable tokens), and sorts
 * only those. Ties are broken by the lower id everywhere, so results are reproducible. */
#include "sampler/sampler.h"
#include "sampler/sampling_ranges.h"
#include "sampler/rng.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

struct di_sampler {
  int vocab;
  int32_t *count;   /* output-token counts (zero between calls) */
  uint8_t *seen;    /* token appears in prompt or output (zero between calls) */
  int32_t *touched; /* ids whose count/seen were set */
  int32_t *cid;     /* candidates */
  float *cp;
};

di_status di_sampler_create(int vocab, di_sampler **out) {
  if (vocab <= 0) return di_error_set(DI_ERR_INVALID_ARG, "sampler: vocabulary of %d tokens", vocab);
  di_sampler *s = calloc(1, sizeof *s);
  if (!s) return di_error_set(DI_ERR_OOM, "sampler: out of memory");
  s->vocab = vocab;
  s->count = calloc((size_t)vocab, sizeof *s->count);
  s->seen = calloc((size_t)vocab, 1);
  s->touched = malloc((size_t)vocab * sizeof *s->touched);
  s->cid = malloc((size_t)vocab * sizeof *s->cid);
  s->cp = malloc((size_t)vocab * sizeof *s->cp);
  if (!s->count || !s->seen || !s->touched || !s->cid || !s->cp) {
    di_sampler_free(s);
    return di_error_set(DI_ERR_OOM, "sampler: out of memory for %d-token scratch", vocab);
  }
  *out = s;
  return DI_OK;
}

void di_sampler_free(di_sampler *s) {
  if (!s) return;
  free(s->count); free(s->seen); free(s->touched); free(s->cid); free(s->cp);
  free(s);
}

di_status di_sampling_validate(const di_sampling *sp, int vocab) {
  /* the ranges every surface checks (sampler/sampling_ranges.h): the server and the CLI refuse the
   * same values with the same words before a request gets here */
  const struct { const char *name; double v; } vals[] = {
      {"temperature", sp->temperature}, {"top_p", sp->top_p}, {"top_k", sp->top_k}, {"min_p", sp->min_p},
      {"repetition_penalty", sp->repetition_penalty}, {"presence_penalty", sp->presence_penalty},
      {"frequency_penalty", sp->frequency_penalty}};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    char msg[160];
    if (!di_sampling_range_check(di_sampling_range_find(vals[i].name), vals[i].v, msg, sizeof msg))
      return di_error_set(DI_ERR_INVALID_ARG, "%s %s", vals[i].name, msg);
  }
  if (sp->logprobs > DI_MAX_LOGPROBS)
    return di_error_set(DI_ERR_INVALID_ARG, "logprobs must be at most %d, got %d", DI_MAX_LOGPROBS, sp->logprobs);
  for (int i = 0; i < sp->n_bias; i++) {
    if (sp->bias_ids[i] < 0 || sp->bias_ids[i] >= vocab)
      return di_error_set(DI_ERR_INVALID_ARG, "logit_bias names token %d, outside the vocabulary [0, %d)", sp->bias_ids[i], vocab);
    if (isnan(sp->bias_values[i])) return di_error_set(DI_ERR_INVALID_ARG, "logit_bias for token %d is NaN", sp->bias_ids[i]);
  }
  return DI_OK;
}

/* AVX2: eight lanes of maxima, then the first index holding the maximum; NaN never wins (max_ps keeps
 * the accumulator). */
int32_t di_row_argmax(const float *l, int V, float *out_max) {
  float mx = -INFINITY;
  int i = 0;
#ifdef __AVX2__
  if (V >= 16) {
    __m256 acc = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= V; i += 8) acc = _mm256_max_ps(_mm256_loadu_ps(l + i), acc);
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    for (int k = 0; k < 8; k++) if (lane[k] > mx) mx = lane[k];
  }
#endif
  for (; i < V; i++) if (l[i] > mx) mx = l[i];
  *out_max = mx;
  if (mx == -INFINITY) return -1;
  i = 0;
#ifdef __AVX2__
  __m256 m8 = _mm256_set1_ps(mx);
  for (; i + 8 <= V; i += 8) {
    int bits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(l + i), m8, _CMP_EQ_OQ));
    if (bits) return i + __builtin_ctz((unsigned)bits);
  }
#endif
  for (; i < V; i++) if (l[i] == mx) return i;
  return -1;
}

double di_row_expsum(const float *l, int V, float mx) {
  double z = 0;
  for (int i = 0; i < V; i++)
    if (!isnan(l[i])) z += exp((double)l[i] - (double)mx);
  return z;
}

/* a ranks before b: larger probability, then lower id */
static int before(float pa, int32_t ia, float pb, int32_t ib) { return pa > pb || (pa == pb && ia < ib); }

static int cmp_cand(const void *a, const void *b, void *ctx) {
  const float *p = ctx;
  int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
  if (before(p[ia], ia, p[ib], ib)) return -1;
  if (before(p[ib], ib, p[ia], ia)) return 1;
  return 0;
}

/* qsort_r is a GNU extension (_GNU_SOURCE is defined project-wide) */
static void sort_ids(int32_t *ids, int n, float *p) { qsort_r(ids, (size_t)n, sizeof *ids, cmp_cand, p); }

static void apply_penalties(di_sampler *s, float *l, const di_sampling *sp, const int32_t *hist, int n_prompt,
                            int n_hist) {
  int rep = sp->repetition_penalty != 1.0f, pf = sp->presence_penalty != 0 || sp->frequency_penalty != 0;
  if (!rep && !pf) return;
  int nt = 0;
  for (int i = 0; i < n_hist; i++) {
    int32_t t = hist[i];
    if (t < 0 || t >= s->vocab) continue;
    if (!s->seen[t] && s->count[t] == 0) s->touched[nt++] = t;
    s->seen[t] = 1;
    if (i >= n_prompt) s->count[t]++;
  }
  for (int k = 0; k < nt; k++) {
    int32_t t = s->touched[k];
    if (rep) l[t] = l[t] > 0 ? l[t] / sp->repetition_penalty : l[t] * sp->repetition_penalty;
    if (pf && s->count[t] > 0) l[t] -= sp->presence_penalty + sp->frequency_penalty * (float)s->count[t];
    s->seen[t] = 0;
    s->count[t] = 0;
  }
}

/* keeps the k best of ids[0..n) (by p) at the front in rank order; returns min(k, n) */
static int top_k_select(int32_t *ids, int n, int k, const float *p) {
  if (k >= n) return n;
  /* min-heap of the k best seen so far; root = worst of them */
  int32_t *h = ids; /* reuse the front of the array: ids[0..k) becomes the heap */
  for (int i = k / 2 - 1; i >= 0; i--) {
    for (int j = i;;) {
      int c = 2 * j + 1, w = j;
      if (c < k && before(p[h[w]], h[w], p[h[c]], h[c])) w = c;
      if (c + 1 < k && before(p[h[w]], h[w], p[h[c + 1]], h[c + 1])) w = c + 1;
      if (w == j) break;
      int32_t t = h[j]; h[j] = h[w]; h[w] = t; j = w;
    }
  }
  for (int i = k; i < n; i++) {
    int32_t x = ids[i];
    if (!before(p[x], x, p[h[0]], h[0])) continue;
    h[0] = x;
    for (int j = 0;;) {
      int c = 2 * j + 1, w = j;
      if (c < k && before(p[h[w]], h[w], p[h[c]], h[c])) w = c;
      if (c + 1 < k && before(p[h[w]], h[w], p[h[c + 1]], h[c + 1])) w = c + 1;
      if (w == j) break;
      int32_t t = h[j]; h[j] = h[w]; h[w] = t; j = w;
    }
  }
  return k;
}

/* The kept set of top-k / top-p / min-p over p (unnormalised, the best token = 1, total z): ids in
 * rank order in s->cid, their count returned, their mass in *tot. */
static int truncate_set(di_sampler *s, const float *p, int V, const di_sampling *sp, double z, double *tot) {
  int32_t *c = s->cid;
  int n = 0, sorted = 0;
  if (sp->top_k > 0 && sp->top_k < V) {
    for (int i = 0; i < V; i++) if (p[i] > 0) c[n++] = i;
    n = top_k_select(c, n, sp->top_k, p);
    sort_ids(c, n, (float *)p);
    sorted = 1;
    z = 0;
    for (int i = 0; i < n; i++) z += p[c[i]];
  } else if (sp->top_p < 1) {
    /* the nucleus lies within the tokens above some threshold: find one that holds top_p */
    for (double thr = 0.1;; thr *= 0.1) {
      double m = 0;
      n = 0;
      if (thr < 1e-30) {
        for (int i = 0; i < V; i++) if (p[i] > 0) c[n++] = i;
        break;
      }
      for (int i = 0; i < V; i++) if (p[i] >= thr) { c[n++] = i; m += p[i]; }
      if (m >= sp->top_p * z) break;
    }
    sort_ids(c, n, (float *)p);
    sorted = 1;
  } else {
    for (int i = 0; i < V; i++) if (p[i] > 0) c[n++] = i;
  }
  if (sp->top_p < 1 && sorted) {
    double acc = 0, need = sp->top_p * z;
    int keep = n;
    for (int i = 0; i < n; i++) {
      acc += p[c[i]];
      if (acc >= need) { keep = i + 1; break; }
    }
    n = keep;
  }
  if (sp->min_p > 0) {
    /* relative to the most probable survivor, which is c[0] when sorted and has p = 1 */
    float pm = 0;
    for (int i = 0; i < n; i++) if (p[c[i]] > pm) pm = p[c[i]];
    int m = 0;
    for (int i = 0; i < n; i++) if (p[c[i]] >= sp->min_p * pm) c[m++] = c[i];
    n = m;
  }
  *tot = 0;
  for (int i = 0; i < n; i++) *tot += p[c[i]];
  return n;
}

/* bias, masks, bans and penalties on l in place; the best id (-1: none allowed), its logit, and the
 * log-softmax normaliser when logprobs are asked for */
static int32_t prepare(di_sampler *s, float *l, int V, const di_sampling *sp, const int32_t *history, int n_prompt,
                       int n_history, const uint32_t *allow, float *mx, double *lse) {
  for (int i = 0; i < sp->n_bias; i++)
    if (sp->bias_ids[i] >= 0 && sp->bias_ids[i] < V) l[sp->bias_ids[i]] += sp->bias_values[i];
  if (allow)
    for (int i = 0; i < V; i++)
      if (!(allow[i >> 5] >> (i & 31) & 1u)) l[i] = -INFINITY;
  for (int i = 0; i < sp->n_ban; i++)
    if (sp->ban_ids[i] >= 0 && sp->ban_ids[i] < V) l[sp->ban_ids[i]] = -INFINITY;
  apply_penalties(s, l, sp, history, n_prompt, n_history);
  int32_t best = di_row_argmax(l, V, mx); /* NaN logits are never chosen */
  *lse = 0;
  if (best >= 0 && sp->logprobs >= 0) {
    for (int i = 0; i < V; i++)
      if (isnan(l[i])) l[i] = -INFINITY;
    *lse = *mx + log(di_row_expsum(l, V, *mx));
  }
  return best;
}

/* temperature-scaled weights exp((l - mx) / T) into p; returns their sum */
static double tempered(const float *l, int V, float mx, float temperature, float *p) {
  float inv_t = 1.0f / temperature;
  double z = 0;
  for (int i = 0; i < V; i++) {
    float d = (l[i] - mx) * inv_t; /* the best token has p = 1; -inf, NaN and underflow give 0 */
    p[i] = d > -87.0f ? expf(d) : 0.0f;
    z += p[i];
  }
  return z;
}

static int truncates(const di_sampling *sp, int V) {
  return (sp->top_k > 0 && sp->top_k < V) || sp->top_p < 1 || sp->min_p > 0;
}

di_status di_sampler_probs(di_sampler *s, float *l, int vocab_limit, const di_sampling *sp, const int32_t *history,
                           int n_prompt, int n_history, const uint32_t *allow, float *probs, double *lse) {
  int V = vocab_limit > 0 && vocab_limit < s->vocab ? vocab_limit : s->vocab;
  float mx;
  int32_t best = prepare(s, l, V, sp, history, n_prompt, n_history, allow, &mx, lse);
  if (best < 0) return di_error_set(DI_ERR_INVALID_ARG, "no token is allowed at this step (all masked or banned)");
  if (!(sp->temperature > 0 && sp->top_k != 1)) {
    memset(probs, 0, sizeof(float) * (size_t)V);
    probs[best] = 1.0f;
    return DI_OK;
  }
  double z;
  z = tempered(l, V, mx, sp->temperature, s->cp);
  if (!truncates(sp, V)) {
    for (int i = 0; i < V; i++) probs[i] = (float)(s->cp[i] / z);
    return DI_OK;
  }
  double tot;
  int n = truncate_set(s, s->cp, V, sp, z, &tot);
  memset(probs, 0, sizeof(float) * (size_t)V);
  for (int i = 0; i < n; i++) probs[s->cid[i]] = (float)(s->cp[s->cid[i]] / tot);
  return DI_OK;
}

int32_t di_sample_from_probs(const float *probs, int V, double u) {
  double tot = 0;
  for (int i = 0; i < V; i++) tot += probs[i];
  double target = u * tot, acc = 0;
  int32_t tok = -1;
  for (int i = 0; i < V; i++) {
    if (probs[i] <= 0) continue;
    acc += probs[i];
    tok = i;
    if (acc > target) break;
  }
  return tok;
}

di_status di_sampler_sample(di_sampler *s, float *l, int vocab_limit, const di_sampling *sp,
                            const int32_t *history, int n_prompt, int n_history, const uint32_t *allow,
                            uint64_t counter, di_sample_result *res) {
  int V = vocab_limit > 0 && vocab_limit < s->vocab ? vocab_limit : s->vocab;
  float mx;
  double lse;
  int32_t best = prepare(s, l, V, sp, history, n_prompt, n_history, allow, &mx, &lse);
  if (best < 0) return di_error_set(DI_ERR_INVALID_ARG, "no token is allowed at this step (all masked or banned)");
  int32_t tok = best;
  if (sp->temperature > 0 && sp->top_k != 1) {
    float *p = s->cp;
    double z = tempered(l, V, mx, sp->temperature, p);
    double u = di_rng_uniform(sp->seed, sp->stream, counter);
    if (!truncates(sp, V)) {
      double target = u * z, acc = 0;
      tok = -1;
      for (int i = 0; i < V; i++) {
        if (p[i] <= 0) continue;
        acc += p[i];
        tok = i;
        if (acc > target) break;
      }
    } else {
      double tot;
      int n = truncate_set(s, p, V, sp, z, &tot);
      int32_t *c = s->cid;
      double target = u * tot, acc = 0;
      tok = c[n - 1];
      for (int i = 0; i < n; i++) {
        acc += p[c[i]];
        if (acc > target) { tok = c[i]; break; }
      }
    }
    if (tok < 0) tok = best;
  }
  di_sampler_logprobs(l, V, sp->logprobs, lse, tok, res);
  return DI_OK;
}

void di_sampler_logprobs(const float *l, int V, int logprobs, double lse, int32_t tok, di_sample_result *res) {
  res->token = tok;
  res->n_top = 0;
  res->logprob = logprobs >= 0 ? (float)(l[tok] - lse) : 0.0f;
  if (logprobs > 0) {
    int k = logprobs;
    int n = 0;
    for (int i = 0; i < V; i++) {
      if (l[i] == -INFINITY) continue;
      if (n == k && !before(l[i], i, l[res->top_ids[n - 1]], res->top_ids[n - 1])) continue;
      int j = n < k ? n++ : k - 1;
      while (j > 0 && before(l[i], i, l[res->top_ids[j - 1]], res->top_ids[j - 1])) {
        res->top_ids[j] = res->top_ids[j - 1];
        j--;
      }
      res->top_ids[j] = i;
    }
    for (int j = 0; j < n; j++) res->top_logprobs[j] = (float)(l[res->top_ids[j]] - lse);
    res->n_top = n;
  }
}
