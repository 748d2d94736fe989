/* Grammar compilation entry point: dispatches to the front-ends, keeps a process-wide cache of
 * compiled grammars keyed by (kind, options, source text), and checks whole strings. */
#include "grammar/grammar_impl.h"
#include "grammar/language_key.h"
#include "grammar/string_bound.h"
#include <stdlib.h>
#include <string.h>

#define CACHE_SLOTS 64
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static di_grammar *cache[CACHE_SLOTS];
static unsigned cache_next;
static di_grammar *live_head; /* every live grammar (under cache_mu): see di_grammar_forget_vocab */

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
  const unsigned char *u = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ u[i]) * 0x100000001B3ULL;
  return h;
}

static void normalize_opt(di_grammar_options *o, const di_grammar_options *in) {
  memset(o, 0, sizeof *o);
  if (in)
    *o = *in;
  if (o->max_whitespace < 0)
    o->max_whitespace = 0;
  if (o->max_branches <= 0)
    o->max_branches = 256;
  if (o->max_elements <= 0)
    o->max_elements = 2000000;
  o->ignore_unsupported_keywords = o->ignore_unsupported_keywords != 0;
  o->strict = o->strict != 0;
  if (o->max_digits == 0)
    o->max_digits = DI_GRAMMAR_DEFAULT_MAX_DIGITS;
  if (o->max_digits < 0)
    o->max_digits = -1;
  if (o->max_string_length == 0)
    o->max_string_length = DI_GRAMMAR_DEFAULT_MAX_STRING_LENGTH;
  if (o->max_string_length < 0)
    o->max_string_length = -1;
}

/* A separator option: `mark` with JSON whitespace around it (or empty); its unused bytes zeroed, so
 * options compare (and hash) by content. */
static di_status normalize_separator(char sep[8], char mark, const char *name) {
  size_t n = 0;
  while (n < 8 && sep[n])
    n++;
  if (n == 8)
    return di_error_set(DI_ERR_INVALID_ARG, "grammar options: %s is at most 7 bytes", name);
  memset(sep + n, 0, 8 - n);
  int marks = 0;
  for (size_t i = 0; i < n; i++) {
    if (sep[i] == mark)
      marks++;
    else if (sep[i] != ' ' && sep[i] != '\t' && sep[i] != '\n' && sep[i] != '\r')
      marks = 99;
  }
  if (n > 0 && marks != 1)
    return di_error_set(DI_ERR_INVALID_ARG, "grammar options: %s must be '%c' with optional JSON whitespace around it",
                        name, mark);
  return DI_OK;
}

static void grammar_destroy(di_grammar *g) {
  if (!g)
    return;
  pthread_mutex_lock(&cache_mu);
  if (g->live_prev)
    g->live_prev->live_next = g->live_next;
  else if (live_head == g)
    live_head = g->live_next;
  if (g->live_next)
    g->live_next->live_prev = g->live_prev;
  pthread_mutex_unlock(&cache_mu);
  if (g->rt_ready)
    di_grt_free(&g->rt);
  di_gvcache_free_all(g->vcaches);
  di_count_chains_free(&g->chains);
  free(g->minlen);
  di_gb_free(&g->core);
  pthread_mutex_destroy(&g->mu);
  free(g->src);
  free(g);
}

