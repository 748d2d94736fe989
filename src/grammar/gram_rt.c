/* Lazily determinised pushdown automaton (see gram_rt.h). Expansion of rule references is
 * eager (closure) with tail calls eliminated, so repetition written as right recursion keeps
 * stacks flat; left recursion is rejected at compile time, which makes every closure finite.
 * A step fills every byte class of its state's row that the state's stacks cannot tell from the
 * stepped one (the same stacks take it), so a state costs one closure per distinct successor set,
 * not one per byte class: the budget and ASCII-run searches step each state by every class. */
#include "util/grow.h"
#include "grammar/gram_rt.h"
#include <stdlib.h>
#include <string.h>
#include "util/sort_i32.h"
#include "util/switches.h"

static inline uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return (uint32_t)x;
}

static inline int grow(void **p, int *cap, int need, size_t elsize) { return di_grow(p, cap, need, elsize, 64); }

static int node_rehash(di_grt *rt, int cap) {
  int32_t *h = malloc(sizeof(int32_t) * (size_t)cap);
  if (!h)
    return 0;
  memset(h, 0xff, sizeof(int32_t) * (size_t)cap);
  for (int i = 2; i < rt->nn; i++) {
    uint32_t k = mix(((uint64_t)(uint32_t)rt->npos[i] << 32) | (uint32_t)rt->npar[i]) & (uint32_t)(cap - 1);
    while (h[k] >= 0)
      k = (k + 1) & (uint32_t)(cap - 1);
    h[k] = i;
  }
  free(rt->nhash);
  rt->nhash = h;
  rt->nhcap = cap;
  return 1;
}

/* Node id of (pos, parent), created when new; -1 past the budget or out of memory. */
static int node_get(di_grt *rt, int pos, int parent) {
  uint32_t k = mix(((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent) & (uint32_t)(rt->nhcap - 1);
  for (;;) {
    int id = rt->nhash[k];
    if (id < 0)
      break;
    if (rt->npos[id] == pos && rt->npar[id] == parent)
      return id;
    k = (k + 1) & (uint32_t)(rt->nhcap - 1);
  }
  if (rt->nn >= rt->max_nodes)
    return -1;
  int oldcap = rt->capn;
  if (!grow((void **)&rt->npos, &rt->capn, rt->nn + 1, sizeof(int32_t)))
    return -1;
  if (rt->capn != oldcap) { /* npar and gen share npos' capacity */
    int32_t *np = realloc(rt->npar, sizeof(int32_t) * (size_t)rt->capn);
    if (np)
      rt->npar = np;
    uint32_t *ng = realloc(rt->gen, sizeof(uint32_t) * (size_t)rt->capn);
    if (ng)
      rt->gen = ng;
    if (!np || !ng) {
      rt->capn = oldcap; /* keep the arrays consistent: npos is merely larger */
      return -1;
    }
  }
  int id = rt->nn++;
  rt->npos[id] = pos;
  rt->npar[id] = parent;
  rt->gen[id] = 0;
  rt->nhash[k] = id;
  if (rt->nn * 2 > rt->nhcap && !node_rehash(rt, rt->nhcap * 2))
    return -1;
  return id;
}

static uint32_t state_hash(const int32_t *v, int n, int flags) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)flags;
  for (int i = 0; i < n; i++)
    h = (h ^ (uint32_t)v[i]) * 0x100000001B3ULL;
  return mix(h);
}

static int state_rehash(di_grt *rt, int cap) {
  int32_t *h = malloc(sizeof(int32_t) * (size_t)cap);
  if (!h)
    return 0;
  memset(h, 0xff, sizeof(int32_t) * (size_t)cap);
  for (int i = 0; i < rt->ns; i++) {
    uint32_t k = state_hash(rt->sn + rt->soff[i], rt->soff[i + 1] - rt->soff[i], rt->sflags[i]) & (uint32_t)(cap - 1);
    while (h[k] >= 0)
      k = (k + 1) & (uint32_t)(cap - 1);
    h[k] = i;
  }
  free(rt->shash);
  rt->shash = h;
  rt->shcap = cap;
  return 1;
}

