/* Expert parallelism: the routed experts of every MoE layer spread over the ranks (physical slots,
 * E + redundant ones, slot p on rank p / slots_per_rank), and the exchange that sends each token's
 * hidden state to the ranks holding its chosen experts and brings the expert outputs back.
 *
 * One call per MoE layer on every rank (a rank with no tokens calls it with T = 0). The outputs come
 * back per (token, slot), unweighted, so the caller combines them in its single-rank order: this is
 * what makes N ranks bit-identical to one on the CPU (each expert row's arithmetic does not depend
 * on which other rows share its GEMM). With EPLB the load of each logical expert is counted every
 * step and the placement recomputed every step_interval steps from the last window_size steps (the
 * same on every rank: the loads are all-gathered, the algorithm is deterministic). On CPU ranks the
 * weights are memory-mapped, so a rank touches only its slots' experts and a move copies nothing. */
#ifndef DI_DIST_EP_H
#define DI_DIST_EP_H
#include "dist/comm.h"
#include <stdint.h>

typedef struct di_ep di_ep;

typedef struct di_ep_config {
  int enable_eplb;
  int num_redundant_experts; /* extra physical slots (EPLB) */
  int window_size;           /* steps of load history a rebalance looks at */
  int step_interval;         /* steps between rebalances */
} di_ep_config;

/* Runs the local experts over rows sorted by logical expert: count[e] rows of expert e, in expert
 * order, n rows in all; x [n][H] -> y [n][H]. scratch holds n * scratch_per_row floats. */
typedef di_status (*di_ep_experts_fn)(void *user, int layer, const float *x, const int32_t *count, int n, float *y,
                                      float *scratch);

/* n_layers: layer indices passed to di_ep_routed are < n_layers. n_groups: the router's expert
 * groups (EPLB keeps groups on nodes where it can). */
di_status di_ep_create(di_comm *comm, int n_layers, int n_experts, int hidden, int n_groups, int scratch_per_row,
                       const di_ep_config *cfg, di_ep **out);
void di_ep_destroy(di_ep *ep);

/* x [T][H]; ids [T * K] (logical experts; -1 = slot unused). Writes y [T * K][H]: the expert's output
 * for each used slot (unused slots untouched). Collective. */
di_status di_ep_routed(di_ep *ep, int layer, const float *x, int T, const int32_t *ids, int K, float *y,
                       di_ep_experts_fn fn, void *user);

/* For a rank whose step is over (or that had no work): joins, with zero tokens, every forward the
 * other ranks run, one round of the MoE layers per forward, until a round's first exchange finds no
 * rank in a forward (all listening); then every rank returns together. Collective: after each
 * engine step every rank calls it, so ranks with different numbers of forwards per step stay in
 * step. Needs one forward first (it replays that forward's MoE layer order). */
di_status di_ep_listen(di_ep *ep);
/* The experts a listening rank runs for the others' rows: fn(user, layer, ...) with a user pointer
 * that lives as long as the ep (the backend). */
void di_ep_set_listener(di_ep *ep, di_ep_experts_fn fn, void *user);

/* For a backend with an exchange of its own (the CUDA one, src/backend/cuda/cuda_ep.cu): the physical
 * slot of each of the n (token, slot) pairs of one MoE layer (ids: logical experts, -1 = unused ->
 * -1), by di_ep_routed's replica rule, counting the loads as it does. The step ends (and EPLB may
 * rebalance: a collective over the ep's communicator) when the layer is not above the previous
 * call's, so every rank calls it for every MoE layer of every forward. Slot p lives on rank
 * p / (di_ep_slots / ranks). di_ep_count_rows adds the rows this rank computed (di_ep_imbalance). */
di_status di_ep_pick_slots(di_ep *ep, int layer, const int32_t *ids, int n, int32_t *slot);
/* The same for a listening rank's call (no forward of its own: n = 0), which does not extend the
 * recorded layer order a listener replays. */
di_status di_ep_pick_slots_listening(di_ep *ep, int layer);
/* For a backend with its own exchange: di_ep_listen runs fn(user, layer, &any_real) for each MoE layer
 * of the recorded order instead of di_ep_routed's exchange; fn joins that layer's exchange with zero
 * tokens and sets any_real to whether any rank's call came from a forward (NULL fn: di_ep_routed's). */
typedef di_status (*di_ep_listen_layer_fn)(void *user, int layer, int *any_real);
void di_ep_set_listen_layer(di_ep *ep, di_ep_listen_layer_fn fn, void *user);
/* 1 once a forward has recorded the MoE layers a listening rank replays (di_ep_listen needs one). */
int di_ep_has_forward(const di_ep *ep);
void di_ep_count_rows(di_ep *ep, int64_t rows);

/* Expert rows computed on each rank since the last reset, all-gathered (collective): returns
 * max / mean over ranks (1 = even), and the rows of this rank in *local_rows when non-NULL. */
di_status di_ep_imbalance(di_ep *ep, double *imbalance, int64_t *local_rows);
void di_ep_reset_stats(di_ep *ep);
/* Rebalances done so far, and the logical expert of physical slot p of a layer (tests, logs). */
int di_ep_rebalances(const di_ep *ep);
int di_ep_slot_expert(const di_ep *ep, int layer, int slot);
int di_ep_slots(const di_ep *ep);
/* Seconds spent in the exchange (the alltoallv calls and waits) since creation, this rank. */
double di_ep_exchange_seconds(const di_ep *ep);
#endif
