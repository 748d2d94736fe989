/* libFuzzer target for the tokenizer. The first input byte picks what the rest is:
 *   even: text for one of two built-in tokenizers (byte-level BPE with normalizers, a Split regex,
 *         added tokens with lstrip/rstrip/single_word and clean-up; or SentencePiece-style BPE with
 *         Metaspace and byte fallback): encode, decode, token bytes, and the streaming detokenizer,
 *         whose output must equal the full decode (else the target traps);
 *   odd:  a tokenizer.json to load (then used on a fixed text if it loads);
 *   3:    a tokenizer_config.json (bos/eos tokens and their add_* switches, clean-up, added tokens'
 *         decoder table), loaded with the first built-in tokenizer.json (the other odd values keep
 *         their meaning, so the older corpus does not change).
 * Also compiled into tests/tokenizer/test_tokenizer_fuzz_corpus.c, which replays the corpus. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_tokenizer_cleanup(void);

static char *build_json(int sentencepiece) {
  size_t cap = 1 << 16, n = 0;
  char *j = malloc(cap);
  if (!j)
    return NULL;
#define OUT(...) (n += (size_t)snprintf(j + n, cap - n, __VA_ARGS__))
  int id = 0;
  OUT("{\"version\":\"1.0\",\"added_tokens\":["
      "{\"id\":0,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true},"
      "{\"id\":1,\"content\":\"<L>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"special\":true},"
      "{\"id\":2,\"content\":\"word\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":true,\"special\":false}],");
  if (!sentencepiece) {
    OUT("\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\d{4,}\"},\"content\":\"#\"}]},"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"'s|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s+(?!\\\\S)|\\\\s+\"},"
        "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":false}]},"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[0],\"tokens\":[\"<s>\"]}}},"
        "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{");
    /* the 256 byte stand-ins (ids 3..258), then merges of a few common pairs */
    for (int b = 0; b < 256; b++) {
      int cp = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE) ? b : -1;
      static int extra;
      if (b == 0)
        extra = 0;
      if (cp < 0)
        cp = 256 + extra++;
      OUT("\"\\u%04x\":%d,", cp, 3 + b);
    }
    id = 259;
    OUT("\"\\u0120t\":%d,\"he\":%d,\"\\u0120the\":%d,\"in\":%d,\"\\u0120\\u0120\":%d},"
        "\"merges\":[\"\\u0120 t\",\"h e\",\"\\u0120t he\",[\"i\",\"n\"],\"\\u0120 \\u0120\"]}}",
        id, id + 1, id + 2, id + 3, id + 4);
  } else {
    OUT("\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},\"pre_tokenizer\":null,"
        "\"post_processor\":null,\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
        "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
        "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,\"vocab\":{\"<unk>\":3,");
    for (int b = 0; b < 256; b++)
      OUT("\"<0x%02X>\":%d,", b, 4 + b);
    OUT("\"\\u2581\":260,\"a\":261,\"b\":262,\"\\u2581a\":263,\"ab\":264,\"\\u00e9\":265},"
        "\"merges\":[\"\\u2581 a\",\"a b\"]}}");
  }
#undef OUT
  return j;
}

static di_tokenizer *fixed[2];
static char *json0; /* built-in tokenizer 0's tokenizer.json, for mode 3 (built once: not what it fuzzes) */

#define STREAM_IDS 32
#define MAX_TEXT 512 /* text bytes used; longer inputs add cost, not paths (the text is split in pieces) */

/* Frees the built-in tokenizers (the corpus replay test calls it, so leak checks stay clean). */
void fuzz_tokenizer_cleanup(void) {
  for (int i = 0; i < 2; i++) {
    di_tokenizer_free(fixed[i]);
    fixed[i] = NULL;
  }
  free(json0);
  json0 = NULL;
}

