/* Sorting non-negative int32 arrays, the grammar automaton's stack sets and token lists: small ones
 * by insertion (no call per comparison, as qsort makes), larger ones by a least-significant-digit
 * radix sort over the bytes that the largest value uses (stable, linear, needs a scratch array of n).
 * Values must be >= 0. */
#ifndef DI_UTIL_SORT_I32_H
#define DI_UTIL_SORT_I32_H
#include <stdint.h>
#include <string.h>

enum { DI_SORT_I32_SMALL = 32 }; /* at most this many: insertion sort, no scratch used */

static inline void di_sort_i32_small(int32_t *v, int n) {
  for (int i = 1; i < n; i++) {
    const int32_t x = v[i];
    int j = i;
    for (; j > 0 && v[j - 1] > x; j--)
      v[j] = v[j - 1];
    v[j] = x;
  }
}

/* Sorts v[0..n) ascending; tmp must hold n elements when n > DI_SORT_I32_SMALL. */
static inline void di_sort_i32(int32_t *v, int n, int32_t *tmp) {
  if (n <= DI_SORT_I32_SMALL) {
    di_sort_i32_small(v, n);
    return;
  }
  uint32_t most = 0;
  for (int i = 0; i < n; i++)
    most |= (uint32_t)v[i];
  int32_t *src = v, *dst = tmp;
  for (int shift = 0; shift < 32 && (most >> shift) != 0; shift += 8) {
    int count[257] = {0};
    for (int i = 0; i < n; i++)
      count[(((uint32_t)src[i] >> shift) & 0xFF) + 1]++;
    for (int b = 0; b < 256; b++)
      count[b + 1] += count[b];
    for (int i = 0; i < n; i++)
      dst[count[((uint32_t)src[i] >> shift) & 0xFF]++] = src[i];
    int32_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != v)
    memcpy(v, src, sizeof *v * (size_t)n);
}
#endif
