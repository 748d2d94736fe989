/* Token masks against brute force: for random walks through several grammars over a synthetic
 * vocabulary (all single bytes, multi-byte fragments, UTF-8 pieces, random strings, a stop id,
 * empty ids), every mask bit must equal "accepting this token alone succeeds". Also rollback,
 * termination and the stop-token rules. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/ci_shared.h"
#include "grammar/grammar.h"
#include "grammar/vocab.h"
#include "test_util.h"

static uint64_t rng = 88172645463325252ULL;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)rng;
}

#define NV 1400
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
  static const char *frags[] = {"{\"", "\":", "\",", "\"}", "\"", "{}", "[]", "[", "],", "},", "true", "false", "null",
                                "nul", "tru", "name", "\"name", "\"name\":", "age", "\"age\":", "0", "10", "123", "-1",
                                "1.5", "e+", ".0", "\\n", "\\\"", "\\u00", "é", "\xc3", "\xa9", "日本", "\xe6\x97",
                                " ", "  ", "\n", ", ", ": ", "abc", "ab", "a", "b", "c", "x", "2024", "-01", "-15",
                                "T12", ":30", ":00Z", "@", ".com", "foo", "bar", "\"foo\"", "\"bar\"", "+", "(", ")",
                                "1+2", "()", "((", "))", "ws", "\"tags\":[", "\"x\"]", "[\"", "\"]",
                                /* leap seconds: tokens reaching from the seconds into the offset */
                                ":60-08:", "60-08:0", "0-08:01", ":60+16", "-08:00\"", "-08:01\"", "15:5", "9:60", "9:60-08",
                                "9:60-09"};
  for (size_t i = 0; i < sizeof frags / sizeof frags[0]; i++)
    add_tok(frags[i], strlen(frags[i]));
  static const char alpha[] = "{}[]\":,0123456789-.eE+abcdefnrtulsx \\\n@T:Z";
  while (n_tok < NV - 10) {
    char buf[8];
    int n = 2 + (int)(rnd() % 6);
    for (int i = 0; i < n; i++)
      buf[i] = alpha[rnd() % (sizeof alpha - 1)];
    add_tok(buf, (size_t)n);
  }
  while (n_tok < NV)
    add_tok("", 0); /* padding / special ids without bytes */
}

static int allowed(const uint32_t *mask, int id) { return (mask[id >> 5] >> (id & 31)) & 1u; }

enum { STOP = NV - 1 };

static di_grammar_vocab *make_vocab(void) {
  int32_t stops[1] = {STOP};
  /* the stop id has no bytes of its own here; give it some to check they are ignored */
  di_grammar_vocab *v = NULL;
  const char *tb[NV];
  for (int i = 0; i < NV; i++)
    tb[i] = toks[i];
  size_t tl[NV];
  memcpy(tl, lens, sizeof tl);
  tb[STOP] = "</s>";
  tl[STOP] = 4;
  CHECK(di_grammar_vocab_create(NV, tb, tl, stops, 1, &v) == DI_OK);
  return v;
}