static di_status compile_new(di_grammar_kind kind, const char *src, size_t len, const di_grammar_options *o,
                             di_grammar **out) {
  di_grammar *g = calloc(1, sizeof *g);
  if (!g)
    return di_error_set(DI_ERR_OOM, "out of memory");
  pthread_mutex_init(&g->mu, NULL);
  di_gb_init(&g->core, o->max_elements);
  di_status st;
  switch (kind) {
  case DI_GRAMMAR_EBNF: st = di_ebnf_compile(&g->core, src, len, o->root_rule); break;
  case DI_GRAMMAR_REGEX: st = di_regex_compile(&g->core, src, len); break;
  case DI_GRAMMAR_JSON_SCHEMA: st = di_json_schema_compile(&g->core, src, len, o); break;
  case DI_GRAMMAR_JSON_ANY: st = di_json_any_compile(&g->core, o); break;
  case DI_GRAMMAR_LARK: st = di_lark_compile(&g->core, src, len, o); break;
  default: st = di_error_set(DI_ERR_INVALID_ARG, "unknown grammar kind %d", (int)kind);
  }
  if (st == DI_OK)
    st = di_count_chains_find(&g->core, &g->chains);
  if (st != DI_OK) {
    grammar_destroy(g);
    return st;
  }
  if ((g->minlen = malloc(sizeof *g->minlen * ((size_t)g->core.n_rules + 1))))
    di_language_key_rule_minlen(&g->core, g->minlen);
  if ((st = di_sbound_prepare(&g->core, g->minlen)) != DI_OK) {
    grammar_destroy(g);
    return st;
  }
  g->refs = 1;
  pthread_mutex_lock(&cache_mu);
  g->live_next = live_head;
  if (live_head)
    live_head->live_prev = g;
  live_head = g;
  pthread_mutex_unlock(&cache_mu);
  *out = g;
  return DI_OK;
}

void di_grammar_forget_vocab(uint64_t vocab_serial) {
  pthread_mutex_lock(&cache_mu);
  for (di_grammar *g = live_head; g; g = g->live_next) {
    pthread_mutex_lock(&g->mu);
    di_gvcache_drop(g, vocab_serial);
    pthread_mutex_unlock(&g->mu);
  }
  pthread_mutex_unlock(&cache_mu);
}

di_status di_grammar_compile(di_grammar_kind kind, const char *source, size_t len, const di_grammar_options *opt,
                             di_grammar **out) {
  if (!out || (!source && len && kind != DI_GRAMMAR_JSON_ANY))
    return di_error_set(DI_ERR_INVALID_ARG, "di_grammar_compile: NULL argument");
  if (kind == DI_GRAMMAR_JSON_ANY)
    len = 0;
  di_grammar_options o;
  normalize_opt(&o, opt);
  DI_TRY(normalize_separator(o.item_separator, ',', "item_separator"));
  DI_TRY(normalize_separator(o.key_separator, ':', "key_separator"));
  if (o.indent < 0 || o.indent > DI_GRAMMAR_MAX_INDENT)
    return di_error_set(DI_ERR_INVALID_ARG, "grammar options: indent must be 0..%d spaces, got %d", DI_GRAMMAR_MAX_INDENT,
                        o.indent);
  if (o.indent && kind != DI_GRAMMAR_JSON_SCHEMA) /* any JSON would be one line: XGrammar's basic any */
    return di_error_set(DI_ERR_INVALID_ARG, "grammar options: indent applies to a JSON schema only");
  if (o.indent && o.max_whitespace)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "grammar options: indent fixes the whitespace; max_whitespace must be 0 beside it");
  size_t root_len = strnlen(o.root_rule, sizeof o.root_rule);
  if (root_len == sizeof o.root_rule)
    return di_error_set(DI_ERR_INVALID_ARG, "grammar options: root_rule is at most %zu bytes", sizeof o.root_rule - 1);
  memset(o.root_rule + root_len, 0, sizeof o.root_rule - root_len); /* compared by content for the cache */
  int no_cache = o.no_cache;
  o.no_cache = 0;
  if (no_cache) {
    di_grammar *g = NULL;
    DI_TRY(compile_new(kind, source ? source : "", len, &o, &g));
    g->kind = kind;
    g->opt = o;
    *out = g; /* not in the cache: g->src stays NULL, never matched */
    return DI_OK;
  }
  uint64_t h = fnv(&kind, sizeof kind, 0xcbf29ce484222325ULL);
  h = fnv(&o, sizeof o, h);
  h = fnv(source ? source : "", len, h);
  pthread_mutex_lock(&cache_mu);
  for (int i = 0; i < CACHE_SLOTS; i++) {
    di_grammar *c = cache[i];
    if (c && c->hash == h && c->kind == kind && c->len == len && memcmp(&c->opt, &o, sizeof o) == 0 &&
        (len == 0 || memcmp(c->src, source, len) == 0)) {
      c->refs++;
      pthread_mutex_unlock(&cache_mu);
      *out = c;
      return DI_OK;
    }
  }
  pthread_mutex_unlock(&cache_mu);
  di_grammar *g = NULL;
  DI_TRY(compile_new(kind, source ? source : "", len, &o, &g));
  g->kind = kind;
  g->opt = o;
  g->len = len;
  g->hash = h;
  g->src = malloc(len + 1);
  if (!g->src) {
    grammar_destroy(g);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  if (len)
    memcpy(g->src, source, len);
  g->src[len] = 0;
  pthread_mutex_lock(&cache_mu);
  unsigned slot = cache_next++ % CACHE_SLOTS;
  di_grammar *old = cache[slot];
  cache[slot] = g;
  g->refs++; /* the cache's reference */
  if (old && --old->refs == 0) {
    pthread_mutex_unlock(&cache_mu);
    grammar_destroy(old);
  } else {
    pthread_mutex_unlock(&cache_mu);
  }
  *out = g;
  return DI_OK;
}

