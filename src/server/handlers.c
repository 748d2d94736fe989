/* The endpoints of `deepinfer serve`: routing, /v1/completions and /v1/chat/completions (whole
 * responses and server-sent-event streams), /v1/models, /health, /version, /metrics, /tokenize and
 * /detokenize. Generation requests become one engine job each (engine_loop.h); while waiting for
 * its events a handler polls its socket so that a client that went away aborts its job. Responses
 * go out through the transport's di_conn_* calls (server.c). */
#include "server/server_internal.h"
#include "api/model_internal.h"
#include "server/reasoning.h"
#include "server/tool_calls.h"
#include "server/tool_choice.h"
#include "server/tool_stream.h"
#include "server/tokenizer_info.h"
#include "server/responses.h"
#include "util/json.h"
#include "util/text.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DI_SERVER_VERSION "0.1.0"
#define POLL_MS 100

static const char *JSON_TYPE = "application/json";

/* A whole response carrying the request's common headers (c->extra) and `more`. */
static int respond(di_conn *c, int status, const char *type, const char *body, size_t len, int keep_alive,
                   const char *more) {
  char h[2048];
  snprintf(h, sizeof h, "%s%s", c->extra, more ? more : "");
  return di_conn_respond(c, status, type, body, len, keep_alive, h);
}

static int send_json(di_conn *c, int status, cJSON *obj, int keep_alive) {
  char *s = di_json_print_checked(obj, c->json_mark);
  cJSON_Delete(obj);
  c->status = s ? status : 500;
  static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
  int rc = s ? respond(c, status, JSON_TYPE, s, strlen(s), keep_alive, NULL)
             : respond(c, 500, JSON_TYPE, oom, sizeof oom - 1, 0, NULL);
  free(s);
  return rc == 0 ? keep_alive : 0;
}

/* bytes of `s` that are not UTF-8 become '?' (messages quote client input: the body must stay JSON) */
static void utf8_replace_invalid(char *s) {
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    size_t j = i;
    if (di_utf8_decode(s, n, &j) < 0) s[i++] = '?';
    else i = j;
  }
}

int di_srv_send_error(di_conn *c, const di_oai_error *err, int keep_alive) {
  di_oai_error fixed = *err;
  const di_oai_error *e = &fixed;
  utf8_replace_invalid(fixed.message);
  utf8_replace_invalid(fixed.param);
  di_srv_log_rejection(c, e->status, e->message);
  char *s = di_oai_error_json(e);
  c->status = e->status;
  const char *extra = e->status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL;
  int rc = respond(c, e->status, JSON_TYPE, s ? s : "{}", s ? strlen(s) : 2, keep_alive, extra);
  free(s);
  pthread_mutex_lock(&c->srv->mu);
  c->srv->n_errors++;
  pthread_mutex_unlock(&c->srv->mu);
  return rc == 0 ? keep_alive : 0;
}

static void make_id(di_server *s, const char *prefix, char *out, size_t cap) {
  pthread_mutex_lock(&s->mu);
  uint64_t k = s->next_id++;
  pthread_mutex_unlock(&s->mu);
  /* splitmix64 of a per-server random seed and a counter: unique, not guessable from the count */
  uint64_t z = s->id_seed + k * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)z, (unsigned long long)(k & 0xffffffffu));
}

/* a growing text buffer (/metrics, the SSE events of a stream waiting to be sent) */
typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  for (int attempt = 0; attempt < 2; attempt++) {
    va_list ap;
    va_start(ap, fmt);
    int n = b->p ? vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap) : -1;
    va_end(ap);
    if (n >= 0 && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
    size_t cap = (b->cap ? b->cap * 2 : 8192) + (n > 0 ? (size_t)n : 0);
    char *q = realloc(b->p, cap);
    if (!q) return;
    b->p = q;
    b->cap = cap;
  }
}

/* ---- generation -------------------------------------------------------------------------------- */
typedef struct choice {
  char *text;
  size_t len, cap;
  cJSON *logprobs;               /* completions: the logprobs object; chat: the content array */
  int text_offset;
  size_t r_emitted, c_emitted;   /* streamed with a reasoning/tool parser: text sent as reasoning, content */
  di_finish_reason finish;
  int n_out;
  char *error;
  int echoed;                    /* streamed echo with logprobs: the prompt's chunk was sent */
  double t_last;                 /* monotonic seconds: this choice's last token (inter-token latency) */
  di_tool_stream tools;          /* streamed tool calls: what of them was sent */
  int32_t *ids;                  /* the generated token ids (kept when the response carries token_ids) */
  int n_ids, cap_ids;
} choice;

typedef struct gen {
  di_server *s;
  di_conn *c;
  di_oai_request r;
  di_srv_job *job;
  int n_choices;
  choice *ch;
  char id[64];
  long long created;
  int prompt_tokens, cached_tokens;
  int keep_alive;
  double last_peer_check;
  double t_submit, t_first;      /* monotonic seconds: job accepted, first token */
  sbuf out;                      /* streamed events not sent yet */
  di_resp_req *resp;             /* a /v1/responses request served as chat: its replies are translated */
  /* prompt logprobs per prompt (taken from sample 0's first event), stride plp_k[i] per token */
  float **plp;
  di_token_logprob **plp_top;
  int32_t **plp_rank;
  int *plp_k;
} gen;

static double mono_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* mutex held */
static void observe(di_histogram *h, double v) {
  int b = 0;
  while (b < h->n && v > h->le[b]) b++;
  if (b < h->n) h->counts[b]++;
  h->sum += v;
  h->count++;
}

static int append(choice *c, const char *t, size_t n) {
  if (c->len + n + 1 > c->cap) {
    size_t cap = (c->len + n + 1) * 2;
    char *b = realloc(c->text, cap);
    if (!b) return -1;
    c->text = b;
    c->cap = cap;
  }
  memcpy(c->text + c->len, t, n);
  c->len += n;
  c->text[c->len] = 0;
  return 0;
}

static cJSON *new_logprobs(int chat) { return chat ? cJSON_CreateArray() : di_oai_completion_logprobs_new(); }

/* adds an event's tokens to `lp` (a fresh or accumulated logprobs object) */
static void add_event_logprobs(gen *g, choice *ch, cJSON *lp, const di_srv_event *ev) {
  for (int t = 0; t < ev->n_tokens; t++) {
    di_oai_add_logprob(g->s->oai.tok, g->r.chat, lp, ev->tokens[t], ev->logprobs[t],
                       ev->top ? ev->top + (size_t)t * (size_t)ev->n_top : NULL, ev->n_top, ch->text_offset);
    size_t n = 0;
    if (g->s->oai.tok && di_tokenizer_token_bytes(g->s->oai.tok, ev->tokens[t], &n)) ch->text_offset += (int)n;
  }
}

/* keeps the prompt logprobs an event carries (sample 0's first) for the response */
static void take_prompt_logprobs(gen *g, di_srv_event *ev) {
  int i = ev->prompt_index;
  if (!ev->prompt_logprobs || !g->plp || i < 0 || i >= g->r.n_prompts || g->plp[i]) return;
  g->plp[i] = ev->prompt_logprobs;
  g->plp_top[i] = ev->prompt_top;
  g->plp_rank[i] = ev->prompt_ranks;
  g->plp_k[i] = ev->prompt_top ? ev->n_prompt_top : 0;
  ev->prompt_logprobs = NULL;
  ev->prompt_top = NULL;
  ev->prompt_ranks = NULL;
}

/* bytes of a token's text (for text_offset) */
static int token_len(const gen *g, int32_t id) {
  size_t n = 0;
  return g->s->oai.tok && di_tokenizer_token_bytes(g->s->oai.tok, id, &n) ? (int)n : 0;
}

/* completions with echo and logprobs: the prompt's tokens lead the logprobs (the first one with null
 * logprob and alternatives), then the generated ones (`generated`, consumed; may be NULL); text_offset
 * runs over all of them, as vLLM counts it */
