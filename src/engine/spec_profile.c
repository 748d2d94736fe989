/* DSpark's step-time profile measured at startup (speculative_config "profile": "startup"), per CUDA-graph
 * bucket, before the first request; the confidence schedule (spec_dspark.c) then starts from it and the
 * online EMA of the engine's own steps refines it (di_spec_record_step).
 *
 * Without it the schedule learns the profile online: a probe step without drafts, then one verifying
 * every draft, then EMA per token count; until a count is seen it is interpolated. At startup instead,
 * synthetic decoding steps run straight through the backend (not through the scheduler): for each size T
 * of the backend's graph buckets (backend ops->graph_buckets: the token counts it replays from captured
 * graphs; the CUDA backend pads a step to the next power of two up to 256) and, beyond the largest, at
 * powers of two up to the largest decoding step the schedule can make (max_num_seqs x (1 + k), at most
 * max_num_batched_tokens). A bucket's time then stands for every count it pads (T/2, T]; counts beyond
 * the buckets (eager steps) are interpolated linearly between the sizes measured, as online. Each size is
 * run a few times untimed (the CUDA backend's first sight is eager, the second captures the graph) and
 * timed as the engine times a step (from submit's start to wait's return: an eager step's launches count,
 * session 15): the median of the timed runs.
 *
 * A step of T tokens is min(T, max_num_seqs) sequences of consecutive rows, all on one scratch KV
 * sequence's blocks (taken from the manager and given back; never committed, so never a prefix-cache
 * entry; the rows they write are garbage in free blocks, and the CUDA feature log's rows of them are
 * flushed before any request's, so a later request's own rows overwrite them). They are sampled as the
 * engine's plain path samples (greedy rows inside the step where the backend samples on the device),
 * every row an output row with its logits wanted. With proposals inside the step (the CUDA drafter's
 * graph_on) each size is measured a second time with every sequence proposing a full block, for the
 * profile of proposing steps; a size whose proposal the backend declines (a step too large for its
 * graphs) is given the plain time plus the proposal cost of the largest size it accepted. */
#include "engine/spec_internal.h"
#include "kv/kv_manager.h"
#include <stdlib.h>
#include <string.h>

enum { WARM_RUNS = 2, TIMED_RUNS = 3, MAX_SIZES = 64 };

typedef struct prof_scratch {
  di_kv_seq kv;
  int32_t *tok, *pos, *seq_of, *out_rows, *prow, *pcap, *dblk;
  uint8_t *want;
  di_batch_seq *seqs;
  const int32_t **gtab, **dtab;
  int *gblk;
  di_sample_row *rows;
  int32_t *sampled;
} prof_scratch;

