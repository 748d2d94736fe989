/* Process-wide distributed state and the CLI's distributed flags (see dist.h). The flags are taken
 * out of argv in main() so that no command's parser needs to know them. Fault injection for the
 * failure tests: DEEPINFER_DIST_TEST_FAIL="RANK:CALL:kill|stall" makes rank RANK SIGKILL itself (or
 * sleep forever) at its CALL-th expert exchange; "RANK:CALL:oom" makes the CALL-th request a
 * data-parallel worker rank RANK takes fail as out of memory (di_dist_test_fail_add). */
#include "util/switches.h"
#include "dist/dist.h"
#include "util/status.h"
#include "util/json.h"
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct {
  di_comm *comm;
  di_ep *ep;
  int expert_parallel, dp_size;
  di_ep_config eplb;
  double timeout_s;
  int ep_L, ep_E, ep_H;
  int fail_rank, fail_call, fail_stall, fail_oom;
  long calls, adds;
} g = {.fail_rank = -1};

int di_dist_parse_eplb_config(const char *json, di_ep_config *cfg, char *err, size_t err_len) {
  cJSON *j = cJSON_Parse(json);
  if (!j || !cJSON_IsObject(j)) {
    snprintf(err, err_len, "--eplb-config: not a JSON object: %s", json);
    cJSON_Delete(j);
    return -1;
  }
  for (cJSON *it = j->child; it; it = it->next) {
    int *dst = strcmp(it->string, "num_redundant_experts") == 0 ? &cfg->num_redundant_experts
               : strcmp(it->string, "window_size") == 0         ? &cfg->window_size
               : strcmp(it->string, "step_interval") == 0       ? &cfg->step_interval
                                                                : NULL;
    if (!dst) {
      snprintf(err, err_len, "--eplb-config: unknown key \"%s\" (num_redundant_experts, window_size, step_interval)",
               it->string);
      cJSON_Delete(j);
      return -1;
    }
    const double lo = dst == &cfg->num_redundant_experts ? 0 : 1;
    int64_t v;
    if (!di_json_int_in(it, lo, 1e6, &v)) { /* the one range check: 1e300 is refused, not cast */
      snprintf(err, err_len, "--eplb-config: \"%s\" must be an integer in [%g, 1000000]", it->string, lo);
      cJSON_Delete(j);
      return -1;
    }
    *dst = (int)v;
  }
  cJSON_Delete(j);
  return 0;
}

static int setup(int *argc, char **argv, int orig_argc, char **orig);

static void stop_as_interrupt(int sig) {
  (void)sig;
  raise(SIGINT);
}

/* Takes argv[i] (and its value) out when it is one of ours; returns 1 if taken, -1 on a bad value. */
static int take_flag(int *argc, char **argv, int i) {
  const char *a = argv[i], *v = NULL;
  int nv = 0; /* arguments consumed besides the flag */
  static const char *with_value[] = {"--eplb-config", "--dist-timeout", "--data-parallel-size"};
  const char *name = NULL;
  if (strcmp(a, "--enable-expert-parallel") == 0 || strcmp(a, "--enable-eplb") == 0) {
    name = a;
  } else {
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) {
      const size_t n = strlen(with_value[k]);
      if (strncmp(a, with_value[k], n) == 0 && (a[n] == '\0' || a[n] == '=')) {
        name = with_value[k];
        if (a[n] == '=') {
          v = a + n + 1;
        } else if (i + 1 < *argc) {
          v = argv[i + 1];
          nv = 1;
        } else {
          fprintf(stderr, "deepinfer: %s needs a value\n", name);
          return -1;
        }
      }
    }
  }
  if (!name)
    return 0;
  char err[256];
  if (strcmp(name, "--enable-expert-parallel") == 0) {
    g.expert_parallel = 1;
  } else if (strcmp(name, "--enable-eplb") == 0) {
    g.eplb.enable_eplb = 1;
  } else if (strcmp(name, "--eplb-config") == 0) {
    if (di_dist_parse_eplb_config(v, &g.eplb, err, sizeof err) != 0) {
      fprintf(stderr, "deepinfer: %s\n", err);
      return -1;
    }
  } else if (strcmp(name, "--dist-timeout") == 0) {
    char *end;
    g.timeout_s = strtod(v, &end);
    if (*end || !(g.timeout_s > 0) || g.timeout_s > 86400) {
      fprintf(stderr, "deepinfer: --dist-timeout: seconds in (0, 86400] expected, got '%s'\n", v);
      return -1;
    }
  } else { /* --data-parallel-size */
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 4096) {
      fprintf(stderr, "deepinfer: --data-parallel-size: an integer in [1, 4096] expected, got '%s'\n", v);
      return -1;
    }
    g.dp_size = (int)n;
  }
  memmove(argv + i, argv + i + 1 + nv, sizeof(char *) * (size_t)(*argc - i - 1 - nv + 1));
  *argc -= 1 + nv;
  return 1;
}

