/* DeepSeek-V2 / V3 on the CUDA backend, in the manner of llama.cpp's src/models/deepseek2.cpp: the
 * architecture's shapes and weights to the device (q/kv_a as one matrix, experts padded and gate/up
 * interleaved, shared experts folded in as experts where their width allows), one decoder layer (MLA
 * with the absorbed query over the latent KV cache, then the dense MLP or the MoE), and the forward of
 * a prepared step (embed, layers, final norm, lm_head, in-step sampling). */
#include "cuda_backend_impl.cuh"
#include "k_inv_fusions.h"
#include "cuda_ep.cuh"
#include "k_mha_prefill.h"
#include <string.h>

/* DEEPINFER_CUDA_FP8=1: the layer's FP8 weight groups to the device as FP8 (per-row scales, see
 * cuda_upload_fp8.cu), in the bf16 groups' row layouts; a group any of whose matrices is not FP8 with
 * the group's block width (or whose slices would split a scale block) stays bf16. Shapes were checked
 * by check_shape before. */
static di_status upload_layer_fp8(cu_backend *b, const di_model_config *c, const di_ds_layer *s, cu_layer *d, int l) {
  const int H = b->H, qrows = b->qr > 0 ? b->qr : b->NH * b->dqk;
  const di_weight *qa = b->qr > 0 ? &s->q_a : &s->q_proj;
  const int bc = qa->block_cols;
  const di_weight *g_qkv[] = {qa, &s->kv_a, NULL};
  if (fp8_uploadable(bc, g_qkv)) {
    DI_TRY(fp8_alloc(b, b->Wa, H, bc, &d->f_qkv_a));
    DI_TRY(fp8_up_rows(qa, 0, qrows, 0, H, &d->f_qkv_a, 0));
    DI_TRY(fp8_up_rows(&s->kv_a, 0, b->R + b->dr, 0, H, &d->f_qkv_a, qrows));
  }
  const di_weight *g_qb[] = {&s->q_b, NULL};
  if (b->qr > 0 && fp8_uploadable(s->q_b.block_cols, g_qb)) {
    DI_TRY(fp8_alloc(b, (int64_t)b->NH * b->dqk, b->qr, s->q_b.block_cols, &d->f_q_b));
    DI_TRY(fp8_up_rows(&s->q_b, 0, (int64_t)b->NH * b->dqk, 0, b->qr, &d->f_q_b, 0));
  }
  const di_weight *g_o[] = {&s->o_proj, NULL};
  if (fp8_uploadable(s->o_proj.block_cols, g_o)) {
    DI_TRY(fp8_alloc(b, H, b->NH * b->dv, s->o_proj.block_cols, &d->f_o));
    DI_TRY(fp8_up_rows(&s->o_proj, 0, H, 0, (int64_t)b->NH * b->dv, &d->f_o, 0));
  }
  if (!s->is_moe) {
    const int I = b->Idense, bg = s->gate.block_cols;
    const di_weight *g_gu[] = {&s->gate, &s->up, NULL}, *g_dn[] = {&s->down, NULL};
    if (fp8_uploadable(bg, g_gu) && fp8_uploadable(s->down.block_cols, g_dn)) {
      DI_TRY(fp8_alloc(b, 2 * (int64_t)I, H, bg, &d->f_gate_up));
      DI_TRY(fp8_up_rows(&s->gate, 0, I, 0, H, &d->f_gate_up, 0));
      DI_TRY(fp8_up_rows(&s->up, 0, I, 0, H, &d->f_gate_up, I));
      DI_TRY(fp8_alloc(b, H, I, s->down.block_cols, &d->f_down));
      DI_TRY(fp8_up_rows(&s->down, 0, H, 0, I, &d->f_down, 0));
    }
    return DI_OK;
  }
  /* experts: every routed expert (and the shared ones, folded or not) FP8 with one block width, the
   * vector GEMV's alignment (block_cols % 16), and the folded shared down's column slices on blocks */
  const int E = b->E, I = c->moe_intermediate_size, Ip = b->Ip, Hp = b->Hp, eb = s->exp_gate[0].block_cols;
  int ok = eb % 16 == 0;
  for (int e = 0; e < E && ok; e++) {
    const di_weight *g[] = {&s->exp_gate[e], &s->exp_up[e], &s->exp_down[e], NULL};
    ok = fp8_uploadable(eb, g);
  }
  if (ok && s->has_shared) {
    const di_weight *g[] = {&s->sh_gate, &s->sh_up, &s->sh_down, NULL};
    ok = fp8_uploadable(eb, g) && (b->n_sh == 0 || I % eb == 0);
  }
  if (!ok) return DI_OK;
  /* expert parallel: this rank's experts only, at local slots (then the shared ones when folded) */
  const int n_routed = b->ep ? b->ep_El : E, Et = n_routed + b->n_sh;
  DI_TRY(fp8_alloc(b, (int64_t)Et * 2 * Ip, Hp, eb, &d->f_exp_gu));
  DI_TRY(fp8_alloc(b, (int64_t)Et * Hp, Ip, eb, &d->f_exp_down));
  for (int j = 0; j < n_routed; j++) {
    const int e = b->ep ? cu_ep_local_expert(b, l, j) : j;
    DI_TRY(fp8_up_rows(&s->exp_gate[e], 0, I, 0, H, &d->f_exp_gu, (int64_t)j * 2 * Ip));
    DI_TRY(fp8_up_rows(&s->exp_up[e], 0, I, 0, H, &d->f_exp_gu, (int64_t)j * 2 * Ip + Ip));
    DI_TRY(fp8_up_rows(&s->exp_down[e], 0, H, 0, I, &d->f_exp_down, (int64_t)j * Hp));
  }
  if (s->has_shared && b->n_sh > 0) {
    for (int j = 0; j < b->n_sh; j++) {
      const int e = n_routed + j;
      DI_TRY(fp8_up_rows(&s->sh_gate, (int64_t)j * I, (int64_t)(j + 1) * I, 0, H, &d->f_exp_gu, (int64_t)e * 2 * Ip));
      DI_TRY(fp8_up_rows(&s->sh_up, (int64_t)j * I, (int64_t)(j + 1) * I, 0, H, &d->f_exp_gu, (int64_t)e * 2 * Ip + Ip));
      DI_TRY(fp8_up_rows(&s->sh_down, 0, H, (int64_t)j * I, (int64_t)(j + 1) * I, &d->f_exp_down, (int64_t)e * Hp));
    }
  } else if (s->has_shared) {
    const int Is = (int)s->sh_gate.rows;
    DI_TRY(fp8_alloc(b, 2 * (int64_t)Is, H, eb, &d->f_sh_gu));
    DI_TRY(fp8_up_rows(&s->sh_gate, 0, Is, 0, H, &d->f_sh_gu, 0));
    DI_TRY(fp8_up_rows(&s->sh_up, 0, Is, 0, H, &d->f_sh_gu, Is));
    DI_TRY(fp8_alloc(b, H, Is, eb, &d->f_sh_down));
    DI_TRY(fp8_up_rows(&s->sh_down, 0, H, 0, Is, &d->f_sh_down, 0));
  }
  return DI_OK;
}

