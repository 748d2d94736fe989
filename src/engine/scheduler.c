/* The scheduler: continuous batching under a token budget and a sequence cap, chunked prefill,
 * prefix-cache lookups at admission, and preemption by recompute when KV blocks run out (the most
 * recently admitted running request gives its blocks back and rejoins the front of the queue; it
 * recomputes its prompt and output later and, sampling being keyed by position, produces the same
 * tokens). Also turns a plan into the backend's di_batch. */
#include "util/grow.h"
#include "engine/engine_internal.h"
#include "engine/spec_decode.h"
#include <stdlib.h>
#include <string.h>

static di_status sched_push(di_sched *s, di_req *r, int start, int n_new, int sample) {
  if (s->n == s->cap) {
    int cap = s->cap ? s->cap * 2 : 64;
    di_sched_entry *e = realloc(s->e, (size_t)cap * sizeof *e);
    if (!e) return di_error_set(DI_ERR_OOM, "scheduler: out of memory");
    s->e = e;
    s->cap = cap;
  }
  s->e[s->n++] = (di_sched_entry){.r = r, .start = start, .n_new = n_new, .sample = sample, .sample_row = -1};
  s->n_tokens += n_new;
  s->n_sample += sample;
  s->n_plp += di_plp_rows(r, start, n_new, NULL);
  return DI_OK;
}

void di_sched_clear(di_sched *s) { s->n = s->n_tokens = s->n_sample = s->n_plp = s->spec_plain = s->spec_ahead = s->spec_devverify = s->spec_gprop = s->fb_queued = 0; }

/* Shortens a chunk of r from `start` so that its prompt-logprob rows fit the step's row budget
 * (the logits buffer); 0: nothing of r fits this step. */
static int plp_fit(const di_engine *e, const di_sched *s, const di_req *r, int start, int n_new) {
  int first;
  int rows = di_plp_rows(r, start, n_new, &first);
  int left = e->plp_row_cap - s->n_plp;
  if (rows <= left) return n_new;
  return first + (left > 0 ? left : 0) - start;
}

/* the entry's sampled row is the whole prompt's last; a score-only request samples none */
static int wants_sample(const di_req *r, int end, int total) { return end == total && !r->score_only; }

void di_sched_free(di_sched *s) {
  free(s->e); free(s->tokens); free(s->positions); free(s->seq_of); free(s->out_rows); free(s->want_logits); free(s->seqs); free(s->tables); free(s->gtab); free(s->gblk); free(s->dtab); free(s->dblk); free(s->replay); free(s->prow); /* (pcap lies in prow) */
  memset(s, 0, sizeof *s);
}

static void remove_at(di_req **q, int *n, int i) {
  memmove(q + i, q + i + 1, (size_t)(*n - i - 1) * sizeof *q);
  (*n)--;
}

void di_engine_remove_running(di_engine *e, di_req *r) {
  for (int i = 0; i < e->n_running; i++)
    if (e->running[i] == r) { remove_at(e->running, &e->n_running, i); return; }
}

void di_engine_remove_waiting(di_engine *e, di_req *r) {
  for (int i = 0; i < e->n_waiting; i++)
    if (e->waiting[i] == r) { remove_at(e->waiting, &e->n_waiting, i); return; }
}

static void preempt(di_engine *e, di_req *v) {
  di_engine_remove_running(e, v);
  di_req_free_kv(e, v); /* recomputed from position 0 later */
  v->n_computed = v->n_valid = 0;
  v->n_draft = 0;
  v->replay = 0;
  v->state = DI_REQ_WAITING;
  memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof *e->waiting);
  e->waiting[0] = v;
  e->n_waiting++;
  e->preemptions++;
  e->preempted_this_step = 1;
}

/* tokens the request will have once the in-flight step's sample lands */
static int total_tokens(const di_req *r, int spec) { return r->n_tokens + (spec ? r->pending : 0); }

static int in_plan(const di_sched *s, const di_req *r) {
  for (int i = 0; i < s->n; i++) if (s->e[i].r == r) return 1;
  return 0;
}

/* Whether a running request is computing the prompt block that would extend fresh request r's
 * prefix-cache hit (r matched `hit` tokens, may match up to lim - 1): then r waits for that block to
 * be written and registered instead of computing the same tokens beside it (requests that share a
 * long system prompt and arrive together compute it once). The running request must have the whole
 * block in its prompt and not yet have it valid; it keeps computing (running requests come first),
 * so the wait ends. */
