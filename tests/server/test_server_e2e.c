/* The server in-process (so the sanitizer build covers its threads): engine-dummy (random weights,
 * the default model's tokenizer and chat template) served on a free loopback port; completions,
 * a stream that concatenates to the whole greedy text, chat, errors, a chunked body, concurrent
 * clients, a client that disconnects mid-stream (its request is aborted), then a graceful stop. */
#include "server/server.h"
#include "test_util.h"
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int g_port;

static int connect_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)g_port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) { close(fd); return -1; }
  return fd;
}

/* sends raw bytes, reads until the server closes; malloc'd response */
static char *exchange(const char *req, size_t len) {
  int fd = connect_port();
  if (fd < 0) return NULL;
  if (send(fd, req, len, MSG_NOSIGNAL) != (ssize_t)len) { close(fd); return NULL; }
  size_t cap = 1 << 16, n = 0;
  char *out = malloc(cap);
  for (;;) {
    if (n + 4096 > cap) out = realloc(out, cap *= 2);
    ssize_t k = recv(fd, out + n, cap - n - 1, 0);
    if (k <= 0) break;
    n += (size_t)k;
  }
  out[n] = 0;
  close(fd);
  return out;
}

static char *post(const char *path, const char *json) {
  char *req = malloc(strlen(json) + 512);
  int n = sprintf(req, "POST %s HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                  "Connection: close\r\n\r\n%s", path, strlen(json), json);
  char *r = exchange(req, (size_t)n);
  free(req);
  return r;
}

static int status_of(const char *resp) { return resp && strncmp(resp, "HTTP/1.1 ", 9) == 0 ? atoi(resp + 9) : -1; }

/* the body of a Content-Length response as JSON */
static cJSON *body_json(const char *resp) {
  const char *b = resp ? strstr(resp, "\r\n\r\n") : NULL;
  return b ? cJSON_Parse(b + 4) : NULL;
}

static const char *choice_text(cJSON *o) {
  cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  cJSON *t = cJSON_GetObjectItem(c, "text");
  if (!t) t = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content");
  return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* concatenated text of a streamed (chunked) response; *done: saw [DONE] */
static char *stream_text(const char *resp, int *done) {
  char *text = calloc(1, 1 << 16);
  size_t n = 0;
  *done = 0;
  for (const char *p = resp ? strstr(resp, "data: ") : NULL; p; p = strstr(p + 6, "data: ")) {
    if (strncmp(p + 6, "[DONE]", 6) == 0) { *done = 1; break; }
    const char *end = strstr(p, "\n\n");
    if (!end) break;
    cJSON *o = cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6));
    const char *t = o ? choice_text(o) : NULL;
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "content");
    if (!t && cJSON_IsString(d)) t = d->valuestring;
    if (t && n + strlen(t) < (1 << 16) - 1) { memcpy(text + n, t, strlen(t)); n += strlen(t); }
    cJSON_Delete(o);
  }
  return text;
}

static double metric(const char *name) {
  char *r = exchange("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", 45);
  double v = -1;
  size_t n = strlen(name);
  /* the sample line: the name at the start of a line, then labels or a space */
  for (const char *p = r; p && (p = strstr(p, name)); p += n) {
    if (p == r || p[-1] != '\n' || (p[n] != ' ' && p[n] != '{')) continue;
    const char *sp = strchr(p, ' ');
    if (sp) v = atof(sp + 1);
    break;
  }
  free(r);
  return v;
}

static void *run_server(void *arg) {
  static di_status st;
  st = di_server_run(arg);
  return &st;
}

static void *concurrent_client(void *arg) {
  char body[256];
  snprintf(body, sizeof body, "{\"prompt\": \"Client %d\", \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true%s}",
           (int)(intptr_t)arg, (intptr_t)arg % 2 ? ", \"stream\": true" : "");
  char *r = post("/v1/completions", body);
  int ok = status_of(r) == 200;
  if (ok && (intptr_t)arg % 2) {
    int done;
    char *t = stream_text(r, &done);
    ok = done && strlen(t) > 0;
    free(t);
  }
  free(r);
  return (void *)(intptr_t)ok;
}

