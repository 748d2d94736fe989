/* DSpark speculative decoding in the engine: the block drafter's context feed and proposals after
 * each step, the Markov and confidence heads applied left to right, draft distributions for
 * speculative sampling, confidence-scheduled verification grants and the calibration counts.
 *
 * After a step: every position the target computed with a valid token ([start, n_valid) of each
 * scheduled sequence, prompt chunks included) becomes a context row of the drafter (its features are
 * the hidden rows wait() wrote). Then each decoding sequence (n_valid == n_tokens - 1: its last token
 * is sampled, not computed) gets one block anchored at that token. Draft j's logits are the block's
 * row j plus the Markov term of draft j - 1 (the anchor for j = 0); its confidence is the head's
 * probability, the survival of draft j the product up to j. Greedy requests (and acceptance "exact")
 * take the argmax; the others draw draft j from q_j, the draft logits processed exactly as the
 * sampler processes the target's (bias, bans, penalties counting the drafts before j, temperature,
 * top-k/p, min-p), kept for the min(1, p/q) test (sample_rows.c).
 *
 * Structured outputs: a request with a grammar drafts the argmax under the grammar's mask, the
 * grammar walked over the draft (each draft accepted into the request's matcher, then all of them
 * rolled back after the proposal), cut at the first position where nothing is allowed or after a stop
 * token; it is verified by exact match against the plain (masked) sample, so its output equals plain
 * constrained decoding's, greedy or seeded.
 *
 * Scheduling (di_spec_grant_scheduled): candidates (request, position) in decreasing survival are
 * admitted while (tokens expected from the step) / (the step's predicted time) grows. The time of a
 * step of n tokens comes from a profile of measured steps (EMA per token count, linear between
 * counts seen, taken from the engine's own steps: a step is first run without drafts to measure it,
 * then with all of them to measure a larger one). The survivals
 * are the ones computed on the host after the previous step: no extra synchronisation.
 *
 * Proposals inside the step (graph_prop: the drafter's graph_on, CUDA): at submit a device-sampled
 * step whose requests all draft greedily carries the next proposal (di_spec_graph_propose); after it
 * the drafts are taken from the step (graph_drafts) where the device's anchor is the host's last
 * token, else proposed eagerly as before. The profile then keeps proposing steps' times apart
 * (prof_prop_ms): drafts are admitted while expected tokens / (a proposing step's time) beats the rate
 * of a plain step without a proposal (prof_ms); the probe of a plain step's time carries none. */
#include "engine/spec_internal.h"
#include "sampler/rng.h"
#include "util/grow.h"
#include "util/json.h"
#include "util/switches.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the sequence as the drafter addresses its cache: its table in the drafter's KV group */
static di_batch_seq drafter_seq(const di_engine *e, const di_req *r) {
  return (di_batch_seq){r->kv.table[e->drafter_group], r->kv.n[e->drafter_group], di_req_key(r)};
}

static int samples_drafts(const struct di_spec *sp, const di_req *r) {
  return !sp->exact && r->sp.temperature > 0 && r->sp.top_k != 1 && !r->constraint;
}

int di_spec_grammar_mask(di_engine *e, di_req *r, float *lg, int limit) {
  struct di_spec *sp = e->spec;
  const int words = (sp->V + 31) / 32;
  if (!sp->gmask) {
    sp->gmask = calloc((size_t)words, sizeof *sp->gmask);
    if (!sp->gmask) return 0;
  }
  memset(sp->gmask, 0, sizeof *sp->gmask * (size_t)words);
  if (e->constraint.fill_mask(r->constraint, sp->gmask) != DI_OK) return 0;
  int any = 0;
  for (int v = 0; v < limit; v++) {
    if (sp->gmask[v >> 5] >> (v & 31) & 1u) any = 1;
    else lg[v] = -INFINITY;
  }
  return any;
}

