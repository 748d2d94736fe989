/* The KV cache groups of DeepSeek-V2/V3 (backend.h's di_kv_group_info), declared once for every
 * backend: one full-context group holding each cached layer's MLA latent row (the normalized
 * kv_lora_rank latent and the roped key part, kv_lora_rank + qk_rope_head_dim values) per token. The
 * backend decides the element size (f32 on the CPU, bf16 on CUDA), the row's stride (CUDA pads it to
 * 576 values) and which MTP layers it caches. */
#include "arch/deepseek.h"
#include <string.h>

int di_ds_kv_groups(const di_model_config *cfg, int n_mtp_cached, int elem_bytes, int row_stride, di_kv_group_info *g,
                    int cap) {
  if (cap < 1) return 1;
  const int layers = cfg->num_hidden_layers + n_mtp_cached;
  const int row = row_stride > 0 ? row_stride : cfg->kv_lora_rank + cfg->qk_rope_head_dim;
  memset(&g[0], 0, sizeof g[0]);
  g[0].kind = DI_KV_FULL;
  g[0].n_layers = layers;
  g[0].bytes_per_token = (int64_t)layers * row * elem_bytes;
  g[0].bytes_per_entry = g[0].bytes_per_token;
  g[0].tokens_per_entry = 1;
  g[0].window = 0;
  return 1;
}
