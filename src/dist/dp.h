/* Attention data parallel: each rank runs its own engine (its requests' attention and KV cache);
 * rank 0 places arriving requests on the rank with the least load (tokens of its unfinished
 * requests, as every rank reports each iteration; ties to the lower rank) and all ranks iterate
 * together. With expert parallel on, a rank's forward exchanges with every other rank: after its
 * step each rank listens (di_ep_listen), joining the others' forwards with zero tokens, so ranks
 * with no work, or with fewer forwards in a step, never leave a collective waiting.
 * The offline driver: every rank passes the same request list (as each rank of `mpirun ... deepinfer`
 * sees the same arguments); the results come back on rank 0. */
#ifndef DI_DIST_DP_H
#define DI_DIST_DP_H
#include "dist/comm.h"
#include "dist/ep.h"

typedef struct di_dp_result {
  int32_t *ids;              /* generated ids (malloc'd; rank 0 only) */
  int n_ids;
  di_finish_reason finish;
  int rank;                  /* where it ran */
} di_dp_result;

/* Runs reqs[0..n) on the ranks: `arrivals` requests join per iteration (>= 1; n for all at once).
 * ep: the expert-parallel state when expert parallel is on (a forward must have run on every rank
 * before: see di_ep_listen), else NULL. out[n] (rank 0: ids, finish, rank; other ranks: rank only);
 * free the ids with di_dp_results_free. Collective. */
di_status di_dp_generate(di_comm *c, di_engine *e, di_ep *ep, const di_request_params *reqs, int n, int arrivals,
                         di_dp_result *out);
void di_dp_results_free(di_dp_result *out, int n);
#endif