di_status di_engine_set_dspark(di_engine *e, const di_drafter_ops *d, int num_tokens, int exact, int fixed) {
  if (!e || !d) return di_error_set(DI_ERR_INVALID_ARG, "di_engine_set_dspark: NULL argument");
  DI_TRY(di_spec_refuse_data_parallel(e, num_tokens));
  if (num_tokens < 1 || num_tokens > DI_SPEC_MAX_DRAFT)
    return di_error_set(DI_ERR_INVALID_ARG, "num_speculative_tokens must be in [1, %d], got %d", DI_SPEC_MAX_DRAFT, num_tokens);
  if (e->n_all > 0 || e->n_grave > 0 || e->steps > 0 || e->inflight_active)
    return di_error_set(DI_ERR_INVALID_ARG, "speculative decoding must be set before the first request");
  if (num_tokens > d->block_size) num_tokens = d->block_size;
  DI_TRY(di_spec_alloc(e, num_tokens, d->feat_dim));
  struct di_spec *sp = e->spec;
  sp->method = DI_SPEC_DSPARK;
  sp->exact = exact;
  sp->fixed = fixed;
  sp->drafter = *d;
  const size_t T = (size_t)sp->max_tok, S = (size_t)sp->max_seqs, B = (size_t)d->block_size;
  sp->feat_rows = malloc(T * (size_t)d->feat_dim * sizeof(float));
  sp->atok = malloc(S * sizeof *sp->atok);
  sp->apos = malloc(S * sizeof *sp->apos);
  sp->areq = malloc(S * sizeof *sp->areq);
  sp->dhid = malloc(S * B * (size_t)d->hidden * sizeof(float));
  sp->dlog = malloc(S * B * (size_t)sp->V * sizeof(float));
  sp->dwant = malloc(S * B);
  sp->dcap = malloc(S * sizeof *sp->dcap);
  sp->dtok = malloc(S * B * sizeof *sp->dtok);
  sp->dconf = malloc(S * B * sizeof *sp->dconf);
  di_status st = sp->feat_rows && sp->atok && sp->apos && sp->areq && sp->dhid && sp->dlog && sp->dwant && sp->dcap &&
                 sp->dtok && sp->dconf
                     ? di_sampler_create(sp->V, &sp->sampler)
                     : di_error_set(DI_ERR_OOM, "DSpark: out of memory");
  int64_t n_blocks = 0; /* the drafter's cache: its own KV-manager group, blocks of DI_DRAFTER_BLOCK_TOKENS */
  if (st == DI_OK) st = di_engine_add_drafter_group(e, d->cache_bytes_per_token, DI_DRAFTER_BLOCK_TOKENS, &n_blocks);
  if (st == DI_OK) st = d->kv_alloc(d->ctx, n_blocks);
  if (st == DI_OK && d->context_on_device && di_switch_bool(DI_SW_DSPARK_DEVICE_STEPS, 1)) {
    st = d->context_on_device(d->ctx, sp->max_tok);
    sp->device_steps = st == DI_OK;
  }
  sp->feed_skip = !sp->device_steps && !di_switch_bool(DI_SW_DSPARK_PAUSE_FEED, 0);
  /* proposals inside the device-sampled steps (greedy / exact drafts, no grammar) */
  if (st == DI_OK && sp->device_steps && d->graph_on && d->graph_drafts && di_switch_bool(DI_SW_DSPARK_GRAPH_PROPOSE, 1)) {
    sp->ganchor = malloc(S * 2 * sizeof *sp->ganchor);
    st = sp->ganchor ? d->graph_on(d->ctx, e->cfg.vocab_limit < sp->V ? e->cfg.vocab_limit : sp->V)
                     : di_error_set(DI_ERR_OOM, "DSpark: out of memory");
    sp->graph_prop = st == DI_OK;
  }
  if (st != DI_OK) {
    sp->drafter.destroy = NULL; /* the caller still owns the drafter on failure */
    di_spec_free(e);
  }
  return st;
}

void di_spec_calibrate(struct di_spec *sp, float conf, int accepted) {
  int b = (int)(conf * DI_SPEC_CALIB_BINS);
  if (b < 0) b = 0;
  if (b >= DI_SPEC_CALIB_BINS) b = DI_SPEC_CALIB_BINS - 1;
  sp->cal_n[b]++;
  sp->cal_pred[b] += conf;
  sp->cal_acc[b] += accepted != 0;
}

void di_spec_record_step(di_engine *e, int n_tokens, double seconds, int proposed) {
  struct di_spec *sp = e->spec;
  if (!sp || n_tokens <= 0 || n_tokens > DI_SPEC_PROFILE_MAX) return;
  double ms = seconds * 1e3, *p = proposed ? &sp->prof_prop_ms[n_tokens] : &sp->prof_ms[n_tokens];
  /* a step without a proposal taken down at once by a faster one: the host's noise only ever slows a
   * step, and one slow probe of the plain step made drafts that do not pay look paying (session 15: the
   * H200's batch 64 at 0.19-0.37x of plain decoding in two of four runs) */
  if (!proposed && *p > 0 && ms < *p) *p = ms;
  else *p = *p > 0 ? 0.8 * *p + 0.2 * ms : ms;
  sp->steps_seen++;
}

/* Looking again after a pause costs the host more than the profile's proposing steps show (graph
 * replays, timed from submit to wait): the step that carries the proposal is a new graph key (an eager
 * first sight, then a capture: ~1-3 ms of launches on the shipped model) and, under token feedback, the
 * fetch of its drafts waits for the step queued behind it. On the H200 this made the paused schedule
 * ~0.03 ms a step slower than plain decoding at 16 / 64 over 200 steps (two looks). look_ms keeps the
 * last proposing step's submit time above the plain steps' (an EMA), plus its drafts' fetch
 * (graph_drafts); pause_if_unpaid weighs the next pause against the larger of it and the profile's. */
