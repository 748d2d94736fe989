/* Grammar builder: rules, alternatives, interned byte classes, UTF-8 lowering of code-point
 * sets, bounded repetition, and the final checks (defined, productive, not left-recursive) and
 * flattening into the array the automaton walks. */
#include "util/grow.h"
#include "grammar/gram_ir.h"
#include "grammar/rule_scc.h"
#include <stdlib.h>
#include <string.h>

struct di_cpcache {
  di_cprange *r;
  int n, negate;
  di_gel el;
};

/* The rules built for repetitions of one element x: star = x*, opt[j-1] = O_j (at most j more
 * copies). They are context free, so every x{m,n} and x* of the grammar reuses them: a schema with
 * a hundred bounded strings holds one chain, not a hundred (and its positions share masks). */
struct di_repcache {
  di_gel x;
  int star; /* -1 until built */
  int32_t *opt;
  int n_opt, cap_opt;
};

void di_gb_init(di_gb *b, int max_elements) {
  memset(b, 0, sizeof *b);
  b->max_els = max_elements > 0 ? max_elements : 2000000;
  b->root = -1;
}

void di_gb_free(di_gb *b) {
  for (int i = 0; i < b->n_rules; i++) {
    free(b->rules[i].name);
    free(b->rules[i].alt_off);
    free(b->rules[i].els);
  }
  for (int i = 0; i < b->n_cpc; i++)
    free(b->cpc[i].r);
  free(b->cpc);
  for (int i = 0; i < b->n_rpc; i++)
    free(b->rpc[i].opt);
  free(b->rpc);
  free(b->rules);
  free(b->name_ht);
  free(b->classes);
  free(b->flat);
  free(b->rule_alts);
  free(b->rule_first);
  free(b->sb_cont);
  memset(b, 0, sizeof *b);
}

static inline int grow(void **p, int *cap, int need, size_t elsize) { return di_grow(p, cap, need, elsize, 8); }

static uint32_t name_hash(const char *s) { /* FNV-1a */
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* The slot of `name` in the index: the one holding its rule, else the empty slot where it would go. */
static int32_t *name_slot(const di_gb *b, const char *name) {
  const uint32_t mask = (uint32_t)b->ht_cap - 1;
  for (uint32_t i = name_hash(name) & mask;; i = (i + 1) & mask) {
    int32_t *e = &b->name_ht[i];
    if (*e < 0 || strcmp(b->rules[*e].name, name) == 0)
      return e;
  }
}

/* Puts rule r (just appended, its name set) into the index, doubling it at half full. A failed
 * allocation sets b->oom: the caller's grammar is then abandoned, so a rule missing from the index
 * can never be looked up. */
static void name_index(di_gb *b, int r) {
  if (!b->rules[r].name)
    return; /* its strdup failed: b->oom is set */
  if (2 * (r + 1) > b->ht_cap) {
    int cap = b->ht_cap ? 2 * b->ht_cap : 64;
    int32_t *ht = malloc((size_t)cap * sizeof *ht);
    if (!ht) {
      b->oom = 1;
      return;
    }
    free(b->name_ht);
    b->name_ht = ht;
    b->ht_cap = cap;
    memset(ht, 0xff, (size_t)cap * sizeof *ht);
    for (int i = 0; i < r; i++)
      if (b->rules[i].name) {
        int32_t *e = name_slot(b, b->rules[i].name);
        if (*e < 0)
          *e = i;
      }
  }
  int32_t *e = name_slot(b, b->rules[r].name);
  if (*e < 0) /* a name already held keeps its first rule, as the scan found it */
    *e = r;
}

int di_gb_rule(di_gb *b, const char *name) {
  if (b->name_ht) {
    const int32_t *e = name_slot(b, name);
    if (*e >= 0)
      return *e;
  }
  if (!grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof(di_grule))) {
    b->oom = 1;
    return 0;
  }
  di_grule *r = &b->rules[b->n_rules];
  memset(r, 0, sizeof *r);
  r->name = strdup(name);
  if (!r->name)
    b->oom = 1;
  name_index(b, b->n_rules);
  return b->n_rules++;
}

int di_gb_new_rule(di_gb *b, const char *hint) {
  /* anonymous names contain '#', which EBNF identifiers cannot, so they never collide with a named
   * rule; indexed all the same, so a lookup by any name finds what a scan of the rules would */
  if (!grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof(di_grule))) {
    b->oom = 1;
    return 0;
  }
  char name[96];
  snprintf(name, sizeof name, "%.60s#%d", hint, b->n_rules);
  di_grule *r = &b->rules[b->n_rules];
  memset(r, 0, sizeof *r);
  r->name = strdup(name);
  if (!r->name)
    b->oom = 1;
  name_index(b, b->n_rules);
  return b->n_rules++;
}

