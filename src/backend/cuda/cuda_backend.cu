/* The CUDA backend behind backend/backend.h's vtable: create (the device, the environment switches,
 * then the architecture's weights), destroy, and the backend's public extras. How a step runs, and the
 * other parts: cuda_backend_impl.cuh. */
#include "cuda_backend_impl.cuh"
#include <stdlib.h>
#include <string.h>


/* DEEPINFER_CUDA_SKIP=a,b,...: the phase bits of the list (cuda_backend_impl.cuh) */
static int parse_skip(const char *phases) {
  static const char *names[] = {"qkv", "prep", "absorb", "attn", "vo", "gate", "experts", "combine", "lmhead"};
  int m = 0;
  for (int i = 0; phases && i < 9; i++)
    if (strstr(phases, names[i])) m |= 1 << i;
  return m;
}

/* The profile's per-phase device time (DEEPINFER_CUDA_PROFILE=1 or di_backend_cuda_set_profile), decode-sized
 * and larger steps apart, to stderr; then cleared. */
static void prof_print(cu_backend *b, const char *title) {
  static const char *kind[2] = {"decode-sized", "prefill-sized"};
  for (int a = 0; a < 2; a++) {
    cu_backend::cu_prof_acc *pa = &b->prof_acc[a];
    if (!pa->steps) continue;
    double tot = 0;
    for (int k = 0; k < pa->n; k++) tot += pa->ms[k];
    fprintf(stderr, "cuda profile%s%s over %lld eager %s steps (device time per phase, all layers; %.3f ms a step):\n",
            *title ? " " : "", title, (long long)pa->steps, kind[a], tot / (double)pa->steps);
    for (int k = 0; k < pa->n; k++)
      fprintf(stderr, "  %-18s %10.3f ms  %5.1f%%\n", pa->label[k], pa->ms[k], 100.0 * pa->ms[k] / tot);
    memset(pa, 0, sizeof *pa);
  }
}

static void cu_destroy(di_backend *bb) {
  cu_backend *b = (cu_backend *)bb;
  if (!b) return;
  if (b->stream) cudaStreamSynchronize(b->stream);
  free(b->want_host);
  free(b->lg_out);
  if (b->prof) prof_print(b, "");
  if (di_switch_bool(DI_SW_CUDA_STATS, 0))
    fprintf(stderr, "cuda stats: steps %lld, graphs captured %lld, replays %lld, resamples %lld\n",
            (long long)b->stats.steps, (long long)b->stats.graph_captures, (long long)b->stats.graph_replays,
            (long long)b->stats.resamples);
  if (b->prof)
    for (int i = 0; i < MAX_MARKS; i++) if (b->marks[i]) cudaEventDestroy(b->marks[i]);
  if (b->ev_g0) cudaEventDestroy(b->ev_g0);
  for (int i = 0; i < 2; i++) if (b->ev_sampled[i]) cudaEventDestroy(b->ev_sampled[i]);
  if (b->ev_h2d) cudaEventDestroy(b->ev_h2d);
  if (b->ev_g1) cudaEventDestroy(b->ev_g1);
  drop_graphs(b);
  cu_ep_destroy(b);
  for (int i = 0; i < b->n_allocs; i++) cudaFree(b->allocs[i]);
  free(b->allocs);
  free(b->L);
  cudaFreeHost(b->in_host);
  cudaFreeHost(b->h_sample_rows);
  cudaFreeHost(b->h_sample_out);
  free(b->sub_rows);
  di_cu_blas_destroy(b->blas);
  di_cu_fp8lt_destroy(b->fp8lt);
  if (b->stream) cudaStreamDestroy(b->stream);
  free(b);
}

/* the graph buckets: a step of at most DI_CUDA_GRAPH_MAX_T tokens is padded to a power of two (cuda_step.cu) */
static int cu_graph_buckets(di_backend *bb, int *tokens, int cap) {
  const cu_backend *b = (const cu_backend *)bb;
  int n = 0;
  for (int t = 1; b->use_graphs && t <= DI_CUDA_GRAPH_MAX_T && n < cap; t *= 2) tokens[n++] = t;
  return n;
}

static const di_backend_ops CU_OPS = {"cuda", cu_kv_groups, cu_kv_alloc, cu_submit, cu_wait, cu_sample, cu_mtp,
                                      NULL /* release */, cu_sample_async, cu_sample_fetch, cu_destroy,
                                      cu_memory_info, NULL /* kv_alloc_groups */, cu_set_kv_fp8, cu_graph_buckets};

