/* The CUDA backend's device memory: every allocation recorded (freed together at destroy), the
 * activation buffers sized for a step's token / output / split counts (growth drops the captured
 * graphs, which hold the old pointers), and the paged latent KV pool. */
#include "cuda_backend_impl.cuh"
#include <stdlib.h>
#include <string.h>

/* ---- allocation --------------------------------------------------------------------------------- */

di_status dev_alloc(cu_backend *b, void **p, size_t bytes) {
  if (b->n_allocs == b->cap_allocs) {
    int nc = b->cap_allocs ? 2 * b->cap_allocs : 256;
    void **na = (void **)realloc(b->allocs, sizeof(void *) * (size_t)nc);
    if (!na) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
    b->allocs = na;
    b->cap_allocs = nc;
  }
  cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
  if (e != cudaSuccess)
    return di_error_set(DI_ERR_OOM, "cuda: cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
  b->allocs[b->n_allocs++] = *p;
  return DI_OK;
}

void dev_free(cu_backend *b, void *p) {
  if (!p) return;
  for (int i = 0; i < b->n_allocs; i++)
    if (b->allocs[i] == p) {
      cudaFree(p);
      b->allocs[i] = b->allocs[--b->n_allocs];
      return;
    }
}

/* ---- activations -------------------------------------------------------------------------------- */

void drop_graphs(cu_backend *b) {
  for (int i = 0; i < b->n_graphs; i++)
    if (b->graphs[i].exec) cudaGraphExecDestroy(b->graphs[i].exec);
  b->n_graphs = 0;
}

void drop_proposal_graphs(cu_backend *b) {
  int k = 0;
  for (int i = 0; i < b->n_graphs; i++) {
    if (b->graphs[i].prop_blk == 0) {
      b->graphs[k++] = b->graphs[i];
      continue;
    }
    if (b->graphs[i].exec) cudaGraphExecDestroy(b->graphs[i].exec);
  }
  b->n_graphs = k;
}


di_status ensure_acts(cu_backend *b, int T, int n_out, int n_parts) {
  if (T > b->cap_T) {
    int c = b->cap_T ? b->cap_T : 256;
    while (c < T) c *= 2;
    drop_graphs(b);
    b->cap_T = c;
    const int64_t A = (int64_t)c * b->Kt; /* expert assignments */
    int64_t act_w = (int64_t)b->Ip * A;
    if ((int64_t)b->Idense * c > act_w) act_w = (int64_t)b->Idense * c;
    if ((int64_t)b->Ish * c > act_w) act_w = (int64_t)b->Ish * c;
    int64_t gu_w = 2 * (int64_t)b->Idense * c;
    if (2 * (int64_t)b->Ish * c > gu_w) gu_w = 2 * (int64_t)b->Ish * c;
    REALLOC(b->h, sizeof(float) * (size_t)c * b->H);
    REALLOC(b->gg_cnt, sizeof(int32_t) * (size_t)(b->Hp / 64 + 1));
    DI_CU(cudaMemset(b->gg_cnt, 0, sizeof(int32_t) * (size_t)(b->Hp / 64 + 1))); /* the invariant down + combine's */
    REALLOC(b->xf, sizeof(float) * (size_t)c * b->H);
    REALLOC(b->xn, 2 * (size_t)c * b->Hp);
    DI_CU(cudaMemset(b->xn, 0, 2 * (size_t)c * b->Hp)); /* padding columns stay zero */
    REALLOC(b->qkv, 2 * (size_t)c * b->Wa);
    REALLOC(b->q, 2 * (size_t)c * b->NH * b->dqk);
    REALLOC(b->qa_n, 2 * (size_t)c * (b->qr > 0 ? b->qr : 1));
    REALLOC(b->Qa, 2 * (size_t)c * b->NH * DI_CUK_MLA_D);
    REALLOC(b->olat, 2 * (size_t)c * b->NH * DI_CUK_MLA_R);
    REALLOC(b->attn, 2 * (size_t)c * b->NH * b->dv);
    REALLOC(b->router_logits, sizeof(float) * (size_t)c * (b->E > 0 ? b->E : 1));
    REALLOC(b->topk_ids, sizeof(int32_t) * (size_t)(A > 0 ? A : 1));
    REALLOC(b->topk_w, sizeof(float) * (size_t)(A > 0 ? A : 1));
    REALLOC(b->perm_tok, sizeof(int32_t) * (size_t)(A > 0 ? A : 1));
    REALLOC(b->inv, sizeof(int32_t) * (size_t)(A > 0 ? A : 1));
    REALLOC(b->tiles, sizeof(int32_t) * (size_t)(A / 16 + b->Et + 1));
    REALLOC(b->expert_off, sizeof(int32_t) * (size_t)(b->Et + 1));
    REALLOC(b->n_tiles, sizeof(int32_t) * 4);
    REALLOC(b->gu, 2 * (size_t)(gu_w > 0 ? gu_w : 1));
    REALLOC(b->act, 2 * (size_t)(act_w > 0 ? act_w : 1));
    REALLOC(b->y, sizeof(float) * (size_t)(A > 0 ? A : 1) * b->Hp);
    if (b->fp8) { /* FP8 weights: quantized activations of any product of the step, the experts' gate/up */
      int kmax = b->Hp;
      const int ks[] = {b->qr, b->NH * b->dv, b->Idense, b->Ish, b->Ip};
      for (int i = 0; i < 5; i++) kmax = ks[i] > kmax ? ks[i] : kmax;
      size_t ws = di_cuk_fp8_ws_bytes(c, kmax);
      if (A > 0 && di_cuk_fp8_ws_bytes((int)A, b->Ip) > ws) ws = di_cuk_fp8_ws_bytes((int)A, b->Ip);
      if (b->fp8lt) { /* cuBLASLt's dense products: the widest N of a dense FP8 weight */
        int nmax = b->H;
        const int ns[] = {b->Wa, b->NH * b->dqk, 2 * b->Idense, 2 * b->Ish};
        for (int i = 0; i < 4; i++) nmax = ns[i] > nmax ? ns[i] : nmax;
        if (di_cu_fp8lt_ws_bytes(c, nmax, kmax) > ws) ws = di_cu_fp8lt_ws_bytes(c, nmax, kmax);
      }
      REALLOC(b->fp8_ws, ws);
      b->fp8_ws_bytes = ws;
      REALLOC(b->egu, 2 * (size_t)(A > 0 ? A : 1) * 2 * b->Ip);
    }
    /* the padded garbage rows of Qa's latent columns are rewritten every step; start finite */
    DI_CU(cudaMemset(b->Qa, 0, 2 * (size_t)c * b->NH * DI_CUK_MLA_D));
  }
  if (n_out > b->cap_out) {
    int c = b->cap_out ? b->cap_out : b->out_cap0;
    while (c < n_out) c *= 2;
    drop_graphs(b);
    /* with token feedback this step may read the last step's samples (d_sample_out, the embedding of
     * its -1 - row ids) and the host may still fetch them (a half of h_sample_out): both keep their
     * contents across the growth (rare: the capacity doubles), after the stream has drained */
    DI_CU(cudaStreamSynchronize(b->stream));
    const int old_cap = b->cap_out;
    int32_t *old_d = b->d_sample_out, *old_h = b->h_sample_out;
    b->d_sample_out = NULL;
    b->h_sample_out = NULL;
    REALLOC(b->hout, sizeof(float) * (size_t)c * b->H);
    REALLOC(b->hn, 2 * (size_t)c * b->H);
    REALLOC(b->logits, sizeof(float) * (size_t)c * b->V);
    REALLOC(b->d_sample_rows, sizeof(di_cuk_sample_row) * (size_t)c);
    DI_TRY(dev_alloc(b, (void **)&b->d_sample_out, sizeof(int32_t) * (size_t)c));
    if (old_d) {
      DI_CU(cudaMemcpy(b->d_sample_out, old_d, sizeof(int32_t) * (size_t)old_cap, cudaMemcpyDeviceToDevice));
      dev_free(b, old_d);
    }
    free(b->sub_rows);
    b->sub_rows = (di_sample_row *)malloc(sizeof(di_sample_row) * (size_t)c);
    if (!b->sub_rows) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
    cudaFreeHost(b->h_sample_rows);
    b->h_sample_rows = NULL;
    DI_CU(cudaMallocHost((void **)&b->h_sample_rows, sizeof(di_cuk_sample_row) * (size_t)c));
    DI_CU(cudaMallocHost((void **)&b->h_sample_out, 2 * sizeof(int32_t) * (size_t)c));
    if (old_h) {
      for (int half = 0; half < 2; half++)
        memcpy(b->h_sample_out + (size_t)half * c, old_h + (size_t)half * old_cap, sizeof(int32_t) * (size_t)old_cap);
      cudaFreeHost(old_h);
    }
    b->cap_out = c;
  }
  if (b->n_capture > 0 && b->cap_rows < b->cap_out) { /* the drafter's feature rows (cuda_dspark.cu) */
    drop_graphs(b);
    DI_CU(cudaStreamSynchronize(b->stream));
    REALLOC(b->cap_buf, sizeof(float) * (size_t)b->cap_out * b->n_capture * b->H);
    b->cap_rows = b->cap_out;
  }
  if (n_parts > b->cap_parts) {
    int c = b->cap_parts ? b->cap_parts : 512;
    while (c < n_parts) c *= 2;
    drop_graphs(b);
    b->cap_parts = c;
    REALLOC(b->part_o, sizeof(float) * (size_t)c * DI_CUK_ATTN_ROWS * DI_CUK_MLA_R);
    REALLOC(b->part_lse, sizeof(float) * (size_t)c * DI_CUK_ATTN_ROWS);
    REALLOC(b->part_cnt, sizeof(int32_t) * (size_t)c);
    DI_CU(cudaMemset(b->part_cnt, 0, sizeof(int32_t) * (size_t)c)); /* the decode form's merge counters start at zero */
  }
  return DI_OK;
}


int cu_kv_groups(di_backend *bb, di_kv_group_info *g, int cap) {
  cu_backend *b = (cu_backend *)bb; /* bf16 rows padded to DI_CUK_MLA_D, or FP8 entries; the MTP layer when it runs here */
  return di_ds_kv_groups(b->cfg, b->n_mtp, 1, (int)cu_kv_row_bytes(b), g, cap);
}

/* --kv-cache-dtype fp8 (before the pool exists): the latent cache in the CPU backend's FP8 entry format
 * (DI_CUK_KV8_ROW bytes a token and layer instead of 1,152), written by the MLA prep kernels and read,
 * dequantized, by every attention kernel (k_kv8.cuh) */
extern "C" di_status di_backend_cuda_set_kv_fp8(di_backend *bb, int on) {
  cu_backend *b = (cu_backend *)bb;
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: KV format change while a step is in flight");
  drop_graphs(b);
  dev_free(b, b->kv);
  b->kv = NULL;
  b->kv_fp8 = on ? 1 : 0;
  return DI_OK;
}

di_status cu_set_kv_fp8(di_backend *bb) {
  cu_backend *b = (cu_backend *)bb;
  if (b->kv) return di_error_set(DI_ERR_INTERNAL, "--kv-cache-dtype fp8: set after the KV pool was allocated");
  b->kv_fp8 = 1;
  return DI_OK;
}

/* the latent pool of n_blocks blocks (+1: the padding tokens' block), every layer and the MTP layer */
static size_t kv_pool_bytes(const cu_backend *b, int64_t n_blocks) {
  return (size_t)(b->n_layers + b->n_mtp) * (size_t)(n_blocks + 1) * DI_KV_BLOCK_SIZE * cu_kv_row_bytes(b);
}

di_status cu_kv_alloc(di_backend *bb, int64_t n_blocks) {
  cu_backend *b = (cu_backend *)bb;
  if (n_blocks <= 0) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: kv_alloc of %lld blocks", (long long)n_blocks);
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: kv_alloc while a step is in flight");
  drop_graphs(b);
  dev_free(b, b->kv);
  b->kv = NULL;
  const size_t bytes = kv_pool_bytes(b, n_blocks);
  DI_TRY(dev_alloc(b, (void **)&b->kv, bytes));
  DI_CU(cudaMemset(b->kv, 0, bytes));
  b->n_blocks = n_blocks;
  return DI_OK;
}


/* gpu_memory_utilization's inputs (backend.h): the largest step's activation and output buffers are
 * reserved first (they then count as used), then the device's total and in-use bytes are read. The
 * attention's partial-result slots and the CUDA graphs grow later; the (1 - utilization) headroom
 * covers them. A pool left by an earlier engine is not counted: the new engine's kv_alloc replaces it. */
di_status cu_memory_info(di_backend *bb, int max_step_tokens, int max_outputs, int64_t *total_bytes,
                         int64_t *used_bytes) {
  cu_backend *b = (cu_backend *)bb;
  DI_TRY(ensure_acts(b, max_step_tokens > 256 ? max_step_tokens : 256, max_outputs > 16 ? max_outputs : 16, 512));
  DI_CU(cudaDeviceSynchronize());
  size_t free_b = 0, total_b = 0;
  DI_CU(cudaMemGetInfo(&free_b, &total_b));
  /* a KV pool from an earlier engine over this backend is about to be replaced (kv_alloc frees it
   * first): it does not count as used */
  const size_t pool = b->kv ? kv_pool_bytes(b, b->n_blocks) : 0;
  *total_bytes = (int64_t)total_b;
  *used_bytes = (int64_t)(total_b - free_b) - (int64_t)pool;
  return DI_OK;
}
