/* Token references as byte spellings (see token_ref.h). "Any token but N" is 0xFF followed by the
 * 4-byte ids that differ from N's: they first differ at byte k, so one alternative per k. */
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