di_status upload_layer(cu_backend *b, const di_model_config *c, const di_ds_layer *s, cu_layer *d, int l) {
  const int H = b->H;
  DI_TRY(up_vec(b, s->attn_norm, H, &d->attn_norm));
  DI_TRY(up_vec(b, s->ffn_norm, H, &d->ffn_norm));
  /* the attention's input projections as one matrix: [q_a or q_proj ; kv_a] */
  const int qrows = b->qr > 0 ? b->qr : b->NH * b->dqk;
  if (b->qr > 0) DI_TRY(check_shape(&s->q_a, b->qr, H, "q_a_proj"));
  else DI_TRY(check_shape(&s->q_proj, qrows, H, "q_proj"));
  DI_TRY(check_shape(&s->kv_a, b->R + b->dr, H, "kv_a_proj_with_mqa"));
  if (b->qr > 0) DI_TRY(check_shape(&s->q_b, (int64_t)b->NH * b->dqk, b->qr, "q_b_proj"));
  DI_TRY(check_shape(&s->o_proj, H, (int64_t)b->NH * b->dv, "o_proj"));
  if (!s->is_moe) {
    DI_TRY(check_shape(&s->gate, b->Idense, H, "mlp.gate_proj"));
    DI_TRY(check_shape(&s->up, b->Idense, H, "mlp.up_proj"));
    DI_TRY(check_shape(&s->down, H, b->Idense, "mlp.down_proj"));
  } else {
    const int I = c->moe_intermediate_size;
    for (int e = 0; e < b->E; e++) {
      DI_TRY(check_shape(&s->exp_gate[e], I, H, "experts.gate_proj"));
      DI_TRY(check_shape(&s->exp_up[e], I, H, "experts.up_proj"));
      DI_TRY(check_shape(&s->exp_down[e], H, I, "experts.down_proj"));
    }
    if (s->has_shared && b->n_sh > 0) {
      DI_TRY(check_shape(&s->sh_gate, (int64_t)b->n_sh * I, H, "shared_experts.gate_proj"));
      DI_TRY(check_shape(&s->sh_up, (int64_t)b->n_sh * I, H, "shared_experts.up_proj"));
      DI_TRY(check_shape(&s->sh_down, H, (int64_t)b->n_sh * I, "shared_experts.down_proj"));
    } else if (s->has_shared) {
      const int Is = (int)s->sh_gate.rows;
      if (b->Ish && Is != b->Ish)
        return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: layer %d shared experts %d wide, others %d", l, Is, b->Ish);
      DI_TRY(check_shape(&s->sh_up, Is, H, "shared_experts.up_proj"));
      DI_TRY(check_shape(&s->sh_gate, Is, H, "shared_experts.gate_proj"));
      DI_TRY(check_shape(&s->sh_down, H, Is, "shared_experts.down_proj"));
    }
  }
  if (b->fp8) DI_TRY(upload_layer_fp8(b, c, s, d, l));
  if (!d->f_qkv_a.q) {
    DI_TRY(dev_alloc(b, (void **)&d->qkv_a, (size_t)b->Wa * H * 2));
    DI_TRY(up_rows(b->qr > 0 ? &s->q_a : &s->q_proj, 0, qrows, d->qkv_a, H));
    DI_TRY(up_rows(&s->kv_a, 0, b->R + b->dr, d->qkv_a + (size_t)qrows * H, H));
  }
  if (b->qr > 0) {
    DI_TRY(up_vec(b, s->q_a_norm, b->qr, &d->q_a_norm));
    if (!d->f_q_b.q) DI_TRY(up_mat(b, &s->q_b, (int64_t)b->NH * b->dqk, b->qr, &d->q_b, "q_b_proj"));
  }
  DI_TRY(up_vec(b, s->kv_a_norm, b->R, &d->kv_a_norm));
  DI_TRY(up_mat(b, &s->kv_b, (int64_t)b->NH * (b->dn + b->dv), b->R, &d->kv_b, "kv_b_proj"));
  if (!d->f_o.q) DI_TRY(up_mat(b, &s->o_proj, H, (int64_t)b->NH * b->dv, &d->o_proj, "o_proj"));
  d->is_moe = s->is_moe;
  if (!s->is_moe) {
    const int I = b->Idense;
    if (d->f_gate_up.q) return DI_OK;
    DI_TRY(dev_alloc(b, (void **)&d->gate_up, (size_t)2 * I * H * 2));
    DI_TRY(up_rows(&s->gate, 0, I, d->gate_up, H));
    DI_TRY(up_rows(&s->up, 0, I, d->gate_up + (int64_t)I * H, H));
    DI_TRY(up_mat(b, &s->down, H, I, &d->down, "mlp.down_proj"));
    return DI_OK;
  }
  const int E = b->E, I = c->moe_intermediate_size, Ip = b->Ip;
  DI_TRY(up_mat(b, &s->router, E, H, &d->router, "mlp.gate"));
  if (s->router_bias) DI_TRY(up_vec(b, s->router_bias, E, &d->router_bias));
  d->has_shared = s->has_shared;
  if (s->has_shared && b->n_sh == 0) b->Ish = (int)s->sh_gate.rows;
  if (d->f_exp_gu.q) return DI_OK;
  /* expert parallel: this rank's experts only (then the shared ones when folded) */
  const int Hp = b->Hp, n_routed = b->ep ? b->ep_El : E, Et = n_routed + b->n_sh;
  const size_t gu_e = (size_t)2 * Ip * Hp, dn_e = (size_t)Hp * Ip;
  DI_TRY(dev_alloc(b, (void **)&d->exp_gu, gu_e * Et * 2));
  DI_TRY(dev_alloc(b, (void **)&d->exp_down, dn_e * Et * 2));
  if (!b->stage) DI_TRY(dev_alloc(b, (void **)&b->stage, gu_e * Et * 2));
  if (Ip != I || Hp != H) {
    DI_CU(cudaMemset(b->stage, 0, gu_e * Et * 2));
    DI_CU(cudaMemset(d->exp_down, 0, dn_e * Et * 2));
  }
  /* staging layout per expert: gate rows [0, Ip), up rows [Ip, 2Ip); then interleaved for the glu GEMM */
  for (int jj = 0; jj < n_routed; jj++) {
    const size_t j = (size_t)jj; /* the local slot, holding expert e */
    const int e = b->ep ? cu_ep_local_expert(b, l, jj) : jj;
    DI_TRY(check_shape(&s->exp_gate[e], I, H, "experts.gate_proj"));
    DI_TRY(check_shape(&s->exp_up[e], I, H, "experts.up_proj"));
    DI_TRY(check_shape(&s->exp_down[e], H, I, "experts.down_proj"));
    DI_TRY(up_rows(&s->exp_gate[e], 0, I, b->stage + gu_e * j, Hp));
    DI_TRY(up_rows(&s->exp_up[e], 0, I, b->stage + gu_e * j + (size_t)Ip * Hp, Hp));
    DI_TRY(up_rows(&s->exp_down[e], 0, H, d->exp_down + dn_e * j, Ip));
  }
  d->has_shared = s->has_shared;
  if (s->has_shared && b->n_sh > 0) {
    /* shared MLP of width n_sh*I == n_sh experts of width I (a slice of its rows / columns each) */
    DI_TRY(check_shape(&s->sh_gate, (int64_t)b->n_sh * I, H, "shared_experts.gate_proj"));
    DI_TRY(check_shape(&s->sh_up, (int64_t)b->n_sh * I, H, "shared_experts.up_proj"));
    DI_TRY(check_shape(&s->sh_down, H, (int64_t)b->n_sh * I, "shared_experts.down_proj"));
    for (int j = 0; j < b->n_sh; j++) {
      const int e = n_routed + j;
      DI_TRY(up_rows(&s->sh_gate, (int64_t)j * I, (int64_t)(j + 1) * I, b->stage + gu_e * e, Hp));
      DI_TRY(up_rows(&s->sh_up, (int64_t)j * I, (int64_t)(j + 1) * I, b->stage + gu_e * e + (size_t)Ip * Hp, Hp));
      DI_TRY(up_cols(&s->sh_down, 0, H, (int64_t)j * I, (int64_t)(j + 1) * I, d->exp_down + dn_e * e, Ip));
    }
  } else if (s->has_shared) {
    const int Is = (int)s->sh_gate.rows;
    if (b->Ish && Is != b->Ish)
      return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: layer %d shared experts %d wide, others %d", l, Is, b->Ish);
    b->Ish = Is;
    DI_TRY(check_shape(&s->sh_up, Is, H, "shared_experts.up_proj"));
    DI_TRY(check_shape(&s->sh_gate, Is, H, "shared_experts.gate_proj"));
    DI_TRY(dev_alloc(b, (void **)&d->sh_gu, (size_t)2 * Is * H * 2));
    DI_TRY(up_rows(&s->sh_gate, 0, Is, d->sh_gu, H));
    DI_TRY(up_rows(&s->sh_up, 0, Is, d->sh_gu + (int64_t)Is * H, H));
    DI_TRY(up_mat(b, &s->sh_down, H, Is, &d->sh_down, "shared_experts.down_proj"));
  }
  DI_TRY(di_cuk_glu_interleave((const uint16_t *)b->stage, (uint16_t *)d->exp_gu, Et, Ip, Hp, NULL));
  DI_CU(cudaDeviceSynchronize()); /* the staging buffer is reused by the next layer */
  return DI_OK;
}


di_status cu_upload_expert(cu_backend *b, const di_ds_layer *s, int l, int e, int j) {
  cu_layer *d = &b->L[l];
  const int H = b->H, Hp = b->Hp, Ip = b->Ip, I = b->cfg->moe_intermediate_size;
  if (d->f_exp_gu.q) { /* FP8: rows into the slot's place, as upload_layer_fp8 */
    DI_TRY(fp8_up_rows(&s->exp_gate[e], 0, I, 0, H, &d->f_exp_gu, (int64_t)j * 2 * Ip));
    DI_TRY(fp8_up_rows(&s->exp_up[e], 0, I, 0, H, &d->f_exp_gu, (int64_t)j * 2 * Ip + Ip));
    return fp8_up_rows(&s->exp_down[e], 0, H, 0, I, &d->f_exp_down, (int64_t)j * Hp);
  }
  const size_t gu_e = (size_t)2 * Ip * Hp, dn_e = (size_t)Hp * Ip;
  if (!b->stage) DI_TRY(dev_alloc(b, (void **)&b->stage, gu_e * 2)); /* one expert's staging */
  DI_CU(cudaMemset(b->stage, 0, gu_e * 2));
  DI_TRY(up_rows(&s->exp_gate[e], 0, I, b->stage, Hp));
  DI_TRY(up_rows(&s->exp_up[e], 0, I, b->stage + (size_t)Ip * Hp, Hp));
  DI_TRY(up_rows(&s->exp_down[e], 0, H, d->exp_down + dn_e * j, Ip)); /* padding stays zero */
  DI_TRY(di_cuk_glu_interleave((const uint16_t *)b->stage, (uint16_t *)(d->exp_gu + gu_e * j), 1, Ip, Hp, NULL));
  DI_CU(cudaDeviceSynchronize());
  return DI_OK;
}