static cJSON *echo_logprobs_json(gen *g, int prompt, cJSON *generated) {
  cJSON *o = di_oai_completion_logprobs_new();
  if (!o) { cJSON_Delete(generated); return NULL; }
  const int32_t *ids = g->r.prompt_ids[prompt];
  const float *lp = g->plp[prompt];
  int k = g->plp_k[prompt], want = g->r.logprobs < k ? g->r.logprobs : k, offset = 0;
  for (int i = 0; i < g->r.n_prompt_ids[prompt]; i++) {
    if (i == 0 || !lp) {
      char *t = di_oai_token_text(g->s->oai.tok, ids[i], NULL, NULL);
      cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "tokens"), cJSON_CreateString(t ? t : ""));
      free(t);
      cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "token_logprobs"), cJSON_CreateNull());
      cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "top_logprobs"), cJSON_CreateNull());
      cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "text_offset"), cJSON_CreateNumber(offset));
    } else {
      di_oai_add_logprob(g->s->oai.tok, 0, o, ids[i], lp[i], k ? g->plp_top[prompt] + (size_t)i * (size_t)k : NULL,
                         want, offset);
    }
    offset += token_len(g, ids[i]);
  }
  static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
  for (int a = 0; generated && a < 4; a++) {
    cJSON *from = cJSON_GetObjectItemCaseSensitive(generated, keys[a]), *to = cJSON_GetObjectItemCaseSensitive(o, keys[a]);
    cJSON *it;
    while (from && (it = cJSON_DetachItemFromArray(from, 0)) != NULL) cJSON_AddItemToArray(to, it);
  }
  cJSON_Delete(generated);
  return o;
}

/* vLLM's prompt_logprobs: [null, {"<id>": {logprob, rank, decoded_token}}, ...]; the token itself
 * first (its rank: 1 + the ids more likely), then the top `want` (rank: their place) */
static cJSON *prompt_logprobs_json(gen *g, int prompt) {
  cJSON *a = cJSON_CreateArray();
  const float *lp = g->plp[prompt];
  int k = g->plp_k[prompt], want = g->r.prompt_logprobs < k ? g->r.prompt_logprobs : k;
  const int32_t *ids = g->r.prompt_ids[prompt];
  for (int i = 0; a && i < g->r.n_prompt_ids[prompt]; i++) {
    if (i == 0 || !lp) { di_json_append(a, cJSON_CreateNull()); continue; }
    cJSON *d = cJSON_CreateObject();
    const di_token_logprob *top = k ? g->plp_top[prompt] + (size_t)i * (size_t)k : NULL;
    for (int j = -1; j < want; j++) {
      int32_t id = j < 0 ? ids[i] : top[j].id;
      if (id < 0) continue;
      char key[16];
      snprintf(key, sizeof key, "%d", (int)id);
      if (cJSON_GetObjectItemCaseSensitive(d, key)) continue;
      int rank = j < 0 && g->plp_rank[prompt] ? g->plp_rank[prompt][i] : 0;
      for (int q = 0; q < want && !rank; q++)
        if (top[q].id == id) rank = q + 1;
      float v = j < 0 ? lp[i] : top[j].logprob;
      cJSON *e = cJSON_AddObjectToObject(d, key);
      cJSON_AddNumberToObject(e, "logprob", isfinite(v) ? v : -9999.0);
      if (rank) cJSON_AddNumberToObject(e, "rank", rank);
      else cJSON_AddNullToObject(e, "rank");
      char *t = di_oai_token_text(g->s->oai.tok, id, NULL, NULL);
      cJSON_AddStringToObject(e, "decoded_token", t ? t : "");
      free(t);
    }
    cJSON_AddItemToArray(a, d);
  }
  return a;
}

static cJSON *usage_json(const gen *g) {
  long long completion = 0;
  for (int i = 0; i < g->n_choices; i++) completion += g->ch[i].n_out;
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", g->prompt_tokens);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(g->prompt_tokens + completion));
  cJSON *d = cJSON_CreateObject();
  cJSON_AddNumberToObject(d, "cached_tokens", g->cached_tokens);
  cJSON_AddItemToObject(u, "prompt_tokens_details", d);
  return u;
}

/* OpenAI's system_fingerprint: names the serving configuration (server version and model folder),
 * so a client can tell when replies may change for reasons other than the request */
static void fingerprint(const di_server *s, char *out, size_t cap) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  const char *parts[2] = {DI_SERVER_VERSION, di_model_dir(s->cfg.model)};
  for (int i = 0; i < 2; i++)
    for (const char *p = parts[i] ? parts[i] : ""; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  snprintf(out, cap, "fp_%010llx", (unsigned long long)(h & 0xffffffffffull));
}

static cJSON *envelope(const gen *g, const char *object) {
  cJSON *o = cJSON_CreateObject();
  char fp[32];
  fingerprint(g->s, fp, sizeof fp);
  cJSON_AddStringToObject(o, "id", g->id);
  cJSON_AddStringToObject(o, "object", object);
  cJSON_AddNumberToObject(o, "created", (double)g->created);
  cJSON_AddStringToObject(o, "model", g->s->cfg.served_name);
  cJSON_AddStringToObject(o, "system_fingerprint", fp);
  return o;
}

/* a fresh tool-call id (tool_stream.h's callback) */
static void tool_call_id(void *ctx, char *out, size_t cap) { make_id(((gen *)ctx)->s, "chatcmpl-tool-", out, cap); }

/* keeps an event's token ids on its choice (responses that carry token_ids) */
static int keep_ids(choice *ch, const di_srv_event *ev) {
  if (ch->n_ids + ev->n_tokens > ch->cap_ids) {
    int cap = (ch->n_ids + ev->n_tokens) * 2 + 16;
    int32_t *a = realloc(ch->ids, (size_t)cap * sizeof *a);
    if (!a) return -1;
    ch->ids = a;
    ch->cap_ids = cap;
  }
  if (ev->n_tokens) memcpy(ch->ids + ch->n_ids, ev->tokens, (size_t)ev->n_tokens * sizeof *ev->tokens);
  ch->n_ids += ev->n_tokens;
  return 0;
}

static cJSON *ids_json(const int32_t *ids, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < n; i++) di_json_append(a, cJSON_CreateNumber(ids[i]));
  return a;
}

static const char *finish_str(di_finish_reason f) {
  return f == DI_FINISH_STOP ? "stop" : f == DI_FINISH_LENGTH ? "length" : f == DI_FINISH_ABORT ? "abort" : "error";
}

/* The tool calls in a whole chat reply as OpenAI's tool_calls array, or NULL when it has none;
 * *content_len: the bytes of content before them. */
static cJSON *tool_calls_json(gen *g, const char *text, size_t len, size_t *content_len) {
  di_tool_call *calls;
  *content_len = len;
  int n = text ? di_tool_choice_calls(&g->r, text, len, 1, content_len, &calls) : 0;
  if (n <= 0) { *content_len = len; return NULL; }
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) {
    cJSON *c = cJSON_CreateObject();
    char id[64];
    make_id(g->s, "chatcmpl-tool-", id, sizeof id);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", calls[i].name);
    cJSON_AddStringToObject(f, "arguments", calls[i].arguments);
    cJSON_AddItemToArray(a, c);
  }
  di_tool_calls_free(calls, n);
  return a;
}

static void record_usage(gen *g, int ok) {
  long long completion = 0;
  int longest = 0;
  for (int i = 0; i < g->n_choices; i++) {
    completion += g->ch[i].n_out;
    if (g->ch[i].n_out > longest) longest = g->ch[i].n_out;
  }
  double t = mono_s();
  di_server *s = g->s;
  pthread_mutex_lock(&s->mu);
  s->n_prompt_tokens += g->prompt_tokens;
  s->n_generation_tokens += completion;
  if (!ok) s->n_disconnects++;
  /* a choice cut off by a client that went away was aborted (its job is): counted as such */
  for (int i = 0; i < g->n_choices; i++) {
    di_finish_reason f = g->ch[i].finish == DI_FINISH_NONE && !ok ? DI_FINISH_ABORT : g->ch[i].finish;
    if (f > DI_FINISH_NONE && f < 5) s->finished[f]++;
  }
  if (ok && g->t_submit > 0) {
    if (g->t_first > 0) observe(&s->ttft, g->t_first - g->t_submit);
    observe(&s->e2e, t - g->t_submit);
    if (g->t_first > 0 && longest > 1) observe(&s->tpot, (t - g->t_first) / (longest - 1));
  }
  pthread_mutex_unlock(&s->mu);
}

