/* The default length bound of pattern / format strings: the compile-time marks and radius, and the
 * run-time per-node / per-state memos the counter reads (string_bound.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/string_bound.h"
#include "util/switches.h"

enum { SB_INF = 1 << 28, SB_LEX = 16 }; /* SB_LEX: the counter's lexical positions (di_sb_lex) */

/* ---- compile time --------------------------------------------------------------------------- */

/* Characters as the counter counts them (string_bound.h di_sb_lex), written into the rules: a class
 * element is a character's first byte unless it holds UTF-8 continuation bytes only, and in an
 * alternative everything after a class of the backslash alone is the rest of an escape (a \u pair's
 * second escape included), no new character. */
static int is_backslash(const di_gbyteset *c) {
  for (int w = 0; w < 8; w++)
    if (c->w[w] != (w == 2 ? 1u << ('\\' - 64) : 0u))
      return 0;
  return 1;
}
static int is_continuation(const di_gbyteset *c) {
  for (int b = 0; b < 256; b++)
    if (di_gbyteset_has(c, (unsigned)b) && (b < 0x80 || b >= 0xC0))
      return 0;
  return 1;
}

/* Scratch of body_radius, made once per grammar: per rule and per flat position, zeroed between
 * bodies where a body touched them. */
typedef struct {
  int *rad, *few;
  int32_t *list, *list2;
  uint8_t *seen, *outside;
  uint8_t *ws, *intail; /* per flat position: a character's first byte; after a backslash */
  uint8_t *cls;         /* per class: 1 continuation bytes only, 2 the backslash alone */
} radius_scratch;

/* The most characters a stack at any position of rule r (or of the rules it reaches) needs to finish
 * r, bounded by `cap` (cap + 1 = more): fixed points over the rules reached from r, first of each
 * rule's fewest characters, then of the radius over the rules reached outside escapes (a stack inside
 * an escape has no character of it left to count). */
static int body_radius(const di_gb *g, int r, int cap, radius_scratch *x) {
  int n = 0;
  x->list[n++] = r, x->seen[r] = 1;
  for (int k = 0; k < n; k++) /* the rules reached from r, and the positions' weights */
    for (int a = g->rule_first[x->list[k]]; a < g->rule_first[x->list[k] + 1]; a++) {
      int after_bs = 0;
      for (int p = g->rule_alts[a]; g->flat[p].kind != DI_GE_END; p++) {
        const di_gel e = g->flat[p];
        x->intail[p] = (uint8_t)after_bs;
        if (e.kind == DI_GE_CLASS) {
          x->ws[p] = !after_bs && x->cls[e.arg] != 1;
          after_bs = after_bs || x->cls[e.arg] == 2;
        } else if (!x->seen[e.arg]) {
          x->seen[e.arg] = 1, x->list[n++] = e.arg;
        }
      }
    }
  for (int k = 0; k < n; k++)
    x->few[x->list[k]] = SB_INF, x->rad[x->list[k]] = 0;
  /* fewest characters (sums only fall); the rules from the last reached back, so that a rule mostly
   * follows the rules it refers to and a round or two settles them */
  for (int changed = 1, it = 0; changed && it < n + 2; it++) {
    changed = 0;
    for (int k = n - 1; k >= 0; k--) {
      const int q = x->list[k];
      long best = x->few[q];
      for (int a = g->rule_first[q]; a < g->rule_first[q + 1]; a++) {
        long sum = 0;
        for (int p = g->rule_alts[a]; g->flat[p].kind != DI_GE_END; p++)
          sum += x->intail[p] ? 0 : g->flat[p].kind == DI_GE_CLASS ? x->ws[p] : x->few[g->flat[p].arg];
        if (sum < best)
          best = sum;
      }
      if (best < x->few[q])
        x->few[q] = (int)best, changed = 1;
    }
  }
  int m = 0;
  x->outside[r] = 1, x->list2[m++] = r;
  for (int k = 0; k < m; k++)
    for (int a = g->rule_first[x->list2[k]]; a < g->rule_first[x->list2[k] + 1]; a++)
      for (int p = g->rule_alts[a]; g->flat[p].kind != DI_GE_END; p++)
        if (g->flat[p].kind == DI_GE_RULE && !x->intail[p] && !x->outside[g->flat[p].arg])
          x->outside[g->flat[p].arg] = 1, x->list2[m++] = g->flat[p].arg;
  int result = 0;
  for (int changed = 1, it = 0; changed && result <= cap; it++) {
    changed = 0;
    for (int k = m - 1; k >= 0 && result <= cap; k--) {
      const int q = x->list2[k];
      int best = x->rad[q];
      for (int a = g->rule_first[q]; a < g->rule_first[q + 1]; a++) {
        int end = g->rule_alts[a];
        while (g->flat[end].kind != DI_GE_END)
          end++;
        long suffix = 0; /* characters of the elements after position p */
        for (int p = end - 1; p >= g->rule_alts[a]; p--) {
          const di_gel e = g->flat[p];
          const long w = x->intail[p] ? 0 : e.kind == DI_GE_CLASS ? x->ws[p] : x->few[e.arg];
          long here = suffix + w; /* a stack at p itself */
          if (e.kind == DI_GE_RULE && !x->intail[p] && x->rad[e.arg] + suffix > here)
            here = x->rad[e.arg] + suffix; /* a stack inside the rule at p */
          if (here > best)
            best = here > SB_INF ? SB_INF : (int)here;
          suffix = suffix + w > SB_INF ? SB_INF : suffix + w;
        }
      }
      if (best != x->rad[q])
        x->rad[q] = best, changed = 1;
      if (x->rad[q] > result)
        result = x->rad[q];
    }
    if (it > cap + 2 * m) /* cannot happen: each round raises some radius by at least one */
      result = cap + 1;
  }
  for (int k = 0; k < n; k++) { /* the scratch back to zero where this body touched it */
    const int q = x->list[k];
    x->seen[q] = x->outside[q] = 0;
    for (int a = g->rule_first[q]; a < g->rule_first[q + 1]; a++)
      for (int p = g->rule_alts[a]; g->flat[p].kind != DI_GE_END; p++)
        x->ws[p] = x->intail[p] = 0;
  }
  return result > cap ? cap + 1 : result;
}

