/* Tokenizer tests without Python: every id and decoded text of the DeepSeek-V3 golden file, the
 * streaming detokenizer's contract, the invalid-UTF-8 policy, tokenizer_config.json facts, token
 * bytes, concurrent encoding from several threads, and the errors malformed tokenizer.json gets. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "util/json.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
  char *text;
  size_t len;
  int32_t *ids;
  size_t n;
  char *decoded;
} golden;

static int load_golden(golden **out, size_t *count) {
  char *data;
  size_t n;
  if (di_read_file(test_path("tests/data/tokenizers/tokenizer_dsv3_public.jsonl"), &data, &n) != DI_OK)
    return -1;
  size_t cap = 128, k = 0;
  golden *g = calloc(cap, sizeof *g);
  char *line = data;
  while (line < data + n) {
    char *nl = memchr(line, '\n', (size_t)(data + n - line));
    size_t ll = nl ? (size_t)(nl - line) : (size_t)(data + n - line);
    cJSON *j = cJSON_ParseWithLength(line, ll);
    if (j) {
      const cJSON *t = cJSON_GetObjectItem(j, "text"), *ids = cJSON_GetObjectItem(j, "ids"),
                  *dec = cJSON_GetObjectItem(j, "decoded");
      if (k == cap)
        g = realloc(g, (cap *= 2) * sizeof *g);
      g[k].text = strdup(t->valuestring);
      g[k].len = strlen(t->valuestring);
      g[k].n = (size_t)cJSON_GetArraySize(ids);
      g[k].ids = malloc((g[k].n + 1) * sizeof(int32_t));
      for (size_t i = 0; i < g[k].n; i++)
        g[k].ids[i] = (int32_t)cJSON_GetArrayItem(ids, (int)i)->valuedouble;
      g[k].decoded = strdup(dec->valuestring);
      k++;
      cJSON_Delete(j);
    }
    line += ll + 1;
  }
  free(data);
  *out = g;
  *count = k;
  return 0;
}

/* Streams ids through a detokenizer; checks each piece is valid UTF-8 and the whole equals the
 * full decode. */
static void check_stream(const di_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *what) {
  char *full;
  size_t fl;
  CHECK(di_tokenizer_decode(t, ids, n, skip, &full, &fl) == DI_OK);
  di_detok_stream *s;
  CHECK(di_detok_stream_create(t, skip, &s) == DI_OK);
  char *acc = malloc(fl + 64);
  size_t al = 0;
  int ok = 1, valid = 1;
  for (size_t i = 0; i <= n; i++) {
    const char *p;
    size_t pl;
    di_status st = i < n ? di_detok_stream_push(s, ids[i], &p, &pl) : di_detok_stream_flush(s, &p, &pl);
    if (st != DI_OK || al + pl > fl) {
      ok = 0;
      break;
    }
    if (!di_utf8_valid(p, pl))
      valid = 0;
    memcpy(acc + al, p, pl);
    al += pl;
  }
  CHECKF(ok && al == fl && memcmp(acc, full, fl) == 0, "%s: streamed text differs from the full decode", what);
  CHECKF(valid, "%s: a streamed piece split a UTF-8 character", what);
  di_detok_stream_free(s);
  free(acc);
  free(full);
}

static void test_golden(const di_tokenizer *t) {
  golden *g = NULL;
  size_t n = 0;
  CHECK(load_golden(&g, &n) == 0);
  CHECKF(n >= 60, "golden lines: %zu", n);
  size_t bad_ids = 0, bad_dec = 0;
  for (size_t k = 0; k < n; k++) {
    int32_t *ids;
    size_t m;
    CHECK(di_tokenizer_encode(t, g[k].text, g[k].len, 0, &ids, &m) == DI_OK);
    if (m != g[k].n || memcmp(ids, g[k].ids, m * sizeof *ids) != 0) {
      bad_ids++;
      fprintf(stderr, "golden #%zu: ids differ for \"%.60s\"\n", k, g[k].text);
    }
    for (size_t i = 0; i < g[k].n; i++) /* every golden id checked one by one too */
      CHECK(i < m && ids[i] == g[k].ids[i]);
    char *dec;
    size_t dl;
    CHECK(di_tokenizer_decode(t, g[k].ids, g[k].n, 0, &dec, &dl) == DI_OK);
    if (strcmp(dec, g[k].decoded) != 0) {
      bad_dec++;
      fprintf(stderr, "golden #%zu: decode differs: \"%.60s\"\n", k, dec);
    }
    free(dec);
    check_stream(t, g[k].ids, g[k].n, 0, "golden");
    free(ids);
    free(g[k].text);
    free(g[k].ids);
    free(g[k].decoded);
  }
  CHECKF(bad_ids == 0 && bad_dec == 0, "%zu id mismatches, %zu decode mismatches", bad_ids, bad_dec);
  free(g);
}

