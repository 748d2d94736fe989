/* JSON text helpers shared by the JSON Schema front-end (json_text.c). */
#ifndef DI_GRAMMAR_JSON_TEXT_H
#define DI_GRAMMAR_JSON_TEXT_H
#include <cjson/cJSON.h>
#include "grammar/gram_ir.h"

/* A growable NUL-terminated byte buffer; oom is set when an allocation failed. */
typedef struct di_sbuf {
  char *p;
  size_t n, cap;
  int oom;
} di_sbuf;
void di_sbuf_put(di_sbuf *b, const char *s, size_t n);
/* A JSON string literal (with quotes) the way generation writes it. */
void di_sbuf_json_string(di_sbuf *b, const char *s);
/* A JSON value, compact, keys in their order, integral numbers as integers. */
void di_sbuf_json(di_sbuf *b, const cJSON *j);
/* Adds to `rule` alternatives matching exactly the integers in [lo, hi] (bounds optional, each
 * within +-2^53), written without leading zeros or "-0". */
void di_json_int_range(di_gb *b, int rule, int has_lo, int64_t lo, int has_hi, int64_t hi);
#endif
