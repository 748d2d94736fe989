/* Token masks with the real DeepSeek-V3 tokenizer (tests/data/tokenizers/deepseek-v3, 128k ids):
 * documents valid for a schema, a regex and the JSON-object mode are tokenized and replayed; every
 * token of the document must be allowed, EOS exactly where the grammar can end, special tokens and ids past the
 * tokenizer never; at some steps the whole mask is compared against brute force (each id
 * accepted alone, then rolled back). */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar.h"
#include "grammar/vocab.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

static int allowed(const uint32_t *m, int id) { return (m[id >> 5] >> (id & 31)) & 1u; }

static void replay_opt(di_tokenizer *tok, const di_grammar_vocab *v, int vsize, di_grammar_kind kind, const char *src,
                       const char *doc, int brute_every, const di_grammar_options *opt) {
  di_grammar *g = NULL;
  di_status st = di_grammar_compile(kind, src, strlen(src), opt, &g);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK)
    return;
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(di_tokenizer_encode(tok, doc, strlen(doc), 0, &ids, &n) == DI_OK);
  di_grammar_matcher *m = NULL;
  CHECK(di_grammar_matcher_create(g, v, &m) == DI_OK);
  uint32_t *mask = malloc(sizeof(uint32_t) * (size_t)((vsize + 31) / 32));
  int eos = di_tokenizer_eos_id(tok), bad = 0;
  for (size_t k = 0; k <= n && m; k++) {
    CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
    CHECKF(allowed(mask, eos) == di_grammar_matcher_can_end(m), "EOS allowed %d at step %zu", allowed(mask, eos), k);
    if (k == n)
      CHECK(allowed(mask, eos));
    CHECK(!allowed(mask, vsize - 1)); /* padding id beyond the tokenizer */
    CHECK(!allowed(mask, di_tokenizer_bos_id(tok)));
    if (brute_every && k % (size_t)brute_every == 0) {
      for (int id = 0; id < vsize; id++) {
        int ok;
        if (id == eos) {
          ok = di_grammar_matcher_can_end(m);
        } else {
          ok = di_grammar_matcher_accept_token(m, id) == DI_OK;
          if (ok)
            di_grammar_matcher_rollback(m, 1);
        }
        if (ok != allowed(mask, id) && bad++ < 5)
          fprintf(stderr, "step %zu id %d: mask %d brute force %d\n", k, id, allowed(mask, id), ok);
      }
    }
    if (k < n) {
      CHECKF(allowed(mask, ids[k]), "document token %zu (id %d) not allowed", k, ids[k]);
      CHECK(di_grammar_matcher_accept_token(m, ids[k]) == DI_OK);
    } else {
      CHECK(di_grammar_matcher_accept_token(m, eos) == DI_OK);
      CHECK(di_grammar_matcher_is_terminated(m));
    }
  }
  CHECKF(bad == 0, "%d mask mismatches", bad);
  free(mask);
  free(ids);
  di_grammar_matcher_free(m);
  di_grammar_free(g);
}

static void replay(di_tokenizer *tok, const di_grammar_vocab *v, int vsize, di_grammar_kind kind, const char *src,
                   const char *doc, int brute_every) {
  replay_opt(tok, v, vsize, kind, src, doc, brute_every, NULL);
}

/* The default string bound (a counter beside the automaton state, string_bound.h) leaves every mask
 * as it is without the bound while the strings stay short of it: both forms replay the document,
 * masks compared word for word at every step. */
static void same_masks(di_tokenizer *tok, const di_grammar_vocab *v, int vsize, const char *src, const char *doc) {
  di_grammar_options on = {0}, off = {0};
  off.max_string_length = -1;
  di_grammar *g[2] = {NULL, NULL};
  CHECK(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, src, strlen(src), &on, &g[0]) == DI_OK);
  CHECK(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, src, strlen(src), &off, &g[1]) == DI_OK);
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(di_tokenizer_encode(tok, doc, strlen(doc), 0, &ids, &n) == DI_OK);
  di_grammar_matcher *m[2] = {NULL, NULL};
  CHECK(di_grammar_matcher_create(g[0], v, &m[0]) == DI_OK && di_grammar_matcher_create(g[1], v, &m[1]) == DI_OK);
  const size_t words = (size_t)(vsize + 31) / 32;
  uint32_t *a = malloc(sizeof(uint32_t) * words), *b = malloc(sizeof(uint32_t) * words);
  int differ = 0;
  for (size_t k = 0; k < n && m[0] && m[1]; k++) {
    CHECK(di_grammar_matcher_fill_mask(m[0], a) == DI_OK && di_grammar_matcher_fill_mask(m[1], b) == DI_OK);
    differ += memcmp(a, b, sizeof(uint32_t) * words) != 0;
    CHECK(di_grammar_matcher_accept_token(m[0], ids[k]) == DI_OK && di_grammar_matcher_accept_token(m[1], ids[k]) == DI_OK);
  }
  CHECKF(differ == 0, "%d of %zu masks differ with the bound on and off", differ, n);
  free(a), free(b), free(ids);
  di_grammar_matcher_free(m[0]), di_grammar_matcher_free(m[1]);
  di_grammar_free(g[0]), di_grammar_free(g[1]);
}

