/* A chain of heap blocks released together: weight bindings keep their f32 copies and side tables in
 * one (the chain's head lives in the owning struct as a void pointer). */
#ifndef DI_UTIL_OWNED_H
#define DI_UTIL_OWNED_H
#include <stddef.h>
#include <stdlib.h>

typedef struct di_owned_block {
  struct di_owned_block *next;
  max_align_t data[];
} di_owned_block;

/* `bytes` of memory (max_align_t aligned) owned by the chain at *head; NULL when out of memory. */
static inline void *di_owned_alloc(void **head, size_t bytes) {
  di_owned_block *b = (di_owned_block *)malloc(sizeof(di_owned_block) + bytes);
  if (!b)
    return NULL;
  b->next = (di_owned_block *)*head;
  *head = b;
  return b->data;
}

/* Frees every block of the chain and empties it. */
static inline void di_owned_free(void **head) {
  di_owned_block *b = (di_owned_block *)*head;
  while (b) {
    di_owned_block *n = b->next;
    free(b);
    b = n;
  }
  *head = NULL;
}
#endif