/* Interns the set v[0..n) (sorted here) with flags; DI_GRT_DEAD when empty and flagless. */
static int state_get(di_grt *rt, int32_t *v, int n, int flags) {
  if (n == 0 && flags == 0)
    return DI_GRT_DEAD;
  if (n > DI_SORT_I32_SMALL && !grow((void **)&rt->sort_tmp, &rt->sort_cap, n, sizeof(int32_t)))
    goto oom;
  di_sort_i32(v, n, rt->sort_tmp); /* node ids are >= 0 */
  uint32_t h = state_hash(v, n, flags);
  uint32_t k = h & (uint32_t)(rt->shcap - 1);
  for (;;) {
    int id = rt->shash[k];
    if (id < 0)
      break;
    int m = rt->soff[id + 1] - rt->soff[id];
    if (m == n && rt->sflags[id] == flags && (n == 0 || memcmp(rt->sn + rt->soff[id], v, sizeof(int32_t) * (size_t)n) == 0))
      return id;
    k = (k + 1) & (uint32_t)(rt->shcap - 1);
  }
  if (rt->ns >= rt->max_states) {
    di_error_set(DI_ERR_OOM, "grammar automaton exceeded its budget of %d states", rt->max_states);
    return DI_GRT_ERROR;
  }
  if (!grow((void **)&rt->sn, &rt->sn_cap, rt->sn_n + n, sizeof(int32_t)))
    goto oom;
  int old = rt->caps;
  if (!grow((void **)&rt->sflags, &rt->caps, rt->ns + 1, 1))
    goto oom;
  if (rt->caps != old) {
    int32_t *so = realloc(rt->soff, sizeof(int32_t) * (size_t)(rt->caps + 1));
    int32_t **tr = realloc(rt->trans, sizeof(int32_t *) * (size_t)rt->caps);
    if (so)
      rt->soff = so;
    if (tr)
      rt->trans = tr;
    if (!so || !tr)
      goto oom;
  }
  int id = rt->ns++;
  if (n > 0)
    memcpy(rt->sn + rt->sn_n, v, sizeof(int32_t) * (size_t)n);
  rt->sn_n += n;
  rt->soff[id + 1] = rt->sn_n;
  rt->sflags[id] = (uint8_t)flags;
  rt->trans[id] = NULL;
  rt->shash[k] = id;
  if (rt->ns * 2 > rt->shcap && !state_rehash(rt, rt->shcap * 2))
    goto oom;
  return id;
oom:
  di_error_set(DI_ERR_OOM, "out of memory growing the grammar automaton");
  return DI_GRT_ERROR;
}

static int push_work(di_grt *rt, int *nw, int id) {
  if (id < 0)
    return 0;
  if (!grow((void **)&rt->work, &rt->work_cap, *nw + 1, sizeof(int32_t)))
    return 0;
  rt->work[(*nw)++] = id;
  return 1;
}

/* Closure of the work list: expands rule references and pops finished alternatives until only
 * terminal (byte class) positions remain. Returns the new state. */
static int closure(di_grt *rt, int nw) {
  const di_gb *g = rt->g;
  int nout = 0, flags = 0;
  while (nw > 0) {
    int id = rt->work[--nw];
    if (rt->gen[id] == rt->cur_gen)
      continue;
    rt->gen[id] = rt->cur_gen;
    int pos = rt->npos[id], par = rt->npar[id];
    di_gel e = g->flat[pos];
    if (e.kind == DI_GE_CLASS) {
      if (!grow((void **)&rt->out, &rt->out_cap, nout + 1, sizeof(int32_t)))
        goto oom;
      rt->out[nout++] = id;
      if (nout > rt->max_set) {
        di_error_set(DI_ERR_OOM, "grammar is too ambiguous: more than %d parallel parses", rt->max_set);
        return DI_GRT_ERROR;
      }
    } else if (e.kind == DI_GE_END) {
      if (par == DI_GRT_ROOT)
        flags |= DI_GRT_ACCEPT;
      else if (par == DI_GRT_PSEUDO)
        flags |= DI_GRT_PSEUDO_END;
      else if (!push_work(rt, &nw, par))
        goto oom;
    } else {
      int cont = g->flat[pos + 1].kind == DI_GE_END ? par : node_get(rt, pos + 1, par);
      if (cont < 0)
        goto oom;
      for (int a = g->rule_first[e.arg]; a < g->rule_first[e.arg + 1]; a++)
        if (!push_work(rt, &nw, node_get(rt, g->rule_alts[a], cont)))
          goto oom;
    }
  }
  return state_get(rt, rt->out, nout, flags);
oom:
  di_error_set(DI_ERR_OOM, "grammar automaton exceeded its budget of %d stack nodes (or memory)", rt->max_nodes);
  return DI_GRT_ERROR;
}

