/* OpenAI request bodies into engine requests (src/server/openai.c), without a server: defaults
 * (generation_config, OpenAI's max_tokens), every mapped field, structured outputs, chat rendering,
 * the error each bad field gets (status, param, code), logprobs shapes, and the fuzz corpus. */
#include "server/openai.h"
#include "chat/chat_template.h"
#include "test_util.h"
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
/* the fuzz target itself, replayed over its corpus with its own context (its file-scope names kept
 * apart from this file's) */
#define LLVMFuzzerTestOneInput fuzz_openai_one
#define ctx fuzz_oai_ctx
#define ready fuzz_oai_ready
#include "../../fuzz/fuzz_openai.c"
#undef ready
#undef ctx
#undef LLVMFuzzerTestOneInput

static di_oai_ctx ctx;

static int rd(int chat, const char *body, di_oai_request *r, di_oai_error *e) {
  return di_oai_parse_request(&ctx, chat, body, strlen(body), r, e);
}

/* expects a failure with this status and param */
static void bad(int chat, const char *body, int status, const char *param) {
  di_oai_request r;
  di_oai_error e;
  int rc = rd(chat, body, &r, &e);
  CHECKF(rc == -1 && e.status == status && strcmp(e.param, param) == 0, "%s -> rc %d status %d param \"%s\" (%s)", body,
         rc, rc ? e.status : 0, rc ? e.param : "", rc ? e.message : "");
  if (rc == 0) di_oai_request_free(&r);
}

/* expects each value of structured_outputs.FIELD (beside a json schema) to be refused with 400 naming it */
static void bad_structured_values(const char *field, const char *const *values, size_t n) {
  char body[200], param[64];
  snprintf(param, sizeof param, "structured_outputs.%s", field);
  for (size_t i = 0; i < n; i++) {
    snprintf(body, sizeof body, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, \"%s\": %s}}", field,
             values[i]);
    bad(0, body, 400, param);
  }
}

static void test_completions(void) {
  di_oai_request r;
  di_oai_error e;
  CHECK(rd(0, "{\"prompt\": \"Hello world\"}", &r, &e) == 0);
  CHECK(r.n_prompts == 1 && r.n == 1 && r.params[0].prompt_ids[0] == 0 && r.params[0].n_prompt_ids >= 2);
  /* defaults: generation_config's sampling, 16 new tokens */
  CHECK(fabsf(r.params[0].temperature - 0.7f) < 1e-6 && fabsf(r.params[0].top_p - 0.95f) < 1e-6);
  CHECK(r.params[0].max_tokens == 16 && r.params[0].logprobs == -1 && !r.stream && r.params[0].skip_special_tokens);
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": [[5, 6, 7], [8]], \"n\": 3, \"temperature\": 0, \"top_p\": 0.5, \"top_k\": 4, \"min_p\": 0.2,"
              "\"seed\": 9, \"max_tokens\": 7, \"stop\": \"zz\", \"stop_token_ids\": [3], \"logit_bias\": {\"11\": -100, \"12\": 2.5},"
              "\"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, \"repetition_penalty\": 1.2, \"min_tokens\": 2,"
              "\"ignore_eos\": true, \"include_stop_str_in_output\": true, \"skip_special_tokens\": false, \"logprobs\": 2,"
              "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"user\": \"u\", \"model\": \"m\"}",
           &r, &e) == 0);
  CHECK(r.n_prompts == 2 && r.n == 3 && r.stream && r.include_usage && r.logprobs == 2);
  di_request_params *p = &r.params[1];
  CHECK(p->n_prompt_ids == 1 && p->prompt_ids[0] == 8 && p->n == 3 && p->temperature == 0 && fabsf(p->top_p - 0.5f) < 1e-6);
  CHECK(p->top_k == 4 && fabsf(p->min_p - 0.2f) < 1e-6 && p->has_seed && p->seed == 9 && p->max_tokens == 7);
  CHECK(p->n_stop == 1 && strcmp(p->stop[0], "zz") == 0 && p->n_stop_token_ids == 1 && p->stop_token_ids[0] == 3);
  CHECK(p->n_logit_bias == 2 && p->logit_bias_ids[0] == 11 && p->logit_bias_values[0] == -100 && p->logit_bias_values[1] == 2.5f);
  CHECK(p->presence_penalty == 0.5f && p->frequency_penalty == -0.5f && fabsf(p->repetition_penalty - 1.2f) < 1e-6);
  CHECK(p->min_tokens == 2 && p->ignore_eos && p->include_stop_str_in_output && !p->skip_special_tokens && p->logprobs == 2);
  di_oai_request_free(&r);
  /* echo keeps the prompt text; a long prompt's default max_tokens is what is left of the context */
  char body[4096] = "{\"echo\": true, \"prompt\": [";
  for (int i = 0; i < 250; i++) strcat(body, i ? ",5" : "5");
  strcat(body, "]}");
  CHECK(rd(0, body, &r, &e) == 0);
  CHECK(r.params[0].max_tokens == 6 && r.echo && r.prompt_text[0] && r.params[0].prompt_logprobs == -1);
  di_oai_request_free(&r);
  /* lm-evaluation-harness scoring: echo + logprobs + max_tokens 0 is a score-only prompt-logprob request;
   * the engine computes the larger k of echo's logprobs and prompt_logprobs */
  CHECK(rd(0, "{\"prompt\": [1, 2, 3], \"echo\": true, \"logprobs\": 3, \"max_tokens\": 0, \"prompt_logprobs\": 1}",
           &r, &e) == 0);
  CHECK(r.echo_logprobs && r.prompt_logprobs == 1 && r.params[0].max_tokens == 0 && r.params[0].prompt_logprobs == 3);
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": [1, 2], \"echo\": true, \"max_tokens\": 0}", &r, &e) == 0);
  CHECK(!r.echo_logprobs && r.params[0].max_tokens == 0 && r.params[0].prompt_logprobs == 0);
  di_oai_request_free(&r);
}

