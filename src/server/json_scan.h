/* A streaming pre-check of JSON request bodies, fed as the bytes arrive (before the body is
 * complete, long before cJSON builds a tree from it): nesting depth, valid UTF-8 (RFC 8259 requires
 * it), and a bound on the number of values the tree would have, so a body that would cost many
 * times its size in parsed nodes (a list of millions of token ids) or that would exhaust the
 * parser's recursion is refused at the byte where it crosses the limit, with a message that says
 * which limit. It does not check the grammar otherwise: cJSON reports syntax errors afterwards. */
#ifndef DI_SERVER_JSON_SCAN_H
#define DI_SERVER_JSON_SCAN_H
#include <stddef.h>
#include <stdint.h>

typedef struct di_json_scan {
  int max_depth;
  long long max_values;
  int depth;
  long long values;          /* an upper bound on the parsed tree's nodes so far (1 + commas + 2 x containers) */
  int in_string, escape;
  int utf8_need;             /* continuation bytes still expected */
  unsigned char utf8_lo, utf8_hi; /* the range the next continuation byte must be in */
  size_t pos;                /* bytes fed */
  int error_status;          /* 0 ok; else the HTTP status to answer (400, 413) */
  char error[200];
} di_json_scan;

void di_json_scan_init(di_json_scan *s, int max_depth, long long max_values);
/* Feeds the next n bytes. 0 ok; -1 on the first violation (error_status, error set; later calls
 * keep returning -1). */
int di_json_scan_feed(di_json_scan *s, const char *p, size_t n);
/* The body ended: -1 when it stops inside a UTF-8 sequence. */
int di_json_scan_end(di_json_scan *s);
#endif