static void test_config_and_bytes(const di_tokenizer *t) {
  CHECK(di_tokenizer_bos_id(t) == 0);
  CHECK(di_tokenizer_eos_id(t) == 1);
  CHECK(di_tokenizer_add_bos(t) == 1);
  CHECK(strcmp(di_tokenizer_bos_token(t), "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>") == 0);
  CHECK(di_tokenizer_vocab_size(t) >= 128815);
  CHECK(di_tokenizer_is_special(t, 0) && !di_tokenizer_is_special(t, 19923));
  CHECK(di_tokenizer_token_to_id(t, "Hello") == 19923);
  CHECK(di_tokenizer_token_to_id(t, "no-such-token-xyz") == -1);
  size_t bl;
  const char *b = di_tokenizer_token_bytes(t, 2058, &bl); /* "Ġworld" */
  CHECK(b && bl == 6 && memcmp(b, " world", 6) == 0);
  b = di_tokenizer_token_bytes(t, 0, &bl);
  CHECK(b && bl == strlen(di_tokenizer_bos_token(t)) && memcmp(b, di_tokenizer_bos_token(t), bl) == 0);
  b = di_tokenizer_token_bytes(t, -1, &bl);
  CHECK(b == NULL && bl == 0);
  b = di_tokenizer_token_bytes(t, di_tokenizer_vocab_size(t), &bl);
  CHECK(b == NULL && bl == 0);
  /* a byte token: the 256 single bytes are all somewhere in the vocab */
  int bytes_seen[256] = {0};
  for (int32_t id = 0; id < di_tokenizer_vocab_size(t); id++) {
    b = di_tokenizer_token_bytes(t, id, &bl);
    if (b && bl == 1)
      bytes_seen[(unsigned char)b[0]] = 1;
  }
  int all = 1;
  for (int i = 0; i < 256; i++)
    all &= bytes_seen[i];
  CHECK(all);
  /* prompt: BOS per add_bos_token, nothing else added */
  int32_t *ids, *pids;
  size_t n, pn;
  CHECK(di_tokenizer_encode(t, "Hello world", 11, 0, &ids, &n) == DI_OK);
  CHECK(di_tokenizer_encode_prompt(t, "Hello world", 11, &pids, &pn) == DI_OK);
  CHECK(pn == n + 1 && pids[0] == 0 && memcmp(pids + 1, ids, n * sizeof *ids) == 0);
  free(ids);
  free(pids);
  /* add_special_tokens: the ByteLevel post-processor adds nothing */
  CHECK(di_tokenizer_encode(t, "Hello world", 11, 1, &ids, &n) == DI_OK);
  CHECK(n == 2 && ids[0] == 19923 && ids[1] == 2058);
  free(ids);
  /* special tokens are matched in text; decode can skip them */
  const char *txt = "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>Hello world";
  CHECK(di_tokenizer_encode(t, txt, strlen(txt), 0, &ids, &n) == DI_OK);
  CHECK(n == 3 && ids[0] == 0 && ids[1] == 19923);
  char *dec;
  CHECK(di_tokenizer_decode(t, ids, n, 1, &dec, NULL) == DI_OK);
  CHECK(strcmp(dec, "Hello world") == 0);
  free(dec);
  CHECK(di_tokenizer_decode(t, ids, n, 0, &dec, NULL) == DI_OK);
  CHECK(strcmp(dec, txt) == 0);
  free(dec);
  check_stream(t, ids, n, 1, "skip specials");
  free(ids);
  int32_t bad[] = {19923, -5};
  CHECK_ERR(di_tokenizer_decode(t, bad, 2, 0, &dec, NULL), "outside the vocab");
}