int di_dist_cli_setup(int *argc, char **argv) {
  char **orig = malloc(sizeof(char *) * (size_t)(*argc + 1)); /* for a relaunch under mpirun */
  if (!orig)
    return 1;
  memcpy(orig, argv, sizeof(char *) * (size_t)(*argc + 1));
  const int orig_argc = *argc;
  int rc = setup(argc, argv, orig_argc, orig);
  free(orig);
  return rc;
}

static int setup(int *argc, char **argv, int orig_argc, char **orig) {
  for (int i = 2; i < *argc;) {
    int r = take_flag(argc, argv, i);
    if (r < 0)
      return 2;
    if (r == 0)
      i++;
  }
  if (g.dp_size > 1 && strcmp(argv[1], "serve") && strcmp(argv[1], "generate") && strcmp(argv[1], "LLM")) {
    fprintf(stderr, "deepinfer: --data-parallel-size: for serve and generate (%s runs no engine; under mpirun every "
                    "rank runs it)\n", argv[1]);
    return 2;
  }
  if (g.eplb.enable_eplb && !g.expert_parallel) {
    fprintf(stderr, "deepinfer: --enable-eplb needs --enable-expert-parallel\n");
    return 2;
  }
  if (!(g.timeout_s > 0)) {
    const char *e = di_switch_get(DI_SW_DIST_TIMEOUT);
    g.timeout_s = e && atof(e) > 0 ? atof(e) : 60.0;
  }
  const char *f = di_switch_get(DI_SW_DIST_TEST_FAIL);
  if (f) {
    char mode[16] = "";
    if (sscanf(f, "%d:%d:%15s", &g.fail_rank, &g.fail_call, mode) != 3 ||
        (strcmp(mode, "kill") && strcmp(mode, "stall") && strcmp(mode, "oom"))) {
      fprintf(stderr, "deepinfer: DEEPINFER_DIST_TEST_FAIL: RANK:CALL:kill|stall|oom expected, got '%s'\n", f);
      return 2;
    }
    g.fail_stall = strcmp(mode, "stall") == 0;
    g.fail_oom = strcmp(mode, "oom") == 0;
  }
  if (!di_comm_launched_by_mpi() && g.dp_size > 1) /* this process becomes the launcher of the ranks */
    exit(di_dist_relaunch(g.dp_size, orig_argc, orig));
  if (!di_comm_launched_by_mpi()) {
    if (g.expert_parallel && di_comm_self_create(&g.comm) != DI_OK) {
      fprintf(stderr, "deepinfer: %s\n", di_last_error());
      return 1;
    }
    return 0;
  }
  if (di_comm_mpi_create(g.timeout_s, &g.comm) != DI_OK) {
    fprintf(stderr, "deepinfer: %s\n", di_last_error());
    return 1;
  }
  if (g.dp_size > 1 && g.comm->size != g.dp_size) {
    fprintf(stderr, "deepinfer: --data-parallel-size %d but mpirun started %d ranks\n", g.dp_size, g.comm->size);
    return 2;
  }
  if (g.dp_size > 1) { /* the launcher's stop request (launch.c): rank 0 handles it as Ctrl-C, workers wait for rank 0 */
    signal(SIGUSR1, g.comm->rank == 0 ? stop_as_interrupt : SIG_IGN);
    if (g.comm->rank != 0)
      signal(SIGINT, SIG_IGN);
  }
  if (g.comm->rank != 0) {
    if (!freopen("/dev/null", "w", stdout))
      fprintf(stderr, "deepinfer: rank %d: cannot silence stdout\n", g.comm->rank);
    for (int i = 2; i + 1 < *argc; i++)
      if (strcmp(argv[i], "--out") == 0)
        argv[i + 1] = (char *)"/dev/null";
    for (int i = 2; i < *argc; i++)
      if (strncmp(argv[i], "--out=", 6) == 0)
        argv[i] = (char *)"--out=/dev/null";
  }
  return 0;
}