void di_spec_submitted(di_engine *e, const di_sched *s, double seconds) {
  struct di_spec *sp = e->spec;
  if (!sp || sp->method != DI_SPEC_DSPARK) return;
  const double ms = seconds * 1e3;
  if (s->spec_gprop) {
    sp->look_ms = sp->plain_submit_ms > 0 && ms > sp->plain_submit_ms ? ms - sp->plain_submit_ms : 0;
  } else if (s->spec_plain) {
    sp->plain_submit_ms = sp->plain_submit_ms > 0 ? 0.9 * sp->plain_submit_ms + 0.1 * ms : ms;
  }
}

void di_spec_record_pipelined(di_engine *e, int n_tokens, double seconds) {
  struct di_spec *sp = e->spec;
  if (!sp || sp->method != DI_SPEC_DSPARK || n_tokens <= 0) return;
  const double ms = seconds * 1e3;
  if (n_tokens != sp->pipe_size) sp->pipe_size = n_tokens, sp->pipe_count = 0, sp->pipe_ms = 0;
  sp->pipe_ms = sp->pipe_count ? 0.9 * sp->pipe_ms + 0.1 * ms : ms; /* an EMA, not the minimum: an interval
                                                                      shortened by a late fetch before it is noise too */
  sp->pipe_count++;
}

/* the plain step's time against which drafts must pay: the profile's (a probe: a synchronous step),
 * or what plain steps of that size cost in the pipeline under token feedback when that is less */
static double plain_ms(const struct di_spec *sp, double t0, int n) {
  return sp->pipe_size == n && sp->pipe_count >= 8 && sp->pipe_ms > 0 && (t0 <= 0 || sp->pipe_ms < t0) ? sp->pipe_ms : t0;
}

/* Looks amortised: a look's cost over the paused steps' at most DI_SPEC_LOOK_SHARE; pauses of at most
 * DI_SPEC_PAUSE_MAX steps. */
#define DI_SPEC_LOOK_SHARE 0.01
#define DI_SPEC_PAUSE_MAX 8192
/* DI_SPEC_FEED_TAIL: the last paused steps whose rows the host-path drafter is fed (feed_skip) */
#define DI_SPEC_FEED_TAIL 16

/* the host path leaves a paused step's one-row decoding entries (a generated token's row) unfed
 * (di_spec_draft_dspark) */
static int unfed_now(const struct di_spec *sp) {
  return sp->method == DI_SPEC_DSPARK && sp->feed_skip && !sp->fixed && sp->pause > DI_SPEC_FEED_TAIL;
}

float *di_spec_hidden_for(di_engine *e, const di_sched *s) {
  struct di_spec *sp = e->spec;
  if (sp->device_steps) return NULL;
  if (!unfed_now(sp)) return sp->hidden;
  for (int i = 0; i < s->n; i++) {
    const di_sched_entry *en = &s->e[i];
    if (!en->dropped && (en->n_new != 1 || en->start < en->r->n_prompt)) return sp->hidden; /* prompt rows are fed */
  }
  return NULL;
}

static int pause_floor(double look_ms, double t0) {
  int64_t n = DI_SPEC_PAUSE_MAX; /* look_ms / (share x t0), at most DI_SPEC_PAUSE_MAX (also when not finite) */
  if (!di_double_to_int_in(look_ms / (DI_SPEC_LOOK_SHARE * t0), 0, DI_SPEC_PAUSE_MAX, &n)) n = DI_SPEC_PAUSE_MAX;
  return (int)n;
}

static void open_look(struct di_spec *sp) {
  if (sp->fixed || sp->look_open) return;
  sp->look_open = 1;
  sp->look_calls = 0;
  sp->look_acc = 0;
}

/* The full cost of a look (and of the first schedule's probe and exploration): from the di_engine_step
 * call that starts it to the first call that completes a paused step again, what those calls took above
 * as many paused calls (steady_ms). On CUDA a look is a synchronous step whose proposal is a new graph key
 * (an eager first sight, later a capture), a flush of the feature log, the pipeline drained and filled
 * again: 5-7 ms at batch 64 on the H200 (session 15) against the ~0.3 ms the profile's proposing steps
 * show. The pause running when it is known is lengthened to DI_SPEC_LOOK_SHARE of it. */
void di_spec_call_done(di_engine *e, double seconds) {
  struct di_spec *sp = e->spec;
  if (!sp || sp->method != DI_SPEC_DSPARK || sp->fixed) return;
  const double ms = seconds * 1e3;
  if (!sp->step_paused) {
    sp->paused_run = 0;
    if (sp->look_open) {
      sp->look_acc += ms;
      if (++sp->look_calls > 256) sp->look_open = 0; /* drafts paid: no pause to weigh it against */
    }
    return;
  }
  sp->step_paused = 0;
  /* the first paused call after a look is the look's too (under token feedback: the pipeline filled again) */
  if (sp->look_open && ++sp->paused_run < 2) {
    sp->look_acc += ms;
    sp->look_calls++;
    return;
  }
  /* (noise only slows a call: a faster one takes the reference down at once) */
  sp->steady_ms = sp->steady_ms > 0 && ms >= sp->steady_ms ? 0.95 * sp->steady_ms + 0.05 * ms : ms;
  if (!sp->look_open) return;
  sp->look_open = 0;
  const double cost = sp->look_acc - sp->look_calls * sp->steady_ms;
  if (!(cost > 0)) return;
  sp->look_cost_ms = cost;
  sp->looks++;
  const int len = pause_floor(cost, sp->steady_ms);
  if (sp->pause > 0 && len > sp->pause_len) {
    sp->pause += len - sp->pause_len;
    sp->pause_len = len;
  }
}

