/* JSON Schema front-end: compiles a schema (draft 2020-12 subset) to grammar rules that produce
 * the JSON text generation writes: compact (or bounded whitespace), properties in schema order,
 * integral numbers as integers. Errors name the keyword and its JSON pointer. Policies are in
 * docs/structured-outputs.md. Also the "any JSON" grammar. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/gram_ir.h"
#include "grammar/grammar.h"
#include "grammar/json_decimal.h"
#include "grammar/json_formats.h"
#include "grammar/json_schema_not.h"
#include "grammar/json_text.h"
#include "grammar/regular_set.h"
#include "util/json.h"

/* The further `pattern`s of merged allOf branches (an internal keyword, not JSON Schema's). */
#define PATTERNS_KEY "x-deepinfer-patterns"
/* The additionalProperties of merged allOf branches that other branches' patternProperties do not
 * see (internal): [{"p": [that branch's patterns], "ap": its additionalProperties}, ...]; a name
 * matching some patterns, none of them that branch's, gets "ap" too (gen_object). */
#define PP_ADDL_KEY "x-deepinfer-pattern-addl"

enum { T_NULL = 1, T_BOOL = 2, T_OBJECT = 4, T_ARRAY = 8, T_NUMBER = 16, T_INTEGER = 32, T_STRING = 64, T_ALL = 127 };

typedef struct {
  const cJSON *node;
  int rule, level; /* level: the nesting level it was laid out at (indent only) */
} memo_t;

typedef struct {
  di_gb *b;
  const di_grammar_options *opt;
  cJSON *root;
  memo_t *memo;
  int nmemo, capmemo;
  cJSON **owned; /* merged schemas we allocated */
  int nowned, capowned;
  int branches, depth;
  int indent;     /* di_grammar_options.indent: spaces per level, 0 = one line */
  int level;      /* containers entered (indent's nesting level of the value being generated) */
  int compact;    /* > 0: inside a value laid out on one line under indent (any JSON, const / enum) */
  di_gel ws;      /* bounded whitespace element, or kind -1 for none */
  int r_any, r_string, r_number, r_jchar, r_int, r_ktail, r_kesc, r_kesc_tail;
  int key_counter; /* excl_rule: the key's bound kept by the matcher's counter (string_bound.h), tails unbounded */
  int r_time; /* the time rule of the time formats, leap seconds included (json_formats.h), -1 until built */
  const char *escapes; /* x-guidance json_allowed_escapes: the letters allowed after a backslash, NULL = all */
  char why_empty[400]; /* the last reason a schema was found to admit nothing, for the error */
} jc;

static di_status unsupported(jc *c, const char *path, const char *kw) {
  return di_error_set(DI_ERR_UNSUPPORTED,
                      "json schema: unsupported keyword '%s' at %s (pass ignore_unsupported_keywords / "
                      "--ignore-unsupported to skip it)",
                      kw, *path ? path : "#");
}

/* The compile takes j (freed at its end); 0 when out of memory, j then freed already. */
static int own(jc *c, cJSON *j) {
  if (c->nowned == c->capowned) {
    int nc = c->capowned ? c->capowned * 2 : 16;
    cJSON **q = realloc(c->owned, sizeof *q * (size_t)nc);
    if (!q) {
      cJSON_Delete(j);
      return 0;
    }
    c->owned = q;
    c->capowned = nc;
  }
  c->owned[c->nowned++] = j;
  return 1;
}

/* ---- small sequence helpers ------------------------------------------------------------------ */
static void lit(jc *c, di_gseq *s, const char *t) {
  /* the separators as the options spell them (XGrammar's exact separators); under indent its
   * defaults: "," between laid-out items, ", " on one line, ": " after a key */
  if (c->opt && t[0] == ',' && !t[1])
    t = c->opt->item_separator[0] ? c->opt->item_separator : !c->indent ? t : c->compact ? ", " : ",";
  else if (c->opt && t[0] == ':' && !t[1])
    t = c->opt->key_separator[0] ? c->opt->key_separator : c->indent ? ": " : t;
  di_gseq_bytes(c->b, s, t, strlen(t));
}
static void ws(jc *c, di_gseq *s) {
  if (c->ws.kind >= 0)
    di_gseq_push(c->b, s, c->ws);
}
/* A newline and `level` indents (indent's layout). */
static void newline(jc *c, di_gseq *s, int level) {
  char buf[1 + DI_GRAMMAR_MAX_INDENT * DI_GRAMMAR_MAX_INDENT_LEVELS];
  int n = level * c->indent;
  buf[0] = '\n';
  memset(buf + 1, ' ', (size_t)n);
  di_gseq_bytes(c->b, s, buf, (size_t)n + 1);
}
/* Indent's newline before an item or member of a container being laid out (c->level is the items'
 * level), nothing without indent (the whitespace slots, none under indent, are the caller's). */
static void nl_in(jc *c, di_gseq *s) {
  if (c->indent && !c->compact)
    newline(c, s, c->level);
}
/* Indent's newline before a non-empty container's closing bracket, at the container's own level. */
static void nl_out(jc *c, di_gseq *s) {
  if (c->indent && !c->compact)
    newline(c, s, c->level - 1);
}
static di_gel rule_el(int r) { return (di_gel){DI_GE_RULE, r}; }

/* Literal JSON value with whitespace slots (only where generation may put whitespace). */
static void emit_value_literal(jc *c, di_gseq *s, const cJSON *j) {
  if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
    c->compact++; /* on one line under indent */
    int obj = cJSON_IsObject(j);
    lit(c, s, obj ? "{" : "[");
    for (const cJSON *e = j->child; e; e = e->next) {
      ws(c, s);
      if (obj) {
        di_sbuf k = {0};
        di_sbuf_json_string(&k, e->string);
        di_gseq_bytes(c->b, s, k.p ? k.p : "", k.n);
        free(k.p);
        ws(c, s);
        lit(c, s, ":");
        ws(c, s);
      }
      emit_value_literal(c, s, e);
      ws(c, s);
      if (e->next)
        lit(c, s, ",");
    }
    if (!j->child)
      ws(c, s);
    lit(c, s, obj ? "}" : "]");
    c->compact--;
    return;
  }
  di_sbuf v = {0};
  di_sbuf_json(&v, j);
  di_gseq_bytes(c->b, s, v.p ? v.p : "", v.n);
  if (v.oom)
    c->b->oom = 1;
  free(v.p);
}

/* ---- shared rules ---------------------------------------------------------------------------- */
/* A JSON escape (regex text, after its backslash): \uXXXX only for a scalar value, so a high
 * surrogate must be followed by an escaped low one (the pair is one character, as maxLength counts
 * code points) and a lone surrogate is refused (it is no character: RFC 8259 section 8.2). */
#define JSON_UESC_RE                                                                                \
  "u([0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|[dD][89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F]" \
  "[0-9a-fA-F]{2})"
#define JSON_ESCAPE_RE "([\"\\\\/bfnrt]|" JSON_UESC_RE ")"
static int mk_rule_regex(jc *c, const char *hint, const char *re) {
  int r = di_gb_new_rule(c->b, hint);
  if (di_regex_compile_into(c->b, r, re, strlen(re), 0, 1) != DI_OK)
    c->b->oom = 1; /* our own regexes: cannot fail except out of memory */
  return r;
}

/* The escapes (regex text, from its backslash on) that x-guidance's json_allowed_escapes leaves:
 * its short escapes and, with `u`, every \u spelling JSON_ESCAPE_RE takes; "" when none is left. */
static void escape_re(const jc *c, char *out, size_t cap) {
  if (!c->escapes) {
    snprintf(out, cap, "\\\\%s", JSON_ESCAPE_RE);
    return;
  }
  char cls[16];
  size_t n = 0;
  for (const char *e = c->escapes; *e && n + 3 < sizeof cls; e++)
    if (*e != 'u')
      n += (size_t)snprintf(cls + n, sizeof cls - n, "%s%c", *e == '\\' ? "\\" : "", *e);
  cls[n] = 0;
  int u = strchr(c->escapes, 'u') != NULL;
  if (!n && !u)
    out[0] = 0;
  else
    snprintf(out, cap, "\\\\(%s%s%s%s%s)", n ? "[" : "", cls, n ? "]" : "", n && u ? "|" : "",
             u ? JSON_UESC_RE : "");
}

static int jchar_rule(jc *c) {
  if (c->r_jchar < 0) {
    char esc[256], re[320];
    escape_re(c, esc, sizeof esc);
    snprintf(re, sizeof re, "[^\"\\\\\\x00-\\x1f]%s%s", esc[0] ? "|" : "", esc);
    c->r_jchar = mk_rule_regex(c, "jchar", re);
  }
  return c->r_jchar;
}

static void mark_bounded(jc *c, int r, int64_t minl);

/* Any JSON string. Under the generation bound its body is jchar* with the bound kept by the
 * matcher's character counter (string_bound.h; since session 16: a 4,096-link counted repetition
 * made every character its own automaton state, and the first document's masks paid for them). */
static int string_rule(jc *c) {
  if (c->r_string < 0) {
    c->r_string = di_gb_new_rule(c->b, "string");
    di_gseq s = {0};
    lit(c, &s, "\"");
    if (c->opt->max_string_length > 0 && !c->b->sb_off) {
      di_gseq body = {0};
      di_gseq_repeat(c->b, &body, rule_el(jchar_rule(c)), 0, -1);
      int r = di_gb_new_rule(c->b, "sbody");
      di_gb_add_alt(c->b, r, body.v, body.n);
      di_gseq_free(&body);
      mark_bounded(c, r, 0);
      di_gseq_push(c->b, &s, rule_el(r));
    } else {
      di_gseq_repeat(c->b, &s, rule_el(jchar_rule(c)), 0, c->opt->max_string_length);
    }
    lit(c, &s, "\"");
    di_gb_add_alt(c->b, c->r_string, s.v, s.n);
    di_gseq_free(&s);
  }
  return c->r_string;
}

/* The generation bound on digits (docs: "No runaway values"): "*" unbounded, else "{0,D-1}"
 * after a first digit, "{1,D}" for a fraction or an exponent (whose bound is at most 3 digits). */
static void digit_reps(const jc *c, char rest[24], char some[24], char exp[24]) {
  int d = c->opt->max_digits;
  if (d < 0) {
    strcpy(rest, "*"), strcpy(some, "+"), strcpy(exp, "+");
    return;
  }
  snprintf(rest, 24, "{0,%d}", d - 1);
  snprintf(some, 24, "{1,%d}", d);
  snprintf(exp, 24, "{1,%d}", d < 3 ? d : 3);
}

static int number_rule(jc *c) {
  if (c->r_number < 0) {
    char rest[24], some[24], exp[24], re[160];
    digit_reps(c, rest, some, exp);
    snprintf(re, sizeof re, "-?(0|[1-9][0-9]%s)(\\.[0-9]%s)?([eE][+-]?[0-9]%s)?", rest, some, exp);
    c->r_number = mk_rule_regex(c, "number", re);
  }
  return c->r_number;
}

static int int_rule(jc *c) {
  if (c->r_int < 0) {
    char rest[24], some[24], exp[24], re[80];
    digit_reps(c, rest, some, exp);
    snprintf(re, sizeof re, "-?(0|[1-9][0-9]%s)", rest);
    c->r_int = mk_rule_regex(c, "integer", re);
  }
  return c->r_int;
}

/* The largest magnitude an unbounded side of a range may reach under the digits bound: 10^D - 1
 * (D at most 18 so that it fits int64); -1 when digits are unbounded. */
static int64_t digits_cap(const jc *c) {
  int d = c->opt->max_digits;
  if (d < 0)
    return -1;
  int64_t v = 1;
  for (int i = 0; i < (d > 18 ? 18 : d); i++)
    v *= 10;
  return v - 1;
}

/* value ::= object | array | string | number | true | false | null, with the whitespace policy */
/* rule ::= open item ("," item)* close | open ws close  (objects and arrays of "any JSON") */
static void container_alts(jc *c, di_gseq *s, int rule, const char *open, int item, const char *close) {
  di_gb *b = c->b;
  lit(c, s, open);
  di_gseq_push(b, s, rule_el(item));
  di_gseq t = {0};
  lit(c, &t, ",");
  di_gseq_push(b, &t, rule_el(item));
  di_gseq_repeat(b, s, di_gb_wrap(b, &t, "more"), 0, -1);
  di_gseq_free(&t);
  lit(c, s, close);
  di_gb_add_alt(b, rule, s->v, s->n);
  s->n = 0;
  lit(c, s, open);
  ws(c, s);
  lit(c, s, close);
  di_gb_add_alt(b, rule, s->v, s->n);
  s->n = 0;
}

static int any_rule(jc *c) {
  if (c->r_any >= 0)
    return c->r_any;
  di_gb *b = c->b;
  int v = c->r_any = di_gb_new_rule(b, "value");
  c->compact++; /* on one line under indent */
  int obj = di_gb_new_rule(b, "object"), arr = di_gb_new_rule(b, "array");
  int mem = di_gb_new_rule(b, "member");
  di_gseq s = {0};
  /* member ::= ws string ws ":" ws value ws */
  ws(c, &s);
  di_gseq_push(b, &s, rule_el(string_rule(c)));
  ws(c, &s);
  lit(c, &s, ":");
  ws(c, &s);
  di_gseq_push(b, &s, rule_el(v));
  ws(c, &s);
  di_gb_add_alt(b, mem, s.v, s.n);
  s.n = 0;
  /* object ::= "{" member ("," member)* "}" | "{" ws "}" */
  container_alts(c, &s, obj, "{", mem, "}");
  /* array ::= "[" ws value ws ("," ws value ws)* "]" | "[" ws "]" */
  int el = di_gb_new_rule(b, "element");
  ws(c, &s);
  di_gseq_push(b, &s, rule_el(v));
  ws(c, &s);
  di_gb_add_alt(b, el, s.v, s.n);
  s.n = 0;
  container_alts(c, &s, arr, "[", el, "]");
  di_gel alts[] = {rule_el(obj), rule_el(arr), rule_el(string_rule(c)), rule_el(number_rule(c))};
  for (int i = 0; i < 4; i++)
    di_gb_add_alt(b, v, &alts[i], 1);
  const char *kw[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    lit(c, &s, kw[i]);
    di_gb_add_alt(b, v, s.v, s.n);
    s.n = 0;
  }
  di_gseq_free(&s);
  c->compact--;
  return v;
}

static void jc_init(jc *c, di_gb *b, const di_grammar_options *opt) {
  memset(c, 0, sizeof *c);
  c->b = b;
  c->opt = opt;
  c->r_any = c->r_string = c->r_number = c->r_jchar = c->r_int = c->r_ktail = c->r_kesc = c->r_kesc_tail = c->r_time = -1;
  c->ws.kind = -1;
  c->indent = opt ? opt->indent : 0;
  if (opt && opt->max_whitespace > 0) {
    di_gbyteset set = {{0}};
    di_gbyteset_add(&set, ' ');
    di_gbyteset_add(&set, '\t');
    di_gbyteset_add(&set, '\n');
    di_gbyteset_add(&set, '\r');
    di_gseq s = {0};
    di_gseq_repeat(b, &s, (di_gel){DI_GE_CLASS, di_gb_class(b, &set)}, 0, opt->max_whitespace);
    c->ws = di_gb_wrap(b, &s, "ws");
    di_gseq_free(&s);
  }
}

static void jc_free(jc *c) {
  for (int i = 0; i < c->nowned; i++)
    cJSON_Delete(c->owned[i]);
  free(c->owned);
  free(c->memo);
}

/* Integers in [lo, hi]; has_lo/has_hi say whether each bound exists. */
static di_status int_range(jc *c, int rule, int has_lo, int64_t lo, int has_hi, int64_t hi, const char *path) {
  const int64_t LIM = 9007199254740992LL; /* 2^53: beyond it JSON numbers are not exact */
  if ((has_lo && (lo > LIM || lo < -LIM)) || (has_hi && (hi > LIM || hi < -LIM)))
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: integer bound beyond 2^53 at %s", path);
  if (has_lo && has_hi && lo > hi)
    return di_error_set(DI_ERR_FORMAT, "json schema: minimum above maximum at %s (no integer fits)", path);
  di_json_int_range(c->b, rule, has_lo, lo, has_hi, hi);
  return DI_OK;
}

/* ---- $ref ------------------------------------------------------------------------------------ */
/* Walks the subschemas of `s` (only where keywords hold schemas: not inside enum, const, examples)
 * counting those whose $anchor is `name` (*found = the last) and nested $id's. */
static void find_anchor(const cJSON *s, const char *name, int depth, const cJSON **found, int *n_found, int *n_ids) {
  static const char *maps[] = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", NULL};
  static const char *ones[] = {"items", "additionalProperties", "not", "if", "then", "else", "contains",
                               "propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems", NULL};
  static const char *lists[] = {"allOf", "anyOf", "oneOf", "prefixItems", "items", NULL};
  if (!cJSON_IsObject(s) || depth > 64)
    return;
  for (int k = 0; k < 2; k++) { /* a plain $ref may name a $dynamicAnchor too */
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, k ? "$dynamicAnchor" : "$anchor");
    if (cJSON_IsString(a) && strcmp(a->valuestring, name) == 0)
      *found = s, ++*n_found;
  }
  if (depth > 0 && cJSON_GetObjectItemCaseSensitive(s, "$id"))
    ++*n_ids;
  for (int i = 0; maps[i]; i++)
    for (const cJSON *e = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(s, maps[i])) ? cJSON_GetObjectItemCaseSensitive(s, maps[i])->child : NULL; e; e = e->next)
      find_anchor(e, name, depth + 1, found, n_found, n_ids);
  for (int i = 0; ones[i]; i++)
    find_anchor(cJSON_GetObjectItemCaseSensitive(s, ones[i]), name, depth + 1, found, n_found, n_ids);
  for (int i = 0; lists[i]; i++)
    for (const cJSON *e = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(s, lists[i])) ? cJSON_GetObjectItemCaseSensitive(s, lists[i])->child : NULL; e; e = e->next)
      find_anchor(e, name, depth + 1, found, n_found, n_ids);
}

