/* The Responses API over chat completions (see responses.h). The request side maps input items to
 * chat messages (consecutive function_call items become one assistant message with tool_calls, as
 * the chat templates expect); the reply side maps chat's reasoning_content / content / tool_calls to
 * output items in that order. Streamed, the chat chunks' deltas drive a small state machine: an item
 * opens (response.output_item.added) when its first delta arrives, closes (.done events) when a later
 * kind starts or the reply finishes, and the usage chunk ends the stream (response.completed). */
#include "server/responses.h"
#include "util/json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(param, ...) di_oai_fail(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static const cJSON *get(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return v && !cJSON_IsNull(v) ? v : NULL;
}

/* content given as a string or as parts [{type: input_text | output_text | text, text}] -> a string */
static cJSON *content_text(const cJSON *c, const char *param, di_oai_error *err) {
  if (cJSON_IsString(c)) return cJSON_CreateString(c->valuestring);
  if (!cJSON_IsArray(c)) { BAD(param, "'%s' must be a string or an array of text parts", param); return NULL; }
  size_t n = 1;
  for (const cJSON *p = c->child; p; p = p->next) {
    const cJSON *type = get(p, "type"), *text = get(p, "text");
    if (!cJSON_IsString(type) || !cJSON_IsString(text) ||
        (strcmp(type->valuestring, "input_text") != 0 && strcmp(type->valuestring, "output_text") != 0 &&
         strcmp(type->valuestring, "text") != 0)) {
      BAD(param, "parts of '%s' must be input_text or output_text with a 'text' (images and files are not supported)", param);
      return NULL;
    }
    n += strlen(text->valuestring) + 1;
  }
  char *s = malloc(n), *w = s;
  if (!s) return NULL;
  for (const cJSON *p = c->child; p; p = p->next) {
    const char *t = get(p, "text")->valuestring;
    if (w != s) *w++ = '\n';
    memcpy(w, t, strlen(t));
    w += strlen(t);
  }
  *w = 0;
  cJSON *out = cJSON_CreateString(s);
  free(s);
  return out;
}

static cJSON *message(const char *role, cJSON *content) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "role", role);
  if (content) di_json_add_item(m, "content", content); /* freed if m could not be made */
  else cJSON_AddNullToObject(m, "content");
  return m;
}

/* a function_call / custom_tool_call item as a chat tool call, added to the assistant message that
 * ends `msgs` (a new one when the last message is not such an assistant message) */
static int add_call(cJSON *msgs, const cJSON *item, int custom, int index, di_oai_error *err) {
  char param[64];
  snprintf(param, sizeof param, "input[%d]", index);
  const cJSON *name = get(item, "name"), *call_id = get(item, "call_id");
  const cJSON *args = get(item, custom ? "input" : "arguments");
  if (!cJSON_IsString(name) || !cJSON_IsString(args))
    return BAD(param, "a %s item needs a string 'name' and '%s'", custom ? "custom_tool_call" : "function_call",
               custom ? "input" : "arguments");
  cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
  cJSON *calls = last ? cJSON_GetObjectItemCaseSensitive(last, "tool_calls") : NULL;
  const cJSON *role = last ? get(last, "role") : NULL;
  if (!calls || !cJSON_IsString(role) || strcmp(role->valuestring, "assistant") != 0) {
    last = message("assistant", NULL);
    calls = cJSON_AddArrayToObject(last, "tool_calls");
    cJSON_AddItemToArray(msgs, last);
  }
  cJSON *c = cJSON_CreateObject();
  cJSON_AddStringToObject(c, "id", cJSON_IsString(call_id) ? call_id->valuestring : "");
  cJSON_AddStringToObject(c, "type", "function");
  cJSON *f = cJSON_AddObjectToObject(c, "function");
  cJSON_AddStringToObject(f, "name", name->valuestring);
  cJSON_AddStringToObject(f, "arguments", args->valuestring);
  di_json_append(calls, c); /* freed if calls could not be made */
  return 0;
}

