/* The table of environment switches (see switches.h) and the one place that reads them. */
#include "util/switches.h"
#include <stdio.h>
#include <stdlib.h>

static const di_switch_info TABLE[DI_SW_COUNT] = {
    [DI_SW_ACCELERATOR] = {"DEEPINFER_ACCELERATOR", "cpu",
                           "backend when di_model_options.accelerator is unset: cpu or cuda"},
    [DI_SW_HF_MODEL_DIR] = {"DEEPINFER_HF_MODEL_DIR", "models/default",
                            "model folder of the CLI when --model is not given"},
    [DI_SW_API_KEY] = {"DEEPINFER_API_KEY", "none", "bearer key `deepinfer serve` requires when --api-key is not given"},
    [DI_SW_BATCH_INVARIANT] = {"DEEPINFER_BATCH_INVARIANT", "0",
                               "1: CUDA batch-invariant mode (a row's logits independent of the batch), as "
                               "di_model_options.batch_invariant"},
    [DI_SW_HOST_SAMPLING] = {"DEEPINFER_HOST_SAMPLING", "0",
                             "1: the engine samples on the host even when the backend offers device sampling"},
    [DI_SW_NO_FEEDBACK] = {"DEEPINFER_NO_FEEDBACK", "0",
                           "1: no device token feedback (each step waits for the host to have its tokens)"},
    [DI_SW_SAMPLER_THREADS] = {"DEEPINFER_SAMPLER_THREADS", "cores/2, at most 8",
                               "threads of the host row sampler"},
    [DI_SW_DSPARK_DEVICE_STEPS] = {"DEEPINFER_DSPARK_DEVICE_STEPS", "1",
                                   "0: DSpark on CUDA feeds its context from the host and samples every step on the "
                                   "host (no plain path for steps that verify no draft, no device verification)"},
    [DI_SW_DSPARK_GRAPH_PROPOSE] = {"DEEPINFER_DSPARK_GRAPH_PROPOSE", "1",
                                    "0: DSpark on CUDA proposes after each step (eagerly, with host round trips) "
                                    "instead of inside the step's CUDA graph"},
    [DI_SW_DSPARK_FLUSH_ASYNC] = {"DEEPINFER_DSPARK_FLUSH_ASYNC", "1",
                                  "0: DSpark on CUDA turns its feature log into drafter cache entries with a host "
                                  "synchronisation per 1,024 rows (session 13's flush) instead of without one"},
    [DI_SW_DSPARK_PAUSE_FEED] = {"DEEPINFER_DSPARK_PAUSE_FEED", "0",
                                 "1: DSpark's host-path drafter (the CPU) is fed every decoding row while the confidence "
                                 "schedule pauses (session 15) instead of the prompt rows and the last 16 paused steps' only"},
    [DI_SW_DSPARK_PROP_GRAPH] = {"DEEPINFER_DSPARK_PROP_GRAPH", "0",
                                 "1: DSpark on CUDA runs a graph step's in-step proposal as a CUDA graph of its own behind "
                                 "the step's plain graph (session 16: correct on the H200, a look cheaper at batch 16 only) instead of inside one graph with it"},
    [DI_SW_DSPARK_FLUSH_WARM] = {"DEEPINFER_DSPARK_FLUSH_WARM", "0",
                                 "1: DSpark on CUDA runs one pass of its feature log's flush at startup (nothing written), so "
                                 "the first full flush's GEMM planning is not paid while requests run (session 16; not yet run on a GPU)"},
    [DI_SW_CUDA_GRAPHS] = {"DEEPINFER_CUDA_GRAPHS", "1", "0: no CUDA graphs (every step launched eagerly)"},
    [DI_SW_CUDA_STEP_SAMPLE] = {"DEEPINFER_CUDA_STEP_SAMPLE", "1",
                                "0: no sampling inside the step's graph (a separate sample launch after it)"},
    [DI_SW_CUDA_MTP] = {"DEEPINFER_CUDA_MTP", "1",
                        "0: the MTP layer is not loaded on the GPU (no speculative drafts on CUDA)"},
    [DI_SW_CUDA_PDL] = {"DEEPINFER_CUDA_PDL", "1", "0: no programmatic dependent launch between kernels"},
    [DI_SW_CUDA_CARVEOUT] = {"DEEPINFER_CUDA_CARVEOUT", "100",
                             "shared-memory carveout (percent) set on every kernel; outside 0..100: the driver's"},
    [DI_SW_CUDA_ATTN_CLUSTER] = {"DEEPINFER_CUDA_ATTN_CLUSTER", "16 (8 where 16 cannot be placed)",
                                 "CTAs per cluster of the decode attention: 16, 8, or 0 (splits + combine kernel)"},
    [DI_SW_CUDA_ATTN_MIN_SPLIT] = {"DEEPINFER_CUDA_ATTN_MIN_SPLIT", "1",
                                   "at least this many key tiles per attention split"},
    [DI_SW_CUDA_ATTN_SPLIT_KEYS] = {"DEEPINFER_CUDA_ATTN_SPLIT_KEYS", "32",
                                    "keys per attention key tile of a split (a multiple of 32)"},
    [DI_SW_CUDA_ATTN_PRELOAD] = {"DEEPINFER_CUDA_ATTN_PRELOAD", "1", "0: the attention kernels do not preload keys"},
    [DI_SW_CUDA_ATTN_FIXED] = {"DEEPINFER_CUDA_ATTN_FIXED", "0 (1 in the batch-invariant mode)",
                               "1 (or a split size in keys, a multiple of 32): MLA attention in the fixed-split form at every step "
                               "(k_mla_fixed.cu; batch-invariant); 0: the mode's other kernels"},
    [DI_SW_CUDA_MLA_FIXED_TC] = {"DEEPINFER_CUDA_MLA_FIXED_TC", "1",
                                 "1: the fixed-split attention of steps whose runs average >= 64 rows (prefill chunks, "
                                 "verify blocks) on its tensor-core kernel (k_mla_fixed_tc.cu, the same bits); 2: every "
                                 "step there (decode rows too); 0: the CUDA-core kernel only"},
    [DI_SW_CUDA_MLA_FIXED_DEC] = {"DEEPINFER_CUDA_MLA_FIXED_DEC", "2",
                                  "2: the fixed-split attention of every step of 16-row items (decode) on its decode form "
                                  "(k_mla_fixed.cu: 8 warps, a tile's scores beside the previous tile's softmax and P.V; "
                                  "the same bits; bf16 caches); 1: only steps whose items fit one CTA an SM; 0: off"},
    [DI_SW_CUDA_MLA_FIXED_DEC_MERGE] = {"DEEPINFER_CUDA_MLA_FIXED_DEC_MERGE", "0",
                                        "1: the fixed split's decode form merges a row group's split partials in the "
                                        "CTA that finishes its last split (the combine kernel's arithmetic; no combine "
                                        "launch)"},
    [DI_SW_CUDA_ABSORB_NK] = {"DEEPINFER_CUDA_ABSORB_NK", "1",
                              "1: the batch-invariant mode's query absorption, at steps of up to 8 or of 64 tokens or more, on "
                              "per-head transposed copies of W_UK (W [N][K]: the hybrid tensor-core GEMM instead of "
                              "mma.sync above 8 rows; the same bits; 2 MB a V2-Lite layer, 16 MB a V3 layer); 0: off"},
    [DI_SW_CUDA_PREFILL_MHA] = {"DEEPINFER_CUDA_PREFILL_MHA", "512",
                                "N > 0: steps of at least N tokens (1: 512), each run of them a prefill chunk, run MLA "
                                "attention in the non-absorbed (MHA) form: keys up-projected by kv_b, FlashAttention-2 "
                                "over 192 / 128 head dims (k_mha_prefill.cu); the default mode only (the "
                                "batch-invariant mode keeps one form for every step); 0: off"},
    [DI_SW_CUDA_FOLD_UV] = {"DEEPINFER_CUDA_FOLD_UV", "0", "1: W_UV applied in the decode attention's epilogue"},
    [DI_SW_CUDA_VO_FUSED] = {"DEEPINFER_CUDA_VO_FUSED", "1",
                             "0: one-token W_UV and o_proj as two GEMMs (not the fused kernel)"},
    [DI_SW_CUDA_DOWN_COMBINE] = {"DEEPINFER_CUDA_DOWN_COMBINE", "1",
                                 "0: decode's MoE down projection and combine as separate kernels, no normed q/kv "
                                 "GEMM"},
    [DI_SW_CUDA_INV_DOWN_COMBINE] = {"DEEPINFER_CUDA_INV_DOWN_COMBINE", "0",
                                     "N > 0: the batch-invariant mode's MoE combine (and the next layer's norm) in "
                                     "the last CTAs of its expert down projection at steps of up to N tokens (the "
                                     "unfused kernels' bits; k_grouped_gemm.cu; H200: slower, 2-20x the combine kernel it replaces); 0: off"},
    [DI_SW_CUDA_INV_PREP_ABSORB] = {"DEEPINFER_CUDA_INV_PREP_ABSORB", "0",
                                    "1: the batch-invariant mode's MLA preparation in the launch of its query "
                                    "absorption at steps of up to 16 tokens (the unfused kernels' bits; k_tc_gemm.cu; "
                                    "H200: no gain at 1-4 tokens, slower at 16); 0: off"},
    [DI_SW_CUDA_GV_WARPS] = {"DEEPINFER_CUDA_GV_WARPS", "1", "4: the grouped GEMV with four warps per row block"},
    [DI_SW_CUDA_BLOCK_ROUTE] = {"DEEPINFER_CUDA_BLOCK_ROUTE", "0", "1: the block-wide MoE routing at every size (A/B)"},
    [DI_SW_CUDA_OUT_CAP] = {"DEEPINFER_CUDA_OUT_CAP", "16",
                            "first output-row capacity (1..4096; tests of its growth under feedback)"},
    [DI_SW_CUDA_SKIP] = {"DEEPINFER_CUDA_SKIP", "none",
                         "phases left out of every step (qkv,prep,absorb,attn,vo,gate,experts,combine,lmhead; "
                         "benchmarks only: outputs are garbage)"},
    [DI_SW_CUDA_PROFILE] = {"DEEPINFER_CUDA_PROFILE", "0",
                            "1: per-phase device time of eager steps (graphs off), printed at destroy"},
    [DI_SW_CUDA_GPU_TIME] = {"DEEPINFER_CUDA_GPU_TIME", "0", "1: device time of each replayed graph (di_cuda_stats)"},
    [DI_SW_CUDA_STATS] = {"DEEPINFER_CUDA_STATS", "0", "1: step, graph and resample counts printed at destroy"},
    [DI_SW_CUDA_V4] = {"DEEPINFER_CUDA_V4", "1",
                       "1: DeepSeek-V4 models run on the CUDA backend with accelerator cuda; 0: accelerator cuda is refused"},
    [DI_SW_CUDA_V4_F32] = {"DEEPINFER_CUDA_V4_F32", "0",
                           "1: the DeepSeek-V4 CUDA backend keeps its weights in float32 (tests: CPU-exact arithmetic)"},
    [DI_SW_CUDA_V4_TC] = {"DEEPINFER_CUDA_V4_TC", "0",
                          "1: the DeepSeek-V4 CUDA backend's dense bf16 linear layers on the batch-invariant tensor-core "
                          "GEMM (bf16 activations) at every step; 0: the float32-activation GEMV kernels"},
    [DI_SW_CUDA_V4_NATIVE] = {"DEEPINFER_CUDA_V4_NATIVE", "1",
                              "1: the DeepSeek-V4 CUDA backend keeps FP8 weights FP8 (W8A16 GEMVs over bf16-rounded activations) "
                              "and MXFP4 routed experts MXFP4 on the device (faster at every batch measured, half the memory); 0: "
                              "dequantized to bf16 at load (float32 activations: ~1e-6 agreement with the CPU backend)"},
    [DI_SW_CUDA_V4_FEEDBACK] = {"DEEPINFER_CUDA_V4_FEEDBACK", "1",
                                "1: the DeepSeek-V4 CUDA backend offers device token feedback (sample_async / sample_fetch: the "
                                "engine queues the next step before the host has the tokens); 0: it does not"},
    [DI_SW_CUDA_V4_GRAPHS] = {"DEEPINFER_CUDA_V4_GRAPHS", "0",
                              "1: the DeepSeek-V4 CUDA backend runs steps of up to 256 tokens as CUDA graphs, one per bucket "
                              "(tokens, sequences, outputs, compressed entries; captured the second time a bucket is seen; not "
                              "under expert parallel); 0: every step eager"},
    [DI_SW_CUDA_V4_SIDE] = {"DEEPINFER_CUDA_V4_SIDE", "1",
                            "1: the DeepSeek-V4 CUDA backend in the native mode runs a one-token step's shared expert on a "
                            "second stream beside the routed experts (same results; not under expert parallel); 0: one stream"},
    [DI_SW_CUDA_V4_MX_TC] = {"DEEPINFER_CUDA_V4_MX_TC", "0",
                             "N > 0: the DeepSeek-V4 CUDA backend's native MXFP4 routed experts run on the tensor cores "
                             "(W4A16: bf16-rounded activations) in steps of at least N tokens (1: every step, which keeps "
                             "a token's logits independent of its step; N > 1: not, across N, so the batch-invariant mode "
                             "takes N > 1 as 0); 0 (the default in both modes until measured end to end; 2 is the proposed "
                             "default-mode value: one-token steps on the CUDA-core kernels, larger steps and prefill on the "
                             "tensor cores): always the CUDA-core kernels (float32 activations)"},
    [DI_SW_CUDA_V4_FORK] = {"DEEPINFER_CUDA_V4_FORK", "0",
                            "bits: 1: the DeepSeek-V4 CUDA backend runs each mHC site's Sinkhorn on a stream of its own "
                            "beside the sublayer (joined before hc_post); 2: a one-token step's compressor and indexer on "
                            "two more streams beside the q path (joined before the attention; not with "
                            "DEEPINFER_CUDA_V4_TC=1 or the phase profile); 4 (with 2): the indexer's queries on a third "
                            "stream beside its compressor; the same results; 0: one stream"},
    [DI_SW_CUDA_TC_INVARIANT] = {"DEEPINFER_CUDA_TC_INVARIANT", "1",
                                 "1: batch-invariant mode on tensor cores (dense GEMMs on k_tc_gemm.cu, experts on "
                                 "the grouped GEMM at every step); 0: skinny 8-row chunks and the grouped GEMV"},
    [DI_SW_CUDA_TC_CORE] = {"DEEPINFER_CUDA_TC_CORE", "hybrid",
                            "the tensor-core GEMM core (all give the same bits): hybrid = mma.sync up to 8 rows, tma above (experts: tma for 64-row tiles); mma: mma.sync (k_tc_gemm.cu); wgmma: wgmma with cp.async loads (k_tc_wgmma.cuh); tma: wgmma with TMA loads, warp-specialized, persistent (k_tc_tma.cuh, experts k_tc_grouped.cu); gemv: hybrid with <= 8 rows on the tile-free split chains (k_tc_gemv.cuh)"},
    [DI_SW_CUDA_TC_DEFAULT_MINM] = {"DEEPINFER_CUDA_TC_DEFAULT_MINM", "4",
                                    "default mode: dense GEMMs of N..8 rows on the tensor-core kernel, not the skinny "
                                    "one (0: never)"},
    [DI_SW_CUDA_TC_FUSED_REDUCE] = {"DEEPINFER_CUDA_TC_FUSED_REDUCE", "0",
                                    "1: the tensor-core GEMM adds decode-sized split partials in its last CTA per "
                                    "tile (no reduce kernel; the same bits)"},
    [DI_SW_CUDA_FP8] = {"DEEPINFER_CUDA_FP8", "1",
                        "1: FP8 block-scaled weights kept in FP8 on the device (native FP8 kernels); 0: dequantized to bf16 at load"},
    [DI_SW_CUDA_FP8_GEMV_ROWS] = {"DEEPINFER_CUDA_FP8_GEMV_ROWS", "3",
                                  "most rows of a dense FP8 product taken by the decode GEMV (16 with DEEPINFER_CUDA_FP8_LT=0); more go to cuBLASLt's FP8 matmul, or the mma.sync FP8 GEMM"},
    [DI_SW_CUDA_FP8_TC] = {"DEEPINFER_CUDA_FP8_TC", "1",
                           "0: FP8 products of 3 to DEEPINFER_CUDA_FP8_GEMV_ROWS rows (every M in the invariant mode) on the CUDA-core GEMV instead of the tensor-core one"},
    [DI_SW_CUDA_FP8_TC_RING] = {"DEEPINFER_CUDA_FP8_TC_RING", "2",
                                "weight pieces in flight per warp in the FP8 tensor-core GEMV: 2, or 3"},
    [DI_SW_CUDA_FP8_FUSE] = {"DEEPINFER_CUDA_FP8_FUSE", "1",
                             "0: the FP8 path's one- and two-token fusions off (attention norm inside the q/kv GEMV, experts' gate/up + SiLU, one token's down + combine)"},
    [DI_SW_CUDA_FP8_GV16] = {"DEEPINFER_CUDA_FP8_GV16", "1",
                             "1: the FP8 path's decode-sized expert GEMVs (gate/up + SiLU, down, one token's down + combine) "
                             "with 16 weight rows per warp (k_fp8_grouped_gemv.cu; 2: the same, pipelined loads), "
                             "bit-equal to the 2-row CUDA-core GEMV they replace; 0: that GEMV (1-2 rows) and the tensor-core one (3-16)"},
    [DI_SW_CUDA_SKINNY_ROWS] = {"DEEPINFER_CUDA_SKINNY_ROWS", "0",
                                "N > 0: default-mode dense bf16 products of at most 8 rows with >= N outputs (the lm_head at decode: 102,400 for V2-Lite) on a persistent form of the skinny GEMM (each warp walks row pairs, loads in flight across them; the same bits); 0: off"},
    [DI_SW_CUDA_FP8_GMMA] = {"DEEPINFER_CUDA_FP8_GMMA", "1",
                             "1: the FP8 path's expert products of steps of DEEPINFER_CUDA_FP8_GMMA_MIN_T tokens or more (outside the invariant mode) "
                             "that DEEPINFER_CUDA_FP8_TCG's kernel does not take on k_fp8_grouped_mma.cu's grouped W8A8 GEMM (16- and 64-row tiles, gate/up + SiLU in one kernel; 2: the same, 64-row tiles as one warp row of 4 warps); "
                             "0: the tensor-core GEMV (16-row tiles) and k_fp8_gemm.cu's grouped GEMM (64-row tiles)"},
    [DI_SW_CUDA_FP8_GMMA_MIN_T] = {"DEEPINFER_CUDA_FP8_GMMA_MIN_T", "4",
                                   "fewest tokens of a step (at least 2) whose FP8 expert products take the grouped W8A8 GEMMs (DEEPINFER_CUDA_FP8_TCG / _GMMA; fewer: the 16-row GEMVs)"},
    [DI_SW_CUDA_FP8_TCG] = {"DEEPINFER_CUDA_FP8_TCG", "1",
                            "1: the FP8 path's grouped W8A8 expert GEMMs (outside the invariant mode) on k_fp8_tc_grouped.cu's wgmma kernel "
                            "(TMA, FP8 tensor cores, 64-row tiles) where I % 128 and H % 256; 0: k_fp8_grouped_mma.cu's mma.sync one"},
    [DI_SW_CUDA_FP8_LT] = {"DEEPINFER_CUDA_FP8_LT", "1",
                           "1: dense FP8 products above the GEMV bound on cuBLASLt's block-scaled FP8 matmul (activations quantized per 1 x 128)"},
    [DI_SW_CUDA_EP_OVERLAP] = {"DEEPINFER_CUDA_EP_OVERLAP", "1",
                               "0: under --enable-expert-parallel on CUDA, the shared experts run after the exchange "
                               "on one stream (1: on a second stream while the routed rows are exchanged)"},
    [DI_SW_COMM] = {"DEEPINFER_COMM", "auto",
                    "mpi: GPU ranks exchange over the MPI communicator with host copies even in an NCCL build "
                    "(several ranks on one GPU, which NCCL refuses); auto: NCCL when the build has it"},
    [DI_SW_DIST_TIMEOUT] = {"DEEPINFER_DIST_TIMEOUT", "60",
                            "seconds a collective between ranks may wait before the job ends with a message "
                            "(--dist-timeout wins)"},
    [DI_SW_DIST_TEST_FAIL] = {"DEEPINFER_DIST_TEST_FAIL", "unset",
                              "RANK:CALL:MODE (kill or stall): rank RANK kills itself or stalls at exchange CALL; oom: its "
                              "CALL-th data-parallel request fails as out of memory (failure tests)"},
    [DI_SW_MPI_OMPI_SIZE] = {"OMPI_COMM_WORLD_SIZE", "unset", "set by Open MPI's mpirun: the process is one of N ranks"},
    [DI_SW_MPI_PMIX_RANK] = {"PMIX_RANK", "unset", "set by a PMIx launcher: the process is a rank"},
    [DI_SW_MPI_PMI_RANK] = {"PMI_RANK", "unset", "set by a PMI launcher (MPICH, Slurm): the process is a rank"},
    [DI_SW_MPI_OMPI_LOCAL_RANK] = {"OMPI_COMM_WORLD_LOCAL_RANK", "unset",
                                   "set by Open MPI's mpirun: the rank on its machine (a GPU rank's device)"},
    [DI_SW_GRAMMAR_MAX_STATES] = {"DI_GRAMMAR_MAX_STATES", "200000",
                                  "states budget of a grammar's runtime automaton (values above 16; tests)"},
    [DI_SW_GRAMMAR_CI_DEPTH] = {"DI_GRAMMAR_CI_DEPTH", "12", "depth of the context-independent token precompute"},
    [DI_SW_GRAMMAR_CI_UNCERTAIN] = {"DI_GRAMMAR_CI_UNCERTAIN", "256",
                                    "uncertain tokens kept per context-independent key"},
    [DI_SW_GRAMMAR_DEBUG] = {"DI_GRAMMAR_DEBUG", "unset", "set: the grammar matcher prints per-key statistics"},
    [DI_SW_GRAMMAR_SHARED_CI] = {"DI_GRAMMAR_SHARED_CI", "1",
                                 "0: each grammar classifies the vocabulary alone (no store shared between grammars; A/B runs)"},
    [DI_SW_GRAMMAR_COUNT_CI] = {"DI_GRAMMAR_COUNT_CI", "1",
                                "0: every position of a counted repetition x{m,n} gets its own classification walk (A/B runs, tests)"},
    [DI_SW_GRAMMAR_GROUP_CI] = {"DI_GRAMMAR_GROUP_CI", "1",
                                "0: each stack of a state is classified alone, never a rule's alternatives as one key, and no "
                                "walk starts from the plain-text rows (A/B runs, tests)"},
};

const di_switch_info *di_switch_info_of(di_switch sw) {
  return sw >= 0 && sw < DI_SW_COUNT ? &TABLE[sw] : NULL;
}

const char *di_switch_get(di_switch sw) {
  if (sw < 0 || sw >= DI_SW_COUNT) return NULL;
  const char *v = getenv(TABLE[sw].name);
  return v && *v ? v : NULL;
}

int di_switch_bool(di_switch sw, int dflt) {
  const char *v = di_switch_get(sw);
  if (!v) return dflt;
  return v[0] == '0' ? 0 : v[0] == '1' ? 1 : dflt;
}

int di_switch_int(di_switch sw, int dflt) {
  const char *v = di_switch_get(sw);
  return v ? atoi(v) : dflt;
}

void di_switch_markdown_row(di_switch sw, char *buf, int cap) {
  const di_switch_info *i = di_switch_info_of(sw);
  if (cap <= 0) return;
  if (!i) {
    buf[0] = 0;
    return;
  }
  snprintf(buf, (size_t)cap, "| `%s` | %s | %s |", i->name, i->dflt, i->meaning);
}
