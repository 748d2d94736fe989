/* Stop-string search over streamed text (see stop_strings.h). */
#include "sampler/stop_strings.h"
#include <stdlib.h>
#include <string.h>

di_status di_stop_set_init(di_stop_set *ss, const char *const *strs, int n) {
  memset(ss, 0, sizeof *ss);
  if (n <= 0) return DI_OK;
  ss->s = calloc((size_t)n, sizeof *ss->s);
  ss->len = calloc((size_t)n, sizeof *ss->len);
  if (!ss->s || !ss->len) {
    di_stop_set_destroy(ss);
    return di_error_set(DI_ERR_OOM, "stop strings: out of memory");
  }
  for (int i = 0; i < n; i++) {
    if (!strs[i] || !strs[i][0]) {
      di_stop_set_destroy(ss);
      return di_error_set(DI_ERR_INVALID_ARG, "stop string %d is empty", i);
    }
    ss->len[i] = strlen(strs[i]);
    ss->s[i] = malloc(ss->len[i] + 1);
    if (!ss->s[i]) {
      di_stop_set_destroy(ss);
      return di_error_set(DI_ERR_OOM, "stop strings: out of memory");
    }
    memcpy(ss->s[i], strs[i], ss->len[i] + 1);
    ss->n = i + 1;
    if (ss->len[i] > ss->max_len) ss->max_len = ss->len[i];
  }
  return DI_OK;
}

void di_stop_set_destroy(di_stop_set *ss) {
  if (ss->s)
    for (int i = 0; i < ss->n; i++) free(ss->s[i]);
  free(ss->s);
  free(ss->len);
  memset(ss, 0, sizeof *ss);
}

long di_stop_find(const di_stop_set *ss, const char *text, size_t len, size_t checked, int *which) {
  long best = -1;
  for (int i = 0; i < ss->n; i++) {
    size_t L = ss->len[i];
    if (L > len) continue;
    /* a new match must end after `checked`: it starts at or after checked - L + 1 */
    size_t from = checked >= L ? checked - L + 1 : 0;
    const char *hit = memmem(text + from, len - from, ss->s[i], L);
    if (hit && (best < 0 || hit - text < best)) {
      best = hit - text;
      *which = i;
    }
  }
  return best;
}

size_t di_stop_holdback(const di_stop_set *ss, const char *text, size_t len) {
  size_t hold = 0;
  for (int i = 0; i < ss->n; i++) {
    size_t L = ss->len[i];
    for (size_t k = (L - 1 < len ? L - 1 : len); k > hold; k--)
      if (memcmp(text + len - k, ss->s[i], k) == 0) {
        hold = k;
        break;
      }
  }
  return hold;
}
