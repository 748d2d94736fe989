/* The speculative-decoding state shared by spec_decode.c (MTP drafting, verification, grants) and
 * spec_dspark.c (the DSpark block drafter, its confidence-scheduled grants and calibration). */
#ifndef DI_SPEC_INTERNAL_H
#define DI_SPEC_INTERNAL_H
#include "engine/drafter.h"
#include "engine/spec_decode.h"
#include "sampler/sampler.h"

enum { DI_SPEC_MTP = 0, DI_SPEC_DSPARK = 1 };
#define DI_SPEC_PROFILE_MAX 4096 /* step-time profile: tokens per step tracked exactly up to this */

typedef struct spec_cand {
  float conf;
  int entry, j;
} spec_cand;

struct di_spec {
  int k, method;
  int exact;                     /* acceptance "exact": a draft is accepted iff it equals the sample */
  int fixed;                     /* schedule "fixed": every draft up to k (no step-time model) */
  int device_steps;              /* DSpark: the drafter feeds its context on the device, and steps that
                                    verify no draft take the plain path (di_spec_plain_ok) */
  int async_ok;                  /* the engine's async_scheduling before speculative decoding turned it off */
  di_sample_row *vrows;          /* device steps: a verify step's rows sampled on the device [max_tok] */
  int32_t *vtok;                 /* and their tokens [max_tok] */
  float min_conf;
  int H, V, max_tok, max_seqs;
  float *hidden;                 /* [max_tok][H]: the target's hidden states (DSpark: features), every row */
  /* MTP batch scratch: up to max_tok rows, max_seqs outputs */
  int32_t *tok, *pos, *seq_of, *out_rows, *out_req;
  di_batch_seq *seqs;
  di_req **reqs;
  float *prev, *hid_out, *logits;
  /* verification scratch [max_seqs] */
  int *act, *row0, *vstart, *vbase;
  spec_cand *cands;              /* [max_seqs * k] */
  /* DSpark */
  di_drafter_ops drafter;
  float *feat_rows;              /* [max_tok][feat_dim] the context rows of one step, packed */
  int32_t *atok, *apos;          /* [max_seqs] anchors */
  di_req **areq;
  float *dhid, *dlog;            /* [max_seqs * B][hidden], [max_seqs * B][vocab] */
  uint32_t *gmask;               /* a grammar mask (ceil(vocab / 32) words) while drafting under a grammar */
  uint8_t *dwant;
  int32_t *dcap, *dtok;          /* drafter-made greedy drafts: caps [max_seqs], tokens [max_seqs * B] */
  float *dconf;                  /* and their confidences [max_seqs * B] */                /* [max_seqs * B] rows of a proposal whose logits are read (within the draft cap) */
  int32_t *hist;                 /* history scratch for draft distributions */
  int hist_cap;
  di_sampler *sampler;           /* draft distributions (engine thread) */
  int graph_prop;                /* DSpark: proposals inside the step (drafter graph_on; di_spec_graph_propose) */
  int probe_plain;               /* the next step is a probe of the plain step time: no proposal inside it */
  int32_t *ganchor;              /* [max_seqs][2] anchors of a step's proposal (graph_drafts) */
  int64_t graph_proposals, graph_missed; /* steps that proposed inside, blocks whose anchor the host did not confirm */
  double prof_ms[DI_SPEC_PROFILE_MAX + 1]; /* step time (EMA) by tokens in the step; 0: not seen */
  double prof_prop_ms[DI_SPEC_PROFILE_MAX + 1]; /* the same for steps with a proposal inside them (graph_prop) */
  int64_t steps_seen;
  int profiled_sizes;            /* step sizes measured by the startup profile (spec_profile.c); 0: online only */
  double draft_ms;               /* EMA of one proposal's host time per drafting sequence */
  int pause, pause_len;          /* steps left without proposals (the last schedule admitted none), its length */
  /* the host's cost of looking again (di_spec_submitted): the last proposing step's submit above the plain
   * steps' (plain_submit_ms, an EMA) plus the fetch of its drafts, ms */
  double look_ms, plain_submit_ms;
  int verify_run;                /* schedules in a row that admitted drafts (a plain step is probed again after DI_SPEC_REPROBE) */
  /* what a look really costs (di_spec_call_done): the engine steps (di_engine_step calls) from the one that
   * starts a look (a proposal after a pause, or the first schedule's probe and exploration) to the first
   * that completes a paused step again, their wall time above as many paused steps' (steady_ms: an EMA of
   * the calls that complete a paused step) */
  int look_open, look_calls, step_paused, paused_run; /* step_paused: this call completed a paused step; paused_run: such calls in a row */
  double look_acc, look_cost_ms, steady_ms;
  int64_t looks;                 /* looks whose full cost was measured */
  /* plain steps under token feedback (item 1 of session 15): the time from the previous step's tokens to
   * this one's, for steps queued behind the one before (engine.c feedback_step), an EMA at one size */
  int pipe_size, pipe_count;
  double pipe_ms;
  int feed_skip;                 /* host path: decoding rows not fed to the drafter while paused (DEEPINFER_DSPARK_PAUSE_FEED 0) */
  int64_t rows_unfed;            /* context rows so left out */
  /* stats */
  int64_t verify_steps, drafted, accepted, drafted_at[DI_SPEC_MAX_DRAFT], accepted_at[DI_SPEC_MAX_DRAFT];
  int64_t cal_n[DI_SPEC_CALIB_BINS], cal_acc[DI_SPEC_CALIB_BINS];
  double cal_pred[DI_SPEC_CALIB_BINS];
};

/* Allocates the common state (k drafts, hidden rows of hidden_width floats); async scheduling off. */
di_status di_spec_alloc(di_engine *e, int num_tokens, int hidden_width);
/* How many tokens a request may still draft (drafts past its length limits are useless). */
int di_spec_draft_cap(const struct di_spec *sp, const di_req *r);
/* A drafting failure: the step's running requests end with it (message "<method> drafting failed:
 * ..."), which is returned. */
di_status di_spec_fail(di_engine *e, di_sched *s, di_status st);
/* A draft logits row under the request's grammar state (DSpark and MTP drafting): the tokens it forbids
 * in [0, limit) set to -inf; 0 when nothing is allowed (or the mask cannot be made). */
int di_spec_grammar_mask(di_engine *e, di_req *r, float *lg, int limit);
/* DSpark drafting after a step (di_spec_draft's DSpark branch). */
di_status di_spec_draft_dspark(di_engine *e, di_sched *s);
/* Confidence calibration: a verified draft predicted `conf`, accepted or not. */
void di_spec_calibrate(struct di_spec *sp, float conf, int accepted);
/* DSpark grants: drafts admitted by predicted survival while expected tokens per second improves. */
di_status di_spec_grant_scheduled(di_engine *e, di_sched *s, int *budget, int n_cands);
#endif
