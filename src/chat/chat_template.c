/* Chat templates: finding a folder's template and special tokens, and rendering a conversation
 * with the variables transformers' apply_chat_template (5.17) passes: the named special tokens,
 * then the caller's extra variables, then messages, tools, documents and add_generation_prompt. */
#include "chat/chat_template.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "chat/jinja.h"
#include "util/json.h"

static const char *const TOKEN_NAMES[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};
#define NTOK (sizeof TOKEN_NAMES / sizeof TOKEN_NAMES[0])

struct di_chat_template {
  jj_template *tpl;       /* the default template */
  jj_template *tool_use;  /* a "tool_use" named template, or NULL */
  char *tokens[NTOK];     /* special-token strings or NULL */
};

void di_chat_template_free(di_chat_template *t) {
  if (!t) return;
  jj_template_free(t->tpl);
  jj_template_free(t->tool_use);
  for (size_t i = 0; i < NTOK; i++) free(t->tokens[i]);
  free(t);
}

const char *di_chat_template_token(const di_chat_template *t, const char *name) {
  for (size_t i = 0; i < NTOK; i++)
    if (strcmp(TOKEN_NAMES[i], name) == 0) return t->tokens[i];
  return NULL;
}

static di_status set_token(di_chat_template *t, size_t i, const char *s) {
  free(t->tokens[i]);
  t->tokens[i] = NULL;
  if (!s) return DI_OK;
  t->tokens[i] = strdup(s);
  return t->tokens[i] ? DI_OK : di_error_set(DI_ERR_OOM, "chat template: out of memory");
}

di_status di_chat_template_from_string(const char *source, const char *bos, const char *eos, di_chat_template **out) {
  if (!source || !out) return di_error_set(DI_ERR_INVALID_ARG, "chat template: NULL argument");
  di_chat_template *t = calloc(1, sizeof *t);
  if (!t) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  di_status st = jj_parse(source, strlen(source), &t->tpl);
  if (st == DI_OK) st = set_token(t, 0, bos);
  if (st == DI_OK) st = set_token(t, 1, eos);
  if (st != DI_OK) {
    di_chat_template_free(t);
    return st;
  }
  *out = t;
  return DI_OK;
}

static int file_exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A token entry in tokenizer_config.json: a string, {"content": ...}, or null. */
static di_status token_string(const cJSON *cfg, const char *key, const char **out) {
  *out = NULL;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  if (!v || cJSON_IsNull(v)) return DI_OK;
  if (cJSON_IsString(v)) {
    *out = v->valuestring;
    return DI_OK;
  }
  if (cJSON_IsObject(v)) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (cJSON_IsString(c)) {
      *out = c->valuestring;
      return DI_OK;
    }
  }
  return di_error_set(DI_ERR_FORMAT, "tokenizer_config.json: \"%s\" is neither a string nor an object with a string \"content\"", key);
}

di_status di_chat_template_load(const char *dir, di_chat_template **out) {
  if (!dir || !out) return di_error_set(DI_ERR_INVALID_ARG, "chat template: NULL argument");
  size_t dl = strlen(dir);
  char *jpath = malloc(dl + 32), *cpath = malloc(dl + 32);
  if (!jpath || !cpath) {
    free(jpath);
    free(cpath);
    return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  }
  snprintf(jpath, dl + 32, "%s/chat_template.jinja", dir);
  snprintf(cpath, dl + 32, "%s/tokenizer_config.json", dir);
  cJSON *cfg = NULL;
  char *src = NULL;
  di_chat_template *t = NULL;
  di_status st = DI_OK;
  if (file_exists(cpath)) st = di_json_read_file(cpath, &cfg);
  if (st == DI_OK && cfg && !cJSON_IsObject(cfg))
    st = di_error_set(DI_ERR_FORMAT, "%s: expected a JSON object", cpath);
  if (st == DI_OK) {
    t = calloc(1, sizeof *t);
    if (!t) st = di_error_set(DI_ERR_OOM, "chat template: out of memory");
  }
  for (size_t i = 0; st == DI_OK && cfg && i < NTOK; i++) {
    const char *s;
    st = token_string(cfg, TOKEN_NAMES[i], &s);
    if (st == DI_OK) st = set_token(t, i, s);
    if (st != DI_OK) st = di_error_wrap(st, "%s", cpath);
  }
  if (st == DI_OK && file_exists(jpath)) {
    size_t n;
    st = di_read_file(jpath, &src, &n);
    if (st == DI_OK && strlen(src) != n) st = di_error_set(DI_ERR_FORMAT, "%s: contains a NUL byte", jpath);
    if (st == DI_OK) {
      st = jj_parse(src, n, &t->tpl);
      if (st != DI_OK) st = di_error_wrap(st, "%s", jpath);
    }
  } else if (st == DI_OK) {
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    if (!ct || cJSON_IsNull(ct)) {
      st = di_error_set(DI_ERR_NOT_FOUND, "%s has no chat template: neither chat_template.jinja nor \"chat_template\" in tokenizer_config.json", dir);
    } else if (cJSON_IsString(ct)) {
      st = jj_parse(ct->valuestring, strlen(ct->valuestring), &t->tpl);
      if (st != DI_OK) st = di_error_wrap(st, "%s", cpath);
    } else if (cJSON_IsArray(ct)) {
      for (const cJSON *e = ct->child; e && st == DI_OK; e = e->next) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name"), *tx = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(nm) || !cJSON_IsString(tx)) {
          st = di_error_set(DI_ERR_FORMAT, "%s: \"chat_template\" list entries need string \"name\" and \"template\"", cpath);
          break;
        }
        jj_template **slot = strcmp(nm->valuestring, "default") == 0 ? &t->tpl
                             : strcmp(nm->valuestring, "tool_use") == 0 ? &t->tool_use : NULL;
        if (!slot) continue;
        st = jj_parse(tx->valuestring, strlen(tx->valuestring), slot);
        if (st != DI_OK) st = di_error_wrap(st, "%s (template \"%s\")", cpath, nm->valuestring);
      }
      if (st == DI_OK && !t->tpl)
        st = di_error_set(DI_ERR_NOT_FOUND, "%s: \"chat_template\" has no template named \"default\"", cpath);
    } else st = di_error_set(DI_ERR_FORMAT, "%s: \"chat_template\" must be a string or a list of {name, template}", cpath);
  }
  free(src);
  cJSON_Delete(cfg);
  free(jpath);
  free(cpath);
  if (st != DI_OK) {
    di_chat_template_free(t);
    return st;
  }
  *out = t;
  return DI_OK;
}

