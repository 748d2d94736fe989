/* --quantization fp8 for DeepSeek-V2/V3: after binding a BF16 checkpoint (or making BF16 dummy weights),
 * the linear layers DeepSeek-V3 ships in FP8 are quantized to 128 x 128 block FP8 with F32 scales
 * (weights_quantize.c), so the backends run them as they run a V3 FP8 checkpoint. This is per block,
 * not vLLM's per-tensor fp8. Kept in BF16, as in DeepSeek's FP8 checkpoints (and for MLA's weight
 * absorption): the embeddings, lm_head and the MTP head / embedding, the router gates (mlp.gate), the
 * norms (f32 vectors anyway), and kv_b_proj, whose W_UK / W_UV halves MLA's absorbed attention multiplies
 * with the queries and the attention output in bf16. Quantized: q_a / q_b / q_proj, kv_a_proj_with_mqa,
 * o_proj, the dense MLP's gate / up / down, every routed and shared expert's gate / up / down, and the
 * MTP layer's eh_proj. Weights already FP8 stay as stored. */
#include "arch/deepseek.h"
#include "util/status.h"

#define QB 128

static di_status q(di_ds_weights *w, di_weight *m) {
  if (di_weight_quantize_fp8(m, QB, QB, &w->owned))
    return di_error_set(DI_ERR_OOM, "--quantization fp8: out of memory quantizing %s", m->name ? m->name : "a weight");
  return DI_OK;
}

di_status di_ds_weights_quantize_fp8(const di_model_config *cfg, di_ds_weights *w) {
  for (int l = 0; l < w->n_layers + w->n_mtp; l++) {
    di_ds_layer *L = &w->layers[l];
    DI_TRY(q(w, &L->q_a));
    DI_TRY(q(w, &L->q_b));
    DI_TRY(q(w, &L->q_proj));
    DI_TRY(q(w, &L->kv_a));
    DI_TRY(q(w, &L->o_proj));
    if (!L->is_moe) {
      DI_TRY(q(w, &L->gate));
      DI_TRY(q(w, &L->up));
      DI_TRY(q(w, &L->down));
    } else {
      for (int e = 0; e < cfg->n_routed_experts; e++) {
        DI_TRY(q(w, &L->exp_gate[e]));
        DI_TRY(q(w, &L->exp_up[e]));
        DI_TRY(q(w, &L->exp_down[e]));
      }
      if (L->has_shared) {
        DI_TRY(q(w, &L->sh_gate));
        DI_TRY(q(w, &L->sh_up));
        DI_TRY(q(w, &L->sh_down));
      }
    }
    DI_TRY(q(w, &L->eh_proj));
  }
  return DI_OK;
}
