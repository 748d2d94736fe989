/* Regular languages as sets: each language is a grammar of its own (a regex, or a list of
 * literals) run by the lazy DFA of gram_rt.c; di_rlang_emit() explores the product of several such
 * DFAs (plus an optional JSON-string character counter) breadth first, keeps the states from
 * which an accepting state is reachable, minimises them (Moore) and writes one IR rule per state
 * left: `q ::= [bytes] q' | ...` (and the empty alternative when q accepts). Complement ("in none of these") is the product with
 * those languages' acceptance flipped, which is why the DFA has to be explicit here: a pushdown
 * grammar has no complement, a regular one does.
 *
 * The character counter follows a JSON string body byte by byte: a UTF-8 continuation byte adds
 * nothing, `\` starts an escape counted as one character (`\uXXXX` runs four hex digits more).
 * Canonically escaped text (what json_string regexes emit) has no surrogate pairs, so this is
 * exact for it. */
#include "grammar/regular_set.h"
#include "grammar/rule_scc.h"
#include <stdlib.h>
#include <string.h>
#include "grammar/gram_rt.h"
#include "util/grow.h"

struct di_rlang {
  di_gb g;
  di_grt rt;
};

static di_status finish_lang(di_rlang *l, int root) {
  di_status st = di_gb_finish(&l->g, root);
  if (st == DI_OK)
    st = di_grt_init(&l->rt, &l->g);
  return st;
}

di_status di_rlang_regex(const char *re, size_t len, int json_string, int anchored, di_rlang **out) {
  *out = NULL;
  di_rlang *l = calloc(1, sizeof *l);
  if (!l)
    return di_error_set(DI_ERR_OOM, "out of memory");
  di_gb_init(&l->g, 1 << 22);
  int root = di_gb_new_rule(&l->g, "re");
  di_status st = di_regex_compile_into(&l->g, root, re, len, json_string, anchored);
  if (st == DI_OK)
    st = finish_lang(l, root);
  if (st != DI_OK) {
    di_rlang_free(l);
    return st;
  }
  *out = l;
  return DI_OK;
}

