/* Deferred operations on regular rules (rule_ops.h). */
#include "grammar/rule_ops.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/grow.h"

di_status di_rule_ops_push(di_rule_ops *o, int kind, int target, const int *ops, int k, int n, const char *where) {
  if (!di_grow((void **)&o->v, &o->cap, o->n + 1, sizeof *o->v, 8))
    return di_error_set(DI_ERR_OOM, "out of memory");
  di_rule_op *x = &o->v[o->n++];
  memset(x, 0, sizeof *x);
  x->kind = kind, x->target = target, x->k = k, x->n = n;
  for (int i = 0; i < k; i++)
    x->ops[i] = ops[i];
  snprintf(x->where, sizeof x->where, "%s", where);
  return DI_OK;
}

void di_rule_ops_free(di_rule_ops *o) {
  free(o->v);
  memset(o, 0, sizeof *o);
}

/* Rules reachable from rule r (r included) get stamp[x] == mark. */
static void mark_reachable(const di_gb *b, int r, int *stamp, int mark, int *queue) {
  int qh = 0, qt = 0;
  queue[qt++] = r;
  stamp[r] = mark;
  while (qh < qt) {
    const di_grule *R = &b->rules[queue[qh++]];
    for (int k = 0; k < R->n_els; k++)
      if (R->els[k].kind == DI_GE_RULE && stamp[R->els[k].arg] != mark) {
        stamp[R->els[k].arg] = mark;
        queue[qt++] = R->els[k].arg;
      }
  }
}

/* (Lark's terminal cycles are errors before this runs, so some operation is always ready there; a
 * cycle through the operations themselves is an error here.) */
di_status di_rule_ops_run(di_gb *b, const di_rule_ops *ro, const char *dialect) {
  if (ro->n == 0)
    return DI_OK;
  char *done = calloc((size_t)ro->n, 1);
  int *stamp = NULL, *queue = NULL;
  int left = ro->n, mark = 0, cap = 0;
  di_status st = done ? DI_OK : di_error_set(DI_ERR_OOM, "out of memory");
  while (st == DI_OK && left > 0) {
    int progressed = 0;
    for (int i = 0; i < ro->n && st == DI_OK; i++) {
      if (done[i])
        continue;
      const di_rule_op *o = &ro->v[i];
      if (b->n_rules > cap) { /* operations add rules: the stamps grow with them */
        int nc = b->n_rules * 2;
        int *ns = realloc(stamp, sizeof(int) * (size_t)nc), *nq = ns ? realloc(queue, sizeof(int) * (size_t)nc) : NULL;
        if (ns)
          stamp = ns;
        if (!ns || !nq) {
          st = di_error_set(DI_ERR_OOM, "out of memory");
          break;
        }
        queue = nq;
        memset(stamp + cap, 0, sizeof(int) * (size_t)(nc - cap));
        cap = nc;
      }
      int blocked = 0; /* a pending operation's target reachable from an operand */
      for (int k = 0; k < o->k && !blocked; k++) {
        mark_reachable(b, o->ops[k], stamp, ++mark, queue);
        for (int j = 0; j < ro->n && !blocked; j++)
          blocked = !done[j] && j != i && stamp[ro->v[j].target] == mark && (ro->v[j].target != o->target || j < i);
      }
      if (blocked)
        continue;
      char what[400];
      if (o->kind == DI_ROP_LAZY || o->kind == DI_ROP_CHARS || o->kind == DI_ROP_TOKENS)
        snprintf(what, sizeof what, "%s: rule '%.200s' (%s)", dialect, b->rules[o->target].name, o->where);
      else
        snprintf(what, sizeof what, "%s: the %s at %s", dialect, o->kind == DI_ROP_AND ? "'&'" : "'~'", o->where);
      if (o->kind == DI_ROP_LAZY)
        st = di_rlang_make_lazy(b, o->target, what);
      else if (o->kind == DI_ROP_CHARS)
        st = di_rlang_bound_chars(b, o->target, o->n, what);
      else if (o->kind == DI_ROP_TOKENS)
        st = di_rlang_bound_tokens(b, o->target, o->n, what);
      else if (o->kind == DI_ROP_AND)
        st = di_rlang_combine(b, o->target, o->ops, o->k, (1u << o->k) - 1, 0, what);
      else
        st = di_rlang_combine(b, o->target, o->ops, 1, 0, 1, what);
      done[i] = 1, left--, progressed = 1;
    }
    if (st == DI_OK && !progressed)
      st = di_error_set(DI_ERR_FORMAT, "%s: lazy / max_chars / max_tokens / '&' / '~' operations depend on each other "
                        "in a cycle", dialect);
  }
  free(done), free(stamp), free(queue);
  return st;
}