/* ---- the forward pass ---------------------------------------------------------------------------- */

/* layer l's part of the pool (bf16 rows, or FP8 entries with b->kv_fp8) */
static void *layer_cache(cu_backend *b, int l) {
  return (unsigned char *)b->kv + (size_t)l * (size_t)(b->n_blocks + 1) * DI_KV_BLOCK_SIZE * cu_kv_row_bytes(b);
}

di_status mlp_dense(cu_backend *b, int T, const bf16 *gate_up, const bf16 *down, int I) {
  cudaStream_t s = b->stream;
  DI_TRY(di_cu_gemm(b->blas, T, 2 * I, b->H, (const uint16_t *)b->xn, b->Hp, (const uint16_t *)gate_up, b->H,
                    b->gu, 2 * I, 0, 0.f, s));
  DI_TRY(di_cuk_silu_mul((const uint16_t *)b->gu, T, I, (uint16_t *)b->act, s));
  DI_TRY(di_cu_gemm(b->blas, T, b->H, I, (const uint16_t *)b->act, I, (const uint16_t *)down, I, b->h, b->H, 1,
                    1.f, s));
  return DI_OK;
}

/* An FP8 weight's product (cuda_fp8.h: the decode GEMV up to DEEPINFER_CUDA_FP8_GEMV_ROWS rows and in
 * the batch-invariant mode, else the tensor-core GEMM on activations quantized into fp8_ws). */
static di_status fp8_mm(cu_backend *b, int M, int N, int K, const bf16 *X, int ldx, const di_cuk_fp8w *w, void *Y,
                        int ldy, int y_f32, float beta) {
  if (b->fp8lt && !b->invariant && M > di_cuk_fp8_gemv_max_rows()) { /* cuBLASLt where it has an algorithm */
    const di_status st = di_cu_fp8lt_matmul(b->fp8lt, M, N, K, (const uint16_t *)X, ldx, *w, Y, ldy, y_f32, beta,
                                            b->fp8_ws, b->fp8_ws_bytes, b->stream);
    if (st != DI_ERR_UNSUPPORTED) return st;
  }
  return di_cuk_fp8_matmul(M, N, K, (const uint16_t *)X, ldx, *w, Y, ldy, y_f32, beta, b->invariant, b->fp8_ws,
                           b->fp8_ws_bytes, b->stream);
}

/* mlp_dense with FP8 gate/up and down */
static di_status mlp_dense_fp8(cu_backend *b, int T, const di_cuk_fp8w *gate_up, const di_cuk_fp8w *down, int I) {
  if (di_cuk_fp8_tc_use(T, b->invariant) && (b->invariant || T <= di_cuk_fp8_gemv_max_rows()) &&
      di_cuk_fp8_tc_ok(b->H, b->xn, b->Hp, *gate_up)) /* gate/up and SiLU in one tensor-core GEMV */
    DI_TRY(di_cuk_fp8_tc_gemv_glu(T, 2 * I, b->H, (const uint16_t *)b->xn, b->Hp, *gate_up, (uint16_t *)b->act, I,
                                  b->stream));
  else if (b->fp8_fuse && !b->invariant && T <= di_cuk_fp8_gemv_max_rows() && !di_cuk_fp8_tc_use(T, 0) &&
           di_cuk_fp8_gemv_vec_ok(b->H, b->xn, b->Hp, *gate_up))
    DI_TRY(di_cuk_fp8_gemv_glu(T, 2 * I, b->H, (const uint16_t *)b->xn, b->Hp, *gate_up, (uint16_t *)b->act, I,
                               b->stream)); /* the CUDA-core GEMV's gate/up + SiLU */
  else {
    DI_TRY(fp8_mm(b, T, 2 * I, b->H, b->xn, b->Hp, gate_up, b->gu, 2 * I, 0, 0.f));
    DI_TRY(di_cuk_silu_mul((const uint16_t *)b->gu, T, I, (uint16_t *)b->act, b->stream));
  }
  return fp8_mm(b, T, b->H, I, b->act, I, down, b->h, b->H, 1, 1.f);
}

/* The routed (and folded shared) experts in FP8: gate/up into egu, silu_mul into act, down into y
 * (f32, the combine's input). Decode-sized steps and the batch-invariant mode: grouped GEMVs; larger
 * ones: the grouped tensor-core GEMM on activations quantized per 128 (the token rows of xn gathered
 * through perm_tok, then the A rows of act) where the tiles are 64 rows and the blocks 128 wide, else
 * grouped GEMVs of up to 16 rows a pass. With DEEPINFER_CUDA_FP8_GV16 (outside the invariant mode), steps of
 * up to GV16_MAX_T tokens take the 16-rows-a-warp GEMVs of k_fp8_grouped_gemv.cu instead (bit-equal to the
 * CUDA-core GEMV; they replace the tensor-core GEMV at 3-16 rows). Outside the invariant mode, steps of at least
 * DEEPINFER_CUDA_FP8_GMMA_MIN_T tokens (4; and never one token) take the grouped W8A8 GEMMs instead: k_fp8_tc_grouped.cu's
 * wgmma one (DEEPINFER_CUDA_FP8_TCG) where the widths allow (I % 128, H % 256), else k_fp8_grouped_mma.cu's mma.sync
 * one (DEEPINFER_CUDA_FP8_GMMA). */
#define GV16_MAX_T 16 /* DEEPINFER_CUDA_FP8_GV16: up to this many token rows (passes of up to 4 rows an expert) */
/* the invariant mode's query absorption takes the W_UK [N][K] copies (DEEPINFER_CUDA_ABSORB_NK) at steps of up to 8
 * tokens (both forms on mma.sync there) and from DI_ABSORB_NK_MIN_T tokens (the hybrid core runs [N][K] above 8 rows
 * on TMA wgmma); on the H200 (session 15, us a layer, [N][K] vs [K][N]) 3.4 vs 3.9 at one token, 7.3 vs 3.7 at
 * 16, 6.9 vs 8.2 at 64, 9.1 vs 8.7 at 128, 9.5 vs 22.0 at 256, 12.9 vs 25.0 at 512, 78.6 vs 200 at 4,096; both
 * forms give the same bits, so the cut only picks the faster */
#define DI_ABSORB_NK_MIN_T 64
#define DI_ABSORB_NK_MAX_SMALL_T 8
/* Whether a step of T tokens takes k_fp8_tc_grouped.cu for layer L's experts (DEEPINFER_CUDA_FP8_TCG); layer_step
 * then builds 64-row tiles (the kernel's CTA tile: an expert's weights read once per 64 of its rows, not 16). */