static di_status resolve_ref(jc *c, const char *ref, const char *path, const cJSON **out) {
  if (ref[0] != '#')
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: only local $ref ('#...') is supported, got '%s' at %s", ref,
                        path);
  const cJSON *cur = c->root;
  const char *p = ref + 1;
  if (*p && *p != '/') { /* "#name": a $anchor, resolved when the document has one and no nested $id */
    const cJSON *found = NULL;
    int n_found = 0, n_ids = 0;
    find_anchor(c->root, p, 0, &found, &n_found, &n_ids);
    if (n_found == 1 && n_ids == 0) {
      *out = found;
      return DI_OK;
    }
    if (n_found == 0 && n_ids == 0)
      return di_error_set(DI_ERR_FORMAT, "json schema: $ref '%s' at %s names no $anchor", ref, path);
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "json schema: $ref to an anchor ('%s') in a document with nested $id is not supported at %s",
                        ref, path);
  }
  while (*p == '/') {
    p++;
    char tok[256];
    size_t n = 0;
    while (*p && *p != '/' && n + 1 < sizeof tok) {
      char ch = *p++;
      if (ch == '~' && (*p == '0' || *p == '1'))
        ch = *p++ == '0' ? '~' : '/';
      else if (ch == '%' && p[0] && p[1]) {
        char hx[3] = {p[0], p[1], 0};
        ch = (char)strtol(hx, NULL, 16);
        p += 2;
      }
      tok[n++] = ch;
    }
    tok[n] = 0;
    if (cJSON_IsArray(cur)) {
      char *end;
      long k = strtol(tok, &end, 10);
      cur = *end ? NULL : cJSON_GetArrayItem(cur, (int)k);
    } else if (cJSON_IsObject(cur)) {
      const cJSON *e = cur->child;
      while (e && strcmp(e->string, tok) != 0)
        e = e->next;
      cur = e;
    } else {
      cur = NULL;
    }
    if (!cur)
      return di_error_set(DI_ERR_FORMAT, "json schema: $ref '%s' at %s points nowhere", ref, path);
  }
  *out = cur;
  return DI_OK;
}

/* ---- schema compilation ---------------------------------------------------------------------- */
static di_status gen(jc *c, const cJSON *sch, const char *path, int *rule_out);

static const char *ANNOTATIONS[] = {"$schema", "$id", "title", "description", "default", "examples", "$comment",
                                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions",
                                    "contentMediaType", "contentEncoding", "contentSchema", NULL};
static const char *SUPPORTED[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                  "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
                                  "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf",
                                  "oneOf", "allOf", "$ref", "dependentRequired", "dependentSchemas", "dependencies",
                                  "additionalItems", "unevaluatedProperties", "unevaluatedItems", "contains",
                                  "minContains", "minProperties", "maxProperties",
                                  "propertyNames", "not", "if", "then", "else", "multipleOf", "patternProperties", NULL};

/* Keywords of JSON Schema (2020-12 and the older drafts' spellings) that constrain values and that
 * this front-end does not enforce (an error naming them unless ignore_unsupported_keywords). Any
 * keyword outside every list is not JSON Schema's and is ignored, as the specification says. */
static const char *UNENFORCED[] = {"maxContains", "uniqueItems",
                                   "$dynamicRef", "$recursiveRef", NULL};

static int in_list(const char *k, const char **list) {
  for (int i = 0; list[i]; i++)
    if (strcmp(k, list[i]) == 0)
      return 1;
  return 0;
}

static int type_bit(const char *t) {
  static const char *names[] = {"null", "boolean", "object", "array", "number", "integer", "string"};
  for (int i = 0; i < 7; i++)
    if (strcmp(t, names[i]) == 0)
      return 1 << i;
  return 0;
}

static di_status get_types(const cJSON *sch, const char *path, int *out) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(sch, "type");
  if (!t) {
    *out = T_ALL;
    return DI_OK;
  }
  int m = 0;
  if (cJSON_IsString(t)) {
    m = type_bit(t->valuestring);
    if (!m)
      return di_error_set(DI_ERR_FORMAT, "json schema: unknown type '%s' at %s/type", t->valuestring, path);
  } else if (cJSON_IsArray(t)) {
    for (const cJSON *e = t->child; e; e = e->next) {
      int b = cJSON_IsString(e) ? type_bit(e->valuestring) : 0;
      if (!b)
        return di_error_set(DI_ERR_FORMAT, "json schema: bad entry in 'type' at %s/type", path);
      m |= b;
    }
  } else {
    return di_error_set(DI_ERR_FORMAT, "json schema: 'type' must be a string or an array at %s/type", path);
  }
  if (m & T_NUMBER)
    m |= T_INTEGER;
  *out = m;
  return DI_OK;
}

/* JSON type bits a value has (integral numbers are also "number"). */
static int value_types(const cJSON *v) {
  if (cJSON_IsNull(v))
    return T_NULL;
  if (cJSON_IsBool(v))
    return T_BOOL;
  if (cJSON_IsObject(v))
    return T_OBJECT;
  if (cJSON_IsArray(v))
    return T_ARRAY;
  if (cJSON_IsString(v))
    return T_STRING;
  if (cJSON_IsNumber(v))
    return v->valuedouble == floor(v->valuedouble) ? (T_NUMBER | T_INTEGER) : T_NUMBER;
  return 0;
}

