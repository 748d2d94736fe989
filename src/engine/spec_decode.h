/* Speculative decoding with the model's MTP layer ("DSpark") inside the engine: the hooks the step
 * loop and the scheduler call when it is on (di_engine_set_speculative). Off: none is called. */
#ifndef DI_SPEC_DECODE_H
#define DI_SPEC_DECODE_H
#include "engine/engine_internal.h"

/* Grants draft tokens of running decode entries already in `s` from *budget, by confidence. */
di_status di_spec_grant(di_engine *e, di_sched *s, int *budget);
/* Hidden-state rows [max_num_batched_tokens][hidden] the backend's wait() fills (every row). */
float *di_spec_hidden(di_engine *e);
/* DSpark device steps: 1 when step `s` (planned, built) verifies no draft and every entry is one
 * decoding row, so it can be sampled as plain decoding samples (on the device, with feedback). */
int di_spec_plain_ok(const di_engine *e, const di_sched *s);
/* `s` is submitted as a plain step: its entries' old drafts are void; sets s->spec_ahead when no
 * proposal is due after it (the confidence schedule's pause, counted here in such steps). */
void di_spec_plain_submitted(di_engine *e, di_sched *s);
/* DSpark device steps: the row buffer [max_num_batched_tokens] for a verify step sampled on the device
 * (every output row drawn there, its tokens compared with the drafts on the host); NULL when off. */
di_sample_row *di_spec_verify_rows(di_engine *e);
/* Samples and verifies the rows of a completed step (replaces the plain sample_step); a step
 * submitted with spec_devverify takes its tokens from the device instead of the host sampler. */
di_status di_spec_sample_step(di_engine *e, di_sched *s);
/* After detokenisation: drops tokens accepted after a stop string ended the request. */
void di_spec_after_post(di_engine *e, di_sched *s);
/* Runs the MTP layer over the step's accepted tokens and drafts the next tokens. On failure the
 * step's running requests end with the error, which is returned. */
di_status di_spec_draft(di_engine *e, di_sched *s);
void di_spec_free(di_engine *e);
/* A completed step of n_tokens tokens took `seconds` (DSpark's step-time profile). */
void di_spec_record_step(di_engine *e, int n_tokens, double seconds);
struct di_drafter_ops;
/* DSpark: speculative decoding with a block drafter (engine/drafter.h), which the engine then owns
 * (destroyed with the engine; not on failure). exact: acceptance "exact"; fixed: schedule "fixed". */
/* engine.c: shrinks a budget-sized KV pool so that a drafter cache of extra_bytes_per_token beside
 * each of its blocks fits the same budget (before the first request). */
di_status di_engine_kv_share_budget(di_engine *e, int64_t extra_bytes_per_token);
di_status di_engine_set_dspark(di_engine *e, const struct di_drafter_ops *d, int num_tokens, int exact, int fixed);
#endif
