/* The engine's internal structures: requests, the scheduler's plan for one step, and the engine
 * core, which runs over any backend (the real model's, or a mock in tests) with optional text and
 * structured-output adapters. The public di_engine_* functions live in engine.c; di_engine_create
 * (which needs a loaded model) lives in src/api/engine.c and calls di_engine_core_create. */
#ifndef DI_ENGINE_INTERNAL_H
#define DI_ENGINE_INTERNAL_H
#include "deepinfer.h"
#include "backend/backend.h"
#include "kv/kv_manager.h"
#include "sampler/sampler.h"
#include "sampler/stop_strings.h"

/* Text: prompt encoding and streaming detokenisation (the tokenizer, or a mock in tests). */
typedef struct di_text_ops {
  void *ctx;
  /* raw: no special tokens added (the text is a rendered chat template) */
  di_status (*encode_prompt)(void *ctx, const char *text, int raw, int32_t **ids, size_t *n);
  di_status (*stream_create)(void *ctx, int skip_special_tokens, void **stream);
  di_status (*stream_push)(void *stream, int32_t id, const char **text, size_t *len);
  di_status (*stream_flush)(void *stream, const char **text, size_t *len);
  void (*stream_free)(void *stream);
} di_text_ops;

/* Structured outputs: a per-request token-mask state (the grammar engine, via an adapter). */
typedef struct di_constraint_ops {
  void *ctx;
  /* Compiles what `p` asks for (json_schema / regex / grammar / json_object) into a state. */
  di_status (*create)(void *ctx, const di_request_params *p, void **state);
  di_status (*fill_mask)(void *state, uint32_t *mask); /* ceil(vocab/32) words, zeroed by the caller */
  di_status (*accept)(void *state, int32_t id);
  int (*is_terminated)(void *state);
  void (*free)(void *state);
  /* Undoes the last n accepted tokens (speculative drafting walks the grammar over a draft, then
   * goes back); NULL: constrained requests do not draft. */
  di_status (*rollback)(void *state, int n);
} di_constraint_ops;

typedef struct di_engine_core_config {
  di_backend *backend;
  int vocab_size;          /* logits row width */
  int vocab_limit;         /* ids >= this are padding: never sampled */
  int max_context;         /* the model's context */
  const int32_t *eos_ids;
  int n_eos;
  const di_text_ops *text;             /* NULL: no tokenizer (text prompts and stop strings fail) */
  const di_constraint_ops *constraint; /* NULL: structured outputs unavailable (requests fail) */
  const char *constraint_missing;      /* message for that case */
  void (*on_free)(void *ctx);          /* called by di_engine_free with on_free_ctx */
  void *on_free_ctx;
} di_engine_core_config;

di_status di_engine_core_create(const di_engine_core_config *cfg, const di_engine_options *opt, di_engine **out);

/* sample_rows.c: host sampling of a step's rows, in parallel over rows when worth it */
typedef struct di_row_job {
  struct di_req *r;
  int row;                   /* logits row */
  /* speculative sampling (spec != 0): accept `draft` (drawn from q) with min(1, p/q), else draw from
   * the normalised residual max(0, p - q); draft < 0 (the row after the last draft): draw from p.
   * `accepted` says which happened. */
  int spec;
  int32_t draft;
  const float *q;
  int accepted;
  di_sample_result res;
  di_status st;
  char err[256];
} di_row_job;
typedef struct di_row_sampler di_row_sampler;
/* threads <= 0: $DEEPINFER_SAMPLER_THREADS, else half the cores, at most 8 */
di_status di_row_sampler_create(int vocab, int threads, di_row_sampler **out);
void di_row_sampler_free(di_row_sampler *rs);
void di_row_sampler_run(di_row_sampler *rs, di_engine *e, di_row_job *jobs, int n);
/* Work (rows x vocab) from which the threads are used (tests set 0 to force them). */
void di_row_sampler_set_min_work(di_row_sampler *rs, int64_t rows_x_vocab);

#define DI_SPEC_MAX_DRAFT 5
/* RNG streams (added to the sample index) of speculative sampling's draws: the draft token, the
 * acceptance test, the residual; plain sampling uses the sample index itself */
