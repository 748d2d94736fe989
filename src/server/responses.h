/* The Responses API (POST /v1/responses), stateless: a request is translated into the chat
 * completions request it means (instructions -> a system message, input items -> messages, function
 * and custom tools -> tools, text.format -> response_format, a custom tool's grammar -> a regex
 * constraint), served as chat, and the chat reply translated back: whole (chat.completion -> a
 * Response object with reasoning / message / function_call / custom_tool_call output items) or
 * streamed (chat chunks -> response.* events). store and previous_response_id are 400s: nothing is
 * kept between requests. */
#ifndef DI_SERVER_RESPONSES_H
#define DI_SERVER_RESPONSES_H
#include <cjson/cJSON.h>
#include "server/openai.h"

typedef struct di_resp_req {
  cJSON *echo;            /* request fields a Response repeats (instructions, tools, tool_choice, ...) */
  char **custom_names;    /* custom tools: their calls are custom_tool_call items with `input` */
  int n_custom;
  char *forced_custom;    /* tool_choice names a custom tool: the whole reply is its input */
  /* streaming state */
  int seq;                /* sequence_number of the next event */
  int started, text_open, reasoning_open, n_items;
  char item_id[128];      /* the open message / reasoning item */
  int item_index;
  char *text, *reasoning; /* what the open items hold so far */
  size_t text_len, reasoning_len;
  int n_calls;
  struct di_resp_call { char id[128], call_id[128]; char *name, *args; size_t args_len; int output_index; } *calls;
  cJSON *done_items;      /* the output items closed so far (for response.completed) */
  char resp_id[80];
  double created;
  char model[512];
  int incomplete;
} di_resp_req;

/* Reads a Responses body into a chat completions body (malloc'd JSON text in *chat_body). Returns 0,
 * or -1 with err set (400 for store / previous_response_id, Lark grammars, unknown item types ...). */
int di_resp_translate(const char *body, size_t len, char **chat_body, di_resp_req *rr, di_oai_error *err);
/* After the chat body was read into r: a forced custom tool makes the reply that tool's input. */
int di_resp_adjust(di_resp_req *rr, di_oai_request *r, di_oai_error *err);
void di_resp_req_free(di_resp_req *rr);

/* A whole chat.completion object (taken) as a Response object. */
cJSON *di_resp_from_chat(di_resp_req *rr, cJSON *chat);

/* Streaming: each chat chunk (taken) becomes Responses events passed to emit(ctx, type, data)
 * (data taken). The usage chunk (choices []) ends the stream with response.completed. */
typedef void (*di_resp_emit_fn)(void *ctx, const char *type, cJSON *data);
void di_resp_stream_chunk(di_resp_req *rr, cJSON *chunk, di_resp_emit_fn emit, void *ctx);
#endif
