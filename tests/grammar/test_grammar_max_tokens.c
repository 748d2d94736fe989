/* Lark's max_tokens=N (a lexeme spans at most N accepted tokens, counting the token it starts in,
 * as llguidance counts) against an oracle written independently of the engine: for the grammar
 * `start: "<" r ("," r)* ">"` with `r[max_tokens=N]: /[a-z]+/`, a token sequence is a valid
 * prefix exactly when its text is a prefix of the language and every letter run (one lexeme) has
 * bytes in at most N of the tokens. Random walks over a small vocabulary of short strings check
 * accept_token, every mask bit, can_end and rollback (speculative decoding: the states are kept
 * per token, so rolling back across a boundary must restore the counts exactly). The byte-level
 * shortcuts of the mask (classifications, count chains, shared store) are off for such grammars,
 * so this test is what shows their replacement is exact. Also the compile errors. */
#include <stdlib.h>
#include <string.h>
#include "grammar/ci_shared.h"
#include "grammar/grammar.h"
#include "grammar/vocab.h"
#include "test_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)rng;
}

#define NV 160
#define MAXSTEP 40
static char toks[NV][5];
static int n_tok;
enum { STOP = NV - 1 };

static void build_vocab(void) {
  static const char alpha[] = "<>,ab";
  for (int i = 0; i < 5; i++) /* every single byte the grammar uses, then random 2..4-byte strings */
    toks[n_tok][0] = alpha[i], toks[n_tok++][1] = 0;
  while (n_tok < STOP) {
    int n = 2 + (int)(rnd() % 3);
    for (int i = 0; i < n; i++)
      toks[n_tok][i] = alpha[rnd() % 5];
    toks[n_tok++][n] = 0;
  }
  strcpy(toks[STOP], "");
}

/* The oracle: text t[0..n) of k tokens whose first byte offsets are start[0..k) (start[k] = n). */
static int oracle(const char *t, int n, const int *start, int k, int max_tokens, int *complete) {
  *complete = 0;
  if (n == 0)
    return 1;
  if (t[0] != '<')
    return 0;
  int tok = 0, run_first_tok = -1, prev = '<';
  for (int i = 1; i < n; i++) {
    while (tok + 1 < k && start[tok + 1] <= i)
      tok++;
    char c = t[i];
    if (prev == '>')
      return 0; /* nothing after the end */
    if (c == 'a' || c == 'b') {
      if (run_first_tok < 0)
        run_first_tok = tok;
      if (tok - run_first_tok + 1 > max_tokens)
        return 0; /* this lexeme's bytes now lie in more than max_tokens tokens */
    } else if (c == ',' || c == '>') {
      if (run_first_tok < 0)
        return 0; /* an empty lexeme */
      run_first_tok = -1;
    } else {
      return 0;
    }
    prev = c;
  }
  *complete = prev == '>';
  return 1;
}

static void walks_on(di_grammar_vocab *v, int max_tokens, int n_walks);

static di_grammar_vocab *make_vocab(void) {
  const char *tb[NV];
  size_t tl[NV];
  for (int i = 0; i < NV; i++)
    tb[i] = toks[i], tl[i] = strlen(toks[i]);
  int32_t stops[1] = {STOP};
  di_grammar_vocab *v = NULL;
  CHECK(di_grammar_vocab_create(NV, tb, tl, stops, 1, &v) == DI_OK);
  return v;
}

static void walks(int max_tokens, int n_walks) {
  di_grammar_vocab *v = make_vocab();
  if (v)
    walks_on(v, max_tokens, n_walks);
  di_grammar_vocab_free(v);
}

/* The vocabulary's shared classifications (ci_shared.h) serve max_tokens grammars: grammars with
 * different bounds (and one without) compiled afresh on one vocabulary reuse each other's entries
 * (a classification is of the bytes alone), and every mask still agrees with the oracle. */
static void shared_walks(void) {
  di_grammar_vocab *v = make_vocab();
  if (!v)
    return;
  walks_on(v, 2, 20);
  long hits0 = 0, lookups0 = 0, hits = 0, lookups = 0;
  di_ci_shared_stats(v->shared_ci, &hits0, &lookups0);
  walks_on(v, 3, 20);
  walks_on(v, 2, 20);
  walks_on(v, 1, 20);
  di_ci_shared_stats(v->shared_ci, &hits, &lookups);
  CHECKF(hits > hits0, "max_tokens grammars did not reuse shared classifications (%ld hits)", hits - hits0);
  fprintf(stderr, "shared max_tokens walks: %ld hits of %ld lookups after the first grammar\n", hits - hits0,
          lookups - lookups0);
  di_grammar_vocab_free(v);
}