static cJSON *item(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static di_status get_count(const cJSON *sch, const char *k, const char *path, int64_t *out) {
  const cJSON *v = item(sch, k);
  if (!v)
    return DI_OK;
  if (!di_json_is_int_in(v, 0, HUGE_VAL))
    return di_error_set(DI_ERR_FORMAT, "json schema: '%s' must be a non-negative integer at %s/%s", k, path, k);
  if (!di_json_int_in(v, 0, 1e9, out))
    *out = 1000000000; /* larger counts are as good as unbounded */
  return DI_OK;
}

/* Merges schema b into a copy of a (allOf semantics, for the subset we support). */
static di_status merge(jc *c, const cJSON *a, const cJSON *b, int b_outer, const char *path, cJSON **out);

/* Resolves a schema that is only a $ref (plus annotations) to its target. */
static di_status deref(jc *c, const cJSON *s, const char *path, const cJSON **out) {
  for (int hops = 0; hops < 64; hops++) {
    const cJSON *r = cJSON_IsObject(s) ? item(s, "$ref") : NULL;
    if (!r) {
      *out = s;
      return DI_OK;
    }
    if (!cJSON_IsString(r))
      return di_error_set(DI_ERR_FORMAT, "json schema: $ref must be a string at %s", path);
    const cJSON *t;
    DI_TRY(resolve_ref(c, r->valuestring, path, &t));
    int others = 0;
    for (const cJSON *e = s->child; e; e = e->next)
      if (strcmp(e->string, "$ref") != 0 && !in_list(e->string, ANNOTATIONS))
        others = 1;
    if (others) { /* $ref with sibling keywords: allOf(target, siblings) */
      cJSON *sib = cJSON_Duplicate(s, 1);
      if (!sib || !own(c, sib))
        return di_error_set(DI_ERR_OOM, "out of memory");
      cJSON_DeleteItemFromObjectCaseSensitive(sib, "$ref");
      cJSON *m;
      if (++c->depth > 64)
        return di_error_set(DI_ERR_UNSUPPORTED, "json schema: $ref merging nested too deeply at %s", path);
      di_status st = merge(c, t, sib, 1, path, &m);
      c->depth--;
      DI_TRY(st);
      *out = m;
      return DI_OK;
    }
    s = t;
  }
  return di_error_set(DI_ERR_FORMAT, "json schema: $ref chain too long (a cycle?) at %s", path);
}

/* The in-place subschema's unevaluatedProperties / unevaluatedItems, when it has no applicators of
 * its own, sees only its own properties / items: exactly what additionalProperties / items mean.
 * Renamed so on a copy, the merge below then gives the outer schema's names its constraint. An
 * inner one beside further applicators is refused (what it sees would need their annotations). */
static di_status localise_unevaluated(jc *c, const cJSON *inner, const char *path, const cJSON **out) {
  static const char *un[] = {"unevaluatedProperties", "unevaluatedItems"};
  static const char *as[] = {"additionalProperties", "items"};
  static const char *applicators[] = {"allOf", "anyOf", "oneOf", "$ref", "not", "if", "dependentSchemas",
                                      "dependencies", "patternProperties", "contains", NULL};
  *out = inner;
  if (!cJSON_IsObject(inner) || (!item(inner, un[0]) && !item(inner, un[1])))
    return DI_OK;
  for (int i = 0; applicators[i]; i++)
    if (item(inner, applicators[i]) && !c->opt->ignore_unsupported_keywords)
      return di_error_set(DI_ERR_UNSUPPORTED,
                          "json schema: unsupported keyword 'unevaluatedProperties/Items' in an allOf/$ref subschema "
                          "beside '%s' at %s",
                          applicators[i], path);
  cJSON *cp = cJSON_Duplicate(inner, 1);
  if (!cp || !own(c, cp))
    return di_error_set(DI_ERR_OOM, "out of memory");
  for (int i = 0; i < 2; i++) {
    cJSON *u = cJSON_DetachItemFromObjectCaseSensitive(cp, un[i]);
    if (!u)
      continue;
    if (item(cp, as[i]) || (i == 1 && cJSON_IsArray(item(cp, "items"))))
      cJSON_Delete(u); /* everything is evaluated already */
    else
      cJSON_AddItemToObject(cp, as[i], u);
  }
  *out = cp;
  return DI_OK;
}

static char *key_body(const char *name);

/* *seen = 1 when property `name` matches one of patternProperties pp's patterns (pp may be NULL). */
static di_status matches_side_patterns(const cJSON *pp, const char *name, const char *path, int *seen) {
  *seen = 0;
  if (!cJSON_IsObject(pp) || !pp->child)
    return DI_OK;
  char *body = key_body(name);
  if (!body)
    return di_error_set(DI_ERR_OOM, "out of memory");
  di_status st = DI_OK;
  for (const cJSON *e = pp->child; e && st == DI_OK && !*seen; e = e->next) {
    di_rlang *re = NULL;
    st = di_rlang_regex(e->string, strlen(e->string), 1, 0, &re);
    if (st != DI_OK) {
      st = di_error_wrap(st, "json schema: pattern '%.100s' at %s/patternProperties", e->string, path);
      break;
    }
    int r = di_rlang_contains(re, body, strlen(body));
    di_rlang_free(re);
    if (r < 0)
      st = di_error_set(DI_ERR_UNSUPPORTED, "json schema: matching '%.100s' against patternProperties at %s", name, path);
    *seen = r > 0;
  }
  free(body);
  return st;
}

/* merge()'s builders: each takes v (freed when it cannot be attached) and clears *ok on a failed
 * allocation, so that merge reports out of memory instead of returning a schema with a keyword
 * silently missing (test_alloc_failures). */
static void m_add(int *ok, cJSON *obj, const char *k, cJSON *v) {
  if (!*ok || !obj || !v || !cJSON_AddItemToObject(obj, k, v)) {
    cJSON_Delete(v);
    *ok = 0;
  }
}
static void m_push(int *ok, cJSON *arr, cJSON *v) {
  if (!*ok || !arr || !v || !cJSON_AddItemToArray(arr, v)) {
    cJSON_Delete(v);
    *ok = 0;
  }
}
static void m_replace(int *ok, cJSON *obj, const char *k, cJSON *v) {
  if (!*ok || !v || !cJSON_ReplaceItemInObjectCaseSensitive(obj, k, v)) {
    cJSON_Delete(v);
    *ok = 0;
  }
}
/* {"allOf": [x, y]} (copies); NULL with *ok cleared when out of memory */
static cJSON *m_all2(int *ok, const cJSON *x, const cJSON *y) {
  cJSON *all = cJSON_CreateObject(), *arr = all ? cJSON_AddArrayToObject(all, "allOf") : NULL;
  int fine = arr != NULL;
  m_push(&fine, arr, cJSON_Duplicate(x, 1));
  m_push(&fine, arr, cJSON_Duplicate(y, 1));
  if (!fine) {
    cJSON_Delete(all);
    *ok = 0;
    return NULL;
  }
  return all;
}

static di_status merge(jc *c, const cJSON *a, const cJSON *b, int b_outer, const char *path, cJSON **out) {
  DI_TRY(deref(c, a, path, &a));
  DI_TRY(deref(c, b, path, &b));
  DI_TRY(localise_unevaluated(c, b_outer ? a : b, path, b_outer ? &a : &b));
  if (cJSON_IsFalse(a) || cJSON_IsFalse(b)) {
    cJSON *f = cJSON_CreateFalse();
    if (!f || !own(c, f))
      return di_error_set(DI_ERR_OOM, "out of memory");
    *out = f;
    return DI_OK;
  }
  cJSON *m = cJSON_IsObject(a) ? cJSON_Duplicate(a, 1) : cJSON_CreateObject();
  if (!m || !own(c, m))
    return di_error_set(DI_ERR_OOM, "out of memory");
  if (!cJSON_IsObject(b)) {
    *out = m;
    return DI_OK;
  }
  int ok = 1;
  for (int side = 0; side < 2; side++) { /* another branch's additionalProperties does not see our patterns */
    const cJSON *x = side ? b : a, *y = side ? a : b;
    const cJSON *xa = cJSON_IsObject(x) ? item(x, "additionalProperties") : NULL;
    const cJSON *xp = cJSON_IsObject(x) ? item(x, "patternProperties") : NULL;
    const cJSON *yp = cJSON_IsObject(y) ? item(y, "patternProperties") : NULL;
    int unseen = 0;
    for (const cJSON *q = yp ? yp->child : NULL; xa && !cJSON_IsTrue(xa) && q; q = q->next)
      unseen |= !xp || !item(xp, q->string);
    if (!unseen)
      continue;
    if (xp && !cJSON_IsObject(xp))
      return di_error_set(DI_ERR_FORMAT, "json schema: 'patternProperties' must be an object at %s", path);
    /* names matching y's patterns and none of x's get x's additionalProperties (gen_object) */
    cJSON *list = item(m, PP_ADDL_KEY);
    if (!list)
      list = cJSON_AddArrayToObject(m, PP_ADDL_KEY);
    cJSON *entry = cJSON_CreateObject(), *pats = entry ? cJSON_AddArrayToObject(entry, "p") : NULL;
    if (!pats) {
      cJSON_Delete(entry);
      return di_error_set(DI_ERR_OOM, "out of memory");
    }
    for (const cJSON *q = xp ? xp->child : NULL; q; q = q->next)
      m_push(&ok, pats, cJSON_CreateString(q->string));
    m_add(&ok, entry, "ap", cJSON_Duplicate(xa, 1));
    m_push(&ok, list, entry); /* entry is m's (the compile owns m) or freed */
    if (!ok)
      return di_error_set(DI_ERR_OOM, "out of memory");
  }
  if (!item(m, "if")) { /* then / else without a sibling if mean nothing (and must not meet the other side's if) */
    cJSON_DeleteItemFromObjectCaseSensitive(m, "then");
    cJSON_DeleteItemFromObjectCaseSensitive(m, "else");
  }
  for (const cJSON *e = b->child; e; e = e->next) {
    const char *k = e->string;
    if ((strcmp(k, "then") == 0 || strcmp(k, "else") == 0) && !item(b, "if"))
      continue;
    cJSON *x = item(m, k);
    if (!x) {
      m_add(&ok, m, k, cJSON_Duplicate(e, 1));
      continue;
    }
    if ((strcmp(k, PATTERNS_KEY) == 0 || strcmp(k, PP_ADDL_KEY) == 0) && cJSON_IsArray(x) && cJSON_IsArray(e)) {
      for (const cJSON *q = e->child; q; q = q->next)
        m_push(&ok, x, cJSON_Duplicate(q, 1));
      continue;
    }
    if (strcmp(k, "pattern") == 0 && cJSON_IsString(x) && cJSON_IsString(e) && !cJSON_Compare(x, e, 1)) {
      cJSON *more = item(m, PATTERNS_KEY); /* both patterns apply: gen_string takes their product */
      if (!more)
        more = cJSON_AddArrayToObject(m, PATTERNS_KEY);
      m_push(&ok, more, cJSON_Duplicate(e, 1));
      continue;
    }
    if (in_list(k, ANNOTATIONS) || cJSON_Compare(x, e, 1) || (!in_list(k, SUPPORTED) && !in_list(k, UNENFORCED)))
      continue; /* the same value twice, or a keyword JSON Schema does not define (ignored) */
    if (strcmp(k, "type") == 0) {
      int ta, tb;
      DI_TRY(get_types(m, path, &ta));
      DI_TRY(get_types(b, path, &tb));
      int t = ta & tb;
      cJSON *arr = cJSON_CreateArray();
      static const char *names[] = {"null", "boolean", "object", "array", "number", "integer", "string"};
      int fine = arr != NULL;
      for (int i = 0; i < 7; i++) /* number implies integer in get_types; keep only "number" */
        if (((t >> i) & 1) && !(i == 5 && (t & T_NUMBER)))
          m_push(&fine, arr, cJSON_CreateString(names[i]));
      if (!fine) {
        cJSON_Delete(arr);
        arr = NULL;
      }
      m_replace(&ok, m, k, arr);
    } else if (strcmp(k, "properties") == 0 || strcmp(k, "patternProperties") == 0) {
      for (const cJSON *p = e->child; p; p = p->next) {
        cJSON *q = item(x, p->string);
        if (!q)
          m_add(&ok, x, p->string, cJSON_Duplicate(p, 1));
        else
          m_replace(&ok, x, p->string, m_all2(&ok, q, p));
      }
    } else if (strcmp(k, "required") == 0) {
      for (const cJSON *r = e->child; r; r = r->next) {
        int found = 0;
        for (const cJSON *q = x->child; q; q = q->next)
          found |= cJSON_Compare(q, r, 1);
        if (!found)
          m_push(&ok, x, cJSON_Duplicate(r, 1));
      }
    } else if (strcmp(k, "additionalProperties") == 0 || strcmp(k, "items") == 0) {
      if (cJSON_IsFalse(x))
        continue;
      if (cJSON_IsFalse(e) || cJSON_IsTrue(x))
        m_replace(&ok, m, k, cJSON_Duplicate(e, 1));
      else if (!cJSON_IsTrue(e))
        m_replace(&ok, m, k, m_all2(&ok, x, e));
    } else if (cJSON_IsNumber(x) && cJSON_IsNumber(e) &&
               (strncmp(k, "min", 3) == 0 || strncmp(k, "max", 3) == 0 || strncmp(k, "exclusiveM", 10) == 0)) {
      int is_min = strncmp(k, "min", 3) == 0 || strcmp(k, "exclusiveMinimum") == 0;
      double v = is_min ? fmax(x->valuedouble, e->valuedouble) : fmin(x->valuedouble, e->valuedouble);
      cJSON_SetNumberValue(x, v);
    } else if (strcmp(k, "enum") == 0 || strcmp(k, "const") == 0) {
      /* intersection: keep a's values that b allows */
      cJSON *arr = cJSON_CreateArray();
      const cJSON *xa = strcmp(k, "const") == 0 ? NULL : x->child;
      const cJSON *ea = strcmp(k, "const") == 0 ? NULL : e->child;
      int fine = arr != NULL;
      if (strcmp(k, "const") == 0) {
        if (cJSON_Compare(x, e, 1))
          m_push(&fine, arr, cJSON_Duplicate(x, 1));
      } else {
        for (; xa; xa = xa->next)
          for (const cJSON *q = ea; q; q = q->next)
            if (cJSON_Compare(xa, q, 1)) {
              m_push(&fine, arr, cJSON_Duplicate(xa, 1));
              break;
            }
      }
      if (!fine) {
        cJSON_Delete(arr);
        arr = NULL;
      }
      cJSON_DeleteItemFromObjectCaseSensitive(m, k);
      m_add(&ok, m, "enum", arr);
    } else if ((strcmp(k, "anyOf") == 0 || strcmp(k, "oneOf") == 0) && cJSON_IsArray(x) && cJSON_IsArray(e)) {
      /* (x1 | x2) & (e1 | e2) = (x1 & e1) | (x1 & e2) | ...: one list of branches (nesting the second
       * under allOf would merge it into the first again, endlessly) */
      if (cJSON_GetArraySize(x) * cJSON_GetArraySize(e) > c->opt->max_branches)
        return di_error_set(DI_ERR_UNSUPPORTED,
                            "json schema: anyOf/oneOf/allOf expansion exceeds %d branches at %s (raise max_branches)",
                            c->opt->max_branches, path);
      cJSON *cross = cJSON_CreateArray();
      int fine = cross != NULL;
      for (const cJSON *xi = x->child; xi && fine; xi = xi->next)
        for (const cJSON *ej = e->child; ej && fine; ej = ej->next)
          m_push(&fine, cross, m_all2(&fine, xi, ej));
      if (!fine) {
        cJSON_Delete(cross);
        cross = NULL;
      }
      m_replace(&ok, m, k, cross);
    } else if (strcmp(k, "allOf") == 0 || strcmp(k, "anyOf") == 0 || strcmp(k, "oneOf") == 0 ||
               strncmp(k, "dependen", 8) == 0) {
      /* both have the combinator: nest b's under a fresh allOf */
      cJSON *extra = item(m, "allOf");
      if (!extra)
        extra = cJSON_AddArrayToObject(m, "allOf");
      cJSON *w = cJSON_CreateObject();
      int fine = w != NULL;
      m_add(&fine, w, k, cJSON_Duplicate(e, 1));
      if (!fine) {
        cJSON_Delete(w);
        w = NULL;
      }
      m_push(&ok, extra, w);
    } else {
      return di_error_set(DI_ERR_UNSUPPORTED, "json schema: cannot combine two different '%s' (allOf) at %s", k, path);
    }
  }
  /* additionalProperties of one side applies to the properties only the other side names */
  cJSON *mp = item(m, "properties");
  for (cJSON *p = mp ? mp->child : NULL; p; p = p->next) {
    for (int side = 0; side < 2; side++) {
      const cJSON *src = side ? b : a;
      const cJSON *sp = cJSON_IsObject(src) ? item(src, "properties") : NULL;
      const cJSON *sa = cJSON_IsObject(src) ? item(src, "additionalProperties") : NULL;
      if (!sa || cJSON_IsTrue(sa) || (sp && item(sp, p->string)))
        continue;
      int seen = 0; /* a name matching one of that side's patterns gets that pattern's schema instead */
      DI_TRY(matches_side_patterns(cJSON_IsObject(src) ? item(src, "patternProperties") : NULL, p->string, path,
                                   &seen));
      if (seen)
        continue;
      cJSON *all = m_all2(&ok, p, sa);
      m_replace(&ok, mp, p->string, all); /* the key is copied before p is freed */
      if (!ok)
        return di_error_set(DI_ERR_OOM, "out of memory");
      p = all;
    }
  }
  /* likewise `items` of a side without `prefixItems` covers every index, the other side's prefix
   * positions included */
  cJSON *mpi = item(m, "prefixItems");
  for (int side = 0; side < 2 && cJSON_IsArray(mpi); side++) {
    const cJSON *src = side ? b : a;
    const cJSON *si = cJSON_IsObject(src) ? item(src, "items") : NULL;
    if (!si || cJSON_IsTrue(si) || item(src, "prefixItems"))
      continue;
    for (cJSON *p = mpi->child; p; p = p->next) {
      cJSON *all = m_all2(&ok, p, si);
      if (!all || !cJSON_ReplaceItemViaPointer(mpi, p, all)) {
        cJSON_Delete(all);
        return di_error_set(DI_ERR_OOM, "out of memory");
      }
      p = all;
    }
  }
  if (!ok)
    return di_error_set(DI_ERR_OOM, "out of memory");
  *out = m;
  return DI_OK;
}

/* uniqueItems is enforced exactly when every position takes a small finite set of values: each
 * position's set (enum / const filtered by type, or the booleans and null a type list names) as a
 * bit mask over one list of at most MAX_UNIQUE_VALUES distinct values. */
enum { MAX_UNIQUE_VALUES = 10, MAX_UNIQUE_PREFIX = 8 };
typedef struct {
  const cJSON *vals[MAX_UNIQUE_VALUES];
  int n;
  unsigned allowed[MAX_UNIQUE_PREFIX + 1]; /* per position (prefixItems), then the rest (items) */
  int P;
} unique_layout;

/* Adds v to the list (deduplicated: 1 and 1.0 are one value); its index, or -1 past the bound. */
static int unique_value_index(unique_layout *u, const cJSON *v) {
  for (int i = 0; i < u->n; i++)
    if (cJSON_Compare(u->vals[i], v, 1))
      return i;
  if (u->n == MAX_UNIQUE_VALUES)
    return -1;
  u->vals[u->n] = v;
  return u->n++;
}

/* The values schema s admits as a mask over u's list; -1 when not a small finite set. */
static long finite_values(jc *c, const cJSON *s, unique_layout *u) {
  if (cJSON_IsFalse(s))
    return 0;
  if (!s || cJSON_IsTrue(s) || deref(c, s, "#", &s) != DI_OK || !cJSON_IsObject(s))
    return -1;
  int types;
  if (get_types(s, "#", &types) != DI_OK)
    return -1;
  for (const cJSON *e = s->child; e; e = e->next) /* keywords beside enum/const would filter them further */
    if (!in_list(e->string, ANNOTATIONS) && strcmp(e->string, "enum") && strcmp(e->string, "const") &&
        strcmp(e->string, "type"))
      return -1;
  const cJSON *en = item(s, "enum"), *cn = item(s, "const");
  long mask = 0;
  if (en || cn) {
    if (en && !cJSON_IsArray(en))
      return -1;
    if (cn && en) { /* both: the const must be in the enum */
      int in = 0;
      for (const cJSON *q = en->child; q; q = q->next)
        in |= cJSON_Compare(q, cn, 1);
      if (!in)
        return 0;
    }
    for (const cJSON *v = cn ? cn : en->child; v; v = cn ? NULL : v->next) {
      if (!(value_types(v) & types))
        continue;
      int i = unique_value_index(u, v);
      if (i < 0)
        return -1;
      mask |= 1L << i;
    }
    return mask;
  }
  if (types & ~(T_BOOL | T_NULL))
    return -1;
  cJSON *lits = cJSON_CreateArray(); /* true, false, null as values of our own */
  if (!lits || !own(c, lits)) /* own frees it on failure */
    return -1;
  if (types & T_BOOL) {
    cJSON_AddItemToArray(lits, cJSON_CreateTrue());
    cJSON_AddItemToArray(lits, cJSON_CreateFalse());
  }
  if (types & T_NULL)
    cJSON_AddItemToArray(lits, cJSON_CreateNull());
  for (const cJSON *v = lits->child; v; v = v->next) {
    int i = unique_value_index(u, v);
    if (i < 0)
      return -1;
    mask |= 1L << i;
  }
  return mask;
}

/* 1 when sch's positions all take small finite sets (u filled), else 0. */
static int unique_item_layout(jc *c, const cJSON *sch, unique_layout *u) {
  memset(u, 0, sizeof *u);
  const cJSON *items = item(sch, "items"), *prefix = item(sch, "prefixItems"), *mx = item(sch, "maxItems");
  if (item(sch, "contains"))
    return 0;
  if (cJSON_IsArray(items) && !prefix) /* draft 7's tuple form */
    prefix = items, items = item(sch, "additionalItems");
  if (prefix && !cJSON_IsArray(prefix))
    return 0;
  for (const cJSON *e = prefix ? prefix->child : NULL; e; e = e->next) {
    long m = u->P < MAX_UNIQUE_PREFIX ? finite_values(c, e, u) : -1;
    if (m < 0)
      return 0;
    u->allowed[u->P++] = (unsigned)m;
  }
  long tail = finite_values(c, items, u);
  if (tail < 0 && !(cJSON_IsNumber(mx) && mx->valuedouble <= u->P))
    return 0; /* unbounded items past the prefix */
  u->allowed[u->P] = tail < 0 ? 0 : (unsigned)tail;
  return 1;
}

/* An unenforced keyword whose value here constrains nothing (uniqueItems false, or over arrays of
 * at most one item; minProperties 0), or that is enforced in this case (uniqueItems over a small
 * finite set of item values). */
static int enforced_anyway(jc *c, const cJSON *sch, const cJSON *kw) {
  const char *k = kw->string;
  if (strcmp(k, "uniqueItems") == 0) {
    const cJSON *mx = item(sch, "maxItems");
    unique_layout u;
    return cJSON_IsFalse(kw) || (cJSON_IsNumber(mx) && mx->valuedouble <= 1) || unique_item_layout(c, sch, &u);
  }
  if (strcmp(k, "maxContains") == 0)
    return !item(sch, "contains"); /* without contains it means nothing */
  if (strcmp(k, "minProperties") == 0)
    return cJSON_IsNumber(kw) && kw->valuedouble <= 0;
  return 0;
}

static di_status check_keywords(jc *c, const cJSON *sch, const char *path) {
  for (const cJSON *e = sch->child; e; e = e->next) {
    const char *k = e->string;
    if (!in_list(k, UNENFORCED) || c->opt->ignore_unsupported_keywords || enforced_anyway(c, sch, e))
      continue;
    return unsupported(c, path, k);
  }
  return DI_OK;
}

static int memo_find(jc *c, const cJSON *n) {
  for (int i = c->nmemo - 1; i >= 0; i--) /* under indent a schema's text depends on its level */
    if (c->memo[i].node == n && (!c->indent || c->memo[i].level == c->level))
      return c->memo[i].rule;
  return -1;
}

/* A string under several of format, pattern and minLength / maxLength: each regex determinised
 * (regular_set.h) and their product, with a character counter when a length is given, emitted as
 * rules (NULL *rule: no string qualifies). */
enum { MAX_STRING_PATTERNS = 8 };
static di_status constrained_string(jc *c, const char *fre, const char *const *pats, int npat, int has_len,
                                    int64_t minl, int64_t maxl, const char *path, int *rule) {
  if (minl > 100000 || maxl > 100000)
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: string length bound above 100000 at %s", path);
  di_rlang *langs[MAX_STRING_PATTERNS + 1] = {NULL};
  int k = 0;
  di_status st = DI_OK;
  if (fre)
    st = di_rlang_regex(fre, strlen(fre), 1, 1, &langs[k++]);
  for (int i = 0; st == DI_OK && i < npat; i++) {
    st = di_rlang_regex(pats[i], strlen(pats[i]), 1, 0, &langs[k++]);
    if (st != DI_OK)
      st = di_error_wrap(st, "json schema: 'pattern' at %s", path);
  }
  if (st == DI_OK) {
    di_rlang_product p = {langs, k, (1u << k) - 1, 0, has_len, (int)minl, (int)maxl, 50000, 0, 0, 0};
    st = di_rlang_emit(c->b, &p, rule);
    if (st == DI_ERR_UNSUPPORTED)
      st = di_error_wrap(st, "json schema: format / pattern / length combined at %s", path);
  }
  for (int i = 0; i < k; i++)
    di_rlang_free(langs[i]);
  return st;
}

/* The default length bound of a pattern / format string without maxLength (string_bound.h): body
 * rule r (followed by the closing quote) gets the counter, unless its minLength is above the bound
 * (then it stays unbounded: the two bounds cannot be one counter) or the bound is off. */
static void mark_bounded(jc *c, int r, int64_t minl) {
  const int n = c->opt->max_string_length;
  if (n <= 0 || minl > n || c->b->oom || c->b->sb_off || r < 0 || r >= c->b->n_rules || (c->b->sb_n && c->b->sb_n != n))
    return;
  c->b->rules[r].sbound = 1;
  c->b->sb_n = n;
}

static di_status gen_string(jc *c, const cJSON *sch, const char *path, int rule) {
  di_gb *b = c->b;
  const cJSON *fmt = item(sch, "format"), *pat = item(sch, "pattern");
  int64_t minl = 0, maxl = -1;
  DI_TRY(get_count(sch, "minLength", path, &minl));
  DI_TRY(get_count(sch, "maxLength", path, &maxl));
  int has_len = minl > 0 || maxl >= 0;
  di_gseq s = {0};
  di_status st = DI_OK;
  if (fmt && !cJSON_IsString(fmt))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'format' must be a string at %s", path);
  if (pat && !cJSON_IsString(pat))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'pattern' must be a string at %s", path);
  const char *fre = NULL;
  if (fmt) {
    int defined;
    fre = di_json_format_regex(fmt->valuestring, &defined);
    if (!fre && defined && !c->opt->ignore_unsupported_keywords)
      return di_error_set(DI_ERR_UNSUPPORTED, "json schema: unsupported format '%s' at %s/format", fmt->valuestring, path);
  }
  /* the patterns: `pattern`, and those allOf branches added (merge keeps them under PATTERNS_KEY) */
  const char *pats[MAX_STRING_PATTERNS];
  int npat = 0;
  if (pat)
    pats[npat++] = pat->valuestring;
  for (const cJSON *e = cJSON_IsArray(item(sch, PATTERNS_KEY)) ? item(sch, PATTERNS_KEY)->child : NULL; e; e = e->next)
    if (cJSON_IsString(e) && npat < MAX_STRING_PATTERNS)
      pats[npat++] = e->valuestring;
    else
      return unsupported(c, path, "pattern (more than 8 from allOf)");
  lit(c, &s, "\"");
  if (npat + (fre != NULL) > 1 || ((fre || pat) && has_len)) {
    /* several constraints on one string: the product of their automata with a character counter */
    int r = -1;
    st = constrained_string(c, fre, pats, npat, has_len, minl, maxl, path, &r);
    if (st != DI_OK || r < 0) {
      di_gseq_free(&s);
      if (st == DI_OK)
        snprintf(c->why_empty, sizeof c->why_empty, "no string satisfies the pattern, format and length at %.200s",
                 path);
      return st;
    }
    if (maxl < 0)
      mark_bounded(c, r, minl);
    di_gseq_push(b, &s, rule_el(r));
  } else if (fre || pat) {
    int r = di_gb_new_rule(b, fre ? "format" : "pattern");
    const char *re = fre ? fre : pat->valuestring;
    if (fre)
      st = di_json_format_compile(b, fmt->valuestring, fre, r, &c->r_time);
    else if ((st = di_regex_compile_into(b, r, re, strlen(re), 1, 0)) != DI_OK)
      st = di_error_wrap(st, "json schema: 'pattern' at %s", path);
    if (st != DI_OK) {
      di_gseq_free(&s);
      return st;
    }
    mark_bounded(c, r, 0);
    di_gseq_push(b, &s, rule_el(r));
  } else if (has_len) {
    if (maxl < 0 && c->opt->max_string_length > 0) /* the generation bound, yet never below minLength */
      maxl = minl > c->opt->max_string_length ? minl : c->opt->max_string_length;
    if (maxl >= 0 && maxl < minl) {
      di_gseq_free(&s);
      return di_error_set(DI_ERR_FORMAT, "json schema: maxLength below minLength at %s", path);
    }
    if (minl > 100000 || maxl > 100000) {
      di_gseq_free(&s);
      return di_error_set(DI_ERR_UNSUPPORTED, "json schema: string length bound above 100000 at %s", path);
    }
    di_gseq_repeat(b, &s, rule_el(jchar_rule(c)), (int)minl, (int)maxl);
  } else {
    s.n = 0;
    di_gseq_push(b, &s, rule_el(string_rule(c)));
    st = di_gb_add_alt(b, rule, s.v, s.n);
    di_gseq_free(&s);
    return st;
  }
  lit(c, &s, "\"");
  st = di_gb_add_alt(b, rule, s.v, s.n);
  di_gseq_free(&s);
  return st;
}

static di_status gen_integer(jc *c, const cJSON *sch, const char *path, int rule) {
  int has_lo = 0, has_hi = 0;
  double lo = 0, hi = 0;
  const cJSON *v;
  if ((v = item(sch, "minimum")) && cJSON_IsNumber(v))
    has_lo = 1, lo = ceil(v->valuedouble);
  if ((v = item(sch, "exclusiveMinimum")) && cJSON_IsNumber(v)) {
    double x = floor(v->valuedouble) + 1;
    if (!has_lo || x > lo)
      lo = x;
    has_lo = 1;
  }
  if ((v = item(sch, "maximum")) && cJSON_IsNumber(v))
    has_hi = 1, hi = floor(v->valuedouble);
  if ((v = item(sch, "exclusiveMaximum")) && cJSON_IsNumber(v)) {
    double x = ceil(v->valuedouble) - 1;
    if (!has_hi || x < hi)
      hi = x;
    has_hi = 1;
  }
  if (!has_lo && !has_hi) {
    di_gel e = rule_el(int_rule(c));
    return di_gb_add_alt(c->b, rule, &e, 1);
  }
  int64_t ilo = 0, ihi = 0;
  if ((has_lo && !di_double_to_int_in(lo, -9.1e15, 9.1e15, &ilo)) || (has_hi && !di_double_to_int_in(hi, -9.1e15, 9.1e15, &ihi)))
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: integer bound beyond 2^53 at %s", path);
  if (has_lo && has_hi && lo > hi)
    return DI_OK; /* no integer fits: this type contributes no alternative */
  int64_t cap = digits_cap(c);
  if (cap >= 0 && (!has_lo || !has_hi)) { /* the open side gets the digits bound */
    if (!has_hi && ilo <= cap) {
      di_json_int_range(c->b, rule, 1, ilo, 1, cap);
      return DI_OK;
    }
    if (!has_lo && ihi >= -cap) {
      di_json_int_range(c->b, rule, 1, -cap, 1, ihi);
      return DI_OK;
    }
  }
  return int_range(c, rule, has_lo, ilo, has_hi, ihi, path);
}

/* Fractions after an integer part: any (or none), only zeros (or none), or with a nonzero digit. */
enum { FRAC_ANY, FRAC_ZERO, FRAC_NONZERO };
static di_gel frac_el(jc *c, int kind) {
  static const char *re[] = {"(\\.[0-9]+)?", "(\\.0+)?", "\\.[0-9]*[1-9][0-9]*"};
  char bounded[96];
  const char *src = re[kind];
  int d = c->opt->max_digits;
  if (d > 0) { /* the digits bound: at most d fraction digits (2d - 1 when one must be nonzero) */
    if (kind == FRAC_ANY)
      snprintf(bounded, sizeof bounded, "(\\.[0-9]{1,%d})?", d);
    else if (kind == FRAC_ZERO)
      snprintf(bounded, sizeof bounded, "(\\.0{1,%d})?", d);
    else
      snprintf(bounded, sizeof bounded, "\\.0{0,%d}[1-9][0-9]{0,%d}", d - 1, d - 1);
    src = bounded;
  }
  int r = mk_rule_regex(c, "frac", src);
  return rule_el(r);
}

/* Adds `sign` I frac for I in [lo, hi] (hi < 0: unbounded), lo >= 0. */
static void int_part_alt(jc *c, int rule, int neg, int64_t lo, int64_t hi, int frac) {
  if (hi >= 0 && hi < lo)
    return;
  int r = di_gb_new_rule(c->b, "ipart");
  di_json_int_range(c->b, r, 1, lo, hi >= 0, hi);
  di_gseq s = {0};
  if (neg)
    lit(c, &s, "-");
  di_gseq_push(c->b, &s, rule_el(r));
  di_gseq_push(c->b, &s, frac_el(c, frac));
  di_gb_add_alt(c->b, rule, s.v, s.n);
  di_gseq_free(&s);
}

/* Magnitudes y = I.F (no exponent) in the interval from a (exclusive if a_ex) to b (b < 0:
 * unbounded; exclusive if b_ex), a >= 0, written after an optional "-". */
static void magnitude_interval(jc *c, int rule, int neg, int64_t a, int a_ex, int64_t b, int b_ex) {
  int64_t cap = digits_cap(c);
  if (b < 0 && cap >= 0 && a <= cap) /* unbounded side: integer part of at most max_digits digits */
    b = cap + 1, b_ex = 1;
  if (b >= 0 && (b < a || (b == a && (a_ex || b_ex))))
    return;
  /* I strictly inside: any fraction */
  int64_t ilo = a_ex ? a + 1 : a;
  int64_t ihi = b < 0 ? -1 : b - 1;
  if (b < 0 || ihi >= ilo)
    int_part_alt(c, rule, neg, ilo, ihi, FRAC_ANY);
  if (a_ex) /* I = a needs a nonzero fraction (and then stays below b when b > a) */
    int_part_alt(c, rule, neg, a, a, FRAC_NONZERO);
  if (b >= 0 && !b_ex && !(a_ex && b == a)) /* I = b only with a zero fraction */
    int_part_alt(c, rule, neg, b, b, FRAC_ZERO);
}

/* Adds `sign` I F for I in [lo, hi] (hi < 0: unbounded), F the fraction regex frac_re ("" = none). */
static void int_part_alt_re(jc *c, int rule, int neg, int64_t lo, int64_t hi, const char *frac_re) {
  if (hi >= 0 && hi < lo)
    return;
  int r = di_gb_new_rule(c->b, "ipart");
  di_json_int_range(c->b, r, 1, lo, hi >= 0, hi);
  di_gseq s = {0};
  if (neg)
    lit(c, &s, "-");
  di_gseq_push(c->b, &s, rule_el(r));
  if (*frac_re)
    di_gseq_push(c->b, &s, rule_el(mk_rule_regex(c, "frac", frac_re)));
  di_gb_add_alt(c->b, rule, s.v, s.n);
  di_gseq_free(&s);
}

/* One integer part's alternative with the fraction between lo and hi (json_decimal.h). */
static di_status decimal_alt(jc *c, int rule, int neg, int64_t ipart, const char *lo, int lo_ex, const char *hi,
                             int hi_ex, const char *path) {
  char re[9000];
  int k = di_decimal_fraction_regex(lo, lo_ex, hi, hi_ex, c->opt->max_digits, re, sizeof re);
  if (k < 0)
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: number bound with too many fraction digits at %s", path);
  if (k > 0)
    int_part_alt_re(c, rule, neg, ipart, ipart, re);
  return DI_OK;
}

/* Magnitudes y = I.F in the interval from a (exclusive if a_ex) to b (NULL: unbounded; exclusive
 * if b_ex), written after an optional "-": integral bounds as magnitude_interval, else the integer
 * parts of the bounds carry the fraction languages of json_decimal.c. */
static di_status magnitude_interval_dec(jc *c, int rule, int neg, const di_decimal *a, int a_ex, const di_decimal *b,
                                        int b_ex, const char *path) {
  if (!a->f[0] && (!b || !b->f[0])) {
    magnitude_interval(c, rule, neg, a->i, a_ex, b ? b->i : -1, b_ex);
    return DI_OK;
  }
  int64_t cap = digits_cap(c);
  di_decimal capd = {0, ""};
  if (!b && cap >= 0 && a->i <= cap) { /* unbounded side: integer part of at most max_digits digits */
    capd.i = cap + 1;
    b = &capd, b_ex = 1;
  }
  if (b) {
    int cmp = a->i != b->i ? (a->i < b->i ? -1 : 1) : strcmp(a->f, b->f); /* digit strings: numeric order */
    if (cmp > 0 || (cmp == 0 && (a_ex || b_ex)))
      return DI_OK;
    if (a->i == b->i)
      return decimal_alt(c, rule, neg, a->i, a->f, a_ex, b->f, b_ex, path);
  }
  DI_TRY(decimal_alt(c, rule, neg, a->i, a->f, a_ex, NULL, 0, path));
  if (!b || b->i - 1 >= a->i + 1)
    int_part_alt(c, rule, neg, a->i + 1, b ? b->i - 1 : -1, FRAC_ANY);
  if (b)
    DI_TRY(decimal_alt(c, rule, neg, b->i, NULL, 0, b->f, b_ex, path));
  return DI_OK;
}

/* Numbers (no exponent) within minimum/maximum bounds (inclusive or exclusive, integral or not). */
static di_status gen_number_bounded(jc *c, const cJSON *sch, const char *path, int rule) {
  int has_lo = 0, has_hi = 0, lo_ex = 0, hi_ex = 0;
  double lo = 0, hi = 0;
  static const char *kw[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
  for (int k = 0; k < 4; k++) {
    const cJSON *v = item(sch, kw[k]);
    if (!v)
      continue;
    if (!cJSON_IsNumber(v))
      return di_error_set(DI_ERR_FORMAT, "json schema: '%s' must be a number at %s/%s", kw[k], path, kw[k]);
    double x = v->valuedouble;
    if (fabs(x) > 9e15) {
      if (c->opt->ignore_unsupported_keywords)
        continue;
      return di_error_set(DI_ERR_UNSUPPORTED, "json schema: '%s' on a number beyond 9e15 (got %g) at %s/%s", kw[k],
                          x, path, kw[k]);
    }
    if (k < 2 && (!has_lo || x > lo || (x == lo && k == 1)))
      has_lo = 1, lo = x, lo_ex = k == 1;
    if (k >= 2 && (!has_hi || x < hi || (x == hi && k == 3)))
      has_hi = 1, hi = x, hi_ex = k == 3;
  }
  if (!has_lo && !has_hi) {
    di_gel e = rule_el(number_rule(c));
    return di_gb_add_alt(c->b, rule, &e, 1);
  }
  di_decimal L = {0, ""}, H = {0, ""}, zero = {0, ""}; /* magnitudes of the bounds */
  if (has_lo)
    (void)di_decimal_from_double(lo, &L);
  if (has_hi)
    (void)di_decimal_from_double(hi, &H);
  /* x >= 0 part */
  if (!has_hi || hi > 0 || (hi == 0 && !hi_ex)) {
    int from_lo = has_lo && lo >= 0;
    DI_TRY(magnitude_interval_dec(c, rule, 0, from_lo ? &L : &zero, from_lo ? lo_ex : 0, has_hi ? &H : NULL,
                                  has_hi ? hi_ex : 0, path));
  }
  /* x < 0 part: magnitude y = -x > 0 (-0 is the non-negative part's business) */
  if (!has_lo || lo < 0) {
    int from_hi = has_hi && hi < 0;
    DI_TRY(magnitude_interval_dec(c, rule, 1, from_hi ? &H : &zero, from_hi ? hi_ex : 1, has_lo ? &L : NULL,
                                  has_lo ? lo_ex : 0, path));
  }
  return DI_OK;
}

/* "string key not equal to any of keys[]" (as JSON-encoded bytes, between the quotes): a trie of
 * rules; the first byte that leaves the trie continues as any string. Under the string generation
 * bound (max_string_length N >= 0) a key has at most N characters too: trie nodes past N
 * characters are not entered and the tail after a node of k characters is at most N - k - 1
 * more (the leaving character is one). */
typedef struct {
  char **keys;
  int n;
} keyset;

/* Characters of a JSON-encoded key prefix as maxLength counts them: an escape is one (a \u escape of
 * a low surrogate none: it completes a pair), UTF-8 continuation bytes none; an escape cut off at
 * the end of the prefix counts as begun. */
static int key_chars(const char *p, size_t n) {
  int k = 0;
  for (size_t i = 0; i < n;) {
    unsigned char ch = (unsigned char)p[i];
    if (ch == '\\') {
      size_t len = i + 1 < n && p[i + 1] == 'u' ? 6 : 2;
      int low = len == 6 && i + 3 < n && (p[i + 2] == 'd' || p[i + 2] == 'D') && p[i + 3] &&
                strchr("cdefCDEF", p[i + 3]);
      k += !low;
      i += len;
    } else {
      k += (ch & 0xC0) != 0x80;
      i++;
    }
  }
  return k;
}

static int excl_rule(jc *c, const keyset *ks, const char *prefix, size_t plen, int depth) {
  di_gb *b = c->b;
  /* < 0: the tails unbounded (the bound off, or kept by the counter on the whole key: key_counter) */
  const int bound = c->key_counter ? -1 : c->opt->max_string_length;
  int r = di_gb_new_rule(b, "key");
  int is_full = 0;
  di_gbyteset next = {{0}};
  for (int i = 0; i < ks->n; i++) {
    if (strncmp(ks->keys[i], prefix, plen) != 0 || strlen(ks->keys[i]) < plen)
      continue;
    if (ks->keys[i][plen] == 0)
      is_full = 1;
    else
      di_gbyteset_add(&next, (unsigned char)ks->keys[i][plen]);
  }
  di_gseq s = {0};
  if (!is_full) {
    lit(c, &s, "\"");
    di_gb_add_alt(b, r, s.v, s.n);
    s.n = 0;
  }
  char buf[1024];
  for (unsigned ch = 0; ch < 256; ch++) {
    if (!di_gbyteset_has(&next, ch))
      continue;
    if (plen + 1 >= sizeof buf || depth > 200)
      continue; /* absurdly long keys: such keys are simply not generated as additional keys */
    memcpy(buf, prefix, plen);
    buf[plen] = (char)ch;
    if (bound >= 0 && key_chars(buf, plen + 1) > bound)
      continue; /* every key through this node is longer than the bound */
    int sub = excl_rule(c, ks, buf, plen + 1, depth + 1);
    di_gseq_byte(b, &s, (uint8_t)ch);
    di_gseq_push(b, &s, rule_el(sub));
    di_gb_add_alt(b, r, s.v, s.n);
    s.n = 0;
  }
  /* leave the trie: a character whose first byte is not a trie continuation, then any tail */
  di_gbyteset plain = {{0}};
  for (unsigned ch = 0x20; ch < 0x80; ch++)
    if (ch != '"' && ch != '\\' && !di_gbyteset_has(&next, ch))
      di_gbyteset_add(&plain, ch);
  if (c->r_kesc < 0 || (bound < 0 && c->r_ktail < 0)) { /* shared by all trie nodes: tail ::= jchar* '"' ; esc ::= an escape or non-ASCII */
    if (bound < 0 && c->r_ktail < 0) {
      di_gseq t = {0};
      di_gseq_repeat(b, &t, rule_el(jchar_rule(c)), 0, -1);
      lit(c, &t, "\"");
      c->r_ktail = di_gb_new_rule(b, "ktail");
      di_gb_add_alt(b, c->r_ktail, t.v, t.n);
      di_gseq_free(&t);
    }
    char esc[256], re[320];
    escape_re(c, esc, sizeof esc);
    snprintf(re, sizeof re, "%s%s[\\u0080-\\u{10FFFF}]", esc, esc[0] ? "|" : "");
    if (c->r_kesc < 0) {
      c->r_kesc = di_gb_new_rule(b, "kesc");
      if (di_regex_compile_into(b, c->r_kesc, re, strlen(re), 0, 1) != DI_OK)
        b->oom = 1;
    }
    /* esc ktail as one rule, referenced last by every trie node: its stacks then have one parent
     * whichever node they leave from, so the automaton's states inside an escape or a multi-byte
     * character are shared by all the trie's nodes instead of built once per node (unbounded keys
     * only: under the bound each node's tail has its own count) */
    if (bound < 0 && c->r_kesc_tail < 0) {
      di_gseq e = {0};
      di_gseq_push(b, &e, rule_el(c->r_kesc));
      di_gseq_push(b, &e, rule_el(c->r_ktail));
      c->r_kesc_tail = di_gb_new_rule(b, "kesctail");
      di_gb_add_alt(b, c->r_kesc_tail, e.v, e.n);
      di_gseq_free(&e);
    }
  }
  /* the tail after the leaving character: any string (jchar* '"'), or under the bound at most
   * `left` more characters; none when the leaving character itself would pass the bound */
  int left = bound < 0 ? -1 : bound - key_chars(prefix, plen) - 1;
  if (bound < 0 || left >= 0) {
    for (int esc = 0; esc < 2; esc++) {
      if (esc) { /* escapes and non-ASCII characters also leave the trie */
        int esc_ok = !di_gbyteset_has(&next, '\\');
        for (unsigned lead = 0xC2; lead < 0xF5; lead++)
          if (di_gbyteset_has(&next, lead))
            esc_ok = 0;
        if (!esc_ok)
          break;
      }
      if (esc && bound < 0) {
        /* the shared escape tail (esc ktail as one rule): one parent for every trie node's stacks */
        di_gseq_push(b, &s, rule_el(c->r_kesc_tail));
      } else {
        if (esc)
          di_gseq_push(b, &s, rule_el(c->r_kesc));
        else
          di_gseq_push(b, &s, (di_gel){DI_GE_CLASS, di_gb_class(b, &plain)});
        if (bound < 0) {
          di_gseq_push(b, &s, rule_el(c->r_ktail));
        } else {
          di_gseq_repeat(b, &s, rule_el(jchar_rule(c)), 0, left);
          lit(c, &s, "\"");
        }
      }
      di_gb_add_alt(b, r, s.v, s.n);
      s.n = 0;
    }
  }
  if (!b->oom && b->rules[r].n_alts == 0) { /* a named key of exactly N characters, nothing past it */
    di_gbyteset none = {{0}};
    di_gseq_push(b, &s, (di_gel){DI_GE_CLASS, di_gb_class(b, &none)});
    di_gb_add_alt(b, r, s.v, s.n);
  }
  di_gseq_free(&s);
  return r;
}

/* ---- patternProperties -------------------------------------------------------------------- */
/* The patterns of a patternProperties keyword, each determinised (regular_set.h) so that names can
 * be matched against them and the names matching none of them can be generated. */
enum { MAX_PATTERN_PROPERTIES = 4 };
typedef struct {
  di_rlang *re[MAX_PATTERN_PROPERTIES];
  const cJSON *schema[MAX_PATTERN_PROPERTIES];
  int k;
} pattern_set;

static void pattern_set_free(pattern_set *ps) {
  for (int i = 0; i < ps->k; i++)
    di_rlang_free(ps->re[i]);
  ps->k = 0;
}

static di_status pattern_set_compile(jc *c, const cJSON *pp, const char *path, pattern_set *ps) {
  if (!cJSON_IsObject(pp))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'patternProperties' must be an object at %s", path);
  for (const cJSON *e = pp->child; e; e = e->next) {
    if (ps->k == MAX_PATTERN_PROPERTIES)
      return unsupported(c, path, "patternProperties (more than 4 patterns)");
    di_status st = di_rlang_regex(e->string, strlen(e->string), 1, 0, &ps->re[ps->k]);
    if (st != DI_OK)
      return di_error_wrap(st, "json schema: pattern '%.100s' at %s/patternProperties", e->string, path);
    ps->schema[ps->k++] = e;
  }
  return DI_OK;
}

/* A property name's body as generation writes it (JSON-escaped, without the quotes); NULL: no memory. */
static char *key_body(const char *name) {
  di_sbuf kb = {0};
  di_sbuf_json_string(&kb, name);
  if (kb.oom || !kb.p || kb.n < 2) {
    free(kb.p);
    return NULL;
  }
  memmove(kb.p, kb.p + 1, kb.n - 2);
  kb.p[kb.n - 2] = 0;
  return kb.p;
}

/* allOf(base, the schemas of the patterns in mask, and the additionalProperties of merged allOf
 * branches none of whose patterns is in mask: PP_ADDL_KEY entries of `unseen`, may be NULL); base
 * may be NULL. */
static cJSON *all_of_patterns(jc *c, const cJSON *base, const pattern_set *ps, unsigned mask, const cJSON *unseen) {
  cJSON *o = cJSON_CreateObject(), *arr = o ? cJSON_AddArrayToObject(o, "allOf") : NULL;
  if (!arr) {
    cJSON_Delete(o);
    return NULL;
  }
  if (!own(c, o)) /* own frees it on failure */
    return NULL;
  if (base)
    cJSON_AddItemToArray(arr, cJSON_Duplicate(base, 1));
  for (int i = 0; i < ps->k; i++)
    if ((mask >> i) & 1)
      cJSON_AddItemToArray(arr, cJSON_Duplicate(ps->schema[i], 1));
  for (const cJSON *e = cJSON_IsArray(unseen) ? unseen->child : NULL; e; e = e->next) {
    int hit = 0;
    for (const cJSON *q = item(e, "p") ? item(e, "p")->child : NULL; q && !hit; q = q->next)
      for (int i = 0; i < ps->k && !hit; i++)
        hit = ((mask >> i) & 1) && cJSON_IsString(q) && strcmp(ps->schema[i]->string, q->valuestring) == 0;
    if (!hit && item(e, "ap"))
      cJSON_AddItemToArray(arr, cJSON_Duplicate(item(e, "ap"), 1));
  }
  return o;
}

/* The patterns a named property matches (bit mask); -1 out of memory or past a budget. */
static int matching_patterns(const pattern_set *ps, const char *name) {
  char *body = key_body(name);
  if (!body)
    return -1;
  int m = 0;
  for (int i = 0; i < ps->k && m >= 0; i++) {
    int r = di_rlang_contains(ps->re[i], body, strlen(body));
    m = r < 0 ? -1 : m | (r << i);
  }
  free(body);
  return m;
}

/* The members whose names are not named properties: for each set T of patterns, the names matching
 * exactly those (and no named property) with a value satisfying all their schemas; with T empty,
 * the names matching no pattern, valued by vr (when vr >= 0: other properties are allowed). */
static di_status pattern_members(jc *c, const pattern_set *ps, const cJSON *unseen, const keyset *ks, int vr,
                                 const char *path, int *r_members) {
  di_gb *b = c->b;
  *r_members = -1;
  di_rlang *langs[2 + MAX_PATTERN_PROPERTIES] = {NULL};
  char **raw = calloc((size_t)ks->n + 1, sizeof *raw);
  static const char *universe = "[\\s\\S]*";
  di_status st = raw ? di_rlang_regex(universe, strlen(universe), 1, 1, &langs[0])
                     : di_error_set(DI_ERR_OOM, "out of memory");
  for (int i = 0; st == DI_OK && i < ks->n; i++) {
    size_t L = strlen(ks->keys[i]);
    if (!(raw[i] = malloc(L)))
      st = di_error_set(DI_ERR_OOM, "out of memory");
    else
      memcpy(raw[i], ks->keys[i] + 1, L - 2), raw[i][L - 2] = 0;
  }
  if (st == DI_OK)
    st = di_rlang_literals((const char *const *)raw, ks->n, &langs[1]);
  for (int i = 0; i < ps->k; i++)
    langs[2 + i] = ps->re[i];
  unsigned all = (1u << ps->k) - 1;
  for (unsigned T = vr >= 0 ? 0 : 1; st == DI_OK && T <= all; T++) {
    di_rlang_product p = {langs, 2 + ps->k, 1u | (T << 2), 2u | ((all & ~T) << 2), 0, 0, -1, 20000, 0, 0, 0};
    int key = -1, val = vr;
    st = di_rlang_emit(b, &p, &key);
    if (st == DI_ERR_UNSUPPORTED)
      st = di_error_wrap(st, "json schema: patternProperties at %s", path);
    if (st != DI_OK || key < 0)
      continue;
    if (T) {
      char sub[1200];
      snprintf(sub, sizeof sub, "%s/patternProperties", path);
      const cJSON *vs = T & (T - 1) || unseen ? all_of_patterns(c, NULL, ps, T, unseen) : NULL;
      for (int i = 0; !vs && i < ps->k; i++)
        if (T == 1u << i)
          vs = ps->schema[i];
      st = vs ? gen(c, vs, sub, &val) : di_error_set(DI_ERR_OOM, "out of memory");
      if (st != DI_OK || val < 0)
        continue;
    }
    if (*r_members < 0)
      *r_members = di_gb_new_rule(b, "pmember");
    di_gseq s = {0};
    nl_in(c, &s);
    lit(c, &s, "\"");
    mark_bounded(c, key, 0); /* the names' default bound, as other keys' (string_bound.h) */
    di_gseq_push(b, &s, rule_el(key));
    lit(c, &s, "\"");
    ws(c, &s);
    lit(c, &s, ":");
    ws(c, &s);
    di_gseq_push(b, &s, rule_el(val));
    st = di_gb_add_alt(b, *r_members, s.v, s.n);
    di_gseq_free(&s);
  }
  for (int i = 0; raw && i < ks->n; i++)
    free(raw[i]);
  free(raw);
  di_rlang_free(langs[0]);
  di_rlang_free(langs[1]);
  return st;
}

static int bare_container(const cJSON *sch);

static di_status gen_object(jc *c, const cJSON *sch, const char *path, int rule) {
  di_gb *b = c->b;
  const cJSON *props = item(sch, "properties"), *req = item(sch, "required"), *addl = item(sch, "additionalProperties");
  if (!addl) /* the schema and its merged in-place subschemas evaluate only their properties */
    addl = item(sch, "unevaluatedProperties");
  if (props && !cJSON_IsObject(props))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'properties' must be an object at %s", path);
  if (req && !cJSON_IsArray(req))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'required' must be an array at %s", path);
  int64_t minp = 0, maxp = -1;
  DI_TRY(get_count(sch, "minProperties", path, &minp));
  DI_TRY(get_count(sch, "maxProperties", path, &maxp));
  int has_maxp = maxp >= 0;
  if ((has_maxp ? maxp : minp) > 64)
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: minProperties/maxProperties above 64 are not supported at %s",
                        path);
  if (has_maxp && maxp < minp)
    return DI_OK; /* no object fits */
  /* the property list: properties in order, then required names not among them */
  int np = 0;
  for (const cJSON *p = props ? props->child : NULL; p; p = p->next)
    np++;
  for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
    np++;
  const char **names = calloc((size_t)np + 1, sizeof *names);
  const cJSON **schemas = calloc((size_t)np + 1, sizeof *schemas);
  int *isreq = calloc((size_t)np + 1, sizeof(int));
  int *rules = calloc((size_t)np + 1, sizeof(int));
  keyset ks = {calloc((size_t)np + 1, sizeof(char *)), 0};
  di_grammar *png = NULL; /* propertyNames' own grammar, to check the named properties */
  pattern_set ps = {.k = 0};
  di_status st = DI_OK;
  if (!names || !schemas || !isreq || !rules || !ks.keys) {
    st = di_error_set(DI_ERR_OOM, "out of memory");
    goto done;
  }
  const cJSON *pprops = item(sch, "patternProperties"), *unseen = item(sch, PP_ADDL_KEY);
  if (pprops) {
    const cJSON *pn0 = item(sch, "propertyNames");
    if (pn0 && !cJSON_IsTrue(pn0) && !c->opt->ignore_unsupported_keywords) {
      st = unsupported(c, path, "patternProperties (with propertyNames)");
      goto done;
    }
    st = pattern_set_compile(c, pprops, path, &ps);
    if (st != DI_OK)
      goto done;
  }
  int n = 0;
  for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
    int dup = 0;
    for (int i = 0; i < n; i++)
      dup |= strcmp(names[i], p->string) == 0;
    if (dup)
      continue;
    names[n] = p->string;
    schemas[n++] = p;
  }
  int nprops = n;
  for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
    if (!cJSON_IsString(r)) {
      st = di_error_set(DI_ERR_FORMAT, "json schema: 'required' entries must be strings at %s/required", path);
      goto done;
    }
    int found = -1;
    for (int i = 0; i < n; i++)
      if (strcmp(names[i], r->valuestring) == 0)
        found = i;
    int pm = found < 0 && ps.k ? matching_patterns(&ps, r->valuestring) : 0;
    if (pm < 0) {
      st = di_error_set(DI_ERR_OOM, "out of memory matching patternProperties at %s", path);
      goto done;
    }
    if (found >= 0) {
      isreq[found] = 1;
    } else if (pm > 0) { /* required, named by no property, matching patterns: their schemas */
      names[n] = r->valuestring;
      schemas[n] = all_of_patterns(c, NULL, &ps, (unsigned)pm, unseen);
      if (!schemas[n]) {
        st = di_error_set(DI_ERR_OOM, "out of memory");
        goto done;
      }
      isreq[n++] = 1;
    } else if (cJSON_IsFalse(addl)) {
      /* required, yet not a property and no other property allowed: no object satisfies this */
      snprintf(c->why_empty, sizeof c->why_empty,
               "required property '%.100s' at %.150s/required is not in 'properties' and additionalProperties is false",
               r->valuestring, path);
      goto done;
    } else {
      names[n] = r->valuestring;
      schemas[n] = addl && !cJSON_IsBool(addl) ? addl : NULL; /* NULL: any value */
      isreq[n++] = 1;
    }
  }
  for (int i = 0; i < nprops && ps.k; i++) { /* a named property matching patterns: all their schemas apply */
    int pm = matching_patterns(&ps, names[i]);
    if (pm < 0 || (pm > 0 && !(schemas[i] = all_of_patterns(c, schemas[i], &ps, (unsigned)pm, NULL)))) {
      st = di_error_set(DI_ERR_OOM, "out of memory matching patternProperties at %s", path);
      goto done;
    }
  }
  /* JSON Schema's default admits other properties; strict mode (XGrammar's) admits none, except in
   * a bare {"type": "object"} (annotations only), which stays any object as in XGrammar's strict mode */
  int allow_addl = addl ? !cJSON_IsFalse(addl) : (!c->opt->strict || bare_container(sch));
  /* propertyNames: named properties are checked against it here (a grammar of its own); other
   * names are generated from it, which needs there to be no named property they could repeat */
  const cJSON *pn = item(sch, "propertyNames");
  int r_pkey = -1, pn_none = cJSON_IsFalse(pn);
  if (pn_none) {
    allow_addl = 0;
  } else if (pn && !cJSON_IsTrue(pn)) {
    char *txt = cJSON_PrintUnformatted(pn);
    if (!txt) {
      st = di_error_set(DI_ERR_OOM, "out of memory");
      goto done;
    }
    int has_ref = strstr(txt, "\"$ref\"") != NULL;
    if ((has_ref || (allow_addl && n > 0)) && !c->opt->ignore_unsupported_keywords) {
      free(txt);
      st = unsupported(c, path, has_ref ? "propertyNames (with $ref)"
                                        : "propertyNames (with properties and other names allowed)");
      goto done;
    }
    di_grammar_options po = *c->opt;
    po.no_cache = 1;
    po.max_string_length = -1;
    st = di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, txt, strlen(txt), &po, &png);
    free(txt);
    if (st != DI_OK && strstr(di_last_error(), "no JSON value satisfies")) {
      st = DI_OK; /* no name fits: as propertyNames false */
      pn_none = 1, allow_addl = 0;
    }
    if (st != DI_OK)
      goto done;
    if (allow_addl) {
      cJSON *str = cJSON_CreateObject(), *ks_schema = NULL;
      if (!str || !own(c, str)) {
        st = di_error_set(DI_ERR_OOM, "out of memory");
        goto done;
      }
      cJSON_AddStringToObject(str, "type", "string");
      char sub[1200];
      snprintf(sub, sizeof sub, "%s/propertyNames", path);
      st = merge(c, str, pn, 0, sub, &ks_schema);
      if (st == DI_OK)
        st = gen(c, ks_schema, sub, &r_pkey);
      if (st != DI_OK)
        goto done;
      if (r_pkey < 0)
        allow_addl = 0;
    }
  }
  for (int i = 0; i < n; i++) {
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/properties/%s", path, names[i]);
    if (schemas[i]) {
      st = gen(c, schemas[i], sub, &rules[i]);
      if (st != DI_OK)
        goto done;
    } else {
      rules[i] = any_rule(c);
    }
    if (rules[i] < 0 && isreq[i])
      goto done; /* a required property that can have no value: no object fits */
    di_sbuf kb = {0};
    di_sbuf_json_string(&kb, names[i]);
    if (kb.oom) {
      free(kb.p);
      st = di_error_set(DI_ERR_OOM, "out of memory");
      goto done;
    }
    ks.keys[ks.n++] = kb.p;
    if (pn_none || (png && !di_grammar_accepts(png, kb.p, kb.n))) { /* a name propertyNames rejects */
      rules[i] = -1;
      if (isreq[i]) {
        snprintf(c->why_empty, sizeof c->why_empty, "required property '%.100s' fails propertyNames at %.200s",
                 names[i], path);
        goto done;
      }
    }
  }
  /* additional members: key (not a named property) ":" value */
  int r_addl = -1;
  if (ps.k) {
    int vr = -1;
    if (allow_addl && (!addl || cJSON_IsTrue(addl))) {
      vr = any_rule(c);
    } else if (allow_addl) {
      char sub[1200];
      snprintf(sub, sizeof sub, "%s/additionalProperties", path);
      st = gen(c, addl, sub, &vr);
    }
    if (st == DI_OK)
      st = pattern_members(c, &ps, unseen, &ks, vr, path, &r_addl);
    if (st != DI_OK)
      goto done;
  } else if (allow_addl) {
    int vr;
    if (!addl || cJSON_IsTrue(addl)) {
      vr = any_rule(c);
    } else {
      char sub[1200];
      snprintf(sub, sizeof sub, "%s/additionalProperties", path);
      st = gen(c, addl, sub, &vr);
      if (st != DI_OK)
        goto done;
    }
    if (vr >= 0) {
      /* keys without their quotes for the exclusion trie */
      keyset raw = {calloc((size_t)ks.n + 1, sizeof(char *)), ks.n};
      for (int i = 0; raw.keys && i < ks.n; i++) {
        size_t L = strlen(ks.keys[i]);
        raw.keys[i] = malloc(L);
        if (raw.keys[i]) {
          memcpy(raw.keys[i], ks.keys[i] + 1, L - 2);
          raw.keys[i][L - 2] = 0;
        } else {
          b->oom = 1;
          raw.n = i;
          break;
        }
      }
      if (!raw.keys)
        b->oom = 1, raw.n = 0;
      r_addl = di_gb_new_rule(b, "addl");
      di_gseq s = {0};
      nl_in(c, &s);
      lit(c, &s, "\"");
      /* under the bound, the whole key is a bounded body for the matcher's counter (string_bound.h)
       * when every named key fits the bound (always at the default 4,096); else each trie node's
       * tail counts its own characters (a counted repetition of N - k - 1) */
      int fits = c->opt->max_string_length > 0 && !b->sb_off && (!b->sb_n || b->sb_n == c->opt->max_string_length);
      for (int i = 0; fits && i < raw.n; i++)
        fits = key_chars(raw.keys[i], strlen(raw.keys[i])) <= c->opt->max_string_length;
      int kr = -1;
      if (n) {
        c->key_counter = fits;
        kr = excl_rule(c, &raw, "", 0, 0);
        c->key_counter = 0;
        if (fits)
          mark_bounded(c, kr, 0);
      }
      di_gseq_push(b, &s, rule_el(kr));
      if (!n) {
        s.n = 0;
        nl_in(c, &s);
        di_gseq_push(b, &s, rule_el(r_pkey >= 0 ? r_pkey : string_rule(c)));
      }
      ws(c, &s);
      lit(c, &s, ":");
      ws(c, &s);
      di_gseq_push(b, &s, rule_el(vr));
      di_gb_add_alt(b, r_addl, s.v, s.n);
      di_gseq_free(&s);
      for (int i = 0; i < raw.n; i++)
        free(raw.keys[i]);
      free(raw.keys);
    }
  }
  /* S_i[k]: members from property i on, none emitted yet; R_i[k]: some emitted (needs a comma);
   * k counts the members emitted so far for minProperties / maxProperties (saturating at minProperties
   * when there is no maximum; a single layer without either keyword) */
  int K = has_maxp ? (int)maxp : (int)minp;
  int *Snext = calloc((size_t)K + 1, sizeof(int)), *Rnext = calloc((size_t)K + 1, sizeof(int));
  int *Scur = calloc((size_t)K + 1, sizeof(int)), *Rcur = calloc((size_t)K + 1, sizeof(int));
  if (!Snext || !Rnext || !Scur || !Rcur) {
    free(Snext), free(Rnext), free(Scur), free(Rcur);
    st = di_error_set(DI_ERR_OOM, "out of memory");
    goto done;
  }
  di_gel more = {-1, -1};
  if (r_addl >= 0) {
    di_gseq t = {0};
    lit(c, &t, ",");
    ws(c, &t);
    di_gseq_push(b, &t, rule_el(r_addl));
    ws(c, &t);
    more = di_gb_wrap(b, &t, "addl_more");
    di_gseq_free(&t);
  }
  for (int k = 0; k <= K; k++) {
    /* tail after the last named property: additional members, as many as the bounds leave */
    int S = di_gb_new_rule(b, "obj_s"), R = di_gb_new_rule(b, "obj_r");
    if (b->oom) { /* the new rules' indices are not valid then */
      st = di_error_set(DI_ERR_OOM, "out of memory building the grammar");
      free(Snext), free(Rnext), free(Scur), free(Rcur);
      goto done;
    }
    b->rules[S].defined = b->rules[R].defined = 1;
    int amin = minp > k ? (int)minp - k : 0, amax = has_maxp ? (int)maxp - k : -1;
    /* the object ends here: after members (R, or S with additional ones) at indent's newline */
    di_gseq s = {0};
    if (amin == 0) {
      di_gb_add_alt(b, S, NULL, 0);
      nl_out(c, &s);
      di_gb_add_alt(b, R, s.v, s.n);
      s.n = 0;
    }
    if (r_addl >= 0 && amax != 0) {
      di_gseq_push(b, &s, rule_el(r_addl));
      ws(c, &s);
      di_gseq_repeat(b, &s, more, amin > 1 ? amin - 1 : 0, amax < 0 ? -1 : amax - 1);
      nl_out(c, &s);
      di_gb_add_alt(b, S, s.v, s.n);
      s.n = 0;
      di_gseq_repeat(b, &s, more, amin > 1 ? amin : 1, amax);
      nl_out(c, &s);
      di_gb_add_alt(b, R, s.v, s.n);
    }
    di_gseq_free(&s);
    Snext[k] = S;
    Rnext[k] = R;
  }
  for (int i = n - 1; i >= 0; i--) {
    di_gel kvel = {-1, -1};
    if (rules[i] >= 0) {
      di_gseq kv = {0};
      nl_in(c, &kv);
      di_gseq_bytes(b, &kv, ks.keys[i], strlen(ks.keys[i]));
      ws(c, &kv);
      lit(c, &kv, ":");
      ws(c, &kv);
      di_gseq_push(b, &kv, rule_el(rules[i]));
      ws(c, &kv);
      kvel = di_gb_wrap(b, &kv, "member");
      di_gseq_free(&kv);
    }
    for (int k = 0; k <= K; k++) {
      int S = di_gb_new_rule(b, "obj_s"), R = di_gb_new_rule(b, "obj_r");
      if (b->oom) {
        st = di_error_set(DI_ERR_OOM, "out of memory building the grammar");
        free(Snext), free(Rnext), free(Scur), free(Rcur);
        goto done;
      }
      b->rules[S].defined = b->rules[R].defined = 1;
      int k1 = k < K ? k + 1 : has_maxp ? -1 : K; /* the count after this member; -1: over the maximum */
      if (rules[i] >= 0 && k1 >= 0) {
        di_gseq s = {0};
        di_gseq_push(b, &s, kvel);
        di_gseq_push(b, &s, rule_el(Rnext[k1]));
        di_gb_add_alt(b, S, s.v, s.n);
        s.n = 0;
        lit(c, &s, ",");
        ws(c, &s);
        di_gseq_push(b, &s, kvel);
        di_gseq_push(b, &s, rule_el(Rnext[k1]));
        di_gb_add_alt(b, R, s.v, s.n);
        di_gseq_free(&s);
      }
      if (!isreq[i]) { /* a required property that is unsatisfiable leaves S/R without alternatives */
        di_gel e = rule_el(Snext[k]);
        di_gb_add_alt(b, S, &e, 1);
        e = rule_el(Rnext[k]);
        di_gb_add_alt(b, R, &e, 1);
      }
      Scur[k] = S;
      Rcur[k] = R;
    }
    memcpy(Snext, Scur, sizeof(int) * ((size_t)K + 1));
    memcpy(Rnext, Rcur, sizeof(int) * ((size_t)K + 1));
  }
  int S0 = Snext[0];
  free(Snext), free(Rnext), free(Scur), free(Rcur);
  (void)nprops;
  {
    di_gseq s = {0};
    lit(c, &s, "{");
    ws(c, &s);
    di_gseq_push(b, &s, rule_el(S0));
    lit(c, &s, "}");
    st = di_gb_add_alt(b, rule, s.v, s.n);
    di_gseq_free(&s);
  }