/* A chaos client: random requests (whole, streamed, n > 1, stop strings, malformed bodies) and
 * random disconnects part-way. Returns how many answers were not what their kind expects. */
static void *chaos_client(void *arg) {
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)((intptr_t)arg + 1);
  long bad = 0;
  for (int k = 0; k < 12; k++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    int kind = (int)(x % 5), max_tokens = 1 + (int)((x >> 8) % 24), n = 1 + (int)((x >> 16) % 3);
    char body[512];
    snprintf(body, sizeof body, "{\"prompt\": \"chaos %d %d\", \"max_tokens\": %d, \"n\": %d, \"temperature\": 0.8, "
             "\"seed\": %d, \"stop\": [\"e\"], \"stream\": %s}", (int)(intptr_t)arg, k, max_tokens, n, k,
             kind == 1 || kind == 3 ? "true" : "false");
    if (kind == 4) snprintf(body, sizeof body, "{\"prompt\": [1, 2, \"x\"], \"max_tokens\": %d", max_tokens);
    char req[1024];
    int len = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                       strlen(body), body);
    if (kind == 3) {
      /* leaves after the first bytes of the stream */
      int fd = connect_port();
      if (fd < 0) { bad++; continue; }
      send(fd, req, (size_t)len, MSG_NOSIGNAL);
      char b[64];
      if (recv(fd, b, sizeof b, 0) <= 0) bad++;
      close(fd);
      continue;
    }
    char *r = exchange(req, (size_t)len);
    int st = status_of(r);
    if (kind == 4 ? st != 400 : st != 200) bad++;
    if (kind == 1 && (!r || !strstr(r, "data: [DONE]"))) bad++;
    free(r);
  }
  return (void *)bad;
}