/* Random walks through one grammar on vocabulary v, every mask against brute force. */
static void walk_on(const char *name, di_grammar_kind kind, const char *src, int steps, int walks,
                    const di_grammar_vocab *v, const di_grammar_options *opt) {
  di_grammar *g = NULL;
  di_status st = di_grammar_compile(kind, src, strlen(src), opt, &g);
  CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
  if (st != DI_OK)
    return;
  uint32_t mask[(NV + 31) / 32];
  int bad = 0, ended = 0;
  for (int w = 0; w < walks; w++) {
    di_grammar_matcher *m = NULL;
    CHECK(di_grammar_matcher_create(g, v, &m) == DI_OK);
    for (int step = 0; step < steps; step++) {
      CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
      int n_allowed = 0, cand[NV];
      for (int id = 0; id < NV; id++) {
        int a = allowed(mask, id);
        int ok;
        if (id == STOP) {
          ok = di_grammar_matcher_can_end(m);
        } else if (di_grammar_matcher_accept_token(m, id) == DI_OK) {
          ok = 1;
          CHECK(di_grammar_matcher_rollback(m, 1) == DI_OK);
        } else {
          ok = 0;
        }
        if (a != ok && bad++ < 5)
          fprintf(stderr, "%s: walk %d step %d token %d '%s': mask %d, brute force %d\n", name, w, step, id, toks[id],
                  a, ok);
        if (ok && id != STOP)
          cand[n_allowed++] = id;
      }
      if (n_allowed == 0 || (di_grammar_matcher_can_end(m) && rnd() % 8 == 0)) {
        CHECK(di_grammar_matcher_can_end(m));
        CHECK(di_grammar_matcher_accept_token(m, STOP) == DI_OK);
        CHECK(di_grammar_matcher_is_terminated(m));
        CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
        int any = 0;
        for (int i = 0; i < (NV + 31) / 32; i++)
          any |= mask[i] != 0;
        CHECK(!any);
        CHECK(di_grammar_matcher_accept_token(m, 'a') != DI_OK);
        CHECK(di_grammar_matcher_rollback(m, 1) == DI_OK);
        CHECK(!di_grammar_matcher_is_terminated(m));
        ended++;
        break;
      }
      int id = cand[rnd() % (unsigned)n_allowed];
      CHECK(di_grammar_matcher_accept_token(m, id) == DI_OK);
      if (rnd() % 10 == 0 && di_grammar_matcher_num_accepted(m) >= 2) { /* speculative: roll back 2, redo */
        CHECK(di_grammar_matcher_rollback(m, 2) == DI_OK);
      }
    }
    /* empty ids are never allowed */
    CHECK(!allowed(mask, NV - 2));
    CHECK(di_grammar_matcher_accept_token(m, NV - 2) != DI_OK);
    CHECK(di_grammar_matcher_rollback(m, di_grammar_matcher_num_accepted(m) + 1) != DI_OK);
    di_grammar_matcher_free(m);
  }
  CHECKF(bad == 0, "%s: %d mask mismatches", name, bad);
  fprintf(stderr, "%s: %d walks, %d ended by stop\n", name, walks, ended);
  di_grammar_free(g);
}

static void walk(const char *name, di_grammar_kind kind, const char *src, int steps, int walks) {
  di_grammar_vocab *v = make_vocab();
  if (v)
    walk_on(name, kind, src, steps, walks, v, NULL);
  di_grammar_vocab_free(v);
}

/* Classifications shared between grammars (ci_shared.h): on one vocabulary, grammars compiled
 * afresh (no compile cache) that hold the same sub-languages -- counted strings, a date-time, an
 * integer range -- in different surroundings reuse each other's entries, and every mask still
 * equals brute force; two languages differing in one byte class (maxLength 6 vs 7, [a-c] vs [a-d])
 * must not share. */
static void shared_classifications(void) {
  di_grammar_vocab *v = make_vocab();
  if (!v)
    return;
  di_grammar_options opt = {0};
  opt.no_cache = 1;
  static const char *const schemas[] = {
      "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"when\":{\"type\":"
      "\"string\",\"format\":\"date-time\"},\"age\":{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}},"
      "\"required\":[\"name\",\"when\"]}",
      "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":6},{\"type\":\"string\",\"format\":"
      "\"date-time\"},{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}]},\"maxItems\":3}",
      "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":7},{\"type\":\"string\",\"pattern\":"
      "\"^[a-d]+$\"}]},\"maxItems\":3}",
      "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":6},{\"type\":\"string\",\"pattern\":"
      "\"^[a-c]+$\"}]},\"maxItems\":3}",
      /* longer than the longest token (8 bytes): positions with more left share one description */
      "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":40},\"maxItems\":2}",
  };
  const char *names[] = {"shared-object", "shared-array", "shared-array-7", "shared-array-6", "shared-long-string"};
  for (int i = 0; i < 5; i++)
    walk_on(names[i], DI_GRAMMAR_JSON_SCHEMA, schemas[i], 30, 6, v, &opt);
  long hits = 0, lookups = 0;
  di_ci_shared_stats(v->shared_ci, &hits, &lookups);
  CHECKF(hits > 0 && hits < lookups, "shared classifications: %ld hits of %ld lookups", hits, lookups);
  walk_on("shared-object-again", DI_GRAMMAR_JSON_SCHEMA, schemas[0], 30, 6, v, &opt);
  long hits2 = 0, lookups2 = 0;
  di_ci_shared_stats(v->shared_ci, &hits2, &lookups2);
  CHECKF(hits2 - hits > (lookups2 - lookups) / 2, "the same schema compiled again: %ld hits of %ld lookups",
         hits2 - hits, lookups2 - lookups);
  fprintf(stderr, "shared classifications: %ld hits of %ld lookups\n", hits2, lookups2);
  di_grammar_vocab_free(v);
}

