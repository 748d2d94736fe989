/* Grammar vocabulary: each token id's bytes, the stop ids, and a byte trie of the other tokens
 * laid out in preorder, so a mask computation can walk all tokens sharing a prefix once and skip
 * a whole subtree when the automaton dies on the prefix; and the bitmaps the walks OR instead of
 * setting tokens one by one (large subtrees, tokens by length, plain-text and letter-digit rows). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/ci_shared.h"
#include "grammar/grammar_impl.h"
#include "grammar/plain_text.h"
#include "grammar/token_ref.h"
#include "grammar/vocab.h"
#include "grammar/string_bound.h"

static atomic_ullong vocab_serial = 1;

static const di_grammar_vocab *sort_v;
static int cmp_tok(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  const di_grammar_vocab *v = sort_v;
  uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
  int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
  if (c)
    return c;
  if (lx != ly)
    return lx < ly ? -1 : 1;
  return x < y ? -1 : x > y;
}

/* plain_below[i] (plain_text.h): bottom-up over the trie (children have larger preorder indices),
 * for each node and decoder state u entering it: whether its byte and everything below decode as
 * plain text from u, and the most characters started on the way. */
static di_status plain_below(di_grammar_vocab *v) {
  int n = v->nnodes;
  v->plain_below = malloc((size_t)n + 1);
  uint8_t *ok = malloc((size_t)n + 1), *most = malloc(((size_t)n + 1) * DI_PLAIN_STATES);
  if (!v->plain_below || !ok || !most) {
    free(ok);
    free(most);
    return DI_ERR_OOM;
  }
  for (int j = n - 1; j >= 0; j--) {
    ok[j] = 0;
    uint8_t below_ok = 0xFF, below_most[DI_PLAIN_STATES] = {0}; /* over the children, per state */
    for (int k = j + 1; k < v->tnext[j]; k = v->tnext[k]) {
      below_ok &= ok[k];
      for (int u = 0; u < DI_PLAIN_STATES; u++)
        if (most[(size_t)k * DI_PLAIN_STATES + u] > below_most[u])
          below_most[u] = most[(size_t)k * DI_PLAIN_STATES + u];
    }
    v->plain_below[j] = (below_ok & 1) ? below_most[0] : DI_PLAIN_NOT;
    if (v->plain_below[j] != DI_PLAIN_NOT && v->plain_below[j] > v->max_plain)
      v->max_plain = v->plain_below[j];
    for (int u = 0; u < DI_PLAIN_STATES; u++) {
      int starts = 0, u2 = di_plain_step(u, v->tbyte[j], &starts);
      int m = u2 < 0 ? 0 : starts + below_most[u2];
      most[(size_t)j * DI_PLAIN_STATES + u] = (uint8_t)(m > DI_PLAIN_CAP ? DI_PLAIN_CAP : m);
      if (u2 >= 0 && ((below_ok >> u2) & 1))
        ok[j] |= (uint8_t)(1u << u);
    }
  }
  free(ok);
  free(most);
  return DI_OK;
}

/* whole_plain / plain_le (plain_text.h): per token (sorted index) the characters of its whole
 * text when it is plain (decoded from a character boundary), DI_PLAIN_NOT when not; per trie node
 * the most of them over the tokens at or below it (a subtree's tokens are one range of sorted
 * indices); and rows of ids by that count, cumulative, so that a walk from a state taking any L
 * plain characters ORs row L once instead of setting its tokens one by one (matcher.c). Rows stop
 * at DI_PLAIN_ROWS (tokens with more plain characters are walked). */