di_status di_gb_add_alt(di_gb *b, int rule, const di_gel *els, int n) {
  if (b->oom)
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  if (b->total_els + n + 1 > b->max_els)
    return di_error_set(DI_ERR_UNSUPPORTED, "grammar too large: more than %d elements (bound max_elements)",
                        b->max_els);
  di_grule *r = &b->rules[rule];
  if (!grow((void **)&r->alt_off, &r->cap_alts, r->n_alts + 2, sizeof(int32_t)) ||
      !grow((void **)&r->els, &r->cap_els, r->n_els + n, sizeof(di_gel))) {
    b->oom = 1;
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  }
  if (r->n_alts == 0)
    r->alt_off[0] = 0;
  if (n)
    memcpy(r->els + r->n_els, els, (size_t)n * sizeof(di_gel));
  r->n_els += n;
  r->n_alts++;
  r->alt_off[r->n_alts] = r->n_els;
  r->defined = 1;
  b->total_els += n + 1;
  return DI_OK;
}

int di_gb_class(di_gb *b, const di_gbyteset *s) {
  /* linear intern over recent classes: grammars have few distinct classes */
  int lo = b->n_classes > 256 ? b->n_classes - 256 : 0;
  for (int i = b->n_classes - 1; i >= lo; i--)
    if (memcmp(&b->classes[i], s, sizeof *s) == 0)
      return i;
  if (!grow((void **)&b->classes, &b->cap_classes, b->n_classes + 1, sizeof(di_gbyteset))) {
    b->oom = 1;
    return 0;
  }
  b->classes[b->n_classes] = *s;
  return b->n_classes++;
}

void di_gseq_push(di_gb *b, di_gseq *s, di_gel e) {
  if (!grow((void **)&s->v, &s->cap, s->n + 1, sizeof(di_gel))) {
    b->oom = 1;
    return;
  }
  s->v[s->n++] = e;
}

void di_gseq_free(di_gseq *s) {
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

void di_gseq_byte(di_gb *b, di_gseq *s, uint8_t c) {
  di_gbyteset set = {{0}};
  di_gbyteset_add(&set, c);
  di_gseq_push(b, s, (di_gel){DI_GE_CLASS, di_gb_class(b, &set)});
}

void di_gseq_bytes(di_gb *b, di_gseq *s, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    di_gseq_byte(b, s, (uint8_t)p[i]);
}

static int cmp_range(const void *a, const void *c) {
  const di_cprange *x = a, *y = c;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

int di_cpset_normalize(di_cprange *r, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (r[i].lo > r[i].hi || r[i].lo > 0x10FFFF)
      continue;
    if (r[i].hi > 0x10FFFF)
      r[i].hi = 0x10FFFF;
    r[k++] = r[i];
  }
  if (k > 1) /* (r may be NULL when the set is empty: qsort's base must not be) */
    qsort(r, (size_t)k, sizeof *r, cmp_range);
  int m = 0;
  for (int i = 0; i < k; i++) {
    if (m > 0 && r[i].lo <= r[m - 1].hi + 1) {
      if (r[i].hi > r[m - 1].hi)
        r[m - 1].hi = r[i].hi;
    } else {
      r[m++] = r[i];
    }
  }
  return m;
}

static int utf8_encode(uint32_t c, uint8_t *o) {
  if (c < 0x80) {
    o[0] = (uint8_t)c;
    return 1;
  }
  if (c < 0x800) {
    o[0] = (uint8_t)(0xC0 | (c >> 6));
    o[1] = (uint8_t)(0x80 | (c & 63));
    return 2;
  }
  if (c < 0x10000) {
    o[0] = (uint8_t)(0xE0 | (c >> 12));
    o[1] = (uint8_t)(0x80 | ((c >> 6) & 63));
    o[2] = (uint8_t)(0x80 | (c & 63));
    return 3;
  }
  o[0] = (uint8_t)(0xF0 | (c >> 18));
  o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
  o[2] = (uint8_t)(0x80 | ((c >> 6) & 63));
  o[3] = (uint8_t)(0x80 | (c & 63));
  return 4;
}

/* A UTF-8 byte-range sequence: bytes k in [lo[k], hi[k]]. */
typedef struct {
  uint8_t lo[4], hi[4];
  int len;
} u8seq;

typedef struct {
  u8seq *v;
  int n, cap;
} u8seqs;

/* Splits [lo,hi] (same encoded length) until every byte position is an independent range:
 * the classic construction used by regex engines to compile Unicode classes to bytes. */
static void utf8_split(u8seqs *out, uint32_t lo, uint32_t hi, int *oom) {
  static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (int i = 0; i < 3; i++) {
    if (lo <= bounds[i] && hi > bounds[i]) {
      utf8_split(out, lo, bounds[i], oom);
      utf8_split(out, bounds[i] + 1, hi, oom);
      return;
    }
  }
  uint8_t a[4], z[4];
  int len = utf8_encode(lo, a);
  for (int i = 1; i < len; i++) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(out, lo, lo | m, oom);
        utf8_split(out, (lo | m) + 1, hi, oom);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(out, lo, (hi & ~m) - 1, oom);
        utf8_split(out, hi & ~m, hi, oom);
        return;
      }
    }
  }
  utf8_encode(hi, z);
  if (!grow((void **)&out->v, &out->cap, out->n + 1, sizeof(u8seq))) {
    *oom = 1;
    return;
  }
  u8seq *s = &out->v[out->n++];
  s->len = len;
  for (int i = 0; i < len; i++) {
    s->lo[i] = a[i];
    s->hi[i] = z[i];
  }
}

