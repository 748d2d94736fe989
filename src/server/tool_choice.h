/* tool_choice of a chat request into a constraint (tool_choice.c). */
#ifndef DI_SERVER_TOOL_CHOICE_H
#define DI_SERVER_TOOL_CHOICE_H
#include "server/openai.h"
#include "server/tool_calls.h"

/* Checks `tools` and reads `tool_choice` of a chat body: sets r->tool_choice, and for "required" or
 * a named function r->json_schema (and r->tool_name). `constrained`: the request already has a
 * structured-output constraint (then the forced forms are a 400). Returns 0 or -1 with err set. */
int di_oai_read_tool_choice(const cJSON *root, di_oai_request *r, int constrained, di_oai_error *err);
/* The tool calls of a reply text[0..len) as the request's tool_choice makes them: a named function's
 * reply is its arguments, a required reply's calls are the array's objects (each one's arguments the
 * raw text of its "parameters"), an auto reply's its DeepSeek markup (tool_calls.h). While not final,
 * the calls so far, the last possibly unfinished (arguments only grow). *content_len: the bytes of text before the
 * calls. Returns the number of calls (*calls malloc'd, di_tool_calls_free), -1 on out of memory. */
int di_tool_choice_calls(const di_oai_request *r, const char *text, size_t len, int final, size_t *content_len,
                         di_tool_call **calls);
#endif
