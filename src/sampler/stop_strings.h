/* Stop strings over streamed text: finds the earliest stop string in the text generated so far
 * (matches may span any number of tokens) and tells how much of the text's tail must be held back
 * from streaming because it could still become the start of a stop string. */
#ifndef DI_SAMPLER_STOP_STRINGS_H
#define DI_SAMPLER_STOP_STRINGS_H
#include <stddef.h>
#include "util/status.h"

typedef struct di_stop_set {
  char **s;
  size_t *len;
  int n;
  size_t max_len;
} di_stop_set;

/* Copies the strings; empty strings are an error (they would match everywhere). */
di_status di_stop_set_init(di_stop_set *ss, const char *const *strs, int n);
void di_stop_set_destroy(di_stop_set *ss);
/* Earliest match in text[0..len) that ends after byte `checked` (the bytes before `checked` were
 * searched already). Returns the match start or -1; *which = index of the stop string. */
long di_stop_find(const di_stop_set *ss, const char *text, size_t len, size_t checked, int *which);
/* Bytes at the end of text[0..len) that are a proper prefix of some stop string. */
size_t di_stop_holdback(const di_stop_set *ss, const char *text, size_t len);
#endif
