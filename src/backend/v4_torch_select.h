/* torch.topk's selection procedure on (value, index) pairs, shared by the CPU V4 ops (di_v4_topk_like_torch:
 * the router and the indexer's torch-tie mode) and the CUDA router (k_v4_dense.cu), so that both pick the
 * same experts when biased router scores are exactly equal.
 *
 * Which of several equal scores torch.topk keeps is an artefact of its CPU algorithm: with k*64 <= n a
 * heap select of the first k, otherwise an introselect (median-of-three quickselect, insertion sort below
 * four elements, heap select when the depth budget 2*floor(log2 n) runs out), ordering by value only.
 * Checked against torch.topk on thousands of tie-heavy random rows by tests/data/tools/v4_topk_ties.py.
 * Header-only (static inline, __host__ __device__ under nvcc); no library calls, so it runs on the device. */
#ifndef DI_V4_TORCH_SELECT_H
#define DI_V4_TORCH_SELECT_H

#ifdef __CUDACC__
#define DI_V4S_FN static inline __host__ __device__
#else
#define DI_V4S_FN static inline
#endif

typedef struct {
  float v;
  int i;
} di_v4_scored;

DI_V4S_FN int di_v4s_before(const di_v4_scored *x, const di_v4_scored *y) { return x->v > y->v; }
DI_V4S_FN void di_v4s_swap(di_v4_scored *a, di_v4_scored *b) {
  di_v4_scored t = *a;
  *a = *b;
  *b = t;
}

/* Sifts `val` into the max-first heap a[0..len) from the hole at `hole`: down to a leaf, then up. */
DI_V4S_FN void di_v4s_heap_adjust(di_v4_scored *a, long hole, long len, di_v4_scored val) {
  const long top = hole;
  long child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (di_v4s_before(&a[child], &a[child - 1]))
      child--;
    a[hole] = a[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    a[hole] = a[child - 1];
    hole = child - 1;
  }
  long parent = (hole - 1) / 2;
  while (hole > top && di_v4s_before(&a[parent], &val)) {
    a[hole] = a[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  a[hole] = val;
}

/* Leaves in a[0..k) the k best of a[0..n): a heap of the first k whose worst is replaced by any better later element. */
DI_V4S_FN void di_v4s_heap_select(di_v4_scored *a, long k, long n) {
  if (k >= 2)
    for (long parent = (k - 2) / 2;; parent--) {
      di_v4s_heap_adjust(a, parent, k, a[parent]);
      if (parent == 0)
        break;
    }
  for (long i = k; i < n; i++)
    if (di_v4s_before(&a[i], &a[0])) {
      di_v4_scored v = a[i];
      a[i] = a[0];
      di_v4s_heap_adjust(a, 0, k, v);
    }
}

DI_V4S_FN void di_v4s_insertion_sort(di_v4_scored *a, long n) {
  for (long i = 1; i < n; i++) {
    di_v4_scored v = a[i];
    if (di_v4s_before(&v, &a[0])) {
      for (long j = i; j > 0; j--) /* memmove(a + 1, a, i elements) */
        a[j] = a[j - 1];
      a[0] = v;
    } else {
      long j = i;
      while (di_v4s_before(&v, &a[j - 1])) {
        a[j] = a[j - 1];
        j--;
      }
      a[j] = v;
    }
  }
}

/* Puts the element of rank `nth` at a[nth], better ones before it, worse ones after. */
DI_V4S_FN void di_v4s_introselect(di_v4_scored *a, long nth, long n) {
  long lo = 0, hi = n, depth = 0;
  for (long m = n; m > 1; m >>= 1)
    depth += 2;
  while (hi - lo > 3) {
    if (depth-- == 0) {
      di_v4s_heap_select(a + lo, nth - lo + 1, hi - lo);
      di_v4s_swap(&a[lo], &a[nth]);
      return;
    }
    /* median of a[lo+1], a[mid], a[hi-1] moved to a[lo] as the pivot */
    di_v4_scored *x = &a[lo + 1], *y = &a[lo + (hi - lo) / 2], *z = &a[hi - 1], *med;
    if (di_v4s_before(x, y))
      med = di_v4s_before(y, z) ? y : di_v4s_before(x, z) ? z : x;
    else
      med = di_v4s_before(x, z) ? x : di_v4s_before(y, z) ? z : y;
    di_v4s_swap(&a[lo], med);
    long f = lo + 1, l = hi;
    for (;;) {
      while (di_v4s_before(&a[f], &a[lo]))
        f++;
      l--;
      while (di_v4s_before(&a[lo], &a[l]))
        l--;
      if (f >= l)
        break;
      di_v4s_swap(&a[f], &a[l]);
      f++;
    }
    if (f <= nth)
      lo = f;
    else
      hi = f;
  }
  di_v4s_insertion_sort(a + lo, hi - lo);
}

/* work[0..n) holds (value, index) pairs; afterwards work[0..k) are the k entries torch.topk returns for
 * those values (in no particular order). */
DI_V4S_FN void di_v4s_select_pairs(di_v4_scored *work, int n, int k) {
  if ((long)k * 64 <= n)
    di_v4s_heap_select(work, k, n);
  else
    di_v4s_introselect(work, k - 1, n);
}
/* The same on v[0..n) with indices 0..n-1. */
DI_V4S_FN void di_v4s_select(const float *v, int n, int k, di_v4_scored *work) {
  for (int i = 0; i < n; i++) {
    work[i].v = v[i];
    work[i].i = i;
  }
  di_v4s_select_pairs(work, n, k);
}
#endif