static int fp8_tcg_step(const cu_backend *b, const cu_layer *L, int T) {
  return L->f_exp_gu.q && b->fp8_tcg && !b->invariant && T >= b->fp8_gmma_min_t && T > 1 &&
         di_cuk_fp8_tcg_ok(2 * b->Ip, b->Hp, 1, L->f_exp_gu) && di_cuk_fp8_tcg_ok(b->Hp, b->Ip, 0, L->f_exp_down);
}
static di_status experts_fp8(cu_backend *b, const cu_layer *L, const cu_expert_rows *io, int down_combine) {
  cudaStream_t s = b->stream;
  const int Hp = b->Hp, Ip = b->Ip, T = io->T, A = io->A, bm = io->bm, max_tiles = io->max_tiles;
  const uint16_t *x = (const uint16_t *)io->x;
  /* the tensor-core GEMV (di_cuk_fp8_tc_use: invariant mode, or above 2 token rows) up to the dense
   * GEMV bound of token rows, the CUDA-core one up to GEMV_MAX_T */
  const int tc = di_cuk_fp8_tc_use(T, b->invariant) && di_cuk_fp8_tc_ok(Hp, io->x, Hp, L->f_exp_gu) &&
                 di_cuk_fp8_tc_ok(Ip, io->act, Ip, L->f_exp_down);
  const int mma = !b->invariant && T > (tc ? di_cuk_fp8_gemv_max_rows() : GEMV_MAX_T) && bm == 64 &&
                  di_cuk_fp8_gemm_ok(Hp, L->f_exp_gu) && di_cuk_fp8_gemm_ok(Ip, L->f_exp_down);
  const int tcg = !down_combine && bm <= 64 && fp8_tcg_step(b, L, T);
  if (tcg || (b->fp8_gmma && !b->invariant && T >= b->fp8_gmma_min_t && !down_combine && (bm == 16 || bm == 64) &&
              di_cuk_fp8_gmma_ok(Hp, L->f_exp_gu) && di_cuk_fp8_gmma_ok(Ip, L->f_exp_down))) {
    /* DEEPINFER_CUDA_FP8_TCG / _GMMA: W8A8 on k_fp8_tc_grouped.cu (wgmma) or k_fp8_grouped_mma.cu (mma.sync),
     * activations quantized per 128; gate/up + SiLU in one kernel, then act quantized for the down product */
    uint8_t *xq;
    float *sx;
    int ldq, lds;
    DI_TRY(di_cuk_fp8_quant_ws(x, Hp, io->x_rows, Hp, b->fp8_ws, b->fp8_ws_bytes, &xq, &ldq, &sx, &lds, s));
    DI_TRY((tcg ? di_cuk_fp8_tcg_grouped : di_cuk_fp8_gmma_grouped)(xq, ldq, sx, lds, io->perm_tok, L->f_exp_gu,
                                                                     2 * Ip, Hp, io->expert_off, io->tiles, io->n_tiles,
                                                                     max_tiles, bm, io->act, Ip, 0, 1, s));
    DI_TRY(di_cuk_fp8_quant_ws((const uint16_t *)io->act, Ip, A, Ip, b->fp8_ws, b->fp8_ws_bytes, &xq, &ldq, &sx, &lds,
                               s));
    return (tcg ? di_cuk_fp8_tcg_grouped : di_cuk_fp8_gmma_grouped)(xq, ldq, sx, lds, NULL, L->f_exp_down, Hp, Ip,
                                                                    io->expert_off, io->tiles, io->n_tiles, max_tiles,
                                                                    bm, io->y, Hp, 1, 0, s);
  }
  if (b->fp8_gv16 && !b->invariant && T <= GV16_MAX_T && di_cuk_fp8_gv16_ok(Hp, io->x, Hp, L->f_exp_gu) &&
      di_cuk_fp8_gv16_ok(Ip, io->act, Ip, L->f_exp_down)) { /* DEEPINFER_CUDA_FP8_GV16: 16 rows a warp */
    const int pipe = b->fp8_gv16 == 2, rows = T < bm ? T : bm;
    DI_TRY(di_cuk_fp8_gv16_grouped(x, Hp, io->perm_tok, L->f_exp_gu, 2 * Ip, Hp, io->expert_off, io->tiles,
                                   io->n_tiles, max_tiles, bm, rows, io->act, Ip, 0, 1, pipe, io->pf0, io->pf_e0, s));
    if (down_combine) /* (one GPU only: the step's own routing in topk_ids / topk_w / inv) */
      return di_cuk_fp8_gv16_down_combine((const uint16_t *)io->act, Ip, L->f_exp_down, Hp, Ip, b->topk_ids, b->topk_w,
                                          b->inv, b->Kt, b->h, b->H, pipe, io->pf_e0, io->pf0 >= 0 ? b->n_sh : 0, s);
    return di_cuk_fp8_gv16_grouped((const uint16_t *)io->act, Ip, NULL, L->f_exp_down, Hp, Ip, io->expert_off,
                                   io->tiles, io->n_tiles, max_tiles, bm, rows, io->y, Hp, 1, 0, pipe, io->pf0,
                                   io->pf_e0, s);
  }
  if (!mma && tc) { /* gate/up + SiLU in one kernel, then down */
    DI_TRY(di_cuk_fp8_tc_grouped_gemv(x, Hp, io->perm_tok, L->f_exp_gu, 2 * Ip, Hp, io->expert_off, io->tiles,
                                      io->n_tiles, max_tiles, bm, bm, io->act, Ip, 0, 1, s));
    return di_cuk_fp8_tc_grouped_gemv((const uint16_t *)io->act, Ip, NULL, L->f_exp_down, Hp, Ip, io->expert_off,
                                      io->tiles, io->n_tiles, max_tiles, bm, bm, io->y, Hp, 1, 0, s);
  }
  if (!mma && b->fp8_fuse && !b->invariant && di_cuk_fp8_gemv_vec_ok(Hp, io->x, Hp, L->f_exp_gu) &&
      di_cuk_fp8_gemv_vec_ok(Ip, io->act, Ip, L->f_exp_down)) { /* gate/up + SiLU in one kernel; one token: down + combine */
    const int rows = T <= GEMV_MAX_T ? T : 16;
    DI_TRY(di_cuk_fp8_grouped_gemv_form(x, Hp, io->perm_tok, L->f_exp_gu, 2 * Ip, Hp, io->expert_off, io->tiles,
                                        io->n_tiles, max_tiles, bm, rows, io->act, Ip, 0, 1, s));
    if (down_combine) /* (one GPU only: the step's own routing in topk_ids / topk_w / inv) */
      return di_cuk_fp8_down_combine((const uint16_t *)io->act, Ip, L->f_exp_down, Hp, Ip, b->topk_ids, b->topk_w,
                                     b->inv, b->Kt, b->h, b->H, s);
    return di_cuk_fp8_grouped_gemv((const uint16_t *)io->act, Ip, NULL, L->f_exp_down, Hp, Ip, io->expert_off,
                                   io->tiles, io->n_tiles, max_tiles, bm, rows, io->y, Hp, 1, s);
  }
  if (!mma) {
    const int rows = b->invariant ? 1 : T <= GEMV_MAX_T ? T : 16;
    DI_TRY(di_cuk_fp8_grouped_gemv(x, Hp, io->perm_tok, L->f_exp_gu, 2 * Ip, Hp, io->expert_off, io->tiles,
                                   io->n_tiles, max_tiles, bm, rows, io->egu, 2 * Ip, 0, s));
    DI_TRY(di_cuk_silu_mul((const uint16_t *)io->egu, A, Ip, (uint16_t *)io->act, s));
    return di_cuk_fp8_grouped_gemv((const uint16_t *)io->act, Ip, NULL, L->f_exp_down, Hp, Ip, io->expert_off,
                                   io->tiles, io->n_tiles, max_tiles, bm, rows, io->y, Hp, 1, s);
  }
  uint8_t *xq;
  float *sx;
  int ldq, lds;
  DI_TRY(di_cuk_fp8_quant_ws(x, Hp, io->x_rows, Hp, b->fp8_ws, b->fp8_ws_bytes, &xq, &ldq, &sx, &lds, s));
  DI_TRY(di_cuk_fp8_grouped_gemm(xq, ldq, sx, lds, io->perm_tok, L->f_exp_gu, 2 * Ip, Hp, io->expert_off, io->tiles,
                                 io->n_tiles, max_tiles, bm, io->egu, 2 * Ip, 0, s));
  DI_TRY(di_cuk_silu_mul((const uint16_t *)io->egu, A, Ip, (uint16_t *)io->act, s));
  DI_TRY(di_cuk_fp8_quant_ws((const uint16_t *)io->act, Ip, A, Ip, b->fp8_ws, b->fp8_ws_bytes, &xq, &ldq, &sx, &lds, s));
  return di_cuk_fp8_grouped_gemm(xq, ldq, sx, lds, NULL, L->f_exp_down, Hp, Ip, io->expert_off, io->tiles,
                                 io->n_tiles, max_tiles, bm, io->y, Hp, 1, s);
}

/* The shared experts when they are not folded into the grouped GEMM: added into h (on b->stream) */
static di_status shared_experts(cu_backend *b, const cu_layer *L, int T) {
  if (!L->has_shared || b->n_sh > 0) return DI_OK;
  if (L->f_sh_gu.q) return mlp_dense_fp8(b, T, &L->f_sh_gu, &L->f_sh_down, b->Ish);
  return mlp_dense(b, T, L->sh_gu, L->sh_down, b->Ish);
}

#define PROF(label) prof_mark(b, label)

static void prof_mark(cu_backend *b, const char *label) {
  if (!b->prof || b->n_marks >= MAX_MARKS) return;
  cudaEventRecord(b->marks[b->n_marks], b->stream);
  b->mark_label[b->n_marks++] = label;
}

/* The expert products (cuda_ep.cuh), on one GPU over the step's rows and under expert parallel over
 * the received ones: FP8 experts on their batch-invariant kernels; decode-sized steps (T <= GEMV_MAX_T)
 * and the invariant mode off the tensor cores as grouped GEMVs (a row's arithmetic there does not
 * depend on the rows beside it, up to GEMV_MAX_T at a time); else, and in the invariant mode on tensor
 * cores, the grouped GEMM (a row's chain of mma steps does not depend on the tile size or on how many
 * rows its expert has: test_cuda_tc_gemm). */
