/* Speculative decoding with the model's MTP layer ("DSpark"): after each step the MTP layer runs over
 * every newly accepted token (keeping its own KV entries complete) and drafts up to k tokens with
 * confidences; the scheduler grants verification slots by confidence; verification is lossless.
 *
 * Verification: row j of a sequence's verify run is sampled exactly as plain decoding would sample it
 * (same sampler, same counter-based RNG key (seed, position), same penalties over the tokens accepted
 * so far, pushed one by one); draft j is accepted iff it equals that sample. The output is therefore
 * identical to decoding without drafts, greedy or seeded (a draft only saves a step when it matches).
 *
 * MTP KV: the entry at position i needs token t[i+1] and the main model's final hidden state h[i]. A
 * step that computed rows [start, start + n) of a sequence runs the MTP layer over positions
 * [start, min(n_valid, n_tokens - 1)) (prompt chunks included: the next prompt token is known), so the
 * entries of every position before the last token exist. Draft 1 comes from the row at n_tokens - 2;
 * draft j > 1 from one more MTP row at n_tokens - 3 + j, fed draft j - 1 and the previous MTP row's
 * output hidden state (as vLLM runs one MTP layer for k > 1). Those speculative entries lie at
 * positions >= n_tokens - 1 and are overwritten by the next step's real rows. A stale entry (e.g. the
 * last slot of a prefix-cache block reached through another continuation) only lowers acceptance.
 *
 * Structured outputs (MTP as DSpark, spec_dspark.c): a request with a grammar drafts the argmax under
 * its grammar's mask, the matcher walked over the drafts and rolled back after them; drafting stops where
 * the grammar ends or allows nothing. Verification (exact match) walks the matcher over each accepted
 * token so round j's mask sees rounds < j, and stops at the grammar's end, so the output equals plain
 * constrained decoding's. */
#include "engine/spec_internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void di_spec_free(di_engine *e) {
  struct di_spec *sp = e->spec;
  if (!sp) return;
  free(sp->hidden); free(sp->tok); free(sp->pos); free(sp->seq_of); free(sp->out_rows); free(sp->out_req);
  free(sp->seqs); free(sp->reqs); free(sp->prev); free(sp->hid_out); free(sp->logits);
  free(sp->act); free(sp->row0); free(sp->vstart); free(sp->vbase); free(sp->cands);
  free(sp->vrows); free(sp->vtok);
  free(sp->feat_rows); free(sp->atok); free(sp->apos); free(sp->areq); free(sp->dhid); free(sp->dlog); free(sp->dwant); free(sp->dcap); free(sp->dtok); free(sp->dconf); free(sp->gmask); free(sp->hist); free(sp->ganchor);
  di_sampler_free(sp->sampler);
  if (sp->drafter.destroy) sp->drafter.destroy(sp->drafter.ctx);
  e->opt.async_scheduling = sp->async_ok;
  free(sp);
  e->spec = NULL;
}

di_status di_spec_refuse_data_parallel(const di_engine *e, int num_tokens) {
  if (!e->dp || num_tokens == 0) return DI_OK;
  return di_error_set(DI_ERR_UNSUPPORTED,
                      "speculative decoding (--speculative-config) does not work with --data-parallel-size > 1 yet: "
                      "the drafts would run on rank 0's requests only and the MTP / drafter forward would break the "
                      "other ranks' expert exchange; run without one of them");
}

