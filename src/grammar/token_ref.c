/* Token references as byte spellings (see token_ref.h). "Any token but N" is 0xFF followed by the
 * 4-byte ids that differ from N's: they first differ at byte k, so one alternative per k. A set
 * of id ranges is 0xFF and, per range, the usual decomposition of a range of big-endian numbers
 * into byte classes (fixed leading bytes, then a low edge, a full middle and a high edge). */
#include <stdlib.h>
#include "grammar/token_ref.h"

int di_token_ref_parse(const char *s, size_t n, size_t *i, int32_t *id) {
  size_t j = *i;
  if (j + 1 >= n || s[j] != '<' || s[j + 1] != '[')
    return 0;
  j += 2;
  int64_t v = 0;
  size_t d0 = j;
  while (j < n && s[j] >= '0' && s[j] <= '9' && j - d0 < 10)
    v = v * 10 + (s[j++] - '0');
  if (j == d0 || v > INT32_MAX || j + 1 >= n || s[j] != ']' || s[j + 1] != '>')
    return 0;
  *i = j + 2;
  *id = (int32_t)v;
  return 1;
}

static di_gel byte_el(di_gb *b, int lo, int hi, int except) {
  di_gbyteset set = {{0}};
  for (int c = lo; c <= hi; c++)
    if (c != except)
      di_gbyteset_add(&set, (unsigned)c);
  return (di_gel){DI_GE_CLASS, di_gb_class(b, &set)};
}

void di_token_ref_push(di_gb *b, di_gseq *seq, int32_t id, int negated) {
  uint8_t sp[DI_TOKEN_REF_LEN];
  di_token_ref_spell(id, sp);
  if (!negated) {
    for (int k = 0; k < DI_TOKEN_REF_LEN; k++)
      di_gseq_push(b, seq, byte_el(b, sp[k], sp[k], -1));
    return;
  }
  int r = di_gb_new_rule(b, "not_token");
  for (int k = 1; k < DI_TOKEN_REF_LEN; k++) {
    di_gel alt[DI_TOKEN_REF_LEN];
    alt[0] = byte_el(b, DI_TOKEN_REF_MARK, DI_TOKEN_REF_MARK, -1);
    for (int j = 1; j < k; j++)
      alt[j] = byte_el(b, sp[j], sp[j], -1);
    alt[k] = byte_el(b, 0, 255, sp[k]);
    for (int j = k + 1; j < DI_TOKEN_REF_LEN; j++)
      alt[j] = byte_el(b, 0, 255, -1);
    di_gb_add_alt(b, r, alt, DI_TOKEN_REF_LEN);
  }
  di_gseq_push(b, seq, (di_gel){DI_GE_RULE, r});
}