/* usage counts from an event (every event carries the prompt and output counts) */
static void note_event(gen *g, choice *ch, const di_srv_event *ev) {
  if (ev->n_tokens > 0) {
    double t = mono_s();
    if (g->t_first == 0) g->t_first = t;
    if (ch->t_last > 0) {
      /* the event's tokens arrived together: the gap is shared out between them */
      pthread_mutex_lock(&g->s->mu);
      for (int k = 0; k < ev->n_tokens; k++) observe(&g->s->itl, (t - ch->t_last) / ev->n_tokens);
      pthread_mutex_unlock(&g->s->mu);
    }
    ch->t_last = t;
  }
  if (ev->n_output_tokens > ch->n_out) ch->n_out = ev->n_output_tokens;
  if (ev->sample_index == 0 && ev->finish != DI_FINISH_NONE) g->cached_tokens += ev->n_cached_tokens;
  if (ev->finish != DI_FINISH_NONE) {
    ch->finish = ev->finish;
    if (ev->error && !ch->error) ch->error = strdup(ev->error);
  }
}

/* Waits for the next event, watching the socket. Returns 1 with *ev, -1 when the job is done, -2
 * when the client went away (the job is aborted then). */
static int wait_event(gen *g, di_srv_event **ev) {
  for (;;) {
    /* the socket is checked every POLL_MS even while events keep coming (a non-streamed request
     * writes nothing until the end, so a gone client is only seen this way) */
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double now = (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
    if (now - g->last_peer_check >= POLL_MS * 1e-3) {
      g->last_peer_check = now;
      if (di_conn_peer_gone(g->c)) {
        di_srv_abort(g->s->loop, g->job);
        return -2;
      }
    }
    int rc = di_srv_next_event(g->s->loop, g->job, POLL_MS, ev);
    if (rc != 0) return rc;
  }
}

/* the error to answer when a choice ended in an error or was aborted by the server */
static int failed_choice(const gen *g, di_oai_error *err) {
  for (int i = 0; i < g->n_choices; i++) {
    const choice *ch = &g->ch[i];
    if (ch->finish == DI_FINISH_ERROR) {
      /* an error before any token is the request's fault (it cannot fit the KV pool ...) */
      int before = ch->n_out == 0;
      return di_oai_fail(err, before ? 400 : 500, before ? "invalid_request_error" : "server_error", "", NULL, "%s",
                         ch->error ? ch->error : "the request failed");
    }
    if (ch->finish == DI_FINISH_ABORT || ch->finish == DI_FINISH_NONE) {
      char why[1024];
      di_srv_job_error(g->s->loop, g->job, why, sizeof why);
      return di_oai_fail(err, 503, "server_error", "", NULL, "the request was aborted: %s",
                         *why ? why : "the server is shutting down");
    }
  }
  return 0;
}

static int respond_whole(gen *g) {
  di_srv_event *ev;
  int rc;
  while ((rc = wait_event(g, &ev)) == 1) {
    int ci = ev->prompt_index * g->r.n + ev->sample_index;
    if (ci >= 0 && ci < g->n_choices) {
      choice *ch = &g->ch[ci];
      take_prompt_logprobs(g, ev);
      if (ev->logprobs && g->r.logprobs >= 0) {
        if (!ch->logprobs) ch->logprobs = new_logprobs(g->r.chat);
        if (ch->logprobs) add_event_logprobs(g, ch, ch->logprobs, ev);
      }
      if ((ev->text_len && append(ch, ev->text, ev->text_len) != 0) || (g->r.return_token_ids && keep_ids(ch, ev) != 0)) {
        di_srv_event_free(ev);
        di_srv_abort(g->s->loop, g->job);
        di_oai_error err;
        di_oai_fail(&err, 500, "server_error", "", NULL, "out of memory");
        return di_srv_send_error(g->c, &err, 0);
      }
      note_event(g, ch, ev);
    }
    di_srv_event_free(ev);
  }
  record_usage(g, rc != -2);
  if (rc == -2) { g->c->status = 499; return 0; }
  di_oai_error err;
  if (failed_choice(g, &err)) return di_srv_send_error(g->c, &err, g->keep_alive);
  cJSON *o = envelope(g, g->r.chat ? "chat.completion" : "text_completion");
  cJSON *choices = cJSON_AddArrayToObject(o, "choices");
  for (int i = 0; i < g->n_choices; i++) {
    choice *ch = &g->ch[i];
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", i);
    if (g->r.chat) {
      cJSON *m = cJSON_AddObjectToObject(c, "message");
      cJSON_AddStringToObject(m, "role", "assistant");
      const char *text = ch->text ? ch->text : "";
      size_t c_begin = 0, content_len = ch->len;
      if (g->r.parse_reasoning) {
        di_reasoning_split sp;
        di_reasoning_split_text(text, ch->len, 1, &sp);
        char *r = strndup(text + sp.r_begin, sp.r_end - sp.r_begin);
        if (r) cJSON_AddStringToObject(m, "reasoning_content", r);
        free(r);
        c_begin = sp.c_begin;
        content_len = ch->len - c_begin;
      }
      cJSON *calls = g->r.parse_tools || g->r.tool_choice >= DI_TOOL_CHOICE_REQUIRED
                         ? tool_calls_json(g, text + c_begin, ch->len - c_begin, &content_len) : NULL;
      if (calls) {
        /* the reply's text before the calls is the content (null when there is none, as OpenAI) */
        while (content_len && strchr(" \n\r\t", text[c_begin + content_len - 1])) content_len--;
        if (ch->finish != DI_FINISH_LENGTH) ch->finish = DI_FINISH_NONE; /* reported as "tool_calls" below */
      }
      char *content = strndup(text + c_begin, content_len);
      /* content is null when the reply is all tool calls, or all reasoning (as vLLM) */
      if (content && (content_len || (!calls && !(g->r.parse_reasoning && c_begin >= ch->len))))
        cJSON_AddStringToObject(m, "content", content);
      else
        cJSON_AddNullToObject(m, "content");
      free(content);
      if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
      else cJSON_AddNullToObject(m, "tool_calls"); /* as OpenAI: null, not [], when there are none */
      if (ch->logprobs) {
        cJSON *lp = cJSON_AddObjectToObject(c, "logprobs");
        cJSON_AddItemToObject(lp, "content", ch->logprobs);
        ch->logprobs = NULL;
      } else {
        cJSON_AddNullToObject(c, "logprobs");
      }
    } else {
      const char *echo = g->r.echo ? g->r.prompt_text[i / g->r.n] : "";
      size_t el = strlen(echo);
      char *t = malloc(el + ch->len + 1);
      if (t) {
        memcpy(t, echo, el);
        if (ch->len) memcpy(t + el, ch->text, ch->len);
        t[el + ch->len] = 0;
      }
      cJSON_AddStringToObject(c, "text", t ? t : "");
      free(t);
      int pi = i / g->r.n;
      if (g->r.echo_logprobs) { /* every choice of the prompt echoes its logprobs */
        cJSON *lp = echo_logprobs_json(g, pi, ch->logprobs);
        ch->logprobs = NULL;
        if (lp) cJSON_AddItemToObject(c, "logprobs", lp);
        else cJSON_AddNullToObject(c, "logprobs");
      } else if (ch->logprobs) {
        cJSON_AddItemToObject(c, "logprobs", ch->logprobs);
        ch->logprobs = NULL;
      } else {
        cJSON_AddNullToObject(c, "logprobs");
      }
      if (g->r.prompt_logprobs >= 0) cJSON_AddItemToObject(c, "prompt_logprobs", prompt_logprobs_json(g, pi));
    }
    if (g->r.return_token_ids) cJSON_AddItemToObject(c, "token_ids", ids_json(ch->ids, ch->n_ids));
    cJSON_AddStringToObject(c, "finish_reason", ch->finish == DI_FINISH_NONE ? "tool_calls" : finish_str(ch->finish));
    cJSON_AddNullToObject(c, "stop_reason");
    cJSON_AddItemToArray(choices, c);
  }
  if (g->r.chat && g->r.prompt_logprobs >= 0) cJSON_AddItemToObject(o, "prompt_logprobs", prompt_logprobs_json(g, 0));
  cJSON_AddItemToObject(o, "usage", usage_json(g));
  if (g->resp) o = di_resp_from_chat(g->resp, o);
  return send_json(g->c, 200, o, g->keep_alive);
}

/* Queues one SSE event; the queue goes out as one HTTP chunk when no more events are waiting
 * (sse_flush), so a burst of events (n > 1, or a handler that fell behind) costs one send. */
/* a Responses API event (responses.h's emit callback): "event: TYPE" before its data */
static void resp_emit(void *ctx, const char *type, cJSON *data) {
  gen *g = ctx;
  cJSON_AddStringToObject(data, "type", type);
  char *s = di_json_print_checked(data, g->c->json_mark);
  cJSON_Delete(data);
  if (s) sb_printf(&g->out, "event: %s\ndata: %s\n\n", type, s);
  free(s);
}

static int sse_send(gen *g, cJSON *obj) {
  if (g->resp && obj) { /* the chat chunk becomes Responses events */
    size_t before = g->out.len;
    di_resp_stream_chunk(g->resp, obj, resp_emit, g);
    return g->out.len >= before ? 0 : -1;
  }
  char *s = di_json_print_checked(obj, g->c->json_mark);
  cJSON_Delete(obj);
  if (!s) return -1;
  size_t before = g->out.len;
  sb_printf(&g->out, "data: %s\n\n", s);
  free(s);
  return g->out.len > before ? 0 : -1;
}

static int sse_flush(gen *g) {
  if (g->out.len == 0) return 0;
  int rc = di_conn_write(g->c, g->out.p, g->out.len);
  g->out.len = 0;
  return rc;
}

/* one streamed chunk for choice `index`: text (may be empty), logprobs (taken), finish or NULL */
static cJSON *chunk_json(gen *g, int index, const char *text, size_t len, int role, cJSON *lp, const char *finish,
                         cJSON *tool_calls, const char *reasoning, size_t reasoning_len) {
  cJSON *o = envelope(g, g->r.chat ? "chat.completion.chunk" : "text_completion");
  cJSON *choices = cJSON_AddArrayToObject(o, "choices");
  cJSON *c = cJSON_CreateObject();
  cJSON_AddNumberToObject(c, "index", index);
  char *t = malloc(len + 1);
  if (t) { memcpy(t, text, len); t[len] = 0; }
  if (g->r.chat) {
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    if (role) cJSON_AddStringToObject(d, "role", "assistant");
    if (reasoning_len) {
      char *r = strndup(reasoning, reasoning_len);
      if (r) cJSON_AddStringToObject(d, "reasoning_content", r);
      free(r);
    }
    if (len || role) cJSON_AddStringToObject(d, "content", t ? t : "");
    if (tool_calls) cJSON_AddItemToObject(d, "tool_calls", tool_calls);
    if (lp) {
      cJSON *l = cJSON_AddObjectToObject(c, "logprobs");
      cJSON_AddItemToObject(l, "content", lp);
    } else {
      cJSON_AddNullToObject(c, "logprobs");
    }
  } else {
    cJSON_AddStringToObject(c, "text", t ? t : "");
    if (lp) cJSON_AddItemToObject(c, "logprobs", lp); else cJSON_AddNullToObject(c, "logprobs");
  }
  free(t);
  if (finish) cJSON_AddStringToObject(c, "finish_reason", finish); else cJSON_AddNullToObject(c, "finish_reason");
  if (!g->r.chat || finish) cJSON_AddNullToObject(c, "stop_reason");
  cJSON_AddItemToArray(choices, c);
  if (g->r.include_usage && g->r.continuous_usage) cJSON_AddItemToObject(o, "usage", usage_json(g));
  else if (g->r.include_usage) cJSON_AddNullToObject(o, "usage");
  return o;
}

/* A streamed chat reply split as it grows: reasoning up to </think>, then content up to where tool
 * calls start (a tail that might begin a marker, or whitespace before one, waits), then the calls as
 * incremental deltas (tool_stream.h). Sends what this event adds; returns 0, or -1 when sending
 * failed. `lp` (this event's logprobs or NULL) is taken. */
static int stream_split(gen *g, int ci, choice *ch, const di_srv_event *ev, cJSON *lp) {
  const char *text = ch->text ? ch->text : "";
  int final = ev->finish != DI_FINISH_NONE;
  size_t r_from = 0, r_to = 0, c_begin = 0;
  if (g->r.parse_reasoning) {
    di_reasoning_split sp;
    di_reasoning_split_text(text, ch->len, final, &sp);
    r_from = ch->r_emitted > sp.r_begin ? ch->r_emitted : sp.r_begin;
    r_to = sp.r_end > r_from ? sp.r_end : r_from;
    ch->r_emitted = r_to;
    c_begin = sp.c_begin;
  }
  size_t c_end = ch->len;
  cJSON *deltas = NULL;
  int n_calls = 0;
  if ((g->r.parse_tools || g->r.tool_choice >= DI_TOOL_CHOICE_REQUIRED) && c_begin < ch->len) {
    di_tool_call *calls = NULL;
    size_t content_len = 0;
    n_calls = di_tool_choice_calls(&g->r, text + c_begin, ch->len - c_begin, final, &content_len, &calls);
    if (n_calls > 0 && (deltas = cJSON_CreateArray()) != NULL &&
        di_tool_stream_step(&ch->tools, calls, n_calls, deltas, tool_call_id, g) == 0) {
      cJSON_Delete(deltas);
      deltas = NULL;
    }
    di_tool_calls_free(calls, n_calls > 0 ? n_calls : 0);
    if (final && n_calls > 0) { /* the content before the calls, less the whitespace a reply with calls drops */
      c_end = c_begin + content_len;
      while (c_end > c_begin && strchr(" \n\r\t", text[c_end - 1])) c_end--;
    } else if (final) {
      c_end = ch->len;
    } else if (g->r.tool_choice >= DI_TOOL_CHOICE_REQUIRED) {
      c_end = c_begin; /* a forced reply is all calls until it proves not to be (cut off) */
    } else {
      c_end = c_begin + di_tool_calls_safe_prefix(text + c_begin, ch->len - c_begin);
    }
  }
  size_t c_from = ch->c_emitted > c_begin ? ch->c_emitted : c_begin;
  if (c_end < c_from) c_end = c_from;
  ch->c_emitted = c_end;
  const char *fin = !final ? NULL : n_calls > 0 && ev->finish != DI_FINISH_LENGTH ? "tool_calls" : finish_str(ev->finish);
  if (c_end > c_from || r_to > r_from || lp || fin || deltas)
    return sse_send(g, chunk_json(g, ci, text + c_from, c_end - c_from, 0, lp, fin, deltas, text + r_from, r_to - r_from));
  return 0;
}

static int respond_stream(gen *g) {
  int ok = di_conn_begin_stream(g->c, 200, "text/event-stream; charset=utf-8", g->keep_alive, g->c->extra) == 0;
  g->c->status = 200;
  for (int i = 0; ok && i < g->n_choices; i++) {
    if (g->r.chat) ok = sse_send(g, chunk_json(g, i, "", 0, 1, NULL, NULL, NULL, NULL, 0)) == 0;
    else if (g->r.echo && !g->r.echo_logprobs) { /* with logprobs: once the prompt's logprobs are in */
      const char *p = g->r.prompt_text[i / g->r.n];
      ok = sse_send(g, chunk_json(g, i, p, strlen(p), 0, NULL, NULL, NULL, NULL, 0)) == 0;
    }
  }
  if (ok) ok = sse_flush(g) == 0;
  di_srv_event *ev;
  int rc = -1, pending = 0;
  while (ok) {
    /* take every event already waiting before sending; block (watching the socket) only after */
    if (pending && (rc = di_srv_next_event(g->s->loop, g->job, 0, &ev)) == 0) {
      ok = sse_flush(g) == 0;
      pending = 0;
      continue;
    }
    if (!pending) rc = wait_event(g, &ev);
    if (rc != 1) break;
    pending = 1;
    int ci = ev->prompt_index * g->r.n + ev->sample_index;
    if (ci >= 0 && ci < g->n_choices) {
      choice *ch = &g->ch[ci];
      if (g->r.echo_logprobs) {
        /* the echo chunk of each choice of this prompt carries the prompt's logprobs (sample 0's first
         * event brings them; a choice that has an event before them, e.g. an error, echoes without) */
        take_prompt_logprobs(g, ev);
        int pi = ev->prompt_index;
        for (int k = 0; ok && k < g->r.n; k++) {
          choice *c2 = &g->ch[pi * g->r.n + k];
          if (c2->echoed || (!g->plp[pi] && c2 != ch)) continue;
          c2->echoed = 1;
          const char *p = g->r.prompt_text[pi];
          ok = sse_send(g, chunk_json(g, pi * g->r.n + k, p, strlen(p), 0, echo_logprobs_json(g, pi, NULL), NULL, NULL,
                                      NULL, 0)) == 0;
        }
        if (!ok) {
          di_srv_event_free(ev);
          break;
        }
      }
      note_event(g, ch, ev);
      cJSON *lp = NULL;
      if (ev->logprobs && g->r.logprobs >= 0 && ev->n_tokens > 0 && (lp = new_logprobs(g->r.chat)))
        add_event_logprobs(g, ch, lp, ev);
      if (ev->finish == DI_FINISH_ERROR || ev->finish == DI_FINISH_ABORT) {
        cJSON_Delete(lp);
        /* this sample's own error (other samples may still be running) */
        di_oai_error err;
        char why[1024];
        di_srv_job_error(g->s->loop, g->job, why, sizeof why);
        if (ev->finish == DI_FINISH_ERROR)
          di_oai_fail(&err, ch->n_out == 0 ? 400 : 500, ch->n_out == 0 ? "invalid_request_error" : "server_error", "",
                      NULL, "%s", ev->error ? ev->error : "the request failed");
        else
          di_oai_fail(&err, 503, "server_error", "", NULL, "the request was aborted: %s",
                      *why ? why : "the server is shutting down");
        char *s = di_oai_error_json(&err);
        if (s) sb_printf(&g->out, "%sdata: %s\n\n", g->resp ? "event: error\n" : "", s);
        free(s);
      } else if (g->r.parse_tools || g->r.parse_reasoning || g->r.tool_choice >= DI_TOOL_CHOICE_REQUIRED) {
        if (ev->text_len && append(ch, ev->text, ev->text_len) != 0) {
          cJSON_Delete(lp);
          ok = 0;
          di_srv_event_free(ev);
          break;
        }
        ok = stream_split(g, ci, ch, ev, lp) == 0;
      } else if (ev->text_len || lp || ev->finish != DI_FINISH_NONE || (g->r.return_token_ids && ev->n_tokens)) {
        cJSON *o = chunk_json(g, ci, ev->text, ev->text_len, 0, lp,
                              ev->finish != DI_FINISH_NONE ? finish_str(ev->finish) : NULL, NULL, NULL, 0);
        /* without a tokenizer the text is empty: the chunk carries the new token ids (vLLM's token_ids) */
        if (o && g->r.return_token_ids)
          cJSON_AddItemToObject(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0), "token_ids",
                                ids_json(ev->tokens, ev->n_tokens));
        ok = sse_send(g, o) == 0;
      }
    }
    di_srv_event_free(ev);
  }
  if (ok && rc != -2) ok = sse_flush(g) == 0;
  if (!ok || rc == -2) {
    if (!ok) di_srv_abort(g->s->loop, g->job);
    record_usage(g, 0);
    g->c->status = 499;
    return 0;
  }
  record_usage(g, 1);
  if (g->r.include_usage) {
    cJSON *o = envelope(g, g->r.chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", usage_json(g));
    if (sse_send(g, o) != 0 || sse_flush(g) != 0) return 0;
  }
  static const char done[] = "data: [DONE]\n\n"; /* not in the Responses API: response.completed ends it */
  if ((!g->resp && di_conn_write(g->c, done, sizeof done - 1) != 0) || di_conn_end_stream(g->c) != 0) return 0;
  return g->keep_alive;
}

/* resp: a /v1/responses request, `body` its chat translation */
static int handle_generate(di_server *s, di_conn *c, const char *body, size_t len, int chat, int keep_alive,
                           di_resp_req *resp) {
  gen g;
  memset(&g, 0, sizeof g);
  g.s = s;
  g.c = c;
  g.keep_alive = keep_alive;
  g.resp = resp;
  di_oai_error err;
  if (di_oai_parse_request(&s->oai, chat, body, len, &g.r, &err)) return di_srv_send_error(c, &err, keep_alive);
  if (resp && di_resp_adjust(resp, &g.r, &err)) {
    di_oai_request_free(&g.r);
    return di_srv_send_error(c, &err, keep_alive);
  }
  if (!resp) di_conn_release_body(c); /* parsed: `body` is not read again (a /v1/responses one is its translation) */
  int result;
  if ((long long)g.r.n_prompts * g.r.n > s->cfg.max_n) {
    di_oai_fail(&err, 400, "invalid_request_error", "n", NULL, "prompts x n is %lld, more than this server's --max-n %d",
                (long long)g.r.n_prompts * g.r.n, s->cfg.max_n);
    result = di_srv_send_error(c, &err, keep_alive);
    di_oai_request_free(&g.r);
    return result;
  }
  g.n_choices = g.r.n_prompts * g.r.n;
  g.ch = calloc((size_t)g.n_choices, sizeof *g.ch);
  g.plp = calloc((size_t)g.r.n_prompts, sizeof *g.plp);
  g.plp_top = calloc((size_t)g.r.n_prompts, sizeof *g.plp_top);
  g.plp_k = calloc((size_t)g.r.n_prompts, sizeof *g.plp_k);
  g.plp_rank = calloc((size_t)g.r.n_prompts, sizeof *g.plp_rank);
  if (g.ch && g.r.echo_logprobs) /* generated tokens' text_offset continues after the prompt's tokens */
    for (int i = 0; i < g.n_choices; i++)
      for (int t = 0; t < g.r.n_prompt_ids[i / g.r.n]; t++) g.ch[i].text_offset += token_len(&g, g.r.prompt_ids[i / g.r.n][t]);
  g.job = g.ch && g.plp && g.plp_top && g.plp_k && g.plp_rank ? di_srv_job_create(g.r.n_prompts, g.r.params) : NULL;
  if (!g.job) {
    di_oai_fail(&err, 500, "server_error", "", NULL, "out of memory");
    result = di_srv_send_error(c, &err, keep_alive);
    goto done;
  }
  di_status st = di_srv_submit(s->loop, g.job);
  if (st != DI_OK) {
    /* parameters the engine rejected (a schema or regex that does not compile, ...) */
    if (st == DI_ERR_ABORTED) di_oai_fail(&err, 503, "server_error", "", NULL, "%s", di_last_error());
    else if (st == DI_ERR_OOM || st == DI_ERR_BACKEND || st == DI_ERR_INTERNAL)
      di_oai_fail(&err, 500, "server_error", "", NULL, "%s", di_last_error());
    else di_oai_fail(&err, 400, "invalid_request_error", "", NULL, "%s", di_last_error());
    result = di_srv_send_error(c, &err, keep_alive);
    goto done;
  }
  g.t_submit = mono_s();
  make_id(s, resp ? "resp_" : chat ? "chatcmpl-" : "cmpl-", g.id, sizeof g.id);
  g.created = (long long)time(NULL);
  for (int i = 0; i < g.r.n_prompts; i++) g.prompt_tokens += g.r.n_prompt_ids[i];
  pthread_mutex_lock(&s->mu);
  s->n_generate_requests++;
  pthread_mutex_unlock(&s->mu);
  result = g.r.stream ? respond_stream(&g) : respond_whole(&g);
done:
  if (g.job) di_srv_job_release(s->loop, g.job);
  for (int i = 0; g.ch && i < g.n_choices; i++) {
    free(g.ch[i].text);
    free(g.ch[i].error);
    free(g.ch[i].ids);
    di_tool_stream_free(&g.ch[i].tools);
    cJSON_Delete(g.ch[i].logprobs);
  }
  free(g.ch);
  for (int i = 0; g.plp && g.plp_top && g.plp_rank && i < g.r.n_prompts; i++) {
    free(g.plp[i]);
    free(g.plp_top[i]);
    free(g.plp_rank[i]);
  }
  free(g.plp); free(g.plp_top); free(g.plp_k); free(g.plp_rank);
  free(g.out.p);
  di_oai_request_free(&g.r);
  return result;
}

/* ---- the other endpoints ----------------------------------------------------------------------- */
static cJSON *model_card(di_server *s) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", s->cfg.served_name);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)s->started);
  cJSON_AddStringToObject(m, "owned_by", "deepinfer");
  cJSON_AddStringToObject(m, "root", di_model_dir(s->cfg.model));
  cJSON_AddNullToObject(m, "parent");
  cJSON_AddNumberToObject(m, "max_model_len", s->cfg.max_model_len);
  return m;
}