di_status di_engine_set_speculative(di_engine *e, int num_tokens, float min_confidence) {
  if (!e) return di_error_set(DI_ERR_INVALID_ARG, "di_engine_set_speculative: NULL engine");
  DI_TRY(di_spec_refuse_data_parallel(e, num_tokens));
  if (num_tokens < 0 || num_tokens > DI_SPEC_MAX_DRAFT)
    return di_error_set(DI_ERR_INVALID_ARG, "num_speculative_tokens must be in [0, %d], got %d", DI_SPEC_MAX_DRAFT, num_tokens);
  if (!(min_confidence >= 0.0f && min_confidence <= 1.0f))
    return di_error_set(DI_ERR_INVALID_ARG, "the speculative confidence threshold must be in [0, 1], got %g", (double)min_confidence);
  if (e->n_all > 0 || e->n_grave > 0 || e->steps > 0 || e->inflight_active)
    return di_error_set(DI_ERR_INVALID_ARG, "speculative decoding must be set before the first request");
  if (num_tokens == 0) {
    di_spec_free(e);
    return DI_OK;
  }
  if (!e->be->ops->mtp || e->be->n_mtp_layers < 1)
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "speculative decoding needs the model's MTP layer (num_nextn_predict_layers >= 1) on a backend "
                        "that runs it (the %s backend %s)", e->be->ops->name,
                        e->be->ops->mtp ? "has none for this model" : "does not run MTP layers yet");
  DI_TRY(di_spec_alloc(e, num_tokens, e->be->hidden_size));
  e->spec->min_conf = min_confidence;
  e->spec->exact = 1;
  return DI_OK;
}

di_status di_spec_alloc(di_engine *e, int num_tokens, int hidden_width) {
  di_spec_free(e);
  struct di_spec *sp = calloc(1, sizeof *sp);
  if (!sp) return di_error_set(DI_ERR_OOM, "speculative decoding: out of memory");
  sp->async_ok = e->opt.async_scheduling; /* di_spec_free gives it back */
  sp->k = num_tokens;
  sp->H = hidden_width;
  sp->V = e->cfg.vocab_size;
  sp->max_tok = e->opt.max_num_batched_tokens;
  sp->max_seqs = e->opt.max_num_seqs;
  size_t T = (size_t)sp->max_tok, S = (size_t)sp->max_seqs, H = (size_t)sp->H, V = (size_t)sp->V;
  e->spec = sp;
  /* every row of a step is an output row (its hidden state feeds the drafter), so the logits
   * buffer holds a whole step */
  size_t rows = T > S ? T : S; /* plain decoding (if turned off again) needs max_num_seqs rows */
  float *lg = realloc(e->logits, rows * V * sizeof *lg);
  if (lg) e->logits = lg;
  sp->hidden = malloc(T * H * sizeof *sp->hidden);
  sp->tok = malloc(T * sizeof *sp->tok);
  sp->pos = malloc(T * sizeof *sp->pos);
  sp->seq_of = malloc(T * sizeof *sp->seq_of);
  sp->out_rows = malloc(S * sizeof *sp->out_rows);
  sp->out_req = malloc(S * sizeof *sp->out_req);
  sp->seqs = malloc(S * sizeof *sp->seqs);
  sp->reqs = malloc(S * sizeof *sp->reqs);
  sp->prev = malloc(T * H * sizeof *sp->prev);
  sp->hid_out = malloc(S * H * sizeof *sp->hid_out);
  sp->logits = malloc(S * V * sizeof *sp->logits);
  sp->act = malloc(S * sizeof *sp->act);
  sp->row0 = malloc(S * sizeof *sp->row0);
  sp->vstart = malloc(S * sizeof *sp->vstart);
  sp->vbase = malloc(S * sizeof *sp->vbase);
  sp->cands = malloc(S * (size_t)sp->k * sizeof *sp->cands);
  if (!lg || !sp->hidden || !sp->tok || !sp->pos || !sp->seq_of || !sp->out_rows || !sp->out_req || !sp->seqs ||
      !sp->reqs || !sp->prev || !sp->hid_out || !sp->logits || !sp->act || !sp->row0 || !sp->vstart || !sp->vbase ||
      !sp->cands) {
    di_spec_free(e);
    return di_error_set(DI_ERR_OOM, "speculative decoding: out of memory for %d-token steps", (int)T);
  }
  /* drafts depend on the step just sampled: plan after it (synchronous steps; DSpark's device steps
   * plan ahead where no proposal follows a step, if async_ok) */
  e->opt.async_scheduling = 0;
  return DI_OK;
}

