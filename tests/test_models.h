/* Helpers of the model-level tests that compare one model load against another (a quantized or
 * FP8-cache model against the reference load): loading with a failed check naming the load, README.md
 * as token ids, and the logits comparison (top-1 agreement and relative L2 error, printed and
 * bounded). Functions in a header (static inline) rather than in test_util.c: test_util.c is linked
 * into every test, and these would pull the model loader into the ones that need none. */
#ifndef DI_TEST_MODELS_H
#define DI_TEST_MODELS_H
#include "deepinfer.h"
#include "test_util.h"
#include "model/safetensors.h"
#include "util/json.h"
#include <stdio.h>
#include <stdlib.h>

/* a golden file's tensor by a name with the prompt's number in it ("p%d.ids", "p%d.logits", ...) */
static inline const di_st_tensor *test_st_findf(const di_st_file *f, const char *fmt, int p) {
  char name[64];
  snprintf(name, sizeof name, fmt, p);
  return di_st_file_find(f, name);
}

/* the defaults, quiet, 2 compute threads: what the comparison tests load with before their one change */
static inline void test_model_options(di_model_options *o) {
  di_model_options_default(o);
  o->quiet = 1;
  o->threads = 2;
}

/* dir loaded with o; on failure a failed check naming dir and `what` (the option tried), NULL */
static inline di_model *test_load_model(const char *dir, const di_model_options *o, const char *what) {
  di_model *m = NULL;
  di_status st = di_model_load(dir, o, &m);
  CHECKF(st == DI_OK, "%s (%s): %s", dir, what, di_last_error());
  return st == DI_OK ? m : NULL;
}

/* README.md of the source tree in dir's tokenizer (with special tokens); *n ids; NULL and failed checks
 * when it cannot be read or has fewer than min_tokens */
static inline int32_t *test_readme_ids(const char *dir, size_t min_tokens, size_t *n) {
  di_tokenizer *tok = NULL;
  CHECKF(di_tokenizer_load(dir, &tok) == DI_OK, "%s", di_last_error());
  char *text = NULL;
  size_t len = 0;
  int32_t *ids = NULL;
  *n = 0;
  CHECK(di_read_file(test_path("README.md"), &text, &len) == DI_OK);
  if (tok && text) CHECK(di_tokenizer_encode(tok, text, len, 1, &ids, n) == DI_OK);
  CHECKF(*n >= min_tokens, "README.md: %zu tokens", *n);
  free(text);
  di_tokenizer_free(tok);
  if (*n < min_tokens) {
    free(ids);
    return NULL;
  }
  return ids;
}

/* Scores ids (n of them, one forward each model) with ref and got, prints "<what>, <name>: top-1
 * agreement A over n positions, logits rel L2 error E" and checks A >= min_agree and E < max_err.
 * Frees both models (either may be NULL after a failed load: nothing compared then). */
static inline void test_compare_models(const char *what, const char *name, di_model *ref, di_model *got,
                                       const int32_t *ids, int n, double min_agree, double max_err) {
  if (ref && got) {
    const int V = di_model_vocab_size(ref);
    float *lr = malloc(sizeof(float) * (size_t)n * V), *lg = malloc(sizeof(float) * (size_t)n * V);
    CHECKF(di_model_score(ref, ids, n, lr) == DI_OK, "%s", di_last_error());
    CHECKF(di_model_score(got, ids, n, lg) == DI_OK, "%s", di_last_error());
    int agree = 0;
    for (int t = 0; t < n; t++) agree += test_argmax(lr + (size_t)t * V, V) == test_argmax(lg + (size_t)t * V, V);
    const double ag = (double)agree / n, err = test_rel_l2(lg, lr, (size_t)n * V);
    printf("%s, %s: top-1 agreement %.4f over %d positions, logits rel L2 error %.4f\n", what, name, ag, n, err);
    CHECKF(ag >= min_agree && err < max_err, "%s: agreement %.4f, error %.4f", name, ag, err);
    free(lr);
    free(lg);
  }
  di_model_free(ref);
  di_model_free(got);
}
#endif