di_status cu_routed_experts(cu_backend *b, const cu_layer *L, const cu_expert_rows *io) {
  if (L->f_exp_gu.q) return experts_fp8(b, L, io, 0);
  cudaStream_t s = b->stream;
  const uint16_t *x = (const uint16_t *)io->x;
  const int Hp = b->Hp, Ip = b->Ip;
  if ((io->T <= GEMV_MAX_T || b->invariant) && !di_cu_blas_tc_invariant(b->blas)) {
    const int gv_rows = io->T < GEMV_MAX_T ? io->T : GEMV_MAX_T;
    DI_TRY(di_cuk_grouped_gemv(x, Hp, io->perm_tok, (const uint16_t *)L->exp_gu, 2 * Ip, Hp, io->expert_off, io->tiles,
                               io->n_tiles, io->max_tiles, io->bm, gv_rows, io->act, Ip, 0, 1, io->pf0, io->pf_e0, s));
    PROF("experts gate/up");
    return di_cuk_grouped_gemv((const uint16_t *)io->act, Ip, NULL, (const uint16_t *)L->exp_down, Hp, Ip,
                               io->expert_off, io->tiles, io->n_tiles, io->max_tiles, io->bm, gv_rows, io->y, Hp, 1, 0,
                               io->pf0, io->pf_e0, s);
  }
  DI_TRY(di_cuk_grouped_gemm(x, Hp, io->perm_tok, (const uint16_t *)L->exp_gu, 2 * Ip, Hp, io->expert_off, io->tiles,
                             io->n_tiles, io->max_tiles, io->bm, io->act, Ip, 0, 1, s));
  PROF("experts gate/up");
  return di_cuk_grouped_gemm((const uint16_t *)io->act, Ip, NULL, (const uint16_t *)L->exp_down, Hp, Ip,
                             io->expert_off, io->tiles, io->n_tiles, io->max_tiles, io->bm, io->y, Hp, 1, 0, s);
}

/* Whether layer L's attention norm is done inside its q/kv product (decode-sized steps, normed_gemm):
 * bf16 weights through di_cu_gemm_normed; FP8 ones (DEEPINFER_CUDA_FP8_FUSE, on) through the CUDA-core
 * FP8 GEMV's normed form where that GEMV takes the step (1-2 rows, not the batch-invariant mode). */
static int qkv_normed(const cu_backend *b, const cu_layer *L, int T, int normed_gemm) {
  if (!normed_gemm) return 0;
  if (L->qkv_a) return 1;
  return L->f_qkv_a.q && b->fp8_fuse && !b->invariant && !di_cuk_fp8_tc_use(T, 0) &&
         T <= di_cuk_fp8_gemv_max_rows() && di_cuk_fp8_gemv_normed_ok(b->H, b->h, b->H, L->attn_norm, L->f_qkv_a);
}

/* One decoder layer on b->h (T rows): main layer l, or the MTP layer (l = n_layers + i). *xn_ready_io:
 * in, the previous layer's MoE combine already wrote this layer's normed input to xn; out, the same
 * for the layer after it. normed_gemm: decode-sized steps norm inside the q/kv GEMM (see forward). */
