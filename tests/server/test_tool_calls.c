/* DeepSeek tool-call markup parsed out of reply text (V3/R1 and V3.1 forms), cut-off calls,
 * replies without markup, and the streaming hold-back of a marker that may be starting. */
#include "server/tool_calls.h"
#include "test_util.h"
#include <stdlib.h>
#include <string.h>

#define CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define CALLS_END "<｜tool▁calls▁end｜>"
#define CALL_BEGIN "<｜tool▁call▁begin｜>"
#define CALL_END "<｜tool▁call▁end｜>"
#define SEP "<｜tool▁sep｜>"

static int parse(const char *t, size_t *content_len, di_tool_call **calls) {
  return di_tool_calls_parse(t, strlen(t), content_len, calls);
}

int main(void) {
  size_t cl;
  di_tool_call *c;
  /* V3 / R1 */
  const char *v3 = "Let me check." CALLS_BEGIN CALL_BEGIN "function" SEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" CALL_END
                   CALL_BEGIN "function" SEP "get_time\n```json\n{\"tz\": \"CET\", \"code\": \"```\"}\n```" CALL_END CALLS_END;
  CHECK(parse(v3, &cl, &c) == 2);
  CHECK(cl == strlen("Let me check."));
  CHECK(c && strcmp(c[0].name, "get_weather") == 0 && strcmp(c[0].arguments, "{\"city\": \"Paris\"}") == 0);
  CHECK(c && strcmp(c[1].name, "get_time") == 0 && strcmp(c[1].arguments, "{\"tz\": \"CET\", \"code\": \"```\"}") == 0);
  di_tool_calls_free(c, 2);
  /* V3.1 */
  const char *v31 = CALLS_BEGIN CALL_BEGIN "search" SEP "{\"q\": \"x\"}" CALL_END CALLS_END;
  CHECK(parse(v31, &cl, &c) == 1 && cl == 0);
  CHECK(c && strcmp(c[0].name, "search") == 0 && strcmp(c[0].arguments, "{\"q\": \"x\"}") == 0);
  di_tool_calls_free(c, 1);
  /* a call cut off by max_tokens is not returned; the first, complete one is */
  const char *cut = CALLS_BEGIN CALL_BEGIN "a" SEP "{}" CALL_END CALL_BEGIN "b" SEP "{\"unfinished";
  CHECK(parse(cut, &cl, &c) == 1 && c && strcmp(c[0].name, "a") == 0);
  di_tool_calls_free(c, 1);
  /* markup without a complete call, or none at all: plain content */
  CHECK(parse("hello" CALLS_BEGIN CALL_BEGIN "x", &cl, &c) == 0 && c == NULL && cl == strlen("hello" CALLS_BEGIN CALL_BEGIN "x"));
  CHECK(parse("no tools here", &cl, &c) == 0 && cl == 13);
  CHECK(parse(CALLS_BEGIN CALL_BEGIN SEP "{}" CALL_END, &cl, &c) == 0); /* empty name */
  CHECK(parse(CALLS_BEGIN CALL_BEGIN "nosep" CALL_END, &cl, &c) == 0);
  /* streaming: content goes out up to the marker, or up to a tail that could start it */
  const char *m = CALLS_BEGIN;
  CHECK(di_tool_calls_safe_prefix("plain text", 10) == 10);
  char buf[128];
  for (size_t k = 1; k < strlen(m); k++) {
    snprintf(buf, sizeof buf, "abc%.*s", (int)k, m);
    CHECKF(di_tool_calls_safe_prefix(buf, strlen(buf)) == 3, "k %zu", k);
  }
  snprintf(buf, sizeof buf, "abc%sdef", m);
  CHECK(di_tool_calls_safe_prefix(buf, strlen(buf)) == 3);
  CHECK(di_tool_calls_safe_prefix("abc<", 4) == 3 && di_tool_calls_safe_prefix("abc<x", 5) == 5);
  CHECK(di_tool_calls_safe_prefix("", 0) == 0);
  return test_finish("test_tool_calls");
}
