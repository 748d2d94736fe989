/* The V4-Flash shape of a DeepSeek-V4 configuration, shared by the CUDA kernel tests
 * (tests/cuda/test_cuda_v4_kernels.c: every kernel at these shapes) and the benchmark
 * (bench/bench_cuda_v4.c: a model of n_layers of them with random weights), so both measure the same
 * shape: hidden 4096, 64 heads x 512, q_lora 1024, 8 output groups x o_lora 1024, routed experts
 * top-6 of width 2048 + 1 shared, indexer 64 x 128 top-512, window 128, compress rates 4 and 128,
 * vocab 129280, hc 4 with Sinkhorn 20. Layer order (assumed: V4-Flash's own config was not at hand):
 * sliding, sliding, then CSA / HCA alternating; hash routing in the first 3 layers. */
#ifndef DI_ARCH_DEEPSEEK_V4_SHAPES_H
#define DI_ARCH_DEEPSEEK_V4_SHAPES_H
#include "arch/deepseek_v4.h"
#include <string.h>

static inline void di_v4_flash_shape(di_v4_config *c, int n_layers, int n_experts) {
  memset(c, 0, sizeof *c);
  c->vocab_size = 129280;
  c->hidden_size = 4096;
  c->n_layers = n_layers;
  c->n_heads = 64;
  c->head_dim = 512;
  c->q_lora_rank = 1024;
  c->o_groups = 8;
  c->o_lora_rank = 1024;
  c->n_routed_experts = n_experts;
  c->n_shared_experts = 1;
  c->top_k = 6;
  c->moe_inter = 2048;
  c->routed_scaling = 1.5;
  c->rms_eps = 1e-6;
  c->hc_eps = 1e-6;
  c->hc_mult = 4;
  c->hc_sinkhorn_iters = 20;
  c->swiglu_limit = 10;
  c->sliding_window = 128;
  c->csa_rate = 4;
  c->hca_rate = 128;
  c->index_n_heads = 64;
  c->index_head_dim = 128;
  c->index_topk = 512;
  c->rope_main = (di_v4_rope){64, 10000, 0, 1, 32, 1, 65536, 1};
  c->rope_compress = (di_v4_rope){64, 160000, 1, 16, 32, 1, 65536, 1};
  for (int l = 0; l < n_layers && l < DI_V4_MAX_LAYERS; l++) {
    c->attn_kind[l] = l < 2 ? DI_V4_ATTN_SLIDING : (l % 2 == 0 ? DI_V4_ATTN_CSA : DI_V4_ATTN_HCA);
    c->ffn_kind[l] = l < 3 ? DI_V4_FFN_HASH_MOE : DI_V4_FFN_MOE;
  }
}
#endif
