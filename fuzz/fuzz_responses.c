/* libFuzzer target: Responses API request bodies (POST /v1/responses, src/server/responses.c), the
 * way the server reads them: di_resp_translate into a chat completions body, that body through the
 * OpenAI chat reader (di_oai_parse_request) and di_resp_adjust, then a fixed chat reply translated
 * back, whole and streamed, so the request's echoed fields (tools, custom tools, text.format, ...)
 * reach the Response builders. Any bytes must either be read or fail with an OpenAI error (a 4xx/5xx
 * status and a message), never crash; a translated body must be JSON the chat reader takes or refuses
 * with an error. The tokenizer and template are engine-dummy's, loaded once (oai_fuzz_ctx.h).
 * Replayed by tests/server/test_responses_fuzz_corpus.c. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "oai_fuzz_ctx.h"
#include "server/responses.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_responses_cleanup(void);

static di_oai_ctx ctx;
static di_tokenizer *tok;
static di_chat_template *tmpl;
static int ready;

static void setup(void) {
  oai_fuzz_ctx_init(&ctx, &tok, &tmpl);
  ready = 1;
}

/* Frees the tokenizer and template (the replay test calls it, so leak checks stay clean). */
void fuzz_responses_cleanup(void) {
  di_tokenizer_free(tok);
  di_chat_template_free(tmpl);
  tok = NULL;
  tmpl = NULL;
  ready = 0;
}

static void check_error(const di_oai_error *err) {
  if (err->status < 400 || err->status > 599 || !err->message[0]) __builtin_trap();
  free(di_oai_error_json(err));
}

static void drop_event(void *c, const char *type, cJSON *e) {
  (void)c;
  if (!type || !type[0]) __builtin_trap();
  cJSON_Delete(e);
}

static const char whole_reply[] =
    "{\"id\":\"chatcmpl-1\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"finish_reason\":\"tool_calls\","
    "\"message\":{\"role\":\"assistant\",\"reasoning_content\":\"think\",\"content\":\"hi\",\"tool_calls\":[{\"id\":"
    "\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]}}],"
    "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}";
static const char *const stream_reply[] = {
    "{\"id\":\"c\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"t\"}}]}",
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}",
    ("{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":{\"name\":\"f\","
     "\"arguments\":\"{}\"}}]},\"finish_reason\":\"length\"}]}"),
    "{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!ready) setup();
  di_resp_req rr;
  char *chat_body;
  di_oai_error err;
  if (di_resp_translate((const char *)data, size, &chat_body, &rr, &err) != 0) {
    check_error(&err);
    return 0;
  }
  if (!chat_body) __builtin_trap();
  di_oai_request r;
  if (di_oai_parse_request(&ctx, 1, chat_body, strlen(chat_body), &r, &err) == 0) {
    if (r.n_prompts < 1 || !r.params) __builtin_trap();
    if (di_resp_adjust(&rr, &r, &err) != 0) check_error(&err);
    di_oai_request_free(&r);
  } else {
    check_error(&err);
  }
  free(chat_body);
  cJSON *whole = di_resp_from_chat(&rr, cJSON_Parse(whole_reply));
  if (!whole) __builtin_trap();
  cJSON_Delete(whole);
  di_resp_req_free(&rr);
  /* streamed: a fresh translation (the stream state starts empty) */
  if (di_resp_translate((const char *)data, size, &chat_body, &rr, &err) != 0) __builtin_trap(); /* read once already */
  free(chat_body);
  for (size_t i = 0; i < sizeof stream_reply / sizeof *stream_reply; i++)
    di_resp_stream_chunk(&rr, cJSON_Parse(stream_reply[i]), drop_event, NULL);
  di_resp_req_free(&rr);
  return 0;
}