static void test_structured(void) {
  di_oai_request r;
  di_oai_error e;
  CHECK(rd(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\","
              "\"json_schema\": {\"name\": \"n\", \"schema\": {\"type\": \"object\"}}}}", &r, &e) == 0);
  CHECK(r.params[0].json_schema && strcmp(r.params[0].json_schema, "{\"type\":\"object\"}") == 0 && !r.params[0].json_object);
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}", &r, &e) == 0 && r.params[0].json_object);
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"choice\": [\"a.b\", \"(c)\"]}}", &r, &e) == 0);
  CHECK(r.params[0].regex && strcmp(r.params[0].regex, "(a\\.b)|(\\(c\\))") == 0);
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": \"x\", \"guided_grammar\": \"root ::= \\\"a\\\"\"}", &r, &e) == 0 && r.params[0].grammar);
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": \"{\\\"type\\\": \\\"integer\\\"}\"}}", &r, &e) == 0);
  CHECK(r.params[0].json_schema && strstr(r.params[0].json_schema, "integer"));
  di_oai_request_free(&r);
  bad(0, "{\"prompt\": \"x\", \"guided_regex\": \"a\", \"response_format\": {\"type\": \"json_object\"}}", 400, "guided_regex");
  bad(0, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"xml\"}}", 400, "response_format.type");
  bad(0, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\"}}", 400, "response_format.json_schema");
  bad(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"choice\": []}}", 400, "structured_outputs.choice");
  /* XGrammar's separators [item, key] and max_whitespace (issue 23) */
  CHECK(rd(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, \"separators\": [\", \", \" : \"],"
              "\"max_whitespace\": 2}}", &r, &e) == 0);
  CHECK(r.params[0].item_separator && strcmp(r.params[0].item_separator, ", ") == 0);
  CHECK(r.params[0].key_separator && strcmp(r.params[0].key_separator, " : ") == 0 && r.params[0].max_whitespace == 2);
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, \"separators\": null}}", &r, &e) == 0);
  CHECK(!r.params[0].item_separator && !r.params[0].key_separator && r.params[0].max_whitespace == 0);
  di_oai_request_free(&r);
  static const char *const bad_seps[] = {"[\",\"]", "[\",\", \":\", \":\"]", "[\":\", \",\"]", "[\", ,\", \":\"]", "[\",x\", \":\"]",
                                   "[\",       \", \":\"]", "\", \"", "[1, 2]", "[\"\", \":\"]"};
  bad_structured_values("separators", bad_seps, sizeof bad_seps / sizeof *bad_seps);
  bad(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, \"max_whitespace\": 65}}", 400,
      "structured_outputs.max_whitespace");
  bad(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, \"max_whitespace\": -1}}", 400,
      "structured_outputs.max_whitespace");
  /* XGrammar's indent (issue 23, s13-23d) */
  CHECK(rd(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, \"indent\": 4, \"separators\": [\",\", \":\"]}}",
           &r, &e) == 0);
  CHECK(r.params[0].indent == 4 && r.params[0].item_separator && strcmp(r.params[0].item_separator, ",") == 0);
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, \"indent\": null}}", &r, &e) == 0);
  CHECK(r.params[0].indent == 0);
  di_oai_request_free(&r);
  static const char *const bad_indents[] = {"0", "17", "-1", "2.5", "\"2\"", "true"};
  bad_structured_values("indent", bad_indents, sizeof bad_indents / sizeof *bad_indents);
  bad(0, "{\"prompt\": \"x\", \"structured_outputs\": {\"json\": {}, \"indent\": 2, \"max_whitespace\": 1}}", 400,
      "structured_outputs.indent");
}

