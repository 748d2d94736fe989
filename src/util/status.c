/* Thread-local error messages: see status.h. */
#include "util/status.h"
#include <stdarg.h>
#include <string.h>

static _Thread_local char g_msg[2048];

di_status di_error_set(di_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  return st;
}

di_status di_error_wrap(di_status st, const char *fmt, ...) {
  char prefix[1024], old[sizeof g_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, g_msg, sizeof old);
  size_t pl = strlen(prefix);
  while (pl > 0 && (prefix[pl - 1] == ' ' || prefix[pl - 1] == ':')) pl--; /* the ": " is added here */
  if (pl > sizeof g_msg - 3)
    pl = sizeof g_msg - 3;
  memcpy(g_msg, prefix, pl);
  g_msg[pl] = ':';
  g_msg[pl + 1] = ' ';
  size_t rest = sizeof g_msg - pl - 3;
  size_t ol = strnlen(old, rest);
  memcpy(g_msg + pl + 2, old, ol);
  g_msg[pl + 2 + ol] = 0;
  return st;
}

void di_error_clear(void) { g_msg[0] = 0; }

const char *di_last_error(void) { return g_msg; }

const char *di_status_str(di_status st) {
  switch (st) {
  case DI_OK: return "ok";
  case DI_ERR_INVALID_ARG: return "invalid argument";
  case DI_ERR_IO: return "I/O error";
  case DI_ERR_FORMAT: return "malformed input";
  case DI_ERR_UNSUPPORTED: return "unsupported";
  case DI_ERR_NOT_FOUND: return "not found";
  case DI_ERR_OOM: return "out of memory";
  case DI_ERR_CONTEXT_OVERFLOW: return "longer than the context";
  case DI_ERR_BACKEND: return "backend error";
  case DI_ERR_ABORTED: return "aborted";
  case DI_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}