/* The longest string of rule r in bytes, -1 when unbounded (a rule reaching itself) or past `cap`
 * (or nesting past 1,000 rules deep); memo: -2 unknown, -3 being visited. */
static long longest(const di_gb *g, int r, long cap, long *memo, int depth) {
  if (memo[r] != -2)
    return memo[r] == -3 ? -1 : memo[r];
  if (depth > 1000)
    return -1;
  memo[r] = -3;
  long best = 0;
  for (int a = g->rule_first[r]; a < g->rule_first[r + 1] && best >= 0; a++) {
    long sum = 0;
    for (int p = g->rule_alts[a]; g->flat[p].kind != DI_GE_END && sum >= 0; p++) {
      const long x = g->flat[p].kind == DI_GE_CLASS ? 1 : longest(g, g->flat[p].arg, cap, memo, depth + 1);
      sum = x < 0 ? -1 : sum + x;
      if (sum > cap)
        sum = -1;
    }
    best = sum < 0 ? -1 : sum > best ? sum : best;
  }
  memo[r] = best;
  return best;
}

di_status di_sbound_prepare(di_gb *g, const int32_t *minlen) {
  if (g->sb_n <= 0) {
    g->sb_n = 0;
    return DI_OK;
  }
  int radius = 0, marks = 0;
  const size_t nr = (size_t)(g->n_rules ? g->n_rules : 1), nf = (size_t)g->n_flat + 1;
  long *memo = malloc(sizeof *memo * nr);
  radius_scratch x = {malloc(sizeof(int) * nr), malloc(sizeof(int) * nr), malloc(sizeof(int32_t) * nr),
                      malloc(sizeof(int32_t) * nr), calloc(nr, 1), calloc(nr, 1), calloc(nf, 1), calloc(nf, 1),
                      malloc((size_t)g->n_classes + 1)};
#define SB_SCRATCH_FREE() free(x.rad), free(x.few), free(x.list), free(x.list2), free(x.seen), free(x.outside), \
                          free(x.ws), free(x.intail), free(x.cls)
  if (!memo || !x.rad || !x.few || !x.list || !x.list2 || !x.seen || !x.outside || !x.ws || !x.intail || !x.cls) {
    free(memo);
    SB_SCRATCH_FREE();
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (int k = 0; k < g->n_classes; k++)
    x.cls[k] = is_backslash(&g->classes[k]) ? 2 : is_continuation(&g->classes[k]) ? 1 : 0;
  for (int r = 0; r < g->n_rules; r++)
    memo[r] = -2;
  for (int r = 0; r < g->n_rules; r++) {
    if (!g->rules[r].sbound)
      continue;
    /* a body whose every string fits the bound needs no counter (a uuid, a date); one whose shortest
     * string is longer keeps its language (the bound would leave it none: as a minLength above it) */
    const long most = longest(g, r, g->sb_n, memo, 0);
    if ((most >= 0 && most <= g->sb_n) || (minlen && minlen[r] > g->sb_n)) {
      g->rules[r].sbound = 0;
      continue;
    }
    const int rad = body_radius(g, r, DI_SB_RADIUS_MAX, &x);
    if (rad > DI_SB_RADIUS_MAX) {
      g->rules[r].sbound = 0; /* left unbounded (string_bound.h) */
      continue;
    }
    if (rad > radius)
      radius = rad;
    marks++;
  }
  free(memo);
  SB_SCRATCH_FREE();
#undef SB_SCRATCH_FREE
  if (marks) {
    /* a body referenced last in an alternative (never so by json_schema.c; a front end's rewriting
     * could) has no frame to mark: it stays unbounded */
    for (int p = 0; p + 1 < g->n_flat; p++)
      if (g->flat[p].kind == DI_GE_RULE && g->flat[p + 1].kind == DI_GE_END)
        g->rules[g->flat[p].arg].sbound = 0;
    if (!(g->sb_cont = calloc((size_t)g->n_flat, 1)))
      return di_error_set(DI_ERR_OOM, "out of memory");
    marks = 0;
    for (int p = 0; p + 1 < g->n_flat; p++)
      if (g->flat[p].kind == DI_GE_RULE && g->rules[g->flat[p].arg].sbound)
        g->sb_cont[p + 1] = 1, marks++;
  }
  if (!marks) {
    free(g->sb_cont);
    g->sb_cont = NULL;
    g->sb_n = 0;
  }
  g->sb_radius = radius;
  if (g->sb_n && di_switch_get(DI_SW_GRAMMAR_DEBUG) != 0)
    fprintf(stderr, "string bound: %d characters, %d closing quotes after bounded bodies, radius %d characters\n",
            g->sb_n, marks, radius);
  return DI_OK;
}

/* ---- run time -------------------------------------------------------------------------------- */

static int grow_states(di_grt *rt, int s) {
  if (s < rt->sb_state_cap)
    return 1;
  int nc = rt->sb_state_cap ? rt->sb_state_cap : 256;
  while (nc <= s)
    nc *= 2;
  uint8_t *info = realloc(rt->sb_info, (size_t)nc);
  if (info)
    rt->sb_info = info;
  int32_t *pr = realloc(rt->sb_prune, sizeof *pr * (size_t)nc);
  if (pr)
    rt->sb_prune = pr;
  int16_t *rem = realloc(rt->sb_rem, sizeof *rem * SB_LEX * (size_t)nc);
  if (rem)
    rt->sb_rem = rem;
  if (!info || !pr || !rem)
    return 0;
  memset(info + rt->sb_state_cap, 0, (size_t)(nc - rt->sb_state_cap));
  for (int i = rt->sb_state_cap; i < nc; i++)
    pr[i] = DI_GRT_UNKNOWN;
  memset(rem + SB_LEX * (size_t)rt->sb_state_cap, 0xff, sizeof *rem * SB_LEX * (size_t)(nc - rt->sb_state_cap));
  rt->sb_state_cap = nc;
  return 1;
}

/* 1 when a frame below node id's top sits at a bounded body's closing quote, 0 when none, -1 out of
 * memory. Memoised per node (rt->sb_node: 0 unknown, 1 no, 2 yes). */
static int node_inside(di_grt *rt, int id) {
  if (id < 2)
    return 0;
  if (id >= rt->sb_node_cap) {
    int nc = rt->sb_node_cap ? rt->sb_node_cap : 1024;
    while (nc <= id || nc < rt->nn)
      nc *= 2;
    uint8_t *q = realloc(rt->sb_node, (size_t)nc);
    if (!q)
      return -1;
    memset(q + rt->sb_node_cap, 0, (size_t)(nc - rt->sb_node_cap));
    rt->sb_node = q;
    rt->sb_node_cap = nc;
  }
  if (rt->sb_node[id])
    return rt->sb_node[id] - 1;
  /* the frames below id up to one whose answer is known (or the bottom), at most 256 at a time */
  int32_t path[256];
  int n = 0, x = id;
  while (x >= 2 && !rt->sb_node[x] && n < 256)
    path[n++] = x, x = rt->npar[x];
  int below; /* x or a frame below it is at a closing quote */
  if (x < 2) {
    below = 0;
  } else {
    const int in = rt->sb_node[x] ? rt->sb_node[x] - 1 : node_inside(rt, x);
    if (in < 0)
      return -1;
    below = in || rt->g->sb_cont[rt->npos[x]];
  }
  for (int i = n - 1; i >= 0; i--) {
    rt->sb_node[path[i]] = (uint8_t)(below + 1);
    below = below || rt->g->sb_cont[rt->npos[path[i]]];
  }
  return rt->sb_node[id] - 1;
}

int di_sb_info_slow(di_grt *rt, int s) {
  if (!grow_states(rt, s))
    goto oom;
  int bits = DI_SB_KNOWN | (rt->sflags[s] & DI_GRT_ACCEPT ? DI_SB_OUTSIDE : 0);
  for (int i = rt->soff[s]; i < rt->soff[s + 1]; i++) {
    const int in = node_inside(rt, rt->sn[i]);
    if (in < 0)
      goto oom;
    bits |= in ? DI_SB_INSIDE : DI_SB_OUTSIDE;
  }
  rt->sb_info[s] = (uint8_t)bits;
  return bits;
oom:
  di_error_set(DI_ERR_OOM, "out of memory");
  return DI_GRT_ERROR;
}

int di_sb_prune(di_grt *rt, int s) {
  if (!grow_states(rt, s)) {
    di_error_set(DI_ERR_OOM, "out of memory");
    return DI_GRT_ERROR;
  }
  if (rt->sb_prune[s] != DI_GRT_UNKNOWN)
    return rt->sb_prune[s];
  const int n = rt->soff[s + 1] - rt->soff[s];
  int32_t *keep = malloc(sizeof *keep * (size_t)(n ? n : 1));
  if (!keep) {
    di_error_set(DI_ERR_OOM, "out of memory");
    return DI_GRT_ERROR;
  }
  int k = 0;
  for (int i = rt->soff[s]; i < rt->soff[s + 1]; i++) {
    const int in = node_inside(rt, rt->sn[i]); /* known: di_sb_info ran on s */
    if (in < 0) {
      free(keep);
      di_error_set(DI_ERR_OOM, "out of memory");
      return DI_GRT_ERROR;
    }
    if (!in)
      keep[k++] = rt->sn[i];
  }
  const int flags = rt->sflags[s];
  int r = k == n ? s : k == 0 && !(flags & DI_GRT_ACCEPT) ? DI_GRT_DEAD : di_grt_state_of(rt, keep, k, flags);
  free(keep);
  if (r == DI_GRT_ERROR)
    return r;
  if (!grow_states(rt, s)) { /* di_grt_state_of may have made states: s's slot is still there */
    di_error_set(DI_ERR_OOM, "out of memory");
    return DI_GRT_ERROR;
  }
  rt->sb_prune[s] = r;
  return r;
}

enum { SB_SEARCH_MAX = 16384 }; /* configurations a viability search may reach before it gives up */

/* The fewest characters from (s, lex) to a state with a stack outside the body (0-1 breadth-first
 * search over (state, lexical position): a character's first byte costs one); SB_INF when there is
 * none, -2 out of memory, -3 past the search's budget. */
static int fewest_chars(di_grt *rt, int s, unsigned lex) {
  enum { QCAP = 4 * SB_SEARCH_MAX, HCAP = 4 * SB_SEARCH_MAX }; /* powers of two */
  typedef struct {
    int64_t key; /* state * 16 + lexical position, -1 empty */
    int32_t d;   /* the smallest distance known */
  } slot;
  int64_t *q = malloc(sizeof *q * QCAP); /* a ring: keys, distance in the map */
  slot *map = malloc(sizeof *map * HCAP);
  if (!q || !map) {
    free(q), free(map);
    return -2;
  }
  for (int i = 0; i < HCAP; i++)
    map[i].key = -1;
  unsigned head = 0, tail = 0;
  int reached = 0, result = SB_INF;
#define SB_FIND(k, h)                                                                                                  \
  do {                                                                                                                 \
    h = (unsigned)((uint64_t)(k) * 0x9E3779B97F4A7C15ull >> 40) & (HCAP - 1);                                          \
    while (map[h].key != -1 && map[h].key != (k))                                                                     \
      h = (h + 1) & (HCAP - 1);                                                                                        \
  } while (0)
  unsigned h;
  const int64_t k0 = (int64_t)s * 16 + lex;
  SB_FIND(k0, h);
  map[h].key = k0, map[h].d = 0, reached = 1;
  q[tail++ & (QCAP - 1)] = k0;
  while (head != tail) {
    const int64_t key = q[head++ & (QCAP - 1)];
    SB_FIND(key, h);
    const int d = map[h].d;
    const int xs = (int)(key >> 4);
    const unsigned xl = (unsigned)(key & 15);
    const int info = di_sb_info(rt, xs);
    if (info < 0) {
      result = -2;
      break;
    }
    if (info & DI_SB_OUTSIDE) { /* popped in order of distance: the fewest */
      result = d;
      break;
    }
    uint64_t done[256 * 32 / 64] = {0}; /* (byte class, tick, next position) triples expanded */
    for (unsigned c = 0; c < 256; c++) {
      int tick;
      const unsigned nl = di_sb_lex(xl, c, &tick);
      const unsigned kk = (unsigned)rt->cls[c] * 32 + (unsigned)tick * 16 + nl;
      if (done[kk >> 6] >> (kk & 63) & 1)
        continue;
      done[kk >> 6] |= 1ull << (kk & 63);
      const int ns = di_grt_step(rt, xs, c);
      if (ns == DI_GRT_ERROR) {
        result = -2;
        goto out;
      }
      if (ns < 0)
        continue;
      const int64_t nk = (int64_t)ns * 16 + nl;
      const int nd = d + tick;
      SB_FIND(nk, h);
      if (map[h].key == nk && map[h].d <= nd)
        continue;
      if (map[h].key != nk && ++reached > SB_SEARCH_MAX) {
        result = -3;
        goto out;
      }
      if (tail - head >= QCAP - 1) {
        result = -3;
        goto out;
      }
      map[h].key = nk, map[h].d = nd;
      if (tick)
        q[tail++ & (QCAP - 1)] = nk;
      else
        q[--head & (QCAP - 1)] = nk;
    }
  }
out:
#undef SB_FIND
  free(q), free(map);
  return result;
}

int di_sb_viable(di_grt *rt, int s, uint32_t cs) {
  if (s < 0)
    return 0;
  const int info = di_sb_info(rt, s);
  if (info < 0)
    return info;
  if (!(info & DI_SB_INSIDE) || (info & DI_SB_OUTSIDE))
    return 1;
  const int left = rt->g->sb_n - (int)di_sb_count(cs);
  if (left >= rt->g->sb_radius) /* every position of a body ends within the radius (bytes >= characters) */
    return 1;
  const unsigned lex = cs >> 24;
  int16_t *memo = &rt->sb_rem[(size_t)s * SB_LEX + lex];
  int d = *memo;
  if (d < 0) {
    d = fewest_chars(rt, s, lex);
    if (d == -2) {
      di_error_set(DI_ERR_OOM, "out of memory");
      return DI_GRT_ERROR;
    }
    if (d == -3)
      return 1; /* past the search's budget: taken as viable (never met by the formats; documented) */
    if (d > 32767)
      d = 32767;
    memo = &rt->sb_rem[(size_t)s * SB_LEX + lex]; /* the search may have grown the arrays */
    *memo = (int16_t)d;
  }
  return d <= left;
}
