/* A canonical description of the language a truncated stack takes, independent of the grammar it
 * comes from, so that classifications of the vocabulary (matcher.c) can be shared between grammars
 * with the same sub-language (ci_shared.h). */
#ifndef DI_GRAMMAR_LANGUAGE_KEY_H
#define DI_GRAMMAR_LANGUAGE_KEY_H
#include <stdint.h>
#include "grammar/ci_shared.h"
#include "grammar/gram_rt.h"

typedef struct di_lkey_item {
  int dist, seq, rule;
} di_lkey_item;

typedef struct di_language_key {
  uint32_t *w; /* the description, n words */
  int n, cap;
  uint64_t hash;
  /* per grammar (for_g): each rule's shortest string in bytes, and scratch: rule id -> local number
   * (0 = not met), rules met in order, best distance found, the distance queue */
  const di_gb *for_g;
  const int32_t *given_minlen; /* set by the caller: the grammar's rule lengths made at compile, or NULL */
  int32_t *minlen, *local, *queue, *best;
  uint32_t *cls_id; /* per class set of the grammar: its id in the store (0: written out) */
  int nlocal, seq;
  di_lkey_item *heap;
  int heap_cap;
} di_language_key;

/* Describes the language of stack `node` (its frames up to its bottom sentinel, ROOT or PSEUDO) as
 * far as strings of at most max_bytes bytes can tell: each frame's rest of alternative, then every
 * rule reachable from them within max_bytes, rules renumbered in the order they are met and byte
 * classes named by their store ids (di_ci_shared_class_id; written out as their 256-bit sets when
 * the store has no id for them or store is NULL); so two stacks with one description (made with
 * one store) agree on every string of at most max_bytes bytes. Returns 1 with k->w / k->n /
 * k->hash set, 0 when the description would pass max_words (or memory ran out): the caller then
 * does not share. */
int di_language_key_make(di_language_key *k, const di_grt *rt, di_ci_shared *store, int node, int max_bytes,
                         int max_words);
/* The same for the set of stacks nodes[0..n) (2 <= n <= 64; their language is the union of theirs),
 * in whatever order they come. */
int di_language_key_make_set(di_language_key *k, const di_grt *rt, di_ci_shared *store, const int32_t *nodes, int n,
                             int max_bytes, int max_words);
/* Each rule's shortest string in bytes (minlen[0 .. g->n_rules)): a grammar-level analysis, made
 * once at compile (grammar.c) and handed to descriptions by given_minlen. */
void di_language_key_rule_minlen(const di_gb *g, int32_t *minlen);
void di_language_key_free(di_language_key *k);
#endif