done:
  pattern_set_free(&ps);
  di_grammar_free(png);
  for (int i = 0; ks.keys && i < ks.n; i++)
    free(ks.keys[i]);
  free(ks.keys);
  free(names);
  free(schemas);
  free(isreq);
  free(rules);
  return st;
}

/* An array with `contains` (at least minContains elements, default 1, match it): elements I
 * (items), of which the matching ones are M = items & contains:
 *   "[" ws (I ws "," ws)* M ws { ("," ws I ws)* "," ws M ws }^(n-1) ("," ws I ws)* "]"
 * Supported without prefixItems, maxContains and a minItems above n, or maxItems (refused, naming
 * the keyword). */
static di_status gen_array_contains(jc *c, const cJSON *sch, const char *path, int rule) {
  di_gb *b = c->b;
  const cJSON *cont = item(sch, "contains"), *items = item(sch, "items"), *minc = item(sch, "minContains");
  int64_t n = 1, minI = 0;
  DI_TRY(get_count(sch, "minContains", path, &n));
  DI_TRY(get_count(sch, "minItems", path, &minI));
  (void)minc;
  static const char *refused[] = {"prefixItems", "maxContains", "maxItems", "unevaluatedItems", NULL};
  for (int i = 0; refused[i]; i++)
    if (item(sch, refused[i]) && !c->opt->ignore_unsupported_keywords)
      return di_error_set(DI_ERR_UNSUPPORTED, "json schema: unsupported keyword 'contains' together with '%s' at %s",
                          refused[i], path);
  if (n > 16 || (minI > n && !c->opt->ignore_unsupported_keywords))
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "json schema: 'contains' with minContains above 16 or minItems above minContains is not "
                        "supported at %s",
                        path);
  char sub[1200];
  int ri = -1, rm = -1;
  if (!items || cJSON_IsTrue(items)) {
    ri = any_rule(c);
  } else if (!cJSON_IsFalse(items)) {
    snprintf(sub, sizeof sub, "%s/items", path);
    DI_TRY(gen(c, items, sub, &ri));
  }
  cJSON *both = NULL;
  snprintf(sub, sizeof sub, "%s/contains", path);
  DI_TRY(merge(c, items ? items : cJSON_IsObject(cont) ? cont : sch, cont, 0, sub, &both));
  DI_TRY(gen(c, both, sub, &rm));
  if (ri < 0 || rm < 0)
    return DI_OK; /* no element can match: no array fits */
  di_gseq t = {0}, s = {0};
  /* before the first match: (I ws "," ws)* */
  di_gseq_push(b, &t, rule_el(ri));
  ws(c, &t);
  lit(c, &t, ",");
  ws(c, &t);
  nl_in(c, &t);
  di_gel lead = di_gb_wrap(b, &t, "contains_lead");
  t.n = 0;
  /* after a match: ("," ws I ws)* */
  lit(c, &t, ",");
  ws(c, &t);
  nl_in(c, &t);
  di_gseq_push(b, &t, rule_el(ri));
  ws(c, &t);
  di_gel more = di_gb_wrap(b, &t, "contains_more");
  di_gseq_free(&t);
  lit(c, &s, "[");
  ws(c, &s);
  nl_in(c, &s);
  di_gseq_repeat(b, &s, lead, 0, -1);
  di_gseq_push(b, &s, rule_el(rm));
  ws(c, &s);
  for (int64_t k = 1; k < n; k++) {
    di_gseq_repeat(b, &s, more, 0, -1);
    lit(c, &s, ",");
    ws(c, &s);
    nl_in(c, &s);
    di_gseq_push(b, &s, rule_el(rm));
    ws(c, &s);
  }
  di_gseq_repeat(b, &s, more, 0, -1);
  nl_out(c, &s);
  lit(c, &s, "]");
  di_status st = di_gb_add_alt(b, rule, s.v, s.n);
  di_gseq_free(&s);
  return st;
}