int di_dist_cli_finish(int rc) {
  if (g.comm && g.comm->size > 1 && rc != 0) {
    char msg[96];
    snprintf(msg, sizeof msg, "the command failed with exit code %d on this rank", rc);
    di_comm_abort(g.comm, msg);
  }
  if (g.ep) { /* every rank is here: the summary's all-gather is safe */
    double imb = 1;
    if (di_ep_imbalance(g.ep, &imb, NULL) != DI_OK)
      di_dist_fail();
    if (g.comm->rank == 0)
      fprintf(stderr, "deepinfer: expert parallel: load imbalance %.3f (max / mean expert rows per rank), %d "
                      "rebalance%s, %.3f s in the exchange on rank 0\n",
              imb, di_ep_rebalances(g.ep), di_ep_rebalances(g.ep) == 1 ? "" : "s", di_ep_exchange_seconds(g.ep));
  }
  di_ep_destroy(g.ep);
  g.ep = NULL;
  if (g.comm && g.comm->size > 1 && di_comm_barrier(g.comm) != DI_OK)
    di_dist_fail();
  di_comm_destroy(g.comm);
  g.comm = NULL;
  return rc;
}

di_comm *di_dist_comm(void) { return g.comm; }
int di_dist_dp_size(void) { return g.dp_size > 1 ? g.dp_size : 1; }
di_ep *di_dist_ep_current(void) { return g.ep; }
int di_dist_expert_parallel(void) { return g.expert_parallel && g.comm; }
int di_dist_eplb_enabled(void) { return g.eplb.enable_eplb; }

di_status di_dist_ep_get(int n_layers, int n_experts, int hidden, int n_groups, int scratch_per_row, di_ep **out) {
  if (!di_dist_expert_parallel())
    return di_error_set(DI_ERR_INTERNAL, "expert parallel is off");
  if (!g.ep) {
    DI_TRY(di_ep_create(g.comm, n_layers, n_experts, hidden, n_groups, scratch_per_row, &g.eplb, &g.ep));
    g.ep_L = n_layers, g.ep_E = n_experts, g.ep_H = hidden;
    if (g.comm->rank == 0) {
      fprintf(stderr, "deepinfer: expert parallel over %d rank%s (%s): %d experts in %d slots", g.comm->size,
              g.comm->size > 1 ? "s" : "", g.comm->kind, n_experts, di_ep_slots(g.ep));
      if (g.eplb.enable_eplb)
        fprintf(stderr, ", EPLB every %d steps over the last %d", g.eplb.step_interval > 0 ? g.eplb.step_interval : 3000,
                g.eplb.window_size > 0 ? g.eplb.window_size : 1000);
      fprintf(stderr, "\n");
    }
  } else if (g.ep_L != n_layers || g.ep_E != n_experts || g.ep_H != hidden) {
    return di_error_set(DI_ERR_UNSUPPORTED, "expert parallel: one model per process (experts %d/%d, layers %d/%d)",
                        n_experts, g.ep_E, n_layers, g.ep_L);
  }
  di_dist_count_exchange();
  *out = g.ep;
  return DI_OK;
}

void di_dist_count_exchange(void) {
  g.calls++;
  if (!g.fail_oom && g.fail_rank == di_comm_rank(g.comm) && g.calls == g.fail_call) {
    fprintf(stderr, "deepinfer: rank %d: DEEPINFER_DIST_TEST_FAIL: %s at exchange %ld\n", g.fail_rank,
            g.fail_stall ? "stalling" : "killing itself", g.calls);
    fflush(stderr);
    if (g.fail_stall)
      for (;;)
        pause();
    raise(SIGKILL);
  }
}

void di_dist_fail(void) { di_comm_abort(g.comm, di_last_error()); }

int di_dist_test_fail_add(void) { return g.fail_oom && g.fail_rank == di_comm_rank(g.comm) && ++g.adds == g.fail_call; }
