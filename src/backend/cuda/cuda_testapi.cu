/* Plain-C helpers over the CUDA runtime for the GPU tests and benchmarks, so their C sources need
 * no CUDA headers: device allocation, copies, synchronization and a wall clock. */
#include "cuda_common.cuh"
#include "cuda_kernels.h"
#include <time.h>

extern "C" void *di_cut_malloc(size_t bytes) {
  void *p = NULL;
  return cudaMalloc(&p, bytes ? bytes : 16) == cudaSuccess ? p : NULL;
}
extern "C" void di_cut_free(void *p) { if (p) cudaFree(p); }
extern "C" int di_cut_h2d(void *dst, const void *src, size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}
extern "C" int di_cut_d2h(void *dst, const void *src, size_t bytes) {
  return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}
extern "C" int di_cut_sync(void) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { fprintf(stderr, "cuda: %s\n", cudaGetErrorString(e)); return -1; }
  e = cudaGetLastError();
  if (e != cudaSuccess) { fprintf(stderr, "cuda: %s\n", cudaGetErrorString(e)); return -1; }
  return 0;
}
extern "C" int di_cut_device_ok(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
extern "C" int di_cut_mem_info(size_t *free_bytes, size_t *total_bytes) {
  cudaDeviceSynchronize();
  return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : -1;
}
extern "C" double di_cut_time_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