static void walks_on(di_grammar_vocab *v, int max_tokens, int n_walks) {
  char src[200];
  snprintf(src, sizeof src, "start: \"<\" r (\",\" r)* \">\"\nr[max_tokens=%d]: /[a-z]+/\n", max_tokens);
  /* the grammar is over a..z; the vocabulary only has a and b, which keeps walks dense */
  di_grammar *g = NULL;
  CHECKF(di_grammar_compile(DI_GRAMMAR_LARK, src, strlen(src), NULL, &g) == DI_OK, "%s", di_last_error());
  if (!g)
    return;
  uint32_t mask[(NV + 31) / 32];
  int bad = 0, longest_run = 0, ended = 0, rolled = 0;
  for (int w = 0; w < n_walks && v; w++) {
    di_grammar_matcher *m = NULL;
    CHECK(di_grammar_matcher_create(g, v, &m) == DI_OK);
    if (!m)
      break;
    char text[MAXSTEP * 5 + 8];
    int start[MAXSTEP + 2], k = 0, n = 0;
    for (int step = 0; step < MAXSTEP; step++) {
      CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
      int cand[NV], nc = 0, complete = 0;
      CHECK(oracle(text, n, start, k, max_tokens, &complete));
      CHECK(((mask[STOP >> 5] >> (STOP & 31)) & 1u) == (unsigned)complete);
      CHECK(di_grammar_matcher_can_end(m) == complete);
      for (int id = 0; id < STOP; id++) {
        int len = (int)strlen(toks[id]), c2;
        memcpy(text + n, toks[id], (size_t)len);
        start[k] = n;
        start[k + 1] = n + len;
        int want = oracle(text, n + len, start, k + 1, max_tokens, &c2);
        int got = (mask[id >> 5] >> (id & 31)) & 1u;
        int acc = di_grammar_matcher_accept_token(m, id) == DI_OK;
        if (acc)
          CHECK(di_grammar_matcher_rollback(m, 1) == DI_OK);
        if ((got != want || acc != want) && bad++ < 8)
          fprintf(stderr, "max_tokens=%d walk %d step %d: text '%.*s' + '%s': oracle %d, mask %d, accept %d\n",
                  max_tokens, w, step, n, text, toks[id], want, got, acc);
        if (want)
          cand[nc++] = id;
      }
      if (nc == 0 || (complete && rnd() % 2 == 0)) {
        CHECK(complete);
        CHECK(di_grammar_matcher_accept_token(m, STOP) == DI_OK);
        ended++;
        break;
      }
      /* prefer letters so that runs reach the bound */
      int id = cand[rnd() % (unsigned)nc];
      for (int tries = 0; tries < 3 && strchr(toks[id], '>'); tries++)
        id = cand[rnd() % (unsigned)nc];
      int len = (int)strlen(toks[id]);
      CHECK(di_grammar_matcher_accept_token(m, id) == DI_OK);
      start[k++] = n;
      memcpy(text + n, toks[id], (size_t)len);
      n += len;
      start[k] = n;
      int run = 0;
      for (int i = n - 1; i >= 0 && (text[i] == 'a' || text[i] == 'b'); i--)
        run++;
      if (run > longest_run)
        longest_run = run;
      if (k >= 3 && rnd() % 6 == 0) { /* speculative decoding: roll back 1..3 tokens */
        int r = 1 + (int)(rnd() % 3);
        CHECK(di_grammar_matcher_rollback(m, r) == DI_OK);
        k -= r;
        n = start[k];
        rolled++;
      }
    }
    di_grammar_matcher_free(m);
  }
  CHECKF(bad == 0, "max_tokens=%d: %d disagreements with the oracle", max_tokens, bad);
  CHECK(longest_run > max_tokens); /* the walks did reach the bound (multi-byte tokens) */
  fprintf(stderr, "max_tokens=%d: %d walks, %d ended, %d rollbacks, longest run %d bytes\n", max_tokens, n_walks,
          ended, rolled, longest_run);
  di_grammar_free(g);
}

/* A lexeme needing N + 1 tokens is refused at the token that would be its N + 1-th, N is taken,
 * and the same bytes in fewer tokens pass (the bound is on tokens, not bytes). */
