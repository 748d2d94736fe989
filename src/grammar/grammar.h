/* Structured outputs: one grammar engine (a byte-level pushdown automaton, determinised lazily)
 * with three front-ends (GBNF-style EBNF, regex, JSON Schema) and token masks over a vocabulary.
 * This is the interface the sampler/engine uses; see docs/structured-outputs.md for the policies. */
#ifndef DI_GRAMMAR_H
#define DI_GRAMMAR_H
#include <stddef.h>
#include <stdint.h>
#include "util/status.h"

/* A compiled grammar: immutable as far as callers can tell (its lazily built automaton caches
 * are guarded by a mutex), refcounted, shareable across threads. */
typedef struct di_grammar di_grammar;
typedef enum {
  DI_GRAMMAR_EBNF,        /* GBNF dialect (llama.cpp): the start rule is `root` */
  DI_GRAMMAR_REGEX,       /* whole-output match */
  DI_GRAMMAR_JSON_SCHEMA, /* a JSON Schema (draft 2020-12 subset) as JSON text */
  DI_GRAMMAR_JSON_ANY,    /* any JSON object (OpenAI json_object mode); source ignored */
  DI_GRAMMAR_LARK         /* Lark (llguidance's dialect): the start rule is `start` */
} di_grammar_kind;

/* Default generation bounds for JSON values the schema leaves unbounded (docs/structured-outputs.md,
 * "No runaway values"): digits of an integer (or of a number's integer part and fraction; 3 in an
 * exponent), and characters (code points, as maxLength counts them) of a string whose schema gives
 * it no maxLength, enum or const: string values, strings under a pattern or format, the keys of free
 * members (any JSON's, additionalProperties', propertyNames', patternProperties' names) and a
 * minLength-only string (never below its minLength; a pattern string with a minLength above the
 * bound stays unbounded). Since session 16 the bound is a character counter the matcher keeps
 * beside the automaton state (string_bound.h), not a counted repetition in the grammar: masks equal
 * the unbounded ones except within a token's length of the bound (PERFORMANCE.md, "Session 16,
 * s16-23"). Lark max_chars bodies keep it written into the grammar (their products copy rules). */
enum { DI_GRAMMAR_DEFAULT_MAX_DIGITS = 16, DI_GRAMMAR_DEFAULT_MAX_STRING_LENGTH = 4096 };

typedef struct di_grammar_options {
  int ignore_unsupported_keywords; /* JSON Schema: 1 = skip keywords it cannot enforce instead of failing
                                      (keywords JSON Schema does not define are always ignored) */
  int max_whitespace;              /* JSON: whitespace chars allowed between tokens (0 = compact) */
  int max_branches;                /* JSON Schema: bound on anyOf/oneOf/allOf expansion (0 = 256) */
  int max_elements;                /* bound on the compiled grammar's size (0 = 2,000,000) */
  int no_cache;                    /* 1 = compile afresh, bypassing the content cache (benchmarks) */
  int strict;                      /* JSON Schema: XGrammar's strict mode: an object schema without
                                      additionalProperties admits no other properties (0 = JSON
                                      Schema's default: it admits any) */
  int max_digits;                  /* JSON: digits of a number the schema does not bound (0 = default
                                      DI_GRAMMAR_DEFAULT_MAX_DIGITS, -1 = unbounded) */
  int max_string_length;           /* JSON: characters of a string without maxLength, pattern and
                                      format strings and keys included (0 = default
                                      DI_GRAMMAR_DEFAULT_MAX_STRING_LENGTH, -1 = unbounded) */
  char item_separator[8];          /* JSON: the text between array items and object members: ","
                                      with JSON whitespace around it ("" = ","), as XGrammar's
                                      separators (", " with any_whitespace=False); whitespace slots
                                      of max_whitespace still apply beside it (0 for exact text) */
  char key_separator[8];           /* JSON: the text between a key and its value, ":" with JSON
                                      whitespace around it ("" = ":") */
  char root_rule[32];              /* EBNF: the start rule's name ("" = root), XGrammar's
                                      root_rule_name */
  int indent;                      /* JSON Schema: XGrammar's `indent` layout (0 = one line, the
                                      default; 1..DI_GRAMMAR_MAX_INDENT spaces per nesting level):
                                      a newline and the level's spaces after "[" / "{" and each
                                      item separator, before the closing bracket; separators ","
                                      and ": " unless given; empty containers and unconstrained
                                      values ({}, bare {"type": "object" / "array"}, const / enum)
                                      on one line with ", " / ": "; needs max_whitespace 0 */
} di_grammar_options;

/* di_grammar_options.indent's bounds: spaces per level, and nesting levels laid out (a recursive
 * schema nests without end, so it cannot be laid out by level: refused past this depth) */
enum { DI_GRAMMAR_MAX_INDENT = 16, DI_GRAMMAR_MAX_INDENT_LEVELS = 32 };