static int handle_models(di_server *s, di_conn *c, int keep_alive) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "object", "list");
  cJSON *d = cJSON_AddArrayToObject(o, "data");
  cJSON_AddItemToArray(d, model_card(s));
  return send_json(c, 200, o, keep_alive);
}

static void sb_histogram(sbuf *b, const char *name, const char *help, const char *label, const di_histogram *h) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  long long cum = 0;
  for (int i = 0; i < h->n; i++) {
    cum += h->counts[i];
    sb_printf(b, "%s_bucket{%s,le=\"%g\"} %lld\n", name, label, h->le[i], cum);
  }
  sb_printf(b, "%s_bucket{%s,le=\"+Inf\"} %lld\n%s_sum{%s} %.6f\n%s_count{%s} %lld\n", name, label, h->count, name,
            label, h->sum, name, label, h->count);
}

static int handle_metrics(di_server *s, di_conn *c, int keep_alive) {
  di_engine_stats st;
  int running, waiting;
  di_srv_stats(s->loop, &st, &running, &waiting);
  di_spec_stats spec;
  di_srv_spec_stats(s->loop, &spec);
  /* the model name as a Prometheus label value (backslash, quote and newline escaped) */
  char label[600] = "model_name=\"";
  size_t k = strlen(label);
  for (const char *p = s->cfg.served_name; *p && k < sizeof label - 4; p++) {
    if (*p == '\\' || *p == '"') label[k++] = '\\';
    if (*p == '\n') { label[k++] = '\\'; label[k++] = 'n'; continue; }
    label[k++] = *p;
  }
  label[k++] = '"';
  label[k] = 0;
  const char *l = label;
  sbuf b = {0};
  pthread_mutex_lock(&s->mu);
  sb_printf(&b,
      "# HELP deepinfer_num_requests_running Jobs (HTTP generation requests) in the engine.\n"
      "# TYPE deepinfer_num_requests_running gauge\ndeepinfer_num_requests_running{%s} %d\n"
      "# HELP deepinfer_num_requests_waiting Jobs queued for the engine thread.\n"
      "# TYPE deepinfer_num_requests_waiting gauge\ndeepinfer_num_requests_waiting{%s} %d\n"
      "# TYPE deepinfer_num_sequences_running gauge\ndeepinfer_num_sequences_running{%s} %d\n"
      "# TYPE deepinfer_num_sequences_waiting gauge\ndeepinfer_num_sequences_waiting{%s} %d\n"
      "# TYPE deepinfer_kv_cache_usage_perc gauge\ndeepinfer_kv_cache_usage_perc{%s} %.6f\n"
      "# TYPE deepinfer_prefix_cache_hit_rate gauge\ndeepinfer_prefix_cache_hit_rate{%s} %.6f\n"
      "# TYPE deepinfer_prompt_tokens_total counter\ndeepinfer_prompt_tokens_total{%s} %lld\n"
      "# TYPE deepinfer_generation_tokens_total counter\ndeepinfer_generation_tokens_total{%s} %lld\n"
      "# TYPE deepinfer_engine_steps_total counter\ndeepinfer_engine_steps_total{%s} %lld\n"
      "# TYPE deepinfer_preemptions_total counter\ndeepinfer_preemptions_total{%s} %lld\n"
      "# HELP deepinfer_prefix_waits_total Admissions put off until a running request wrote shared prompt blocks.\n"
      "# TYPE deepinfer_prefix_waits_total counter\ndeepinfer_prefix_waits_total{%s} %lld\n"
      "# TYPE deepinfer_http_requests_total counter\ndeepinfer_http_requests_total %lld\n"
      "# TYPE deepinfer_generate_requests_total counter\ndeepinfer_generate_requests_total %lld\n"
      "# TYPE deepinfer_http_errors_total counter\ndeepinfer_http_errors_total %lld\n"
      "# TYPE deepinfer_client_disconnects_total counter\ndeepinfer_client_disconnects_total %lld\n"
      "# TYPE deepinfer_open_connections gauge\ndeepinfer_open_connections %d\n",
      l, running, l, waiting, l, st.n_running, l, st.n_waiting, l,
      st.kv_blocks_total ? (double)st.kv_blocks_used / (double)st.kv_blocks_total : 0.0, l, st.prefix_cache_hit_rate, l,
      s->n_prompt_tokens, l, s->n_generation_tokens, l, (long long)st.steps, l, (long long)st.preemptions, l,
      (long long)st.prefix_waits, s->n_requests,
      s->n_generate_requests, s->n_errors, s->n_disconnects, s->n_conns);
  sb_printf(&b, "# HELP deepinfer_request_success_total Finished samples by finish reason (abort: the client went away).\n"
                "# TYPE deepinfer_request_success_total counter\n");
  static const char *reasons[5] = {"none", "stop", "length", "abort", "error"};
  for (int i = 1; i < 5; i++)
    sb_printf(&b, "deepinfer_request_success_total{%s,finished_reason=\"%s\"} %lld\n", l, reasons[i], s->finished[i]);
  /* the names vLLM's /metrics uses (after its vllm: prefix), so its dashboards read these */
  sb_printf(&b,
      "# HELP deepinfer_prefix_cache_queries_total Prompt tokens looked up in the prefix cache.\n"
      "# TYPE deepinfer_prefix_cache_queries_total counter\ndeepinfer_prefix_cache_queries_total{%s} %lld\n"
      "# HELP deepinfer_prefix_cache_hits_total Of them, found in the cache.\n"
      "# TYPE deepinfer_prefix_cache_hits_total counter\ndeepinfer_prefix_cache_hits_total{%s} %lld\n"
      "# TYPE deepinfer_num_preemptions_total counter\ndeepinfer_num_preemptions_total{%s} %lld\n"
      "# HELP deepinfer_kv_cache_blocks_used KV-cache blocks in use (deepinfer_kv_cache_usage_perc is used / total).\n"
      "# TYPE deepinfer_kv_cache_blocks_used gauge\ndeepinfer_kv_cache_blocks_used{%s} %lld\n"
      "# TYPE deepinfer_kv_cache_blocks_total gauge\ndeepinfer_kv_cache_blocks_total{%s} %lld\n"
      "# HELP deepinfer_kv_cache_blocks_cached Free blocks that still hold a cached prefix.\n"
      "# TYPE deepinfer_kv_cache_blocks_cached gauge\ndeepinfer_kv_cache_blocks_cached{%s} %lld\n"
      "# HELP deepinfer_spec_decode_num_drafts_total Sequence-steps that verified a draft.\n"
      "# TYPE deepinfer_spec_decode_num_drafts_total counter\ndeepinfer_spec_decode_num_drafts_total{%s} %lld\n"
      "# TYPE deepinfer_spec_decode_num_draft_tokens_total counter\ndeepinfer_spec_decode_num_draft_tokens_total{%s} %lld\n"
      "# TYPE deepinfer_spec_decode_num_accepted_tokens_total counter\n"
      "deepinfer_spec_decode_num_accepted_tokens_total{%s} %lld\n"
      "# HELP deepinfer_http_rejections_total Requests refused by the HTTP layer itself (malformed, limits).\n"
      "# TYPE deepinfer_http_rejections_total counter\ndeepinfer_http_rejections_total %lld\n"
      "# TYPE deepinfer_http_timeouts_total counter\ndeepinfer_http_timeouts_total %lld\n",
      l, (long long)st.prefix_cache_query_tokens, l, (long long)st.prefix_cache_hit_tokens, l, (long long)st.preemptions,
      l, (long long)st.kv_blocks_used, l, (long long)st.kv_blocks_total, l, (long long)st.kv_blocks_cached, l,
      (long long)spec.verify_steps, l, (long long)spec.drafted_tokens, l, (long long)spec.accepted_tokens,
      s->n_rejected_protocol, s->n_timeouts);
  sb_printf(&b, "# TYPE deepinfer_spec_decode_num_accepted_tokens_per_pos_total counter\n");
  for (int i = 0; i < spec.num_tokens && i < 5; i++)
    sb_printf(&b, "deepinfer_spec_decode_num_accepted_tokens_per_pos_total{%s,position=\"%d\"} %lld\n", l, i,
              (long long)spec.accepted_at[i]);
  /* DSpark's confidence head: per bin of predicted acceptance, drafts verified, summed predictions
   * and accepted drafts; the expected calibration error over all of them */
  sb_printf(&b, "# HELP deepinfer_spec_decode_confidence_drafts_total Verified drafts by predicted-acceptance bin.\n"
                "# TYPE deepinfer_spec_decode_confidence_drafts_total counter\n"
                "# TYPE deepinfer_spec_decode_confidence_predicted_total counter\n"
                "# TYPE deepinfer_spec_decode_confidence_accepted_total counter\n");
  for (int i = 0; i < DI_SPEC_CALIB_BINS && spec.method == 1; i++)
    sb_printf(&b, "deepinfer_spec_decode_confidence_drafts_total{%s,bin=\"%.1f\"} %lld\n"
                  "deepinfer_spec_decode_confidence_predicted_total{%s,bin=\"%.1f\"} %.6g\n"
                  "deepinfer_spec_decode_confidence_accepted_total{%s,bin=\"%.1f\"} %lld\n",
              l, i / 10.0, (long long)spec.calib_count[i], l, i / 10.0, spec.calib_predicted[i], l, i / 10.0,
              (long long)spec.calib_accepted[i]);
  sb_printf(&b, "# HELP deepinfer_spec_decode_confidence_ece Expected calibration error of the confidence head.\n"
                "# TYPE deepinfer_spec_decode_confidence_ece gauge\ndeepinfer_spec_decode_confidence_ece{%s} %.6g\n",
            l, spec.calibration_error);
  sb_histogram(&b, "deepinfer_time_to_first_token_seconds", "From the job's admission to its first token.", l, &s->ttft);
  sb_histogram(&b, "deepinfer_inter_token_latency_seconds", "Between a sample's consecutive output tokens.", l, &s->itl);
  sb_histogram(&b, "deepinfer_e2e_request_latency_seconds", "From the job's admission to its response's end.", l, &s->e2e);
  sb_histogram(&b, "deepinfer_time_per_output_token_seconds", "Mean time between output tokens of a request.", l, &s->tpot);
  sb_histogram(&b, "deepinfer_request_time_per_output_token_seconds", "Mean time between output tokens of a request.", l, &s->tpot);
  pthread_mutex_unlock(&s->mu);
  int have = b.p != NULL;
  c->status = have ? 200 : 500;
  int rc = have ? respond(c, 200, "text/plain; version=0.0.4", b.p, b.len, keep_alive, NULL)
                : respond(c, 500, "text/plain", "out of memory\n", 14, 0, NULL);
  free(b.p);
  return rc == 0 && have ? keep_alive : 0;
}