static void test_chat(void) {
  di_oai_request r;
  di_oai_error e;
  CHECK(rd(1, "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys.\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\","
              "\"text\": \"A\"}, {\"type\": \"text\", \"text\": \"B\"}]}], \"max_completion_tokens\": 4, \"max_tokens\": 9,"
              "\"logprobs\": true, \"top_logprobs\": 3, \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}",
           &r, &e) == 0);
  CHECK(r.rendered && strstr(r.rendered, "Sys.") && strstr(r.rendered, "A\nB") && r.params[0].max_tokens == 4);
  CHECK(r.logprobs == 3 && r.params[0].logprobs == 3 && r.parse_tools == 1);
  /* the template's BOS only: the rendered text is encoded without special tokens */
  int bos = 0;
  for (int i = 0; i < r.params[0].n_prompt_ids; i++) bos += r.params[0].prompt_ids[i] == 0;
  CHECK(bos == 1);
  di_oai_request_free(&r);
  CHECK(rd(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}], \"tool_choice\": \"none\"}",
           &r, &e) == 0 && r.parse_tools == 0);
  /* chat: the rest of the context by default */
  CHECK(r.params[0].max_tokens == 256 - r.params[0].n_prompt_ids);
  di_oai_request_free(&r);
  bad(1, "{\"messages\": []}", 400, "messages");
  bad(1, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages[0]");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages[0].content");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", 400, "messages[0].content");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}", 400, "top_logprobs");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": {\"type\": \"function\"}}", 400, "tool_choice");
  /* tool_choice "required" / named: constrained by a JSON schema of the call (as vLLM), no markup parsing */
