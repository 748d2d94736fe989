/* Speculative decoding with the model's MTP layer ("DSpark") inside the engine: the hooks the step
 * loop and the scheduler call when it is on (di_engine_set_speculative). Off: none is called. */
#ifndef DI_SPEC_DECODE_H
#define DI_SPEC_DECODE_H
#include "engine/engine_internal.h"

/* Grants draft tokens of running decode entries already in `s` from *budget, by confidence. */
di_status di_spec_grant(di_engine *e, di_sched *s, int *budget);
/* Hidden-state rows [max_num_batched_tokens][hidden] the backend's wait() fills (every row). */
float *di_spec_hidden(di_engine *e);
/* The same for the step s: NULL also when DSpark's host path feeds none of its rows (a paused step of
 * one-row decoding entries, feed_skip: spec_dspark.c), so the backend copies no features. */
float *di_spec_hidden_for(di_engine *e, const di_sched *s);
/* DSpark device steps: 1 when step `s` (planned, built) verifies no draft and every entry is one
 * decoding row, so it can be sampled as plain decoding samples (on the device, with feedback). */
int di_spec_plain_ok(const di_engine *e, const di_sched *s);
/* `s` is submitted as a plain step: its entries' old drafts are void; sets s->spec_ahead when no
 * proposal is due after it (the confidence schedule's pause, counted here in such steps). */
void di_spec_plain_submitted(di_engine *e, di_sched *s);
/* DSpark proposals inside the step: at submit, whether the device-sampled step s (spec_plain or
 * spec_devverify) carries one (sets its batch's propose_row / propose_cap); 0 leaves the proposal to
 * di_spec_draft after the step, as before. */
int di_spec_graph_propose(di_engine *e, di_sched *s);
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
/* A completed step of n_tokens tokens took `seconds` (DSpark's step-time profile; proposed: the step
 * carried a proposal inside it, di_spec_graph_propose, whose time the profile keeps apart). */
void di_spec_record_step(di_engine *e, int n_tokens, double seconds, int proposed);
/* `s` was handed to the backend's submit, which took `seconds` on the host (DSpark: what a step carrying a
 * proposal costs the host beyond a plain step's, for the confidence schedule's pause). */
void di_spec_submitted(di_engine *e, const di_sched *s, double seconds);
/* DSpark: one di_engine_step call is over; it took `seconds` of wall time (the looks' full cost: see
 * spec_dspark.c, di_spec_call_done). */
void di_spec_call_done(di_engine *e, double seconds);
/* DSpark: a plain step of n_tokens queued behind the step before it (token feedback) gave its tokens
 * `seconds` after that step's: what a plain step costs in the pipeline (the schedule's plain rate). */
void di_spec_record_pipelined(di_engine *e, int n_tokens, double seconds);
struct di_drafter_ops;
/* DSpark: speculative decoding with a block drafter (engine/drafter.h), which the engine then owns
 * (destroyed with the engine; not on failure). exact: acceptance "exact"; fixed: schedule "fixed". */
/* engine.c: adds a KV-manager group for a block drafter's cache (DSpark), before the first request:
 * bytes_per_token of it per position, in blocks of block_tokens positions (a divisor of
 * DI_KV_BLOCK_SIZE), full context, allocated, prefix-cached, truncated, preempted and freed with each
 * request like the target's groups (kv_manager.h). Its pool is sized with the target's groups from one
 * budget (num_kv_blocks given: as many tokens as group 0 holds); *n_blocks gets its block count, for
 * the drafter to allocate. Batches then carry each sequence's table in it (di_batch.drafter_tables). */
di_status di_engine_add_drafter_group(di_engine *e, int64_t bytes_per_token, int block_tokens, int64_t *n_blocks);
di_status di_engine_set_dspark(di_engine *e, const struct di_drafter_ops *d, int num_tokens, int exact, int fixed);
/* spec_profile.c: DSpark's step-time profile measured now (speculative_config "profile": "startup"), per
 * graph bucket of the backend (ops->graph_buckets), by synthetic steps through the backend; after
 * di_engine_set_dspark, before the first request. The schedule starts from it instead of probing, and
 * the engine's own steps refine it online. A fixed schedule needs none (nothing is run). */
di_status di_spec_profile_startup(di_engine *e);
#endif