static int range_class(di_gb *b, uint8_t lo, uint8_t hi) {
  di_gbyteset set = {{0}};
  for (unsigned c = lo; c <= hi; c++)
    di_gbyteset_add(&set, c);
  return di_gb_class(b, &set);
}

void di_gseq_cp(di_gb *b, di_gseq *s, uint32_t c) {
  if (c < 0x80) {
    di_gseq_byte(b, s, (uint8_t)c);
    return;
  }
  di_cprange r = {c, c};
  di_gseq_cpset(b, s, &r, 1, 0);
}

void di_gseq_cpset(di_gb *b, di_gseq *s, const di_cprange *in, int n, int negate) {
  di_cprange *r = malloc(sizeof(di_cprange) * (size_t)(n + 2) * 2);
  if (!r) {
    b->oom = 1;
    return;
  }
  if (n > 0)
    memcpy(r, in, sizeof(di_cprange) * (size_t)n);
  n = di_cpset_normalize(r, n);
  if (negate) { /* complement over 0..0x10FFFF */
    di_cprange *c = r + n + 2;
    int k = 0;
    uint32_t next = 0;
    for (int i = 0; i < n; i++) {
      if (r[i].lo > next)
        c[k++] = (di_cprange){next, r[i].lo - 1};
      next = r[i].hi + 1;
    }
    if (next <= 0x10FFFF)
      c[k++] = (di_cprange){next, 0x10FFFF};
    memmove(r, c, sizeof(di_cprange) * (size_t)k);
    n = k;
  }
  /* surrogates are not valid UTF-8: carve D800-DFFF out */
  di_cprange tmp[2];
  int m = 0;
  di_cprange *r2 = malloc(sizeof(di_cprange) * (size_t)(n * 2 + 1));
  if (!r2) {
    free(r);
    b->oom = 1;
    return;
  }
  for (int i = 0; i < n; i++) {
    int t = 0;
    if (r[i].lo < 0xD800)
      tmp[t++] = (di_cprange){r[i].lo, r[i].hi < 0xD7FF ? r[i].hi : 0xD7FF};
    if (r[i].hi > 0xDFFF)
      tmp[t++] = (di_cprange){r[i].lo > 0xE000 ? r[i].lo : 0xE000, r[i].hi};
    for (int j = 0; j < t; j++)
      r2[m++] = tmp[j];
  }
  free(r);
  n = m;
  r = r2;
  /* reuse a recent identical set */
  for (int i = b->n_cpc - 1; i >= 0 && i >= b->n_cpc - 64; i--) {
    if (b->cpc[i].n == n && memcmp(b->cpc[i].r, r, sizeof(di_cprange) * (size_t)n) == 0) {
      di_gseq_push(b, s, b->cpc[i].el);
      free(r);
      return;
    }
  }
  u8seqs seqs = {0};
  int oom = 0;
  di_gbyteset ascii = {{0}};
  int has_ascii = 0;
  for (int i = 0; i < n; i++) {
    uint32_t lo = r[i].lo, hi = r[i].hi;
    if (lo < 0x80) {
      uint32_t h = hi < 0x7F ? hi : 0x7F;
      for (uint32_t c = lo; c <= h; c++)
        di_gbyteset_add(&ascii, c);
      has_ascii = 1;
      if (hi < 0x80)
        continue;
      lo = 0x80;
    }
    utf8_split(&seqs, lo, hi, &oom);
  }
  di_gel el;
  if (oom) {
    b->oom = 1;
    free(seqs.v);
    free(r);
    return;
  }
  if (seqs.n == 0) {
    el = (di_gel){DI_GE_CLASS, di_gb_class(b, &ascii)}; /* possibly empty: never matches */
  } else {
    int rule = di_gb_new_rule(b, "char");
    if (has_ascii) {
      di_gel a = {DI_GE_CLASS, di_gb_class(b, &ascii)};
      di_gb_add_alt(b, rule, &a, 1);
    }
    /* sequences sharing all but the last byte range merge poorly; they are few anyway */
    for (int i = 0; i < seqs.n; i++) {
      di_gel e[4];
      for (int k = 0; k < seqs.v[i].len; k++)
        e[k] = (di_gel){DI_GE_CLASS, range_class(b, seqs.v[i].lo[k], seqs.v[i].hi[k])};
      di_gb_add_alt(b, rule, e, seqs.v[i].len);
    }
    el = (di_gel){DI_GE_RULE, rule};
  }
  free(seqs.v);
  di_gseq_push(b, s, el);
  if (grow((void **)&b->cpc, &b->cap_cpc, b->n_cpc + 1, sizeof(struct di_cpcache))) {
    b->cpc[b->n_cpc++] = (struct di_cpcache){r, n, 0, el};
  } else {
    free(r);
  }
}

