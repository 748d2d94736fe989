/* The op test table (backend/op_table.h) on the CUDA backend: every row within its bf16-operand bound
 * of the float64 reference, two seeds, both GEMM paths (the skinny kernels and cuBLASLt); the CPU
 * backend's runner on the same rows beside it. The V4 rows have no CUDA kernel yet and must answer
 * unsupported (rows_without_kernel: drop an op from it when its runner case lands). Built only with
 * nvcc; run on the device by scripts/device_tests.sh (stage "ops"). */
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/op_table.h"
#include "test_util.h"

/* rows of ops with no CUDA kernel yet (DeepSeek-V4's: issue 20 adds them, then their runner) */
static int rows_without_kernel(void) {
  int n = 0;
  for (int i = 0; i < di_n_op_cases; i++)
    n += di_op_cases[i].op == DI_OP_V4_HC || di_op_cases[i].op == DI_OP_V4_ROUTE || di_op_cases[i].op == DI_OP_V4_TOPK;
  return n;
}

int main(void) {
  if (!di_cut_device_ok()) {
    printf("no CUDA device: skipped\n");
    return test_finish("test_cuda_ops");
  }
  di_cu_blas *blas = NULL;
  CHECK(di_cu_blas_create(&blas) == DI_OK);
  for (int skinny = 1; skinny >= 0; skinny--) {
    di_cu_blas_set_skinny(blas, skinny);
    for (uint64_t seed = 1; seed <= 2; seed++) {
      di_op_report r = di_op_check(skinny ? "cuda" : "cublas", di_cuda_op_run, blas, 1, seed, seed == 1 ? stdout : NULL);
      CHECKF(r.passed == di_n_op_cases - rows_without_kernel() && r.failed == 0 && r.unsupported == rows_without_kernel(),
             "skinny %d seed %llu: %d passed, %d failed, %d unsupported of %d", skinny, (unsigned long long)seed,
             r.passed, r.failed, r.unsupported, r.run);
    }
  }
  di_op_report c = di_op_check("cpu", di_cpu_op_run, NULL, 0, 1, stdout);
  CHECK(c.passed == di_n_op_cases);
  di_cu_blas_destroy(blas);
  return test_finish("test_cuda_ops");
}