static void test_invalid_utf8(const di_tokenizer *t) {
  /* the repair itself: Python's bytes.decode("utf-8", "replace") on these inputs */
  struct { const char *in; size_t n; const char *out; } cases[] = {
      {"abc\xff" "def", 7, "abc\xef\xbf\xbd" "def"},
      {"\xe4\xbd", 2, "\xef\xbf\xbd"},
      {"x\xed\xa0\x80y", 5, "x\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdy"},
      {"\xf0\x9f\x98", 3, "\xef\xbf\xbd"},
      {"\xc3\x28", 2, "\xef\xbf\xbd("},
      {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
      {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    di_buf b = {0};
    CHECK(di_utf8_lossy_append(&b, cases[k].in, cases[k].n) == 0);
    CHECKF(b.len == strlen(cases[k].out) && memcmp(b.p, cases[k].out, b.len) == 0, "lossy case %zu", k);
    /* encoding the raw bytes equals encoding the repaired text */
    int32_t *a, *c;
    size_t na, nc;
    CHECK(di_tokenizer_encode(t, cases[k].in, cases[k].n, 0, &a, &na) == DI_OK);
    CHECK(di_tokenizer_encode(t, b.p, b.len, 0, &c, &nc) == DI_OK);
    CHECKF(na == nc && memcmp(a, c, na * sizeof *a) == 0, "invalid UTF-8 case %zu", k);
    free(a);
    free(c);
    di_buf_free(&b);
  }
}

static void test_stream_random(const di_tokenizer *t) {
  /* random ids: split characters, lone continuation bytes, specials */
  uint64_t x = 88172645463325252ULL;
  int vs = di_tokenizer_vocab_size(t);
  for (int trial = 0; trial < 300; trial++) {
    int32_t ids[48];
    size_t n = (size_t)(trial % 48);
    for (size_t i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      /* bias to the byte tokens (low ids of a byte-level vocab hold single bytes) */
      ids[i] = (int32_t)(x % 4 == 0 ? (x >> 8) % 300 : (x >> 8) % (uint64_t)vs);
    }
    check_stream(t, ids, n, trial & 1, "random ids");
  }
  /* text that splits into byte tokens: rare CJK, emoji with modifiers */
  const char *txt = "\xf0\xa9\xb8\xbd\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x94\xac caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd";
  int32_t *ids;
  size_t n;
  CHECK(di_tokenizer_encode(t, txt, strlen(txt), 0, &ids, &n) == DI_OK);
  check_stream(t, ids, n, 0, "multibyte text");
  free(ids);
}

typedef struct {
  const di_tokenizer *t;
  int ok;
  int seed;
} worker;

static const char *const THREAD_TEXTS[] = {
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "def f(x):\n    return x ** 2  # \xe4\xbd\xa0\xe5\xa5\xbd\n",
    "\xf0\x9f\x98\x80 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd caf\xc3\xa9 na\xc3\xafve \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",
    "      many   spaces\t\t\n\n\nand lines",
};

static void *work(void *p) {
  worker *w = p;
  int32_t *ref[4];
  size_t refn[4];
  w->ok = 1;
  for (int k = 0; k < 4; k++)
    if (di_tokenizer_encode(w->t, THREAD_TEXTS[k], strlen(THREAD_TEXTS[k]), 0, &ref[k], &refn[k]) != DI_OK)
      w->ok = 0;
  for (int it = 0; it < 300 && w->ok; it++) {
    int k = (it + w->seed) % 4;
    char buf[512];
    /* vary the text so the shared word cache sees inserts from every thread */
    int l = snprintf(buf, sizeof buf, "%s %d%s", THREAD_TEXTS[k], it * 7919 + w->seed, THREAD_TEXTS[(k + 1) % 4]);
    int32_t *ids;
    size_t n;
    if (di_tokenizer_encode(w->t, buf, (size_t)l, 0, &ids, &n) != DI_OK) {
      w->ok = 0;
      break;
    }
    char *dec;
    if (di_tokenizer_decode(w->t, ids, n, 0, &dec, NULL) != DI_OK || strcmp(dec, buf) != 0)
      w->ok = 0;
    free(dec);
    free(ids);
    if (di_tokenizer_encode(w->t, THREAD_TEXTS[k], strlen(THREAD_TEXTS[k]), 0, &ids, &n) != DI_OK ||
        n != refn[k] || memcmp(ids, ref[k], n * sizeof *ids) != 0)
      w->ok = 0;
    free(ids);
  }
  for (int k = 0; k < 4; k++)
    free(ref[k]);
  return NULL;
}

static void test_threads(const di_tokenizer *t) {
  pthread_t th[4];
  worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){t, 0, i};
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECKF(w[i].ok, "thread %d saw a wrong encode/decode", i);
  }
}

