/* Growing a heap array by doubling: the one helper behind the project's dynamic arrays. */
#ifndef DI_UTIL_GROW_H
#define DI_UTIL_GROW_H
#include <stdlib.h>

/* Makes *p hold at least `need` elements of `elsize` bytes (capacity *cap, starting at `first` and
 * doubling). Returns 1, or 0 on out-of-memory with *p and *cap unchanged. */
static inline int di_grow(void **p, int *cap, int need, size_t elsize, int first) {
  if (need <= *cap)
    return 1;
  int nc = *cap ? *cap : first;
  while (nc < need)
    nc *= 2;
  void *q = realloc(*p, (size_t)nc * elsize);
  if (!q)
    return 0;
  *p = q;
  *cap = nc;
  return 1;
}
#endif
