/* Tool calls in a DeepSeek model's reply (vLLM's `--tool-call-parser deepseek_v3`): the text after
 * <｜tool▁calls▁begin｜> holds calls written as
 *   <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>   (V3, R1)
 *   <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>                           (V3.1)
 * These markers are plain (non-special) added tokens of DeepSeek's tokenizers, so they are in the
 * detokenized text. */
#ifndef DI_SERVER_TOOL_CALLS_H
#define DI_SERVER_TOOL_CALLS_H
#include <stddef.h>

typedef struct di_tool_call {
  char *name;
  char *arguments;   /* JSON text as the model wrote it */
} di_tool_call;

/* Finds the tool calls in text[0..len). Returns the number of complete calls (0: none, or markup
 * without one complete call: then the reply is plain content); *content_len: the bytes before the
 * markup. *calls is malloc'd (free with di_tool_calls_free); NULL on 0 or out of memory (-1). */
int di_tool_calls_parse(const char *text, size_t len, size_t *content_len, di_tool_call **calls);
void di_tool_calls_free(di_tool_call *calls, int n);
/* How many bytes of text[0..len) may be streamed as content now: up to the markup if it started,
 * else all but a tail that could be the start of the markup. */
size_t di_tool_calls_safe_prefix(const char *text, size_t len);
#endif