/* predicted milliseconds of a step of n tokens from a profile (prof_ms or prof_prop_ms): linear
 * between measured counts, the per-token slope of the two nearest measured counts beyond them; below
 * the smallest count measured, that count's time when flat_below (else -1, as when nothing is) */
static double profile_ms(const double *prof, int n, int flat_below) {
  if (n > DI_SPEC_PROFILE_MAX) n = DI_SPEC_PROFILE_MAX;
  if (prof[n] > 0) return prof[n];
  int lo = n - 1, hi = n + 1;
  while (lo > 0 && !(prof[lo] > 0)) lo--;
  while (hi <= DI_SPEC_PROFILE_MAX && !(prof[hi] > 0)) hi++;
  if (lo > 0 && hi <= DI_SPEC_PROFILE_MAX) return prof[lo] + (prof[hi] - prof[lo]) * (double)(n - lo) / (double)(hi - lo);
  if (lo > 0) { /* beyond the largest count seen: extend by its slope from the one below */
    int lo2 = lo - 1;
    while (lo2 > 0 && !(prof[lo2] > 0)) lo2--;
    double slope = lo2 > 0 ? (prof[lo] - prof[lo2]) / (double)(lo - lo2) : prof[lo] / (double)lo;
    if (slope < 0) slope = 0;
    return prof[lo] + slope * (double)(n - lo);
  }
  if (flat_below && hi <= DI_SPEC_PROFILE_MAX) return prof[hi];
  return -1; /* nothing measured */
}

static double step_ms(const struct di_spec *sp, int n) { return profile_ms(sp->prof_ms, n, 0); }

/* profile_ms at rising counts (the admission's base + 1, base + 2, ...): the same values, the measured
 * counts around each found by one forward walk instead of a scan of the gaps at every count */
typedef struct prof_walk {
  const double *prof;
  int flat_below, cur, lo, lo2, hi; /* lo, lo2: the largest measured counts below cur; hi: the next above */
} prof_walk;

static prof_walk walk_start(const double *prof, int flat_below) { return (prof_walk){prof, flat_below, 1, 0, 0, 0}; }

static double walk_at(prof_walk *w, int n) {
  const double *prof = w->prof;
  if (n > DI_SPEC_PROFILE_MAX) n = DI_SPEC_PROFILE_MAX;
  for (; w->cur < n; w->cur++)
    if (prof[w->cur] > 0) w->lo2 = w->lo, w->lo = w->cur;
  if (w->hi <= n)
    for (w->hi = n + 1; w->hi <= DI_SPEC_PROFILE_MAX && !(prof[w->hi] > 0); w->hi++) {}
  if (prof[n] > 0) return prof[n];
  const int lo = w->lo, hi = w->hi;
  if (lo > 0 && hi <= DI_SPEC_PROFILE_MAX) return prof[lo] + (prof[hi] - prof[lo]) * (double)(n - lo) / (double)(hi - lo);
  if (lo > 0) {
    double slope = w->lo2 > 0 ? (prof[lo] - prof[w->lo2]) / (double)(lo - w->lo2) : prof[lo] / (double)lo;
    if (slope < 0) slope = 0;
    return prof[lo] + slope * (double)(n - lo);
  }
  if (w->flat_below && hi <= DI_SPEC_PROFILE_MAX) return prof[hi];
  return -1;
}

/* The admission: candidates (sorted by survival) taken in order; the prefix with the best expected
 * tokens per millisecond wins if it beats the step without drafts (rate0). Not the first prefix whose
 * next candidate lowers the rate: a cost every admitted draft shares (a proposal inside the step, the
 * drafting sequences' proposals after it) is a jump the first draft alone need not pay. Stops where no
 * later prefix can win: the candidates after c add at most their survival each (at most c's), over a
 * step no shorter (step times rise with tokens). t_extra: added to every step time. */
static int admit(const spec_cand *cands, int take, double expect, double rate0, prof_walk *w, int base, double t_extra) {
  double e_run = expect, best_rate = rate0;
  int best = 0;
  for (int c = 0; c < take; c++) {
    e_run += cands[c].conf;
    const double t = walk_at(w, base + c + 1);
    if (t <= 0) break;
    const double r = e_run / (t + t_extra);
    if (r > best_rate) best_rate = r, best = c + 1;
    if ((e_run + (double)(take - c - 1) * cands[c].conf) / (t + t_extra) <= best_rate) break;
  }
  return best;
}

