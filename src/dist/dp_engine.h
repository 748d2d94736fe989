/* Attention data parallel behind the engine API: `serve --data-parallel-size N`, `generate
 * --data-parallel-size N` and `LLM(data_parallel_size=N)` run N ranks (mpirun), every rank loads
 * the model and creates its engine; on rank 0 the engine gets a front end (this file) and the other
 * ranks become workers inside di_engine_create. The front end places each new request on the rank
 * of least load (tokens of its unfinished requests), and every di_engine_step of rank 0 is one tick
 * of all ranks: rank 0 hands the new requests and aborts to their ranks, every rank steps its own
 * engine (with expert parallel, ranks with fewer forwards listen: di_ep_listen), and the workers'
 * outputs come back to rank 0, merged into its step's output under rank 0's request ids. So the
 * server and the Python API run unchanged over N ranks.
 *
 * Determinism: rank 0 encodes text prompts, numbers requests and draws the seeds of unseeded ones in
 * arrival order, as one rank does; the CPU backend is batch-invariant, so N ranks give the outputs
 * of one bit for bit. Engine statistics (di_engine_get_stats) stay rank 0's own. */
#ifndef DI_DIST_DP_ENGINE_H
#define DI_DIST_DP_ENGINE_H
#include "deepinfer.h"

typedef struct di_dp_front di_dp_front;
struct di_engine;

/* Called by di_engine_create on every rank when the data-parallel size is > 1 (collective): prepare
 * before the engine exists (checks the ranks; with expert parallel one warm-up forward), attach
 * after. Rank 0: attaches a front end to e (e->dp). Other ranks: serve as a worker until rank 0's
 * engine is freed, then end the process (exit 0; a failure ends the job with a message). */
di_status di_dp_prepare(di_model *m);
di_status di_dp_attach(struct di_engine *e);

/* The hooks of the engine API on rank 0 (engine.c): add_request places the request (-1: keep it
 * here) and hands remote ones over with their id and seed already fixed. */
int di_dp_front_place(di_dp_front *f, int n_prompt);
di_status di_dp_front_add(di_dp_front *f, int rank, const di_request_params *p, const int32_t *prompt, int n_prompt,
                          uint64_t id, uint64_t seed);
/* 1 when `id` is an unfinished remote request (its abort was queued), 0 when it is not remote. */
int di_dp_front_abort(di_dp_front *f, uint64_t id);
int di_dp_front_busy(const di_dp_front *f);
di_status di_dp_front_step(di_dp_front *f, struct di_engine *e, di_step_output **out);
/* Adds the other ranks' engine statistics (as of the last step) to s, rank 0's own: counts and rates
 * summed (the ranks run at once), the prefix-cache hit rate recomputed from the summed tokens. */
void di_dp_front_add_stats(const di_dp_front *f, di_engine_stats *s);
/* Stops the workers (their processes end) and frees the front end; then tears the ranks down. */
void di_dp_front_free(di_dp_front *f);
#endif