di_status di_rlang_from_builder(di_gb *g, int root, di_rlang **out) {
  *out = NULL;
  di_rlang *l = calloc(1, sizeof *l);
  if (!l) {
    di_gb_free(g);
    memset(g, 0, sizeof *g);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  l->g = *g;
  memset(g, 0, sizeof *g);
  di_status st = finish_lang(l, root);
  if (st != DI_OK) {
    di_rlang_free(l);
    return st;
  }
  *out = l;
  return DI_OK;
}

di_status di_rlang_literals(const char *const *s, int n, di_rlang **out) {
  *out = NULL;
  di_rlang *l = calloc(1, sizeof *l);
  if (!l)
    return di_error_set(DI_ERR_OOM, "out of memory");
  if (n == 0) { /* the empty language: a DFA without states */
    l->rt.start = DI_GRT_DEAD;
    *out = l;
    return DI_OK;
  }
  di_gb_init(&l->g, 1 << 22);
  int root = di_gb_new_rule(&l->g, "lit");
  di_gseq q = {0};
  for (int i = 0; i < n; i++) {
    q.n = 0;
    di_gseq_bytes(&l->g, &q, s[i], strlen(s[i]));
    di_gb_add_alt(&l->g, root, q.v, q.n);
  }
  di_gseq_free(&q);
  di_status st = finish_lang(l, root);
  if (st != DI_OK) {
    di_rlang_free(l);
    return st;
  }
  *out = l;
  return DI_OK;
}

void di_rlang_free(di_rlang *l) {
  if (!l)
    return;
  if (l->rt.g)
    di_grt_free(&l->rt);
  di_gb_free(&l->g);
  free(l);
}

static int lang_step(di_rlang *l, int s, unsigned c) { return s < 0 ? s : di_grt_step(&l->rt, s, c); }
static int lang_accepts(const di_rlang *l, int s) { return s >= 0 && (di_grt_flags(&l->rt, s) & DI_GRT_ACCEPT); }

int di_rlang_contains(di_rlang *l, const char *s, size_t n) {
  int q = l->rt.start;
  for (size_t i = 0; i < n && q >= 0; i++)
    q = lang_step(l, q, (unsigned char)s[i]);
  return q == DI_GRT_ERROR ? -1 : lang_accepts(l, q);
}

/* ---- the product ------------------------------------------------------------------------------ */
/* A product state: k component states, then the escape phase and the character count. */
typedef struct {
  const di_rlang_product *p;
  int w;           /* ints per state */
  int32_t *st;     /* n * w */
  int n, cap;
  int32_t *hash;   /* open addressing, -1 empty */
  int hcap;
  int32_t *succ;   /* n * nj, -1 = none */
  int nj;          /* joint byte classes */
  uint8_t jcls[256];
  uint8_t jrep[256]; /* a representative byte per joint class */
} prod_t;

static uint32_t tuple_hash(const int32_t *t, int w) {
  uint32_t h = 2166136261u;
  for (int i = 0; i < w; i++)
    h = (h ^ (uint32_t)t[i]) * 16777619u;
  return h;
}

/* Index of tuple t, added when new; -1 out of memory, -2 past the budget. */
static int intern(prod_t *P, const int32_t *t) {
  if (P->n * 2 >= P->hcap) {
    int nh = P->hcap ? P->hcap * 2 : 1024;
    int32_t *h = malloc(sizeof *h * (size_t)nh);
    if (!h)
      return -1;
    memset(h, 0xff, sizeof *h * (size_t)nh);
    for (int i = 0; i < P->n; i++) {
      uint32_t x = tuple_hash(P->st + (size_t)i * P->w, P->w) & (uint32_t)(nh - 1);
      while (h[x] >= 0)
        x = (x + 1) & (uint32_t)(nh - 1);
      h[x] = i;
    }
    free(P->hash);
    P->hash = h;
    P->hcap = nh;
  }
  uint32_t x = tuple_hash(t, P->w) & (uint32_t)(P->hcap - 1);
  while (P->hash[x] >= 0) {
    if (memcmp(P->st + (size_t)P->hash[x] * P->w, t, sizeof *t * (size_t)P->w) == 0)
      return P->hash[x];
    x = (x + 1) & (uint32_t)(P->hcap - 1);
  }
  if (P->n >= P->p->max_states)
    return -2;
  if (!di_grow((void **)&P->st, &P->cap, (P->n + 1) * P->w, sizeof(int32_t), 64))
    return -1;
  memcpy(P->st + (size_t)P->n * P->w, t, sizeof *t * (size_t)P->w);
  P->hash[x] = P->n;
  return P->n++;
}

/* The counter's view of a byte: 0 plain, 1 UTF-8 continuation, 2 backslash, 3 'u'. */
static int counter_class(unsigned c) { return c >= 0x80 && c <= 0xBF ? 1 : c == '\\' ? 2 : c == 'u' ? 3 : 0; }

/* Successor of tuple t on byte c into u; 0 when it can never lead to an emitted string. */
static int tuple_step(const prod_t *P, const int32_t *t, unsigned c, int32_t *u, int *err) {
  const di_rlang_product *p = P->p;
  for (int i = 0; i < p->k; i++) {
    u[i] = lang_step(p->langs[i], t[i], c);
    if (u[i] == DI_GRT_ERROR) {
      *err = 1;
      return 0;
    }
    if (u[i] < 0 && ((p->in >> i) & 1))
      return 0;
  }
  int esc = t[p->k], cnt = t[p->k + 1];
  if (p->count_chars && p->count_plain) { /* UTF-8 text: a character per non-continuation byte */
    if (counter_class(c) != 1)
      cnt++;
    if (p->max_chars >= 0 && cnt > p->max_chars)
      return 0;
    if (p->max_chars < 0 && cnt > p->min_chars)
      cnt = p->min_chars;
  } else if (p->count_chars) {
    if (esc == 0) {
      if (counter_class(c) != 1)
        cnt++;
      if (c == '\\')
        esc = 1;
    } else if (esc == 1) {
      esc = c == 'u' ? 2 : 0;
    } else {
      esc = esc == 5 ? 0 : esc + 1;
    }
    if (p->max_chars >= 0 && cnt > p->max_chars)
      return 0;
    if (p->max_chars < 0 && cnt > p->min_chars)
      cnt = p->min_chars;
  }
  u[p->k] = esc;
  u[p->k + 1] = cnt;
  return 1;
}

static int tuple_accepts(const prod_t *P, const int32_t *t) {
  const di_rlang_product *p = P->p;
  for (int i = 0; i < p->k; i++) {
    int a = lang_accepts(p->langs[i], t[i]);
    if (((p->in >> i) & 1) && !a)
      return 0;
    if (((p->out >> i) & 1) && a)
      return 0;
  }
  return !p->count_chars || (t[p->k] == 0 && t[p->k + 1] >= p->min_chars);
}

/* Bytes that no component (nor the counter) tells apart share a joint class. */
static void joint_classes(prod_t *P) {
  const di_rlang_product *p = P->p;
  P->nj = 0;
  for (unsigned c = 0; c < 256; c++) {
    int j;
    for (j = 0; j < P->nj; j++) {
      unsigned r = P->jrep[j];
      int same = !p->count_chars || counter_class(r) == counter_class(c);
      for (int i = 0; same && i < p->k; i++)
        if (p->langs[i]->rt.g && p->langs[i]->rt.cls[r] != p->langs[i]->rt.cls[c])
          same = 0;
      if (same)
        break;
    }
    if (j == P->nj)
      P->jrep[P->nj++] = (uint8_t)c;
    P->jcls[c] = (uint8_t)j;
  }
}

static di_status explore(prod_t *P) {
  const di_rlang_product *p = P->p;
  int32_t *t = calloc((size_t)P->w * 2, sizeof *t);
  if (!t)
    return di_error_set(DI_ERR_OOM, "out of memory");
  int32_t *u = t + P->w;
  for (int i = 0; i < p->k; i++)
    t[i] = p->langs[i]->rt.start;
  di_status st = DI_OK;
  int scap = 0;
  if (intern(P, t) < 0)
    st = di_error_set(DI_ERR_OOM, "out of memory");
  for (int s = 0; st == DI_OK && s < P->n; s++) {
    if (!di_grow((void **)&P->succ, &scap, (s + 1) * P->nj, sizeof(int32_t), 64)) {
      st = di_error_set(DI_ERR_OOM, "out of memory");
      break;
    }
    int ends = p->shortest && tuple_accepts(P, P->st + (size_t)s * P->w);
    for (int j = 0; j < P->nj; j++) {
      int err = 0;
      if (ends) { /* a lazy match stops at its first end */
        P->succ[(size_t)s * P->nj + j] = -1;
        continue;
      }
      memcpy(t, P->st + (size_t)s * P->w, sizeof *t * (size_t)P->w); /* P->st may move in intern */
      int id = -1;
      if (tuple_step(P, t, P->jrep[j], u, &err)) {
        id = intern(P, u);
        if (id == -1)
          st = di_error_set(DI_ERR_OOM, "out of memory");
        else if (id == -2)
          st = di_error_set(DI_ERR_UNSUPPORTED, "the combined string language needs more than %d automaton states",
                            p->max_states);
      } else if (err) {
        st = di_error_set(DI_ERR_UNSUPPORTED, "the string language's automaton exceeded its budget");
      }
      if (st != DI_OK)
        break;
      P->succ[(size_t)s * P->nj + j] = id;
    }
  }
  free(t);
  return st;
}

/* live[s]: an emitted string can end from s (reverse reachability from the accepting states). */
static di_status live_states(const prod_t *P, char *live) {
  int n = P->n, nj = P->nj;
  int32_t *deg = calloc((size_t)n + 1, sizeof *deg), *queue = malloc(sizeof(int32_t) * (size_t)(n + 1));
  int32_t *rev = malloc(sizeof(int32_t) * ((size_t)n * nj + 1));
  if (!deg || !queue || !rev) {
    free(deg), free(queue), free(rev);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (size_t e = 0; e < (size_t)n * nj; e++)
    if (P->succ[e] >= 0)
      deg[P->succ[e] + 1]++;
  for (int i = 0; i < n; i++)
    deg[i + 1] += deg[i];
  int32_t *fill = calloc((size_t)n, sizeof *fill);
  if (!fill) {
    free(deg), free(queue), free(rev);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (size_t e = 0; e < (size_t)n * nj; e++)
    if (P->succ[e] >= 0) {
      int to = P->succ[e];
      rev[deg[to] + fill[to]++] = (int32_t)(e / (size_t)nj);
    }
  int qh = 0, qt = 0;
  for (int s = 0; s < n; s++)
    if ((live[s] = (char)tuple_accepts(P, P->st + (size_t)s * P->w)))
      queue[qt++] = s;
  while (qh < qt) {
    int s = queue[qh++];
    for (int i = deg[s]; i < deg[s + 1]; i++)
      if (!live[rev[i]]) {
        live[rev[i]] = 1;
        queue[qt++] = rev[i];
      }
  }
  free(deg), free(queue), free(rev), free(fill);
  return DI_OK;
}

/* Moore's partition refinement over the live states: states with the same acceptance whose
 * successors fall in the same blocks, byte class by byte class, merge (a divisibility automaton
 * by 1000, say, has 1000 remainders but needs 4 states). block[s] = -1 for states not live.
 * Returns the number of blocks, -1 out of memory. */
static int minimise(const prod_t *P, const char *live, int32_t *block) {
  int n = P->n, nj = P->nj, w = nj + 1, nb = 0;
  int hcap = 1;
  while (hcap < 2 * n + 2)
    hcap *= 2;
  int32_t *sig = malloc(sizeof *sig * (size_t)n * (size_t)w), *nbk = malloc(sizeof *nbk * (size_t)n);
  int32_t *h = malloc(sizeof *h * (size_t)hcap);
  if (!sig || !nbk || !h) {
    free(sig), free(nbk), free(h);
    return -1;
  }
  int has[2] = {0, 0};
  for (int s = 0; s < n; s++) {
    block[s] = live[s] ? tuple_accepts(P, P->st + (size_t)s * P->w) : -1;
    if (block[s] >= 0)
      has[block[s]] = 1;
  }
  nb = has[0] + has[1];
  for (;;) {
    for (int s = 0; s < n; s++) {
      if (block[s] < 0)
        continue;
      int32_t *g = sig + (size_t)s * w;
      g[0] = block[s];
      for (int j = 0; j < nj; j++) {
        int t = P->succ[(size_t)s * nj + j];
        g[j + 1] = t >= 0 ? block[t] : -1;
      }
    }
    memset(h, 0xff, sizeof *h * (size_t)hcap);
    int nn = 0;
    for (int s = 0; s < n; s++) {
      if (block[s] < 0) {
        nbk[s] = -1;
        continue;
      }
      const int32_t *g = sig + (size_t)s * w;
      uint32_t x = tuple_hash(g, w) & (uint32_t)(hcap - 1);
      while (h[x] >= 0 && memcmp(sig + (size_t)h[x] * w, g, sizeof *g * (size_t)w) != 0)
        x = (x + 1) & (uint32_t)(hcap - 1);
      if (h[x] < 0) {
        h[x] = s;
        nbk[s] = nn++;
      } else {
        nbk[s] = nbk[h[x]];
      }
    }
    memcpy(block, nbk, sizeof *block * (size_t)n);
    if (nn == nb)
      break;
    nb = nn;
  }
  free(sig), free(nbk), free(h);
  return nb;
}

/* Writes the live product states as rules, one per Moore block. With p->token_copies = N > 0
 * (Lark max_tokens) the rules are written N times, copy c for "c + 1 tokens left", each copy's
 * edges staying in that copy, plus an entry rule (the start block's alternatives, leading into copy
 * N - 1) that no edge returns to: a stack in the entry rule has read no byte of the lexeme, so a
 * token boundary leaves it alone, while gram_rt.c's di_grt_boundary moves a stack in copy c to the
 * same state of copy c - 1 (tok_link) and drops one in copy 0. Every copy gets its alternatives in
 * the same order, so flat positions correspond one to one. */
static di_status emit_rules(di_gb *b, const prod_t *P, const char *live, int *rule) {
  const int copies = P->p->token_copies > 0 ? P->p->token_copies : 1;
  int32_t *block = malloc(sizeof *block * (size_t)P->n);
  int nb = block ? minimise(P, live, block) : -1;
  int *rid = nb >= 0 ? malloc(sizeof(int) * ((size_t)nb * (size_t)copies + 1)) : NULL;
  char *emitted = rid ? calloc((size_t)nb + 1, 1) : NULL;
  char *done = emitted ? malloc((size_t)P->nj) : NULL;
  if (!done) {
    free(block), free(rid), free(emitted);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (int c = 0; c < copies; c++)
    for (int k = 0; k < nb; k++)
      rid[c * nb + k] = di_gb_new_rule(b, "rset");
  const int entry = P->p->token_copies > 0 ? di_gb_new_rule(b, "rset_entry") : -1;
  if (entry >= 0 && !b->oom) {
    b->rules[entry].defined = 1;
    for (int c = 0; c < copies; c++)
      for (int k = 0; k < nb; k++)
        b->rules[rid[c * nb + k]].tok_link = c == 0 ? -1 : rid[(c - 1) * nb + k] + 1;
  }
  di_status st = DI_OK;
  for (int s = 0; st == DI_OK && s < P->n && !b->oom; s++) {
    int k = block[s];
    if (k < 0 || emitted[k])
      continue; /* not live, or its block is written from another member */
    emitted[k] = 1;
    const int with_entry = entry >= 0 && k == block[0];
    for (int c = 0; c < copies; c++)
      b->rules[rid[c * nb + k]].defined = 1;
    if (tuple_accepts(P, P->st + (size_t)s * P->w)) {
      for (int c = 0; st == DI_OK && c < copies; c++)
        st = di_gb_add_alt(b, rid[c * nb + k], NULL, 0);
      if (st == DI_OK && with_entry)
        st = di_gb_add_alt(b, entry, NULL, 0);
    }
    const int32_t *sc = P->succ + (size_t)s * P->nj;
    memset(done, 0, (size_t)P->nj);
    for (int j = 0; st == DI_OK && j < P->nj; j++) {
      if (done[j] || sc[j] < 0 || block[sc[j]] < 0)
        continue;
      int to = block[sc[j]];
      di_gbyteset set = {{0}};
      for (int j2 = j; j2 < P->nj; j2++)
        if (sc[j2] >= 0 && block[sc[j2]] == to)
          done[j2] = 1;
      for (unsigned c = 0; c < 256; c++) {
        int t = sc[P->jcls[c]];
        if (t >= 0 && block[t] == to)
          di_gbyteset_add(&set, c);
      }
      const int cls = di_gb_class(b, &set);
      for (int c = 0; st == DI_OK && c < copies; c++) {
        di_gel e[2] = {{DI_GE_CLASS, cls}, {DI_GE_RULE, rid[c * nb + to]}};
        st = di_gb_add_alt(b, rid[c * nb + k], e, 2);
      }
      if (st == DI_OK && with_entry) {
        di_gel e[2] = {{DI_GE_CLASS, cls}, {DI_GE_RULE, rid[(copies - 1) * nb + to]}};
        st = di_gb_add_alt(b, entry, e, 2);
      }
    }
  }
  if (st == DI_OK && b->oom)
    st = di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  *rule = st == DI_OK && block[0] >= 0 ? (entry >= 0 ? entry : rid[block[0]]) : -1;
  free(block), free(rid), free(emitted), free(done);
  return st;
}

di_status di_rlang_emit(di_gb *b, const di_rlang_product *p, int *rule) {
  *rule = -1;
  for (int i = 0; i < p->k; i++)
    if (p->langs[i]->rt.start < 0 && ((p->in >> i) & 1))
      return DI_OK; /* a required language is empty */
  prod_t P = {.p = p, .w = p->k + 2};
  joint_classes(&P);
  di_status st = explore(&P);
  char *live = st == DI_OK ? calloc((size_t)P.n + 1, 1) : NULL;
  if (st == DI_OK && !live)
    st = di_error_set(DI_ERR_OOM, "out of memory");
  if (st == DI_OK)
    st = live_states(&P, live);
  if (st == DI_OK && P.n > 0 && live[0])
    st = emit_rules(b, &P, live, rule);
  free(live);
  free(P.st);
  free(P.hash);
  free(P.succ);
  return st;
}

/* ---- lazy rules ------------------------------------------------------------------------------ */
/* Copies the rules reachable from r in b into g (a fresh builder); *root = r's copy. Alternatives
 * referring to a product_drop rule are left out when may_drop (an operand taken as it is), an error
 * otherwise (a complemented operand would then take more). */
static di_status copy_reachable(const di_gb *b, int r, di_gb *g, int *root, int may_drop) {
  int *map = malloc(sizeof(int) * (size_t)b->n_rules), *stack = malloc(sizeof(int) * (size_t)b->n_rules);
  if (!map || !stack) {
    free(map), free(stack);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (int i = 0; i < b->n_rules; i++)
    map[i] = -1;
  int ns = 0;
  map[r] = di_gb_new_rule(g, b->rules[r].name);
  stack[ns++] = r;
  di_status st = DI_OK;
  di_gseq q = {0};
  while (ns > 0 && st == DI_OK) {
    int x = stack[--ns];
    const di_grule *R = &b->rules[x];
    if (!R->defined) {
      st = di_error_set(DI_ERR_FORMAT, "rule '%s' is used but not defined", R->name);
      break;
    }
    if (R->tok_link != 0) { /* a max_tokens lexeme's copies: a language of bytes would lose the bound */
      st = di_error_set(DI_ERR_UNSUPPORTED, "a max_tokens rule cannot be part of another lexeme, lazy, "
                        "max_chars or max_tokens rule (it bounds tokens, not bytes)");
      break;
    }
    di_gb_mark_defined(g, map[x]); /* (no-op after an allocation failure: g->rules may be NULL) */
    for (int a = 0; a < R->n_alts && st == DI_OK; a++) {
      int dropped = 0;
      for (int k = R->alt_off[a]; k < R->alt_off[a + 1]; k++)
        dropped |= R->els[k].kind == DI_GE_RULE && b->rules[R->els[k].arg].product_drop;
      if (dropped && !may_drop) {
        st = di_error_set(DI_ERR_UNSUPPORTED, "a complement cannot take a time format's leap seconds (their "
                          "automaton is too large)");
        break;
      }
      if (dropped)
        continue;
      q.n = 0;
      for (int k = R->alt_off[a]; k < R->alt_off[a + 1]; k++) {
        di_gel e = R->els[k];
        if (e.kind == DI_GE_CLASS) {
          e.arg = di_gb_class(g, &b->classes[e.arg]);
        } else {
          if (map[e.arg] < 0) {
            map[e.arg] = di_gb_new_rule(g, b->rules[e.arg].name);
            stack[ns++] = e.arg;
          }
          e.arg = map[e.arg];
        }
        di_gseq_push(g, &q, e);
      }
      st = di_gb_add_alt(g, map[x], q.v, q.n);
    }
  }
  di_gseq_free(&q);
  *root = map[r];
  free(map), free(stack);
  return st == DI_OK && g->oom ? di_error_set(DI_ERR_OOM, "out of memory") : st;
}

/* Replaces rule `target`'s alternatives by the product of the languages of rules ops[0..k) (each
 * copied out with what it reaches, so `target` may be one of them): `in` / `out` / `shortest` /
 * counting as in di_rlang_product. */
static di_status apply_product(di_gb *b, int target, const int *ops, int k, const di_rlang_product *shape,
                               const char *what, const char *needs) {
  di_rlang *langs[DI_RLANG_MAX_OPERANDS] = {0};
  di_status st = DI_OK;
  if (k < 1 || k > DI_RLANG_MAX_OPERANDS)
    return di_error_set(DI_ERR_UNSUPPORTED, "%s: between 1 and %d operands", what, DI_RLANG_MAX_OPERANDS);
  for (int i = 0; i < k && st == DI_OK; i++) {
    di_gb g;
    di_gb_init(&g, b->max_els);
    int root = -1;
    st = copy_reachable(b, ops[i], &g, &root, !((shape->out >> i) & 1));
    if (st == DI_OK)
      st = di_rlang_from_builder(&g, root, &langs[i]);
    else
      di_gb_free(&g);
  }
  int res = -1;
  if (st == DI_OK) {
    di_rlang_product p = *shape;
    p.langs = langs, p.k = k;
    if (p.max_states <= 0)
      p.max_states = 50000;
    st = di_rlang_emit(b, &p, &res);
  }
  for (int i = 0; i < k; i++)
    di_rlang_free(langs[i]);
  if (st == DI_ERR_UNSUPPORTED)
    return di_error_wrap(st, "%s: %s", what, needs);
  if (st != DI_OK)
    return st;
  di_grule *R = &b->rules[target]; /* its alternatives become the product */
  b->total_els -= R->n_els + R->n_alts;
  R->n_alts = R->n_els = 0;
  R->defined = 1;
  if (res < 0)
    return DI_OK;
  di_gel e = {DI_GE_RULE, res};
  return di_gb_add_alt(b, target, &e, 1);
}

/* 1 when the rules reachable from r are right-linear within their cycles (every reference to a rule
 * of the referring rule's own strongly connected component is an alternative's last element), so
 * the language is regular; 0 when not, -1 out of memory. Without it a product over a recursive rule
 * would explore ever deeper stacks up to its state budget (minutes: found by fuzzing EBNF
 * attributes). Not for max_chars, whose bound makes any rule finite. */
static int right_linear(const di_gb *b, int r, int *bad) {
  int n = b->n_rules, *map = malloc(sizeof(int) * (size_t)n), *list = malloc(sizeof(int) * (size_t)n);
  int *off = NULL, *to = NULL, *comp = NULL, m = 0, ne = 0, res = -1;
  if (!map || !list)
    goto out;
  for (int i = 0; i < n; i++)
    map[i] = -1;
  map[r] = m, list[m++] = r;
  for (int q = 0; q < m; q++) /* the reachable rules, and their references counted */
    for (int k = 0; k < b->rules[list[q]].n_els; k++) {
      di_gel e = b->rules[list[q]].els[k];
      if (e.kind == DI_GE_RULE) {
        ne++;
        if (map[e.arg] < 0)
          map[e.arg] = m, list[m++] = e.arg;
      }
    }
  off = malloc(sizeof(int) * (size_t)(m + 1)), to = calloc((size_t)ne + 1, sizeof(int));
  comp = malloc(sizeof(int) * (size_t)(m + 1));
  if (!off || !to || !comp)
    goto out;
  ne = 0;
  for (int q = 0; q < m; q++) {
    off[q] = ne;
    for (int k = 0; k < b->rules[list[q]].n_els; k++)
      if (b->rules[list[q]].els[k].kind == DI_GE_RULE)
        to[ne++] = map[b->rules[list[q]].els[k].arg];
  }
  off[m] = ne;
  if (di_rule_scc(m, off, to, comp, NULL) != DI_OK)
    goto out;
  res = 1;
  for (int q = 0; q < m && res; q++) {
    const di_grule *R = &b->rules[list[q]];
    for (int a = 0; a < R->n_alts && res; a++)
      for (int k = R->alt_off[a]; k < R->alt_off[a + 1] - 1 && res; k++) /* all but the last element */
        if (R->els[k].kind == DI_GE_RULE && comp[map[R->els[k].arg]] == comp[q])
          res = 0, *bad = list[q];
  }
out:
  free(map), free(list), free(off), free(to), free(comp);
  return res;
}

static di_status check_regular(const di_gb *b, int r, const char *what, const char *needs) {
  int bad = r, lin = right_linear(b, r, &bad);
  if (lin < 0)
    return di_error_set(DI_ERR_OOM, "out of memory");
  return lin ? DI_OK
             : di_error_set(DI_ERR_UNSUPPORTED, "%s: %s: rule '%s' refers to its own cycle before its end", what, needs,
                            b->rules[bad].name);
}

di_status di_rlang_make_lazy(di_gb *b, int r, const char *what) {
  static const char needs[] = "a lazy rule must be regular (no recursion but repetition)";
  DI_TRY(check_regular(b, r, what, needs));
  di_rlang_product shape = {.in = 1, .max_chars = -1, .shortest = 1};
  return apply_product(b, r, &r, 1, &shape, what, needs);
}

di_status di_rlang_bound_chars(di_gb *b, int r, int max_chars, const char *what) {
  di_rlang_product shape = {.in = 1, .count_chars = 1, .count_plain = 1, .max_chars = max_chars};
  return apply_product(b, r, &r, 1, &shape, what,
                       "max_chars needs a regular rule (no recursion but repetition) or a bound small enough to enumerate");
}

di_status di_rlang_bound_tokens(di_gb *b, int r, int max_tokens, const char *what) {
  if (max_tokens < 1 || max_tokens > DI_RLANG_MAX_TOKENS)
    return di_error_set(DI_ERR_UNSUPPORTED, "%s: max_tokens is a count from 1 to %d", what, DI_RLANG_MAX_TOKENS);
  static const char needs[] = "max_tokens needs a regular rule (no recursion but repetition)";
  DI_TRY(check_regular(b, r, what, needs));
  di_rlang_product shape = {.in = 1, .max_chars = -1, .token_copies = max_tokens};
  return apply_product(b, r, &r, 1, &shape, what, needs);
}

di_status di_rlang_combine(di_gb *b, int target, const int *ops, int k, unsigned in, unsigned out, const char *what) {
  static const char needs[] = "the operands must be regular (terminals are)";
  for (int i = 0; i < k && i < DI_RLANG_MAX_OPERANDS; i++)
    DI_TRY(check_regular(b, ops[i], what, needs));
  di_rlang_product shape = {.in = in, .out = out, .max_chars = -1};
  return apply_product(b, target, ops, k, &shape, what, needs);
}