static int prefix_in_flight(const di_engine *e, const di_req *r, int hit, int lim) {
  if (!e->opt.enable_prefix_caching || !di_kv_shares_prefixes(e->kv)) return 0;
  const int B = DI_KV_BLOCK_SIZE, next_end = (hit / B + 1) * B; /* the block after the hit */
  if (next_end > lim - 1) return 0; /* the match never takes the last token it is given */
  for (int i = 0; i < e->n_running; i++) {
    const di_req *q = e->running[i];
    if (q->abort_requested || q->n_valid >= next_end || q->n_prompt < next_end) continue;
    int k = 0;
    while (k < next_end && q->tokens[k] == r->tokens[k]) k++;
    if (k == next_end) return 1;
  }
  return 0;
}

di_status di_schedule(di_engine *e, di_sched *s, int spec) {
  di_sched_clear(s);
  e->preempted_this_step = 0;
  int budget = e->opt.max_num_batched_tokens;
  int chunked = e->opt.enable_chunked_prefill;

  for (int i = 0; i < e->n_running && budget > 0; i++) {
    di_req *r = e->running[i];
    if (r->abort_requested) continue;
    int total = total_tokens(r, spec);
    if (spec && r->pending) {
      int n_out = total - r->n_prompt;
      if (n_out >= r->max_tokens || total >= r->max_len) continue; /* finishes on length */
    }
    int need = total - r->n_computed;
    if (need <= 0) continue;
    int n_new = need < budget ? need : budget;
    n_new = plp_fit(e, s, r, r->n_computed, n_new);
    if (n_new <= 0) continue;
    /* window groups give back what is behind the window (registered first: cached for prefix hits) */
    di_kv_slide(e->kv, &r->kv, r->tokens, r->n_tokens, r->n_computed);
    if (!di_kv_can_allocate(e->kv, &r->kv, r->n_computed + n_new)) {
      if (spec) {
        /* memory is short: give up the early plan; after step n the plan is made with
         * preemption allowed (never starving the request that cannot grow) */
        for (int k = s->n - 1; k >= 0; k--) {
          di_req *q = s->e[k].r;
          q->n_computed = s->e[k].start;
          di_kv_truncate(e->kv, &q->kv, q->n_computed > q->n_valid ? q->n_computed : q->n_valid);
        }
        di_sched_clear(s);
        return DI_OK;
      }
      /* free memory by preempting the latest admitted requests that are not yet planned */
      while (!di_kv_can_allocate(e->kv, &r->kv, r->n_computed + n_new)) {
        di_req *victim = NULL;
        for (int j = e->n_running - 1; j >= 0; j--)
          if (!in_plan(s, e->running[j])) { victim = e->running[j]; break; }
        if (!victim) break;
        preempt(e, victim);
        if (victim == r) break;
      }
      if (r->state != DI_REQ_RUNNING) { i--; continue; } /* r itself was preempted; list shifted */
      if (!di_kv_can_allocate(e->kv, &r->kv, r->n_computed + n_new)) continue;
      /* the loop removed entries after i only (victims are unplanned, r is at i): i stays valid */
    }
    DI_TRY(di_kv_allocate(e->kv, &r->kv, r->n_computed + n_new));
    DI_TRY(sched_push(s, r, r->n_computed, n_new, wants_sample(r, r->n_computed + n_new, total)));
    r->n_computed += n_new;
    budget -= n_new;
  }

  /* speculative decoding: draft tokens to verify, by confidence, before admissions */
  if (e->spec) DI_TRY(di_spec_grant(e, s, &budget));

  /* admit waiting requests (FCFS) unless this step had to preempt; one whose next prompt block another
   * running request is still computing waits for it (see prefix_in_flight) and lets later ones pass.
   * Fairness: the samples of one request (n > 1) hold at most share_cap of the max_num_seqs slots, so
   * the rest stay open to other requests (n = 1024 beside short chats: the chats are admitted at once);
   * its further samples wait and let later requests pass */
  const int share_cap = e->opt.max_num_seqs - e->opt.max_num_seqs / 4 > 0 ? e->opt.max_num_seqs - e->opt.max_num_seqs / 4 : 1;
  uint64_t capped_id = UINT64_MAX;
  for (int i = 0; i < e->n_waiting && budget > 0 && !e->preempted_this_step; i++) {
    if (e->n_running >= e->opt.max_num_seqs) break;
    di_req *r = e->waiting[i];
    if (r->abort_requested) continue;
    if (r->n_samples > share_cap) {
      if (r->id == capped_id) continue;
      int same = 0;
      for (int k = 0; k < e->n_running; k++) same += e->running[k]->id == r->id;
      if (same >= share_cap) {
        capped_id = r->id;
        continue;
      }
    }
    /* samples 1..n-1 wait until sample 0 has written the prompt's blocks, then share them */
    di_req *lead = r->leader;
    if (lead && lead->state != DI_REQ_DONE && lead->n_valid < lead->n_prompt && di_kv_shares_prefixes(e->kv)) continue;
    int fresh = r->n_computed == 0;
    int hit = 0;
    /* prompt logprobs need their rows computed: a prefix-cache hit may cover the prompt only up to
     * the first row still wanted (the match never takes the last token it is given) */
    if (fresh) {
      int first = 0;
      const int lim = di_plp_rows(r, 0, r->n_tokens, &first) > 0 ? first + 1 : r->n_tokens;
      r->replay = 0; /* (a hit undone below must not leave one behind) */
      hit = di_kv_match_prefix(e->kv, &r->kv, r->tokens, lim, r->sample_index > 0);
      r->n_computed = r->n_valid = hit;
      if (!lead && prefix_in_flight(e, r, hit, lim)) {
        di_req_free_kv(e, r);
        r->n_computed = r->n_valid = 0;
        e->prefix_waits++;
        continue;
      }
      if (hit > 0 && e->replay_len > 0) { /* bounded replay: the window before the hit is recomputed */
        r->replay = e->replay_len;
        hit -= r->replay;
        r->n_computed = r->n_valid = hit;
      }
    }
    int need = r->n_tokens - r->n_computed;
    int n_new = need < budget ? need : budget;
    n_new = plp_fit(e, s, r, r->n_computed, n_new);
    if (n_new <= 0) break; /* the step's prompt-logprob rows are taken; FCFS: wait for the next */
    int whole_needed = !chunked && !r->admitted; /* a preempted request may recompute in chunks */
    if ((whole_needed && n_new < need) || !di_kv_can_allocate(e->kv, &r->kv, r->n_computed + n_new)) {
      if (fresh) {
        di_req_free_kv(e, r);
        r->n_computed = r->n_valid = 0;
      }
      break;
    }
    di_status st = di_kv_allocate(e->kv, &r->kv, r->n_computed + n_new);
    if (st != DI_OK) { /* out of memory for the block table: the request waits as it was */
      if (fresh) {
        di_req_free_kv(e, r);
        r->n_computed = r->n_valid = 0;
      }
      return st;
    }
    if (!r->admitted) {
      r->admitted = 1;
      r->n_cached = hit;
      e->prompt_tokens += r->n_prompt;
    }
    remove_at(e->waiting, &e->n_waiting, i);
    i--;
    r->state = DI_REQ_RUNNING;
    e->running[e->n_running++] = r;
    DI_TRY(sched_push(s, r, r->n_computed, n_new, wants_sample(r, r->n_computed + n_new, r->n_tokens)));
    s->e[s->n - 1].replay = r->replay; /* told once, on the step that resumes it (a rebuilt batch keeps it) */
    r->replay = 0;
    r->n_computed += n_new;
    budget -= n_new;
  }
  return DI_OK;
}

