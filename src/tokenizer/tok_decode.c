/* Decoding: ids to token strings, the decoder chain (ByteLevel, Metaspace, Replace, ByteFallback,
 * Fuse, Strip) as HF's decode_chain, transformers' clean-up of tokenization spaces, the raw bytes of
 * each token (for grammar masks), and the streaming detokenizer (HF's DecodeStream scheme: decode a
 * window that starts at the previous chunk, emit what grew unless it ends in U+FFFD). */
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode.h"

/* A list of strings: bytes in data, (off, len) pairs in idx. */
typedef struct { di_buf data; di_spans idx; } strlist;

static int sl_add(strlist *l, const char *s, size_t n) {
  size_t off = l->data.len;
  if (di_buf_append(&l->data, s, n))
    return -1;
  if (l->idx.len + 2 > l->idx.cap) {
    size_t cap = l->idx.cap ? l->idx.cap * 2 : 64;
    size_t *p = realloc(l->idx.p, cap * sizeof *p);
    if (!p)
      return -1;
    l->idx.p = p, l->idx.cap = cap;
  }
  l->idx.p[l->idx.len++] = off;
  l->idx.p[l->idx.len++] = n;
  return 0;
}
/* room for `bytes` bytes in `strings` entries at once: a decode knows both from its ids, and growing
 * the lists by doubling from 64 was most of its allocations (the streaming detokenizer decodes a
 * window twice per token) */
static int sl_reserve(strlist *l, size_t bytes, size_t strings) {
  if (di_buf_reserve(&l->data, bytes))
    return -1;
  if (l->idx.cap < 2 * strings) {
    size_t *p = realloc(l->idx.p, 2 * strings * sizeof *p);
    if (!p)
      return -1;
    l->idx.p = p, l->idx.cap = 2 * strings;
  }
  return 0;
}
static void sl_free(strlist *l) {
  di_buf_free(&l->data);
  free(l->idx.p);
}
#define SL_N(l) ((l)->idx.len / 2)
#define SL_S(l, i) ((l)->data.p + (l)->idx.p[2 * (i)])
#define SL_L(l, i) ((l)->idx.p[2 * (i) + 1])

/* ByteLevel: a token whose every char is in the byte map gives those bytes, else its own bytes. */
static int bytelevel_bytes(const char *s, size_t n, di_buf *out) {
  size_t start = out->len;
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    int l = di_utf8_decode(u + i, n - i, &cp);
    int b = l ? di_cp_to_byte(cp) : -1;
    if (b < 0) {
      out->len = start;
      return di_buf_append(out, s, n);
    }
    if (di_buf_putc(out, (char)b))
      return -1;
    i += (size_t)l;
  }
  return 0;
}

static int byte_token(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
    return -1;
  int v = 0;
  for (int k = 3; k < 5; k++) {
    char c = s[k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0)
      return -1;
    v = v * 16 + d;
  }
  return v;
}

