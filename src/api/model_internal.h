/* The di_model handle behind the public API: configuration, bound weights, the backend that runs
 * them, and (when the folder has them) the tokenizer and chat template. */
#ifndef DI_API_MODEL_INTERNAL_H
#define DI_API_MODEL_INTERNAL_H
#include "deepinfer.h"
#include "model/config.h"
#include "arch/deepseek.h"
#include "backend/backend.h"

typedef struct di_tensor_source di_tensor_source;

struct di_model {
  char *dir;
  di_model_config cfg;
  di_tensor_source *source;  /* the memory-mapped checkpoint (NULL for dummy weights) */
  di_ds_weights weights;
  di_backend *backend;       /* owns the KV pool; one engine at a time uses it */
  int threads;
  struct di_tokenizer *tokenizer;        /* NULL when the folder has no tokenizer.json */
  int tokenizer_vocab;                   /* ids >= this are padding (never sampled); = vocab if no tokenizer */
};

/* Creates the backend named by `accelerator` ("cpu", "cuda"/"nvidia") for a loaded model. */
di_status di_backend_create(const char *accelerator, const di_model_config *cfg, const di_ds_weights *w,
                            int threads, di_backend **out);
#endif
