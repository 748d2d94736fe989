/* Device helpers shared by the DeepSeek-V4 kernels (k_v4_dense.cu, k_v4_attn.cu): the launch check,
 * warp and CTA reductions (double, as the CPU's sums), a window row's place in the pool, and one rotary pair
 * rotated as di_v4_rope_apply does (float angle, cos / sin in double, attention factor). */
#ifndef DI_K_V4_COMMON_CUH
#define DI_K_V4_COMMON_CUH
#include "cuda_common.cuh"
#include <math.h>

#define V4_LAUNCH(what)                                                                              \
  do {                                                                                               \
    cudaError_t e_ = cudaGetLastError();                                                             \
    if (e_ != cudaSuccess)                                                                           \
      return di_error_set(DI_ERR_BACKEND, "cuda v4: launching %s failed: %s", what, cudaGetErrorString(e_)); \
  } while (0)

static __device__ __forceinline__ float warp_sum_f(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/* Sum over a CTA of blockDim.x (a multiple of 32, <= 1024) threads; every thread gets the total. */
static __device__ double block_sum_d(double v) {
  __shared__ double part[32];
  __shared__ double total;
  v = warp_sum_d(v);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    double x = lane < (int)(blockDim.x >> 5) ? part[lane] : 0;
    x = warp_sum_d(x);
    if (lane == 0) total = x;
  }
  __syncthreads();
  return total;
}

static __device__ double block_max_d(double v) {
  __shared__ double part[32];
  __shared__ double total;
  for (int o = 16; o > 0; o >>= 1) {
    const double u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    double x = lane < (int)(blockDim.x >> 5) ? part[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) {
      const double u = __shfl_xor_sync(0xffffffffu, x, o);
      x = u > x ? u : x;
    }
    if (lane == 0) total = x;
  }
  __syncthreads();
  return total;
}

#define V4K_BS 64 /* DI_KV_BLOCK_SIZE */
/* Window row p of layer l in the window pool's blocks of table tab. */
static __device__ __forceinline__ const float *window_row(const float *pool, const int32_t *tab, int n_layers, int l, int hd,
                                                          int64_t p) {
  return pool + (((size_t)tab[p / V4K_BS] * n_layers + l) * V4K_BS + (size_t)(p % V4K_BS)) * hd;
}

static __device__ __forceinline__ void rope_pair(float *r, int i, float inv_freq, int pos, float af, int sign) {
  const float f = (float)pos * inv_freq;
  const float c = (float)cos((double)f) * af, sn = sign * ((float)sin((double)f) * af);
  const float a = r[2 * i], b = r[2 * i + 1];
  r[2 * i] = a * c - b * sn;
  r[2 * i + 1] = b * c + a * sn;
}

#endif
