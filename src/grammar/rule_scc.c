/* Strongly connected components (iterative Tarjan) for the grammar builders' cycle checks: an
 * explicit stack of (node, next edge) stands in for recursion, so a deep chain of rules (a JSON
 * schema's nesting, a long Lark grammar) cannot overflow the C stack. */
#include "grammar/rule_scc.h"
#include <stdlib.h>

di_status di_rule_scc(int n, const int *off, const int *to, int *comp, int *n_comp) {
  int *idx = malloc(sizeof(int) * (size_t)(n + 1)), *low = malloc(sizeof(int) * (size_t)(n + 1));
  int *tstack = malloc(sizeof(int) * (size_t)(n + 1)), *cs_node = malloc(sizeof(int) * (size_t)(n + 1));
  int *cs_edge = malloc(sizeof(int) * (size_t)(n + 1));
  char *onstack = calloc((size_t)n + 1, 1);
  di_status st = DI_OK;
  if (!idx || !low || !tstack || !cs_node || !cs_edge || !onstack) {
    st = di_error_set(DI_ERR_OOM, "out of memory");
    goto done;
  }
  for (int i = 0; i < n; i++)
    idx[i] = -1;
  int counter = 0, tsp = 0, ncomp = 0;
  for (int s0 = 0; s0 < n; s0++) {
    if (idx[s0] >= 0)
      continue;
    int csp = 0;
    cs_node[csp] = s0;
    cs_edge[csp++] = off[s0];
    idx[s0] = low[s0] = counter++;
    tstack[tsp++] = s0;
    onstack[s0] = 1;
    while (csp) {
      int v = cs_node[csp - 1];
      if (cs_edge[csp - 1] < off[v + 1]) {
        int w = to[cs_edge[csp - 1]++];
        if (idx[w] < 0) {
          idx[w] = low[w] = counter++;
          tstack[tsp++] = w;
          onstack[w] = 1;
          cs_node[csp] = w;
          cs_edge[csp++] = off[w];
        } else if (onstack[w] && idx[w] < low[v]) {
          low[v] = idx[w];
        }
      } else {
        if (low[v] == idx[v]) {
          int w;
          do {
            w = tstack[--tsp];
            onstack[w] = 0;
            comp[w] = ncomp;
          } while (w != v);
          ncomp++;
        }
        csp--;
        if (csp && low[v] < low[cs_node[csp - 1]])
          low[cs_node[csp - 1]] = low[v];
      }
    }
  }
  if (n_comp)
    *n_comp = ncomp;
done:
  free(idx);
  free(low);
  free(tstack);
  free(cs_node);
  free(cs_edge);
  free(onstack);
  return st;
}