/* After admitting `best` drafts: when nothing pays (best == 0), stop proposing for a while (the
 * context is still fed on the device; the host path's drafter only the prompt rows and the last
 * DI_SPEC_FEED_TAIL paused steps' rows, feed_skip), then look again; the pause doubles (16 .. 512 steps)
 * while it keeps not paying, and is at least so long that looking again (a proposal, t_draft ms against a
 * t0 ms step; the last look's full cost when known, di_spec_call_done) costs at most DI_SPEC_LOOK_SHARE of
 * the paused steps' time (at most DI_SPEC_PAUSE_MAX steps). A paying step ends the doubling. */
static void pause_if_unpaid(struct di_spec *sp, int best, double t_draft, double t0) {
  if (sp->look_ms > t_draft) t_draft = sp->look_ms; /* what the last look cost the host (di_spec_submitted) */
  if (sp->look_cost_ms > t_draft) t_draft = sp->look_cost_ms; /* and in wall time (di_spec_call_done) */
  if (best > 0) {
    sp->pause_len = 0;
    return;
  }
  int len = sp->pause_len ? (sp->pause_len < 512 ? 2 * sp->pause_len : 512) : 16;
  const int floor_len = pause_floor(t_draft, t0);
  if (len < floor_len) len = floor_len;
  sp->pause_len = len;
  sp->pause = sp->pause_len;
}

enum { DI_SPEC_REPROBE = 32 };

static int cand_cmp(const void *a, const void *b) {
  const spec_cand *x = a, *y = b;
  if (x->conf != y->conf) return x->conf > y->conf ? -1 : 1;
  if (x->entry != y->entry) return x->entry < y->entry ? -1 : 1;
  return (x->j > y->j) - (x->j < y->j);
}

di_status di_spec_grant_scheduled(di_engine *e, di_sched *s, int *budget, int n) {
  struct di_spec *sp = e->spec;
  qsort(sp->cands, (size_t)n, sizeof *sp->cands, cand_cmp);
  int take = n < *budget ? n : *budget;
  if (!sp->fixed && take > 0) {
    /* expected tokens: one per sampled entry, plus each admitted draft's survival */
    double expect = 0;
    for (int i = 0; i < s->n; i++) expect += s->e[i].sample ? 1.0 : 0.0;
    int base = s->n_tokens, best = 0, above = 0;
    double t0 = plain_ms(sp, step_ms(sp, base), base);
    /* proposals inside the step: steps that verify drafts propose too (their times are prof_prop_ms),
     * to be weighed against the plain step without a proposal (prof_ms) */
    const double *prof = sp->graph_prop ? sp->prof_prop_ms : sp->prof_ms;
    for (int m = base + 1; m <= DI_SPEC_PROFILE_MAX && !above; m++) above = prof[m] > 0;
    if (t0 <= 0) {
      take = 0; /* probe: this step measures a step without drafts (and, inside the step, without a proposal) */
      sp->probe_plain = sp->graph_prop;
      open_look(sp); /* the probe and the exploration after it cost as a look does */
    } else if (above && sp->graph_prop) {
      /* the step's cost of proposing: what a proposing step of base tokens costs over a plain one */
      double tp = profile_ms(sp->prof_prop_ms, base, 1);
      double t_draft = tp > t0 ? tp - t0 : 0;
      prof_walk w = walk_start(sp->prof_prop_ms, 1);
      best = admit(sp->cands, take, expect, expect / t0, &w, base, 0);
      take = best;
      pause_if_unpaid(sp, best, t_draft, t0);
    } else if (above) {
      /* the drafts' own cost: the proposals of the drafting sequences (paid for the next step) */
      int drafting = 0;
      for (int i = 0; i < s->n; i++) drafting += s->e[i].r->n_draft > 0;
      double t_draft = sp->draft_ms * drafting;
      prof_walk w = walk_start(sp->prof_ms, 0);
      best = admit(sp->cands, take, expect, expect / t0, &w, base, t_draft);
      take = best;
      pause_if_unpaid(sp, best, t_draft, t0);
    } /* else explore: verify everything, which measures a larger step */
    /* while drafts are verified no plain step is measured: every DI_SPEC_REPROBE schedules in a row one
     * verifies none (a probe, as the first), so a wrong plain time lasts that long at most */
    if (take > 0 && t0 > 0 && ++sp->verify_run >= DI_SPEC_REPROBE) {
      take = 0;
      sp->probe_plain = sp->graph_prop;
      sp->verify_run = 0;
    } else if (take == 0) {
      sp->verify_run = 0;
    }
  }
  for (int c = 0; c < take; c++) {
    di_req *r = s->e[sp->cands[c].entry].r;
    if (sp->cands[c].j + 1 > r->n_spec) r->n_spec = sp->cands[c].j + 1;
  }
  return DI_OK;
}

/* q_j for a request that samples its drafts: the draft logits processed as the sampler processes a
 * target row at that position (history = tokens + drafts before j) */