/* uniqueItems over k distinct values: a rule per set of values used so far (2^k), each continuing
 * with a value not in it that the next position allows (the number of items so far is the set's
 * size, so it also picks the prefixItems position), ending once minItems are there, stopping at
 * maxItems. */
static di_status gen_array_unique(jc *c, const cJSON *sch, const unique_layout *u, const char *path, int rule) {
  const cJSON *const *vals = u->vals;
  int k = u->n;
  di_gb *b = c->b;
  int64_t minI = 0, maxI = -1;
  DI_TRY(get_count(sch, "minItems", path, &minI));
  DI_TRY(get_count(sch, "maxItems", path, &maxI));
  int nsets = 1 << k, *U = malloc(sizeof(int) * (size_t)nsets);
  di_gel *val = malloc(sizeof(di_gel) * ((size_t)k + 1));
  if (!U || !val) {
    free(U), free(val);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  di_gseq s = {0};
  for (int i = 0; i < k; i++) {
    s.n = 0;
    emit_value_literal(c, &s, vals[i]);
    val[i] = di_gb_wrap(b, &s, "uniq_value");
  }
  for (int m = 0; m < nsets; m++)
    U[m] = di_gb_new_rule(b, "uniq");
  di_status st = b->oom ? di_error_set(DI_ERR_OOM, "out of memory building the grammar") : DI_OK;
  for (int m = 0; st == DI_OK && m < nsets; m++) {
    int used = __builtin_popcount((unsigned)m);
    b->rules[U[m]].defined = 1;
    if (used >= minI)
      st = di_gb_add_alt(b, U[m], NULL, 0);
    unsigned next = u->allowed[used < u->P ? used : u->P];
    for (int i = 0; st == DI_OK && i < k && (maxI < 0 || used < maxI); i++) {
      if (((m >> i) & 1) || !((next >> i) & 1))
        continue;
      s.n = 0;
      lit(c, &s, ",");
      ws(c, &s);
      nl_in(c, &s);
      di_gseq_push(b, &s, val[i]);
      ws(c, &s);
      di_gseq_push(b, &s, rule_el(U[m | 1 << i]));
      st = di_gb_add_alt(b, U[m], s.v, s.n);
    }
  }
  if (st == DI_OK && minI == 0) {
    s.n = 0;
    lit(c, &s, "[");
    ws(c, &s);
    lit(c, &s, "]");
    st = di_gb_add_alt(b, rule, s.v, s.n);
  }
  for (int i = 0; st == DI_OK && i < k && maxI != 0; i++) {
    if (!((u->allowed[0] >> i) & 1))
      continue;
    s.n = 0;
    lit(c, &s, "[");
    ws(c, &s);
    nl_in(c, &s);
    di_gseq_push(b, &s, val[i]);
    ws(c, &s);
    di_gseq_push(b, &s, rule_el(U[1 << i]));
    nl_out(c, &s);
    lit(c, &s, "]");
    st = di_gb_add_alt(b, rule, s.v, s.n);
  }
  di_gseq_free(&s);
  free(U), free(val);
  return st;
}

static di_status gen_array(jc *c, const cJSON *sch, const char *path, int rule) {
  di_gb *b = c->b;
  const cJSON *cont = item(sch, "contains"), *minc = item(sch, "minContains");
  if (cont && !(cJSON_IsNumber(minc) && minc->valuedouble == 0))
    return gen_array_contains(c, sch, path, rule);
  if (cont && item(sch, "unevaluatedItems") && !c->opt->ignore_unsupported_keywords) /* contains evaluates items */
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: unsupported keyword 'unevaluatedItems' beside 'contains' at %s",
                        path);
  unique_layout ul;
  if (cJSON_IsTrue(item(sch, "uniqueItems")) && unique_item_layout(c, sch, &ul))
    return gen_array_unique(c, sch, &ul, path, rule);
  const cJSON *items = item(sch, "items"), *prefix = item(sch, "prefixItems");
  if (cJSON_IsArray(items) && !prefix) { /* draft 7's tuple form: items [...] + additionalItems */
    prefix = items;
    items = item(sch, "additionalItems");
  } else if (!items) { /* the schema and its merged in-place subschemas evaluate only their items */
    items = item(sch, "unevaluatedItems");
  }
  int64_t minI = 0, maxI = -1;
  DI_TRY(get_count(sch, "minItems", path, &minI));
  DI_TRY(get_count(sch, "maxItems", path, &maxI));
  if (prefix && !cJSON_IsArray(prefix))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'prefixItems' must be an array at %s", path);
  int P = prefix ? cJSON_GetArraySize(prefix) : 0;
  int r_item = -1; /* element schema past the prefix; -1: none allowed */
  char sub[1200];
  if (!items || cJSON_IsTrue(items)) {
    r_item = any_rule(c);
  } else if (!cJSON_IsFalse(items)) {
    snprintf(sub, sizeof sub, "%s/items", path);
    DI_TRY(gen(c, items, sub, &r_item));
  }
  int *pr = calloc((size_t)P + 1, sizeof(int));
  if (!pr)
    return di_error_set(DI_ERR_OOM, "out of memory");
  int k = 0;
  for (const cJSON *e = prefix ? prefix->child : NULL; e; e = e->next, k++) {
    snprintf(sub, sizeof sub, "%s/prefixItems/%d", path, k);
    di_status st = gen(c, e, sub, &pr[k]);
    if (st != DI_OK) {
      free(pr);
      return st;
    }
  }
  /* limit the length to the prefix when no further items are allowed, and where a prefix item
   * is unsatisfiable (rule < 0) */
  int64_t maxlen = maxI;
  for (int i = 0; i < P; i++)
    if (pr[i] < 0 && (maxlen < 0 || maxlen > i))
      maxlen = i;
  if (r_item < 0 && (maxlen < 0 || maxlen > P))
    maxlen = P;
  if (minI > 100000 || maxlen > 100000) {
    free(pr);
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: minItems/maxItems above 100000 at %s", path);
  }
  if (maxlen >= 0 && minI > maxlen) {
    free(pr);
    return DI_OK; /* no array fits */
  }
  /* A_k: continuation after k elements (k >= 1), up to the prefix length; then repetition */
  int next = -1; /* rule for "after k elements" */
  int tailK = P > 0 ? P : 1;
  {
    /* after tailK elements: ("," item){max(0,min-tailK), maxlen-tailK} */
    int r = di_gb_new_rule(b, "arr_tail");
    di_gseq s = {0};
    if (r_item >= 0 && (maxlen < 0 || maxlen > tailK)) {
      di_gseq t = {0};
      lit(c, &t, ",");
      ws(c, &t);
      nl_in(c, &t);
      di_gseq_push(b, &t, rule_el(r_item));
      ws(c, &t);
      di_gel one = di_gb_wrap(b, &t, "arr_more");
      di_gseq_free(&t);
      int lo = (int)(minI > tailK ? minI - tailK : 0);
      int hi = maxlen < 0 ? -1 : (int)(maxlen - tailK);
      di_gseq_repeat(b, &s, one, lo, hi);
      di_gb_add_alt(b, r, s.v, s.n);
    } else if (minI <= tailK) {
      di_gb_add_alt(b, r, NULL, 0);
    }
    di_gseq_free(&s);
    if (b->oom) {
      free(pr);
      return di_error_set(DI_ERR_OOM, "out of memory building the grammar");
    }
    b->rules[r].defined = 1;
    next = r;
  }
  for (int kk = tailK - 1; kk >= 1; kk--) { /* after kk elements, kk < P */
    int r = di_gb_new_rule(b, "arr_k");
    if (kk >= minI)
      di_gb_add_alt(b, r, NULL, 0);
    if (pr[kk] >= 0 && (maxlen < 0 || maxlen > kk)) {
      di_gseq s = {0};
      lit(c, &s, ",");
      ws(c, &s);
      nl_in(c, &s);
      di_gseq_push(b, &s, rule_el(pr[kk]));
      ws(c, &s);
      di_gseq_push(b, &s, rule_el(next));
      di_gb_add_alt(b, r, s.v, s.n);
      di_gseq_free(&s);
    }
    if (b->oom) {
      free(pr);
      return di_error_set(DI_ERR_OOM, "out of memory building the grammar");
    }
    b->rules[r].defined = 1;
    next = r;
  }
  di_gseq s = {0};
  int first = P > 0 ? pr[0] : r_item;
  if (minI == 0) {
    lit(c, &s, "[");
    ws(c, &s);
    lit(c, &s, "]");
    di_gb_add_alt(b, rule, s.v, s.n);
    s.n = 0;
  }
  if (first >= 0 && maxlen != 0) {
    lit(c, &s, "[");
    ws(c, &s);
    nl_in(c, &s);
    di_gseq_push(b, &s, rule_el(first));
    ws(c, &s);
    di_gseq_push(b, &s, rule_el(next));
    nl_out(c, &s);
    lit(c, &s, "]");
    di_gb_add_alt(b, rule, s.v, s.n);
  }
  di_gseq_free(&s);
  free(pr);
  return DI_OK;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b, b = t;
  }
  return a;
}