/* Leap seconds (json_formats.c's trie, whose rules language_key.c describes by number: di_grule.canon):
 * documents fed one byte token at a time through leap seconds in several offsets, every mask against
 * brute force, the grammar compiled afresh each round so later rounds take shared classifications
 * (the numbered rules' keys) from the earlier ones. */
static int mask_vs_brute(di_grammar_matcher *m, const char *name, int step) {
  uint32_t mask[(NV + 31) / 32];
  CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
  int bad = 0;
  for (int id = 0; id < NV; id++) {
    int ok;
    if (id == STOP)
      ok = di_grammar_matcher_can_end(m);
    else if ((ok = di_grammar_matcher_accept_token(m, id) == DI_OK))
      CHECK(di_grammar_matcher_rollback(m, 1) == DI_OK);
    if (allowed(mask, id) != ok && bad++ < 3)
      fprintf(stderr, "%s: step %d token %d '%s': mask %d, brute force %d\n", name, step, id, toks[id],
              allowed(mask, id), ok);
  }
  return bad;
}

static void leap_seconds(void) {
  di_grammar_vocab *v = make_vocab();
  if (!v)
    return;
  di_grammar_options opt = {0};
  opt.no_cache = 1;
  static const char schema[] = "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"format\":\"time\"},"
                               "{\"type\":\"string\",\"format\":\"date-time\"}]},\"maxItems\":3}";
  /* a second grammar around the same time rule (a pattern's rules built first, which the time
   * regex may reuse): its classifications must agree with the first's wherever they are shared */
  static const char schema2[] = "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":"
                                "\"^[0-5][0-9]:$\"},\"t\":{\"type\":\"string\",\"format\":\"time\"}}}";
  static const char *const docs2[] = {"{\"p\":\"59:\",\"t\":\"15:59:60-08:00\"}", "{\"t\":\"14:59:60-09:00\"}"};
  static const char *const docs[] = {
      "[\"15:59:60-08:00\",\"23:59:60Z\"]", "[\"00:29:60.25-23:30\",\"1990-12-31T22:59:60+23:00\"]",
      "[\"2016-12-31T23:59:60+00:00\",\"12:00:60+12:01\",\"01:29:60+01:30\"]", "[\"15:59:59+15:00\"]",
      /* neighbouring local minutes: their offsets differ in the last digit only */
      "[\"15:58:60-08:01\",\"15:59:60-08:00\",\"15:58:60+15:59\"]",
      /* the same minute in another hour (a key that dropped the hour would share them) */
      "[\"14:59:60-09:00\",\"15:59:60+16:00\"]"};
  long hits0 = 0, lookups0 = 0;
  di_ci_shared_stats(v->shared_ci, &hits0, &lookups0);
  int bad = 0, steps = 0;
  const size_t n1 = sizeof docs / sizeof docs[0], n2 = sizeof docs2 / sizeof docs2[0];
  for (int round = 0; round < 2; round++)
    for (size_t d = 0; d < n1 + n2; d++) {
      const char *src = d < n1 ? schema : schema2;
      di_grammar *g = NULL;
      CHECKF(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, src, strlen(src), &opt, &g) == DI_OK, "%s", di_last_error());
      if (!g)
        continue;
      di_grammar_matcher *m = NULL;
      CHECK(di_grammar_matcher_create(g, v, &m) == DI_OK);
      const char *doc = d < n1 ? docs[d] : docs2[d - n1];
      for (size_t i = 0; m && doc[i]; i++, steps++) {
        bad += mask_vs_brute(m, "leap-seconds", (int)i);
        CHECKF(di_grammar_matcher_accept_token(m, (unsigned char)doc[i]) == DI_OK, "leap seconds: '%s' at %zu", doc,
               i);
      }
      if (m) {
        bad += mask_vs_brute(m, "leap-seconds-end", steps);
        CHECK(di_grammar_matcher_can_end(m));
      }
      di_grammar_matcher_free(m);
      di_grammar_free(g);
    }
  long hits = 0, lookups = 0;
  di_ci_shared_stats(v->shared_ci, &hits, &lookups);
  CHECKF(bad == 0, "leap seconds: %d mask mismatches", bad);
  CHECKF(hits - hits0 > 0, "leap seconds: no shared classification reused (%ld lookups)", lookups - lookups0);
  fprintf(stderr, "leap seconds: %d steps, shared %ld hits of %ld lookups\n", steps, hits - hits0, lookups - lookups0);
  di_grammar_vocab_free(v);
}