static void scratch_free(di_engine *e, prof_scratch *p) {
  di_kv_free_seq(e->kv, &p->kv);
  free(p->tok); free(p->pos); free(p->seq_of); free(p->out_rows); free(p->prow); free(p->pcap); free(p->dblk);
  free(p->want); free(p->seqs); free(p->gtab); free(p->dtab); free(p->gblk); free(p->rows); free(p->sampled);
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* one synthetic step of T tokens over n sequences (propose: each with a full block); *ms its time (the
 * median of the timed runs), *made whether the backend proposed inside it */
static di_status time_step(di_engine *e, prof_scratch *p, int T, int propose, double *ms, int *made) {
  struct di_spec *sp = e->spec;
  di_backend *be = e->be;
  const int n = T < sp->max_seqs ? T : sp->max_seqs, ng = e->n_kv_groups > 0 ? e->n_kv_groups : 1;
  const int limit = e->cfg.vocab_limit < sp->V ? e->cfg.vocab_limit : sp->V;
  for (int q = 0, t = 0; q < n; q++) {
    const int rows = T / n + (q < T % n); /* consecutive positions 0 .. rows - 1 of sequence q */
    p->prow[q] = propose ? t : -1; /* its first row's sample is the anchor; the rows after it its "drafts" */
    p->pcap[q] = propose ? sp->drafter.block_size : 0;
    for (int k = 0; k < rows; k++, t++) {
      p->tok[t] = 3 + (int32_t)(((uint32_t)t * 2654435761u) % (uint32_t)(limit > 3 ? limit - 3 : 1));
      p->pos[t] = k;
      p->seq_of[t] = q;
      p->out_rows[t] = t;
      p->want[t] = 1;
      p->rows[t] = (di_sample_row){.temperature = 0.f, .top_p = 1.f, .counter = (uint64_t)k, .vocab_limit = e->cfg.vocab_limit};
    }
    p->seqs[q] = (di_batch_seq){.block_table = p->kv.table[0], .n_blocks = p->kv.n[0], .key = UINT64_MAX - (uint64_t)q};
    for (int g = 0; g < ng; g++) {
      p->gtab[q * ng + g] = p->kv.table[g];
      p->gblk[q * ng + g] = p->kv.n[g];
    }
    if (e->drafter_group > 0) {
      p->dtab[q] = p->kv.table[e->drafter_group];
      p->dblk[q] = p->kv.n[e->drafter_group];
    }
  }
  const int dev = e->device_sampling;
  di_batch bt = {.n_tokens = T, .tokens = p->tok, .positions = p->pos, .seq_of = p->seq_of, .n_seqs = n, .seqs = p->seqs,
                 .n_outputs = T, .output_rows = p->out_rows, .sample_rows = dev ? p->rows : NULL,
                 .n_groups = e->n_kv_groups, .group_tables = p->gtab, .group_blocks = p->gblk, .output_logits = p->want,
                 .drafter_tables = e->drafter_group > 0 ? p->dtab : NULL,
                 .drafter_blocks = e->drafter_group > 0 ? p->dblk : NULL,
                 .propose_row = propose ? p->prow : NULL, .propose_cap = propose ? p->pcap : NULL};
  double t_run[TIMED_RUNS];
  *made = 0;
  for (int r = 0; r < WARM_RUNS + TIMED_RUNS; r++) {
    const double t0 = di_now();
    DI_TRY(be->ops->submit(be, &bt));
    DI_TRY(be->ops->wait(be, dev ? NULL : e->logits, di_spec_hidden(e)));
    const double t1 = di_now();
    if (dev) DI_TRY(be->ops->sample(be, p->rows, T, p->sampled));
    if (propose) DI_TRY(sp->drafter.graph_drafts(sp->drafter.ctx, n, made, sp->ganchor, sp->dtok, sp->dconf));
    if (be->ops->release) /* each run's sequences end with it (a backend keeping per-sequence state drops theirs) */
      for (int q = 0; q < n; q++) be->ops->release(be, UINT64_MAX - (uint64_t)q);
    if (r >= WARM_RUNS) t_run[r - WARM_RUNS] = (t1 - t0) * 1e3;
  }
  qsort(t_run, TIMED_RUNS, sizeof *t_run, cmp_double);
  *ms = t_run[TIMED_RUNS / 2];
  return DI_OK;
}

/* the sizes to measure, ascending: the backend's buckets up to t_max, then powers of two and t_max;
 * *n_buckets of them are buckets */
static int profile_sizes(di_engine *e, int t_max, int *sizes, int *n_buckets) {
  int b[MAX_SIZES], nb = e->be->ops->graph_buckets ? e->be->ops->graph_buckets(e->be, b, MAX_SIZES) : 0, n = 0;
  for (int i = 0; i < nb && n < MAX_SIZES; i++)
    if (b[i] >= 1 && b[i] <= t_max && (n == 0 || b[i] > sizes[n - 1])) sizes[n++] = b[i];
  *n_buckets = n;
  int next = n > 0 ? 2 * sizes[n - 1] : 1;
  for (; next < t_max && n < MAX_SIZES - 1; next *= 2) sizes[n++] = next;
  if (n == 0 || sizes[n - 1] < t_max) sizes[n++] = t_max;
  return n;
}

di_status di_spec_profile_startup(di_engine *e) {
  struct di_spec *sp = e ? e->spec : NULL;
  if (!sp || sp->method != DI_SPEC_DSPARK)
    return di_error_set(DI_ERR_INVALID_ARG, "the startup step-time profile is for DSpark (speculative_config method \"dspark\")");
  if (e->n_all > 0 || e->n_grave > 0 || e->steps > 0 || e->inflight_active)
    return di_error_set(DI_ERR_INVALID_ARG, "the startup step-time profile must run before the first request");
  if (sp->fixed) return DI_OK; /* the fixed schedule reads no profile */
  int t_max = sp->max_seqs * (1 + sp->k);
  if (t_max > sp->max_tok) t_max = sp->max_tok;
  if (t_max > DI_SPEC_PROFILE_MAX) t_max = DI_SPEC_PROFILE_MAX;
  int sizes[MAX_SIZES], n_buckets = 0;
  const int n_sizes = profile_sizes(e, t_max, sizes, &n_buckets);
  const int max_seq_rows = (t_max + sp->max_seqs - 1) / sp->max_seqs;
  prof_scratch p;
  memset(&p, 0, sizeof p);
  const size_t T = (size_t)t_max, S = (size_t)sp->max_seqs, G = (size_t)(e->n_kv_groups > 0 ? e->n_kv_groups : 1);
  p.tok = malloc(T * sizeof *p.tok);
  p.pos = malloc(T * sizeof *p.pos);
  p.seq_of = malloc(T * sizeof *p.seq_of);
  p.out_rows = malloc(T * sizeof *p.out_rows);
  p.want = malloc(T);
  p.rows = malloc(T * sizeof *p.rows);
  p.sampled = malloc(T * sizeof *p.sampled);
  p.prow = malloc(S * sizeof *p.prow);
  p.pcap = malloc(S * sizeof *p.pcap);
  p.dblk = malloc(S * sizeof *p.dblk);
  p.seqs = malloc(S * sizeof *p.seqs);
  p.dtab = malloc(S * sizeof *p.dtab);
  p.gtab = malloc(S * G * sizeof *p.gtab);
  p.gblk = malloc(S * G * sizeof *p.gblk);
  di_status st = p.tok && p.pos && p.seq_of && p.out_rows && p.want && p.rows && p.sampled && p.prow && p.pcap && p.dblk &&
                         p.seqs && p.dtab && p.gtab && p.gblk
                     ? DI_OK
                     : di_error_set(DI_ERR_OOM, "DSpark startup profile: out of memory");
  /* the drafter's proposal reads a block past its anchor: room for the rows and one block */
  if (st == DI_OK && !di_kv_can_allocate(e->kv, &p.kv, max_seq_rows + sp->drafter.block_size))
    st = di_error_set(DI_ERR_OOM, "DSpark startup profile: no KV blocks for a %d-token scratch sequence", max_seq_rows);
  if (st == DI_OK) st = di_kv_allocate(e->kv, &p.kv, max_seq_rows + sp->drafter.block_size);
  double plain[MAX_SIZES] = {0}, prop[MAX_SIZES] = {0};
  int made[MAX_SIZES] = {0};
  for (int i = 0; st == DI_OK && i < n_sizes; i++) {
    int m = 0;
    st = time_step(e, &p, sizes[i], 0, &plain[i], &m);
    if (st == DI_OK && sp->graph_prop) st = time_step(e, &p, sizes[i], 1, &prop[i], &made[i]);
  }
  scratch_free(e, &p);
  if (st != DI_OK) return st;
  /* proposals the backend declined (made 0): the plain time plus the last accepted size's proposal cost */
  double extra = 0;
  for (int i = 0; sp->graph_prop && i < n_sizes; i++) {
    if (made[i]) extra = prop[i] > plain[i] ? prop[i] - plain[i] : 0;
    else prop[i] = plain[i] + extra;
  }
  memset(sp->prof_ms, 0, sizeof sp->prof_ms);
  memset(sp->prof_prop_ms, 0, sizeof sp->prof_prop_ms);
  for (int i = 0; i < n_sizes; i++) {
    const int lo = i < n_buckets ? (i > 0 ? sizes[i - 1] + 1 : 1) : sizes[i]; /* a bucket: every count it pads */
    for (int c = lo; c <= sizes[i]; c++) {
      sp->prof_ms[c] = plain[i];
      if (sp->graph_prop) sp->prof_prop_ms[c] = prop[i];
    }
  }
  sp->profiled_sizes = n_sizes;
  return DI_OK;
}