di_status layer_step(cu_backend *b, int l, int *xn_ready_io, int normed_gemm) {
  cudaStream_t s = b->stream;
  const int T = b->Tp, H = b->H, Hp = b->Hp, NH = b->NH;
  const uint16_t *xn = (const uint16_t *)b->xn;
  int xn_ready = *xn_ready_io;
  const cu_layer *L = &b->L[l];
  if (!xn_ready && qkv_normed(b, L, T, normed_gemm)) { /* decode: the attention norm inside the q/kv GEMM */
    if (!SKIP(SKIP_QKV) && L->f_qkv_a.q)
      DI_TRY(di_cuk_fp8_gemv_normed(T, b->Wa, H, b->h, H, L->attn_norm, b->eps, L->f_qkv_a, (uint16_t *)b->qkv, b->Wa,
                                    s));
    else if (!SKIP(SKIP_QKV))
      DI_TRY(di_cu_gemm_normed(b->blas, T, b->Wa, H, b->h, H, L->attn_norm, b->eps, (const uint16_t *)L->qkv_a, H,
                               b->qkv, b->Wa, 0, s));
  } else {
    if (!xn_ready) DI_TRY(di_cuk_rmsnorm(b->h, H, L->attn_norm, T, H, b->eps, (uint16_t *)b->xn, Hp, NULL, s));
    PROF("norm");
    if (!SKIP(SKIP_QKV) && L->f_qkv_a.q) DI_TRY(fp8_mm(b, T, b->Wa, H, b->xn, Hp, &L->f_qkv_a, b->qkv, b->Wa, 0, 0.f));
    else if (!SKIP(SKIP_QKV))
      DI_TRY(di_cu_gemm(b->blas, T, b->Wa, H, xn, Hp, (const uint16_t *)L->qkv_a, H, b->qkv, b->Wa, 0, 0.f, s));
  }
  xn_ready = 0;
  const uint16_t *q, *kva;
  int ldq;
  if (b->qr > 0) {
    DI_TRY(di_cuk_rmsnorm_bf16((const uint16_t *)b->qkv, b->Wa, L->q_a_norm, T, b->qr, b->eps, (uint16_t *)b->qa_n,
                               b->qr, s));
    if (L->f_q_b.q) DI_TRY(fp8_mm(b, T, NH * b->dqk, b->qr, b->qa_n, b->qr, &L->f_q_b, b->q, NH * b->dqk, 0, 0.f));
    else
      DI_TRY(di_cu_gemm(b->blas, T, NH * b->dqk, b->qr, (const uint16_t *)b->qa_n, b->qr, (const uint16_t *)L->q_b,
                        b->qr, b->q, NH * b->dqk, 0, 0.f, s));
    q = (const uint16_t *)b->q;
    ldq = NH * b->dqk;
    kva = (const uint16_t *)b->qkv + b->qr;
  } else {
    q = (const uint16_t *)b->qkv;
    ldq = b->Wa;
    kva = (const uint16_t *)b->qkv + NH * b->dqk;
  }
  PROF("q/kv proj");
  void *cache = layer_cache(b, l);
  const int kv8 = b->kv_fp8;
  const uint16_t *wuk = (const uint16_t *)L->kv_b; /* W_UK[h] = kv_b rows h*(dn+dv) .. +dn, [dn][R] */
  const int64_t wuk_stride = (int64_t)(b->dn + b->dv) * b->R;
  /* (bit-equal to the two kernels it replaces: test_mla_prep_absorb; so batch-invariant mode too) */
  /* (not with the invariant tensor-core GEMMs: the absorption must then be theirs at every step) */
  if (!SKIP(SKIP_PREP) && !SKIP(SKIP_ABSORB) && !di_cu_blas_tc_invariant(b->blas) &&
      di_cuk_mla_prep_absorb_ok(T, NH, b->R, wuk, b->R, wuk_stride)) {
    /* decode: both in one launch */
    DI_TRY(di_cuk_mla_prep_absorb(kva, b->Wa, q, ldq, b->d_pos, b->d_slots, T, NH, b->dn, b->dr, b->R, L->kv_a_norm,
                                  b->eps, b->rope, (uint16_t *)b->Qa, cache, kv8, wuk, b->R, wuk_stride, s));
  } else if (b->inv_prep_absorb && b->invariant && di_cu_blas_tc_invariant(b->blas) && !b->mha_step &&
             b->dqk % 8 == 0 && !SKIP(SKIP_PREP) && !SKIP(SKIP_ABSORB) &&
             (L->wuk_t && T <= DI_ABSORB_NK_MAX_SMALL_T
                  ? di_cuk_tc_gemm_prep_ok(T, b->R, b->dn, ldq, b->dn, 0, q, L->wuk_t, NH)
                  : di_cuk_tc_gemm_prep_ok(T, b->R, b->dn, ldq, b->R, 1, q, L->kv_b, NH))) {
    /* the invariant mode's decode steps: the prep in the absorption's launch (the two kernels' bits below) */
    const int nk = L->wuk_t && T <= DI_ABSORB_NK_MAX_SMALL_T;
    DI_TRY(di_cuk_tc_gemm_prep(NH, T, b->R, b->dn, q, ldq, b->dqk, nk ? (const uint16_t *)L->wuk_t : wuk,
                               nk ? b->dn : b->R, nk ? (int64_t)b->R * b->dn : wuk_stride, !nk, (uint16_t *)b->Qa,
                               NH * DI_CUK_MLA_D, DI_CUK_MLA_D, kva, b->Wa, q, ldq, b->d_pos, b->d_slots, T, NH, b->dn,
                               b->dr, b->R, L->kv_a_norm, b->eps, b->rope, (uint16_t *)b->Qa, cache, kv8, s));
  } else {
    if (!SKIP(SKIP_PREP))
      DI_TRY(di_cuk_mla_prep(kva, b->Wa, q, ldq, b->d_pos, b->d_slots, T, NH, b->dn, b->dr, b->R, L->kv_a_norm, b->eps,
                           b->rope, (uint16_t *)b->Qa, cache, kv8, s));
    /* q_lat[t][h] = q_nope[t][h] . W_UK[h]  (W_UK[h] = kv_b rows h*(dn+dv) .. +dn, [dn][R]); not needed by
     * the MHA form */
    if (!SKIP(SKIP_ABSORB) && !b->mha_step && b->invariant && L->wuk_t &&
        (T <= DI_ABSORB_NK_MAX_SMALL_T || T >= DI_ABSORB_NK_MIN_T)) /* the W [N][K] copy: the same bits */
      DI_TRY(di_cu_gemm_batched(b->blas, NH, T, b->R, b->dn, q, ldq, b->dqk, (const uint16_t *)L->wuk_t, b->dn,
                                (int64_t)b->R * b->dn, 0, (uint16_t *)b->Qa, NH * DI_CUK_MLA_D, DI_CUK_MLA_D, s));
    else if (!SKIP(SKIP_ABSORB) && !b->mha_step)
      DI_TRY(di_cu_gemm_batched(b->blas, NH, T, b->R, b->dn, q, ldq, b->dqk, (const uint16_t *)L->kv_b, b->R,
                              (int64_t)(b->dn + b->dv) * b->R, 1, (uint16_t *)b->Qa, NH * DI_CUK_MLA_D, DI_CUK_MLA_D, s));
  }
  PROF("mla prep+absorb");
  /* decode with one cluster per row group: W_UV applied in the attention kernel's epilogue */
  const int fold_uv = !b->mha_step && b->attn_cl && b->max_citems == 0 && di_cuk_uv_fold_ok(b->dv, b->R) && !SKIP(SKIP_VO) &&
                      b->fold_uv;
  const di_cuk_uv_fold fold = {(const uint16_t *)(L->kv_b + (int64_t)b->dn * b->R), (int64_t)(b->dn + b->dv) * b->R,
                               b->R, b->dv, NH * b->dv, (uint16_t *)b->attn};
  /* the fixed split's decode form (16-row items of a bf16 cache; =1 where the step's items fit one CTA an SM:
   * decided by the graph's shape only), merging its own partials if asked */
  const int dec_form = !b->mha_step && b->attn_fixed && b->bm == 16 && !kv8 &&
                       (b->fixed_dec == 2 || (b->fixed_dec == 1 && b->max_items <= b->sms));
  const int dec_merge = dec_form && b->fixed_dec_merge && b->max_citems > 0;
  if (!SKIP(SKIP_ATTN) && b->mha_step) { /* prefill in the MHA form (k_mha_prefill.cu): out is per-head v */
    const int wkv = NH * (b->dn + b->dv);
    DI_TRY(di_cuk_mha_gather(cache, kv8, b->d_mha_slots, b->n_mha_keys, (uint16_t *)b->mha_g, s));
    DI_TRY(di_cu_gemm(b->blas, b->n_mha_keys, wkv, b->R, (const uint16_t *)b->mha_g, DI_CUK_MLA_D,
                      (const uint16_t *)L->kv_b, b->R, b->mha_kv, wkv, 0, 0.f, s));
    DI_TRY(di_cuk_mha_prefill(q, ldq, b->dqk, (const uint16_t *)b->Qa, (const uint16_t *)b->mha_kv, wkv,
                              (const uint16_t *)b->mha_g, b->d_pos, b->d_mha_items, b->n_mha_items, NH, b->dn, b->dr,
                              b->dv, b->base.cfg->softmax_scale, (uint16_t *)b->attn, NH * b->dv, s));
  } else if (!SKIP(SKIP_ATTN) && b->attn_fixed && b->bm == 64) /* ... on tensor cores (k_mla_fixed_tc.cu; cuda_step.cu
                                                               * picks 64-row items for bf16 caches only) */
    DI_TRY(di_cuk_mla_attn_fixed_tc((const uint16_t *)b->Qa, (const uint16_t *)cache, b->d_bt, b->bt_stride, b->d_pos,
                                    NH, b->base.cfg->softmax_scale, b->attn_fixed, b->d_items, b->d_nitems,
                                    b->max_items, (uint16_t *)b->olat, b->part_o, b->part_lse, b->tc_slots, s));
  else if (!SKIP(SKIP_ATTN) && dec_form) /* its decode form, the same bits */
    DI_TRY(di_cuk_mla_attn_fixed_dec((const uint16_t *)b->Qa, (const uint16_t *)cache, b->d_bt, b->bt_stride, b->d_pos,
                                     NH, b->base.cfg->softmax_scale, b->attn_fixed, b->d_items, b->d_nitems,
                                     b->max_items, 2, (uint16_t *)b->olat, b->part_o, b->part_lse,
                                     dec_merge ? b->part_cnt : NULL, s));
  else if (!SKIP(SKIP_ATTN) && b->attn_fixed) /* the fixed-split form (k_mla_fixed.cu; cuda_step.cu's items) */
    DI_TRY(di_cuk_mla_attn_fixed((const uint16_t *)b->Qa, cache, kv8, b->d_bt, b->bt_stride, b->d_pos, NH,
                                 b->base.cfg->softmax_scale, b->attn_fixed, b->d_items, b->d_nitems, b->max_items,
                                 b->bm, (uint16_t *)b->olat, b->part_o, b->part_lse, s));
  else if (!SKIP(SKIP_ATTN) && b->attn_cl)
    DI_TRY(di_cuk_mla_attn_cluster((const uint16_t *)b->Qa, cache, kv8, b->d_bt, b->bt_stride, b->d_pos,
                                   NH, b->base.cfg->softmax_scale, b->d_items, b->d_nitems, b->max_items,
                                   b->attn_cl, b->invariant, (uint16_t *)b->olat, b->part_o, b->part_lse,
                                   fold_uv ? &fold : NULL, s));
  else if (!SKIP(SKIP_ATTN))
    DI_TRY(di_cuk_mla_attn((const uint16_t *)b->Qa, cache, kv8, b->d_bt, b->bt_stride, b->d_pos, NH,
                         b->base.cfg->softmax_scale, b->d_items, b->d_nitems, b->max_items, b->bm,
                         (uint16_t *)b->olat, b->part_o, b->part_lse, s));
  if (!b->mha_step && b->max_citems > 0 && !SKIP(SKIP_ATTN) && b->attn_fixed && dec_merge)
    ; /* merged by the decode form */
  else if (!b->mha_step && b->max_citems > 0 && !SKIP(SKIP_ATTN) && b->attn_fixed)
    DI_TRY(di_cuk_mla_combine_fixed(b->d_citems, b->d_ncitems, b->max_citems, b->part_o, b->part_lse,
                                    (uint16_t *)b->olat, s));
  else if (!b->mha_step && b->max_citems > 0 && !SKIP(SKIP_ATTN))
    DI_TRY(di_cuk_mla_combine(b->d_citems, b->d_ncitems, b->max_citems, b->part_o, b->part_lse,
                              (uint16_t *)b->olat, s));
  PROF("mla attention");
  /* v[t][h] = W_UV[h] . o_lat[t][h]  (W_UV[h] = kv_b rows h*(dn+dv)+dn .. +dv, [dv][R]), then o_proj into
   * h: at one token both in one kernel (DEEPINFER_CUDA_VO_FUSED=0: the two GEMMs) */
  /* (an FP8 o_proj: the kernel's FP8 form, DEEPINFER_CUDA_FP8_FUSE) */
  const int vo_fused = b->vo_fused && !b->mha_step && !fold_uv && !SKIP(SKIP_VO) &&
                       (L->o_proj ? di_cuk_mla_vo_ok(T, NH, H, b->R, b->dv)
                                  : b->fp8_fuse && di_cuk_mla_vo_fp8_ok(T, NH, H, b->R, b->dv, &L->f_o));
  if (vo_fused && L->o_proj)
    DI_TRY(di_cuk_mla_vo((const uint16_t *)b->olat, DI_CUK_MLA_R, (const uint16_t *)(L->kv_b + (int64_t)b->dn * b->R),
                         (int64_t)(b->dn + b->dv) * b->R, b->R, b->dv, (const uint16_t *)L->o_proj, NH * b->dv, NH, H,
                         b->h, s));
  else if (vo_fused)
    DI_TRY(di_cuk_mla_vo_fp8((const uint16_t *)b->olat, DI_CUK_MLA_R, (const uint16_t *)(L->kv_b + (int64_t)b->dn * b->R),
                             (int64_t)(b->dn + b->dv) * b->R, b->R, b->dv, &L->f_o, NH, H, b->h, s));
  if (!SKIP(SKIP_VO) && !fold_uv && !vo_fused && !b->mha_step) /* (the MHA form's output is v already) */
    DI_TRY(di_cu_gemm_batched(b->blas, NH, T, b->dv, b->R, (const uint16_t *)b->olat, NH * DI_CUK_MLA_R,
                            DI_CUK_MLA_R, (const uint16_t *)(L->kv_b + (int64_t)b->dn * b->R), b->R,
                            (int64_t)(b->dn + b->dv) * b->R, 0, (uint16_t *)b->attn, NH * b->dv, b->dv, s));
  if (!SKIP(SKIP_VO) && L->f_o.q && !vo_fused)
    DI_TRY(fp8_mm(b, T, H, NH * b->dv, b->attn, NH * b->dv, &L->f_o, b->h, H, 1, 1.f));
  else if (!SKIP(SKIP_VO) && !vo_fused)
    DI_TRY(di_cu_gemm(b->blas, T, H, NH * b->dv, (const uint16_t *)b->attn, NH * b->dv, (const uint16_t *)L->o_proj,
                    NH * b->dv, b->h, H, 1, 1.f, s));
  PROF("v + o_proj");
  /* small steps: the MoE gate's norm, router logits and routing are one kernel (di_cuk_moe_gate) */
  /* (xn, logits, ids and weights bit-equal to the unfused kernels: test_moe_gate; so batch-invariant mode too) */
  const int fused_gate = L->is_moe && T <= GATE_FUSE_MAX_T && di_cuk_moe_gate_supported(b->E, H);
  if (!fused_gate)
    DI_TRY(di_cuk_rmsnorm(b->h, H, L->ffn_norm, T, H, b->eps, (uint16_t *)b->xn, Hp, L->is_moe ? b->xf : NULL, s));
  if (!L->is_moe) {
    if (L->f_gate_up.q) DI_TRY(mlp_dense_fp8(b, T, &L->f_gate_up, &L->f_down, b->Idense));
    else DI_TRY(mlp_dense(b, T, L->gate_up, L->down, b->Idense));
    PROF("dense mlp");
    *xn_ready_io = 0;
    return DI_OK;
  }
  const int E = b->E, Et = b->Et, Kt = b->Kt, A = T * Kt, bm = A >= 32 * Et || fp8_tcg_step(b, L, T) ? 64 : 16;
  int max_tiles = (A + bm - 1) / bm + Et;
  if (max_tiles > A) max_tiles = A;
  const di_cuk_perm pm = {bm, b->perm_tok, b->inv, b->expert_off, b->tiles, b->n_tiles};
  if (SKIP(SKIP_GATE)) {
  } else if (fused_gate) {
    DI_TRY(di_cuk_moe_gate(b->h, L->ffn_norm, b->eps, T, H, (const uint16_t *)L->router, L->router_bias, b->router,
                           (uint16_t *)b->xn, Hp, b->router_logits, b->topk_ids, b->topk_w, &pm, s));
  } else {
    DI_TRY(di_cuk_router_logits(b->xf, (const uint16_t *)L->router, T, E, H, b->router_logits, s));
    DI_TRY(di_cuk_moe_route(b->router_logits, L->router_bias, T, b->router, b->topk_ids, b->topk_w, &pm, s));
  }
  if (T > 1 && !SKIP(SKIP_GATE))
    DI_TRY(di_cuk_moe_permute(b->topk_ids, A, Kt, Et, bm, b->perm_tok, b->inv, b->expert_off, b->tiles, b->n_tiles, s));
  PROF("router");
  const int next_normed = l + 1 < b->n_layers && qkv_normed(b, &b->L[l + 1], T, normed_gemm);
  const int down_combine = normed_gemm && T == 1 && !b->invariant && !(L->has_shared && b->n_sh == 0) &&
                           !SKIP(SKIP_EXPERTS) && !b->ep &&
                           (!L->f_exp_gu.q || (b->fp8_fuse && next_normed && !di_cuk_fp8_tc_use(T, 0) &&
                                               di_cuk_fp8_gemv_vec_ok(Hp, b->xn, Hp, L->f_exp_gu) &&
                                               di_cuk_fp8_gemv_vec_ok(b->Ip, b->act, b->Ip, L->f_exp_down)));
  const int32_t *inv = b->inv; /* where the combine finds (token, slot)'s output in y */
  /* the invariant mode's combine (and the next layer's norm) in the down GEMM's last CTAs
   * (DEEPINFER_CUDA_INV_DOWN_COMBINE: the bits of the grouped GEMM + di_cuk_moe_combine below) */
  const int inv_dc = b->invariant && T <= b->inv_down_combine && !L->f_exp_gu.q && !b->ep && !SKIP(SKIP_EXPERTS) &&
                     !SKIP(SKIP_COMBINE) && !(L->has_shared && b->n_sh == 0) && !down_combine &&
                     di_cu_blas_tc_invariant(b->blas) && b->gg_cnt &&
                     di_cuk_grouped_gemm_combine_ok(Hp, b->Ip, b->Ip, b->act, bm, H, Kt, T);
  const int fuse = l + 1 < b->n_layers && !(L->has_shared && b->n_sh == 0) && !down_combine && !next_normed;
  int shared_done = 0;
  if (b->ep && L->has_shared && b->n_sh == 0 && cu_ep_side_stream(b)) {
    /* expert parallel (DEEPINFER_CUDA_EP_OVERLAP, on by default): the shared experts on the side stream while the
     * routed rows are exchanged and computed on the main one; the combine waits for both. The same
     * arithmetic as in order (shared adds into h, the combine adds the routed after), so the same bits */
    const cudaStream_t main_stream = b->stream;
    DI_TRY(cu_ep_side_begin(b));
    b->stream = (cudaStream_t)cu_ep_side_stream(b);
    const di_status st = shared_experts(b, L, T);
    b->stream = main_stream;
    DI_TRY(st);
    DI_TRY(cu_ep_moe(b, l, T, &inv));
    DI_TRY(cu_ep_side_end(b));
    shared_done = 1;
  } else if (b->ep) { /* expert parallel: the experts on their ranks (cuda_ep.cu); y in slot order */
    DI_TRY(cu_ep_moe(b, l, T, &inv));
  } else if (!SKIP(SKIP_EXPERTS)) {
    const int pf0 = T == 1 && L->has_shared && b->n_sh > 0 ? Kt - b->n_sh : -1; /* shared experts: last tiles */
    if (down_combine && L->f_exp_gu.q) { /* FP8 experts, one token: down + combine in one kernel too */
      const cu_expert_rows io = {b->xn, T, b->perm_tok, b->expert_off, b->tiles, b->n_tiles, max_tiles, bm, A, T,
                                 pf0, E, b->act, b->egu, b->y};
      DI_TRY(experts_fp8(b, L, &io, 1));
    } else if (down_combine) { /* one token: the down projection adds the weighted outputs to h itself */
      DI_TRY(di_cuk_grouped_gemv(xn, Hp, b->perm_tok, (const uint16_t *)L->exp_gu, 2 * b->Ip, Hp, b->expert_off,
                                 b->tiles, b->n_tiles, max_tiles, bm, 1, b->act, b->Ip, 0, 1, pf0, E, s));
      PROF("experts gate/up");
      DI_TRY(di_cuk_moe_down_combine((const uint16_t *)b->act, b->Ip, (const uint16_t *)L->exp_down, Hp, b->Ip,
                                     b->topk_ids, b->topk_w, b->inv, Kt, b->h, H, E, pf0 >= 0 ? b->n_sh : 0, s));
    } else if (inv_dc) {
      DI_TRY(di_cuk_grouped_gemm(xn, Hp, b->perm_tok, (const uint16_t *)L->exp_gu, 2 * b->Ip, Hp, b->expert_off,
                                 b->tiles, b->n_tiles, max_tiles, bm, b->act, b->Ip, 0, 1, s));
      PROF("experts gate/up");
      DI_TRY(di_cuk_grouped_gemm_combine((const uint16_t *)b->act, b->Ip, (const uint16_t *)L->exp_down, Hp, b->Ip,
                                         b->expert_off, b->tiles, b->n_tiles, max_tiles, bm, b->y, Hp, b->inv,
                                         b->topk_w, T, Kt, H, b->h, fuse ? b->L[l + 1].attn_norm : NULL, b->eps,
                                         (uint16_t *)b->xn, Hp, b->gg_cnt, s));
    } else {
      const cu_expert_rows io = {b->xn, T, b->perm_tok, b->expert_off, b->tiles, b->n_tiles, max_tiles, bm, A, T,
                                 pf0, E, b->act, b->egu, b->y};
      DI_TRY(cu_routed_experts(b, L, &io));
    }
  }
  PROF("experts down");
  if (!shared_done) DI_TRY(shared_experts(b, L, T));
  /* the combine writes the next layer's normed input unless that layer norms inside its q/kv product */
  if (!SKIP(SKIP_COMBINE) && !down_combine && !inv_dc)
    DI_TRY(di_cuk_moe_combine(b->y, Hp, inv, b->topk_w, T, Kt, H, b->h, fuse ? b->L[l + 1].attn_norm : NULL,
                            b->eps, (uint16_t *)b->xn, Hp, s));
  *xn_ready_io = fuse;
  PROF("combine");
  return DI_OK;
}

