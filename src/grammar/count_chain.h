/* Counted repetitions in the compiled IR: the chains di_gseq_repeat builds for x{0,k}
 *   O_1 ::= x | ""      O_j ::= x O_{j-1} | ""      (x a byte class, or a rule that takes no empty string)
 * recognised by their shape alone (whatever front-end wrote them). In the automaton a position
 * inside such a repetition has a "count frame": the top stack frame at x in O_j when x is a class
 * (j more x's allowed, this one included), or the frame at O_{j-1} in O_j below x's own frames
 * when x is a rule (x in progress, then j-1 more). Either way at most j more x's start, and each
 * takes at least one byte, so a token of at most j bytes cannot tell O_j from O_J, J > j: the
 * matcher (matcher.c, classify) derives such a position's classification from the position far
 * from the end and walks only the tokens longer than j. */
#ifndef DI_GRAMMAR_COUNT_CHAIN_H
#define DI_GRAMMAR_COUNT_CHAIN_H
#include "grammar/gram_ir.h"

typedef struct di_count_chains {
  int32_t *index;       /* per rule: j for O_j, 0 when the rule is no chain link */
  int32_t *up, *down;   /* per rule: O_{j+1} (-1 when none is known) and O_{j-1} (-1 for O_1) */
  int32_t *frame_rule;  /* per flat position: the chain rule whose count frame sits there, or -1 */
  int n_frames;         /* how many positions are count frames (0: nothing to derive) */
  int n_rules;          /* rules of the grammar searched (the memo's size) */
  int32_t *desc;        /* di_count_chain_descend's memo for length desc_len (-1: not known yet) */
  int desc_len;
} di_count_chains;

di_status di_count_chains_find(const di_gb *g, di_count_chains *c);
void di_count_chains_free(di_count_chains *c);
/* The link reached from chain rule r by following `down` while its index exceeds len (r itself
 * when index[r] <= len; the chain's bottom when it ends first). Memoised per len, so walking a
 * long chain (a 4,096-character string bound) from each of its positions costs O(1) amortised;
 * not thread-safe (the matcher calls it under the grammar's lock). */
int di_count_chain_descend(di_count_chains *c, int r, int len);
/* The flat position of rule r's count frame (r a chain link with a frame), else -1. */
int di_count_chain_frame_pos(const di_gb *g, const di_count_chains *c, int r);
#endif
