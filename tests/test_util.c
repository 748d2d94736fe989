/* See test_util.h. */
#include "test_util.h"
#include "util/json.h"
#include <dirent.h>
#include <math.h>
#include <stdlib.h>

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