di_gel di_gb_wrap(di_gb *b, const di_gseq *s, const char *hint) {
  if (s->n == 1)
    return s->v[0];
  int r = di_gb_new_rule(b, hint);
  di_gb_add_alt(b, r, s->v, s->n);
  return (di_gel){DI_GE_RULE, r};
}

void di_gseq_repeat_tail(di_gb *b, di_gseq *s, int from, int min, int max, const char *hint) {
  di_gseq tail = {0};
  for (int k = from; k < s->n; k++)
    di_gseq_push(b, &tail, s->v[k]);
  s->n = from;
  di_gel x = di_gb_wrap(b, &tail, hint);
  di_gseq_free(&tail);
  di_gseq_repeat(b, s, x, min, max);
}

static struct di_repcache *repcache_of(di_gb *b, di_gel x) {
  for (int i = 0; i < b->n_rpc; i++)
    if (b->rpc[i].x.kind == x.kind && b->rpc[i].x.arg == x.arg)
      return &b->rpc[i];
  if (!grow((void **)&b->rpc, &b->cap_rpc, b->n_rpc + 1, sizeof(struct di_repcache))) {
    b->oom = 1;
    return NULL;
  }
  b->rpc[b->n_rpc] = (struct di_repcache){x, -1, NULL, 0, 0};
  return &b->rpc[b->n_rpc++];
}

void di_gseq_repeat(di_gb *b, di_gseq *s, di_gel x, int min, int max) {
  for (int i = 0; i < min; i++)
    di_gseq_push(b, s, x);
  if (max >= 0 && max - min <= 0)
    return;
  struct di_repcache *rc = repcache_of(b, x);
  if (!rc)
    return;
  if (max < 0) { /* R ::= x R | "" -- right recursion, a tail call in the automaton */
    if (rc->star < 0) {
      int r = di_gb_new_rule(b, "star");
      di_gel e[2] = {x, {DI_GE_RULE, r}};
      di_gb_add_alt(b, r, e, 2);
      di_gb_add_alt(b, r, NULL, 0);
      rc->star = r;
    }
    di_gseq_push(b, s, (di_gel){DI_GE_RULE, rc->star});
    return;
  }
  int k = max - min;
  /* O_1 ::= x | "" ; O_j ::= x O_{j-1} | "" (extending the chain built so far) */
  while (rc->n_opt < k) {
    if (!grow((void **)&rc->opt, &rc->cap_opt, rc->n_opt + 1, sizeof(int32_t))) {
      b->oom = 1;
      return;
    }
    int prev = rc->n_opt ? rc->opt[rc->n_opt - 1] : -1;
    int r = di_gb_new_rule(b, "opt");
    rc = repcache_of(b, x); /* di_gb_new_rule does not move rpc, but stay safe */
    di_gel e[2] = {x, {DI_GE_RULE, prev}};
    di_gb_add_alt(b, r, e, prev < 0 ? 1 : 2);
    di_gb_add_alt(b, r, NULL, 0);
    rc->opt[rc->n_opt++] = r;
    if (b->oom || b->total_els > b->max_els)
      return;
  }
  di_gseq_push(b, s, (di_gel){DI_GE_RULE, rc->opt[k - 1]});
}

