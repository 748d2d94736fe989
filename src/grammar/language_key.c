/* The canonical language description of a truncated stack (language_key.h). Words: per frame a
 * FRAME tag and its elements to the alternative's END, the bottom sentinel, then per reachable rule
 * (in the order met) a RULE tag, its alternative count and each alternative's elements. An element
 * is CLASS + 8 words of its byte set, REF + the rule's local number, or END. Rule names, rule ids
 * and class ids never appear, which is what makes descriptions comparable across grammars. */
#include "grammar/language_key.h"
#include <stdlib.h>
#include <string.h>

enum { TAG_FRAME = 0xF0000001u, TAG_BOTTOM = 0xF0000002u, TAG_RULE = 0xF0000003u, TAG_CLASS = 0xF0000004u,
       TAG_REF = 0xF0000005u, TAG_END = 0xF0000006u };

static int put(di_language_key *k, uint32_t x, int max_words) {
  if (k->n >= max_words)
    return 0;
  if (k->n == k->cap) {
    int nc = k->cap ? k->cap * 2 : 256;
    uint32_t *q = realloc(k->w, sizeof *q * (size_t)nc);
    if (!q)
      return 0;
    k->w = q;
    k->cap = nc;
  }
  k->w[k->n++] = x;
  return 1;
}

/* Elements from flat position pos through its END; rules met get local numbers. */
static int put_alternative(di_language_key *k, const di_gb *g, int pos, int *nq, int max_words) {
  for (;; pos++) {
    di_gel e = g->flat[pos];
    if (e.kind == DI_GE_END)
      return put(k, TAG_END, max_words);
    if (e.kind == DI_GE_CLASS) {
      if (!put(k, TAG_CLASS, max_words))
        return 0;
      for (int i = 0; i < 8; i++)
        if (!put(k, g->classes[e.arg].w[i], max_words))
          return 0;
      continue;
    }
    if (!k->local[e.arg]) {
      k->queue[*nq] = e.arg;
      k->local[e.arg] = ++*nq;
    }
    if (!put(k, TAG_REF, max_words) || !put(k, (uint32_t)k->local[e.arg], max_words))
      return 0;
  }
}

int di_language_key_make(di_language_key *k, const di_grt *rt, int node, int max_words) {
  const di_gb *g = rt->g;
  if (k->n_rules < g->n_rules) {
    free(k->local);
    free(k->queue);
    k->local = calloc((size_t)g->n_rules, sizeof *k->local);
    k->queue = malloc(sizeof *k->queue * (size_t)g->n_rules);
    k->n_rules = k->local && k->queue ? g->n_rules : 0;
    if (!k->n_rules)
      return 0;
  }
  k->n = 0;
  int nq = 0, ok = 1;
  for (; ok && node > DI_GRT_PSEUDO; node = rt->npar[node])
    ok = put(k, TAG_FRAME, max_words) && put_alternative(k, g, rt->npos[node], &nq, max_words);
  ok = ok && put(k, TAG_BOTTOM, max_words) && put(k, (uint32_t)node, max_words);
  for (int i = 0; ok && i < nq; i++) {
    int r = k->queue[i];
    ok = put(k, TAG_RULE, max_words) && put(k, (uint32_t)(g->rule_first[r + 1] - g->rule_first[r]), max_words);
    for (int a = g->rule_first[r]; ok && a < g->rule_first[r + 1]; a++)
      ok = put_alternative(k, g, g->rule_alts[a], &nq, max_words);
  }
  for (int i = 0; i < nq; i++) /* leave the scratch clear for the next description */
    k->local[k->queue[i]] = 0;
  if (!ok)
    return 0;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int i = 0; i < k->n; i++)
    h = (h ^ k->w[i]) * 0x100000001b3ULL;
  k->hash = h ^ (h >> 29);
  return 1;
}

void di_language_key_free(di_language_key *k) {
  free(k->w);
  free(k->local);
  free(k->queue);
  memset(k, 0, sizeof *k);
}