static int read_input(const cJSON *input, cJSON *msgs, di_oai_error *err) {
  if (cJSON_IsString(input)) {
    di_json_append(msgs, message("user", cJSON_CreateString(input->valuestring)));
    return 0;
  }
  if (!cJSON_IsArray(input)) return BAD("input", "'input' must be a string or an array of input items");
  int i = 0;
  for (const cJSON *it = input->child; it; it = it->next, i++) {
    char param[64];
    snprintf(param, sizeof param, "input[%d]", i);
    if (!cJSON_IsObject(it)) return BAD(param, "'%s' must be an object", param);
    const cJSON *type = get(it, "type"), *role = get(it, "role");
    const char *t = cJSON_IsString(type) ? type->valuestring : "message";
    if (strcmp(t, "message") == 0) {
      if (!cJSON_IsString(role)) return BAD(param, "a message item needs a 'role'");
      const char *r = role->valuestring;
      if (strcmp(r, "developer") == 0) r = "system";
      if (strcmp(r, "user") != 0 && strcmp(r, "system") != 0 && strcmp(r, "assistant") != 0)
        return BAD(param, "role '%s' is not one of user, system, developer, assistant", role->valuestring);
      char cp[80];
      snprintf(cp, sizeof cp, "%s.content", param);
      cJSON *c = content_text(get(it, "content"), cp, err);
      if (!c) return -1;
      di_json_append(msgs, message(r, c));
    } else if (strcmp(t, "function_call") == 0 || strcmp(t, "custom_tool_call") == 0) {
      if (add_call(msgs, it, t[0] == 'c', i, err)) return -1;
    } else if (strcmp(t, "function_call_output") == 0 || strcmp(t, "custom_tool_call_output") == 0) {
      const cJSON *out = get(it, "output"), *call_id = get(it, "call_id");
      char cp[80];
      snprintf(cp, sizeof cp, "%s.output", param);
      cJSON *c = content_text(out, cp, err);
      if (!c) return -1;
      cJSON *m = message("tool", c);
      if (cJSON_IsString(call_id)) cJSON_AddStringToObject(m, "tool_call_id", call_id->valuestring);
      di_json_append(msgs, m);
    } else if (strcmp(t, "reasoning") == 0) {
      continue; /* earlier reasoning is not replayed (templates drop it too) */
    } else {
      return BAD(param, "input items of type '%s' are not supported", t);
    }
  }
  if (!msgs->child) return BAD("input", "'input' has no messages");
  return 0;
}

/* tools -> chat tools; custom tools are described to the template as functions taking a string */
static int read_tools(const cJSON *tools, cJSON *chat, di_resp_req *rr, di_oai_error *err) {
  if (!tools) return 0;
  if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array");
  cJSON *out = cJSON_AddArrayToObject(chat, "tools");
  int i = 0;
  for (const cJSON *t = tools->child; t; t = t->next, i++) {
    char param[32];
    snprintf(param, sizeof param, "tools[%d]", i);
    const cJSON *type = get(t, "type"), *name = get(t, "name"), *desc = get(t, "description");
    if (!cJSON_IsString(type)) return BAD(param, "'%s' needs a 'type'", param);
    int custom = strcmp(type->valuestring, "custom") == 0;
    if (!custom && strcmp(type->valuestring, "function") != 0)
      return BAD(param, "tools of type '%s' are not supported (function and custom are)", type->valuestring);
    if (!cJSON_IsString(name) || !name->valuestring[0]) return BAD(param, "'%s' needs a 'name'", param);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name->valuestring);
    if (cJSON_IsString(desc)) cJSON_AddStringToObject(f, "description", desc->valuestring);
    if (custom) {
      cJSON *p = cJSON_AddObjectToObject(f, "parameters");
      cJSON_AddStringToObject(p, "type", "string");
      char **names = realloc(rr->custom_names, (size_t)(rr->n_custom + 1) * sizeof *names);
      if (!names) { cJSON_Delete(c); return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory"); }
      rr->custom_names = names;
      names[rr->n_custom++] = strdup(name->valuestring);
    } else {
      const cJSON *params = get(t, "parameters");
      if (params) di_json_add_item(f, "parameters", cJSON_Duplicate(params, 1));
    }
    di_json_append(out, c); /* freed if out could not be made */
  }
  return 0;
}

static const cJSON *find_tool(const cJSON *tools, const char *name) {
  for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next) {
    const cJSON *n = get(t, "name");
    if (cJSON_IsString(n) && strcmp(n->valuestring, name) == 0) return t;
  }
  return NULL;
}

