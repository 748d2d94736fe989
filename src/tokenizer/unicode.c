/* UTF-8 and Unicode algorithms the tokenizer needs (see unicode.h): lossy UTF-8 repair,
 * White_Space, canonical/compatibility normalization (decompose, reorder, compose with Hangul done
 * algorithmically) and lowercase, all over the generated tables in unicode_tables.c. */
#include "tokenizer/unicode.h"

int di_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
  if (n == 0)
    return 0;
  unsigned c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  int len;
  uint32_t v, min;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < (size_t)len)
    return 0;
  for (int i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
    return 0;
  *cp = v;
  return len;
}

int di_utf8_encode(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

int di_utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  uint32_t cp;
  while (i < n) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    int l = di_utf8_decode(u + i, n - i, &cp);
    if (!l)
      return 0;
    i += (size_t)l;
  }
  return 1;
}

/* Length of the maximal prefix of s that could start a valid sequence (Unicode's "maximal subpart"):
 * the lead byte plus the continuation bytes that are acceptable at each step. At least 1. */
static size_t maximal_subpart(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  int len;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    len = 2;
  else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0)
      lo = 0xA0;
    if (c == 0xED)
      hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0)
      lo = 0x90;
    if (c == 0xF4)
      hi = 0x8F;
  } else
    return 1;
  size_t i = 1;
  for (; i < (size_t)len && i < n; i++) {
    unsigned b = s[i];
    if (i == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80)
      break;
  }
  return i;
}

int di_utf8_lossy_append(di_buf *b, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0, run = 0;
  uint32_t cp;
  while (i < n) {
    if (u[i] < 0x80) {
      i++;
      continue;
    }
    int l = di_utf8_decode(u + i, n - i, &cp);
    if (l) {
      i += (size_t)l;
      continue;
    }
    if (di_buf_append(b, s + run, i - run))
      return -1;
    if (di_buf_append(b, "\xEF\xBF\xBD", 3))
      return -1;
    i += maximal_subpart(u + i, n - i);
    run = i;
  }
  return di_buf_append(b, s + run, n - run);
}

int di_uc_is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

int di_uc_is_word(uint32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  size_t lo = 0, hi = di_uc_alnum_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c < di_uc_alnum_ranges[mid][0])
      hi = mid;
    else if (c > di_uc_alnum_ranges[mid][1])
      lo = mid + 1;
    else
      return 1;
  }
  return 0;
}