#define DI_SPEC_STREAM_DRAFT ((uint64_t)1 << 40)
#define DI_SPEC_STREAM_ACCEPT ((uint64_t)2 << 40)
#define DI_SPEC_STREAM_RESIDUAL ((uint64_t)3 << 40)

typedef enum { DI_REQ_WAITING, DI_REQ_RUNNING, DI_REQ_DONE } di_req_state;

typedef struct di_req {
  uint64_t id;
  int sample_index, n_samples;
  struct di_req *leader;     /* sample 0 of the same request (NULL for sample 0) */
  di_req_state state;
  int32_t *tokens;           /* prompt then output */
  int n_tokens, cap, n_prompt;
  int n_computed;            /* tokens whose KV is written or scheduled to be */
  int n_valid;               /* tokens whose KV is written (completed steps) */
  int pending;               /* 1 while an in-flight step samples its next token */
  int inflight;              /* 1 while it is part of the in-flight step */
  int n_cached;              /* prompt tokens found in the prefix cache (first admission) */
  int replay;                /* SWA bounded replay: positions its first step recomputes before its hit */
  int n_posted;              /* output tokens already detokenised / given to the grammar */
  int admitted;
  di_kv_seq kv;
  /* sampling and stopping */
  di_sampling sp;
  int32_t *bias_ids;
  float *bias_values;
  int max_tokens, min_tokens, max_len;
  int32_t *stop_ids;         /* EOS (unless ignore_eos) + stop_token_ids */
  int n_stop_ids;
  di_stop_set stops;
  int include_stop_str;
  void *detok;
  char *text;                /* generated text so far (after stop-string truncation) */
  size_t text_len, text_cap, text_checked, text_emitted;
  void *constraint;
  /* finishing */
  di_finish_reason finish;
  char *error;
  int32_t stop_token;
  int abort_requested;
  int reported;              /* final output handed out */
  /* this step's output */
  int in_output;             /* has something to report */
  int collected;             /* reported by the last step: its buffers are reset by the next */
  int n_out, out_cap;
  int32_t *out_tokens;
  float *out_lp;
  di_token_logprob *out_top;
  size_t out_text_from;      /* text emitted this step: text[out_text_from .. text_emitted) */
  char *out_text;            /* NUL-terminated copy for the API */
  /* timing */
  double t_arrival, t_first, t_last;
  /* speculative decoding (spec_decode.c): drafts for positions n_tokens.. with cumulative
   * confidences; n_spec of them are verified by the step in flight */
  int32_t draft[DI_SPEC_MAX_DRAFT];
  float draft_conf[DI_SPEC_MAX_DRAFT];
  int n_draft, n_spec;
  float draft_pconf[DI_SPEC_MAX_DRAFT]; /* DSpark: the confidence head's per-position probability */
  float *draft_q;            /* DSpark with rejection sampling: [DI_SPEC_MAX_DRAFT][vocab] draft distributions */
  int draft_sampled;         /* the drafts were drawn from draft_q (verify by min(1, p/q)) */
  int spec_walked;           /* verification: tokens of this step accepted into the grammar ahead of
                                di_req_post_tokens (rolled back before it), so round j's mask sees them */
  /* prompt logprobs (prompt_logprobs.c): k < 0 off; rows of positions [0, n_prompt - 1) are
   * extracted up to plp_next (each predicts the token after it) into plp / plp_top [n_prompt] */
  int plp_k;
  int plp_from; /* the first prompt index reported (di_request_params.prompt_logprobs_from) */
  int plp_next;
  int plp_sent;              /* delivered with the first output */
  /* device token feedback (engine.c, feedback_step): the output row of this request's sample in the
   * step whose sampling is queued (-1: none), and whether it is also in the step queued after it */
  int fb_row, in_next;
  int score_only;            /* max_tokens 0 with prompt logprobs: no sample row, ends after the prompt */
  float *plp;
  di_token_logprob *plp_top;
  int32_t *plp_rank;
} di_req;