static int class_empty(const di_gbyteset *c) {
  for (int i = 0; i < 8; i++)
    if (c->w[i])
      return 0;
  return 1;
}

di_status di_gb_finish(di_gb *b, int root) {
  if (b->oom)
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  if (b->total_els > b->max_els)
    return di_error_set(DI_ERR_UNSUPPORTED, "grammar too large: more than %d elements", b->max_els);
  int nr = b->n_rules;
  for (int i = 0; i < nr; i++)
    if (!b->rules[i].defined)
      return di_error_set(DI_ERR_FORMAT, "rule '%s' is used but not defined", b->rules[i].name);
  char *prod = calloc((size_t)nr + 1, 1), *nullable = calloc((size_t)nr + 1, 1);
  if (!prod || !nullable) {
    free(prod);
    free(nullable);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  /* productive and nullable rules: fixpoints */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < nr; i++) {
      di_grule *r = &b->rules[i];
      for (int a = 0; a < r->n_alts; a++) {
        int p = 1, nl = 1;
        for (int k = r->alt_off[a]; k < r->alt_off[a + 1]; k++) {
          di_gel e = r->els[k];
          if (e.kind == DI_GE_CLASS) {
            nl = 0;
            if (class_empty(&b->classes[e.arg]))
              p = 0;
          } else {
            if (!prod[e.arg])
              p = 0;
            if (!nullable[e.arg])
              nl = 0;
          }
        }
        if (p && !prod[i])
          prod[i] = 1, changed = 1;
        if (nl && !nullable[i])
          nullable[i] = 1, changed = 1;
      }
    }
  }
  if (!prod[root]) {
    free(prod);
    free(nullable);
    return di_error_set(DI_ERR_FORMAT, "the grammar accepts nothing (rule '%s' can never complete)",
                        b->rules[root].name);
  }
  /* Left recursion: a cycle of rule references, each reached through a nullable prefix, that
   * pushes a stack node on the way (a reference that is not the last element of its alternative).
   * The automaton expands rules eagerly, so such a cycle would grow stacks without end; cycles of
   * tail references only (as in `(a*)*`) revisit the same node and are harmless. Found with
   * strongly connected components (di_rule_scc) over the "left edges". */
  di_status st = DI_OK;
  int ne = 0, cape = 64;
  int *eto = malloc(sizeof(int) * (size_t)cape), *efrom = malloc(sizeof(int) * (size_t)cape);
  char *egrow = malloc((size_t)cape);
  int *eoff = calloc((size_t)nr + 1, sizeof(int));
  if (!eto || !efrom || !egrow || !eoff)
    st = di_error_set(DI_ERR_OOM, "out of memory");
  for (int i = 0; st == DI_OK && i < nr; i++) {
    di_grule *r = &b->rules[i];
    eoff[i] = ne;
    for (int a = 0; a < r->n_alts && st == DI_OK; a++) {
      for (int k = r->alt_off[a]; k < r->alt_off[a + 1]; k++) {
        di_gel e = r->els[k];
        if (e.kind == DI_GE_CLASS || !prod[e.arg])
          break;
        if (ne == cape) {
          cape *= 2;
          int *t1 = realloc(eto, sizeof(int) * (size_t)cape), *t2 = realloc(efrom, sizeof(int) * (size_t)cape);
          char *t3 = realloc(egrow, (size_t)cape);
          if (t1)
            eto = t1;
          if (t2)
            efrom = t2;
          if (t3)
            egrow = t3;
          if (!t1 || !t2 || !t3) {
            st = di_error_set(DI_ERR_OOM, "out of memory");
            break;
          }
        }
        eto[ne] = e.arg;
        efrom[ne] = i;
        egrow[ne] = k + 1 < r->alt_off[a + 1];
        ne++;
        if (!nullable[e.arg])
          break;
      }
    }
  }
  if (eoff)
    eoff[nr] = ne;
  int *comp = malloc(sizeof(int) * (size_t)(nr + 1));
  if (st == DI_OK && !comp)
    st = di_error_set(DI_ERR_OOM, "out of memory");
  if (st == DI_OK)
    st = di_rule_scc(nr, eoff, eto, comp, NULL);
  if (st == DI_OK) {
    for (int e = 0; e < ne; e++)
      if (egrow[e] && comp[efrom[e]] == comp[eto[e]]) {
        st = di_error_set(DI_ERR_UNSUPPORTED,
                          "rule '%s' is left-recursive (through '%s'); rewrite it with repetition",
                          b->rules[eto[e]].name, b->rules[efrom[e]].name);
        break;
      }
  }
  free(eto);
  free(efrom);
  free(egrow);
  free(eoff);
  free(comp);
  if (st != DI_OK) {
    free(prod);
    free(nullable);
    return st;
  }
  /* flatten, dropping alternatives that can never complete */
  b->flat = malloc(sizeof(di_gel) * (size_t)(b->total_els + 1));
  b->rule_first = malloc(sizeof(int32_t) * (size_t)(nr + 1));
  int n_alts = 0;
  for (int i = 0; i < nr; i++)
    n_alts += b->rules[i].n_alts;
  b->rule_alts = malloc(sizeof(int32_t) * (size_t)(n_alts + 1));
  if (!b->flat || !b->rule_first || !b->rule_alts) {
    free(prod);
    free(nullable);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  int nf = 0, na = 0;
  for (int i = 0; i < nr; i++) {
    di_grule *r = &b->rules[i];
    b->rule_first[i] = na;
    for (int a = 0; a < r->n_alts; a++) {
      int ok = 1;
      for (int k = r->alt_off[a]; k < r->alt_off[a + 1]; k++) {
        di_gel e = r->els[k];
        if ((e.kind == DI_GE_CLASS && class_empty(&b->classes[e.arg])) || (e.kind == DI_GE_RULE && !prod[e.arg]))
          ok = 0;
      }
      if (!ok)
        continue;
      b->rule_alts[na++] = nf;
      for (int k = r->alt_off[a]; k < r->alt_off[a + 1]; k++)
        b->flat[nf++] = r->els[k];
      b->flat[nf++] = (di_gel){DI_GE_END, i};
    }
  }
  b->rule_first[nr] = na;
  b->n_flat = nf;
  b->root = root;
  free(prod);
  free(nullable);
  return DI_OK;
}

