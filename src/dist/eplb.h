/* Expert placement by DeepSeek's EPLB algorithm (the public eplb.py, re-derived here in C): given
 * each logical expert's load over a window, chooses which experts get the redundant physical slots
 * and which rank holds each physical slot, so the ranks' loads are as even as the heuristic makes
 * them. Hierarchical where the node count divides the expert groups (groups packed onto nodes first,
 * so a token's group-limited experts stay on few nodes; then replicas and ranks inside each node),
 * global otherwise (one group, one node). Pure computation: tested without any communicator. */
#ifndef DI_DIST_EPLB_H
#define DI_DIST_EPLB_H
#include "deepinfer.h"
#include <stdint.h>

/* weight[n_logical]: load of each expert of one layer. Writes phy2log[n_physical]: the logical expert
 * of each physical slot; slot p lives on rank p / (n_physical / n_ranks). n_physical >= n_logical,
 * n_physical % n_ranks == 0, n_ranks % n_nodes == 0. Deterministic (ties go to the lower index), so
 * every rank computes the same placement from the same loads. *hierarchical says which form ran. */
di_status di_eplb_rebalance(const double *weight, int n_logical, int n_physical, int n_groups, int n_nodes,
                            int n_ranks, int32_t *phy2log, int *hierarchical);

/* Packs n items into n_packs packs of n / n_packs items each, heaviest first into the lightest pack
 * that has room (ties: lower pack). pack[i], rank_in_pack[i]. n % n_packs == 0. */
void di_eplb_balanced_packing(const double *weight, int n, int n_packs, int32_t *pack, int32_t *rank_in_pack);
/* Gives n_physical - n_logical extra replicas one at a time to the expert of highest load per
 * replica. phy2log[n_physical], replica_rank[n_physical], count[n_logical]. */
void di_eplb_replicate(const double *weight, int n_logical, int n_physical, int32_t *phy2log, int32_t *replica_rank,
                       int32_t *count);
#endif
