/* Every environment switch the library reads (DEEPINFER_*, the MPI launchers' rank variables, and the grammar engine's DI_GRAMMAR_* test
 * knobs), in one table with its default and meaning, as vLLM's envs.py. Code never calls getenv for
 * these names itself: it asks this table, so the list in docs/switches.md (checked against the table by
 * tests/unit/test_switches.c, printed by `deepinfer switches`) is the whole list.
 *
 * Values are read from the environment at every call (not cached): tests set a switch between two
 * backend creations. An empty value counts as unset. */
#ifndef DI_SWITCHES_H
#define DI_SWITCHES_H

typedef enum {
  /* general */
  DI_SW_ACCELERATOR,
  DI_SW_HF_MODEL_DIR,
  DI_SW_API_KEY,
  DI_SW_BATCH_INVARIANT,
  /* engine and sampler */
  DI_SW_HOST_SAMPLING,
  DI_SW_NO_FEEDBACK,
  DI_SW_SAMPLER_THREADS,
  DI_SW_DSPARK_DEVICE_STEPS,
  DI_SW_DSPARK_GRAPH_PROPOSE,
  DI_SW_DSPARK_FLUSH_ASYNC,
  DI_SW_DSPARK_PAUSE_FEED,
  DI_SW_DSPARK_PROP_GRAPH,
  DI_SW_DSPARK_FLUSH_WARM,
  /* CUDA backend */
  DI_SW_CUDA_GRAPHS,
  DI_SW_CUDA_STEP_SAMPLE,
  DI_SW_CUDA_MTP,
  DI_SW_CUDA_PDL,
  DI_SW_CUDA_CARVEOUT,
  DI_SW_CUDA_ATTN_CLUSTER,
  DI_SW_CUDA_ATTN_MIN_SPLIT,
  DI_SW_CUDA_ATTN_SPLIT_KEYS,
  DI_SW_CUDA_ATTN_PRELOAD,
  DI_SW_CUDA_ATTN_FIXED,
  DI_SW_CUDA_MLA_FIXED_TC,
  DI_SW_CUDA_MLA_FIXED_DEC,
  DI_SW_CUDA_MLA_FIXED_DEC_MERGE,
  DI_SW_CUDA_ABSORB_NK,
  DI_SW_CUDA_PREFILL_MHA,
  DI_SW_CUDA_FOLD_UV,
  DI_SW_CUDA_VO_FUSED,
  DI_SW_CUDA_DOWN_COMBINE,
  DI_SW_CUDA_INV_DOWN_COMBINE,
  DI_SW_CUDA_INV_PREP_ABSORB,
  DI_SW_CUDA_GV_WARPS,
  DI_SW_CUDA_BLOCK_ROUTE,
  DI_SW_CUDA_OUT_CAP,
  DI_SW_CUDA_SKIP,
  DI_SW_CUDA_PROFILE,
  DI_SW_CUDA_GPU_TIME,
  DI_SW_CUDA_STATS,
  DI_SW_CUDA_V4,
  DI_SW_CUDA_V4_F32,
  DI_SW_CUDA_V4_TC,
  DI_SW_CUDA_V4_NATIVE,
  DI_SW_CUDA_V4_FEEDBACK,
  DI_SW_CUDA_V4_GRAPHS,
  DI_SW_CUDA_V4_SIDE,
  DI_SW_CUDA_V4_MX_TC,
  DI_SW_CUDA_V4_FORK,
  DI_SW_CUDA_TC_INVARIANT,
  DI_SW_CUDA_TC_CORE,
  DI_SW_CUDA_TC_FUSED_REDUCE,
  DI_SW_CUDA_TC_DEFAULT_MINM,
  DI_SW_CUDA_FP8,
  DI_SW_CUDA_FP8_GEMV_ROWS,
  DI_SW_CUDA_FP8_TC,
  DI_SW_CUDA_FP8_LT,
  DI_SW_CUDA_FP8_TC_RING,
  DI_SW_CUDA_FP8_FUSE,
  DI_SW_CUDA_FP8_GV16,
  DI_SW_CUDA_SKINNY_ROWS,
  DI_SW_CUDA_FP8_GMMA,
  DI_SW_CUDA_FP8_GMMA_MIN_T,
  DI_SW_CUDA_FP8_TCG,
  /* several ranks (src/dist/) */
  DI_SW_DIST_TIMEOUT,
  DI_SW_DIST_TEST_FAIL,
  DI_SW_MPI_OMPI_SIZE,  /* launcher variables: set by mpirun, read to know the process is a rank */
  DI_SW_MPI_PMIX_RANK,
  DI_SW_MPI_PMI_RANK,
  DI_SW_MPI_OMPI_LOCAL_RANK,
  /* grammar engine (tests of its budget paths, debugging) */
  DI_SW_GRAMMAR_MAX_STATES,
  DI_SW_GRAMMAR_CI_DEPTH,
  DI_SW_GRAMMAR_CI_UNCERTAIN,
  DI_SW_GRAMMAR_DEBUG,
  DI_SW_GRAMMAR_SHARED_CI,
  DI_SW_GRAMMAR_COUNT_CI,
  DI_SW_GRAMMAR_GROUP_CI,
  DI_SW_CUDA_EP_OVERLAP,
  DI_SW_COMM,
  DI_SW_COUNT
} di_switch;

typedef struct di_switch_info {
  const char *name;     /* the environment variable */
  const char *dflt;     /* its default, in words */
  const char *meaning;  /* one sentence */
} di_switch_info;

#ifdef __cplusplus
extern "C" {
#endif
/* The table entry of sw (never NULL for sw in [0, DI_SW_COUNT)). */
const di_switch_info *di_switch_info_of(di_switch sw);
/* The value, or NULL when unset or empty. */
const char *di_switch_get(di_switch sw);
/* A boolean switch: unset/empty gives dflt; a value starting with '0' is off, with '1' on; any other
 * value gives dflt. */
int di_switch_bool(di_switch sw, int dflt);
/* An integer switch: atoi of the value, or dflt when unset/empty (range checks stay with the caller,
 * which knows what an out-of-range value falls back to). */
int di_switch_int(di_switch sw, int dflt);
/* The switch's row of the table in docs/switches.md: "| `NAME` | default | meaning |" into buf (cap
 * bytes, truncated and NUL-terminated). `deepinfer switches` prints these rows and the doc's test checks
 * that the doc holds each one. */
void di_switch_markdown_row(di_switch sw, char *buf, int cap);
#ifdef __cplusplus
}
#endif
#endif