void di_engine_get_spec_stats(const di_engine *e, di_spec_stats *s) {
  memset(s, 0, sizeof *s);
  const struct di_spec *sp = e ? e->spec : NULL;
  if (!sp) return;
  s->num_tokens = sp->k;
  s->verify_steps = sp->verify_steps;
  s->drafted_tokens = sp->drafted;
  s->accepted_tokens = sp->accepted;
  for (int j = 0; j < DI_SPEC_MAX_DRAFT; j++) {
    s->drafted_at[j] = sp->drafted_at[j];
    s->accepted_at[j] = sp->accepted_at[j];
  }
  s->acceptance_rate = sp->drafted > 0 ? (double)sp->accepted / (double)sp->drafted : 0;
  s->method = sp->method;
  double n_all = 0, gap = 0;
  for (int b = 0; b < DI_SPEC_CALIB_BINS; b++) {
    s->calib_count[b] = sp->cal_n[b];
    s->calib_predicted[b] = sp->cal_pred[b];
    s->calib_accepted[b] = sp->cal_acc[b];
    n_all += (double)sp->cal_n[b];
    if (sp->cal_n[b] > 0) gap += fabs((double)sp->cal_acc[b] - sp->cal_pred[b]);
  }
  s->calibration_error = n_all > 0 ? gap / n_all : 0;
  s->proposals_in_step = sp->graph_proposals;
  s->proposals_missed = sp->graph_missed;
  s->mean_accepted_length = sp->verify_steps > 0 ? 1.0 + (double)sp->accepted / (double)sp->verify_steps : 0;
}

float *di_spec_hidden(di_engine *e) { return e->spec->device_steps ? NULL : e->spec->hidden; }

static int cand_cmp(const void *a, const void *b) {
  const spec_cand *x = a, *y = b;
  if (x->conf != y->conf) return x->conf > y->conf ? -1 : 1;
  if (x->entry != y->entry) return x->entry < y->entry ? -1 : 1;
  return (x->j > y->j) - (x->j < y->j);
}

/* Policy: every running request's own token is planned first (the scheduler's running pass); the
 * budget left then goes to draft tokens in decreasing cumulative confidence (the estimated chance
 * that the token and every draft before it are accepted), ties to the earlier running request, then
 * the earlier draft position. Confidences fall along a draft, so each request gets a prefix of its
 * draft: long confident drafts first. A grant is cut further when KV blocks are short (drafts never
 * preempt). Waiting requests are admitted from what is left. */
di_status di_spec_grant(di_engine *e, di_sched *s, int *budget) {
  struct di_spec *sp = e->spec;
  int n = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    di_req *r = en->r;
    r->n_spec = 0;
    if (!en->sample || en->n_new != 1 || en->start != r->n_tokens - 1) continue;
    for (int j = 0; j < r->n_draft && n < sp->max_seqs * sp->k; j++) sp->cands[n++] = (spec_cand){r->draft_conf[j], i, j};
  }
  if (n == 0 || *budget <= 0) return DI_OK;
  if (sp->method == DI_SPEC_DSPARK) {
    DI_TRY(di_spec_grant_scheduled(e, s, budget, n));
  } else {
    qsort(sp->cands, (size_t)n, sizeof *sp->cands, cand_cmp);
    int take = n < *budget ? n : *budget;
    for (int c = 0; c < take; c++) {
      di_req *r = s->e[sp->cands[c].entry].r;
      if (sp->cands[c].j + 1 > r->n_spec) r->n_spec = sp->cands[c].j + 1;
    }
  }
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    di_req *r = en->r;
    int g = r->n_spec;
    if (g == 0) continue;
    while (g > 0 && !di_kv_can_allocate(e->kv, &r->kv, en->start + 1 + g)) g--;
    if (g > 0) DI_TRY(di_kv_allocate(e->kv, &r->kv, en->start + 1 + g));
    r->n_spec = g;
    en->n_new += g;
    r->n_computed += g;
    s->n_tokens += g;
    *budget -= g;
  }
  return DI_OK;
}