int main(void) {
  di_tokenizer *tok = NULL;
  di_status st = di_tokenizer_load(test_path("tests/data/tokenizers/deepseek-v3"), &tok);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK)
    return test_finish("test_grammar_tokenizer");
  int vsize = di_tokenizer_vocab_size(tok) + 64; /* a model's padded vocabulary */
  di_grammar_vocab *v = NULL;
  CHECK(di_grammar_vocab_from_tokenizer(tok, vsize, NULL, 0, &v) == DI_OK);
  replay(tok, v, vsize, DI_GRAMMAR_JSON_SCHEMA,
         "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},\"age\":{\"type\":"
         "\"integer\",\"minimum\":0,\"maximum\":130},\"email\":{\"type\":\"string\",\"format\":\"email\"},\"tags\":{"
         "\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"日本\"]}}},\"required\":[\"name\",\"age\"]}",
         "{\"name\":\"Zoë O'Brien\",\"age\":42,\"email\":\"zoe@example.org\",\"tags\":[\"green\",\"日本\"]}", 6);
  replay(tok, v, vsize, DI_GRAMMAR_REGEX, "(\\d{3}-){2}\\d{4}( ext\\. \\d+)?", "555-123-4567 ext. 89", 3);
  /* ASCII runs (ascii_run.h): a counted class and a class loop, brute force at every step */
  replay(tok, v, vsize, DI_GRAMMAR_REGEX, "[a-z0-9-]{1,30}(\\.[a-z0-9-]{1,30})+@?[A-Z0-9]*",
         "mail-server01.example-domain.org@ABC123", 1);
  /* rules emitted from automaton products (regular_set.h): patternProperties, multipleOf with bounds,
   * a pattern with a length */
  replay(tok, v, vsize, DI_GRAMMAR_JSON_SCHEMA,
         "{\"type\":\"object\",\"patternProperties\":{\"^x-[a-z]+$\":{\"type\":\"integer\",\"multipleOf\":5,"
         "\"minimum\":0,\"maximum\":1000}},\"additionalProperties\":{\"type\":\"string\",\"pattern\":\"^[a-z ]+$\","
         "\"maxLength\":12}}",
         "{\"x-abc\":125,\"other\":\"some words\",\"x-q\":1000}", 2);
  /* counted strings (count_chain.h): positions near the end derived, far ones shared, brute force
   * at every other step */
  replay(tok, v, vsize, DI_GRAMMAR_JSON_SCHEMA,
         "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"note\":{\"type\":"
         "\"string\",\"minLength\":3,\"maxLength\":300}},\"required\":[\"name\",\"note\"]}",
         "{\"name\":\"Linus Hopper and the quick brown fox jr\",\"note\":\"please call before arriving, leave at the "
         "door \\\"gift wrap\\\" — thank you; café naïve résumé 東京 priority customer requested express delivery of "
         "fragile items, handle with care\"}",
         2);
  replay(tok, v, vsize, DI_GRAMMAR_JSON_ANY, "",
         "{\"a\":[1,-2.5e3,true,null,{\"b\":\"c\\\"d\\n\"}],\"emoji\":\"😀 café\",\"n\":{}}", 8);
  /* group keys and plain / letter-digit rows (matcher.c): free keys beside known ones (the key trie
   * with its escapes nested), a counted name, an email, strings in an array; brute force at every
   * third step, and the counters show the paths ran on this vocabulary */
  const long groups0 = atomic_load(&v->n_group_walks), rows0 = atomic_load(&v->n_row_walks);
  replay(tok, v, vsize, DI_GRAMMAR_JSON_SCHEMA,
         "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"email\":{\"type\":"
         "\"string\",\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
         "\"required\":[\"name\"]}",
         "{\"name\":\"Zoë Nakamura\",\"email\":\"zoe.n@example.com\",\"tags\":[\"fragile\",\"東京 express\"],"
         "\"extra key\":{\"é\\\"\":[1,\"x\"]},\"nam\":null}",
         3);
  CHECKF(atomic_load(&v->n_group_walks) > groups0 && atomic_load(&v->n_row_walks) > rows0,
         "group keys / rows unused on the V3 vocabulary (%ld / %ld walks)", atomic_load(&v->n_group_walks) - groups0,
         atomic_load(&v->n_row_walks) - rows0);
  /* the string bound (session 16: a counter beside the automaton state): below it the masks are the
   * unbounded ones; at a bound of 12 characters (every string near it: the mask's filter on this
   * vocabulary; the uuid, 36 characters, keeps its language) brute force at every step */
  const char *bench = "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
                      "\"email\":{\"type\":\"string\",\"format\":\"email\"},\"sku\":{\"type\":\"string\",\"pattern\":"
                      "\"^[A-Z]{3}-[0-9]{4}$\"},\"note\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\",\"items\":"
                      "{\"type\":\"string\",\"pattern\":\"[a-z]\"}}},\"required\":[\"id\"]}";
  const char *bdoc = "{\"id\":\"64abd298-f7b2-0a75-ff42-475ca4e1b2bd\",\"email\":\"ada.lovelace@example.com\","
                     "\"sku\":\"TZG-5671\",\"note\":\"jumps quick with handle \\\"requested\\\" shipping 東京 order\","
                     "\"tags\":[\"fox\",\"quick brown\"],\"free key\":{\"k\":\"v\"}}";
  same_masks(tok, v, vsize, bench, bdoc);
  di_grammar_options small = {0};
  small.max_string_length = 12;
  replay_opt(tok, v, vsize, DI_GRAMMAR_JSON_SCHEMA, bench,
             "{\"id\":\"64abd298-f7b2-0a75-ff42-475ca4e1b2bd\",\"email\":\"ada@exam.com\",\"note\":\"jumps "
             "\\\"q\\\" 東京\",\"tags\":[\"fox\",\"quick brown\"],\"free key\":{\"k\":\"v\"}}",
             1, &small);
  di_grammar_vocab_free(v);
  di_tokenizer_free(tok);
  return test_finish("test_grammar_tokenizer");
}
