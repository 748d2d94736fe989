/* libFuzzer target: tool-call markup in model replies (V3, V3.1, V4 DSML) and tool_choice "required"
 * arrays. Any bytes are parsed whole and as partial streams would see them; a complete call of a
 * prefix must agree with the whole parse, and (session 13) every call of a prefix must have the name
 * and a prefix of the arguments of that call at the end of the stream (the whole parse's, or for a
 * last call cut off before its end marker the partial parse of all the text): server/tool_stream.c
 * sends only the bytes past what it sent, so arguments that changed instead of growing would reach
 * the client corrupted. The same check as tests/server/test_tool_calls.c's check_prefixes, here so
 * that the fuzzer finds what breaks it. Nothing may crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/tool_calls.h"
#include "server/tool_choice.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *t = (const char *)data;
  size_t cl;
  di_tool_call *whole;
  int nw = di_tool_calls_parse(t, size, &cl, &whole);
  if (cl > size) abort();
  di_tool_call *full = NULL;
  size_t fcl;
  int nf = nw > 0 ? di_tool_calls_parse_partial(t, size, &fcl, &full) : 0;
  if (nw > 0 && nf >= 0 && !(nf == nw || (nf == nw + 1 && !full[nw].complete))) abort();
  for (size_t k = 0; k <= size; k += 1 + size / 64) {
    di_tool_call *part;
    size_t pcl;
    int np = di_tool_calls_parse_partial(t, k, &pcl, &part);
    if (di_tool_calls_safe_prefix(t, k) > k) abort();
    /* a complete call of the prefix is a complete call of the whole text */
    for (int i = 0; nw > 0 && i < np && i < nw; i++)
      if (part[i].complete && strcmp(part[i].arguments, whole[i].arguments) != 0 && i + 1 < nw) abort();
    /* every call of the prefix as the stream ends: same name, arguments only grow */
    if (nw > 0 && nf > 0 && np > nf) abort();
    for (int i = 0; nw > 0 && nf > 0 && i < np && i < nf; i++) {
      const di_tool_call *ref = i < nw ? &whole[i] : &full[i];
      if (strcmp(part[i].name, ref->name) != 0 || strncmp(ref->arguments, part[i].arguments, strlen(part[i].arguments)) != 0)
        abort();
    }
    di_tool_calls_free(part, np > 0 ? np : 0);
  }
  di_tool_calls_free(full, nf > 0 ? nf : 0);
  di_tool_calls_free(whole, nw > 0 ? nw : 0);
  di_oai_request rq;
  memset(&rq, 0, sizeof rq);
  rq.tool_choice = DI_TOOL_CHOICE_REQUIRED;
  for (int final = 0; final < 2; final++) {
    di_tool_call *c;
    int n = di_tool_choice_calls(&rq, t, size, final, &cl, &c);
    if (cl > size) abort();
    di_tool_calls_free(c, n > 0 ? n : 0);
  }
  return 0;
}
