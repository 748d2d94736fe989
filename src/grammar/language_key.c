/* The canonical language description of a truncated stack (language_key.h).
 *
 * Words: per frame a FRAME tag and its elements to the alternative's END, the bottom sentinel,
 * then per reachable rule a RULE tag, its local number, its alternative count and each
 * alternative's elements. An element is CLASS_ID + the byte set's id in the shared store (the same
 * for every grammar on that store), CLASS + 8 words of its byte set (no id), REF + the rule's local
 * number, or END. Each tag fixes how many words follow it, so a description reads back one way.
 * Rule names, rule ids and the grammar's class numbers never appear, which is what makes
 * descriptions comparable across grammars.
 *
 * Only what a token can reach is described. A classification reads at most max_bytes bytes (the
 * longest token) from the stack, so a rule that cannot be entered before more bytes than that
 * are consumed never affects it: rules are visited in order of their distance (the fewest bytes
 * consumed before the rule is entered: a lower bound from each rule's shortest string, computed
 * once per grammar), and those farther than max_bytes are written as one FAR tag, as are frames
 * farther than that. This is what lets the positions of a long counted string (x{0,1024}: every
 * remaining length its own rule chain) share one description once more characters remain than
 * the longest token has bytes. Distances are exact lower bounds, so two stacks with the same
 * description agree on every string of at most max_bytes bytes, hence on every token. A rule whose
 * language is fixed whatever grammar holds it (di_grule.canon: the time formats' 1,440-minute leap
 * second trie, which a description of every position within a token's reach of a time would
 * otherwise spell out) is written as CANON + its number, and what it reaches is not described.
 *
 * A set of stacks (a state's, classified as one key by matcher.c) is SET + its size, then each
 * stack's frames as above (each from distance 0) down to the node all of them lie above (JOIN),
 * the stacks in an order of their positions, then FRAME JOIN and that node's frames once (entered
 * at the least distance any stack reaches it), then the rules they reach. Two sets with one
 * description hold stacks with the same languages, hence classify every token alike; no single
 * stack's description begins with SET. */
#include "grammar/language_key.h"
#include "util/grow.h"
#include <stdlib.h>
#include <string.h>

enum { TAG_FRAME = 0xF0000001u, TAG_BOTTOM = 0xF0000002u, TAG_RULE = 0xF0000003u, TAG_CLASS = 0xF0000004u,
       TAG_REF = 0xF0000005u, TAG_END = 0xF0000006u, TAG_FAR = 0xF0000007u, TAG_CLASS_ID = 0xF0000008u,
       TAG_CANON = 0xF0000009u, TAG_SET = 0xF000000Au, TAG_JOIN = 0xF000000Bu };
enum { FAR_AWAY = 1 << 28 };

static int put(di_language_key *k, uint32_t x, int max_words) {
  if (k->n >= max_words || !di_grow((void **)&k->w, &k->cap, k->n + 1, sizeof *k->w, 256))
    return 0;
  k->w[k->n++] = x;
  return 1;
}

static int el_minlen(const di_language_key *k, di_gel e) { return e.kind == DI_GE_CLASS ? 1 : k->minlen[e.arg]; }

/* Rules in DFS postorder over their references (a rule after the rules it refers to, but for the
 * references that close a cycle), into order[]; rules of a fixed language (di_grule.canon) are left
 * out, their length being given (the rules they refer to are still ordered, as roots of their own).
 * Returns how many, -1 when memory ran out. */
static int post_order(const di_gb *g, int32_t *order) {
  typedef struct {
    int32_t r, a, p; /* rule, its alternative, the element next */
  } frame;
  uint8_t *seen = calloc((size_t)g->n_rules + 1, 1);
  frame *st = malloc(sizeof *st * ((size_t)g->n_rules + 1));
  if (!seen || !st) {
    free(seen);
    free(st);
    return -1;
  }
  int n = 0;
  for (int root = 0; root < g->n_rules; root++) {
    if (seen[root] || g->rules[root].canon) /* a fixed language: its length is given */
      continue;
    int sp = 0;
    seen[root] = 1;
    st[sp++] = (frame){root, g->rule_first[root], -1};
    while (sp > 0) {
      frame *f = &st[sp - 1];
      if (f->a >= g->rule_first[f->r + 1]) { /* every alternative done */
        order[n++] = f->r;
        sp--;
        continue;
      }
      f->p = f->p < 0 ? g->rule_alts[f->a] : f->p + 1;
      di_gel e = g->flat[f->p];
      if (e.kind == DI_GE_END) {
        f->a++;
        f->p = -1;
      } else if (e.kind == DI_GE_RULE && !seen[e.arg] && !g->rules[e.arg].canon) {
        seen[e.arg] = 1;
        st[sp++] = (frame){e.arg, g->rule_first[e.arg], -1};
      }
    }
  }
  free(seen);
  free(st);
  return n;
}

