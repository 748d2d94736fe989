/* The tokenizer.json scanner (tok_json.c): a cursor over JSON text with just the operations the
 * loader needs to stream the vocab and merges without building a tree. */
#ifndef DI_TOKENIZER_TOK_JSON_H
#define DI_TOKENIZER_TOK_JSON_H
#include "tokenizer/buf.h"
#include "util/status.h"

typedef struct {
  const char *begin, *p, *end;
  const char *what; /* names the input in errors */
} di_jscan;

static inline int isalnum_ascii(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
/* Decodes a string literal, appending its UTF-8 bytes to out (escapes resolved). */
di_status di_jscan_string(di_jscan *s, di_buf *out);
di_status di_jscan_int(di_jscan *s, int64_t *v);
/* Skips one value, reporting where it lies in the text. */
di_status di_jscan_value_extent(di_jscan *s, const char **start, size_t *len);
di_status di_jscan_expect(di_jscan *s, char c);
di_status di_jscan_next(di_jscan *s, char close, int *more);
int di_jscan_peek(di_jscan *s, char c); /* skips whitespace; nonzero if the next char is c */
#endif
