/* Warming L2 with weights a later kernel of the step will stream, while the kernels in between are
 * latency-bound and leave DRAM idle. At batch 1 a decode layer's attention, o_proj and MoE gate read
 * ~25 MB in ~20 us (DRAM mostly idle), then the experts stream ~140 MB at full bandwidth; the shared
 * experts' weights are known before routing, so this kernel, placed early in the layer, moves them
 * into L2 during the idle stretch and the expert kernels then stream only the routed experts from
 * DRAM. It is a link of the PDL chain: it lets its successor launch first (that one's own pre-wait
 * prefetch keeps its window), issues its prefetches, then waits for its predecessor, so the chain's
 * ordering (every kernel's wait covers all earlier kernels) is kept. evict_last keeps the lines
 * through the routed experts' streaming; lines are 128 B. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"

#define PF_THREADS 256

static __global__ void __launch_bounds__(PF_THREADS)
l2_prefetch_kernel(di_cuk_span s0, di_cuk_span s1, int evict_last) {
  di_pdl_trigger();
  const int64_t stride = (int64_t)gridDim.x * PF_THREADS * 128;
  const int64_t first = ((int64_t)blockIdx.x * PF_THREADS + threadIdx.x) * 128;
  for (int k = 0; k < 2; k++) {
    const di_cuk_span sp = k ? s1 : s0;
    const char *p = (const char *)sp.ptr;
    for (int64_t o = first; o < (int64_t)sp.bytes; o += stride) {
      if (evict_last) asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(p + o));
      else asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + o));
    }
  }
  di_pdl_wait();
}

extern "C" di_status di_cuk_l2_prefetch(di_cuk_span s0, di_cuk_span s1, int ctas, int evict_last, di_cu_stream s) {
  if (ctas <= 0 || (!s0.bytes && !s1.bytes)) return DI_OK;
  DI_CU(di_launch(l2_prefetch_kernel, ctas, PF_THREADS, 0, s, s0, s1, evict_last));
  DI_CU_LAUNCH("l2_prefetch");
  return DI_OK;
}