/* di_grow with the batch builder's error message. */
static di_status grow(void **p, int *cap, int need, size_t elem) {
  return di_grow(p, cap, need, elem, 64) ? DI_OK : di_error_set(DI_ERR_OOM, "batch: out of memory");
}

di_status di_sched_build_batch(di_engine *e, di_sched *s) {
  int n_tok = 0, n_seq = 0, n_tab = 0, ng = e->n_kv_groups > 0 ? e->n_kv_groups : 1;
  for (int i = 0; i < s->n; i++)
    if (!s->e[i].dropped) {
      n_tok += s->e[i].n_new;
      n_seq++;
      for (int g = 0; g < ng; g++) n_tab += s->e[i].r->kv.n[g];
      if (e->drafter_group > 0) n_tab += s->e[i].r->kv.n[e->drafter_group];
    }
  int tb = s->table_cap;
  DI_TRY(grow((void **)&s->tables, &tb, n_tab, sizeof *s->tables));
  s->table_cap = tb;
  int tc = s->tok_cap, sc = s->seq_cap;
  DI_TRY(grow((void **)&s->tokens, &tc, n_tok, sizeof *s->tokens));
  tc = s->tok_cap;
  DI_TRY(grow((void **)&s->positions, &tc, n_tok, sizeof *s->positions));
  tc = s->tok_cap;
  DI_TRY(grow((void **)&s->seq_of, &tc, n_tok, sizeof *s->seq_of));
  tc = s->tok_cap;
  DI_TRY(grow((void **)&s->out_rows, &tc, n_tok, sizeof *s->out_rows));
  tc = s->tok_cap;
  DI_TRY(grow((void **)&s->want_logits, &tc, n_tok, sizeof *s->want_logits));
  s->tok_cap = tc;
  DI_TRY(grow((void **)&s->seqs, &sc, n_seq, sizeof *s->seqs));
  s->seq_cap = sc;
  int rc = s->replay_cap;
  DI_TRY(grow((void **)&s->replay, &rc, n_seq, sizeof *s->replay));
  s->replay_cap = rc;
  int gc = s->gtab_cap;
  DI_TRY(grow((void **)&s->gtab, &gc, n_seq * ng, sizeof *s->gtab));
  gc = s->gtab_cap;
  DI_TRY(grow((void **)&s->gblk, &gc, n_seq * ng, sizeof *s->gblk));
  s->gtab_cap = gc;
  if (e->drafter_group > 0) {
    int dc = s->dtab_cap;
    DI_TRY(grow((void **)&s->dtab, &dc, n_seq, sizeof *s->dtab));
    dc = s->dtab_cap;
    DI_TRY(grow((void **)&s->dblk, &dc, n_seq, sizeof *s->dblk));
    s->dtab_cap = dc;
  }
  int t = 0, q = 0, o = 0, tab = 0, n_plp = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    di_req *r = en->r;
    for (int g = 0; g < ng; g++) { /* copies: the tables may grow (realloc) while the step runs */
      int nb = r->kv.n[g];
      if (nb) memcpy(s->tables + tab, r->kv.table[g], (size_t)nb * sizeof *s->tables);
      s->gtab[q * ng + g] = s->tables + tab;
      s->gblk[q * ng + g] = nb;
      tab += nb;
    }
    if (e->drafter_group > 0) { /* the drafter's table (DSpark's own group) */
      int nb = r->kv.n[e->drafter_group];
      if (nb) memcpy(s->tables + tab, r->kv.table[e->drafter_group], (size_t)nb * sizeof *s->tables);
      s->dtab[q] = s->tables + tab;
      s->dblk[q] = nb;
      tab += nb;
    }
    s->seqs[q] = (di_batch_seq){.block_table = s->gtab[q * ng], .n_blocks = s->gblk[q * ng], .key = di_req_key(r)};
    s->replay[q] = en->replay;
    int t0 = t;
    for (int k = 0; k < en->n_new; k++) {
      int pos = en->start + k;
      s->tokens[t] = pos < r->n_tokens ? r->tokens[pos] : -1; /* -1: sampled by the in-flight step */
      if (pos >= r->n_tokens && r->n_spec > 0) s->tokens[t] = r->draft[pos - r->n_tokens]; /* verified draft */
      if (e->spec) s->out_rows[o++] = t; /* every row: its hidden state feeds the MTP layer */
      s->positions[t] = pos;
      s->seq_of[t] = q;
      t++;
    }
    int first;
    en->plp_n = di_plp_rows(r, en->start, en->n_new, &first);
    en->plp_pos0 = first;
    if (e->spec) { /* every row is an output row: row index = token index */
      en->plp_row0 = t0 + (first - en->start);
      en->sample_row = en->sample ? t - 1 : -1;
      /* logits only for the rows verification samples (the last 1 + n_spec) and prompt logprobs */
      for (int k = 0; k < en->n_new; k++)
        s->want_logits[t0 + k] = (uint8_t)((en->sample && k >= en->n_new - 1 - r->n_spec) ||
                                           (k >= first - en->start && k < first - en->start + en->plp_n));
    } else {
      en->plp_row0 = o;
      for (int k = 0; k < en->plp_n; k++) s->out_rows[o++] = t0 + (first - en->start) + k;
      en->sample_row = en->sample ? o : -1;
      if (en->sample) s->out_rows[o++] = t - 1;
    }
    n_plp += en->plp_n;
    q++;
  }
  s->batch = (di_batch){.n_tokens = t, .tokens = s->tokens, .positions = s->positions, .seq_of = s->seq_of,
                        .n_seqs = q, .seqs = s->seqs, .n_outputs = o, .output_rows = s->out_rows,
                        .n_groups = e->n_kv_groups, .group_tables = s->gtab, .group_blocks = s->gblk,
                        .seq_replay = e->replay_len > 0 ? s->replay : NULL,
                        .output_logits = e->spec ? s->want_logits : NULL,
                        .drafter_tables = e->drafter_group > 0 ? s->dtab : NULL,
                        .drafter_blocks = e->drafter_group > 0 ? s->dblk : NULL};
  s->n_plp = n_plp;
  return DI_OK;
}

void di_sched_patch_tokens(di_sched *s) {
  int t = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    for (int k = 0; k < en->n_new; k++, t++)
      if (s->tokens[t] < 0) s->tokens[t] = en->r->tokens[en->start + k];
  }
}