/* rt->tok_map from the rules' tok_link (gram_ir.h): copies have their alternatives in the same
 * order and shape (regular_set.c emit_rules), so position i of alternative a of a copy maps to
 * position i of alternative a of the next copy down. */
static di_status tok_map_init(di_grt *rt) {
  const di_gb *g = rt->g;
  int any = 0;
  for (int r = 0; r < g->n_rules && !any; r++)
    any = g->rules[r].tok_link != 0;
  if (!any)
    return DI_OK;
  rt->tok_map = malloc(sizeof(int32_t) * (size_t)(g->n_flat + 1));
  if (!rt->tok_map)
    return di_error_set(DI_ERR_OOM, "out of memory");
  for (int i = 0; i <= g->n_flat; i++)
    rt->tok_map[i] = DI_GRT_UNKNOWN;
  char *linked = calloc((size_t)g->n_rules + 1, 1); /* a copy that another copy links to */
  if (!linked)
    return di_error_set(DI_ERR_OOM, "out of memory");
  for (int r = 0; r < g->n_rules; r++)
    if (g->rules[r].tok_link > 0)
      linked[g->rules[r].tok_link - 1] = 1;
  for (int r = 0; r < g->n_rules; r++)
    if (g->rules[r].tok_link == -1 && !linked[r])
      rt->tok_one = 1; /* a last copy that is also the first: N = 1 */
  free(linked);
  for (int r = 0; r < g->n_rules; r++) {
    const int link = g->rules[r].tok_link;
    if (link == 0)
      continue;
    const int na = g->rule_first[r + 1] - g->rule_first[r];
    if (link > 0 && g->rule_first[link] - g->rule_first[link - 1] != na)
      return di_error_set(DI_ERR_INTERNAL, "max_tokens copies differ in shape");
    for (int a = 0; a < na; a++) {
      int p = g->rule_alts[g->rule_first[r] + a];
      int q = link > 0 ? g->rule_alts[g->rule_first[link - 1] + a] : -1;
      for (int k = 0;; k++) {
        rt->tok_map[p + k] = link > 0 ? q + k : DI_GRT_DEAD;
        if (g->flat[p + k].kind == DI_GE_END)
          break;
      }
    }
  }
  rt->tok_canon = malloc(sizeof(int32_t) * (size_t)(g->n_flat + 1));
  if (!rt->tok_canon)
    return di_error_set(DI_ERR_OOM, "out of memory");
  for (int i = 0; i <= g->n_flat; i++)
    rt->tok_canon[i] = DI_GRT_UNKNOWN;
  for (int i = 0; i <= g->n_flat; i++) { /* follow the copies down; each position is filled once */
    if (rt->tok_map[i] == DI_GRT_UNKNOWN || rt->tok_canon[i] != DI_GRT_UNKNOWN)
      continue;
    int last = i;
    while (rt->tok_map[last] >= 0 && rt->tok_canon[last] == DI_GRT_UNKNOWN)
      last = rt->tok_map[last];
    const int canon = rt->tok_canon[last] != DI_GRT_UNKNOWN ? rt->tok_canon[last] : last;
    for (int p = i; p != last; p = rt->tok_map[p])
      rt->tok_canon[p] = canon;
    rt->tok_canon[last] = canon;
  }
  return DI_OK;
}

int di_grt_boundary_safe(const di_grt *rt, int s) {
  if (!rt->tok_map)
    return 1;
  if (rt->tok_one)
    return 0;
  for (int i = rt->soff[s]; i < rt->soff[s + 1]; i++)
    if (rt->tok_map[rt->npos[rt->sn[i]]] == DI_GRT_DEAD)
      return 0;
  return 1;
}

