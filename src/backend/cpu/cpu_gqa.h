/* Grouped-query attention on the CPU (the DSpark drafter's attention; no MLA): nh query heads share
 * nkv key/value heads (query head h reads kv head h / (nh / nkv), as HF's repeat_kv), every query row
 * sees every key row (the drafter's block attends to its context and to the whole block). Scores and
 * the weighted sum run in a fixed order (di_cpu_dot), so a row never depends on the other rows. */
#ifndef DI_CPU_GQA_H
#define DI_CPU_GQA_H
#include <stdint.h>

/* q [nq][ldq] (head h at h*hd), k/v [nk][ldkv] (kv head g at g*hd); out [nq][ldo]; scratch >= nk
 * floats. */
void di_cpu_gqa_attend(const float *q, int nq, int ldq, int nh, int nkv, int hd, const float *k, const float *v,
                       int ldkv, int nk, float scale, float *out, int ldo, float *scratch);
#endif