static int handle_tokenize(di_server *s, di_conn *c, const char *body, size_t len, int keep_alive) {
  di_oai_error err;
  cJSON *root;
  if (di_oai_parse_json(body, len, &root, &err)) return di_srv_send_error(c, &err, keep_alive);
  int rc;
  if (!cJSON_IsObject(root) || di_oai_check_model(&s->oai, root, &err)) {
    if (!cJSON_IsObject(root)) di_oai_fail(&err, 400, "invalid_request_error", "", NULL, "the request body must be a JSON object");
    cJSON_Delete(root);
    return di_srv_send_error(c, &err, keep_alive);
  }
  const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
  const cJSON *ast = cJSON_GetObjectItemCaseSensitive(root, "add_special_tokens");
  if (!s->oai.tok) {
    di_oai_fail(&err, 400, "invalid_request_error", "", NULL, "the model folder has no tokenizer.json");
  } else if (cJSON_IsString(prompt)) {
    int32_t *ids = NULL;
    size_t n = 0;
    di_status st = di_oai_encode_text(s->oai.tok, prompt->valuestring, !(ast && cJSON_IsFalse(ast)), &ids, &n);
    if (st != DI_OK) {
      di_oai_fail(&err, 400, "invalid_request_error", "prompt", NULL, "%s", di_last_error());
    } else {
      cJSON *o = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(o, "tokens");
      for (size_t i = 0; i < n; i++) di_json_append(t, cJSON_CreateNumber(ids[i]));
      cJSON_AddNumberToObject(o, "count", (double)n);
      cJSON_AddNumberToObject(o, "max_model_len", s->cfg.max_model_len);
      free(ids);
      cJSON_Delete(root);
      return send_json(c, 200, o, keep_alive);
    }
  } else if (msgs) {
    /* the chat path: rendered and encoded exactly as /v1/chat/completions does */
    di_oai_request r;
    char *text = cJSON_PrintUnformatted(root);
    if (text && di_oai_parse_request(&s->oai, 1, text, strlen(text), &r, &err) == 0) {
      cJSON *o = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(o, "tokens");
      for (int i = 0; i < r.n_prompt_ids[0]; i++) di_json_append(t, cJSON_CreateNumber(r.prompt_ids[0][i]));
      cJSON_AddNumberToObject(o, "count", r.n_prompt_ids[0]);
      cJSON_AddNumberToObject(o, "max_model_len", s->cfg.max_model_len);
      di_oai_request_free(&r);
      free(text);
      cJSON_Delete(root);
      return send_json(c, 200, o, keep_alive);
    }
    if (!text) di_oai_fail(&err, 500, "server_error", "", NULL, "out of memory");
    free(text);
  } else {
    di_oai_fail(&err, 400, "invalid_request_error", "prompt", NULL, "give 'prompt' (a string) or 'messages'");
  }
  cJSON_Delete(root);
  rc = di_srv_send_error(c, &err, keep_alive);
  return rc;
}

