/* Text to pieces: regex patterns (PCRE2 JIT, UTF + UCP, with Oniguruma's find_iter rules), the
 * normalizers, and the pre-tokenizers (Split with every behavior and invert, ByteLevel, Metaspace,
 * whitespace split), ending in the BPE model for each piece. Mirrors HF's NormalizedString::split. */
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode.h"

const uint16_t di_byte_to_cp[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10A, 0x10B,
    0x10C, 0x10D, 0x10E, 0x10F, 0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117,
    0x118, 0x119, 0x11A, 0x11B, 0x11C, 0x11D, 0x11E, 0x11F, 0x120, 0x21, 0x22, 0x23,
    0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x2B, 0x2C, 0x2D, 0x2E, 0x2F,
    0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3A, 0x3B,
    0x3C, 0x3D, 0x3E, 0x3F, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47,
    0x48, 0x49, 0x4A, 0x4B, 0x4C, 0x4D, 0x4E, 0x4F, 0x50, 0x51, 0x52, 0x53,
    0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5A, 0x5B, 0x5C, 0x5D, 0x5E, 0x5F,
    0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6A, 0x6B,
    0x6C, 0x6D, 0x6E, 0x6F, 0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77,
    0x78, 0x79, 0x7A, 0x7B, 0x7C, 0x7D, 0x7E, 0x121, 0x122, 0x123, 0x124, 0x125,
    0x126, 0x127, 0x128, 0x129, 0x12A, 0x12B, 0x12C, 0x12D, 0x12E, 0x12F, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13A, 0x13B, 0x13C, 0x13D,
    0x13E, 0x13F, 0x140, 0x141, 0x142, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7,
    0xA8, 0xA9, 0xAA, 0xAB, 0xAC, 0x143, 0xAE, 0xAF, 0xB0, 0xB1, 0xB2, 0xB3,
    0xB4, 0xB5, 0xB6, 0xB7, 0xB8, 0xB9, 0xBA, 0xBB, 0xBC, 0xBD, 0xBE, 0xBF,
    0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xCB,
    0xCC, 0xCD, 0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7,
    0xD8, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0, 0xE1, 0xE2, 0xE3,
    0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xEB, 0xEC, 0xED, 0xEE, 0xEF,
    0xF0, 0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB,
    0xFC, 0xFD, 0xFE, 0xFF};

