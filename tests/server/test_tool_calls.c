/* DeepSeek tool-call markup parsed out of reply text (V3/R1, V3.1 and V4 DSML forms), cut-off calls,
 * replies without markup, the streaming hold-back of a marker that may be starting, and the partial
 * parse of every prefix of a reply: names as final, arguments and content prefixes of the final ones
 * (what makes streamed deltas reassemble to the whole reply). */
#include "server/tool_calls.h"
#include "server/tool_choice.h"
#include "test_util.h"
/* the fuzz target itself (its tool_choice "required" reads and prefix checks on every input), replayed too */
#define LLVMFuzzerTestOneInput fuzz_tool_calls_one
#include "../../fuzz/fuzz_tool_calls.c"
#undef LLVMFuzzerTestOneInput
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define CALLS_END "<｜tool▁calls▁end｜>"
#define CALL_BEGIN "<｜tool▁call▁begin｜>"
#define CALL_END "<｜tool▁call▁end｜>"
#define SEP "<｜tool▁sep｜>"

#define BAR "\xEF\xBD\x9C"
#define DSML_OPEN "<" BAR "DSML" BAR "tool_calls>"
#define DSML_CLOSE "</" BAR "DSML" BAR "tool_calls>"
#define INVOKE(name) "<" BAR "DSML" BAR "invoke name=\"" name "\">"
#define INVOKE_END "</" BAR "DSML" BAR "invoke>"
#define PARAM(key, str) "<" BAR "DSML" BAR "parameter name=\"" key "\" string=\"" str "\">"
#define PARAM_END "</" BAR "DSML" BAR "parameter>"

static int starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* every prefix of `t`: the partial parse agrees with the whole parse of all of t, and a call the
 * whole parse does not have with the partial parse of all of t (the calls a stream shows at its end). The whole parse drops a
 * last call cut off before its end marker (a reply stopped by max_tokens), which the stream showed
 * as an incomplete call: so the count is bounded by the partial parse of t, not the whole parse
 * (fuzz/corpus/tool_calls/cut_off_last_call and two merged inputs of session 10 have such a call) */
static void check_prefixes(const char *t) {
  size_t n = strlen(t), cl, fcl;
  di_tool_call *whole, *full;
  int nw = di_tool_calls_parse(t, n, &cl, &whole);
  int nf = di_tool_calls_parse_partial(t, n, &fcl, &full);
  CHECKF(nw > 0, "%s", t);
  CHECKF(nf == nw || (nf == nw + 1 && !full[nw].complete), "whole parse %d calls, partial parse of all %d", nw, nf);
  size_t content_end = cl;
  while (content_end && strchr(" \n", t[content_end - 1])) content_end--;
  for (size_t k = 0; k <= n; k++) {
    di_tool_call *part;
    size_t pcl;
    int np = di_tool_calls_parse_partial(t, k, &pcl, &part);
    CHECKF(np >= 0 && np <= nf, "prefix %zu: %d calls", k, np);
    for (int i = 0; i < np && i < nf; i++) {
      const di_tool_call *ref = i < nw ? &whole[i] : &full[i]; /* the cut-off call: as the stream ends */
      CHECKF(strcmp(part[i].name, ref->name) == 0, "prefix %zu call %d name %s", k, i, part[i].name);
      CHECKF(starts_with(ref->arguments, part[i].arguments), "prefix %zu call %d args '%s' vs '%s'", k, i,
             part[i].arguments, ref->arguments);
      if (part[i].complete)
        CHECKF(i < nw && strcmp(whole[i].arguments, part[i].arguments) == 0, "prefix %zu call %d complete", k, i);
    }
    size_t safe = di_tool_calls_safe_prefix(t, k);
    CHECKF(safe <= content_end, "prefix %zu: %zu content bytes streamed, the reply has %zu", k, safe, content_end);
    di_tool_calls_free(part, np);
  }
  di_tool_calls_free(whole, nw);
  di_tool_calls_free(full, nf);
}

/* fuzz/corpus/tool_calls (fuzz/fuzz_tool_calls.c's seeds): replies with calls pass check_prefixes */
static void replay_file(const char *name, const char *rel, const char *buf, size_t n, void *ctx) {
  (void)name;
  (void)rel;
  int *with_calls = ctx;
  size_t cl;
  di_tool_call *c;
  int nc = di_tool_calls_parse(buf, n, &cl, &c);
  di_tool_calls_free(c, nc > 0 ? nc : 0);
  if (nc > 0 && strlen(buf) == n) { (*with_calls)++; check_prefixes(buf); } /* (di_read_file NUL-terminates) */
}

