/* Regular languages as sets (regular_set.c): a regex determinised on its own, so that the JSON
 * Schema front-end can take complements, intersections and a character count of regular
 * languages (patternProperties: names matching none of the patterns; pattern / format with
 * minLength / maxLength) and emit the result as ordinary IR rules. */
#ifndef DI_GRAMMAR_REGULAR_SET_H
#define DI_GRAMMAR_REGULAR_SET_H
#include <stddef.h>
#include "grammar/gram_ir.h"

typedef struct di_rlang di_rlang;

/* The regex as a language of its own (the arguments of di_regex_compile_into). */
di_status di_rlang_regex(const char *re, size_t len, int json_string, int anchored, di_rlang **out);
/* The language of rule `root` of a builder the caller filled (it must be regular: no recursion
 * but in tail position). Takes the builder's contents, on failure too; *g is left empty. */
di_status di_rlang_from_builder(di_gb *g, int root, di_rlang **out);
/* The language of exactly the given byte strings (e.g. JSON-escaped property names). */
di_status di_rlang_literals(const char *const *s, int n, di_rlang **out);
void di_rlang_free(di_rlang *l);
/* 1 when the whole of s is in the language, 0 when not, -1 past the automaton's budget. */
int di_rlang_contains(di_rlang *l, const char *s, size_t n);

/* The product of langs[0..k): a string is emitted when every language in bit mask `in` contains it
 * and none in `out` does, and, when count_chars, it has min_chars..max_chars (max < 0: no
 * maximum) characters counted as a JSON string body counts them (an escape is one character;
 * the languages must then spell text as json_string regexes do). The product is determinised
 * (at most max_states states, else DI_ERR_UNSUPPORTED) and written into b as rules; *rule is -1
 * when no string qualifies. */
typedef struct di_rlang_product {
  di_rlang **langs;
  int k;
  unsigned in, out;
  int count_chars, min_chars, max_chars;
  int max_states;
  int shortest; /* keep only strings no proper prefix of which qualifies (a lazy match) */
  int count_plain; /* with count_chars: count UTF-8 characters of plain text (no JSON escapes) */
  int token_copies; /* > 0: write the rules that many times for a max_tokens bound (emit_rules) */
} di_rlang_product;
di_status di_rlang_emit(di_gb *b, const di_rlang_product *p, int *rule);

/* Replaces the alternatives of rule r of b (not finished) by its shortest matches: the strings of
 * r's language no proper prefix of which is in it (Lark's lazy rules). r's language must be
 * regular; DI_ERR_UNSUPPORTED naming `what` when it is not (or too large). */
di_status di_rlang_make_lazy(di_gb *b, int r, const char *what);
/* Replaces rule r's alternatives by its strings of at most max_chars UTF-8 characters (Lark's
 * max_chars); r must be regular, as for di_rlang_make_lazy. */
di_status di_rlang_bound_chars(di_gb *b, int r, int max_chars, const char *what);
/* Rule r (regular, as for di_rlang_make_lazy) becomes a lexeme that spans at most max_tokens
 * accepted tokens (Lark's max_tokens): its DFA is written max_tokens times plus an entry copy,
 * linked by di_grule.tok_link, and the matcher moves stacks one copy down per token
 * (di_grt_boundary). 1 <= max_tokens <= DI_RLANG_MAX_TOKENS. */
#define DI_RLANG_MAX_TOKENS 4096
di_status di_rlang_bound_tokens(di_gb *b, int r, int max_tokens, const char *what);
/* Rule `target` (not finished; its alternatives are replaced) becomes the strings in every
 * language of ops[i] with bit i set in `in` and in none with bit i set in `out` (Lark's `A & B`
 * and `~A`; with in == 0 the complement is over all byte strings). Operands must be regular. */
#define DI_RLANG_MAX_OPERANDS 16
di_status di_rlang_combine(di_gb *b, int target, const int *ops, int k, unsigned in, unsigned out, const char *what);
#endif