/* Multiples of m = p / 10^d (p, d found from the value; p <= 1000, d <= 6), written without an
 * exponent: the digits of the integer part and of at most d fraction digits, read as one number
 * N = I * 10^d + F * 10^(d - |F|), must be divisible by p. A rule per (remainder of the digits so
 * far mod p, fraction digits read): a finite automaton for divisibility. Integers need only
 * I == 0 mod p / gcd(p, 10^d). The language of the multiples alone: bounds and the digits bound
 * are applied by gen_number_multiple's product. */
static di_status gen_multiple(jc *c, const cJSON *mult, int integer_only, const char *path, int rule) {
  di_gb *b = c->b;
  if (!cJSON_IsNumber(mult) || !(mult->valuedouble > 0))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'multipleOf' must be a number above 0 at %s/multipleOf", path);
  double m = mult->valuedouble, scaled = m;
  int d = 0;
  int64_t pow10 = 1;
  while (d < 6 && fabs(scaled - floor(scaled + 0.5)) > 1e-9 * scaled)
    d++, pow10 *= 10, scaled = m * (double)pow10;
  int64_t p = 0;
  if (!di_double_to_int_in(floor(scaled + 0.5), 1, 1000, &p) || fabs(scaled - (double)p) > 1e-9 * scaled)
    return unsupported(c, path, "multipleOf (only p / 10^d with p <= 1000 and d <= 6)");
  if (integer_only) { /* integral x: x * 10^d divisible by p */
    p /= gcd64(p, pow10);
    d = 0, pow10 = 1;
  }
  /* R[j][r]: j fraction digits read (j = 0: in the integer part), digits so far = r mod p */
  int P = (int)p, D = d;
  int *R = malloc(sizeof(int) * (size_t)(D + 1) * (size_t)P);
  if (!R)
    return di_error_set(DI_ERR_OOM, "out of memory");
  for (int k = 0; k < (D + 1) * P; k++)
    R[k] = di_gb_new_rule(b, "mult");
  di_gseq s = {0};
  for (int j = 0; j <= D; j++)
    for (int r = 0; r < P; r++) {
      int self = R[j * P + r];
      b->rules[self].defined = 1;
      int64_t scale = 1; /* what the missing fraction digits multiply by */
      for (int k = j; k < D; k++)
        scale *= 10;
      if ((r * scale) % P == 0)
        di_gb_add_alt(b, self, NULL, 0); /* may end here */
      if (j > 0 && j < D) /* one more fraction digit */
        for (int dig = 0; dig < 10; dig++) {
          s.n = 0;
          di_gseq_byte(b, &s, (uint8_t)('0' + dig));
          di_gseq_push(b, &s, rule_el(R[(j + 1) * P + (r * 10 + dig) % P]));
          di_gb_add_alt(b, self, s.v, s.n);
        }
      if (j == 0 && D > 0) { /* "." then the first fraction digit (a fraction ends in a nonzero digit or not at all) */
        for (int dig = 0; dig < 10; dig++) {
          s.n = 0;
          di_gseq_byte(b, &s, '.');
          di_gseq_byte(b, &s, (uint8_t)('0' + dig));
          di_gseq_push(b, &s, rule_el(R[(D >= 1 ? 1 : 0) * P + (r * 10 + dig) % P]));
          di_gb_add_alt(b, self, s.v, s.n);
        }
      }
    }
  /* the integer part: "0" or [1-9][0-9]*, digits feeding the remainder; I[r] = inside it */
  int *I = malloc(sizeof(int) * (size_t)P);
  if (!I) {
    free(R);
    di_gseq_free(&s);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (int r = 0; r < P; r++)
    I[r] = di_gb_new_rule(b, "mult_int");
  for (int r = 0; r < P; r++) {
    di_gel e = rule_el(R[r]); /* the integer part may end: on to the fraction (or the end) */
    di_gb_add_alt(b, I[r], &e, 1);
    for (int dig = 0; dig < 10; dig++) {
      s.n = 0;
      di_gseq_byte(b, &s, (uint8_t)('0' + dig));
      di_gseq_push(b, &s, rule_el(I[(r * 10 + dig) % P]));
      di_gb_add_alt(b, I[r], s.v, s.n);
    }
  }
  for (int neg = 0; neg < 2; neg++) {
    s.n = 0;
    if (neg)
      di_gseq_byte(b, &s, '-');
    int n0 = s.n;
    if (!neg) { /* "0" (and 0.x); "-0" is not written */
      di_gseq_byte(b, &s, '0');
      di_gseq_push(b, &s, rule_el(R[0]));
      di_gb_add_alt(b, rule, s.v, s.n);
    }
    for (int dig = 1; dig < 10; dig++) {
      s.n = n0;
      di_gseq_byte(b, &s, (uint8_t)('0' + dig));
      di_gseq_push(b, &s, rule_el(I[dig % P]));
      di_gb_add_alt(b, rule, s.v, s.n);
    }
  }
  di_gseq_free(&s);
  free(R);
  free(I);
  return DI_OK;
}

/* The numbers of `types` that sch's bounds (or the digits bound) admit, without multipleOf, into a
 * fresh builder: the same generators run on a context of their own. */
static di_status numbers_without_multiple(jc *c, const cJSON *sch, int types, const char *path, di_gb *g, int *root) {
  jc sub;
  di_gb_init(g, c->b->max_els);
  jc_init(&sub, g, c->opt);
  *root = di_gb_new_rule(g, "num");
  g->rules[*root].defined = 1;
  int has_bounds = item(sch, "minimum") || item(sch, "maximum") || item(sch, "exclusiveMinimum") ||
                   item(sch, "exclusiveMaximum");
  di_status st = DI_OK;
  if (types & T_NUMBER) {
    if (has_bounds) {
      st = gen_number_bounded(&sub, sch, path, *root);
    } else {
      di_gel e = rule_el(number_rule(&sub));
      st = di_gb_add_alt(g, *root, &e, 1);
    }
  } else {
    st = gen_integer(&sub, sch, path, *root);
  }
  jc_free(&sub);
  return st;
}

/* multipleOf under bounds or the digits bound: the product of the multiples' automaton and the
 * bounded numbers' one (both regular), determinised (regular_set.h) and emitted as rules. */
static di_status gen_number_multiple(jc *c, const cJSON *sch, const cJSON *mult, int types, const char *path,
                                     int rule) {
  di_gb gm, gn;
  int rm, rn, r = -1;
  di_rlang *langs[2] = {NULL, NULL};
  jc sub;
  di_gb_init(&gm, c->b->max_els);
  jc_init(&sub, &gm, c->opt);
  rm = di_gb_new_rule(&gm, "mult");
  gm.rules[rm].defined = 1;
  di_status st = gen_multiple(&sub, mult, !(types & T_NUMBER), path, rm);
  jc_free(&sub);
  if (st == DI_OK)
    st = di_rlang_from_builder(&gm, rm, &langs[0]);
  else
    di_gb_free(&gm);
  if (st == DI_OK) {
    st = numbers_without_multiple(c, sch, types, path, &gn, &rn);
    if (st == DI_OK)
      st = di_rlang_from_builder(&gn, rn, &langs[1]);
    else
      di_gb_free(&gn);
    if (st == DI_ERR_FORMAT && strstr(di_last_error(), "accepts nothing"))
      st = DI_OK; /* the bounds admit no number: langs[1] stays NULL */
  }
  if (st == DI_OK && langs[1]) {
    di_rlang_product p = {langs, 2, 3, 0, 0, 0, -1, 100000, 0, 0, 0};
    st = di_rlang_emit(c->b, &p, &r);
    if (st == DI_ERR_UNSUPPORTED)
      st = di_error_wrap(st, "json schema: multipleOf with bounds at %s", path);
  }
  if (st == DI_OK && r >= 0) {
    di_gel e = rule_el(r);
    st = di_gb_add_alt(c->b, rule, &e, 1);
  }
  di_rlang_free(langs[0]);
  di_rlang_free(langs[1]);
  return st;
}

/* Alternatives of `rule` for schema `sch` that has no anyOf/oneOf/allOf/$ref left. */
/* Annotations only, beside at most `type` "object" or "array" (XGrammar's basic any / object /
 * array, which indent lays out on one line). */
static int bare_container(const cJSON *sch) {
  static const char *ann[] = {"title", "default", "description", "examples", "deprecated", "readOnly",
                              "writeOnly", "$comment", "$schema", NULL};
  const cJSON *t = item(sch, "type");
  if (t && (!cJSON_IsString(t) || (strcmp(t->valuestring, "object") && strcmp(t->valuestring, "array"))))
    return 0;
  for (const cJSON *e = sch->child; e; e = e->next)
    if (strcmp(e->string, "type") && !in_list(e->string, ann))
      return 0;
  return 1;
}

static di_status gen_plain(jc *c, const cJSON *sch, const char *path, int rule) {
  DI_TRY(check_keywords(c, sch, path));
  int types;
  DI_TRY(get_types(sch, path, &types));
  if (cJSON_IsTrue(item(sch, DI_NONINTEGRAL_KEY))) { /* from `not {type: integer}`: non-integral numbers */
    if (!(types & T_NUMBER))
      return DI_OK;
    if (item(sch, "minimum") || item(sch, "maximum") || item(sch, "exclusiveMinimum") || item(sch, "exclusiveMaximum"))
      return unsupported(c, path, "not (of integer, beside numeric bounds)");
    int r = mk_rule_regex(c, "nonintegral", "-?(0|[1-9][0-9]*)\\.[0-9]*[1-9][0-9]*|-?[1-9](\\.[0-9]*[1-9])?[eE]-[0-9]+");
    di_gel e = rule_el(r);
    return di_gb_add_alt(c->b, rule, &e, 1);
  }
  const cJSON *en = item(sch, "enum"), *cn = item(sch, "const");
  if (en || cn) {
    if (en && !cJSON_IsArray(en))
      return di_error_set(DI_ERR_FORMAT, "json schema: 'enum' must be an array at %s/enum", path);
    for (const cJSON *v = cn ? cn : en->child; v; v = cn ? NULL : v->next) {
      if (!(value_types(v) & types))
        continue;
      if (cn && en) { /* both: the const must be in the enum */
        int in = 0;
        for (const cJSON *q = en->child; q; q = q->next)
          in |= cJSON_Compare(q, cn, 1);
        if (!in)
          continue;
      }
      di_gseq s = {0};
      emit_value_literal(c, &s, v);
      di_status st = di_gb_add_alt(c->b, rule, s.v, s.n);
      di_gseq_free(&s);
      DI_TRY(st);
    }
    return DI_OK;
  }
  di_gseq s = {0};
  if (types & T_NULL) {
    lit(c, &s, "null");
    di_gb_add_alt(c->b, rule, s.v, s.n);
    s.n = 0;
  }
  if (types & T_BOOL) {
    lit(c, &s, "true");
    di_gb_add_alt(c->b, rule, s.v, s.n);
    s.n = 0;
    lit(c, &s, "false");
    di_gb_add_alt(c->b, rule, s.v, s.n);
    s.n = 0;
  }
  di_gseq_free(&s);
  int has_bounds = item(sch, "minimum") || item(sch, "maximum") || item(sch, "exclusiveMinimum") ||
                   item(sch, "exclusiveMaximum");
  const cJSON *mult = item(sch, "multipleOf");
  if (mult && (types & (T_NUMBER | T_INTEGER))) {
    if (has_bounds || c->opt->max_digits > 0)
      DI_TRY(gen_number_multiple(c, sch, mult, types, path, rule));
    else
      DI_TRY(gen_multiple(c, mult, !(types & T_NUMBER), path, rule));
  } else if (types & T_NUMBER) {
    if (has_bounds) {
      DI_TRY(gen_number_bounded(c, sch, path, rule));
    } else {
      di_gel e = rule_el(number_rule(c));
      DI_TRY(di_gb_add_alt(c->b, rule, &e, 1));
    }
  } else if (types & T_INTEGER) {
    DI_TRY(gen_integer(c, sch, path, rule));
  }
  if (types & T_STRING)
    DI_TRY(gen_string(c, sch, path, rule));
  if (!(types & (T_ARRAY | T_OBJECT)))
    return DI_OK;
  /* containers: their items one level in; under indent a bare {"type": "object" / "array"} is
   * laid out on one line, as XGrammar's basic rules are */
  int bare = c->indent && bare_container(sch);
  c->compact += bare;
  if (++c->level > DI_GRAMMAR_MAX_INDENT_LEVELS && c->indent && !c->compact) {
    c->level--, c->compact -= bare;
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "json schema: indent lays out at most %d nesting levels; deeper at %s (a recursive "
                        "schema cannot be laid out by level)",
                        DI_GRAMMAR_MAX_INDENT_LEVELS, path);
  }
  di_status st = DI_OK;
  if (types & T_ARRAY)
    st = gen_array(c, sch, path, rule);
  if (st == DI_OK && (types & T_OBJECT))
    st = gen_object(c, sch, path, rule);
  c->level--, c->compact -= bare;
  return st;
}