int di_cp_to_byte(uint32_t cp) {
  if (cp >= 0x21 && cp <= 0x7E)
    return (int)cp;
  if ((cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
    return (int)cp;
  /* the stand-ins above U+00FF are assigned in byte order to the bytes not printable themselves:
   * 0x00-0x20, then 0x7F-0xA0, then 0xAD */
  if (cp >= 0x100 && cp <= 0x120)
    return (int)(cp - 0x100);
  if (cp >= 0x121 && cp <= 0x142)
    return (int)(0x7F + cp - 0x121);
  if (cp == 0x143)
    return 0xAD;
  return -1;
}

/* ---- patterns ---- */
/* Oniguruma's \s (what HF's regexes are written for) is the White_Space property; PCRE2 10.42's \s
 * in UCP mode also matches U+180E. Oniguruma's \w is letters, marks, Nd and Pc; PCRE2 10.42's is
 * letters and all numbers. So \s, \S, \w and \W are spelled out as explicit classes (\S and \W
 * only outside brackets, where a negated class can stand). */
#define WORD_CHARS "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
#define WS_CHARS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static int rewrite_regex(const char *src, size_t n, di_buf *out) {
  int in_class = 0;
  for (size_t i = 0; i < n; i++) {
    char c = src[i];
    if (c == '\\' && i + 1 < n) {
      char e = src[i + 1];
      i++;
      if (e == 's' || e == 'S' || e == 'w' || e == 'W') {
        const char *set = e == 's' || e == 'S' ? WS_CHARS : WORD_CHARS;
        int neg = e == 'S' || e == 'W';
        if (in_class && !neg) {
          if (di_buf_append(out, set, strlen(set)))
            return -1;
          continue;
        }
        if (!in_class) {
          const char *open = neg ? "[^" : "[";
          if (di_buf_append(out, open, strlen(open)) || di_buf_append(out, set, strlen(set)) || di_buf_putc(out, ']'))
            return -1;
          continue;
        }
      }
      if (di_buf_putc(out, '\\') || di_buf_putc(out, e))
        return -1;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = 1;
      if (di_buf_putc(out, c))
        return -1;
      /* a ']' right after '[' or '[^' is a literal */
      if (i + 1 < n && src[i + 1] == '^') {
        if (di_buf_putc(out, '^'))
          return -1;
        i++;
      }
      if (i + 1 < n && src[i + 1] == ']') {
        if (di_buf_putc(out, ']'))
          return -1;
        i++;
      }
      continue;
    }
    if (in_class && c == '[' && i + 1 < n && src[i + 1] == ':') { /* POSIX class [:alpha:] */
      const char *end = memchr(src + i + 2, ']', n - i - 2);
      if (end) {
        size_t l = (size_t)(end - (src + i)) + 1;
        if (di_buf_append(out, src + i, l))
          return -1;
        i += l - 1;
        continue;
      }
    }
    if (in_class && c == ']')
      in_class = 0;
    if (di_buf_putc(out, c))
      return -1;
  }
  return di_buf_reserve(out, 0);
}

di_status di_pattern_compile(di_pattern *pat, const char *src, size_t n, int literal, const char *what) {
  int err;
  PCRE2_SIZE off;
  di_buf rx = {0};
  if (!literal) {
    if (rewrite_regex(src, n, &rx)) {
      di_buf_free(&rx);
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    }
  }
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* LITERAL refuses UCP */
  pat->re = pcre2_compile((PCRE2_SPTR)(literal ? src : rx.p), literal ? n : rx.len, opts, &err, &off, NULL);
  di_buf_free(&rx);
  if (!pat->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return di_error_set(DI_ERR_FORMAT, "%s: bad regex \"%.*s\" near offset %zu: %s", what, (int)(n > 200 ? 200 : n),
                        src, (size_t)off, (const char *)msg);
  }
  pcre2_jit_compile(pat->re, PCRE2_JIT_COMPLETE); /* no JIT: the interpreter still works */
  return DI_OK;
}

void di_pattern_free(di_pattern *pat) {
  if (pat->re)
    pcre2_code_free(pat->re);
  pat->re = NULL;
}

static int spans_push(di_spans *m, size_t a, size_t b) {
  if (m->len + 2 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    size_t *p = realloc(m->p, cap * sizeof *p);
    if (!p)
      return -1;
    m->p = p, m->cap = cap;
  }
  m->p[m->len++] = a;
  m->p[m->len++] = b;
  return 0;
}

di_status di_pattern_find_all(const di_pattern *pat, pcre2_match_data *md, const char *s, size_t n, di_spans *m) {
  size_t last_end = 0;
  size_t lme = (size_t)-1;
  while (last_end <= n) {
    int rc = pcre2_match(pat->re, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT)
      rc = pcre2_match(pat->re, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
      break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return di_error_set(DI_ERR_INTERNAL, "tokenizer: regex match failed at byte %zu: %s", last_end,
                          (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t a = ov[0], b = ov[1];
    if (b <= a && b == lme) { /* empty match right after the previous one: step one char */
      if (last_end >= n)
        break;
      last_end++;
      while (last_end < n && ((unsigned char)s[last_end] & 0xC0) == 0x80)
        last_end++;
      continue;
    }
    if (b < a)
      b = a;
    last_end = b;
    lme = b;
    if (spans_push(m, a, b))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  return DI_OK;
}

/* ---- normalizers ---- */
static di_status norm_replace(const di_norm *nm, pcre2_match_data *md, const char *s, size_t n, di_buf *out) {
  di_spans m = {0};
  di_status st = di_pattern_find_all(&nm->pat, md, s, n, &m);
  size_t prev = 0;
  for (size_t k = 0; st == DI_OK && k < m.len; k += 2) {
    if (di_buf_append(out, s + prev, m.p[k] - prev) || di_buf_append(out, nm->str, nm->str_len))
      st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    prev = m.p[k + 1];
  }
  if (st == DI_OK && di_buf_append(out, s + prev, n - prev))
    st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  free(m.p);
  return st;
}

di_status di_normalize(const di_tokenizer *t, const char *s, size_t n, di_buf *out) {
  di_buf a = {0}, b = {0};
  pcre2_match_data *md = NULL;
  di_status st = DI_OK;
  if (di_buf_append(&a, s, n))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  for (int k = 0; k < t->n_norms && st == DI_OK; k++) {
    const di_norm *nm = &t->norms[k];
    b.len = 0;
    int rc = 0;
    switch (nm->kind) {
    case NORM_NF:
      rc = di_uc_normalize_append(&b, a.p, a.len, (di_nf_form)nm->form);
      break;
    case NORM_LOWER:
      rc = di_uc_lowercase_append(&b, a.p, a.len);
      break;
    case NORM_PREPEND:
      if (a.len)
        rc = di_buf_append(&b, nm->str, nm->str_len);
      rc = rc || di_buf_append(&b, a.p, a.len);
      break;
    case NORM_STRIP: {
      size_t lo = 0, hi = a.len;
      const unsigned char *u = (const unsigned char *)a.p;
      uint32_t cp;
      while (nm->strip_left && lo < hi) {
        int l = di_utf8_decode(u + lo, hi - lo, &cp);
        if (!l || !di_uc_is_whitespace(cp))
          break;
        lo += (size_t)l;
      }
      while (nm->strip_right && hi > lo) {
        size_t j = hi - 1;
        while (j > lo && (u[j] & 0xC0) == 0x80)
          j--;
        int l = di_utf8_decode(u + j, hi - j, &cp);
        if (!l || !di_uc_is_whitespace(cp))
          break;
        hi = j;
      }
      rc = di_buf_append(&b, a.p + lo, hi - lo);
      break;
    }
    case NORM_REPLACE:
      if (!md && !(md = pcre2_match_data_create(4, NULL))) {
        st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
        break;
      }
      st = norm_replace(nm, md, a.p, a.len, &b);
      break;
    }
    if (rc)
      st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    di_buf tmp = a;
    a = b;
    b = tmp;
  }
  if (md)
    pcre2_match_data_free(md);
  di_buf_free(&b);
  if (st != DI_OK) {
    di_buf_free(&a);
    return st;
  }
  out->len = 0;
  if (di_buf_append(out, a.p, a.len))
    st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  di_buf_free(&a);
  return st;
}

/* ---- pre-tokenizers ---- */
typedef struct { uint32_t off, len; uint8_t first; } piece;
typedef struct { piece *p; size_t len, cap; } pvec;
typedef struct {
  di_buf arena;
  pvec a, b;
  di_spans m, sp;
  pcre2_match_data *md;
  uint8_t *flags; /* per span: is_match */
  size_t flags_cap;
} scratch;

void *di_pre_scratch_new(void) {
  scratch *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->md = pcre2_match_data_create(4, NULL);
  if (!s->md) {
    free(s);
    return NULL;
  }
  return s;
}

void di_pre_scratch_free(void *p) {
  scratch *s = p;
  if (!s)
    return;
  di_buf_free(&s->arena);
  free(s->a.p);
  free(s->b.p);
  free(s->m.p);
  free(s->sp.p);
  free(s->flags);
  pcre2_match_data_free(s->md);
  free(s);
}

static int pv_push(pvec *v, uint32_t off, uint32_t len, uint8_t first) {
  if (len == 0)
    return 0; /* HF drops empty splits */
  if (v->len == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 64;
    piece *p = realloc(v->p, cap * sizeof *p);
    if (!p)
      return -1;
    v->p = p, v->cap = cap;
  }
  v->p[v->len++] = (piece){off, len, first};
  return 0;
}

/* Splits piece pc by the (start, end) list in s->m (or, with pred, by single characters for which
 * pred holds) and applies behavior/invert as HF's NormalizedString::split. */
static di_status split_piece(scratch *s, piece pc, di_behavior beh, int invert, pvec *out) {
  /* spans: alternating (start, end, is_match) covering [0, len) */
  size_t nm = s->m.len / 2;
  size_t cap = nm * 2 + 2;
  di_spans *spp = &s->sp;
#define sp (*spp)
  sp.len = 0;
  if (cap > s->flags_cap) {
    uint8_t *f = realloc(s->flags, cap);
    if (!f)
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
    s->flags = f, s->flags_cap = cap;
  }
  size_t ns = 0, prev = 0;
  int oom = 0;
  if (pc.len == 0) {
    oom |= spans_push(&sp, 0, 0);
    s->flags[ns++] = 0;
  }
  for (size_t k = 0; k < nm; k++) {
    size_t a = s->m.p[2 * k], b = s->m.p[2 * k + 1];
    if (prev != a) {
      oom |= spans_push(&sp, prev, a);
      s->flags[ns++] = 0;
    }
    oom |= spans_push(&sp, a, b);
    s->flags[ns++] = 1;
    prev = b;
  }
  if (prev != pc.len && pc.len) {
    oom |= spans_push(&sp, prev, pc.len);
    s->flags[ns++] = 0;
  }
  if (oom) {
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  if (invert)
    for (size_t k = 0; k < ns; k++)
      s->flags[k] ^= 1;
  /* merge per behavior into sp in place: result spans written at index w */
  size_t w = 0;
  int prev_match = 0;
  switch (beh) {
  case BEH_REMOVED:
    for (size_t k = 0; k < ns; k++)
      if (!s->flags[k])
        sp.p[2 * w] = sp.p[2 * k], sp.p[2 * w + 1] = sp.p[2 * k + 1], w++;
    break;
  case BEH_ISOLATED:
    w = ns;
    break;
  case BEH_MERGED_PREV:
    for (size_t k = 0; k < ns; k++) {
      int im = s->flags[k];
      if (im && !prev_match && w > 0)
        sp.p[2 * (w - 1) + 1] = sp.p[2 * k + 1];
      else
        sp.p[2 * w] = sp.p[2 * k], sp.p[2 * w + 1] = sp.p[2 * k + 1], w++;
      prev_match = im;
    }
    break;
  case BEH_MERGED_NEXT: {
    /* walk backwards: a match joins the span after it unless that one is a match too */
    size_t r = ns; /* result spans are built from the end at indices [r, ns) */
    for (size_t k = ns; k-- > 0;) {
      int im = s->flags[k];
      if (im && !prev_match && r < ns)
        sp.p[2 * r] = sp.p[2 * k];
      else {
        r--;
        sp.p[2 * r] = sp.p[2 * k], sp.p[2 * r + 1] = sp.p[2 * k + 1];
      }
      prev_match = im;
    }
    for (size_t k = r; k < ns; k++)
      sp.p[2 * w] = sp.p[2 * k], sp.p[2 * w + 1] = sp.p[2 * k + 1], w++;
    break;
  }
  case BEH_CONTIGUOUS:
    for (size_t k = 0; k < ns; k++) {
      int im = s->flags[k];
      if (im == prev_match && w > 0)
        sp.p[2 * (w - 1) + 1] = sp.p[2 * k + 1];
      else
        sp.p[2 * w] = sp.p[2 * k], sp.p[2 * w + 1] = sp.p[2 * k + 1], w++;
      prev_match = im;
    }
    break;
  }
  for (size_t k = 0; k < w; k++) {
    size_t a = sp.p[2 * k], b = sp.p[2 * k + 1];
    if (pv_push(out, pc.off + (uint32_t)a, (uint32_t)(b - a), (uint8_t)(pc.first && a == 0)))
      return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  return DI_OK;
#undef sp
}

/* Fills s->m with one span per character where the character is whitespace (WhitespaceSplit) or
 * equals `cp` (Metaspace's split on its replacement). */
static int char_matches(scratch *s, const char *p, size_t n, int whitespace, uint32_t want) {
  s->m.len = 0;
  const unsigned char *u = (const unsigned char *)p;
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    int l = di_utf8_decode(u + i, n - i, &cp);
    if (!l)
      l = 1, cp = 0xFFFD;
    int hit = whitespace ? di_uc_is_whitespace(cp) : cp == want;
    if (hit && spans_push(&s->m, i, i + (size_t)l))
      return -1;
    i += (size_t)l;
  }
  return 0;
}

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static di_status apply_pre(const di_pre *pr, scratch *s, pvec *in, pvec *out) {
  out->len = 0;
  for (size_t k = 0; k < in->len; k++) {
    piece pc = in->p[k];
    switch (pr->kind) {
    case PRE_SPLIT:
      s->m.len = 0;
      DI_TRY(di_pattern_find_all(&pr->pat, s->md, s->arena.p + pc.off, pc.len, &s->m));
      DI_TRY(split_piece(s, pc, pr->behavior, pr->invert, out));
      break;
    case PRE_WSPLIT:
      if (char_matches(s, s->arena.p + pc.off, pc.len, 1, 0))
        return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      DI_TRY(split_piece(s, pc, BEH_REMOVED, 0, out));
      break;
    case PRE_BYTELEVEL: {
      piece q = pc;
      if (pr->add_prefix_space && s->arena.p[pc.off] != ' ') {
        q.off = (uint32_t)s->arena.len;
        q.len = pc.len + 1;
        if (di_buf_reserve(&s->arena, (size_t)pc.len + 1)) /* reserve first: the source is in the arena */
          return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
        s->arena.p[s->arena.len] = ' ';
        memcpy(s->arena.p + s->arena.len + 1, s->arena.p + pc.off, pc.len);
        s->arena.len += (size_t)pc.len + 1;
        s->arena.p[s->arena.len] = 0;
      }
      size_t first_new = out->len;
      if (pr->has_pat) {
        s->m.len = 0;
        DI_TRY(di_pattern_find_all(&pr->pat, s->md, s->arena.p + q.off, q.len, &s->m));
        DI_TRY(split_piece(s, q, BEH_ISOLATED, 0, out));
      } else if (pv_push(out, q.off, q.len, q.first)) {
        return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      }
      /* map every byte to its printable stand-in */
      for (size_t j = first_new; j < out->len; j++) {
        piece *o = &out->p[j];
        if (di_buf_reserve(&s->arena, (size_t)o->len * 2))
          return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
        const unsigned char *src = (const unsigned char *)s->arena.p + o->off;
        char *dst = s->arena.p + s->arena.len;
        size_t w = 0;
        for (uint32_t i = 0; i < o->len; i++) {
          uint32_t cp = di_byte_to_cp[src[i]];
          if (cp < 0x80)
            dst[w++] = (char)cp;
          else {
            dst[w++] = (char)(0xC0 | (cp >> 6));
            dst[w++] = (char)(0x80 | (cp & 0x3F));
          }
        }
        o->off = (uint32_t)s->arena.len;
        o->len = (uint32_t)w;
        s->arena.len += w;
        s->arena.p[s->arena.len] = 0;
      }
      break;
    }
    case PRE_METASPACE: {
      /* replace ' ' by the replacement, prepend it per the scheme, then split before each one */
      uint32_t off = (uint32_t)s->arena.len;
      const char *src = s->arena.p + pc.off; /* stable: we reserve before writing */
      if (di_buf_reserve(&s->arena, (size_t)pc.len * pr->repl_len + pr->repl_len))
        return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      src = s->arena.p + pc.off;
      int starts = pc.len >= pr->repl_len && memcmp(src, pr->repl, pr->repl_len) == 0;
      if (!starts && pc.len && src[0] == ' ')
        starts = 1; /* the space becomes the replacement */
      int pre = !starts && (pr->prepend == PREPEND_ALWAYS || (pr->prepend == PREPEND_FIRST && pc.first));
      char *dst = s->arena.p + s->arena.len;
      size_t w = 0;
      if (pre)
        memcpy(dst, pr->repl, pr->repl_len), w += pr->repl_len;
      for (uint32_t i = 0; i < pc.len; i++) {
        if (src[i] == ' ')
          memcpy(dst + w, pr->repl, pr->repl_len), w += pr->repl_len;
        else
          dst[w++] = src[i];
      }
      s->arena.len += w;
      s->arena.p[s->arena.len] = 0;
      piece q = {off, (uint32_t)w, pc.first};
      if (pr->split) {
        uint32_t rc;
        di_utf8_decode((const unsigned char *)pr->repl, pr->repl_len, &rc);
        if (char_matches(s, s->arena.p + q.off, q.len, 0, rc))
          return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
        DI_TRY(split_piece(s, q, BEH_MERGED_NEXT, 0, out));
      } else if (pv_push(out, q.off, q.len, q.first)) {
        return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      }
      break;
    }
    }
  }
  return DI_OK;
}

di_status di_pre_gpt2_compile(di_pattern *pat) { return di_pattern_compile(pat, GPT2_RE, sizeof GPT2_RE - 1, 0, "ByteLevel"); }

di_status di_pretokenize_encode(const di_tokenizer *t, const char *text, size_t n, int at_start, di_ivec *ids,
                                void *scratch_p) {
  scratch *s = scratch_p;
  if (n == 0)
    return DI_OK;
  if (n > UINT32_MAX / 4)
    return di_error_set(DI_ERR_INVALID_ARG, "tokenizer: text of %zu bytes is too long to encode at once", n);
  s->arena.len = 0;
  s->a.len = 0;
  if (di_buf_append(&s->arena, text, n) || pv_push(&s->a, 0, (uint32_t)n, (uint8_t)at_start))
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  pvec *in = &s->a, *out = &s->b;
  for (int k = 0; k < t->n_pres; k++) {
    DI_TRY(apply_pre(&t->pres[k], s, in, out));
    pvec *tmp = in;
    in = out;
    out = tmp;
  }
  for (size_t k = 0; k < in->len; k++)
    DI_TRY(di_bpe_encode_word(t, s->arena.p + in->p[k].off, in->p[k].len, ids));
  return DI_OK;
}
