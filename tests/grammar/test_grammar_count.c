/* Counted repetitions (src/grammar/count_chain.h): the classification of a position near the end
 * of x{m,n} is derived from the position far from the end (tokens of at most j bytes as there,
 * longer ones walked), positions farther than the longest token take that entry as it is, and
 * a state whose stacks are all that far takes the mask of the state at the longest token's count.
 * Masks must be bit-identical to the old per-position walks (DI_GRAMMAR_COUNT_CI=0, on its own
 * vocabulary so no classification is shared between the two) and to brute force, on random
 * schemas, regexes and EBNF with minLength / maxLength, formats, patterns and {m,n}, over a
 * synthetic vocabulary whose tokens reach 40 bytes (strings with quotes, escapes, UTF-8). */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar.h"
#include "grammar/vocab.h"
#include "test_util.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)rng;
}

#define NV 2600
enum { STOP = NV - 1 };
static char *toks[NV];
static size_t lens[NV];
static int n_tok;

static void add_tok(const char *s, size_t n) {
  toks[n_tok] = malloc(n + 1);
  memcpy(toks[n_tok], s, n);
  toks[n_tok][n] = 0;
  lens[n_tok++] = n;
}

static void build_vocab(void) {
  for (int b = 0; b < 256; b++) {
    char c = (char)b;
    add_tok(&c, 1);
  }
  static const char *frags[] = {"\"", "\",", "\"}", "\":", "{\"", "\"]", "[\"", "\\n", "\\\"", "\\u00e9", "\\ud83d",
                                "\\ude00", "é", "日本", "\xc3", "\xa9", "\xe6\x97", "@", ".com", "@example.com",
                                "2024-01-15", "T12:30:00Z", "abc", "ab", " ", "  ", "name", "\"name\":\"", "-", "0",
                                "12", "123", "-0123"};
  for (size_t i = 0; i < sizeof frags / sizeof frags[0]; i++)
    add_tok(frags[i], strlen(frags[i]));
  static const char *pieces[] = {"a", "b", "c", "x", "z", "A", "Q", "0", "1", "9", " ", "-", ".", "@", "_", "\"",
                                 "\\n", "\\\"", "é", "日", ",", ":", "}", "]"};
  const int np = (int)(sizeof pieces / sizeof pieces[0]);
  while (n_tok < NV - 8) {
    char buf[64];
    size_t n = 0;
    /* mostly short tokens, some up to 40 bytes; letters far more often than structure */
    int want = rnd() % 4 ? 2 + (int)(rnd() % 7) : 9 + (int)(rnd() % 32);
    while ((int)n < want) {
      const char *p = pieces[rnd() % 3 ? rnd() % 10 : rnd() % (unsigned)np];
      size_t pl = strlen(p);
      if (n + pl > 40)
        break;
      memcpy(buf + n, p, pl);
      n += pl;
    }
    if (n > 0)
      add_tok(buf, n);
  }
  while (n_tok < NV)
    add_tok("", 0);
}

