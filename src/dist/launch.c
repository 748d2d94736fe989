/* `deepinfer serve|generate --data-parallel-size N` outside mpirun: the process becomes the launcher
 * of its ranks. It runs `mpirun --oversubscribe -np N <this binary> <the same arguments>` (Debian's
 * OpenMPI; the ranks inherit the environment, and see --data-parallel-size again, now under mpirun)
 * and waits for it. mpirun runs in its own process group, so a terminal's Ctrl-C reaches this
 * process alone, which turns SIGINT / SIGTERM / SIGHUP into a graceful stop of the ranks (see
 * forward()). The exit code is mpirun's, or 128 + the signal when one stopped a job that then
 * failed (as a killed process would report it). */
#include "dist/dist.h"
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t g_child = -1, g_signal;

/* the first signal asks for a graceful stop: SIGUSR1, which mpirun passes on to every rank (rank 0
 * takes it as SIGINT: `serve` shuts down and stops the workers; the workers ignore it); a second one
 * ends the job at once (SIGTERM to mpirun, which kills the ranks) */
static void forward(int sig) {
  const int first = g_signal == 0;
  if (first)
    g_signal = sig;
  if (g_child > 0)
    kill((pid_t)g_child, first ? SIGUSR1 : SIGTERM);
}

int di_dist_relaunch(int n, int argc, char **argv) {
  char mpirun[] = "mpirun", self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    fprintf(stderr, "deepinfer: --data-parallel-size: cannot find this program (/proc/self/exe): %s\n", strerror(errno));
    return 1;
  }
  self[len] = '\0';
  if (geteuid() == 0) { /* OpenMPI refuses root without both (CI runs as root) */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  char np[16];
  snprintf(np, sizeof np, "%d", n);
  char **av = calloc((size_t)argc + 6, sizeof(char *));
  if (!av) {
    fprintf(stderr, "deepinfer: out of memory\n");
    return 1;
  }
  int k = 0;
  av[k++] = mpirun;
  av[k++] = (char *)"--oversubscribe";
  av[k++] = (char *)"-np";
  av[k++] = np;
  av[k++] = self;
  for (int i = 1; i < argc; i++)
    av[k++] = argv[i];
  av[k] = NULL;
  fflush(NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  const pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "deepinfer: --data-parallel-size: fork: %s\n", strerror(errno));
    free(av);
    return 1;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* this launcher killed (SIGKILL): mpirun still ends the job */
    signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
    execvp(mpirun, av);
    if (errno == ENOENT)
      fprintf(stderr, "deepinfer: --data-parallel-size %d starts its ranks with mpirun, which is not on PATH (Debian: "
                      "apt-get install openmpi-bin)\n", n);
    else
      fprintf(stderr, "deepinfer: exec mpirun: %s\n", strerror(errno));
    _exit(1);
  }
  g_child = pid;
  free(av);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return rc != 0 && g_signal ? 128 + g_signal : rc;
}
