/* DeepSeek's EPLB placement (src/dist/eplb.c) on its own, no ranks needed: balanced packing fills
 * every pack exactly and stays within one item of the mean; replicas go to the hottest experts; a
 * placement holds every expert, the same number of slots per rank, whole groups per node in the
 * hierarchical form, the global form when the nodes do not divide the groups; and on skewed
 * (Zipf-like, shuffled) loads the busiest rank's load falls well below the contiguous placement's. */
#include "dist/eplb.h"
#include "test_util.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

static void test_packing(void) {
  for (int trial = 0; trial < 50; trial++) {
    const int m = 1 + (int)(urand() * 8), per = 1 + (int)(urand() * 6), n = m * per;
    double w[64], load[8] = {0}, sum = 0, mx = 0;
    int32_t pack[64], rank[64], filled[8] = {0};
    for (int i = 0; i < n; i++) {
      w[i] = urand() * 100;
      sum += w[i];
      mx = w[i] > mx ? w[i] : mx;
    }
    di_eplb_balanced_packing(w, n, m, pack, rank);
    int ok = 1;
    unsigned char seen[8][8] = {{0}};
    for (int i = 0; i < n; i++) {
      ok &= pack[i] >= 0 && pack[i] < m && rank[i] >= 0 && rank[i] < per && !seen[pack[i]][rank[i]];
      if (ok)
        seen[pack[i]][rank[i]] = 1;
      filled[pack[i]]++;
      load[pack[i]] += w[i];
    }
    CHECK(ok);
    double worst = 0;
    for (int p = 0; p < m; p++) {
      CHECK(filled[p] == per);
      worst = load[p] > worst ? load[p] : worst;
    }
    CHECKF(worst <= sum / m + mx + 1e-9, "trial %d: busiest pack %g, mean %g, largest item %g", trial, worst, sum / m, mx);
  }
}

static void test_replicate(void) {
  const double w[4] = {100, 1, 30, 1};
  int32_t p2l[8], rk[8], cnt[4];
  di_eplb_replicate(w, 4, 6, p2l, rk, cnt); /* 100 -> 100/2 -> 100/3 */
  CHECK(cnt[0] == 3 && cnt[1] == 1 && cnt[2] == 1 && cnt[3] == 1);
  CHECK(p2l[4] == 0 && p2l[5] == 0 && rk[4] == 1 && rk[5] == 2);
  di_eplb_replicate(w, 4, 8, p2l, rk, cnt); /* then 100/3 > 30 once more; 100/4 = 25 < 30 */
  CHECK(cnt[0] == 4 && cnt[2] == 2 && p2l[7] == 2 && rk[7] == 1);
}

/* load of each rank: each slot carries its expert's load over the expert's replica count */
static double max_over_mean(const double *w, int E, const int32_t *p2l, int P, int N) {
  int cnt[256] = {0};
  double rank_load[64] = {0}, sum = 0, mx = 0;
  for (int p = 0; p < P; p++)
    cnt[p2l[p]]++;
  for (int p = 0; p < P; p++)
    rank_load[p / (P / N)] += w[p2l[p]] / cnt[p2l[p]];
  for (int r = 0; r < N; r++) {
    sum += rank_load[r];
    mx = rank_load[r] > mx ? rank_load[r] : mx;
  }
  return mx / (sum / N);
}

static void test_rebalance(void) {
  enum { E = 64, G = 8, R = 16, P = E + R, N = 8 };
  double w[E];
  int perm[E];
  for (int e = 0; e < E; e++)
    perm[e] = e;
  for (int e = E - 1; e > 0; e--) { /* hot experts scattered, not all in group 0 */
    int j = (int)(urand() * (e + 1)), t = perm[e];
    perm[e] = perm[j], perm[j] = t;
  }
  for (int e = 0; e < E; e++)
    w[perm[e]] = 1000.0 / pow(e + 1, 1.1);
  int32_t p2l[P], p2l2[P], plain[E];
  for (int nodes = 1; nodes <= 4; nodes *= 2) {
    int hier = -1;
    CHECK(di_eplb_rebalance(w, E, P, G, nodes, N, p2l, &hier) == DI_OK);
    CHECK(hier == 1);
    int cnt[E] = {0};
    for (int p = 0; p < P; p++)
      cnt[p2l[p]]++;
    int all = 1;
    for (int e = 0; e < E; e++)
      all &= cnt[e] >= 1;
    CHECK(all);
    /* hierarchical: the slots of a node hold whole groups, G / nodes of them */
    for (int n = 0; n < nodes; n++) {
      unsigned char g_in[G] = {0};
      int ng = 0;
      for (int p = n * (P / nodes); p < (n + 1) * (P / nodes); p++)
        if (!g_in[p2l[p] / (E / G)]++)
          ng++;
      CHECKF(ng == G / nodes, "node %d holds %d groups", n, ng);
    }
    CHECK(di_eplb_rebalance(w, E, P, G, nodes, N, p2l2, NULL) == DI_OK);
    CHECK(memcmp(p2l, p2l2, sizeof p2l) == 0); /* deterministic */
    for (int e = 0; e < E; e++)
      plain[e] = e;
    const double before = max_over_mean(w, E, plain, E, N), after = max_over_mean(w, E, p2l, P, N);
    printf("nodes %d: max/mean rank load %.3f contiguous -> %.3f EPLB\n", nodes, before, after);
    /* one node: close to even; more nodes: groups must stay whole on a node, which costs balance */
    CHECKF(after < before && after < (nodes == 1 ? 1.05 : 1.6), "%.3f -> %.3f", before, after);
  }
  int hier = -1; /* 3 nodes do not divide 8 groups: global */
  CHECK(di_eplb_rebalance(w, E, 78, G, 3, 6, p2l, &hier) == DI_OK && hier == 0);
  CHECK_ERR(di_eplb_rebalance(w, E, 70, G, 1, 8, p2l, NULL), "multiple of the ranks");
  CHECK_ERR(di_eplb_rebalance(w, E, 60, G, 1, 4, p2l, NULL), "at least the experts");
}

int main(void) {
  test_packing();
  test_replicate();
  test_rebalance();
  return test_finish("test_eplb");
}
