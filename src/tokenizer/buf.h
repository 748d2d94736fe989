/* A growable byte buffer and a growable int32 vector, the scratch storage of the tokenizer.
 * Functions return 0 on success and -1 when memory ran out (the buffer is then unchanged). */
#ifndef DI_TOKENIZER_BUF_H
#define DI_TOKENIZER_BUF_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char *p; size_t len, cap; } di_buf;
typedef struct { int32_t *p; size_t len, cap; } di_ivec;

static inline int di_buf_reserve(di_buf *b, size_t extra) {
  if (b->len + extra + 1 <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra + 1)
    cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p)
    return -1;
  b->p = p;
  b->cap = cap;
  return 0;
}
static inline int di_buf_append(di_buf *b, const void *s, size_t n) {
  if (di_buf_reserve(b, n))
    return -1;
  if (n)
    memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
  return 0;
}
static inline int di_buf_putc(di_buf *b, char c) { return di_buf_append(b, &c, 1); }
static inline void di_buf_free(di_buf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
}
static inline int di_ivec_push(di_ivec *v, int32_t x) {
  if (v->len == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 64;
    int32_t *p = realloc(v->p, cap * sizeof *p);
    if (!p)
      return -1;
    v->p = p;
    v->cap = cap;
  }
  v->p[v->len++] = x;
  return 0;
}
#endif
