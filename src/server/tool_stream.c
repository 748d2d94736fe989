/* Incremental tool-call deltas (see tool_stream.h). */
#include "server/tool_stream.h"
#include <stdlib.h>
#include <string.h>

int di_tool_stream_step(di_tool_stream *st, const di_tool_call *calls, int n, cJSON *deltas,
                        void (*make_id)(void *ctx, char *out, size_t cap), void *ctx) {
  int added = 0;
  for (int i = 0; i < n; i++) {
    if (i >= st->n_opened) {
      if (i != st->n_opened) break;
      if (st->n_opened == st->cap) {
        int cap = st->cap ? 2 * st->cap : 4;
        size_t *a = realloc(st->args_sent, (size_t)cap * sizeof *a);
        if (!a) return added;
        st->args_sent = a;
        st->cap = cap;
      }
      char id[64];
      make_id(ctx, id, sizeof id);
      cJSON *d = cJSON_CreateObject();
      cJSON_AddNumberToObject(d, "index", i);
      cJSON_AddStringToObject(d, "id", id);
      cJSON_AddStringToObject(d, "type", "function");
      cJSON *f = cJSON_AddObjectToObject(d, "function");
      cJSON_AddStringToObject(f, "name", calls[i].name);
      cJSON_AddStringToObject(f, "arguments", "");
      cJSON_AddItemToArray(deltas, d);
      st->args_sent[st->n_opened++] = 0;
      added++;
    }
    size_t have = strlen(calls[i].arguments), sent = st->args_sent[i];
    if (have <= sent) continue;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "index", i);
    cJSON *f = cJSON_AddObjectToObject(d, "function");
    char *more = malloc(have - sent + 1);
    if (more) {
      memcpy(more, calls[i].arguments + sent, have - sent);
      more[have - sent] = 0;
      cJSON_AddStringToObject(f, "arguments", more);
      free(more);
    }
    cJSON_AddItemToArray(deltas, d);
    st->args_sent[i] = have;
    added++;
  }
  return added;
}

void di_tool_stream_free(di_tool_stream *st) {
  free(st->args_sent);
  memset(st, 0, sizeof *st);
}
