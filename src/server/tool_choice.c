/* tool_choice of a chat request (see openai.h): "auto", "none", "required" or a named function.
 * The forced forms are constrained by the grammar engine as vLLM does it: a named function's reply
 * is its parameters' JSON (the arguments), a required reply is a JSON array of {"name", "parameters"}
 * objects, one branch per tool; the handler turns either into tool_calls. */
#include "server/tool_choice.h"
#include "util/json.h"
#include <stdlib.h>
#include <string.h>

#define BAD(param, ...) di_oai_fail(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* the function object of tools[i] ({type: "function", function: {...}}), or NULL */
static const cJSON *tool_function(const cJSON *tool) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function");
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
  return cJSON_IsObject(f) && cJSON_IsString(name) && name->valuestring[0] ? f : NULL;
}

static cJSON *parameters_schema(const cJSON *f) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(f, "parameters");
  if (p && cJSON_IsObject(p)) return cJSON_Duplicate(p, 1);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "type", "object");
  return o;
}

/* {"type": "array", "minItems": 1, "items": {"anyOf": [{name: const NAME, parameters: SCHEMA}, ...]}} */
static cJSON *required_schema(const cJSON *tools) {
  cJSON *s = cJSON_CreateObject();
  cJSON_AddStringToObject(s, "type", "array");
  cJSON_AddNumberToObject(s, "minItems", 1);
  cJSON *any = cJSON_AddArrayToObject(cJSON_AddObjectToObject(s, "items"), "anyOf");
  for (const cJSON *t = tools->child; t; t = t->next) {
    const cJSON *f = tool_function(t);
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "object");
    cJSON *props = cJSON_AddObjectToObject(b, "properties");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "name"), "const",
                            cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring);
    cJSON_AddItemToObject(props, "parameters", parameters_schema(f));
    cJSON *req = cJSON_AddArrayToObject(b, "required");
    di_json_append(req, cJSON_CreateString("name"));
    di_json_append(req, cJSON_CreateString("parameters"));
    cJSON_AddFalseToObject(b, "additionalProperties");
    cJSON_AddItemToArray(any, b);
  }
  return s;
}

int di_oai_read_tool_choice(const cJSON *root, di_oai_request *r, int constrained, di_oai_error *err) {
  const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
  if (tools && cJSON_IsNull(tools)) tools = NULL;
  if (tools && !cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array");
  r->tool_choice = DI_TOOL_CHOICE_AUTO;
  if (!tc || cJSON_IsNull(tc)) return 0;
  const char *name = NULL;
  if (cJSON_IsString(tc)) {
    if (strcmp(tc->valuestring, "auto") == 0) return 0;
    if (strcmp(tc->valuestring, "none") == 0) { r->tool_choice = DI_TOOL_CHOICE_NONE; return 0; }
    if (strcmp(tc->valuestring, "required") != 0)
      return BAD("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                 "\"function\": {\"name\": ...}}, not \"%s\"", tc->valuestring);
    r->tool_choice = DI_TOOL_CHOICE_REQUIRED;
  } else if (cJSON_IsObject(tc)) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tc, "type");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(f) ? f : tc, "name"); /* Responses: {type, name} */
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(n))
      return BAD("tool_choice", "a named tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    name = n->valuestring;
    r->tool_choice = DI_TOOL_CHOICE_NAMED;
  } else {
    return BAD("tool_choice", "tool_choice must be a string or an object");
  }
  if (!tools || !tools->child)
    return BAD("tool_choice", "tool_choice \"%s\" needs a non-empty 'tools'", name ? name : "required");
  int i = 0;
  for (const cJSON *t = tools->child; t; t = t->next, i++) /* the forced forms need every tool's name */
    if (!tool_function(t))
      return BAD("tools", "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}", i);
  if (constrained)
    return BAD("tool_choice", "tool_choice \"%s\" is a structured-output constraint itself: give no response_format, "
               "structured_outputs or guided_* with it", name ? name : "required");
  cJSON *schema = NULL;
  const unsigned long alloc_mark = di_json_alloc_failures(); /* the schema must be whole (util/json.h) */
  if (name) {
    for (const cJSON *t = tools->child; t && !schema; t = t->next) {
      const cJSON *f = tool_function(t);
      if (strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, name) == 0) schema = parameters_schema(f);
    }
    if (!schema) return BAD("tool_choice", "tool_choice names the function \"%s\", which is not in 'tools'", name);
    r->tool_name = strdup(name);
  } else {
    schema = required_schema(tools);
  }
  r->json_schema = di_json_print_checked(schema, alloc_mark);
  cJSON_Delete(schema);
  if (!r->json_schema || (name && !r->tool_name)) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  return 0;
}

/* ---- a "required" reply, read as it grows ------------------------------------------------------
 * The reply is a JSON array of {"name": ..., "parameters": ...} objects (the grammar guarantees
 * valid JSON, not that it is complete). Each call's arguments are the raw text of its "parameters"
 * value as written, so the text of an unfinished value is a prefix of the finished one: streamed
 * deltas of it reassemble exactly. */