di_status forward(cu_backend *b) {
  cudaStream_t s = b->stream;
  const int T = b->Tp, H = b->H;
  b->n_marks = 0;
  PROF("start");
  DI_TRY(di_cuk_embed((const uint16_t *)b->embed, b->d_tokens, b->d_sample_out, T, H, b->h, s));
  if (b->n_capture) DI_TRY(capture_layer(b, -1));
  int xn_ready = 0; /* the MoE combine already wrote this layer's normed input */
  /* decode-sized steps: each layer's attention norm is done by its q/kv GEMM, and a one-token step's
   * MoE down projection adds the weighted expert outputs to h itself (DEEPINFER_CUDA_DOWN_COMBINE=0:
   * the separate combine kernel, which then also writes the next layer's normed input) */
  const int normed_gemm = b->down_combine && di_cu_gemm_normed_ok(b->blas, T, H, H);
  for (int l = 0; l < b->n_layers; l++) {
    DI_TRY(layer_step(b, l, &xn_ready, normed_gemm));
    if (b->n_capture) DI_TRY(capture_layer(b, l));
  }
  /* the output head's rows: every output row, or only the wanted ones (lg_gather, cuda_step.cu) */
  const int n_lg = b->lg_gather ? b->n_lg_p : b->n_out_p;
  DI_TRY(di_cuk_rmsnorm_rows(b->h, H, b->lg_gather ? b->d_lg_rows : b->d_out_rows, b->final_norm, n_lg, H, b->eps,
                             (uint16_t *)b->hn, H, s));
  if (!SKIP(SKIP_LMHEAD))
    DI_TRY(di_cu_gemm(b->blas, n_lg, b->V, H, (const uint16_t *)b->hn, H, (const uint16_t *)b->lm_head, H,
                    b->logits, b->V, 1, 0.f, s));
  PROF("lm_head");
  if (b->step_sample) DI_TRY(di_cuk_sample(b->logits, b->n_out_p, b->V, b->d_step_rows, b->d_sample_out, s));
  /* DSpark: the next block proposed from this step's samples, in the same graph (cuda_dspark.cu) */
  if (b->prop_on && b->step_sample && !b->prop_defer) DI_TRY(b->prop_forward(b->prop_ctx));
  return DI_OK;
}

