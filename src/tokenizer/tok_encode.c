/* Encoding: invalid UTF-8 repair, added-token extraction (leftmost-longest matching over a byte trie
 * with HF's single_word / lstrip / rstrip rules, first on the raw text for non-normalized tokens, then
 * on the normalized text for normalized ones), the pipeline for the text between them, and the
 * post-processor's special tokens. */
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode.h"

/* ---- trie of added tokens: edges in a hash map keyed by (node, byte) ---- */
typedef struct {
  uint64_t *keys; /* node * 256 + byte + 1, 0 empty */
  int32_t *child;
  uint64_t mask;
} edge_map;

static edge_map *trie_edges(const di_trie *tr) { return tr->edges; }

static int32_t edge_get(const edge_map *e, int32_t node, unsigned char b) {
  uint64_t key = (uint64_t)node * 256 + b + 1;
  uint64_t h = (key * 0x9E3779B97F4A7C15ULL >> 20) & e->mask;
  for (;;) {
    if (e->keys[h] == key)
      return e->child[h];
    if (!e->keys[h])
      return 0;
    h = (h + 1) & e->mask;
  }
}

void di_trie_free(di_trie *tr) {
  edge_map *e = trie_edges(tr);
  if (e) {
    free(e->keys);
    free(e->child);
    free(e);
  }
  free(tr->term);
  memset(tr, 0, sizeof *tr);
}

/* Builds the trie over the added tokens with normalized == want_norm (their normalized form when
 * want_norm). */
di_status di_trie_build(di_tokenizer *t, di_trie *tr, int want_norm) {
  size_t total = 1;
  for (int i = 0; i < t->n_added; i++)
    if (t->added[i].normalized == want_norm)
      total += want_norm ? t->added[i].norm_len : t->added[i].len;
  tr->empty = total == 1;
  edge_map *e = calloc(1, sizeof *e);
  uint64_t cap = 16;
  while (cap < total * 2)
    cap *= 2;
  tr->term = malloc(total * sizeof *tr->term);
  if (e) {
    e->keys = calloc(cap, sizeof *e->keys);
    e->child = malloc(cap * sizeof *e->child);
  }
  tr->edges = e;
  if (!e || !tr->term || !e->keys || !e->child)
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory for added tokens");
  e->mask = cap - 1;
  tr->n_nodes = 1;
  tr->term[0] = -1;
  for (int i = 0; i < t->n_added; i++) {
    const di_added *a = &t->added[i];
    if (a->normalized != want_norm)
      continue;
    const char *s = want_norm ? a->norm : a->content;
    size_t n = want_norm ? a->norm_len : a->len;
    if (n == 0)
      continue;
    tr->first[(unsigned char)s[0]] = 1;
    int32_t node = 0;
    for (size_t k = 0; k < n; k++) {
      int32_t c = edge_get(e, node, (unsigned char)s[k]);
      if (!c) {
        c = tr->n_nodes++;
        tr->term[c] = -1;
        uint64_t key = (uint64_t)node * 256 + (unsigned char)s[k] + 1;
        uint64_t h = (key * 0x9E3779B97F4A7C15ULL >> 20) & e->mask;
        while (e->keys[h])
          h = (h + 1) & e->mask;
        e->keys[h] = key;
        e->child[h] = c;
      }
      node = c;
    }
    tr->term[node] = i; /* a later duplicate wins */
  }
  return DI_OK;
}

static uint32_t last_cp(const char *s, size_t n) {
  size_t j = n - 1;
  while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80)
    j--;
  uint32_t cp = 0xFFFD;
  di_utf8_decode((const unsigned char *)s + j, n - j, &cp);
  return cp;
}

typedef struct { size_t a, b; int32_t id; } seg;
typedef struct { seg *p; size_t len, cap; } segvec;
static int seg_push(segvec *v, size_t a, size_t b, int32_t id) {
  if (v->len == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 16;
    seg *p = realloc(v->p, cap * sizeof *p);
    if (!p)
      return -1;
    v->p = p, v->cap = cap;
  }
  v->p[v->len++] = (seg){a, b, id};
  return 0;
}

