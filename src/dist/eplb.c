/* DeepSeek's EPLB placement (see eplb.h). The three steps of the hierarchical form, per layer:
 *   1. groups -> nodes: balanced packing of the groups' summed loads (groups stay whole on a node);
 *   2. inside each node: replicas to the experts of highest load per replica;
 *   3. the node's physical experts (load = expert load / its replica count) -> the node's ranks by
 *      balanced packing.
 * The global form is the same with one group and one node. Experts are renumbered "node-major"
 * (mlog) in step 1 so steps 2-3 see each node's experts as one contiguous range. */
#include "dist/eplb.h"
#include "util/status.h"
#include <stdlib.h>
#include <string.h>

void di_eplb_balanced_packing(const double *weight, int n, int n_packs, int32_t *pack, int32_t *rank_in_pack) {
  const int per = n / n_packs;
  int32_t *order = malloc(sizeof(int32_t) * (size_t)n);
  double *load = calloc((size_t)n_packs, sizeof(double));
  int32_t *filled = calloc((size_t)n_packs, sizeof(int32_t));
  DI_ASSERT(order && load && filled);
  for (int i = 0; i < n; i++)
    order[i] = i;
  /* heaviest first; equal loads keep the lower index first (insertion sort: n is the experts of a layer) */
  for (int i = 1; i < n; i++) {
    int32_t v = order[i];
    int j = i - 1;
    while (j >= 0 && weight[order[j]] < weight[v]) {
      order[j + 1] = order[j];
      j--;
    }
    order[j + 1] = v;
  }
  for (int k = 0; k < n; k++) {
    const int i = order[k];
    int best = -1;
    for (int p = 0; p < n_packs; p++)
      if (filled[p] < per && (best < 0 || load[p] < load[best]))
        best = p;
    pack[i] = best;
    rank_in_pack[i] = filled[best]++;
    load[best] += weight[i];
  }
  free(order);
  free(load);
  free(filled);
}

void di_eplb_replicate(const double *weight, int n_logical, int n_physical, int32_t *phy2log, int32_t *replica_rank,
                       int32_t *count) {
  for (int i = 0; i < n_logical; i++) {
    phy2log[i] = i;
    replica_rank[i] = 0;
    count[i] = 1;
  }
  for (int p = n_logical; p < n_physical; p++) {
    int best = 0;
    for (int e = 1; e < n_logical; e++)
      if (weight[e] / count[e] > weight[best] / count[best])
        best = e;
    phy2log[p] = best;
    replica_rank[p] = count[best]++;
  }
}

static di_status hierarchical(const double *w, int L, int P, int G, int nodes, int ranks, int32_t *phy2log) {
  const int gsize = L / G, groups_per_node = G / nodes, L_node = L / nodes, P_node = P / nodes;
  const int ranks_node = ranks / nodes, P_rank = P / ranks;
  int32_t *gpack = malloc(sizeof(int32_t) * (size_t)G), *grank = malloc(sizeof(int32_t) * (size_t)G);
  double *gload = calloc((size_t)G, sizeof(double));
  int32_t *mlog2log = malloc(sizeof(int32_t) * (size_t)L);
  double *wn = malloc(sizeof(double) * (size_t)L_node), *wp = malloc(sizeof(double) * (size_t)P_node);
  int32_t *p2m = malloc(sizeof(int32_t) * (size_t)P_node), *prank = malloc(sizeof(int32_t) * (size_t)P_node);
  int32_t *cnt = malloc(sizeof(int32_t) * (size_t)L_node), *pk = malloc(sizeof(int32_t) * (size_t)P_node);
  int32_t *rk = malloc(sizeof(int32_t) * (size_t)P_node);
  if (!gpack || !grank || !gload || !mlog2log || !wn || !wp || !p2m || !prank || !cnt || !pk || !rk) {
    free(gpack), free(grank), free(gload), free(mlog2log), free(wn), free(wp), free(p2m), free(prank), free(cnt);
    free(pk), free(rk);
    return di_error_set(DI_ERR_OOM, "eplb: out of memory");
  }
  /* 1. groups onto nodes */
  for (int e = 0; e < L; e++)
    gload[e / gsize] += w[e];
  di_eplb_balanced_packing(gload, G, nodes, gpack, grank);
  for (int e = 0; e < L; e++) {
    const int g = e / gsize;
    mlog2log[(gpack[g] * groups_per_node + grank[g]) * gsize + e % gsize] = e;
  }
  for (int n = 0; n < nodes; n++) {
    /* 2. replicas inside the node */
    for (int k = 0; k < L_node; k++)
      wn[k] = w[mlog2log[n * L_node + k]];
    di_eplb_replicate(wn, L_node, P_node, p2m, prank, cnt);
    /* 3. the node's physical experts onto its ranks */
    for (int p = 0; p < P_node; p++)
      wp[p] = wn[p2m[p]] / cnt[p2m[p]];
    di_eplb_balanced_packing(wp, P_node, ranks_node, pk, rk);
    for (int p = 0; p < P_node; p++)
      phy2log[n * P_node + pk[p] * P_rank + rk[p]] = mlog2log[n * L_node + p2m[p]];
  }
  free(gpack), free(grank), free(gload), free(mlog2log), free(wn), free(wp), free(p2m), free(prank), free(cnt);
  free(pk), free(rk);
  return DI_OK;
}

di_status di_eplb_rebalance(const double *weight, int n_logical, int n_physical, int n_groups, int n_nodes,
                            int n_ranks, int32_t *phy2log, int *hierarchical_out) {
  if (n_logical <= 0 || n_physical < n_logical || n_ranks <= 0 || n_physical % n_ranks || n_nodes <= 0 ||
      n_ranks % n_nodes)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "eplb: %d physical slots for %d experts on %d ranks (%d nodes): the slots must be at least "
                        "the experts and a multiple of the ranks, the ranks a multiple of the nodes",
                        n_physical, n_logical, n_ranks, n_nodes);
  const int hier = n_groups > 0 && n_logical % n_groups == 0 && n_groups % n_nodes == 0;
  if (hierarchical_out)
    *hierarchical_out = hier;
  if (hier)
    return hierarchical(weight, n_logical, n_physical, n_groups, n_nodes, n_ranks, phy2log);
  return hierarchical(weight, n_logical, n_physical, 1, 1, n_ranks, phy2log);
}
