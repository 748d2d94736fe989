/* OpenAI request bodies into engine requests (see openai.h). Field names and ranges follow the
 * OpenAI API; vLLM's extras (top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
 * stop_token_ids, skip_special_tokens, include_stop_str_in_output, structured_outputs and the older
 * guided_* fields) are read too. Sampling defaults come from generation_config.json, as vLLM does. */
#include "server/openai.h"
#include "server/tool_choice.h"
#include "chat/chat_template.h"
#include "util/json.h"
#include "sampler/sampling_ranges.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROMPTS 1024
#define MAX_SAMPLES 1024
#define MAX_STOPS 64
#define MAX_TOP_LOGPROBS 20

int di_oai_fail(di_oai_error *e, int status, const char *type, const char *param, const char *code,
                const char *fmt, ...) {
  e->status = status;
  e->type = type;
  e->code = code;
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return -1;
}

#define BAD(param, ...) di_oai_fail(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

char *di_oai_error_json(const di_oai_error *e) {
  const unsigned long alloc_mark = di_json_alloc_failures();
  cJSON *root = cJSON_CreateObject(), *o = cJSON_CreateObject();
  if (!root || !o) { cJSON_Delete(root); cJSON_Delete(o); return NULL; }
  cJSON_AddItemToObject(root, "error", o);
  cJSON_AddStringToObject(o, "message", e->message);
  cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
  if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param); else cJSON_AddNullToObject(o, "param");
  if (e->code) cJSON_AddStringToObject(o, "code", e->code); else cJSON_AddNullToObject(o, "code");
  char *s = di_json_print_checked(root, alloc_mark);
  cJSON_Delete(root);
  return s;
}

int di_oai_parse_json(const char *body, size_t len, cJSON **out, di_oai_error *err) {
  if (len == 0) return BAD("", "the request body is empty (expected a JSON object)");
  cJSON *root;
  if (di_json_parse(body, len, "request body", &root) != DI_OK) return BAD("", "%s", di_last_error());
  *out = root;
  return 0;
}

