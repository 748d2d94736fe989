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
  int clock_pinned;       /* di_chat_template_pin_clock: strftime_now() renders pinned_now (UTC) */
  int64_t pinned_now;
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

static int reserved(const char *k) {
  return !strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "documents") || !strcmp(k, "add_generation_prompt");
}

static di_status set_tokens(const di_chat_template *t, jj_vars *v) {
  for (size_t i = 0; i < NTOK; i++)
    if (t->tokens[i]) {
      jv s = jj_str_dup(&v->arena, t->tokens[i], strlen(t->tokens[i]));
      if (s.kind != JV_STR) return di_error_set(DI_ERR_OOM, "chat template: out of memory");
      DI_TRY(jj_vars_set(v, TOKEN_NAMES[i], s));
    }
  return DI_OK;
}

/* Adds the named arguments after the tokens and extras (so they win), checks them, renders. */
static di_status finish(const di_chat_template *t, jj_vars *v, jv messages, jv tools, jv documents, int agp,
                        size_t max_output, char **out, size_t *len) {
  if (messages.kind != JV_LIST || messages.tuple)
    return di_error_set(DI_ERR_INVALID_ARG, "chat template: messages must be a JSON array");
  if (messages.u.l->n == 0)
    return di_error_set(DI_ERR_INVALID_ARG, "chat template: cannot apply a chat template to an empty conversation");
  if (tools.kind != JV_NONE && tools.kind != JV_LIST)
    return di_error_set(DI_ERR_INVALID_ARG, "chat template: tools must be a JSON array");
  DI_TRY(jj_vars_set(v, "messages", messages));
  DI_TRY(jj_vars_set(v, "tools", tools));
  if (documents.kind != JV_NONE) {
    if (documents.kind != JV_LIST) return di_error_set(DI_ERR_INVALID_ARG, "chat template: documents must be a JSON array");
    for (size_t i = 0; i < documents.u.l->n; i++)
      if (documents.u.l->v[i].kind != JV_DICT)
        return di_error_set(DI_ERR_INVALID_ARG, "chat template: documents should be a list of objects with \"title\" and \"text\"");
  }
  DI_TRY(jj_vars_set(v, "documents", documents));
  DI_TRY(jj_vars_set(v, "add_generation_prompt", jv_bool(agp)));
  const jj_template *tpl = tools.kind != JV_NONE && t->tool_use ? t->tool_use : t->tpl;
  size_t n = 0;
  jj_render_options opt = {.clock_pinned = t->clock_pinned, .pinned_now = t->pinned_now, .max_output = max_output};
  DI_TRY(jj_render_vars(tpl, v, &opt, out, &n));
  if (len) *len = n;
  return DI_OK;
}

di_status di_chat_template_render(const di_chat_template *t, const cJSON *messages, const cJSON *tools,
                                  int add_generation_prompt, const cJSON *extra, char **out, size_t *len) {
  if (!t || !messages || !out) return di_error_set(DI_ERR_INVALID_ARG, "chat template: NULL argument");
  if (extra && !cJSON_IsObject(extra)) return di_error_set(DI_ERR_INVALID_ARG, "chat template: extra variables must be a JSON object");
  for (const cJSON *e = extra ? extra->child : NULL; e; e = e->next)
    if (reserved(e->string ? e->string : ""))
      return di_error_set(DI_ERR_INVALID_ARG, "chat template: the extra variable \"%s\" would replace an argument of the render", e->string);
  jj_vars v;
  di_status st = jj_vars_init(&v);
  /* special tokens < extra variables < the named arguments, as transformers passes them */
  if (st == DI_OK) st = set_tokens(t, &v);
  for (const cJSON *e = extra ? extra->child : NULL; st == DI_OK && e; e = e->next)
    st = jj_vars_set_cjson(&v, e->string ? e->string : "", e);
  if (st == DI_OK) {
    jv m = jj_from_cjson(&v.arena, messages);
    jv tl = tools && !cJSON_IsNull(tools) ? jj_from_cjson(&v.arena, tools) : jv_none();
    st = v.arena.failed ? di_error_set(DI_ERR_OOM, "chat template: out of memory")
                        : finish(t, &v, m, tl, jv_none(), add_generation_prompt != 0, 0, out, len);
  }
  jj_vars_free(&v);
  return st;
}

/* ---- public JSON-string API (include/deepinfer.h) ---------------------------------------------- */
/* The conversation text is read with Python's json.loads semantics (jj_json_parse), so numbers
 * written as 3.0 stay floats and print back as transformers prints them. */
di_status di_chat_template_render_json_bounded(const di_chat_template *t, const char *conversation_json,
                                               int add_generation_prompt, size_t max_output, char **out) {
  if (!t || !conversation_json || !out) return di_error_set(DI_ERR_INVALID_ARG, "chat template: NULL argument");
  jj_vars v;
  DI_TRY(jj_vars_init(&v));
  jv root;
  di_status st = jj_json_parse(&v.arena, conversation_json, strlen(conversation_json), "the conversation", &root);
  jv messages = root, tools = jv_none(), documents = jv_none();
  int agp = add_generation_prompt < 0 ? 1 : add_generation_prompt;
  if (st == DI_OK) st = set_tokens(t, &v);
  if (st == DI_OK && root.kind == JV_DICT) {
    jv *m = jj_dict_gets(root.u.d, "messages", 8), *tl = jj_dict_gets(root.u.d, "tools", 5),
       *g = jj_dict_gets(root.u.d, "add_generation_prompt", 21), *docs = jj_dict_gets(root.u.d, "documents", 9);
    if (!m) st = di_error_set(DI_ERR_INVALID_ARG, "the conversation object has no \"messages\"");
    else messages = *m;
    if (tl) tools = *tl;
    if (docs) documents = *docs;
    if (st == DI_OK && g && add_generation_prompt < 0) {
      if (g->kind != JV_BOOL) st = di_error_set(DI_ERR_INVALID_ARG, "the conversation's \"add_generation_prompt\" must be true or false");
      else agp = (int)g->u.i;
    }
    for (size_t i = 0; st == DI_OK && i < root.u.d->n; i++) {
      jv k = root.u.d->k[i];
      char name[256];
      snprintf(name, sizeof name, "%.*s", (int)(k.u.s.n < 255 ? k.u.s.n : 255), k.u.s.p);
      if (!reserved(name)) st = jj_vars_set(&v, name, root.u.d->v[i]);
    }
  } else if (st == DI_OK && root.kind != JV_LIST) {
    st = di_error_set(DI_ERR_INVALID_ARG, "the conversation must be a JSON array of messages or an object with \"messages\"");
  }
  if (st == DI_OK) st = finish(t, &v, messages, tools, documents, agp, max_output, out, NULL);
  jj_vars_free(&v);
  return st;
}

di_status di_chat_template_render_json(const di_chat_template *t, const char *conversation_json,
                                       int add_generation_prompt, char **out) {
  return di_chat_template_render_json_bounded(t, conversation_json, add_generation_prompt, 0, out);
}

void di_chat_template_pin_clock(di_chat_template *t, int64_t unix_seconds) {
  if (!t) return;
  t->clock_pinned = 1;
  t->pinned_now = unix_seconds;
}

void di_string_free(char *s) { free(s); }
