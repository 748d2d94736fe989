/* Streamed tool calls as OpenAI's incremental deltas: each call opens with {index, id, type,
 * function: {name, arguments: ""}}, then its arguments arrive as {index, function: {arguments:
 * "<the new bytes>"}} as the model writes them. Fed the calls parsed so far (tool_calls.h's partial
 * parse, whose arguments only grow), so the deltas of a call concatenate to its final arguments. */
#ifndef DI_SERVER_TOOL_STREAM_H
#define DI_SERVER_TOOL_STREAM_H
#include <cjson/cJSON.h>
#include "server/tool_calls.h"

typedef struct di_tool_stream {
  int n_opened;                 /* calls whose opening delta was sent */
  size_t *args_sent;            /* [n_opened]: bytes of arguments sent per call */
  int cap;
} di_tool_stream;

/* Appends to `deltas` (a cJSON array) what calls[0..n) add beyond what was sent; make_id writes a
 * fresh call id. Returns the number of deltas appended. */
int di_tool_stream_step(di_tool_stream *st, const di_tool_call *calls, int n, cJSON *deltas,
                        void (*make_id)(void *ctx, char *out, size_t cap), void *ctx);
void di_tool_stream_free(di_tool_stream *st);
#endif
