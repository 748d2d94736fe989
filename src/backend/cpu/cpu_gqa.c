/* Grouped-query attention (see cpu_gqa.h): per query row and head, scores by di_cpu_dot, a max-shifted
 * softmax in float32 whose normaliser is summed in double, then the value rows accumulated in key
 * order. Checked against a float64 reference in tests/unit/test_gqa.c. */
#include "backend/cpu/cpu_gqa.h"
#include "backend/cpu/cpu_gemm.h"
#include <math.h>
#include <string.h>

void di_cpu_gqa_attend(const float *q, int nq, int ldq, int nh, int nkv, int hd, const float *k, const float *v,
                       int ldkv, int nk, float scale, float *out, int ldo, float *scratch) {
  const int group = nh / nkv;
  for (int i = 0; i < nq; i++)
    for (int h = 0; h < nh; h++) {
      const float *qh = q + (size_t)i * ldq + (size_t)h * hd;
      const int g = h / group;
      float mx = -INFINITY;
      for (int j = 0; j < nk; j++) {
        scratch[j] = di_cpu_dot(qh, k + (size_t)j * ldkv + (size_t)g * hd, hd) * scale;
        if (scratch[j] > mx) mx = scratch[j];
      }
      double z = 0;
      for (int j = 0; j < nk; j++) {
        scratch[j] = expf(scratch[j] - mx);
        z += scratch[j];
      }
      float *o = out + (size_t)i * ldo + (size_t)h * hd;
      memset(o, 0, sizeof(float) * (size_t)hd);
      for (int j = 0; j < nk; j++) {
        const float *vj = v + (size_t)j * ldkv + (size_t)g * hd;
        const float p = scratch[j];
        for (int d = 0; d < hd; d++) o[d] += p * vj[d];
      }
      const float inv = (float)(1.0 / z);
      for (int d = 0; d < hd; d++) o[d] *= inv;
    }
}