static int handle_detokenize(di_server *s, di_conn *c, const char *body, size_t len, int keep_alive) {
  di_oai_error err;
  cJSON *root;
  if (di_oai_parse_json(body, len, &root, &err)) return di_srv_send_error(c, &err, keep_alive);
  const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
  int n = cJSON_GetArraySize(toks);
  int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
  int bad = !cJSON_IsObject(root) || !cJSON_IsArray(toks) || !ids || di_oai_check_model(&s->oai, root, &err);
  if (!bad && !s->oai.tok) {
    bad = 1;
    di_oai_fail(&err, 400, "invalid_request_error", "", NULL, "the model folder has no tokenizer.json");
  } else if (bad && err.status != 404) {
    di_oai_fail(&err, 400, "invalid_request_error", "tokens", NULL, "'tokens' must be an array of token ids");
  }
  int i = 0;
  for (const cJSON *v = bad ? NULL : toks->child; v; v = v->next, i++) {
    int64_t id;
    if (!di_json_int_in(v, 0, s->oai.vocab_size - 1, &id)) {
      bad = 1;
      di_oai_fail(&err, 400, "invalid_request_error", "tokens", NULL, "tokens[%d] is not a token id in [0, %d)", i, s->oai.vocab_size);
      break;
    }
    ids[i] = (int32_t)id;
  }
  cJSON_Delete(root);
  char *text = NULL;
  size_t tlen;
  if (!bad && di_tokenizer_decode(s->oai.tok, ids, (size_t)n, 0, &text, &tlen) != DI_OK) {
    bad = 1;
    di_oai_fail(&err, 400, "invalid_request_error", "tokens", NULL, "%s", di_last_error());
  }
  free(ids);
  if (bad) return di_srv_send_error(c, &err, keep_alive);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "prompt", text);
  free(text);
  return send_json(c, 200, o, keep_alive);
}