/* tool_choice; a named custom tool is constrained by its grammar (regex) */
static int read_tool_choice(const cJSON *root, cJSON *chat, di_resp_req *rr, di_oai_error *err) {
  const cJSON *tc = get(root, "tool_choice"), *tools = get(root, "tools");
  if (!tc) return 0;
  if (cJSON_IsString(tc)) {
    if (strcmp(tc->valuestring, "required") == 0 && rr->n_custom)
      return BAD("tool_choice", "tool_choice \"required\" with custom tools is not supported (name the tool)");
    cJSON_AddStringToObject(chat, "tool_choice", tc->valuestring);
    return 0;
  }
  const cJSON *type = get(tc, "type"), *name = get(tc, "name");
  if (!cJSON_IsObject(tc) || !cJSON_IsString(type) || !cJSON_IsString(name))
    return BAD("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\"|\"custom\", \"name\": ...}");
  const cJSON *tool = find_tool(tools, name->valuestring);
  if (!tool) return BAD("tool_choice", "tool_choice names \"%s\", which is not in 'tools'", name->valuestring);
  if (strcmp(type->valuestring, "function") == 0) {
    cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    return 0;
  }
  if (strcmp(type->valuestring, "custom") != 0) return BAD("tool_choice.type", "tool_choice type must be function or custom");
  rr->forced_custom = strdup(name->valuestring);
  const cJSON *format = get(tool, "format"), *ftype = format ? get(format, "type") : NULL;
  if (!ftype || strcmp(ftype->valuestring, "text") == 0) return 0; /* free text is the input */
  const cJSON *syntax = get(format, "syntax"), *def = get(format, "definition");
  if (strcmp(ftype->valuestring, "grammar") != 0 || !cJSON_IsString(syntax) || !cJSON_IsString(def))
    return BAD("tools", "a custom tool's format must be {\"type\": \"text\"} or {\"type\": \"grammar\", \"syntax\": "
               "\"regex\"|\"lark\", \"definition\": ...}");
  if (get(chat, "structured_outputs") || get(chat, "response_format"))
    return BAD("tool_choice", "a custom tool's grammar is the reply's constraint: give no other structured output with it");
  if (strcmp(syntax->valuestring, "regex") == 0) {
    cJSON_AddStringToObject(cJSON_AddObjectToObject(chat, "structured_outputs"), "regex", def->valuestring);
    return 0;
  }
  if (strcmp(syntax->valuestring, "lark") == 0) { /* llguidance's Lark, as structured_outputs takes it */
    cJSON *so = cJSON_AddObjectToObject(chat, "structured_outputs");
    cJSON_AddStringToObject(so, "grammar", def->valuestring);
    cJSON_AddStringToObject(so, "grammar_syntax", "lark");
    return 0;
  }
  return BAD("tools", "custom tool grammar syntax must be \"regex\" or \"lark\", not \"%s\"", syntax->valuestring);
}

/* text.format -> response_format */
static int read_text_format(const cJSON *root, cJSON *chat, di_oai_error *err) {
  const cJSON *text = get(root, "text"), *format = text ? get(text, "format") : NULL;
  if (!format) return 0;
  const cJSON *type = get(format, "type");
  if (!cJSON_IsString(type)) return BAD("text.format", "'text.format' needs a 'type'");
  cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
  cJSON_AddStringToObject(rf, "type", type->valuestring);
  if (strcmp(type->valuestring, "json_schema") == 0) {
    const cJSON *schema = get(format, "schema"), *name = get(format, "name");
    if (!schema) return BAD("text.format.schema", "text.format of type json_schema needs a 'schema'");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddStringToObject(js, "name", cJSON_IsString(name) ? name->valuestring : "response");
    di_json_add_item(js, "schema", cJSON_Duplicate(schema, 1));
  } else if (strcmp(type->valuestring, "text") != 0 && strcmp(type->valuestring, "json_object") != 0) {
    return BAD("text.format.type", "text.format type must be text, json_object or json_schema, not \"%s\"", type->valuestring);
  }
  return 0;
}