/* Sampling and verification of a completed step (every row has logits: row t of the batch is
 * logits row t). Rows of each sequence are sampled in rounds so that round j sees the tokens of
 * rounds < j, exactly as plain decoding would. */
di_status di_spec_sample_step(di_engine *e, di_sched *s) {
  struct di_spec *sp = e->spec;
  int row = 0, n_act = 0;
  if (s->spec_devverify) DI_TRY(e->be->ops->sample(e->be, sp->vrows, s->batch.n_outputs, sp->vtok));
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    di_req *r = en->r;
    int t0 = row;
    row += en->n_new;
    r->inflight = 0;
    r->pending = 0;
    int base = en->n_new - r->n_spec;
    if (r->state == DI_REQ_DONE) {
      di_req_free_kv(e, r);
      r->n_spec = 0;
      continue;
    }
    r->n_valid = en->start + base;
    di_kv_commit(e->kv, &r->kv, r->tokens, r->n_valid < r->n_tokens ? r->n_valid : r->n_tokens);
    if (r->abort_requested) {
      di_req_finish(e, r, DI_FINISH_ABORT, NULL);
      r->n_spec = 0;
      continue;
    }
    if (!en->sample) continue;
    if (r->n_spec > 0) {
      sp->verify_steps++;
      sp->drafted += r->n_spec;
      for (int j = 0; j < r->n_spec; j++) sp->drafted_at[j]++;
    }
    sp->act[n_act] = i;
    sp->row0[n_act] = t0 + base - 1;
    sp->vstart[n_act] = en->start;
    sp->vbase[n_act] = base;
    n_act++;
  }
  for (int j = 0; n_act > 0; j++) {
    for (int a = 0; a < n_act; a++) {
      di_row_job *jb = &e->jobs[a];
      jb->r = s->e[sp->act[a]].r;
      jb->row = sp->row0[a] + j;
      jb->spec = jb->r->draft_sampled; /* drafts drawn from q: min(1, p/q); else exact match */
      jb->draft = j < jb->r->n_spec ? jb->r->draft[j] : -1;
      jb->q = jb->spec && jb->draft >= 0 ? jb->r->draft_q + (size_t)j * sp->V : NULL;
    }
    if (s->spec_devverify) { /* drawn on the device already (greedy or "exact" rows, nothing else) */
      for (int a = 0; a < n_act; a++) {
        di_row_job *jb = &e->jobs[a];
        jb->st = DI_OK;
        jb->spec = 0;
        jb->res = (di_sample_result){.token = sp->vtok[jb->row]};
      }
    } else {
      di_row_sampler_run(e->rows, e, e->jobs, n_act);
    }
    int m = 0;
    for (int a = 0; a < n_act; a++) {
      di_row_job *jb = &e->jobs[a];
      di_req *r = jb->r;
      int more = 0;
      if (jb->st != DI_OK) {
        di_req_finish(e, r, DI_FINISH_ERROR, jb->err);
      } else {
        di_req_push_token(e, r, &jb->res);
        int match = j < r->n_spec && (jb->spec ? jb->accepted : jb->res.token == r->draft[j]);
        if (match) {
          sp->accepted++;
          sp->accepted_at[j]++;
        }
        if (j < r->n_spec && sp->method == DI_SPEC_DSPARK) di_spec_calibrate(sp, r->draft_pconf[j], match);
        more = match && r->state != DI_REQ_DONE;
        /* a grammar's mask for the next round must see this token: accepted now, undone below (the
         * tokens are accepted for good by di_req_post_tokens after the step) */
        if (more && r->constraint) {
          if (e->constraint.rollback && e->constraint.accept(r->constraint, jb->res.token) == DI_OK) r->spec_walked++;
          else more = 0;
          /* the token completed the grammar: plain decoding ends the request with it (di_req_post_tokens),
           * so no row after it is sampled, whatever stops it would otherwise take (ignore_eos: no stop
           * token would; the next round's mask would allow nothing and fail the request) */
          if (more && e->constraint.is_terminated(r->constraint)) more = 0;
        }
      }
      if (more) {
        sp->act[m] = sp->act[a];
        sp->row0[m] = sp->row0[a];
        sp->vstart[m] = sp->vstart[a];
        sp->vbase[m] = sp->vbase[a];
        m++;
        continue;
      }
      /* rows up to this round's are valid; KV of the rejected draft rows is dropped */
      if (r->state != DI_REQ_DONE) {
        r->n_valid = r->n_computed = sp->vstart[a] + sp->vbase[a] + j;
        di_kv_truncate(e->kv, &r->kv, r->n_computed);
        di_kv_commit(e->kv, &r->kv, r->tokens, r->n_valid < r->n_tokens ? r->n_valid : r->n_tokens);
      }
      if (r->spec_walked > 0) {
        di_status st = e->constraint.rollback(r->constraint, r->spec_walked);
        r->spec_walked = 0;
        if (st != DI_OK) di_req_finish(e, r, DI_FINISH_ERROR, di_last_error());
      }
      r->n_spec = 0;
      r->draft_sampled = 0;
    }
    n_act = m;
  }
  return DI_OK;
}