static di_status create(const di_model_config *c, const di_ds_weights *w, cu_backend *b) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0)
    return di_error_set(DI_ERR_BACKEND, "cuda: no CUDA device available (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  cu_ep_pick_device(ndev); /* expert parallel under mpirun: GPU = local rank */
  int dev = 0;
  DI_CU(cudaGetDevice(&dev));
  DI_CU(cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, dev));
  int cc_major = 0, cc_minor = 0;
  DI_CU(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  DI_CU(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (cc_major != 9) /* sm_90a code only (clusters, PDL, Hopper-specific instructions) */
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "cuda: the CUDA backend is built for sm_90 (H100/H200); device %d is sm_%d%d", dev, cc_major,
                        cc_minor);
  DI_CU(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
  DI_TRY(di_cu_blas_create(&b->blas));
  b->use_graphs = di_switch_bool(DI_SW_CUDA_GRAPHS, 1);
  b->skip = parse_skip(di_switch_get(DI_SW_CUDA_SKIP));
  const int min_split = di_switch_int(DI_SW_CUDA_ATTN_MIN_SPLIT, 1);
  b->attn_min_split = min_split > 0 ? min_split : 1;
  /* DEEPINFER_CUDA_FOLD_UV=1: W_UV in the decode attention's epilogue; off by default (batch 1 on the
   * H200: 430 tok/s with it, 437 without: the epilogue's 128 KB of W_UV per CTA costs more than the
   * kernel it saves) */
  b->fold_uv = di_switch_bool(DI_SW_CUDA_FOLD_UV, 0);
  const int out_cap = di_switch_int(DI_SW_CUDA_OUT_CAP, 16);
  b->out_cap0 = out_cap >= 1 && out_cap <= 4096 ? out_cap : 16;
  b->step_sample_on = di_switch_bool(DI_SW_CUDA_STEP_SAMPLE, 1);
  b->vo_fused = di_switch_bool(DI_SW_CUDA_VO_FUSED, 1);
  /* Batch-invariant mode (di_model_options.batch_invariant, or DEEPINFER_BATCH_INVARIANT=1): a row's
   * logits do not depend on what else is in the step (the CPU backend always is). Every product runs a
   * form whose per-row arithmetic is fixed: GEMMs in chunks of the skinny kernels (gemm.cu), experts as
   * the grouped GEMV, attention with fixed key splits (k_mla_fixed.cu; DEEPINFER_CUDA_ATTN_FIXED=0: the
   * strided cluster form), none of the one-token fusions that change the arithmetic (the fused gate and
   * prep + absorb are bit-equal to their unfused kernels and stay). Slower. */
  b->invariant = b->invariant || di_switch_bool(DI_SW_BATCH_INVARIANT, 0);
  di_cu_blas_set_tc_default(b->blas, di_switch_int(DI_SW_CUDA_TC_DEFAULT_MINM, 4));
  di_cu_blas_set_skinny_rows(b->blas, di_switch_int(DI_SW_CUDA_SKINNY_ROWS, 0));
  const char *tc_core = di_switch_get(DI_SW_CUDA_TC_CORE);
  /* hybrid by default: all four cores give the same bits (test_cuda_tc_gemm), hybrid is the fastest */
  di_cuk_tc_gemm_set_core(!tc_core || !strcmp(tc_core, "hybrid") ? 3
                          : !strcmp(tc_core, "wgmma")            ? 1
                          : !strcmp(tc_core, "tma")              ? 2
                          : !strcmp(tc_core, "gemv")             ? 4
                                                                 : 0);
  di_cuk_tc_gemm_set_fused_reduce(di_switch_bool(DI_SW_CUDA_TC_FUSED_REDUCE, 0));
  if (b->invariant) {
    di_cu_blas_set_invariant(b->blas, 1);
    /* tensor cores (k_tc_gemm.cu; experts on the grouped GEMM at every step): see di_cu_blas_set_tc */
    di_cu_blas_set_tc(b->blas, di_switch_bool(DI_SW_CUDA_TC_INVARIANT, 1));
    b->vo_fused = b->fold_uv = 0; /* the one-token fusions that change the arithmetic */
  }
  di_cuk_attn_set_preload(di_switch_bool(DI_SW_CUDA_ATTN_PRELOAD, 1));
  di_cuk_grouped_gemv_set_one_warp(di_switch_int(DI_SW_CUDA_GV_WARPS, 1) != 4);
  b->down_combine = di_switch_bool(DI_SW_CUDA_DOWN_COMBINE, 1);
  /* the invariant mode's combine in the down projection's last CTAs (same bits; H200, session 16: slower) */
  b->inv_down_combine = di_switch_int(DI_SW_CUDA_INV_DOWN_COMBINE, 0);
  if (b->inv_down_combine < 0) b->inv_down_combine = 0;
  b->inv_prep_absorb = di_switch_bool(DI_SW_CUDA_INV_PREP_ABSORB, 0); /* ... and its prep beside the absorption */
  /* FP8 weights kept FP8 on the device, with the FP8 kernels (cuda_fp8.h); off by default until the
   * model-level runs on the H200 are recorded (docs/NOTES.md, issue 18) */
  b->fp8 = di_switch_bool(DI_SW_CUDA_FP8, 1); /* on by default since session 14 (PERFORMANCE.md "Session 14, s14-18") */
  b->fp8_fuse = di_switch_bool(DI_SW_CUDA_FP8_FUSE, 1);
  b->fp8_gmma = di_switch_bool(DI_SW_CUDA_FP8_GMMA, 1);
  b->fp8_gmma_min_t = di_switch_int(DI_SW_CUDA_FP8_GMMA_MIN_T, 4);
  if (b->fp8_gmma_min_t < 2) b->fp8_gmma_min_t = 2; /* one token keeps the fused down + combine */
  b->fp8_tcg = di_switch_int(DI_SW_CUDA_FP8_TCG, 1);
  b->fp8_gv16 = di_switch_int(DI_SW_CUDA_FP8_GV16, 1); /* (H200, V2-Lite FP8: batch 1 531 vs 426 tok/s) */
  if (b->fp8_gv16 < 0 || b->fp8_gv16 > 2)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: DEEPINFER_CUDA_FP8_GV16=%d (0, 1 or 2)", b->fp8_gv16);
  if (b->fp8 && di_switch_bool(DI_SW_CUDA_FP8_LT, 1)) DI_TRY(di_cu_fp8lt_create(&b->fp8lt));
  /* decode attention in clusters of 16 CTAs where the GPU can place them (H200: 417 vs 404 tok/s at
   * batch 1 with 8), else 8; DEEPINFER_CUDA_ATTN_CLUSTER=8, 16 or 0 (splits + a combine kernel, the
   * prefill kernel's form) */
  const int want_cl = di_switch_int(DI_SW_CUDA_ATTN_CLUSTER, 16);
  b->attn_cluster = want_cl == 0 ? 0 : want_cl == 16 && di_cuk_attn_cluster_ok(16) ? 16 : 8;
  /* attention with a fixed key split at every step (k_mla_fixed.cu: a row's bits independent of the
   * batch, the chunk and decode / verify / prefill); DEEPINFER_CUDA_ATTN_FIXED=1 (splits of
   * DI_CUK_ATTN_FIXED_SPLIT keys) or =N (splits of N keys, a multiple of 32), 0: off. On by default in
   * the batch-invariant mode (H200, V2-Lite shape: prefill 1.6-1.7x, batch 256 1.3x the strided cluster
   * form; batch 1 8% slower: PERFORMANCE.md, session 9, issue 19); off in the default mode (there it
   * won 1.7-2.4% at batch 16..256 and a 512-token prefill and lost 11-12% at batch 1 and 4,096 tokens). */
  const int fixed = di_switch_int(DI_SW_CUDA_ATTN_FIXED, b->invariant ? 1 : 0);
  b->attn_fixed = fixed == 1 ? DI_CUK_ATTN_FIXED_SPLIT : fixed >= 32 && fixed % 32 == 0 ? fixed : 0;
  if (fixed != 0 && !b->attn_fixed)
    return di_error_set(DI_ERR_INVALID_ARG, "DEEPINFER_CUDA_ATTN_FIXED=%d: 0, 1 or a split size in keys (a multiple "
                        "of 32)", fixed);
  /* the fixed split on tensor cores (k_mla_fixed_tc.cu: mla_fixed_kernel's bits on wgmma, 64-row items) for
   * prefill-like steps (H200, V2-Lite shape: bit-identical; the kernel 1.32x at 4,096 tokens, the
   * invariant mode's prefill 30.3k vs 26.3k tok/s at 4,096, equal at 512 and in decode: PERFORMANCE.md,
   * session 12, s12-19) */
  b->fixed_tc = di_switch_int(DI_SW_CUDA_MLA_FIXED_TC, 1);
  if (b->fixed_tc < 0 || b->fixed_tc > 2)
    return di_error_set(DI_ERR_INVALID_ARG, "DEEPINFER_CUDA_MLA_FIXED_TC=%d: 0, 1 or 2", b->fixed_tc);
  /* its decode form on every 16-row step (two warp roles a CTA, the same bits; H200, session 15, s15-19: the kernel
   * 14.7 vs 22.2 us for a token at 600 keys, the invariant mode at batch 1 / 4 / 16 67.8 / 85.3 / 96.9 ->
   * 72.3 / 88.7 / 99.3% of the default, at 64 / 256 (=2) 95.8 / 98.0% (94.6 / 93-94% before)) */
  b->fixed_dec = di_switch_int(DI_SW_CUDA_MLA_FIXED_DEC, 2);
  if (b->fixed_dec < 0 || b->fixed_dec > 2)
    return di_error_set(DI_ERR_INVALID_ARG, "DEEPINFER_CUDA_MLA_FIXED_DEC=%d: 0, 1 or 2", b->fixed_dec);
  b->fixed_dec_merge = di_switch_bool(DI_SW_CUDA_MLA_FIXED_DEC_MERGE, 0);
  /* the invariant absorption on W_UK [N][K] copies (the hybrid core: the same bits; H200, session 15's batch A:
   * 200 -> 82 us a layer at 4,096 tokens, invariant prefill 85.2 / 67.6 / 50.2 -> 87.6 / 69.0 / 51.0% of the
   * default at 512 / 4,096 / 16,384; steps of 9 .. 63 tokens keep the [K][N] form,
   * cuda_deepseek2.cu) */
  b->absorb_nk = di_switch_bool(DI_SW_CUDA_ABSORB_NK, 1);
  /* prefill attention in the MHA form (k_mha_prefill.cu) on steps of at least N tokens (512 by default; H200,
   * V2-Lite shape: prefill 1.15x at 512 tokens, 1.65x at 4,096: PERFORMANCE.md, session 10, issue 19) */
  const int mha = di_switch_int(DI_SW_CUDA_PREFILL_MHA, 512);
  b->prefill_mha = mha == 1 ? 512 : mha > 0 ? mha : 0;
  const int split_keys = di_switch_int(DI_SW_CUDA_ATTN_SPLIT_KEYS, 0);
  b->split_keys = split_keys >= 32 && split_keys % 32 == 0 ? split_keys : DI_CUK_ATTN_KTILE;
  for (int i = 0; i < 2; i++) DI_CU(cudaEventCreateWithFlags(&b->ev_sampled[i], cudaEventDisableTiming));
  DI_CU(cudaEventCreateWithFlags(&b->ev_h2d, cudaEventDisableTiming));
  if (di_switch_bool(DI_SW_CUDA_GPU_TIME, 0)) {
    DI_CU(cudaEventCreate(&b->ev_g0));
    DI_CU(cudaEventCreate(&b->ev_g1));
    b->gpu_time = 1;
  }
  if (di_switch_bool(DI_SW_CUDA_PROFILE, 0)) {
    b->prof = 1;
    b->use_graphs = 0;
    for (int i = 0; i < MAX_MARKS; i++) DI_CU(cudaEventCreate(&b->marks[i]));
  }
  DI_TRY(ds2_load(b, c, w));
  if (b->invariant && b->absorb_nk) DI_TRY(ds2_wuk_t(b));
  dev_free(b, b->stage);
  b->stage = NULL;
  DI_TRY(ensure_acts(b, 256, 16, 512));
  DI_CU(cudaDeviceSynchronize());
  return DI_OK;
}

extern "C" di_status di_backend_cuda_create(const di_model_config *cfg, const di_ds_weights *w, int batch_invariant,
                                            di_backend **out) {
  cu_backend *b = (cu_backend *)calloc(1, sizeof *b);
  if (!b) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
  b->invariant = batch_invariant != 0;
  b->base.ops = &CU_OPS;
  b->base.cfg = cfg;
  b->base.vocab_size = cfg->vocab_size;
  b->base.hidden_size = cfg->hidden_size;
  di_status st = create(cfg, w, b);
  if (st != DI_OK) {
    cu_destroy(&b->base);
    return st;
  }
  *out = &b->base;
  return DI_OK;
}

extern "C" int64_t di_backend_cuda_free_bytes(void) {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
  return (int64_t)fr;
}

extern "C" void di_backend_cuda_set_skip(di_backend *bb, const char *phases) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the old phase list */
  b->skip = parse_skip(phases);
}