int di_resp_translate(const char *body, size_t len, char **chat_body, di_resp_req *rr, di_oai_error *err) {
  memset(rr, 0, sizeof *rr);
  *chat_body = NULL;
  const unsigned long alloc_mark = di_json_alloc_failures(); /* the chat body must be whole (util/json.h) */
  cJSON *root;
  if (di_oai_parse_json(body, len, &root, err)) return -1;
  cJSON *chat = cJSON_CreateObject(), *msgs = cJSON_CreateArray();
  int rc = -1;
  if (!chat || !msgs) { di_oai_fail(err, 500, "server_error", "", NULL, "out of memory"); goto out; }
  const cJSON *store = get(root, "store"), *prev = get(root, "previous_response_id"), *v;
  if (!cJSON_IsObject(root)) { BAD("", "the request body must be a JSON object"); goto out; }
  if (prev) {
    BAD("previous_response_id", "previous_response_id is not supported: this server keeps no responses (it is "
        "stateless); send the whole conversation in 'input'");
    goto out;
  }
  if (store && !cJSON_IsFalse(store)) {
    BAD("store", "store must be false: this server keeps no responses (it is stateless)");
    goto out;
  }
  if (get(root, "background") && !cJSON_IsFalse(get(root, "background"))) { BAD("background", "background responses are not supported"); goto out; }
  const cJSON *instr = get(root, "instructions");
  if (instr && !cJSON_IsString(instr)) { BAD("instructions", "'instructions' must be a string"); goto out; }
  if (instr) di_json_append(msgs, message("system", cJSON_CreateString(instr->valuestring)));
  if (!get(root, "input")) { BAD("input", "'input' is required"); goto out; }
  if (read_input(get(root, "input"), msgs, err)) goto out;
  di_json_add_item(chat, "messages", msgs); /* freed if it cannot be added */
  msgs = NULL;
  /* the sampling fields both APIs share, and vLLM's extras (structured outputs, penalties ...) */
  static const char *const same[] = {"model", "temperature", "top_p", "stream", "seed", "top_k", "min_p",
                                     "repetition_penalty", "presence_penalty", "frequency_penalty", "stop",
                                     "parallel_tool_calls", "min_tokens", "ignore_eos", "logit_bias", "stop_token_ids",
                                     "skip_special_tokens", "chat_template_kwargs", "structured_outputs",
                                     "guided_json", "guided_regex", "guided_grammar", "guided_choice"};
  for (size_t i = 0; i < sizeof same / sizeof *same; i++)
    if ((v = get(root, same[i]))) di_json_add_item(chat, same[i], cJSON_Duplicate(v, 1));
  if ((v = get(root, "max_output_tokens"))) di_json_add_item(chat, "max_tokens", cJSON_Duplicate(v, 1));
  if (cJSON_IsTrue(get(root, "stream"))) cJSON_AddTrueToObject(cJSON_AddObjectToObject(chat, "stream_options"), "include_usage");
  if (read_tools(get(root, "tools"), chat, rr, err) || read_tool_choice(root, chat, rr, err) ||
      read_text_format(root, chat, err))
    goto out;
  cJSON_DeleteItemFromObjectCaseSensitive(chat, "parallel_tool_calls"); /* accepted, calls are always parallel-capable */
  rr->echo = cJSON_CreateObject();
  static const char *const echoed[] = {"instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
                                       "text", "metadata", "parallel_tool_calls", "reasoning", "user"};
  for (size_t i = 0; i < sizeof echoed / sizeof *echoed; i++)
    if ((v = get(root, echoed[i]))) di_json_add_item(rr->echo, echoed[i], cJSON_Duplicate(v, 1));
  *chat_body = di_json_print_checked(chat, alloc_mark);
  rc = *chat_body ? 0 : di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
out:
  cJSON_Delete(msgs);
  cJSON_Delete(chat);
  cJSON_Delete(root);
  if (rc) di_resp_req_free(rr);
  return rc;
}

int di_resp_adjust(di_resp_req *rr, di_oai_request *r, di_oai_error *err) {
  if (!rr->forced_custom) return 0;
  r->tool_choice = DI_TOOL_CHOICE_NAMED;
  r->parse_tools = 0;
  r->parse_reasoning = 0;
  free(r->tool_name);
  r->tool_name = strdup(rr->forced_custom);
  return r->tool_name ? 0 : di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
}

