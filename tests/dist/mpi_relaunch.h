/* For the multi-rank tests: re-executes this test binary under `mpirun --oversubscribe -np N`, with
 * OpenMPI's run-as-root switches (CI runs as root) and LeakSanitizer off for the ranks (Open MPI's
 * own allocations outlive MPI_Finalize). Returns 0 after printing why it skipped (no MPI in the
 * build, no mpirun), else only on exec failure (1). */
#ifndef DI_TESTS_MPI_RELAUNCH_H
#define DI_TESTS_MPI_RELAUNCH_H
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int mpi_relaunch(const char *self, const char *np, const char *name) {
#ifndef DI_HAVE_MPI
  (void)self, (void)np;
  printf("%s: %s-rank part skipped: built without MPI (Debian: libopenmpi-dev)\n", name, np);
  return 0;
#else
  if (system("command -v mpirun > /dev/null 2>&1") != 0) {
    printf("%s: %s-rank part skipped: mpirun not found (Debian: openmpi-bin)\n", name, np);
    return 0;
  }
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
  fflush(stdout);
  execlp("mpirun", "mpirun", "--oversubscribe", "-np", np, self, (char *)NULL);
  perror("exec mpirun");
  return 1;
#endif
}

/* The same as a child: runs `mpirun --oversubscribe -np N self arg` and returns its exit code (0 after
 * saying why when it skips), so one test can run several jobs. */
#include <sys/wait.h>
static inline int mpi_run(const char *self, const char *np, const char *name, const char *arg) {
  fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
#ifdef DI_HAVE_MPI
    if (system("command -v mpirun > /dev/null 2>&1") == 0) {
      setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
      setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
      setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
      execlp("mpirun", "mpirun", "--oversubscribe", "-np", np, self, arg, (char *)NULL);
      perror("exec mpirun");
      _exit(1);
    }
#endif
    _exit(mpi_relaunch(self, np, name)); /* says why it skips */
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid)
    return 1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
#endif
