/* Chat templates: loads a model folder's Jinja chat template (chat_template.jinja, else
 * tokenizer_config.json's "chat_template") and its special-token strings, and renders a
 * conversation to exactly the text transformers' apply_chat_template (5.17) renders. */
#ifndef DI_CHAT_CHAT_TEMPLATE_H
#define DI_CHAT_CHAT_TEMPLATE_H
#include <stddef.h>
#include <cjson/cJSON.h>
#include "deepinfer.h"
#include "util/status.h"

/* di_chat_template is declared in deepinfer.h. */

/* dir: model/tokenizer folder. Template from chat_template.jinja if present, else
 * tokenizer_config.json's "chat_template" (a string, or a list of {name, template}: "default",
 * or "tool_use" when tools are given). bos/eos (and the other named special tokens) from
 * tokenizer_config.json, as strings or {"content": ...} objects. */
di_status di_chat_template_load(const char *dir, di_chat_template **out);
/* A template from its source; bos/eos may be NULL (then undefined in the template). */
di_status di_chat_template_from_string(const char *source, const char *bos, const char *eos,
                                       di_chat_template **out);
void di_chat_template_free(di_chat_template *t);
/* messages: cJSON array of {role, content, ...} (tool_calls etc. passed through); tools: cJSON
 * array or NULL; extra: cJSON object of extra template variables or NULL (they override the
 * special tokens, as transformers' kwargs do). *out is malloc'd and NUL-terminated; *len its
 * length (may be NULL). */
di_status di_chat_template_render(const di_chat_template *t, const cJSON *messages, const cJSON *tools,
                                  int add_generation_prompt, const cJSON *extra, char **out, size_t *len);
/* di_chat_template_render_json (deepinfer.h) with the rendered text bounded at max_output bytes (0:
 * the render's default, 64 MiB): a render that would pass it stops there with
 * DI_ERR_CONTEXT_OVERFLOW, so a server that takes no prompt longer than a bound spends no more than
 * that bound on rendering a conversation. */
di_status di_chat_template_render_json_bounded(const di_chat_template *t, const char *conversation_json,
                                               int add_generation_prompt, size_t max_output, char **out);
/* The special-token string `name` ("bos_token", "eos_token", ...) or NULL. Owned by t. */
const char *di_chat_template_token(const di_chat_template *t, const char *name);
#endif
