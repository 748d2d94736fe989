/* One character of a quoted grammar literal, shared by the GBNF and Lark front ends so that both
 * read escapes the same way; each front end words its own errors and decides what an unknown
 * escape means (GBNF refuses it, Lark keeps the backslash as Python does). */
#ifndef DI_GRAMMAR_LITERAL_CHAR_H
#define DI_GRAMMAR_LITERAL_CHAR_H
#include <stddef.h>
#include <stdint.h>

typedef enum {
  DI_LIT_OK,
  DI_LIT_BAD_UTF8,   /* the character is not valid UTF-8 */
  DI_LIT_UNFINISHED, /* a backslash at the end of the text */
  DI_LIT_UNKNOWN,    /* an escape of neither set; *i is past the escaped character */
  DI_LIT_BAD_HEX,    /* \x \u \U without enough hex digits; *hex_digits says how many were needed */
  DI_LIT_RANGE       /* a hex escape beyond U+10FFFF */
} di_lit_result;

/* Reads the character at s[*i] (s has n bytes) into *cp and advances *i past it: a UTF-8 character
 * or an escape: \n \t \r \f \v \0 \\ \" \' \xHH \uHHHH \UHHHHHHHH, or a backslash before one of
 * the characters in `self_escaping` (the front end's own punctuation) meaning that character. */
di_lit_result di_read_literal_char(const char *s, size_t n, size_t *i, const char *self_escaping, int32_t *cp,
                                   int *hex_digits);
#endif