/* Compiles `source` (`len` bytes). Errors carry a position ("line 3, column 7" / "offset 12" /
 * a JSON pointer for schemas). The result is cached by (kind, content, options): compiling the
 * same text again returns the same grammar with its reference count raised. opt may be NULL. */
di_status di_grammar_compile(di_grammar_kind kind, const char *source, size_t len,
                             const di_grammar_options *opt, di_grammar **out);
/* The same by the syntax's name, for API surfaces that carry it as text (OpenAI custom tools'
 * `format: {type: "grammar", syntax: ...}`, `grammar_syntax`): "lark", "regex", "gbnf" (or
 * "ebnf"), "json_schema"; anything else is DI_ERR_INVALID_ARG naming it. */
di_status di_grammar_compile_syntax(const char *syntax, const char *source, size_t len, const di_grammar_options *opt,
                                    di_grammar **out);
/* Drops one reference; NULL is a no-op. */
void di_grammar_free(di_grammar *g);
/* Empties the cache of compiled grammars (the cache's references dropped; a grammar held elsewhere
 * lives on). Their automata and mask caches grow lazily as inputs reach new states, so a test that
 * counts allocations (test_alloc_failures) empties it to compare runs. */
void di_grammar_cache_clear(void);
/* 1 when the grammar accepts all `len` bytes of s as a whole output, 0 otherwise (also 0 if the
 * automaton's state budget ran out, with di_last_error() saying so). */
int di_grammar_accepts(const di_grammar *g, const char *s, size_t len);
/* Number of rules / elements after compilation (for tests and the benchmark). */
int di_grammar_num_elements(const di_grammar *g);
/* Writes the compiled grammar as GBNF-like text (debugging aid; `deepinfer grammar --print`). */
void di_grammar_print(const di_grammar *g, FILE *f);

/* Vocabulary: the raw bytes of each token id + which ids end generation. Built once per
 * tokenizer; immutable, shareable. Ids with no bytes (NULL or length 0) are never allowed. Stop
 * ids are allowed exactly when the grammar can end, whatever their bytes. A token of more than
 * 65,535 bytes is refused (DI_ERR_INVALID_ARG). */
typedef struct di_grammar_vocab di_grammar_vocab;
di_status di_grammar_vocab_create(int vocab_size, const char *const *token_bytes, const size_t *token_lens,
                                  const int32_t *stop_ids, int n_stop, di_grammar_vocab **out);
/* After every matcher made with v is freed; v's mask caches leave the grammars that hold them. */
void di_grammar_vocab_free(di_grammar_vocab *v);
int di_grammar_vocab_size(const di_grammar_vocab *v);
/* The vocabulary of a loaded tokenizer (src/tokenizer/tokenizer.h): each id's generated bytes;
 * special tokens get none (never allowed) except the stop ids: the tokenizer's EOS plus
 * `extra_stop_ids`. vocab_size >= the tokenizer's (a model's padded vocabulary; ids beyond the
 * tokenizer have no bytes); 0 = the tokenizer's own size. */
struct di_tokenizer;
di_status di_grammar_vocab_from_tokenizer(const struct di_tokenizer *t, int vocab_size, const int32_t *extra_stop_ids,
                                          int n_extra, di_grammar_vocab **out);

/* Per-request state. The grammar and the vocabulary must outlive the matcher. A matcher is used
 * by one thread at a time; matchers of one grammar on different threads share its caches. */
typedef struct di_grammar_matcher di_grammar_matcher;
di_status di_grammar_matcher_create(const di_grammar *g, const di_grammar_vocab *v, di_grammar_matcher **out);
void di_grammar_matcher_free(di_grammar_matcher *m);
/* bitmask: ceil(vocab_size/32) uint32 words, bit i set = token i allowed. Stop ids allowed
 * exactly when the grammar can end here. After termination only stop ids... nothing is allowed. */
di_status di_grammar_matcher_fill_mask(di_grammar_matcher *m, uint32_t *bitmask);
/* Advances by one token; an error (DI_ERR_INVALID_ARG) if the grammar does not allow it, and then
 * the state is unchanged. */
di_status di_grammar_matcher_accept_token(di_grammar_matcher *m, int32_t id);
/* Advances by raw bytes (e.g. a forced prefix); all-or-nothing like accept_token. Counts as one
 * step for rollback. */
di_status di_grammar_matcher_accept_bytes(di_grammar_matcher *m, const char *s, size_t len);
/* Undoes the last n accepted steps (0 <= n <= number accepted). */
di_status di_grammar_matcher_rollback(di_grammar_matcher *m, int n_tokens);
int di_grammar_matcher_num_accepted(const di_grammar_matcher *m);
void di_grammar_matcher_reset(di_grammar_matcher *m);
int di_grammar_matcher_is_terminated(const di_grammar_matcher *m); /* a stop token was accepted */
int di_grammar_matcher_can_end(const di_grammar_matcher *m);
#endif
