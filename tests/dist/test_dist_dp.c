/* Attention data parallel with expert parallel (src/dist/dp.c) at 2 ranks on dsv3-tiny and on
 * dsv4-tiny (DeepSeek-V4: a listening rank runs its experts through the listener context of
 * cpu_deepseek_v4_ep.c): a mix of greedy and seeded-sampling requests of different lengths, arriving
 * one per iteration and placed by load, gives every request exactly the ids it gets alone (run by all
 * ranks together, each rank's forward exchanging experts); both ranks get requests; the rank without
 * work at the start joins the exchanges with zero tokens (di_ep_listen); every KV block comes back.
 * On V4 the step's token budget is 8, so prompts are prefilled in chunks that fall differently alone
 * and mixed: V4's chunk-independent results hold under data parallel. Re-executes itself under
 * `mpirun --oversubscribe -np 2`, once per model (skipped, saying so, without mpirun or MPI). */
#include "deepinfer.h"
#include "dist/dist.h"
#include "dist/dp.h"
#include "test_util.h"
#include "mpi_relaunch.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NREQ = 8 };

static void make_requests(di_request_params *p, int32_t prompts[NREQ][40], int vocab) {
  const int span = vocab - 2 < 900 ? vocab - 2 : 900;
  for (int i = 0; i < NREQ; i++) {
    di_request_params_default(&p[i]);
    const int len = 3 + (i * 11) % 29;
    for (int j = 0; j < len; j++)
      prompts[i][j] = 1 + (int32_t)((i * 131 + j * 37) % span);
    p[i].prompt_ids = prompts[i];
    p[i].n_prompt_ids = len;
    p[i].max_tokens = 4 + (i * 5) % 9;
    p[i].ignore_eos = 1;
    p[i].temperature = i % 3 == 2 ? 0.8f : 0.0f;
    if (i % 3 == 2) {
      p[i].has_seed = 1;
      p[i].seed = 100 + (uint64_t)i;
    }
  }
}

static int run_ranks(const char *model) {
  char name[96];
  snprintf(name, sizeof name, "test_dist_dp %s", model);
  char a0[] = "test_dist_dp", a1[] = "generate", a2[] = "--enable-expert-parallel", a3[] = "--dist-timeout", a4[] = "30";
  char *argv[] = {a0, a1, a2, a3, a4, NULL};
  int argc = 5;
  if (di_dist_cli_setup(&argc, argv) != 0)
    return 1;
  di_comm *c = di_dist_comm();
  di_model_options mo;
  di_model_options_default(&mo);
  mo.threads = 1;
  di_model *m = NULL;
  char dir[128];
  snprintf(dir, sizeof dir, "tests/data/models/%s", model);
  CHECK(di_model_load(test_path(dir), &mo, &m) == DI_OK);
  if (!m)
    return di_dist_cli_finish(test_finish(name));
  /* one forward on every rank first: it creates the expert-parallel state and records the MoE layers */
  const int32_t warm[1] = {1};
  float *lg = malloc(sizeof(float) * (size_t)di_model_vocab_size(m));
  CHECK(di_model_score(m, warm, 1, lg) == DI_OK);
  free(lg);
  di_ep *ep = di_dist_ep_current();
  CHECK(ep != NULL);
  di_engine *e = NULL;
  di_engine_options eo;
  di_engine_options_default(&eo);
  const int v4 = strstr(model, "dsv4") != NULL;
  if (v4)
    eo.max_num_batched_tokens = 8; /* prompts in chunks (see the top) */
  CHECK(di_engine_create(m, &eo, &e) == DI_OK);
  di_request_params p[NREQ];
  int32_t prompts[NREQ][40];
  make_requests(p, prompts, di_model_vocab_size(m));
  /* alone: every rank runs request i by itself, together */
  di_dp_result alone[NREQ], mixed[NREQ];
  memset(alone, 0, sizeof alone);
  memset(mixed, 0, sizeof mixed);
  for (int i = 0; i < NREQ; i++) {
    di_request_params q = p[i]; /* the same request on every rank, stepped together */
    uint64_t id;
    CHECK(di_engine_add_request(e, &q, &id) == DI_OK);
    int32_t ids[64];
    int n_ids = 0;
    while (di_engine_has_unfinished(e)) {
      di_step_output *so;
      CHECK(di_engine_step(e, &so) == DI_OK);
      for (int s = 0; so && s < so->n; s++)
        for (int k = 0; k < so->seqs[s].n_new_tokens && n_ids < 64; k++)
          ids[n_ids++] = so->seqs[s].new_tokens[k];
      CHECK(di_ep_listen(ep) == DI_OK);
    }
    alone[i].ids = malloc(sizeof(int32_t) * (size_t)(n_ids + 1));
    memcpy(alone[i].ids, ids, sizeof(int32_t) * (size_t)n_ids);
    alone[i].n_ids = n_ids;
  }
  di_status dst = di_dp_generate(c, e, ep, p, NREQ, 1, mixed);
  CHECKF(dst == DI_OK, "%s", di_last_error());
  int on_rank[2] = {0, 0};
  for (int i = 0; i < NREQ; i++)
    if (mixed[i].rank >= 0 && mixed[i].rank < 2)
      on_rank[mixed[i].rank]++;
  CHECKF(on_rank[0] > 0 && on_rank[1] > 0, "placement %d / %d", on_rank[0], on_rank[1]);
  if (c->rank == 0)
    for (int i = 0; i < NREQ; i++) {
      CHECKF(mixed[i].n_ids == p[i].max_tokens && mixed[i].n_ids == alone[i].n_ids &&
                 memcmp(mixed[i].ids, alone[i].ids, sizeof(int32_t) * (size_t)alone[i].n_ids) == 0,
             "request %d (rank %d): %d ids mixed, %d alone", i, mixed[i].rank, mixed[i].n_ids, alone[i].n_ids);
      CHECK(mixed[i].finish == DI_FINISH_LENGTH);
    }
  CHECK(di_engine_check(e) == DI_OK);
  di_engine_stats s;
  di_engine_get_stats(e, &s);
  CHECK(s.kv_blocks_used == 0);
  if (c->rank == 0)
    printf("%s, data parallel 2: requests on ranks %d / %d, all equal to alone\n", model, on_rank[0], on_rank[1]);
  di_dp_results_free(alone, NREQ);
  di_dp_results_free(mixed, NREQ);
  di_engine_free(e);
  di_model_free(m);
  int mine = di_test_failed, all[64] = {0};
  if (di_comm_allgather(c, &mine, sizeof mine, all) != DI_OK)
    di_dist_fail();
  const int rank = c->rank;
  int failed = 0;
  for (int r = 0; r < c->size; r++)
    failed += all[r];
  int rc = rank == 0 ? test_finish(name) : (failed ? 1 : 0);
  if (rank == 0 && failed && !rc)
    rc = 1;
  return di_dist_cli_finish(rc);
}

int main(int argc, char **argv) {
  if (di_comm_launched_by_mpi())
    return run_ranks(argc > 1 ? argv[1] : "dsv3-tiny");
  int rc = mpi_run(argv[0], "2", "test_dist_dp", "dsv3-tiny");
  return mpi_run(argv[0], "2", "test_dist_dp", "dsv4-tiny") || rc;
}
