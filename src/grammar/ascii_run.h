/* "ASCII runs": the second subtree skip of a classification walk (matcher.c), for positions that
 * take runs of a byte class rather than a JSON string's plain text (the email format's atext and
 * its counted domain labels, hostnames, hex digits, a bounded integer's digits). Per automaton
 * state s: a set C(s) of ASCII bytes and a length n(s) such that every string of at most n(s)
 * bytes of C(s) keeps the automaton alive from s, checked breadth first (so exact for any
 * grammar; the choice of C is a heuristic: the bytes c that s takes twice in a row). Per trie
 * node the vocabulary records the ASCII bytes of the token suffixes below it and the longest
 * suffix (vocab.c): when those bytes are in C(s) and the length is at most n(s), every token
 * below the node is accepted without a walk. */
#ifndef DI_GRAMMAR_ASCII_RUN_H
#define DI_GRAMMAR_ASCII_RUN_H
#include <stdint.h>
#include "grammar/gram_rt.h"

enum { DI_ASCII_RUN_MAX = 24 }; /* the longest run checked (longer token suffixes are walked) */

typedef struct di_ascii_run {
  uint64_t set[2]; /* C(s): bit b for ASCII byte b (bit 0, NUL, is never set) */
  int16_t n;       /* n(s); -1: not computed yet */
} di_ascii_run;

/* Computes r for state s (scratch: seen states, reused between calls). 0, or -1 past the
 * automaton's budget (r then allows nothing). */
typedef struct di_ascii_scratch {
  int32_t *key;
  uint32_t *at, stamp;
  int32_t *cur, *next;
  int cap_cur, cap_next;
} di_ascii_scratch;
int di_ascii_run_compute(di_grt *rt, int s, di_ascii_scratch *w, di_ascii_run *r);
void di_ascii_scratch_free(di_ascii_scratch *w);

/* The subtree test: bytes below (same layout as set; bit 0 = some byte below is NUL or not ASCII)
 * within C and the longest suffix below at most n. */
static inline int di_ascii_run_covers(const di_ascii_run *r, const uint64_t below[2], int len_below) {
  return len_below <= r->n && !(below[0] & ~r->set[0]) && !(below[1] & ~r->set[1]);
}
#endif