static di_status draft_dist(di_engine *e, di_req *r, int j, float *lg, float *q) {
  struct di_spec *sp = e->spec;
  int n = r->n_tokens + j;
  if (n > sp->hist_cap) {
    int32_t *h = realloc(sp->hist, (size_t)n * 2 * sizeof *h);
    if (!h) return di_error_set(DI_ERR_OOM, "DSpark: out of memory");
    sp->hist = h;
    sp->hist_cap = n * 2;
  }
  memcpy(sp->hist, r->tokens, sizeof(int32_t) * (size_t)r->n_tokens);
  memcpy(sp->hist + r->n_tokens, r->draft, sizeof(int32_t) * (size_t)j);
  di_sampling spp = r->sp;
  if (n - r->n_prompt >= r->min_tokens) spp.n_ban = 0;
  double lse;
  return di_sampler_probs(sp->sampler, lg, e->cfg.vocab_limit, &spp, sp->hist, r->n_prompt, n, NULL, q, &lse);
}

di_sample_row *di_spec_verify_rows(di_engine *e) {
  struct di_spec *sp = e->spec;
  if (!sp || !sp->device_steps) return NULL;
  if (!sp->vrows) {
    sp->vrows = malloc(sizeof *sp->vrows * (size_t)sp->max_tok);
    sp->vtok = malloc(sizeof *sp->vtok * (size_t)sp->max_tok);
    if (!sp->vrows || !sp->vtok) {
      free(sp->vrows); free(sp->vtok);
      sp->vrows = NULL; sp->vtok = NULL;
    }
  }
  return sp->vrows;
}

int di_spec_plain_ok(const di_engine *e, const di_sched *s) {
  const struct di_spec *sp = e->spec;
  if (!sp || !sp->device_steps || sp->fixed || s->n_plp > 0 || s->batch.n_outputs != s->batch.n_tokens) return 0;
  for (int i = 0; i < s->n; i++) {
    const di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    if (!en->sample || en->n_new != 1 || en->r->n_spec > 0) return 0;
  }
  return 1;
}

void di_spec_plain_submitted(di_engine *e, di_sched *s) {
  struct di_spec *sp = e->spec;
  for (int i = 0; i < s->n; i++) {
    di_req *r = s->e[i].r;
    r->n_draft = 0; /* drafts from before this step: it computes past their anchor without them */
    r->draft_sampled = 0;
  }
  s->spec_ahead = sp->pause > 0 && sp->async_ok;
  if (s->spec_ahead) sp->pause--;
}

int di_spec_graph_propose(di_engine *e, di_sched *s) {
  struct di_spec *sp = e->spec;
  s->batch.propose_row = s->batch.propose_cap = NULL;
  if (!sp || !sp->graph_prop || s->spec_ahead) return 0;
  if (sp->probe_plain) { /* this step measures a plain step: its proposal comes after it */
    sp->probe_plain = 0;
    return 0;
  }
  if (sp->pause > 0 && !sp->fixed) return 0; /* (counted down after the step, di_spec_draft_dspark) */
  const int B = sp->drafter.block_size, n_seqs = s->batch.n_seqs;
  if (n_seqs > sp->max_seqs) return 0;
  if (!di_grow((void **)&s->prow, &s->prop_cap, 2 * n_seqs, sizeof *s->prow, 64)) return 0;
  s->pcap = s->prow + n_seqs;
  int q = 0, t = 0, any = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    di_req *r = en->r;
    const int t0 = t;
    t += en->n_new;
    int row = -1, cap = 0;
    if (en->sample && r->state == DI_REQ_RUNNING && !(r->constraint && !e->constraint.rollback)) {
      if (samples_drafts(sp, r) || r->constraint) return 0; /* drafts made on the host: after the step */
      cap = di_spec_draft_cap(sp, r); /* (n_tokens may be one short here: a bound, cut after the step) */
      if (cap > B) cap = B;
      if (cap > 0) row = t0 + en->n_new - 1 - r->n_spec;
    }
    s->prow[q] = row;
    s->pcap[q] = cap > 0 ? cap : 0;
    any |= row >= 0;
    q++;
  }
  if (!any || q != n_seqs) return 0;
  if (sp->pause_len > 0) open_look(sp); /* a look after a pause */
  s->batch.propose_row = s->prow;
  s->batch.propose_cap = s->pcap;
  return 1;
}

/* the drafts a step proposed inside itself (di_spec_graph_propose) to its requests: a block counts when
 * its anchor (found on the device from the step's samples) is the request's last token at its
 * position, as the host's verification left it; 0 when the step made none (the backend declined) */
