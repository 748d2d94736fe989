/* Token references `<[id]>` / `!<[id]>` (llama.cpp's GBNF; llguidance's Lark): a grammar element that
 * is one token by its id rather than by its text. The automaton works on bytes, so a token
 * reference is spelled as 0xFF and the id in 4 big-endian bytes (0xFF is never part of UTF-8 text,
 * which is all a grammar's characters can produce); the matcher consumes a token by that spelling
 * where the grammar allows it, else by its text (matcher.c). */
#ifndef DI_GRAMMAR_TOKEN_REF_H
#define DI_GRAMMAR_TOKEN_REF_H
#include "grammar/gram_ir.h"

enum { DI_TOKEN_REF_MARK = 0xFF, DI_TOKEN_REF_LEN = 5 };

static inline void di_token_ref_spell(int32_t id, uint8_t out[DI_TOKEN_REF_LEN]) {
  out[0] = DI_TOKEN_REF_MARK;
  for (int k = 0; k < 4; k++)
    out[1 + k] = (uint8_t)((uint32_t)id >> (24 - 8 * k));
}

/* Parses `<[digits]>` at s[*i] (the '<'), advancing *i past it. 0 when malformed. */
int di_token_ref_parse(const char *s, size_t n, size_t *i, int32_t *id);
/* Appends to seq the element for token `id` (negated: any one token but `id`). */
void di_token_ref_push(di_gb *b, di_gseq *seq, int32_t id, int negated);

/* llguidance's token sets `<[A-B,C,...]>`, `<[^...]>` (the complement) and `<[*]>` (any token):
 * parsed at s[*i] (the '<') into at most cap sorted, disjoint, inclusive ranges of ids in
 * 0..INT32_MAX. 1 with *nr set and *i past the '>', 0 when malformed or over cap. */
typedef struct { int32_t lo, hi; } di_token_range;
int di_token_set_parse(const char *s, size_t n, size_t *i, di_token_range *out, int cap, int *nr);
/* Appends to seq the element for one token whose id is in the ranges (nr 0: an empty class). */
void di_token_set_push(di_gb *b, di_gseq *seq, const di_token_range *r, int nr);
#endif