extern "C" di_status di_backend_cuda_set_attn_fixed(di_backend *bb, int split) {
  cu_backend *b = (cu_backend *)bb;
  if (split != 0 && (split < 32 || split % 32))
    return di_error_set(DI_ERR_INVALID_ARG, "cuda: fixed attention split %d (0, or a multiple of 32)", split);
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the old attention kernels */
  b->attn_fixed = split;
  return DI_OK;
}

extern "C" void di_backend_cuda_set_fixed_tc(di_backend *bb, int level) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the old attention kernel */
  b->fixed_tc = level < 0 ? 0 : level > 2 ? 2 : level;
}

extern "C" void di_backend_cuda_set_fixed_dec(di_backend *bb, int level) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the old attention kernel */
  const int lv = level < 0 ? 0 : level & 3;
  b->fixed_dec = lv > 2 ? 2 : lv;
  b->fixed_dec_merge = level > 0 && (level >> 2) & 1;
}

extern "C" void di_backend_cuda_set_inv_down_combine(di_backend *bb, int max_tokens) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the old kernels */
  b->inv_down_combine = max_tokens > 0 ? max_tokens : 0;
}

extern "C" void di_backend_cuda_set_inv_prep_absorb(di_backend *bb, int on) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the old kernels */
  b->inv_prep_absorb = on != 0;
}