/* ---- typed fields ------------------------------------------------------------------------------ */
static const cJSON *field(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

/* an integer exactly representable as a double */
static int is_int(const cJSON *v) { return di_json_is_int_in(v, -DI_JSON_MAX_EXACT_INT, DI_JSON_MAX_EXACT_INT); }

static int get_int(const cJSON *o, const char *k, double lo, double hi, long long *out, di_oai_error *err) {
  const cJSON *v = field(o, k);
  if (!v) return 0;
  if (!is_int(v)) return BAD(k, "'%s' must be an integer", k);
  int64_t x;
  if (!di_json_int_in(v, lo, hi, &x)) return BAD(k, "'%s' must be in [%.0f, %.0f], got %.0f", k, lo, hi, v->valuedouble);
  *out = x;
  return 0;
}

/* A sampling parameter, checked against the range table every surface shares (sampler/sampling_ranges.h);
 * an integer one is also stored in *out_int (when non-NULL). */
static int get_sampling_value(const cJSON *o, const char *k, double *out, long long *out_int, di_oai_error *err) {
  const cJSON *v = field(o, k);
  if (!v) return 0;
  const di_sampling_range *r = di_sampling_range_find(k);
  if (r->integer ? !is_int(v) : !cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return BAD(k, "'%s' must be %s", k, r->integer ? "an integer" : "a number");
  char msg[160];
  if (!di_sampling_range_check(r, v->valuedouble, msg, sizeof msg)) return BAD(k, "'%s' %s", k, msg);
  int64_t x;
  if (out) *out = v->valuedouble;
  if (out_int && di_json_int_in(v, r->lo, r->hi, &x)) *out_int = (long long)x;
  return 0;
}
static int get_sampling(const cJSON *o, const char *k, double *out, di_oai_error *err) {
  return get_sampling_value(o, k, out, NULL, err);
}
static int get_sampling_int(const cJSON *o, const char *k, long long *out, di_oai_error *err) {
  return get_sampling_value(o, k, NULL, out, err);
}

static int get_bool(const cJSON *o, const char *k, int *out, di_oai_error *err) {
  const cJSON *v = field(o, k);
  if (!v) return 0;
  if (!cJSON_IsBool(v)) return BAD(k, "'%s' must be a boolean", k);
  *out = cJSON_IsTrue(v);
  return 0;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int di_oai_check_model(const di_oai_ctx *ctx, const cJSON *root, di_oai_error *err) {
  const cJSON *m = field(root, "model");
  if (!m) return 0;
  if (!cJSON_IsString(m)) return BAD("model", "'model' must be a string");
  if (strcmp(m->valuestring, ctx->served_name) == 0 || (ctx->model_dir && strcmp(m->valuestring, ctx->model_dir) == 0))
    return 0;
  return di_oai_fail(err, 404, "invalid_request_error", "model", "model_not_found",
                     "The model `%s` does not exist (this server serves `%s`).", m->valuestring, ctx->served_name);
}

/* ---- prompts ----------------------------------------------------------------------------------- */
static int add_prompt(di_oai_request *r, int32_t *ids, int n, char *text, di_oai_error *err) {
  if (r->n_prompts == MAX_PROMPTS) { free(ids); free(text); return BAD("prompt", "at most %d prompts per request", MAX_PROMPTS); }
  size_t k = (size_t)r->n_prompts + 1;
  int32_t **a = realloc(r->prompt_ids, k * sizeof *a);
  if (a) r->prompt_ids = a;
  int *b = realloc(r->n_prompt_ids, k * sizeof *b);
  if (b) r->n_prompt_ids = b;
  char **c = realloc(r->prompt_text, k * sizeof *c);
  if (c) r->prompt_text = c;
  if (!a || !b || !c) { free(ids); free(text); return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory"); }
  r->prompt_ids[r->n_prompts] = ids;
  r->n_prompt_ids[r->n_prompts] = n;
  r->prompt_text[r->n_prompts] = text;
  r->n_prompts++;
  return 0;
}

/* a text that cannot fit max_model_len tokens whatever its tokenization (every token is at most
 * max_token_bytes): refused without tokenizing it (the tokenizer's working memory is many times the text) */
static int text_too_long(const di_oai_ctx *ctx, size_t len, const char *param, di_oai_error *err) {
  if (!ctx->max_token_bytes || len / ctx->max_token_bytes <= (size_t)ctx->max_model_len) return 0;
  return di_oai_fail(err, 400, "invalid_request_error", param, "context_length_exceeded",
                     "This model's maximum context length is %d tokens. However, your %s is %zu bytes, more than %d "
                     "tokens of at most %zu bytes each. Please reduce the length of the %s.",
                     ctx->max_model_len, param, len, ctx->max_model_len, ctx->max_token_bytes, param);
}

di_status di_oai_encode_text(const di_tokenizer *tok, const char *s, int add_special_tokens, int32_t **ids, size_t *n) {
  const char *bos = di_tokenizer_bos_token(tok);
  int has_bos = bos && *bos && strncmp(s, bos, strlen(bos)) == 0;
  return add_special_tokens && !has_bos ? di_tokenizer_encode_prompt(tok, s, strlen(s), ids, n)
                                        : di_tokenizer_encode(tok, s, strlen(s), 0, ids, n);
}

static int text_prompt(const di_oai_ctx *ctx, di_oai_request *r, const char *s, di_oai_error *err) {
  if (!ctx->tok) return BAD("prompt", "text prompts need a tokenizer (the model folder has no tokenizer.json); send token ids");
  if (text_too_long(ctx, strlen(s), "prompt", err)) return -1;
  int32_t *ids = NULL;
  size_t n = 0;
  if (di_oai_encode_text(ctx->tok, s, r->add_special_tokens, &ids, &n) != DI_OK) return BAD("prompt", "%s", di_last_error());
  char *text = xstrdup(s);
  if (!text) { free(ids); return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory"); }
  return add_prompt(r, ids, (int)n, text, err);
}

static int ids_prompt(const di_oai_ctx *ctx, di_oai_request *r, const cJSON *arr, di_oai_error *err) {
  int n = cJSON_GetArraySize(arr);
  int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
  if (!ids) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  int i = 0;
  for (const cJSON *v = arr->child; v; v = v->next, i++) {
    int64_t id;
    if (!di_json_int_in(v, 0, ctx->vocab_size - 1, &id)) {
      free(ids);
      return BAD("prompt", "prompt token %d is not a token id in [0, %d)", i, ctx->vocab_size);
    }
    ids[i] = (int32_t)id;
  }
  char *text = NULL;
  if (r->echo && ctx->tok) {
    size_t len;
    if (di_tokenizer_decode(ctx->tok, ids, (size_t)n, 0, &text, &len) != DI_OK) text = NULL;
  }
  if (!text) text = xstrdup("");
  return add_prompt(r, ids, n, text, err);
}

static int read_prompts(const di_oai_ctx *ctx, di_oai_request *r, const cJSON *p, di_oai_error *err) {
  if (!p) return BAD("prompt", "'prompt' is required");
  if (cJSON_IsString(p)) return text_prompt(ctx, r, p->valuestring, err);
  if (!cJSON_IsArray(p) || !p->child)
    return BAD("prompt", "'prompt' must be a string, an array of token ids, or a non-empty array of those");
  if (cJSON_IsNumber(p->child)) return ids_prompt(ctx, r, p, err);
  for (const cJSON *v = p->child; v; v = v->next) {
    if (cJSON_IsString(v)) { if (text_prompt(ctx, r, v->valuestring, err)) return -1; }
    else if (cJSON_IsArray(v) && v->child) { if (ids_prompt(ctx, r, v, err)) return -1; }
    else return BAD("prompt", "each prompt in the array must be a string or a non-empty array of token ids");
  }
  return 0;
}

/* ---- chat -------------------------------------------------------------------------------------- */
/* content given as parts [{type: "text", text}] becomes one string (parts joined by "\n", as vLLM
 * does for templates that expect string content) */
static int flatten_content(cJSON *msg, int index, di_oai_error *err) {
  cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
  if (!c || cJSON_IsNull(c) || cJSON_IsString(c)) return 0;
  char param[64];
  snprintf(param, sizeof param, "messages[%d].content", index);
  if (!cJSON_IsArray(c)) return BAD(param, "'%s' must be a string, null or an array of content parts", param);
  size_t len = 0;
  for (cJSON *part = c->child; part; part = part->next) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
    if (!cJSON_IsObject(part) || !cJSON_IsString(type)) return BAD(param, "each part of '%s' must be an object with a 'type'", param);
    if (strcmp(type->valuestring, "text") != 0)
      return BAD(param, "content parts of type '%s' are not supported (text only)", type->valuestring);
    if (!cJSON_IsString(text)) return BAD(param, "a text part of '%s' needs a string 'text'", param);
    len += strlen(text->valuestring) + 1;
  }
  char *s = malloc(len + 1), *w = s;
  if (!s) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  for (cJSON *part = c->child; part; part = part->next) {
    const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
    if (w != s) *w++ = '\n';
    size_t n = strlen(t);
    memcpy(w, t, n);
    w += n;
  }
  *w = 0;
  cJSON *str = cJSON_CreateString(s);
  free(s);
  if (!str) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", str);
  return 0;
}

static int render_chat(const di_oai_ctx *ctx, di_oai_request *r, const cJSON *root, di_oai_error *err) {
  if (!ctx->tmpl)
    return BAD("messages", "the model has no chat template (chat_template.jinja or tokenizer_config.json's chat_template); use /v1/completions");
  if (!ctx->tok) return BAD("messages", "chat needs a tokenizer (the model folder has no tokenizer.json)");
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  if (!msgs || cJSON_IsNull(msgs)) return BAD("messages", "'messages' is required");
  if (!cJSON_IsArray(msgs) || !msgs->child) return BAD("messages", "'messages' must be a non-empty array");
  int add_gen = 1, cont = 0;
  const unsigned long alloc_mark = di_json_alloc_failures(); /* the conversation must be whole (util/json.h) */
  if (get_bool(root, "add_generation_prompt", &add_gen, err) || get_bool(root, "continue_final_message", &cont, err)) return -1;
  if (cont) return BAD("continue_final_message", "continue_final_message is not supported");
  cJSON *conv = cJSON_CreateObject();
  cJSON *m = cJSON_Duplicate(msgs, 1);
  if (!conv || !m) { cJSON_Delete(conv); cJSON_Delete(m); return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory"); }
  cJSON_AddItemToObject(conv, "messages", m);
  int i = 0;
  for (cJSON *msg = m->child; msg; msg = msg->next, i++) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d]", i);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) { cJSON_Delete(conv); return BAD(param, "'%s' must be an object with a string 'role'", param); }
    if (flatten_content(msg, i, err)) { cJSON_Delete(conv); return -1; }
  }
  const cJSON *tools = field(root, "tools"); /* checked by di_oai_read_tool_choice */
  if (tools && r->tool_choice != DI_TOOL_CHOICE_NONE) {
    di_json_add_item(conv, "tools", cJSON_Duplicate(tools, 1));
    r->parse_tools = ctx->tool_parser && r->tool_choice == DI_TOOL_CHOICE_AUTO && cJSON_GetArraySize(tools) > 0;
  }
  const cJSON *kw = field(root, "chat_template_kwargs");
  if (kw) {
    if (!cJSON_IsObject(kw)) { cJSON_Delete(conv); return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object"); }
    for (const cJSON *v = kw->child; v; v = v->next)
      if (strcmp(v->string, "messages") != 0 && strcmp(v->string, "tools") != 0 && strcmp(v->string, "add_generation_prompt") != 0)
        di_json_add_item(conv, v->string, cJSON_Duplicate(v, 1));
  }
  cJSON_AddBoolToObject(conv, "add_generation_prompt", add_gen);
  /* a reply constrained to JSON (a schema, json_object, a forced tool call) is JSON from its first
   * token: no <think> to split (a regex or grammar may spell one out, so those replies are split) */
  r->parse_reasoning = ctx->reasoning_parser && r->tool_choice < DI_TOOL_CHOICE_REQUIRED && !r->json_schema &&
                       !r->json_object;
  char *text = di_json_print_checked(conv, alloc_mark);
  cJSON_Delete(conv);
  if (!text) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  /* the render stops one byte past what any prompt of max_model_len tokens can be: a conversation too
   * long for the context costs no more than that, whatever its size */
  size_t fit = ctx->max_token_bytes ? (size_t)ctx->max_model_len * ctx->max_token_bytes : 0;
  di_status st = di_chat_template_render_json_bounded(ctx->tmpl, text, -1, fit ? fit + 1 : 0, &r->rendered);
  free(text);
  if (st == DI_ERR_CONTEXT_OVERFLOW && fit)
    return di_oai_fail(err, 400, "invalid_request_error", "messages", "context_length_exceeded",
                       "This model's maximum context length is %d tokens. However, your messages render to more than "
                       "%zu bytes, more than %d tokens of at most %zu bytes each. Please reduce the length of the messages.",
                       ctx->max_model_len, fit, ctx->max_model_len, ctx->max_token_bytes);
  if (st != DI_OK) return BAD("messages", "chat template: %s", di_last_error());
  int32_t *ids = NULL;
  size_t n = 0;
  /* the rendered template holds its own BOS: no special tokens added */
  if (text_too_long(ctx, strlen(r->rendered), "messages", err)) return -1;
  if (di_tokenizer_encode(ctx->tok, r->rendered, strlen(r->rendered), 0, &ids, &n) != DI_OK)
    return BAD("messages", "%s", di_last_error());
  char *copy = xstrdup("");
  if (!copy) { free(ids); return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory"); }
  return add_prompt(r, ids, (int)n, copy, err);
}

/* ---- structured outputs ------------------------------------------------------------------------ */
/* a regex matching exactly one of the strings (vLLM's guided_choice) */
static char *choice_regex(const cJSON *arr, di_oai_error *err, const char *param) {
  if (!cJSON_IsArray(arr) || !arr->child) { BAD(param, "'%s' must be a non-empty array of strings", param); return NULL; }
  size_t len = 1;
  for (const cJSON *v = arr->child; v; v = v->next) {
    if (!cJSON_IsString(v)) { BAD(param, "'%s' must be a non-empty array of strings", param); return NULL; }
    len += 2 * strlen(v->valuestring) + 3;
  }
  char *re = malloc(len), *w = re;
  if (!re) { di_oai_fail(err, 500, "server_error", "", NULL, "out of memory"); return NULL; }
  for (const cJSON *v = arr->child; v; v = v->next) {
    if (v != arr->child) *w++ = '|';
    *w++ = '(';
    for (const char *s = v->valuestring; *s; s++) {
      if (strchr("\\^$.|?*+()[]{}/", *s)) *w++ = '\\';
      *w++ = *s;
    }
    *w++ = ')';
  }
  *w = 0;
  return re;
}

static int set_struct(di_oai_request *r, int *count, const char *param, const cJSON *v, int kind, di_oai_error *err) {
  /* kind: 0 json schema, 1 regex, 2 grammar, 3 choice, 4 json_object */
  if (!v) return 0;
  if (++*count > 1)
    return BAD(param, "give at most one structured-output constraint (response_format, structured_outputs, guided_*)");
  char *s = NULL;
  if (kind == 0) {
    if (cJSON_IsString(v)) s = xstrdup(v->valuestring);
    else if (cJSON_IsObject(v) || cJSON_IsBool(v)) s = cJSON_PrintUnformatted(v);
    else return BAD(param, "'%s' must be a JSON schema (an object, or a string holding one)", param);
    r->json_schema = s;
  } else if (kind == 1 || kind == 2) {
    if (!cJSON_IsString(v)) return BAD(param, "'%s' must be a string", param);
    s = xstrdup(v->valuestring);
    if (kind == 1) r->regex = s; else r->grammar = s;
  } else if (kind == 3) {
    if (!(s = choice_regex(v, err, param))) return -1;
    r->regex = s;
  } else {
    if (!cJSON_IsTrue(v)) { --*count; return 0; }
    return 0;
  }
  if (!s) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  return 0;
}

/* structured_outputs.separators: XGrammar's [item, key] pair of exact JSON separators, each "," /
 * ":" with JSON whitespace around it (the content is checked again by the grammar compiler). */
static int read_separators(const cJSON *v, di_oai_request *r, di_oai_error *err) {
  static const char *what = "'separators' must be two strings [item, key]: ',' and ':' each with optional JSON "
                            "whitespace around it, at most 7 bytes";
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2) return BAD("structured_outputs.separators", "%s", what);
  for (int i = 0; i < 2; i++) {
    const cJSON *s = cJSON_GetArrayItem(v, i);
    if (!cJSON_IsString(s) || strlen(s->valuestring) > 7) return BAD("structured_outputs.separators", "%s", what);
    int marks = 0;
    for (const char *c = s->valuestring; *c; c++)
      marks += *c == (i ? ':' : ',') ? 1 : strchr(" \t\n\r", *c) ? 0 : 99;
    if (marks != 1) return BAD("structured_outputs.separators", "%s", what);
  }
  char *item = xstrdup(cJSON_GetArrayItem(v, 0)->valuestring), *key = xstrdup(cJSON_GetArrayItem(v, 1)->valuestring);
  if (!item || !key) {
    free(item); free(key);
    return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  }
  r->item_separator = item;
  r->key_separator = key;
  return 0;
}

/* structured_outputs' options beside the constraint: grammar_syntax ("gbnf" | "lark"), strict,
 * max_digits / max_string_length (positive, or -1 for unbounded), separators, max_whitespace
 * (0..DI_MAX_WHITESPACE), indent (1..DI_MAX_INDENT; docs/structured-outputs.md). */
static int read_structure_options(const cJSON *so, di_oai_request *r, di_oai_error *err) {
  const cJSON *syn = field(so, "grammar_syntax");
  if (syn) {
    if (!cJSON_IsString(syn) || (strcmp(syn->valuestring, "gbnf") != 0 && strcmp(syn->valuestring, "lark") != 0))
      return BAD("structured_outputs.grammar_syntax", "'grammar_syntax' must be \"gbnf\" or \"lark\"");
    r->grammar_syntax = strcmp(syn->valuestring, "lark") == 0;
  }
  const cJSON *strict = field(so, "strict");
  if (strict && !cJSON_IsBool(strict)) return BAD("structured_outputs.strict", "'strict' must be a boolean");
  if (cJSON_IsTrue(strict)) r->json_strict = 1;
  static const char *bounds[] = {"max_digits", "max_string_length"};
  for (int i = 0; i < 2; i++) {
    const cJSON *v = field(so, bounds[i]);
    if (!v) continue;
    int64_t x = 0;
    if (!di_json_int_in(v, -1, 1e9, &x) || x == 0)
      return BAD(i ? "structured_outputs.max_string_length" : "structured_outputs.max_digits",
                 "'%s' must be a positive integer or -1 (unbounded)", bounds[i]);
    *(i ? &r->max_string_length : &r->max_digits) = (int)x;
  }
  const cJSON *seps = field(so, "separators");
  if (seps && !cJSON_IsNull(seps) && read_separators(seps, r, err)) return -1;
  const cJSON *ws = field(so, "max_whitespace");
  if (ws) {
    int64_t x = 0;
    if (!di_json_int_in(ws, 0, DI_MAX_WHITESPACE, &x))
      return BAD("structured_outputs.max_whitespace", "'max_whitespace' must be an integer in 0..%d", DI_MAX_WHITESPACE);
    r->max_whitespace = (int)x;
  }
  const cJSON *ind = field(so, "indent"); /* XGrammar's indent (null: one line) */
  if (ind && !cJSON_IsNull(ind)) {
    int64_t x = 0;
    if (!di_json_int_in(ind, 1, DI_MAX_INDENT, &x))
      return BAD("structured_outputs.indent", "'indent' must be an integer in 1..%d (spaces per level)", DI_MAX_INDENT);
    if (r->max_whitespace)
      return BAD("structured_outputs.indent", "'indent' fixes the whitespace: give no 'max_whitespace' beside it");
    r->indent = (int)x;
  }
  return 0;
}

static int read_structure(const cJSON *root, di_oai_request *r, int *json_object, di_oai_error *err) {
  int count = 0;
  *json_object = 0;
  const cJSON *rf = field(root, "response_format");
  if (rf) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
      return BAD("response_format", "'response_format' must be an object with a string 'type'");
    if (strcmp(type->valuestring, "json_object") == 0) { *json_object = 1; count++; }
    else if (strcmp(type->valuestring, "json_schema") == 0) {
      const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
      const cJSON *schema = js ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
      if (!cJSON_IsObject(js)) return BAD("response_format.json_schema", "response_format of type json_schema needs a 'json_schema' object");
      if (!schema || cJSON_IsNull(schema)) return BAD("response_format.json_schema.schema", "'json_schema' needs a 'schema'");
      if (set_struct(r, &count, "response_format.json_schema.schema", schema, 0, err)) return -1;
      const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
      if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
        return BAD("response_format.json_schema.strict", "'strict' must be a boolean");
      r->json_strict = cJSON_IsTrue(strict);
    } else if (strcmp(type->valuestring, "text") != 0)
      return BAD("response_format.type", "response_format type must be \"text\", \"json_object\" or \"json_schema\", not \"%s\"",
                 type->valuestring);
  }
  const cJSON *so = field(root, "structured_outputs");
  if (so) {
    if (!cJSON_IsObject(so)) return BAD("structured_outputs", "'structured_outputs' must be an object");
    if (set_struct(r, &count, "structured_outputs.json", field(so, "json"), 0, err) ||
        set_struct(r, &count, "structured_outputs.regex", field(so, "regex"), 1, err) ||
        set_struct(r, &count, "structured_outputs.grammar", field(so, "grammar"), 2, err) ||
        set_struct(r, &count, "structured_outputs.choice", field(so, "choice"), 3, err))
      return -1;
    if (read_structure_options(so, r, err)) return -1;
    const cJSON *jo = field(so, "json_object");
    if (jo && !cJSON_IsBool(jo)) return BAD("structured_outputs.json_object", "'json_object' must be a boolean");
    if (cJSON_IsTrue(jo)) {
      if (++count > 1) return BAD("structured_outputs", "give at most one structured-output constraint");
      *json_object = 1;
    }
  }
  if (set_struct(r, &count, "guided_json", field(root, "guided_json"), 0, err) ||
      set_struct(r, &count, "guided_regex", field(root, "guided_regex"), 1, err) ||
      set_struct(r, &count, "guided_grammar", field(root, "guided_grammar"), 2, err) ||
      set_struct(r, &count, "guided_choice", field(root, "guided_choice"), 3, err))
    return -1;
  return 0;
}

/* ---- the request ------------------------------------------------------------------------------- */
static int read_stops(const cJSON *root, di_oai_request *r, di_oai_error *err) {
  const cJSON *st = field(root, "stop");
  if (st) {
    if (cJSON_IsString(st)) {
      r->stops = calloc(1, sizeof *r->stops);
      if (!r->stops || !(r->stops[0] = xstrdup(st->valuestring))) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
      r->n_stops = 1;
    } else if (cJSON_IsArray(st)) {
      int n = cJSON_GetArraySize(st);
      if (n > MAX_STOPS) return BAD("stop", "at most %d stop strings", MAX_STOPS);
      r->stops = calloc((size_t)(n ? n : 1), sizeof *r->stops);
      if (!r->stops) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
      for (const cJSON *v = st->child; v; v = v->next) {
        if (!cJSON_IsString(v)) return BAD("stop", "'stop' must be a string or an array of strings");
        if (!(r->stops[r->n_stops++] = xstrdup(v->valuestring))) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
      }
    } else {
      return BAD("stop", "'stop' must be a string or an array of strings");
    }
    for (int i = 0; i < r->n_stops; i++)
      if (!r->stops[i][0]) return BAD("stop", "stop strings must not be empty");
  }
  const cJSON *ids = field(root, "stop_token_ids");
  if (ids) {
    if (!cJSON_IsArray(ids)) return BAD("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    int n = cJSON_GetArraySize(ids);
    if (n > MAX_STOPS) return BAD("stop_token_ids", "at most %d stop token ids", MAX_STOPS);
    r->stop_token_ids = malloc((size_t)(n ? n : 1) * sizeof *r->stop_token_ids);
    if (!r->stop_token_ids) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
    for (const cJSON *v = ids->child; v; v = v->next) {
      int64_t id;
      if (!di_json_int_in(v, 0, 2147483647.0, &id))
        return BAD("stop_token_ids", "'stop_token_ids' must be an array of token ids");
      r->stop_token_ids[r->n_stop_token_ids++] = (int32_t)id;
    }
  }
  return 0;
}

static int read_logit_bias(const di_oai_ctx *ctx, const cJSON *root, di_oai_request *r, di_oai_error *err) {
  const cJSON *lb = field(root, "logit_bias");
  if (!lb) return 0;
  if (!cJSON_IsObject(lb)) return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
  int n = cJSON_GetArraySize(lb);
  r->bias_ids = malloc((size_t)(n ? n : 1) * sizeof *r->bias_ids);
  r->bias_values = malloc((size_t)(n ? n : 1) * sizeof *r->bias_values);
  if (!r->bias_ids || !r->bias_values) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  for (const cJSON *v = lb->child; v; v = v->next) {
    char *end;
    long id = strtol(v->string, &end, 10);
    if (!v->string[0] || *end || id < 0 || id >= ctx->vocab_size)
      return BAD("logit_bias", "logit_bias key \"%s\" is not a token id in [0, %d)", v->string, ctx->vocab_size);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < -100 || v->valuedouble > 100)
      return BAD("logit_bias", "logit_bias values must be numbers in [-100, 100]");
    r->bias_ids[r->n_bias] = (int32_t)id;
    r->bias_values[r->n_bias++] = (float)v->valuedouble;
  }
  return 0;
}

static int parse(const di_oai_ctx *ctx, int chat, const cJSON *root, di_oai_request *r, di_oai_error *err) {
  if (!cJSON_IsObject(root)) return BAD("", "the request body must be a JSON object");
  if (di_oai_check_model(ctx, root, err)) return -1;
  long long n = 1, max_tokens = -1, top_k = -2, min_tokens = 0, seed = -1, logprobs = -1;
  double temperature = NAN, top_p = NAN, min_p = 0, pres = 0, freq = 0, rep = 1;
  int ignore_eos = 0, skip_special = 1, include_stop = 0;
  if (get_bool(root, "stream", &r->stream, err) || get_sampling_int(root, "n", &n, err) ||
      get_sampling(root, "temperature", &temperature, err) || get_sampling(root, "top_p", &top_p, err) ||
      get_sampling_int(root, "top_k", &top_k, err) || get_sampling(root, "min_p", &min_p, err) ||
      get_sampling(root, "presence_penalty", &pres, err) || get_sampling(root, "frequency_penalty", &freq, err) ||
      get_sampling(root, "repetition_penalty", &rep, err) || get_sampling_int(root, "min_tokens", &min_tokens, err) ||
      get_int(root, "seed", -9223372036854775808.0, 18446744073709551615.0, &seed, err) ||
      get_bool(root, "ignore_eos", &ignore_eos, err) || get_bool(root, "skip_special_tokens", &skip_special, err) ||
      get_bool(root, "include_stop_str_in_output", &include_stop, err))
    return -1;
  int has_seed = field(root, "seed") != NULL;
  const char *mt_key = chat && field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  /* completions: 0 scores the prompt only (echo, prompt logprobs), as lm-evaluation-harness asks */
  if (get_int(root, mt_key, chat ? 1 : 0, 2147483647.0, &max_tokens, err)) return -1;
  if (max_tokens > 0 && min_tokens > max_tokens)
    return BAD("min_tokens", "'min_tokens' must be at most '%s' (%lld), got %lld", mt_key, max_tokens, min_tokens);
  long long best_of = n;
  if (get_int(root, "best_of", 1, MAX_SAMPLES, &best_of, err)) return -1;
  if (best_of != n) return BAD("best_of", "best_of other than n is not supported");
  const cJSON *so = field(root, "stream_options");
  if (so) {
    if (!r->stream) return BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object");
    if (get_bool(so, "include_usage", &r->include_usage, err) ||
        get_bool(so, "continuous_usage_stats", &r->continuous_usage, err))
      return -1;
  }
  if (chat) {
    int want = 0;
    if (get_bool(root, "logprobs", &want, err)) return -1;
    long long top = 0;
    if (get_int(root, "top_logprobs", 0, MAX_TOP_LOGPROBS, &top, err)) return -1;
    if (field(root, "top_logprobs") && !want) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->logprobs = want ? (int)top : -1;
  } else {
    if (get_int(root, "logprobs", 0, MAX_TOP_LOGPROBS, &logprobs, err) || get_bool(root, "echo", &r->echo, err)) return -1;
    r->logprobs = (int)logprobs;
    r->echo_logprobs = r->echo && logprobs >= 0;
    const cJSON *suffix = field(root, "suffix");
    if (suffix && !(cJSON_IsString(suffix) && !suffix->valuestring[0])) return BAD("suffix", "'suffix' is not supported");
  }
  long long plp = -1;
  if (get_int(root, "prompt_logprobs", 0, MAX_TOP_LOGPROBS, &plp, err)) return -1;
  r->prompt_logprobs = (int)plp;
  if (r->stream && plp >= 0) return BAD("prompt_logprobs", "prompt_logprobs is not supported with stream");
  if (max_tokens == 0 && !r->echo && plp < 0)
    return BAD(mt_key, "max_tokens 0 (scoring the prompt only) needs echo or prompt_logprobs");
  /* the engine computes the larger of the two k; each answer takes its own top entries */
  int engine_plp = r->echo_logprobs && logprobs > plp ? (int)logprobs : (int)plp;
  if (max_tokens == 0 && engine_plp < 0) engine_plp = 0; /* score-only requests are prompt-logprob requests */
  r->n = (int)n;
  if (read_stops(root, r, err) || read_logit_bias(ctx, root, r, err)) return -1;
  int json_object = 0;
  if (read_structure(root, r, &json_object, err)) return -1;
  r->json_object = json_object;
  if (chat && di_oai_read_tool_choice(root, r, json_object || r->json_schema || r->regex || r->grammar, err)) return -1;
  if (!chat && get_bool(root, "add_special_tokens", &r->add_special_tokens, err)) return -1;
  if (get_bool(root, "return_token_ids", &r->return_token_ids, err)) return -1;
  if (!ctx->tok) r->return_token_ids = 1;
  if (chat) {
    if (render_chat(ctx, r, root, err)) return -1;
  } else {
    if (read_prompts(ctx, r, field(root, "prompt"), err)) return -1;
  }
  if ((long long)r->n_prompts * n > MAX_SAMPLES)
    return BAD("n", "prompts x n must be at most %d, got %lld", MAX_SAMPLES, (long long)r->n_prompts * n);
  r->params = calloc((size_t)r->n_prompts, sizeof *r->params);
  if (!r->params) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  const char *pparam = chat ? "messages" : "prompt";
  for (int i = 0; i < r->n_prompts; i++) {
    int np = r->n_prompt_ids[i];
    if (np == 0) return BAD(pparam, "the prompt is empty (no tokens)");
    if (np > ctx->max_model_len || (np == ctx->max_model_len && max_tokens != 0))
      return di_oai_fail(err, 400, "invalid_request_error", pparam, "context_length_exceeded",
                         "This model's maximum context length is %d tokens. However, your request has %d input tokens "
                         "(the prompt must leave room for at least one generated token). Please reduce the length of the %s.",
                         ctx->max_model_len, np, chat ? "messages" : "prompt");
    if (max_tokens > 0 && np + max_tokens > ctx->max_model_len)
      return di_oai_fail(err, 400, "invalid_request_error", mt_key, "context_length_exceeded",
                         "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                         "(%d in the %s, %lld for the completion). Please reduce the length of the %s or the completion.",
                         ctx->max_model_len, np + max_tokens, np, chat ? "messages" : "prompt", max_tokens,
                         chat ? "messages" : "prompt");
    di_request_params *p = &r->params[i];
    di_request_params_default(p);
    p->prompt_ids = r->prompt_ids[i];
    p->n_prompt_ids = np;
    p->n = (int)n;
    p->temperature = !isnan(temperature) ? (float)temperature : !isnan(ctx->default_temperature) ? ctx->default_temperature : 1.0f;
    p->top_p = !isnan(top_p) ? (float)top_p : !isnan(ctx->default_top_p) && ctx->default_top_p > 0 ? ctx->default_top_p : 1.0f;
    p->top_k = top_k != -2 ? (int)(top_k < 0 ? 0 : top_k) : ctx->default_top_k > 0 ? ctx->default_top_k : 0;
    p->min_p = (float)min_p;
    p->presence_penalty = (float)pres;
    p->frequency_penalty = (float)freq;
    p->repetition_penalty = (float)rep;
    p->logit_bias_ids = r->bias_ids;
    p->logit_bias_values = r->bias_values;
    p->n_logit_bias = r->n_bias;
    if (has_seed) { p->has_seed = 1; p->seed = (uint64_t)seed; }
    p->logprobs = r->logprobs;
    /* OpenAI's defaults: 16 new tokens for completions, the rest of the context for chat */
    int room = ctx->max_model_len - np;
    p->max_tokens = max_tokens >= 0 ? (int)max_tokens : chat ? room : room < 16 ? room : 16;
    p->prompt_logprobs = engine_plp;
    p->min_tokens = (int)min_tokens;
    p->stop_token_ids = r->stop_token_ids;
    p->n_stop_token_ids = r->n_stop_token_ids;
    p->stop = (const char *const *)r->stops;
    p->n_stop = r->n_stops;
    p->ignore_eos = ignore_eos;
    p->include_stop_str_in_output = include_stop;
    p->skip_special_tokens = skip_special;
    p->json_schema = r->json_schema;
    p->regex = r->regex;
    p->grammar = r->grammar;
    p->json_object = json_object;
    p->grammar_syntax = r->grammar_syntax;
    p->json_strict = r->json_strict;
    p->max_digits = r->max_digits;
    p->max_string_length = r->max_string_length;
    p->item_separator = r->item_separator;
    p->key_separator = r->key_separator;
    p->max_whitespace = r->max_whitespace;
    p->indent = r->indent;
  }
  return 0;
}

int di_oai_parse_request(const di_oai_ctx *ctx, int chat, const char *body, size_t len, di_oai_request *r,
                         di_oai_error *err) {
  memset(r, 0, sizeof *r);
  r->chat = chat;
  r->add_special_tokens = 1;
  r->logprobs = -1;
  r->prompt_logprobs = -1;
  cJSON *root;
  if (di_oai_parse_json(body, len, &root, err)) return -1;
  int rc = parse(ctx, chat, root, r, err);
  cJSON_Delete(root);
  if (rc) di_oai_request_free(r);
  return rc;
}

void di_oai_request_free(di_oai_request *r) {
  for (int i = 0; i < r->n_prompts; i++) {
    free(r->prompt_ids[i]);
    free(r->prompt_text[i]);
  }
  free(r->prompt_ids);
  free(r->n_prompt_ids);
  free(r->prompt_text);
  for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
  free(r->stops);
  free(r->stop_token_ids);
  free(r->bias_ids);
  free(r->bias_values);
  free(r->json_schema);
  free(r->regex);
  free(r->grammar);
  free(r->item_separator);
  free(r->key_separator);
  free(r->tool_name);
  di_string_free(r->rendered);
  free(r->params);
  memset(r, 0, sizeof *r);
}

/* ---- logprobs ---------------------------------------------------------------------------------- */
/* length of the valid UTF-8 sequence at s[0..n), 0 if invalid */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len;
  unsigned min;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) { len = 2; min = 0x80; }
  else if (c >= 0xE0 && c <= 0xEF) { len = 3; min = 0x800; }
  else if (c >= 0xF0 && c <= 0xF4) { len = 4; min = 0x10000; }
  else return 0;
  if (n < len) return 0;
  unsigned cp = c & (0xFF >> (len + 1));
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

char *di_oai_token_text(const di_tokenizer *tok, int32_t id, const char **raw, size_t *raw_len) {
  size_t n = 0;
  const char *b = tok ? di_tokenizer_token_bytes(tok, id, &n) : NULL;
  if (!b) n = 0;
  if (raw) *raw = b;
  if (raw_len) *raw_len = n;
  char *out = malloc(3 * n + 1), *w = out;
  if (!out) return NULL;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq((const unsigned char *)b + i, n - i);
    if (k) { memcpy(w, b + i, k); w += k; i += k; }
    else { memcpy(w, "\xEF\xBF\xBD", 3); w += 3; i++; }
  }
  *w = 0;
  return out;
}

/* OpenAI clients expect finite numbers; -inf (a masked-out alternative) reads as vLLM's -9999 */
static double finite_lp(float lp) { return isfinite(lp) ? lp : -9999.0; }

static cJSON *bytes_array(const char *raw, size_t n) {
  cJSON *a = cJSON_CreateArray();
  for (size_t i = 0; a && i < n; i++) di_json_append(a, cJSON_CreateNumber((unsigned char)raw[i]));
  return a;
}

cJSON *di_oai_completion_logprobs_new(void) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  di_json_add_item(o, "text_offset", cJSON_CreateArray());
  di_json_add_item(o, "token_logprobs", cJSON_CreateArray());
  di_json_add_item(o, "tokens", cJSON_CreateArray());
  di_json_add_item(o, "top_logprobs", cJSON_CreateArray());
  return o;
}