/* The architecture's shapes (router, rotary, padded widths) and weights to the device: the main layers,
 * then the MTP layer when loaded (b->n_mtp, set by create). */
/* The batch-invariant absorption's W [N][K] copies of W_UK (DEEPINFER_CUDA_ABSORB_NK): W [K][N] products run
 * on the mma.sync kernel only, W [N][K] ones on the hybrid core (TMA wgmma above 8 rows), with the same
 * chains, so the same bits (test_cuda_tc_gemm checks both forms against each other). 2 MB a V2-Lite layer. */
di_status ds2_wuk_t(cu_backend *b) {
  for (int l = 0; l < b->n_layers + b->n_mtp; l++) {
    cu_layer *L = &b->L[l];
    if (L->wuk_t || !L->kv_b || b->dn % 8 || b->R % 8) continue;
    DI_TRY(dev_alloc(b, (void **)&L->wuk_t, (size_t)b->NH * b->R * b->dn * 2));
    DI_TRY(di_cuk_mla_wuk_transpose((const uint16_t *)L->kv_b, b->NH, b->dn, b->dv, b->R, (uint16_t *)L->wuk_t, NULL));
  }
  DI_CU(cudaDeviceSynchronize());
  return DI_OK;
}

di_status ds2_load(cu_backend *b, const di_model_config *c, const di_ds_weights *w) {
  b->cfg = c;
  b->H = c->hidden_size; b->NH = c->num_attention_heads; b->dn = c->qk_nope_head_dim; b->dr = c->qk_rope_head_dim;
  b->dv = c->v_head_dim; b->R = c->kv_lora_rank; b->dqk = b->dn + b->dr; b->V = c->vocab_size;
  b->qr = c->q_lora_rank; b->eps = c->rms_norm_eps; b->Idense = c->intermediate_size;
  b->E = c->n_routed_experts; b->K = c->n_routed_experts > 0 ? c->num_experts_per_tok : 0;
  b->Ip = (c->moe_intermediate_size + 63) / 64 * 64;
  b->Hp = b->E > 0 ? (b->H + 127) / 128 * 128 : b->H;
  b->Wa = (b->qr > 0 ? b->qr : b->NH * b->dqk) + b->R + b->dr;
  /* shared experts fold into the grouped GEMM when they are n_shared experts' worth of width */
  b->n_sh = 0;
  if (b->E > 0 && c->n_shared_experts > 0) {
    int fold = 1;
    for (int l = 0; l < w->n_layers; l++)
      if (w->layers[l].is_moe && w->layers[l].has_shared &&
          w->layers[l].sh_gate.rows != (int64_t)c->n_shared_experts * c->moe_intermediate_size)
        fold = 0;
    if (fold) b->n_sh = c->n_shared_experts;
  }
  DI_TRY(cu_ep_setup(b, c)); /* expert parallel: which experts live here (unfolds the shared ones) */
  cu_ep_set_weights(b, w);   /* EPLB uploads moved experts from them */
  b->Et = b->E + b->n_sh;
  b->Kt = b->K + b->n_sh;
  if (b->R > DI_CUK_MLA_R || b->dr > DI_CUK_MLA_P || b->dr % 2)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: kv_lora_rank %d / rope dim %d unsupported (<= %d / even <= %d)",
                        b->R, b->dr, DI_CUK_MLA_R, DI_CUK_MLA_P);
  if (b->E > 0 && b->K > 8)
    return di_error_set(DI_ERR_UNSUPPORTED, "cuda backend: MoE top-k <= 8 supported (got %d)", b->K);
  b->router.E = b->E; b->router.k = b->K; b->router.n_group = c->n_group; b->router.topk_group = c->topk_group;
  b->router.sigmoid = c->scoring_func == DI_SCORE_SIGMOID;
  b->router.method = c->topk_method == DI_TOPK_GREEDY ? 0 : c->topk_method == DI_TOPK_GROUP_LIMITED_GREEDY ? 1 : 2;
  b->router.norm_topk = c->norm_topk_prob;
  b->router.scale_after_norm = c->scale_after_renorm;
  b->router.routed_scale = c->routed_scaling_factor;
  b->router.n_shared = b->n_sh;
  b->router.block_route = di_switch_bool(DI_SW_CUDA_BLOCK_ROUTE, 0); /* A/B: the block-wide routing everywhere */
  double invf[DI_CUK_MLA_P / 2];
  float invf32[DI_CUK_MLA_P / 2];
  di_rope_inv_freq(c, invf);
  for (int i = 0; i < b->dr / 2; i++) invf32[i] = (float)invf[i];
  DI_TRY(up_vec(b, invf32, b->dr / 2, &b->inv_freq));
  b->rope.inv_freq = b->inv_freq;
  b->rope.attn_factor = c->rope_attention_factor;
  b->rope.interleave = c->rope_interleave;
  /* weights */
  DI_TRY(up_mat(b, &w->embed, b->V, b->H, &b->embed, "embed_tokens"));
  DI_TRY(up_mat(b, &w->lm_head, b->V, b->H, &b->lm_head, "lm_head"));
  DI_TRY(up_vec(b, w->final_norm, b->H, &b->final_norm));
  b->n_layers = w->n_layers;
  /* the MTP layer when the checkpoint has one (checked on the H200 against the CPU's MTP forward and
   * in speculative decoding); DEEPINFER_CUDA_MTP=0 leaves it on the host (no weights, no KV for it) */
  b->n_mtp = w->n_mtp > 0 && di_switch_bool(DI_SW_CUDA_MTP, 1) ? 1 : 0;
  b->L = (cu_layer *)calloc((size_t)(b->n_layers + b->n_mtp > 0 ? b->n_layers + b->n_mtp : 1), sizeof(cu_layer));
  if (!b->L) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
  for (int l = 0; l < b->n_layers + b->n_mtp; l++) DI_TRY(upload_layer(b, c, &w->layers[l], &b->L[l], l));
  if (b->n_mtp) {
    const di_ds_layer *m = &w->layers[w->n_layers];
    DI_TRY(up_vec(b, m->enorm, b->H, &b->mtp_enorm));
    DI_TRY(up_vec(b, m->hnorm, b->H, &b->mtp_hnorm));
    DI_TRY(up_vec(b, m->head_norm, b->H, &b->mtp_head_norm));
    DI_TRY(up_mat(b, &m->eh_proj, b->H, 2 * (int64_t)b->H, &b->mtp_eh, "eh_proj"));
    if (m->mtp_embed.data == w->embed.data) b->mtp_embed = b->embed;
    else DI_TRY(up_mat(b, &m->mtp_embed, b->V, b->H, &b->mtp_embed, "mtp embed_tokens"));
    if (m->head.data == w->lm_head.data) b->mtp_head = b->lm_head;
    else DI_TRY(up_mat(b, &m->head, b->V, b->H, &b->mtp_head, "shared_head.head"));
    b->base.n_mtp_layers = 1;
  }
  return DI_OK;
}