#define TOOLS2 "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"," \
               "\"properties\": {\"a\": {\"type\": \"integer\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"g\"}}]"
  CHECK(rd(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], " TOOLS2 ", \"tool_choice\": \"required\"}", &r, &e) == 0);
  CHECK(r.tool_choice == DI_TOOL_CHOICE_REQUIRED && r.parse_tools == 0 && r.params[0].json_schema &&
        strstr(r.params[0].json_schema, "\"anyOf\"") && strstr(r.params[0].json_schema, "{\"const\":\"g\"}") &&
        strstr(r.params[0].json_schema, "\"minItems\":1"));
  di_oai_request_free(&r);
  CHECK(rd(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], " TOOLS2 ", \"tool_choice\": {\"type\": \"function\", "
              "\"function\": {\"name\": \"f\"}}}", &r, &e) == 0);
  CHECK(r.tool_choice == DI_TOOL_CHOICE_NAMED && r.tool_name && strcmp(r.tool_name, "f") == 0 && r.params[0].json_schema &&
        strcmp(r.params[0].json_schema, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}") == 0);
  di_oai_request_free(&r);
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], " TOOLS2 ", \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"h\"}}}", 400, "tool_choice");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}", 400, "tool_choice");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], " TOOLS2 ", \"tool_choice\": \"required\", "
         "\"guided_regex\": \"a\"}", 400, "tool_choice");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], " TOOLS2 ", \"tool_choice\": \"sometimes\"}", 400, "tool_choice");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}], "
         "\"tool_choice\": \"required\"}", 400, "tools");
  /* add_special_tokens false on completions: the text's tokens without BOS (vLLM's field) */
  CHECK(rd(0, "{\"prompt\": \"hello\", \"add_special_tokens\": false}", &r, &e) == 0);
  int32_t first_plain = r.params[0].prompt_ids[0];
  int n_plain = r.params[0].n_prompt_ids;
  di_oai_request_free(&r);
  CHECK(rd(0, "{\"prompt\": \"hello\"}", &r, &e) == 0);
  CHECK(first_plain != 0 && r.params[0].prompt_ids[0] == 0 && r.params[0].n_prompt_ids == n_plain + 1);
  di_oai_request_free(&r);
  bad(0, "{\"prompt\": \"hello\", \"add_special_tokens\": 0}", 400, "add_special_tokens");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"continue_final_message\": true}", 400, "continue_final_message");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": 3}", 400, "chat_template_kwargs");
}

