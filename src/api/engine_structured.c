/* Structured outputs for the engine: compiles a request's json_schema / regex / grammar /
 * json_object with the grammar engine (compiled grammars are cached by content there) and keeps
 * one matcher per request sample. The token vocabulary for masks is built once per engine from
 * the tokenizer: padding ids beyond the tokenizer and special tokens other than the stop ids have
 * no bytes, so a mask never allows them. */
#include "api/engine_api.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
#include <stdlib.h>
#include <string.h>

typedef struct constraint_state {
  di_grammar *g;
  di_grammar_matcher *m;
} constraint_state;

static di_status build_vocab(di_engine_text_ctx *c) {
  if (c->gvocab) return DI_OK;
  int n = c->model_vocab;
  const char **bytes = calloc((size_t)n, sizeof *bytes);
  size_t *lens = calloc((size_t)n, sizeof *lens);
  if (!bytes || !lens) {
    free(bytes); free(lens);
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar vocabulary");
  }
  int tv = di_tokenizer_vocab_size(c->tok);
  for (int i = 0; i < n && i < tv; i++) {
    int is_stop = 0;
    for (int k = 0; k < c->n_eos; k++) is_stop |= c->eos[k] == i;
    if (di_tokenizer_is_special(c->tok, i) && !is_stop) continue;
    bytes[i] = di_tokenizer_token_bytes(c->tok, i, &lens[i]);
  }
  di_status st = di_grammar_vocab_create(n, bytes, lens, c->eos, c->n_eos, &c->gvocab);
  free(bytes);
  free(lens);
  return st;
}

_Static_assert(DI_MAX_INDENT == DI_GRAMMAR_MAX_INDENT, "the request's indent bound is the grammar's");

/* A request's separator (NULL = the default) into the options' fixed field; its content is
 * checked by the grammar compiler (",", ":" with JSON whitespace around it). */
static di_status copy_separator(char dst[8], const char *src, const char *name) {
  if (!src) return DI_OK;
  size_t n = strlen(src);
  if (n >= 8) return di_error_set(DI_ERR_INVALID_ARG, "structured output: %s is at most 7 bytes", name);
  memcpy(dst, src, n + 1);
  return DI_OK;
}

static di_status c_create(void *ctx, const di_request_params *p, void **state) {
  di_engine_text_ctx *c = ctx;
  DI_TRY(build_vocab(c));
  di_grammar_kind kind;
  const char *src;
  if (p->json_schema) { kind = DI_GRAMMAR_JSON_SCHEMA; src = p->json_schema; }
  else if (p->regex) { kind = DI_GRAMMAR_REGEX; src = p->regex; }
  else if (p->grammar) { kind = p->grammar_syntax == 1 ? DI_GRAMMAR_LARK : DI_GRAMMAR_EBNF; src = p->grammar; }
  else { kind = DI_GRAMMAR_JSON_ANY; src = ""; }
  if (p->grammar_syntax != 0 && p->grammar_syntax != 1)
    return di_error_set(DI_ERR_INVALID_ARG, "structured output: grammar_syntax must be 0 (GBNF) or 1 (Lark)");
  di_grammar_options opt = {0};
  opt.strict = p->json_strict;
  opt.max_digits = p->max_digits;
  opt.max_string_length = p->max_string_length;
  DI_TRY(copy_separator(opt.item_separator, p->item_separator, "item_separator"));
  DI_TRY(copy_separator(opt.key_separator, p->key_separator, "key_separator"));
  if (p->max_whitespace < 0 || p->max_whitespace > DI_MAX_WHITESPACE)
    return di_error_set(DI_ERR_INVALID_ARG, "structured output: max_whitespace must be 0..%d, got %d",
                        DI_MAX_WHITESPACE, p->max_whitespace);
  opt.max_whitespace = p->max_whitespace;
  if (p->indent < 0 || p->indent > DI_MAX_INDENT)
    return di_error_set(DI_ERR_INVALID_ARG, "structured output: indent must be 0..%d spaces, got %d", DI_MAX_INDENT,
                        p->indent);
  if (p->indent && !p->json_schema)
    return di_error_set(DI_ERR_INVALID_ARG, "structured output: indent applies to a JSON schema only");
  opt.indent = p->indent;
  constraint_state *s = calloc(1, sizeof *s);
  if (!s) return di_error_set(DI_ERR_OOM, "out of memory");
  di_status st = di_grammar_compile(kind, src, strlen(src), &opt, &s->g);
  if (st == DI_OK) st = di_grammar_matcher_create(s->g, c->gvocab, &s->m);
  if (st != DI_OK) {
    di_grammar_free(s->g);
    free(s);
    return di_error_wrap(st, "structured output");
  }
  *state = s;
  return DI_OK;
}

static di_status c_fill(void *state, uint32_t *mask) {
  return di_grammar_matcher_fill_mask(((constraint_state *)state)->m, mask);
}
static di_status c_accept(void *state, int32_t id) {
  di_status st = di_grammar_matcher_accept_token(((constraint_state *)state)->m, id);
  return st == DI_OK ? st : di_error_wrap(st, "structured output");
}
static di_status c_rollback(void *state, int n) {
  return di_grammar_matcher_rollback(((constraint_state *)state)->m, n);
}
static int c_terminated(void *state) { return di_grammar_matcher_is_terminated(((constraint_state *)state)->m); }
static void c_free(void *state) {
  constraint_state *s = state;
  di_grammar_matcher_free(s->m);
  di_grammar_free(s->g);
  free(s);
}

void di_engine_constraint_ops(di_engine_text_ctx *c, di_constraint_ops *ops) {
  *ops = (di_constraint_ops){c, c_create, c_fill, c_accept, c_terminated, c_free, c_rollback};
}
