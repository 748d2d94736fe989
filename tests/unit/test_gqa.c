/* The CPU grouped-query attention op (backend/cpu/cpu_gqa.c) against a float64 reference on fresh
 * random inputs: head groups 1 (MHA), 2, 4 and nh (MQA), head dims 8..64 with a tail, 1..700 keys,
 * large score ranges (softmax shift), rows in one call bit-equal to each row alone (batch invariance).
 * Bound: rel L2 <= 2e-6 per case (float32 accumulation over <= 700 keys). */
#include "backend/cpu/cpu_gqa.h"
#include "test_util.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_state = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* [-1, 1) */
  g_state ^= g_state << 13; g_state ^= g_state >> 7; g_state ^= g_state << 17;
  return (float)((g_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static void reference(const float *q, int nq, int nh, int nkv, int hd, const float *k, const float *v, int nk, double scale,
                      double *out) {
  double *s = malloc(sizeof(double) * (size_t)nk);
  for (int i = 0; i < nq; i++)
    for (int h = 0; h < nh; h++) {
      int g = h / (nh / nkv);
      double mx = -INFINITY, z = 0;
      for (int j = 0; j < nk; j++) {
        double d = 0;
        for (int e = 0; e < hd; e++) d += (double)q[(size_t)i * nh * hd + h * hd + e] * k[(size_t)j * nkv * hd + g * hd + e];
        s[j] = d * scale;
        if (s[j] > mx) mx = s[j];
      }
      for (int j = 0; j < nk; j++) z += (s[j] = exp(s[j] - mx));
      for (int e = 0; e < hd; e++) {
        double acc = 0;
        for (int j = 0; j < nk; j++) acc += s[j] * v[(size_t)j * nkv * hd + g * hd + e];
        out[(size_t)i * nh * hd + h * hd + e] = acc / z;
      }
    }
  free(s);
}

static void one_case(int nq, int nh, int nkv, int hd, int nk, float amp) {
  const size_t QN = (size_t)nq * nh * hd, KN = (size_t)nk * nkv * hd;
  float *q = malloc(QN * 4), *k = malloc(KN * 4), *v = malloc(KN * 4), *out = malloc(QN * 4), *row = malloc((size_t)nh * hd * 4);
  float *sc = malloc((size_t)nk * 4), *reff = malloc(QN * 4);
  double *ref = malloc(QN * 8);
  for (size_t i = 0; i < QN; i++) q[i] = urand() * amp;
  for (size_t i = 0; i < KN; i++) { k[i] = urand(); v[i] = urand(); }
  const float scale = 1.0f / sqrtf((float)hd);
  di_cpu_gqa_attend(q, nq, nh * hd, nh, nkv, hd, k, v, nkv * hd, nk, scale, out, nh * hd, sc);
  reference(q, nq, nh, nkv, hd, k, v, nk, scale, ref);
  for (size_t i = 0; i < QN; i++) reff[i] = (float)ref[i];
  double err = test_rel_l2(out, reff, QN);
  CHECKF(err <= 2e-6, "nq %d nh %d nkv %d hd %d nk %d amp %g: rel L2 %.3g", nq, nh, nkv, hd, nk, amp, err);
  int same = 1;
  for (int i = 0; i < nq; i++) {
    di_cpu_gqa_attend(q + (size_t)i * nh * hd, 1, nh * hd, nh, nkv, hd, k, v, nkv * hd, nk, scale, row, nh * hd, sc);
    same &= memcmp(row, out + (size_t)i * nh * hd, (size_t)nh * hd * 4) == 0;
  }
  CHECKF(same, "rows of one call differ from each row alone (nq %d nk %d)", nq, nk);
  free(q); free(k); free(v); free(out); free(row); free(sc); free(reff); free(ref);
}

int main(void) {
  const int shapes[][4] = {{4, 4, 32, 0}, {4, 2, 32, 0}, {8, 2, 16, 0}, {8, 1, 64, 0}, {6, 3, 24, 0}, {2, 1, 8, 0}, {4, 2, 36, 0}};
  const int nks[] = {1, 2, 7, 64, 129, 700};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t n = 0; n < sizeof nks / sizeof nks[0]; n++)
      one_case(1 + (int)((s + n) % 6), shapes[s][0], shapes[s][1], shapes[s][2], nks[n], n % 2 ? 8.0f : 1.0f);
  return test_finish("test_gqa");
}
