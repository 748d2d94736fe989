/* The architecture registry: one entry per architecture the model loader serves, so the API and the
 * engine have no per-architecture branches. An entry names its config.json model_type, what callers
 * must know of its numerics (flags), and how a model of it is loaded: its own config fields read from
 * config.json's tree (parsed once, by the loader), its weights bound by name and shape from the
 * checkpoint (arch/deepseek_weights.c, arch/deepseek_v4_weights.c) or made as dummies, and the backend
 * whose forward runs it on the asked accelerator. It declares the model's KV cache groups (kinds,
 * layers, entries, windows: the latent cache of V2/V3, V4's compressed, indexer, window and state
 * caches) through the same function the backends' kv_groups answer with, the backend choosing only
 * the element size (and CUDA's row padding, and which MTP layers it caches); the engine takes the
 * groups from the backend's kv_groups. Entries: arch_deepseek.c (V2, V3), arch_deepseek_v4.c (V4);
 * the table: arch_registry.c. */
#ifndef DI_API_ARCH_REGISTRY_H
#define DI_API_ARCH_REGISTRY_H
#include <stdint.h>
#include "backend/backend.h"
#include "model/config.h"
#include "util/progress.h"
#include "util/status.h"

typedef struct di_model di_model;
struct cJSON;

/* What di_model_load hands an entry's load. */
typedef struct di_arch_load {
  const char *dir;
  const struct cJSON *config; /* config.json's tree; m->cfg already holds its generic fields */
  int dummy;                  /* load format "dummy": random weights in the checkpoint's shapes */
  uint64_t dummy_seed;
  const char *accelerator;    /* "cpu", "cuda", ... (NULL or "": cpu) */
  int threads, batch_invariant;
  int quantize_fp8;           /* --quantization fp8: quantize the bf16 linear layers at load */
  int kv_fp8;                 /* --kv-cache-dtype fp8: the latent cache in E4M3 */
  di_progress *progress;      /* may be NULL */
} di_arch_load;

typedef struct di_arch_entry {
  const char *model_type;
  di_arch arch;
  /* its logits depend on how a sequence is cut into forward calls (V4's compressed attention):
   * log-likelihoods keep each sequence in one call */
  int whole_sequence;
  /* di_model_score range-checks token ids itself (the backend names bad ids by position only) */
  int check_token_ids;
  /* Fills m's architecture state and m->backend (m->source: the opened checkpoint, owned by m). On
   * failure m is left for di_model_free. */
  di_status (*load)(di_model *m, const di_arch_load *in);
  /* The KV cache groups of the loaded model m for a cache of elem_bytes per value, unpadded rows and
   * every MTP layer cached (what the CPU backend's kv_groups reports with 4); returns their count
   * (<= cap). Per-sequence bytes (di_kv_group_info.bytes_per_seq) are the backend's to add. */
  int (*kv_groups)(const di_model *m, int elem_bytes, di_kv_group_info *g, int cap);
  /* Frees the architecture state (not the backend, not the source). */
  void (*free)(di_model *m);
} di_arch_entry;

/* The entry of an architecture (NULL when none serves it). */
const di_arch_entry *di_arch_entry_find(di_arch arch);

extern const di_arch_entry di_arch_deepseek_v2, di_arch_deepseek_v3, di_arch_deepseek_v4;
#endif