/* A tiny state budget: the automaton of a grammar used by successive requests is reset between
 * them (no live matcher), and a request that needs more states gets an error, not a crash. */
static void budget(void) {
  setenv("DI_GRAMMAR_MAX_STATES", "600", 1);
  di_grammar_options opt = {0};
  opt.no_cache = 1;
  di_grammar *g = NULL;
  const char *src = "{}";
  CHECK(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, src, strlen(src), &opt, &g) == DI_OK);
  const char *tb[NV];
  for (int i = 0; i < NV; i++)
    tb[i] = toks[i];
  int32_t stop = NV - 1;
  di_grammar_vocab *v = NULL;
  CHECK(di_grammar_vocab_create(NV, tb, lens, &stop, 1, &v) == DI_OK);
  uint32_t mask[(NV + 31) / 32];
  int errors = 0, completed = 0;
  for (int r = 0; r < 12; r++) {
    di_grammar_matcher *m = NULL;
    CHECK(di_grammar_matcher_create(g, v, &m) == DI_OK);
    const char *doc = r % 3 == 2 ? "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                                   "1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
                                 : "[1,{\"a\":[true]}]";
    int ok = 1;
    for (const char *p = doc; *p && ok; p++) {
      if (di_grammar_matcher_fill_mask(m, mask) != DI_OK || di_grammar_matcher_accept_token(m, (unsigned char)*p) != DI_OK)
        ok = 0;
    }
    if (ok) {
      CHECK(di_grammar_matcher_can_end(m));
      completed++;
    } else {
      errors++;
      CHECK(di_last_error()[0] != 0);
    }
    di_grammar_matcher_free(m);
  }
  CHECKF(completed == 8 && errors == 4, "%d requests completed under the tiny budget", completed);
  fprintf(stderr, "budget: %d requests completed, %d stopped by the state budget\n", completed, errors);
  di_grammar_vocab_free(v);
  di_grammar_free(g);
  unsetenv("DI_GRAMMAR_MAX_STATES");
}

/* Matchers of one grammar on several threads share its caches (under its mutex): each thread
 * walks its own random path and checks every mask against brute force. */
typedef struct {
  di_grammar *g;
  di_grammar_vocab *v;
  uint64_t seed;
  int bad, steps, err;
} thr_arg;

static void *thread_walk(void *p) {
  thr_arg *a = p;
  uint64_t r = a->seed;
  uint32_t mask[(NV + 31) / 32];
  for (int w = 0; w < 3; w++) {
    di_grammar_matcher *m = NULL;
    if (di_grammar_matcher_create(a->g, a->v, &m) != DI_OK) {
      a->err++;
      return NULL;
    }
    for (int step = 0; step < 25; step++) {
      if (di_grammar_matcher_fill_mask(m, mask) != DI_OK) {
        a->err++;
        break;
      }
      int cand[NV], n = 0;
      for (int id = 0; id < NV - 1; id++) {
        int ok = di_grammar_matcher_accept_token(m, id) == DI_OK;
        if (ok) {
          di_grammar_matcher_rollback(m, 1);
          cand[n++] = id;
        }
        if (ok != allowed(mask, id))
          a->bad++;
      }
      if (!n)
        break;
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      if (di_grammar_matcher_accept_token(m, cand[r % (unsigned)n]) != DI_OK)
        a->err++;
      a->steps++;
    }
    di_grammar_matcher_free(m);
  }
  return NULL;
}