static di_status apply_dec(const di_dec *d, pcre2_match_data *md, strlist *in, strlist *out) {
  size_t n = SL_N(in);
  int oom = 0;
  char rep[4];
  int rep_len = 0;
  if (d->kind == DEC_METASPACE || d->kind == DEC_STRIP)
    rep_len = di_utf8_encode(d->ch, rep);
  switch (d->kind) {
  case DEC_BYTELEVEL: {
    di_buf raw = {0}, txt = {0};
    for (size_t i = 0; i < n && !oom; i++)
      oom |= bytelevel_bytes(SL_S(in, i), SL_L(in, i), &raw);
    oom = oom || di_utf8_lossy_append(&txt, raw.p ? raw.p : "", raw.len) || sl_add(out, txt.p ? txt.p : "", txt.len);
    di_buf_free(&raw);
    di_buf_free(&txt);
    break;
  }
  case DEC_METASPACE:
    for (size_t i = 0; i < n && !oom; i++) {
      const char *s = SL_S(in, i);
      size_t l = SL_L(in, i), j = 0;
      di_buf t = {0};
      while (j < l && !oom) {
        if (j + (size_t)rep_len <= l && memcmp(s + j, rep, (size_t)rep_len) == 0) {
          if (!(i == 0 && d->prepend != PREPEND_NEVER))
            oom |= di_buf_putc(&t, ' ');
          j += (size_t)rep_len;
        } else {
          oom |= di_buf_putc(&t, s[j]);
          j++;
        }
      }
      oom = oom || sl_add(out, t.p ? t.p : "", t.len);
      di_buf_free(&t);
    }
    break;
  case DEC_REPLACE:
    for (size_t i = 0; i < n && !oom; i++) {
      const char *s = SL_S(in, i);
      size_t l = SL_L(in, i), prev = 0;
      di_spans m = {0};
      di_status st = di_pattern_find_all(&d->pat, md, s, l, &m);
      if (st != DI_OK) {
        free(m.p);
        return st;
      }
      di_buf t = {0};
      for (size_t k = 0; k < m.len && !oom; k += 2) {
        oom |= di_buf_append(&t, s + prev, m.p[k] - prev) || di_buf_append(&t, d->str, d->str_len);
        prev = m.p[k + 1];
      }
      oom = oom || di_buf_append(&t, s + prev, l - prev) || sl_add(out, t.p ? t.p : "", t.len);
      di_buf_free(&t);
      free(m.p);
    }
    break;
  case DEC_BYTEFALLBACK: {
    di_buf bytes = {0};
    for (size_t i = 0; i <= n && !oom; i++) {
      int b = i < n ? byte_token(SL_S(in, i), SL_L(in, i)) : -1;
      if (b >= 0) {
        oom |= di_buf_putc(&bytes, (char)b);
        continue;
      }
      if (bytes.len) {
        if (di_utf8_valid(bytes.p, bytes.len))
          oom |= sl_add(out, bytes.p, bytes.len);
        else
          for (size_t k = 0; k < bytes.len && !oom; k++)
            oom |= sl_add(out, "\xEF\xBF\xBD", 3);
        bytes.len = 0;
      }
      if (i < n)
        oom = oom || sl_add(out, SL_S(in, i), SL_L(in, i));
    }
    di_buf_free(&bytes);
    break;
  }
  case DEC_FUSE: {
    di_buf joined = {0};
    for (size_t i = 0; i < n && !oom; i++)
      oom |= di_buf_append(&joined, SL_S(in, i), SL_L(in, i));
    oom = oom || sl_add(out, joined.p ? joined.p : "", joined.len);
    di_buf_free(&joined);
    break;
  }
  case DEC_STRIP:
    for (size_t i = 0; i < n && !oom; i++) {
      const char *s = SL_S(in, i);
      size_t l = SL_L(in, i), a = 0, b = l;
      for (int k = 0; k < d->start && a + (size_t)rep_len <= b && memcmp(s + a, rep, (size_t)rep_len) == 0; k++)
        a += (size_t)rep_len;
      for (int k = 0; k < d->stop && b >= a + (size_t)rep_len && memcmp(s + b - rep_len, rep, (size_t)rep_len) == 0; k++)
        b -= (size_t)rep_len;
      oom = sl_add(out, s + a, b - a);
    }
    break;
  }
  return oom ? di_error_set(DI_ERR_OOM, "tokenizer: out of memory") : DI_OK;
}