static di_status load_str(const char *json, di_tokenizer **t) {
  return di_tokenizer_load_mem(json, strlen(json), NULL, 0, "tokenizer.json", t);
}

static void test_errors(void) {
  di_tokenizer *t = NULL;
  CHECK_ERR(di_tokenizer_load(test_path("tests/data/no-such-dir"), &t), "does not exist");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, ", &t), "at byte");
  CHECK_ERR(load_str("[1, 2]", &t), "expected '{'");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", &t), "model type \"WordPiece\"");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"BPE\", \"merges\": []}}", &t), "model.vocab");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}}}", &t), "outside [0, 2^24]");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a c\"]}}", &t),
            "\"c\" is not in the vocab");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", &t),
            "merged token \"ab\"");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"abc\"]}}", &t),
            "separated by one space");
  CHECK_ERR(load_str("{\"normalizer\": {\"type\": \"Precompiled\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}}}", &t),
            "normalizer type \"Precompiled\" is not supported");
  CHECK_ERR(load_str("{\"pre_tokenizer\": {\"type\": \"Punctuation\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}}}", &t),
            "pre_tokenizer type \"Punctuation\"");
  CHECK_ERR(load_str("{\"decoder\": {\"type\": \"CTC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}}}", &t),
            "decoder type \"CTC\"");
  CHECK_ERR(load_str("{\"post_processor\": {\"type\": \"Foo\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}}}", &t),
            "post_processor type \"Foo\"");
  /* token ids beyond int32 or not integers (an undefined conversion before: found by fuzzing) */
  CHECK_ERR(load_str("{\"post_processor\": {\"type\": \"BertProcessing\", \"cls\": [\"[CLS]\", 1e300], \"sep\": [\"[SEP]\", 2]},"
                     " \"model\": {\"type\": \"BPE\", \"vocab\": {}}}", &t),
            "\"cls\"/\"sep\" must be [token, id]");
  CHECK_ERR(load_str("{\"post_processor\": {\"type\": \"BertProcessing\", \"cls\": [\"[CLS]\", 1.5], \"sep\": [\"[SEP]\", 2]},"
                     " \"model\": {\"type\": \"BPE\", \"vocab\": {}}}", &t),
            "\"cls\"/\"sep\" must be [token, id]");
  CHECK_ERR(load_str("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"},"
                     " \"model\": {\"type\": \"BPE\", \"vocab\": {}}}", &t),
            "bad regex");
  CHECK_ERR(load_str("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"},"
                     " \"model\": {\"type\": \"BPE\", \"vocab\": {}}}", &t),
            "unknown behavior \"Sideways\"");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 1}]}", &t),
            "missing \"content\"");
  CHECK_ERR(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\\x\": 0}}}", &t), "bad escape");
  CHECK(t == NULL);
  /* a minimal valid one */
  CHECK(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]}}",
                 &t) == DI_OK);
  int32_t *ids;
  size_t n;
  CHECK(di_tokenizer_encode(t, "abba", 4, 0, &ids, &n) == DI_OK);
  CHECK(n == 3 && ids[0] == 2 && ids[1] == 1 && ids[2] == 0);
  free(ids);
  char *dec;
  int32_t two[] = {2, 0};
  CHECK(di_tokenizer_decode(t, two, 2, 0, &dec, NULL) == DI_OK);
  CHECK(strcmp(dec, "ab a") == 0); /* no decoder: tokens joined by spaces, as HF */
  free(dec);
  di_tokenizer_free(t);
  di_tokenizer_free(NULL);
  /* a vocab string given twice: the later id wins and the earlier id is no token (as HF) */
  CHECK(load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"a\": 2}}}", &t) == DI_OK);
  CHECK(di_tokenizer_token_to_id(t, "a") == 2 && di_tokenizer_id_to_token(t, 0) == NULL);
  CHECK(di_tokenizer_encode(t, "ab", 2, 0, &ids, &n) == DI_OK);
  CHECK(n == 2 && ids[0] == 2 && ids[1] == 1);
  free(ids);
  di_tokenizer_free(t);
}

