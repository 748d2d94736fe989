/* Launch policy shared by the kernels (used by di_launch in cuda_common.cuh): whether programmatic
 * dependent launch is on (DEEPINFER_CUDA_PDL=0 turns it off, for A/B measurements and as a fallback),
 * and the one shared-memory carveout every kernel is given, set once per kernel. */
#include "cuda_common.cuh"
#include "util/switches.h"
#include <pthread.h>
#include <stdlib.h>

int di_cu_pdl_enabled(void) {
  static int on = -1; /* read once; a benign race writes the same value */
  if (on < 0) {
    on = di_switch_bool(DI_SW_CUDA_PDL, 1);
  }
  return on;
}

#define MAX_KERNELS 512
static const void *g_seen[MAX_KERNELS];
static int g_n_seen, g_carveout = -2;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

void di_cu_kernel_setup(const void *kernel) {
  if (g_carveout == -1) return; /* the driver's choice: nothing to do */
  /* seen already (the common case): no lock; entries are written once, before g_n_seen counts them */
  const int n = __atomic_load_n(&g_n_seen, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++)
    if (g_seen[i] == kernel) return;
  pthread_mutex_lock(&g_mu);
  if (g_carveout == -2) {
    /* default 100 (all shared): measured 343 vs 336 tok/s at batch 1 on the V2-Lite shape; the
     * kernels that stream weights bypass L1 anyway. "-1": leave it to the driver. */
    const char *e = di_switch_get(DI_SW_CUDA_CARVEOUT);
    g_carveout = !e ? 100 : atoi(e) >= 0 && atoi(e) <= 100 ? atoi(e) : -1;
  }
  int seen = g_carveout < 0;
  for (int i = 0; i < g_n_seen && !seen; i++) seen = g_seen[i] == kernel;
  if (!seen && g_n_seen < MAX_KERNELS) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, g_carveout);
    g_seen[g_n_seen] = kernel;
    __atomic_store_n(&g_n_seen, g_n_seen + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_mu);
}

int di_cu_cluster_fits(const void *kernel, int cluster, int threads, size_t smem) {
  if (cluster > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  /* the kernel's dynamic shared memory limit is raised to smem, never lowered: its launches of a larger
   * shape set it before they run and must not find it cut down by a check of a smaller one */
  cudaFuncAttributes fa;
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess ||
      ((size_t)fa.maxDynamicSharedSizeBytes < smem &&
       cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)) {
    cudaGetLastError();
    return 0;
  }
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = (unsigned)cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.gridDim = dim3((unsigned)cluster);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n >= 1;
}