int di_grt_boundary_slow(di_grt *rt, int s) {
  const int n = rt->soff[s + 1] - rt->soff[s];
  if (!grow((void **)&rt->work, &rt->work_cap, n, sizeof(int32_t)))
    return DI_GRT_ERROR;
  int m = 0;
  for (int i = 0; i < n; i++) {
    const int id = rt->sn[rt->soff[s] + i];
    /* only the top frame can be in a copy: copies' references are tail calls, and a bounded
     * lexeme is never inside another rule's language (copy_reachable refuses that) */
    const int to = rt->tok_map[rt->npos[id]];
    if (to == DI_GRT_UNKNOWN) {
      rt->work[m++] = id;
    } else if (to >= 0) {
      const int moved = node_get(rt, to, rt->npar[id]);
      if (moved < 0) {
        di_error_set(DI_ERR_OOM, "grammar automaton exceeded its budget of %d stack nodes", rt->max_nodes);
        return DI_GRT_ERROR;
      }
      rt->work[m++] = moved;
    }
  }
  const int r = state_get(rt, rt->work, m, rt->sflags[s]);
  if (r == DI_GRT_ERROR)
    return r;
  const int old = rt->bnd_cap;
  if (!grow((void **)&rt->bnd, &rt->bnd_cap, rt->ns, sizeof(int32_t))) {
    di_error_set(DI_ERR_OOM, "out of memory");
    return DI_GRT_ERROR;
  }
  for (int i = old; i < rt->bnd_cap; i++)
    rt->bnd[i] = DI_GRT_UNKNOWN;
  rt->bnd[s] = r;
  return r;
}