extern "C" void di_backend_cuda_set_skinny_rows(di_backend *bb, int min_n) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the old kernel */
  di_cu_blas_set_skinny_rows(b->blas, min_n > 0 ? min_n : 0);
}

extern "C" void di_backend_cuda_set_prefill_mha(di_backend *bb, int min_tokens) {
  ((cu_backend *)bb)->prefill_mha = min_tokens == 1 ? 512 : min_tokens > 0 ? min_tokens : 0;
}

extern "C" di_status di_backend_cuda_set_profile(di_backend *bb, int on) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b);
  if (on && !b->prof) {
    for (int i = 0; i < MAX_MARKS; i++)
      if (!b->marks[i]) DI_CU(cudaEventCreate(&b->marks[i]));
    b->prof_graphs_saved = b->use_graphs;
    b->use_graphs = 0; /* the marks are recorded on eager steps */
    b->prof = 1;
  } else if (!on && b->prof) {
    b->prof = 0;
    b->use_graphs = b->prof_graphs_saved;
  }
  return DI_OK;
}

extern "C" void di_backend_cuda_profile_dump(di_backend *bb, const char *title) {
  cu_backend *b = (cu_backend *)bb;
  cudaStreamSynchronize(b->stream);
  prof_print(b, title ? title : "");
}

