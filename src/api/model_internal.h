/* The di_model handle behind the public API: configuration, bound weights, the backend that runs
 * them. (The engine and the server load the folder's tokenizer.json themselves.) */
#ifndef DI_API_MODEL_INTERNAL_H
#define DI_API_MODEL_INTERNAL_H
#include "deepinfer.h"
#include "model/config.h"
#include "arch/deepseek.h"
#include "arch/deepseek_v4.h"
#include "backend/backend.h"
#include "api/arch_registry.h"

typedef struct di_tensor_source di_tensor_source;

struct di_model {
  char *dir;
  di_model_config cfg;
  di_tensor_source *source;  /* the memory-mapped checkpoint (NULL for dummy weights) */
  const di_arch_entry *arch; /* the architecture's registry entry: loaded the state below, made the backend */
  union {                    /* the architecture's state (one member live, as `arch` loaded it); cfg holds
                                the generic fields of every architecture */
    di_ds_weights weights;   /* DeepSeek-V2/V3 (their whole config is cfg) */
    struct {                 /* DeepSeek-V4 */
      di_v4_config v4cfg;
      di_v4_weights v4w;
    };
  };
  di_backend *backend;       /* owns the KV pool; one engine at a time uses it */
  int threads;
  int tokenizer_vocab;                   /* ids >= this are padding (never sampled); = vocab if no tokenizer */
};

/* Creates the backend named by `accelerator` ("cpu", "cuda"/"nvidia") for a loaded DeepSeek-V2/V3 model
 * (batch_invariant: di_model_options.batch_invariant; the CPU backend always is). (arch_deepseek.c) */
di_status di_backend_create(const char *accelerator, const di_model_config *cfg, const di_ds_weights *w,
                            int threads, int batch_invariant, di_backend **out);
#endif
