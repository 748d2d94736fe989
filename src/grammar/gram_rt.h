/* The grammar automaton at run time: a pushdown automaton over bytes whose stacks are
 * hash-consed nodes (position, parent) and whose configurations -- sets of stacks -- are interned
 * as numbered states with memoised byte transitions, i.e. a DFA built lazily as input is seen. */
#ifndef DI_GRAMMAR_RT_H
#define DI_GRAMMAR_RT_H
#include "grammar/gram_ir.h"

enum { DI_GRT_ROOT = 0, DI_GRT_PSEUDO = 1 };   /* sentinel parents: end of grammar / unknown stack */
enum { DI_GRT_ACCEPT = 1, DI_GRT_PSEUDO_END = 2 }; /* state flags */
#define DI_GRT_DEAD (-1)
#define DI_GRT_ERROR (-2)
#define DI_GRT_UNKNOWN (-3)

typedef struct di_grt {
  const di_gb *g;
  int32_t *npos, *npar; /* node id -> (position in g->flat, parent node id) */
  int nn, capn;
  int32_t *nhash;
  int nhcap;
  int32_t *soff, *sn; /* state i = terminal nodes sn[soff[i] .. soff[i+1]) (sorted) */
  int sn_n, sn_cap;
  uint8_t *sflags;
  int ns, caps;
  int32_t *shash;
  int shcap;
  int32_t **trans; /* per state, a successor per byte class (DI_GRT_UNKNOWN until computed), or NULL */
  uint8_t cls[256]; /* byte -> byte class: bytes no grammar class tells apart share transitions */
  int ncls;
  uint64_t (*cmask)[4]; /* per grammar class set (g->classes): the byte classes it holds, as bits */
  uint32_t *gen;   /* per node: closure generation that visited it */
  uint32_t cur_gen;
  int32_t *work, *out;
  int work_cap, out_cap;
  int32_t *sort_tmp; /* state_get's sorting scratch */
  int sort_cap;
  int start;
  int max_nodes, max_states, max_set;
  /* Lark max_tokens (di_grt_boundary): per flat position, the same position in the copy with one
   * token fewer left, DI_GRT_DEAD for the last copy, -3 (none) elsewhere; NULL when the grammar has
   * no max_tokens rule. bnd: di_grt_boundary per state (DI_GRT_UNKNOWN until computed). */
  int32_t *tok_map;
  int32_t *bnd;
  int bnd_cap;
  int tok_one; /* some max_tokens rule has N = 1 (its entry leads straight into the last copy) */
  int32_t *tok_canon; /* per flat position in a copy: the same position in the last copy (the copies
                       * take the same byte strings, so their classifications are one), else -3 */
  /* pattern / format strings' length bound (string_bound.h), grown on demand: per stack node, 0 not
   * known, 1 outside every bounded body, 2 inside one; per state, its DI_SB_* bits (0 not known), the
   * state without its bounded stacks (DI_GRT_UNKNOWN until computed) and, per lexical position (16), the
   * fewest characters until a stack outside the body (-1 not known) */
  uint8_t *sb_node;
  int sb_node_cap;
  uint8_t *sb_info;
  int32_t *sb_prune;
  int16_t *sb_rem;
  int sb_state_cap;
} di_grt;

di_status di_grt_init(di_grt *rt, const di_gb *g);
void di_grt_free(di_grt *rt);
/* Computes the successor of state s on byte c (slow path of di_grt_step). */
int di_grt_step_slow(di_grt *rt, int s, unsigned c);
static inline int di_grt_step(di_grt *rt, int s, unsigned c) {
  int32_t *t = rt->trans[s];
  if (t && t[rt->cls[c]] != DI_GRT_UNKNOWN)
    return t[rt->cls[c]];
  return di_grt_step_slow(rt, s, c);
}
/* Stack node `id` with only its top `depth` frames kept and the rest replaced by the unknown
 * PSEUDO sentinel (unchanged when the stack is not deeper). DI_GRT_ERROR past the budget. */
int di_grt_truncated_stack(di_grt *rt, int id, int depth);
/* Stack node `id` with its frames above node anc (an ancestor of id, or its bottom sentinel) kept
 * and anc replaced by anc with only its top `depth` frames (depth 0: PSEUDO; a sentinel stays).
 * DI_GRT_ERROR past the budget, when anc is not below id, or more than 64 frames above it. */
int di_grt_truncated_from(di_grt *rt, int id, int anc, int depth);
/* Stack node `id` with the frame `depth` levels below its top (0 = the top) moved to position
 * pos, the frames above it kept. DI_GRT_ERROR past the budget or when the stack is not that deep. */
int di_grt_replace_frame(di_grt *rt, int id, int depth, int pos);
/* The state at the start of `rule` (its alternatives expanded) with stack `parent` below. */
int di_grt_rule_state(di_grt *rt, int rule, int parent);
/* The state of stacks nodes[0..n) (each topped by a byte class) with flags, interned. */
int di_grt_state_of(di_grt *rt, const int32_t *nodes, int n, int flags);
/* The state {stack id}, where id's position is a byte class. */
int di_grt_node_state(di_grt *rt, int id);
/* The state after a token boundary: every stack inside a max_tokens lexeme moves to the copy with
 * one token fewer left, those in the last copy are dropped (the lexeme must have ended within the
 * token). s itself when the grammar has no max_tokens rule or s < 0; DI_GRT_DEAD when nothing
 * survives; DI_GRT_ERROR past the budget. Memoised per state. */
int di_grt_boundary_slow(di_grt *rt, int s);
static inline int di_grt_boundary(di_grt *rt, int s) {
  if (!rt->tok_map || s < 0)
    return s;
  if (s < rt->bnd_cap && rt->bnd[s] != DI_GRT_UNKNOWN)
    return rt->bnd[s];
  return di_grt_boundary_slow(rt, s);
}
/* 1 when no token from state s can lose a stack at the next boundary: s has no stack in a last
 * copy and no max_tokens rule has N = 1 (bytes never move a stack into another copy, and an entry
 * leads into copy N - 1), so byte-level acceptance is the whole answer. */
int di_grt_boundary_safe(const di_grt *rt, int s);
static inline int di_grt_flags(const di_grt *rt, int s) { return rt->sflags[s]; }
#endif
