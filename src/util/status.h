/* Status codes and the thread-local error message every fallible internal function sets.
 * Contract: a function returning a status other than DI_OK has called di_error_set() first, so
 * di_last_error() names the problem (file, tensor, key, position). The library never exits or
 * aborts on bad input; DI_ASSERT is only for broken internal invariants. */
#ifndef DI_UTIL_STATUS_H
#define DI_UTIL_STATUS_H
#include "deepinfer.h"
#include <stdio.h>
#include <stdlib.h>

/* Sets the thread's last error message (printf-style) and returns `st` for `return di_error_set(...)`. */
di_status di_error_set(di_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with more context ("loading model: " + old message). */
di_status di_error_wrap(di_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void di_error_clear(void);

#define DI_ASSERT(c)                                                                       \
  do {                                                                                     \
    if (!(c)) {                                                                            \
      fprintf(stderr, "deepinfer: internal invariant broken: %s (%s:%d)\n", #c, __FILE__, \
              __LINE__);                                                                   \
      abort();                                                                             \
    }                                                                                      \
  } while (0)

#define DI_TRY(expr)               \
  do {                             \
    di_status di_try_st_ = (expr); \
    if (di_try_st_ != DI_OK)       \
      return di_try_st_;           \
  } while (0)

#endif
