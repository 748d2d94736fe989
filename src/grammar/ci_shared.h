/* Classifications of the vocabulary shared between grammars. A classification (matcher.c: which
 * tokens a truncated stack accepts whatever lies below, which it rejects, which are uncertain) is
 * a function of the stack's language and the vocabulary alone, so grammars compiled from different
 * sources -- or the same schema compiled afresh -- that contain the same sub-language (a JSON string
 * body, a counted string at a given length, an email or date-time format, a number) reuse one
 * trie walk. The store hangs on the vocabulary and is keyed by the canonical language description
 * of language_key.h (compared in full, not only by hash). Entries are reference counted: a grammar's
 * cache holds them after the store forgets them. */
#ifndef DI_GRAMMAR_CI_SHARED_H
#define DI_GRAMMAR_CI_SHARED_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct di_ci_entry {
  atomic_int refs;
  int nacc;
  uint32_t *acc_bits; /* dense form (vocab words), or NULL */
  int32_t *acc_list;  /* sparse form: token ids */
  int32_t *unc;       /* uncertain tokens: sorted indices (trie order) */
  int nunc;
  int overflow;       /* walk abandoned past its bound of uncertain tokens (no lists kept) */
  size_t bytes;       /* memory it holds */
} di_ci_entry;

void di_ci_entry_release(di_ci_entry *e);

typedef struct di_ci_shared di_ci_shared;
di_ci_shared *di_ci_shared_create(size_t max_bytes);
void di_ci_shared_free(di_ci_shared *s);
/* The entry stored for description key[0..n) (hash h), with a reference taken; NULL when none. */
di_ci_entry *di_ci_shared_find(di_ci_shared *s, const uint32_t *key, int n, uint64_t h);
/* Stores e for the description (replacing an older entry; the store takes its own reference). Past
 * the store's memory bound everything stored so far is forgotten first. */
void di_ci_shared_put(di_ci_shared *s, const uint32_t *key, int n, uint64_t h, di_ci_entry *e);
/* A number for byte set set[0..8) that is the same for every grammar using the store and differs
 * between different sets (ids are never reused: the table is not forgotten with the entries), so
 * language descriptions (language_key.h) can name a class in one word instead of eight. 0 when the
 * table is full (the caller writes the set out). */
uint32_t di_ci_shared_class_id(di_ci_shared *s, const uint32_t set[8]);
/* Lookups that found an entry / all lookups, since creation (tests, DI_GRAMMAR_DEBUG). */
void di_ci_shared_stats(di_ci_shared *s, long *hits, long *lookups);
#endif