void di_resp_req_free(di_resp_req *rr) {
  cJSON_Delete(rr->echo);
  for (int i = 0; i < rr->n_custom; i++) free(rr->custom_names[i]);
  free(rr->custom_names);
  free(rr->forced_custom);
  free(rr->text);
  free(rr->reasoning);
  for (int i = 0; i < rr->n_calls; i++) { free(rr->calls[i].name); free(rr->calls[i].args); }
  free(rr->calls);
  cJSON_Delete(rr->done_items);
  memset(rr, 0, sizeof *rr);
}

/* ---- the reply --------------------------------------------------------------------------------- */
static int is_custom(const di_resp_req *rr, const char *name) {
  for (int i = 0; i < rr->n_custom; i++)
    if (strcmp(rr->custom_names[i], name) == 0) return 1;
  return 0;
}

/* item ids from the response id: msg_..., rs_..., fc_... plus the item's place */
static void item_id(const di_resp_req *rr, const char *prefix, int index, char *out, size_t cap) {
  const char *tail = strchr(rr->resp_id, '_');
  snprintf(out, cap, "%s%s_%d", prefix, tail ? tail + 1 : rr->resp_id, index);
}

static cJSON *reasoning_item(const char *id, const char *text) {
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "type", "reasoning");
  cJSON_AddStringToObject(it, "id", id);
  cJSON_AddArrayToObject(it, "summary");
  cJSON *content = cJSON_AddArrayToObject(it, "content");
  if (text) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "reasoning_text");
    cJSON_AddStringToObject(p, "text", text);
    di_json_append(content, p);
  }
  cJSON_AddStringToObject(it, "status", text ? "completed" : "in_progress");
  return it;
}

static cJSON *text_part(const char *text) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddStringToObject(p, "type", "output_text");
  cJSON_AddStringToObject(p, "text", text);
  cJSON_AddArrayToObject(p, "annotations");
  cJSON_AddArrayToObject(p, "logprobs");
  return p;
}

static cJSON *message_item(const char *id, const char *text) {
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "type", "message");
  cJSON_AddStringToObject(it, "id", id);
  cJSON_AddStringToObject(it, "status", text ? "completed" : "in_progress");
  cJSON_AddStringToObject(it, "role", "assistant");
  cJSON *content = cJSON_AddArrayToObject(it, "content");
  if (text) di_json_append(content, text_part(text));
  return it;
}

static cJSON *call_item(const di_resp_req *rr, const char *id, const char *call_id, const char *name, const char *args,
                        int done) {
  int custom = is_custom(rr, name);
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "type", custom ? "custom_tool_call" : "function_call");
  cJSON_AddStringToObject(it, "id", id);
  cJSON_AddStringToObject(it, "call_id", call_id);
  cJSON_AddStringToObject(it, "name", name);
  cJSON_AddStringToObject(it, custom ? "input" : "arguments", args);
  cJSON_AddStringToObject(it, "status", done ? "completed" : "in_progress");
  return it;
}

/* the Response object around `output` (taken) */
static cJSON *response_object(const di_resp_req *rr, const char *status, cJSON *output, const cJSON *usage) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", rr->resp_id);
  cJSON_AddStringToObject(o, "object", "response");
  cJSON_AddNumberToObject(o, "created_at", rr->created);
  cJSON_AddStringToObject(o, "status", status);
  if (rr->incomplete && strcmp(status, "incomplete") == 0)
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
  else
    cJSON_AddNullToObject(o, "incomplete_details");
  cJSON_AddNullToObject(o, "error");
  cJSON_AddStringToObject(o, "model", rr->model);
  di_json_add_item(o, "output", output ? output : cJSON_CreateArray());
  cJSON_AddFalseToObject(o, "store");
  cJSON_AddNullToObject(o, "previous_response_id");
  static const char *const keys[] = {"instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
                                     "text", "metadata", "reasoning", "user"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    const cJSON *v = get(rr->echo, keys[i]);
    if (v) di_json_add_item(o, keys[i], cJSON_Duplicate(v, 1));
    else if (!strcmp(keys[i], "tools")) cJSON_AddArrayToObject(o, "tools");
    else if (!strcmp(keys[i], "tool_choice")) cJSON_AddStringToObject(o, "tool_choice", "auto");
    else if (!strcmp(keys[i], "text")) cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "text"), "format"), "type", "text");
    else if (!strcmp(keys[i], "metadata")) cJSON_AddObjectToObject(o, "metadata");
    else cJSON_AddNullToObject(o, keys[i]);
  }
  const cJSON *ptc = get(rr->echo, "parallel_tool_calls");
  cJSON_AddBoolToObject(o, "parallel_tool_calls", ptc ? cJSON_IsTrue(ptc) : 1);
  cJSON_AddStringToObject(o, "truncation", "disabled");
  if (usage) {
    const cJSON *pt = get(usage, "prompt_tokens"), *ct = get(usage, "completion_tokens");
    const cJSON *det = get(usage, "prompt_tokens_details"), *cached = det ? get(det, "cached_tokens") : NULL;
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", pt ? pt->valuedouble : 0);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", cached ? cached->valuedouble : 0);
    cJSON_AddNumberToObject(u, "output_tokens", ct ? ct->valuedouble : 0);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", (pt ? pt->valuedouble : 0) + (ct ? ct->valuedouble : 0));
  } else {
    cJSON_AddNullToObject(o, "usage");
  }
  return o;
}

