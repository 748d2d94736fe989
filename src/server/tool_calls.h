/* Tool calls in a DeepSeek model's reply (vLLM's `--tool-call-parser deepseek_v3 | deepseek_v31 |
 * deepseek_v4`). Every form is recognised whichever parser was named (their markers differ):
 *   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>...   (V3, R1)
 *   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...                           (V3.1)
 *   <｜DSML｜tool_calls>\n<｜DSML｜invoke name="NAME">\n<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>
 *   ...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>          (V4; V3.2 names the block function_calls; tool_calls_dsml.c)
 * DSML parameters become a JSON object text: {"K": "V" (string="true", escaped) or V (raw JSON), ...}.
 * The markers are plain (non-special) added tokens of DeepSeek's tokenizers, so they are in the text. */
#ifndef DI_SERVER_TOOL_CALLS_H
#define DI_SERVER_TOOL_CALLS_H
#include <stddef.h>

typedef struct di_tool_call {
  char *name;
  char *arguments;   /* JSON text as the model wrote it (DSML: built from the parameters) */
  int complete;      /* 0: the call is still being written (partial parses only) */
} di_tool_call;

/* Finds the complete tool calls in text[0..len). Returns their number (0: none, or markup without
 * one complete call: then the reply is plain content); *content_len: the bytes before the markup.
 * *calls is malloc'd (free with di_tool_calls_free); NULL on 0 or out of memory (-1). */
int di_tool_calls_parse(const char *text, size_t len, size_t *content_len, di_tool_call **calls);
/* As di_tool_calls_parse on a reply still being generated: the calls so far, the last one possibly
 * incomplete (complete = 0) with its name known and `arguments` holding only what later text cannot
 * change (a tail that may be the start of a closing marker, or whitespace that would be trimmed, waits).
 * So as text grows, each call's arguments only grow, ending as di_tool_calls_parse's. *content_len
 * is where the markup starts (len when it has not). */
int di_tool_calls_parse_partial(const char *text, size_t len, size_t *content_len, di_tool_call **calls);
void di_tool_calls_free(di_tool_call *calls, int n);
/* How many bytes of text[0..len) may be streamed as content now: up to the markup if it started
 * (less the whitespace before it, which a reply with calls drops), else all but a tail that could
 * be the start of the markup or whitespace before it. */
size_t di_tool_calls_safe_prefix(const char *text, size_t len);

/* helpers shared by the format parsers (tool_calls.c) */
const char *di_tc_find(const char *h, size_t hl, const char *n);
/* the longest tail of t[0..len) that is a proper prefix of marker m */
size_t di_tc_partial_tail(const char *t, size_t len, const char *m);
char *di_tc_dup(const char *s, size_t n);
/* appends a call (taking name and arguments); -1 on out of memory (they are freed) */
int di_tc_push(di_tool_call **a, int *n, int *cap, char *name, char *arguments, int complete);
/* DSML (V4 / V3.2) calls after the block marker that starts at text[at]; partial as above */
int di_tool_calls_parse_dsml(const char *text, size_t len, size_t at, int partial, di_tool_call **calls);
#endif