static int cmp_range(const void *a, const void *b) {
  const di_token_range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int read_id(const char *s, size_t n, size_t *j, int32_t *v) {
  int64_t x = 0;
  size_t d0 = *j;
  while (*j < n && s[*j] >= '0' && s[*j] <= '9' && *j - d0 < 10)
    x = x * 10 + (s[(*j)++] - '0');
  if (*j == d0 || x > INT32_MAX)
    return 0;
  *v = (int32_t)x;
  return 1;
}

int di_token_set_parse(const char *s, size_t n, size_t *i, di_token_range *out, int cap, int *nr) {
  size_t j = *i;
  if (j + 1 >= n || s[j] != '<' || s[j + 1] != '[' || cap < 2)
    return 0;
  j += 2;
  int neg = j < n && s[j] == '^', k = 0;
  if (neg)
    j++;
  for (;;) {
    di_token_range r;
    if (j < n && s[j] == '*') { /* the wildcard stands alone (llguidance: <[*,100]> is an error) */
      if (neg || k > 0 || j + 1 >= n || s[j + 1] != ']')
        return 0;
      r.lo = 0, r.hi = INT32_MAX;
      j++;
    } else {
      if (!read_id(s, n, &j, &r.lo))
        return 0;
      r.hi = r.lo;
      if (j < n && s[j] == '-') {
        j++;
        if (!read_id(s, n, &j, &r.hi) || r.hi < r.lo)
          return 0;
      }
    }
    if (k == cap - 1) /* one slot kept for the complement's extra range */
      return 0;
    out[k++] = r;
    if (j < n && s[j] == ',') {
      j++;
      continue;
    }
    break;
  }
  if (j + 1 >= n || s[j] != ']' || s[j + 1] != '>')
    return 0;
  qsort(out, (size_t)k, sizeof *out, cmp_range);
  int m = 0; /* merge overlapping or adjacent ranges */
  for (int a = 0; a < k; a++) {
    if (m > 0 && (int64_t)out[a].lo <= (int64_t)out[m - 1].hi + 1) {
      if (out[a].hi > out[m - 1].hi)
        out[m - 1].hi = out[a].hi;
    } else {
      out[m++] = out[a];
    }
  }
  if (neg) { /* the gaps of 0..INT32_MAX: at most m + 1 ranges, rewritten in place from the end */
    int c = 0;
    int64_t next = 0;
    di_token_range *res = out;
    for (int a = 0; a < m; a++) {
      di_token_range cur = res[a];
      if (cur.lo > next) /* c <= a, and res[a] is read first: nothing unread is overwritten */
        res[c++] = (di_token_range){(int32_t)next, cur.lo - 1};
      next = (int64_t)cur.hi + 1;
    }
    if (next <= INT32_MAX)
      res[c++] = (di_token_range){(int32_t)next, INT32_MAX};
    m = c;
  }
  *i = j + 2;
  *nr = m;
  return 1;
}

/* Ids lo..hi of their low `bytes` bytes (the higher ones fixed by the caller) onto alternative
 * prefix `pre` of `npre` elements, as alternatives of rule r. */
static void range_alts(di_gb *b, int r, di_gel *pre, int npre, uint32_t lo, uint32_t hi, int bytes) {
  if (bytes == 0) {
    di_gb_add_alt(b, r, pre, npre);
    return;
  }
  int shift = 8 * (bytes - 1);
  uint32_t m = shift ? (((uint32_t)1 << shift) - 1) : 0;
  uint32_t lb = lo >> shift, hb = hi >> shift;
  if (lb == hb) {
    pre[npre] = byte_el(b, (int)lb, (int)lb, -1);
    range_alts(b, r, pre, npre + 1, lo & m, hi & m, bytes - 1);
    return;
  }
  uint32_t mid_lo = lb + ((lo & m) != 0), mid_hi = hb - ((hi & m) != m);
  if ((lo & m) != 0) {
    pre[npre] = byte_el(b, (int)lb, (int)lb, -1);
    range_alts(b, r, pre, npre + 1, lo & m, m, bytes - 1);
  }
  if (mid_lo <= mid_hi) {
    pre[npre] = byte_el(b, (int)mid_lo, (int)mid_hi, -1);
    for (int k = 1; k < bytes; k++)
      pre[npre + k] = byte_el(b, 0, 255, -1);
    di_gb_add_alt(b, r, pre, npre + bytes);
  }
  if ((hi & m) != m) {
    pre[npre] = byte_el(b, (int)hb, (int)hb, -1);
    range_alts(b, r, pre, npre + 1, 0, hi & m, bytes - 1);
  }
}

void di_token_set_push(di_gb *b, di_gseq *seq, const di_token_range *rs, int nr) {
  int r = di_gb_new_rule(b, "token_set");
  di_gel pre[DI_TOKEN_REF_LEN];
  pre[0] = byte_el(b, DI_TOKEN_REF_MARK, DI_TOKEN_REF_MARK, -1);
  for (int k = 0; k < nr; k++)
    range_alts(b, r, pre, 1, (uint32_t)rs[k].lo, (uint32_t)rs[k].hi, 4);
  di_gb_mark_defined(b, r); /* an empty set: a rule with no alternative, matching nothing */
  di_gseq_push(b, seq, (di_gel){DI_GE_RULE, r});
}