static void take_envelope(di_resp_req *rr, const cJSON *chat) {
  const cJSON *id = get(chat, "id"), *created = get(chat, "created"), *model = get(chat, "model");
  if (!rr->resp_id[0]) snprintf(rr->resp_id, sizeof rr->resp_id, "%s", cJSON_IsString(id) ? id->valuestring : "resp_");
  if (cJSON_IsNumber(created)) rr->created = created->valuedouble;
  if (cJSON_IsString(model)) snprintf(rr->model, sizeof rr->model, "%s", model->valuestring);
}

cJSON *di_resp_from_chat(di_resp_req *rr, cJSON *chat) {
  take_envelope(rr, chat);
  const cJSON *choice = cJSON_GetArrayItem(get(chat, "choices"), 0);
  const cJSON *m = get(choice, "message"), *finish = get(choice, "finish_reason");
  cJSON *output = cJSON_CreateArray();
  char id[128];
  const cJSON *reasoning = get(m, "reasoning_content"), *content = get(m, "content"), *calls = get(m, "tool_calls");
  if (cJSON_IsString(reasoning) && reasoning->valuestring[0]) { /* as streamed: no item for no reasoning */
    item_id(rr, "rs_", cJSON_GetArraySize(output), id, sizeof id);
    di_json_append(output, reasoning_item(id, reasoning->valuestring));
  }
  if (cJSON_IsString(content) && (content->valuestring[0] || !calls)) {
    item_id(rr, "msg_", cJSON_GetArraySize(output), id, sizeof id);
    di_json_append(output, message_item(id, content->valuestring));
  }
  for (const cJSON *c = calls ? calls->child : NULL; c; c = c->next) {
    const cJSON *f = get(c, "function"), *cid = get(c, "id");
    item_id(rr, "fc_", cJSON_GetArraySize(output), id, sizeof id);
    di_json_append(output, call_item(rr, id, cJSON_IsString(cid) ? cid->valuestring : "", get(f, "name")->valuestring,
                                           get(f, "arguments")->valuestring, 1));
  }
  rr->incomplete = cJSON_IsString(finish) && strcmp(finish->valuestring, "length") == 0;
  cJSON *o = response_object(rr, rr->incomplete ? "incomplete" : "completed", output, get(chat, "usage"));
  cJSON_Delete(chat);
  return o;
}

/* ---- streaming --------------------------------------------------------------------------------- */
static cJSON *event(di_resp_req *rr) {
  cJSON *e = cJSON_CreateObject();
  cJSON_AddNumberToObject(e, "sequence_number", rr->seq++);
  return e;
}

static void emit_item(di_resp_req *rr, const char *type, int index, cJSON *item, di_resp_emit_fn emit, void *ctx) {
  cJSON *e = event(rr);
  cJSON_AddNumberToObject(e, "output_index", index);
  di_json_add_item(e, "item", item);
  emit(ctx, type, e);
}

static void grow(char **s, size_t *len, const char *add, size_t n) {
  char *p = realloc(*s, *len + n + 1);
  if (!p) return;
  memcpy(p + *len, add, n);
  *len += n;
  p[*len] = 0;
  *s = p;
}