/* HF decode (without clean-up): appends the text to out. */
di_status di_decode_tokens(const di_tokenizer *t, const int32_t *ids, size_t n, int skip_special, di_buf *out) {
  strlist a = {0}, b = {0};
  di_status st = DI_OK;
  size_t bytes = 0;
  for (size_t i = 0; i < n; i++)
    bytes += ids[i] >= 0 && ids[i] < t->vocab_size ? t->tok_len[ids[i]] : 0;
  /* the decoders' output list: about the input's size (ByteFallback / Replace may grow it a little) */
  if (n && (sl_reserve(&a, bytes, n) || (t->has_decoder && sl_reserve(&b, bytes + 16, n))))
    st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  for (size_t i = 0; i < n && st == DI_OK; i++) {
    int32_t id = ids[i];
    if (id < 0 || id >= t->vocab_size) {
      st = di_error_set(DI_ERR_INVALID_ARG, "decode: token id %d at position %zu is outside the vocab (size %d)",
                        (int)id, i, (int)t->vocab_size);
      break;
    }
    uint8_t f = t->tok_flags[id];
    if (!(f & 1) || (skip_special && (f & 8)))
      continue;
    if (sl_add(&a, t->tok_data.p + t->tok_off[id], t->tok_len[id]))
      st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  pcre2_match_data *md = NULL;
  if (st == DI_OK && t->has_decoder) {
    md = pcre2_match_data_create(4, NULL);
    if (!md)
      st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    for (int k = 0; k < t->n_decs && st == DI_OK; k++) {
      b.data.len = 0;
      b.idx.len = 0;
      st = apply_dec(&t->decs[k], md, &a, &b);
      strlist tmp = a;
      a = b;
      b = tmp;
    }
  }
  for (size_t i = 0; i < SL_N(&a) && st == DI_OK; i++) {
    if ((!t->has_decoder && i > 0 && di_buf_putc(out, ' ')) || di_buf_append(out, SL_S(&a, i), SL_L(&a, i)))
      st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  if (st == DI_OK && di_buf_reserve(out, 0))
    st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  if (md)
    pcre2_match_data_free(md);
  sl_free(&a);
  sl_free(&b);
  return st;
}

/* transformers' clean_up_tokenization: sequential str.replace passes, in its order. */
void di_cleanup_spaces(di_buf *b) {
  static const char *const pats[][2] = {{" .", "."},     {" ?", "?"},     {" !", "!"},   {" ,", ","},
                                        {" ' ", "'"},    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},
                                        {" 've", "'ve"}, {" 're", "'re"}};
  for (size_t p = 0; p < sizeof pats / sizeof pats[0]; p++) {
    size_t pl = strlen(pats[p][0]), rl = strlen(pats[p][1]), r = 0, w = 0;
    const char *first = b->len ? memmem(b->p, b->len, pats[p][0], pl) : NULL;
    if (!first)
      continue; /* most passes find nothing: skip their copy loop (the streaming detokenizer runs this per token) */
    r = w = (size_t)(first - b->p);
    while (r < b->len) {
      if (b->p[r] == ' ' && r + pl <= b->len && memcmp(b->p + r, pats[p][0], pl) == 0) { /* every pattern starts with ' ' */
        memcpy(b->p + w, pats[p][1], rl); /* replacements are shorter: w + rl <= r + pl */
        w += rl;
        r += pl;
      } else {
        b->p[w++] = b->p[r++];
      }
    }
    b->len = w;
  }
  if (b->p)
    b->p[b->len] = 0;
}

di_status di_tokenizer_decode(const di_tokenizer *t, const int32_t *ids, size_t n, int skip_special_tokens,
                              char **text, size_t *len) {
  if (!t || (!ids && n) || !text)
    return di_error_set(DI_ERR_INVALID_ARG, "di_tokenizer_decode: NULL argument");
  di_buf out = {0};
  di_status st = di_decode_tokens(t, ids, n, skip_special_tokens, &out);
  if (st != DI_OK) {
    di_buf_free(&out);
    return st;
  }
  if (t->clean_up)
    di_cleanup_spaces(&out);
  if (!out.p && di_buf_reserve(&out, 0))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  *text = out.p;
  if (len)
    *len = out.len;
  return DI_OK;
}

/* Raw bytes of one token in the middle of generated text (no first-token stripping, no lossy
 * repair): the decoder chain's per-token effects. */
static int token_raw(const di_tokenizer *t, int32_t id, di_buf *out) {
  const char *s = t->tok_data.p + t->tok_off[id];
  size_t n = t->tok_len[id];
  if ((t->tok_flags[id] & 2) || !t->has_decoder)
    return di_buf_append(out, s, n);
  di_buf cur = {0}, nxt = {0};
  if (di_buf_append(&cur, s, n))
    return -1;
  int oom = 0;
  for (int k = 0; k < t->n_decs && !oom; k++) {
    const di_dec *d = &t->decs[k];
    nxt.len = 0;
    char rep[4];
    int rl;
    switch (d->kind) {
    case DEC_BYTELEVEL:
      oom = bytelevel_bytes(cur.p, cur.len, &nxt);
      break;
    case DEC_METASPACE:
      rl = di_utf8_encode(d->ch, rep);
      for (size_t j = 0; j < cur.len && !oom;) {
        if (j + (size_t)rl <= cur.len && memcmp(cur.p + j, rep, (size_t)rl) == 0)
          oom = di_buf_putc(&nxt, ' '), j += (size_t)rl;
        else
          oom = di_buf_putc(&nxt, cur.p[j]), j++;
      }
      break;
    case DEC_REPLACE: {
      pcre2_match_data *md = pcre2_match_data_create(4, NULL);
      di_spans m = {0};
      if (!md || di_pattern_find_all(&d->pat, md, cur.p, cur.len, &m) != DI_OK) {
        oom = 1;
      } else {
        size_t prev = 0;
        for (size_t q = 0; q < m.len && !oom; q += 2) {
          oom = di_buf_append(&nxt, cur.p + prev, m.p[q] - prev) || di_buf_append(&nxt, d->str, d->str_len);
          prev = m.p[q + 1];
        }
        oom = oom || di_buf_append(&nxt, cur.p + prev, cur.len - prev);
      }
      free(m.p);
      if (md)
        pcre2_match_data_free(md);
      break;
    }
    case DEC_BYTEFALLBACK: {
      int bv = byte_token(cur.p, cur.len);
      oom = bv >= 0 ? di_buf_putc(&nxt, (char)bv) : di_buf_append(&nxt, cur.p, cur.len);
      break;
    }
    case DEC_FUSE:
    case DEC_STRIP:
      oom = di_buf_append(&nxt, cur.p, cur.len);
      break;
    }
    di_buf tmp = cur;
    cur = nxt;
    nxt = tmp;
  }
  oom = oom || di_buf_append(out, cur.p ? cur.p : "", cur.len);
  di_buf_free(&cur);
  di_buf_free(&nxt);
  return oom ? -1 : 0;
}

di_status di_build_raw_bytes(di_tokenizer *t) {
  int byte_fallback = 0;
  for (int k = 0; k < t->n_decs; k++)
    byte_fallback |= t->decs[k].kind == DEC_BYTEFALLBACK;
  if (byte_fallback)
    for (int32_t id = 0; id < t->vocab_size; id++)
      if ((t->tok_flags[id] & 1) && byte_token(t->tok_data.p + t->tok_off[id], t->tok_len[id]) >= 0)
        t->tok_flags[id] |= 16;
  t->raw_off = malloc((size_t)t->vocab_size * sizeof *t->raw_off);
  t->raw_len = malloc((size_t)t->vocab_size * sizeof *t->raw_len);
  if (!t->raw_off || !t->raw_len)
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  for (int32_t id = 0; id < t->vocab_size; id++) {
    t->raw_off[id] = (uint32_t)t->raw_data.len;
    t->raw_len[id] = 0;
    if (!(t->tok_flags[id] & 1))
      continue;
    if (token_raw(t, id, &t->raw_data))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    t->raw_len[id] = (uint32_t)(t->raw_data.len - t->raw_off[id]);
  }
  return DI_OK;
}

const char *di_tokenizer_token_bytes(const di_tokenizer *t, int32_t id, size_t *len) {
  if (!t || id < 0 || id >= t->vocab_size || !(t->tok_flags[id] & 1)) {
    if (len)
      *len = 0;
    return NULL;
  }
  if (len)
    *len = t->raw_len[id];
  return t->raw_data.p ? t->raw_data.p + t->raw_off[id] : "";
}

/* ---- streaming ---- */
struct di_detok_stream {
  const di_tokenizer *t;
  int skip;
  di_ivec ids;      /* the window: context tokens of the last chunk, then pending ones */
  di_buf prefix;    /* decode of the context tokens */
  size_t prefix_index;
  di_buf pending;   /* clean-up mode: raw text not yet emitted */
  di_buf out;       /* what the last call returned */
  di_buf scratch;
  /* The decoder may still change text it already produced when tokens are appended (a Replace on
   * the fused text whose pattern is more than one literal character: a match can span tokens, or,
   * like `a*`, match the empty string at the end). Such a chain is not streamable by windows: the
   * stream then holds everything and the flush emits the whole decode (found by fuzz_tokenizer,
   * crash-tokenizer-c128ba5c282055dd). */
  int whole;
};

static int decoder_streamable(const di_tokenizer *t) {
  int fused = 0;
  for (int k = 0; k < t->n_decs; k++) {
    if (t->decs[k].kind == DEC_FUSE)
      fused = 1;
    else if (fused && t->decs[k].kind == DEC_REPLACE && !t->decs[k].one_char)
      return 0;
  }
  return 1;
}

di_status di_detok_stream_create(const di_tokenizer *t, int skip_special_tokens, di_detok_stream **out) {
  if (!t || !out)
    return di_error_set(DI_ERR_INVALID_ARG, "di_detok_stream_create: NULL argument");
  di_detok_stream *s = calloc(1, sizeof *s);
  if (!s)
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  s->t = t;
  s->skip = skip_special_tokens;
  s->whole = !decoder_streamable(t);
  *out = s;
  return DI_OK;
}

void di_detok_stream_free(di_detok_stream *s) {
  if (!s)
    return;
  free(s->ids.p);
  di_buf_free(&s->prefix);
  di_buf_free(&s->pending);
  di_buf_free(&s->out);
  di_buf_free(&s->scratch);
  free(s);
}

/* Whether the raw bytes of the window's tokens end inside a UTF-8 character that later bytes could
 * still complete (HF's DecodeStream only looks for a trailing U+FFFD, which also holds back text
 * ending in a genuine U+FFFD and makes the window grow without bound). */
static int tail_incomplete(const di_detok_stream *s) {
  unsigned char tail[4];
  int k = 0;
  for (size_t i = s->ids.len; i-- > 0 && k < 4;) {
    int32_t id = s->ids.p[i];
    if (s->skip && (s->t->tok_flags[id] & 8))
      continue;
    size_t bl;
    const char *b = di_tokenizer_token_bytes(s->t, id, &bl);
    while (bl > 0 && k < 4)
      tail[3 - k++] = (unsigned char)b[--bl];
  }
  const unsigned char *t = tail + 4 - k;
  /* find the last lead byte within the tail; incomplete if it announces more bytes than follow and
   * every byte after it is a continuation byte acceptable there */
  for (int j = k - 1; j >= 0 && j >= k - 3; j--) {
    unsigned c = t[j];
    if ((c & 0xC0) == 0x80)
      continue;
    int need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
    int have = k - j;
    if (have >= need)
      return 0;
    if (have >= 2) { /* second byte ranges of E0, ED, F0, F4 */
      unsigned b1 = t[j + 1];
      if ((c == 0xE0 && b1 < 0xA0) || (c == 0xED && b1 > 0x9F) || (c == 0xF0 && b1 < 0x90) || (c == 0xF4 && b1 > 0x8F))
        return 0;
    }
    return 1;
  }
  return 0;
}

/* Passes raw text through the clean-up stage: emits what can no longer change. */
static di_status stream_emit(di_detok_stream *s, const char *txt, size_t n, int final) {
  s->out.len = 0;
  if (!s->t->clean_up) {
    if (di_buf_append(&s->out, txt, n))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    return DI_OK;
  }
  if (di_buf_append(&s->pending, txt, n))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  /* A clean-up match starts with a space and spans at most 5 bytes of the raw text, so cutting
   * where the 8 bytes before the cut hold no space splits no match: cleanup(A+B) = cleanup(A) +
   * cleanup(B). */
  size_t len = s->pending.len, k = len;
  const char *p = s->pending.p;
  if (!final) {
    for (;; k--) {
      int ok = k == len || ((unsigned char)p[k] & 0xC0) != 0x80;
      for (size_t j = k >= 8 ? k - 8 : 0; ok && j < k; j++)
        if (p[j] == ' ')
          ok = 0;
      if (ok || k == 0)
        break;
    }
  }
  if (di_buf_append(&s->out, p, k))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  di_cleanup_spaces(&s->out);
  memmove(s->pending.p, p + k, len - k);
  s->pending.len = len - k;
  return DI_OK;
}

di_status di_detok_stream_push(di_detok_stream *s, int32_t id, const char **text, size_t *len) {
  if (!s || !text || !len)
    return di_error_set(DI_ERR_INVALID_ARG, "di_detok_stream_push: NULL argument");
  if (id < 0 || id >= s->t->vocab_size)
    return di_error_set(DI_ERR_INVALID_ARG, "detokenize: token id %d is outside the vocab (size %d)", (int)id,
                        (int)s->t->vocab_size);
  if (di_ivec_push(&s->ids, id))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  if (s->whole || (s->t->tok_flags[id] & 16)) {
    /* a ByteFallback byte token: a later byte token can still turn this group of bytes into
     * U+FFFD per byte, so nothing is final until a non-byte token closes the group (and nothing
     * is final before the flush for a chain that is not streamable) */
    s->out.len = 0;
    *text = "";
    *len = 0;
    return DI_OK;
  }
  s->scratch.len = 0;
  DI_TRY(di_decode_tokens(s->t, s->ids.p, s->ids.len, s->skip, &s->scratch));
  const char *str = s->scratch.p ? s->scratch.p : "";
  size_t n = s->scratch.len;
  int ends_fffd = n >= 3 && memcmp(str + n - 3, "\xEF\xBF\xBD", 3) == 0;
  if (ends_fffd && !tail_incomplete(s))
    ends_fffd = 0; /* a real U+FFFD (or an invalid byte): final, no need to wait */
  if (n > s->prefix.len && !ends_fffd && memcmp(str, s->prefix.p ? s->prefix.p : "", s->prefix.len) == 0) {
    const char *nt = str + s->prefix.len;
    size_t nn = n - s->prefix.len;
    /* keep the tokens of this chunk as the next window's context */
    size_t new_prefix_index = s->ids.len - s->prefix_index;
    memmove(s->ids.p, s->ids.p + s->prefix_index, new_prefix_index * sizeof *s->ids.p);
    s->ids.len = new_prefix_index;
    s->prefix_index = new_prefix_index;
    di_buf keep = s->scratch;
    s->scratch = (di_buf){0};
    s->prefix.len = 0;
    di_status st = di_decode_tokens(s->t, s->ids.p, s->ids.len, s->skip, &s->prefix);
    if (st == DI_OK)
      st = stream_emit(s, nt, nn, 0);
    s->scratch = keep;
    if (st != DI_OK)
      return st;
  } else {
    s->out.len = 0;
  }
  *text = s->out.p ? s->out.p : "";
  *len = s->out.len;
  return DI_OK;
}

di_status di_detok_stream_flush(di_detok_stream *s, const char **text, size_t *len) {
  if (!s || !text || !len)
    return di_error_set(DI_ERR_INVALID_ARG, "di_detok_stream_flush: NULL argument");
  s->scratch.len = 0;
  DI_TRY(di_decode_tokens(s->t, s->ids.p, s->ids.len, s->skip, &s->scratch));
  const char *str = s->scratch.p ? s->scratch.p : "";
  size_t n = s->scratch.len;
  if (n < s->prefix.len || memcmp(str, s->prefix.p ? s->prefix.p : "", s->prefix.len) != 0)
    return di_error_set(DI_ERR_INTERNAL, "detokenize: the decoder's output is not stable under appending tokens");
  DI_TRY(stream_emit(s, str + s->prefix.len, n - s->prefix.len, 1));
  /* the stream is reset: a later push starts fresh text */
  s->ids.len = 0;
  s->prefix.len = 0;
  s->prefix_index = 0;
  *text = s->out.p ? s->out.p : "";
  *len = s->out.len;
  return DI_OK;
}