static void exact(void) {
  const char *tb[] = {"<", "a", "aa", "aaa", ">", "a>", ""};
  size_t tl[7];
  for (int i = 0; i < 7; i++)
    tl[i] = strlen(tb[i]);
  int32_t stops[1] = {6};
  di_grammar_vocab *v = NULL;
  CHECK(di_grammar_vocab_create(7, tb, tl, stops, 1, &v) == DI_OK);
  const char *src = "start: \"<\" r \">\"\nr[max_tokens=3]: /a+/\n";
  di_grammar *g = NULL;
  CHECKF(di_grammar_compile(DI_GRAMMAR_LARK, src, strlen(src), NULL, &g) == DI_OK, "%s", di_last_error());
  di_grammar_matcher *m = NULL;
  CHECK(g && v && di_grammar_matcher_create(g, v, &m) == DI_OK);
  if (!m) {
    di_grammar_free(g);
    di_grammar_vocab_free(v);
    return;
  }
  uint32_t mask[1];
  CHECK(di_grammar_matcher_accept_token(m, 0) == DI_OK); /* "<": the lexeme has not begun */
  for (int i = 0; i < 3; i++)
    CHECK(di_grammar_matcher_accept_token(m, 1) == DI_OK); /* "a" x 3: three tokens */
  CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
  CHECK(mask[0] == (1u << 4)); /* only ">": a fourth letter token would be the lexeme's fourth */
  CHECK(di_grammar_matcher_accept_token(m, 1) != DI_OK);
  CHECK(di_grammar_matcher_accept_token(m, 5) != DI_OK); /* "a>" too: its 'a' is in a fourth token */
  CHECK(di_grammar_matcher_accept_token(m, 4) == DI_OK);
  CHECK(di_grammar_matcher_can_end(m));
  CHECK(di_grammar_matcher_rollback(m, 2) == DI_OK); /* back to "<aa": two tokens used */
  CHECK(di_grammar_matcher_fill_mask(m, mask) == DI_OK);
  CHECK(mask[0] == ((1u << 1) | (1u << 2) | (1u << 3) | (1u << 4) | (1u << 5)));
  CHECK(di_grammar_matcher_accept_token(m, 5) == DI_OK); /* "a>": the third token ends it */
  CHECK(di_grammar_matcher_can_end(m));
  di_grammar_matcher_reset(m);
  CHECK(di_grammar_matcher_accept_token(m, 0) == DI_OK);
  CHECK(di_grammar_matcher_accept_token(m, 3) == DI_OK); /* 9 letters in 3 tokens: allowed */
  CHECK(di_grammar_matcher_accept_token(m, 3) == DI_OK);
  CHECK(di_grammar_matcher_accept_token(m, 3) == DI_OK);
  CHECK(di_grammar_matcher_accept_token(m, 2) != DI_OK);
  CHECK(di_grammar_matcher_accept_token(m, 4) == DI_OK);
  di_grammar_matcher_free(m);
  di_grammar_free(g);
  di_grammar_vocab_free(v);
}

static void errors(void) {
  static const struct {
    const char *src, *msg;
  } bad[] = {
      {"start: r\nr[max_tokens=0]: /a+/\n", "max_tokens is a count from 1"},
      {"start: r\nr[max_tokens=\"foo\"]: /a+/\n", "max_tokens is a count from 1"},
      {"start: r\nr[max_tokens=3, max_tokens=4]: /a+/\n", "given twice"},
      {"start: TOK\nTOK[max_tokens=3]: \"a\"\n", "not terminals"},
      /* the body is a token expression (llguidance's rule): terminals, strings, regexes */
      {"start: r\nr[max_tokens=2]: \"(\" r \")\" | \"x\"\n", "cannot refer to a rule"},
      {"start: outer \"z\"\nouter[max_tokens=1]: inner | inner \"y\"\ninner[max_tokens=1]: /x*/\n",
       "cannot refer to a rule"},
      {"start: r\nr[max_tokens=2]: A\nA: \"(\" A \")\" | \"x\"\n", "max_tokens needs a regular rule"},
      {"start: r\nr[max_tokens=4097]: /a+/\n", "max_tokens is a count from 1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    di_grammar *g = NULL;
    di_status st = di_grammar_compile(DI_GRAMMAR_LARK, bad[i].src, strlen(bad[i].src), NULL, &g);
    CHECKF(st != DI_OK && strstr(di_last_error(), bad[i].msg), "case %zu: status %d, '%s'", i, (int)st,
           di_last_error());
    di_grammar_free(g);
  }
}

int main(void) {
  build_vocab();
  exact();
  errors();
  walks(1, 60);
  walks(2, 60);
  walks(3, 40);
  shared_walks();
  return test_finish("test_grammar_max_tokens");
}