static void print_class(const di_gbyteset *c, FILE *f) {
  int n = 0;
  for (int i = 0; i < 256; i++)
    n += di_gbyteset_has(c, (unsigned)i);
  if (n == 1) {
    for (int i = 0; i < 256; i++)
      if (di_gbyteset_has(c, (unsigned)i)) {
        if (i >= 0x20 && i < 0x7F && i != '"' && i != '\\')
          fprintf(f, "\"%c\"", i);
        else
          fprintf(f, "\"\\x%02X\"", i);
      }
    return;
  }
  fputc('[', f);
  for (int i = 0; i < 256;) {
    if (!di_gbyteset_has(c, (unsigned)i)) {
      i++;
      continue;
    }
    int j = i;
    while (j + 1 < 256 && di_gbyteset_has(c, (unsigned)j + 1))
      j++;
    for (int k = 0; k < (j > i ? 2 : 1); k++) {
      int ch = k ? j : i;
      if (ch > 0x20 && ch < 0x7F && ch != ']' && ch != '\\' && ch != '-' && ch != '^')
        fputc(ch, f);
      else
        fprintf(f, "\\x%02X", ch);
      if (k == 0 && j > i)
        fputc('-', f);
    }
    i = j + 1;
  }
  fputc(']', f);
}

void di_gb_print(const di_gb *b, FILE *f) {
  for (int i = 0; i < b->n_rules; i++) {
    fprintf(f, "%s ::=", b->rules[i].name);
    for (int a = b->rule_first[i]; a < b->rule_first[i + 1]; a++) {
      if (a > b->rule_first[i])
        fprintf(f, " |");
      int p = b->rule_alts[a];
      if (b->flat[p].kind == DI_GE_END)
        fprintf(f, " \"\"");
      for (; b->flat[p].kind != DI_GE_END; p++) {
        fputc(' ', f);
        if (b->flat[p].kind == DI_GE_CLASS)
          print_class(&b->classes[b->flat[p].arg], f);
        else
          fprintf(f, "%s", b->rules[b->flat[p].arg].name);
      }
    }
    fputc('\n', f);
  }
}