static di_status plain_rows(di_grammar_vocab *v) {
  const int n = v->nnodes, ns = v->nsorted;
  uint8_t *tokp = malloc((size_t)ns + 1);
  v->wplain = malloc((size_t)n + 1);
  if (!tokp || !v->wplain) {
    free(tokp);
    return DI_ERR_OOM;
  }
  int most = 0;
  for (int k = 0; k < ns; k++) {
    const int id = v->sorted[k];
    int u = 0, chars = 0;
    for (uint32_t b = v->off[id]; b < v->off[id + 1] && u >= 0; b++) {
      int starts = 0;
      u = di_plain_step(u, v->bytes[b], &starts);
      chars += starts;
    }
    tokp[k] = u < 0 ? DI_PLAIN_NOT : (uint8_t)(chars > DI_PLAIN_CAP ? DI_PLAIN_CAP : chars);
    if (tokp[k] != DI_PLAIN_NOT && tokp[k] > most)
      most = tokp[k];
  }
  for (int j = n - 1; j >= 0; j--) { /* children have larger preorder indices */
    uint8_t m = 0;
    for (int k = v->tok_lo[j]; k < v->tok_lo[j + 1]; k++) /* the tokens ending at node j */
      if (tokp[k] > m)
        m = tokp[k];
    for (int k = j + 1; k < v->tnext[j]; k = v->tnext[k])
      if (v->wplain[k] > m)
        m = v->wplain[k];
    v->wplain[j] = m;
  }
  v->plain_rows = most < DI_PLAIN_ROWS ? most : DI_PLAIN_ROWS;
  v->plain_le = calloc(((size_t)v->plain_rows + 1) * (size_t)v->words, sizeof(uint32_t));
  if (!v->plain_le) {
    free(tokp);
    return DI_ERR_OOM;
  }
  for (int k = 0; k < ns; k++)
    if (tokp[k] <= v->plain_rows) {
      const int id = v->sorted[k];
      v->plain_le[(size_t)tokp[k] * (size_t)v->words + (size_t)(id >> 5)] |= 1u << (id & 31);
    }
  for (size_t L = 1; L <= (size_t)v->plain_rows; L++) /* cumulative */
    for (int w = 0; w < v->words; w++)
      v->plain_le[L * (size_t)v->words + (size_t)w] |= v->plain_le[(L - 1) * (size_t)v->words + (size_t)w];
  /* the same for tokens of letters and digits alone, by bytes (ascii_run.h: a state whose run takes
   * them all) */
  v->walnum = malloc((size_t)n + 1);
  v->alnum_le = calloc(((size_t)DI_ALNUM_ROWS + 1) * (size_t)v->words, sizeof(uint32_t));
  if (!v->walnum || !v->alnum_le) {
    free(tokp);
    return DI_ERR_OOM;
  }
  for (int k = 0; k < ns; k++) {
    const int id = v->sorted[k], len = (int)(v->off[id + 1] - v->off[id]);
    int ok = len <= DI_ALNUM_ROWS;
    for (uint32_t b = v->off[id]; ok && b < v->off[id + 1]; b++) {
      const unsigned c = v->bytes[b];
      ok = (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
    }
    tokp[k] = ok ? (uint8_t)len : 255;
    if (ok)
      v->alnum_le[(size_t)len * (size_t)v->words + (size_t)(id >> 5)] |= 1u << (id & 31);
  }
  for (size_t L = 1; L <= (size_t)DI_ALNUM_ROWS; L++)
    for (int w = 0; w < v->words; w++)
      v->alnum_le[L * (size_t)v->words + (size_t)w] |= v->alnum_le[(L - 1) * (size_t)v->words + (size_t)w];
  for (int j = n - 1; j >= 0; j--) {
    uint8_t m = 0;
    for (int k = v->tok_lo[j]; k < v->tok_lo[j + 1]; k++)
      if (tokp[k] > m)
        m = tokp[k];
    for (int k = j + 1; k < v->tnext[j]; k = v->tnext[k])
      if (v->walnum[k] > m)
        m = v->walnum[k];
    v->walnum[j] = m;
  }
  free(tokp);
  return DI_OK;
}

/* subtree_of / subtree_bits: the ids below each trie node holding at least DI_SUBTREE_MIN tokens as
 * a bitmap, so that a classification walk accepting the whole subtree ORs words instead of setting
 * thousands of scattered bits (ids are not in trie order). */
static di_status subtree_bits(di_grammar_vocab *v) {
  v->subtree_of = malloc(sizeof(int32_t) * ((size_t)v->nnodes + 1));
  if (!v->subtree_of)
    return DI_ERR_OOM;
  int nbig = 0;
  for (int i = 0; i < v->nnodes; i++)
    v->subtree_of[i] = v->tok_lo[v->tnext[i]] - v->tok_lo[i] >= DI_SUBTREE_MIN && nbig < DI_TNODE_MAX_SUBTREES ? nbig++ : -1;
  v->subtree_bits = calloc((size_t)nbig * (size_t)v->words + 1, sizeof(uint32_t));
  if (!v->subtree_bits)
    return DI_ERR_OOM;
  for (int i = 0; i < v->nnodes; i++) {
    if (v->subtree_of[i] < 0)
      continue;
    uint32_t *b = v->subtree_bits + (size_t)v->subtree_of[i] * (size_t)v->words;
    for (int k = v->tok_lo[i]; k < v->tok_lo[v->tnext[i]]; k++)
      b[v->sorted[k] >> 5] |= 1u << (v->sorted[k] & 31);
  }
  return DI_OK;
}

/* tn: the walk's records (vocab.h), from the creation arrays, which are freed. */
static di_status walk_nodes(di_grammar_vocab *v) {
  const int n = v->nnodes;
  v->tn = malloc(sizeof(di_tnode) * ((size_t)n + 1));
  if (!v->tn)
    return DI_ERR_OOM;
  for (int i = 0; i < n; i++) {
    di_tnode *t = &v->tn[i];
    t->tnext = v->tnext[i];
    t->tok_lo = v->tok_lo[i];
    t->depth = (uint16_t)v->tdepth[i];
    t->subtree = (int16_t)v->subtree_of[i];
    t->byte = v->tbyte[i];
    t->plain = v->plain_below[i];
    t->len_below = v->len_below[i];
    const int wp = v->wplain[i] < DI_TNODE_WPLAIN_MAX ? v->wplain[i] : DI_TNODE_WPLAIN_MAX;
    t->flags = (uint8_t)(((v->ascii_below[2 * (size_t)i] & 1) ? DI_TNODE_NOT_ASCII : 0) | wp << DI_TNODE_WPLAIN_SHIFT);
  }
  memset(&v->tn[n], 0, sizeof v->tn[n]);
  v->tn[n].tok_lo = v->nsorted;
  v->tn[n].tnext = n;
  v->tn[n].subtree = -1;
  free(v->tnext);
  free(v->tok_lo);
  free(v->tdepth);
  free(v->subtree_of);
  free(v->tbyte);
  free(v->plain_below);
  free(v->len_below);
  free(v->wplain);
  v->wplain = NULL;
  v->tnext = v->tok_lo = v->tdepth = v->subtree_of = NULL;
  v->tbyte = v->plain_below = v->len_below = NULL;
  return DI_OK;
}

/* len_le: row L holds the sorted (non-stop, non-empty) ids of at most L bytes, L up to the longest
 * token (at most 255: a longer T is never asked for, matcher.c). */
static di_status len_le(di_grammar_vocab *v) {
  v->len_le_max = v->maxlen < 255 ? v->maxlen : 255;
  size_t rows = (size_t)v->len_le_max + 1;
  v->len_le = calloc(rows * (size_t)v->words, sizeof(uint32_t));
  if (!v->len_le)
    return DI_ERR_OOM;
  for (int k = 0; k < v->nsorted; k++) {
    int id = v->sorted[k], len = (int)(v->off[id + 1] - v->off[id]);
    if (len <= v->len_le_max)
      v->len_le[(size_t)len * (size_t)v->words + (size_t)(id >> 5)] |= 1u << (id & 31);
  }
  for (size_t L = 1; L < rows; L++) /* cumulative */
    for (int w = 0; w < v->words; w++)
      v->len_le[L * (size_t)v->words + (size_t)w] |= v->len_le[(L - 1) * (size_t)v->words + (size_t)w];
  return DI_OK;
}

/* ascii_below / len_below (ascii_run.h): bottom-up over the trie, as plain_below. */
static di_status ascii_below(di_grammar_vocab *v) {
  int n = v->nnodes;
  v->ascii_below = calloc(2 * ((size_t)n + 1), sizeof(uint64_t));
  v->len_below = calloc((size_t)n + 1, 1);
  if (!v->ascii_below || !v->len_below)
    return DI_ERR_OOM;
  for (int j = n - 1; j >= 0; j--) {
    uint64_t *b = v->ascii_below + 2 * (size_t)j;
    int most = 0;
    for (int k = j + 1; k < v->tnext[j]; k = v->tnext[k]) {
      unsigned c = v->tbyte[k];
      if (c == 0 || c >= 128)
        b[0] |= 1;
      else
        b[c >> 6] |= 1ull << (c & 63);
      b[0] |= v->ascii_below[2 * (size_t)k];
      b[1] |= v->ascii_below[2 * (size_t)k + 1];
      if (1 + v->len_below[k] > most)
        most = 1 + v->len_below[k];
    }
    v->len_below[j] = (uint8_t)(most > 255 ? 255 : most);
  }
  return DI_OK;
}

di_status di_grammar_vocab_create(int vocab_size, const char *const *token_bytes, const size_t *token_lens,
                                  const int32_t *stop_ids, int n_stop, di_grammar_vocab **out) {
  if (vocab_size <= 0 || !token_bytes || !token_lens || (n_stop && !stop_ids) || !out)
    return di_error_set(DI_ERR_INVALID_ARG, "di_grammar_vocab_create: bad arguments");
  di_grammar_vocab *v = calloc(1, sizeof *v);
  if (!v)
    return di_error_set(DI_ERR_OOM, "out of memory");
  v->n = vocab_size;
  v->words = (vocab_size + 31) / 32;
  v->serial = atomic_fetch_add(&vocab_serial, 1);
  size_t total = 0;
  for (int i = 0; i < vocab_size; i++)
    total += token_bytes[i] ? token_lens[i] : 0;
  v->off = malloc(sizeof(uint32_t) * ((size_t)vocab_size + 1));
  v->bytes = malloc(total + 1);
  v->is_stop = calloc((size_t)vocab_size, 1);
  v->stop = malloc(sizeof(int32_t) * ((size_t)n_stop + 1));
  v->sorted = malloc(sizeof(int32_t) * ((size_t)vocab_size + 1));
  if (!v->off || !v->bytes || !v->is_stop || !v->stop || !v->sorted || total > 0xFFFFFFF0u) {
    di_grammar_vocab_free(v);
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar vocabulary");
  }
  size_t o = 0;
  for (int i = 0; i < vocab_size; i++) {
    v->off[i] = (uint32_t)o;
    if (token_bytes[i] && token_lens[i]) {
      memcpy(v->bytes + o, token_bytes[i], token_lens[i]);
      o += token_lens[i];
    }
  }
  v->off[vocab_size] = (uint32_t)o;
  for (int i = 0; i < n_stop; i++) {
    if (stop_ids[i] < 0 || stop_ids[i] >= vocab_size) {
      di_grammar_vocab_free(v);
      return di_error_set(DI_ERR_INVALID_ARG, "stop id %d outside the vocabulary (size %d)", (int)stop_ids[i], vocab_size);
    }
    if (!v->is_stop[stop_ids[i]])
      v->stop[v->nstop++] = stop_ids[i];
    v->is_stop[stop_ids[i]] = 1;
  }
  int ns = 0, maxlen = 0;
  for (int i = 0; i < vocab_size; i++) {
    int len = (int)(v->off[i + 1] - v->off[i]);
    if (len > 0 && !v->is_stop[i])
      v->sorted[ns++] = i;
    if (len > maxlen)
      maxlen = len;
  }
  v->nsorted = ns;
  v->maxlen = maxlen;
  if (maxlen > DI_TNODE_MAX_DEPTH) {
    di_grammar_vocab_free(v);
    return di_error_set(DI_ERR_INVALID_ARG, "grammar vocabulary: a token of %d bytes (at most %d are supported)", maxlen,
                        DI_TNODE_MAX_DEPTH);
  }
  if (len_le(v) != DI_OK) {
    di_grammar_vocab_free(v);
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar vocabulary");
  }
  v->quote_chars = malloc(sizeof(uint16_t) * ((size_t)vocab_size + 1));
  for (int id = 0; v->quote_chars && id < vocab_size; id++) {
    unsigned lex = 0, chars = 0, quote = 0;
    for (uint32_t i = v->off[id]; i < v->off[id + 1] && !quote; i++) {
      int tick;
      if (lex == 0 && v->bytes[i] == '"')
        quote = 0x100;
      lex = di_sb_lex(lex, v->bytes[i], &tick);
      chars += (unsigned)tick;
    }
    v->quote_chars[id] = (uint16_t)((chars < 255 ? chars : 255) | quote);
  }
  v->mark_ids = malloc(sizeof(int32_t) * ((size_t)vocab_size + 1));
  if (!v->mark_ids || !v->quote_chars) {
    di_grammar_vocab_free(v);
    return di_error_set(DI_ERR_OOM, "out of memory building the grammar vocabulary");
  }
  for (int i = 0; i < vocab_size; i++)
    if (memchr(v->bytes + v->off[i], DI_TOKEN_REF_MARK, v->off[i + 1] - v->off[i]))
      v->mark_ids[v->nmark++] = i;
  /* qsort has no context argument in C11: a global guarded by a lock (vocab creation is rare) */
  static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&sort_mu);
  sort_v = v;
  qsort(v->sorted, (size_t)ns, sizeof(int32_t), cmp_tok);
  pthread_mutex_unlock(&sort_mu);
  /* trie in preorder: one node per distinct prefix */
  size_t cap = 1024;
  v->tbyte = malloc(cap);
  v->tdepth = malloc(sizeof(int32_t) * cap);
  v->tnext = malloc(sizeof(int32_t) * cap);
  v->tok_lo = malloc(sizeof(int32_t) * (cap + 1));
  int32_t *open = malloc(sizeof(int32_t) * ((size_t)maxlen + 2));
  if (!v->tbyte || !v->tdepth || !v->tnext || !v->tok_lo || !open) {
    free(open);
    di_grammar_vocab_free(v);
    return di_error_set(DI_ERR_OOM, "out of memory building the token trie");
  }
  int nn = 0, nopen = 0;
  const uint8_t *prev = NULL;
  int prevlen = 0;
  for (int k = 0; k < ns; k++) {
    int id = v->sorted[k];
    const uint8_t *t = v->bytes + v->off[id];
    int len = (int)(v->off[id + 1] - v->off[id]);
    int l = 0;
    while (prev && l < len && l < prevlen && t[l] == prev[l])
      l++;
    while (nopen > l) /* close nodes deeper than the shared prefix */
      v->tnext[open[--nopen]] = nn;
    for (int d = l; d < len; d++) {
      if ((size_t)nn + 1 >= cap) {
        cap *= 2;
        uint8_t *a = realloc(v->tbyte, cap);
        if (a)
          v->tbyte = a;
        int32_t *b = realloc(v->tdepth, sizeof(int32_t) * cap), *c = realloc(v->tnext, sizeof(int32_t) * cap),
                *e = realloc(v->tok_lo, sizeof(int32_t) * (cap + 1));
        if (b)
          v->tdepth = b;
        if (c)
          v->tnext = c;
        if (e)
          v->tok_lo = e;
        if (!a || !b || !c || !e) {
          free(open);
          di_grammar_vocab_free(v);
          return di_error_set(DI_ERR_OOM, "out of memory building the token trie");
        }
      }
      v->tbyte[nn] = t[d];
      v->tdepth[nn] = d + 1;
      v->tok_lo[nn] = k; /* first token (sorted index) at or below this node */
      open[nopen++] = nn;
      nn++;
    }
    prev = t;
    prevlen = len;
  }
  while (nopen > 0)
    v->tnext[open[--nopen]] = nn;
  v->tok_lo[nn] = ns;
  v->nnodes = nn;
  free(open);
  if (plain_below(v) != DI_OK || ascii_below(v) != DI_OK || subtree_bits(v) != DI_OK || plain_rows(v) != DI_OK ||
      walk_nodes(v) != DI_OK) {
    di_grammar_vocab_free(v);
    return di_error_set(DI_ERR_OOM, "out of memory building the token trie");
  }
  /* Tokens ending at node i are exactly the sorted indices [tok_lo[i], tok_lo[i+1]): a token that
   * creates no node equals its predecessor. The subtree of i holds [tok_lo[i], tok_lo[tnext[i]]). */
  v->shared_ci = di_ci_shared_create((size_t)64 << 20); /* NULL: every grammar classifies alone */
  *out = v;
  return DI_OK;
}

void di_grammar_vocab_free(di_grammar_vocab *v) {
  if (!v)
    return;
  di_grammar_forget_vocab(v->serial); /* its mask caches in the grammars (cached ones outlive it) */
  free(v->off);
  free(v->bytes);
  free(v->is_stop);
  free(v->stop);
  free(v->sorted);
  free(v->tbyte);
  free(v->tdepth);
  free(v->tnext);
  free(v->tok_lo);
  free(v->tn);
  free(v->mark_ids);
  free(v->len_le);
  free(v->quote_chars);
  free(v->plain_below);
  free(v->ascii_below);
  free(v->len_below);
  di_ci_shared_free(v->shared_ci);
  free(v->subtree_of);
  free(v->subtree_bits);
  free(v->wplain);
  free(v->plain_le);
  free(v->walnum);
  free(v->alnum_le);
  free(v);
}

int di_grammar_vocab_size(const di_grammar_vocab *v) { return v->n; }