static void check_stream(const di_tokenizer *t, const int32_t *ids, size_t n, int skip) {
  char *full;
  size_t fl;
  if (di_tokenizer_decode(t, ids, n, skip, &full, &fl) != DI_OK)
    return;
  di_detok_stream *s;
  if (di_detok_stream_create(t, skip, &s) != DI_OK) {
    free(full);
    return;
  }
  size_t pos = 0;
  int ok = 1;
  for (size_t i = 0; i <= n && ok; i++) {
    const char *p;
    size_t pl;
    di_status st = i < n ? di_detok_stream_push(s, ids[i], &p, &pl) : di_detok_stream_flush(s, &p, &pl);
    if (st != DI_OK)
      break;
    if (pos + pl > fl || memcmp(full + pos, p, pl) != 0)
      ok = 0;
    pos += pl;
  }
  if (ok && pos != fl)
    ok = 0;
  di_detok_stream_free(s);
  free(full);
  if (!ok) {
    fprintf(stderr, "fuzz_tokenizer: streamed text differs from the full decode\n");
    abort();
  }
}

static void exercise(const di_tokenizer *t, const char *text, size_t n) {
  int32_t *ids;
  size_t k;
  if (di_tokenizer_encode(t, text, n, (int)(n & 1), &ids, &k) != DI_OK)
    return;
  for (size_t i = 0; i < k; i++) {
    size_t bl;
    const char *b = di_tokenizer_token_bytes(t, ids[i], &bl);
    if (!b && bl)
      abort();
  }
  /* the stream against the full decode, keeping or skipping specials (the text's length picks one:
   * both per input doubled the run time, the dominant cost of this target). At most STREAM_IDS ids,
   * from an offset the text picks: the streaming detokenizer decodes its window twice per token, so
   * streaming every id of a long text was most of the target's time, and a window of 32 ids already
   * crosses several compactions of the stream's state; the whole text is still encoded and decoded. */
  size_t from = k > STREAM_IDS ? (size_t)(unsigned char)text[0] * 131u % (k - STREAM_IDS + 1) : 0;
  check_stream(t, ids + from, k - from < STREAM_IDS ? k - from : STREAM_IDS, (int)(n >> 1 & 1));
  /* random-ish ids from the text itself: split characters, byte tokens, specials */
  int vs = di_tokenizer_vocab_size(t);
  if (vs > 0 && n) {
    int32_t raw[64];
    size_t m = n < 24 ? n : 24;
    for (size_t i = 0; i < m; i++)
      raw[i] = (int32_t)((unsigned char)text[i] * 7u % (unsigned)vs);
    check_stream(t, raw, m, 0);
  }
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  int mode = data[0];
  data++;
  size--;
  if (mode == 3) {
    if (!json0 && !(json0 = build_json(0)))
      return 0;
    di_tokenizer *t;
    if (di_tokenizer_load_mem(json0, strlen(json0), (const char *)data, size, "fuzz", &t) == DI_OK) {
      static const char text[] = "<s> Hello word , it 's 12345 <L> end";
      exercise(t, text, sizeof text - 1);
      di_tokenizer_free(t);
    }
    return 0;
  }
  if (mode & 1) {
    di_tokenizer *t;
    if (di_tokenizer_load_mem((const char *)data, size, NULL, 0, "tokenizer.json", &t) == DI_OK) {
      static const char text[] = "Hello world! <s> caf\xc3\xa9 123456 \xe4\xbd\xa0\xe5\xa5\xbd \xff end";
      exercise(t, text, sizeof text - 1);
      di_tokenizer_free(t);
    }
    return 0;
  }
  int which = (mode >> 1) & 1;
  if (!fixed[which]) {
    char *j = build_json(which);
    static const char cfg[] = "{\"clean_up_tokenization_spaces\": true, \"bos_token\": \"<s>\", \"add_bos_token\": true}";
    if (!j || di_tokenizer_load_mem(j, strlen(j), cfg, sizeof cfg - 1, "fuzz", &fixed[which]) != DI_OK) {
      fprintf(stderr, "fuzz_tokenizer: built-in tokenizer %d does not load: %s\n", which, di_last_error());
      abort();
    }
    free(j);
  }
  exercise(fixed[which], (const char *)data, size < MAX_TEXT ? size : MAX_TEXT);
  return 0;
}