/* HF AddedVocabulary::find_matches: segments of s (id -1 for plain text, else the token's id). */
static int find_added(const di_tokenizer *t, const di_trie *tr, const char *s, size_t n, segvec *out) {
  out->len = 0;
  const edge_map *e = trie_edges(tr);
  const unsigned char *u = (const unsigned char *)s;
  size_t start_offset = 0, i = 0;
  while (!tr->empty && i < n) {
    if (!tr->first[u[i]]) {
      i++;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < n; j++) {
      node = edge_get(e, node, u[j]);
      if (!node)
        break;
      if (tr->term[node] >= 0)
        best = tr->term[node], best_end = j + 1;
    }
    if (best < 0) {
      i++;
      continue;
    }
    const di_added *a = &t->added[best];
    size_t start = i, stop = best_end;
    i = best_end; /* the matcher resumes after this match whether or not it is used */
    if (a->single_word) {
      int start_space = start == 0 || !di_uc_is_word(last_cp(s, start));
      uint32_t nc = 0;
      if (stop < n)
        di_utf8_decode(u + stop, n - stop, &nc);
      int stop_space = stop == n || !di_uc_is_word(nc);
      if (!start_space || !stop_space)
        continue;
    }
    if (a->lstrip) {
      size_t ns = start;
      while (ns > 0) {
        size_t j = ns - 1;
        while (j > 0 && (u[j] & 0xC0) == 0x80)
          j--;
        uint32_t cp;
        if (!di_utf8_decode(u + j, ns - j, &cp) || !di_uc_is_whitespace(cp))
          break;
        ns = j;
      }
      start = ns > start_offset ? ns : start_offset;
    }
    if (a->rstrip) {
      while (stop < n) {
        uint32_t cp;
        int l = di_utf8_decode(u + stop, n - stop, &cp);
        if (!l || !di_uc_is_whitespace(cp))
          break;
        stop += (size_t)l;
      }
    }
    if (start_offset < start && seg_push(out, start_offset, start, -1))
      return -1;
    if (seg_push(out, start, stop, a->id))
      return -1;
    start_offset = stop;
  }
  if (start_offset < n && seg_push(out, start_offset, n, -1))
    return -1;
  return 0;
}

static di_status encode_valid(const di_tokenizer *t, const char *text, size_t len, di_ivec *ids) {
  segvec raw = {0}, sub = {0};
  di_buf norm = {0};
  void *scratch = di_pre_scratch_new();
  di_status st = DI_OK;
  if (!scratch || find_added(t, &t->trie_raw, text, len, &raw)) {
    st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    goto done;
  }
  for (size_t k = 0; k < raw.len && st == DI_OK; k++) {
    seg sg = raw.p[k];
    if (sg.id >= 0) {
      if (di_ivec_push(ids, sg.id))
        st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      continue;
    }
    const char *s = text + sg.a;
    size_t n = sg.b - sg.a;
    if (t->n_norms) {
      st = di_normalize(t, s, n, &norm);
      if (st != DI_OK)
        break;
      s = norm.p;
      n = norm.len;
    }
    if (t->trie_norm.empty) {
      st = di_pretokenize_encode(t, s, n, sg.a == 0, ids, scratch);
      continue;
    }
    if (find_added(t, &t->trie_norm, s, n, &sub)) {
      st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      break;
    }
    for (size_t j = 0; j < sub.len && st == DI_OK; j++) {
      seg ss = sub.p[j];
      if (ss.id >= 0) {
        if (di_ivec_push(ids, ss.id))
          st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      } else {
        st = di_pretokenize_encode(t, s + ss.a, ss.b - ss.a, sg.a == 0 && ss.a == 0, ids, scratch);
      }
    }
  }
done:
  free(raw.p);
  free(sub.p);
  di_buf_free(&norm);
  di_pre_scratch_free(scratch);
  return st;
}

di_status di_tokenizer_encode(const di_tokenizer *t, const char *text, size_t len, int add_special_tokens,
                              int32_t **ids_out, size_t *n_out) {
  if (!t || (!text && len) || !ids_out || !n_out)
    return di_error_set(DI_ERR_INVALID_ARG, "di_tokenizer_encode: NULL argument");
  di_buf fixed = {0};
  if (!di_utf8_valid(text, len)) { /* policy: maximal invalid subsequences become U+FFFD */
    if (di_utf8_lossy_append(&fixed, text, len))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    text = fixed.p;
    len = fixed.len;
  }
  di_ivec ids = {0};
  di_status st = DI_OK;
  if (add_special_tokens)
    for (size_t k = 0; k < t->post_prefix.len && st == DI_OK; k++)
      if (di_ivec_push(&ids, t->post_prefix.p[k]))
        st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  if (st == DI_OK)
    st = encode_valid(t, text, len, &ids);
  if (add_special_tokens)
    for (size_t k = 0; k < t->post_suffix.len && st == DI_OK; k++)
      if (di_ivec_push(&ids, t->post_suffix.p[k]))
        st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  di_buf_free(&fixed);
  if (st != DI_OK) {
    free(ids.p);
    return st;
  }
  if (!ids.p && !(ids.p = malloc(sizeof(int32_t)))) /* callers always get a buffer to free */
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  *ids_out = ids.p;
  *n_out = ids.len;
  return DI_OK;
}

di_status di_tokenizer_encode_prompt(const di_tokenizer *t, const char *text, size_t len, int32_t **ids_out,
                                     size_t *n_out) {
  int32_t *ids;
  size_t n;
  DI_TRY(di_tokenizer_encode(t, text, len, 0, &ids, &n));
  int bos = t->add_bos && t->bos_id >= 0, eos = t->add_eos && t->eos_id >= 0;
  if (!bos && !eos) {
    *ids_out = ids;
    *n_out = n;
    return DI_OK;
  }
  int32_t *r = malloc((n + 2) * sizeof *r);
  if (!r) {
    free(ids);
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  size_t w = 0;
  if (bos)
    r[w++] = t->bos_id;
  memcpy(r + w, ids, n * sizeof *r);
  w += n;
  if (eos)
    r[w++] = t->eos_id;
  free(ids);
  *ids_out = r;
  *n_out = w;
  return DI_OK;
}
