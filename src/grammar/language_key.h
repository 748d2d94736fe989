/* A canonical description of the language a truncated stack takes, independent of the grammar it
 * comes from, so that classifications of the vocabulary (matcher.c) can be shared between grammars
 * with the same sub-language (ci_shared.h). */
#ifndef DI_GRAMMAR_LANGUAGE_KEY_H
#define DI_GRAMMAR_LANGUAGE_KEY_H
#include <stdint.h>
#include "grammar/gram_rt.h"

typedef struct di_language_key {
  uint32_t *w; /* the description, n words */
  int n, cap;
  uint64_t hash;
  int32_t *local;  /* scratch: rule id -> local number + 1 (0 = not met), one per rule */
  int32_t *queue;  /* scratch: rules met, in order */
  int n_rules;
} di_language_key;

/* Describes the language of stack `node` (its frames up to its bottom sentinel, ROOT or PSEUDO):
 * each frame's rest of alternative, then every rule reachable from them, rules renumbered in the
 * order they are met and byte classes written out as their 256-bit sets; so two stacks get the same
 * description exactly when they run the same rule text, and hence take the same language. Returns
 * 1 with k->w / k->n / k->hash set, 0 when the description would pass max_words (or memory ran out):
 * the caller then does not share. */
int di_language_key_make(di_language_key *k, const di_grt *rt, int node, int max_words);
void di_language_key_free(di_language_key *k);
#endif