/* Each rule's shortest string in bytes: relaxation from "infinite" until nothing changes, passes in
 * reference postorder (post_order), so that a grammar without recursion settles in its first pass
 * and the second only confirms it, whichever order the front-end created its rules in (index order
 * took 8 passes on a JSON Schema grammar, whose value rules come before their parts'). Values are
 * only upper bounds until it has, so a grammar that does not settle within the pass budget gets 0
 * for every rule: safe (distances are lower bounds), merely less shared. */
void di_language_key_rule_minlen(const di_gb *g, int32_t *minlen) {
  di_language_key kk = {0}, *k = &kk; /* el_minlen reads k->minlen */
  k->minlen = minlen;
  for (int r = 0; r < g->n_rules; r++) /* a fixed language's length is given (di_grule.canon) */
    k->minlen[r] = g->rules[r].canon ? g->rules[r].canon_minlen : FAR_AWAY;
  int32_t *order = malloc(sizeof *order * ((size_t)g->n_rules + 1));
  int n_order = order ? post_order(g, order) : -1;
  if (n_order < 0) {
    free(order);
    order = NULL;
  }
  for (int pass = 0;; pass++) {
    int changed = 0;
    for (int i = 0; i < (order ? n_order : g->n_rules); i++) {
      int r = order ? order[i] : i;
      if (!order && g->rules[r].canon)
        continue;
      for (int a = g->rule_first[r]; a < g->rule_first[r + 1]; a++) {
        int len = 0;
        for (int p = g->rule_alts[a]; g->flat[p].kind != DI_GE_END && len < FAR_AWAY; p++)
          len += el_minlen(k, g->flat[p]);
        if (len > FAR_AWAY)
          len = FAR_AWAY;
        if (len < k->minlen[r]) {
          k->minlen[r] = len;
          changed = 1;
        }
      }
    }
    if (!changed)
      break;
    if (pass == 64) {
      memset(k->minlen, 0, sizeof *k->minlen * (size_t)g->n_rules);
      break;
    }
  }
  free(order);
}

/* The distance queue: (distance, order met) -> rule, a binary min-heap. */
static int heap_push(di_language_key *k, int *nh, int dist, int rule) {
  if (!di_grow((void **)&k->heap, &k->heap_cap, *nh + 1, sizeof *k->heap, 64))
    return 0;
  int i = (*nh)++;
  k->heap[i].dist = dist;
  k->heap[i].seq = k->seq++;
  k->heap[i].rule = rule;
  while (i > 0) {
    int p = (i - 1) / 2;
    if (k->heap[p].dist < k->heap[i].dist || (k->heap[p].dist == k->heap[i].dist && k->heap[p].seq < k->heap[i].seq))
      break;
    di_lkey_item t = k->heap[p];
    k->heap[p] = k->heap[i];
    k->heap[i] = t;
    i = p;
  }
  return 1;
}

static di_lkey_item heap_pop(di_language_key *k, int *nh) {
  di_lkey_item top = k->heap[0];
  k->heap[0] = k->heap[--*nh];
  for (int i = 0;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < *nh && (k->heap[l].dist < k->heap[m].dist || (k->heap[l].dist == k->heap[m].dist && k->heap[l].seq < k->heap[m].seq)))
      m = l;
    if (r < *nh && (k->heap[r].dist < k->heap[m].dist || (k->heap[r].dist == k->heap[m].dist && k->heap[r].seq < k->heap[m].seq)))
      m = r;
    if (m == i)
      break;
    di_lkey_item t = k->heap[m];
    k->heap[m] = k->heap[i];
    k->heap[i] = t;
    i = m;
  }
  return top;
}

/* Elements from flat position pos (at distance dist) through its END; rules met get local numbers
 * and are queued at the distance they are entered. Returns the distance after the alternative
 * (its shortest string added), or -1 when the description is too long. */