int main(void) {
  di_model_options mo;
  di_model_options_default(&mo);
  mo.load_format = "dummy";
  mo.threads = 2;
  mo.quiet = 1;
  di_model *m = NULL;
  di_engine *e = NULL;
  di_chat_template *tmpl = NULL;
  di_server *srv = NULL;
  const char *dir = test_path("tests/data/models/engine-dummy");
  CHECK(di_model_load(dir, &mo, &m) == DI_OK);
  di_engine_options eo;
  di_engine_options_default(&eo);
  eo.num_kv_blocks = 256;
  eo.seed = 1;
  CHECK(m && di_engine_create(m, &eo, &e) == DI_OK);
  CHECK(di_chat_template_load(dir, &tmpl) == DI_OK);
  di_server_config sc;
  di_server_config_default(&sc);
  sc.port = 0;
  sc.served_name = "m";
  sc.model = m;
  sc.engine = e;
  sc.tmpl = tmpl;
  sc.log_requests = 0;
  sc.max_body_bytes = 1 << 16;
  sc.tool_call_parser = 1;
  CHECK(e && di_server_create(&sc, &srv) == DI_OK);
  if (!srv) return test_finish("test_server_e2e");
  g_port = di_server_port(srv);
  CHECK(g_port > 0);
  pthread_t th;
  pthread_create(&th, NULL, run_server, srv);

  char *r = exchange("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", 44);
  CHECKF(status_of(r) == 200, "%s", r ? r : "(no response)");
  free(r);

  /* whole and streamed greedy completions agree */
  const char *req = "{\"model\": \"m\", \"prompt\": \"The quick brown fox\", \"max_tokens\": 10, \"temperature\": 0, \"ignore_eos\": true";
  char buf[512];
  snprintf(buf, sizeof buf, "%s}", req);
  r = post("/v1/completions", buf);
  CHECK(status_of(r) == 200);
  cJSON *o = body_json(r);
  const char *whole = choice_text(o);
  CHECK(whole && strlen(whole) > 0);
  cJSON *usage = cJSON_GetObjectItem(o, "usage");
  CHECK(cJSON_GetObjectItem(usage, "completion_tokens") && cJSON_GetObjectItem(usage, "completion_tokens")->valueint == 10);
  snprintf(buf, sizeof buf, "%s, \"stream\": true}", req);
  char *rs = post("/v1/completions", buf);
  CHECK(status_of(rs) == 200 && strstr(rs, "Transfer-Encoding: chunked") != NULL);
  int done;
  char *streamed = stream_text(rs, &done);
  CHECKF(done && whole && strcmp(streamed, whole) == 0, "stream \"%s\" vs whole \"%s\"", streamed, whole ? whole : "");
  free(streamed);
  free(rs);
  cJSON_Delete(o);
  free(r);

  /* chat */
  r = post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 5, \"temperature\": 0}");
  CHECK(status_of(r) == 200);
  o = body_json(r);
  CHECK(o && strcmp(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion") == 0 && choice_text(o));
  cJSON_Delete(o);
  free(r);

  /* the Responses API whole and streamed (events, no [DONE]); its stateless refusal */
  r = post("/v1/responses", "{\"input\": \"Hi\", \"instructions\": \"Be brief.\", \"max_output_tokens\": 4, \"temperature\": 0}");
  CHECKF(status_of(r) == 200 && strstr(r, "\"object\":\"response\"") && strstr(r, "\"output_text\""), "%s", r ? r : "");
  free(r);
  r = post("/v1/responses", "{\"input\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"type\": \"function_call\", \"call_id\": \"c1\", "
           "\"name\": \"f\", \"arguments\": \"{}\"}, {\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"ok\"}], "
           "\"max_output_tokens\": 4, \"temperature\": 0, \"stream\": true}");
  CHECKF(status_of(r) == 200 && strstr(r, "event: response.created") && strstr(r, "event: response.output_text.delta") &&
         strstr(r, "event: response.incomplete") && !strstr(r, "[DONE]"), "%s", r ? r : "");
  free(r);
  r = post("/v1/responses", "{\"input\": \"Hi\", \"store\": true}");
  CHECK(status_of(r) == 400 && strstr(r, "\"param\":\"store\""));
  free(r);
  /* a named tool_choice (schema-constrained) and V4 markup (forced by a regex), streamed: argument
   * deltas, no markup in the stream */
  const char *tool = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", "
                     "\"properties\": {\"a\": {\"type\": \"integer\", \"enum\": [7]}}, \"required\": [\"a\"], \"additionalProperties\": false}}}]";
  char tbuf[2048];
  snprintf(tbuf, sizeof tbuf, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], %s, \"tool_choice\": {\"type\": \"function\", "
           "\"function\": {\"name\": \"f\"}}, \"max_tokens\": 40, \"temperature\": 0, \"stream\": true}", tool);
  r = post("/v1/chat/completions", tbuf);
  CHECKF(status_of(r) == 200 && strstr(r, "\"name\":\"f\"") && strstr(r, "\"finish_reason\":\"tool_calls\""), "%s", r ? r : "");
  free(r);
  snprintf(tbuf, sizeof tbuf, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], %s, \"max_tokens\": 200, \"temperature\": 0, "
           "\"stream\": true, \"guided_regex\": \"Ok\\n\\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Ctool_calls>\\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke "
           "name=\\\"f\\\">\\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter name=\\\"a\\\" string=\\\"false\\\">7</\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"
           "parameter>\\n</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke>\\n</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Ctool_calls>\"}", tool);
  r = post("/v1/chat/completions", tbuf);
  CHECKF(status_of(r) == 200 && strstr(r, "\"name\":\"f\"") && !strstr(r, "DSML") && !strstr(r, "\\n") /* the blank line before the markup is dropped */ &&
         strstr(r, "\"finish_reason\":\"tool_calls\""), "%s", r ? r : "");
  free(r);
  r = exchange("GET /tokenizer_info HTTP/1.1\r\nConnection: close\r\n\r\n", 52);
  CHECKF(status_of(r) == 200 && strstr(r, "\"eos_token\"") && strstr(r, "\"chat_template\""), "%s", r ? r : "");
  free(r);

  /* errors */
  r = post("/v1/completions", "{\"prompt\": ");
  CHECK(status_of(r) == 400 && strstr(r, "\"error\"") && strstr(r, "invalid JSON"));
  free(r);
  r = post("/v1/completions", "{\"prompt\": \"x\", \"model\": \"other\"}");
  CHECK(status_of(r) == 404 && strstr(r, "model_not_found"));
  free(r);
  r = post("/v1/completions", "{\"prompt\": \"x\", \"n\": \"2\"}");
  CHECK(status_of(r) == 400 && strstr(r, "\"param\":\"n\""));
  free(r);
  r = post("/v1/completions", "{\"prompt\": \"x\", \"guided_regex\": \"(\"}");
  CHECK(status_of(r) == 400);
  free(r);
  r = exchange("DELETE /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n", 49);
  CHECK(status_of(r) == 405 && strstr(r, "Allow: GET"));
  free(r);
  r = exchange("GET /v1/models HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 53);
  CHECK(status_of(r) == 413);
  free(r);
  /* a chunked body */
  const char *ch = "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                   "f\r\n{\"prompt\": \"Hel\r\n15\r\nlo\", \"max_tokens\": 3}\r\n0\r\n\r\n";
  r = exchange(ch, strlen(ch));
  CHECKF(status_of(r) == 200, "%s", r ? r : "");
  free(r);

  /* concurrent clients */
  pthread_t cl[6];
  for (intptr_t i = 0; i < 6; i++) pthread_create(&cl[i], NULL, concurrent_client, (void *)i);
  int all_ok = 1;
  for (int i = 0; i < 6; i++) {
    void *ok;
    pthread_join(cl[i], &ok);
    all_ok &= ok != NULL;
  }
  CHECK(all_ok);

  /* a client that leaves mid-stream: its request is aborted */
  const char *lb = "{\"prompt\": \"Long\", \"max_tokens\": 600, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true}";
  snprintf(buf, sizeof buf, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s", strlen(lb), lb);
  int fd = connect_port();
  CHECK(fd >= 0 && send(fd, buf, strlen(buf), MSG_NOSIGNAL) > 0);
  char got[8192];
  size_t gn = 0;
  int datas = 0;
  while (datas < 3 && gn < sizeof got - 1) {
    ssize_t k = recv(fd, got + gn, sizeof got - 1 - gn, 0);
    if (k <= 0) break;
    gn += (size_t)k;
    got[gn] = 0;
    datas = 0;
    for (const char *p = got; (p = strstr(p, "data: ")); p += 6) datas++;
  }
  close(fd);
  CHECK(datas >= 3);
  int aborted = 0;
  for (int i = 0; i < 400 && !aborted; i++) {
    aborted = metric("deepinfer_client_disconnects_total") == 1 && metric("deepinfer_num_requests_running") == 0;
    if (!aborted) usleep(25000);
  }
  CHECK(aborted);
  CHECK(metric("deepinfer_generation_tokens_total") < 600);

  r = exchange("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", 44);
  CHECK(status_of(r) == 200);
  free(r);

  /* chaos: 4 clients x 12 random requests with disconnects; then every KV block is free again */
  pthread_t chaos[4];
  for (intptr_t i = 0; i < 4; i++) pthread_create(&chaos[i], NULL, chaos_client, (void *)i);
  long chaos_bad = 0;
  for (int i = 0; i < 4; i++) {
    void *b;
    pthread_join(chaos[i], &b);
    chaos_bad += (long)b;
  }
  CHECKF(chaos_bad == 0, "%ld unexpected answers", chaos_bad);
  int idle = 0;
  for (int i = 0; i < 400 && !idle; i++) {
    idle = metric("deepinfer_num_requests_running") == 0 && metric("deepinfer_kv_cache_usage_perc") == 0;
    if (!idle) usleep(25000);
  }
  CHECK(idle);

  di_server_request_stop(srv);
  void *res;
  pthread_join(th, &res);
  CHECK(*(di_status *)res == DI_OK);
  CHECK(di_engine_check(e) == DI_OK);
  di_server_free(srv);
  di_engine_free(e);
  di_model_free(m);
  di_chat_template_free(tmpl);
  return test_finish("test_server_e2e");
}