/* One scheduled piece of work: tokens [start, start + n_new) of r; sample = logits wanted. */
typedef struct di_sched_entry {
  di_req *r;
  int start, n_new, sample;
  int dropped;
  int replay;                /* SWA bounded replay: the entry resumes a hit, replaying this many positions */
  /* set by di_sched_build_batch: logits rows of this entry */
  int sample_row;            /* output row of the sampled position (-1: none) */
  int plp_pos0, plp_n, plp_row0; /* prompt-logprob rows: positions plp_pos0.. at rows plp_row0.. */
} di_sched_entry;

typedef struct di_sched {
  di_sched_entry *e;
  int n, cap, n_tokens, n_sample;
  int n_plp;                 /* prompt-logprob rows (planned, then as built) */
  /* the batch built from it */
  int32_t *tokens, *positions, *seq_of, *out_rows;
  uint8_t *want_logits;      /* speculative decoding: per output row, whether its logits are read */
  di_batch_seq *seqs;
  int32_t *tables;           /* copies of the block tables: the engine may grow (realloc) a request's
                                table while this batch is in flight */
  const int32_t **gtab;      /* per sequence and group: its table in `tables` (di_batch.group_tables) */
  int *gblk;                 /* and its length */
  const int32_t **dtab;      /* per sequence: its table in the drafter's group (di_batch.drafter_tables) */
  int *dblk;                 /* and its length */
  int32_t *replay;           /* per sequence: di_batch.seq_replay */
  int tok_cap, seq_cap, table_cap, gtab_cap, replay_cap, dtab_cap;
  di_batch batch;
  /* speculative decoding (DSpark, device steps): the step verifies no draft and is sampled like plain
   * decoding (spec_plain); and no proposal follows it, so the step after it may be planned while it runs
   * (spec_ahead). Set at submit. */
  int spec_plain, spec_ahead;
  /* queued behind the step before it on the device (device token feedback, engine.c feedback_step) */
  int fb_queued;
  int spec_devverify; /* a verify step whose every row is sampled on the device (di_spec_verify_rows) */
  /* DSpark proposals inside the step (di_spec_graph_propose; di_batch.propose_row / propose_cap, per
   * sequence of the batch): spec_gprop, the step carries them */
  int spec_gprop;
  int32_t *prow, *pcap;
  int prop_cap;
} di_sched;

struct di_engine {
  di_engine_core_config cfg;
  di_text_ops text;
  di_constraint_ops constraint;
  di_engine_options opt;
  di_backend *be;
  di_kv_manager *kv;
  char kv_summary[384];      /* how the KV cache was sized (di_engine_kv_summary) */
  int n_kv_groups;      /* groups whose tables each batch carries (0: group 0's only, as block_table) */
  int drafter_group;    /* the DSpark drafter's KV group (di_engine_add_drafter_group), 0: none (group 0 is
                           always the target's); batches carry its tables as drafter_tables */
  int replay_len;       /* SWA bounded replay: tokens a prefix hit recomputes (window - 1), 0: exact */
  di_row_sampler *rows;      /* host sampling of a step's rows */
  di_row_job *jobs;          /* [max_num_seqs] */
  float *logits;             /* [max_num_seqs][vocab] */
  di_sample_row *dev_rows;   /* [max_num_seqs] rows for a backend that samples on the device */
  di_sample_row *step_rows;  /* [max_num_seqs] the same, planned at submit (di_batch.sample_rows) */
  int32_t *dev_tokens;
  int device_sampling;       /* the backend samples and DEEPINFER_HOST_SAMPLING is unset */
  int feedback;              /* ... and can keep the tokens on the device (sample_async / sample_fetch), with
                                async scheduling on and DEEPINFER_NO_FEEDBACK unset */
  int64_t feedback_steps;    /* steps queued before the host had their input tokens */
  uint64_t next_id, seed_state;
  /* requests: every live one in `all`; queues hold pointers */
  di_req **all;
  int n_all, cap_all;
  di_req **running, **waiting;
  int n_running, n_waiting, cap_queue;
  di_req **graveyard;        /* finished and reported: freed at the next step */
  int n_grave, cap_grave;
  /* steps */
  di_sched sched[2];
  int cur;                   /* sched[cur] is in flight when inflight_active */
  int inflight_active;
  double t_submit;           /* when the in-flight step was submitted */
  double t_done;             /* when the last step's tokens were on the host (DSpark: pipelined plain steps' time) */
  double t_submit0;          /* when its submit began (DSpark's step times count the submit: an eager step's launches) */
  int preempted_this_step;
  /* outputs */
  di_seq_output *outs;
  int n_outs, cap_outs;
  di_step_output step_out;
  struct di_spec *spec;      /* speculative decoding state; NULL when off (the default) */
  struct di_dp_front *dp;    /* data parallel, rank 0: the other ranks' requests (dist/dp_engine.h) */
  int plp_row_cap;           /* prompt-logprob rows per step (0 until a request asks for them) */
  /* stats */
  int64_t steps, prompt_tokens, generated_tokens, preemptions, prefix_waits;
  double busy_s, host_s, hidden_s, wait_s;
};