/* ---- routing ----------------------------------------------------------------------------------- */
static int path_is(const di_http_request *req, const char *p) {
  size_t n = strlen(p);
  return req->path_len == n && memcmp(req->target, p, n) == 0;
}

static int method_not_allowed(di_conn *c, const char *allow, int keep_alive) {
  di_oai_error err;
  di_oai_fail(&err, 405, "invalid_request_error", "", NULL, "method not allowed (allowed: %s)", allow);
  char *s = di_oai_error_json(&err);
  char extra[64];
  snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
  c->status = 405;
  int rc = respond(c, 405, JSON_TYPE, s ? s : "{}", s ? strlen(s) : 2, keep_alive, extra);
  free(s);
  return rc == 0 ? keep_alive : 0;
}

static int authorized(di_server *s, const di_http_request *req) {
  if (!s->cfg.api_key || !*s->cfg.api_key) return 1;
  size_t n;
  const char *v = di_http_header_get(req, "authorization", &n);
  size_t kl = strlen(s->cfg.api_key);
  if (!v || n != 7 + kl || strncasecmp(v, "Bearer ", 7) != 0) return 0;
  /* constant-time compare: the key is a secret */
  unsigned diff = 0;
  for (size_t i = 0; i < kl; i++) diff |= (unsigned char)v[7 + i] ^ (unsigned char)s->cfg.api_key[i];
  return diff == 0;
}

