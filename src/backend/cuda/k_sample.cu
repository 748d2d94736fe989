/* Sampling on the GPU, one block per output row, with the CPU sampler's semantics
 * (src/sampler/sampler.c): greedy (temperature <= 0 or top_k == 1: the first maximal logit);
 * otherwise p_i = exp((l_i - max) / T) and, without truncation, the token where the running sum in
 * id order passes u * sum(p); with top-k / top-p / min-p, the survivors in descending-probability
 * order and the same running-sum draw over them. Only one token id per row leaves the device.
 * The survivors are found by radix selection on the probability's bits (k-th largest for top-k,
 * the mass threshold for top-p), then gathered (at most CAP) and sorted in shared memory so the
 * CPU's ordered logic runs exactly; a larger survivor set is drawn from by one more radix
 * selection (the token where the descending-order running mass passes u * total), which equals the
 * CPU's choice up to float summation order. The uniform draw is the sampler's counter-based
 * generator with stream 0 (di_sample_row has no stream). */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#define NT 1024
#define CAP 2048

static __host__ __device__ uint64_t fmix64(uint64_t x) {
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27; x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
/* == di_rng_uniform(seed, stream = 0, counter) of src/sampler/rng.c */
static __host__ __device__ double uniform01(uint64_t seed, uint64_t counter) {
  const uint64_t stream = 0;
  uint64_t k = fmix64(seed + 0x9e3779b97f4a7c15ULL);
  uint64_t x = fmix64(k ^ (stream * 0xd1342543de82ef95ULL + 0x632be59bd9b4e019ULL));
  x = fmix64(x ^ (counter + k));
  x = fmix64(x + 0x9e3779b97f4a7c15ULL * (counter ^ stream));
  return (double)(x >> 11) * (1.0 / 9007199254740992.0);
}

extern "C" double di_cuk_uniform(uint64_t seed, uint64_t counter) { return uniform01(seed, counter); }

struct Shared {
  float redf[32];
  int redi[32];
  double redd[32];
  unsigned int hist[256];
  float histm[256];
  double chunk[NT];
  float cp[CAP];
  int cid[CAP];
  int ncand;
  unsigned int prefix;
  float needf;
  int needi;
};

static __device__ double block_sum_d(double v, Shared &sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.redd[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < 32 ? sh.redd[threadIdx.x] : 0.0;
  if (threadIdx.x < 32)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x == 0) sh.redd[0] = v;
  __syncthreads();
  double r = sh.redd[0];
  __syncthreads();
  return r;
}

/* p_i of the row (0 for ids >= V) */
static __device__ __forceinline__ float prob(const float *l, int i, float mx, float inv_t) {
  float x = l[i];
  return x == -INFINITY || x != x ? 0.f : expf((x - mx) * inv_t);
}

/* This thread's share of the mass of the tokens with bits(p) >= lo. */
static __device__ double mass_from(const float *l, int V, float mx, float inv_t, unsigned int lo) {
  double m = 0;
  for (int i = threadIdx.x; i < V; i += NT) {
    float p = prob(l, i, mx, inv_t);
    if (p > 0.f && __float_as_uint(p) >= lo) m += p;
  }
  return m;
}

/* Radix selection (4 passes of 8 bits, from the top) over the tokens with bits(p) >= lo, in
 * descending order of p. by_mass = 0: the bits of the need_i-th largest p; by_mass = 1: the bits
 * of the token at which the running mass (descending order) reaches need_f (strict: passes it). */
static __device__ unsigned int radix_select(const float *l, int V, float mx, float inv_t, unsigned int lo,
                                            int by_mass, float need_f, int need_i, int strict, Shared &sh) {
  if (threadIdx.x == 0) { sh.prefix = 0; sh.needi = need_i; sh.needf = need_f; }
  for (int pass = 0; pass < 4; pass++) {
    const int shift = 24 - 8 * pass;
    for (int d = threadIdx.x; d < 256; d += NT) { sh.hist[d] = 0; sh.histm[d] = 0.f; }
    __syncthreads();
    const unsigned int pre = sh.prefix;
    const unsigned int hmask = pass == 0 ? 0u : (0xffffffffu << (shift + 8));
    for (int i = threadIdx.x; i < V; i += NT) {
      float p = prob(l, i, mx, inv_t);
      unsigned int b = __float_as_uint(p);
      if (p > 0.f && b >= lo && (b & hmask) == pre) {
        int d = (b >> shift) & 255;
        if (by_mass) atomicAdd(&sh.histm[d], p);
        else atomicAdd(&sh.hist[d], 1u);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = 255;
      if (!by_mass) {
        int need = sh.needi;
        for (; d > 0; d--) {
          if ((int)sh.hist[d] >= need) break;
          need -= sh.hist[d];
        }
        sh.needi = need;
      } else {
        float need = sh.needf;
        for (; d > 0; d--) {
          if (strict ? sh.histm[d] > need : sh.histm[d] >= need) break;
          need -= sh.histm[d];
        }
        sh.needf = need;
      }
      sh.prefix = pre | ((unsigned int)d << shift);
    }
    __syncthreads();
  }
  unsigned int r = sh.prefix;
  __syncthreads();
  return r < lo ? lo : r;
}

/* The argmax runs over a cluster of SAMPLE_CLUSTER CTAs per row (each a slice of the vocabulary;
 * CTA 0 takes the slices' results in slice order through distributed shared memory): one CTA alone
 * took ~14 us for a 129k vocabulary, most of a greedy decode step's time outside the forward pass.
 * The rest of the sampler (temperature, truncation, the draw) runs in CTA 0 only. */
#define SAMPLE_CLUSTER 8
static __device__ __forceinline__ void argmax_merge(float &bv, int &bi, float ov, int oi) {
  if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
}

static __global__ void __launch_bounds__(NT) sample_kernel(const float *logits, int Vfull,
                                                           const di_cuk_sample_row *rows, int32_t *out) {
  __shared__ Shared sh;
  __shared__ float slice_v[SAMPLE_CLUSTER];
  __shared__ int slice_i[SAMPLE_CLUSTER];
  DI_PDL_ENTRY();
  cg::cluster_group cl = cg::this_cluster();
  const int row = blockIdx.x / SAMPLE_CLUSTER, rank = (int)cl.block_rank();
  const di_cuk_sample_row rw = rows[row];
  const float *l = logits + (int64_t)row * Vfull;
  const int V = rw.vocab_limit > 0 && rw.vocab_limit < Vfull ? rw.vocab_limit : Vfull;
  const int tid = threadIdx.x;

  /* argmax, first index on ties; NaN counts as -inf: this CTA's slice, 4-float aligned */
  const int per = ((V + SAMPLE_CLUSTER - 1) / SAMPLE_CLUSTER + 3) & ~3;
  const int i0 = rank * per, i1 = min(V, i0 + per);
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = i0 + tid; i < i1; i += NT) {
    float x = l[i];
    if (x > bv) { bv = x; bi = i; }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    argmax_merge(bv, bi, ov, oi);
  }
  if ((tid & 31) == 0) { sh.redf[tid >> 5] = bv; sh.redi[tid >> 5] = bi; }
  __syncthreads();
  if (tid < 32) {
    bv = sh.redf[tid]; bi = sh.redi[tid];
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      argmax_merge(bv, bi, ov, oi);
    }
    if (tid == 0) {
      *cl.map_shared_rank(&slice_v[rank], 0) = bv;
      *cl.map_shared_rank(&slice_i[rank], 0) = bi;
    }
  }
  cl.sync(); /* every slice's result is in CTA 0 */
  if (rank != 0) return;
  if (tid == 0) {
    bv = slice_v[0]; bi = slice_i[0];
    for (int r = 1; r < SAMPLE_CLUSTER; r++) argmax_merge(bv, bi, slice_v[r], slice_i[r]);
    sh.redf[0] = bv; sh.redi[0] = bi;
  }
  __syncthreads();
  const float mx = sh.redf[0];
  const int best = sh.redi[0] == 0x7fffffff ? 0 : sh.redi[0];
  if (!(rw.temperature > 0.f) || rw.top_k == 1 || mx == -INFINITY) {
    if (tid == 0) out[row] = best;
    return;
  }
  const float inv_t = (float)(1.0 / (double)rw.temperature);
  const double u = uniform01(rw.seed, rw.counter);
  const int use_k = rw.top_k > 0 && rw.top_k < V;
  const int trunc = use_k || rw.top_p < 1.f || rw.min_p > 0.f;
  /* the CPU sampler sorts only for top-k / top-p; min-p alone keeps id order */
  const int sorted_order = use_k || rw.top_p < 1.f;

  double zs = 0;
  for (int i = tid; i < V; i += NT) zs += prob(l, i, mx, inv_t);
  const double z = block_sum_d(zs, sh);

  /* survivors: p >= tau (bits of p; positive floats order like their bits) */
  unsigned int tau = 1; /* smallest positive float: every p > 0 */
  if (use_k) tau = radix_select(l, V, mx, inv_t, 1u, 0, 0.f, rw.top_k, 0, sh);
  /* the exact (sorted) path below redoes top-p and min-p itself from the top-k survivors; without
   * top-k it takes the survivors of every cut */
  const unsigned int tau_k = tau;
  if (rw.top_p < 1.f) {
    double zk = use_k ? block_sum_d(mass_from(l, V, mx, inv_t, tau), sh) : z;
    tau = radix_select(l, V, mx, inv_t, tau, 1, (float)(rw.top_p * zk), 0, 0, sh);
  }
  if (rw.min_p > 0.f) {
    unsigned int tm = __float_as_uint(rw.min_p); /* the most probable token has p = 1 */
    if (tm > tau) tau = tm;
  }
  if (tid == 0) sh.ncand = 0;
  __syncthreads();
  if (sorted_order) {
    for (int i = tid; i < V; i += NT) {
      float p = prob(l, i, mx, inv_t);
      if (__float_as_uint(p) >= (use_k ? tau_k : tau) && p > 0.f) {
        int j = atomicAdd(&sh.ncand, 1);
        if (j < CAP) { sh.cp[j] = p; sh.cid[j] = i; }
      }
    }
    __syncthreads();
  }
  const int nc = sh.ncand;
  if (sorted_order && nc <= CAP) {
    /* bitonic sort of the survivors: p descending, id ascending */
    int n2 = 1;
    while (n2 < nc) n2 <<= 1;
    for (int i = nc + tid; i < n2; i += NT) { sh.cp[i] = -1.f; sh.cid[i] = 0x7fffffff; }
    __syncthreads();
    for (int k = 2; k <= n2; k <<= 1)
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int i = tid; i < n2; i += NT) {
          int ixj = i ^ j;
          if (ixj > i) {
            float pa = sh.cp[i], pb = sh.cp[ixj];
            int ia = sh.cid[i], ib = sh.cid[ixj];
            bool a_first = pa > pb || (pa == pb && ia < ib);
            bool up = (i & k) == 0;
            if (up != a_first) {
              sh.cp[i] = pb; sh.cp[ixj] = pa; sh.cid[i] = ib; sh.cid[ixj] = ia;
            }
          }
        }
        __syncthreads();
      }
    if (tid == 0) {
      int n = nc;
      double zz = z;
      if (use_k) {
        if (n > rw.top_k) n = rw.top_k;
        zz = 0;
        for (int i = 0; i < n; i++) zz += sh.cp[i];
      }
      if (rw.top_p < 1.f && use_k) { /* without top-k the candidates are the nucleus already */
        double acc = 0, need = rw.top_p * zz;
        for (int i = 0; i < n; i++) {
          acc += sh.cp[i];
          if (acc >= need) { n = i + 1; break; }
        }
      }
      if (rw.min_p > 0.f) {
        int m = 0;
        for (int i = 0; i < n; i++)
          if (sh.cp[i] >= rw.min_p * 1.f) { sh.cp[m] = sh.cp[i]; sh.cid[m] = sh.cid[i]; m++; }
        n = m;
      }
      double tot = 0;
      for (int i = 0; i < n; i++) tot += sh.cp[i];
      double target = u * tot, acc = 0;
      int tok = n > 0 ? sh.cid[n - 1] : best;
      for (int i = 0; i < n; i++) {
        acc += sh.cp[i];
        if (acc > target) { tok = sh.cid[i]; break; }
      }
      out[row] = tok;
    }
    return;
  }
  if (sorted_order) {
    /* more survivors than fit in shared memory: the draw in descending-probability order, by radix
     * selection of the token where the running mass passes u * tot (ties: the lowest id) */
    const double tot = block_sum_d(mass_from(l, V, mx, inv_t, tau), sh);
    const unsigned int key = radix_select(l, V, mx, inv_t, tau, 1, (float)(u * tot), 0, 1, sh);
    if (tid == 0) sh.redi[0] = 0x7fffffff;
    __syncthreads();
    for (int i = tid; i < V; i += NT) {
      float p = prob(l, i, mx, inv_t);
      if (p > 0.f && __float_as_uint(p) == key) atomicMin(&sh.redi[0], i);
    }
    __syncthreads();
    if (tid == 0) out[row] = sh.redi[0] == 0x7fffffff ? best : sh.redi[0];
    return;
  }
  /* id-order draw over the survivors p >= tau (all p > 0 without truncation; min-p alone keeps id
   * order too): chunked prefix sums */
  const int chunk = (V + NT - 1) / NT;
  const int c0 = tid * chunk, c1 = min(V, c0 + chunk);
  double cs = 0;
  for (int i = c0; i < c1; i++) {
    float p = prob(l, i, mx, inv_t);
    if (p > 0.f && __float_as_uint(p) >= tau) cs += p;
  }
  sh.chunk[tid] = cs;
  __syncthreads();
  if (tid == 0) {
    double acc = 0;
    for (int t = 0; t < NT; t++) { double v = sh.chunk[t]; sh.chunk[t] = acc; acc += v; }
    sh.redd[0] = acc;
  }
  __syncthreads();
  const double target = u * (trunc ? sh.redd[0] : z);
  const double before = sh.chunk[tid];
  if (tid == 0) sh.redi[0] = -1;
  __syncthreads();
  if (before <= target && before + cs > target) {
    double acc = before;
    for (int i = c0; i < c1; i++) {
      float p = prob(l, i, mx, inv_t);
      if (!(p > 0.f && __float_as_uint(p) >= tau)) continue;
      acc += p;
      if (acc > target) { atomicMax(&sh.redi[0], i); break; }
    }
  }
  __syncthreads();
  if (tid == 0) {
    int tok = sh.redi[0];
    if (tok < 0) { /* rounding left target past the end: the last survivor */
      for (int i = V - 1; i >= 0; i--) {
        float p = prob(l, i, mx, inv_t);
        if (p > 0.f && __float_as_uint(p) >= tau) { tok = i; break; }
      }
    }
    out[row] = tok < 0 ? best : tok;
  }
}

extern "C" di_status di_cuk_sample(const float *logits, int n, int V, const di_cuk_sample_row *rows,
                                   int32_t *out, di_cu_stream s) {
  if (n <= 0) return DI_OK;
  DI_CU(di_launch_cluster(sample_kernel, n * SAMPLE_CLUSTER, NT, 0, s, SAMPLE_CLUSTER, logits, V, rows, out));
  DI_CU_LAUNCH("sample");
  return DI_OK;
}