static int allowed(const uint32_t *mask, int id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

static di_grammar_vocab *make_vocab(void) {
  int32_t stops[1] = {STOP};
  const char *tb[NV];
  size_t tl[NV];
  for (int i = 0; i < NV; i++) {
    tb[i] = toks[i];
    tl[i] = lens[i];
  }
  di_grammar_vocab *v = NULL;
  CHECK(di_grammar_vocab_create(NV, tb, tl, stops, 1, &v) == DI_OK);
  return v;
}

/* Random walks with three matchers of the same source, one per vocabulary: the derivation on
 * (group keys off, so that single stacks derive), the old per-position path (both off), and the
 * default (group keys, plain rows and the derivation for the stacks left alone): each step every
 * mask and brute force agree; the next token is one of the allowed, long ones
 * preferred half the time so that walks reach the ends of the repetitions. */
static int bad;
static void compare(const char *name, di_grammar_kind kind, const char *src, di_grammar_vocab *von,
                    di_grammar_vocab *voff, di_grammar_vocab *vgr, int walks, int steps) {
  di_grammar_options opt = {0};
  opt.no_cache = 1;
  di_grammar *ga = NULL, *gb = NULL, *gc = NULL;
  di_status st = di_grammar_compile(kind, src, strlen(src), &opt, &ga);
  CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
  if (st != DI_OK)
    return;
  CHECK(di_grammar_compile(kind, src, strlen(src), &opt, &gb) == DI_OK);
  CHECK(di_grammar_compile(kind, src, strlen(src), &opt, &gc) == DI_OK);
  uint32_t ma[(NV + 31) / 32], mb[(NV + 31) / 32], mc[(NV + 31) / 32];
  for (int w = 0; w < walks; w++) {
    di_grammar_matcher *a = NULL, *b = NULL, *c = NULL;
    setenv("DI_GRAMMAR_GROUP_CI", "0", 1); /* switches are read when a grammar's caches for a vocabulary are made */
    CHECK(di_grammar_matcher_create(ga, von, &a) == DI_OK);
    setenv("DI_GRAMMAR_COUNT_CI", "0", 1);
    CHECK(di_grammar_matcher_create(gb, voff, &b) == DI_OK);
    unsetenv("DI_GRAMMAR_COUNT_CI");
    unsetenv("DI_GRAMMAR_GROUP_CI");
    CHECK(di_grammar_matcher_create(gc, vgr, &c) == DI_OK);
    if (!a || !b || !c)
      return;
    for (int step = 0; step < steps; step++) {
      CHECK(di_grammar_matcher_fill_mask(a, ma) == DI_OK);
      CHECK(di_grammar_matcher_fill_mask(b, mb) == DI_OK);
      CHECK(di_grammar_matcher_fill_mask(c, mc) == DI_OK);
      int cand[NV], nc = 0, longest = -1;
      for (int id = 0; id < NV; id++) {
        int ok;
        if (id == STOP) {
          ok = di_grammar_matcher_can_end(a);
        } else {
          ok = di_grammar_matcher_accept_token(a, id) == DI_OK;
          if (ok)
            CHECK(di_grammar_matcher_rollback(a, 1) == DI_OK);
        }
        if ((allowed(ma, id) != ok || allowed(mb, id) != ok || allowed(mc, id) != ok) && bad++ < 8)
          fprintf(stderr, "%s: walk %d step %d token %d '%s': derived %d, per position %d, group keys %d, brute force %d\n",
                  name, w, step, id, toks[id], allowed(ma, id), allowed(mb, id), allowed(mc, id), ok);
        if (ok && id != STOP) {
          cand[nc++] = id;
          if (longest < 0 || lens[id] > lens[longest])
            longest = id;
        }
      }
      if (nc == 0)
        break;
      int id = rnd() % 2 ? longest : cand[rnd() % (unsigned)nc];
      CHECK(di_grammar_matcher_accept_token(a, id) == DI_OK);
      CHECK(di_grammar_matcher_accept_token(b, id) == DI_OK);
      CHECK(di_grammar_matcher_accept_token(c, id) == DI_OK);
    }
    di_grammar_matcher_free(a);
    di_grammar_matcher_free(b);
    di_grammar_matcher_free(c);
  }
  di_grammar_free(ga);
  di_grammar_free(gb);
  di_grammar_free(gc);
}

/* Random sources: each exercises chains of a different x and continuation. */
static void random_source(int k, char *buf, size_t cap, di_grammar_kind *kind) {
  int lo = (int)(rnd() % 6), hi = lo + (int)(rnd() % 70);
  static const char *const formats[] = {"email", "date", "uuid", "date-time", "ipv4"};
  *kind = DI_GRAMMAR_JSON_SCHEMA;
  switch (k % 8) {
  case 0: /* a counted JSON string (x: a JSON character rule, then the closing quote) */
    snprintf(buf, cap, "{\"type\":\"string\",\"minLength\":%d,\"maxLength\":%d}", lo, hi);
    break;
  case 1: /* an object: a counted name beside other members and free keys */
    snprintf(buf, cap,
             "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":%d},\"n\":{\"type\":"
             "\"integer\"}},\"required\":[\"name\"]}",
             hi);
    break;
  case 2: /* a pattern with a counted class (x: a byte class) */
    snprintf(buf, cap, "{\"type\":\"string\",\"pattern\":\"^[a-z0-9 ]{%d,%d}$\"}", lo, hi);
    break;
  case 3: /* a format or pattern with a length: an automaton product, no chain */
  {
    int f = (int)(rnd() % 5); /* an email's product grows with the bound: at most 24 there */
    snprintf(buf, cap, "{\"type\":\"string\",\"format\":\"%s\",\"maxLength\":%d}", formats[f], f ? 36 + hi : 6 + hi % 19);
  }
    break;
  case 4: /* counted strings inside a counted array */
    snprintf(buf, cap, "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":%d},\"maxItems\":%d}", hi,
             1 + (int)(rnd() % 6));
    break;
  case 5: /* a regex whose x is a rule of two lengths */
    *kind = DI_GRAMMAR_REGEX;
    snprintf(buf, cap, "(ab|c|é){%d,%d}x?", lo, hi);
    break;
  case 6: /* EBNF: the continuation's first byte is also an x (no unique split) */
    *kind = DI_GRAMMAR_EBNF;
    snprintf(buf, cap, "root ::= \"\\\"\" [a-z\"]{%d,%d} \"\\\"\" [a-c]{0,%d}\n", lo, hi, (int)(rnd() % 12));
    break;
  default: /* the default string bound on every string */
    snprintf(buf, cap, "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}}");
    break;
  }
}

int main(void) {
  build_vocab();
  di_grammar_vocab *von = make_vocab(), *voff = make_vocab(), *vgr = make_vocab();
  if (!von || !voff || !vgr)
    return test_finish("test_grammar_count");
  CHECK(von->maxlen == 40);
  char src[512];
  for (int k = 0; k < 160; k++) {
    di_grammar_kind kind;
    random_source(k, src, sizeof src, &kind);
    compare(src, kind, src, von, voff, vgr, 3, 30);
  }
  /* a string longer than the longest token: far positions share, near ones derive */
  compare("string{0,100}", DI_GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":100}", von, voff, vgr, 3, 40);
  CHECKF(bad == 0, "%d mask mismatches", bad);
  /* the derivation ran, both ways, and never with the switch off */
  fprintf(stderr, "classifications derived %ld, taken as they are %ld; masks of a moved state %ld\n",
          (long)von->n_count_derived, (long)von->n_count_same, (long)von->n_count_masks);
  CHECK(von->n_count_derived > 20);
  CHECK(von->n_count_masks > 20);
  CHECK(voff->n_count_derived == 0 && voff->n_count_same == 0 && voff->n_count_masks == 0);
  /* group keys and plain rows ran with the defaults, and never with the switch off */
  fprintf(stderr, "group-key walks %ld, walks from a plain row %ld\n", (long)vgr->n_group_walks, (long)vgr->n_row_walks);
  CHECK(vgr->n_group_walks > 100 && vgr->n_row_walks > 20);
  CHECK(von->n_group_walks == 0 && von->n_row_walks == 0 && voff->n_group_walks == 0);
  di_grammar_vocab_free(von);
  di_grammar_vocab_free(voff);
  di_grammar_vocab_free(vgr);
  for (int i = 0; i < n_tok; i++)
    free(toks[i]);
  return test_finish("test_grammar_count");
}