di_status di_chat_template_render(const di_chat_template *t, const cJSON *messages, const cJSON *tools,
                                  int add_generation_prompt, const cJSON *extra, char **out, size_t *len) {
  if (!t || !messages || !out) return di_error_set(DI_ERR_INVALID_ARG, "chat template: NULL argument");
  if (!cJSON_IsArray(messages)) return di_error_set(DI_ERR_INVALID_ARG, "chat template: messages must be a JSON array");
  if (cJSON_GetArraySize(messages) == 0)
    return di_error_set(DI_ERR_INVALID_ARG, "chat template: cannot apply a chat template to an empty conversation");
  if (tools && !cJSON_IsArray(tools) && !cJSON_IsNull(tools))
    return di_error_set(DI_ERR_INVALID_ARG, "chat template: tools must be a JSON array");
  if (extra && !cJSON_IsObject(extra)) return di_error_set(DI_ERR_INVALID_ARG, "chat template: extra variables must be a JSON object");
  if (tools && cJSON_IsNull(tools)) tools = NULL;
  cJSON *vars = cJSON_CreateObject();
  if (!vars) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  int ok = 1;
  /* Later entries shadow earlier ones: special tokens < extra < the named arguments. */
  for (size_t i = 0; i < NTOK && ok; i++)
    if (t->tokens[i]) ok = cJSON_AddStringToObject(vars, TOKEN_NAMES[i], t->tokens[i]) != NULL;
  for (const cJSON *e = extra ? extra->child : NULL; e && ok; e = e->next) {
    const char *k = e->string ? e->string : "";
    if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "documents") || !strcmp(k, "add_generation_prompt")) {
      cJSON_Delete(vars);
      return di_error_set(DI_ERR_INVALID_ARG, "chat template: the extra variable \"%s\" would replace an argument of the render", k);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(vars, k);
    ok = cJSON_AddItemReferenceToObject(vars, k, (cJSON *)e);
  }
  if (ok) ok = cJSON_AddItemReferenceToObject(vars, "messages", (cJSON *)messages);
  if (ok) ok = tools ? cJSON_AddItemReferenceToObject(vars, "tools", (cJSON *)tools) : cJSON_AddNullToObject(vars, "tools") != NULL;
  if (ok) ok = cJSON_AddNullToObject(vars, "documents") != NULL;
  if (ok) ok = cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt != 0) != NULL;
  if (!ok) {
    cJSON_Delete(vars);
    return di_error_set(DI_ERR_OOM, "chat template: out of memory");
  }
  const jj_template *tpl = tools && t->tool_use ? t->tool_use : t->tpl;
  size_t n = 0;
  di_status st = jj_render(tpl, vars, NULL, out, &n);
  cJSON_Delete(vars);
  if (st == DI_OK && len) *len = n;
  return st;
}

/* ---- public JSON-string API (include/deepinfer.h) ---------------------------------------------- */
di_status di_chat_template_render_json(const di_chat_template *t, const char *conversation_json,
                                       int add_generation_prompt, char **out) {
  if (!t || !conversation_json || !out) return di_error_set(DI_ERR_INVALID_ARG, "chat template: NULL argument");
  cJSON *root;
  DI_TRY(di_json_parse(conversation_json, strlen(conversation_json), "the conversation", &root));
  const cJSON *messages = root, *tools = NULL;
  cJSON *extra = NULL;
  di_status st = DI_OK;
  int agp = add_generation_prompt < 0 ? 1 : add_generation_prompt;
  if (cJSON_IsObject(root)) {
    messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!messages) st = di_error_set(DI_ERR_INVALID_ARG, "the conversation object has no \"messages\"");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt");
    if (st == DI_OK && g && add_generation_prompt < 0) {
      if (!cJSON_IsBool(g)) st = di_error_set(DI_ERR_INVALID_ARG, "the conversation's \"add_generation_prompt\" must be true or false");
      else agp = cJSON_IsTrue(g);
    }
    if (st == DI_OK) {
      extra = cJSON_CreateObject();
      if (!extra) st = di_error_set(DI_ERR_OOM, "chat template: out of memory");
    }
    for (const cJSON *e = root->child; st == DI_OK && e; e = e->next) {
      const char *k = e->string ? e->string : "";
      if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "add_generation_prompt") || !strcmp(k, "documents"))
        continue;
      if (!cJSON_AddItemReferenceToObject(extra, k, (cJSON *)e)) st = di_error_set(DI_ERR_OOM, "chat template: out of memory");
    }
  } else if (!cJSON_IsArray(root)) {
    st = di_error_set(DI_ERR_INVALID_ARG, "the conversation must be a JSON array of messages or an object with \"messages\"");
  }
  if (st == DI_OK) st = di_chat_template_render(t, messages, tools, agp, extra, out, NULL);
  cJSON_Delete(extra);
  cJSON_Delete(root);
  return st;
}

void di_string_free(char *s) { free(s); }