/* A copy of `sch` (owned by the compile) for a rewrite, with its allOf array (created if absent). */
static di_status copy_with_allof(jc *c, const cJSON *sch, const char *path, cJSON **rw_out, cJSON **all_out) {
  cJSON *rw = cJSON_Duplicate(sch, 1);
  if (!rw || !own(c, rw))
    return di_error_set(DI_ERR_OOM, "out of memory");
  cJSON *all = item(rw, "allOf");
  if (!all)
    all = cJSON_AddArrayToObject(rw, "allOf");
  if (!cJSON_IsArray(all))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'allOf' must be an array at %s/allOf", path);
  *rw_out = rw;
  *all_out = all;
  return DI_OK;
}

/* dependentRequired / dependentSchemas (and draft 7's dependencies) as what they mean for each
 * trigger name k: either k is absent (properties: {k: false}) or it is present together with its
 * dependencies (required: [k, deps...]) or its schema (allOf: [{required: [k]}, S]). *out is `sch`
 * without those keywords and with one anyOf per trigger added to its allOf. */
static di_status rewrite_dependencies(jc *c, const cJSON *sch, const char *path, cJSON **out) {
  cJSON *rw, *all;
  DI_TRY(copy_with_allof(c, sch, path, &rw, &all));
  static const char *kws[] = {"dependentRequired", "dependentSchemas", "dependencies"};
  for (int k = 0; k < 3; k++) {
    const cJSON *dep = item(sch, kws[k]);
    if (!dep)
      continue;
    if (!cJSON_IsObject(dep))
      return di_error_set(DI_ERR_FORMAT, "json schema: '%s' must be an object at %s/%s", kws[k], path, kws[k]);
    for (const cJSON *d = dep->child; d; d = d->next) {
      int is_list = cJSON_IsArray(d);
      if ((k == 0 && !is_list) || (k == 1 && is_list))
        return di_error_set(DI_ERR_FORMAT, "json schema: '%s/%s' must be %s at %s", kws[k], d->string,
                            k == 0 ? "an array of names" : "a schema", path);
      cJSON *choice = cJSON_CreateObject(), *alts = cJSON_AddArrayToObject(choice, "anyOf");
      cJSON *absent = cJSON_CreateObject(), *ap = cJSON_AddObjectToObject(absent, "properties");
      cJSON_AddFalseToObject(ap, d->string);
      cJSON_AddItemToArray(alts, absent);
      cJSON *present = cJSON_CreateObject(), *req = cJSON_AddArrayToObject(present, "required");
      cJSON_AddItemToArray(req, cJSON_CreateString(d->string));
      if (is_list) {
        for (const cJSON *n = d->child; n; n = n->next)
          if (cJSON_IsString(n))
            cJSON_AddItemToArray(req, cJSON_CreateString(n->valuestring));
      } else {
        cJSON *both = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(both, "allOf");
        cJSON_AddItemToArray(arr, present);
        cJSON_AddItemToArray(arr, cJSON_Duplicate(d, 1));
        present = both;
      }
      cJSON_AddItemToArray(alts, present);
      cJSON_AddItemToArray(all, choice);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(rw, kws[k]);
  }
  *out = rw;
  return DI_OK;
}

/* `not` and `if`/`then`/`else` as what they mean, with the complement of json_schema_not.c:
 * not X = allOf [complement(X)]; if I then T else E = anyOf [allOf [I, T], allOf [complement(I), E]]
 * (a missing then / else is true; then / else without if mean nothing). *out is `sch` without
 * those keywords and with the result in its allOf. */
static di_status rewrite_not_if(jc *c, const cJSON *sch, const char *path, cJSON **out) {
  cJSON *rw, *all;
  DI_TRY(copy_with_allof(c, sch, path, &rw, &all));
  char why[128] = "";
  const cJSON *nt = item(sch, "not"), *ifs = item(sch, "if");
  if (nt) {
    cJSON *neg = NULL;
    if (di_json_schema_negate(nt, &neg, why, sizeof why) == 0)
      cJSON_AddItemToArray(all, neg);
    else if (!c->opt->ignore_unsupported_keywords)
      return di_error_set(DI_ERR_UNSUPPORTED,
                          "json schema: unsupported keyword 'not' at %s (no complement for its '%s')", path, why);
    cJSON_DeleteItemFromObjectCaseSensitive(rw, "not");
  }
  if (ifs) {
    cJSON *neg = NULL;
    if (di_json_schema_negate(ifs, &neg, why, sizeof why) != 0) {
      if (!c->opt->ignore_unsupported_keywords)
        return di_error_set(DI_ERR_UNSUPPORTED,
                            "json schema: unsupported keyword 'if' at %s (no complement for its '%s')", path, why);
      ifs = NULL; /* skipped */
    }
    if (ifs) {
    const cJSON *th = item(sch, "then"), *el = item(sch, "else");
    cJSON *choice = cJSON_CreateObject(), *alts = cJSON_AddArrayToObject(choice, "anyOf");
    cJSON *yes = cJSON_CreateObject(), *ya = cJSON_AddArrayToObject(yes, "allOf");
    cJSON_AddItemToArray(ya, cJSON_Duplicate(ifs, 1));
    cJSON_AddItemToArray(ya, th ? cJSON_Duplicate(th, 1) : cJSON_CreateTrue());
    cJSON *no = cJSON_CreateObject(), *na = cJSON_AddArrayToObject(no, "allOf");
    cJSON_AddItemToArray(na, neg);
    cJSON_AddItemToArray(na, el ? cJSON_Duplicate(el, 1) : cJSON_CreateTrue());
    cJSON_AddItemToArray(alts, yes);
    cJSON_AddItemToArray(alts, no);
    cJSON_AddItemToArray(all, choice);
    }
  }
  cJSON_DeleteItemFromObjectCaseSensitive(rw, "if");
  cJSON_DeleteItemFromObjectCaseSensitive(rw, "then");
  cJSON_DeleteItemFromObjectCaseSensitive(rw, "else");
  *out = rw;
  return DI_OK;
}

/* Compiles schema `sch` into a rule (memoised by node, so recursive $refs work). *rule_out = -1
 * when the schema admits no value (false, or empty intersections). */
static di_status gen(jc *c, const cJSON *sch, const char *path, int *rule_out) {
  if (cJSON_IsTrue(sch)) {
    *rule_out = any_rule(c);
    return DI_OK;
  }
  if (cJSON_IsFalse(sch)) {
    *rule_out = -1;
    return DI_OK;
  }
  if (!cJSON_IsObject(sch))
    return di_error_set(DI_ERR_FORMAT, "json schema: a schema must be an object or a boolean at %s", *path ? path : "#");
  int m = memo_find(c, sch);
  if (m >= 0) {
    *rule_out = m;
    return DI_OK;
  }
  if (++c->depth > 200)
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: nested too deeply at %s", path);
  di_gb *b = c->b;
  int rule = di_gb_new_rule(b, "schema");
  if (b->oom)
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  if (c->nmemo == c->capmemo) {
    int nc = c->capmemo ? c->capmemo * 2 : 32;
    memo_t *q = realloc(c->memo, sizeof *q * (size_t)nc);
    if (!q)
      return di_error_set(DI_ERR_OOM, "out of memory");
    c->memo = q;
    c->capmemo = nc;
  }
  c->memo[c->nmemo++] = (memo_t){sch, rule, c->level};
  b->rules[rule].defined = 1;
  di_status st = DI_OK;
  const cJSON *ref = item(sch, "$ref"), *all = item(sch, "allOf"), *any = item(sch, "anyOf"), *one = item(sch, "oneOf");
  int has_not_if = item(sch, "not") || item(sch, "if") || item(sch, "then") || item(sch, "else");
  if (has_not_if || item(sch, "dependentRequired") || item(sch, "dependentSchemas") || item(sch, "dependencies")) {
    cJSON *rw = NULL;
    int r = -1;
    st = has_not_if ? rewrite_not_if(c, sch, path, &rw) : rewrite_dependencies(c, sch, path, &rw);
    if (st == DI_OK)
      st = gen(c, rw, path, &r);
    if (st == DI_OK && r >= 0) {
      di_gel e = rule_el(r);
      st = di_gb_add_alt(b, rule, &e, 1);
    }
  } else if (ref) {
    const cJSON *t;
    st = deref(c, sch, path, &t);
    if (st == DI_OK) {
      int r;
      st = gen(c, t, path, &r);
      if (st == DI_OK && r >= 0) {
        di_gel e = rule_el(r);
        st = di_gb_add_alt(b, rule, &e, 1);
      }
    }
  } else if (all) {
    if (!cJSON_IsArray(all)) {
      st = di_error_set(DI_ERR_FORMAT, "json schema: 'allOf' must be an array at %s/allOf", path);
    } else {
      cJSON *base = cJSON_Duplicate(sch, 1);
      if (!base || !own(c, base)) {
        st = di_error_set(DI_ERR_OOM, "out of memory");
      } else {
        cJSON_DeleteItemFromObjectCaseSensitive(base, "allOf");
        cJSON *acc = base;
        for (const cJSON *e = all->child; e && st == DI_OK; e = e->next)
          st = merge(c, acc, e, 0, path, &acc);
        int r;
        if (st == DI_OK)
          st = gen(c, acc, path, &r);
        if (st == DI_OK && r >= 0) {
          di_gel e = rule_el(r);
          st = di_gb_add_alt(b, rule, &e, 1);
        }
      }
    }
  } else if (any || one) {
    const cJSON *arr = any ? any : one;
    const char *kw = any ? "anyOf" : "oneOf";
    if (any && (item(sch, "unevaluatedProperties") || item(sch, "unevaluatedItems")) &&
        !c->opt->ignore_unsupported_keywords) {
      /* what is evaluated depends on every anyOf branch that matches, not on one */
      st = unsupported(c, path, item(sch, "unevaluatedProperties") ? "unevaluatedProperties" : "unevaluatedItems");
    } else if (!cJSON_IsArray(arr)) {
      st = di_error_set(DI_ERR_FORMAT, "json schema: '%s' must be an array at %s/%s", kw, path, kw);
    } else {
      cJSON *base = cJSON_Duplicate(sch, 1);
      if (!base || !own(c, base)) {
        st = di_error_set(DI_ERR_OOM, "out of memory");
      } else {
        cJSON_DeleteItemFromObjectCaseSensitive(base, kw);
        int siblings = 0;
        for (const cJSON *e = base->child; e; e = e->next)
          if (!in_list(e->string, ANNOTATIONS))
            siblings = 1;
        int k = 0;
        for (const cJSON *e = arr->child; e && st == DI_OK; e = e->next, k++) {
          if (++c->branches > c->opt->max_branches) {
            st = di_error_set(DI_ERR_UNSUPPORTED,
                              "json schema: anyOf/oneOf/allOf expansion exceeds %d branches at %s (raise max_branches)",
                              c->opt->max_branches, path);
            break;
          }
          char sub[1200];
          snprintf(sub, sizeof sub, "%s/%s/%d", path, kw, k);
          const cJSON *branch = e;
          if (siblings) {
            cJSON *mm;
            st = merge(c, base, e, 0, sub, &mm);
            branch = mm;
          }
          int r = -1;
          if (st == DI_OK)
            st = gen(c, branch, sub, &r);
          if (st == DI_OK && r >= 0) {
            di_gel el = rule_el(r);
            st = di_gb_add_alt(b, rule, &el, 1);
          }
        }
      }
    }
  } else {
    st = gen_plain(c, sch, path, rule);
  }
  c->depth--;
  if (st != DI_OK)
    return st;
  if (b->oom)
    return di_error_set(DI_ERR_OOM, "out of memory");
  if (b->total_els > b->max_els)
    return di_error_set(DI_ERR_UNSUPPORTED, "json schema: grammar too large (more than %d elements) at %s", b->max_els,
                        path);
  *rule_out = rule; /* possibly without alternatives: pruned as unproductive by di_gb_finish */
  return DI_OK;
}

di_status di_json_schema_compile(di_gb *b, const char *src, size_t len, const di_grammar_options *opt) {
  int r = -1;
  char why_empty[400] = "";
  DI_TRY(di_json_schema_compile_into(b, src, len, opt, &r, why_empty, sizeof why_empty));
  int top = di_gb_new_rule(b, "root");
  if (b->oom)
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  b->rules[top].defined = 1;
  di_status st = DI_OK;
  if (r >= 0) {
    di_gel e = rule_el(r);
    st = di_gb_add_alt(b, top, &e, 1);
  }
  if (st == DI_OK)
    st = di_gb_finish(b, top);
  if (st != DI_OK && strstr(di_last_error(), "accepts nothing"))
    st = di_error_set(DI_ERR_FORMAT, "json schema: no JSON value satisfies the schema%s%s",
                      why_empty[0] ? ": " : "", why_empty);
  return st;
}

/* llguidance's compile options inside the root schema (`"x-guidance": {...}`, its
 * JsonCompileOptions; llguidance reads them at the root only). The ones that mean what this
 * front-end does are taken: json_allow_general_unicode_escapes true (every JSON spelling of a
 * character in a string without a pattern, our only behaviour) and lenient (unsupported keywords
 * and formats ignored: ignore_unsupported_keywords). Any other option, or another value, would change
 * the language in a way not implemented here (json_allowed_escapes: which escapes to write), so it
 * is an error naming it rather than silently ignored (which accepted escapes the schema's author
 * had excluded). */
/* With json_allowed_escapes, the strings this front-end spells in one canonical form (const / enum
 * values, property names, pattern and format strings) would have to follow the option too: until
 * they do, a schema with a pattern or format, or with such a literal needing an escape, is refused.
 * Annotations (title, description, ...) are not written, so their text does not matter. */
static int needs_escape(const char *t) {
  for (; t && *t; t++)
    if (*t == '"' || *t == '\\' || (unsigned char)*t < 0x20)
      return 1;
  return 0;
}

static int any_needs_escape(const cJSON *j) { /* a string value or an object key anywhere in j */
  if (cJSON_IsString(j) && needs_escape(j->valuestring))
    return 1;
  for (const cJSON *e = j->child; e; e = e->next)
    if ((e->string && needs_escape(e->string)) || any_needs_escape(e))
      return 1;
  return 0;
}

static const char *escapes_conflict(const cJSON *j) {
  static const char *annotations[] = {"title", "description", "$comment", "examples", "default", "$id",
                                            "$schema", "$anchor", "$ref", "$dynamicRef", "x-guidance", NULL};
  for (const cJSON *e = j ? j->child : NULL; e; e = e->next) {
    const char *k = cJSON_IsObject(j) ? e->string : NULL;
    if (k && in_list(k, annotations))
      continue;
    if (k && (strcmp(k, "pattern") == 0 || strcmp(k, "patternProperties") == 0 || strcmp(k, "format") == 0))
      return k;
    if (k && (strcmp(k, "const") == 0 || strcmp(k, "enum") == 0 || strcmp(k, "required") == 0 ||
              strcmp(k, "dependentRequired") == 0)) {
      if (any_needs_escape(e))
        return "a const / enum value or a required name needing an escape";
      continue;
    }
    if (k && cJSON_IsObject(e) &&
        (strcmp(k, "properties") == 0 || strcmp(k, "$defs") == 0 || strcmp(k, "definitions") == 0 ||
         strcmp(k, "dependentSchemas") == 0)) { /* schemas keyed by names, not keywords */
      for (const cJSON *n = e->child; n; n = n->next) {
        if (strcmp(k, "properties") == 0 && needs_escape(n->string))
          return "a property name needing an escape";
        const char *w = escapes_conflict(n);
        if (w)
          return w;
      }
      continue;
    }
    const char *w = escapes_conflict(e);
    if (w)
      return w;
  }
  return NULL;
}

static di_status x_guidance_options(const cJSON *root, const di_grammar_options *in, di_grammar_options *out,
                                    const char **escapes) {
  *escapes = NULL;
  if (in)
    *out = *in;
  else
    memset(out, 0, sizeof *out);
  const cJSON *xg = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "x-guidance") : NULL;
  if (!xg)
    return DI_OK;
  if (!cJSON_IsObject(xg))
    return di_error_set(DI_ERR_FORMAT, "json schema: 'x-guidance' must be an object at #/x-guidance");
  for (const cJSON *e = xg->child; e; e = e->next) {
    if (strcmp(e->string, "json_allow_general_unicode_escapes") == 0 && cJSON_IsTrue(e))
      continue;
    if (strcmp(e->string, "json_allowed_escapes") == 0 && cJSON_IsString(e)) {
      for (const char *l = e->valuestring; *l; l++)
        if (!strchr("nrbtf\"u\\", *l))
          return di_error_set(DI_ERR_FORMAT,
                              "json schema: x-guidance json_allowed_escapes: '%c' is not a JSON escape letter "
                              "(nrbtf\"u\\) at #/x-guidance/json_allowed_escapes", *l);
      const char *w = escapes_conflict(root);
      if (w)
        return di_error_set(DI_ERR_UNSUPPORTED,
                            "json schema: x-guidance option 'json_allowed_escapes' beside '%s' is not supported "
                            "(that text is spelled in one canonical form) at #/x-guidance/json_allowed_escapes",
                            w);
      *escapes = e->valuestring;
      continue;
    }
    if (strcmp(e->string, "lenient") == 0 && cJSON_IsBool(e)) {
      if (cJSON_IsTrue(e))
        out->ignore_unsupported_keywords = 1;
      continue;
    }
    return di_error_set(DI_ERR_UNSUPPORTED,
                        "json schema: x-guidance option '%s'%s is not supported at #/x-guidance/%s", e->string,
                        strcmp(e->string, "json_allow_general_unicode_escapes") == 0 ? " other than true" : "",
                        e->string);
  }
  return DI_OK;
}

