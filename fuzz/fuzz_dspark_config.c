/* libFuzzer target: a DSpark drafter's config.json (src/arch/dspark_weights.c, di_dspark_read_config)
 * against a fixed target (vocabulary 1,024, 8 layers, hidden 64). Any input is refused with an error
 * or read into a drafter shape that holds every bound the reader promises (the ranges of its fields,
 * heads a multiple of the KV heads, an even head_dim, 1..16 increasing target layer ids in [-1, 7], a
 * mask token inside the vocabulary, the confidence head's Markov input only with a Markov head); a
 * shape that breaks one is a crash here. Replayed by tests/model/test_dspark_config_fuzz_corpus.c. */
#include "arch/dspark.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fuzz_dspark_accepted; /* the last input was read (for the replay test's seed checks) */

static void check_shape(const di_dspark *d, const di_model_config *t) {
  int ok = d->hidden >= 1 && d->hidden <= 65536 && d->inter >= 1 && d->n_layers >= 1 && d->n_layers <= 256 &&
           d->n_heads >= 1 && d->n_kv_heads >= 1 && d->n_heads % d->n_kv_heads == 0 && d->head_dim >= 2 &&
           d->head_dim % 2 == 0 && d->vocab == t->vocab_size && d->block_size >= 1 && d->block_size <= 64 &&
           d->mask_token >= 0 && d->mask_token < d->vocab && d->markov_rank >= 0 && d->markov_rank <= 1024 &&
           (!d->conf_with_markov || d->markov_rank > 0) && d->n_feats >= 1 && d->n_feats <= DI_DSPARK_MAX_FEATS &&
           d->target_hidden == t->hidden_size;
  for (int i = 0; ok && i < d->n_feats; i++)
    ok = d->feat_layers[i] >= -1 && d->feat_layers[i] < t->num_hidden_layers && (i == 0 || d->feat_layers[i] > d->feat_layers[i - 1]);
  if (!ok) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_dspark_accepted = 0;
  cJSON *j = cJSON_ParseWithLength((const char *)data, size);
  if (!j) return 0;
  di_model_config t;
  memset(&t, 0, sizeof t);
  t.vocab_size = 1024;
  t.num_hidden_layers = 8;
  t.hidden_size = 64;
  di_dspark d;
  memset(&d, 0, sizeof d);
  if (di_dspark_read_config(&d, j, "fuzz/config.json", &t) == DI_OK) {
    check_shape(&d, &t);
    fuzz_dspark_accepted = 1;
  }
  cJSON_Delete(j);
  return 0;
}