/* closes the open reasoning or message item */
static void close_text_items(di_resp_req *rr, di_resp_emit_fn emit, void *ctx) {
  if (rr->reasoning_open) {
    cJSON *e = event(rr);
    cJSON_AddStringToObject(e, "item_id", rr->item_id);
    cJSON_AddNumberToObject(e, "output_index", rr->item_index);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddStringToObject(e, "text", rr->reasoning ? rr->reasoning : "");
    emit(ctx, "response.reasoning_text.done", e);
    cJSON *item = reasoning_item(rr->item_id, rr->reasoning ? rr->reasoning : "");
    di_json_append(rr->done_items, cJSON_Duplicate(item, 1));
    emit_item(rr, "response.output_item.done", rr->item_index, item, emit, ctx);
    rr->reasoning_open = 0;
  }
  if (rr->text_open) {
    const char *t = rr->text ? rr->text : "";
    cJSON *e = event(rr);
    cJSON_AddStringToObject(e, "item_id", rr->item_id);
    cJSON_AddNumberToObject(e, "output_index", rr->item_index);
    cJSON_AddNumberToObject(e, "content_index", 0);
    cJSON_AddStringToObject(e, "text", t);
    cJSON_AddArrayToObject(e, "logprobs");
    emit(ctx, "response.output_text.done", e);
    e = event(rr);
    cJSON_AddStringToObject(e, "item_id", rr->item_id);
    cJSON_AddNumberToObject(e, "output_index", rr->item_index);
    cJSON_AddNumberToObject(e, "content_index", 0);
    di_json_add_item(e, "part", text_part(t));
    emit(ctx, "response.content_part.done", e);
    cJSON *item = message_item(rr->item_id, t);
    di_json_append(rr->done_items, cJSON_Duplicate(item, 1));
    emit_item(rr, "response.output_item.done", rr->item_index, item, emit, ctx);
    rr->text_open = 0;
  }
}