extern "C" di_status di_backend_cuda_set_invariant(di_backend *bb, int on) {
  cu_backend *b = (cu_backend *)bb;
  on = on != 0;
  cudaStreamSynchronize(b->stream);
  drop_graphs(b); /* captured graphs hold the other mode's kernels */
  if (on == b->invariant) return DI_OK;
  if (on) { /* as create does for the invariant mode */
    b->saved_vo_fused = b->vo_fused;
    b->saved_fold_uv = b->fold_uv;
    b->saved_attn_fixed = b->attn_fixed;
    di_cu_blas_set_invariant(b->blas, 1);
    di_cu_blas_set_tc(b->blas, di_switch_bool(DI_SW_CUDA_TC_INVARIANT, 1));
    b->vo_fused = b->fold_uv = 0;
    if (b->absorb_nk) DI_TRY(ds2_wuk_t(b));
    const int fixed = di_switch_int(DI_SW_CUDA_ATTN_FIXED, 1);
    b->attn_fixed = fixed == 1 ? DI_CUK_ATTN_FIXED_SPLIT : fixed >= 32 && fixed % 32 == 0 ? fixed : 0;
  } else {
    di_cu_blas_set_invariant(b->blas, 0);
    b->vo_fused = b->saved_vo_fused;
    b->fold_uv = b->saved_fold_uv;
    b->attn_fixed = b->saved_attn_fixed;
  }
  b->invariant = on;
  return DI_OK;
}

extern "C" void di_backend_cuda_stats(di_backend *bb, di_cuda_stats *out) {
  *out = ((cu_backend *)bb)->stats;
}