/* 1 when `origin` may read responses (CORS): "*" allows all, else a comma-separated list */
static int origin_allowed(const char *allowed, const char *origin, size_t n) {
  if (!allowed || !*allowed) return 0;
  if (strcmp(allowed, "*") == 0) return 1;
  for (const char *p = allowed; *p;) {
    while (*p == ',' || *p == ' ') p++;
    const char *e = p;
    while (*e && *e != ',') e++;
    const char *t = e;
    while (t > p && t[-1] == ' ') t--;
    if ((size_t)(t - p) == n && memcmp(p, origin, n) == 0) return 1;
    p = e;
  }
  return 0;
}

/* the headers every response to this request carries: CORS for allowed origins, the client's
 * X-Request-Id echoed (header values are free of CR/LF: the parser refuses control characters) */
static void common_headers(di_server *s, di_conn *c, const di_http_request *req) {
  size_t n = 0, k = 0;
  const char *origin = di_http_header_get(req, "origin", &n);
  c->extra[0] = 0;
  if (origin && n < 300 && origin_allowed(s->cfg.allowed_origins, origin, n)) {
    if (strcmp(s->cfg.allowed_origins, "*") == 0)
      k += (size_t)snprintf(c->extra + k, sizeof c->extra - k, "Access-Control-Allow-Origin: *\r\n");
    else
      k += (size_t)snprintf(c->extra + k, sizeof c->extra - k, "Access-Control-Allow-Origin: %.*s\r\nVary: Origin\r\n",
                            (int)n, origin);
  }
  const char *rid = di_http_header_get(req, "x-request-id", &n);
  if (rid && n > 0 && n <= 256 && k < sizeof c->extra)
    snprintf(c->extra + k, sizeof c->extra - k, "X-Request-Id: %.*s\r\n", (int)n, rid);
}

size_t di_srv_body_limit(const di_server *s, const di_http_request *req, int *prompt_bound) {
  /* a prompt route's body beyond what a prompt of max_model_len tokens (each at most max_token_bytes,
   * each byte of text at most 6 bytes of JSON escape) plus 1 MiB of parameters can be is refused as it
   * arrives, before it is parsed */
  int prompt_route = path_is(req, "/v1/completions") || path_is(req, "/v1/chat/completions") || path_is(req, "/tokenize") ||
                     path_is(req, "/v1/responses");
  size_t fit = s->oai.max_token_bytes ? (size_t)s->oai.max_model_len * s->oai.max_token_bytes * 6 + (1u << 20) : 0;
  *prompt_bound = prompt_route && fit && fit < s->cfg.max_body_bytes;
  return *prompt_bound ? fit : s->cfg.max_body_bytes;
}

int di_srv_dispatch(di_server *s, di_conn *c, const di_http_request *req, const char *body, size_t body_len) {
  int ka = 1; /* keep-alive is the transport's (libmicrohttpd): handlers only ask for a close */
  c->json_mark = di_json_alloc_failures(); /* this thread builds the request's replies */
  int get = strcmp(req->method, "GET") == 0, post = strcmp(req->method, "POST") == 0;
  common_headers(s, c, req);
  if (strcmp(req->method, "OPTIONS") == 0) {
    /* a CORS preflight: what a browser may send (the allowed origin, if any, is in c->extra) */
    char more[512];
    size_t n = 0;
    const char *h = di_http_header_get(req, "access-control-request-headers", &n);
    snprintf(more, sizeof more, "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nAccess-Control-Allow-Headers: %.*s\r\n"
             "Access-Control-Max-Age: 600\r\nAllow: GET, POST, OPTIONS\r\n", h && n < 300 ? (int)n : 1, h && n < 300 ? h : "*");
    c->status = 200;
    pthread_mutex_lock(&s->mu);
    s->n_requests++;
    pthread_mutex_unlock(&s->mu);
    return respond(c, 200, "text/plain", "", 0, ka, more) == 0 ? ka : 0;
  }
  pthread_mutex_lock(&s->mu);
  s->n_requests++;
  pthread_mutex_unlock(&s->mu);
  di_oai_error err;
  /* every route needs the key but the probes a load balancer or Prometheus polls without one */
  int open_route = path_is(req, "/health") || path_is(req, "/ping") || path_is(req, "/metrics");
  if (!open_route && !authorized(s, req)) {
    di_oai_fail(&err, 401, "invalid_request_error", "", "invalid_api_key", "Unauthorized: a valid API key is required "
                "(Authorization: Bearer KEY)");
    return di_srv_send_error(c, &err, ka);
  }
  if (path_is(req, "/health") || path_is(req, "/ping")) {
    if (!get && !(post && path_is(req, "/ping"))) return method_not_allowed(c, path_is(req, "/ping") ? "GET, POST" : "GET", ka);
    if (!di_srv_healthy(s->loop)) {
      di_oai_fail(&err, 503, "server_error", "", NULL, "the engine's last step failed (see the server log)");
      return di_srv_send_error(c, &err, ka);
    }
    c->status = 200;
    return respond(c, 200, JSON_TYPE, "", 0, ka, NULL) == 0 ? ka : 0;
  }
  if (path_is(req, "/version")) {
    if (!get) return method_not_allowed(c, "GET", ka);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", DI_SERVER_VERSION);
    return send_json(c, 200, o, ka);
  }
  if (path_is(req, "/metrics")) {
    if (!get) return method_not_allowed(c, "GET", ka);
    return handle_metrics(s, c, ka);
  }
  if (path_is(req, "/v1/models")) {
    if (!get) return method_not_allowed(c, "GET", ka);
    return handle_models(s, c, ka);
  }
  if (req->path_len > 11 && memcmp(req->target, "/v1/models/", 11) == 0) {
    if (!get) return method_not_allowed(c, "GET", ka);
    size_t n = req->path_len - 11;
    const char *name = req->target + 11;
    if (strlen(s->cfg.served_name) == n && memcmp(name, s->cfg.served_name, n) == 0) return send_json(c, 200, model_card(s), ka);
    di_oai_fail(&err, 404, "invalid_request_error", "model", "model_not_found", "The model `%.*s` does not exist.", (int)n, name);
    return di_srv_send_error(c, &err, ka);
  }
  if (path_is(req, "/v1/responses")) {
    if (!post) return method_not_allowed(c, "POST", ka);
    di_resp_req rr;
    char *chat_body;
    if (di_resp_translate(body, body_len, &chat_body, &rr, &err)) return di_srv_send_error(c, &err, ka);
    int rc = handle_generate(s, c, chat_body, strlen(chat_body), 1, ka, &rr);
    free(chat_body);
    di_resp_req_free(&rr);
    return rc;
  }
  if (path_is(req, "/tokenizer_info")) {
    if (!get) return method_not_allowed(c, "GET", ka);
    char why[4200];
    cJSON *info = di_tokenizer_info_json(di_model_dir(s->cfg.model), why, sizeof why);
    if (info) return send_json(c, 200, info, ka);
    di_oai_fail(&err, 404, "invalid_request_error", "", NULL, "%s", why);
    return di_srv_send_error(c, &err, ka);
  }
  int is_cmpl = path_is(req, "/v1/completions"), is_chat = path_is(req, "/v1/chat/completions");
  int is_tok = path_is(req, "/tokenize"), is_detok = path_is(req, "/detokenize");
  if (is_cmpl || is_chat || is_tok || is_detok) {
    if (!post) return method_not_allowed(c, "POST", ka);
    if (is_cmpl || is_chat) return handle_generate(s, c, body, body_len, is_chat, ka, NULL);
    return is_tok ? handle_tokenize(s, c, body, body_len, ka) : handle_detokenize(s, c, body, body_len, ka);
  }
  di_oai_fail(&err, 404, "invalid_request_error", "", NULL, "no such endpoint: %s %.*s", req->method, (int)req->path_len,
              req->target);
  return di_srv_send_error(c, &err, ka);
}