/* This rank's own engine, under the data-parallel front end (the public ones go through it). */
di_status di_engine_step_local(di_engine *e, di_step_output **out);
int di_engine_has_unfinished_local(const di_engine *e);
/* This rank's engine statistics alone (di_engine_get_stats adds the other data-parallel ranks'). */
void di_engine_get_stats_local(const di_engine *e, di_engine_stats *s);
/* DI_ERR_UNSUPPORTED with the reason when an engine with data-parallel ranks is asked to speculate
 * (num_tokens > 0); DI_OK otherwise. */
di_status di_spec_refuse_data_parallel(const di_engine *e, int num_tokens);

/* request.c */
di_status di_req_create(di_engine *e, const di_request_params *p, const int32_t *prompt, int n_prompt,
                        int sample_index, uint64_t id, uint64_t seed, di_req **out);
void di_req_free(di_engine *e, di_req *r);
/* The sequence's identity in the backend's batch (di_batch_seq.key): request id and sample index. */
uint64_t di_req_key(const di_req *r);
/* Gives back the sample's KV blocks and tells the backend to drop its per-sequence state (if it
 * keeps any). Not while a step that contains the sample is in flight. */
void di_req_free_kv(di_engine *e, di_req *r);
/* Ends a request (frees its KV blocks; it leaves the queues); reported at the next collection. */
void di_req_finish(di_engine *e, di_req *r, di_finish_reason why, const char *error);
/* Appends a sampled token and applies the cheap stop rules (stop tokens, length): what must be
 * known before the next step is submitted. */
void di_req_push_token(di_engine *e, di_req *r, const di_sample_result *res);
/* The rest, done while the next step computes: the grammar, detokenisation, stop strings (which
 * may end a request that is already in the next step: its result is then discarded). */
void di_req_post_tokens(di_engine *e, di_req *r);
/* Copies this step's output into an API record (and resets the step buffers on the next step). */
void di_req_fill_output(di_engine *e, di_req *r, di_seq_output *o);
void di_req_reset_output(di_req *r);
int di_req_output_count(const di_req *r);

/* prompt_logprobs.c */
/* Rows a request wants for positions [start, start + n): those < n_prompt - 1 not yet extracted;
 * *first (may be NULL) = the first such position. */
int di_plp_rows(const di_req *r, int start, int n, int *first);
/* Sizes the logits buffer for prompt-logprob rows (first such request). */
di_status di_plp_reserve(di_engine *e);
/* Copies the prompt logprobs of a completed step's rows into their requests (before sampling). */
void di_plp_extract(di_engine *e, const di_sched *s);
/* Ends score-only requests whose prompt the completed step finished. */
void di_plp_finish_scored(di_engine *e, const di_sched *s);

/* scheduler.c: plans one step. `spec`: step n is in flight, plan step n+1 as if every sample of
 * step n produced one token and none finished (no preemption in that mode). */
di_status di_schedule(di_engine *e, di_sched *s, int spec);
/* Builds s->batch (tokens of pending samples are filled by di_sched_patch after step n). */
di_status di_sched_build_batch(di_engine *e, di_sched *s);
void di_sched_patch_tokens(di_sched *s);
void di_sched_clear(di_sched *s);
void di_sched_free(di_sched *s);
/* queues */
void di_engine_remove_running(di_engine *e, di_req *r);
void di_engine_remove_waiting(di_engine *e, di_req *r);
double di_now(void);
#endif
