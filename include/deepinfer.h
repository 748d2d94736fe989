/* DeepInfer public C API: the one header applications include.
 *
 * Conventions
 *  - Handles are opaque. Every `*_create`/`*_load` has a matching `*_free`; freeing NULL is a no-op.
 *  - Every fallible function returns a di_status. On failure di_last_error() returns a readable
 *    message for the calling thread (it names the file, tensor, key or position at fault), valid
 *    until the next failing call on that thread. Outputs are left untouched on failure.
 *  - Strings passed in are copied; strings returned are owned by the handle that returned them and
 *    live as long as it does, unless the function says otherwise.
 *  - The library never exits or aborts on bad input or out-of-memory.
 */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================ */
/* Status                                                                                        */
/* ============================================================================================ */
typedef enum di_status {
  DI_OK = 0,
  DI_ERR_INVALID_ARG = 1,   /* a caller-supplied value is out of range or inconsistent */
  DI_ERR_IO = 2,            /* a file could not be opened, read or mapped */
  DI_ERR_FORMAT = 3,        /* malformed input: JSON, safetensors, tokenizer.json, a grammar */
  DI_ERR_UNSUPPORTED = 4,   /* valid input naming something DeepInfer does not implement */
  DI_ERR_NOT_FOUND = 5,     /* a required file, tensor or key is missing */
  DI_ERR_OOM = 6,           /* memory (host or device, or the KV budget) ran out */
  DI_ERR_CONTEXT_OVERFLOW = 7, /* a prompt longer than the model's context */
  DI_ERR_BACKEND = 8,       /* the accelerator reported an error */
  DI_ERR_ABORTED = 9,       /* the operation was aborted by the caller */
  DI_ERR_INTERNAL = 10
} di_status;

/* A short fixed name of a status ("malformed input"). Never NULL. */
const char *di_status_str(di_status st);
/* The message of the last failure on this thread ("" when none). Never NULL. */
const char *di_last_error(void);

/* ============================================================================================ */
/* Models                                                                                        */
/* ============================================================================================ */
typedef struct di_model di_model;

typedef struct di_model_options {
  const char *load_format;   /* "auto" (safetensors in the folder) or "dummy" (random weights in
                                the shapes config.json describes; no weight files read). NULL: auto */
  const char *accelerator;   /* "cpu", "cuda" (alias "nvidia"); NULL: $DEEPINFER_ACCELERATOR, else cpu */
  int threads;               /* CPU threads; <= 0: all cores */
  uint64_t dummy_seed;       /* seed of the dummy weights */
  int quiet;                 /* nonzero: no progress lines on stderr while loading */
} di_model_options;

/* Fills `opt` with defaults. */
void di_model_options_default(di_model_options *opt);

/* Loads a Hugging Face model folder (config.json, *.safetensors, optional generation_config.json,
 * tokenizer files). `opt` may be NULL for defaults. On success *out owns the model. */
di_status di_model_load(const char *dir, const di_model_options *opt, di_model **out);
void di_model_free(di_model *m);

/* The model's facts. */
int di_model_vocab_size(const di_model *m);       /* rows of the output layer (config vocab_size) */
int di_model_max_context(const di_model *m);      /* max_position_embeddings */
const char *di_model_type(const di_model *m);     /* "deepseek_v2", "deepseek_v3" */
const char *di_model_dir(const di_model *m);
/* Default EOS ids (generation_config.json, else config.json). Returns the count; fills up to cap. */
int di_model_eos_ids(const di_model *m, int32_t *ids, int cap);

/* Runs the whole sequence `ids[0..n)` through the model from an empty cache and writes the logits
 * at every position to `logits` (row-major [n][vocab_size], float32). */
di_status di_model_score(di_model *m, const int32_t *ids, int n, float *logits);

#ifdef __cplusplus
}
#endif
#endif /* DEEPINFER_H */