static di_status graph_drafts(di_engine *e, di_sched *s, int *made) {
  struct di_spec *sp = e->spec;
  const di_drafter_ops *d = &sp->drafter;
  const int B = d->block_size;
  const double t0 = di_now();
  DI_TRY(d->graph_drafts(d->ctx, s->batch.n_seqs, made, sp->ganchor, sp->dtok, sp->dconf));
  sp->look_ms += (di_now() - t0) * 1e3; /* (under token feedback: the wait for the step queued behind this one) */
  if (!*made) return DI_OK;
  sp->graph_proposals++;
  int q = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    const int k = q++;
    di_req *r = en->r;
    if (s->prow[k] < 0 || r->state != DI_REQ_RUNNING || r->n_valid != r->n_tokens - 1) continue;
    if (sp->ganchor[2 * k] != r->tokens[r->n_tokens - 1] || sp->ganchor[2 * k + 1] != r->n_tokens - 1) {
      sp->graph_missed++;
      continue;
    }
    int cap = di_spec_draft_cap(sp, r);
    if (cap > s->pcap[k]) cap = s->pcap[k];
    float survive = 1.0f;
    for (int j = 0; j < cap && sp->dtok[(size_t)k * B + j] >= 0; j++) {
      survive *= sp->dconf[(size_t)k * B + j];
      r->draft[j] = sp->dtok[(size_t)k * B + j];
      r->draft_pconf[j] = sp->dconf[(size_t)k * B + j];
      r->draft_conf[j] = survive;
      r->n_draft = j + 1;
    }
  }
  return DI_OK;
}