di_status di_grt_init(di_grt *rt, const di_gb *g) {
  memset(rt, 0, sizeof *rt);
  rt->g = g;
  rt->max_nodes = 8 << 20;
  rt->max_states = 200000; /* ~1 KB of transitions each: bounds memory to a few hundred MB */
  rt->max_set = 100000;
  const int max_states = di_switch_int(DI_SW_GRAMMAR_MAX_STATES, 0); /* tests of the budget paths */
  if (max_states > 16)
    rt->max_states = max_states;
  /* hash tables sized by the grammar (a document of a JSON schema makes about 2 stack nodes and 0.7
   * states per flat position): growing them by rehashing is one mask's spike, not amortised */
  rt->nhcap = 1024;
  while (rt->nhcap < 8 * g->n_flat && rt->nhcap < (1 << 20))
    rt->nhcap *= 2;
  rt->shcap = 1024;
  while (rt->shcap < 2 * g->n_flat && rt->shcap < (1 << 18))
    rt->shcap *= 2;
  rt->nhash = malloc(sizeof(int32_t) * (size_t)rt->nhcap);
  rt->shash = malloc(sizeof(int32_t) * (size_t)rt->shcap);
  rt->caps = 64;
  rt->sflags = malloc((size_t)rt->caps);
  rt->soff = malloc(sizeof(int32_t) * (size_t)(rt->caps + 1));
  rt->trans = malloc(sizeof(int32_t *) * (size_t)rt->caps);
  rt->capn = 1024;
  rt->npos = malloc(sizeof(int32_t) * (size_t)rt->capn);
  rt->npar = malloc(sizeof(int32_t) * (size_t)rt->capn);
  rt->gen = malloc(sizeof(uint32_t) * (size_t)rt->capn);
  if (!rt->nhash || !rt->shash || !rt->sflags || !rt->soff || !rt->trans || !rt->npos || !rt->npar || !rt->gen) {
    di_grt_free(rt);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  memset(rt->nhash, 0xff, sizeof(int32_t) * (size_t)rt->nhcap);
  memset(rt->shash, 0xff, sizeof(int32_t) * (size_t)rt->shcap);
  /* byte classes: refine the partition of 0..255 by every class set of the grammar */
  memset(rt->cls, 0, sizeof rt->cls);
  rt->ncls = 1;
  for (int k = 0; k < g->n_classes && rt->ncls < 256; k++) {
    int remap[256][2];
    for (int i = 0; i < 256; i++)
      remap[i][0] = remap[i][1] = -1;
    int n = 0;
    uint8_t nc[256];
    for (int b = 0; b < 256; b++) {
      int in = di_gbyteset_has(&g->classes[k], (unsigned)b);
      int *slot = &remap[rt->cls[b]][in];
      if (*slot < 0)
        *slot = n++;
      nc[b] = (uint8_t)*slot;
    }
    memcpy(rt->cls, nc, sizeof nc);
    rt->ncls = n;
  }
  /* each class set as a set of byte classes (the classes refine every set, so it is a union of them) */
  rt->cmask = calloc((size_t)g->n_classes + 1, sizeof *rt->cmask);
  if (!rt->cmask) {
    di_grt_free(rt);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (int k = 0; k < g->n_classes; k++)
    for (int b = 0; b < 256; b++)
      if (di_gbyteset_has(&g->classes[k], (unsigned)b))
        rt->cmask[k][rt->cls[b] >> 6] |= 1ull << (rt->cls[b] & 63);
  rt->soff[0] = 0;
  rt->nn = 2; /* sentinels */
  rt->npos[0] = rt->npos[1] = -1;
  rt->npar[0] = rt->npar[1] = -1;
  rt->gen[0] = rt->gen[1] = 0;
  rt->cur_gen = 1;
  int nw = 0;
  for (int a = g->rule_first[g->root]; a < g->rule_first[g->root + 1]; a++)
    if (!push_work(rt, &nw, node_get(rt, g->rule_alts[a], DI_GRT_ROOT))) {
      di_grt_free(rt);
      return di_error_set(DI_ERR_OOM, "out of memory");
    }
  const di_status ts = tok_map_init(rt);
  if (ts != DI_OK) {
    di_grt_free(rt);
    return ts;
  }
  rt->start = closure(rt, nw);
  if (rt->start < 0) {
    di_grt_free(rt);
    return rt->start == DI_GRT_DEAD ? di_error_set(DI_ERR_FORMAT, "the grammar accepts nothing") : DI_ERR_OOM;
  }
  return DI_OK;
}

void di_grt_free(di_grt *rt) {
  if (rt->trans)
    for (int i = 0; i < rt->ns; i++)
      free(rt->trans[i]);
  free(rt->trans);
  free(rt->npos);
  free(rt->npar);
  free(rt->nhash);
  free(rt->soff);
  free(rt->sn);
  free(rt->sflags);
  free(rt->shash);
  free(rt->gen);
  free(rt->work);
  free(rt->out);
  free(rt->tok_map);
  free(rt->tok_canon);
  free(rt->bnd);
  free(rt->cmask);
  free(rt->sort_tmp);
  free(rt->sb_node);
  free(rt->sb_info);
  free(rt->sb_prune);
  free(rt->sb_rem);
  memset(rt, 0, sizeof *rt);
}

int di_grt_step_slow(di_grt *rt, int s, unsigned c) {
  if (!rt->trans[s]) {
    int32_t *t = malloc(sizeof(int32_t) * (size_t)rt->ncls);
    if (!t) {
      di_error_set(DI_ERR_OOM, "out of memory");
      return DI_GRT_ERROR;
    }
    for (int i = 0; i < rt->ncls; i++)
      t[i] = DI_GRT_UNKNOWN;
    rt->trans[s] = t;
  }
  if (++rt->cur_gen == 0) { /* generation counter wrapped: clear marks */
    memset(rt->gen, 0, sizeof(uint32_t) * (size_t)rt->nn);
    rt->cur_gen = 1;
  }
  const di_gb *g = rt->g;
  const int t = rt->cls[c];
  /* same: the byte classes that every stack of s takes exactly when it takes t's (they step to
   * the same successor) */
  uint64_t same[4] = {~0ull, ~0ull, ~0ull, ~0ull};
  int nw = 0;
  for (int i = rt->soff[s]; i < rt->soff[s + 1]; i++) {
    int id = rt->sn[i];
    int pos = rt->npos[id];
    const uint64_t *m = rt->cmask[g->flat[pos].arg];
    if ((m[t >> 6] >> (t & 63)) & 1u) {
      for (int w = 0; w < 4; w++)
        same[w] &= m[w];
      if (!push_work(rt, &nw, node_get(rt, pos + 1, rt->npar[id]))) {
        di_error_set(DI_ERR_OOM, "grammar automaton exceeded its budget of %d stack nodes", rt->max_nodes);
        return DI_GRT_ERROR;
      }
    } else {
      for (int w = 0; w < 4; w++)
        same[w] &= ~m[w];
    }
  }
  int r = closure(rt, nw);
  if (r == DI_GRT_ERROR)
    return r;
  int32_t *row = rt->trans[s]; /* note: rt->trans may have moved, index again */
  for (int w = 0; w < 4; w++)
    for (uint64_t x = same[w]; x; x &= x - 1) {
      const int k = w * 64 + __builtin_ctzll(x);
      if (k < rt->ncls)
        row[k] = r;
    }
  return r;
}

int di_grt_rule_state(di_grt *rt, int rule, int parent) {
  if (++rt->cur_gen == 0) { /* generation counter wrapped: clear marks */
    memset(rt->gen, 0, sizeof(uint32_t) * (size_t)rt->nn);
    rt->cur_gen = 1;
  }
  const di_gb *g = rt->g;
  int nw = 0;
  for (int a = g->rule_first[rule]; a < g->rule_first[rule + 1]; a++)
    if (!push_work(rt, &nw, node_get(rt, g->rule_alts[a], parent))) {
      di_error_set(DI_ERR_OOM, "grammar automaton exceeded its budget of %d stack nodes", rt->max_nodes);
      return DI_GRT_ERROR;
    }
  return closure(rt, nw);
}

int di_grt_truncated_stack(di_grt *rt, int id, int depth) {
  int pos[64];
  int n = 0, cur = id;
  if (depth > 64)
    depth = 64;
  while (n < depth && cur > DI_GRT_PSEUDO) {
    pos[n++] = rt->npos[cur];
    cur = rt->npar[cur];
  }
  int base = cur > DI_GRT_PSEUDO ? DI_GRT_PSEUDO : cur; /* deeper frames become "unknown" */
  for (int i = n - 1; i >= 0 && base >= 0; i--)
    base = node_get(rt, pos[i], base);
  if (base < 0)
    di_error_set(DI_ERR_OOM, "grammar automaton exceeded its budget of %d stack nodes", rt->max_nodes);
  return base < 0 ? DI_GRT_ERROR : base;
}

int di_grt_truncated_from(di_grt *rt, int id, int anc, int depth) {
  int pos[64];
  int n = 0, cur = id;
  for (; cur != anc; cur = rt->npar[cur]) {
    if (cur <= DI_GRT_PSEUDO || n == 64)
      return DI_GRT_ERROR; /* anc is no ancestor of id, or too far */
    pos[n++] = rt->npos[cur];
  }
  int base = anc <= DI_GRT_PSEUDO ? anc : depth > 0 ? di_grt_truncated_stack(rt, anc, depth) : DI_GRT_PSEUDO;
  for (int i = n - 1; i >= 0 && base >= 0; i--)
    base = node_get(rt, pos[i], base);
  if (base < 0)
    di_error_set(DI_ERR_OOM, "grammar automaton exceeded its budget of %d stack nodes", rt->max_nodes);
  return base < 0 ? DI_GRT_ERROR : base;
}

int di_grt_replace_frame(di_grt *rt, int id, int depth, int pos) {
  int above[64];
  int cur = id;
  if (depth >= 64)
    return DI_GRT_ERROR;
  for (int n = 0; n < depth; n++) {
    if (cur <= DI_GRT_PSEUDO)
      return DI_GRT_ERROR;
    above[n] = rt->npos[cur];
    cur = rt->npar[cur];
  }
  if (cur <= DI_GRT_PSEUDO)
    return DI_GRT_ERROR;
  int base = node_get(rt, pos, rt->npar[cur]);
  for (int i = depth - 1; i >= 0 && base >= 0; i--)
    base = node_get(rt, above[i], base);
  if (base < 0)
    di_error_set(DI_ERR_OOM, "grammar automaton exceeded its budget of %d stack nodes", rt->max_nodes);
  return base < 0 ? DI_GRT_ERROR : base;
}

int di_grt_state_of(di_grt *rt, const int32_t *nodes, int n, int flags) {
  if (!grow((void **)&rt->out, &rt->out_cap, n, sizeof(int32_t)))
    return DI_GRT_ERROR;
  memcpy(rt->out, nodes, sizeof(int32_t) * (size_t)n); /* state_get sorts in place */
  return state_get(rt, rt->out, n, flags);
}

int di_grt_node_state(di_grt *rt, int id) {
  if (!grow((void **)&rt->out, &rt->out_cap, 1, sizeof(int32_t)))
    return DI_GRT_ERROR;
  rt->out[0] = id; /* state_get sorts in place: use the scratch buffer */
  return state_get(rt, rt->out, 1, 0);
}
