/* See test_util.h. */
#include "test_util.h"
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