static void threads(void) {
  const char *src = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":"
                    "\"integer\",\"minimum\":-50}},\"b\":{\"type\":\"string\"}},\"additionalProperties\":true}";
  di_grammar *g = NULL;
  CHECK(di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, src, strlen(src), NULL, &g) == DI_OK);
  const char *tb[NV];
  for (int i = 0; i < NV; i++)
    tb[i] = toks[i];
  int32_t stop = NV - 1;
  di_grammar_vocab *v = NULL;
  CHECK(di_grammar_vocab_create(NV, tb, lens, &stop, 1, &v) == DI_OK);
  enum { T = 4 };
  pthread_t th[T];
  thr_arg args[T];
  for (int i = 0; i < T; i++) {
    args[i] = (thr_arg){g, v, 0x9E3779B97F4A7C15ULL * (uint64_t)(i + 1), 0, 0, 0};
    CHECK(pthread_create(&th[i], NULL, thread_walk, &args[i]) == 0);
  }
  int steps = 0;
  for (int i = 0; i < T; i++) {
    pthread_join(th[i], NULL);
    CHECKF(args[i].bad == 0 && args[i].err == 0, "thread %d: %d mismatches, %d errors", i, args[i].bad, args[i].err);
    steps += args[i].steps;
  }
  CHECK(steps > 100);
  di_grammar_vocab_free(v);
  di_grammar_free(g);
}

/* Walks abandoned at the bound of uncertain tokens resume with one frame more (matcher.c
 * compute_ci): with the bound at 0, 3 and 17 nearly every classification is abandoned and resumed,
 * at several depths in a row; every mask must still equal brute force, and the resumptions must
 * have happened. */
static void resumed_walks(void) {
  static const char *bounds[] = {"0", "3", "17"};
  for (int b = 0; b < 3; b++) {
    setenv("DI_GRAMMAR_CI_UNCERTAIN", bounds[b], 1); /* read when a grammar's caches for a vocabulary are made */
    di_grammar_vocab *v = make_vocab();
    if (!v)
      continue;
    char name[64];
    snprintf(name, sizeof name, "resumed-json-any-%s", bounds[b]);
    walk_on(name, DI_GRAMMAR_JSON_ANY, "", 30, 6, v, NULL);
    snprintf(name, sizeof name, "resumed-schema-%s", bounds[b]);
    walk_on(name, DI_GRAMMAR_JSON_SCHEMA,
            "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"when\":{\"type\":"
            "\"string\",\"format\":\"date-time\"},\"n\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}}",
            30, 6, v, NULL);
    snprintf(name, sizeof name, "resumed-ebnf-%s", bounds[b]);
    walk_on(name, DI_GRAMMAR_EBNF,
            "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" ws expr ws \")\"\nws ::= \" \"?\n", 30,
            6, v, NULL);
    snprintf(name, sizeof name, "resumed-regex-%s", bounds[b]);
    walk_on(name, DI_GRAMMAR_REGEX, "(ab|a[0-9]+c)*x?(é|日本)+\\d{2,4}", 25, 6, v, NULL);
    const long resumed = atomic_load(&v->n_resumed);
    CHECKF(resumed > 0, "bound %s: no walk was resumed", bounds[b]);
    fprintf(stderr, "resumed walks (bound %s): %ld\n", bounds[b], resumed);
    di_grammar_vocab_free(v);
  }
  unsetenv("DI_GRAMMAR_CI_UNCERTAIN");
}

/* Group keys (matcher.c get_group_ci): a state's stacks classified as one key, counted from their
 * common ancestor, and walks started from the vocabulary's plain rows. Grammars with many
 * alternatives, alternatives nested at another's start (a rule reference first: the stacks end at
 * different heights), free keys beside known ones, counted strings and a set of stacks with no
 * common frame; at uncertain-token bounds 0 / 3 / 17 / the default, so that group walks are
 * abandoned and resumed at several levels; every mask against brute force, the same grammars with
 * the switch off as well; the counters show the paths ran (and not with the switch off). */