static void test_errors(void) {
  di_oai_request r;
  di_oai_error e;
  CHECK(rd(0, "{\"prompt\": ", &r, &e) == -1 && e.status == 400 && strstr(e.message, "byte"));
  CHECK(rd(0, "", &r, &e) == -1 && e.status == 400);
  bad(0, "[1]", 400, "");
  bad(0, "{\"prompt\": \"x\", \"model\": \"gpt\"}", 404, "model");
  CHECK(rd(0, "{\"prompt\": \"x\", \"model\": \"gpt\"}", &r, &e) == -1 && strcmp(e.code, "model_not_found") == 0);
  bad(0, "{\"prompt\": \"x\", \"model\": 3}", 400, "model");
  bad(0, "{}", 400, "prompt");
  bad(0, "{\"prompt\": 5}", 400, "prompt");
  bad(0, "{\"prompt\": []}", 400, "prompt");
  bad(0, "{\"prompt\": [1, 8200]}", 400, "prompt");
  bad(0, "{\"prompt\": [1, 2.5]}", 400, "prompt");
  bad(0, "{\"prompt\": [[1], 3]}", 400, "prompt");
  bad(0, "{\"prompt\": \"x\", \"max_tokens\": 0}", 400, "max_tokens");
  bad(0, "{\"prompt\": \"x\", \"max_tokens\": 1.5}", 400, "max_tokens");
  bad(0, "{\"prompt\": \"x\", \"temperature\": \"1\"}", 400, "temperature");
  bad(0, "{\"prompt\": \"x\", \"top_p\": 1.5}", 400, "top_p");
  bad(0, "{\"prompt\": \"x\", \"min_p\": -0.1}", 400, "min_p");
  bad(0, "{\"prompt\": \"x\", \"n\": 2000}", 400, "n");
  bad(0, "{\"prompt\": \"x\", \"presence_penalty\": 3}", 400, "presence_penalty");
  bad(0, "{\"prompt\": \"x\", \"stream\": 1}", 400, "stream");
  bad(0, "{\"prompt\": \"x\", \"stop\": [\"\"]}", 400, "stop");
  bad(0, "{\"prompt\": \"x\", \"stop\": {}}", 400, "stop");
  bad(0, "{\"prompt\": \"x\", \"stop_token_ids\": [-1]}", 400, "stop_token_ids");
  bad(0, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", 400, "logit_bias");
  bad(0, "{\"prompt\": \"x\", \"logit_bias\": {\"8200\": 1}}", 400, "logit_bias");
  bad(0, "{\"prompt\": \"x\", \"logit_bias\": []}", 400, "logit_bias");
  bad(0, "{\"prompt\": \"x\", \"logprobs\": 21}", 400, "logprobs");
  bad(0, "{\"prompt\": \"x\", \"max_tokens\": 0}", 400, "max_tokens");
  bad(1, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 0}", 400, "max_tokens");
  bad(0, "{\"prompt\": \"x\", \"suffix\": \"s\"}", 400, "suffix");
  bad(0, "{\"prompt\": \"x\", \"best_of\": 2}", 400, "best_of");
  bad(0, "{\"prompt\": \"x\", \"stream_options\": {}}", 400, "stream_options");
  bad(0, "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}", 400, "include_usage");
  bad(0, "{\"prompt\": \"x\", \"prompt_logprobs\": 21}", 400, "prompt_logprobs");
  bad(0, "{\"prompt\": \"x\", \"prompt_logprobs\": 1, \"stream\": true}", 400, "prompt_logprobs");
  /* context limits: 256 here */
  char big[4096] = "{\"prompt\": [";
  for (int i = 0; i < 256; i++) strcat(big, i ? ",5" : "5");
  strcat(big, "]}");
  CHECK(rd(0, big, &r, &e) == -1 && e.status == 400 && strcmp(e.code, "context_length_exceeded") == 0 &&
        strcmp(e.param, "prompt") == 0 && strstr(e.message, "256"));
  big[strlen(big) - 4] = 0; /* 255 ids ... */
  strcat(big, "], \"max_tokens\": 2}");
  CHECK(rd(0, big, &r, &e) == -1 && strcmp(e.param, "max_tokens") == 0 && strcmp(e.code, "context_length_exceeded") == 0);
  char *j = di_oai_error_json(&e);
  CHECK(j && strstr(j, "\"error\":{\"message\":") && strstr(j, "\"param\":\"max_tokens\"") &&
        strstr(j, "\"code\":\"context_length_exceeded\"") && strstr(j, "\"type\":\"invalid_request_error\""));
  free(j);
  di_oai_fail(&e, 500, "server_error", NULL, NULL, "boom %d", 1);
  j = di_oai_error_json(&e);
  CHECK(j && strstr(j, "\"param\":null") && strstr(j, "\"code\":null") && strstr(j, "boom 1"));
  free(j);
}

/* a conversation too long for the context is refused after rendering at most what a prompt of
 * max_model_len tokens can be (max_model_len x max_token_bytes + 1 bytes), not after rendering all
 * of it; the bound itself is exact */
static void test_chat_render_bound(void) {
  const char *conv = "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello there, how are you?\"}]}";
  char *whole = NULL, *at = NULL, *below = NULL;
  CHECK(di_chat_template_render_json_bounded(ctx.tmpl, conv, -1, 0, &whole) == DI_OK && whole);
  size_t L = whole ? strlen(whole) : 0;
  CHECK(L > 10 && di_chat_template_render_json_bounded(ctx.tmpl, conv, -1, L, &at) == DI_OK && at && strcmp(at, whole) == 0);
  CHECK(di_chat_template_render_json_bounded(ctx.tmpl, conv, -1, L - 1, &below) == DI_ERR_CONTEXT_OVERFLOW && !below);
  CHECKF(strstr(di_last_error(), "too large"), "%s", di_last_error());
  free(whole);
  free(at);
  /* through the request reader: 256 tokens of at most 4 bytes = 1,024 bytes; 200 messages of 50 bytes */
  ctx.max_token_bytes = 4;
  size_t cap = 200 * 96 + 64;
  char *body = malloc(cap);
  strcpy(body, "{\"messages\": [");
  for (int i = 0; i < 200; i++)
    strcat(body, i ? ", {\"role\": \"user\", \"content\": \"0123456789012345678901234567890123456789012345678\"}"
                   : "{\"role\": \"user\", \"content\": \"0123456789012345678901234567890123456789012345678\"}");
  strcat(body, "]}");
  di_oai_request r;
  di_oai_error e;
  CHECK(rd(1, body, &r, &e) == -1 && e.status == 400 && strcmp(e.code, "context_length_exceeded") == 0 &&
        strcmp(e.param, "messages") == 0);
  CHECKF(strstr(e.message, "render to more than 1024 bytes"), "%s", e.message);
  /* a short conversation still renders and is read */
  CHECK(rd(1, conv, &r, &e) == 0 && r.rendered && strstr(r.rendered, "Hello there"));
  di_oai_request_free(&r);
  ctx.max_token_bytes = 0;
  free(body);
}

static void test_logprobs_shapes(void) {
  di_token_logprob top[2] = {{72, -0.1f}, {73, -INFINITY}};
  cJSON *o = di_oai_completion_logprobs_new();
  di_oai_add_logprob(ctx.tok, 0, o, 72, -0.1f, top, 2, 5);
  char *s = cJSON_PrintUnformatted(o);
  CHECKF(s && strstr(s, "\"text_offset\":[5]") && strstr(s, "\"token_logprobs\":[-0.1") && strstr(s, "-9999"), "%s", s);
  free(s);
  cJSON_Delete(o);
  cJSON *a = cJSON_CreateArray();
  di_oai_add_logprob(ctx.tok, 1, a, 72, -0.5f, top, 2, 0);
  cJSON *e0 = cJSON_GetArrayItem(a, 0);
  CHECK(cJSON_IsString(cJSON_GetObjectItem(e0, "token")) && cJSON_GetArraySize(cJSON_GetObjectItem(e0, "top_logprobs")) == 2);
  CHECK(cJSON_IsArray(cJSON_GetObjectItem(e0, "bytes")));
  cJSON_Delete(a);
  /* a token whose bytes are not valid UTF-8 reads with U+FFFD */
  int found = 0;
  for (int32_t id = 0; id < 8197 && !found; id++) {
    const char *raw;
    size_t n;
    char *t = di_oai_token_text(ctx.tok, id, &raw, &n);
    if (t && n == 1 && (unsigned char)raw[0] >= 0x80) found = strcmp(t, "\xEF\xBF\xBD") == 0 ? 1 : -1;
    free(t);
  }
  CHECK(found == 1);
}

static void test_fuzz_corpus(void) {
  /* through the target itself first: its own context (oai_fuzz_ctx.h) and checks */
  const int replayed = test_fuzz_replay("fuzz/corpus/openai", fuzz_openai_one);
  const char *dir = test_path("fuzz/corpus/openai");
  DIR *d = opendir(dir);
  CHECKF(d != NULL, "no corpus at %s", dir);
  if (!d) return;
  int files = 0, ok = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    char *buf = malloc(1 << 20);
    size_t n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    files++;
    for (int chat = 0; chat < 2; chat++) {
      di_oai_request r;
      di_oai_error e;
      if (di_oai_parse_request(&ctx, chat, buf, n, &r, &e) == 0) {
        ok++;
        di_oai_request_free(&r);
      } else {
        CHECKF(e.status >= 400 && e.status < 600 && e.message[0], "%s: status %d", de->d_name, e.status);
      }
    }
    free(buf);
  }
  closedir(d);
  CHECKF(files >= 10 && ok >= 5 && replayed == files, "%d files (%d through the target), %d read", files, replayed, ok);
  printf("fuzz corpus: %d files, %d reads succeeded\n", files, ok);
}

int main(void) {
  const char *dir = test_path("tests/data/models/engine-dummy");
  di_tokenizer *tok = NULL;
  di_chat_template *tmpl = NULL;
  CHECK(di_tokenizer_load(dir, &tok) == DI_OK);
  CHECK(di_chat_template_load(dir, &tmpl) == DI_OK);
  ctx.tok = tok;
  ctx.tmpl = tmpl;
  ctx.served_name = "m";
  ctx.model_dir = dir;
  ctx.max_model_len = 256;
  ctx.vocab_size = 8200;
  ctx.default_temperature = 0.7f;
  ctx.default_top_p = 0.95f;
  ctx.tool_parser = 1;
  if (tok && tmpl) {
    test_completions();
    test_structured();
    test_chat();
    test_errors();
    test_chat_render_bound();
    test_logprobs_shapes();
    test_fuzz_corpus();
  }
  di_tokenizer_free(tok);
  di_chat_template_free(tmpl);
  return test_finish("test_openai");
}
