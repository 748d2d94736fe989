/* Recognises the counted-repetition chains of the IR (count_chain.h). */
#include "grammar/count_chain.h"
#include <stdlib.h>
#include <string.h>

/* Whether every string of rule r has a byte: each alternative holds a class, or a rule that does
 * (looked into `depth` levels deep; 0 when undecided, which only makes fewer rules count). */
static int takes_a_byte(const di_gb *g, int r, int depth) {
  for (int a = g->rule_first[r]; a < g->rule_first[r + 1]; a++) {
    int ok = 0;
    for (int p = g->rule_alts[a]; !ok && g->flat[p].kind != DI_GE_END; p++)
      ok = g->flat[p].kind == DI_GE_CLASS || (depth > 0 && takes_a_byte(g, g->flat[p].arg, depth - 1));
    if (!ok)
      return 0;
  }
  return 1;
}

/* Memoised takes_a_byte, 4 levels deep (memo: 0 unknown, 1 yes, 2 no). */
static int x_takes_a_byte(const di_gb *g, uint8_t *memo, int r) {
  if (!memo[r])
    memo[r] = takes_a_byte(g, r, 4) ? 1 : 2;
  return memo[r] == 1;
}

/* The x-alternative of a rule shaped like a chain link (two alternatives, one empty, the other
 * `x` or `x REF`), its start position in *p; -1 when the rule has another shape. */
static int link_shape(const di_gb *g, uint8_t *memo, int r, int *p) {
  if (g->rule_first[r + 1] - g->rule_first[r] != 2)
    return -1;
  int a0 = g->rule_alts[g->rule_first[r]], a1 = g->rule_alts[g->rule_first[r] + 1];
  int x;
  if (g->flat[a0].kind == DI_GE_END && g->flat[a1].kind != DI_GE_END)
    x = a1;
  else if (g->flat[a1].kind == DI_GE_END && g->flat[a0].kind != DI_GE_END)
    x = a0;
  else
    return -1;
  di_gel e = g->flat[x];
  if (e.kind == DI_GE_RULE && (e.arg == r || !x_takes_a_byte(g, memo, e.arg)))
    return -1; /* x must take at least one byte */
  if (g->flat[x + 1].kind == DI_GE_END) {
    *p = x;
    return 0; /* O_1 */
  }
  if (g->flat[x + 1].kind != DI_GE_RULE || g->flat[x + 2].kind != DI_GE_END)
    return -1;
  *p = x;
  return 1;
}

di_status di_count_chains_find(const di_gb *g, di_count_chains *c) {
  memset(c, 0, sizeof *c);
  int n = g->n_rules;
  c->n_rules = n;
  c->index = calloc((size_t)n + 1, sizeof *c->index);
  c->up = malloc(sizeof *c->up * ((size_t)n + 1));
  c->down = malloc(sizeof *c->down * ((size_t)n + 1));
  c->frame_rule = malloc(sizeof *c->frame_rule * ((size_t)g->n_flat + 1));
  uint8_t *memo = calloc((size_t)n + 1, 1); /* x_takes_a_byte */
  int32_t *xpos = malloc(sizeof *xpos * ((size_t)n + 1));
  int32_t *path = malloc(sizeof *path * ((size_t)n + 1));
  uint8_t *state = calloc((size_t)n + 1, 1); /* the index walk's marks, below */
  if (!c->index || !c->up || !c->down || !c->frame_rule || !memo || !xpos || !path || !state) {
    free(memo);
    free(xpos);
    free(path);
    free(state);
    di_count_chains_free(c);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (int r = 0; r < n; r++) {
    c->up[r] = c->down[r] = -1;
    xpos[r] = -1;
  }
  for (int i = 0; i < g->n_flat; i++)
    c->frame_rule[i] = -1;
  /* index: follow the down links to a resolved rule or an O_1 (state: 0 unseen, 1 on the current
   * path, 2 settled), so a cycle (x*) or a broken link settles every rule above it as no link */
  for (int r = 0; r < n; r++) {
    if (state[r])
      continue;
    int np = 0, cur = r, base;
    for (;;) {
      if (state[cur] == 2) {
        base = c->index[cur] > 0 ? c->index[cur] : -1;
        break;
      }
      if (state[cur] == 1) { /* a cycle */
        base = -1;
        break;
      }
      int p, shape = link_shape(g, memo, cur, &p);
      if (shape < 0) {
        state[cur] = 2; /* index 0 */
        base = -1;
        break;
      }
      state[cur] = 1;
      path[np++] = cur;
      xpos[cur] = p;
      if (shape == 0) {
        base = 0; /* cur is O_1 */
        break;
      }
      int d = g->flat[p + 1].arg, pd; /* the link below must repeat the same x */
      if (link_shape(g, memo, d, &pd) < 0 || g->flat[pd].kind != g->flat[p].kind || g->flat[pd].arg != g->flat[p].arg) {
        base = -1;
        break;
      }
      cur = d;
    }
    for (int k = np - 1; k >= 0; k--) { /* from the bottom of the path up */
      int q = path[k];
      state[q] = 2;
      if (base < 0)
        continue;
      c->index[q] = ++base;
      if (g->flat[xpos[q] + 1].kind == DI_GE_RULE) {
        c->down[q] = g->flat[xpos[q] + 1].arg;
        if (c->up[c->down[q]] < 0)
          c->up[c->down[q]] = q;
      }
    }
  }
  free(state);
  for (int r = 0; r < n; r++) {
    if (c->index[r] <= 0) {
      c->index[r] = 0;
      continue;
    }
    int p = xpos[r];
    int fp = g->flat[p].kind == DI_GE_CLASS ? p : (c->index[r] >= 2 ? p + 1 : -1);
    if (fp >= 0) {
      c->frame_rule[fp] = r;
      c->n_frames++;
    }
  }
  free(memo);
  free(xpos);
  free(path);
  return DI_OK;
}

int di_count_chain_descend(di_count_chains *c, int r, int len) {
  if (!c->desc || c->desc_len != len) {
    if (!c->desc && !(c->desc = malloc(sizeof *c->desc * ((size_t)c->n_rules + 1)))) {
      while (c->index[r] > len && c->down[r] >= 0) /* no memo: the plain walk */
        r = c->down[r];
      return r;
    }
    for (int i = 0; i <= c->n_rules; i++)
      c->desc[i] = -1;
    c->desc_len = len;
  }
  int s = r;
  while (c->desc[s] < 0 && c->index[s] > len && c->down[s] >= 0)
    s = c->down[s];
  const int res = c->desc[s] >= 0 ? c->desc[s] : s;
  for (int q = r; q != s; q = c->down[q])
    c->desc[q] = res;
  c->desc[s] = res;
  return res;
}

int di_count_chain_frame_pos(const di_gb *g, const di_count_chains *c, int r) {
  if (r < 0 || c->index[r] <= 0)
    return -1;
  for (int a = g->rule_first[r]; a < g->rule_first[r + 1]; a++) {
    int p = g->rule_alts[a];
    if (g->flat[p].kind == DI_GE_END)
      continue;
    int fp = g->flat[p].kind == DI_GE_CLASS ? p : p + 1;
    return c->frame_rule[fp] == r ? fp : -1;
  }
  return -1;
}

void di_count_chains_free(di_count_chains *c) {
  free(c->index);
  free(c->up);
  free(c->down);
  free(c->desc);
  free(c->frame_rule);
  memset(c, 0, sizeof *c);
}