static void group_keys(void) {
  static const char *bounds[] = {"0", "3", "17", NULL};
  static const char *ebnf =
      "root ::= item (\",\" item)*\n"
      "item ::= \"a\" num | \"b\" str | sub tail | [c-f]+ | \"\\\"\" str \"\\\"\" | \"x\" | \"xy\" num\n"
      "sub ::= \"g\" | \"h\" \"i\" | [j-m] | inner\n"
      "inner ::= \"n\" | \"op\" | [q-s]+\n"
      "tail ::= \"\" | \":\" num | \"=\" str\n"
      "str ::= ([^\"\\\\] | \"\\\\\" [\"\\\\nt])*\n"
      "num ::= [0-9]+ (\".\" [0-9]+)?\n";
  static const char *schema =
      "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":7},\"nab\":{\"type\":"
      "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"sub\":{\"type\":\"object\","
      "\"properties\":{\"x\":{\"type\":\"string\"}}}},\"required\":[\"name\"]}";
  for (int on = 0; on < 2; on++)
    for (int b = 0; b < 4; b++) {
      if (!on)
        setenv("DI_GRAMMAR_GROUP_CI", "0", 1); /* switches are read when a grammar's caches for a vocabulary are made */
      if (bounds[b])
        setenv("DI_GRAMMAR_CI_UNCERTAIN", bounds[b], 1);
      di_grammar_vocab *v = make_vocab();
      if (v) {
        char name[64];
        snprintf(name, sizeof name, "group-ebnf-%s-%s", on ? "on" : "off", bounds[b] ? bounds[b] : "default");
        walk_on(name, DI_GRAMMAR_EBNF, ebnf, 30, 8, v, NULL);
        snprintf(name, sizeof name, "group-schema-%s-%s", on ? "on" : "off", bounds[b] ? bounds[b] : "default");
        walk_on(name, DI_GRAMMAR_JSON_SCHEMA, schema, 40, 8, v, NULL);
        snprintf(name, sizeof name, "group-json-%s-%s", on ? "on" : "off", bounds[b] ? bounds[b] : "default");
        walk_on(name, DI_GRAMMAR_JSON_ANY, "", 30, 6, v, NULL);
        snprintf(name, sizeof name, "group-regex-%s-%s", on ? "on" : "off", bounds[b] ? bounds[b] : "default");
        walk_on(name, DI_GRAMMAR_REGEX, "(a|b[0-9]|c+|(d|e)f|é)+|x(y|z)*", 20, 6, v, NULL);
        const long gw = atomic_load(&v->n_group_walks), rw = atomic_load(&v->n_row_walks);
        fprintf(stderr, "group keys %s, bound %s: %ld group walks, %ld from a plain row, %ld resumed\n", on ? "on" : "off",
                bounds[b] ? bounds[b] : "default", gw, rw, (long)atomic_load(&v->n_resumed));
        if (on)
          CHECKF(gw > 20 && rw > 5, "group keys on, bound %s: %ld group walks, %ld from a row", bounds[b] ? bounds[b] : "default",
                 gw, rw);
        else
          CHECKF(gw == 0 && rw == 0, "group keys off: %ld group walks, %ld from a row", gw, rw);
        di_grammar_vocab_free(v);
      }
      unsetenv("DI_GRAMMAR_CI_UNCERTAIN");
      unsetenv("DI_GRAMMAR_GROUP_CI");
    }
}

/* The trie keeps token depths in 16 bits (vocab.h): a longer token is refused by name. */
static void long_token(void) {
  size_t n = 70000;
  char *big = malloc(n);
  if (!big)
    return;
  memset(big, 'a', n);
  const char *tb[2] = {"a", big};
  size_t tl[2] = {1, n};
  di_grammar_vocab *v = NULL;
  CHECK(di_grammar_vocab_create(2, tb, tl, NULL, 0, &v) == DI_ERR_INVALID_ARG);
  CHECK(v == NULL);
  CHECK(strstr(di_last_error(), "70000 bytes") != NULL);
  tl[1] = 65535; /* the longest taken */
  CHECK(di_grammar_vocab_create(2, tb, tl, NULL, 0, &v) == DI_OK);
  di_grammar_vocab_free(v);
  free(big);
}