void di_oai_add_logprob(const di_tokenizer *tok, int chat, cJSON *obj, int32_t id, float logprob,
                        const di_token_logprob *top, int n_top, int text_offset) {
  const char *raw;
  size_t raw_len;
  char *text = di_oai_token_text(tok, id, &raw, &raw_len);
  if (!text) return;
  if (chat) {
    cJSON *e = cJSON_CreateObject(), *tops = cJSON_CreateArray();
    cJSON_AddStringToObject(e, "token", text);
    cJSON_AddNumberToObject(e, "logprob", finite_lp(logprob));
    cJSON_AddItemToObject(e, "bytes", bytes_array(raw, raw_len));
    for (int k = 0; k < n_top; k++) {
      const char *traw;
      size_t tlen;
      char *tt = di_oai_token_text(tok, top[k].id, &traw, &tlen);
      if (!tt) continue;
      cJSON *t = cJSON_CreateObject();
      cJSON_AddStringToObject(t, "token", tt);
      cJSON_AddNumberToObject(t, "logprob", finite_lp(top[k].logprob));
      cJSON_AddItemToObject(t, "bytes", bytes_array(traw, tlen));
      cJSON_AddItemToArray(tops, t);
      free(tt);
    }
    cJSON_AddItemToObject(e, "top_logprobs", tops);
    cJSON_AddItemToArray(obj, e);
  } else {
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "tokens"), cJSON_CreateString(text));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "token_logprobs"), cJSON_CreateNumber(finite_lp(logprob)));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "text_offset"), cJSON_CreateNumber(text_offset));
    /* the chosen token and the top alternatives, keyed by text (as OpenAI's legacy format does) */
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, text, finite_lp(logprob));
    for (int k = 0; k < n_top; k++) {
      char *tt = di_oai_token_text(tok, top[k].id, NULL, NULL);
      if (!tt) continue;
      if (!cJSON_GetObjectItemCaseSensitive(d, tt)) cJSON_AddNumberToObject(d, tt, finite_lp(top[k].logprob));
      free(tt);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "top_logprobs"), d);
  }
  free(text);
}