static void text_delta(di_resp_req *rr, int reasoning, const char *delta, di_resp_emit_fn emit, void *ctx) {
  if (!*delta) return;
  if (reasoning ? !rr->reasoning_open : !rr->text_open) {
    close_text_items(rr, emit, ctx);
    rr->item_index = rr->n_items++;
    item_id(rr, reasoning ? "rs_" : "msg_", rr->item_index, rr->item_id, sizeof rr->item_id);
    emit_item(rr, "response.output_item.added", rr->item_index,
              reasoning ? reasoning_item(rr->item_id, NULL) : message_item(rr->item_id, NULL), emit, ctx);
    if (!reasoning) {
      cJSON *e = event(rr);
      cJSON_AddStringToObject(e, "item_id", rr->item_id);
      cJSON_AddNumberToObject(e, "output_index", rr->item_index);
      cJSON_AddNumberToObject(e, "content_index", 0);
      di_json_add_item(e, "part", text_part(""));
      emit(ctx, "response.content_part.added", e);
    }
    if (reasoning) { rr->reasoning_open = 1; free(rr->reasoning); rr->reasoning = NULL; rr->reasoning_len = 0; }
    else { rr->text_open = 1; free(rr->text); rr->text = NULL; rr->text_len = 0; }
  }
  if (reasoning) grow(&rr->reasoning, &rr->reasoning_len, delta, strlen(delta));
  else grow(&rr->text, &rr->text_len, delta, strlen(delta));
  cJSON *e = event(rr);
  cJSON_AddStringToObject(e, "item_id", rr->item_id);
  cJSON_AddNumberToObject(e, "output_index", rr->item_index);
  cJSON_AddNumberToObject(e, "content_index", 0);
  cJSON_AddStringToObject(e, "delta", delta);
  if (!reasoning) cJSON_AddArrayToObject(e, "logprobs");
  emit(ctx, reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", e);
}

static void call_delta(di_resp_req *rr, const cJSON *tc, di_resp_emit_fn emit, void *ctx) {
  const cJSON *idx = get(tc, "index"), *f = get(tc, "function");
  int64_t ix;
  if (!di_json_int_in(idx, 0, 1 << 20, &ix)) return;
  int i = (int)ix;
  if (i == rr->n_calls) { /* a new call opens */
    const cJSON *name = get(f, "name"), *cid = get(tc, "id");
    struct di_resp_call *c = realloc(rr->calls, (size_t)(rr->n_calls + 1) * sizeof *c);
    if (!c || !cJSON_IsString(name)) return;
    rr->calls = c;
    close_text_items(rr, emit, ctx);
    c = &rr->calls[rr->n_calls++];
    memset(c, 0, sizeof *c);
    c->output_index = rr->n_items++;
    item_id(rr, "fc_", c->output_index, c->id, sizeof c->id);
    snprintf(c->call_id, sizeof c->call_id, "%s", cJSON_IsString(cid) ? cid->valuestring : c->id);
    c->name = strdup(name->valuestring);
    emit_item(rr, "response.output_item.added", c->output_index, call_item(rr, c->id, c->call_id, c->name, "", 0), emit, ctx);
  }
  if (i < 0 || i >= rr->n_calls) return;
  struct di_resp_call *c = &rr->calls[i];
  const cJSON *args = get(f, "arguments");
  if (!cJSON_IsString(args) || !args->valuestring[0]) return;
  grow(&c->args, &c->args_len, args->valuestring, strlen(args->valuestring));
  cJSON *e = event(rr);
  cJSON_AddStringToObject(e, "item_id", c->id);
  cJSON_AddNumberToObject(e, "output_index", c->output_index);
  cJSON_AddStringToObject(e, "delta", args->valuestring);
  emit(ctx, is_custom(rr, c->name) ? "response.custom_tool_call_input.delta" : "response.function_call_arguments.delta", e);
}

static void close_calls(di_resp_req *rr, di_resp_emit_fn emit, void *ctx) {
  for (int i = 0; i < rr->n_calls; i++) {
    struct di_resp_call *c = &rr->calls[i];
    int custom = is_custom(rr, c->name);
    cJSON *e = event(rr);
    cJSON_AddStringToObject(e, "item_id", c->id);
    cJSON_AddNumberToObject(e, "output_index", c->output_index);
    cJSON_AddStringToObject(e, custom ? "input" : "arguments", c->args ? c->args : "");
    if (!custom) cJSON_AddStringToObject(e, "name", c->name);
    emit(ctx, custom ? "response.custom_tool_call_input.done" : "response.function_call_arguments.done", e);
    cJSON *item = call_item(rr, c->id, c->call_id, c->name, c->args ? c->args : "", 1);
    di_json_append(rr->done_items, cJSON_Duplicate(item, 1));
    emit_item(rr, "response.output_item.done", c->output_index, item, emit, ctx);
  }
}

void di_resp_stream_chunk(di_resp_req *rr, cJSON *chunk, di_resp_emit_fn emit, void *ctx) {
  if (!rr->started) {
    rr->started = 1;
    rr->done_items = cJSON_CreateArray();
    take_envelope(rr, chunk);
    cJSON *e = event(rr);
    di_json_add_item(e, "response", response_object(rr, "in_progress", NULL, NULL));
    emit(ctx, "response.created", e);
    e = event(rr);
    di_json_add_item(e, "response", response_object(rr, "in_progress", NULL, NULL));
    emit(ctx, "response.in_progress", e);
  }
  const cJSON *choices = get(chunk, "choices");
  const cJSON *choice = cJSON_GetArrayItem(choices, 0);
  if (choice) {
    const cJSON *d = get(choice, "delta"), *finish = get(choice, "finish_reason");
    const cJSON *r = get(d, "reasoning_content"), *c = get(d, "content"), *calls = get(d, "tool_calls");
    if (cJSON_IsString(r)) text_delta(rr, 1, r->valuestring, emit, ctx);
    if (cJSON_IsString(c)) text_delta(rr, 0, c->valuestring, emit, ctx);
    for (const cJSON *tc = calls ? calls->child : NULL; tc; tc = tc->next) call_delta(rr, tc, emit, ctx);
    if (cJSON_IsString(finish)) {
      rr->incomplete = strcmp(finish->valuestring, "length") == 0;
      close_text_items(rr, emit, ctx);
      close_calls(rr, emit, ctx);
    }
  } else if (cJSON_IsArray(choices)) { /* the usage chunk: the end */
    cJSON *e = event(rr);
    cJSON *items = rr->done_items;
    rr->done_items = NULL;
    /* items closed in output_index order: reasoning/message items first as they came, then calls */
    di_json_add_item(e, "response", response_object(rr, rr->incomplete ? "incomplete" : "completed", items,
                                                         get(chunk, "usage")));
    emit(ctx, rr->incomplete ? "response.incomplete" : "response.completed", e);
  }
  cJSON_Delete(chunk);
}
