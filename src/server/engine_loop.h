/* The engine thread of `deepinfer serve`. The engine is not thread-safe, so one thread owns it:
 * HTTP handler threads hand it jobs (one job = the engine requests of one HTTP request) through a
 * locked queue, and read what each step produced from their job's event list (a condition variable
 * per job). The thread steps while any request is unfinished and sleeps otherwise.
 *
 * Job lifetime: di_srv_job_create gives the handler a job; di_srv_submit hands it to the engine
 * thread (which takes a reference until every sample finished); di_srv_job_release drops the
 * handler's reference. Whoever drops the last reference frees it. */
#ifndef DI_SERVER_ENGINE_LOOP_H
#define DI_SERVER_ENGINE_LOOP_H
#include <pthread.h>
#include "deepinfer.h"

/* What one step produced for one sample (a copy of di_seq_output). */
typedef struct di_srv_event {
  struct di_srv_event *next;
  int prompt_index, sample_index;
  int n_tokens;
  int32_t *tokens;
  char *text;
  size_t text_len;
  float *logprobs;            /* [n_tokens] or NULL */
  int n_top;
  di_token_logprob *top;      /* [n_tokens][n_top] */
  di_finish_reason finish;
  char *error;                /* finish == DI_FINISH_ERROR */
  int32_t stop_token;
  int n_prompt_tokens, n_cached_tokens, n_output_tokens;
  float *prompt_logprobs;     /* [n_prompt_tokens] (entry 0 NaN) in sample 0's first event, else NULL */
  int n_prompt_top;
  di_token_logprob *prompt_top; /* [n_prompt_tokens][n_prompt_top] or NULL */
  int32_t *prompt_ranks;      /* [n_prompt_tokens] with prompt_logprobs */
} di_srv_event;
void di_srv_event_free(di_srv_event *ev);

typedef struct di_srv_engine di_srv_engine;
typedef struct di_srv_job di_srv_job;

/* Starts the thread over an engine it will own until di_srv_engine_stop. */
di_status di_srv_engine_start(di_engine *e, di_srv_engine **out);
/* Aborts everything still running, joins the thread and frees the loop (not the engine). */
void di_srv_engine_stop(di_srv_engine *s);

/* A job of n_prompts engine requests; params[i] (and what they point to) must stay valid until
 * di_srv_submit returns. */
di_srv_job *di_srv_job_create(int n_prompts, const di_request_params *params);
/* Queues the job and waits until the engine thread added its requests. On failure (invalid
 * parameters, a grammar that does not compile, shutting down) returns the engine's status with the
 * message set on this thread; no request of the job runs then. */
di_status di_srv_submit(di_srv_engine *s, di_srv_job *job);
/* Takes the next event. Returns 1 with *ev (the caller frees it), 0 when timeout_ms passed without
 * one, -1 when every sample finished and every event was taken. */
int di_srv_next_event(di_srv_engine *s, di_srv_job *job, int timeout_ms, di_srv_event **ev);
/* Asks the engine thread to abort the job's requests (client gone). */
void di_srv_abort(di_srv_engine *s, di_srv_job *job);
void di_srv_job_release(di_srv_engine *s, di_srv_job *job);
/* Copies the job's error message ("" if none: a failed step, out of memory) into buf. */
void di_srv_job_error(di_srv_engine *s, di_srv_job *job, char *buf, size_t cap);
/* Aborts every job (shutdown). */
void di_srv_abort_all(di_srv_engine *s);

/* 0 when the engine's last step failed (a backend error), else 1. */
int di_srv_healthy(di_srv_engine *s);
/* The engine's stats as of its last step, and the jobs in flight. */
void di_srv_stats(di_srv_engine *s, di_engine_stats *st, int *jobs_running, int *jobs_waiting);
/* The speculative-decoding counters as of the last step. */
void di_srv_spec_stats(di_srv_engine *s, di_spec_stats *spec);
#endif