void di_spec_after_post(di_engine *e, di_sched *s) {
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped || !en->sample) continue;
    di_req *r = en->r;
    if (r->state != DI_REQ_DONE || r->finish != DI_FINISH_STOP) continue;
    /* a stop string ended the request at token n_posted: later accepted tokens never happened */
    int drop = (r->n_tokens - r->n_prompt) - r->n_posted;
    if (drop <= 0 || drop > r->n_out) continue;
    r->n_tokens -= drop;
    r->n_out -= drop;
    e->generated_tokens -= drop;
  }
}

/* argmax over [0, limit) and its softmax probability */
static int32_t top1(const float *lg, int limit, float *prob) {
  int best = 0;
  for (int v = 1; v < limit; v++)
    if (lg[v] > lg[best]) best = v;
  double z = 0;
  for (int v = 0; v < limit; v++) z += exp((double)(lg[v] - lg[best]));
  *prob = (float)(1.0 / z);
  return best;
}

/* how many tokens a request may still draft (drafts past its length limits are useless) */
int di_spec_draft_cap(const struct di_spec *sp, const di_req *r) {
  int cap = sp->k;
  int left_out = r->max_tokens - (r->n_tokens - r->n_prompt) - 1;
  int left_len = r->max_len - r->n_tokens - 1;
  if (left_out < cap) cap = left_out;
  if (left_len < cap) cap = left_len;
  return cap;
}

di_status di_spec_fail(di_engine *e, di_sched *s, di_status st) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s drafting failed: %s", e->spec->method == DI_SPEC_DSPARK ? "DSpark" : "MTP", di_last_error());
  for (int i = 0; i < s->n; i++)
    if (!s->e[i].dropped && s->e[i].r->state == DI_REQ_RUNNING) di_req_finish(e, s->e[i].r, DI_FINISH_ERROR, msg);
  di_error_set(st, "%s", msg);
  return st;
}

