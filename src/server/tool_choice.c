/* tool_choice of a chat request (see openai.h): "auto", "none", "required" or a named function.
 * The forced forms are constrained by the grammar engine as vLLM does it: a named function's reply
 * is its parameters' JSON (the arguments), a required reply is a JSON array of {"name", "parameters"}
 * objects, one branch per tool; the handler turns either into tool_calls. */
#include "server/tool_choice.h"
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
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString("parameters"));
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
  r->json_schema = schema ? cJSON_PrintUnformatted(schema) : NULL;
  cJSON_Delete(schema);
  if (!r->json_schema || (name && !r->tool_name)) return di_oai_fail(err, 500, "server_error", "", NULL, "out of memory");
  return 0;
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
    if (!final) return 0; /* the array is read whole at the end */
    cJSON *a = cJSON_ParseWithLength(text, len);
    for (const cJSON *it = cJSON_IsArray(a) ? a->child : NULL; it; it = it->next) {
      const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
      const cJSON *params = cJSON_GetObjectItemCaseSensitive(it, "parameters");
      if (!cJSON_IsString(name) || !params) continue;
      if (di_tc_push(calls, &n, &cap, strdup(name->valuestring), cJSON_PrintUnformatted(params), 1) != 0) {
        cJSON_Delete(a);
        di_tool_calls_free(*calls, n);
        *calls = NULL;
        return -1;
      }
    }
    cJSON_Delete(a);
    if (n == 0) *content_len = len; /* cut off (max_tokens): the text stays content */
    return n;
  }
  return final ? di_tool_calls_parse(text, len, content_len, calls) : di_tool_calls_parse_partial(text, len, content_len, calls);
}
