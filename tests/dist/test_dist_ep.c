/* The expert-parallel exchange (src/dist/ep.c) on a skewed routing workload, with made-up experts
 * whose rows are a fixed function of (expert, row): every (token, slot) output must equal the expert
 * applied locally, exactly; EPLB on (replicas, rebalancing) must give the same outputs as EPLB off,
 * bit for bit; and the measured load imbalance (max / mean expert rows per rank) must fall with EPLB.
 * Each rank routes its own tokens (as data-parallel ranks do), one rank sometimes has none (it
 * joins every exchange with zero tokens). Runs in-process on the one-rank communicator, then
 * re-executes itself under `mpirun --oversubscribe -np 4` (skipped, saying so, when mpirun or MPI is
 * missing; OpenMPI's run-as-root switches are set for CI). */
#include "dist/comm.h"
#include "dist/ep.h"
#include "test_util.h"
#include "mpi_relaunch.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { E = 16, H = 24, K = 4, LAYERS = 3, STEPS = 40 };

static void expert_row(int e, const float *x, float *y) {
  for (int d = 0; d < H; d++)
    y[d] = x[d] * (1.0f + 0.03125f * (float)e) + sinf((float)(e * H + d));
}

static di_status fake_experts(void *user, int layer, const float *x, const int32_t *count, int n, float *y,
                              float *scratch) {
  int *rows_seen = user;
  for (int e = 0, r = 0; e < E; e++)
    for (int i = 0; i < count[e]; i++, r++)
      expert_row(e, x + (size_t)r * H, y + (size_t)r * H);
  *rows_seen += n;
  return DI_OK;
}

static uint64_t rng_state;
static double urand(void) {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* Zipf-like over experts (expert 0 hottest, then 1, ...): contiguous placement puts the hot ones
 * together on rank 0. K distinct experts per token. */
static void route(int T, int32_t *ids) {
  for (int t = 0; t < T; t++)
    for (int k = 0; k < K; k++) {
      int e, dup;
      do {
        const double u = urand();
        e = (int)(E * pow(u, 3.0));
        e = e >= E ? E - 1 : e;
        dup = 0;
        for (int j = 0; j < k; j++)
          dup |= ids[t * K + j] == e;
      } while (dup);
      ids[t * K + k] = e;
    }
}

/* Runs STEPS steps of LAYERS layers; returns the imbalance over the steps after the warm-up and
 * checks every output against the local expert. out_sum: a digest of every output (bitwise). */
static double run_workload(di_comm *c, int eplb, uint64_t *digest) {
  di_ep_config cfg = {eplb, eplb ? 4 : 0, 8, 4};
  di_ep *ep;
  CHECK(di_ep_create(c, LAYERS, E, H, 4, 0, &cfg, &ep) == DI_OK);
  float x[64 * H], y[64 * K * H], ref[H];
  int32_t ids[64 * K];
  int bad = 0, rows = 0;
  uint64_t dg = 1469598103934665603ull;
  for (int step = 0; step < STEPS; step++) {
    if (step == STEPS / 2)
      di_ep_reset_stats(ep); /* measure after EPLB has seen the load */
    rng_state = 0x9E3779B97F4A7C15ull * (uint64_t)(1 + step * 131 + c->rank);
    const int T = (c->rank == 1 && step % 5 == 0) ? 0 : 8 + (int)(urand() * 40);
    for (int layer = 0; layer < LAYERS; layer++) {
      for (int i = 0; i < T * H; i++)
        x[i] = (float)(urand() * 2 - 1);
      route(T, ids);
      memset(y, 0, sizeof(float) * (size_t)T * K * H);
      CHECK(di_ep_routed(ep, layer, x, T, ids, K, y, fake_experts, &rows) == DI_OK);
      for (int i = 0; i < T * K; i++) {
        expert_row(ids[i], x + (size_t)(i / K) * H, ref);
        bad += memcmp(ref, y + (size_t)i * H, sizeof ref) != 0;
        for (int d = 0; d < H; d++) {
          uint32_t u;
          memcpy(&u, y + (size_t)i * H + d, 4);
          dg = (dg ^ u) * 1099511628211ull;
        }
      }
    }
  }
  CHECKF(bad == 0, "rank %d: %d outputs differ from the local expert (eplb %d)", c->rank, bad, eplb);
  double imb = 0;
  CHECK(di_ep_imbalance(ep, &imb, NULL) == DI_OK);
  if (eplb && c->size > 1)
    CHECKF(di_ep_rebalances(ep) == STEPS / 4 - (STEPS % 4 == 0), "%d rebalances", di_ep_rebalances(ep));
  di_ep_destroy(ep);
  *digest = dg;
  return imb;
}

static void check_workload(di_comm *c) {
  uint64_t d_off, d_on;
  const double off = run_workload(c, 0, &d_off), on = run_workload(c, 1, &d_on);
  CHECKF(d_off == d_on, "rank %d: EPLB changed the outputs", c->rank);
  if (c->rank == 0)
    printf("%d rank(s): load imbalance (max / mean expert rows per rank) %.3f without EPLB, %.3f with\n", c->size, off,
           on);
  if (c->size > 1)
    CHECKF(on < off * 0.8, "imbalance %.3f with EPLB, %.3f without", on, off);
}

int main(int argc, char **argv) {
  if (di_comm_launched_by_mpi()) {
    di_comm *c;
    if (di_comm_mpi_create(20, &c) != DI_OK) {
      fprintf(stderr, "%s\n", di_last_error());
      return 1;
    }
    check_workload(c);
    /* every rank's failures count: gather them */
    int mine = di_test_failed, all[64] = {0};
    CHECK(di_comm_allgather(c, &mine, sizeof mine, all) == DI_OK);
    int failed = 0;
    for (int r = 0; r < c->size; r++)
      failed += all[r];
    const int rank = c->rank;
    di_comm_destroy(c);
    if (rank != 0)
      return failed ? 1 : 0;
    if (failed && !di_test_failed)
      di_test_failed = failed;
    return test_finish("test_dist_ep (4 ranks)");
  }
  di_comm *self;
  CHECK(di_comm_self_create(&self) == DI_OK);
  check_workload(self);
  di_comm_destroy(self);
  int rc = test_finish("test_dist_ep (1 rank)");
  if (rc)
    return rc;
  return mpi_relaunch(argv[0], "4", "test_dist_ep");
}
