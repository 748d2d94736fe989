/* See test_util.h. */
#include "test_util.h"
#include "deepinfer.h"
#include "util/json.h"
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int di_test_passed, di_test_failed;

const char *test_path(const char *rel) {
  static char buf[8][4096];
  static int k;
  const char *root = getenv("DI_SOURCE_DIR");
  char *b = buf[k++ & 7];
  snprintf(b, 4096, "%s/%s", root ? root : ".", rel);
  return b;
}

int test_finish(const char *name) {
  printf("%s: %d passed, %d failed\n", name, di_test_passed, di_test_failed);
  return di_test_failed ? 1 : 0;
}

int test_argmax(const float *v, int n) {
  int b = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[b])
      b = i;
  return b;
}

typedef struct {
  int (*fuzz_one)(const uint8_t *, size_t);
  const int *accepted;
  int ok, bad;
} replay_ok_bad_ctx;

static void replay_ok_bad_file(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  (void)rel;
  replay_ok_bad_ctx *c = ctx;
  c->fuzz_one((const uint8_t *)data, n);
  if (strncmp(name, "ok_", 3) == 0) {
    c->ok++;
    CHECKF(*c->accepted, "%s refused: %s", name, di_last_error());
  } else if (strncmp(name, "bad_", 4) == 0) {
    c->bad++;
    CHECKF(!*c->accepted, "%s was accepted", name);
  }
}

int test_replay_ok_bad(const char *rel_dir, int (*fuzz_one)(const uint8_t *, size_t), const int *accepted, int *ok,
                       int *bad) {
  replay_ok_bad_ctx c = {fuzz_one, accepted, 0, 0};
  const int files = test_for_each_file(rel_dir, replay_ok_bad_file, &c);
  *ok = c.ok, *bad = c.bad;
  return files;
}

static const char *replaying; /* the corpus file in the target now (test_fuzz_replay) */

static void replay_died(int sig) {
  if (replaying) {
    static const char pre[] = "test_fuzz_replay: the fuzz target died on ";
    (void)!write(2, pre, sizeof pre - 1);
    (void)!write(2, replaying, strlen(replaying));
    (void)!write(2, "\n", 1);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

static void replay_target_file(const char *name, const char *rel, const char *data, size_t n, void *ctx) {
  (void)name;
  union { void *p; int (*f)(const uint8_t *, size_t); } u = {ctx};
  replaying = rel;
  u.f((const uint8_t *)data, n);
  replaying = NULL;
}

int test_fuzz_replay(const char *rel_dir, int (*fuzz_one)(const uint8_t *, size_t)) {
  /* abort() and __builtin_trap() (the targets' verdicts); SIGSEGV is left to the sanitizers' reports */
  void (*old_abrt)(int) = signal(SIGABRT, replay_died), (*old_ill)(int) = signal(SIGILL, replay_died);
  union { int (*f)(const uint8_t *, size_t); void *p; } u = {fuzz_one};
  int n = test_for_each_file(rel_dir, replay_target_file, u.p);
  signal(SIGABRT, old_abrt);
  signal(SIGILL, old_ill);
  return n;
}

double test_rel_l2(const float *got, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (got[i] != got[i])
      return INFINITY;
    double d = (double)got[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * (double)ref[i];
  }
  return sqrt(num / (den > 0 ? den : 1));
}

int test_for_each_file(const char *rel_dir, test_file_fn fn, void *ctx) {
  DIR *d = opendir(test_path(rel_dir));
  CHECKF(d != NULL, "cannot open %s", rel_dir);
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    char rel[1024];
    snprintf(rel, sizeof rel, "%s/%s", rel_dir, e->d_name);
    char *buf;
    size_t len;
    if (di_read_file(test_path(rel), &buf, &len) != DI_OK)
      continue;
    fn(e->d_name, rel, buf, len, ctx);
    free(buf);
    n++;
  }
  closedir(d);
  return n;
}