/* Decoder chains whose output can change text already produced when tokens are appended: a Replace
 * on the fused text with a pattern that matches the empty string (`a*`: found by fuzz_tokenizer,
 * crash-tokenizer-c128ba5c282055dd) or spans tokens (`ab`). The stream must still equal the full
 * decode for every sequence; a one-character Replace after Fuse stays incremental (pieces before
 * the flush). Every sequence of up to 4 of the ids a, b, c, "ab". */
static void test_stream_unstable_decoders(void) {
  static const char *const chains[] = {
      "[{\"type\": \"Fuse\"}, {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"a*\"}, \"content\": \"~\"}]",
      "[{\"type\": \"Fuse\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \"ab\"}, \"content\": \"X\"}]",
      "[{\"type\": \"Fuse\"}, {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"b$\"}, \"content\": \"\"}]",
      "[{\"type\": \"Fuse\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"ZZ\"}]",
      "[{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"a*\"}, \"content\": \"~\"}, {\"type\": \"Fuse\"}]",
  };
  const int incremental[] = {0, 0, 0, 1, 1};
  for (size_t c = 0; c < sizeof chains / sizeof *chains; c++) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"decoder\": {\"type\": \"Sequence\", \"decoders\": %s}, \"model\": {\"type\": \"BPE\", \"vocab\": "
             "{\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3}, \"merges\": [\"a b\"]}}",
             chains[c]);
    di_tokenizer *t = NULL;
    di_status st = load_str(json, &t);
    CHECKF(st == DI_OK, "chain %zu: %s", c, di_last_error());
    if (st != DI_OK)
      continue;
    int early = 0;
    for (int len = 1; len <= 4; len++) {
      int total = 1;
      for (int k = 0; k < len; k++)
        total *= 4;
      for (int code = 0; code < total; code++) {
        int32_t ids[4];
        for (int k = 0, v = code; k < len; k++, v /= 4)
          ids[k] = v % 4;
        char what[64];
        snprintf(what, sizeof what, "chain %zu, sequence %d of length %d", c, code, len);
        check_stream(t, ids, (size_t)len, 0, what);
        di_detok_stream *s;
        CHECK(di_detok_stream_create(t, 0, &s) == DI_OK);
        for (int k = 0; k < len; k++) {
          const char *p;
          size_t pl;
          CHECK(di_detok_stream_push(s, ids[k], &p, &pl) == DI_OK);
          early |= pl > 0;
        }
        di_detok_stream_free(s);
      }
    }
    CHECKF(early == incremental[c], "chain %zu: pieces before the flush %d, expected %d", c, early, incremental[c]);
    di_tokenizer_free(t);
  }
}

int main(void) {
  di_tokenizer *t = NULL;
  double t0 = now_s();
  di_status st = di_tokenizer_load(test_path("tests/data/tokenizers/deepseek-v3"), &t);
  double t1 = now_s();
  CHECKF(st == DI_OK, "load: %s", di_last_error());
  if (st != DI_OK)
    return test_finish("test_tokenizer");
  printf("DeepSeek-V3 tokenizer.json loaded in %.1f ms\n", (t1 - t0) * 1e3);
  test_golden(t);
  test_config_and_bytes(t);
  test_invalid_utf8(t);
  test_stream_random(t);
  test_threads(t);
  di_tokenizer_free(t);
  test_errors();
  test_stream_unstable_decoders();
  return test_finish("test_tokenizer");
}
