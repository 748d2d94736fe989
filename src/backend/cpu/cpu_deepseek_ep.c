/* Expert parallel for the DeepSeek-V2/V3 MoE layer on the CPU (hook in cpu_deepseek.c's moe()):
 * the routed experts run on the ranks that hold them (dist/ep.c's exchange), the shared experts here.
 * The outputs land in the same expert-sorted rows (where[]) the single-rank path fills, so the
 * single-rank combine adds them in the same order; each expert row is computed by the same GEMM
 * calls with the same per-row arithmetic as on one rank, whatever rows share the GEMM, hence the
 * result is bit-identical to one rank. */
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_gemm.h"
#include "dist/dist.h"
#include <math.h>
#include <string.h>

static inline float silu(float v) { return v / (1.0f + expf(-v)); }

/* dist/ep.h's di_ep_experts_fn: every local expert's gate+up as one parallel loop, then the downs */
static di_status run_experts(void *user, int layer, const float *x, const int32_t *count, int n, float *y,
                             float *scratch) {
  di_cpu_backend *b = user;
  const di_ds_layer *L = &b->w->layers[layer];
  const int H = b->cfg->hidden_size, E = b->cfg->n_routed_experts;
  const int64_t I = b->cfg->moe_intermediate_size;
  float *g = scratch, *up = scratch + (size_t)n * I;
  di_gemm_job *jobs = b->s_jobs;
  int nj = 0;
  for (int e = 0, r0 = 0; e < E; r0 += count[e], e++) {
    if (!count[e])
      continue;
    jobs[nj++] = (di_gemm_job){x + (size_t)r0 * H, count[e], H, &L->exp_gate[e], 0, I, g + (size_t)r0 * I, I};
    jobs[nj++] = (di_gemm_job){x + (size_t)r0 * H, count[e], H, &L->exp_up[e], 0, I, up + (size_t)r0 * I, I};
  }
  di_cpu_gemm_multi(b->tp, jobs, nj);
  for (int64_t i = 0; i < (int64_t)n * I; i++)
    g[i] = silu(g[i]) * up[i];
  nj = 0;
  for (int e = 0, r0 = 0; e < E; r0 += count[e], e++) {
    if (!count[e])
      continue;
    jobs[nj++] = (di_gemm_job){g + (size_t)r0 * I, count[e], I, &L->exp_down[e], 0, H, y + (size_t)r0 * H, H};
  }
  di_cpu_gemm_multi(b->tp, jobs, nj);
  return DI_OK;
}

void di_cpu_deepseek_moe_ep(di_cpu_backend *b, const di_ds_layer *L, const float *x, int T) {
  const di_model_config *c = b->cfg;
  const int H = c->hidden_size, K = c->num_experts_per_tok;
  const int layer = (int)(L - b->w->layers);
  di_ep *ep;
  if (di_dist_ep_get(b->w->n_layers + b->w->n_mtp, c->n_routed_experts, H, c->n_group, 2 * c->moe_intermediate_size,
                     &ep) != DI_OK)
    di_dist_fail();
  /* shared experts first (they do not wait for anyone), as mlp() computes them */
  if (L->has_shared) {
    const int64_t SI = L->sh_gate.rows;
    float *sg = b->s_g, *su = b->s_u;
    const di_gemm_job gu[2] = {{x, T, H, &L->sh_gate, 0, SI, sg, SI}, {x, T, H, &L->sh_up, 0, SI, su, SI}};
    di_cpu_gemm_multi(b->tp, gu, 2);
    for (int64_t i = 0; i < (int64_t)T * SI; i++)
      sg[i] = silu(sg[i]) * su[i];
    di_cpu_gemm(b->tp, sg, T, SI, &L->sh_down, 0, H, b->s_shared, H);
  }
  di_ep_set_listener(ep, run_experts, b); /* a data-parallel rank with no work computes for the others */
  float *y = b->s_exp_in; /* [T * K][H] per slot; unused by the single-rank gather here */
  if (di_ep_routed(ep, layer, x, T, b->s_topk_ids, K, y, run_experts, b) != DI_OK)
    di_dist_fail();
  for (int i = 0; i < T * K; i++)
    memcpy(b->s_exp_out + (size_t)b->s_exp_where[i] * H, y + (size_t)i * H, sizeof(float) * (size_t)H);
}
