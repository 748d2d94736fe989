/* Internals shared by grammar.c (compile, cache, whole-string check) and matcher.c (token masks):
 * the compiled grammar object and its lazily built, mutex-guarded automaton and mask caches. */
#ifndef DI_GRAMMAR_IMPL_H
#define DI_GRAMMAR_IMPL_H
#include <pthread.h>
#include "grammar/grammar.h"
#include "grammar/count_chain.h"
#include "grammar/gram_rt.h"

struct di_gvcache; /* per-vocabulary mask caches, matcher.c */

struct di_grammar {
  di_gb core;
  int refs;                 /* guarded by the global cache mutex */
  pthread_mutex_t mu;       /* guards rt and vcaches */
  di_grt rt;
  int rt_ready;
  struct di_gvcache *vcaches;
  int live_matchers;        /* guarded by mu: caches are reset only when none is live */
  /* grammar-level analyses, made at compile so that the first mask does not pay them: the counted
   * repetitions (count_chain.h) and each rule's shortest string (language_key.h; NULL: computed
   * when first needed) */
  di_count_chains chains;
  int32_t *minlen;
  /* cache key */
  di_grammar_kind kind;
  di_grammar_options opt;
  char *src;
  size_t len;
  uint64_t hash;
  /* every live grammar, cached or not, in one list (guarded by the global cache mutex), so that a
   * vocabulary being freed can take its mask caches out of each (di_grammar_forget_vocab) */
  di_grammar *live_prev, *live_next;
};

void di_gvcache_free_all(struct di_gvcache *c);
/* Frees g's mask caches for the vocabulary with this serial; under g->mu (matcher.c). */
void di_gvcache_drop(di_grammar *g, uint64_t vocab_serial);
/* Called by di_grammar_vocab_free: the vocabulary's mask caches leave every live grammar. Without it
 * a cached grammar kept one cache per vocabulary ever used with it (an engine builds its own), each
 * pointing at a freed vocabulary, for as long as the grammar stayed cached. */
void di_grammar_forget_vocab(uint64_t vocab_serial);
/* Takes one more reference (matchers hold one). */
di_grammar *di_grammar_ref_internal(const di_grammar *g);
#endif