void di_grammar_free(di_grammar *g) {
  if (!g)
    return;
  pthread_mutex_lock(&cache_mu);
  int last = --g->refs == 0;
  pthread_mutex_unlock(&cache_mu);
  if (last)
    grammar_destroy(g);
}

void di_grammar_cache_clear(void) {
  for (int i = 0; i < CACHE_SLOTS; i++) {
    pthread_mutex_lock(&cache_mu);
    di_grammar *g = cache[i];
    cache[i] = NULL;
    int last = g && --g->refs == 0;
    pthread_mutex_unlock(&cache_mu);
    if (last)
      grammar_destroy(g);
  }
}

di_grammar *di_grammar_ref_internal(const di_grammar *gc) {
  di_grammar *g = (di_grammar *)gc;
  pthread_mutex_lock(&cache_mu);
  g->refs++;
  pthread_mutex_unlock(&cache_mu);
  return g;
}

int di_grammar_accepts(const di_grammar *g, const char *s, size_t len) {
  di_grt rt;
  if (di_grt_init(&rt, &g->core) != DI_OK)
    return 0;
  int st = rt.start;
  uint32_t cs = 0; /* the bounded strings' counter (string_bound.h) */
  for (size_t i = 0; i < len && st >= 0; i++)
    st = di_sb_step(&rt, st, &cs, (unsigned char)s[i]);
  int ok = st >= 0 && (di_grt_flags(&rt, st) & DI_GRT_ACCEPT);
  di_grt_free(&rt);
  return ok;
}

int di_grammar_num_elements(const di_grammar *g) { return g->core.n_flat; }

void di_grammar_print(const di_grammar *g, FILE *f) { di_gb_print(&g->core, f); }

di_status di_grammar_compile_syntax(const char *syntax, const char *source, size_t len, const di_grammar_options *opt,
                                    di_grammar **out) {
  static const struct {
    const char *name;
    di_grammar_kind kind;
  } names[] = {{"lark", DI_GRAMMAR_LARK}, {"regex", DI_GRAMMAR_REGEX}, {"gbnf", DI_GRAMMAR_EBNF},
               {"ebnf", DI_GRAMMAR_EBNF}, {"json_schema", DI_GRAMMAR_JSON_SCHEMA}};
  for (size_t i = 0; syntax && i < sizeof names / sizeof names[0]; i++)
    if (strcmp(syntax, names[i].name) == 0)
      return di_grammar_compile(names[i].kind, source, len, opt, out);
  return di_error_set(DI_ERR_INVALID_ARG, "grammar syntax '%s' is not one of lark, regex, gbnf, json_schema",
                      syntax ? syntax : "(null)");
}