static int ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static size_t skip_ws(const char *t, size_t i, size_t n) {
  while (i < n && ws(t[i])) i++;
  return i;
}

/* the end of the string starting at t[i] == '"' (past its closing quote), or n when unfinished */
static size_t scan_string(const char *t, size_t i, size_t n, int *complete) {
  for (i++; i < n; i++) {
    if (t[i] == '\\') { i++; continue; }
    if (t[i] == '"') { *complete = 1; return i + 1; }
  }
  *complete = 0;
  return n;
}

/* the end of the JSON value starting at t[i] (a scalar ends where a delimiter starts) */
static size_t scan_value(const char *t, size_t i, size_t n, int *complete) {
  *complete = 0;
  if (i >= n) return n;
  if (t[i] == '"') return scan_string(t, i, n, complete);
  if (t[i] == '{' || t[i] == '[') {
    int depth = 0;
    while (i < n) {
      char c = t[i];
      if (c == '"') {
        int sc;
        i = scan_string(t, i, n, &sc);
        if (!sc) return n;
        continue;
      }
      if (c == '{' || c == '[') depth++;
      else if ((c == '}' || c == ']') && --depth == 0) { *complete = 1; return i + 1; }
      i++;
    }
    return n;
  }
  while (i < n && !ws(t[i]) && t[i] != ',' && t[i] != '}' && t[i] != ']') i++;
  *complete = i < n;
  return i;
}

static int key_is(const char *t, size_t from, size_t to, const char *k) {
  size_t kl = strlen(k);
  return to - from == kl + 2 && memcmp(t + from + 1, k, kl) == 0;
}

/* the calls of t[0..n); *closed: the array was closed */
static int required_calls(const char *t, size_t n, di_tool_call **calls, int *closed) {
  int count = 0, cap = 0, ok = 1;
  *closed = 0;
  size_t i = skip_ws(t, 0, n);
  if (i >= n || t[i] != '[') return 0;
  for (i++; ok;) {
    i = skip_ws(t, i, n);
    if (i >= n) break;
    if (t[i] == ']') { *closed = 1; break; }
    if (t[i] == ',') { i++; continue; }
    if (t[i] != '{') break;
    char *name = NULL;
    size_t a_from = 0, a_to = 0;
    int have_args = 0, obj_done = 0;
    for (i++;;) {
      i = skip_ws(t, i, n);
      if (i >= n) break;
      if (t[i] == '}') { obj_done = 1; i++; break; }
      if (t[i] == ',') { i++; continue; }
      int kc, vc;
      size_t k_from = i, k_to = t[i] == '"' ? scan_string(t, i, n, &kc) : (kc = 0, n);
      if (!kc) break;
      i = skip_ws(t, k_to, n);
      if (i >= n || t[i] != ':') break;
      i = skip_ws(t, i + 1, n);
      if (i >= n) break;
      size_t v_to = scan_value(t, i, n, &vc);
      if (key_is(t, k_from, k_to, "name") && vc && t[i] == '"' && !name) {
        cJSON *s = cJSON_ParseWithLength(t + i, v_to - i);
        if (cJSON_IsString(s)) name = strdup(s->valuestring);
        cJSON_Delete(s);
      } else if (key_is(t, k_from, k_to, "parameters")) {
        have_args = 1;
        a_from = i;
        a_to = v_to;
      }
      i = v_to;
      if (!vc) break;
    }
    if (name) {
      if (di_tc_push(calls, &count, &cap, name, have_args ? di_tc_dup(t + a_from, a_to - a_from) : di_tc_dup("", 0),
                     obj_done) != 0)
        ok = 0;
    }
    if (!obj_done) break;
  }
  if (!ok) { di_tool_calls_free(*calls, count); *calls = NULL; return -1; }
  return count;
}

int di_tool_choice_calls(const di_oai_request *r, const char *text, size_t len, int final, size_t *content_len,
                         di_tool_call **calls) {
  *calls = NULL;
  *content_len = 0;
  int n = 0, cap = 0;
  if (r->tool_choice == DI_TOOL_CHOICE_NAMED) {
    /* the reply is the arguments; streamed, they grow with it */
    if (di_tc_push(calls, &n, &cap, strdup(r->tool_name), di_tc_dup(text, len), final) != 0) return -1;
    return n;
  }
  if (r->tool_choice == DI_TOOL_CHOICE_REQUIRED) {
    int closed;
    n = required_calls(text, len, calls, &closed);
    if (n > 0 && final && (!closed || !(*calls)[n - 1].complete)) { /* cut off (max_tokens): the text stays content */
      di_tool_calls_free(*calls, n);
      *calls = NULL;
      n = 0;
    }
    if (n <= 0 && final) *content_len = len;
    return n;
  }
  return final ? di_tool_calls_parse(text, len, content_len, calls) : di_tool_calls_parse_partial(text, len, content_len, calls);
}
