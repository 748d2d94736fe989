/* The OpenAI API of `deepinfer serve`: JSON request bodies of /v1/completions and
 * /v1/chat/completions (plus vLLM's extra sampling and structured-output fields) read into engine
 * requests with OpenAI-style errors, and the pieces of OpenAI-shaped responses (errors, logprobs). */
#ifndef DI_SERVER_OPENAI_H
#define DI_SERVER_OPENAI_H
#include <cjson/cJSON.h>
#include "deepinfer.h"

/* What the request readers need to know about the served model. */
typedef struct di_oai_ctx {
  const di_tokenizer *tok;         /* NULL: token-id prompts only */
  const di_chat_template *tmpl;    /* NULL: no chat endpoint */
  const char *served_name;         /* the `model` clients name */
  const char *model_dir;           /* also accepted as the `model` */
  int max_model_len;
  size_t max_token_bytes;          /* the longest token's bytes (0: unknown): a text longer than max_model_len
                                      such tokens is refused before it is tokenized (bounded memory) */
  int vocab_size;
  float default_temperature, default_top_p; /* generation_config.json; NAN: unset */
  int default_top_k;                        /* <= 0: unset */
  int tool_parser;                 /* nonzero: DeepSeek tool-call markup in chat replies becomes tool_calls */
  int reasoning_parser;            /* nonzero: <think>...</think> in chat replies becomes reasoning_content */
} di_oai_ctx;

/* An OpenAI error: HTTP status and the body's {"error": {message, type, param, code}}. */
typedef struct di_oai_error {
  int status;
  const char *type;                /* "invalid_request_error", "not_found_error", "server_error" ... */
  const char *code;                /* NULL or "model_not_found", "context_length_exceeded", ... */
  char param[64];                  /* "" for null */
  char message[1024];
} di_oai_error;

/* Fills `e` (printf-style message) and returns -1, for `return di_oai_fail(...)`. */
int di_oai_fail(di_oai_error *e, int status, const char *type, const char *param, const char *code,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {...}} as a malloc'd string (NULL on out of memory). */
char *di_oai_error_json(const di_oai_error *e);

/* tool_choice: "auto" (markup in the reply parsed when the server has a tool parser), "none",
 * "required" (the reply is constrained to a JSON array of {name, parameters}, as vLLM does), or a named
 * function (the reply is constrained to that function's parameters schema: it is the arguments). */
enum { DI_TOOL_CHOICE_AUTO = 0, DI_TOOL_CHOICE_NONE, DI_TOOL_CHOICE_REQUIRED, DI_TOOL_CHOICE_NAMED };

/* A request read from its JSON body. */
typedef struct di_oai_request {
  int chat;
  int parse_tools;                 /* chat with tools and a tool parser: replies may hold tool calls */
  int parse_reasoning;             /* chat with a reasoning parser: replies hold <think> reasoning */
  int tool_choice;                 /* DI_TOOL_CHOICE_*: how replies become tool calls */
  char *tool_name;                 /* DI_TOOL_CHOICE_NAMED: the function the reply calls */
  int json_object;                 /* response_format json_object (the params carry it too) */
  int return_token_ids;            /* choices carry `token_ids` (vLLM's field; always without a tokenizer) */
  int add_special_tokens;          /* completions (vLLM's field): text prompts get the tokenizer's BOS; default 1 */
  int stream, include_usage;
  int continuous_usage;            /* vLLM's stream_options.continuous_usage_stats: usage in every chunk */
  int echo;                        /* completions: the prompt text leads each choice's text */
  int logprobs;                    /* top alternatives per token; -1: no logprobs */
  int echo_logprobs;               /* completions with echo and logprobs: the prompt's tokens lead them */
  int prompt_logprobs;             /* vLLM's prompt_logprobs field (top k per prompt token); -1: none */
  int n;                           /* samples per prompt */
  int n_prompts;
  di_request_params *params;       /* [n_prompts]: token-id prompts, everything else shared */
  int32_t **prompt_ids;            /* [n_prompts] */
  int *n_prompt_ids;
  char **prompt_text;              /* [n_prompts] for echo: the prompt as text */
  /* storage the params point into */
  char **stops;
  int n_stops;
  int32_t *stop_token_ids;
  int n_stop_token_ids;
  int32_t *bias_ids;
  float *bias_values;
  int n_bias;
  char *json_schema, *regex, *grammar;
  int grammar_syntax, json_strict, max_digits, max_string_length; /* structured-output options */
  char *item_separator, *key_separator; /* structured_outputs.separators (NULL: the default) */
  int max_whitespace;
  int indent;                      /* structured_outputs.indent (0: one line) */
  char *rendered;                  /* chat: the rendered conversation */
} di_oai_request;

/* Read a /v1/completions (chat = 0) or /v1/chat/completions (chat = 1) body. Returns 0, or -1 with
 * `err` filled (and `r` freed). Prompts are tokenized here (the engine gets ids) so that their
 * lengths are checked against max_model_len before anything is queued. */
int di_oai_parse_request(const di_oai_ctx *ctx, int chat, const char *body, size_t len, di_oai_request *r,
                         di_oai_error *err);
void di_oai_request_free(di_oai_request *r);
/* A text prompt's ids: with add_special_tokens the tokenizer's own (BOS when add_bos_token), except
 * that a text already starting with the BOS token's text gets no second one (lm-evaluation-harness's
 * string requests decode their BOS into the text); without, the text's tokens alone (vLLM's field). */
di_status di_oai_encode_text(const di_tokenizer *tok, const char *s, int add_special_tokens, int32_t **ids, size_t *n);

/* `model` of a request: 0 when absent or ours, else -1 with a 404 error. */
int di_oai_check_model(const di_oai_ctx *ctx, const cJSON *root, di_oai_error *err);

/* A token's text for logprobs: its bytes with invalid UTF-8 replaced by U+FFFD (malloc'd). */
char *di_oai_token_text(const di_tokenizer *tok, int32_t id, const char **raw, size_t *raw_len);

/* Appends one generated token to a logprobs object being built.
 * Completions ({tokens, token_logprobs, top_logprobs, text_offset}): `obj` is that object.
 * Chat ({content: [{token, logprob, bytes, top_logprobs}]}): `obj` is the content array. */
void di_oai_add_logprob(const di_tokenizer *tok, int chat, cJSON *obj, int32_t id, float logprob,
                        const di_token_logprob *top, int n_top, int text_offset);
/* An empty logprobs object of the completions shape. */
cJSON *di_oai_completion_logprobs_new(void);

/* Parses a JSON body into a tree; -1 with a 400 error naming the position on malformed JSON. */
int di_oai_parse_json(const char *body, size_t len, cJSON **out, di_oai_error *err);
#endif
