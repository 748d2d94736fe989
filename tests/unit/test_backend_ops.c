/* The op test table (backend/op_table.h) on the CPU backend: every row within its f32 bound of the
 * float64 reference, with 1 and 2 threads, two seeds; and the check must be able to fail: a runner that
 * perturbs one output by a part in a thousand fails every row. */
#include "backend/cpu/cpu_ops.h"
#include "backend/op_table.h"
#include "util/threadpool.h"
#include "test_util.h"
#include <math.h>

static di_status perturbed(void *ctx, const di_op_data *d, float *out) {
  di_status st = di_cpu_op_run(ctx, d, out);
  double mx = 0;
  for (int64_t i = 0; i < d->n_out; i++) mx = fabs(d->ref[i]) > mx ? fabs(d->ref[i]) : mx;
  out[d->n_out / 2] += (float)(mx * 0.05 + 1e-3);
  return st;
}

int main(void) {
  CHECK(di_n_op_cases >= 10);
  for (int threads = 1; threads <= 2; threads++)
    for (uint64_t seed = 1; seed <= 2; seed++) {
      di_threadpool *tp = NULL;
      CHECK(di_threadpool_create(threads, &tp) == DI_OK);
      di_op_report r = di_op_check("cpu", di_cpu_op_run, tp, 0, seed, threads == 1 && seed == 1 ? stdout : NULL);
      CHECKF(r.passed == di_n_op_cases && r.failed == 0 && r.unsupported == 0,
             "threads %d seed %llu: %d passed, %d failed, %d unsupported of %d", threads, (unsigned long long)seed,
             r.passed, r.failed, r.unsupported, r.run);
      di_threadpool_free(tp);
    }
  di_op_report bad = di_op_check("cpu", perturbed, NULL, 0, 3, NULL);
  CHECKF(bad.failed == di_n_op_cases, "a perturbed runner failed %d of %d rows", bad.failed, di_n_op_cases);
  return test_finish("test_backend_ops");
}