int main(void) {
  build_vocab();
  long_token();
  resumed_walks();
  group_keys();
  budget();
  threads();
  walk("json-any", DI_GRAMMAR_JSON_ANY, "", 40, 12);
  shared_classifications();
  leap_seconds();
  walk("schema", DI_GRAMMAR_JSON_SCHEMA,
       "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"age\":{\"type\":\"integer\","
       "\"minimum\":-5,\"maximum\":120},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"x\",\"y\",\"foo\"]}},\"when\":{"
       "\"type\":\"string\",\"format\":\"date-time\"}},\"required\":[\"name\",\"age\"],\"additionalProperties\":{\"type\":"
       "\"boolean\"}}",
       40, 12);
  walk("regex", DI_GRAMMAR_REGEX, "(ab|a[0-9]+c)*x?(é|日本)+\\d{2,4}", 25, 12);
  walk("ebnf", DI_GRAMMAR_EBNF,
       "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" ws expr ws \")\"\nws ::= \" \"?\n", 30,
       12);
  walk("ws-json", DI_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":4}", 30, 8);
  /* Lark: left recursion rewritten, %ignore slots before terminals; bounded generation defaults */
  walk("lark", DI_GRAMMAR_LARK,
       "start: expr\nexpr: expr \"+\" term | term\nterm: term \"*\" atom | atom\natom: INT | \"(\" expr \")\" | /[a-c]+/i\n"
       "%import common.INT\n%import common.WS_INLINE\n%ignore WS_INLINE\n",
       30, 12);
  walk("multiple-of", DI_GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"multipleOf\":0.25}}",
       30, 8);
  walk("json-bounded", DI_GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}}}", 30, 8);
  walk("decimal-bounds", DI_GRAMMAR_JSON_SCHEMA,
       "{\"type\":\"array\",\"items\":{\"type\":\"number\",\"exclusiveMinimum\":-1.5,\"maximum\":2.25}}", 30, 8);
  /* Lark max_tokens (test_grammar_max_tokens.c has the oracle): masks walk every token and test the
   * token boundary; several lexemes, with stop / max_chars / lazy on the same rule, and a token
   * reference beside one */
  walk("lark-max-tokens", DI_GRAMMAR_LARK,
       "start: (r \",\")* ans\nr[max_tokens=2]: /[a-z ]+/\nans[max_tokens=3, stop=\"]\"]: /[0-9.e+-]*/\n", 30, 12);
  walk("lark-max-tokens-chars", DI_GRAMMAR_LARK,
       "start: head \":\" tail\nhead[max_tokens=1, max_chars=4]: /[a-z\"]*/\ntail[lazy, max_tokens=2]: /[a-z]+x/\n", 30,
       12);
  walk("lark-max-tokens-ref", DI_GRAMMAR_LARK, "start: <[5]> r\nr[max_tokens=2]: /[a-c0-9]+/\n", 30, 8);
  /* XGrammar's EBNF rule attributes (rule_ops.h, shared with Lark): a token bound on a rule reference
   * beside a shared sub-rule, lazy + max_tokens, max_chars */
  walk("ebnf-attributes", DI_GRAMMAR_EBNF,
       "root ::= a \" \" b (\",\" c)*\na[max_tokens=2] ::= sub\nb ::= sub\nsub ::= [a-z] sub | [a-z]\n"
       "c[lazy, max_tokens=3] ::= [0-9] [0-9a-z]* \"x\"\n",
       30, 12);
  walk("ebnf-max-chars", DI_GRAMMAR_EBNF, "root ::= \"<\" r \">\" r\nr[max_chars=4] ::= [a-z\"]*\n", 30, 8);
  /* token references: ids 5 and 9 by id (5 may have no bytes), any token but 9 between them, text after */
  walk("token-refs", DI_GRAMMAR_EBNF, "root ::= <[5]> (!<[9]>){0,6} <[9]> [a-z]*\n", 30, 12);
  for (int i = 0; i < n_tok; i++)
    free(toks[i]);
  return test_finish("test_grammar_mask");
}
