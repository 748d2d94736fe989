/* Strongly connected components of a graph over grammar rules (rule_scc.c): the one cycle finder
 * of the grammar builders. gram_ir.c finds left recursion with it (a "left edge" inside one
 * component), lark.c terminals that reach themselves (terminals must stay regular). */
#ifndef DI_GRAMMAR_RULE_SCC_H
#define DI_GRAMMAR_RULE_SCC_H

#include "util/status.h"

/* Nodes 0..n-1; node v's edges go to to[off[v] .. off[v+1]) (off has n + 1 entries). Writes each
 * node's component id into comp[0..n) (ids in the order components complete) and their number into
 * *n_comp when it is not NULL. Iterative Tarjan: no recursion, whatever the graph's depth. */
di_status di_rule_scc(int n, const int *off, const int *to, int *comp, int *n_comp);

#endif
