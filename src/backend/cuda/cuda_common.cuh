/* Shared helpers of the CUDA backend's .cu files: C headers of the project included with C
 * linkage, the error-check macro that turns a CUDA failure into a di_status with a message, and
 * bf16 <-> float conversions used by every kernel. */
#ifndef DI_CUDA_COMMON_CUH
#define DI_CUDA_COMMON_CUH
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
extern "C" {
#include "util/status.h"
}

#define DI_CU(call)                                                                      \
  do {                                                                                   \
    cudaError_t di_cu_e_ = (call);                                                       \
    if (di_cu_e_ != cudaSuccess)                                                         \
      return di_error_set(DI_ERR_BACKEND, "cuda: %s failed: %s (%s:%d)", #call,           \
                          cudaGetErrorString(di_cu_e_), __FILE__, __LINE__);             \
  } while (0)

/* After a kernel launch: launch-configuration errors surface here, not at the next sync. */
#define DI_CU_LAUNCH(what)                                                               \
  do {                                                                                   \
    cudaError_t di_cu_e_ = cudaGetLastError();                                           \
    if (di_cu_e_ != cudaSuccess)                                                         \
      return di_error_set(DI_ERR_BACKEND, "cuda: launching %s failed: %s", what,          \
                          cudaGetErrorString(di_cu_e_));                                 \
  } while (0)

typedef __nv_bfloat16 bf16;

/* Programmatic dependent launch (Hopper): every kernel of the forward pass is launched with
 * di_launch, which lets the next kernel of the stream start while this one drains, and begins with
 * DI_PDL_ENTRY: wait until the previous kernel has finished and its writes are visible, then allow
 * the next kernel to be scheduled. Nothing may be read from earlier kernels' outputs, or written at
 * all, before the wait; what a kernel may do before it is prefetch weights, which no kernel writes.
 * This hides the launch gap and the ramp-up of each of the ~10 kernels a decode layer takes (in
 * a CUDA graph as well: capture keeps the programmatic edges). DEEPINFER_CUDA_PDL=0 turns it off. */
static __device__ __forceinline__ void di_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void di_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}
#define DI_PDL_ENTRY() \
  do {                 \
    di_pdl_wait();     \
    di_pdl_trigger();  \
  } while (0)
/* A 16-byte load of data no kernel writes (weights), not kept in L1, as a volatile asm so that a
 * group of them is issued back to back (memory-level parallelism for weight streaming). */
static __device__ __forceinline__ uint4 di_ld_stream16(const void *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
/* L2 prefetch of one line holding p (weights only: see above). */
static __device__ __forceinline__ void di_prefetch_l2(const void *p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

int di_cu_pdl_enabled(void); /* cuda_launch.cu: DEEPINFER_CUDA_PDL, default on */
/* cuda_launch.cu: once per kernel, the carveout preference (DEEPINFER_CUDA_CARVEOUT=N, percent of
 * the unified L1/shared memory as shared; default 100, -1: the driver's choice). One carveout for every kernel
 * keeps an SM from draining to reconfigure between kernels of different shared-memory needs. */
void di_cu_kernel_setup(const void *kernel);
/* cuda_launch.cu: whether clusters of `cluster` CTAs of this kernel (threads, dynamic shared memory)
 * can be placed at all (the occupancy calculator; > 8 CTAs is non-portable); sets both attributes. */
int di_cu_cluster_fits(const void *kernel, int cluster, int threads, size_t smem);

/* kernel<<<grid, block, smem, s>>>(args...) with the programmatic-serialization attribute, and with
 * thread-block clusters of cluster_x CTAs along x when cluster_x > 1 (grid.x a multiple of it). */
template <typename... KArgs, typename... Args>
static inline cudaError_t di_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                            int cluster_x, Args... args) {
  cudaLaunchConfig_t cfg;
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = di_cu_pdl_enabled();
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = (unsigned)cluster_x;
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cluster_x > 1 ? 2 : 1;
  di_cu_kernel_setup((const void *)kernel);
  return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t di_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                                    Args... args) {
  return di_launch_cluster(kernel, grid, block, smem, s, 1, args...);
}

static __device__ __forceinline__ float di_bf(bf16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16 di_fb(float x) { return __float2bfloat16(x); }

static inline int di_cdiv(int a, int b) { return (a + b - 1) / b; }

/* Block-wide sum of one float per thread (blockDim.x a multiple of 32, <= 1024). */
static __device__ __forceinline__ float di_block_sum(float v, float *scratch32) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) scratch32[w] = v;
  __syncthreads();
  v = l < nw ? scratch32[l] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
static __device__ __forceinline__ float di_block_max(float v, float *scratch32) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads();
  if (l == 0) scratch32[w] = v;
  __syncthreads();
  v = l < nw ? scratch32[l] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sixteen per-lane partial sums of a warp reduced to sixteen totals with 15 shuffles: each step, lanes
 * whose bit `off` is set keep the upper half of their values, the others the lower half, each adding
 * the partner's copy of the half it keeps; afterwards lane l holds the total of value l >> 1. */
#define DI_HALVE(half, off)                                                            \
  {                                                                                    \
    const bool upper = (lane & (off)) != 0;                                            \
    _Pragma("unroll") for (int i = 0; i < (half); i++) {                               \
      float send = upper ? v[i] : v[i + (half)], keep = upper ? v[i + (half)] : v[i]; \
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, (off));                         \
    }                                                                                  \
  }
static __device__ __forceinline__ float di_warp_sum16(float v[16], int lane) {
  DI_HALVE(8, 16) DI_HALVE(4, 8) DI_HALVE(2, 4) DI_HALVE(1, 2)
  return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1); /* the sum of row lane >> 1 */
}
#undef DI_HALVE


/* mma.sync m16n8k16 bf16 -> f32 and ldmatrix, the building blocks of the tensor-core kernels
 * (grouped expert GEMM, MLA attention). Fragment layouts are the PTX ISA's: for the accumulator,
 * thread `lane` holds rows lane/4 and lane/4+8, columns 2*(lane%4) and +1. */
static __device__ __forceinline__ void di_mma16816(float *c, const uint32_t *a, const uint32_t *b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void di_ldsm_x4(uint32_t *r, const void *p) {
  uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
static __device__ __forceinline__ void di_ldsm_x4_t(uint32_t *r, const void *p) {
  uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
static __device__ __forceinline__ void di_cp_async16(void *smem, const void *gmem, bool pred) {
  uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
  int n = pred ? 16 : 0; /* src-size 0 fills the 16 bytes with zeros */
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
static __device__ __forceinline__ void di_cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void di_cp_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
static __device__ __forceinline__ uint32_t di_pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(uint32_t *)&v;
}
#endif
