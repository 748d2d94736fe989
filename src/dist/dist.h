/* The process's place among the ranks: the communicator (MPI under mpirun, one local rank otherwise),
 * the distributed flags (vLLM's names) and the expert-parallel state the backends reach through
 * di_dist_ep. One per process, as MPI itself is: set up by the CLI before a command runs.
 *
 * Flags (any command; removed from argv before the command parses it):
 *   --enable-expert-parallel            routed experts sharded over the ranks
 *   --enable-eplb                       expert load balancing (redundant replicas of hot experts)
 *   --eplb-config JSON                  {"num_redundant_experts": R, "window_size": W, "step_interval": S}
 *   --dist-timeout SECONDS              limit for one collective (default 60; $DEEPINFER_DIST_TIMEOUT)
 *   --data-parallel-size N              attention data parallel over N ranks (serve, generate; dp_engine.h):
 *                                       outside mpirun the process relaunches itself under it (launch.c)
 * Rank 0 alone prints and writes outputs: on other ranks stdout goes to /dev/null and `--out FILE`
 * becomes /dev/null; stderr stays, so every rank can report its own failure. */
#ifndef DI_DIST_DIST_H
#define DI_DIST_DIST_H
#include "dist/comm.h"
#include "dist/ep.h"

/* Parses and strips the flags, starts MPI when launched by mpirun. Returns 0, or an exit code (2: a
 * bad flag, 1: the communicator could not start) after printing why. */
int di_dist_cli_setup(int *argc, char **argv);
/* After the command: rc != 0 on a multi-rank job ends every rank (the others would wait for this
 * one); otherwise tears down (MPI_Finalize). Returns rc. */
int di_dist_cli_finish(int rc);

di_comm *di_dist_comm(void);
/* --data-parallel-size (1 without it). */
int di_dist_dp_size(void);
/* Runs argv (this program's own arguments, argv[0] included) as `mpirun -np n` ranks and returns
 * their exit code (launch.c): finds mpirun on PATH (a clear error and 1 without it), sets OpenMPI's
 * run-as-root switches when root, forwards SIGINT / SIGTERM / SIGHUP to the job. */
int di_dist_relaunch(int n, int argc, char **argv);
int di_dist_expert_parallel(void);
int di_dist_eplb_enabled(void);
/* The expert-parallel state for a model of these shapes, created at the first call (collective-free). */
di_status di_dist_ep_get(int n_layers, int n_experts, int hidden, int n_groups, int scratch_per_row, di_ep **out);
/* One more MoE-layer exchange (di_dist_ep_get counts its callers' own; a backend that keeps the ep
 * calls this per exchange): where DEEPINFER_DIST_TEST_FAIL's rank kills itself or stalls. */
void di_dist_count_exchange(void);
/* The expert-parallel state once a forward created it, else NULL. */
di_ep *di_dist_ep_current(void);
/* Ends the job after a failed collective: prints di_last_error() on this rank and stops every rank. */
__attribute__((noreturn)) void di_dist_fail(void);
/* 1 when DEEPINFER_DIST_TEST_FAIL="RANK:CALL:oom" names this rank and this is its CALL-th request
 * taken as a data-parallel worker (the test of a worker's own out of memory); counts every call. */
int di_dist_test_fail_add(void);

/* Parses --eplb-config's JSON into cfg (other fields untouched); 0 or -1 with a message in err. */
int di_dist_parse_eplb_config(const char *json, di_ep_config *cfg, char *err, size_t err_len);
#endif