static int put_alternative(di_language_key *k, const di_gb *g, int pos, int dist, int *nh, int max_words) {
  for (;; pos++) {
    di_gel e = g->flat[pos];
    if (e.kind == DI_GE_END)
      return put(k, TAG_END, max_words) ? dist : -1;
    if (e.kind == DI_GE_CLASS && k->cls_id[e.arg]) {
      if (!put(k, TAG_CLASS_ID, max_words) || !put(k, k->cls_id[e.arg], max_words))
        return -1;
    } else if (e.kind == DI_GE_CLASS) {
      if (!put(k, TAG_CLASS, max_words))
        return -1;
      for (int i = 0; i < 8; i++)
        if (!put(k, g->classes[e.arg].w[i], max_words))
          return -1;
    } else {
      if (!k->local[e.arg]) {
        k->local[e.arg] = ++k->nlocal;
        k->queue[k->nlocal - 1] = e.arg;
        k->best[e.arg] = FAR_AWAY + 1;
      }
      if (dist < k->best[e.arg]) {
        k->best[e.arg] = dist;
        if (!heap_push(k, nh, dist, e.arg))
          return -1;
      }
      if (!put(k, TAG_REF, max_words) || !put(k, (uint32_t)k->local[e.arg], max_words))
        return -1;
    }
    dist += el_minlen(k, e);
    if (dist > FAR_AWAY)
      dist = FAR_AWAY;
  }
}

/* The per-grammar tables (for_g), made when the grammar changes; 0 without memory. */
static int prepare(di_language_key *k, const di_gb *g, di_ci_shared *store) {
  if (k->for_g != g) {
    free(k->cls_id);
    k->cls_id = calloc((size_t)g->n_classes + 1, sizeof *k->cls_id);
    for (int c = 0; k->cls_id && store && c < g->n_classes; c++)
      k->cls_id[c] = di_ci_shared_class_id(store, g->classes[c].w);
    free(k->local);
    free(k->queue);
    free(k->minlen);
    free(k->best);
    free(k->heap);
    k->local = calloc((size_t)g->n_rules + 1, sizeof *k->local);
    k->queue = malloc(sizeof *k->queue * ((size_t)g->n_rules + 1));
    k->minlen = malloc(sizeof *k->minlen * ((size_t)g->n_rules + 1));
    k->best = malloc(sizeof *k->best * ((size_t)g->n_rules + 1));
    k->heap_cap = g->n_rules + 16;
    k->heap = malloc(sizeof *k->heap * (size_t)k->heap_cap);
    k->for_g = k->local && k->queue && k->minlen && k->best && k->heap && k->cls_id ? g : NULL;
    if (!k->for_g)
      return 0;
    if (k->given_minlen) /* made at compile (matcher.c passes the grammar's) */
      memcpy(k->minlen, k->given_minlen, sizeof *k->minlen * (size_t)g->n_rules);
    else
      di_language_key_rule_minlen(g, k->minlen);
  }
  k->n = 0;
  k->nlocal = 0;
  k->seq = 0;
  return 1;
}

/* Frames from `node` down to node `stop` (-1: to the bottom sentinel, written as BOTTOM; else a
 * JOIN where stop is reached), the first at distance *dist (the distance at the end left there),
 * queueing the rules they reach (nh of them so far); FAR where the distance passes max_bytes. 0
 * when the description would pass max_words. */
static int frames(di_language_key *k, const di_grt *rt, int node, int stop, int *dist, int *nh, int max_bytes,
                  int max_words) {
  const di_gb *g = rt->g;
  int ok = 1, d = *dist;
  for (; ok && node != stop && node > DI_GRT_PSEUDO && d <= max_bytes; node = rt->npar[node]) {
    ok = put(k, TAG_FRAME, max_words);
    if (ok && (d = put_alternative(k, g, rt->npos[node], d, nh, max_words)) < 0)
      ok = 0;
  }
  if (ok && d > max_bytes) {
    ok = put(k, TAG_FAR, max_words);
    d = FAR_AWAY;
  } else if (ok) {
    ok = node == stop ? put(k, TAG_JOIN, max_words) : put(k, TAG_BOTTOM, max_words) && put(k, (uint32_t)node, max_words);
  }
  *dist = d;
  return ok;
}

/* The rules queued (nh), in order of distance, then the hash; ok = 0: a failure so far (the
 * scratch is still cleared). 1, or 0 when the description would pass max_words. */