static void replay_corpus(void) {
  int with_calls = 0;
  int files = test_for_each_file("fuzz/corpus/tool_calls", replay_file, &with_calls);
  CHECK(test_fuzz_replay("fuzz/corpus/tool_calls", fuzz_tool_calls_one) == files);
  CHECKF(files >= 5 && with_calls >= 3, "%d files, %d with calls", files, with_calls);
}

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
  /* a V3 call whose ```json fence is still open at CALL_END: its arguments run to CALL_END (a stream
   * showed the call while it was written; fuzz/corpus/tool_calls/crash-tool_calls-40c546e5e5cfbb79
   * is the fuzzer's input where the whole parse then dropped it) */
  const char *open_fence = CALLS_BEGIN CALL_BEGIN "function" SEP "f\n```json\n{\"a\": 1}\n" CALL_END CALLS_END;
  CHECK(parse(open_fence, &cl, &c) == 1 && c && strcmp(c[0].name, "f") == 0 && strcmp(c[0].arguments, "{\"a\": 1}") == 0);
  di_tool_calls_free(c, 1);
  check_prefixes(open_fence);
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
  /* V4 DSML: string parameters escaped into a JSON string, others as written */
  const char *v4 = "Checking.\n\n" DSML_OPEN "\n" INVOKE("get_weather") "\n" PARAM("city", "true") "Par\"is\n\xC3\xA9" PARAM_END "\n"
                   PARAM("days", "false") "3" PARAM_END "\n" PARAM("opts", "false") "{\"a\": [1, 2]}" PARAM_END "\n" INVOKE_END "\n"
                   INVOKE("now") "\n" INVOKE_END "\n" DSML_CLOSE;
  CHECK(parse(v4, &cl, &c) == 2 && cl == strlen("Checking.\n\n"));
  CHECK(c && strcmp(c[0].name, "get_weather") == 0 &&
        strcmp(c[0].arguments, "{\"city\": \"Par\\\"is\\n\xC3\xA9\", \"days\": 3, \"opts\": {\"a\": [1, 2]}}") == 0);
  CHECK(c && strcmp(c[1].name, "now") == 0 && strcmp(c[1].arguments, "{}") == 0);
  di_tool_calls_free(c, 2);
  /* V3.2's block name; a cut-off invoke is dropped */
  const char *v32 = "<" BAR "DSML" BAR "function_calls>" INVOKE("a") PARAM("x", "false") "1" PARAM_END INVOKE_END INVOKE("b")
                    PARAM("y", "true") "unfinis";
  CHECK(parse(v32, &cl, &c) == 1 && cl == 0 && c && strcmp(c[0].name, "a") == 0 && strcmp(c[0].arguments, "{\"x\": 1}") == 0);
  di_tool_calls_free(c, 1);
  size_t pcl;
  CHECK(di_tool_calls_parse_partial(v32, strlen(v32), &pcl, &c) == 2 && c && !c[1].complete &&
        strcmp(c[1].arguments, "{\"y\": \"unfinis") == 0);
  di_tool_calls_free(c, 2);
  /* whitespace before markup is held back while streaming (a reply with calls drops it) */
  CHECK(di_tool_calls_safe_prefix("ok\n\n", 4) == 2 && di_tool_calls_safe_prefix("ok\n\nmore", 8) == 8);
  /* every prefix of every form */
  check_prefixes(v3);
  check_prefixes(v31);
  check_prefixes(v4);
  check_prefixes("Hm " CALLS_BEGIN CALL_BEGIN "function" SEP "f\n```json\n {\"k\": \"v\"} \n```" CALL_END CALLS_END);
  /* tool_choice "required": the array's calls, read as the reply grows; the arguments are the raw text
   * of "parameters", so every prefix's are prefixes of the final ones */
  di_oai_request rq;
  memset(&rq, 0, sizeof rq);
  rq.tool_choice = DI_TOOL_CHOICE_REQUIRED;
  const char *req = "[ {\"name\": \"f\", \"parameters\": {\"a\": [1, \"x]}\\\"\"], \"b\": 2.5}},{\"name\":\"g\",\"parameters\":{}} ]";
  di_tool_call *rc;
  size_t rcl;
  CHECK(di_tool_choice_calls(&rq, req, strlen(req), 1, &rcl, &rc) == 2 && rcl == 0);
  CHECK(rc && strcmp(rc[0].name, "f") == 0 && strcmp(rc[0].arguments, "{\"a\": [1, \"x]}\\\"\"], \"b\": 2.5}") == 0 &&
        strcmp(rc[1].name, "g") == 0 && strcmp(rc[1].arguments, "{}") == 0);
  for (size_t k = 0; rc && k <= strlen(req); k++) {
    di_tool_call *pc;
    int np = di_tool_choice_calls(&rq, req, k, 0, &rcl, &pc);
    CHECKF(np >= 0 && np <= 2, "prefix %zu", k);
    for (int i = 0; i < np; i++)
      CHECKF(strcmp(pc[i].name, rc[i].name) == 0 && starts_with(rc[i].arguments, pc[i].arguments), "prefix %zu call %d '%s'",
             k, i, pc[i].arguments);
    di_tool_calls_free(pc, np);
    /* a reply cut off before the array closes stays content */
    if (k < strlen(req)) {
      np = di_tool_choice_calls(&rq, req, k, 1, &rcl, &pc);
      CHECKF(np == 0 && rcl == k, "final prefix %zu: %d calls", k, np);
      di_tool_calls_free(pc, np > 0 ? np : 0);
    }
  }
  di_tool_calls_free(rc, 2);
  replay_corpus();
  return test_finish("test_tool_calls");
}