di_status di_json_schema_compile_into(di_gb *b, const char *src, size_t len, const di_grammar_options *opt, int *rule,
                                      char *why_empty, size_t why_cap) {
  /* cJSON strings are NUL-terminated: a schema string holding U+0000 would be silently cut */
  for (size_t i = 0; i + 6 <= len; i++)
    if (src[i] == '\\' && (src[i + 1] == 'u' || src[i + 1] == 'U') && memcmp(src + i + 2, "0000", 4) == 0 &&
        (i == 0 || src[i - 1] != '\\'))
      return di_error_set(DI_ERR_UNSUPPORTED, "json schema: strings containing U+0000 are not supported (offset %zu)", i);
  cJSON *root = NULL;
  DI_TRY(di_json_parse(src, len, "json schema", &root));
  di_grammar_options xg_opt;
  const char *escapes = NULL;
  di_status xst = x_guidance_options(root, opt, &xg_opt, &escapes);
  if (xst != DI_OK) {
    cJSON_Delete(root);
    return xst;
  }
  opt = &xg_opt;
  jc c;
  jc_init(&c, b, opt);
  c.escapes = escapes;
  c.root = root;
  *rule = -1;
  di_status st = gen(&c, root, "#", rule);
  if (why_cap)
    snprintf(why_empty, why_cap, "%s", c.why_empty);
  jc_free(&c);
  cJSON_Delete(root);
  return st;
}

di_status di_json_any_compile(di_gb *b, const di_grammar_options *opt) {
  /* json_object mode: the top level is an object */
  jc c;
  jc_init(&c, b, opt);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "type", "object");
  cJSON_AddTrueToObject(o, "additionalProperties");
  c.root = o;
  int r = -1;
  di_status st = gen(&c, o, "#", &r);
  if (st == DI_OK) {
    int top = di_gb_new_rule(b, "root");
    di_gel e = rule_el(r);
    st = di_gb_add_alt(b, top, &e, 1);
    if (st == DI_OK)
      st = di_gb_finish(b, top);
  }
  jc_free(&c);
  cJSON_Delete(o);
  return st;
}
