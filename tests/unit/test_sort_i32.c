/* src/util/sort_i32.h against qsort: random arrays of every size up to 2,000 (both sides of the
 * insertion-sort bound), values in small and full non-negative ranges, duplicates, sorted and
 * reversed input; the result must equal qsort's element for element. */
#include <stdlib.h>
#include <string.h>
#include "test_util.h"
#include "util/sort_i32.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

static int cmp(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return x < y ? -1 : x > y;
}

int main(void) {
  enum { MAXN = 2000 };
  static int32_t v[MAXN], want[MAXN], tmp[MAXN];
  const uint32_t ranges[] = {1, 7, 256, 65536, 1u << 24, 0x7FFFFFFFu};
  int mismatched = 0;
  for (int n = 0; n <= MAXN; n += n < 80 ? 1 : 37)
    for (int r = 0; r < 6; r++)
      for (int shape = 0; shape < 3; shape++) {
        for (int i = 0; i < n; i++)
          v[i] = (int32_t)(rnd() % ranges[r]);
        if (shape == 1)
          qsort(v, (size_t)n, sizeof *v, cmp);
        for (int i = 0; shape == 2 && i < n / 2; i++) { /* reversed */
          int32_t t = v[i];
          v[i] = v[n - 1 - i];
          v[n - 1 - i] = t;
        }
        memcpy(want, v, sizeof *v * (size_t)n);
        qsort(want, (size_t)n, sizeof *want, cmp);
        di_sort_i32(v, n, tmp);
        if (memcmp(v, want, sizeof *v * (size_t)n) != 0 && mismatched++ < 5)
          fprintf(stderr, "n %d range %u shape %d: differs from qsort\n", n, ranges[r], shape);
        CHECK(memcmp(v, want, sizeof *v * (size_t)n) == 0);
      }
  CHECK(mismatched == 0);
  return test_finish("test_sort_i32");
}