static int ccc_of(uint32_t c) {
  if (c < 0x300)
    return 0;
  size_t lo = 0, hi = di_uc_ccc_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (di_uc_ccc_table[mid].cp == c)
      return di_uc_ccc_table[mid].ccc;
    if (di_uc_ccc_table[mid].cp < c)
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

static const di_uc_map *map_find(const di_uc_map *t, size_t n, uint32_t c) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (t[mid].cp == c)
      return &t[mid];
    if (t[mid].cp < c)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

enum { SBASE = 0xAC00, LBASE = 0x1100, VBASE = 0x1161, TBASE = 0x11A7, LCOUNT = 19, VCOUNT = 21,
       TCOUNT = 28, NCOUNT = VCOUNT * TCOUNT, SCOUNT = LCOUNT * NCOUNT };

static uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
    return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
  if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
    return a + (b - TBASE);
  size_t lo = 0, hi = di_uc_pair_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const di_uc_pair *p = &di_uc_pair_table[mid];
    if (p->a == a && p->b == b)
      return p->c;
    if (p->a < a || (p->a == a && p->b < b))
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

typedef struct { uint32_t *p; size_t len, cap; } cpvec;
static int cp_push(cpvec *v, uint32_t c) {
  if (v->len == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 64;
    uint32_t *p = realloc(v->p, cap * sizeof *p);
    if (!p)
      return -1;
    v->p = p, v->cap = cap;
  }
  v->p[v->len++] = c;
  return 0;
}

int di_uc_normalize_append(di_buf *b, const char *s, size_t n, di_nf_form form) {
  const unsigned char *u = (const unsigned char *)s;
  /* Fast path: ASCII is stable under every form, and so is text below U+0300 under NFC. */
  size_t i = 0;
  int kompat = form == DI_NF_NFKC || form == DI_NF_NFKD;
  unsigned char lim = form == DI_NF_NFC ? 0xCC : 0x80; /* NFC: below U+0300 is stable */
  for (; i < n; i++)
    if (u[i] >= lim)
      break;
  if (i == n)
    return di_buf_append(b, s, n);
  cpvec v = {0};
  const di_uc_map *tab = kompat ? di_uc_compat_table : di_uc_canon_table;
  size_t tabn = kompat ? di_uc_compat_count : di_uc_canon_count;
  const uint32_t *seq = kompat ? di_uc_compat_seq : di_uc_canon_seq;
  i = 0;
  while (i < n) {
    uint32_t c;
    int l = di_utf8_decode(u + i, n - i, &c);
    if (!l) { /* callers pass valid UTF-8; keep going defensively */
      c = 0xFFFD;
      l = 1;
    }
    i += (size_t)l;
    const di_uc_map *m = c >= 0xA0 ? map_find(tab, tabn, c) : NULL;
    if (m) {
      for (uint32_t k = 0; k < m->len; k++) {
        uint32_t d = seq[m->off + k];
        if (d >= SBASE && d < SBASE + SCOUNT) { /* compatibility forms can decompose to Hangul */
          uint32_t si = d - SBASE;
          if (cp_push(&v, LBASE + si / NCOUNT) || cp_push(&v, VBASE + (si % NCOUNT) / TCOUNT))
            goto oom;
          if (si % TCOUNT && cp_push(&v, TBASE + si % TCOUNT))
            goto oom;
        } else if (cp_push(&v, d))
          goto oom;
      }
    } else if (c >= SBASE && c < SBASE + SCOUNT) {
      uint32_t si = c - SBASE;
      if (cp_push(&v, LBASE + si / NCOUNT) || cp_push(&v, VBASE + (si % NCOUNT) / TCOUNT))
        goto oom;
      if (si % TCOUNT && cp_push(&v, TBASE + si % TCOUNT))
        goto oom;
    } else if (cp_push(&v, c))
      goto oom;
  }
  /* canonical ordering: stable insertion sort of each run of non-starters by combining class */
  for (size_t k = 1; k < v.len; k++) {
    int ck = ccc_of(v.p[k]);
    if (!ck)
      continue;
    size_t j = k;
    uint32_t c = v.p[k];
    while (j > 0) {
      int cj = ccc_of(v.p[j - 1]);
      if (cj <= ck)
        break;
      v.p[j] = v.p[j - 1];
      j--;
    }
    v.p[j] = c;
  }
  size_t outn = v.len;
  if (form == DI_NF_NFC || form == DI_NF_NFKC) {
    size_t w = 0;
    long starter = -1;
    int last = 0;
    for (size_t k = 0; k < v.len; k++) {
      uint32_t c = v.p[k];
      int cc = ccc_of(c);
      if (starter >= 0 && (last < cc || (last == 0 && w == (size_t)starter + 1))) {
        uint32_t comp = compose_pair(v.p[starter], c);
        if (comp) {
          v.p[starter] = comp;
          continue;
        }
      }
      if (cc == 0) {
        starter = (long)w;
        last = 0;
      } else {
        last = cc;
      }
      v.p[w++] = c;
    }
    outn = w;
  }
  if (di_buf_reserve(b, outn * 4)) {
    free(v.p);
    return -1;
  }
  for (size_t k = 0; k < outn; k++)
    b->len += (size_t)di_utf8_encode(v.p[k], b->p + b->len);
  b->p[b->len] = 0;
  free(v.p);
  return 0;
oom:
  free(v.p);
  return -1;
}

int di_uc_lowercase_append(di_buf *b, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && u[j] < 0x80 && !(u[j] >= 'A' && u[j] <= 'Z'))
      j++;
    if (di_buf_append(b, s + i, j - i))
      return -1;
    i = j;
    if (i >= n)
      break;
    if (u[i] < 0x80) {
      if (di_buf_putc(b, (char)(u[i] + 32)))
        return -1;
      i++;
      continue;
    }
    uint32_t c;
    int l = di_utf8_decode(u + i, n - i, &c);
    if (!l) {
      if (di_buf_putc(b, (char)u[i]))
        return -1;
      i++;
      continue;
    }
    const di_uc_map *m = map_find(di_uc_lower_table, di_uc_lower_count, c);
    if (!m) {
      if (di_buf_append(b, s + i, (size_t)l))
        return -1;
    } else {
      if (di_buf_reserve(b, m->len * 4))
        return -1;
      for (uint32_t k = 0; k < m->len; k++)
        b->len += (size_t)di_utf8_encode(di_uc_lower_seq[m->off + k], b->p + b->len);
      b->p[b->len] = 0;
    }
    i += (size_t)l;
  }
  return 0;
}