static int finish(di_language_key *k, const di_grt *rt, int nh, int ok, int max_bytes, int max_words) {
  const di_gb *g = rt->g;
  while (ok && nh > 0) {
    di_lkey_item it = heap_pop(k, &nh);
    if (it.dist != k->best[it.rule])
      continue; /* stale: reached by a shorter path, or described already */
    if (it.dist > max_bytes) { /* this and every rule left: beyond any token */
      ok = put(k, TAG_FAR, max_words);
      break;
    }
    k->best[it.rule] = -1; /* described */
    int r = it.rule;
    if (g->rules[r].canon > 0) { /* a fixed language (di_grule.canon): its number says it all */
      ok = put(k, TAG_RULE, max_words) && put(k, (uint32_t)k->local[r], max_words) && put(k, TAG_CANON, max_words) &&
           put(k, (uint32_t)g->rules[r].canon, max_words);
      continue;
    }
    ok = put(k, TAG_RULE, max_words) && put(k, (uint32_t)k->local[r], max_words) &&
         put(k, (uint32_t)(g->rule_first[r + 1] - g->rule_first[r]), max_words);
    for (int a = g->rule_first[r]; ok && a < g->rule_first[r + 1]; a++)
      ok = put_alternative(k, g, g->rule_alts[a], it.dist, &nh, max_words) >= 0;
  }
  for (int i = 0; i < k->nlocal; i++) /* leave the scratch clear for the next description */
    k->local[k->queue[i]] = 0;
  if (!ok)
    return 0;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int i = 0; i < k->n; i++)
    h = (h ^ k->w[i]) * 0x100000001b3ULL;
  k->hash = h ^ (h >> 29);
  return 1;
}

int di_language_key_make(di_language_key *k, const di_grt *rt, di_ci_shared *store, int node, int max_bytes,
                         int max_words) {
  if (!prepare(k, rt->g, store))
    return 0;
  int nh = 0, dist = 0, ok = frames(k, rt, node, -1, &dist, &nh, max_bytes, max_words);
  return finish(k, rt, nh, ok, max_bytes, max_words);
}

/* Orders stacks by their frames' positions, top first (a shorter chain first when one is a prefix
 * of the other, then by bottom sentinel): an order of their content, not of node numbers, which
 * depend on the order the automaton met them in. */
static int stack_cmp(const di_grt *rt, int a, int b) {
  for (; a > DI_GRT_PSEUDO && b > DI_GRT_PSEUDO; a = rt->npar[a], b = rt->npar[b])
    if (rt->npos[a] != rt->npos[b])
      return rt->npos[a] < rt->npos[b] ? -1 : 1;
  if ((a > DI_GRT_PSEUDO) != (b > DI_GRT_PSEUDO))
    return a > DI_GRT_PSEUDO ? 1 : -1;
  return a < b ? -1 : a > b;
}

int di_language_key_make_set(di_language_key *k, const di_grt *rt, di_ci_shared *store, const int32_t *nodes, int n,
                             int max_bytes, int max_words) {
  enum { MAX_SET = 64 };
  if (n < 2 || n > MAX_SET || !prepare(k, rt->g, store))
    return 0;
  int32_t ord[MAX_SET];
  for (int i = 0; i < n; i++) { /* insertion sort: a set is small */
    int j = i;
    for (; j > 0 && stack_cmp(rt, ord[j - 1], nodes[i]) > 0; j--)
      ord[j] = ord[j - 1];
    ord[j] = nodes[i];
  }
  /* the frames below which they all lie (a group key's truncated common ancestor, matcher.c) are
   * written once, after every stack's own, from the nearest distance at which one reaches them */
  int common = rt->npar[ord[0]], hc = 0;
  for (int x = common; x > DI_GRT_PSEUDO; x = rt->npar[x])
    hc++;
  for (int i = 1; i < n && common > DI_GRT_PSEUDO; i++) {
    int b = rt->npar[ord[i]], hb = 0;
    for (int x = b; x > DI_GRT_PSEUDO; x = rt->npar[x])
      hb++;
    for (; hb > hc; hb--)
      b = rt->npar[b];
    for (; hc > hb; hc--)
      common = rt->npar[common];
    for (; common != b && common > DI_GRT_PSEUDO; hc--) {
      common = rt->npar[common];
      b = rt->npar[b];
    }
  }
  if (common <= DI_GRT_PSEUDO)
    common = -1; /* nothing shared but the bottom: each stack is written to it */
  int nh = 0, below = FAR_AWAY, ok = put(k, TAG_SET, max_words) && put(k, (uint32_t)n, max_words);
  for (int i = 0; ok && i < n; i++) {
    int d = 0;
    ok = frames(k, rt, ord[i], common, &d, &nh, max_bytes, max_words);
    if (d < below)
      below = d;
  }
  if (ok && common >= 0) {
    if (below > max_bytes) {
      ok = put(k, TAG_FAR, max_words);
    } else {
      ok = put(k, TAG_FRAME, max_words) && put(k, TAG_JOIN, max_words); /* the shared frames follow */
      ok = ok && frames(k, rt, common, -1, &below, &nh, max_bytes, max_words);
    }
  }
  return finish(k, rt, nh, ok, max_bytes, max_words);
}

void di_language_key_free(di_language_key *k) {
  free(k->w);
  free(k->cls_id);
  free(k->local);
  free(k->queue);
  free(k->minlen);
  free(k->best);
  free(k->heap);
  memset(k, 0, sizeof *k);
}
