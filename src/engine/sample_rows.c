/* Host sampling of a step's rows, in parallel when there are enough of them: each row's sampling
 * (grammar mask, penalties, truncation, draw) depends on its own request only, so rows are split
 * over a small thread pool with per-thread scratch and the result never depends on the split. The
 * results are applied to the requests afterwards, on the engine's thread. */
#include "engine/engine_internal.h"
#include "util/threadpool.h"
#include "sampler/rng.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/switches.h"

struct di_row_sampler {
  int vocab, mask_words, n_threads;
  int64_t min_work;      /* rows x vocab below which one thread does it all */
  di_threadpool *tp;     /* NULL: one thread */
  di_sampler **s;        /* [n_threads] */
  uint32_t *masks;       /* [n_threads][mask_words] */
  float *probs;          /* [n_threads][vocab]: speculative sampling's target distribution */
};

di_status di_row_sampler_create(int vocab, int threads, di_row_sampler **out) {
  di_row_sampler *rs = calloc(1, sizeof *rs);
  if (!rs) return di_error_set(DI_ERR_OOM, "sampler: out of memory");
  if (threads <= 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = di_switch_int(DI_SW_SAMPLER_THREADS, (int)(cores / 2 < 8 ? cores / 2 : 8));
  }
  if (threads < 1) threads = 1;
  rs->vocab = vocab;
  rs->min_work = (int64_t)1 << 20; /* waking the threads costs ~10 us: worth it for many large rows */
  rs->mask_words = (vocab + 31) / 32;
  rs->n_threads = threads;
  rs->s = calloc((size_t)threads, sizeof *rs->s);
  rs->masks = malloc((size_t)threads * (size_t)rs->mask_words * sizeof *rs->masks);
  rs->probs = malloc((size_t)threads * (size_t)vocab * sizeof *rs->probs);
  di_status st = rs->s && rs->masks && rs->probs ? DI_OK : di_error_set(DI_ERR_OOM, "sampler: out of memory");
  for (int t = 0; t < threads && st == DI_OK; t++) st = di_sampler_create(vocab, &rs->s[t]);
  if (st == DI_OK && threads > 1) st = di_threadpool_create(threads, &rs->tp);
  if (st != DI_OK) {
    di_row_sampler_free(rs);
    return st;
  }
  *out = rs;
  return DI_OK;
}

void di_row_sampler_free(di_row_sampler *rs) {
  if (!rs) return;
  if (rs->s)
    for (int t = 0; t < rs->n_threads; t++) di_sampler_free(rs->s[t]);
  free(rs->s);
  free(rs->masks);
  free(rs->probs);
  di_threadpool_free(rs->tp);
  free(rs);
}

typedef struct run_ctx {
  di_row_sampler *rs;
  di_engine *e;
  di_row_job *jobs;
} run_ctx;

/* Speculative sampling of one verify row (di_row_job.spec). Draws are keyed like plain sampling's
 * (seed, sample index, position) on separate streams for the acceptance test and the residual, so a
 * seeded request reproduces at a given schedule. */
static di_status spec_sample(di_row_sampler *rs, di_engine *e, di_row_job *j, int t, float *lg, const di_sampling *sp,
                             const uint32_t *allow) {
  di_req *r = j->r;
  const int V = e->cfg.vocab_limit < e->cfg.vocab_size ? e->cfg.vocab_limit : e->cfg.vocab_size;
  float *p = rs->probs + (size_t)t * (size_t)rs->vocab;
  double lse;
  DI_TRY(di_sampler_probs(rs->s[t], lg, e->cfg.vocab_limit, sp, r->tokens, r->n_prompt, r->n_tokens, allow, p, &lse));
  const uint64_t pos = (uint64_t)r->n_tokens;
  int32_t tok = -1;
  j->accepted = 0;
  if (j->draft >= 0 && j->draft < V) {
    double u = di_rng_uniform(sp->seed, sp->stream + DI_SPEC_STREAM_ACCEPT, pos);
    const float qd = j->q[j->draft], pd = p[j->draft];
    if (pd > 0 && (qd <= pd || u * (double)qd < (double)pd)) {
      tok = j->draft;
      j->accepted = 1;
    } else { /* the residual max(0, p - q), normalised; p itself if it has no mass (rounding) */
      double tot = 0, acc = 0;
      for (int i = 0; i < V; i++)
        if (p[i] > j->q[i]) tot += (double)p[i] - (double)j->q[i];
      const double u2 = di_rng_uniform(sp->seed, sp->stream + DI_SPEC_STREAM_RESIDUAL, pos);
      if (tot > 0) {
        for (int i = 0; i < V; i++) {
          if (!(p[i] > j->q[i])) continue;
          acc += (double)p[i] - (double)j->q[i];
          tok = i;
          if (acc > u2 * tot) break;
        }
      } else {
        tok = di_sample_from_probs(p, V, u2);
      }
    }
  } else {
    tok = di_sample_from_probs(p, V, di_rng_uniform(sp->seed, sp->stream, pos));
  }
  if (tok < 0) return di_error_set(DI_ERR_INVALID_ARG, "no token is allowed at this step (all masked or banned)");
  di_sampler_logprobs(lg, V, sp->logprobs, lse, tok, &j->res);
  return DI_OK;
}

static void sample_one(di_row_sampler *rs, di_engine *e, di_row_job *j, int t) {
  di_req *r = j->r;
  float *lg = e->logits + (size_t)j->row * (size_t)e->cfg.vocab_size;
  const uint32_t *allow = NULL;
  j->st = DI_OK;
  if (r->constraint) {
    uint32_t *mask = rs->masks + (size_t)t * (size_t)rs->mask_words;
    memset(mask, 0, (size_t)rs->mask_words * sizeof *mask);
    j->st = e->constraint.fill_mask(r->constraint, mask);
    allow = mask;
  }
  if (j->st == DI_OK) {
    di_sampling sp = r->sp;
    if (r->n_tokens - r->n_prompt >= r->min_tokens) sp.n_ban = 0;
    if (j->spec)
      j->st = spec_sample(rs, e, j, t, lg, &sp, allow);
    else
      j->st = di_sampler_sample(rs->s[t], lg, e->cfg.vocab_limit, &sp, r->tokens, r->n_prompt, r->n_tokens, allow,
                                (uint64_t)r->n_tokens, &j->res);
  }
  if (j->st != DI_OK) snprintf(j->err, sizeof j->err, "%s", di_last_error()); /* the message is per thread */
}

static void run_range(void *ctx, int64_t begin, int64_t end, int thread) {
  run_ctx *c = ctx;
  for (int64_t i = begin; i < end; i++) sample_one(c->rs, c->e, &c->jobs[i], thread);
}

void di_row_sampler_run(di_row_sampler *rs, di_engine *e, di_row_job *jobs, int n) {
  run_ctx c = {rs, e, jobs};
  if (rs->tp && n >= 2 && (int64_t)n * rs->vocab >= rs->min_work)
    di_parallel_for(rs->tp, n, 1, run_range, &c);
  else
    run_range(&c, 0, n, 0);
}

void di_row_sampler_set_min_work(di_row_sampler *rs, int64_t rows_x_vocab) { rs->min_work = rows_x_vocab; }