di_status di_spec_draft(di_engine *e, di_sched *s) {
  struct di_spec *sp = e->spec;
  if (sp->method == DI_SPEC_DSPARK) return di_spec_draft_dspark(e, s);
  const size_t H = (size_t)sp->H, V = (size_t)sp->V;
  int row = 0, m = 0, q = 0, o = 0;
  for (int i = 0; i < s->n; i++) {
    di_sched_entry *en = &s->e[i];
    if (en->dropped) continue;
    di_req *r = en->r;
    int t0 = row;
    row += en->n_new;
    r->n_draft = 0;
    if (r->state != DI_REQ_RUNNING || (r->constraint && !e->constraint.rollback)) continue;
    int hi = r->n_valid < r->n_tokens - 1 ? r->n_valid : r->n_tokens - 1; /* positions [start, hi) */
    if (hi <= en->start) continue;
    for (int p = en->start; p < hi; p++) {
      sp->tok[m] = r->tokens[p + 1];
      sp->pos[m] = p;
      sp->seq_of[m] = q;
      memcpy(sp->prev + (size_t)m * H, sp->hidden + (size_t)(t0 + p - en->start) * H, H * sizeof(float));
      m++;
    }
    sp->seqs[q] = (di_batch_seq){r->kv.table[0], r->kv.n[0], di_req_key(r)};
    sp->reqs[q] = r;
    if (hi == r->n_tokens - 1 && di_spec_draft_cap(sp, r) > 0) {
      sp->out_rows[o] = m - 1;
      sp->out_req[o++] = q;
    }
    q++;
  }
  if (m == 0) return DI_OK;
  di_batch b = {.n_tokens = m, .tokens = sp->tok, .positions = sp->pos, .seq_of = sp->seq_of, .n_seqs = q,
                .seqs = sp->seqs, .n_outputs = o, .output_rows = sp->out_rows};
  di_status st = e->be->ops->mtp(e->be, &b, sp->prev, o ? sp->logits : NULL, o ? sp->hid_out : NULL);
  if (st != DI_OK) return di_spec_fail(e, s, st);
  /* drafts: one more MTP row per still-confident request and draft position. A request with a grammar
   * drafts the argmax under its mask, each draft accepted into its matcher (r->spec_walked) so the next
   * one's mask follows it, all undone below; its drafts stop where the grammar ends or allows nothing */
  int walked_any = 0;
  for (int j = 0; o > 0; j++) {
    int n = 0;
    for (int a = 0; a < o; a++) {
      di_req *r = sp->reqs[sp->out_req[a]];
      float p, *lg = sp->logits + (size_t)a * V;
      if (r->constraint && (e->constraint.is_terminated(r->constraint) || !di_spec_grammar_mask(e, r, lg, e->cfg.vocab_limit)))
        continue;
      int32_t d = top1(lg, e->cfg.vocab_limit, &p);
      float conf = (j == 0 ? 1.0f : r->draft_conf[j - 1]) * p;
      if (conf < sp->min_conf) continue;
      if (r->constraint) {
        if (e->constraint.accept(r->constraint, d) != DI_OK) continue;
        r->spec_walked++;
        walked_any = 1;
      }
      r->draft[j] = d;
      r->draft_conf[j] = conf;
      r->n_draft = j + 1;
      if (j + 1 >= di_spec_draft_cap(sp, r)) continue;
      int pos = r->n_tokens - 1 + j; /* the MTP row fed draft j */
      if (!di_kv_can_allocate(e->kv, &r->kv, pos + 1)) continue;
      st = di_kv_allocate(e->kv, &r->kv, pos + 1);
      if (st != DI_OK) goto done;
      sp->tok[n] = d;
      sp->pos[n] = pos;
      sp->seq_of[n] = n;
      sp->seqs[n] = (di_batch_seq){r->kv.table[0], r->kv.n[0], di_req_key(r)};
      memcpy(sp->prev + (size_t)n * H, sp->hid_out + (size_t)a * H, H * sizeof(float));
      sp->reqs[n] = r;
      sp->out_req[n] = n;
      sp->out_rows[n] = n;
      n++;
    }
    o = n;
    if (o == 0) break;
    di_batch bj = {.n_tokens = n, .tokens = sp->tok, .positions = sp->pos, .seq_of = sp->seq_of, .n_seqs = n,
                   .seqs = sp->seqs, .n_outputs = n, .output_rows = sp->out_rows};
    st = e->be->ops->mtp(e->be, &bj, sp->prev, sp->logits, sp->hid_out);
    if (st != DI_OK) break;
  }
done:
  if (walked_any) /* the grammar walks over the drafts are undone (verification walks its own) */
    for (int i = 0; i < s->n; i++) {
      di_req *r = s->e[i].r;
      if (s->e[i].dropped || r->spec_walked == 0) continue;
      di_status rs = e->constraint.rollback(r->constraint, r->spec_walked);
      r->spec_walked = 0;
      if (rs != DI_OK && st == DI_OK) st = rs;
    }
  if (st != DI_OK) return di_spec_fail(e, s, st);
  return DI_OK;
}