di_status di_spec_draft_dspark(di_engine *e, di_sched *s) {
  struct di_spec *sp = e->spec;
  const di_drafter_ops *d = &sp->drafter;
  const size_t F = (size_t)d->feat_dim, V = (size_t)sp->V, B = (size_t)d->block_size, DH = (size_t)d->hidden;
  int row = 0, m = 0, q = 0;
  /* a paused plain step (device steps: its context fed on the device, its entries' drafts voided at
   * submit by di_spec_plain_submitted): nothing to do, and the step after it may be in flight already */
  if (s->spec_ahead && sp->device_steps) {
    sp->step_paused = 1;
    return DI_OK;
  }
  /* the host path while paused: the decoding rows of the pause's first steps are not fed (feed_skip):
   * the drafter's cache keeps the prompt rows and the last DI_SPEC_FEED_TAIL steps' rows before a look */
  const int unfed = unfed_now(sp); /* (what di_spec_hidden_for saw at the step's wait) */
  /* 1. context rows of every position this step computed with a valid token: the step's hidden rows
   * as they are when they are all of them (a decoding step without rejected drafts), else packed */
  int packed = 0;
  for (int pass = 0; pass < 2; pass++) {
    row = m = q = 0;
    for (int i = 0; i < s->n; i++) {
      di_sched_entry *en = &s->e[i];
      if (en->dropped) continue;
      di_req *r = en->r;
      int t0 = row;
      row += en->n_new;
      r->n_draft = 0;
      r->draft_sampled = 0;
      if (r->state == DI_REQ_DONE || sp->device_steps) continue; /* its blocks are gone; fed on the device */
      int hi = r->n_valid < en->start + en->n_new ? r->n_valid : en->start + en->n_new;
      if (hi <= en->start) continue;
      if (unfed && en->n_new == 1 && en->start >= r->n_prompt) { /* (a generated token's row) */
        if (!pass) sp->rows_unfed++; /* (the rows after it move up: packed) */
        continue;
      }
      for (int p = en->start; p < hi; p++) {
        const int h = t0 + p - en->start;
        if (pass) memcpy(sp->feat_rows + (size_t)m * F, sp->hidden + (size_t)h * F, F * sizeof(float));
        packed |= h != m;
        sp->pos[m] = p;
        sp->seq_of[m] = q;
        m++;
      }
      sp->seqs[q++] = drafter_seq(e, r);
    }
    if (!packed) break;
  }
  di_status st = m > 0 ? d->context(d->ctx, m, packed ? sp->feat_rows : sp->hidden, sp->pos, sp->seq_of, sp->seqs) : DI_OK;
  if (st != DI_OK) return di_spec_fail(e, s, st);
  if (s->spec_ahead) { /* no proposal: the step after this one may be in flight already */
    sp->step_paused = 1;
    return DI_OK;
  }
  if (s->spec_gprop) { /* proposed inside the step already */
    int made = 0;
    st = graph_drafts(e, s, &made);
    if (st != DI_OK) return di_spec_fail(e, s, st);
    if (made) return DI_OK;
  }
  /* 2. one block per decoding sequence */
  int n = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    di_req *r = en->r;
    if (en->dropped || r->state != DI_REQ_RUNNING || (r->constraint && !e->constraint.rollback)) continue;
    if (r->n_valid != r->n_tokens - 1 || di_spec_draft_cap(sp, r) <= 0) continue;
    sp->atok[n] = r->tokens[r->n_tokens - 1];
    sp->apos[n] = r->n_tokens - 1;
    sp->seqs[n] = drafter_seq(e, r);
    sp->areq[n++] = r;
  }
  if (n == 0) return DI_OK;
  if (sp->pause > 0 && !sp->fixed) {
    sp->pause--;
    sp->step_paused = 1;
    return DI_OK;
  }
  if (sp->pause_len > 0) open_look(sp); /* a look after a pause */
  double t_start = di_now();
  /* blocks the drafter drafts itself (greedy, no grammar: draft_greedy) and those drafted here; logits
   * come to the host only for the latter, and only for the rows that can become drafts */
  const int limit = e->cfg.vocab_limit < (int)V ? e->cfg.vocab_limit : (int)V;
  int n_dev = 0;
  for (int i = 0; i < n; i++) {
    di_req *r = sp->areq[i];
    int cap = di_spec_draft_cap(sp, r);
    if (cap > (int)B) cap = (int)B;
    const int on_dev = d->draft_greedy && !samples_drafts(sp, r) && !r->constraint;
    sp->dcap[i] = on_dev ? cap : 0;
    n_dev += on_dev;
    for (int j = 0; j < (int)B; j++) sp->dwant[(size_t)i * B + j] = (uint8_t)(!on_dev && j < cap);
  }
  /* device steps: nothing comes back when the drafter drafts every block itself */
  const int host_rows = n_dev < n || !sp->device_steps;
  st = d->propose(d->ctx, n, sp->atok, sp->apos, sp->seqs, sp->dwant, host_rows ? sp->dhid : NULL,
                  host_rows ? sp->dlog : NULL);
  if (st == DI_OK && n_dev > 0) st = d->draft_greedy(d->ctx, n, sp->atok, sp->dcap, limit, sp->dtok, sp->dconf);
  if (st != DI_OK) return di_spec_fail(e, s, st);
  /* 3. left to right: Markov term, confidence, the draft token */
  for (int i = 0; i < n; i++) {
    di_req *r = sp->areq[i];
    int cap = di_spec_draft_cap(sp, r);
    if (cap > (int)B) cap = (int)B;
    int sampled = samples_drafts(sp, r);
    if (sampled && !r->draft_q) {
      r->draft_q = malloc(sizeof(float) * DI_SPEC_MAX_DRAFT * V);
      if (!r->draft_q) return di_spec_fail(e, s, di_error_set(DI_ERR_OOM, "DSpark: out of memory"));
    }
    int32_t prev = sp->atok[i];
    float survive = 1.0f;
    int walked = 0; /* drafts accepted into the request's grammar matcher (rolled back below) */
    di_status oom = DI_OK; /* draft_dist out of memory: fails the step (after the rollback), unlike
                              "nothing allowed", which only ends the draft */
    if (sp->dcap[i] > 0) { /* drafted by the drafter itself */
      for (int j = 0; j < sp->dcap[i] && sp->dtok[(size_t)i * B + j] >= 0; j++) {
        survive *= sp->dconf[(size_t)i * B + j];
        r->draft[j] = sp->dtok[(size_t)i * B + j];
        r->draft_pconf[j] = sp->dconf[(size_t)i * B + j];
        r->draft_conf[j] = survive;
        r->n_draft = j + 1;
      }
      continue;
    }
    for (int j = 0; j < cap; j++) {
      float *lg = sp->dlog + ((size_t)i * B + j) * V;
      const float *h = sp->dhid + ((size_t)i * B + j) * DH;
      d->markov(d->ctx, prev, lg);
      float c = d->confidence(d->ctx, h, prev);
      if (r->constraint && (e->constraint.is_terminated(r->constraint) || !di_spec_grammar_mask(e, r, lg, limit))) break;
      int32_t tok;
      if (sampled) {
        float *qj = r->draft_q + (size_t)j * V;
        st = draft_dist(e, r, j, lg, qj);
        if (st == DI_ERR_OOM) oom = st;
        if (st != DI_OK) break; /* nothing allowed: draft no further */
        tok = di_sample_from_probs(qj, e->cfg.vocab_limit < (int)V ? e->cfg.vocab_limit : (int)V,
                                   di_rng_uniform(r->sp.seed, r->sp.stream + DI_SPEC_STREAM_DRAFT,
                                                  (uint64_t)(r->n_tokens + j)));
        if (tok < 0) break;
      } else {
        float mx;
        tok = di_row_argmax(lg, e->cfg.vocab_limit < (int)V ? e->cfg.vocab_limit : (int)V, &mx);
        if (tok < 0) break;
      }
      if (r->constraint) {
        if (e->constraint.accept(r->constraint, tok) != DI_OK) break;
        walked++;
      }
      survive *= c;
      r->draft[j] = tok;
      r->draft_pconf[j] = c;
      r->draft_conf[j] = survive;
      r->n_draft = j + 1;
      prev = tok;
    }
    if (walked > 0) {
      char msg[256];
      snprintf(msg, sizeof msg, "%s", di_last_error());
      st = e->constraint.rollback(r->constraint, walked);
      if (st != DI_OK) return di_spec_fail(e, s, st);
      if (oom != DI_OK) di_error_set(oom, "%s", msg);
    }
    /* a draft cut short by a failed allocation would change what a seeded request samples */
    if (oom != DI_OK) return di_spec_fail(e, s, oom);
    r->draft_sampled = sampled && r->n_draft > 0;
  }
  double ms = (di_now() - t_start) * 1e3 / n;
  sp->draft_ms = sp->draft_ms > 0 ? 0.8 * sp->draft_ms + 0.2 * ms : ms;
  return DI_OK;
}
